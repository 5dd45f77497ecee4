"""Every write of events: one transaction per batch (or per group of batches), idempotent by
event id.

The conflict rule: an event id seen before (in an earlier batch, kept for ``dedup_ttl_days``,
or earlier in the same batch) with the same payload identity (``envelope.payload_hash``) is a
duplicate, with another one a conflict; nothing is stored for either. Only the writing thread
stores events (the write lock), so nothing is stored between looking a key up and inserting it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from ..envelope import Envelope
from ..errors import StoreError
from ..rollup import RollupBatch
from . import event_facts, merge
from .batch import BatchBuilder, PreparedBatch, WriteResult, _results
from .deferred import DeferredRollups

__all__ = ["Writes"]

log = logging.getLogger(__name__)


class _StoredBefore(Exception):
    """A batch's plain INSERT met a key already stored (see ``Store._insert``)."""


# Keys per lookup statement (_stored_hashes, and outcomes.py's lookups).
_PROBE_KEYS = 2000
# An id looked up in an IN list costs about what scanning 300 stored keys does (_stored_hashes).
_KEYS_SCANNED_PER_ID = 300


class Writes(DeferredRollups):
    """Batches of events, written."""

    # --- writing ----------------------------------------------------------------------------

    def prepare_batch(self, envelopes: Sequence[Envelope]) -> PreparedBatch:
        """Everything about a batch that needs no database: run it on any thread.

        Bulk import and the writer's requests build theirs with ``batch_builder``, while
        the previous batch is written, so the Python work (columns, rollup counts)
        overlaps DuckDB's.
        """
        builder = self.batch_builder()
        builder.add_many(envelopes)
        return builder.finish()

    def batch_builder(self) -> BatchBuilder:
        """A batch prepared one envelope at a time (``prepare_batch`` is one in a loop)."""
        return BatchBuilder(self._rollup_batch())

    def write_batch(
        self, envelopes: Sequence[Envelope] | PreparedBatch, *, now: datetime | None = None, merge: bool = True
    ) -> list[WriteResult]:
        """Store the events not seen before, with their rollups, in one transaction.

        Returns one result per envelope, in order. A key seen before (in an
        earlier batch or earlier in this one) with the same payload is a
        duplicate; with a different payload, a conflict. Nothing is stored for
        either. When this returns, the transaction has committed.

        With deferred rollups, the counts are merged here once they cover
        ``max_events``; ``merge=False`` leaves that to the caller (``rollups_due``,
        ``flush_rollups``): the service answers the batch's requests first.
        """
        batch = envelopes if isinstance(envelopes, PreparedBatch) else self.prepare_batch(envelopes)
        return self.write_batches([batch], now=now, merge=merge)[0]

    def write_batches(
        self, batches: Iterable[PreparedBatch], *, now: datetime | None = None, merge: bool = True
    ) -> list[list[WriteResult]]:
        """Several prepared batches in one transaction; the results of each, as ``write_batch``.

        Bulk import writes a row group's worth of events (122,880) or more per transaction:
        DuckDB then writes them into the file, compressed, as they come, where a smaller
        transaction goes into its log first and into the file again at the next checkpoint
        (200,000 events with their keys, stored and checkpointed: 1.84-1.91 s in one
        transaction, 2.49-2.75 s in five; bench/README.md). A batch holding a key stored before
        (or by an earlier batch of the same call) rolls the transaction back: the batches are
        then written in a transaction each, knowing which keys are stored.

        ``batches`` may be an iterator that waits for each batch (bulk import's reading thread
        prepares them): each is inserted as it comes, in the open transaction, so storing
        overlaps preparing instead of waiting for the whole group (the write lock is held
        meanwhile).
        """
        if self.read_only:
            raise StoreError("writing", "the store was opened read-only")
        with self._write_lock:
            try:
                drawn, written = self._write(batches, now)
            except duckdb.Error as exc:  # outside the transaction: a new cohort's insert, a register
                raise self._failed("writing a batch", exc) from exc
            if merge and self._defer is not None and self._pending_events >= self._defer[0]:
                with self._merge_lock:
                    self._flush_after_commit()
        return [_results(batch, inserted, existing) for batch, (inserted, existing) in zip(drawn, written, strict=True)]

    def _batch_time(self, now: datetime | None) -> datetime:
        # Strictly increasing per store, so one batch's received_at never equals another's.
        t = now or datetime.now(UTC)
        last = self._last_batch_time
        if last is not None and t <= last:
            t = last + timedelta(microseconds=1)
        self._last_batch_time = t
        return t

    def _write(
        self, batches: Iterable[PreparedBatch], now: datetime | None
    ) -> tuple[list[PreparedBatch], list[tuple[set[str], dict[str, str]]]]:
        """The batches drawn from ``batches``, and (ids inserted, {stored id: its hash}) of each;
        the write lock is held."""
        drawn: list[PreparedBatch] = []
        times: list[datetime] = []
        out: list[tuple[set[str], dict[str, str]]] = []
        self._pending_cohorts = {}
        self._staged = []
        rest = iter(batches)
        try:
            # Cohorts new to the batch go first, in their own statement, and may outlive a
            # failed insert harmlessly; the keys and the events commit together. With deferred
            # rollups one batch's transaction is one call into DuckDB: each call gives up the GIL
            # and waits to get it back from the request threads (BEGIN alone averaged 2 ms under
            # the HTTP benchmark).
            try:
                if isinstance(batches, Sequence) and len(batches) == 1 and self._defer is not None:
                    drawn, times = [batches[0]], [self._batch_time(now)]
                    out = [
                        self._insert(self._con, drawn[0], times[0], probe=False, whole=True)
                        if drawn[0].unique
                        else (set(), {})
                    ]
                else:
                    with self._transaction("writing a batch") as con:
                        for batch in rest:
                            drawn.append(batch)
                            times.append(self._batch_time(now))
                            out.append(
                                self._insert(con, batch, times[-1], probe=False) if batch.unique else (set(), {})
                            )
                self._committed(out)
            except _StoredBefore:  # rolled back: again, a batch at a time, knowing which keys are stored
                self._pending_cohorts = {}
                self._staged = []
                for batch in rest:  # the group's batches not drawn yet
                    drawn.append(batch)
                    times.append(self._batch_time(now))
                out = []
                for batch, t in zip(drawn, times, strict=True):
                    if not batch.unique:
                        out.append((set(), {}))
                        continue
                    with self._transaction("writing a batch") as con:
                        out.append(self._insert(con, batch, t, probe=True))
                    self._committed([out[-1]])
        finally:
            for name in ("_batch", "_batch_outcomes", "_batch_steps", "_batch_runs"):
                try:
                    self._con.unregister(name)
                except duckdb.Error:
                    pass
        if self._indexed_keys >= self._memory_until:
            try:
                self._fit_memory()
            except duckdb.Error as exc:  # the next batch tries again
                log.warning("raising DuckDB's memory limit for the key index failed: %s", exc)
        return drawn, out

    def _committed(self, written: list[tuple[set[str], dict[str, str]]]) -> None:
        """Take note of what a transaction just committed: its cohorts, keys and counts."""
        # Only committed cohorts enter the cache: a rolled-back id must never be reused.
        self._cohorts.update(self._pending_cohorts)
        self._pending_cohorts = {}
        self._indexed_keys += sum(len(inserted) for inserted, _ in written)
        # The events are committed: nothing from here on may fail the batch (its requests would
        # be told 503 for stored events, and its counts would be skipped by the next merge).
        staged, self._staged = self._staged, []
        if staged:
            added = time.monotonic()
            with self._pending_lock:
                if not self._pending:
                    self._pending_first = added
                for rollups, received_at in staged:
                    self._pending.append((rollups, received_at, added))
                    self._pending_events += rollups.events

    def _insert(
        self, con: duckdb.DuckDBPyConnection, batch: PreparedBatch, now: datetime, *, probe: bool, whole: bool = False
    ) -> tuple[set[str], dict[str, str]]:
        """Insert the keys and the events of the batch that are not stored yet; (ids inserted,
        {stored id: its hash}). ``whole``: the insert is its own transaction, begun and
        committed in the same call (the caller opened none).

        Not ``INSERT ... ON CONFLICT DO NOTHING``: DuckDB plans that as a join against a
        scan of the whole key column, so each commit took longer as the table grew (500
        events: 6.8 ms into 20,000 stored, 47.7 ms into 4,000,000; measured). A plain
        INSERT into ``event_keys`` checks the keys in the index and costs the same at any
        size. When a key is already kept it fails (``_StoredBefore``, the transaction rolls back) and the
        batch is written again with ``probe``: the stored keys are looked up first
        (``_stored_hashes``), and only the rest is inserted. Only this thread writes events (the
        write lock), so nothing is stored between the lookup and the insert.
        """
        by_key = self._cohort_ids(con, {**batch.served_cohorts, **batch.cohorts})
        # cohort_key numbers the batch's cohorts: their ids go in as a column (a second registered
        # table to join costs a register and an unregister per commit, about 1 ms; measured)
        ids = pa.array([by_key[key] for key in batch.cohorts], pa.int32())
        table = batch.table.append_column("cohort_id", ids.take(batch.table["cohort_key"]))
        existing: dict[str, str] = {}
        if probe:
            existing = self._stored_hashes(con, list(dict.fromkeys(batch.event_ids)))
            if existing:
                table = table.filter(pc.invert(pc.is_in(table["event_id"], value_set=pa.array(list(existing)))))
            if not table.num_rows:
                # every key stored before: no INSERT at all (an empty one after a large one, as in
                # a bulk import's transaction, hides rows from DuckDB 1.5's scans on two threads:
                # bench/repro_duckdb_empty_insert.py)
                return set(), existing
        con.register("_batch", table)
        stamp = f"'{now.isoformat()}'::TIMESTAMPTZ"  # ours, aware: a literal, so both go in one call
        writes = (
            f"INSERT INTO event_keys SELECT md5_number(event_id), payload_hash, {stamp} FROM _batch; "
            f"""INSERT INTO events
                      SELECT md5_number(event_id), event_id, payload_hash, generated_id, cohort_id, ts, {stamp},
                             served_model, contract_version, source, run_id, agent_release, finish_reason,
                             attributes, output
                      FROM _batch"""
        )
        # What the new events' finish reasons and run ids say, in the same transaction.
        facts = self._event_facts(con, table, batch, by_key, now, stamp)
        if facts:
            writes = f"{writes}; {facts}"
        try:
            con.execute(f"BEGIN TRANSACTION; {writes}; COMMIT" if whole else writes)
        except BaseException as exc:
            if whole:  # a failed statement (or an interrupt) left the transaction open
                try:
                    con.execute("ROLLBACK")
                except duckdb.Error:
                    pass
            if not isinstance(exc, duckdb.Error):
                raise
            if isinstance(exc, duckdb.ConstraintException) and not probe:
                # A stored key (the only constraint a valid batch can break). Any other would
                # fail the probing try the same way, and surface from there.
                raise _StoredBefore from None
            if whole:
                raise self._failed("writing a batch", exc) from exc
            raise
        inserted = set(batch.event_ids) if not existing else set(table["event_id"].to_pylist())
        fresh: RollupBatch | None = None
        if len(inserted) == batch.unique:
            fresh = batch.rollups
        elif inserted:  # some were stored before: count only what is new
            fresh = self._rollups_of_rows(batch, inserted)
        if fresh is not None:
            if self._defer is None:  # rollups commit with their events
                merge.merge_rollups(con, [fresh], self.rollup)
                self._set_watermark(con, now)
            else:
                self._staged.append((fresh, now))
        return inserted, existing

    def _event_facts(
        self,
        con: duckdb.DuckDBPyConnection,
        table: pa.Table,
        batch: PreparedBatch,
        by_key: dict[tuple[str, str, str, str], int],
        now: datetime,
        stamp: str,
    ) -> str:
        """The statements that store the outcomes and run steps of the events of ``table`` (the ones
        this batch inserts), their tables registered on ``con``; "" when they say neither."""
        cohorts = list(batch.cohorts)  # by cohort_key
        statements = []
        counts = event_facts.outcome_counts(table, self.bucket_seconds, cohorts, by_key)
        if counts:
            con.register(
                "_batch_outcomes",
                pa.table(
                    {
                        "cohort_id": pa.array([c[0] for c in counts], pa.int32()),
                        "bucket": pa.array([c[1] for c in counts], pa.int64()),
                        "kind": pa.array([c[2] for c in counts], pa.string()),
                        "n": pa.array([c[3] for c in counts], pa.int64()),
                    }
                ),
            )
            statements.append(
                """INSERT INTO outcomes SELECT cohort_id, to_timestamp(bucket), kind, n FROM _batch_outcomes
                   ON CONFLICT DO UPDATE SET n = n + excluded.n"""
            )
        steps = event_facts.run_steps_of(table, cohorts, now)
        if steps is not None:
            con.register("_batch_steps", steps[0])
            con.register("_batch_runs", steps[1])
            # INSERT OR IGNORE: the OTLP route writes the step of its events after them, under the
            # same key and with more (trace, span, position, input messages), and replaces this one.
            statements.append("INSERT OR IGNORE INTO run_steps SELECT * FROM _batch_steps")
            statements.append(
                f"""INSERT INTO runs (run_id, first_ts, last_ts, last_received, judged_at)
                    SELECT run_id, first_ts, last_ts, {stamp}, NULL FROM _batch_runs
                    ON CONFLICT (run_id) DO UPDATE SET first_ts = least(runs.first_ts, excluded.first_ts),
                        last_ts = greatest(runs.last_ts, excluded.last_ts), last_received = excluded.last_received"""
            )
        return "; ".join(statements)

    def _stored_hashes(self, con: duckdb.DuckDBPyConnection, event_ids: list[str]) -> dict[str, str]:
        """{event_id: payload hash} of those of ``event_ids`` whose key is kept.

        Each id comes back with its hash, matched to its key in SQL: a key is never fetched
        as a UHUGEINT, which DuckDB's Python client converts in about 80 us (fetching them
        made a batch with one duplicate cost the service 0.25 s at 1M keys, and importing a
        file again take 12 times as long as the first time). A few ids go in as an IN list,
        looked up in the index at any table size (about 15 us an id); many are hash-joined
        against a scan of the key column, which costs by the table's size instead (1M keys:
        30,720 ids in 55 ms joined, 450 ms in IN lists; 500 ids in 8 and 11 ms; measured).
        """
        probe = "SELECT md5_number(e) AS id_key, e FROM unnest(?::VARCHAR[]) AS t(e)"
        if len(event_ids) * _KEYS_SCANNED_PER_ID > self._indexed_keys:
            rows = con.execute(
                f"SELECT p.e, k.payload_hash FROM ({probe}) p JOIN event_keys k USING (id_key)", [event_ids]
            ).fetchall()
        else:
            rows = []
            for i in range(0, len(event_ids), _PROBE_KEYS):
                chunk = event_ids[i : i + _PROBE_KEYS]
                marks = ", ".join(["md5_number(?)"] * len(chunk))
                rows += con.execute(
                    f"""SELECT p.e, k.payload_hash FROM ({probe}) p
                        JOIN (SELECT id_key, payload_hash FROM event_keys WHERE id_key IN ({marks})) k USING (id_key)""",
                    [chunk, *chunk],
                ).fetchall()
        return dict(rows)

    def _cohort_ids(
        self, con: duckdb.DuckDBPyConnection, first_ts: dict[tuple[str, str, str, str], datetime]
    ) -> dict[tuple[str, str, str, str], int]:
        """The id of each cohort (model, prompt version, contract, source), creating new ones
        (set-based) in the current transaction."""
        ids: dict[tuple[str, str, str, str], int] = {}
        new: list[tuple[str, str, str, str]] = []
        for key in first_ts:
            cid = self._cohorts.get(key) or self._pending_cohorts.get(key)
            if cid is None:
                new.append(key)
            else:
                ids[key] = cid
        if not new:
            return ids
        con.register(
            "_nc",
            pa.table(
                {
                    "model": pa.array([k[0] for k in new], pa.string()),
                    "prompt_version": pa.array([k[1] for k in new], pa.string()),
                    "contract": pa.array([k[2] for k in new], pa.string()),
                    "source": pa.array([k[3] for k in new], pa.string()),
                    "first_seen": pa.array([first_ts[k] for k in new], pa.timestamp("us", tz="UTC")),
                }
            ),
        )
        try:
            con.execute(
                """INSERT INTO cohorts
                   SELECT nextval('cohort_seq'), model, prompt_version, contract, first_seen, source FROM _nc
                   ON CONFLICT DO NOTHING"""
            )
            rows = con.execute(
                """SELECT c.cohort_id, c.model, c.prompt_version, c.contract, c.source
                   FROM cohorts c JOIN _nc USING (model, prompt_version, contract, source)"""
            ).fetchall()
        finally:
            con.unregister("_nc")
        for cid, model, prompt_version, contract, source in rows:
            cohort = (str(model), str(prompt_version), str(contract), str(source))
            ids[cohort] = self._pending_cohorts[cohort] = int(cid)
        return ids
