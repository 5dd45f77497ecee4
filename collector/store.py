"""The DuckDB store: schema, versioned migrations, and every write.

One process owns a database file for writing (DuckDB allows one read-write
process per file); inside it, one thread writes (see ``writer.py``). A new
file is created at the current schema version, an older one is migrated
step by step inside a transaction, a newer one is refused with the version
needed.

>>> store = Store.open(Path("var/demo.duckdb"))          # doctest: +SKIP
>>> results = store.write_batch([envelope])               # doctest: +SKIP
>>> results[0].status                                     # doctest: +SKIP
<WriteStatus.accepted: 'accepted'>
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import Enum
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pyarrow as pa

from .envelope import Envelope
from .errors import StoreError, StoreLocked, StoreUnavailable, StoreVersionTooNew
from .rollup import RollupBatch, RollupConfig, compact_rollups

__all__ = ["Store", "WriteStatus", "WriteResult", "SCHEMA_VERSION", "MIGRATIONS"]

log = logging.getLogger(__name__)

_V1 = """
CREATE TABLE meta (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL);
CREATE SEQUENCE cohort_seq START 1;
CREATE TABLE cohorts (
    cohort_id INTEGER PRIMARY KEY, model VARCHAR NOT NULL, prompt_version VARCHAR NOT NULL,
    contract VARCHAR NOT NULL, first_seen TIMESTAMPTZ NOT NULL,
    UNIQUE (model, prompt_version, contract));
-- The idempotency key is indexed as md5_number(event_id), a 128-bit integer: an ART
-- index on it costs about half of one on the string (measured), and a collision
-- between two different ids is out of reach (2^-64 at 2^32 ids).
CREATE TABLE events (
    id_key UHUGEINT PRIMARY KEY, event_id VARCHAR NOT NULL, payload_hash VARCHAR NOT NULL, generated_id BOOLEAN NOT NULL,
    cohort_id INTEGER NOT NULL, ts TIMESTAMPTZ NOT NULL, received_at TIMESTAMPTZ NOT NULL,
    served_model VARCHAR, contract_version VARCHAR, source VARCHAR, run_id VARCHAR,
    agent_release VARCHAR, finish_reason VARCHAR, attributes VARCHAR, output VARCHAR NOT NULL);
-- attributes and output hold JSON text validated at ingest; VARCHAR spares a second parse.
-- Rollups are append-only: each batch adds its own rows, readers sum them, and
-- compact_rollups() folds the rows of a bucket into one per key. No index: an
-- ART index per rollup table made each commit several times slower.
CREATE TABLE cohort_buckets (cohort_id INTEGER NOT NULL, bucket TIMESTAMPTZ NOT NULL, events BIGINT NOT NULL);
CREATE TABLE field_rollups (
    cohort_id INTEGER NOT NULL, bucket TIMESTAMPTZ NOT NULL, path VARCHAR NOT NULL, scope VARCHAR NOT NULL,
    present BIGINT NOT NULL, n_null BIGINT NOT NULL, n_boolean BIGINT NOT NULL,
    n_integer BIGINT NOT NULL, n_number BIGINT NOT NULL, n_string BIGINT NOT NULL,
    n_array BIGINT NOT NULL, n_object BIGINT NOT NULL, long_strings BIGINT NOT NULL,
    values_overflow BIGINT NOT NULL);
CREATE TABLE value_rollups (
    cohort_id INTEGER NOT NULL, bucket TIMESTAMPTZ NOT NULL, path VARCHAR NOT NULL, value VARCHAR NOT NULL,
    n BIGINT NOT NULL);
CREATE TABLE array_rollups (
    cohort_id INTEGER NOT NULL, bucket TIMESTAMPTZ NOT NULL, path VARCHAR NOT NULL, length BIGINT NOT NULL,
    n BIGINT NOT NULL);
"""

_V2 = """
CREATE TABLE served_models (
    cohort_id INTEGER, bucket TIMESTAMPTZ, served_model VARCHAR, n BIGINT NOT NULL,
    PRIMARY KEY (cohort_id, bucket, served_model));
CREATE TABLE outcomes (
    cohort_id INTEGER, bucket TIMESTAMPTZ, kind VARCHAR, n BIGINT NOT NULL,
    PRIMARY KEY (cohort_id, bucket, kind));
INSERT INTO served_models
    SELECT cohort_id, time_bucket(INTERVAL 60 SECOND, ts) AS bucket, served_model, count(*)
    FROM events WHERE served_model IS NOT NULL GROUP BY ALL;
"""

# Each entry turns version i into version i + 1; never edit a released one, append.
MIGRATIONS: list[str] = [_V1, _V2]
SCHEMA_VERSION = len(MIGRATIONS)


class WriteStatus(str, Enum):
    accepted = "accepted"
    duplicate = "duplicate"
    conflict = "conflict"  # the key was seen with a different payload


@dataclass(frozen=True)
class WriteResult:
    event_id: str
    status: WriteStatus


_COLUMNS = ["event_id", "payload_hash", "generated_id", "model", "prompt_version", "contract", "ts",
            "served_model", "contract_version", "source", "run_id", "agent_release", "finish_reason",
            "attributes", "output"]


def _arrow(envelopes: Sequence[Envelope], cohort_ids: Sequence[int]) -> pa.Table:
    s = pa.string()

    def col(i: int) -> pa.Array:
        return pa.array([e[i] for e in envelopes], s)

    f = {name: i for i, name in enumerate(Envelope._fields)}
    # Timestamps go over as integers: converting datetime objects is the slow part of
    # building the batch, and an int64 -> timestamp cast is free in Arrow.
    ts = pa.array([round(e.ts.timestamp() * 1_000_000) for e in envelopes], pa.int64())
    return pa.table({
        "event_id": col(f["event_id"]), "payload_hash": col(f["payload_hash"]),
        "generated_id": pa.array([e.generated_id for e in envelopes], pa.bool_()),
        "cohort_id": pa.array(cohort_ids, pa.int32()),
        "ts": ts.cast(pa.timestamp("us", tz="UTC")),
        "served_model": col(f["served_model"]), "contract_version": col(f["contract_version"]),
        "source": col(f["source"]), "run_id": col(f["run_id"]), "agent_release": col(f["agent_release"]),
        "finish_reason": col(f["finish_reason"]), "attributes": col(f["attributes_json"]),
        "output": col(f["output_json"]),
    })


def _is_lock_error(exc: duckdb.Error) -> bool:
    msg = str(exc).lower()
    return "lock" in msg and ("conflicting" in msg or "could not set lock" in msg)


def _is_space_error(exc: BaseException) -> bool:
    msg = str(exc).lower()
    return any(s in msg for s in ("no space left", "disk full", "out of disk", "could not write",
                                  "i/o error", "input/output error"))


class Store:
    """The DuckDB file: opened once per process, written by one thread at a time.

    >>> with Store.open(tmp_path / "x.duckdb") as store:   # doctest: +SKIP
    ...     store.write_batch(envelopes)
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, path: Path, *, bucket_seconds: int,
                 rollup: RollupConfig, read_only: bool) -> None:
        self._con = con
        self.path = path
        self.bucket_seconds = bucket_seconds
        self.rollup = rollup
        self.read_only = read_only
        self._write_lock = threading.Lock()
        self._local = threading.local()
        self._cohorts: dict[tuple[str, str, str], int] = {}
        self._pending_cohorts: dict[tuple[str, str, str], int] = {}

    # --- opening --------------------------------------------------------------------------

    @classmethod
    def open(cls, path: Path | str, *, memory_limit: str = "2GB", threads: int = 2,
             bucket_seconds: int = 60, rollup: RollupConfig | None = None,
             read_only: bool = False) -> Store:
        """Open (creating or migrating) the database at ``path``."""
        path = Path(path)
        if not read_only:
            path.parent.mkdir(parents=True, exist_ok=True)
        elif not path.exists():
            raise StoreError("opening", f"database {path} does not exist")
        config = {"memory_limit": memory_limit, "threads": str(threads),
                  "enable_external_access": "false", "autoinstall_known_extensions": "false",
                  "autoload_known_extensions": "false"}
        try:
            con = duckdb.connect(str(path), read_only=read_only, config=config)
        except duckdb.IOException as exc:
            if _is_lock_error(exc):
                raise StoreLocked(str(path), exc) from exc
            raise StoreError(f"opening {path}", exc) from exc
        except duckdb.Error as exc:
            raise StoreError(f"opening {path}", exc) from exc
        store = cls(con, path, bucket_seconds=bucket_seconds, rollup=rollup or RollupConfig(),
                    read_only=read_only)
        try:
            store._migrate()
        except BaseException:
            con.close()
            raise
        return store

    def _schema_version(self) -> int:
        has_meta = self._con.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'meta' AND schema_name = 'main'"
        ).fetchone()
        if not has_meta or not has_meta[0]:
            return 0
        row = self._con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        return int(row[0]) if row else 0

    def _migrate(self) -> None:
        found = self._schema_version()
        if found > SCHEMA_VERSION:
            raise StoreVersionTooNew(str(self.path), found, SCHEMA_VERSION)
        if found == SCHEMA_VERSION:
            return
        if self.read_only:
            raise StoreError("opening", f"database {self.path} has schema version {found} and needs "
                             f"migrating to {SCHEMA_VERSION}; open it once read-write (shapewatch serve)")
        for version in range(found, SCHEMA_VERSION):
            log.info("migrating %s from schema version %d to %d", self.path, version, version + 1)
            try:
                self._con.execute("BEGIN TRANSACTION")
                self._con.execute(MIGRATIONS[version])
                self._con.execute(
                    "INSERT INTO meta VALUES ('schema_version', ?) "
                    "ON CONFLICT DO UPDATE SET value = excluded.value", [str(version + 1)])
                self._con.execute("COMMIT")
            except duckdb.Error as exc:
                self._con.execute("ROLLBACK")
                raise StoreError(f"migrating to schema version {version + 1}", exc) from exc

    def close(self) -> None:
        self._con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- reading ----------------------------------------------------------------------------

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A connection for the calling thread (DuckDB connections are not shared across threads)."""
        cur: duckdb.DuckDBPyConnection | None = getattr(self._local, "cur", None)
        if cur is None:
            cur = self._con.cursor()
            self._local.cur = cur
        return cur

    def query(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        """Run a read query on this thread's connection; errors become StoreError."""
        try:
            return self.cursor().execute(sql, params).fetchall()
        except duckdb.Error as exc:
            raise StoreError("reading", exc) from exc

    def healthcheck(self) -> dict[str, Any]:
        """A real query: the schema version and the number of stored events."""
        row = self.query("SELECT (SELECT value FROM meta WHERE key = 'schema_version'), "
                         "(SELECT count(*) FROM events)")[0]
        return {"schema_version": int(row[0]), "events": int(row[1])}

    # --- writing ----------------------------------------------------------------------------

    def write_batch(self, envelopes: Sequence[Envelope], *, now: datetime | None = None,
                    on_commit: Callable[[], None] | None = None) -> list[WriteResult]:
        """Store the events not seen before, with their rollups, in one transaction.

        Returns one result per envelope, in order. A key seen before (in an
        earlier batch or earlier in this one) with the same payload is a
        duplicate; with a different payload, a conflict. Nothing is stored for
        either. When this returns, the transaction has committed.
        """
        if self.read_only:
            raise StoreError("writing", "the store was opened read-only")
        first: dict[str, Envelope] = {}
        results: list[WriteResult | None] = []
        for env in envelopes:
            seen = first.get(env.event_id)
            if seen is None:
                first[env.event_id] = env
                results.append(None)
            else:
                status = WriteStatus.duplicate if seen.payload_hash == env.payload_hash else WriteStatus.conflict
                results.append(WriteResult(env.event_id, status))
        with self._write_lock:
            inserted, existing = self._write(list(first.values()), self._batch_time(now))
        out: list[WriteResult] = []
        for env, res in zip(envelopes, results, strict=True):
            if res is not None:
                out.append(res)
            elif env.event_id in inserted:
                out.append(WriteResult(env.event_id, WriteStatus.accepted))
            else:
                same = existing.get(env.event_id) == env.payload_hash
                out.append(WriteResult(env.event_id, WriteStatus.duplicate if same else WriteStatus.conflict))
        return out

    def _batch_time(self, now: datetime | None) -> datetime:
        # Strictly increasing per store, so one batch's received_at never equals another's.
        t = now or datetime.now(UTC)
        last: datetime | None = getattr(self, "_last_batch_time", None)
        if last is not None and t <= last:
            t = last + timedelta(microseconds=1)
        self._last_batch_time = t
        return t

    def _write(self, envelopes: list[Envelope], now: datetime) -> tuple[set[str], dict[str, str]]:
        if not envelopes:
            return set(), {}
        con = self._con
        try:
            con.execute("BEGIN TRANSACTION")
            self._pending_cohorts = {}
            try:
                inserted, existing = self._insert(con, envelopes, now)
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
            # Only committed cohorts enter the cache: a rolled-back id must never be reused.
            self._cohorts.update(self._pending_cohorts)
        except duckdb.Error as exc:
            if _is_space_error(exc):
                raise StoreUnavailable(exc) from exc
            raise StoreError("writing a batch", exc) from exc
        finally:
            try:
                con.unregister("_batch")
            except duckdb.Error:
                pass
        return inserted, existing

    def _insert(self, con: duckdb.DuckDBPyConnection, envelopes: list[Envelope],
                now: datetime) -> tuple[set[str], dict[str, str]]:
        ids = self._cohort_ids(con, envelopes)
        con.register("_batch", _arrow(envelopes, ids))
        rows = con.execute(
            """INSERT INTO events
               SELECT md5_number(event_id), event_id, payload_hash, generated_id, cohort_id, ts, $now,
                      served_model, contract_version, source, run_id, agent_release, finish_reason,
                      attributes, output
               FROM _batch ON CONFLICT DO NOTHING RETURNING event_id""", {"now": now}).fetchall()
        inserted = {r[0] for r in rows}
        existing: dict[str, str] = {}
        if len(inserted) < len(envelopes):
            existing = dict(con.execute(
                """SELECT e.event_id, e.payload_hash FROM events e
                   WHERE e.id_key IN (SELECT md5_number(event_id) FROM _batch) AND e.received_at < $now""",
                {"now": now}).fetchall())
        if inserted:
            fresh = envelopes if len(inserted) == len(envelopes) else [
                e for e in envelopes if e.event_id in inserted]
            self._add_rollups(con, fresh)
        return inserted, existing

    def _cohort_ids(self, con: duckdb.DuckDBPyConnection, envelopes: Sequence[Envelope]) -> list[int]:
        """The cohort id of each envelope, creating cohorts not seen before (in this transaction)."""
        known = self._cohorts
        pending: dict[tuple[str, str, str], int] = {}
        out: list[int] = []
        for e in envelopes:
            key = (e.model, e.prompt_version, e.contract)
            cid = known.get(key)
            if cid is None:
                cid = pending.get(key)
                if cid is None:
                    row = con.execute(
                        """INSERT INTO cohorts VALUES (nextval('cohort_seq'), ?, ?, ?, ?)
                           ON CONFLICT DO NOTHING RETURNING cohort_id""", [*key, e.ts]).fetchone()
                    if row is None:  # created by an earlier transaction this cache has not seen
                        row = con.execute("SELECT cohort_id FROM cohorts WHERE model = ? AND prompt_version = ? "
                                          "AND contract = ?", list(key)).fetchone()
                    assert row is not None
                    cid = pending[key] = int(row[0])
            out.append(cid)
        self._pending_cohorts.update(pending)
        return out

    def _add_rollups(self, con: duckdb.DuckDBPyConnection, envelopes: Sequence[Envelope]) -> None:
        batch = RollupBatch(self.rollup, bucket_seconds=self.bucket_seconds)
        served: dict[tuple[str, str, str, int, str], int] = {}
        step = self.bucket_seconds
        for e in envelopes:
            output = e.output if e.output is not None else orjson.loads(e.output_json)
            cohort = (e.model, e.prompt_version, e.contract)
            batch.add(output, cohort, e.ts)
            if e.served_model is not None:
                epoch = int(e.ts.timestamp())
                key = (*cohort, epoch - epoch % step, e.served_model)
                served[key] = served.get(key, 0) + 1
        batch.merge_into(con)
        if served:
            keys = list(served)
            con.register("_served", pa.table({
                "model": pa.array([k[0] for k in keys], pa.string()),
                "prompt_version": pa.array([k[1] for k in keys], pa.string()),
                "contract": pa.array([k[2] for k in keys], pa.string()),
                "epoch": pa.array([k[3] for k in keys], pa.int64()),
                "served_model": pa.array([k[4] for k in keys], pa.string()),
                "n": pa.array(list(served.values()), pa.int64())}))
            try:
                con.execute(
                    """INSERT INTO served_models
                       SELECT c.cohort_id, to_timestamp(epoch), served_model, n
                       FROM _served JOIN cohorts c USING (model, prompt_version, contract)
                       ON CONFLICT DO UPDATE SET n = n + excluded.n""")
            finally:
                con.unregister("_served")

    def record_outcomes(self, outcomes: Sequence[tuple[str, str, str, datetime, str]]) -> None:
        """Count provider outcomes: (model, prompt_version, contract, ts, kind) each."""
        if not outcomes:
            return
        table = pa.table({
            "model": pa.array([o[0] for o in outcomes], pa.string()),
            "prompt_version": pa.array([o[1] for o in outcomes], pa.string()),
            "contract": pa.array([o[2] for o in outcomes], pa.string()),
            "ts": pa.array([o[3] for o in outcomes], pa.timestamp("us", tz="UTC")),
            "kind": pa.array([o[4] for o in outcomes], pa.string())})
        with self._write_lock:
            con = self._con
            try:
                con.register("_outc", table)
                con.execute("BEGIN TRANSACTION")
                con.execute(
                    """INSERT INTO cohorts
                       SELECT nextval('cohort_seq'), model, prompt_version, contract, min(ts)
                       FROM _outc b WHERE NOT EXISTS (
                           SELECT 1 FROM cohorts c WHERE c.model = b.model
                           AND c.prompt_version = b.prompt_version AND c.contract = b.contract)
                       GROUP BY model, prompt_version, contract""")
                con.execute(
                    f"""INSERT INTO outcomes
                        SELECT c.cohort_id, time_bucket(INTERVAL {int(self.bucket_seconds)} SECOND, o.ts),
                               o.kind, count(*)
                        FROM _outc o JOIN cohorts c USING (model, prompt_version, contract) GROUP BY ALL
                        ON CONFLICT DO UPDATE SET n = n + excluded.n""")
                con.execute("COMMIT")
            except duckdb.Error as exc:
                con.execute("ROLLBACK")
                if _is_space_error(exc):
                    raise StoreUnavailable(exc) from exc
                raise StoreError("recording provider outcomes", exc) from exc
            finally:
                con.unregister("_outc")

    def compact(self, since: datetime | None = None) -> int:
        """Fold rollup rows (buckets from ``since`` on, or all) into one per key; returns rows removed."""
        with self._write_lock:
            con = self._con
            try:
                con.execute("BEGIN TRANSACTION")
                removed = compact_rollups(con, since)
                con.execute("COMMIT")
            except duckdb.Error as exc:
                con.execute("ROLLBACK")
                if _is_space_error(exc):
                    raise StoreUnavailable(exc) from exc
                raise StoreError("compacting rollups", exc) from exc
        return removed

    def purge(self, *, raw_retention: timedelta, now: datetime | None = None) -> int:
        """Delete raw events received before ``now - raw_retention``; rollups stay."""
        now = now or datetime.now(UTC)
        with self._write_lock:
            try:
                row = self._con.execute(
                    "DELETE FROM events WHERE received_at < ? RETURNING 1", [now - raw_retention]).fetchall()
            except duckdb.Error as exc:
                raise StoreError("purging old raw events", exc) from exc
        return len(row)
