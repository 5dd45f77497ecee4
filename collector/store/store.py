"""``Store``: the DuckDB backend, put together from the modules of this package, and how a
file is opened (created, migrated, recovered) and closed."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import duckdb

from ..errors import StoreError, StoreLocked
from ..rollup import RollupConfig
from ..settings import size_bytes
from ..tiers import HOUR, Horizons, TierPolicy
from .alerts import AlertRecords
from .backend import StoreBackend
from .baselines import BaselineRecords
from .connection import _copy_wal, _is_lock_error, _is_wal_error, _wal_refusal, silence_progress_bar
from .contract_usage import ContractUsage
from .incidents import IncidentRecords
from .outbox import OutboxRecords
from .probes import PROBES_SCHEMA, ProbeRecords
from .reads import Reads
from .registry import ContractVersions
from .runs import RUNS_SCHEMA, RunRecords
from .schema import Schema
from .tiers import TieredRollups

__all__ = ["Store"]

log = logging.getLogger(__name__)

# DuckDB's storage format for files the store creates (DuckDB 1.2 and later read it).
STORAGE_VERSION = "v1.2.0"


class Store(
    Reads,
    ContractVersions,
    TieredRollups,
    AlertRecords,
    BaselineRecords,
    OutboxRecords,
    RunRecords,
    IncidentRecords,
    ProbeRecords,
    ContractUsage,
):
    """The DuckDB file: opened once per process, written by one thread at a time.

    >>> with Store.open(tmp_path / "x.duckdb") as store:   # doctest: +SKIP
    ...     store.write_batch(envelopes)
    """

    @classmethod
    def open(
        cls,
        path: Path | str,
        *,
        memory_limit: str = "2GB",
        threads: int = 1,
        checkpoint_threshold: str = "256MB",
        bucket_seconds: int = 60,
        rollup: RollupConfig | None = None,
        read_only: bool = False,
        schemas: Sequence[Schema] = (),
        tiers: TierPolicy | None = None,
        external_access: bool = False,
    ) -> Store:
        """Open (creating or migrating) the database at ``path``, with the tables of ``schemas``.

        ``tiers``: count and fold rollups into minute, hour and day buckets by age (``tiers.py``);
        None keeps every bucket ``bucket_seconds`` wide. ``external_access``: let DuckDB load
        extensions and attach other databases (the scale-out analyzer attaches its lake: lake.py).
        """
        if tiers is not None and HOUR % bucket_seconds:
            raise StoreError(
                f"opening {path}", f"rollup tiers need a bucket width that divides an hour, not {bucket_seconds} s"
            )
        path = Path(path)
        if not read_only:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"opening {path}", f"cannot create its directory: {exc}") from exc
        elif not path.exists():
            raise StoreError("opening", f"database {path} does not exist")
        config: dict[str, str | bool | int | float | list[str]] = {
            "memory_limit": memory_limit,
            "threads": str(threads),
            "checkpoint_threshold": checkpoint_threshold,
            "enable_external_access": "true" if external_access else "false",
            "autoinstall_known_extensions": "false",
            "autoload_known_extensions": "false",
            # A new file is written in the v1.2 storage format (an existing one keeps its own): in
            # the older format every checkpoint converts the key index back to that format's
            # layout, about half of a checkpoint's time (1.3M keys: 0.48 s against 0.21 s, and
            # an import's closing checkpoint 0.59-0.66 s against 0.39-0.40 s; bench/README.md).
            "storage_compatibility_version": STORAGE_VERSION,
        }
        # A write-ahead log left by an unclean shutdown is copied aside before DuckDB replays
        # it: DuckDB drops a torn or unreadable tail without a word, so the copy (and the
        # warning below) is what lets anyone find out what was on disk.
        wal_copy = None if read_only else _copy_wal(path)
        try:
            con = duckdb.connect(str(path), read_only=read_only, config=config)
        except duckdb.Error as exc:
            if isinstance(exc, duckdb.IOException) and _is_lock_error(exc):
                if wal_copy is not None:  # the log of a live writer, not a crash's
                    wal_copy.unlink(missing_ok=True)
                raise StoreLocked(str(path), exc) from exc
            if _is_wal_error(exc):
                raise StoreError(f"opening {path}", _wal_refusal(path, exc)) from exc
            raise StoreError(f"opening {path}", exc) from exc
        if wal_copy is not None:
            log.warning(
                "%s: replayed a write-ahead log left by an unclean shutdown; a copy of it is kept as %s "
                "(DuckDB drops a torn or unreadable tail of the log: if acknowledged events are "
                "missing, that copy holds what was on disk)",
                path,
                wal_copy,
            )
        store = cls(con, path, bucket_seconds=bucket_seconds, rollup=rollup or RollupConfig(), read_only=read_only)
        try:
            silence_progress_bar(con)
            store._migrate()
            # The runs' tables are the collector's own (POST /v1/traces writes them), kept as a
            # schema of their own so their versions never interleave with the events' migrations;
            # so are the probe runs' (every analyzer reads them, whatever else the file holds).
            for schema in dict.fromkeys((RUNS_SCHEMA, PROBES_SCHEMA, *schemas)):
                store._migrate_schema(schema)
            store._check_bucket_width()
            if tiers is not None:
                store.horizons = Horizons(tiers)
                store._load_horizons()
            store._memory_base = size_bytes(memory_limit)
            row = store._con.execute("SELECT count(*) FROM event_keys").fetchone()
            store._indexed_keys = int(row[0]) if row else 0
            store._fit_memory()
            if not read_only:
                store._recover_rollups()
        except duckdb.Error as exc:
            con.close()
            raise StoreError(f"opening {path}", exc) from exc
        except BaseException:
            con.close()
            raise
        return store

    def close(self) -> None:
        """Merge deferred rollups (if the store can), then close the file."""
        try:
            if self._pending and not self.read_only:
                self.flush_rollups()
        except StoreError as exc:  # the events are stored; the next open rolls them up
            log.warning("rollups not merged at close (%s); they are rebuilt at the next open", exc)
        finally:
            if self._merge_con is not None:
                try:
                    self._merge_con.close()
                except duckdb.Error:  # the file's connection is closing anyway
                    pass
            self._con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _implements(store: Store) -> StoreBackend:
    """Never called: mypy checks here that ``Store`` implements the boundary."""
    return store
