"""Load: a steady ingest rate on loopback while the analyzer evaluates every few seconds and a
dashboard-like client polls the read API, against a real ``shapewatch serve``.

The workspace: 10,000 realistic envelopes (bench/gen.py, five cohorts) two to three hours ago,
frozen as one active baseline per cohort, so every evaluation compares a real window (the
analyzer's window is 1 h: the load only) against real baselines. Then the generator offers a
fixed rate in batches, paced by the clock (load_support.py), and a poller reads what the
dashboard reads (open alerts, cohorts, analyzer runs, /metrics, one cohort's field profile)
at a fixed refresh period.

The offered rate is a fixed fraction of the collector's benchmark: HTTP batch ingest measured
about 8,000 events/s on this 2-core machine with 1,000-event bodies and nothing else running.
Here the same two cores also run the generator, the poller, the analyzer every 5 s, and other
people's test runs (load averages of 4-7 were seen), so the default is 2,000 events/s in
bodies of 500 (the SDK's default batch size): 4 requests/s. At 3,000 events/s in 250-event
bodies the service needed about 0.3 CPU-ms per event and fell behind whenever the machine was
shared (see the issue report); at 2,000 x 500 it needs about 0.5 of a core. It is a
steady-state test, not a capacity test.

Pass (each can fail): achieved rate >= 95% of the offered rate over the run (acknowledged events
per second between the first answer and the last, so a short run's latency does not count
as a shortfall while falling behind does); zero 5xx, zero other non-200, zero transport
errors, zero rejected or duplicate events, in ingest and reads; every acknowledged event is in
the file after the service stopped (read with DuckDB, event id by event id); at least half the
analyzer runs the interval allows completed during the load, all of them ok, and they compared
something (checks > 0); no error, lock, writer or traceback line in the service log; ingest p99
(from send to answer) under 5 s. The bound is half the SDK's 10 s request timeout
(collector/sdk.py): below it no client times out and retries, which is what would turn
latency into duplicate work. It is not a tuning target: a few commits take 1-2.5 s here (shapewatch_commit_seconds;
most likely those that run DuckDB's automatic checkpoint), and a shared machine stretches them.

Environment: ``SHAPEWATCH_LOAD_SECONDS`` (the marked run's length, default 180),
``SHAPEWATCH_LOAD_RATE`` (events/s, default 2000), ``SHAPEWATCH_LOAD_BATCH`` (events per
request, default 500), ``SHAPEWATCH_LOAD_POLL`` (seconds between the poller's refreshes,
default 5: three dashboards open at the default 15 s refresh).
"""

from __future__ import annotations

import itertools
import math
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import fault_support  # noqa: F401  (registers the tests' helpers that rel_support loads)
import httpx
import pytest
from fault_support import spawn
from load_support import (
    LoadPlan,
    Poller,
    cpu_seconds,
    histogram_counts,
    log_problems,
    pct,
    run_load,
    seed_baselines,
    stored_sequence_numbers,
    summary,
    write_config,
)

RATE = float(os.environ.get("SHAPEWATCH_LOAD_RATE", "2000"))
BATCH = int(os.environ.get("SHAPEWATCH_LOAD_BATCH", "500"))
LONG_SECONDS = float(os.environ.get("SHAPEWATCH_LOAD_SECONDS", "180"))
POLL_SECONDS = float(os.environ.get("SHAPEWATCH_LOAD_POLL", "5"))

MIN_RATE_SHARE = 0.95
MAX_INGEST_P99 = 5.0


def _runs_since(c: httpx.Client, since: datetime) -> list[dict[str, Any]]:
    r = c.get("/v1/analyzer/runs", params={"limit": 1000})
    assert r.status_code == 200, r.text
    return [run for run in r.json() if datetime.fromisoformat(run["started_at"]) >= since]


def _scenario(tmp_path: Path, report: dict[str, object], *, seconds: float, interval: float) -> None:
    config = write_config(tmp_path / "shapewatch.toml", interval=f"{interval:g}s", window="1h")
    db = tmp_path / "load.duckdb"
    svc = spawn(tmp_path, db, config=config)
    plan = LoadPlan(rate=RATE, batch=BATCH, seconds=seconds, prefix=f"load-{int(time.time())}-")
    report["offered"] = (
        f"{plan.rate:,.0f} events/s for {plan.seconds:g} s: {plan.batches:,} bodies of "
        f"{plan.batch} from {plan.workers} workers, one every {plan.period * 1000:.0f} ms"
    )
    report["analyzer interval, s"] = interval
    report["dashboard poll period, s"] = POLL_SECONDS
    report["load average before (1 min)"] = os.getloadavg()[0]
    svc.start()
    try:
        assert svc.proc is not None
        with svc.client() as c:
            seeded = seed_baselines(c, datetime.now(UTC))
            report["baseline events seeded (5 cohorts, 5 baselines)"] = sum(seeded.values())
            cohort_id = int(c.get("/v1/cohorts").json()[0]["cohort_id"])
        began = datetime.now(UTC)
        cpu0, wall0, own0 = cpu_seconds(svc.proc.pid), time.monotonic(), time.process_time()
        pid = svc.proc.pid
        cpu_marks: list[float] = []  # the service's CPU seconds at each 10 s mark of the plan

        def tick(elapsed: float) -> None:
            if elapsed >= 10 * len(cpu_marks):
                cpu_marks.append(cpu_seconds(pid))

        with Poller(svc.url, POLL_SECONDS, cohort_id) as poller:
            result = run_load(svc.url, plan, on_tick=tick)
        service_cpu = cpu_seconds(svc.proc.pid) - cpu0
        wall = time.monotonic() - wall0
        client_cpu = time.process_time() - own0
        with svc.client() as c:
            runs = _runs_since(c, began)
            health = c.get("/healthz").json()
            commits = histogram_counts(c.get("/metrics").text, "shapewatch_commit_seconds")
    finally:
        svc.stop()
    exit_code = svc.proc.returncode if svc.proc is not None else None

    # --- figures -----------------------------------------------------------------------------
    outcomes = result.outcomes()
    counts = {k: sum(s.counts.get(k, 0) for s in result.sent) for k in ("accepted", "duplicate", "rejected")}
    slices = result.slice_rates(10.0)
    achieved = result.sustained_rate()
    lat, lat_due, late = result.latencies(), result.latencies_from_due(), result.lateness()
    acked = result.acked_sequence_numbers()
    stored = set(stored_sequence_numbers(db, plan.prefix))
    missing = acked - stored
    problems = log_problems(svc.log_tail(10**7))
    read_lat = [x for v in poller.result.latencies.values() for x in v]
    run_seconds = [float(r["duration_seconds"]) for r in runs]
    expected_runs = seconds / interval
    min_runs = max(1, math.floor(expected_runs / 2))

    report["events offered"] = result.offered_events
    report["events acknowledged (accepted + duplicate)"] = result.acked_events
    report["accepted / duplicate / rejected"] = (
        f"{counts['accepted']:,} / {counts['duplicate']:,} / {counts['rejected']:,}"
    )
    report["achieved rate, events/s (first due time to last answer)"] = result.achieved_rate()
    report["achieved rate, events/s (first answer to last answer)"] = achieved
    report["achieved / offered (first answer to last answer)"] = achieved / plan.rate
    report["10 s slices: min / max events/s"] = (
        f"{min(slices, default=0):,.0f} / {max(slices, default=0):,.0f} over {len(slices)} slices"
    )
    report["10 s slices, events/s"] = " ".join(f"{x:.0f}" for x in slices)
    cpu_per_slice = [b - a for a, b in itertools.pairwise(cpu_marks)]
    report["service CPU per 10 s slice, share of one core"] = " ".join(f"{c / 10:.2f}" for c in cpu_per_slice) or "-"
    report["ingest requests by outcome"] = dict(sorted(outcomes.items()))
    report["ingest latency p50 / p99 / max, ms (send to answer)"] = summary(lat)
    report["ingest latency p50 / p99 / max, ms (due time to answer)"] = summary(lat_due)
    report["send lateness p50 / p99 / max, ms"] = summary(late)
    report["commits (whole service life) / over 0.25 s / over 1 s"] = (
        f"{commits.get('count', 0):,.0f} / {commits.get('count', 0) - commits.get('0.25', 0):,.0f} / "
        f"{commits.get('count', 0) - commits.get('1.0', 0):,.0f}"
    )
    report["dashboard reads by outcome"] = dict(sorted(poller.result.outcomes.items()))
    report["dashboard reads p50 / p99 / max, ms (all)"] = summary(read_lat)
    report["dashboard reads p50 / p99, ms, per route"] = "; ".join(
        f"{k} {pct(v, 0.5) * 1000:.0f}/{pct(v, 0.99) * 1000:.0f}" for k, v in poller.result.latencies.items()
    )
    report["analyzer runs during the load (ok / all; at least)"] = (
        f"{sum(1 for r in runs if r['ok'])} / {len(runs)}; {min_runs}"
    )
    report["analyzer run seconds p50 / max"] = f"{pct(run_seconds, 0.5):.2f} / {max(run_seconds, default=0):.2f}"
    ordered = [float(r["duration_seconds"]) for r in sorted(runs, key=lambda r: r["run_id"])]
    report["analyzer run seconds, first 5 / last 5"] = (
        " ".join(f"{x:.2f}" for x in ordered[:5]) + " / " + " ".join(f"{x:.2f}" for x in ordered[-5:])
    )
    report["analyzer checks per run (max)"] = max((int(r["checks"] or 0) for r in runs), default=0)
    report["acknowledged events missing from the file"] = len(missing)
    report["events in the file (healthz, before stop)"] = health.get("events")
    report["service CPU, share of one core"] = service_cpu / wall
    report["load generator + poller CPU, share of one core"] = client_cpu / wall
    report["load average after (1 min)"] = os.getloadavg()[0]
    report["service log lines naming an error, lock or the writer"] = len(problems)
    report["service exit code (SIGTERM: -15 is normal)"] = exit_code

    # --- pass criteria ---------------------------------------------------------------------------
    assert not problems, "\n".join(problems[:20])
    assert outcomes == {"ok": plan.batches}, dict(outcomes)
    assert counts["rejected"] == 0 and counts["duplicate"] == 0, counts
    assert result.acked_events == result.offered_events
    assert not missing, f"{len(missing)} acknowledged events are not in the file, e.g. {sorted(missing)[:5]}"
    assert poller.result.outcomes.keys() <= {"ok"}, dict(poller.result.outcomes)
    assert achieved >= MIN_RATE_SHARE * plan.rate, f"achieved {achieved:,.0f} of {plan.rate:,.0f} events/s"
    assert pct(lat, 0.99) < MAX_INGEST_P99, f"ingest p99 {pct(lat, 0.99):.2f} s"
    assert all(r["ok"] for r in runs), [r for r in runs if not r["ok"]]
    assert len(runs) >= min_runs, f"{len(runs)} analyzer runs in {seconds:g} s at every {interval:g} s"
    assert any(int(r["checks"] or 0) > 0 for r in runs), "no evaluation compared anything"


@pytest.mark.slow
def test_load_smoke(tmp_path: Path, report: dict[str, object]) -> None:
    """Load (smoke, 10 s): steady ingest while the analyzer runs and the dashboard polls"""
    _scenario(tmp_path, report, seconds=10, interval=3)


@pytest.mark.reliability
def test_load_sustained(tmp_path: Path, report: dict[str, object]) -> None:
    """Load: steady ingest for minutes while the analyzer runs and the dashboard polls"""
    _scenario(tmp_path, report, seconds=LONG_SECONDS, interval=5)
