"""The Agent runs and Cases pages through Streamlit's AppTest, against a real ``shapewatch serve``
that received runs from the real OpenTelemetry SDK (one looping) and a run whose ids, tools and
tags are Markdown and HTML: the run shows its steps in order, a case is accepted from its form,
and no stored value renders as Markdown."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from harness import start_service
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from otlp_agent import run_agent, tracer_provider
from streamlit.testing.v1 import AppTest
from test_dashboard_escaping import _assert_inert, markdown_strings, visible

# A real Streamlit server and service per module (10-20 s): the slow suite (make test-slow, in CI).
pytestmark = pytest.mark.slow

APP = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"
HOSTILE_TOOL = "t ![x](http://127.0.0.1:9/x.png)"
HOSTILE_RUN = "run [link](http://evil) <img src=x onerror=alert(1)>"
HOSTILE_RELEASE = "<script>alert(1)</script>"


def _hostile_request() -> bytes:
    def attr(k: str, v: str) -> dict[str, Any]:
        return {"key": k, "value": {"stringValue": v}}

    calls = [{"type": "tool_call", "name": HOSTILE_TOOL, "arguments": {"a": 1}}] * 3
    span = {
        "traceId": os.urandom(16).hex(),
        "spanId": os.urandom(8).hex(),
        "endTimeUnixNano": str(time.time_ns()),
        "attributes": [
            attr("gen_ai.operation.name", "chat"),
            attr("gen_ai.request.model", "m ![i](http://127.0.0.1:9/i.png)"),
            attr("gen_ai.conversation.id", HOSTILE_RUN),
            attr("shapewatch.contract", "c | <b>x</b>"),
            attr("gen_ai.output.messages", json.dumps([{"parts": calls}])),
        ],
    }
    resource = {"attributes": [attr("service.version", HOSTILE_RELEASE)]}
    return json.dumps({"resourceSpans": [{"resource": resource, "scopeSpans": [{"spans": [span]}]}]}).encode()


@pytest.fixture(scope="module")
def runs_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    db = tmp_path_factory.mktemp("dash-runs") / "runs.duckdb"
    svc = start_service(db, env={"SHAPEWATCH_RUN_IDLE_SECONDS": "1"})
    try:
        provider, memory = tracer_provider("3.0.0", OTLPSpanExporter(endpoint=f"{svc.url}/v1/traces", timeout=30))
        run_agent(provider.get_tracer("agent"), ["A1", "A1", "A1"])
        provider.force_flush()
        looping = format(memory.get_finished_spans()[0].context.trace_id, "032x")
        provider.shutdown()
        r = httpx.post(f"{svc.url}/v1/traces", content=_hostile_request(), headers={"content-type": "application/json"})
        assert r.json()["shapewatch"]["accepted"] == 3, r.text
        deadline = time.monotonic() + 60
        while len(httpx.get(f"{svc.url}/v1/cases").json()["cases"]) < 4:  # 2 rules x 2 runs, judged when idle
            assert time.monotonic() < deadline, "the runs were never judged"
            time.sleep(0.2)
        yield svc.url, looping
    finally:
        svc.stop()


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHAPEWATCH_AUTHOR", "ana")
    monkeypatch.delenv("SHAPEWATCH_TOKEN", raising=False)


def open_page(url: str, page: str, monkeypatch: pytest.MonkeyPatch, query: dict[str, str] | None = None) -> AppTest:
    monkeypatch.setenv("SHAPEWATCH_URL", url)
    at = AppTest.from_file(APP, default_timeout=30).run()
    at.query_params.update(query or {})
    at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.mark.slow
def test_the_runs_page_shows_a_runs_steps_in_order(runs_url: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    url, looping = runs_url
    at = open_page(url, "views/runs.py", monkeypatch, {"run": looping})
    listed, steps = (d.value for d in at.dataframe)
    assert looping in list(listed["run"])
    assert list(steps["kind"]) == ["tool_call", "tool_execution"] * 3 + ["output"]
    assert list(steps["tool / contract"]) == ["get_reservation"] * 6 + ["booking"]
    assert set(steps["release"]) == {"3.0.0"}
    assert [m.value for m in at.metric][:2] == ["7", "3"]
    at = open_page(url, "views/runs.py", monkeypatch, {"run": "no-such-run"})
    assert "No run" in visible(at.warning[0].value)


def test_a_case_is_accepted_from_the_cases_page(runs_url: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    url, looping = runs_url
    at = open_page(url, "views/cases.py", monkeypatch)
    (table,) = (d.value for d in at.dataframe)
    mine = {
        rule: case for case, rule, run in zip(table["case"], table["rule"], table["run"], strict=True) if run == looping
    }
    assert set(mine) == {"retry_loop", "repeated_call"}
    case_id = int(mine["retry_loop"])
    at.text_input(key=f"tool-{case_id}").input("get_reservation")
    at.text_input(key=f"args-{case_id}").input('{"id": "A1"}')
    at.text_input(key=f"note-{case_id}").input("loops on one booking")
    next(b for b in at.button if b.label == "Accept as a probe case" and b.key and str(case_id) in b.key).click().run()
    assert not at.exception, [e.value for e in at.exception]
    accepted = {c["case_id"]: c for c in httpx.get(f"{url}/v1/cases", params={"state": "accepted"}).json()["cases"]}
    case = accepted[case_id]
    assert (case["decided_by"], case["note"]) == ("ana", "loops on one booking")
    assert case["probe_case"]["expect"] == {"tool": "get_reservation", "arguments": {"id": "A1"}}
    at = open_page(url, "views/cases.py", monkeypatch)
    at.segmented_control(key="cases-state").set_value("accepted").run()
    assert len(at.get("download_button")) == 2  # the accepted cases as JSONL, and as probe suite cases (TOML)
    assert len(open_page(url, "views/cases.py", monkeypatch).get("download_button")) == 0  # open ones: none


@pytest.mark.parametrize("page", ["views/runs.py", "views/cases.py"])
def test_no_stored_value_of_a_run_renders_as_markdown(
    runs_url: tuple[str, str], page: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = runs_url
    at = open_page(url, page, monkeypatch, {"run": HOSTILE_RUN} if page == "views/runs.py" else None)
    strings = markdown_strings(at)
    _assert_inert(strings)
    if page == "views/cases.py":
        seen = " ".join(visible(s) for s in strings)
        assert HOSTILE_TOOL in seen and HOSTILE_RELEASE in seen
    else:
        assert HOSTILE_RUN in " ".join(visible(s) for s in strings)
