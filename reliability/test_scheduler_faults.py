"""Scheduler faults: evaluations slower than their interval, a paused process, a kill during
a run, and wall-clock jumps (libfaketime), against a real ``shapewatch serve``.

The workspace drifts (two page alerts fire at the first evaluation) and pages a local
receiver. Evidence comes from the service's own records (``analyzer_runs``: started_at,
finished_at) and from the receiver. Pass, in every scenario: never two evaluations at
once (no run starts before the previous one finished), one catch-up after a pause or a
jump forward (not one per missed interval), evaluations resume after a jump back, and no
duplicate alert or page (each page fingerprint: episode 1, one trigger in the outbox, one
incident opened by one trigger).
"""

from __future__ import annotations

import itertools
import random
import signal
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import fault_support  # noqa: F401  (registers the tests' helpers that rel_support loads)
import httpx
import pytest
from fault_support import Daemon, FaultPager, ensure_faketime, spawn, wait_for
from fault_workspace import evidence, overlaps, seed_drift, utc_now, write_config

pytestmark = pytest.mark.reliability

DAY = timedelta(hours=24)


def _runs(c: httpx.Client) -> list[dict[str, Any]]:
    r = c.get("/v1/analyzer/runs", params={"limit": 1000})
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def _pages_once(pager: FaultPager, ev: dict[str, Any], report: dict[str, object]) -> None:
    fps = sorted(ev["alerts"])
    report["page fingerprints"] = len(fps)
    report["episodes per fingerprint"] = sorted(ep for _, ep in ev["alerts"].values())
    report["incidents per fingerprint"] = [len(pager.incidents_for(fp)) for fp in fps]
    report["triggers received per fingerprint"] = [sum(i.triggers for i in pager.incidents_for(fp)) for fp in fps]
    assert len(fps) == 2, ev["alerts"]
    assert all(ep == 1 for _, ep in ev["alerts"].values()), ev["alerts"]
    assert {k: v[0] for k, v in ev["outbox"].items() if k[1] == "trigger"} == {(fp, "trigger"): 1 for fp in fps}
    for fp in fps:
        assert [(i.open, i.triggers) for i in pager.incidents_for(fp)] == [(True, 1)], pager.incidents_for(fp)


def _start(tmp_path: Path, pager: FaultPager, *, interval: str, **kw: Any) -> Daemon:
    config = write_config(tmp_path / "shapewatch.toml", pager_url=pager.url, window="24h", interval=interval)
    return spawn(tmp_path, tmp_path / "sched.duckdb", config=config, **kw)


def _seed(svc: Daemon) -> None:
    with svc.client() as c:
        seed_drift(
            c, utc_now(), baseline_ago=timedelta(hours=40), drift_ago=timedelta(hours=10), drift_span=timedelta(hours=8)
        )


def _wait_paged(pager: FaultPager) -> None:
    wait_for("both page alerts to reach the pager", lambda: len(pager.open_incidents()) == 2, 40, 0.2)


def test_slow_evaluations_never_overlap(tmp_path: Path, report: dict[str, object]) -> None:
    """Scheduler: evaluations slower than their interval, and runs requested over HTTP meanwhile"""
    interval = 0.01  # shorter than any evaluation of the seeded workspace (about 15-400 ms here)
    with FaultPager() as pager:
        svc = _start(tmp_path, pager, interval=f"{interval}s")
        svc.start()
        try:
            _seed(svc)
            stop = threading.Event()
            manual: list[int] = []

            def hammer() -> None:
                with svc.client() as c:
                    while not stop.is_set():
                        manual.append(c.post("/v1/analyzer/run").status_code)

            threads = [threading.Thread(target=hammer) for _ in range(2)]
            for t in threads:
                t.start()
            try:
                _wait_paged(pager)
                with svc.client() as c:
                    n0 = len(_runs(c))
                    wait_for("40 more evaluations", lambda: len(_runs(c)) >= n0 + 40, 60, 0.2)
            finally:
                stop.set()
                for t in threads:
                    t.join(30)
        finally:
            svc.stop()
        ev = evidence(svc.db)
        log = svc.log_tail(200_000)
    runs = ev["runs"]
    slow = sum(1 for r in runs if r[4] > interval)
    report.update(
        {
            "interval, s": interval,
            "evaluations recorded": len(runs),
            "evaluations slower than the interval": slow,
            "runs requested over HTTP": len(manual),
            "max evaluation, s": round(max(r[4] for r in runs), 3),
            "skipped by the scheduler (max_instances)": log.count("maximum number of running instances"),
            "overlapping evaluations": overlaps(runs),
            "failed evaluations": sum(1 for r in runs if not r[3]),
        }
    )
    assert slow >= 10, "evaluations were not slower than the interval: the scenario tested nothing"
    assert set(manual) == {200}, manual[:20]
    assert overlaps(runs) == 0
    assert all(r[3] for r in runs)
    _pages_once(pager, ev, report)


def test_a_paused_service_catches_up_once(tmp_path: Path, report: dict[str, object]) -> None:
    """Scheduler: SIGSTOP for several intervals, then SIGCONT: one catch-up evaluation"""
    interval = 2.0
    with FaultPager() as pager:
        svc = _start(tmp_path, pager, interval="2s")
        svc.start()
        try:
            _seed(svc)
            _wait_paged(pager)
            with svc.client() as c:
                n0 = len(_runs(c))
                wait_for("two scheduled evaluations", lambda: len(_runs(c)) >= n0 + 2, 30, 0.1)
                last = max(r["started_at"] for r in _runs(c))
            from datetime import datetime

            grid = datetime.fromisoformat(last).timestamp()  # a scheduled start: the grid's phase
            assert svc.proc is not None
            svc.proc.send_signal(signal.SIGSTOP)
            paused_at = time.time()
            # Resume 0.3 s after a grid point at least 4 intervals on: the missed point is just
            # behind, the next one 1.7 s ahead, so "one catch-up" is one start in that gap.
            k = int((paused_at - grid) // interval) + 5
            cont_at = grid + k * interval + 0.3
            time.sleep(max(0.0, cont_at - time.time()))  # the pause itself is the fault under test
            svc.proc.send_signal(signal.SIGCONT)
            resumed = time.time()
            with svc.client() as c:
                wait_for(
                    "three evaluations after the pause",
                    lambda: (
                        sum(1 for r in _runs(c) if datetime.fromisoformat(r["started_at"]).timestamp() >= resumed) >= 3
                    ),
                    30,
                    0.1,
                )
        finally:
            svc.stop()
        ev = evidence(svc.db)
    starts = [r[1].timestamp() for r in ev["runs"]]
    during = [s for s in starts if paused_at + 0.2 < s < resumed]
    first_gap = [s for s in starts if resumed <= s < resumed + interval - 0.5]
    three = [s for s in starts if resumed <= s < resumed + 3 * interval - 0.5]
    report.update(
        {
            "interval, s": interval,
            "paused, s": round(resumed - paused_at, 1),
            "intervals missed": int((resumed - paused_at) // interval),
            "evaluations started during the pause": len(during),
            "evaluations in the first 1.5 s after SIGCONT (catch-up)": len(first_gap),
            "evaluations in the 5.5 s after SIGCONT": len(three),
            "catch-up delay, s": round(first_gap[0] - resumed, 3) if first_gap else None,
            "overlapping evaluations": overlaps(ev["runs"]),
        }
    )
    assert resumed - paused_at >= 4 * interval
    assert (len(during), len(first_gap), len(three)) == (0, 1, 3), (during, first_gap, three)
    assert overlaps(ev["runs"]) == 0
    _pages_once(pager, ev, report)


def test_kills_during_evaluations(tmp_path: Path, report: dict[str, object]) -> None:
    """Scheduler: SIGKILL during evaluations, restarts: no overlap, no duplicate alert or page"""
    rng = random.Random(9)
    with FaultPager() as pager:
        svc = _start(tmp_path, pager, interval="0.05s")
        svc.start()
        kills_in_run = 0
        try:
            _seed(svc)
            for _ in range(4):
                time.sleep(rng.uniform(0.5, 2.0))  # a random moment: evaluations run back to back
                with svc.client() as c:
                    before = _runs(c)[0]["run_id"] if _runs(c) else 0
                svc.kill(signal.SIGKILL)
                svc.start()
                with svc.client() as c:
                    kills_in_run += 1 if before else 0
            _wait_paged(pager)
            with svc.client() as c:
                n0 = len(_runs(c))
                wait_for("more evaluations after the last restart", lambda: len(_runs(c)) >= n0 + 10, 30, 0.1)
        finally:
            svc.stop()
        ev = evidence(svc.db)
        log = svc.log_tail(300_000)
    report.update(
        {
            "kills (SIGKILL)": 4,
            "evaluations recorded": len(ev["runs"]),
            "overlapping evaluations": overlaps(ev["runs"]),
            "failed evaluations": sum(1 for r in ev["runs"] if not r[3]),
        }
    )
    assert overlaps(ev["runs"]) == 0
    assert all(r[3] for r in ev["runs"]), [r for r in ev["runs"] if not r[3]][:3]
    assert "Traceback" not in log, log[-3000:]
    _pages_once(pager, ev, report)


def test_wall_clock_jumps_forward_and_back(tmp_path: Path, report: dict[str, object]) -> None:
    """Scheduler: the wall clock jumps 3 h forward, then back to 1 h behind (libfaketime): no burst, no stall"""
    lib = ensure_faketime()
    if lib is None:
        pytest.skip("libfaketime is not installed and could not be installed (apt-get install faketime)")
    interval = 2.0
    clock = tmp_path / "faketime.rc"
    clock.write_text("+0\n")
    env = {
        "LD_PRELOAD": lib,
        "FAKETIME_TIMESTAMP_FILE": str(clock),
        "FAKETIME_NO_CACHE": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_DONT_RESET": "1",
    }
    with FaultPager() as pager:
        svc = _start(tmp_path, pager, interval="2s", env=env)
        svc.start()
        segments: list[tuple[str, int, float]] = []  # (offset, last run_id before it, real time set)
        try:
            _seed(svc)
            _wait_paged(pager)
            with svc.client() as c:

                def run_ids() -> list[int]:
                    return [r["run_id"] for r in _runs(c)]

                def jump(offset: str) -> float:
                    last = max(run_ids(), default=0)
                    tmp = clock.with_suffix(".new")
                    tmp.write_text(offset + "\n")
                    tmp.replace(clock)  # atomic: libfaketime never reads a half-written offset
                    segments.append((offset, last, time.monotonic()))
                    # the service resumes evaluating: a run recorded after the jump
                    return wait_for(
                        f"an evaluation after the jump to {offset}",
                        lambda: max(run_ids(), default=0) > last,
                        3 * interval + 5,
                        0.05,
                    )

                wait_for("two evaluations", lambda: len(run_ids()) >= 2, 30, 0.1)
                after_forward = jump("+3h")
                wait_for("three more evaluations", lambda: len(run_ids()) >= len(segments) + 5, 30, 0.1)
                n_before_back = len(run_ids())
                after_back = jump("-1h")
                wait_for(
                    "three evaluations after the jump back",
                    lambda: len(run_ids()) >= n_before_back + 3,
                    4 * interval + 5,
                    0.1,
                )
        finally:
            svc.stop()
        ev = evidence(svc.db)
    runs = ev["runs"]
    # Compare runs within one clock segment only (a jump moves started_at by hours).
    bounds = [0] + [last for _, last, _ in segments] + [10**9]
    parts = [[r for r in runs if lo < r[0] <= hi] for lo, hi in itertools.pairwise(bounds)]
    overlapping = sum(overlaps(p[1:] if i else p) for i, p in enumerate(parts))
    bursts = sum(1 for p in parts for a, b in itertools.pairwise(p) if (b[1] - a[1]).total_seconds() < interval / 2)
    report.update(
        {
            "interval, s": interval,
            "evaluations before / after +3h / after -1h": [len(p) for p in parts],
            "seconds to an evaluation after +3h": round(after_forward, 2),
            "seconds to an evaluation after -1h (4 h back)": round(after_back, 2),
            "evaluations less than half an interval apart (catch-up bursts)": bursts,
            "overlapping evaluations": overlapping,
        }
    )
    # No stall: the next evaluation comes at its pace (an interval, plus the watcher's 1 s tick
    # and polling), not after the hour the clock went back.
    assert after_forward < 2 * interval + 1.5 and after_back < 2 * interval + 1.5
    assert (bursts, overlapping) == (0, 0)
    _pages_once(pager, ev, report)
