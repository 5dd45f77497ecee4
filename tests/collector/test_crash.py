"""A 2xx means durable, even across SIGKILL: the crash test.

Client threads send batches of unique event ids and retry each batch (same ids)
until it is answered 200; meanwhile the service is SIGKILLed at random moments
and restarted on the same database and port. At the end every acknowledged id
must be stored exactly once, and nothing that was never sent may be stored.
"""

from __future__ import annotations

import json
import random
import signal
import threading
import time
from pathlib import Path

import duckdb
import httpx
import pytest
from harness import Service, free_port, make_envelope, start_service

from shapewatch.collector import Store

SEED = 20261129
CLIENTS = 4
BATCH = 20
KILLS = 5
BUDGET = 120.0  # seconds for the whole test


@pytest.mark.slow
def test_acknowledged_events_survive_sigkill_exactly_once(tmp_path: Path) -> None:
    t_start = time.monotonic()
    deadline = t_start + BUDGET - 20  # leave time to stop, read the db and report
    rng = random.Random(SEED)
    db, port = tmp_path / "crash.duckdb", free_port()
    svc: Service = start_service(db, port=port, timeout=30)
    url = svc.url

    lock = threading.Lock()
    sent: set[str] = set()
    acked: set[str] = set()
    problems: list[str] = []  # replies no retry loop should ever see
    failures = [0]  # connection errors and 5xx, i.e. the kills were felt
    stop = threading.Event()

    def client(n: int) -> None:
        crng = random.Random(SEED + n)
        with httpx.Client(base_url=url, timeout=5) as http:
            seq = 0
            while not stop.is_set() and time.monotonic() < deadline:
                ids = [f"c{n}-b{seq}-{i}" for i in range(BATCH)]
                seq += 1
                body = json.dumps(
                    [make_envelope(event_id=i, output={"n": crng.randint(0, 9), "who": n}) for i in ids]
                ).encode()
                with lock:
                    sent.update(ids)
                while time.monotonic() < deadline:  # the same batch, same ids, until a 200
                    try:
                        r = http.post("/v1/outputs", content=body, headers={"content-type": "application/json"})
                    except httpx.HTTPError:
                        r = None
                    if r is not None and r.status_code == 200:
                        statuses = {x["status"] for x in r.json()["results"]}
                        with lock:
                            if statuses <= {"accepted", "duplicate"}:
                                acked.update(ids)
                            else:
                                problems.append(f"batch {ids[0]}: {r.text[:300]}")
                        break
                    if r is not None and r.status_code < 500:
                        with lock:
                            problems.append(f"batch {ids[0]}: HTTP {r.status_code} {r.text[:300]}")
                        break
                    with lock:
                        failures[0] += 1
                    stop.wait(0.02)  # retry pacing while the service is down

    threads = [threading.Thread(target=client, args=(n,), name=f"crash-client-{n}") for n in range(CLIENTS)]
    for t in threads:
        t.start()
    restarts: list[float] = []
    try:
        for _ in range(KILLS):
            time.sleep(rng.uniform(0.3, 1.5))  # a random moment under load: the point of the test
            svc.stop(signal.SIGKILL)
            t0 = time.monotonic()
            svc = start_service(db, port=port, timeout=30)
            restarts.append(round(time.monotonic() - t0, 2))
        with lock:
            before = len(acked)
        # a little traffic after the last restart, so the last recovery is exercised too
        end_by = time.monotonic() + 10
        while time.monotonic() < end_by:
            with lock:
                if len(acked) >= before + CLIENTS * BATCH:
                    break
            time.sleep(0.01)
    finally:
        stop.set()
        for t in threads:
            t.join(max(deadline - time.monotonic(), 0) + 10)
        svc.stop()
    assert not any(t.is_alive() for t in threads), "a client thread did not finish in time"

    with duckdb.connect(str(db), read_only=True) as con:
        counts = dict(con.execute("SELECT event_id, count(*) FROM events GROUP BY event_id").fetchall())
    lost = acked - counts.keys()
    duplicated = {i for i, n in counts.items() if n > 1}
    unexpected = counts.keys() - sent
    elapsed = time.monotonic() - t_start
    report = (
        f"sent={len(sent)} acknowledged={len(acked)} stored={len(counts)} lost={len(lost)} "
        f"duplicated={len(duplicated)} unexpected={len(unexpected)} failed_attempts={failures[0]} "
        f"restart_seconds={restarts} elapsed={elapsed:.1f}s problems={problems[:3]} "
        f"examples lost={sorted(lost)[:5]} duplicated={sorted(duplicated)[:5]} "
        f"unexpected={sorted(unexpected)[:5]}"
    )
    print(report)  # noqa: T201  the figures, shown with -s
    assert not problems, report
    assert (len(lost), len(duplicated), len(unexpected)) == (0, 0, 0), report
    assert len(restarts) == KILLS and max(restarts) < 30, report
    assert failures[0] > 0, "no request ever failed: the kills did not hit traffic\n" + report
    assert len(acked) >= 20 * BATCH, "too little traffic to mean anything\n" + report
    assert elapsed < BUDGET, report

    # The counts survived the kills too: rollups deferred at each SIGKILL were rebuilt
    # from the stored events when the file was reopened (the last reopen is this one).
    with Store.open(db) as store:
        events = store.query("SELECT count(*) FROM events")[0][0]
        counted = store.query("SELECT coalesce(sum(events), 0) FROM cohort_buckets")[0][0]
        rows = store.query(
            "SELECT cohort_id, path, sum(present) FROM field_rollups WHERE scope IS NULL AND path = 'n' GROUP BY ALL"
        )
        present = store.query("SELECT cohort_id, count(*) FROM events GROUP BY ALL")
    assert counted == events, report
    assert sorted((c, n) for c, _, n in rows) == sorted(present), report
