"""OTLP ingest benchmark: POST /v1/traces (protobuf and JSON) against POST /v1/outputs, one service, one run.

    .venv/bin/python bench/otlp.py [--runs 20000] [--spans-per-request 512] [--clients 4] [--json OUT]

One ``shapewatch serve`` on a free loopback port and a fresh database. Three phases, each with
its own agent runs (so nothing is a duplicate), every body built before its clock starts:

1. ``traces-protobuf``: runs of an agent as the GenAI conventions trace it (an ``invoke_agent``
   span, two ``chat`` spans each deciding one tool call, two ``execute_tool`` spans, a final
   ``chat`` span with a structured output: 6 spans, 3 events, 5 run steps), in
   ``ExportTraceServiceRequest`` bodies of ``--spans-per-request`` spans (the SDK's batch
   processor sends 512), protobuf;
2. ``traces-json``: the same in OTLP JSON;
3. ``outputs``: the envelopes those spans map to, posted to ``/v1/outputs`` as JSON arrays of
   the same number of events per request.

It prints spans/s and events/s of each phase and the ratio of OTLP's events/s to /v1/outputs'.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
SPANS_PER_RUN, EVENTS_PER_RUN = 6, 3
T0 = 1_764_590_400_000_000_000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _runs(phase: int, n: int) -> list[list[dict[str, Any]]]:
    """n runs, each a list of spans as plain dicts (ids hex, attributes a flat map)."""
    runs = []
    for r in range(n):
        trace = f"{phase:08x}{r:024x}"
        t = T0 + r * 10**6
        spans: list[dict[str, Any]] = [{"trace": trace, "span": f"{1:016x}", "end": t + 9000, "attrs": {"gen_ai.operation.name": "invoke_agent"}}]
        for i in range(2):
            call = {"type": "tool_call", "id": f"c{i}", "name": "get_reservation", "arguments": {"id": f"R{r % 97}-{i}"}}
            spans.append(
                {
                    "trace": trace,
                    "span": f"{2 + 2 * i:016x}",
                    "end": t + 1000 * (1 + 2 * i),
                    "attrs": {
                        "gen_ai.operation.name": "chat",
                        "gen_ai.request.model": "gpt-4o",
                        "gen_ai.response.model": "gpt-4o-2024-08-06",
                        "gen_ai.response.finish_reasons": "tool_calls",
                        "shapewatch.prompt_version": "booking-v2",
                        "shapewatch.contract": "booking",
                        "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [call], "finish_reason": "tool_calls"}]),
                    },
                }
            )
            spans.append(
                {
                    "trace": trace,
                    "span": f"{3 + 2 * i:016x}",
                    "end": t + 1000 * (2 + 2 * i),
                    "attrs": {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_reservation"},
                }
            )
        answer = {"status": ["confirmed", "pending", "cancelled"][r % 3], "reservations": [f"R{r % 97}-0", f"R{r % 97}-1"], "refund": r % 5 == 0, "amount": round(r % 1000 * 1.25, 2)}
        spans.append(
            {
                "trace": trace,
                "span": f"{6:016x}",
                "end": t + 8000,
                "attrs": {
                    "gen_ai.operation.name": "chat",
                    "gen_ai.request.model": "gpt-4o",
                    "gen_ai.response.model": "gpt-4o-2024-08-06",
                    "gen_ai.response.finish_reasons": "stop",
                    "shapewatch.prompt_version": "booking-v2",
                    "shapewatch.contract": "booking",
                    "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": json.dumps(answer)}], "finish_reason": "stop"}]),
                },
            }
        )
        runs.append(spans)
    return runs


def _chunks(runs: list[list[dict[str, Any]]], spans_per_request: int) -> list[list[dict[str, Any]]]:
    flat = [s for run in runs for s in run]
    return [flat[i : i + spans_per_request] for i in range(0, len(flat), spans_per_request)]


def _protobuf(spans: list[dict[str, Any]]) -> bytes:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    kv = rs.resource.attributes.add()
    kv.key, kv.value.string_value = "service.version", "1.0.0"
    ss = rs.scope_spans.add()
    for s in spans:
        sp = ss.spans.add()
        sp.trace_id, sp.span_id, sp.name = bytes.fromhex(s["trace"]), bytes.fromhex(s["span"]), "span"
        sp.start_time_unix_nano, sp.end_time_unix_nano = s["end"] - 500, s["end"]
        for k, v in s["attrs"].items():
            a = sp.attributes.add()
            a.key, a.value.string_value = k, v
    return bytes(req.SerializeToString())


def _json(spans: list[dict[str, Any]]) -> bytes:
    doc = {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "service.version", "value": {"stringValue": "1.0.0"}}]},
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": s["trace"],
                                "spanId": s["span"],
                                "name": "span",
                                "startTimeUnixNano": str(s["end"] - 500),
                                "endTimeUnixNano": str(s["end"]),
                                "attributes": [{"key": k, "value": {"stringValue": v}} for k, v in s["attrs"].items()],
                            }
                            for s in spans
                        ]
                    }
                ],
            }
        ]
    }
    return json.dumps(doc).encode()


def _envelopes(runs: list[list[dict[str, Any]]], events_per_request: int) -> list[bytes]:
    """The envelopes the mapping makes of these runs, as /v1/outputs bodies."""
    sys.path.insert(0, str(ROOT))
    from shapewatch.collector.otlp import OtlpMapping, OtlpSpan, map_spans

    spans = [
        OtlpSpan(s["trace"], s["span"], "span", s["end"] - 500, s["end"], s["attrs"], {"service.version": "1.0.0"})
        for run in runs
        for s in run
    ]
    envs = map_spans(spans, OtlpMapping()).envelopes
    return [json.dumps(envs[i : i + events_per_request]).encode() for i in range(0, len(envs), events_per_request)]


def _post_all(url: str, path: str, bodies: list[bytes], ctype: str, clients: int) -> tuple[float, dict[str, int]]:
    lock = threading.Lock()
    todo = list(reversed(bodies))
    totals = {"ok": 0, "failed": 0}

    def worker() -> None:
        with httpx.Client(base_url=url, timeout=120, headers={"content-type": ctype}) as c:
            while True:
                with lock:
                    if not todo:
                        return
                    body = todo.pop()
                r = c.post(path, content=body)
                with lock:
                    totals["ok" if r.status_code == 200 else "failed"] += 1

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, totals


def _events(url: str) -> int:
    return int(httpx.get(url + "/healthz", timeout=30).json()["events"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=20_000, help="agent runs per phase (6 spans, 3 events each)")
    p.add_argument("--spans-per-request", type=int, default=512, help="spans per OTLP request (the SDK batches 512)")
    p.add_argument("--clients", type=int, default=4, help="client threads")
    p.add_argument("--json", dest="json_out", help="also write the figures to this file")
    args = p.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="otlp-bench-"))
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    exe = Path(sys.executable).parent / "shapewatch"
    log = (workdir / "serve.log").open("wb")
    server = subprocess.Popen([str(exe), "serve", "--db", str(workdir / "bench.duckdb"), "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, env={**os.environ})
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                print("the service did not start; see", workdir / "serve.log")
                return 1
            time.sleep(0.1)
        spans_per_request = args.spans_per_request
        events_per_request = spans_per_request * EVENTS_PER_RUN // SPANS_PER_RUN
        phases = [
            ("traces-protobuf", "/v1/traces", "application/x-protobuf", [_protobuf(c) for c in _chunks(_runs(1, args.runs), spans_per_request)]),
            ("traces-json", "/v1/traces", "application/json", [_json(c) for c in _chunks(_runs(2, args.runs), spans_per_request)]),
            ("outputs", "/v1/outputs", "application/json", _envelopes(_runs(3, args.runs), events_per_request)),
        ]
        figures: dict[str, Any] = {"runs": args.runs, "spans_per_request": spans_per_request, "clients": args.clients}
        for name, path, ctype, bodies in phases:
            before = _events(url)
            seconds, totals = _post_all(url, path, bodies, ctype, args.clients)
            stored = _events(url) - before
            spans = args.runs * SPANS_PER_RUN if path == "/v1/traces" else 0
            figures[name] = {
                "seconds": round(seconds, 3),
                "requests": totals,
                "events_stored": stored,
                "events_per_s": round(stored / seconds),
                "spans_per_s": round(spans / seconds) if spans else None,
                "body_mib": round(sum(map(len, bodies)) / 2**20, 1),
            }
        base = figures["outputs"]["events_per_s"]
        print(f"{args.runs} runs per phase ({args.runs * SPANS_PER_RUN} spans, {args.runs * EVENTS_PER_RUN} events), {args.clients} clients")
        print(f"{'phase':<16} {'seconds':>8} {'spans/s':>9} {'events/s':>9} {'vs outputs':>10} {'MiB sent':>9} requests")
        for name, *_ in phases:
            f = figures[name]
            ratio = f["events_per_s"] / base if base else 0
            print(f"{name:<16} {f['seconds']:>8.2f} {f['spans_per_s'] or '-':>9} {f['events_per_s']:>9} {ratio:>10.2f} {f['body_mib']:>9} {f['requests']}")
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(figures, indent=2))
        failed = any(figures[n]["requests"]["failed"] or figures[n]["events_stored"] != args.runs * EVENTS_PER_RUN for n, *_ in phases)
        return 1 if failed else 0
    finally:
        server.terminate()
        server.wait(30)
        log.close()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
