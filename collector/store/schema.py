"""The store's own tables: their DDL as versioned migrations, and ``Schema`` for the tables of
higher packages kept in the same file.

A new file is created at ``SCHEMA_VERSION``, an older one is migrated step by step (``core.py``
runs each step in a transaction), a newer one is refused with the version needed.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import duckdb
import orjson
import pyarrow as pa

from ..envelope import payload_hash as _payload_hash

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "Schema", "tables_of"]


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
    -- scope: the array path whose items are the units of this path; NULL: the outputs are
    cohort_id INTEGER NOT NULL, bucket TIMESTAMPTZ NOT NULL, path VARCHAR NOT NULL, scope VARCHAR,
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
    SELECT cohort_id, to_timestamp(floor(epoch(ts))::BIGINT // {bucket} * {bucket}) AS bucket, served_model, count(*)
    FROM events WHERE served_model IS NOT NULL GROUP BY ALL;
"""

_V3 = """
-- Provider outcomes have no event of their own: their keys (response id and position)
-- make a re-posted response count its outcomes once.
CREATE TABLE outcome_keys (key VARCHAR PRIMARY KEY, received_at TIMESTAMPTZ NOT NULL);
"""

_V4 = """
-- Number histograms: value is a bin's representative (rollup.number_bin), n its count.
-- Events stored before this version have none: re-reading the whole history here could
-- take as long as its import, so a window reaching back before the upgrade shows the
-- numbers of the newer events only. (Events after the rollup watermark are re-rolled at
-- open as always, numbers included.)
CREATE TABLE number_rollups (
    cohort_id INTEGER NOT NULL, bucket TIMESTAMPTZ NOT NULL, path VARCHAR NOT NULL, value DOUBLE NOT NULL,
    n BIGINT NOT NULL);
"""

_COHORT_EVENTS = """CREATE VIEW cohort_events AS
    SELECT * FROM events
    UNION ALL
    SELECT e.* REPLACE (s.cohort_id AS cohort_id)
    FROM events e JOIN cohorts r ON r.cohort_id = e.cohort_id
    JOIN cohorts s ON s.model = e.served_model AND s.prompt_version = r.prompt_version AND s.contract = r.contract
    WHERE e.served_model <> r.model;
"""

_V5 = (
    """
-- Served cohorts: an output answered by another model than the one requested (an alias
-- served by a dated snapshot) counts in its cohort and in the cohort of the model that
-- answered (same prompt version and contract), so each served model is analysed on its
-- own too (rollup.py). This view is the raw side of that rule: the events of every cohort,
-- an alias's events listed once more under their served cohort. Rollups of events stored
-- before this version are left as they were: re-reading the whole history here could take
-- as long as its import, so served cohorts start with the upgrade.
"""
    + _COHORT_EVENTS
)

_V6 = """
-- Contracts (contracts.py): one row per registered (contract, version); rows are only ever
-- inserted. document: the canonical JSON of the document as registered; content_hash its
-- SHA-256. tools: a JSON array of {name, description, format, strict, schema}, one per schema.
CREATE TABLE contract_versions (
    contract VARCHAR NOT NULL, version VARCHAR NOT NULL,
    document VARCHAR NOT NULL, content_hash VARCHAR NOT NULL, catalog BOOLEAN NOT NULL, tools VARCHAR NOT NULL,
    invocation_hash VARCHAR NOT NULL, discovery_hash VARCHAR NOT NULL,
    registered_at TIMESTAMPTZ NOT NULL, author VARCHAR, note VARCHAR,
    PRIMARY KEY (contract, version));
-- What checking outputs against their contract version found (rollup.ContractStatus), and
-- where they broke it (path NULL: the output itself). Outputs stored before this version
-- were never checked: they count as untagged or unregistered, from their tags.
CREATE TABLE contract_rollups (
    cohort_id INTEGER NOT NULL, bucket TIMESTAMPTZ NOT NULL, contract_version VARCHAR NOT NULL,
    status VARCHAR NOT NULL, n BIGINT NOT NULL);
CREATE TABLE violation_rollups (
    cohort_id INTEGER NOT NULL, bucket TIMESTAMPTZ NOT NULL, contract_version VARCHAR NOT NULL, path VARCHAR,
    keyword VARCHAR NOT NULL, n BIGINT NOT NULL);
INSERT INTO contract_rollups
    SELECT cohort_id, to_timestamp(floor(epoch(ts))::BIGINT // {bucket} * {bucket}) AS bucket,
           coalesce(contract_version, ''), CASE WHEN contract_version IS NULL THEN 'untagged' ELSE 'unregistered' END,
           count(*)
    FROM cohort_events GROUP BY ALL;
"""

_V7 = (
    """
-- The idempotency keys leave the raw events for a table of their own, pruned after
-- dedup_ttl_days (Store.purge). DuckDB keeps a key index in memory and rewrites all of it at
-- every checkpoint (duckdb/duckdb#24848): on events it covered raw_retention_days of events
-- (30 by default), now the keys of the dedup window (7). A key is md5_number(event_id), as before;
-- payload_hash tells a retry from another payload under the same key.
CREATE TABLE event_keys (
    id_key UHUGEINT PRIMARY KEY, payload_hash VARCHAR NOT NULL, received_at TIMESTAMPTZ NOT NULL);
INSERT INTO event_keys SELECT id_key, payload_hash, received_at FROM events;
-- DuckDB cannot drop a primary key: events is rebuilt without one, its rows in their order.
DROP VIEW cohort_events;
CREATE TABLE events_unkeyed (
    id_key UHUGEINT NOT NULL, event_id VARCHAR NOT NULL, payload_hash VARCHAR NOT NULL,
    generated_id BOOLEAN NOT NULL, cohort_id INTEGER NOT NULL, ts TIMESTAMPTZ NOT NULL,
    received_at TIMESTAMPTZ NOT NULL, served_model VARCHAR, contract_version VARCHAR, source VARCHAR,
    run_id VARCHAR, agent_release VARCHAR, finish_reason VARCHAR, attributes VARCHAR, output VARCHAR NOT NULL);
INSERT INTO events_unkeyed SELECT * FROM events;
DROP TABLE events;
ALTER TABLE events_unkeyed RENAME TO events;
"""
    + _COHORT_EVENTS
)  # the view again, as _V5 made it

# Version 9: rollup tiers (collector/tiers.py). Per cohort, the tier boundaries its rollups were
# last folded to (buckets before minute_from are hours, before hour_from days) and its newest
# data then; a cohort without a row was never folded.
_V9 = """
CREATE TABLE tier_marks (
    cohort_id INTEGER NOT NULL, newest TIMESTAMPTZ NOT NULL, minute_from TIMESTAMPTZ NOT NULL,
    hour_from TIMESTAMPTZ NOT NULL);
"""

# Version 10: the source (production, probe, shadow) is part of the cohort, so probe and shadow
# traffic never pools with production. Every existing cohort is production's: its events were
# pooled before, whatever their source, and re-splitting stored rollups by source is not
# possible (they hold no source). DuckDB cannot change a UNIQUE constraint: cohorts is rebuilt,
# ids kept. The served-cohort view matches the source too.
_V10 = """
DROP VIEW cohort_events;
CREATE TABLE cohorts_sourced (
    cohort_id INTEGER PRIMARY KEY, model VARCHAR NOT NULL, prompt_version VARCHAR NOT NULL,
    contract VARCHAR NOT NULL, first_seen TIMESTAMPTZ NOT NULL, source VARCHAR NOT NULL DEFAULT 'production',
    UNIQUE (model, prompt_version, contract, source));
INSERT INTO cohorts_sourced SELECT cohort_id, model, prompt_version, contract, first_seen, 'production' FROM cohorts;
DROP TABLE cohorts;
ALTER TABLE cohorts_sourced RENAME TO cohorts;
CREATE VIEW cohort_events AS
    SELECT * FROM events
    UNION ALL
    SELECT e.* REPLACE (s.cohort_id AS cohort_id)
    FROM events e JOIN cohorts r ON r.cohort_id = e.cohort_id
    JOIN cohorts s ON s.model = e.served_model AND s.prompt_version = r.prompt_version AND s.contract = r.contract
                  AND s.source = r.source
    WHERE e.served_model <> r.model;
"""

# Version 11: true booleans counted apart (field_rollups.n_true), for the true-share assertions.
# Rows counted before are NULL there: how many of their booleans were true is not known.
_V11 = """
ALTER TABLE field_rollups ADD COLUMN n_true BIGINT;
"""

# Version 12: each text column of the raw events that never repeats gets the compression
# DuckDB would end up with, named, or a better one. In a bulk import DuckDB spent about a third of
# its time storing events in choosing and applying a compression for the outputs' text (a
# dictionary tried on text that never repeats, then FSST); zstd, named for the column, takes
# two thirds of that time and the column is 2.5x smaller (bench/README.md, measured on 1M
# events: 3.4 -> 2.2 s of CPU, 277 -> 110 MiB). A selective read decompresses a block of
# outputs instead of one (20 sampled outputs of 1M: 0.1 -> 0.2 s). Event ids and payload hashes
# (hex) end up in FSST anyway: naming it spares the dictionary tried first (0.15-0.4 s per 1M).
_ZSTD_SINCE = (1, 2)  # the first storage format with zstd for text


@functools.cache
def _compression_clause() -> bool:
    """Whether this DuckDB takes ``USING COMPRESSION`` on a column. DuckDB's own tests use the
    clause and its catalog stores the choice, but its documentation does not describe it: should a
    later DuckDB refuse it, a new file keeps the compressions DuckDB chooses instead of failing."""
    con = duckdb.connect()
    try:
        con.execute("CREATE TABLE t (x VARCHAR USING COMPRESSION zstd, y VARCHAR USING COMPRESSION fsst)")
    except duckdb.Error:
        return False
    finally:
        con.close()
    return True


def _v12_compression_named(con: duckdb.DuckDBPyConnection) -> None:
    """Version 12: ``events.output`` is stored with zstd, event ids and payload hashes (in
    ``events`` and ``event_keys``) with FSST, in a file whose storage format has zstd (DuckDB's
    v1.2 and later: every file this store creates). A file of an older format cannot hold zstd
    (DuckDB would store the column uncompressed): it keeps the compressions DuckDB chooses.
    Both tables are rebuilt, their rows in their order, and the view over events made again
    as it was."""
    row = con.execute(
        "SELECT tags['storage_version'] FROM duckdb_databases() WHERE database_name = current_database()"
    ).fetchone()
    found = re.match(r"v(\d+)\.(\d+)\.", str(row[0]) if row else "")  # "v1.2.0+"
    if found is None or (int(found[1]), int(found[2])) < _ZSTD_SINCE or not _compression_clause():
        return
    view = con.execute("SELECT sql FROM duckdb_views() WHERE view_name = 'cohort_events' AND NOT internal").fetchone()
    if view is None:
        raise RuntimeError("schema version 11 has a cohort_events view; this file has none")
    con.execute(
        """DROP VIEW cohort_events;
CREATE TABLE events_named (
    id_key UHUGEINT NOT NULL, event_id VARCHAR NOT NULL USING COMPRESSION fsst,
    payload_hash VARCHAR NOT NULL USING COMPRESSION fsst,
    generated_id BOOLEAN NOT NULL, cohort_id INTEGER NOT NULL, ts TIMESTAMPTZ NOT NULL,
    received_at TIMESTAMPTZ NOT NULL, served_model VARCHAR, contract_version VARCHAR, source VARCHAR,
    run_id VARCHAR, agent_release VARCHAR, finish_reason VARCHAR, attributes VARCHAR,
    output VARCHAR NOT NULL USING COMPRESSION zstd);
INSERT INTO events_named SELECT * FROM events;
DROP TABLE events;
ALTER TABLE events_named RENAME TO events;
CREATE TABLE event_keys_named (
    id_key UHUGEINT PRIMARY KEY, payload_hash VARCHAR NOT NULL USING COMPRESSION fsst,
    received_at TIMESTAMPTZ NOT NULL);
INSERT INTO event_keys_named SELECT * FROM event_keys;
DROP TABLE event_keys;
ALTER TABLE event_keys_named RENAME TO event_keys;"""
    )
    con.execute(view[0])


_REHASH_ROWS = 50_000  # events read and updated at a time by _v8_rehash_payloads


def _v8_rehash_payloads(con: duckdb.DuckDBPyConnection) -> None:
    """Version 8: the payload identity becomes key-order independent (``envelope.payload_hash``:
    the output with the keys of every object in order, ``ts`` as the instant it names), so a
    retry that a client or proxy re-serialized is a duplicate, not a conflict. Every stored
    event's hash, and its key's, is computed again from the stored output (kept as sent) and tags.

    Before, the hash covered ``ts`` as written, which is not stored: the stored time is. Whether
    ``ts`` was given at all is read from the old hash itself: only an event sent without one
    has the old hash of its fields with ``ts`` null. Events are read in chunks on a cursor of
    their own and updated in this transaction: memory stays bounded, and a crash leaves the
    file at version 7, to be migrated again.
    """
    reader = con.cursor()
    try:
        rows = reader.execute(
            """SELECT e.rowid, e.payload_hash, e.output, c.model, c.prompt_version, c.contract, epoch_us(e.ts),
                      e.source, e.attributes, e.served_model, e.contract_version, e.run_id, e.agent_release,
                      e.finish_reason
               FROM events e JOIN cohorts c USING (cohort_id)"""
        ).to_arrow_reader(_REHASH_ROWS)
        for chunk in rows:
            rowids, hashes = [], []
            for rowid, old, output, model, prompt_version, contract, ts_us, source, attributes, *tags in zip(
                *(chunk.column(i).to_pylist() for i in range(chunk.num_columns)), strict=True
            ):
                tail = orjson.dumps([model, prompt_version, contract, None, source, attributes, *tags])
                ts_given = hashlib.blake2b(output.encode() + tail, digest_size=16).hexdigest() != old
                sorted_output = orjson.dumps(orjson.loads(output), option=orjson.OPT_SORT_KEYS)
                rowids.append(rowid)
                hashes.append(
                    _payload_hash(
                        sorted_output,
                        model,
                        prompt_version,
                        contract,
                        ts_us if ts_given else None,
                        source,
                        attributes,
                        tuple(tags),
                    )
                )
            con.register("_rehashed", pa.table({"rid": pa.array(rowids, pa.int64()), "h": hashes}))
            con.execute("UPDATE events SET payload_hash = r.h FROM _rehashed r WHERE events.rowid = r.rid")
            con.unregister("_rehashed")
    finally:
        reader.close()
    # A key was inserted with its event, at the same received_at (an id whose key expired may
    # have an older event too); a key whose event was purged keeps its hash.
    con.execute("""UPDATE event_keys SET payload_hash = e.payload_hash FROM events e
                   WHERE e.id_key = event_keys.id_key AND e.received_at = event_keys.received_at""")


# Each entry turns version i into version i + 1; never edit a released one, append. An entry
# is SQL, or a function run in the step's transaction when SQL cannot say it.
# "{bucket}" stands for the store's bucket width in seconds. Buckets are always on the
# Unix-epoch grid (epoch - epoch % width), the same grid the rollups use.
MIGRATIONS: list[str | Callable[[duckdb.DuckDBPyConnection], None]] = [
    _V1,
    _V2,
    _V3,
    _V4,
    _V5,
    _V6,
    _V7,
    _v8_rehash_payloads,
    _V9,
    _V10,
    _V11,
    _v12_compression_named,
]
SCHEMA_VERSION = len(MIGRATIONS)


@dataclass(frozen=True)
class Schema:
    """Tables a higher package keeps in the store's file, with its own migrations.

    The store applies them with the same mechanism as its own (one transaction
    per step, ``meta['schema_version.<name>']``, a newer version refused), so the
    file has one owner of its schema while each package owns its tables.

    >>> BASELINES = Schema("baselines", ("CREATE TABLE baselines (...)",))   # doctest: +SKIP
    >>> Store.open(path, schemas=[BASELINES])                                # doctest: +SKIP
    """

    name: str
    migrations: tuple[str, ...]

    @property
    def version(self) -> int:
        return len(self.migrations)


_CREATED = re.compile(r"\bCREATE\s+(?:OR\s+REPLACE\s+)?(?:TABLE|VIEW)\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)", re.I)
_DROPPED = re.compile(r"\bDROP\s+(?:TABLE|VIEW)\s+(?:IF\s+EXISTS\s+)?(\w+)", re.I)
_RENAMED = re.compile(r"\bALTER\s+TABLE\s+(\w+)\s+RENAME\s+TO\s+(\w+)", re.I)


def tables_of(migrations: Sequence[object]) -> set[str]:
    """The tables and views that a list of migrations leaves, read from their DDL in order.

    The layering test reads them, so a table added by a new migration is covered without a
    list to keep in step. Steps that are functions create no table.
    """
    names: set[str] = set()
    for step in migrations:
        if not isinstance(step, str):
            continue
        for match in re.finditer(f"{_CREATED.pattern}|{_DROPPED.pattern}|{_RENAMED.pattern}", step, re.I):
            created, dropped, old, new = match.groups()
            if created:
                names.add(created.lower())
            elif dropped:
                names.discard(dropped.lower())
            else:
                names.discard(old.lower())
                names.add(new.lower())
    return names
