"""Scale-out throughput end to end: HTTP clients -> 2 collectors -> NATS JetStream (3 nodes, R3,
sync_interval always) -> 1 or 2 workers -> DuckLake (PostgreSQL catalog, Parquet on local disk).

Two modes, each with 1 and 2 workers: concurrent (workers run while clients send) and backlog
(workers start once every event is acknowledged: their own rate). For each run a fresh loopback cluster (tests/cluster/cluster_harness.py) takes N events
from 6 client threads (250 per request); printed: the time until every event was acknowledged
(the collectors' and JetStream's rate), the time until every event was stored in the lake (end
to end), and where the workers' time went (their own progress logs: time inside the lake's
write, events per commit).

    .venv/bin/python bench/scaleout.py [N]        # default 40,000 events

Figures from a shared 2-core machine are indicative: the NATS nodes, PostgreSQL, the collectors,
the workers and the clients all share the two cores.
"""

from __future__ import annotations

import re
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "cluster"))
sys.path.insert(0, str(ROOT / "tests" / "analysis"))
from cluster_harness import Cluster  # noqa: E402
from drift_outputs import output  # noqa: E402

from shapewatch.collector.store.lake import LakeConfig, LakeWriter  # noqa: E402

PER_REQUEST = 250


def events(n: int) -> list[dict]:
    return [
        {
            "event_id": f"b-{i:08d}",
            "ts": f"2026-11-29T{(i // 3600) % 24:02d}:{(i // 60) % 60:02d}:{i % 60:02d}Z",
            "model": "gpt-4o-2024-08-06",
            "prompt_version": f"triage-v{i % 4}",
            "contract": "intake",
            "output": output(i),
        }
        for i in range(n)
    ]


def run(workers: int, n: int, *, backlog: bool = False) -> dict:
    """``backlog``: the workers start only once every event is acknowledged, so the time to
    store them all is the workers' alone (what one more worker buys)."""
    root = Path(tempfile.mkdtemp(prefix=f"bench-scaleout-{workers}w-"))
    cluster = Cluster(root, collectors=2, workers=0 if backlog else workers)
    cluster.start()
    try:
        assert cluster.pg is not None
        lake = LakeWriter.open(LakeConfig(cluster.pg.dsn, f"{root / 'lake'}/"))
        evs = events(n)
        bodies = [orjson.dumps(evs[i : i + PER_REQUEST]) for i in range(0, n, PER_REQUEST)]
        lock = threading.Lock()
        turn = [0]

        def send(body: bytes) -> None:
            with httpx.Client(timeout=60) as http:
                while True:
                    with lock:
                        url = cluster.urls[turn[0] % len(cluster.urls)]
                        turn[0] += 1
                    try:
                        r = http.post(f"{url}/v1/outputs", content=body, headers={"content-type": "application/json"})
                        if r.status_code == 200:
                            return
                    except httpx.HTTPError:
                        pass
                    time.sleep(0.2)

        t0 = time.monotonic()
        with ThreadPoolExecutor(6) as pool:
            list(pool.map(send, bodies))
        acked = time.monotonic() - t0
        if backlog:
            for i in range(workers):
                proc = cluster.worker(f"w{i}")
                cluster.worker_procs.append(proc)
                proc.start()
            t0 = time.monotonic()  # from the workers' start: their start-up (about 5 s) counts
        while lake.query("SELECT count(*) FROM events")[0][0] < n:
            time.sleep(0.25)
        stored = time.monotonic() - t0
        lake.close()
    finally:
        cluster.stop()
    write_s = batches = 0.0
    for p in root.glob("worker-*.log"):
        for m in re.finditer(r"(\d+) batches, (\d+) events .*? in ([\d.]+) s, ([\d.]+) s of it writing", p.read_text()):
            batches += int(m.group(1))
            write_s += float(m.group(4))
    return {
        "mode": "backlog (workers start after ingest)" if backlog else "concurrent",
        "workers": workers,
        "events": n,
        "acknowledged_s": round(acked, 1),
        "stored_s_counts_from": "workers' start" if backlog else "first request",
        "ingest_events_per_s": round(n / acked),
        "stored_s": round(stored, 1),
        "end_to_end_events_per_s": round(n / stored),
        "worker_commits": int(batches),
        "events_per_commit": round(n / max(batches, 1)),
        "worker_seconds_in_lake_writes": round(write_s, 1),
    }


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 40_000
    for backlog in (False, True):
        for workers in (1, 2):
            print(orjson.dumps(run(workers, n, backlog=backlog)).decode(), flush=True)


if __name__ == "__main__":
    main()
