"""Hostile clients, contracts and documents against a real ``shapewatch serve``: one of them must never
stall, bloat or blind the service for everyone else.

Each scenario plays one class of attack seen against the service and measures what an
unrelated client, the service's memory or its descriptors went through:

- **contract traps:** a contract whose pattern backtracks (``^(a+)+$``) and one whose ``$ref``
  points at a local HTTP server, while a hostile client sends outputs that trigger them:
  an unrelated client's single-event requests keep a p99 under 100 ms, nothing is fetched;
- **rejection amplification:** six concurrent 13 MB batches of invalid envelopes: each reply
  under 1 MB, the service's RSS back within 300 MB of its start;
- **half-open connections:** 20,000 connections that send part of a request head: with all of
  them held, ``/healthz`` answers within 1 s (within 5 s while they are being opened as fast as
  two processes can), and the service holds at most ``max_connections`` of them;
- **the rest of the matrix:** a crafted baseline, out-of-range parameters, a retry in another
  key order, stored Markdown and HTML, a 300 MB admin body: each answered as it should be,
  no 5xx, every cohort still judged.

The unmarked ``_smoke`` scenarios run in ``make test`` at a smaller scale and judge what is
answered, stored and held, not how fast (timing in the default run is noise); the marked ones
run in ``make reliability``, judge the latency bars too, and write the figures into REPORT.md.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import duckdb
import httpx
import orjson
import pytest
from harness import SchemaServer
from hostile_support import make_envelope, peak_rss_mb, rss_mb, start_service
from load_support import pct

JSON = {"content-type": "application/json"}
BACKTRACKING = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^(a+)+$"}}}


@pytest.fixture
def schema_server() -> Iterator[SchemaServer]:
    with SchemaServer() as server:
        yield server


def _plant_remote_ref_contract(db: Path, url: str) -> None:
    """A contract version holding a remote $ref, as a file registered before references were
    checked would hold it (registration refuses it now)."""
    from shapewatch.collector import Store
    from shapewatch.collector.contracts import register_contract

    doc = {"type": "object", "properties": {"code": {"$ref": url}}}
    with Store.open(db) as store:
        register_contract(store, "codes", "2", {"type": "object"})
        tools = [{"name": None, "description": None, "format": "json_schema", "strict": None, "schema": doc}]
        with store.transaction("planting an old registration") as con:
            con.execute(
                "UPDATE contract_versions SET document = ?, tools = ? WHERE contract = 'codes' AND version = '2'",
                [orjson.dumps(doc).decode(), orjson.dumps(tools).decode()],
            )


def _contract_traps(
    tmp_path: Path,
    report: dict[str, object],
    server: SchemaServer,
    *,
    seconds: float,
    unrelated_requests: int,
    p99_bar: float | None,
) -> None:
    url = server.url + "/code.json"
    db = tmp_path / "traps.duckdb"
    _plant_remote_ref_contract(db, url)
    svc = start_service(db, env={"SHAPEWATCH_ROLLUP_MERGE_SECONDS": "1"})
    stop = threading.Event()
    hostile_acked = [0]
    try:
        with svc.client() as c:
            assert (
                c.post(
                    "/v1/contracts",
                    json={"contract": "codes", "version": "1", "author": "rel", "document": BACKTRACKING},
                ).status_code
                == 201
            )
            refused = c.post(
                "/v1/contracts",
                json={
                    "contract": "codes",
                    "version": "3",
                    "author": "rel",
                    "document": {"properties": {"code": {"$ref": url}}},
                },
            )
            report["registering a remote $ref: status"] = refused.status_code
            assert refused.status_code == 422

        def hostile() -> None:
            # 200 outputs a request, ten requests a second: half trip the pattern, half the reference
            trap = "a" * 4000 + "!"
            with svc.client() as h:
                while not stop.is_set():
                    batch = [
                        make_envelope(contract="codes", contract_version="1" if i % 2 else "2", output={"code": trap})
                        for i in range(200)
                    ]
                    r = h.post("/v1/outputs", json=batch)
                    assert r.status_code == 200, r.text
                    hostile_acked[0] += r.json()["accepted"]
                    stop.wait(0.1)

        attacker = threading.Thread(target=hostile, daemon=True)
        attacker.start()
        latencies: list[float] = []
        started = time.monotonic()
        with svc.client() as u:
            while len(latencies) < unrelated_requests or time.monotonic() - started < seconds:
                t0 = time.perf_counter()
                r = u.post("/v1/outputs", json=make_envelope(contract="unrelated"))
                latencies.append(time.perf_counter() - t0)
                assert r.status_code == 200 and r.json()["accepted"] == 1, r.text
        stop.set()
        attacker.join(30)
    finally:
        stop.set()
        svc.stop()
    with duckdb.connect(str(db), read_only=True) as con:
        statuses = dict(
            con.execute(
                "SELECT contract_version || ':' || status, sum(n)::BIGINT FROM contract_rollups "
                "WHERE contract_version IN ('1', '2') GROUP BY ALL"
            ).fetchall()
        )
    report["hostile outputs acknowledged"] = hostile_acked[0]
    report["unrelated requests"] = len(latencies)
    report["unrelated p50 / p99 / max ms"] = (
        f"{pct(latencies, 0.5) * 1000:.1f} / {pct(latencies, 0.99) * 1000:.1f} / {max(latencies) * 1000:.1f}"
    )
    report["fetches of the remote $ref"] = len(server.hits)
    report["contract counts (version:status)"] = ", ".join(f"{k} {v}" for k, v in sorted(statuses.items()))
    assert hostile_acked[0] > 0
    if p99_bar is not None:  # a measured bar: the long scenario only (timing in the default run is noise)
        assert pct(latencies, 0.99) < p99_bar
    assert len(server.hits) == 0
    # the pattern's outputs were checked (invalid, quota aside), the reference's never fetched
    assert statuses.get("1:invalid", 0) > 0 and "2:valid" not in statuses and "2:invalid" not in statuses


@pytest.mark.reliability
def test_contract_traps_stall_no_other_client(
    tmp_path: Path, report: dict[str, object], schema_server: SchemaServer
) -> None:
    """Contract traps: a backtracking pattern and a remote $ref under fire; an unrelated client's p99 under 100 ms"""
    _contract_traps(tmp_path, report, schema_server, seconds=30, unrelated_requests=1000, p99_bar=0.100)


@pytest.mark.slow
def test_contract_traps_smoke(tmp_path: Path, report: dict[str, object], schema_server: SchemaServer) -> None:
    """Contract traps, smoke: the same for 500 requests, every one answered (latency measured, not judged)"""
    _contract_traps(tmp_path, report, schema_server, seconds=5, unrelated_requests=500, p99_bar=None)


def _invalid_batch(target_bytes: int) -> bytes:
    # small envelopes (87 bytes), each missing its model: the most rejections a body can carry
    one = json.dumps(
        {"prompt_version": "intake-v3", "contract": "intake", "output": {"intent": "refund", "priority": "high"}}
    ).encode()
    n = target_bytes // (len(one) + 1)
    return b"[" + b",".join([one] * n) + b"]"


def _rejection_amplification(tmp_path: Path, report: dict[str, object], *, batches: int, size: int) -> None:
    svc = start_service(tmp_path / "amp.duckdb")
    body = _invalid_batch(size)
    try:
        with svc.client() as c:
            c.post("/v1/outputs", json=make_envelope())  # warm
        rss0, peak0 = rss_mb(svc), peak_rss_mb(svc)

        def send(_: int) -> tuple[int, int, int]:
            with httpx.Client(base_url=svc.url, timeout=120) as c:
                r = c.post("/v1/outputs", content=body, headers=JSON)
                return r.status_code, len(r.content), int(r.json().get("rejected", -1))

        with ThreadPoolExecutor(batches) as pool:
            replies = list(pool.map(send, range(batches)))
        peak = peak_rss_mb(svc)
        with svc.client() as c:  # the service still answers, and the next request settles its memory
            assert c.get("/healthz").status_code == 200
        rss1 = rss_mb(svc)
    finally:
        svc.stop()
    items = body.count(b'"prompt_version"')
    report["batches at once"] = batches
    report["body MB / invalid envelopes each"] = f"{len(body) / 1e6:.1f} / {items:,}"
    report["reply bytes (largest)"] = max(r[1] for r in replies)
    report["service RSS before / peak / after MB"] = f"{rss0:.0f} / {peak:.0f} / {rss1:.0f}"
    assert all(r[0] in (200, 503) for r in replies), replies  # 503: bodies held at once, with Retry-After
    assert any(r[0] == 200 and r[2] == items for r in replies)
    assert max(r[1] for r in replies) < 1_000_000
    assert rss1 - rss0 < 300
    report["peak RSS growth MB"] = round(peak - peak0, 1)


@pytest.mark.reliability
def test_invalid_batches_leave_memory_bounded(tmp_path: Path, report: dict[str, object]) -> None:
    """Rejection amplification: six concurrent 13 MB batches of invalid envelopes; replies under 1 MB, RSS back"""
    _rejection_amplification(tmp_path, report, batches=6, size=13_000_000)


@pytest.mark.slow
def test_invalid_batches_smoke(tmp_path: Path, report: dict[str, object]) -> None:
    """Rejection amplification, smoke: two concurrent 3 MB batches"""
    _rejection_amplification(tmp_path, report, batches=2, size=3_000_000)


_FLOOD = textwrap.dedent("""
    import socket, sys, time
    host, port, n, source = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    held, refused = [], 0
    for _ in range(n):
        try:
            s = socket.create_connection((host, port), timeout=5, source_address=(source, 0))
            s.sendall(b"POST /v1/outputs HTTP/1.1\\r\\nhost: x\\r\\ncontent-")
            held.append(s)
        except OSError:
            refused += 1
    print(len(held), refused, flush=True)
    sys.stdin.read()  # hold them until told to stop
""")


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _half_open(tmp_path: Path, report: dict[str, object], *, connections: int, procs: int, judge_latency: bool) -> None:
    svc = start_service(tmp_path / "fd.duckdb")
    host, port = svc.url.removeprefix("http://").split(":")
    floods: list[subprocess.Popen[str]] = []
    latencies: list[float] = []
    fds: list[int] = []
    try:
        fds0 = _fds(svc.proc.pid)
        for i in range(procs):  # from addresses of their own, as a flood comes (the probe uses 127.0.0.1)
            floods.append(
                subprocess.Popen(
                    [sys.executable, "-c", _FLOOD, host, port, str(connections // procs), f"127.0.0.{i + 2}"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )

        def probe(into: list[float]) -> None:
            t0 = time.perf_counter()
            r = httpx.get(svc.url + "/healthz", timeout=10)
            into.append(time.perf_counter() - t0)
            assert r.status_code == 200
            fds.append(_fds(svc.proc.pid))

        while not all(f.poll() is not None or _has_line(f) for f in floods):
            probe(latencies)  # while the connections are being opened, as fast as two processes can
        counts = [f.stdout.readline().split() if f.stdout else [] for f in floods]
        held: list[float] = []
        for _ in range(20):  # every connection opened, and held by the attackers
            probe(held)
        with svc.client() as c:
            ingest = c.post("/v1/outputs", json=make_envelope())
    finally:
        for f in floods:
            if f.poll() is None:
                f.communicate("", timeout=60)
        svc.stop()
    opened = sum(int(c[0]) for c in counts if c)
    report["half-open connections opened"] = opened
    report["healthz probes while the connections opened"] = len(latencies)
    report["healthz p50 / max ms while they opened"] = f"{pct(latencies, 0.5) * 1000:.1f} / {max(latencies) * 1000:.1f}"
    report["healthz p50 / max ms with all of them held"] = f"{pct(held, 0.5) * 1000:.1f} / {max(held) * 1000:.1f}"
    report["service descriptors before / most seen"] = f"{fds0} / {max(fds)}"
    assert opened >= connections * 0.95
    # Held, they cost the service nothing: 1 s is the bar. While they are opened as fast as two
    # processes on the same two cores can, every accept costs the service's event loop, so a probe
    # queues behind up to the listening backlog: answered, in bounded time.
    if judge_latency:  # the long scenario only: timing in the default run is noise
        assert max(held) < 1.0
        assert max(latencies) < 5.0
    assert ingest.status_code == 200
    # max_connections (1000) held once the flood is in; while it arrives, asyncio accepts up to
    # the listening backlog (2048) sockets a turn and the ones pushed out close a turn later, so
    # a burst holds a few thousand for a moment: far from the descriptor limit in any case
    import resource

    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    report["descriptor limit"] = limit
    report["service descriptors after the flood"] = fds[-1]
    assert max(fds) < limit // 2
    assert fds[-1] <= fds0 + 1000 + 20


def _has_line(f: subprocess.Popen[str]) -> bool:
    import select

    return bool(f.stdout and select.select([f.stdout], [], [], 0)[0])


@pytest.mark.reliability
def test_half_open_connections_do_not_blind_healthz(tmp_path: Path, report: dict[str, object]) -> None:
    """Half-open connections: 20,000 half-sent request heads held; /healthz answers within 1 s"""
    _half_open(tmp_path, report, connections=20_000, procs=2, judge_latency=True)


@pytest.mark.slow
def test_half_open_connections_smoke(tmp_path: Path, report: dict[str, object]) -> None:
    """Half-open connections, smoke: 3,000 half-sent request heads; every probe answered (latency measured)"""
    _half_open(tmp_path, report, connections=3_000, procs=1, judge_latency=False)


def _raw(url: str, head: bytes, timeout: float = 10) -> tuple[int, bytes]:
    """Send ``head`` (and whatever body it starts) on a socket of its own; the status and body answered."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(head)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        head_part, _, body = data.partition(b"\r\n\r\n")
        status = int(head_part.split()[1]) if head_part else 0
        length = next(
            (
                int(line.split(b":")[1])
                for line in head_part.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ),
            0,
        )
        while len(body) < length:
            chunk = s.recv(65536)
            if not chunk:
                break
            body += chunk
        return status, body


def _rehashed(doc: dict[str, Any]) -> dict[str, Any]:
    """A baseline document with its hash and id recomputed over its content, as anyone can."""
    import hashlib

    content = {k: v for k, v in doc.items() if k not in ("baseline_id", "hash", "created_at")}
    digest = hashlib.sha256(orjson.dumps(content, option=orjson.OPT_SORT_KEYS)).hexdigest()
    return {**doc, "hash": digest, "baseline_id": digest[:16]}


def _spoil(doc: Any) -> bool:
    """Make the first field count found a string ("present": "lots"); True when one was found."""
    if isinstance(doc, dict):
        if "present" in doc and isinstance(doc["present"], int):
            doc["present"] = "lots"
            return True
        return any(_spoil(v) for v in doc.values())
    if isinstance(doc, list):
        return any(_spoil(v) for v in doc)
    return False


@pytest.mark.slow
def test_hostile_matrix(tmp_path: Path, report: dict[str, object]) -> None:
    """Hostile matrix II: a crafted baseline, out-of-range and costly parameters, a re-serialized retry, stored
    Markdown, huge and stalled admin bodies; each answered as it should, no 5xx, every cohort judged"""
    from datetime import UTC, datetime, timedelta

    svc = start_service(tmp_path / "matrix.duckdb", env={"SHAPEWATCH_BODY_IDLE_SECONDS": "1"})
    got: dict[str, int] = {}
    want: dict[str, int] = {}
    slowest = 0.0
    try:
        with svc.client() as c:
            now = datetime.now(UTC).replace(microsecond=0)
            since, until = now - timedelta(hours=3), now - timedelta(hours=1)
            for cohort in ("a", "b"):
                envs = [
                    make_envelope(
                        model=f"m-{cohort}",
                        contract="intake",
                        ts=(since + timedelta(seconds=20 * i)).isoformat(),
                        output={"priority": ("low", "high")[i % 2], "note": "x"},
                    )
                    for i in range(300)
                ]
                assert c.post("/v1/outputs", json=envs).json()["accepted"] == 300
                r = c.post(
                    "/v1/baselines",
                    json={
                        "model": f"m-{cohort}",
                        "prompt_version": "intake-v3",
                        "contract": "intake",
                        "since": since.isoformat(),
                        "until": until.isoformat(),
                        "note": "reference",
                        "author": "rel",
                    },
                )
                assert r.status_code == 201, r.text
                baseline_id = r.json()["baseline_id"]
            doc = c.get(f"/v1/baselines/{baseline_id}").json()
            doc = doc.get("document", doc)
            assert _spoil(doc)

            def check(name: str, status: int, call: Any) -> httpx.Response:
                nonlocal slowest
                t0 = time.perf_counter()
                r = call()
                slowest = max(slowest, time.perf_counter() - t0)
                got[name], want[name] = r.status_code, status
                return r

            crafted = check(
                'baseline with "present": "lots", hash recomputed',
                422,
                lambda: c.post("/v1/baselines/import", json=_rehashed(doc)),
            )
            report["crafted baseline refused, naming"] = crafted.json()["error"]["fields"][0]["path"]
            for since_text in ("nand", "infd", "1e308d", "99999999999d", "10000d", "100000d"):
                check(f"review since={since_text}", 422, lambda s=since_text: c.get("/v1/review", params={"since": s}))
            check(
                "silence duration nanh",
                422,
                lambda: c.post(
                    "/v1/silences", json={"duration": "nanh", "author": "rel", "reason": "x", "contract": "intake"}
                ),
            )
            check(
                "cohorts until before since",
                422,
                lambda: c.get("/v1/cohorts", params={"since": now.isoformat(), "until": since.isoformat()}),
            )
            for year in ("0001", "9999"):
                check(
                    f"ts in year {year}",
                    422,
                    lambda y=year: c.post("/v1/outputs", json=make_envelope(ts=f"{y}-06-01T00:00:00Z")),
                )
            first = make_envelope(output={"a": 1, "b": {"c": [1, {"d": 2, "e": 3}]}})
            check("first send", 200, lambda: c.post("/v1/outputs", json=first))
            retry = {**first, "output": {"b": {"c": [1, {"e": 3, "d": 2}]}, "a": 1}}
            r = check("retry, keys in another order", 200, lambda: c.post("/v1/outputs", json=retry))
            report["retry in another key order answered"] = r.json()["results"][0]["status"]
            assert r.json()["duplicate"] == 1
            reused = {**first, "output": {"a": 2, "b": {"c": [1, {"d": 2, "e": 3}]}}}
            check("same id, another value", 422, lambda: c.post("/v1/outputs", json=reused))
            marked = [
                make_envelope(model="m-a", contract="intake", output={"priority": v, "note": v})
                for v in (
                    "![x](http://127.0.0.1:9/x.png)",
                    "<script>alert(1)</script>",
                    "[link](http://127.0.0.1:9/)",
                    "a|b\nc",
                )
            ]
            assert c.post("/v1/outputs", json=marked).json()["accepted"] == 4
            review = check("review as Markdown", 200, lambda: c.get("/v1/review", params={"format": "markdown"}))
            # an escaped character (a backslash before it) is text in Markdown, not markup
            unescaped = [m.group(0) for m in re.finditer(r"(?<!\\)(<script|!\[|\]\(http)", review.text)]
            report["unescaped <script, ![ or ](http in the Markdown review"] = len(unescaped)
            assert unescaped == [] and "alert\\(1\\)" in review.text
            run = check("analyzer run", 200, lambda: c.post("/v1/analyzer/run"))
            assert run.json()["ok"] is True
            last = c.get("/v1/analyzer/runs", params={"limit": 1}).json()[0]
            report["analyzer run: ok, cohorts judged, error"] = f"{last['ok']}, {last['cohorts']}, {last['error']}"
            assert (last["ok"], last["error"]) == (True, None) and last["cohorts"] >= 2
            rss0 = rss_mb(svc)
        for path in ("/v1/baselines/import", "/v1/silences"):
            t0 = time.perf_counter()
            status, _ = _raw(
                svc.url,
                f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                f"content-length: 300000000\r\n\r\n{{".encode(),
            )
            slowest = max(slowest, time.perf_counter() - t0)
            got[f"300 MB body to {path}"], want[f"300 MB body to {path}"] = status, 413
            status, _ = _raw(
                svc.url,
                f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                f'content-length: 100\r\n\r\n{{"dur'.encode(),
            )
            got[f"stalled body to {path}"], want[f"stalled body to {path}"] = status, 408
        report["service RSS growth after the 300 MB bodies MB"] = round(rss_mb(svc) - rss0, 1)
    finally:
        svc.stop()
    report["requests tried"] = len(got)
    for name, status in got.items():
        report[name] = status
    report["slowest answer (the stalled bodies aside) ms"] = round(slowest * 1000, 1)
    assert got == want
    assert slowest < 5.0
    log = svc.log.read_text()
    assert "Traceback" not in log, log[-3000:]
