"""Scheduled upkeep of the store, run by the service's APScheduler.

- compaction: folds the rollup rows that group commits appended into one row
  per key, so reading a window costs the same at 10 or 10,000 events/s;
- retention: deletes raw events older than ``raw_retention_days``.

A job never raises into the scheduler: it logs, and counts its outcome in
``shapewatch_job_runs_total{job, outcome}``.

>>> scheduler = start_maintenance(store, settings, registry)   # doctest: +SKIP
>>> scheduler.shutdown()                                       # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from apscheduler.schedulers.background import BackgroundScheduler
from prometheus_client import CollectorRegistry, Counter

from collector import Settings, Store

__all__ = ["start_maintenance", "MaintenanceJobs"]

log = logging.getLogger(__name__)


class MaintenanceJobs:
    """The jobs, callable directly (tests) or by the scheduler."""

    def __init__(self, store: Store, settings: Settings, registry: CollectorRegistry) -> None:
        self.store = store
        self.settings = settings
        self.runs = Counter("shapewatch_job_runs_total", "Scheduled job runs, by job and outcome.",
                            ["job", "outcome"], registry=registry)

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

    def compact_all(self) -> None:
        self._guarded("compact_all", lambda: f"{self.store.compact_by_day()} rows folded")

    def purge(self) -> None:
        days = self.settings.raw_retention_days
        self._guarded("purge", lambda: f"{self.store.purge(raw_retention=timedelta(days=days))} raw events deleted")


def start_maintenance(store: Store, settings: Settings, registry: CollectorRegistry) -> BackgroundScheduler:
    jobs = MaintenanceJobs(store, settings, registry)
    scheduler = BackgroundScheduler(timezone="UTC", job_defaults={
        "max_instances": 1, "coalesce": True, "misfire_grace_time": 300})
    scheduler.add_job(jobs.compact, "interval", minutes=5, id="compact")
    scheduler.add_job(jobs.compact_all, "interval", hours=24, id="compact_all")
    scheduler.add_job(jobs.purge, "interval", hours=1, id="purge", next_run_time=datetime.now(UTC))
    scheduler.start()
    return scheduler
