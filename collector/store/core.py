"""The store's state and its plumbing: migrations, transactions, errors, contract checks.

``Store`` (``store.py``) is this class with the writes, deferred rollups, maintenance and reads
added by the classes between (one module each); they share the state set up here.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import duckdb
import orjson
import pyarrow as pa

from ..contracts import ContractStore, ValidatorCache
from ..errors import StoreError, StoreInvalidated, StoreVersionTooNew
from ..rollup import ContractStatus, RollupBatch, RollupConfig
from ..tiers import Horizons
from .connection import _INDEX_BYTES_PER_EVENT, _INDEX_STEP_EVENTS, _is_fatal, _store_error
from .schema import MIGRATIONS, SCHEMA_VERSION, Schema

__all__ = ["StoreCore"]

log = logging.getLogger(__name__)


class StoreCore:
    """The DuckDB file: opened once per process, written by one thread at a time."""

    def __init__(
        self, con: duckdb.DuckDBPyConnection, path: Path, *, bucket_seconds: int, rollup: RollupConfig, read_only: bool
    ) -> None:
        self._con = con
        self.path = path
        self.bucket_seconds = bucket_seconds
        self.rollup = rollup
        self.read_only = read_only
        self._write_lock = threading.Lock()
        # Merges of deferred rollups take this one, not the write lock: they write only rollup
        # tables, on their own connection, so events keep committing meanwhile. One merge at
        # a time; compaction takes it too. Order: the write lock first when both are held.
        self._merge_lock = threading.Lock()
        # Set by stop_maintenance(): a purge stops between chunks (the service's shutdown).
        self._stop_maintenance = threading.Event()
        # Once DuckDB has invalidated the database, every later statement fails the same way:
        # the first such error, and who to tell (the service stops itself; see _failed).
        self.invalidated: StoreInvalidated | None = None
        self.on_invalidated: Callable[[StoreInvalidated], None] | None = None
        self._merge_con: duckdb.DuckDBPyConnection | None = None
        # memory_limit as configured, and the stored events DuckDB's limit has room for (see
        # _INDEX_BYTES_PER_EVENT); set by open().
        self._memory_base = 0
        self._indexed_keys = 0
        self._memory_until = 0
        self._local = threading.local()
        # (model, prompt version, contract, source) -> cohort_id
        self._cohorts: dict[tuple[str, str, str, str], int] = {}
        self._pending_cohorts: dict[tuple[str, str, str, str], int] = {}
        # Deferred rollups (see defer_rollups): counted, committed events not yet merged.
        self._defer: tuple[int, float] | None = None
        # (counts, received_at of their batch, monotonic time they were added), in commit order;
        # guarded by _pending_lock (held briefly: a commit adds, a merge takes a prefix).
        self._pending: list[tuple[RollupBatch, datetime, float]] = []
        self._pending_lock = threading.Lock()
        self._pending_events = 0
        self._pending_first: float | None = None
        self._staged: list[tuple[RollupBatch, datetime]] = []  # counts of the transaction under way
        # received_at of the last batch written (see _batch_time); set at open from the file
        self._last_batch_time: datetime | None = None
        self.last_merge_error: str | None = None
        self._validators: ValidatorCache | None = None
        # Contract checks done per (cohort, contract version, bucket), for RollupConfig's quota;
        # in memory: a restart checks a little more, never less.
        self._checks_done: dict[tuple[tuple[str, str, str, str], str, int], int] = {}
        self._checks_lock = threading.Lock()
        # Each cohort's newest data, for counting outputs into their tier (set by open when the
        # store keeps tiers; tiers.py)
        self.horizons: Horizons | None = None
        #: outputs of registered contract versions counted unchecked since start, by reason
        #: (RollupBatch.unchecked); guarded by _checks_lock
        self.contract_unchecked: Counter[str] = Counter()

    def _fit_memory(self) -> None:
        """DuckDB's memory limit: the configured one plus room for the index of the keys kept
        and of the next step of them. Keys purged are not taken off until the next open (the
        limit is a ceiling, so erring high costs nothing)."""
        until = self._indexed_keys + _INDEX_STEP_EVENTS
        self._con.execute(f"SET memory_limit = '{self._memory_base + until * _INDEX_BYTES_PER_EVENT}B'")
        self._memory_until = until

    @property
    def memory_limit_bytes(self) -> int:
        """DuckDB's memory limit now: memory_limit plus room for the key index."""
        return self._memory_base + self._memory_until * _INDEX_BYTES_PER_EVENT

    def _schema_version(self) -> int:
        has_meta = self._con.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'meta' AND schema_name = 'main'"
        ).fetchone()
        if not has_meta or not has_meta[0]:
            return 0
        row = self._con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        return int(row[0]) if row else 0

    def _check_bucket_width(self) -> None:
        """The bucket width is chosen once per database: rollups of two widths do not add up."""
        row = self._con.execute("SELECT value FROM meta WHERE key = 'bucket_seconds'").fetchone()
        if row is None:
            if not self.read_only:
                self._con.execute("INSERT INTO meta VALUES ('bucket_seconds', ?)", [str(self.bucket_seconds)])
            return
        if int(row[0]) != self.bucket_seconds:
            raise StoreError(
                "opening",
                f"database {self.path} was created with bucket_seconds={row[0]}; "
                f"set bucket_seconds to {row[0]} (it cannot change once rollups are stored)",
            )

    def _migrate(self) -> None:
        found = self._schema_version()
        if found > SCHEMA_VERSION:
            raise StoreVersionTooNew(str(self.path), found, SCHEMA_VERSION)
        if found == SCHEMA_VERSION:
            return
        if self.read_only:
            raise StoreError(
                "opening",
                f"database {self.path} has schema version {found} and needs "
                f"migrating to {SCHEMA_VERSION}; open it once read-write (shapewatch serve)",
            )
        for version in range(found, SCHEMA_VERSION):
            log.info("migrating %s from schema version %d to %d", self.path, version, version + 1)
            with self._transaction(f"migrating to schema version {version + 1}") as con:
                step = MIGRATIONS[version]
                if callable(step):
                    step(con)
                else:
                    con.execute(step.replace("{bucket}", str(int(self.bucket_seconds))))
                con.execute(
                    "INSERT INTO meta VALUES ('schema_version', ?) ON CONFLICT DO UPDATE SET value = excluded.value",
                    [str(version + 1)],
                )
        # The migrated schema goes into the file now, not into the write-ahead log: replaying a
        # log that rebuilds a table with a unique key (version 10 rebuilds cohorts) after a crash
        # failed in DuckDB, and then the file could not be opened at all.
        self._con.execute("CHECKPOINT")

    def _migrate_schema(self, schema: Schema) -> None:
        key = f"schema_version.{schema.name}"
        row = self._con.execute("SELECT value FROM meta WHERE key = ?", [key]).fetchone()
        found = int(row[0]) if row else 0
        if found > schema.version:
            raise StoreVersionTooNew(f"{self.path} ({schema.name} tables)", found, schema.version)
        if found == schema.version:
            return
        if self.read_only:
            raise StoreError(
                "opening",
                f"database {self.path} has {schema.name} tables at version {found} and "
                f"needs migrating to {schema.version}; open it once read-write (shapewatch serve)",
            )
        for version in range(found, schema.version):
            log.info("migrating %s tables of %s from version %d to %d", schema.name, self.path, version, version + 1)
            with self._transaction(f"migrating {schema.name} tables to version {version + 1}") as con:
                con.execute(schema.migrations[version])
                con.execute(
                    "INSERT INTO meta VALUES (?, ?) ON CONFLICT DO UPDATE SET value = excluded.value",
                    [key, str(version + 1)],
                )
        self._con.execute("CHECKPOINT")  # as after the store's own migrations

    @contextmanager
    def transaction(self, doing: str) -> Iterator[duckdb.DuckDBPyConnection]:
        """A write transaction for higher packages' tables: holds the write lock, always ends.

        Commits when the block ends, rolls back on any exception; DuckDB errors
        become StoreError naming ``doing``. Keep it short: ingestion waits for it.
        """
        if self.read_only:
            raise StoreError(doing, f"database {self.path} is open read-only")
        with self._write_lock, self._transaction(doing) as con:
            yield con

    @contextmanager
    def _transaction(
        self, doing: str, con: duckdb.DuckDBPyConnection | None = None
    ) -> Iterator[duckdb.DuckDBPyConnection]:
        """BEGIN ... COMMIT on the writing connection (or ``con``, the merges'); any failure
        rolls back (never left open).

        DuckDB errors become StoreUnavailable (disk full, I/O) or StoreError naming ``doing``.
        """
        con = self._con if con is None else con
        try:
            con.execute("BEGIN TRANSACTION")
        except duckdb.Error as exc:
            raise self._failed(doing, exc) from exc
        try:
            yield con
            con.execute("COMMIT")
        except BaseException as exc:
            try:
                con.execute("ROLLBACK")
            except duckdb.Error:
                pass
            if isinstance(exc, duckdb.Error):
                raise self._failed(doing, exc) from exc
            raise

    def _failed(self, doing: str, exc: duckdb.Error) -> StoreError:
        """The StoreError for a DuckDB error; an invalidated database is remembered
        (``invalidated``) and reported once to ``on_invalidated``."""
        err = _store_error(doing, exc)
        if isinstance(err, StoreInvalidated) and self.invalidated is None:
            self.invalidated = err
            log.critical("%s", err)
            if self.on_invalidated is not None:
                try:
                    self.on_invalidated(err)
                except Exception:
                    log.exception("on_invalidated failed")
        return err

    def _read_error(self, exc: duckdb.Error) -> StoreError:
        """A failed read is a StoreError; one that meets an invalidated database is reported as
        such (a read can be the first statement to find it: the service must stop then too)."""
        return self._failed("reading", exc) if _is_fatal(exc) else StoreError("reading", exc)

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
            raise self._read_error(exc) from exc

    def query_arrow(self, sql: str, params: Any = None) -> pa.Table:
        """``query``, its result as an Arrow table (for reads of many rows); errors become StoreError.

        ``execute``, not ``sql(..., params=...)``: DuckDB's relation with parameters cost 0.2 s
        more for a day's values (0.77 s against 0.56, medians of six; the query alone 0.44 s).
        """
        try:
            return self.cursor().execute(sql, params).to_arrow_table()
        except duckdb.Error as exc:
            raise self._read_error(exc) from exc

    def healthcheck(self) -> dict[str, Any]:
        """A real query: the schema version and the number of stored events."""
        row = self.query("SELECT (SELECT value FROM meta WHERE key = 'schema_version'), (SELECT count(*) FROM events)")[
            0
        ]
        return {"schema_version": int(row[0]), "events": int(row[1])}

    # --- contracts ----------------------------------------------------------------------------

    @property
    def contract_validators(self) -> ValidatorCache:
        """Compiled validators of the registered contract versions (contracts.py), for the rollups."""
        if self._validators is None:
            # Store adds the contract versions' methods to this class (registry.py)
            self._validators = ValidatorCache(cast(ContractStore, self))
        return self._validators

    def _rollup_batch(self) -> RollupBatch:
        # Every batch of counts checks outputs against their contract version: ingest, a
        # partial insert and the recovery at open count the same way.
        return RollupBatch(
            self.rollup,
            bucket_seconds=self.bucket_seconds,
            check=self._check_contract,
            registered=self._contract_registered,
            horizons=self.horizons,
        )

    def unchecked_counts(self) -> dict[str, int]:
        """Outputs of registered contract versions counted unchecked since start, by reason."""
        with self._checks_lock:
            return dict(self.contract_unchecked)

    def _contract_registered(self, contract: str, version: str) -> bool:
        return self.contract_validators.get(contract, version) is not None

    def _run_checks(self, batches: Sequence[RollupBatch]) -> None:
        # Contract checks of committed (and answered) events, before the merge's transaction
        # opens: however long they take, no transaction and no request waits on them.
        spent: dict[tuple[str, str], float] = {}
        for batch in batches:
            batch.run_checks(spent)
            if batch.unchecked:
                with self._checks_lock:
                    self.contract_unchecked.update(batch.unchecked)
                batch.unchecked.clear()

    def _check_contract(
        self, cohort: tuple[str, str, str, str], version: str, bucket: int, output: dict[str, Any] | str
    ) -> tuple[ContractStatus, Sequence[tuple[str | None, str]]]:
        validators = self.contract_validators
        cap = self.rollup.contract_checks_per_bucket
        if cap:
            if validators.get(cohort[2], version) is None:
                return ContractStatus.unregistered, ()
            key = (cohort, version, bucket)
            with self._checks_lock:
                done = self._checks_done.get(key, 0)
                if done >= cap:
                    return ContractStatus.unchecked, ()
                if len(self._checks_done) > 50_000:  # keep the buckets of the last two hours
                    self._checks_done = {k: n for k, n in self._checks_done.items() if k[2] >= bucket - 7200}
                self._checks_done[key] = done + 1
        return validators.check(cohort[2], version, orjson.loads(output) if isinstance(output, str) else output)
