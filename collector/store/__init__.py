"""The store: schema, versioned migrations, every write, the rollup merge, maintenance, and the
reads the rest of shapewatch needs. No module outside this package runs SQL on its tables
(``tests/test_layers.py`` checks it).

One process owns a database file for writing (DuckDB allows one read-write process per file);
inside it, one thread writes events (see ``writer.py``) and every write takes the store's lock.
A new file is created at the current schema version, an older one is migrated step by step
inside a transaction, a newer one is refused with the version needed.

Raw events are the truth (``events``); their idempotency keys (``event_keys``,
``md5_number(event_id)``) are kept for ``dedup_ttl_days``, the raw events for
``raw_retention_days``; rollups are derived from them, either in the same transaction or
deferred and merged for many batches at once, with ``meta.rollups_through`` saying how far
they go (see ``defer_rollups``).

Modules, by concern:

- ``schema.py``: the DDL as migrations, ``Schema`` for higher packages' tables in the same file
- ``connection.py``: the write-ahead log of a crash, the file lock, memory, DuckDB's errors
- ``core.py``: migrating, transactions, contract checks of counted outputs
- ``batch.py``: batches prepared without the database, and write results
- ``writes.py``, ``outcomes.py``: idempotent batch writes, provider outcomes
- ``deferred.py``, ``merge.py``: merging counts into the rollup tables, now or later
- ``maintenance.py``: compaction, checkpoints, purges
- ``registry.py``: registered contract versions
- ``reads.py``: the read API (cohorts, window rollups, series, samples)
- ``alerts.py``, ``baselines.py``, ``outbox.py``: the tables of the packages above the collector
  (alerts and analyzer runs, baselines, the notification outbox), their DDL and their SQL
- ``backend.py``: ``StoreBackend``, the boundary; ``store.py``: ``Store``, the DuckDB backend

What a backend must provide (``StoreBackend``; a second one, such as DuckLake on PostgreSQL,
implements the same and nothing above the store changes):

- Transactions: ``transaction(doing)`` commits when its block ends and rolls back on any
  exception, holding the one write lock; errors become ``StoreError`` (``StoreUnavailable``
  when the disk or memory is the cause, ``StoreInvalidated`` when the backend cannot go on).
- Idempotent batch writes: ``write_batch(es)`` stores the events whose id was not seen before
  and answers one ``WriteResult`` per envelope, in order, once committed. The conflict rule:
  an id seen before (kept for the dedup TTL, or earlier in the batch) with the same payload
  identity (``envelope.payload_hash``) is a duplicate, with another one a conflict; nothing is
  stored for either. ``record_outcomes`` counts a keyed provider outcome once.
- The rollup merge: counts of stored events (``rollup.RollupBatch``) added into the rollup
  tables with their events or deferred (``defer_rollups``), never lost by a crash (events after
  the watermark are counted again at open), summing exactly what a single merge would.
- Maintenance: ``compact`` keeps sums and shrinks rows, ``purge`` removes raw events and keys
  past retention in short steps, ``checkpoint`` makes the log durable in the file.
- Reads (``reads.py``) returning plain values, and contract versions (``registry.py``).
- The records of the packages above (alerts, baselines, the notification outbox), as rows;
  their tables are registered as ``Schema`` (``ALERTS_SCHEMA``, ...) and migrated with the
  store's own. Writes that must commit together (an evaluation's alerts, history, notifications
  and run record) take ``con``, the handle ``transaction`` yields.

``Store.query`` (SQL on this thread's connection) is not part of the boundary: tests and the
benchmarks read tables with it; no module of shapewatch outside this package runs SQL (the
layering test checks).

>>> store = Store.open(Path("var/demo.duckdb"))          # doctest: +SKIP
>>> results = store.write_batch([envelope])               # doctest: +SKIP
>>> results[0].status                                     # doctest: +SKIP
<WriteStatus.accepted: 'accepted'>
"""

from __future__ import annotations

from ..contracts import ContractRow
from .alerts import ALERT_COLUMNS, ALERTS_SCHEMA, AnalyzerRun
from .backend import StoreBackend
from .baselines import BASELINES_SCHEMA
from .batch import BatchBuilder, PreparedBatch, Purged, WriteResult, WriteStatus
from .outbox import NOTIFY_SCHEMA
from .probes import PROBES_SCHEMA, ProbeCaseRow, ProbeRunRow
from .reads import CohortRow, StoredEvent, WindowRollups
from .runs import RUNS_SCHEMA, CaseRow, RunRollupRow, RunRow, RunStepRow
from .schema import MIGRATIONS, SCHEMA_VERSION, Schema, tables_of
from .store import Store

__all__ = [
    "ALERTS_SCHEMA",
    "ALERT_COLUMNS",
    "BASELINES_SCHEMA",
    "MIGRATIONS",
    "NOTIFY_SCHEMA",
    "PROBES_SCHEMA",
    "RUNS_SCHEMA",
    "SCHEMA_VERSION",
    "AnalyzerRun",
    "BatchBuilder",
    "CaseRow",
    "CohortRow",
    "ContractRow",
    "PreparedBatch",
    "ProbeCaseRow",
    "ProbeRunRow",
    "Purged",
    "RunRollupRow",
    "RunRow",
    "RunStepRow",
    "Schema",
    "Store",
    "StoreBackend",
    "StoredEvent",
    "WindowRollups",
    "WriteResult",
    "WriteStatus",
    "tables_of",
]
