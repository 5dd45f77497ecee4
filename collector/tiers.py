"""Rollup tiers: minute buckets for a cohort's recent past, hour buckets before it, day buckets
before that, so that the rollups of a quiet cohort or of a backfill do not outgrow its raw data.

Age is measured against each cohort's newest data, not the wall clock: a backfill of last
month keeps minute buckets for its most recent day, and ``analyze --at T`` near the end of
imported history reads minutes. A cohort's newest data is the newest bucket it has stored or
is counting, capped at the wall clock plus ``FUTURE_SLACK``: one output dated in the year 2199
must not turn every other output of its cohort into a day bucket.

An output is counted straight into the bucket its age calls for (a late arrival, a backfill);
``store.fold_tiers`` moves buckets into the coarser tier as they age. Boundaries are aligned:
``minute_from`` to the hour and ``hour_from`` to the day, so an hour bucket never starts inside
the minute tier nor a day bucket inside the hour tier.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

__all__ = ["DAY", "FUTURE_SLACK", "HOUR", "Horizons", "TierPolicy"]

HOUR = 3600
DAY = 86_400
#: How far past the wall clock a cohort's newest data may count (clock skew of a sender).
FUTURE_SLACK = HOUR

Cohort = tuple[str, str, str, str]  # (model, prompt version, contract, source)


@dataclass(frozen=True)
class TierPolicy:
    """How long, back from a cohort's newest data, each tier reaches (seconds)."""

    minute_seconds: int = 24 * HOUR  # minute buckets for this long
    hour_seconds: int = 3 * DAY  # hour buckets up to this age; day buckets beyond

    def __post_init__(self) -> None:
        if self.minute_seconds < HOUR:
            raise ValueError("the minute tier must reach back at least one hour")
        if self.hour_seconds < self.minute_seconds + DAY:
            raise ValueError("the hour tier must reach at least one day further back than the minute tier")

    def bounds(self, newest: int) -> tuple[int, int]:
        """(minute_from, hour_from): bucket starts before ``minute_from`` are hours, before
        ``hour_from`` days (epoch seconds, aligned to the hour and the day)."""
        minute_from = (newest - self.minute_seconds) // HOUR * HOUR
        hour_from = (newest - self.hour_seconds) // DAY * DAY
        return minute_from, hour_from

    def start(self, start: int, newest: int) -> tuple[int, bool]:
        """The bucket start an output whose minute bucket starts at ``start`` is counted in, and
        whether that bucket is coarse (an hour or a day)."""
        minute_from, hour_from = self.bounds(newest)
        if start >= minute_from:
            return start, False
        if start >= hour_from:
            return start - start % HOUR, True
        return start - start % DAY, True


class Horizons:
    """Each cohort's newest data (epoch seconds), shared by every batch the store counts.

    Readers and writers on several threads: updates only raise a value, under a lock.
    """

    def __init__(self, policy: TierPolicy, *, clock: Callable[[], float] = time.time) -> None:
        self.policy = policy
        self._clock = clock
        self._newest: dict[Cohort, int] = {}
        self._lock = threading.Lock()

    def newest(self, cohort: Cohort) -> int | None:
        return self._newest.get(cohort)

    def snapshot(self) -> dict[Cohort, int]:
        with self._lock:
            return dict(self._newest)

    def raise_to(self, newest: Mapping[Cohort, int] | Iterable[tuple[Cohort, int]]) -> None:
        """Raise cohorts' newest data to these bucket starts (never lower it; capped at the wall
        clock plus FUTURE_SLACK)."""
        cap = int(self._clock()) + FUTURE_SLACK
        items = newest.items() if isinstance(newest, Mapping) else newest
        with self._lock:
            known = self._newest
            for cohort, start in items:
                start = min(int(start), cap)
                if start > known.get(cohort, start - 1):
                    known[cohort] = start

    def coarsen(self, keys: list[tuple[str, str, str, str, str | None, int]]) -> list[tuple[int, bool]]:
        """The bucket start each rollup group (model, prompt version, contract, source, served model
        or None, minute start) is counted in and whether it is coarse, after raising each cohort's newest
        data to what the groups hold.

        A group answered by another model counts in that model's cohort too (the served cohort),
        in the same bucket: the finer of the two cohorts' tiers, so that neither gets a bucket
        coarser than its own tier (one finer than its tier is read exactly, and folded with it).
        """
        latest: dict[Cohort, int] = {}
        for model, prompt_version, contract, source, served, start in keys:
            cohort = (model, prompt_version, contract, source)
            if start > latest.get(cohort, start - 1):
                latest[cohort] = start
            if served is not None:
                cohort = (served, prompt_version, contract, source)
                if start > latest.get(cohort, start - 1):
                    latest[cohort] = start
        self.raise_to(latest)
        # Each cohort's bounds once per call (a call holds a few cohorts and many minutes).
        bounds = {cohort: self.policy.bounds(self._newest[cohort]) for cohort in latest}
        out = []
        for model, prompt_version, contract, source, served, start in keys:
            minute_from, hour_from = bounds[(model, prompt_version, contract, source)]
            if served is not None:  # the finer tier of the two cohorts
                m2, h2 = bounds[(served, prompt_version, contract, source)]
                minute_from, hour_from = min(minute_from, m2), min(hour_from, h2)
            if start >= minute_from:
                out.append((start, False))
            elif start >= hour_from:
                out.append((start - start % HOUR, True))
            else:
                out.append((start - start % DAY, True))
        return out
