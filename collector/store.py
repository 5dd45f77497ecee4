"""The DuckDB store: schema, versioned migrations, and every write.

One process owns a database file for writing (DuckDB allows one read-write
process per file); inside it, one thread writes events (see ``writer.py``)
and every write takes the store's lock. A new file is created at the current
schema version, an older one is migrated step by step inside a transaction,
a newer one is refused with the version needed.

Raw events are the truth (``events``); their idempotency keys (``event_keys``,
``md5_number(event_id)``) are kept for ``dedup_ttl_days``, the raw events for
``raw_retention_days``;
rollups are derived from them, either in the same transaction or deferred
and merged for many batches at once, with ``meta.rollups_through`` saying how
far they go (see ``defer_rollups``).

>>> store = Store.open(Path("var/demo.duckdb"))          # doctest: +SKIP
>>> results = store.write_batch([envelope])               # doctest: +SKIP
>>> results[0].status                                     # doctest: +SKIP
<WriteStatus.accepted: 'accepted'>
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import duckdb
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from .accel import speedups
from .envelope import Envelope
from .envelope import payload_hash as _payload_hash
from .errors import StoreError, StoreInvalidated, StoreLocked, StoreUnavailable, StoreVersionTooNew
from .rollup import ContractStatus, RollupBatch, RollupConfig, compact_rollups, merge_rollups
from .settings import size_bytes

if TYPE_CHECKING:
    from .contracts import ValidatorCache

__all__ = [
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "BatchBuilder",
    "PreparedBatch",
    "Purged",
    "Schema",
    "Store",
    "WriteResult",
    "WriteStatus",
]

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


class WriteStatus(str, Enum):
    accepted = "accepted"
    duplicate = "duplicate"
    conflict = "conflict"  # the key was seen with a different payload


class Purged(NamedTuple):
    """What ``Store.purge`` deleted."""

    events: int  # raw events, past raw_retention_days
    keys: int  # idempotency keys of events, past dedup_ttl_days


class WriteResult(NamedTuple):
    """What storing one envelope did. A named tuple: one is built per event, and a frozen
    dataclass takes 1.6x as long to build (440 ns against 270, measured)."""

    event_id: str
    status: WriteStatus


_COLUMNS = [
    "event_id",
    "payload_hash",
    "generated_id",
    "model",
    "prompt_version",
    "contract",
    "ts",
    "served_model",
    "contract_version",
    "source",
    "run_id",
    "agent_release",
    "finish_reason",
    "attributes",
    "output",
]


@dataclass(frozen=True)
class PreparedBatch:
    """A batch ready for one transaction: see ``Store.prepare_batch``."""

    event_ids: list[str]  # of every envelope as given, in order
    hashes: list[str]  # their payload hashes
    early: list[WriteResult | None]  # results known without the database (repeats inside the batch)
    cohorts: dict[tuple[str, str, str], datetime]  # cohort (in cohort_key order) -> first ts seen
    # The cohorts of the models that answered an alias (rollup.py's served cohorts), created
    # with the events: a merge then never inserts a cohort, so merges can run beside commits.
    served_cohorts: dict[tuple[str, str, str], datetime]
    table: pa.Table  # the unique events as columns, with cohort_key; no parsed outputs are kept
    rollups: RollupBatch  # the counts of all unique events

    @property
    def unique(self) -> int:
        return int(self.table.num_rows)


class BatchBuilder:
    """Prepares a batch one envelope at a time: everything about it that needs no database.

    Each output is counted as it is added and not kept (only its JSON text is), so a
    caller streaming envelopes (bulk import) lets every parsed output go at once instead
    of holding a whole batch of them: the 1M-line bench import peaked 80-100 MB lower
    (1,287-1,310 MiB against 1,372-1,413), in the same time or less; with contracts
    registered it took about 10% longer (bench/README.md, measured).

    >>> builder = store.batch_builder()                      # doctest: +SKIP
    >>> builder.add(envelope); batch = builder.finish()      # doctest: +SKIP
    """

    def __init__(self, rollups: RollupBatch) -> None:
        self._rollups: RollupBatch | None = rollups
        self._first: dict[str, str] = {}  # event_id -> payload hash of its first occurrence here
        self._event_ids: list[str] = []
        self._hashes: list[str] = []
        self._early: list[WriteResult | None] = []
        self._unique: list[tuple[Any, ...]] = []  # each unique envelope's fields but its output
        self._cohorts: dict[tuple[str, str, str], datetime] = {}
        self._served: dict[tuple[str, str, str], datetime] = {}
        self._order: dict[tuple[str, str, str], int] = {}
        self._keys: list[int] = []

    def __len__(self) -> int:
        """Envelopes added, repeats included."""
        return len(self._event_ids)

    def add(self, env: Envelope) -> None:
        """Add one envelope; a repeat of an id added before is answered without the database."""
        self.add_many((env,))

    def add_many(self, envs: Sequence[Envelope]) -> None:
        """Add envelopes in order, as ``add`` does each: a sequence at a time (the builtins loop
        in C), not an envelope at a time (bench/README.md)."""
        if self._rollups is None:
            raise RuntimeError("BatchBuilder.add after finish()")
        if not envs:
            return
        event_ids: Sequence[str] = [env.event_id for env in envs]
        hashes: Sequence[str] = [env.payload_hash for env in envs]
        first = self._first
        fresh = dict(zip(event_ids, hashes, strict=True))
        if len(fresh) == len(envs) and first.keys().isdisjoint(fresh):  # the usual case: no repeat
            first.update(fresh)
            early: list[WriteResult | None] = [None] * len(envs)
            unique = envs
        else:
            early, kept = [], []
            for env in envs:
                seen = first.get(env.event_id)
                if seen is None:
                    first[env.event_id] = env.payload_hash
                    early.append(None)
                    kept.append(env)
                else:
                    early.append(
                        WriteResult(
                            env.event_id, WriteStatus.duplicate if seen == env.payload_hash else WriteStatus.conflict
                        )
                    )
            unique = kept
        self._event_ids.extend(event_ids)
        self._hashes.extend(hashes)
        self._early.extend(early)
        if not unique:
            return
        # the columns of the new envelopes (in Envelope's field order)
        (_, _, tss, models, prompt_versions, contracts, texts, _, served_models, versions, *_, outputs) = zip(
            *unique, strict=True
        )
        cohorts = list(zip(models, prompt_versions, contracts, strict=True))
        order = self._order
        if not order.keys() >= set(cohorts):
            firsts = dict(zip(reversed(cohorts), reversed(tss), strict=True))  # each cohort's first ts
            for cohort in dict.fromkeys(cohorts):
                if cohort not in order:
                    order[cohort] = len(order)
                    self._cohorts[cohort] = firsts[cohort]
        self._keys.extend(map(order.__getitem__, cohorts))
        # distinct (served, requested) pairs first: most batches have no alias answered by another model
        if any(s is not None and s != m for s, m in set(zip(served_models, models, strict=True))):
            for served, cohort, ts in zip(served_models, cohorts, tss, strict=True):
                if served is not None and served != cohort[0]:
                    self._served.setdefault((served, cohort[1], cohort[2]), ts)
        # An envelope read by the C scanner has no parsed output: its text is counted as it is.
        self._rollups.add_many(
            [text if output is None else output for text, output in zip(texts, outputs, strict=True)],
            cohorts,
            tss,
            served_models,
            versions,
        )
        if outputs.count(None) == len(outputs):  # read by the C scanner: no parsed output to let go
            self._unique.extend(unique)
        else:
            self._unique.extend(env[:_KEPT] for env in unique)

    def finish(self) -> PreparedBatch:
        """The prepared batch; nothing can be added after."""
        rollups = self._rollups
        if rollups is None:
            raise RuntimeError("BatchBuilder.finish called twice")
        self._rollups = None
        rollups.tables()  # Python work: done here, on the preparing thread
        return PreparedBatch(
            self._event_ids,
            self._hashes,
            self._early,
            self._cohorts,
            self._served,
            _arrow(self._unique, self._keys),
            rollups,
        )


def _results(batch: PreparedBatch, inserted: set[str], existing: dict[str, str]) -> list[WriteResult]:
    """One result per envelope of a written batch, in order."""
    if len(inserted) == len(batch.event_ids):  # every envelope new: the usual case
        accepted = WriteStatus.accepted
        return [WriteResult(event_id, accepted) for event_id in batch.event_ids]
    # A repeat is judged against what the key holds now: the payload stored before, or the
    # one this batch stored. (Against the batch's first occurrence alone, a repeat of the
    # stored payload behind a conflicting line would be called a conflict.)
    held = dict(existing)
    held.update(
        (event_id, payload_hash)
        for event_id, payload_hash, res in zip(batch.event_ids, batch.hashes, batch.early, strict=True)
        if res is None and event_id in inserted
    )
    out: list[WriteResult] = []
    for event_id, payload_hash, res in zip(batch.event_ids, batch.hashes, batch.early, strict=True):
        if res is None and event_id in inserted:
            out.append(WriteResult(event_id, WriteStatus.accepted))
        else:
            same = held.get(event_id) == payload_hash
            out.append(WriteResult(event_id, WriteStatus.duplicate if same else WriteStatus.conflict))
    return out


# An envelope's fields up to its parsed output, which is never stored: what a batch keeps of
# each event (a slice of the NamedTuple, a plain tuple, costs a third of ``_replace``).
_KEPT = Envelope._fields.index("output")
_F = {name: i for i, name in enumerate(Envelope._fields)}


def _arrow(rows: list[tuple[Any, ...]], cohort_keys: Sequence[int]) -> pa.Table:
    """The events as columns; ``rows`` are envelopes' fields (whole, or cut at ``_KEPT``)."""

    def col(i: int) -> pa.Array:
        # Packed by C straight from the envelopes: with a list per column for Arrow to convert,
        # building the whole table took 2.0 us per event, 0.9 this way (measured, 2,000 events).
        validity, offsets, data, nulls = speedups.string_column(rows, i)
        return pa.Array.from_buffers(
            pa.string(),
            len(rows),
            [None if validity is None else pa.py_buffer(validity), pa.py_buffer(offsets), pa.py_buffer(data)],
            null_count=nulls,
        )

    f = _F
    # Timestamps go over as integers: converting datetime objects is the slow part of
    # building the batch, and an int64 -> timestamp cast is free in Arrow.
    ts = pa.Array.from_buffers(pa.int64(), len(rows), [None, pa.py_buffer(speedups.epoch_micros(rows, f["ts"]))])
    igen = f["generated_id"]
    return pa.table(
        {
            "event_id": col(f["event_id"]),
            "payload_hash": col(f["payload_hash"]),
            "generated_id": pa.array([r[igen] for r in rows], pa.bool_()),
            "cohort_key": pa.array(cohort_keys, pa.int32()),
            "ts": ts.cast(pa.timestamp("us", tz="UTC")),
            "served_model": col(f["served_model"]),
            "contract_version": col(f["contract_version"]),
            "source": col(f["source"]),
            "run_id": col(f["run_id"]),
            "agent_release": col(f["agent_release"]),
            "finish_reason": col(f["finish_reason"]),
            "attributes": col(f["attributes_json"]),
            "output": col(f["output_json"]),
        }
    )


_WAL_COPIES_KEPT = 5


def _copy_wal(path: Path) -> Path | None:
    """Copy ``<db>.wal`` (when present and not empty) to ``quarantine/`` beside the database;
    the newest copies are kept, older ones deleted. None when there is none or it cannot be copied."""
    import shutil

    wal = Path(f"{path}.wal")
    try:
        if not wal.is_file() or wal.stat().st_size == 0:
            return None
        where = path.parent / "quarantine"
        where.mkdir(exist_ok=True)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
        copy = where / f"{path.name}.wal.{stamp}.unclean"
        shutil.copyfile(wal, copy)
    except OSError as exc:  # a full disk must not also keep the service from starting
        log.warning(
            "%s: a write-ahead log left by an unclean shutdown could not be copied aside (%s); replaying it", path, exc
        )
        return None
    for old in sorted(where.glob(f"{path.name}.wal.*.unclean"))[:-_WAL_COPIES_KEPT]:
        old.unlink(missing_ok=True)
    return copy


def _is_wal_error(exc: duckdb.Error) -> bool:
    msg = str(exc).lower()
    return "wal" in msg and ("replaying" in msg or "corrupt" in msg)


def _wal_refusal(path: Path, exc: duckdb.Error) -> str:
    wal = f"{path}.wal"
    detail = " ".join(str(exc).split())
    return (
        f"its write-ahead log {wal} is damaged and cannot be replayed, so the database is not opened and "
        f"nothing was changed ({detail}). To start anyway, move it aside (mv {wal} {wal}.damaged): the "
        f"database then opens without the writes the log holds (copies of it are kept in "
        f"{path.parent / 'quarantine'}); or restore the database from a backup"
    )


def _is_lock_error(exc: duckdb.Error) -> bool:
    msg = str(exc).lower()
    return "lock" in msg and ("conflicting" in msg or "could not set lock" in msg)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Rows a purge deletes per transaction, holding the write lock: 20,000 keys took 0.1-0.3 s
# (their index entries go at commit); raw events far less.
_PURGE_CHUNK = 20_000
# After each chunk the purge lets go for this long, so a writer waiting for the lock gets it
# (a thread that releases a lock and takes it again at once usually wins it back).
_PURGE_PAUSE_S = 0.005

# DuckDB keeps the index of the idempotency key (an ART over md5_number(event_id)) in memory,
# and a write that needs more than memory_limit fails: measured about 45 bytes per stored event
# (a 512MB limit refused every insert past about 10.7M keys, even after a restart). So the
# configured limit is working memory, and the store adds room for the index on top of it,
# at open and as events are stored, a step at a time.
_INDEX_BYTES_PER_EVENT = 64
_INDEX_STEP_EVENTS = 100_000


def _epoch_us(t: datetime) -> int:
    """Exact microseconds since the epoch (float timestamp() can be 1 us short)."""
    return (t - _EPOCH) // timedelta(microseconds=1)


def _store_error(doing: str, exc: duckdb.Error) -> StoreError:
    if isinstance(exc, duckdb.FatalException) or "database has been invalidated" in str(exc).lower():
        return StoreInvalidated(doing, exc)
    if "out of memory" in str(exc).lower():
        return StoreUnavailable(
            f"DuckDB ran out of memory while {doing} ({' '.join(str(exc).split())[:300]}); "
            "raise memory_limit (import_memory_limit for shapewatch ingest)"
        )
    return StoreUnavailable(exc) if _is_space_error(exc) else StoreError(doing, exc)


def _is_space_error(exc: BaseException) -> bool:
    msg = str(exc).lower()
    return any(
        s in msg
        for s in ("no space left", "disk full", "out of disk", "could not write", "i/o error", "input/output error")
    )


class _StoredBefore(Exception):
    """A batch's plain INSERT met a key already stored (see ``Store._insert``)."""


# Keys per lookup statement of _look_up.
_PROBE_KEYS = 2000
# An id looked up in an IN list costs about what scanning 300 stored keys does (_stored_hashes).
_KEYS_SCANNED_PER_ID = 300


def _look_up(con: duckdb.DuckDBPyConnection, select: str, mark: str, keys: list[str]) -> list[tuple[Any, ...]]:
    """The rows of ``select`` (ending in ``... IN``) for ``keys``, given as ``mark`` each.

    The keys go in as parameters of an IN list, which DuckDB pushes into its scan of the
    key column: the same cost in 200,000 rows as in 4,000,000 (measured, 500 to 40,000
    keys). A join against a subquery of keys, or ``INSERT ... ON CONFLICT``, reads the
    whole key column instead, and grows with the table (see ``Store._stored_hashes``).
    """
    rows: list[tuple[Any, ...]] = []
    for i in range(0, len(keys), _PROBE_KEYS):
        chunk = keys[i : i + _PROBE_KEYS]
        rows += con.execute(f"{select} ({', '.join([mark] * len(chunk))})", chunk).fetchall()
    return rows


class Store:
    """The DuckDB file: opened once per process, written by one thread at a time.

    >>> with Store.open(tmp_path / "x.duckdb") as store:   # doctest: +SKIP
    ...     store.write_batch(envelopes)
    """

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
        self._cohorts: dict[tuple[str, str, str], int] = {}
        self._pending_cohorts: dict[tuple[str, str, str], int] = {}
        # Deferred rollups (see defer_rollups): counted, committed events not yet merged.
        self._defer: tuple[int, float] | None = None
        # (counts, received_at of their batch, monotonic time they were added), in commit order;
        # guarded by _pending_lock (held briefly: a commit adds, a merge takes a prefix).
        self._pending: list[tuple[RollupBatch, datetime, float]] = []
        self._pending_lock = threading.Lock()
        self._pending_events = 0
        self._pending_first: float | None = None
        self._staged: list[tuple[RollupBatch, datetime]] = []  # counts of the transaction under way
        self.last_merge_error: str | None = None
        self._validators: ValidatorCache | None = None
        # Contract checks done per (cohort, contract version, bucket), for RollupConfig's quota;
        # in memory: a restart checks a little more, never less.
        self._checks_done: dict[tuple[tuple[str, str, str], str, int], int] = {}
        self._checks_lock = threading.Lock()
        #: outputs of registered contract versions counted unchecked since start, by reason
        #: (RollupBatch.unchecked); guarded by _checks_lock
        self.contract_unchecked: Counter[str] = Counter()

    # --- opening --------------------------------------------------------------------------

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
    ) -> Store:
        """Open (creating or migrating) the database at ``path``, with the tables of ``schemas``."""
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
            "enable_external_access": "false",
            "autoinstall_known_extensions": "false",
            "autoload_known_extensions": "false",
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
            store._migrate()
            for schema in schemas:
                store._migrate_schema(schema)
            store._check_bucket_width()
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
        row = self.query("SELECT (SELECT value FROM meta WHERE key = 'schema_version'), (SELECT count(*) FROM events)")[
            0
        ]
        return {"schema_version": int(row[0]), "events": int(row[1])}

    # --- contracts ----------------------------------------------------------------------------

    @property
    def contract_validators(self) -> ValidatorCache:
        """Compiled validators of the registered contract versions (contracts.py), for the rollups."""
        if self._validators is None:
            from .contracts import ValidatorCache  # contracts.py builds on this module

            self._validators = ValidatorCache(self)
        return self._validators

    def _rollup_batch(self) -> RollupBatch:
        # Every batch of counts checks outputs against their contract version: ingest, a
        # partial insert and the recovery at open count the same way.
        return RollupBatch(
            self.rollup,
            bucket_seconds=self.bucket_seconds,
            check=self._check_contract,
            registered=self._contract_registered,
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
        self, cohort: tuple[str, str, str], version: str, bucket: int, output: dict[str, Any] | str
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
            merge_rollups(con, [batch for batch, _, _ in taken], self.rollup)
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
            """SELECT e.output, c.model, c.prompt_version, c.contract, epoch_us(e.ts), e.served_model,
                      e.contract_version, epoch_us(e.received_at)
               FROM events e JOIN cohorts c USING (cohort_id)
               WHERE epoch_us(e.received_at) > ? ORDER BY e.received_at""",
            [int(row[0])],
        ).fetchall()
        if not rows:
            return
        log.warning("rolling up %d events stored after the last rollup merge (after a crash)", len(rows))
        batch = self._rollup_batch()
        outputs, models, prompt_versions, contracts, ts_us, served, versions, _ = zip(*rows, strict=True)
        batch.add_many(
            outputs,
            list(zip(models, prompt_versions, contracts, strict=True)),
            [datetime.fromtimestamp(t / 1_000_000, UTC) for t in ts_us],
            served,
            versions,
        )
        with self._transaction("rolling up events stored after the last merge") as con:
            merge_rollups(con, [batch], self.rollup)
            con.execute("UPDATE meta SET value = ? WHERE key = 'rollups_through'", [str(rows[-1][7])])

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
        last: datetime | None = getattr(self, "_last_batch_time", None)
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
            try:
                self._con.unregister("_batch")
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
        (``_look_up``), and only the rest is inserted. Only this thread writes events (the
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
                merge_rollups(con, [fresh], self.rollup)
                self._set_watermark(con, now)
            else:
                self._staged.append((fresh, now))
        return inserted, existing

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
        self, con: duckdb.DuckDBPyConnection, first_ts: dict[tuple[str, str, str], datetime]
    ) -> dict[tuple[str, str, str], int]:
        """The id of each cohort, creating new ones (set-based) in the current transaction."""
        ids: dict[tuple[str, str, str], int] = {}
        new: list[tuple[str, str, str]] = []
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
                    "first_seen": pa.array([first_ts[k] for k in new], pa.timestamp("us", tz="UTC")),
                }
            ),
        )
        try:
            con.execute(
                """INSERT INTO cohorts
                   SELECT nextval('cohort_seq'), model, prompt_version, contract, first_seen FROM _nc
                   ON CONFLICT DO NOTHING"""
            )
            rows = con.execute(
                """SELECT c.cohort_id, c.model, c.prompt_version, c.contract
                   FROM cohorts c JOIN _nc USING (model, prompt_version, contract)"""
            ).fetchall()
        finally:
            con.unregister("_nc")
        for cid, model, prompt_version, contract in rows:
            cohort = (str(model), str(prompt_version), str(contract))
            ids[cohort] = self._pending_cohorts[cohort] = int(cid)
        return ids

    def record_outcomes(
        self,
        outcomes: Sequence[tuple[str, str, str, datetime, str]],
        *,
        keys: Sequence[str | None] | None = None,
        served: Sequence[str | None] | None = None,
    ) -> list[bool]:
        """Count provider outcomes, (model, prompt_version, contract, ts, kind) each; returns,
        in order, whether each was counted.

        An outcome with a key (``keys``, parallel to ``outcomes``) already recorded is
        not counted again: a re-posted response counts once, and a response posted again
        with more outcomes counts only the new ones (the caller's metrics need to know which).
        An outcome whose response was answered by another model than the one requested
        (``served``, parallel too) also counts in that model's cohort, as its outputs do.
        """
        if not outcomes:
            return []
        keys = list(keys) if keys is not None else [None] * len(outcomes)
        answered = list(served) if served is not None else [None] * len(outcomes)
        if len(keys) != len(outcomes) or len(answered) != len(outcomes):
            raise ValueError("keys and served must be parallel to outcomes")
        step = self.bucket_seconds
        with self._write_lock:
            self._pending_cohorts = {}
            with self._transaction("recording provider outcomes") as con:
                wanted = list(dict.fromkeys(k for k in keys if k is not None))
                new: set[str] = set()
                if wanted:  # looked up, then inserted: see _look_up for why not ON CONFLICT
                    seen = {r[0] for r in _look_up(con, "SELECT key FROM outcome_keys WHERE key IN", "?", wanted)}
                    fresh_keys = [k for k in wanted if k not in seen]
                    if fresh_keys:
                        con.execute("INSERT INTO outcome_keys SELECT unnest($keys), now()", {"keys": fresh_keys})
                    new = set(fresh_keys)
                counts: dict[tuple[tuple[str, str, str], int, str], int] = {}
                first_ts: dict[tuple[str, str, str], datetime] = {}
                counted = [False] * len(outcomes)
                for i, ((model, prompt_version, contract, ts, kind), okey, other) in enumerate(
                    zip(outcomes, keys, answered, strict=True)
                ):
                    if okey is not None:
                        if okey not in new:
                            continue
                        new.discard(okey)  # a key repeated within one call counts once too
                    counted[i] = True
                    epoch = int(ts.timestamp())
                    for m in (model,) if other is None or other == model else (model, other):
                        cohort = (m, prompt_version, contract)
                        first_ts.setdefault(cohort, ts)
                        bucket_key = (cohort, epoch - epoch % step, kind)
                        counts[bucket_key] = counts.get(bucket_key, 0) + 1
                if not counts:
                    return counted
                ids = self._cohort_ids(con, first_ts)
                con.executemany(
                    """INSERT INTO outcomes VALUES (?, to_timestamp(?), ?, ?)
                       ON CONFLICT DO UPDATE SET n = n + excluded.n""",
                    [[ids[c], epoch, kind, n] for (c, epoch, kind), n in counts.items()],
                )
            self._cohorts.update(self._pending_cohorts)
        return counted

    def compact(self, since: datetime | None = None, until: datetime | None = None) -> int:
        """Fold rollup rows (buckets in ``[since, until)``, open ends for None) into one per key.

        Returns the rows removed. One transaction, holding the write lock: callers
        compacting a long history go range by range (``compact_by_day``).
        """
        with self._write_lock, self._merge_lock, self._transaction("compacting rollups") as con:
            return compact_rollups(con, since, until)

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
