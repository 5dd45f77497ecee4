"""Reading a window back as a profile: the per-field statistics of one cohort.

A window ``[since, until)`` holds the time buckets whose start lies in it
(buckets are ``bucket_seconds`` wide, on the Unix-epoch grid). Its profile is
the sum of the buckets' rollup rows, so reading it costs the same at any
traffic. Deferred rollups are merged first, so a profile counts every event
committed before the read.

>>> profile = read_profile(store, cohort_id, since, until)          # doctest: +SKIP
>>> profile.fields["customer.tier"].presence_rate                   # doctest: +SKIP
0.61
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from .rules import PRODUCTION
from .store import CohortRow, Store, WindowRollups

__all__ = [
    "FieldProfile",
    "Profile",
    "ValuesNotRead",
    "contract_changes",
    "read_profile",
    "read_profiles",
    "read_step_profiles",
    "served_aliases",
    "with_values",
]

TYPES = ("null", "boolean", "integer", "number", "string", "array", "object")

_Key = TypeVar("_Key", int, float)


class ValuesNotRead(dict[str, int]):
    """The values of a path its reader chose not to read (``read_profiles(values=False)``, then
    ``with_values`` for some paths): empty, and any look at them raises ``LookupError``, so that
    a rule which starts reading the values of a path the analyzer does not name fails loudly
    instead of judging an empty map (no value, no overflow: an enum with nothing unknown)."""

    __slots__ = ()

    def _refuse(self, *args: object, **kwargs: object) -> Any:
        raise LookupError("these values were not read: name the path to with_values")

    __len__ = __iter__ = __contains__ = __getitem__ = __bool__ = _refuse
    get = items = keys = values = copy = _refuse
    __setitem__ = __delitem__ = update = setdefault = pop = popitem = clear = _refuse

    def __repr__(self) -> str:
        return "ValuesNotRead()"


_NOT_READ = ValuesNotRead()


@dataclass(frozen=True)
class FieldProfile:
    """What one path looked like over a window.

    ``units`` is the denominator of presence: the outputs for a path outside any
    array, the items of the array ``scope`` otherwise.
    """

    path: str
    scope: str | None
    units: int
    present: int  # found, null included
    types: dict[str, int]  # JSON type -> count; "integer" is a kind of number
    long_strings: int  # strings too long to be kept as values
    values: dict[str, int]  # short string -> count (bounded per bucket; the rest is overflow)
    values_overflow: int
    array_lengths: dict[int, int] = field(default_factory=dict)  # exact histogram
    # Number histogram: bin representative -> count (rules.number_bin: exact for integers up
    # to 100, within 1% otherwise). Integers and fractions together; booleans are not numbers.
    numbers: dict[float, int] = field(default_factory=dict)
    # Of the booleans, those true; None when some were counted before true counts were kept (then
    # nobody knows), and in documents written before.
    trues: int | None = None

    @property
    def true_share(self) -> float | None:
        """Share of the booleans that are true; None when unknown or there are none."""
        booleans = self.types.get("boolean", 0)
        return self.trues / booleans if self.trues is not None and booleans else None

    @property
    def filled(self) -> int:
        """Present and not null."""
        return self.present - self.types.get("null", 0)

    @property
    def presence_rate(self) -> float:
        """Share of units in which the field appeared filled."""
        return self.filled / self.units if self.units else 0.0

    @property
    def missing(self) -> int:
        return self.units - self.present

    def type_share(self, json_type: str) -> float:
        return self.types.get(json_type, 0) / self.present if self.present else 0.0

    def array_percentile(self, q: float) -> int | None:
        """The q-quantile (0..1) of array lengths, exact (nearest rank); None without arrays."""
        return _nearest_rank(self.array_lengths, q)

    def number_percentile(self, q: float) -> float | None:
        """The q-quantile (0..1) of numbers (nearest rank over the bins); None without numbers.

        Exact for integers up to 100 in magnitude, within 1% otherwise (``rules.number_bin``).
        """
        return _nearest_rank(self.numbers, q)

    @property
    def empty_array_share(self) -> float:
        total = sum(self.array_lengths.values())
        return self.array_lengths.get(0, 0) / total if total else 0.0

    def to_json(self) -> dict[str, Any]:
        """A plain-JSON form (string keys, sorted when dumped) that ``from_json`` reads back equal."""
        out = dataclasses.asdict(self)
        out["array_lengths"] = {str(k): v for k, v in sorted(self.array_lengths.items())}
        # repr() of a float is the shortest text that float() reads back to the same float.
        out["numbers"] = {repr(k): v for k, v in sorted(self.numbers.items())}
        if self.trues is None:  # absent, as in documents written before: their hashes hold
            del out["trues"]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FieldProfile:
        data = dict(data)
        data["array_lengths"] = {int(k): int(v) for k, v in data.get("array_lengths", {}).items()}
        # Absent in profiles written before number histograms existed.
        data["numbers"] = {float(k): int(v) for k, v in data.get("numbers", {}).items()}
        return cls(**data)


def _nearest_rank(histogram: dict[_Key, int], q: float) -> _Key | None:
    """The q-quantile (0..1) of a histogram value -> count, nearest rank; None if it is empty."""
    total = sum(histogram.values())
    if not total:
        return None
    rank = max(1, math.ceil(round(q * total, 9)))  # nearest rank; round() absorbs 0.9 * 10 = 9.000...02
    seen = 0
    for value in sorted(histogram):
        seen += histogram[value]
        if seen >= rank:
            return value
    return max(histogram)


@dataclass(frozen=True)
class Profile:
    """Every field of one cohort over one window."""

    cohort_id: int
    model: str
    prompt_version: str
    contract: str
    since: datetime
    until: datetime
    events: int
    fields: dict[str, FieldProfile]
    served_models: dict[str, int]
    # contract version ('' untagged) -> rollup.ContractStatus value -> outputs
    contract_checks: dict[str, dict[str, int]] = field(default_factory=dict)
    # path ('$': the output itself) -> JSON Schema keyword -> outputs breaking their registered
    # contract there that way
    violations: dict[str, dict[str, int]] = field(default_factory=dict)
    source: str = PRODUCTION  # production, probe or shadow: part of the cohort

    @property
    def cohort(self) -> tuple[str, str, str, str]:
        """(model, prompt version, contract, source)."""
        return (self.model, self.prompt_version, self.contract, self.source)

    @property
    def checked(self) -> int:
        """Outputs checked against a registered contract version (valid or not)."""
        return sum(n for by in self.contract_checks.values() for s, n in by.items() if s in ("valid", "invalid"))

    @property
    def live_contract_version(self) -> str | None:
        """The registered contract version most outputs were tagged with, if any."""
        counts = {
            v: sum(n for s, n in by.items() if s in ("valid", "invalid", "unchecked"))
            for v, by in self.contract_checks.items()
        }
        counts = {v: n for v, n in counts.items() if n}
        return max(sorted(counts), key=lambda v: counts[v]) if counts else None


def contract_changes(
    store: Store, cohort_id: int | None, since: datetime, until: datetime
) -> dict[int, list[dict[str, Any]]]:
    """Contract versions each cohort's outputs (or one cohort's) were first tagged with inside
    ``[since, until)``, by cohort id.

    Each is ``{"version", "first_seen"}`` (the start of the first bucket holding it), oldest first:
    "this started when contract v4 went out". A cohort's first version is its start, not a change;
    untagged outputs are no version. One query for every cohort. Reads the merged rollups as they
    are: callers that read a profile first (which merges) do not merge twice.
    """
    out: dict[int, list[dict[str, Any]]] = {}
    for c, v, t in store.contract_version_starts(since, until, cohort_id):
        out.setdefault(c, []).append({"version": v, "first_seen": t})
    return out


def served_aliases(store: Store) -> dict[tuple[str, str, str, str], list[tuple[str, str, str, str]]]:
    """For each served cohort, the cohorts whose alias it answered, the most answered first.

    A cohort is (model, prompt version, contract, source). An output requested under one model id and
    answered by another also counts in the cohort of the model that answered (``rollup.py``):
    this maps that cohort to the requested ones, so it can be judged against what they were.
    """
    out: dict[tuple[str, str, str, str], list[tuple[str, str, str, str]]] = {}
    for served, prompt_version, contract, model, source in store.served_aliases():
        out.setdefault((served, prompt_version, contract, source), []).append((model, prompt_version, contract, source))
    return out


def read_profiles(
    store: Store, since: datetime, until: datetime, *, numbers: bool = True, values: bool = True
) -> list[Profile]:
    """The profile of every cohort with events in ``[since, until)``, by cohort id.

    ``numbers=False`` leaves number histograms out (empty): a reader with no use for them (the
    analyzer's rules) skips the largest rollup table. ``values=False`` leaves every field's
    short-string values unread (``ValuesNotRead``) for ``with_values`` to fill in for the paths
    the reader judges.
    """
    store.flush_rollups()
    return [p for p in _read(store, None, since, until, numbers=numbers, values=values) if p.events > 0]


def with_values(store: Store, profiles: Sequence[Profile], keys: Collection[tuple[int, str]]) -> list[Profile]:
    """``profiles`` of one window (``read_profiles(values=False)``) with the values of the (cohort id,
    path) ``keys`` read in; the other fields' values stay unread. One query for every cohort."""
    if not profiles:
        return []
    since, until = profiles[0].since, profiles[0].until
    if any((p.since, p.until) != (since, until) for p in profiles):
        raise ValueError("with_values reads one window: the profiles cover several")
    wanted = set(keys)
    read = store.window_values(since, until, wanted) if wanted else {}
    out = []
    for p in profiles:
        fields = p.fields
        if any((p.cohort_id, path) in wanted for path in fields):
            fields = {
                path: dataclasses.replace(f, values=read.get((p.cohort_id, path), {}))
                if (p.cohort_id, path) in wanted
                else f
                for path, f in fields.items()
            }
        out.append(dataclasses.replace(p, fields=fields))
    return out


def read_profile(store: Store, cohort_id: int, since: datetime, until: datetime) -> Profile:
    """The profile of one cohort over ``[since, until)`` (zero events if it had none)."""
    store.flush_rollups()
    if store.cohort(cohort_id) is None:
        raise LookupError(f"no cohort {cohort_id}")
    return _read(store, cohort_id, since, until)[0]


def read_step_profiles(
    store: Store, cohort_id: int, edges: Sequence[datetime], paths: Sequence[str] | None = None
) -> list[Profile]:
    """The profiles of one cohort over consecutive windows ``[edges[i], edges[i + 1])``, oldest first.

    Each equals ``read_profile(store, cohort_id, edges[i], edges[i + 1])``, read for all the windows
    at once (one query per rollup table): a chart's steps. With ``paths``, each profile holds the
    fields of these paths only (and the contract violations at them); everything else is whole.
    """
    store.flush_rollups()
    row = store.cohort(cohort_id)
    if row is None:
        raise LookupError(f"no cohort {cohort_id}")
    rows = {cohort_id: row}
    return [
        _profiles(r, rows, [cohort_id], lo, hi)[0]
        for r, lo, hi in zip(store.step_rollups(cohort_id, edges, paths), edges, edges[1:], strict=False)
    ]


def _read(
    store: Store,
    cohort_id: int | None,
    since: datetime,
    until: datetime,
    *,
    numbers: bool = True,
    values: bool = True,
) -> list[Profile]:
    r = store.window_rollups(since, until, cohort_id, numbers=numbers, values=values)
    wanted = [cohort_id] if cohort_id is not None else sorted(r.events)
    return _profiles(r, {row.cohort_id: row for row in store.cohorts()}, wanted, since, until, values=values)


def _profiles(
    r: WindowRollups,
    rows: Mapping[int, CohortRow],
    wanted: Sequence[int],
    since: datetime,
    until: datetime,
    *,
    values: bool = True,
) -> list[Profile]:
    """The profiles of the cohorts ``wanted`` from the rollups of one window (``values=False``:
    their values were not read)."""
    events = r.events
    fields: dict[int, dict[str, FieldProfile]] = {}
    for row in r.fields:
        c, path, scope = int(row[0]), row[1], row[2]
        # The units of a path under an array are that array's items: the sum of its lengths.
        units = events.get(c, 0) if scope is None else sum(k * n for k, n in r.lengths.get((c, scope), {}).items())
        counts = [int(x) for x in row[3:]]
        types = {t: n for t, n in zip(TYPES, counts[1:8], strict=True) if n}
        fields.setdefault(c, {})[path] = FieldProfile(
            path,
            scope,
            units,
            counts[0],
            types,
            counts[8],
            r.values.get((c, path), {}) if values else _NOT_READ,
            counts[9],
            r.lengths.get((c, path), {}),
            r.numbers.get((c, path), {}),
            counts[10] if counts[11] == types.get("boolean", 0) else None,
        )
    return [
        Profile(
            c,
            rows[c].model,
            rows[c].prompt_version,
            rows[c].contract,
            since,
            until,
            events.get(c, 0),
            fields.get(c, {}),
            r.served.get(c, {}),
            r.checks.get(c, {}),
            r.violations.get(c, {}),
            rows[c].source,
        )
        for c in wanted
    ]
