"""The analyzer's own records in PostgreSQL, shared by every scale-out node: alerts and their
history, silences, incidents, the notification outbox, baselines and their activations, analyzer
runs, contract versions, agent runs and cases, probe runs (every table of the higher packages'
schemas, plus ``contract_versions``).

Each node keeps them in its local DuckDB file, where the embedded SQL reads and writes them
unchanged; PostgreSQL (schema ``shapewatch_state``, the database of the lake's catalog) holds the
copy every node sees:

- **The elected analyzer pushes.** After each write transaction commits locally, before the
  write is answered, the tables whose content changed are copied to PostgreSQL in one
  PostgreSQL transaction that also raises ``state_meta.version``, on condition that
  ``state_meta.epoch`` is still the one this node was elected with (``take_over`` raised it).
  A deposed leader's push finds another epoch and fails (``NotLeader``): it can never overwrite
  its successor's records.
- **Every other node pulls.** Before answering a read it compares ``state_meta.version`` with
  the version it holds and, when it changed, replaces its local copy of the tables with
  PostgreSQL's in one local transaction; it writes nothing itself (``transaction`` refuses).
- **A takeover** raises the epoch, pulls everything, and moves each local sequence past the
  largest id pulled, so the first write of the new leader continues the numbering.

A table is copied only when its content changed since the last push (row count and two
order-independent sums of row hashes, computed locally): whole (the records are small:
thousands of rows, not the events), except the two that grow with every evaluation and are only
ever appended to (``APPEND_ONLY``: alert history, analyzer runs), of which only the new rows
are copied. DuckDB's postgres extension does the copying, so the types are DuckDB's own on
both sides.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import duckdb

from ..errors import StoreError, StoreUnavailable
from .connection import explicit_transaction
from .schema import Schema, tables_of

__all__ = [
    "PG_SCHEMA",
    "STATE_ALIAS",
    "NotLeader",
    "SharedState",
    "shared_tables",
]

log = logging.getLogger(__name__)

PG_SCHEMA = "shapewatch_state"
STATE_ALIAS = "shapewatch_state_db"
LOCK_STATE = 0x5357_0003  # advisory lock: creating the shared tables

_META_DDL = f"""CREATE TABLE IF NOT EXISTS {PG_SCHEMA}.state_meta (
    id INTEGER PRIMARY KEY CHECK (id = 1), epoch BIGINT NOT NULL, version BIGINT NOT NULL,
    leader TEXT, api_url TEXT, elected_at TIMESTAMPTZ, pushed_at TIMESTAMPTZ)"""


#: Tables only ever appended to, by an increasing key: copied by their new rows only (they grow
#: with every evaluation; the others are rewritten whole when they change).
APPEND_ONLY = {"alert_history": "seq", "analyzer_runs": "run_id"}


class NotLeader(StoreUnavailable):
    """This node's epoch is no longer PostgreSQL's: another analyzer was elected since."""


def shared_tables(schemas: Iterable[Schema]) -> list[str]:
    """The tables every node shares: those of the higher packages' schemas and the contract
    versions (registered through the API, read by the rules)."""
    names: set[str] = {"contract_versions"}
    for schema in schemas:
        names |= tables_of(schema.migrations)
    return sorted(names)


class SharedState:
    """The PostgreSQL copy of a store's shared tables, attached to its DuckDB connection
    (``con``) as ``STATE_ALIAS``; the caller (``LakeBoundStore``) holds its write lock around
    every call that writes."""

    def __init__(self, con: duckdb.DuckDBPyConnection, dsn: str, tables: Sequence[str]) -> None:
        self.con, self.dsn, self.tables = con, dsn, list(tables)
        self.epoch: int | None = None  # set while this node is the elected analyzer
        self.version = -1  # the version of PostgreSQL's copy the local tables hold
        self._digests: dict[str, tuple[Any, ...]] = {}
        self._columns: dict[str, list[str]] = {}
        # A node that wrote (was elected) may hold rows PostgreSQL never got: its next pull
        # rewrites every table, append-only ones included.
        self._full_pull = True
        self._pg: Any = None  # psycopg connection for meta()
        self._meta_lock = threading.Lock()

    # --- setup -----------------------------------------------------------------------------------

    def attach(self) -> None:
        """Attach PostgreSQL and create what is missing there (under an advisory lock: two nodes
        starting at once would both create the tables)."""
        import psycopg

        try:
            with psycopg.connect(self.dsn, autocommit=True, connect_timeout=10) as pg:
                pg.execute("SELECT pg_advisory_lock(%s)", [LOCK_STATE])
                try:
                    pg.execute(f"CREATE SCHEMA IF NOT EXISTS {PG_SCHEMA}")
                    pg.execute(_META_DDL)
                    pg.execute(
                        f"INSERT INTO {PG_SCHEMA}.state_meta (id, epoch, version) VALUES (1, 0, 0) ON CONFLICT DO NOTHING"
                    )
                    dsn = self.dsn.replace("'", "''")
                    self.con.execute(f"ATTACH '{dsn}' AS {STATE_ALIAS} (TYPE postgres, SCHEMA '{PG_SCHEMA}')")
                    for table in self.tables:
                        self.con.execute(
                            f"CREATE TABLE IF NOT EXISTS {STATE_ALIAS}.{table} AS FROM main.{table} LIMIT 0"
                        )
                finally:
                    pg.execute("SELECT pg_advisory_unlock(%s)", [LOCK_STATE])
        except (duckdb.Error, psycopg.Error) as exc:
            raise StoreError("attaching the shared analyzer state in PostgreSQL", exc) from exc
        self._columns = {
            t: [r[0] for r in self.con.execute(f"SELECT * FROM main.{t} LIMIT 0").description or []]
            for t in self.tables
        }

    # --- reading the meta row ----------------------------------------------------------------------

    def meta(self) -> tuple[int, int, str | None, str | None]:
        """(epoch, version, leader, api_url) as PostgreSQL holds them now (one query on a
        connection kept open: every read of a standby asks)."""
        import psycopg

        with self._meta_lock:
            for attempt in (1, 2):  # a connection PostgreSQL closed is opened again once
                try:
                    if self._pg is None or self._pg.closed:
                        self._pg = psycopg.connect(self.dsn, autocommit=True, connect_timeout=10)
                    row = self._pg.execute(
                        f"SELECT epoch, version, leader, api_url FROM {PG_SCHEMA}.state_meta"
                    ).fetchone()
                    break
                except psycopg.Error as exc:
                    if self._pg is not None:
                        self._pg.close()
                    self._pg = None
                    if attempt == 2:
                        raise StoreUnavailable(f"reading the shared analyzer state: {exc}", retry_after=1) from exc
        assert row is not None
        return int(row[0]), int(row[1]), row[2], row[3]

    def close(self) -> None:
        with self._meta_lock:
            if self._pg is not None:
                self._pg.close()
                self._pg = None

    # --- the standby's side ------------------------------------------------------------------------

    def pull(self, *, version: int | None = None) -> bool:
        """Replace the local tables with PostgreSQL's copy when its version is not the one held
        (``version``: PostgreSQL's, when the caller just read it); True when it did."""
        if version is not None and version == self.version:
            return False
        try:
            return self._pull()
        except StoreUnavailable:
            # DuckDB caches PostgreSQL's catalog: a table the leader recreated (a release added a
            # column) is read again after the cache is dropped.
            self.con.execute("CALL pg_clear_cache()")
            return self._pull()

    def _pull(self) -> bool:
        con = self.con
        try:
            with explicit_transaction(con):
                row = con.execute(f"SELECT version FROM {STATE_ALIAS}.state_meta").fetchone()
                now = int(row[0]) if row else 0
                if now == self.version:  # nothing changed: the read-only transaction ends
                    return False
                full = self._full_pull
                for table in self.tables:
                    cols = ", ".join(f'"{c}"' for c in self._shared_columns(table))
                    key = APPEND_ONLY.get(table)
                    if key is not None and not full:  # the rows after the last one held
                        top = con.execute(f'SELECT coalesce(max("{key}"), 0) FROM main.{table}').fetchone()
                        # a constant, so the filter reaches PostgreSQL (a subquery would not)
                        con.execute(
                            f"""INSERT INTO main.{table} ({cols}) SELECT {cols} FROM {STATE_ALIAS}.{table}
                                WHERE "{key}" > ?""",
                            [top[0] if top else 0],
                        )
                        continue
                    con.execute(f"DELETE FROM main.{table}")
                    con.execute(f"INSERT INTO main.{table} ({cols}) SELECT {cols} FROM {STATE_ALIAS}.{table}")
        except duckdb.Error as exc:
            raise StoreUnavailable(f"copying the shared analyzer state from PostgreSQL: {exc}") from exc
        self.version = now
        self._full_pull = False
        self._digests.clear()  # the next push compares with what was pulled
        return True

    def _shared_columns(self, table: str) -> list[str]:
        """The columns both sides have (a newer release may have added some locally; the push
        then recreates PostgreSQL's table with them)."""
        theirs = {r[0] for r in self.con.execute(f"SELECT * FROM {STATE_ALIAS}.{table} LIMIT 0").description or []}
        return [c for c in self._columns[table] if c in theirs]

    # --- the leader's side -------------------------------------------------------------------------

    def take_over(self, name: str, api_url: str | None) -> int:
        """Become the writer of the shared state: raise the epoch (every later push of a previous
        leader fails), pull everything, and move the local sequences past the ids pulled."""
        import psycopg

        try:
            with psycopg.connect(self.dsn, autocommit=True, connect_timeout=10) as pg:
                row = pg.execute(
                    f"""UPDATE {PG_SCHEMA}.state_meta SET epoch = epoch + 1, leader = %s, api_url = %s,
                        elected_at = now() RETURNING epoch""",
                    [name, api_url],
                ).fetchone()
        except psycopg.Error as exc:
            raise StoreUnavailable(f"taking over the shared analyzer state: {exc}") from exc
        assert row is not None
        self.version, self._full_pull = -1, True
        self.pull()
        self._advance_sequences()
        self.epoch = int(row[0])
        self._full_pull = True  # from now on its local rows may run ahead of PostgreSQL's
        return self.epoch

    def _advance_sequences(self) -> None:
        con = self.con
        for table, column, default in con.execute(
            "SELECT table_name, column_name, column_default FROM duckdb_columns() "
            "WHERE database_name = current_database() AND column_default LIKE 'nextval(%'"
        ).fetchall():
            if table not in self.tables:
                continue
            seq = default.split("'")[1]
            row = con.execute(f'SELECT max("{column}") FROM main.{table}').fetchone()
            top = int(row[0]) if row and row[0] is not None else 0
            if top > 0:  # nextval until the sequence is past the largest id pulled
                con.execute(f"SELECT max(nextval('{seq}')) FROM range({top})").fetchall()

    def push(self) -> None:
        """Copy the tables that changed to PostgreSQL, if this node is still the leader."""
        if self.epoch is None:
            raise NotLeader("this node is not the elected analyzer: it cannot write the shared state")
        con = self.con
        try:
            digests = {
                t: tuple(
                    con.execute(
                        f"SELECT count(*), bit_xor(hash(t)), sum(hash(t)::HUGEINT) FROM main.{t} AS t"
                    ).fetchone()
                    or ()
                )
                for t in self.tables
            }
            changed = [t for t in self.tables if digests[t] != self._digests.get(t)]
            if not changed:
                return
            with explicit_transaction(con):
                rows = con.execute(
                    f"UPDATE {STATE_ALIAS}.state_meta SET version = version + 1, pushed_at = now() WHERE epoch = ?",
                    [self.epoch],
                ).fetchall()
                if not rows or rows[0][0] != 1:
                    raise NotLeader(
                        f"another analyzer was elected after this one (epoch {self.epoch}): this node's "
                        "records are no longer the shared state"
                    )
                for table in changed:
                    if self._shared_columns(table) != self._columns[table]:  # a release added columns
                        con.execute(f"DROP TABLE {STATE_ALIAS}.{table}")
                        con.execute(f"CREATE TABLE {STATE_ALIAS}.{table} AS FROM main.{table} LIMIT 0")
                    cols = ", ".join(f'"{c}"' for c in self._columns[table])
                    key = APPEND_ONLY.get(table)
                    if key is not None:  # the rows PostgreSQL does not have yet
                        top = con.execute(f'SELECT coalesce(max("{key}"), 0) FROM {STATE_ALIAS}.{table}').fetchone()
                        con.execute(
                            f"""INSERT INTO {STATE_ALIAS}.{table} ({cols}) SELECT {cols} FROM main.{table}
                                WHERE "{key}" > ?""",
                            [top[0] if top else 0],
                        )
                        continue
                    con.execute(f"DELETE FROM {STATE_ALIAS}.{table}")
                    con.execute(f"INSERT INTO {STATE_ALIAS}.{table} ({cols}) SELECT {cols} FROM main.{table}")
                row = con.execute(f"SELECT version FROM {STATE_ALIAS}.state_meta").fetchone()
        except NotLeader:
            self.epoch = None
            raise
        except duckdb.Error as exc:
            raise StoreUnavailable(f"copying the analyzer's records to PostgreSQL: {exc}") from exc
        self._digests.update({t: digests[t] for t in changed})
        self.version = int(row[0]) if row else self.version
