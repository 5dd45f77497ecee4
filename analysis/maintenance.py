"""Scheduled upkeep of the store, run by the service's APScheduler.

- compaction: folds the rollup rows that group commits appended into one row
  per key, so reading a window costs the same at 10 or 10,000 events/s;
- retention: deletes raw events older than ``raw_retention_days`` and idempotency keys
  older than ``dedup_ttl_days``.

The scheduler reckons in wall-clock time, so a clock stepped back (NTP, a VM restored,
an operator) would leave every interval job waiting out the jump: an hour back, and no
evaluation, page or compaction for an hour. A watcher thread compares the wall clock with
the monotonic one and, on a jump, moves each interval job's next run to where it stood in
real time (no burst of catch-up runs forward, no stall backward).

A job never raises into the scheduler: it logs, and counts its outcome in
``shapewatch_job_runs_total{job, outcome}``.

>>> scheduler = start_maintenance(store, settings, registry)   # doctest: +SKIP
>>> scheduler.shutdown()                                       # doctest: +SKIP
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger
from prometheus_client import CollectorRegistry, Counter

from shapewatch.collector import Settings, Store

__all__ = ["MaintenanceJobs", "start_maintenance", "watch_clock"]

log = logging.getLogger(__name__)


class MaintenanceJobs:
    """The jobs, callable directly (tests) or by the scheduler."""

    def __init__(self, store: Store, settings: Settings, registry: CollectorRegistry) -> None:
        self.store = store
        self.settings = settings
        self.runs = Counter(
            "shapewatch_job_runs_total",
            "Scheduled job runs, by job and outcome.",
            ["job", "outcome"],
            registry=registry,
        )

    def _guarded(self, name: str, job: Callable[[], str]) -> None:
        try:
            detail = job()
        except Exception:
            log.exception("scheduled job %s failed", name)
            self.runs.labels(name, "failed").inc()
            return
        log.info("scheduled job %s: %s", name, detail)
        self.runs.labels(name, "ok").inc()

    def compact(self) -> None:
        # The last two days hold nearly all appended rows; older buckets were folded already
        # (late events for them are folded by the daily full pass).
        since = datetime.now(UTC) - timedelta(days=2)
        self._guarded("compact", lambda: f"{self.store.compact(since)} rows folded")

    def fold(self) -> None:
        # Buckets that aged past a tier boundary move into hours and days (collector/tiers.py).
        self._guarded("fold", lambda: f"{self.store.fold_tiers()} rollup rows folded into their tiers")

    def compact_all(self) -> None:
        self._guarded("compact_all", lambda: f"{self.store.compact_by_day()} rows folded")

    def purge(self) -> None:
        def run() -> str:
            purged = self.store.purge(
                raw_retention=timedelta(days=self.settings.raw_retention_days),
                dedup_ttl=timedelta(days=self.settings.dedup_ttl_days),
            )
            return f"{purged.events} raw events and {purged.keys} idempotency keys deleted"

        self._guarded("purge", run)
        # Agent runs' steps are raw data too (with the inputs of model calls): kept as long as events.
        before = datetime.now(UTC) - timedelta(days=self.settings.raw_retention_days)
        self._guarded("purge_runs", lambda: f"{self.store.purge_runs(before)} agent runs deleted")


def start_maintenance(store: Store, settings: Settings, registry: CollectorRegistry) -> BackgroundScheduler:
    jobs = MaintenanceJobs(store, settings, registry)
    scheduler = BackgroundScheduler(
        timezone="UTC", job_defaults={"max_instances": 1, "coalesce": True, "misfire_grace_time": 300}
    )
    scheduler.add_job(jobs.compact, "interval", minutes=5, id="compact")
    scheduler.add_job(jobs.fold, "interval", minutes=10, id="fold")
    scheduler.add_job(jobs.compact_all, "interval", hours=24, id="compact_all")
    scheduler.add_job(jobs.purge, "interval", hours=1, id="purge", next_run_time=datetime.now(UTC))
    scheduler.start()
    watch_clock(scheduler)
    return scheduler


def watch_clock(scheduler: BackgroundScheduler, *, tick: float = 1.0, tolerance: float = 2.0) -> threading.Thread:
    """Follow wall-clock jumps of more than ``tolerance`` seconds while ``scheduler`` runs (see the
    module docstring); the thread ends when the scheduler is shut down."""

    pause = threading.Event()  # never set: its timed wait is a monotonic sleep

    def watch() -> None:
        offset = time.time() - time.monotonic()
        while True:
            pause.wait(tick)  # lasts ``tick`` whatever the wall clock does
            if not scheduler.running:
                return
            now_offset = time.time() - time.monotonic()
            jump = now_offset - offset
            if abs(jump) > tolerance:
                offset = now_offset
                try:
                    moved = _follow_clock_jump(scheduler, timedelta(seconds=jump))
                except Exception:  # the watcher must outlive a scheduler that is shutting down
                    log.exception("could not reschedule jobs after a clock jump")
                    continue
                log.warning("the wall clock jumped by %+.1f s; %d scheduled jobs keep their pace", jump, moved)

    thread = threading.Thread(target=watch, name="shapewatch-clock-watch", daemon=True)
    thread.start()
    return thread


def _follow_clock_jump(scheduler: BackgroundScheduler, jump: timedelta) -> int:
    now = datetime.now(UTC)
    moved = 0
    for job in scheduler.get_jobs():
        trigger = job.trigger
        if job.next_run_time is None:
            continue
        if isinstance(trigger, IntervalTrigger):
            # How long the job still had to wait, in real time, before the clock moved.
            left = min(max(job.next_run_time - (now - jump), timedelta(0)), trigger.interval)
            scheduler.reschedule_job(
                job.id,
                trigger=IntervalTrigger(seconds=trigger.interval.total_seconds(), start_date=now + left, timezone=UTC),
            )
        else:  # calendar jobs (the daily digest) follow the new wall clock
            scheduler.modify_job(job.id, next_run_time=trigger.get_next_fire_time(None, now))
        moved += 1
    return moved
