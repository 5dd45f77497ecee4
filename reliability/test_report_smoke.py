"""The report machinery itself: figures recorded by a scenario reach REPORT.md with its outcome."""

from __future__ import annotations

from rel_report import Report


def test_report_lists_each_scenario_with_figures_and_outcome() -> None:
    r = Report()
    r.record(
        "reliability/test_a.py::test_a",
        "Crash, exactly once",
        {"sent": 12000, "lost": 0, "p99 ms": 3.25},
        lambda: "passed",
    )
    r.record("reliability/test_b.py::test_b", "Pager faults", {"note": "a|b"}, lambda: "failed")
    text = r.render(1)
    assert "scenarios: 2; passed 1, failed 1, skipped 0 (pytest exit status 1)" in text
    assert "## Crash, exactly once\n\n`reliability/test_a.py::test_a`: **passed**" in text
    assert "| sent | 12,000 |" in text and "| lost | 0 |" in text and "| p99 ms | 3.250 |" in text
    assert "| note | a\\|b |" in text
