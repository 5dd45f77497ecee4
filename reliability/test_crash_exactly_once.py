"""Crash, exactly once: a Jepsen-style set test of the collector under repeated SIGKILL.

Client threads send unique event ids (single envelopes, JSON arrays and NDJSON bodies),
retrying each request with the same ids until it is answered 200, while the service is
SIGKILLed at random moments and restarted on the same file and port. Every id is tallied:

- ok: acknowledged (a 200 whose per-event status is accepted or duplicate);
- lost: acknowledged but absent after the final restart;
- duplicated: stored more than once, or counted more than once in the rollups;
- unexpected: stored but never sent.

Pass: lost = duplicated = unexpected = 0, every restart healthy in under 30 s, and the
rollups (events per cohort, per-path presence, per-value counts) equal what the stored
events say.
"""

from __future__ import annotations

import json
import random
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from fault_support import Daemon, spawn
from rel_support import make_envelope

from shapewatch.collector import Store

SEED = 20261207
COHORTS = (("m-a", "p1"), ("m-b", "p1"), ("m-a", "p2"))


def _run(tmp_path: Path, report: dict[str, object], *, clients: int, kills: int, budget: float, seed: int) -> None:
    t_start = time.monotonic()
    deadline = t_start + budget - 25  # time left to stop, reopen the file and check
    rng = random.Random(seed)
    db = tmp_path / "crash.duckdb"
    svc: Daemon = spawn(tmp_path, db)
    restarts = [svc.start(timeout=30)]

    lock = threading.Lock()
    sent: dict[str, dict[str, Any]] = {}
    acked: set[str] = set()
    problems: list[str] = []
    failures = Counter[str]()
    stop = threading.Event()

    def client(n: int) -> None:
        crng = random.Random(seed * 100 + n)
        seq = 0
        with httpx.Client(base_url=svc.url, timeout=10) as http:
            while not stop.is_set() and time.monotonic() < deadline:
                mode = ("single", "array", "ndjson")[seq % 3]
                size = 1 if mode == "single" else crng.randint(2, 30)
                envs = []
                for i in range(size):
                    model, prompt = COHORTS[crng.randrange(len(COHORTS))]
                    envs.append(
                        make_envelope(
                            event_id=f"c{n}-r{seq}-{i}",
                            model=model,
                            served_model=model,
                            prompt_version=prompt,
                            output={"n": crng.randint(0, 4), "who": f"c{n}"},
                        )
                    )
                seq += 1
                if mode == "single":
                    body, ctype = json.dumps(envs[0]).encode(), "application/json"
                elif mode == "array":
                    body, ctype = json.dumps(envs).encode(), "application/json"
                else:
                    body, ctype = "\n".join(json.dumps(e) for e in envs).encode(), "application/x-ndjson"
                with lock:
                    sent.update((e["event_id"], e) for e in envs)
                while time.monotonic() < deadline:  # the same request, same ids, until answered
                    try:
                        r = http.post("/v1/outputs", content=body, headers={"content-type": ctype})
                    except httpx.HTTPError as exc:
                        with lock:
                            failures[type(exc).__name__] += 1
                        stop.wait(0.05)  # retry pacing while the service is down
                        continue
                    if r.status_code == 200:
                        reply = r.json()
                        results = reply.get("results") or [{"status": reply.get("status", "accepted")}]
                        statuses = {x["status"] for x in results}
                        with lock:
                            if mode == "single" or statuses <= {"accepted", "duplicate"}:
                                acked.update(e["event_id"] for e in envs)
                            else:
                                problems.append(f"{envs[0]['event_id']}: {r.text[:200]}")
                        break
                    if r.status_code == 503 and r.headers.get("retry-after"):
                        with lock:
                            failures["503"] += 1
                        stop.wait(0.05)
                        continue
                    with lock:
                        problems.append(f"{envs[0]['event_id']}: HTTP {r.status_code} {r.text[:200]}")
                    break

    threads = [threading.Thread(target=client, args=(n,), name=f"set-client-{n}") for n in range(clients)]
    for t in threads:
        t.start()
    try:
        for _ in range(kills):
            stop.wait(rng.uniform(0.4, 2.0))  # a random moment under load: the point of the test
            svc.kill(signal.SIGKILL)
            restarts.append(svc.start(timeout=60))
        with lock:
            before = len(acked)
        # Traffic after the last restart too, so that its recovery is exercised.
        t_end = time.monotonic() + 10
        while time.monotonic() < t_end:
            with lock:
                if len(acked) >= before + 200:
                    break
            time.sleep(0.02)  # polling the clients' progress with a deadline
    finally:
        stop.set()
        for t in threads:
            t.join(max(deadline - time.monotonic(), 0) + 15)
        svc.stop()
    assert not any(t.is_alive() for t in threads), "a client thread did not finish in time"

    # The final restart: opening the file recovers whatever the last kill left (WAL, rollups).
    t0 = time.monotonic()
    with Store.open(db) as store:
        final_open = time.monotonic() - t0
        stored = dict(store.query("SELECT event_id, count(*) FROM events GROUP BY event_id"))
        rows = store.query(
            "SELECT event_id, c.model, c.prompt_version, e.output FROM events e JOIN cohorts c USING (cohort_id)"
        )
        buckets = dict(
            store.query(
                "SELECT c.model || '/' || c.prompt_version, sum(events) FROM cohort_buckets "
                "JOIN cohorts c USING (cohort_id) GROUP BY ALL"
            )
        )
        presence = dict(
            store.query(
                "SELECT c.model || '/' || c.prompt_version, sum(present) FROM field_rollups "
                "JOIN cohorts c USING (cohort_id) WHERE scope IS NULL AND path = 'n' GROUP BY ALL"
            )
        )
        values = dict(
            store.query(
                "SELECT c.model || '/' || c.prompt_version || '/' || value, sum(n) FROM value_rollups "
                "JOIN cohorts c USING (cohort_id) WHERE path = 'who' GROUP BY ALL"
            )
        )
    per_cohort = Counter(f"{m}/{p}" for _, m, p, _ in rows)
    per_value = Counter(f"{m}/{p}/{json.loads(o)['who']}" for _, m, p, o in rows)

    lost = acked - stored.keys()
    duplicated = {i for i, n in stored.items() if n > 1}
    unexpected = stored.keys() - sent.keys()
    changed = {i for i, _, _, o in rows if i in sent and json.loads(o) != sent[i]["output"]}
    rollup_diff = {k: (buckets.get(k), n) for k, n in per_cohort.items() if buckets.get(k) != n}
    rollup_diff |= {k: (n, per_cohort.get(k)) for k, n in buckets.items() if per_cohort.get(k) != n}
    presence_diff = {k: (presence.get(k), n) for k, n in per_cohort.items() if presence.get(k) != n}
    value_diff = {k: (values.get(k), n) for k, n in per_value.items() if values.get(k) != n}
    value_diff |= {k: (n, per_value.get(k)) for k, n in values.items() if per_value.get(k) != n}
    elapsed = time.monotonic() - t_start

    report.update(
        {
            "clients": clients,
            "kills (SIGKILL)": kills,
            "events sent": len(sent),
            "acknowledged (ok)": len(acked),
            "stored": len(stored),
            "stored but not acknowledged (sent, answer lost)": len(stored.keys() - acked),
            "lost": len(lost),
            "duplicated": len(duplicated),
            "unexpected": len(unexpected),
            "payload changed": len(changed),
            "rollup cohorts off": len(rollup_diff),
            "rollup presence off": len(presence_diff),
            "rollup values off": len(value_diff),
            "failed attempts (retried)": sum(failures.values()),
            "restart to healthy, s (first start included)": [round(x, 2) for x in restarts],
            "max restart to healthy, s": round(max(restarts[1:] or restarts), 2),
            "final reopen, s": round(final_open, 2),
            "elapsed, s": round(elapsed, 1),
        }
    )
    detail = (
        f"{report} problems={problems[:3]} lost={sorted(lost)[:5]} dup={sorted(duplicated)[:5]} "
        f"unexpected={sorted(unexpected)[:5]} rollups={list(rollup_diff.items())[:3]} "
        f"presence={list(presence_diff.items())[:3]} values={list(value_diff.items())[:3]}"
    )
    assert problems == [], detail
    assert (len(lost), len(duplicated), len(unexpected), len(changed)) == (0, 0, 0, 0), detail
    assert (rollup_diff, presence_diff, value_diff) == ({}, {}, {}), detail
    assert len(restarts) == kills + 1 and max(restarts) < 30, detail
    assert sum(failures.values()) > 0, "no request ever failed: the kills did not hit traffic\n" + detail
    assert len(acked) >= 100 * kills, "too little traffic to mean anything\n" + detail
    assert elapsed < budget, detail


@pytest.mark.reliability
def test_crash_exactly_once_under_repeated_sigkill(tmp_path: Path, report: dict[str, object]) -> None:
    """Crash, exactly once: clients with retries, 12 SIGKILLs at random moments"""
    _run(tmp_path, report, clients=4, kills=12, budget=240, seed=SEED)
