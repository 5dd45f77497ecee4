"""The scale-out store: the observation tables (events, idempotency keys, cohorts, rollups) in a
DuckLake whose catalog is PostgreSQL and whose data is Parquet files under a path (a local
directory in tests, an ``s3://`` prefix in production).

Three things use it, each through this module only (no SQL about these tables elsewhere):

- ``LakeWriter``: what a scale-out worker commits. ``write_batch`` deduplicates a batch against
  the idempotency keys kept for the dedup TTL (the same conflict rule as ``Store``: same id and
  payload is a duplicate, another payload a conflict, nothing stored for either), then inserts
  keys, events and rollups in one DuckLake transaction. Lookup and insert are race-free only
  because one worker at a time writes a shard (``shard_of``: one event id, one shard), which the
  worker guarantees with a PostgreSQL advisory lock per shard.
- ``LakeBoundStore``: a ``Store`` (a local DuckDB file holding the analyzer's own records:
  alerts, baselines, the outbox) whose observation tables are temporary views of the lake's, on
  every connection it hands out, so the analyzer runs the same rules and the same SQL.
- ``compact_lake``: the scheduled maintenance (rollup compaction, merging small Parquet
  files, expiring old snapshots, deleting files no snapshot needs).

DuckLake has no primary keys, unique constraints or sequences: cohort ids are handed out by a
PostgreSQL table (``shapewatch_cohorts``, an identity column and a unique key), rollups are
append-only as they are in the embedded store, and served-model counts are appended and summed
by readers (they are already summed by every read).

>>> lake = LakeConfig(dsn="host=... dbname=shapewatch", data_path="s3://bucket/lake/")  # doctest: +SKIP
>>> writer = LakeWriter.open(lake)                                                   # doctest: +SKIP
>>> writer.write_batch(envelopes, shard=3)                                           # doctest: +SKIP
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from ..envelope import Envelope
from ..errors import StoreError, StoreUnavailable
from ..rollup import RollupBatch, RollupConfig
from . import merge
from .batch import BatchBuilder, Purged, WriteResult, _results
from .connection import explicit_transaction, silence_progress_bar
from .schema import _COHORT_EVENTS, Schema
from .shared_state import SharedState, shared_tables
from .store import Store

__all__ = ["LAKE_TABLES", "LakeBoundStore", "LakeConfig", "LakeWriter", "compact_lake", "load_lake_extensions"]

log = logging.getLogger(__name__)

# The observation tables, as the embedded schema has them after every migration (schema.py),
# without keys: DuckLake has none. event_keys carries the shard of its id, so a lookup reads
# only the files of its shard (a worker's batch is one shard: its files hold one shard each).
# id_key is md5(event_id) as hex text, not md5_number's UHUGEINT: DuckLake 1.5.5 stores a UHUGEINT
# through a double (its low digits are lost, so no stored key equals its id's key again;
# tests/cluster/test_lake.py keeps that finding), and casting a UHUGEINT to text is slow (a
# quarter of a second per 1,000 keys, measured). LakeBoundStore shows md5_number(event_id) again.
_LAKE_DDL = {
    "meta": "key VARCHAR NOT NULL, value VARCHAR NOT NULL",
    "cohorts": "cohort_id INTEGER NOT NULL, model VARCHAR NOT NULL, prompt_version VARCHAR NOT NULL, "
    "contract VARCHAR NOT NULL, first_seen TIMESTAMPTZ NOT NULL, source VARCHAR NOT NULL",
    "events": "id_key VARCHAR NOT NULL, event_id VARCHAR NOT NULL, payload_hash VARCHAR NOT NULL, "
    "generated_id BOOLEAN NOT NULL, cohort_id INTEGER NOT NULL, ts TIMESTAMPTZ NOT NULL, "
    "received_at TIMESTAMPTZ NOT NULL, served_model VARCHAR, contract_version VARCHAR, source VARCHAR, "
    "run_id VARCHAR, agent_release VARCHAR, finish_reason VARCHAR, attributes VARCHAR, output VARCHAR NOT NULL",
    "event_keys": "id_key VARCHAR NOT NULL, payload_hash VARCHAR NOT NULL, received_at TIMESTAMPTZ NOT NULL, "
    "shard INTEGER NOT NULL",
    "cohort_buckets": "cohort_id INTEGER NOT NULL, bucket TIMESTAMPTZ NOT NULL, events BIGINT NOT NULL",
    "field_rollups": "cohort_id INTEGER NOT NULL, bucket TIMESTAMPTZ NOT NULL, path VARCHAR NOT NULL, scope VARCHAR, "
    "present BIGINT NOT NULL, n_null BIGINT NOT NULL, n_boolean BIGINT NOT NULL, n_integer BIGINT NOT NULL, "
    "n_number BIGINT NOT NULL, n_string BIGINT NOT NULL, n_array BIGINT NOT NULL, n_object BIGINT NOT NULL, "
    "long_strings BIGINT NOT NULL, values_overflow BIGINT NOT NULL, n_true BIGINT",
    "value_rollups": "cohort_id INTEGER NOT NULL, bucket TIMESTAMPTZ NOT NULL, path VARCHAR NOT NULL, "
    "value VARCHAR NOT NULL, n BIGINT NOT NULL",
    "array_rollups": "cohort_id INTEGER NOT NULL, bucket TIMESTAMPTZ NOT NULL, path VARCHAR NOT NULL, "
    "length BIGINT NOT NULL, n BIGINT NOT NULL",
    "number_rollups": "cohort_id INTEGER NOT NULL, bucket TIMESTAMPTZ NOT NULL, path VARCHAR NOT NULL, "
    "value DOUBLE NOT NULL, n BIGINT NOT NULL",
    "served_models": "cohort_id INTEGER, bucket TIMESTAMPTZ, served_model VARCHAR, n BIGINT NOT NULL",
    "outcomes": "cohort_id INTEGER, bucket TIMESTAMPTZ, kind VARCHAR, n BIGINT NOT NULL",
    "contract_rollups": "cohort_id INTEGER NOT NULL, bucket TIMESTAMPTZ NOT NULL, contract_version VARCHAR NOT NULL, "
    "status VARCHAR NOT NULL, n BIGINT NOT NULL",
    "violation_rollups": "cohort_id INTEGER NOT NULL, bucket TIMESTAMPTZ NOT NULL, contract_version VARCHAR NOT NULL, "
    "path VARCHAR, keyword VARCHAR NOT NULL, n BIGINT NOT NULL",
    "tier_marks": "cohort_id INTEGER NOT NULL, newest TIMESTAMPTZ NOT NULL, minute_from TIMESTAMPTZ NOT NULL, "
    "hour_from TIMESTAMPTZ NOT NULL",
}
LAKE_TABLES = tuple(_LAKE_DDL)

# PostgreSQL's side: cohort ids (the lake has no sequence) and the advisory-lock namespaces.
_PG_DDL = """CREATE TABLE IF NOT EXISTS shapewatch_cohorts (
    cohort_id INTEGER GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, model TEXT NOT NULL,
    prompt_version TEXT NOT NULL, contract TEXT NOT NULL, first_seen TIMESTAMPTZ NOT NULL,
    source TEXT NOT NULL DEFAULT 'production', UNIQUE (model, prompt_version, contract, source))"""
#: advisory lock keys (first int of the two-int form): schema setup, cohort registration
LOCK_SCHEMA = 0x5357_0001
LOCK_COHORTS = 0x5357_0002

_EXTENSIONS = (("postgres", "postgres_scanner"), ("ducklake", "ducklake"))


@dataclass(frozen=True)
class LakeConfig:
    """Where the lake is: the PostgreSQL catalog's DSN (libpq key=value or URI) and the data path."""

    dsn: str
    data_path: str
    name: str = "lake"
    #: for an ``s3://`` data path: endpoint, region, key_id, secret, url_style, use_ssl (DuckDB's
    #: S3 secret); empty: the default credential chain of the httpfs extension
    s3: tuple[tuple[str, str], ...] = ()

    def attach_sql(self, *, read_only: bool = False) -> str:
        data = self.data_path.replace("'", "''")
        dsn = self.dsn.replace("'", "''")
        ro = ", READ_ONLY" if read_only else ""
        return f"ATTACH IF NOT EXISTS 'ducklake:postgres:{dsn}' AS {self.name} (DATA_PATH '{data}'{ro})"


def load_lake_extensions(con: duckdb.DuckDBPyConnection) -> None:
    """Install the ducklake and postgres extensions from their wheels (the scale-out extra) and
    load them: nothing is downloaded at run time."""
    try:
        from duckdb_extensions import import_extension
    except ImportError as exc:
        raise StoreError(
            "opening the lake", "the scale-out extra is not installed (pip install 'shapewatch[scaleout]')"
        ) from exc
    for wheel, name in _EXTENSIONS:
        try:
            importlib.import_module(f"duckdb_extension_{wheel}")
        except ImportError as exc:
            raise StoreError("opening the lake", f"duckdb-extension-{wheel} is not installed") from exc
        import_extension(wheel, con=con)
        con.execute(f"LOAD {name}")


def _lake_connection(cfg: LakeConfig, *, threads: int = 2, memory_limit: str = "1GB") -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(
        config={
            "threads": str(threads),
            "memory_limit": memory_limit,
            "autoinstall_known_extensions": "false",
            "autoload_known_extensions": "false",
        }
    )
    try:
        silence_progress_bar(con)
        load_lake_extensions(con)
        attach_lake(con, cfg)
        con.execute(f"USE {cfg.name}")
    except BaseException:
        con.close()
        raise
    return con


def _pg(dsn: str) -> Any:
    import psycopg

    try:
        return psycopg.connect(dsn, autocommit=True, connect_timeout=10)
    except psycopg.Error as exc:
        raise StoreError("connecting to the lake's PostgreSQL catalog", exc) from exc


def _pg_error() -> type[Exception]:
    try:
        import psycopg
    except ImportError:  # then no PostgreSQL call was made either
        return duckdb.Error
    error: type[Exception] = psycopg.Error  # typed here: without the scaleout extra, psycopg is unknown to mypy
    return error


def _s3_secret(con: duckdb.DuckDBPyConnection, cfg: LakeConfig) -> None:
    """The httpfs extension (from its wheel) and an S3 secret for the lake's data path."""
    try:
        from duckdb_extensions import import_extension

        import_extension("httpfs", con=con)
        con.execute("LOAD httpfs")
        if cfg.s3:
            opts = ", ".join(f"{k.upper()} '{v.replace(chr(39), chr(39) * 2)}'" for k, v in cfg.s3)
            con.execute(f"CREATE OR REPLACE SECRET shapewatch_lake_s3 (TYPE s3, {opts})")
    except (ImportError, duckdb.Error) as exc:
        raise StoreError("setting up the lake's object storage", exc) from exc


def attach_lake(con: duckdb.DuckDBPyConnection, cfg: LakeConfig) -> None:
    """Attach the lake to ``con`` and create its tables and PostgreSQL's cohort table where
    missing. One process at a time (an advisory lock): DuckLake 1.5.5 creates its catalog tables
    on the first ATTACH, and two processes attaching a new catalog at once fail on PostgreSQL's
    unique type names (seen with two workers starting together; tests/cluster/test_lake.py)."""
    if "://" not in cfg.data_path:
        Path(cfg.data_path).mkdir(parents=True, exist_ok=True)
    elif cfg.data_path.startswith("s3://"):
        _s3_secret(con, cfg)
    try:
        with _pg(cfg.dsn) as pg:
            pg.execute("SELECT pg_advisory_lock(%s)", [LOCK_SCHEMA])
            try:
                pg.execute(_PG_DDL)
                con.execute(cfg.attach_sql())
                for table, cols in _LAKE_DDL.items():
                    con.execute(f"CREATE TABLE IF NOT EXISTS {cfg.name}.main.{table} ({cols})")
            finally:
                pg.execute("SELECT pg_advisory_unlock(%s)", [LOCK_SCHEMA])
    except (duckdb.Error, OSError, _pg_error()) as exc:
        raise StoreError("attaching the lake", exc) from exc


class LakeWriter:
    """A worker's connection to the lake: idempotent batch writes, one shard at a time.

    >>> w = LakeWriter.open(LakeConfig(dsn, "/data/lake"))     # doctest: +SKIP
    >>> w.write_batch(envelopes, shard=2)                      # doctest: +SKIP
    """

    def __init__(
        self, con: duckdb.DuckDBPyConnection, cfg: LakeConfig, *, bucket_seconds: int, rollup: RollupConfig
    ) -> None:
        self._con = con
        self.cfg = cfg
        self.bucket_seconds = bucket_seconds
        self.rollup = rollup
        self._cohorts: dict[tuple[str, str, str, str], int] = {}
        self._lock = threading.Lock()
        self._last: datetime | None = None

    @classmethod
    def open(cls, cfg: LakeConfig, *, bucket_seconds: int = 60, rollup: RollupConfig | None = None) -> LakeWriter:
        con = _lake_connection(cfg)
        return cls(con, cfg, bucket_seconds=bucket_seconds, rollup=rollup or RollupConfig())

    def close(self) -> None:
        self._con.close()

    def query(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        """A read on the lake (tests and the benchmark check what was stored with it)."""
        with self._lock:
            try:
                return self._con.execute(sql, params).fetchall()
            except duckdb.Error as exc:
                raise StoreError("reading the lake", exc) from exc

    # --- cohorts --------------------------------------------------------------------------------

    def _cohort_ids(self, first_ts: dict[tuple[str, str, str, str], datetime]) -> dict[tuple[str, str, str, str], int]:
        """Each cohort's id: handed out by PostgreSQL (committed first), then its row added to the
        lake's cohorts table under an advisory lock, so two workers never add the same cohort."""
        new = [k for k in first_ts if k not in self._cohorts]
        if not new:
            return {k: self._cohorts[k] for k in first_ts}
        with _pg(self.cfg.dsn) as pg:
            with pg.cursor() as cur:
                cur.executemany(
                    "INSERT INTO shapewatch_cohorts (model, prompt_version, contract, source, first_seen) "
                    "VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                    [(*k, first_ts[k]) for k in new],
                )
            ids: dict[tuple[str, str, str, str], int] = {}
            for k in new:
                row = pg.execute(
                    "SELECT cohort_id, first_seen FROM shapewatch_cohorts WHERE model = %s AND prompt_version = %s "
                    "AND contract = %s AND source = %s",
                    list(k),
                ).fetchone()
                ids[k] = int(row[0])
                first_ts[k] = row[1]
            pg.execute("SELECT pg_advisory_lock(%s)", [LOCK_COHORTS])
            try:
                have = {
                    int(r[0])
                    for r in self._con.execute(
                        "SELECT cohort_id FROM cohorts WHERE cohort_id IN (SELECT unnest(?::INTEGER[]))",
                        [list(ids.values())],
                    ).fetchall()
                }
                missing = [k for k in new if ids[k] not in have]
                if missing:
                    self._con.register(
                        "_nc",
                        pa.table(
                            {
                                "cohort_id": pa.array([ids[k] for k in missing], pa.int32()),
                                "model": [k[0] for k in missing],
                                "prompt_version": [k[1] for k in missing],
                                "contract": [k[2] for k in missing],
                                "first_seen": pa.array([first_ts[k] for k in missing], pa.timestamp("us", tz="UTC")),
                                "source": [k[3] for k in missing],
                            }
                        ),
                    )
                    try:
                        self._con.execute("INSERT INTO cohorts SELECT * FROM _nc")
                    finally:
                        self._con.unregister("_nc")
            finally:
                pg.execute("SELECT pg_advisory_unlock(%s)", [LOCK_COHORTS])
        self._cohorts.update(ids)
        return {k: self._cohorts[k] for k in first_ts}

    # --- writes ---------------------------------------------------------------------------------

    def _now(self, now: datetime | None) -> datetime:
        t = now or datetime.now(UTC)
        if self._last is not None and t <= self._last:
            t = self._last + timedelta(microseconds=1)
        self._last = t
        return t

    def write_batch(
        self,
        envelopes: Sequence[Envelope],
        *,
        shard: int | Sequence[int],
        dedup_ttl: timedelta = timedelta(days=7),
        now: datetime | None = None,
    ) -> list[WriteResult]:
        """Store the envelopes not seen before, with their rollups, in one DuckLake transaction;
        one result per envelope, in order, once committed. ``shard``: the shard of every
        envelope, or of each (a worker commits what it fetched from all its shards at once).

        The caller holds the shards (their advisory locks): nothing else stores an id of these
        shards between the lookup of the kept keys and the insert.
        """
        shards = [shard] * len(envelopes) if isinstance(shard, int) else list(shard)
        if len(shards) != len(envelopes):
            raise ValueError("shard must be one shard or one per envelope")
        with self._lock:
            builder = BatchBuilder(RollupBatch(self.rollup, bucket_seconds=self.bucket_seconds))
            builder.add_many(envelopes)
            batch = builder.finish()
            if not batch.unique:
                return _results(batch, set(), {})
            t = self._now(now)
            try:
                by_key = self._cohort_ids({**batch.served_cohorts, **batch.cohorts})
                ids = pa.array([by_key[key] for key in batch.cohorts], pa.int32())
                table = batch.table.append_column("cohort_id", ids.take(batch.table["cohort_key"]))
                con = self._con
                with explicit_transaction(con):
                    wanted = list(dict.fromkeys(batch.event_ids))
                    existing = dict(
                        con.execute(
                            """SELECT p.e, k.payload_hash
                               FROM (SELECT md5(e) AS id_key, e FROM unnest(?::VARCHAR[]) AS t(e)) p
                               JOIN (SELECT id_key, payload_hash FROM event_keys
                                     WHERE shard IN (SELECT unnest(?::INTEGER[])) AND received_at >= ?) k
                               USING (id_key)""",
                            [wanted, sorted(set(shards)), t - dedup_ttl],
                        ).fetchall()
                    )
                    if existing:
                        table = table.filter(
                            pc.invert(pc.is_in(table["event_id"], value_set=pa.array(list(existing), pa.string())))
                        )
                    inserted: set[str] = set()
                    if table.num_rows:
                        shard_of_id = dict(zip((e.event_id for e in envelopes), shards, strict=True))
                        table = table.append_column(
                            "shard", pa.array([shard_of_id[i] for i in table["event_id"].to_pylist()], pa.int32())
                        )
                        con.register("_batch", table)
                        stamp = f"'{t.isoformat()}'::TIMESTAMPTZ"
                        con.execute(
                            f"INSERT INTO event_keys SELECT md5(event_id), payload_hash, {stamp}, shard FROM _batch"
                        )
                        con.execute(
                            f"""INSERT INTO events
                                SELECT md5(event_id), event_id, payload_hash, generated_id, cohort_id, ts,
                                       {stamp}, served_model, contract_version, source, run_id, agent_release,
                                       finish_reason, attributes, output
                                FROM _batch"""
                        )
                        con.unregister("_batch")
                        inserted = set(table["event_id"].to_pylist())
                        rollups = batch.rollups if len(inserted) == batch.unique else self._rollups_of(batch, inserted)
                        merge.merge_rollups(con, [rollups], self.rollup, keyed=False)
            except (duckdb.Error, _pg_error()) as exc:
                raise StoreError("writing a batch to the lake", exc) from exc
            return _results(batch, inserted, existing)

    def _rollups_of(self, batch: Any, event_ids: set[str]) -> RollupBatch:
        cohorts = list(batch.cohorts)
        rollups = RollupBatch(self.rollup, bucket_seconds=self.bucket_seconds)
        cols = batch.table.select(["event_id", "cohort_key", "ts", "served_model", "contract_version", "output"])
        rows = [r for r in zip(*cols.to_pydict().values(), strict=True) if r[0] in event_ids]
        if rows:
            _, keys, tss, served, versions, outputs = zip(*rows, strict=True)
            rollups.add_many(outputs, [cohorts[k] for k in keys], tss, served, versions)
        rollups.tables()
        return rollups

    # --- maintenance ----------------------------------------------------------------------------

    def compact(
        self, *, older_than: timedelta = timedelta(minutes=10), dedup_ttl: timedelta = timedelta(days=7)
    ) -> dict[str, int]:
        """The scheduled upkeep: see ``compact_lake``."""
        with self._lock:
            return compact_lake(self._con, self.cfg, older_than=older_than, dedup_ttl=dedup_ttl)


def compact_lake(
    con: duckdb.DuckDBPyConnection,
    cfg: LakeConfig,
    *,
    older_than: timedelta = timedelta(minutes=10),
    dedup_ttl: timedelta = timedelta(days=7),
) -> dict[str, int]:
    """Fold rollup rows of each key into one (sums unchanged), drop idempotency keys past the
    dedup TTL, merge small Parquet files, expire snapshots older than ``older_than`` and delete the
    files no snapshot needs. Run by one process at a time (the elected analyzer); a commit that
    meets a worker's concurrent commit is retried by DuckLake or fails and is tried next time."""
    done: dict[str, int] = {}
    now = datetime.now(UTC)
    try:
        with explicit_transaction(con):
            done["rollup_rows_removed"] = merge.compact_rollups(con, until=now - older_than)
            row = con.execute("SELECT count(*) FROM event_keys WHERE received_at < ?", [now - dedup_ttl]).fetchone()
            if row and row[0]:
                con.execute("DELETE FROM event_keys WHERE received_at < ?", [now - dedup_ttl])
            done["keys_purged"] = int(row[0]) if row else 0
        merged = con.execute(f"CALL ducklake_merge_adjacent_files('{cfg.name}')").fetchall()
        done["files_merged"] = len(merged)
        con.execute(
            f"CALL ducklake_expire_snapshots('{cfg.name}', older_than => now() - INTERVAL '{int(older_than.total_seconds())} seconds')"
        )
        cleaned = con.execute(f"CALL ducklake_cleanup_old_files('{cfg.name}', cleanup_all => true)").fetchall()
        done["files_deleted"] = len(cleaned)
    except duckdb.Error as exc:
        raise StoreError("compacting the lake", exc) from exc
    return done


class LakeBoundStore(Store):
    """A ``Store`` whose observation tables are the lake's: the analyzer's own records (alerts,
    baselines, the outbox, its runs) stay in its local file, and every connection the store hands
    out shows the lake's tables in their place (temporary views, which come first in DuckDB's
    name resolution). The rules and their SQL are the embedded store's, unchanged.

    >>> store = LakeBoundStore.open(Path("var/analyzer.duckdb"), external_access=True)  # doctest: +SKIP
    >>> store.bind_lake(LakeConfig(dsn, "/data/lake"))                                    # doctest: +SKIP
    """

    lake: LakeConfig | None = None
    shared: SharedState | None = None

    def bind_lake(self, cfg: LakeConfig) -> None:
        try:
            load_lake_extensions(self._con)
        except duckdb.Error as exc:
            raise StoreError("loading the lake's extensions", exc) from exc
        attach_lake(self._con, cfg)
        self.lake = cfg
        self._shadow(self._con)
        self._local = threading.local()  # cursors made before bind have no views

    # --- the analyzer's records, shared through PostgreSQL (shared_state.py) ---------------------

    def bind_shared_state(self, schemas: Sequence[Schema]) -> None:
        """Share this store's records (the tables of ``schemas`` and the contract versions) with
        every node through the lake's PostgreSQL; until ``take_over`` this node only reads them."""
        assert self.lake is not None, "bind_lake first"
        shared = SharedState(self._con, self.lake.dsn, shared_tables(schemas))
        with self._write_lock:
            shared.attach()
            shared.pull()
        self.shared = shared

    @property
    def is_leader(self) -> bool:
        """Whether this node writes the shared records (always, without shared state)."""
        return self.shared is None or self.shared.epoch is not None

    def take_over(self, name: str, api_url: str | None) -> int:
        """Become the writer of the shared records (the caller won the analyzer election)."""
        assert self.shared is not None
        with self._write_lock:
            return self.shared.take_over(name, api_url)

    def refresh(self) -> bool:
        """A standby's copy of the shared records brought up to PostgreSQL's; True when it
        changed. The leader's copy is the source: nothing to do there."""
        if self.shared is None or self.shared.epoch is not None:
            return False
        _, version, _, _ = self.shared.meta()
        if version == self.shared.version:
            return False
        with self._write_lock:
            return self.shared.pull(version=version)

    def leader_url(self) -> tuple[str | None, str | None]:
        """(name, API URL) of the elected analyzer, as it registered them (None: none yet)."""
        assert self.shared is not None
        _, _, leader, url = self.shared.meta()
        return leader, url

    @contextmanager
    def transaction(self, doing: str) -> Iterator[duckdb.DuckDBPyConnection]:
        """The embedded write transaction; with shared records, only on the elected analyzer,
        and the write is copied to PostgreSQL before this returns (so a 2xx means every node
        will see it, and a takeover carries it)."""
        shared = self.shared
        if shared is None:
            with super().transaction(doing) as con:
                yield con
            return
        if shared.epoch is None:
            raise StoreUnavailable(f"{doing}: this node is not the elected analyzer; send writes there", retry_after=1)
        with self._write_lock:
            with self._transaction(doing) as con:
                yield con
            shared.push()

    def purge_runs(self, before: datetime) -> int:
        return super().purge_runs(before) if self.is_leader else 0

    def close(self) -> None:
        if self.shared is not None:
            self.shared.close()
        super().close()

    def _shadow(self, con: duckdb.DuckDBPyConnection) -> None:
        assert self.lake is not None
        lake = self.lake.name
        for table in LAKE_TABLES:
            if table == "meta":  # the schema version and settings are the local file's
                continue
            cast = " REPLACE (md5_number(event_id) AS id_key)" if table == "events" else ""
            con.execute(f"CREATE OR REPLACE TEMP VIEW {table} AS SELECT *{cast} FROM {lake}.main.{table}")
        # the embedded view (schema.py), over the views above
        con.execute(_COHORT_EVENTS.replace("CREATE VIEW", "CREATE OR REPLACE TEMP VIEW"))

    def cursor(self) -> duckdb.DuckDBPyConnection:
        cur: duckdb.DuckDBPyConnection | None = getattr(self._local, "cur", None)
        if cur is None:
            cur = self._con.cursor()
            if self.lake is not None:
                self._shadow(cur)
            self._local.cur = cur
        return cur

    # The embedded upkeep the service schedules (analysis/maintenance.py), turned to the lake:
    # the lake's rows are folded by compact_lake, its keys purged there too; it has no tiers.

    def compact(self, since: datetime | None = None, until: datetime | None = None) -> int:
        if self.lake is None:
            return super().compact(since, until)
        if not self.is_leader:  # the elected analyzer keeps the lake; two would collide
            return 0
        return self.compact_lake()["rollup_rows_removed"]

    def compact_by_day(self) -> int:
        return self.compact()

    def fold_tiers(self, *, step: timedelta = timedelta(hours=1), max_steps: int | None = None) -> int:
        return 0 if self.lake is not None else super().fold_tiers(step=step, max_steps=max_steps)

    def purge(self, *, raw_retention: timedelta, dedup_ttl: timedelta, now: datetime | None = None) -> Purged:
        if self.lake is None:
            return super().purge(raw_retention=raw_retention, dedup_ttl=dedup_ttl, now=now)
        return Purged(0, 0)  # compact_lake deletes the lake's keys past the TTL

    def write_batches(
        self, batches: Any, *, now: datetime | None = None, merge: bool = True
    ) -> list[list[WriteResult]]:
        if self.lake is None:
            return super().write_batches(batches, now=now, merge=merge)
        raise StoreUnavailable("this node reads the lake; events go to a scale-out collector (POST /v1/outputs there)")

    def compact_lake(self, **kw: Any) -> dict[str, int]:
        """``compact_lake`` on this store's lake (the elected analyzer schedules it)."""
        assert self.lake is not None
        cur = self._con.cursor()
        try:
            cur.execute(f"USE {self.lake.name}")
            return compact_lake(cur, self.lake, **kw)
        finally:
            cur.close()
