"""Window profiles read back from the rollups equal a recomputation from the raw outputs."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from harness import make_envelope
from test_rollup import numbers_of

from shapewatch.collector import Store, flatten_output, read_profile, read_profiles
from shapewatch.collector.envelope import LIMITS, parse_envelope
from shapewatch.collector.profile import FieldProfile
from shapewatch.collector.rollup import number_bin

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def output(rnd: random.Random) -> dict[str, Any]:
    out: dict[str, Any] = {
        "priority": rnd.choice(["low", "high", None]),
        "items": [
            {"k": rnd.choice(["a", "b"]), "n": rnd.choice([1, 2.5, -40, 1e6 + 0.5])} for _ in range(rnd.randint(0, 3))
        ],
        "latency_ms": rnd.choice([rnd.randrange(0, 5000), rnd.uniform(0, 5000)]),
    }
    if rnd.random() < 0.6:
        out["customer"] = {"tier": rnd.choice(["gold", "free"])}
    if rnd.random() < 0.3:
        out["confidence"] = rnd.choice([0.5, "0.5"])
    return out


def write(store: Store, n: int, seed: int) -> list[tuple[datetime, dict[str, Any]]]:
    rnd = random.Random(seed)
    written, batch = [], []
    for i in range(n):
        ts = T0 + timedelta(seconds=rnd.randrange(0, 600))
        out = output(rnd)
        env = make_envelope(event_id=f"s{seed}-{i}", ts=ts.isoformat(), output=out)
        batch.append(parse_envelope(orjson.dumps(env), LIMITS))
        written.append((ts, out))
        if len(batch) == 25:  # several batches per bucket: the window sums their rows
            store.write_batch(batch)
            batch = []
    if batch:
        store.write_batch(batch)
    return written


def expected(
    written: list[tuple[datetime, dict[str, Any]]], since: datetime, until: datetime
) -> tuple[int, dict[str, dict[str, Any]]]:
    """The same statistics computed one output at a time with the reference flattener."""
    inside = [out for ts, out in written if since <= ts.replace(second=0, microsecond=0) < until]
    fields: dict[str, dict[str, Any]] = {}
    items: Counter[str] = Counter()
    for out in inside:
        numbers: dict[str, Counter[float]] = {}
        for path, value in numbers_of(out):
            numbers.setdefault(path, Counter())[value] += 1
        for o in flatten_output(out):
            f = fields.setdefault(
                o.path,
                {
                    "scope": o.scope,
                    "present": 0,
                    "types": Counter(),
                    "values": Counter(),
                    "lengths": Counter(),
                    "numbers": Counter(),
                },
            )
            f["numbers"].update(numbers.pop(o.path, {}))
            f["present"] += 1
            f["types"][o.type.value] += 1
            if o.string is not None:
                f["values"][o.string] += 1
            if o.length is not None:
                f["lengths"][o.length] += 1
                items[o.path] += o.length
    for f in fields.values():
        f["units"] = len(inside) if f["scope"] is None else items[f["scope"]]
    return len(inside), fields


def as_plain(p: FieldProfile) -> dict[str, Any]:
    return {
        "scope": p.scope,
        "present": p.present,
        "types": Counter(p.types),
        "values": Counter(p.values),
        "lengths": Counter(p.array_lengths),
        "numbers": Counter(p.numbers),
        "units": p.units,
    }


@pytest.mark.parametrize("minutes", [(0, 10), (2, 5), (9, 10)])
def test_a_window_profile_equals_the_recomputation(store: Store, minutes: tuple[int, int]) -> None:
    written = write(store, 150, seed=3)
    since, until = T0 + timedelta(minutes=minutes[0]), T0 + timedelta(minutes=minutes[1])
    (profile,) = read_profiles(store, since, until)
    events, fields = expected(written, since, until)
    assert profile.events == events
    assert {p: as_plain(f) for p, f in profile.fields.items()} == fields
    assert profile.served_models == {"claude-sonnet-4-5-20250929": events}
    # Without number histograms: everything else identical, numbers empty.
    (lean,) = read_profiles(store, since, until, numbers=False)
    assert {p: as_plain(f) for p, f in lean.fields.items()} == {
        p: {**f, "numbers": Counter()} for p, f in fields.items()
    }
    assert any(f["numbers"] for f in fields.values())  # the comparison above is not vacuous


def test_rates_and_percentiles(store: Store) -> None:
    outs = [{"tier": "gold", "a": [1]}, {"tier": None, "a": []}, {"a": [1, 2, 3]}, {"tier": "free"}]
    for i, out in enumerate(outs):
        store.write_batch([parse_envelope(orjson.dumps(make_envelope(event_id=f"r{i}", output=out)), LIMITS)])
    cohort_id = store.query("SELECT cohort_id FROM cohorts")[0][0]
    p = read_profile(store, cohort_id, T0, T0 + timedelta(hours=1))
    tier, a, items = p.fields["tier"], p.fields["a"], p.fields["a[]"]
    assert (tier.units, tier.present, tier.filled, tier.presence_rate, tier.missing) == (4, 3, 2, 0.5, 1)
    assert (tier.type_share("string"), tier.type_share("null")) == (2 / 3, 1 / 3)
    assert (a.array_percentile(0.5), a.array_percentile(0.9), a.array_percentile(0.0)) == (1, 3, 0)
    assert a.empty_array_share == 1 / 3
    assert (items.units, items.present, items.presence_rate) == (4, 4, 1.0)  # units: the 4 items


def test_a_window_profile_is_the_merge_of_its_parts(store: Store) -> None:
    write(store, 200, seed=4)
    minutes = [T0 + timedelta(minutes=m) for m in range(11)]
    (whole,) = read_profiles(store, minutes[0], minutes[-1])
    parts = [read_profiles(store, a, b) for a, b in itertools.pairwise(minutes)]
    merged: dict[str, dict[str, Counter[Any]]] = {}
    for part in parts:
        for p in part:
            for path, f in p.fields.items():
                m = merged.setdefault(path, {"types": Counter(), "lengths": Counter(), "numbers": Counter()})
                m["types"].update(f.types)
                m["lengths"].update(f.array_lengths)
                m["numbers"].update(f.numbers)
    assert {
        path: {"types": Counter(f.types), "lengths": Counter(f.array_lengths), "numbers": Counter(f.numbers)}
        for path, f in whole.fields.items()
    } == merged
    assert sum(whole.fields["latency_ms"].numbers.values()) == whole.events


def test_number_percentiles_and_shares(store: Store) -> None:
    # latency: 1..100 ms exactly (small ints are their own bins), then one 250.0 and one 5000.5
    outs: list[dict[str, Any]] = [{"latency": i} for i in range(1, 101)]
    outs += [{"latency": 250.0}, {"latency": 5000.5}, {"latency": None}, {"latency": True}, {"latency": "3"}]
    outs += [{"scores": [0.5, -2, 1e-12]}, {"label": "x"}]
    store.write_batch(
        [parse_envelope(orjson.dumps(make_envelope(event_id=f"n{i}", output=o)), LIMITS) for i, o in enumerate(outs)]
    )
    cohort_id = store.query("SELECT cohort_id FROM cohorts")[0][0]
    p = read_profile(store, cohort_id, T0, T0 + timedelta(hours=1))
    latency, scores = p.fields["latency"], p.fields["scores[]"]
    assert sum(latency.numbers.values()) == 102  # null, boolean and string are not numbers
    assert (latency.number_percentile(0.0), latency.number_percentile(0.5), latency.number_percentile(0.9)) == (
        1.0,
        51.0,
        92.0,
    )  # nearest rank: 51st and 92nd of 102
    assert latency.number_percentile(0.99) == number_bin(250.0)  # 101st of 102
    assert latency.number_percentile(1.0) == number_bin(5000.5)
    assert abs(latency.number_percentile(1.0) - 5000.5) <= 0.01 * 5000.5
    assert scores.numbers == {-2.0: 1, 0.0: 1, number_bin(0.5): 1}  # items of an array, tiny -> 0
    assert (scores.number_percentile(0.0), scores.number_percentile(0.5)) == (-2.0, 0.0)
    assert p.fields["label"].numbers == {} and p.fields["label"].number_percentile(0.5) is None


def test_field_profiles_round_trip_through_json_exactly() -> None:
    f = FieldProfile(
        "x",
        None,
        10,
        9,
        {"number": 6, "integer": 3},
        0,
        {},
        0,
        {0: 1, 3: 2},
        {0.1: 2, -3.0: 1, 1e300: 1, number_bin(1e-5): 3, 0.0: 1, -1.7976931348623157e308: 1},
    )
    data = orjson.loads(orjson.dumps(f.to_json(), option=orjson.OPT_SORT_KEYS))
    assert data["numbers"]["0.1"] == 2 and data["numbers"]["-3.0"] == 1 and data["numbers"]["1e+300"] == 1
    back = FieldProfile.from_json(data)
    assert back == f
    # a profile written before number histograms existed reads back with none
    old = {k: v for k, v in data.items() if k != "numbers"}
    assert FieldProfile.from_json(old).numbers == {}


def test_a_cohort_without_traffic_in_the_window_has_an_empty_profile(store: Store) -> None:
    write(store, 5, seed=1)
    cohort_id = store.query("SELECT cohort_id FROM cohorts")[0][0]
    later = T0 + timedelta(days=1)
    p = read_profile(store, cohort_id, later, later + timedelta(hours=1))
    assert (p.events, p.fields, p.served_models) == (0, {}, {})
    assert read_profiles(store, later, later + timedelta(hours=1)) == []
    with pytest.raises(LookupError):
        read_profile(store, 999, T0, later)


def test_deferred_rollups_are_merged_before_reading(store: Store) -> None:
    store.defer_rollups(max_events=10_000, max_seconds=3600)
    write(store, 20, seed=5)
    (profile,) = read_profiles(store, T0, T0 + timedelta(hours=1))
    assert profile.events == 20
