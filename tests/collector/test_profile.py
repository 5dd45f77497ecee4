"""Window profiles read back from the rollups equal a recomputation from the raw outputs."""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from conftest import make_envelope

from collector import Store, flatten_output, read_profile, read_profiles
from collector.envelope import LIMITS, parse_envelope
from collector.profile import FieldProfile

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def output(rnd: random.Random) -> dict[str, Any]:
    out: dict[str, Any] = {"priority": rnd.choice(["low", "high", None]),
                           "items": [{"k": rnd.choice(["a", "b"]), "n": rnd.choice([1, 2.5])}
                                     for _ in range(rnd.randint(0, 3))]}
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


def expected(written: list[tuple[datetime, dict[str, Any]]], since: datetime, until: datetime
             ) -> tuple[int, dict[str, dict[str, Any]]]:
    """The same statistics computed one output at a time with the reference flattener."""
    inside = [out for ts, out in written if since <= ts.replace(second=0, microsecond=0) < until]
    fields: dict[str, dict[str, Any]] = {}
    items: Counter[str] = Counter()
    for out in inside:
        for o in flatten_output(out):
            f = fields.setdefault(o.path, {"scope": o.scope, "present": 0, "types": Counter(),
                                           "values": Counter(), "lengths": Counter()})
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
    return {"scope": p.scope, "present": p.present, "types": Counter(p.types), "values": Counter(p.values),
            "lengths": Counter(p.array_lengths), "units": p.units}


@pytest.mark.parametrize("minutes", [(0, 10), (2, 5), (9, 10)])
def test_a_window_profile_equals_the_recomputation(store: Store, minutes: tuple[int, int]) -> None:
    written = write(store, 150, seed=3)
    since, until = T0 + timedelta(minutes=minutes[0]), T0 + timedelta(minutes=minutes[1])
    (profile,) = read_profiles(store, since, until)
    events, fields = expected(written, since, until)
    assert profile.events == events
    assert {p: as_plain(f) for p, f in profile.fields.items()} == fields
    assert profile.served_models == {"claude-sonnet-4-5-20250929": events}


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
