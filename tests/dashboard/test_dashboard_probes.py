"""The Probes and Compare pages (issue 25) against a real ``shapewatch serve``, through Streamlit's
AppTest: a suite's last runs, scores over time against thresholds and failed cases expected vs
actual; two cohorts side by side with the field that breached. Stored names that look like
markup stay inert.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest
from harness import make_envelope, start_service
from streamlit.testing.v1 import AppTest
from test_dashboard_escaping import _assert_inert, markdown_strings

from shapewatch.analysis.store_access import SCHEMAS
from shapewatch.collector import Store
from shapewatch.collector.envelope import LIMITS, parse_envelope

# A real Streamlit server and service per module (10-20 s): the slow suite (make test-slow, in CI).
pytestmark = pytest.mark.slow

APP = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"
HOSTILE_SUITE = "suite **bold** <b>x</b>"
NOW = datetime.now(UTC).replace(microsecond=0)


def _runs(store: Store) -> None:
    for i, (tool_hits, spurious) in enumerate([(24, 0), (23, 0), (21, 1)]):
        run_id = f"probe-{i:016x}"
        at = NOW - timedelta(days=2 - i)
        scores = {
            "tool_accuracy": {"value": tool_hits / 24, "hits": tool_hits, "n": 24},
            "argument_accuracy": {"value": 1.0, "hits": tool_hits, "n": tool_hits},
            "spurious_calls": {"value": spurious / 6, "hits": spurious, "n": 6},
        }
        thresholds = {"tool_accuracy": 0.95, "argument_accuracy": 0.9, "spurious_calls": 0.02}
        run = [run_id, HOSTILE_SUITE, "gpt-4o-2024-08-06", "support-v2", "support", "gpt-4o-2024-08-06",
               at, at, "schedule", 30, 0, True, orjson.dumps(scores).decode(), orjson.dumps(thresholds).decode()]  # fmt: skip
        cases = [
            [run_id, 0, "lookup-00", False,
             orjson.dumps({"tool": "lookup_order", "arguments": {"order_id": {"exact": "A-0"}}}).decode(),
             orjson.dumps({"tool": "create_ticket", "arguments": {"priority": "high"}}).decode(), None,
             "tool_accuracy" if tool_hits < 24 else ""],
            [run_id, 1, "hello-00", True, orjson.dumps({"tool": None, "arguments": {}}).decode(),
             orjson.dumps({"tool": "lookup_order" if spurious else None, "arguments": {}}).decode(), None,
             "spurious_calls" if spurious else ""],
        ]  # fmt: skip
        store.add_probe_run(run, cases)


def _outputs(store: Store) -> None:
    rnd = random.Random(3)
    envs = []
    for source, model, email in (("production", "gpt-4o-2024-08-06", 0.7), ("shadow", "gpt-5-2026-01-15", 0.1)):
        for i in range(600):
            out = {"intent": rnd.choice(["refund", "order"]), "customer": {"tier": "gold"}}
            if rnd.random() < email:
                out["customer"]["email"] = "a@b.c"
            env = make_envelope(event_id=f"{source}-{i}", ts=(NOW - timedelta(minutes=30 + i % 60)).isoformat(),
                                model=model, served_model=model, prompt_version="support-v2", contract="support",
                                source=source, output=out)  # fmt: skip
            envs.append(parse_envelope(orjson.dumps(env), LIMITS))
    store.write_batch(envs)


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    db = tmp_path_factory.mktemp("dash-probes") / "probes.duckdb"
    with Store.open(db, schemas=SCHEMAS) as store:
        _runs(store)
        _outputs(store)
    svc = start_service(db)
    try:
        yield svc.url
    finally:
        svc.stop()


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHAPEWATCH_AUTHOR", "ana")
    monkeypatch.delenv("SHAPEWATCH_TOKEN", raising=False)


def open_page(url: str, page: str, monkeypatch: pytest.MonkeyPatch) -> AppTest:
    monkeypatch.setenv("SHAPEWATCH_URL", url)
    at = AppTest.from_file(APP, default_timeout=30).run()
    at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_the_probes_page_shows_scores_against_thresholds_and_failed_cases(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = open_page(url, "views/probes.py", monkeypatch)
    assert at.selectbox(key="probes-suite").value == HOSTILE_SUITE
    assert [m.value for m in at.metric] == ["87.5% (21/24)", "100.0% (21/21)", "16.7% (1/6)"]
    runs, failed = (d.value for d in at.dataframe)
    assert list(runs["trigger"]) == ["schedule"] * 3
    assert list(runs["tool accuracy"]) == ["87.5% (21/24)", "95.8% (23/24)", "100.0% (24/24)"]
    assert failed.to_dict("records") == [
        {"case": "lookup-00", "failed": "tool_accuracy", "expected": "lookup_order {'order_id': {'exact': 'A-0'}}",
         "actual": "create_ticket {'priority': 'high'}"},
        {"case": "hello-00", "failed": "spurious_calls", "expected": "no tool", "actual": "lookup_order {}"},
    ]  # fmt: skip
    _assert_inert(markdown_strings(at))


def test_the_compare_page_sets_a_shadow_beside_production(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(url, "views/compare.py", monkeypatch)
    assert at.selectbox(key="compare-a").value == "[shadow] gpt-5-2026-01-15 / support-v2 / support"
    at.selectbox(key="compare-b").set_value("gpt-4o-2024-08-06 / support-v2 / support").run()
    assert not at.exception, [e.value for e in at.exception]
    assert [m.value for m in at.metric][:3] == ["600", "600", "1"]
    breaches, fields = (d.value for d in at.dataframe)
    assert list(breaches["field"]) == ["customer.email"] and list(breaches["kind"]) == ["presence_drop"]
    email = fields[fields["field"] == "customer.email"].iloc[0]
    assert email["breach"] == "yes"
