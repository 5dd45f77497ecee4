"""Maintenance: rollup compaction, checkpoints, and the purge of raw events and keys past
their retention, each in short transactions so ingest keeps going between them."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import duckdb

from ..errors import StoreError
from . import merge
from .batch import Purged
from .outcomes import Outcomes

__all__ = ["Maintenance"]

# Rows a purge deletes per transaction, holding the write lock: 20,000 keys took 0.1-0.3 s
# (their index entries go at commit); raw events far less.
_PURGE_CHUNK = 20_000
# After each chunk the purge lets go for this long, so a writer waiting for the lock gets it
# (a thread that releases a lock and takes it again at once usually wins it back).
_PURGE_PAUSE_S = 0.005


class Maintenance(Outcomes):
    """Compaction, checkpoints and purges."""

    def compact(self, since: datetime | None = None, until: datetime | None = None) -> int:
        """Fold rollup rows (buckets in ``[since, until)``, open ends for None) into one per key.

        Returns the rows removed. One transaction, holding the write lock: callers
        compacting a long history go range by range (``compact_by_day``).
        """
        with self._write_lock, self._merge_lock, self._transaction("compacting rollups") as con:
            return merge.compact_rollups(con, since, until)

    def compact_by_day(self) -> int:
        """Compact everything, one day of buckets per transaction, letting writes in between."""
        lo, hi = self.query("SELECT epoch(min(bucket))::BIGINT, epoch(max(bucket))::BIGINT FROM cohort_buckets")[0]
        if lo is None:
            return 0
        day = datetime.fromtimestamp(lo // 86_400 * 86_400, UTC)
        last = datetime.fromtimestamp(hi, UTC)
        removed = 0
        while day <= last:
            removed += self.compact(day, day + timedelta(days=1))
            day += timedelta(days=1)
        return removed

    def checkpoint(self) -> None:
        """Write the write-ahead log into the file now (DuckDB's ``CHECKPOINT``).

        DuckDB also checkpoints on its own, inside the commit that takes the log past
        ``checkpoint_threshold``; that commit waits for it. In DuckDB 1.5 a checkpoint writes
        the key index (``event_keys``) whole, so it takes longer the more keys are kept
        (``bench/commits.py`` prints it per size; duckdb/duckdb#24848): dedup_ttl_days bounds it.
        """
        if self.read_only:
            raise StoreError("checkpointing", "the store was opened read-only")
        # Both locks: no transaction of this store is open, so the checkpoint is not skipped.
        with self._write_lock, self._merge_lock:
            try:
                self._con.execute("CHECKPOINT")
            except duckdb.Error as exc:
                raise self._failed("checkpointing", exc) from exc

    def purge(self, *, raw_retention: timedelta, dedup_ttl: timedelta, now: datetime | None = None) -> Purged:
        """Delete raw events received before ``now - raw_retention`` and idempotency keys (of
        events and of provider outcomes) received before ``now - dedup_ttl``; rollups stay.

        The two are independent: raw events may be kept for less time than their keys (an
        event re-sent after its raw output is gone is still a duplicate) or for more (one
        re-sent after its key is gone is stored again).

        A purge runs in chunks, each its own short transaction; after ``stop_maintenance`` it
        stops between two of them, and what is left goes at the next purge.
        """
        now = now or datetime.now(UTC)
        events = self._purge_chunks("events", now - raw_retention, "purging old raw events")
        keys = self._purge_chunks("event_keys", now - dedup_ttl, "purging old idempotency keys")
        with self._write_lock, self._transaction("purging old outcome keys") as con:
            con.execute("DELETE FROM outcome_keys WHERE received_at < ?", [now - dedup_ttl])
        return Purged(events, keys)

    def stop_maintenance(self) -> None:
        """Make a running purge stop after its current chunk (and any later one at once)."""
        self._stop_maintenance.set()

    def _purge_chunks(self, table: str, before: datetime, doing: str) -> int:
        deleted = 0
        while not self._stop_maintenance.is_set():
            # In chunks, letting go of the write lock between them: one huge DELETE would
            # hold up every ingest request for its whole run. The count comes from the DELETE
            # itself: with RETURNING, DuckDB read every column of each deleted row (the raw
            # outputs), and a chunk of 50,000 events held the lock 2-3.6 s instead of 0.01.
            with self._write_lock, self._transaction(doing) as con:
                row = con.execute(
                    f"""DELETE FROM {table} WHERE rowid IN (
                            SELECT rowid FROM {table} WHERE received_at < ? LIMIT ?)""",
                    [before, _PURGE_CHUNK],
                ).fetchone()
            n = int(row[0]) if row else 0
            deleted += n
            if n < _PURGE_CHUNK:
                break
            time.sleep(_PURGE_PAUSE_S)
        return deleted
