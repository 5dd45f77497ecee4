"""Mined cases against a running service: a looping run exported by the real OpenTelemetry SDK
is judged once complete, queued under each rule it matches, and accepted as a probe case that
carries the run's first input and decision; decisions are final and checked."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from harness import Service, start_service
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from otlp_agent import QUESTION, run_agent, tracer_provider

from shapewatch.analysis.probes import parse_suite

ADMIN = "every-scope"

SUITE_MESSAGES = [{"role": "user", "content": "Is my booking A1 confirmed?"}]


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    db = tmp_path_factory.mktemp("cases") / "cases.duckdb"
    s = start_service(db, env={"SHAPEWATCH_RUN_IDLE_SECONDS": "1", "SHAPEWATCH_TOKENS": f"{ADMIN},read:reader"})
    yield s
    s.stop()


def cases_of(c: httpx.Client, run_id: str, timeout: float = 60.0) -> list[dict[str, Any]]:
    """The run's cases once the scheduled job judged it (polled with a deadline)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [x for x in c.get("/v1/cases").json()["cases"] if x["run_id"] == run_id]
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"no case for run {run_id} within {timeout}s")


@pytest.mark.slow
def test_a_looping_run_is_mined_and_accepted_as_a_probe_case(svc: Service) -> None:
    exporter = OTLPSpanExporter(endpoint=f"{svc.url}/v1/traces", headers={"Authorization": f"Bearer {ADMIN}"})
    provider, memory = tracer_provider("2.0.0", exporter)
    run_agent(provider.get_tracer("agent"), ["A1", "A1", "A1", "A1"])
    provider.force_flush()
    run_id = format(memory.get_finished_spans()[0].context.trace_id, "032x")
    provider.shutdown()
    with svc.client(ADMIN) as c:
        found = {x["rule"]: x for x in cases_of(c, run_id)}
        assert set(found) == {"retry_loop", "repeated_call"}
        loop = found["retry_loop"]
        assert (loop["state"], loop["agent_release"], loop["contract"], loop["model"]) == (
            "open",
            "2.0.0",
            "booking",
            "gpt-4o",
        )
        assert loop["detail"] == "tool 'get_reservation' called 3 or more times"
        expect = {"tool": "get_reservation", "arguments": {"id": "A1"}}
        r = c.post(f"/v1/cases/{loop['case_id']}/accept", json={"author": "ana", "note": "loops", "expect": expect})
        assert r.status_code == 200, r.text
        accepted = r.json()
        assert accepted["state"] == "accepted" and accepted["decided_by"] == "ana"
        assert accepted["probe_case"] == {
            "id": f"case-{loop['case_id']}",
            "contract": "booking",
            "prompt_version": "booking-v2",
            "model": "gpt-4o",
            "messages": QUESTION,
            "expect": expect,
            "observed": {"tool": "get_reservation", "arguments": {"id": "A1"}},
            "source": {
                "run_id": run_id,
                "rule": "retry_loop",
                "detail": loop["detail"],
                "agent_release": "2.0.0",
            },
            "note": "loops",
            "suite_case": {
                "id": f"case-{loop['case_id']}",
                "messages": SUITE_MESSAGES,
                "expect": {"tool": "get_reservation", "arguments": {"id": {"exact": "A1"}}},
            },
        }
        # the suite case is a case of the probe suite format, as it is
        suite = parse_suite(
            {"name": "mined", "provider": "openai", "model": "gpt-4o", "allow_alias": True,
             "prompt_version": "booking-v2", "contract": "booking-out",
             "tools": [{"name": "get_reservation"}], "cases": [accepted["probe_case"]["suite_case"]]}
        )  # fmt: skip
        assert suite.cases[0].expect is not None and suite.cases[0].expect.tool == "get_reservation"
        # exported: one JSON object per line, read back whole
        listed = c.get("/v1/cases", params={"state": "accepted"}).json()["cases"]
        lines = "\n".join(json.dumps(x["probe_case"]) for x in listed).splitlines()
        assert [json.loads(line) for line in lines] == [accepted["probe_case"]]
        # decisions are final; the other case is dismissed
        again = c.post(f"/v1/cases/{loop['case_id']}/dismiss", json={"author": "bo"})
        assert again.status_code == 409
        rep = found["repeated_call"]
        dismissed = c.post(f"/v1/cases/{rep['case_id']}/dismiss", json={"author": "bo"}).json()
        assert (dismissed["state"], dismissed["probe_case"]) == ("dismissed", None)
    # the run was judged once: its rollup and its cases are not counted again
    with svc.client(ADMIN) as c:
        assert len([x for x in c.get("/v1/cases").json()["cases"] if x["run_id"] == run_id]) == 2


@pytest.mark.parametrize(
    ("path", "body", "status", "field"),
    [
        ("/v1/cases/999999/accept", {"author": "ana"}, 404, None),
        ("/v1/cases/0/accept", {"author": "ana"}, 422, "case_id"),
        ("/v1/cases/1/accept", {"author": ""}, 422, "author"),
        ("/v1/cases/1/accept", {"author": "ana", "expect": {"tool": 3}}, 422, "expect"),
        ("/v1/cases/1/accept", {"author": "ana", "expect": {"no_tool": True, "tool": "x"}}, 422, "expect"),
        ("/v1/cases/1/accept", {"author": "ana", "surprise": 1}, 422, "surprise"),
    ],
)
def test_decisions_refuse_bad_requests_naming_the_field(
    svc: Service, path: str, body: dict[str, Any], status: int, field: str | None
) -> None:
    with svc.client(ADMIN) as c:
        r = c.post(path, json=body)
    # every refusal comes before the case is looked up, whether case 1 is decided or not
    assert r.status_code == status, r.text
    if field is not None:
        assert r.json()["error"]["fields"][0]["path"] == field


def test_reading_cases_needs_read_and_deciding_needs_admin(svc: Service) -> None:
    with svc.client("reader") as c:
        assert c.get("/v1/cases", params={"state": "open"}).status_code == 200
        assert c.post("/v1/cases/1/dismiss", json={"author": "x"}).status_code == 403
        r = c.get("/v1/cases", params={"state": "maybe"})
        assert r.status_code == 422 and r.json()["error"]["fields"][0]["path"] == "state"
