"""A batch of envelopes prepared for one write transaction, and what writing it did.

Everything here needs no database: a batch is prepared on any thread (bulk import's reading
thread, the service's request threads) while the previous one is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from itertools import repeat
from typing import Any, NamedTuple

import pyarrow as pa

from ..accel import speedups
from ..envelope import Envelope
from ..rollup import RollupBatch
from ..rules import PRODUCTION

__all__ = ["BatchBuilder", "PreparedBatch", "Purged", "WriteResult", "WriteStatus"]


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


@dataclass(frozen=True)
class PreparedBatch:
    """A batch ready for one transaction: see ``Store.prepare_batch``."""

    event_ids: list[str]  # of every envelope as given, in order
    hashes: list[str]  # their payload hashes
    early: list[WriteResult | None]  # results known without the database (repeats inside the batch)
    # cohort (model, prompt version, contract, source; in cohort_key order) -> first ts seen
    cohorts: dict[tuple[str, str, str, str], datetime]
    # The cohorts of the models that answered an alias (rollup.py's served cohorts), created
    # with the events: a merge then never inserts a cohort, so merges can run beside commits.
    served_cohorts: dict[tuple[str, str, str, str], datetime]
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
        self._cohorts: dict[tuple[str, str, str, str], datetime] = {}
        self._served: dict[tuple[str, str, str, str], datetime] = {}
        self._order: dict[tuple[str, str, str, str], int] = {}
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
        # the columns of the envelopes (in Envelope's field order), taken once
        columns = tuple(zip(*envs, strict=True))
        event_ids: Sequence[str] = columns[_F["event_id"]]
        hashes: Sequence[str] = columns[_F["payload_hash"]]
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
            columns = tuple(zip(*unique, strict=True))
        self._event_ids.extend(event_ids)
        self._hashes.extend(hashes)
        self._early.extend(early)
        if not unique:
            return
        (_, _, tss, models, prompt_versions, contracts, texts, _, served_models, versions, sources, *_, outputs) = (
            columns
        )
        # An envelope sent without a source is production's (the events table keeps it as sent).
        if None in sources:
            sources = tuple(PRODUCTION if s is None else s for s in sources)
        cohorts = list(zip(models, prompt_versions, contracts, sources, strict=True))
        order = self._order
        keys: list[int | None] | list[int] = list(map(order.get, cohorts))
        if None in keys:  # a cohort new to the batch
            firsts = dict(zip(reversed(cohorts), reversed(tss), strict=True))  # each cohort's first ts
            for cohort in dict.fromkeys(cohorts):
                if cohort not in order:
                    order[cohort] = len(order)
                    self._cohorts[cohort] = firsts[cohort]
            keys = list(map(order.__getitem__, cohorts))
        self._keys.extend(keys)  # type: ignore[arg-type]  # no None left: every cohort is in order
        # Most envelopes name the model that answered as the one asked (or none): no alias to look
        # for; else distinct (served, requested) pairs first
        if served_models != models and any(
            s is not None and s != m for s, m in set(zip(served_models, models, strict=True))
        ):
            for served, cohort, ts in zip(served_models, cohorts, tss, strict=True):
                if served is not None and served != cohort[0]:
                    self._served.setdefault((served, cohort[1], cohort[2], cohort[3]), ts)
        # An envelope read by the C scanner has no parsed output: its text is counted as it is.
        read_by_c = outputs.count(None) == len(outputs)
        self._rollups.add_many(
            texts
            if read_by_c
            else [text if output is None else output for text, output in zip(texts, outputs, strict=True)],
            cohorts,
            tss,
            served_models,
            versions,
        )
        if read_by_c:  # no parsed output to let go
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
        # built by tuple.__new__ in C, not by the named tuple's own __new__, a Python function:
        # 3.2 ms a 30,720-event batch instead of 6.7 (measured), held GIL that bulk import's
        # reading thread waits for
        pairs = zip(batch.event_ids, repeat(WriteStatus.accepted))
        return list(map(tuple.__new__, repeat(WriteResult), pairs))
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
