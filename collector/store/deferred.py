"""Deferred rollups: events commit alone, their counts wait in memory and are merged for many
batches at once, on a connection of their own, while events keep committing.

Raw events are the truth; rollups are derived from them. ``meta.rollups_through`` records the
received_at up to which events are rolled up; at open, anything later is rolled up again
(``_recover_rollups``), so a crash loses no count.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime, timedelta

import duckdb

from ..errors import StoreError
from ..rollup import RollupBatch
from . import merge
from .batch import PreparedBatch
from .connection import _EPOCH, _epoch_us
from .core import StoreCore

__all__ = ["DeferredRollups"]

log = logging.getLogger(__name__)


class DeferredRollups(StoreCore):
    """Merging counted events into the rollup tables, now or later (``defer_rollups``)."""

    # --- deferred rollups --------------------------------------------------------------------
    #
    # Raw events are the truth; rollups are derived from them. By default a batch's
    # rollups commit in the same transaction as its events. A writer that commits
    # many small batches (the service) defers them instead: events commit alone
    # (so a 2xx waits only for them), their counts wait in memory and are merged
    # for many batches at once. meta.rollups_through records the received_at up to
    # which events are rolled up; on open, anything later is rolled up again, so a
    # crash loses no count.

    def defer_rollups(self, *, max_events: int, max_seconds: float) -> None:
        """Merge rollups every ``max_events`` events (and, with a ticking writer, every ``max_seconds``)."""
        with self._write_lock:
            self._defer = (max_events, max_seconds)

    @property
    def rollups_due(self) -> bool:
        """True when deferred rollups cover ``max_events`` or have waited ``max_seconds``
        (the writer then flushes)."""
        first = self._pending_first
        return (
            self._defer is not None
            and first is not None
            and (self._pending_events >= self._defer[0] or time.monotonic() - first >= self._defer[1])
        )

    @property
    def pending_rollup_events(self) -> int:
        """Events whose rollups wait to be merged (deferred rollups)."""
        return self._pending_events

    def flush_rollups(self) -> int:
        """Merge deferred rollups now; returns the events they covered. Readers call this first."""
        if not self._pending:  # nothing waits: no need to queue behind a merge for the lock
            return 0  # (a batch that commits meanwhile is merged by the next reader or the writer)
        with self._merge_lock:
            return self._flush_locked()

    def _flush_locked(self) -> int:
        """Merge the counts pending now (the merge lock is held); batches committing meanwhile wait."""
        with self._pending_lock:
            taken = list(self._pending)
        if not taken:
            return 0
        n = sum(batch.events for batch, _, _ in taken)
        if self._merge_con is None:
            try:
                self._merge_con = self._con.cursor()
            except duckdb.Error as exc:
                raise self._failed("merging rollups", exc) from exc
        self._run_checks([batch for batch, _, _ in taken])
        # On failure the counts stay pending; the events are stored either way.
        with self._transaction("merging rollups", self._merge_con) as con:
            merge.merge_rollups(con, [batch for batch, _, _ in taken], self.rollup)
            self._set_watermark(con, taken[-1][1])
        with self._pending_lock:
            del self._pending[: len(taken)]
            self._pending_events -= n
            self._pending_first = self._pending[0][2] if self._pending else None
        return n

    def merge_pending(self) -> None:
        """Merge deferred rollups now; a failure is logged and kept in ``last_merge_error``
        (shown by /healthz) instead of raised: the events they count are committed.

        Takes the merge lock only: events keep committing while it runs."""
        if self._pending:
            with self._merge_lock:
                self._flush_after_commit()

    def _flush_after_commit(self) -> None:
        # The events are committed and will be acknowledged: a failed merge must not turn
        # into an error for them (a retry would store events without an id twice).
        # The caller holds the merge lock.
        try:
            self._flush_locked()
        except StoreError as exc:
            self.last_merge_error = str(exc)
            log.error("merging rollups failed (events are stored; counts stay pending): %s", exc)
        else:
            self.last_merge_error = None

    def _set_watermark(self, con: duckdb.DuckDBPyConnection, through: datetime) -> None:
        con.execute(
            "INSERT INTO meta VALUES ('rollups_through', ?) ON CONFLICT DO UPDATE SET value = excluded.value",
            [str(_epoch_us(through))],
        )

    def _recover_rollups(self) -> None:
        """Roll up events committed after the watermark (a crash before their merge)."""
        # received_at must keep growing across restarts, even if the clock went back:
        # the watermark and the rows of a batch are told apart by it.
        last = self._con.execute(
            "SELECT greatest(coalesce(max(epoch_us(received_at)), 0), "
            "coalesce((SELECT value::BIGINT FROM meta WHERE key = 'rollups_through'), 0)) FROM events"
        ).fetchone()
        if last and last[0]:
            self._last_batch_time = _EPOCH + timedelta(microseconds=int(last[0]))
        row = self._con.execute("SELECT value FROM meta WHERE key = 'rollups_through'").fetchone()
        if row is None:  # older files rolled up synchronously: everything stored is counted
            self._con.execute(
                "INSERT INTO meta SELECT 'rollups_through', coalesce(max(epoch_us(received_at)), 0)::VARCHAR "
                "FROM events"
            )
            return
        rows = self._con.execute(
            """SELECT e.output, c.model, c.prompt_version, c.contract, c.source, epoch_us(e.ts), e.served_model,
                      e.contract_version, epoch_us(e.received_at)
               FROM events e JOIN cohorts c USING (cohort_id)
               WHERE epoch_us(e.received_at) > ? ORDER BY e.received_at""",
            [int(row[0])],
        ).fetchall()
        if not rows:
            return
        log.warning("rolling up %d events stored after the last rollup merge (after a crash)", len(rows))
        batch = self._rollup_batch()
        outputs, models, prompt_versions, contracts, sources, ts_us, served, versions, _ = zip(*rows, strict=True)
        batch.add_many(
            outputs,
            list(zip(models, prompt_versions, contracts, sources, strict=True)),
            [datetime.fromtimestamp(t / 1_000_000, UTC) for t in ts_us],
            served,
            versions,
        )
        with self._transaction("rolling up events stored after the last merge") as con:
            merge.merge_rollups(con, [batch], self.rollup)
            con.execute("UPDATE meta SET value = ? WHERE key = 'rollups_through'", [str(rows[-1][8])])

    def _rollups_of_rows(self, batch: PreparedBatch, event_ids: set[str]) -> RollupBatch:
        """The counts of some rows of a prepared batch, re-read from its columns."""
        cohorts = list(batch.cohorts)
        rollups = self._rollup_batch()
        cols = batch.table.select(
            ["event_id", "cohort_key", "ts", "served_model", "contract_version", "output"]
        ).to_pydict()
        rows = [row for row in zip(*cols.values(), strict=True) if row[0] in event_ids]
        if rows:
            _, keys, tss, served, versions, outputs = zip(*rows, strict=True)
            rollups.add_many(outputs, [cohorts[key] for key in keys], tss, served, versions)
        rollups.tables()
        return rollups
