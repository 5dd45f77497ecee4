"""POST /v1/traces and GET /v1/runs against a running ``shapewatch serve``: a small agent program
instrumented with the real OpenTelemetry SDK exports with the real OTLP HTTP exporter (protobuf);
the same spans in OTLP JSON, an exporter's retry, spans with content capture off, and hostile
bodies (gzip bombs, garbage and deeply nested protobuf, deep JSON)."""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from google.rpc.status_pb2 import Status
from harness import Service, start_service
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace.export import SpanExportResult
from otlp_agent import SERVED, otlp_json, otlp_protobuf, run_agent, tracer_provider
from prometheus_client.parser import text_string_to_metric_families

from shapewatch.analysis.store_access import SCHEMAS
from shapewatch.collector import Store

TOKEN = "ingest+read:otlp-secret"
SECRET = "otlp-secret"
MAX_BODY = 256 * 1024
PROTOBUF = {"content-type": "application/x-protobuf"}
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    db = tmp_path_factory.mktemp("otlp") / "otlp.duckdb"
    s = start_service(db, env={"SHAPEWATCH_MAX_BODY_BYTES": str(MAX_BODY), "SHAPEWATCH_TOKENS": f"{TOKEN},read:reader"})
    yield s
    s.stop()


@pytest.fixture
def http(svc: Service) -> Iterator[httpx.Client]:
    with svc.client(SECRET) as c:
        yield c


def exporter(svc: Service) -> OTLPSpanExporter:
    return OTLPSpanExporter(endpoint=f"{svc.url}/v1/traces", headers={"Authorization": f"Bearer {SECRET}"}, timeout=30)


def events_stored(c: httpx.Client) -> int:
    return int(c.get("/healthz").json()["events"])


def span_metric(c: httpx.Client, outcome: str) -> float:
    text = c.get("/metrics").text
    for family in text_string_to_metric_families(text):
        if family.name == "shapewatch_otlp_spans":
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.labels.get("outcome") == outcome:
                    return float(sample.value)
    return 0.0


def run_of(c: httpx.Client, run_id: str) -> dict[str, Any]:
    r = c.get(f"/v1/runs/{run_id}")
    assert r.status_code == 200, r.text
    return r.json()


def steps(run: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [(e["kind"], e["tool"], e["contract"], e["finish_reason"], e["served_model"]) for e in run["events"]]


EXPECTED_STEPS = [
    ("tool_call", "get_reservation", "get_reservation", "tool_calls", SERVED),
    ("tool_execution", "get_reservation", "get_reservation", None, None),
    ("tool_call", "get_reservation", "get_reservation", "tool_calls", SERVED),
    ("tool_execution", "get_reservation", "get_reservation", None, None),
    ("output", None, "booking", "stop", SERVED),
]


def test_a_real_sdk_exporting_protobuf_stores_each_output_once_as_events_of_its_run(
    svc: Service, http: httpx.Client
) -> None:
    before = events_stored(http)
    exp = exporter(svc)
    provider, memory = tracer_provider("1.4.0", exp)
    run_agent(provider.get_tracer("agent"), ["A1", "B2"])
    provider.force_flush()
    spans = memory.get_finished_spans()
    trace_id = format(spans[0].context.trace_id, "032x")
    assert events_stored(http) == before + 3  # two tool calls and the structured output

    run = run_of(http, trace_id)
    assert steps(run) == EXPECTED_STEPS
    assert run["agent_releases"] == ["1.4.0"]
    assert run["contract_versions"] == {"booking": ["4"], "get_reservation": ["4"]}
    assert run["tool_calls"] == 2 and run["steps"] == 5
    hashes = [e["args_hash"] for e in run["events"] if e["kind"] == "tool_call"]
    assert len(set(hashes)) == 2  # different arguments, different identity

    cohorts = {
        (c["cohort"]["model"], c["cohort"]["prompt_version"], c["cohort"]["contract"])
        for c in http.get("/v1/cohorts").json()
    }
    assert {("gpt-4o", "booking-v2", "booking"), ("gpt-4o", "booking-v2", "get_reservation")} <= cohorts

    # The exporter retries the same spans: nothing is stored twice, the run is unchanged.
    assert exp.export(spans) is SpanExportResult.SUCCESS
    assert events_stored(http) == before + 3
    assert run_of(http, trace_id)["events"] == run["events"]

    # The same spans in OTLP JSON are the same events: every one a duplicate, none a conflict.
    r = http.post("/v1/traces", content=otlp_json(spans), headers=JSON)
    assert r.status_code == 200, r.text
    summary = r.json()["shapewatch"]
    assert (summary["accepted"], summary["duplicate"], summary["rejected"], summary["run_steps"]) == (0, 3, 0, 5)
    assert summary["skipped_by_reason"] == {"operation_not_mapped": 1}  # the invoke_agent span
    provider.shutdown()

    # And a run sent only as JSON is stored the same way as one sent as protobuf.
    provider2, memory2 = tracer_provider("1.4.0")
    run_agent(provider2.get_tracer("agent"), ["A1", "B2"])
    spans2 = memory2.get_finished_spans()
    r = http.post("/v1/traces", content=otlp_json(spans2), headers=JSON)
    assert r.json()["shapewatch"]["accepted"] == 3
    run2 = run_of(http, format(spans2[0].context.trace_id, "032x"))
    assert steps(run2) == EXPECTED_STEPS
    assert [e["args_hash"] for e in run2["events"]] == [e["args_hash"] for e in run["events"]]


def test_spans_with_content_capture_off_are_counted_by_reason_and_not_stored(svc: Service, http: httpx.Client) -> None:
    before, skipped = events_stored(http), span_metric(http, "content_not_captured")
    exp = exporter(svc)
    provider, memory = tracer_provider("1.4.0", exp)
    run_agent(provider.get_tracer("agent"), ["C3"], capture=False)
    provider.force_flush()
    assert events_stored(http) == before
    assert span_metric(http, "content_not_captured") == skipped + 2  # two chat spans without content
    # JSON answers say so, and protobuf answers carry it as partial success's warning.
    r = http.post("/v1/traces", content=otlp_json(memory.get_finished_spans()), headers=JSON)
    body = r.json()
    assert body["shapewatch"]["skipped_by_reason"] == {"content_not_captured": 2, "operation_not_mapped": 1}
    assert body["partialSuccess"]["rejectedSpans"] == 0
    assert "2 content_not_captured" in body["partialSuccess"]["errorMessage"]
    r = http.post("/v1/traces", content=otlp_protobuf(memory.get_finished_spans()), headers=PROTOBUF)
    assert r.headers["content-type"] == "application/x-protobuf"
    reply = ExportTraceServiceResponse.FromString(r.content)
    assert reply.partial_success.rejected_spans == 0
    assert "2 content_not_captured" in reply.partial_success.error_message
    assert events_stored(http) == before
    provider.shutdown()


def _span(**over: Any) -> dict[str, Any]:
    attrs = {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "m1",
        "gen_ai.output.messages": json.dumps(
            [{"role": "assistant", "parts": [{"type": "text", "content": '{"a": 1}'}]}]
        ),
    }
    span = {
        "traceId": os.urandom(16).hex(),
        "spanId": os.urandom(8).hex(),
        "name": "chat m1",
        "startTimeUnixNano": "1764590400000000000",
        "endTimeUnixNano": "1764590401000000000",
        "attributes": [{"key": k, "value": {"stringValue": v}} for k, v in attrs.items()],
    }
    span.update(over)
    return span


def _request(*spans: dict[str, Any]) -> bytes:
    return json.dumps({"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": list(spans)}]}]}).encode()


def test_spans_that_cannot_be_mapped_are_rejected_one_by_one_as_partial_success(http: httpx.Client) -> None:
    no_model = _span()
    no_model["attributes"] = [a for a in no_model["attributes"] if a["key"] != "gen_ai.request.model"]
    bad_id = _span(traceId="xyz")
    too_old = _span(endTimeUnixNano="5")
    good = _span()
    r = http.post("/v1/traces", content=_request(no_model, bad_id, good, too_old), headers=JSON)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["partialSuccess"]["rejectedSpans"] == 3
    summary = body["shapewatch"]
    assert (summary["accepted"], summary["rejected_spans"]) == (1, 3)
    assert [(e["index"], e["errors"][0]["path"]) for e in summary["errors"]] == [
        (0, "gen_ai.request.model"),
        (1, "traceId"),
        (3, "ts"),
    ]
    assert "span 0" in body["partialSuccess"]["errorMessage"]


def test_gzip_is_accepted_and_a_gzip_bomb_is_refused_once_it_decompresses_past_the_limit(
    svc: Service, http: httpx.Client
) -> None:
    r = http.post("/v1/traces", content=gzip.compress(_request(_span())), headers={**JSON, "content-encoding": "gzip"})
    assert r.status_code == 200 and r.json()["shapewatch"]["accepted"] == 1
    bomb = gzip.compress(b" " * (64 * MAX_BODY), compresslevel=9)
    assert len(bomb) < MAX_BODY
    r = http.post("/v1/traces", content=bomb, headers={**JSON, "content-encoding": "gzip"})
    assert r.status_code == 413, r.text
    assert r.json()["error"]["fields"] == [{"path": "body", "reason": f"over {MAX_BODY} bytes once decompressed"}]
    r = http.post("/v1/traces", content=b"\x1f\x8b garbage", headers={**PROTOBUF, "content-encoding": "gzip"})
    assert_status(r, 400, "(content-encoding: gzip: ")
    r = http.post("/v1/traces", content=bomb, headers={**PROTOBUF, "content-encoding": "gzip"})
    assert_status(r, 413, f"(body: over {MAX_BODY} bytes once decompressed)")
    r = http.post("/v1/traces", content=gzip.compress(b"{}")[:-6], headers={**JSON, "content-encoding": "gzip"})
    assert r.status_code == 400, r.text
    assert http.get("/healthz").status_code == 200


@pytest.mark.parametrize(
    "body",
    [
        b"\xff" * 1000,  # a field number and wire type that do not exist
        b"\x0a\xff\xff\xff\x0f",  # a length far past the end
        os.urandom(200_000),
    ],
    ids=["bad-tag", "truncated", "random"],
)
def test_garbage_protobuf_is_a_400_naming_the_body(http: httpx.Client, body: bytes) -> None:
    r = http.post("/v1/traces", content=body, headers=PROTOBUF)
    if r.status_code == 200:  # random bytes can happen to parse as unknown fields: then nothing is stored
        reply = ExportTraceServiceResponse.FromString(r.content)
        assert reply.partial_success.rejected_spans == 0
        return
    assert_status(r, 400, "body: not an ExportTraceServiceRequest in protobuf")


def assert_status(r: httpx.Response, status: int, says: str) -> None:
    """A protobuf request refused whole: a google.rpc.Status in protobuf, as OTLP/HTTP asks."""
    assert r.status_code == status, r.content[:300]
    assert r.headers["content-type"] == "application/x-protobuf"
    body = Status.FromString(r.content)
    assert body.code == {400: 3, 413: 8}[status]
    assert says in body.message, body.message


def _nested_protobuf(depth: int) -> bytes:
    req = ExportTraceServiceRequest()
    span = req.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.name = os.urandom(16), os.urandom(8), "chat"
    span.end_time_unix_nano = 1764590401000000000
    kv = span.attributes.add()
    kv.key = "deep"
    value = kv.value
    for _ in range(depth):  # arrays in arrays: two protobuf levels each
        value = value.array_value.values.add()
    value.string_value = "x"
    return bytes(req.SerializeToString())


def test_deeply_nested_values_are_refused_not_recursed_into(http: httpx.Client) -> None:
    # Past protobuf's own recursion limit: the body is refused.
    r = http.post("/v1/traces", content=_nested_protobuf(200), headers=PROTOBUF)
    assert_status(r, 400, "not an ExportTraceServiceRequest")
    # Within it (100 levels) but past the mapping's: that span is an error of its own.
    r = http.post("/v1/traces", content=_nested_protobuf(40), headers=PROTOBUF)
    assert r.status_code == 200
    reply = ExportTraceServiceResponse.FromString(r.content)
    assert reply.partial_success.rejected_spans == 1
    assert "attributes nested more than 32 levels" in reply.partial_success.error_message
    # JSON nested past what the parser takes is a 400; past the mapping's depth, a span error.
    deep: dict[str, Any] = {"stringValue": "x"}
    for _ in range(40):
        deep = {"kvlistValue": {"values": [{"key": "k", "value": deep}]}}
    r = http.post("/v1/traces", content=_request(_span(attributes=[{"key": "d", "value": deep}])), headers=JSON)
    assert r.json()["shapewatch"]["errors"][0]["errors"][0]["path"] == "attributes"
    r = http.post("/v1/traces", content=b'{"resourceSpans": ' + b"[" * 5000 + b"]" * 5000 + b"}", headers=JSON)
    assert r.status_code == 400 and r.json()["error"]["fields"][0]["path"] == "body"


@pytest.mark.parametrize(
    ("body", "path"),
    [
        (b'{"resourceSpans": {}}', "$.resourceSpans"),
        (b'{"resourceSpans": [1]}', "resourceSpans[0]"),
        (b'{"resourceSpans": [{"scopeSpans": [{"spans": ["x"]}]}]}', "resourceSpans[0].scopeSpans[0].spans[0]"),
        (b"[]", "$"),
        (b"not json", "body"),
    ],
)
def test_json_that_is_not_otlp_is_a_400_naming_where(http: httpx.Client, body: bytes, path: str) -> None:
    r = http.post("/v1/traces", content=body, headers=JSON)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["fields"][0]["path"] == path


def test_content_type_encoding_and_token_are_checked_first(svc: Service, http: httpx.Client) -> None:
    assert http.post("/v1/traces", content=b"{}", headers={"content-type": "text/plain"}).status_code == 415
    r = http.post("/v1/traces", content=b"{}", headers={**JSON, "content-encoding": "br"})
    assert r.status_code == 415
    with svc.client() as anonymous:
        assert anonymous.post("/v1/traces", content=b"{}", headers=JSON).status_code == 401
    with svc.client("reader") as reader:
        assert reader.post("/v1/traces", content=b"{}", headers=JSON).status_code == 403
        assert reader.get("/v1/runs").status_code == 200
    assert http.post("/v1/traces", content=b"{}", headers=JSON).json()["shapewatch"]["spans"] == 0


def test_the_run_routes_refuse_unknown_and_overlong_ids(http: httpx.Client) -> None:
    r = http.get("/v1/runs/" + "f" * 32)
    assert r.status_code == 404 and r.json()["error"]["fields"] == [{"path": "run_id", "reason": "unknown run"}]
    r = http.get("/v1/runs/" + "x" * 300)
    assert r.status_code == 422 and r.json()["error"]["fields"][0]["path"] == "run_id"
    assert http.get("/v1/runs", params={"limit": 0}).status_code == 422


@pytest.mark.slow
def test_events_keep_run_id_agent_release_served_model_and_finish_reason(tmp_path: Any) -> None:
    svc = start_service(tmp_path / "kept.duckdb")
    try:
        provider, memory = tracer_provider("2.0.0", OTLPSpanExporter(endpoint=f"{svc.url}/v1/traces", timeout=30))
        run_agent(provider.get_tracer("agent"), ["Z9"])
        provider.force_flush()
        trace_id = format(memory.get_finished_spans()[0].context.trace_id, "032x")
        provider.shutdown()
    finally:
        svc.stop()
    with Store.open(svc.db_path, read_only=True, schemas=SCHEMAS) as store:
        rows = store.query(
            "SELECT c.contract, e.run_id, e.agent_release, e.served_model, e.finish_reason, e.contract_version "
            "FROM events e JOIN cohorts c USING (cohort_id) ORDER BY e.ts, c.contract"
        )
    assert rows == [
        ("get_reservation", trace_id, "2.0.0", SERVED, "tool_calls", "4"),
        ("booking", trace_id, "2.0.0", SERVED, "stop", "4"),
    ]


@pytest.mark.slow
def test_run_show_prints_the_steps_in_order_from_the_service_and_from_the_file(tmp_path: Any) -> None:
    import subprocess

    from harness import ROOT, SHAPEWATCH

    svc = start_service(tmp_path / "show.duckdb")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        provider, memory = tracer_provider("5.1.0", OTLPSpanExporter(endpoint=f"{svc.url}/v1/traces", timeout=30))
        run_agent(provider.get_tracer("agent"), ["K1", "K1"])
        provider.force_flush()
        trace_id = format(memory.get_finished_spans()[0].context.trace_id, "032x")
        provider.shutdown()
        remote = subprocess.run(
            [*SHAPEWATCH, "run", "show", trace_id, "--url", svc.url, "--format", "json"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert remote.returncode == 0, remote.stderr
        table = subprocess.run(
            [*SHAPEWATCH, "run", "show", trace_id, "--url", svc.url],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        missing = subprocess.run(
            [*SHAPEWATCH, "run", "show", "nope", "--url", svc.url], capture_output=True, text=True, env=env, timeout=60
        )
    finally:
        svc.stop()
    view = json.loads(remote.stdout)
    assert [(e["kind"], e["tool"] or e["contract"]) for e in view["events"]] == [
        ("tool_call", "get_reservation"),
        ("tool_execution", "get_reservation"),
        ("tool_call", "get_reservation"),
        ("tool_execution", "get_reservation"),
        ("output", "booking"),
    ]
    lines = table.stdout.splitlines()
    assert lines[0] == f"run {trace_id}"
    assert lines[2] == "  agent releases: 5.1.0"
    assert lines[3] == "  contract versions: booking@4, get_reservation@4"
    steps_printed = [line.split()[2] for line in lines[6:]]
    assert steps_printed == ["tool_call", "tool_execution", "tool_call", "tool_execution", "output"]
    assert (missing.returncode, missing.stderr.strip()) == (
        2,
        "error: the service answered 404: no run 'nope' is stored",
    )
    local = subprocess.run(
        [*SHAPEWATCH, "run", "show", trace_id, "--db", str(svc.db_path), "--format", "json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert local.returncode == 0, local.stderr
    assert json.loads(local.stdout) == view


def test_envelopes_posted_with_a_run_id_make_a_run_in_order_once(http: httpx.Client) -> None:
    """An application that sends envelopes, not traces, gets the same run view."""
    run_id = "env-run-1"

    def env(i: int, contract: str, version: str, output: dict[str, Any], **tags: Any) -> dict[str, Any]:
        return {
            "event_id": f"{run_id}:{i}",
            "ts": f"2026-11-30T10:00:0{i}Z",
            "model": "gpt-4o",
            "prompt_version": "booking-v2",
            "contract": contract,
            "contract_version": version,
            "run_id": run_id,
            "agent_release": "7.0",
            "output": output,
            **tags,
        }

    body = [
        env(2, "booking", "4", {"status": "confirmed"}, finish_reason="stop"),  # sent out of order
        env(0, "get_reservation", "4", {"id": "A1"}, finish_reason="tool_calls"),
        env(1, "cancel", "2", {"id": "A1"}, attributes={"step": "tool_call"}),
    ]
    for attempt in range(2):  # the retry of the same request adds nothing
        r = http.post("/v1/outputs", json=body)
        assert r.status_code == 200, r.text
        assert [x["status"] for x in r.json()["results"]] == ["accepted" if attempt == 0 else "duplicate"] * 3
        run = run_of(http, run_id)
        assert [(e["kind"], e["tool"], e["contract"], e["event_id"]) for e in run["events"]] == [
            ("tool_call", "get_reservation", "get_reservation", f"{run_id}:0"),
            ("tool_call", "cancel", "cancel", f"{run_id}:1"),
            ("output", None, "booking", f"{run_id}:2"),
        ]
        assert (run["steps"], run["tool_calls"], run["agent_releases"]) == (3, 2, ["7.0"])
        assert run["contract_versions"] == {"booking": ["4"], "cancel": ["2"], "get_reservation": ["4"]}
