"""Tests for collector.rollup: the rollups stored with each batch are mergeable
counts that agree with flatten.flatten_output over the raw outputs.

Invariants checked on real DuckDB files: the rollup of a window is the merge of
the rollups of its parts, however the events were split into batches and in
whatever order; the rollups equal a recomputation from the raw `output` column;
the value cap bounds the distinct values and accounts for the rest in
``values_overflow``; compaction changes no sum. Number histograms are recomputed
with ``numbers_of`` below (``rollup.number_bin`` over every number leaf).
TIMESTAMPTZ values are read as epoch seconds (DuckDB's Python conversion of
TIMESTAMPTZ needs pytz).
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from shapewatch.collector import register_contract
from shapewatch.collector import rollup as rollup_module
from shapewatch.collector.envelope import LIMITS, Envelope, parse_envelope
from shapewatch.collector.flatten import JsonType, flatten_output, items_path, join_key
from shapewatch.collector.rollup import ROLLUP_TABLES, RollupConfig, number_bin
from shapewatch.collector.store import Store, WriteStatus
from shapewatch.collector.store import merge as store_merge
from shapewatch.collector.store.merge import compact_rollups

MakeEnvelope = Callable[..., dict[str, Any]]
Sums = dict[str, dict[tuple[Any, ...], tuple[int, ...]]]

T1200 = int(datetime(2026, 11, 29, 12, 0, tzinfo=UTC).timestamp())
CAP = 50  # the `store` fixture's enum_values_per_path
FIELD_COLS = [
    "present",
    "n_null",
    "n_boolean",
    "n_integer",
    "n_number",
    "n_string",
    "n_array",
    "n_object",
    "long_strings",
]


def parse(raw: dict[str, Any]) -> Envelope:
    return parse_envelope(orjson.dumps(raw), LIMITS)


def open_store(tmp_path: Path, name: str, **kw: Any) -> Store:
    kw.setdefault("rollup", RollupConfig(enum_values_per_path=CAP))
    return Store.open(tmp_path / f"{name}.duckdb", **kw)


def write_all(store: Store, batches: list[list[Envelope]]) -> None:
    for batch in batches:
        assert {r.status for r in store.write_batch(batch)} == {WriteStatus.accepted}


def numbers_of(output: dict[str, Any]) -> Iterator[tuple[str, float]]:
    """(path, number_bin(value)) for every number leaf of an output: the reference for number_rollups.

    Booleans are not numbers; numbers inside arrays count under the items path.
    """

    def walk(v: Any, path: str) -> Iterator[tuple[str, float]]:
        if isinstance(v, bool) or v is None or isinstance(v, str):
            return
        if isinstance(v, int | float):
            yield path, number_bin(v)
        elif isinstance(v, list):
            for item in v:
                yield from walk(item, items_path(path))
        else:
            for k, x in v.items():
                yield from walk(x, join_key(path, k))

    for k, v in output.items():
        yield from walk(v, join_key(None, k))


def rollup_sums(store: Store, *, since: int | None = None, until: int | None = None, by_bucket: bool = True) -> Sums:
    """Every rollup table summed per key over [since, until); cohorts by name, buckets as epoch seconds.

    With ``by_bucket=False`` the bucket is summed away: the profile of the whole window.
    """
    out: Sums = {}
    where = []
    if since is not None:
        where.append(f"epoch(t.bucket) >= {int(since)}")
    if until is not None:
        where.append(f"epoch(t.bucket) < {int(until)}")
    cond = f"WHERE {' AND '.join(where)}" if where else ""
    for table, (keys, sums) in ROLLUP_TABLES.items():
        other = [k for k in keys if k not in ("cohort_id", "bucket")]
        cols = ["c.model", "c.prompt_version", "c.contract"]
        if by_bucket:
            cols.append("epoch(t.bucket)::BIGINT")
        cols += [f"t.{k}" for k in other]
        aggs = ", ".join(f"sum(t.{s})::BIGINT" for s in sums)
        rows = store.query(
            f"SELECT {', '.join(cols)}, {aggs} FROM {table} t JOIN cohorts c USING (cohort_id) {cond} GROUP BY ALL"
        )
        out[table] = {tuple(r[: len(cols)]): tuple(r[len(cols) :]) for r in rows}
    return out


def merge(*parts: Sums) -> Sums:
    out: Sums = {}
    for part in parts:
        for table, rows in part.items():
            dst = out.setdefault(table, {})
            for key, vals in rows.items():
                old = dst.get(key)
                dst[key] = vals if old is None else tuple(a + b for a, b in zip(old, vals, strict=True))
    return out


# --- data -----------------------------------------------------------------------------------------

COHORTS = [("model-a", "p1", "intake"), ("model-a", "p2", "intake"), ("model-b", "p1", "triage")]
INTENTS = ["refund", "cancel", "upgrade", "question", "complaint"]
TIERS = ["gold", "silver", "bronze"]


def random_output(rng: random.Random) -> dict[str, Any]:
    """An output with most of what JSON can do to a path: nesting, arrays of objects and of
    arrays, nulls, missing keys, empty arrays and objects, whole floats, long strings, keys
    that need escaping."""
    out: dict[str, Any] = {}
    if rng.random() < 0.9:
        out["intent"] = rng.choice(INTENTS)
    out["priority"] = rng.choice(["low", "high", None, "urgent"])
    out["confidence"] = rng.choice([0.5, 1.0, 0, 1, 0.25, 3.0, -2.0, 0.875])
    if rng.random() < 0.8:
        customer: dict[str, Any] = {"id": f"c-{rng.randrange(20)}"}
        if rng.random() < 0.7:
            customer["tier"] = rng.choice([*TIERS, None])
        if rng.random() < 0.3:
            customer["flags"] = {}
        out["customer"] = customer
    if rng.random() < 0.85:
        ents = []
        for _ in range(rng.randrange(0, 5)):
            ent: dict[str, Any] = {"type": rng.choice(["order", "sku", "person", "date"])}
            if rng.random() < 0.6:
                ent["value"] = f"v{rng.randrange(25)}"
            if rng.random() < 0.2:
                ent["score"] = rng.choice([0.5, 2.0, None, 7])
            if rng.random() < 0.15:
                ent["spans"] = [[rng.randrange(9), rng.randrange(9)] for _ in range(rng.randrange(3))]
            ents.append(ent)
        out["entities"] = ents
    out["tags"] = rng.sample(["billing", "shipping", "account", "bug"], rng.randrange(0, 4))
    n = rng.choice([3, 63, 64, 65, 200])
    out["note"] = rng.choice("xyz") * n  # lengths around the 64-character boundary
    if rng.random() < 0.5:
        out["a.b"] = rng.choice(["dot", "key", True, False])
    if rng.random() < 0.5:
        out["x[0]"] = {"in]ner": rng.choice([1, 1.5, "s", None]), "back\\slash": [rng.choice(TIERS)]}
    if rng.random() < 0.3:
        out["a"] = {"b": rng.choice(["nested", "other"])}  # must not be confused with "a.b"
    if rng.random() < 0.3:
        out["matrix"] = [[rng.randrange(3) for _ in range(rng.randrange(3))] for _ in range(rng.randrange(3))]
    if rng.random() < 0.2:
        out["mixed"] = rng.choice(["5", 5, 5.5, True, None, [], {}, "é" * 64, "é" * 65])
    if rng.random() < 0.1:
        out["deep"] = {"l1": {"l2": {"l3": [{"k": None}, {"k": "v"}, {}]}}}
    if rng.random() < 0.7:  # numbers over the whole range: exact small ints, every kind of bin
        out["amount"] = rng.choice(
            [
                0,
                7,
                -3,
                100,
                -100,
                101,
                -101,
                250,
                10**6,
                2**53 + 1,
                -(2**63),
                2**64 - 1,
                0.1,
                -0.1,
                1e-9,
                5e-10,
                -0.0,
                3.0,
                99.5,
                1234.5678,
                -1e15,
                1e300,
                1.7976931348623157e308,
                round(rng.uniform(-1000, 1000), 2),
            ]
        )
    if rng.random() < 0.4:
        out["readings"] = [
            rng.choice([rng.uniform(-50, 50), rng.randrange(-200, 200), True, None]) for _ in range(rng.randrange(4))
        ]
    return out


def random_envelopes(make: MakeEnvelope, n: int, seed: int, minutes: int = 3) -> list[Envelope]:
    rng = random.Random(seed)
    base = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    result = []
    for i in range(n):
        model, pv, contract = rng.choice(COHORTS)
        ts = base + timedelta(seconds=rng.randrange(minutes * 60), microseconds=rng.randrange(1_000_000))
        result.append(
            parse(
                make(
                    event_id=f"ev-{seed}-{i}",
                    model=model,
                    prompt_version=pv,
                    contract=contract,
                    ts=ts.isoformat(),
                    served_model=rng.choice([f"{model}-snap1", f"{model}-snap2"]),
                    output=random_output(rng),
                )
            )
        )
    return result


def chunks(items: list[Envelope], sizes: list[int]) -> list[list[Envelope]]:
    out, i, k = [], 0, 0
    while i < len(items):
        size = sizes[k % len(sizes)]
        out.append(items[i : i + size])
        i += size
        k += 1
    return out


# --- mergeability ---------------------------------------------------------------------------------


def test_a_window_is_the_merge_of_its_parts_whatever_the_batching(
    store: Store, tmp_path: Path, envelope: MakeEnvelope
) -> None:
    events = random_envelopes(envelope, 300, seed=1)
    # store A: minute by minute, in batches of 40
    by_minute = sorted(events, key=lambda e: e.ts)
    write_all(store, chunks(by_minute, [40]))
    # store B: shuffled, in uneven batches
    other = open_store(tmp_path, "b")
    shuffled = events[:]
    random.Random(2).shuffle(shuffled)
    write_all(other, chunks(shuffled, [1, 37, 5, 60, 3]))

    window = rollup_sums(store, since=T1200, until=T1200 + 180, by_bucket=False)
    parts = [rollup_sums(store, since=T1200 + 60 * m, until=T1200 + 60 * (m + 1), by_bucket=False) for m in range(3)]
    assert window == merge(*parts)
    assert window == rollup_sums(other, since=T1200, until=T1200 + 180, by_bucket=False)
    assert rollup_sums(store) == rollup_sums(other)
    # the window covers every event: 300 units at the top scope, and an alias's outputs once
    # more in the cohort of the model that served them
    aliased = sum(1 for e in events if e.served_model not in (None, e.model))
    assert aliased > 0
    assert sum(v[0] for v in window["cohort_buckets"].values()) == 300 + aliased
    # and three buckets hold something for each cohort
    assert {k[3] for k in rollup_sums(store)["cohort_buckets"]} == {T1200, T1200 + 60, T1200 + 120}
    other.close()


def test_one_batch_and_many_small_batches_give_the_same_sums(tmp_path: Path, envelope: MakeEnvelope) -> None:
    events = random_envelopes(envelope, 120, seed=3)
    one = open_store(tmp_path, "one")
    many = open_store(tmp_path, "many")
    write_all(one, [events])
    write_all(many, chunks(events, [1, 7, 13]))
    assert rollup_sums(one) == rollup_sums(many)
    # the many-batch store really holds several rows per key (else this would prove little)
    assert many.query("SELECT count(*) > count(DISTINCT (cohort_id, bucket, path)) FROM field_rollups") == [(True,)]
    one.close()
    many.close()


def test_the_merge_checking_each_row_alone_gives_what_the_one_taking_paths_as_distinct_gives(
    tmp_path: Path, envelope: MakeEnvelope, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A merge takes each slot's row as alone in its group when its batches name no path twice (it
    # never sees two ids for one path); otherwise it checks row by row. Both must count alike.
    events = random_envelopes(envelope, 120, seed=5)
    batches = chunks(events, [1, 7, 13])
    fast = open_store(tmp_path, "fast")
    write_all(fast, batches)
    monkeypatch.setattr(store_merge, "_distinct_paths", lambda batches: False)
    checked = open_store(tmp_path, "checked")
    write_all(checked, batches)
    assert rollup_sums(checked) == rollup_sums(fast)
    assert checked.query("SELECT count(*) FROM field_rollups") == fast.query("SELECT count(*) FROM field_rollups")
    fast.close()
    checked.close()


def test_two_path_ids_of_one_name_in_a_group_are_summed_into_one_row(
    tmp_path: Path, envelope: MakeEnvelope, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With escaping broken on purpose, the key "a.b" and the key b inside "a" name the same path:
    # two path ids, one name, in one group. The merge must see it (_distinct_paths) and sum their
    # counts into one row per key, as it did before any row was appended as it is.
    monkeypatch.setattr(rollup_module, "join_key", lambda parent, key: key if parent is None else f"{parent}.{key}")
    store = open_store(tmp_path, "clash")
    ts = "2026-11-29T12:00:05Z"
    write_all(
        store,
        [
            [
                parse_envelope(orjson.dumps(envelope(event_id="x", ts=ts, output={"a.b": "x"})), LIMITS),
                parse_envelope(orjson.dumps(envelope(event_id="y", ts=ts, output={"a": {"b": "y"}})), LIMITS),
            ]
        ],
    )
    assert store.query("SELECT present, n_string FROM field_rollups WHERE path = 'a.b'") == [(2, 2)]
    assert sorted(store.query("SELECT value, n FROM value_rollups WHERE path = 'a.b'")) == [("x", 1), ("y", 1)]
    store.close()


# --- agreement with the reference flattening -------------------------------------------------------


def recompute(store: Store, max_len: int) -> dict[str, dict[tuple[Any, ...], Any]]:
    """The rollups, recomputed from the raw outputs with flatten.flatten_output."""
    field: dict[tuple[Any, ...], dict[str, Any]] = {}
    values: dict[tuple[Any, ...], Counter[str]] = defaultdict(Counter)
    lengths: dict[tuple[Any, ...], Counter[int]] = defaultdict(Counter)
    numbers: dict[tuple[Any, ...], Counter[float]] = defaultdict(Counter)
    buckets: Counter[tuple[Any, ...]] = Counter()
    rows = store.query("SELECT cohort_id, epoch_us(ts), output FROM cohort_events")  # served cohorts too
    for cohort_id, ts_us, output in rows:
        bucket = ts_us // 1_000_000 // store.bucket_seconds * store.bucket_seconds
        buckets[(cohort_id, bucket)] += 1
        for path, value in numbers_of(orjson.loads(output)):
            numbers[(cohort_id, bucket, path)][value] += 1
        for obs in flatten_output(orjson.loads(output)):
            key = (cohort_id, bucket, obs.path)
            f = field.setdefault(key, {"scope": obs.scope, **dict.fromkeys(FIELD_COLS, 0), "values_overflow": 0})
            assert f["scope"] == obs.scope
            f["present"] += 1
            f[f"n_{obs.type.value}"] += 1
            if obs.type is JsonType.string:
                assert obs.string is not None
                if len(obs.string) <= max_len:
                    values[key][obs.string] += 1
                else:
                    f["long_strings"] += 1
            if obs.type is JsonType.array:
                assert obs.length is not None
                lengths[key][obs.length] += 1
    return {
        "field": field,
        "values": dict(values),
        "lengths": dict(lengths),
        "numbers": dict(numbers),
        "buckets": dict(buckets),
    }


def stored(store: Store) -> dict[str, dict[tuple[Any, ...], Any]]:
    cols = ", ".join(f"sum({c})::BIGINT" for c in [*FIELD_COLS, "values_overflow"])
    field = {}
    for row in store.query(
        f"SELECT cohort_id, epoch(bucket)::BIGINT, path, scope, {cols} FROM field_rollups GROUP BY ALL"
    ):
        field[row[:3]] = {"scope": row[3], **dict(zip([*FIELD_COLS, "values_overflow"], row[4:], strict=True))}
    values: dict[tuple[Any, ...], Counter[str]] = defaultdict(Counter)
    for cid, b, path, value, n in store.query(
        "SELECT cohort_id, epoch(bucket)::BIGINT, path, value, sum(n)::BIGINT FROM value_rollups GROUP BY ALL"
    ):
        values[(cid, b, path)][value] = n
    lengths: dict[tuple[Any, ...], Counter[int]] = defaultdict(Counter)
    for cid, b, path, length, n in store.query(
        "SELECT cohort_id, epoch(bucket)::BIGINT, path, length, sum(n)::BIGINT FROM array_rollups GROUP BY ALL"
    ):
        lengths[(cid, b, path)][length] = n
    numbers: dict[tuple[Any, ...], Counter[float]] = defaultdict(Counter)
    for cid, b, path, value, n in store.query(
        "SELECT cohort_id, epoch(bucket)::BIGINT, path, value, sum(n)::BIGINT FROM number_rollups GROUP BY ALL"
    ):
        numbers[(cid, b, path)][value] = n
    buckets = {
        (cid, b): n
        for cid, b, n in store.query(
            "SELECT cohort_id, epoch(bucket)::BIGINT, sum(events)::BIGINT FROM cohort_buckets GROUP BY ALL"
        )
    }
    return {
        "field": field,
        "values": dict(values),
        "lengths": dict(lengths),
        "numbers": dict(numbers),
        "buckets": buckets,
    }


def test_rollups_equal_a_recomputation_from_the_raw_outputs(store: Store, envelope: MakeEnvelope) -> None:
    events = random_envelopes(envelope, 500, seed=7, minutes=4)
    write_all(store, chunks(events, [64, 1, 100, 13]))
    expected = recompute(store, store.rollup.enum_value_max_length)
    got = stored(store)
    # under the cap here: no overflow, every short value kept
    assert max(len(v) for v in expected["values"].values()) < CAP
    assert got["buckets"] == expected["buckets"]
    assert got["field"] == expected["field"]
    assert got["values"] == expected["values"]
    assert got["lengths"] == expected["lengths"]
    assert got["numbers"] == expected["numbers"]
    # the data exercised what it was meant to
    paths = {k[2] for k in got["field"]}
    assert {
        "a\\.b",
        "a.b",
        "x\\[0\\].in\\]ner",
        "x\\[0\\].back\\\\slash[]",
        "entities[].spans[][]",
        "matrix[][]",
        "deep.l1.l2.l3[].k",
        "customer.flags",
    } <= paths
    totals = {c: sum(f[c] for f in got["field"].values()) for c in FIELD_COLS}
    assert all(totals[c] > 0 for c in FIELD_COLS), totals
    assert any(0 in h for h in got["lengths"].values())  # empty arrays counted as length 0
    binned = Counter(v for h in got["numbers"].values() for v in h)
    assert {0.0, 7.0, -100.0, 1.7849871279102503e308} <= set(binned)  # exact, tiny, top bin
    assert {p for (_, _, p) in got["numbers"]} >= {"amount", "readings[]", "matrix[][]", "entities[].spans[][]"}


def test_the_accumulator_agrees_with_flatten_on_awkward_documents(store: Store, envelope: MakeEnvelope) -> None:
    outputs: list[dict[str, Any]] = [
        {},
        {"a": []},
        {"a": [[]]},
        {"a": [{}, {"b": None}, [], "s", 1, 1.0, 1.5, True, None]},
        {"e": {"": 1}},
        {"k": "x" * 64, "l": "x" * 65, "u": "\U0001f600" * 64, "v": "\U0001f600" * 65},
        {"n": -0.0, "m": 1e300, "big": 2**63 + 5, "neg": -(2**63), "t": 1e-9, "u": -5e-324, "b": [True, 1]},
        {"q\\.": {"r": 1}, "q\\": {".r": 2}},
    ]
    store.write_batch([parse(envelope(event_id=f"w{i}", output=o)) for i, o in enumerate(outputs)])
    expected = recompute(store, store.rollup.enum_value_max_length)
    got = stored(store)
    assert got == expected


def test_an_empty_key_does_not_share_paths_with_the_top_level(store: Store, envelope: MakeEnvelope) -> None:
    store.write_batch(
        [
            parse(envelope(event_id="top", output={"b": "top"})),
            parse(envelope(event_id="nested", output={"": {"b": "nested"}})),
        ]
    )
    rows = store.query("SELECT path, sum(present)::BIGINT FROM field_rollups GROUP BY path ORDER BY path")
    paths = [r[0] for r in rows]
    assert len(paths) == 3, rows  # the key "", its child "b", and the top-level "b": three different fields
    assert [r[1] for r in rows] == [1, 1, 1]


# --- the value cap ----------------------------------------------------------------------------------


def test_the_value_cap_bounds_distinct_values_and_counts_the_rest_as_overflow(
    tmp_path: Path, envelope: MakeEnvelope
) -> None:
    cap = 4
    store = open_store(tmp_path, "cap", rollup=RollupConfig(enum_values_per_path=cap))
    # (values of `intent` per batch), all in one bucket; a few non-strings and long strings too
    batches = [
        ["v0", "v0", "v1"],
        ["v1", "v2", "v3", "v3", "v3", "v4", "v4"],
        ["v5"] * 5 + ["v0", "v6"],
        ["v7", "v8", "v9", "v9", "v1", "v2"],
    ]
    extras: list[Any] = [None, 7, "L" * 65, "L" * 100]
    total_short = 0
    for b, values in enumerate(batches):
        outs = [{"intent": v} for v in values] + [{"intent": x} for x in extras]
        total_short += len(values)
        store.write_batch([parse(envelope(event_id=f"b{b}-{i}", output=o)) for i, o in enumerate(outs)])

    kept = dict(store.query("SELECT value, sum(n)::BIGINT FROM value_rollups WHERE path = 'intent' GROUP BY value"))
    ((present, n_string, long_strings, overflow),) = store.query(
        "SELECT sum(present)::BIGINT, sum(n_string)::BIGINT, sum(long_strings)::BIGINT, "
        "sum(values_overflow)::BIGINT FROM field_rollups WHERE path = 'intent'"
    )
    assert (present, n_string, long_strings) == (total_short + 4 * len(extras), total_short + 8, 8)
    assert len(kept) <= cap
    assert sum(kept.values()) + overflow == total_short == n_string - long_strings

    # whole values, by the documented policy: kept values keep counting; new ones are admitted
    # by frequency (then by value) while room is left; the rest overflow
    expected: Counter[str] = Counter()
    expected_overflow = 0
    for values in batches:
        counts = Counter(values)
        for v in list(counts):
            if v in expected:
                expected[v] += counts.pop(v)
        for v, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
            if len(expected) < cap:
                expected[v] = n
            else:
                expected_overflow += n
    assert kept == dict(expected) == {"v0": 3, "v1": 3, "v3": 3, "v4": 2}
    assert overflow == expected_overflow == 12
    store.close()


def test_a_kept_value_keeps_counting_when_a_later_batch_brings_many_new_ones(
    tmp_path: Path, envelope: MakeEnvelope
) -> None:
    store = open_store(tmp_path, "kept", rollup=RollupConfig(enum_values_per_path=2))
    for b, values in enumerate([["a", "b"], ["c", "d", "a", "a"]]):
        store.write_batch([parse(envelope(event_id=f"k{b}-{i}", output={"intent": v})) for i, v in enumerate(values)])
    kept = dict(store.query("SELECT value, sum(n)::BIGINT FROM value_rollups GROUP BY value"))
    overflow = store.query("SELECT sum(values_overflow)::BIGINT FROM field_rollups WHERE path = 'intent'")
    assert (kept, overflow) == ({"a": 3, "b": 1}, [(2,)])
    store.close()


def test_the_cap_keeps_the_most_frequent_values_of_a_batch(tmp_path: Path, envelope: MakeEnvelope) -> None:
    store = open_store(tmp_path, "freq", rollup=RollupConfig(enum_values_per_path=2))
    values = ["rare1", "rare2"] + ["common"] * 20 + ["second"] * 5
    store.write_batch([parse(envelope(event_id=f"f{i}", output={"intent": v})) for i, v in enumerate(values)])
    kept = dict(store.query("SELECT value, sum(n)::BIGINT FROM value_rollups GROUP BY value"))
    assert kept == {"common": 20, "second": 5}
    store.close()


def test_the_value_cap_is_per_cohort_bucket_and_path(tmp_path: Path, envelope: MakeEnvelope) -> None:
    store = open_store(tmp_path, "cap2", rollup=RollupConfig(enum_values_per_path=2))
    raws = []
    for minute in (0, 1):
        for path in ("x", "y"):
            for v in ("a", "b", "c"):
                raws.append(envelope(ts=f"2026-11-29T12:0{minute}:30Z", output={path: v}))
    store.write_batch([parse(r) for r in raws])
    rows = store.query(
        "SELECT epoch(bucket)::BIGINT, path, count(*), sum(n)::BIGINT FROM value_rollups GROUP BY ALL ORDER BY ALL"
    )
    assert rows == [(T1200, "x", 2, 2), (T1200, "y", 2, 2), (T1200 + 60, "x", 2, 2), (T1200 + 60, "y", 2, 2)]
    assert store.query(
        "SELECT epoch(bucket)::BIGINT, path, sum(values_overflow)::BIGINT FROM field_rollups GROUP BY ALL ORDER BY ALL"
    ) == [(T1200, "x", 1), (T1200, "y", 1), (T1200 + 60, "x", 1), (T1200 + 60, "y", 1)]
    store.close()


def test_merges_of_several_batches_keep_values_by_the_policy(tmp_path: Path, envelope: MakeEnvelope) -> None:
    """Merges of several batches at once (deferred), some buckets met again by later merges, some
    outputs answered by another model (counted in its cohort too): every (cohort, bucket, path)
    keeps exactly the values the policy admits, whether its merge took the shortcut for slots no
    one else holds (a bucket first met, at most `cap` values) or ranked them."""
    cap = 3
    rng = random.Random(11)
    store = open_store(tmp_path, "policy", rollup=RollupConfig(enum_values_per_path=cap))
    store.defer_rollups(max_events=10**9, max_seconds=float("inf"))
    kept: dict[tuple[str, int, str], Counter[str]] = defaultdict(Counter)
    overflow: Counter[tuple[str, int, str]] = Counter()
    n = 0
    for _merge in range(6):
        merged: dict[tuple[str, int, str], Counter[str]] = defaultdict(Counter)
        for _batch in range(rng.randint(1, 3)):
            batch = []
            for _ in range(rng.randint(1, 12)):
                minute = rng.randint(0, 3)
                served = rng.choice(["m", "m", "m2"])
                output = {
                    p: rng.choice("abcdef"[: rng.randint(1, 6)]) for p in rng.sample(["x", "y"], rng.randint(1, 2))
                }
                batch.append(
                    parse(
                        envelope(
                            event_id=f"e{n}",
                            model="m",
                            served_model=served,
                            ts=f"2026-11-29T12:0{minute}:{rng.randint(0, 59):02d}Z",
                            output=output,
                        )
                    )
                )
                n += 1
                for model in {"m", served}:
                    for path, v in output.items():
                        merged[(model, T1200 + 60 * minute, path)][v] += 1
            write_all(store, [batch])
        store.flush_rollups()
        for key, counts in merged.items():  # the policy, one merge at a time
            for v in [v for v in counts if v in kept[key]]:
                kept[key][v] += counts.pop(v)
            for v, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
                if len(kept[key]) < cap:
                    kept[key][v] = c
                else:
                    overflow[key] += c
    rows = store.query(
        """SELECT c.model, epoch(bucket)::BIGINT, path, value, sum(n)::BIGINT FROM value_rollups
           JOIN cohorts c USING (cohort_id) WHERE c.prompt_version = 'intake-v3' GROUP BY ALL"""
    )
    got: dict[tuple[str, int, str], dict[str, int]] = defaultdict(dict)
    for model, bucket, path, value, count in rows:
        got[(model, bucket, path)][value] = count
    assert dict(got) == {k: dict(v) for k, v in kept.items()}
    got_overflow = {
        (m, b, p): o
        for m, b, p, o in store.query(
            """SELECT c.model, epoch(bucket)::BIGINT, path, sum(values_overflow)::BIGINT FROM field_rollups
           JOIN cohorts c USING (cohort_id) WHERE c.prompt_version = 'intake-v3' GROUP BY ALL"""
        )
        if o
    }
    assert got_overflow == dict(overflow)
    assert len({k[0] for k in kept}) == 2 and sum(overflow.values()) > 0  # both cohorts, and the cap bit
    store.close()


# --- compaction --------------------------------------------------------------------------------------


def rows_per_key(store: Store) -> dict[str, int]:
    """The largest number of rows any one key has, per rollup table."""
    out = {}
    for table, (keys, _) in ROLLUP_TABLES.items():
        k = ", ".join(keys)
        out[table] = int(
            store.query(f"SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM {table} GROUP BY {k})")[0][0]
        )
    return out


def total_rows(store: Store) -> int:
    return sum(int(store.query(f"SELECT count(*) FROM {t}")[0][0]) for t in ROLLUP_TABLES)


def test_compaction_keeps_every_sum_and_leaves_one_row_per_key(store: Store, envelope: MakeEnvelope) -> None:
    # a registered contract some outputs break: violations are rollups too
    register_contract(store, "intake", "3", {"type": "object", "required": ["intent"]})
    write_all(store, chunks(random_envelopes(envelope, 150, seed=11), [10, 3, 25]))
    before = rollup_sums(store)
    rows_before = total_rows(store)
    assert max(rows_per_key(store).values()) > 1
    # compact_rollups takes a connection; the store's own (private) one is the only writer here
    con = store._con
    con.execute("BEGIN TRANSACTION")
    removed = compact_rollups(con)
    con.execute("COMMIT")
    assert rollup_sums(store) == before
    assert rows_per_key(store) == dict.fromkeys(ROLLUP_TABLES, 1)
    assert removed == rows_before - total_rows(store) > 0
    # idempotent
    assert compact_rollups(con) == 0
    assert rollup_sums(store) == before


def test_compaction_since_touches_only_later_buckets(store: Store, envelope: MakeEnvelope) -> None:
    write_all(store, chunks(random_envelopes(envelope, 150, seed=12), [15, 8]))
    before = rollup_sums(store)
    early_rows = store.query(f"SELECT count(*) FROM field_rollups WHERE epoch(bucket) < {T1200 + 60}")
    removed = store.compact(since=datetime(2026, 11, 29, 12, 1, tzinfo=UTC))
    assert removed > 0
    assert rollup_sums(store) == before
    assert store.query(f"SELECT count(*) FROM field_rollups WHERE epoch(bucket) < {T1200 + 60}") == early_rows
    assert store.query(
        f"SELECT max(n) FROM (SELECT count(*) AS n FROM field_rollups WHERE epoch(bucket) >= "
        f"{T1200 + 60} GROUP BY cohort_id, bucket, path, scope)"
    ) == [(1,)]


def test_writes_after_compaction_add_up_as_without_it(tmp_path: Path, envelope: MakeEnvelope) -> None:
    events = random_envelopes(envelope, 160, seed=13)
    plain = open_store(tmp_path, "plain", rollup=RollupConfig(enum_values_per_path=8))
    compacted = open_store(tmp_path, "compacted", rollup=RollupConfig(enum_values_per_path=8))
    batches = chunks(events, [20])
    for i, batch in enumerate(batches):
        write_all(plain, [batch])
        write_all(compacted, [batch])
        if i % 3 == 1:
            compacted.compact()
    # the cap (8) is reached on some paths here: kept values and overflow must still agree
    assert plain.query("SELECT sum(values_overflow) > 0 FROM field_rollups") == [(True,)]
    assert rollup_sums(compacted) == rollup_sums(plain)
    plain.close()
    compacted.close()


# --- buckets ----------------------------------------------------------------------------------------


def test_bucket_boundaries_are_exact_and_in_utc(store: Store, envelope: MakeEnvelope) -> None:
    store.write_batch(
        [
            parse(envelope(ts="2026-11-29T12:00:59.999Z", output={"k": "a"})),
            parse(envelope(ts="2026-11-29T12:01:00.000Z", output={"k": "b"})),
            parse(envelope(ts="2026-11-29T14:00:30+02:00", output={"k": "c"})),  # 12:00:30 UTC
            parse(envelope(ts="2026-11-29T11:59:59.999999-00:00", output={"k": "d"})),
        ]
    )
    assert sorted(store.query("SELECT epoch(bucket)::BIGINT, events FROM cohort_buckets")) == [
        (T1200 - 60, 1),
        (T1200, 2),
        (T1200 + 60, 1),
    ]
    assert sorted(store.query("SELECT epoch(bucket)::BIGINT, value, n FROM value_rollups")) == [
        (T1200 - 60, "d", 1),
        (T1200, "a", 1),
        (T1200, "c", 1),
        (T1200 + 60, "b", 1),
    ]
    assert sorted(store.query("SELECT epoch(bucket)::BIGINT, n FROM served_models")) == [
        (T1200 - 60, 1),
        (T1200, 2),
        (T1200 + 60, 1),
    ]
    # the raw event keeps its instant, in UTC
    assert store.query('SELECT epoch_us(ts) FROM events WHERE output = \'{"k":"c"}\'') == [((T1200 + 30) * 1_000_000,)]


def test_bucket_width_follows_the_store(tmp_path: Path, envelope: MakeEnvelope) -> None:
    store = open_store(tmp_path, "wide", bucket_seconds=3600)
    store.write_batch(
        [parse(envelope(ts=f"2026-11-29T12:{m:02d}:00Z")) for m in (0, 30, 59)]
        + [parse(envelope(ts="2026-11-29T13:00:00Z"))]
    )
    assert sorted(store.query("SELECT epoch(bucket)::BIGINT, events FROM cohort_buckets")) == [
        (T1200, 3),
        (T1200 + 3600, 1),
    ]
    store.close()


def test_compaction_by_day_covers_every_day_and_keeps_the_sums(store: Store, envelope: MakeEnvelope) -> None:
    events = [
        parse(envelope(event_id=f"d{day}-{i}", ts=f"2026-11-{day:02d}T{h:02d}:00:00Z"))
        for day in (27, 28, 29)
        for i, h in enumerate((0, 0, 23, 23))
    ]
    register_contract(store, "intake", "3", {"type": "object", "required": ["never"]})  # violations too
    write_all(store, chunks(events, [1]))  # one row per event: many rows per key
    before = rollup_sums(store)
    assert max(rows_per_key(store).values()) > 1
    assert store.compact_by_day() > 0
    assert rollup_sums(store) == before
    assert rows_per_key(store) == dict.fromkeys(ROLLUP_TABLES, 1)
    assert store.compact_by_day() == 0
