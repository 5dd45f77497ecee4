"""The weekly review report over a seeded database: three cohorts, one drifting, one without a baseline."""

from __future__ import annotations

import random
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from harness import ensure_tool, make_envelope
from prometheus_client import CollectorRegistry

from shapewatch.analysis.alerts import ALERTS_SCHEMA
from shapewatch.analysis.analyzer import Analyzer
from shapewatch.analysis.config import AnalyzerConfig
from shapewatch.analysis.review import build_review, render_html, render_markdown
from shapewatch.baselines import BASELINES_SCHEMA, Cohort, freeze_baseline
from shapewatch.collector import Store, parse_envelope
from shapewatch.collector.envelope import LIMITS

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
DRIFT = Cohort("claude-sonnet-4-5-20250929", "intake-v3", "intake")
STABLE = Cohort("gpt-4o", "triage-v1", "triage")  # an unpinned alias
NEW = Cohort("claude-sonnet-4-5-20250929", "summary-v1", "summary")  # no baseline, no previous version


def _output(rng: random.Random, drifted: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "priority": rng.choice(["low", "medium", "high"]),
        "confidence": round(rng.random(), 3),
        "tags": ["x"] * rng.randint(0, 3),
    }
    if rng.random() < 0.7:
        out["customer"] = {"tier": rng.choice(["gold", "silver"])}
    if drifted and rng.random() < 0.3:
        out["priority"] = "URGENT"
    return out


def _events(
    cohort: Cohort, start: datetime, n: int, rng: random.Random, *, drifted: bool = False, served: str | None = None
) -> list[Any]:
    step = timedelta(days=1) / n
    return [
        parse_envelope(
            orjson.dumps(
                make_envelope(
                    ts=(start + i * step).isoformat(),
                    model=cohort.model,
                    prompt_version=cohort.prompt_version,
                    contract=cohort.contract,
                    served_model=served or cohort.model,
                    output=_output(rng, drifted),
                )
            ),
            LIMITS,
        )
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("review") / "review.duckdb"
    rng = random.Random(7)
    with Store.open(path, schemas=[BASELINES_SCHEMA, ALERTS_SCHEMA]) as store:
        old_day = NOW - timedelta(days=40)
        base_day = NOW - timedelta(days=10)
        batch = _events(DRIFT, base_day, 1000, rng) + _events(STABLE, old_day, 1000, rng, served="gpt-4o-2024-08-06")
        for day in range(1, 4):  # the review week: DRIFT drifts, STABLE does not, NEW appears
            start = NOW - timedelta(days=day)
            batch += _events(DRIFT, start, 800, rng, drifted=True)
            batch += _events(STABLE, start, 800, rng, served="gpt-4o-2024-11-20")
            batch += _events(NEW, start, 300, rng)
        store.write_batch(batch)
        freeze_baseline(
            store,
            DRIFT,
            base_day,
            base_day + timedelta(days=1),
            author="ana",
            note="after the v3 rollout",
            now=base_day + timedelta(days=1),
        )
        freeze_baseline(
            store,
            STABLE,
            old_day,
            old_day + timedelta(days=1),
            author="bo",
            note="first triage baseline",
            now=old_day + timedelta(days=1),
        )
        analyzer = Analyzer(store, AnalyzerConfig(), registry=CollectorRegistry())
        for minutes in (10, 5, 0):  # the scheduler's last evaluations: page alerts confirmed and firing
            assert analyzer.run(NOW - timedelta(minutes=minutes)).ok
    return path


def _review(path: Path) -> dict[str, Any]:
    with Store.open(path, schemas=[BASELINES_SCHEMA, ALERTS_SCHEMA]) as store:
        return build_review(store, AnalyzerConfig(), now=NOW, period=timedelta(days=7))


def test_the_review_lists_each_fact_of_the_seeded_database(seeded: Path) -> None:
    review = _review(seeded)
    by = {Cohort(**c["cohort"]): c for c in review["cohorts"]}
    assert set(by) == {DRIFT, STABLE, NEW}

    drift = by[DRIFT]
    assert drift["baseline"]["author"] == "ana" and drift["baseline"]["note"] == "after the v3 rollout"
    assert drift["baseline"]["how"] == "own" and drift["baseline"]["age_days"] == 9.0
    fired = {(a["field"], a["kind"], a["value"], a["severity"]) for a in drift["alerts"]["fired"]}
    assert ("priority", "unknown_enum_growth", None, "page") in fired  # URGENT folded into it
    assert not any(kind == "new_enum_value" for _, kind, _, _ in fired)
    priority = next(r for r in drift["fields"] if r["field"] == "priority")
    assert priority["new_values"] == ["URGENT"]
    assert priority["presence"] == [1.0, 1.0]

    stable = by[STABLE]
    assert stable["unpinned"] is True
    assert stable["served_models"] == {"gpt-4o-2024-11-20": 2400}
    # The alias is answered by another snapshot than its baseline's: a warn, and nothing else moved.
    assert [(a["field"], a["kind"], a["value"], a["severity"]) for a in stable["alerts"]["fired"]] == [
        ("$", "served_model_change", "gpt-4o-2024-11-20", "warn")
    ]
    assert (stable["alerts"]["acknowledged"], stable["alerts"]["resolved"]) == ([], [])
    assert stable["baseline"]["stale"] is True
    assert review["stale_baselines"] == [
        {"cohort": STABLE._asdict(), "baseline_id": stable["baseline"]["baseline_id"], "age_days": 39.0}
    ]

    assert by[NEW]["baseline"] is None
    assert review["without_baseline"] == [{"cohort": NEW._asdict(), "events": 900}]
    # The candidate is the latest whole day with enough samples and no page alert open in it.
    assert by[NEW]["candidate"] == {"since": "2026-11-28T00:00:00Z", "until": "2026-11-29T00:00:00Z", "samples": 300}
    assert by[STABLE]["candidate"]["differs"] == []
    # The day the firing page alert judged is skipped; an older drifted day is offered, saying what
    # freezing it would accept as the new normal.
    cand = by[DRIFT]["candidate"]
    assert (cand["since"], cand["until"], cand["samples"]) == ("2026-11-27T00:00:00Z", "2026-11-28T00:00:00Z", 800)
    assert [d.split(":")[0] for d in cand["differs"]] == [
        "unknown_enum_growth on priority",
        "new_enum_value on priority = 'URGENT'",
    ]


def test_the_markdown_report_says_it_in_words(seeded: Path) -> None:
    text = render_markdown(_review(seeded))
    # Stored values are code spans or escaped text (test_review_hostile.py tries hostile ones).
    assert "## `claude-sonnet-4-5-20250929` / `intake-v3` / `intake`" in text
    assert "by ana: after the v3 rollout" in text
    assert "page unknown\\_enum\\_growth on `priority`" in text
    assert "| `priority` | 100.0% -> 100.0%; per day " in text and "| URGENT |" in text
    assert "- -> -" not in text and "| - |" not in text  # a real value in every cell
    assert "**unpinned model alias**: `gpt-4o` has no dated version; served models: `gpt-4o-2024-11-20` (2400)" in text
    assert (
        "## Cohorts without a baseline\n\n- `claude-sonnet-4-5-20250929` / `summary-v1` / `summary`: 900 events" in text
    )
    assert "**(older than the configured age)**" in text


@pytest.mark.slow
@pytest.mark.skipif(
    ensure_tool("chromium") is None, reason="chromium missing and not installable here (Debian package chromium)"
)
def test_the_html_report_renders_in_headless_chromium_without_errors(seeded: Path, tmp_path: Path) -> None:
    page = tmp_path / "review.html"
    page.write_text(render_html(_review(seeded)), encoding="utf-8")
    run = subprocess.run(
        [
            "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-logging=stderr",
            "--v=0",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    dom = run.stdout
    assert dom.count('<section class="cohort">') == 3
    assert dom.count('<svg class="spark"') == 3 and '<svg class="bars"' in dom
    assert "unpinned alias" in dom and "no baseline" in dom
    problems = [line for line in run.stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]
    assert problems == []


def test_the_review_is_served_in_each_format(seeded: Path, tmp_path: Path) -> None:
    import shutil as sh

    from fastapi.testclient import TestClient

    from shapewatch.analysis.service import create_app
    from shapewatch.collector import load_settings

    db = tmp_path / "copy.duckdb"
    sh.copy(seeded, db)
    app = create_app(load_settings({"db_path": str(db)}, env={}), registry=CollectorRegistry(), analyze=False)
    with TestClient(app) as client:
        as_json = client.get("/v1/review", params={"since": "30d"})
        md = client.get("/v1/review", params={"since": "30d", "format": "markdown"})
        page = client.get("/v1/review", params={"since": "30d", "format": "html"})
        bad = client.get("/v1/review", params={"since": "soon"})
    assert as_json.status_code == md.status_code == page.status_code == 200
    assert {Cohort(**c["cohort"]) for c in as_json.json()["cohorts"]} == {DRIFT, STABLE, NEW}
    assert md.headers["content-type"].startswith("text/markdown") and "# shapewatch weekly review" in md.text
    assert page.headers["content-type"].startswith("text/html") and page.text.count('<section class="cohort">') == 3
    assert bad.status_code == 422 and "not a duration" in bad.json()["error"]["message"]


def test_one_bad_day_stands_out_and_rows_rank_by_change(tmp_path: Path) -> None:
    # customer.email is filled in 72% of outputs, every day but one, when 30% were: the week's
    # aggregate (about 66%) hides it; the daily series and the worst day do not.
    cohort = Cohort("m-2025-01-01", "p1", "c")
    base_day = NOW - timedelta(days=10)

    def day(start: datetime, filled: float, n: int = 400) -> list[Any]:
        out = []
        for i in range(n):
            output: dict[str, Any] = {"tier": ("gold", "silver")[i % 2]}
            if i < filled * n:
                output["customer"] = {"email": "x"}
            out.append(
                parse_envelope(
                    orjson.dumps(
                        make_envelope(
                            ts=(start + i * timedelta(days=1) / n).isoformat(),
                            model=cohort.model,
                            prompt_version=cohort.prompt_version,
                            contract=cohort.contract,
                            served_model=cohort.model,
                            output=output,
                        )
                    ),
                    LIMITS,
                )
            )
        return out

    with Store.open(tmp_path / "r.duckdb", schemas=[BASELINES_SCHEMA, ALERTS_SCHEMA]) as store:
        batch = day(base_day, 0.72)
        for k in range(7, 0, -1):
            batch += day(NOW - timedelta(days=k), 0.30 if k == 4 else 0.72)
        store.write_batch(batch)
        freeze_baseline(store, cohort, base_day, base_day + timedelta(days=1), author="ana", note="n", now=NOW)
        review = build_review(store, AnalyzerConfig(), now=NOW, period=timedelta(days=7))
    (entry,) = review["cohorts"]
    # the largest change ranks first: the email and the object holding it moved together
    assert {r["field"] for r in entry["fields"][:2]} == {"customer", "customer.email"}
    first = next(r for r in entry["fields"] if r["field"] == "customer.email")
    assert [r["change"] for r in entry["fields"]] == sorted((r["change"] for r in entry["fields"]), reverse=True)
    assert [d["presence"] for d in first["daily"]] == [0.72, 0.72, 0.72, 0.3, 0.72, 0.72, 0.72]
    assert first["worst_day"] == {"day": f"{NOW - timedelta(days=4):%Y-%m-%d}", "presence": 0.3, "move": -42.0}
    assert 0.60 < first["presence"][1] < 0.70  # what the week alone said
    assert first["change"] == pytest.approx(0.42)
    text = render_markdown(review)
    assert f"worst {NOW - timedelta(days=4):%Y-%m-%d} 30.0% (-42.0 pts)" in text
    assert "per day 72 72 72 30 72 72 72" in text
    page = render_html(review)
    assert page.count('<svg class="daily"') == len(entry["fields"])
    assert '<circle class="worst"' in page and "-42.0 pts" in page
    assert "- &rarr; -" not in page
