"""When the service runs the suites of its configuration (``[probes]``).

Each scheduler tick (``ProbeScheduler.tick``, an APScheduler interval job of ``[probes] tick``) runs
a suite when one of these happened since the last tick, at most once per tick:

- ``served_model_change``: the analyzer recorded a new model answering behind the suite's
  ``alias`` (or its ``model``);
- ``contract_change``: a contract version was registered for the suite's contract (or one of its
  tools) whose diff from the version before it is behavioral or breaking;
- ``schedule``: its last run is older than ``[probes] interval`` (daily by default; a restart
  reads the last run from the store, so it does not run everything again).

Changes and versions that exist when the scheduler starts are not triggers. A failing suite is
logged and counted, never raised into the scheduler.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

from shapewatch.collector import Verdict, diff_contracts, diff_verdict, get_contract
from shapewatch.collector.store import Store

from .runner import ProbeRun, record_run, run_suite
from .suite import Suite

__all__ = ["ProbeScheduler"]

log = logging.getLogger(__name__)

_CHANGES = (Verdict.breaking, Verdict.behavioral)


class ProbeScheduler:
    """Decides, tick by tick, which suites run and why; runs and records them.

    >>> scheduler.add_job(ProbeScheduler(store, suites).tick, "interval", seconds=60)   # doctest: +SKIP
    """

    def __init__(
        self,
        store: Store,
        suites: Sequence[Suite],
        *,
        interval: timedelta = timedelta(days=1),
        run: Callable[[Suite, str], ProbeRun] | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.store = store
        self.suites = list(suites)
        self.interval = interval
        self._run = run or (lambda suite, trigger: run_suite(suite, trigger=trigger))
        self._clock = clock
        self._changes = {tuple(c[:5]) for c in store.served_model_changes()}
        self._versions = {(r.contract, r.version) for r in store.contract_versions()}
        self.last_run: dict[str, datetime] = {}
        for s in self.suites:
            done = store.probe_runs(suite=s.name, limit=1)
            if done:
                self.last_run[s.name] = done[0].finished_at
        self.failures = 0
        self.runs: list[ProbeRun] = []  # the runs of this process, oldest first

    def _changed_models(self) -> set[str]:
        fresh = [c for c in self.store.served_model_changes() if tuple(c[:5]) not in self._changes]
        self._changes.update(tuple(c[:5]) for c in fresh)
        return {str(c[0]) for c in fresh}

    def _changed_contracts(self) -> set[str]:
        rows = self.store.contract_versions()
        out = set()
        by_contract: dict[str, list[str]] = {}
        for r in rows:  # oldest registration first
            by_contract.setdefault(r.contract, []).append(r.version)
            if (r.contract, r.version) in self._versions:
                continue
            self._versions.add((r.contract, r.version))
            versions = by_contract[r.contract]
            if len(versions) < 2:
                continue  # a first version changes no behaviour
            try:
                old = get_contract(self.store, r.contract, versions[-2]).definition
                new = get_contract(self.store, r.contract, r.version).definition
                if diff_verdict(diff_contracts(old, new)) in _CHANGES:
                    out.add(r.contract)
            except Exception:  # a contract that cannot be diffed triggers nothing, and is logged
                log.exception("diffing contract %s version %s failed", r.contract, r.version)
        return out

    def tick(self) -> list[ProbeRun]:
        """Run the suites due now; returns their runs."""
        try:
            models = self._changed_models()
            contracts = self._changed_contracts()
        except Exception:
            log.exception("reading what changed for the probe suites failed")
            self.failures += 1
            return []
        now = self._clock()
        done = []
        for suite in self.suites:
            if {suite.alias, suite.model} & models:
                trigger = "served_model_change"
            elif {suite.contract, *suite.tool_names} & contracts:
                trigger = "contract_change"
            elif suite.name not in self.last_run or now - self.last_run[suite.name] >= self.interval:
                trigger = "schedule"
            else:
                continue
            try:
                result = self._run(suite, trigger)
                record_run(self.store, result)
            except Exception:  # a scheduled job never raises into the scheduler
                log.exception("probe suite %s (%s) failed", suite.name, trigger)
                self.failures += 1
                self.last_run[suite.name] = now  # tried: the next try is an interval away
                continue
            self.last_run[suite.name] = result.finished_at
            self.runs.append(result)
            done.append(result)
        return done
