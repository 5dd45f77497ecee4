"""Mergeable rollups: per cohort, time bucket and field path, everything as counts.

Each stored batch's outputs are flattened and counted by a small C
accumulator (``_speedups.Acc``) over the dicts the validator already parsed,
then added into the rollup tables by the store (``store/merge.py``), with the raw
events or, when the store defers them, together with the counts of many batches (see
``Store.defer_rollups``). Everything stored is a count, so a window's profile
is a sum of buckets and the merge of two windows is the sum of their rows.
Rows are appended; the store's compaction folds them into one per key.

Why not flatten inside DuckDB: measured here on realistic outputs (25 paths,
arrays of objects), the set-based ``json_type``/``json_extract_string`` pass
alone cost about 15 µs per output (unnesting 25+ rows per document), several
times the whole budget of bulk import; walking the dicts the validator already
holds costs about 4 µs. DuckDB still does all the merging and all the reading.

Tables (created by the store's migrations, ``store/schema.py``):

- ``cohort_buckets(cohort_id, bucket, events)``: the units of the top scope
- ``field_rollups(cohort_id, bucket, path, scope, present, n_null, n_boolean,
  n_integer, n_number, n_string, n_array, n_object, long_strings, n_true, values_overflow)``
- ``value_rollups(cohort_id, bucket, path, value, n)``: short strings, bounded per key
- ``array_rollups(cohort_id, bucket, path, length, n)``: exact length histogram
- ``number_rollups(cohort_id, bucket, path, value, n)``: number histogram, ``value``
  being the representative of a bin (``number_bin``)
- ``served_models(cohort_id, bucket, served_model, n)``: what actually answered
- ``contract_rollups(cohort_id, bucket, contract_version, status, n)``: outputs by the
  contract version they were tagged with and what checking them against it found
  (``ContractStatus``)
- ``violation_rollups(cohort_id, bucket, contract_version, path, keyword, n)``: outputs
  breaking their registered contract at a path (NULL: the output itself), by JSON Schema keyword

Number bins are fixed, not fitted to the data (as in DDSketch): the same number always
lands in the same bin whatever the batch, bucket or window, so histograms add up like
every other count, and a percentile read from them is within 1% of the exact one.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute

from .accel import speedups
from .flatten import items_path, join_key
from .rules import number_bin
from .tiers import Horizons

__all__ = [
    "ROLLUP_TABLES",
    "ContractCheck",
    "ContractStatus",
    "RollupBatch",
    "RollupConfig",
    "number_bin",
]


class ContractStatus(str, Enum):
    """What checking an output against the contract version it was tagged with found."""

    valid = "valid"
    invalid = "invalid"  # breaks the registered schema: its violations are counted per path
    unregistered = "unregistered"  # tagged with a version nobody registered: counted, never refused
    unchecked = "unchecked"  # registered, not checked: beyond the quota or the time budget (RollupConfig)
    untagged = "untagged"  # no contract_version: nothing to check against


# (cohort, contract version, bucket epoch, output parsed or as JSON text) -> status and violations (path, JSON Schema
# keyword): the store's check (store/core.py).
ContractCheck = Callable[
    [tuple[str, str, str, str], str, int, dict[str, Any] | str], tuple[ContractStatus, Sequence[tuple[str | None, str]]]
]


@dataclass(frozen=True)
class RollupConfig:
    enum_value_max_length: int = 64
    enum_values_per_path: int = 200
    # A merge keeps no values of a path that holds more distinct short strings than this for a
    # cohort, each repeated fewer than ten times on average (free text: store/merge.py); 0 keeps all.
    free_text_min_distinct: int = 200
    # Paths whose values are never stored (the redact_paths setting; privacy.RedactPatterns): a
    # merge drops their values and number bins before writing and counts them as overflow.
    redact_paths: tuple[str, ...] = ()
    max_depth: int = 32
    # Outputs checked against their registered contract per cohort, contract version and bucket
    # (0: every output). A check costs about 0.1-1 ms in jsonschema (measured: 0.8 ms for a
    # 25-field schema), more than everything else ingest does per output, so busy traffic is
    # checked on a sample: the share of violations is estimated from it; the rest counts as
    # unchecked.
    contract_checks_per_bucket: int = 500
    # A check runs after its output was acknowledged, on the thread that merges rollups. Patterns
    # run in linear time (schema_check.py), so no check should come near these; they bound what
    # one contract version's outputs can cost that thread whatever they hold: one output's check
    # (beyond it, the output counts as unchecked) and one version's checks per merge (beyond
    # it, the version's remaining outputs of that merge count as unchecked).
    contract_check_ms: float = 50.0
    contract_check_budget_ms: float = 1000.0


_FIELD_COLS = [
    "present",
    "n_null",
    "n_boolean",
    "n_integer",
    "n_number",
    "n_string",
    "n_array",
    "n_object",
    "long_strings",
    "n_true",  # of n_boolean, those true (NULL in rows counted before true counts were kept)
]


def summed(column: str, table: str = "") -> str:
    """SQL summing a rollup column over rows (``table``: a qualifier such as ``t.``). ``n_true`` of
    rows counted before true counts were kept is NULL: a sum over any of them is NULL too, never a
    count that looks whole."""
    c = f"{table}{column}"
    if column == "n_true":
        return f"CASE WHEN count({c}) = count(*) THEN sum({c}) END"
    return f"sum({c})"


class _PathNames(list[tuple[str, str | None]]):
    """Path id -> (path, scope; None: the outputs), grown by the accumulator's callback."""

    def name(self, parent: int, key: str | None) -> int:
        # Called by the accumulator the first time it meets (parent, key) in a batch.
        if parent < 0:
            path, scope = join_key(None, key or ""), None
        else:
            ppath, pscope = self[parent]
            path, scope = (items_path(ppath), ppath) if key is None else (join_key(ppath, key), pscope)
        self.append((path, scope))
        return len(self) - 1


class RollupBatch:
    """Counts of one batch of outputs, ready to be added to the rollup tables.

    >>> batch = RollupBatch(RollupConfig(), bucket_seconds=60)
    >>> batch.add({"a": [1, 2]}, ("m", "p", "c"), ts)            # doctest: +SKIP
    """

    def __init__(
        self,
        cfg: RollupConfig,
        *,
        bucket_seconds: int,
        check: ContractCheck | None = None,
        registered: Callable[[str, str], bool] | None = None,
        clock: Callable[[], float] = time.perf_counter,
        horizons: Horizons | None = None,
    ) -> None:
        self.cfg = cfg
        # Tiers: each output is counted in the bucket its cohort's age calls for (tiers.py);
        # None: every output in its bucket_seconds bucket.
        self._horizons = horizons
        self._coarse: set[int] = set()  # groups counted in an hour or day bucket
        self._clock = clock  # times the contract checks (run_checks)
        self.bucket_seconds = bucket_seconds
        self._check = check
        self._registered = registered
        # Outputs of registered contract versions, checked by ``run_checks`` (group, version,
        # cohort, bucket start, output): never while the batch is prepared, so that no check,
        # however slow, holds up the commit and the answer of the requests in it.
        self._to_check: list[tuple[int, str, tuple[str, str, str, str], int, dict[str, Any] | str]] = []
        #: outputs counted unchecked by run_checks, by reason: slow, budget, other (beyond the
        #: bucket's quota of checks, or a check that raised)
        self.unchecked: Counter[str] = Counter()
        self._contracts: dict[tuple[int, str, ContractStatus], int] = {}  # (group, version, status) -> outputs
        self._violations: dict[tuple[int, str, str | None, str], int] = {}  # (group, version, path, keyword)
        # (contract, version) found unregistered in this batch: not asked again for every output
        # (the check's cache answers the same for its miss_seconds anyway)
        self._unregistered: set[tuple[str, str]] = set()
        self._paths = _PathNames()
        # (model, prompt version, contract, source, served model if it differs from the model, bucket)
        self._groups: dict[tuple[str, str, str, str, str | None, int], int] = {}
        self._events: list[int] = []  # outputs per group: the units of the top scope
        self._served: dict[tuple[int, str], int] = {}  # (group, served model) -> outputs
        # The namer is its own object, not a bound method of this batch: speedups.Acc is not tracked
        # by the garbage collector, so a cycle batch -> speedups.Acc -> batch would never be freed.
        self._acc: speedups.Acc | None = speedups.Acc(self._paths.name, cfg.enum_value_max_length)
        self._built: tuple[pa.Table, pa.Table, pa.Table, pa.Table, pa.Table, pa.Table] | None = None

    def add(
        self,
        output: dict[str, Any] | str,
        cohort: tuple[str, str, str, str],
        ts: datetime,
        served_model: str | None = None,
        contract_version: str | None = None,
    ) -> None:
        """Count one output: parsed, or as JSON text (counted from the text itself, and parsed
        only if a contract check needs it)."""
        self.add_many((output,), (cohort,), (ts,), (served_model,), (contract_version,))

    def add_many(
        self,
        outputs: Sequence[dict[str, Any] | str],
        cohorts: Sequence[tuple[str, str, str, str]],
        tss: Sequence[datetime],
        served_models: Sequence[str | None],
        contract_versions: Sequence[str | None],
    ) -> None:
        """Count outputs, in order, as ``add`` does each (the five sequences are aligned).

        A batch's bookkeeping is done a sequence at a time (the builtins loop in C) rather than
        an output at a time: this Python, not the counting, was most of an event's cost
        (bench/README.md). Only outputs whose contract version is registered are checked one
        by one.
        """
        if self._acc is None:
            raise RuntimeError("RollupBatch.add after tables(): the counts are already built")
        # An output answered by another model than the one requested (an alias) also counts
        # in the cohort of the model that answered: its group, (model, prompt version, contract,
        # source, that model or None, bucket start), carries it, and the merge adds the group's counts
        # to both cohorts (the output is walked once).
        starts = speedups.bucket_starts(tss, self.bucket_seconds)
        if self._horizons is None:
            gids = speedups.group_ids(self._groups, cohorts, served_models, starts)
        else:
            gids = self._tiered_group_ids(cohorts, served_models, starts)
        self._events.extend([0] * (len(self._groups) - len(self._events)))
        self._acc.add_many(outputs, gids)
        # the outputs per group, per model that answered and per contract version, in one count
        # (few distinct triples): three counts over the outputs were 3% of a bulk import's reading
        tallied = Counter(zip(gids, served_models, contract_versions, strict=True))
        events, served = self._events, self._served
        for (g, model, _), n in tallied.items():
            events[g] += n
            if model is not None:
                served[(g, model)] = served.get((g, model), 0) + n
        self._count_contracts(outputs, cohorts, contract_versions, starts, gids, tallied)

    def _tiered_group_ids(
        self, cohorts: Sequence[tuple[str, str, str, str]], served_models: Sequence[str | None], starts: list[int]
    ) -> list[int]:
        """Group ids as ``speedups.group_ids`` gives them, each group's bucket start moved to its tier.

        The outputs are grouped by minute first (in C), then each minute group, far fewer than the
        outputs, is given its tier's bucket: an output is looked at once either way.
        """
        assert self._horizons is not None
        minute: dict[tuple[str, str, str, str, str | None, int], int] = {}
        ids = speedups.group_ids(minute, cohorts, served_models, starts)
        keys = list(minute)  # ids are given in order of first appearance: keys[i] has id i
        groups = self._groups
        remap = []
        for (model, prompt_version, contract, source, served, _), (start, coarse) in zip(
            keys, self._horizons.coarsen(keys), strict=True
        ):
            g = groups.setdefault((model, prompt_version, contract, source, served, start), len(groups))
            remap.append(g)
            if coarse:
                self._coarse.add(g)
        if remap == list(range(len(remap))):
            return ids
        return list(map(remap.__getitem__, ids))

    def _count_contracts(
        self,
        outputs: Sequence[dict[str, Any] | str],
        cohorts: Sequence[tuple[str, str, str, str]],
        versions: Sequence[str | None],
        starts: list[int],
        gids: list[int],
        tallied: Counter[tuple[int, str | None, str | None]],
    ) -> None:
        """The contract status of each output (and the violations of those checked); ``tallied``:
        the outputs per (group, model that answered, contract version)."""
        checked: set[tuple[str, str]] = set()  # registered, or not asked yet: checked one by one
        if self._check is not None:
            checked = {
                (c[2], v) for c, v in set(zip(cohorts, versions, strict=True)) if v is not None
            } - self._unregistered
        tally = self._contracts
        if not checked:
            for (g, _, v), n in tallied.items():
                ck = (g, v or "", ContractStatus.untagged if v is None else ContractStatus.unregistered)
                tally[ck] = tally.get(ck, 0) + n
            return
        registered = self._registered
        for output, cohort, v, start, g in zip(outputs, cohorts, versions, starts, gids, strict=True):
            status: ContractStatus
            if v is None:
                status = ContractStatus.untagged
            elif (cohort[2], v) in self._unregistered:
                status = ContractStatus.unregistered
            elif registered is not None and not registered(cohort[2], v):
                self._unregistered.add((cohort[2], v))
                status = ContractStatus.unregistered
            else:
                self._to_check.append((g, v, cohort, start, output))
                continue
            ck = (g, v or "", status)
            tally[ck] = tally.get(ck, 0) + 1

    @property
    def checks_pending(self) -> int:
        """Outputs waiting for ``run_checks``."""
        return len(self._to_check)

    def run_checks(self, spent: dict[tuple[str, str], float] | None = None) -> None:
        """Check the outputs of registered contract versions added so far, and count what was found.

        Runs where the batch's counts are merged (the store calls it before its merge
        transaction; ``contract_tables`` calls it in any case), after the batch's events were
        committed and answered. Each check is timed: an output whose check took longer than
        ``cfg.contract_check_ms`` is counted ``unchecked`` (reason ``slow``), and once the checks
        of one contract version have taken ``cfg.contract_check_budget_ms`` in this call (or in
        the calls sharing ``spent``: one merge), its remaining outputs are counted ``unchecked``
        (reason ``budget``) without being checked.
        """
        todo, self._to_check = self._to_check, []
        if not todo:
            return
        assert self._check is not None
        spent = {} if spent is None else spent
        per_output = self.cfg.contract_check_ms / 1000
        budget = self.cfg.contract_check_budget_ms / 1000
        tally = self._contracts
        clock = self._clock
        for g, v, cohort, start, output in todo:
            key = (cohort[2], v)
            found: Sequence[tuple[str | None, str]] = ()
            if spent.get(key, 0.0) >= budget:
                status = ContractStatus.unchecked
                self.unchecked["budget"] += 1
            else:
                t0 = clock()
                status, found = self._check(cohort, v, start, output)
                took = clock() - t0
                spent[key] = spent.get(key, 0.0) + took
                if took > per_output and status in (ContractStatus.valid, ContractStatus.invalid):
                    status, found = ContractStatus.unchecked, ()
                    self.unchecked["slow"] += 1
                elif status is ContractStatus.unchecked:
                    self.unchecked["other"] += 1  # beyond the bucket's quota, or the check raised (logged)
            ck = (g, v, status)
            tally[ck] = tally.get(ck, 0) + 1
            for path, keyword in found:
                vk = (g, v, path, keyword)
                self._violations[vk] = self._violations.get(vk, 0) + 1

    @property
    def events(self) -> int:
        """Outputs added so far."""
        return sum(self._events)

    def _tables(self) -> tuple[pa.Table, pa.Table, pa.Table, pa.Table]:
        g, f, v, a, _ = self.tables()
        return g, f, v, a

    def tables(self) -> tuple[pa.Table, pa.Table, pa.Table, pa.Table, pa.Table]:
        """The counts as Arrow tables (groups, fields, values, lengths, served models).

        Built once (with ``number_table``); after this, ``add`` must not be called.
        Building them is Python work, so a caller that prepares batches on another
        thread calls this there.
        """
        return self._all()[:5]

    def number_table(self) -> pa.Table:
        """The number histogram as an Arrow table (slot, value, n), built with ``tables``.

        Apart from ``tables`` because callers unpack that one's five tables.
        """
        return self._all()[5]

    def contract_tables(self) -> tuple[pa.Table, pa.Table]:
        """Contract checks (g, contract_version, status, n) and violations (g, contract_version, path, keyword, n)."""
        self.run_checks()
        c = pa.table(
            {
                "g": pa.array([k[0] for k in self._contracts], pa.int64()),
                "contract_version": pa.array([k[1] for k in self._contracts], pa.string()),
                "status": pa.array([k[2].value for k in self._contracts], pa.string()),
                "n": pa.array(list(self._contracts.values()), pa.int64()),
            }
        )
        v = pa.table(
            {
                "g": pa.array([k[0] for k in self._violations], pa.int64()),
                "contract_version": pa.array([k[1] for k in self._violations], pa.string()),
                "path": pa.array([k[2] for k in self._violations], pa.string()),
                "keyword": pa.array([k[3] for k in self._violations], pa.string()),
                "n": pa.array(list(self._violations.values()), pa.int64()),
            }
        )
        return c, v

    def _all(self) -> tuple[pa.Table, pa.Table, pa.Table, pa.Table, pa.Table, pa.Table]:
        if self._built is None:
            assert self._acc is not None
            self._built = self._build(self._acc)
            # The tables hold every count now. Batches wait for their merge (several are
            # pending during a bulk import): the accumulator's dicts and number tables would
            # otherwise stay alive beside the tables (measured: about 30 MB per 40,000 events).
            self._acc = None
        return self._built

    def _build(self, acc: speedups.Acc) -> tuple[pa.Table, pa.Table, pa.Table, pa.Table, pa.Table, pa.Table]:
        groups = sorted(self._groups.items(), key=lambda kv: kv[1])
        g = pa.table(
            {
                "g": pa.array([i for _, i in groups], pa.int64()),
                "model": pa.array([k[0] for k, _ in groups], pa.string()),
                "prompt_version": pa.array([k[1] for k, _ in groups], pa.string()),
                "contract": pa.array([k[2] for k, _ in groups], pa.string()),
                "source": pa.array([k[3] for k, _ in groups], pa.string()),
                "served": pa.array([k[4] for k, _ in groups], pa.string()),
                "epoch": pa.array([k[5] for k, _ in groups], pa.int64()),
                "events": pa.array([self._events[i] for _, i in groups], pa.int64()),
                "coarse": pa.array([i in self._coarse for _, i in groups], pa.bool_()),
            }
        )
        # per slot: group, path id, then the counts (packed native int64, no object per count)
        cols = np.frombuffer(acc.count_rows(), dtype=np.int64).reshape(-1, 2 + len(_FIELD_COLS)).T
        names = pa.array([p for p, _ in self._paths], pa.string())
        scopes = pa.array([s for _, s in self._paths], pa.string())
        path_ids = pa.array(cols[1])
        f = {
            "slot": pa.array(np.arange(cols.shape[1], dtype=np.int64)),
            "g": pa.array(cols[0]),
            "path": names.take(path_ids),
            "scope": scopes.take(path_ids),
        }
        for i, name in enumerate(_FIELD_COLS):
            f[name] = pa.array(cols[2 + i])
        vs, voff, vdata, vn = acc.value_rows()  # packed Arrow buffers, wrapped without a copy
        vrows = len(vs) // 8
        v = pa.table(
            {
                "slot": pa.Array.from_buffers(pa.int64(), vrows, [None, pa.py_buffer(vs)]),
                "value": pa.Array.from_buffers(pa.string(), vrows, [None, pa.py_buffer(voff), pa.py_buffer(vdata)]),
                "n": pa.Array.from_buffers(pa.int64(), vrows, [None, pa.py_buffer(vn)]),
            }
        )
        als, al, an = acc.rows(1)  # packed native arrays, as the numbers below
        lrows = len(als) // 8
        a = pa.table(
            {
                "slot": pa.Array.from_buffers(pa.int64(), lrows, [None, pa.py_buffer(als)]),
                "length": pa.Array.from_buffers(pa.int64(), lrows, [None, pa.py_buffer(al)]),
                "n": pa.Array.from_buffers(pa.int64(), lrows, [None, pa.py_buffer(an)]),
            }
        )
        ns, nv, nn = acc.rows(2)  # packed native arrays, wrapped without a copy
        rows = len(ns) // 8
        numbers = pa.table(
            {
                "slot": pa.Array.from_buffers(pa.int64(), rows, [None, pa.py_buffer(ns)]),
                "value": pa.Array.from_buffers(pa.float64(), rows, [None, pa.py_buffer(nv)]),
                "n": pa.Array.from_buffers(pa.int64(), rows, [None, pa.py_buffer(nn)]),
            }
        )
        served = pa.table(
            {
                "g": pa.array([k[0] for k in self._served], pa.int64()),
                "served_model": pa.array([k[1] for k in self._served], pa.string()),
                "n": pa.array(list(self._served.values()), pa.int64()),
            }
        )
        return g, pa.table(f), v, a, served, numbers


# Each rollup table, its key columns and its summed columns.
ROLLUP_TABLES: dict[str, tuple[list[str], list[str]]] = {
    "cohort_buckets": (["cohort_id", "bucket"], ["events"]),
    "field_rollups": (["cohort_id", "bucket", "path", "scope"], [*_FIELD_COLS, "values_overflow"]),
    "value_rollups": (["cohort_id", "bucket", "path", "value"], ["n"]),
    "array_rollups": (["cohort_id", "bucket", "path", "length"], ["n"]),
    "number_rollups": (["cohort_id", "bucket", "path", "value"], ["n"]),
    "contract_rollups": (["cohort_id", "bucket", "contract_version", "status"], ["n"]),
    "violation_rollups": (["cohort_id", "bucket", "contract_version", "path", "keyword"], ["n"]),
}
