"""A chart's steps read at once (``read_step_profiles``, ``Store.step_rollups``) equal the same
windows read one by one (``read_profile``), on the same store: minute, hour and day buckets,
arrays of objects, values, numbers, booleans, served models, contract checks and violations."""

from __future__ import annotations

import itertools
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from harness import make_envelope

from shapewatch.collector import Store, read_profile, read_step_profiles, register_contract
from shapewatch.collector.envelope import LIMITS, parse_envelope
from shapewatch.collector.rollup import RollupConfig
from shapewatch.collector.tiers import TierPolicy

T0 = datetime(2026, 11, 25, 0, 0, tzinfo=UTC)
SPAN = timedelta(days=5)  # older than a day: hour and day buckets after the fold
SCHEMA = {
    "type": "object",
    "required": ["intent", "priority"],
    "properties": {
        "intent": {"type": "string", "enum": ["refund", "billing", "other"]},
        "priority": {"type": "string", "enum": ["low", "high"]},
        "entities": {
            "type": "array",
            "items": {"type": "object", "required": ["type"], "properties": {"type": {"type": "string"}}},
        },
    },
}


def _output(rnd: random.Random) -> dict[str, Any]:
    out: dict[str, Any] = {
        "intent": rnd.choice(["refund", "billing", "other", "URGENT"]),
        "priority": rnd.choice(["low", "high", None, 3]),
        "entities": [
            {"type": rnd.choice(["order", "person", 7]), "score": rnd.choice([1, 2.5, -40, 1e6 + 0.5])}
            for _ in range(rnd.randint(0, 3))
        ],
        "flagged": rnd.choice([True, False, None]),
        "latency_ms": rnd.choice([rnd.randrange(0, 5000), rnd.uniform(0, 5000)]),
    }
    if rnd.random() < 0.6:
        out["customer"] = {"tier": rnd.choice(["gold", "free"])}
    if rnd.random() < 0.2:
        del out["intent"]  # breaks the contract's "required"
    return out


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path: Path = tmp_path_factory.mktemp("steps") / "steps.duckdb"
    s = Store.open(path, rollup=RollupConfig(enum_values_per_path=50), tiers=TierPolicy())
    register_contract(s, "intake", "3", SCHEMA)
    rnd = random.Random(23)
    batch = []
    for i in range(1500):
        ts = T0 + timedelta(seconds=rnd.randrange(0, int(SPAN.total_seconds())))
        raw = make_envelope(
            event_id=f"e{i}",
            ts=ts.isoformat().replace("+00:00", "Z"),
            model="gpt-4o",
            served_model=rnd.choice(["gpt-4o-2024-08-06", "gpt-4o-2024-11-20"]),
            prompt_version=rnd.choice(["triage-v2", "triage-v3"]),
            contract_version=rnd.choice(["3", "3", "9", None]),
            output=_output(rnd),
        )
        batch.append(parse_envelope(orjson.dumps(raw), LIMITS))
        if len(batch) == 50:
            s.write_batch(batch)
            batch = []
    s.write_batch(batch)
    s.flush_rollups()
    s.fold_tiers()  # the older days into hours and days, as the service does
    yield s
    s.close()


def _cohort(store: Store) -> int:
    cid = store.cohort_id("gpt-4o", "triage-v2", "intake")
    assert cid is not None
    return cid


def _edges(since: datetime, until: datetime, points: int) -> list[datetime]:
    step = (until - since) / points
    return [since + step * i for i in range(points + 1)]


def test_the_store_holds_every_kind_of_row_the_comparison_covers(store: Store) -> None:
    cid = _cohort(store)
    whole = read_profile(store, cid, T0, T0 + SPAN)
    assert whole.events > 500
    assert {"entities[].type", "entities[].score", "flagged", "customer.tier"} <= set(whole.fields)
    assert whole.fields["entities[].type"].scope == "entities"
    assert whole.fields["entities[].score"].numbers and whole.fields["entities"].array_lengths
    assert whole.fields["flagged"].trues is not None and whole.fields["intent"].values
    assert set(whole.served_models) == {"gpt-4o", "gpt-4o-2024-08-06", "gpt-4o-2024-11-20"} - {"gpt-4o"}
    assert set(whole.contract_checks) == {"3", "9", ""} and whole.violations

    def widths(since: datetime, until: datetime) -> set[int]:
        """The distances between a cohort's successive buckets in a window, seconds."""
        return {
            int(w)
            for (w,) in store.query(
                """SELECT epoch(lead(bucket) OVER (ORDER BY bucket) - bucket) FROM
                   (SELECT DISTINCT bucket FROM cohort_buckets WHERE cohort_id = ? AND bucket >= ? AND bucket < ?)""",
                [cid, since, until],
            )
            if w is not None
        }

    day = timedelta(days=1)
    assert 86400 in widths(T0, T0 + 2 * day)  # a day bucket, beyond three days of the newest data
    assert min(widths(T0, T0 + 3 * day)) == 3600  # then hours
    assert min(widths(T0 + SPAN - day / 2, T0 + SPAN)) == 60  # the last day: minutes


@pytest.mark.parametrize(
    ("since", "until", "points"),
    [
        (T0 + SPAN - timedelta(hours=24), T0 + SPAN, 24),  # the field page's default: minute buckets
        (T0 - timedelta(hours=7), T0 + SPAN + timedelta(minutes=3), 42),  # the whole span, hours and days cut
        (T0 + timedelta(minutes=13, microseconds=7), T0 + SPAN - timedelta(seconds=1), 200),  # uneven steps
        (None, None, 180),  # one-second steps, under a bucket: around the newest one
    ],
)
def test_grouped_steps_equal_the_windows_read_one_by_one(
    store: Store, since: datetime | None, until: datetime | None, points: int
) -> None:
    cid = _cohort(store)
    if since is None or until is None:
        ((newest,),) = store.query("SELECT max(bucket) FROM cohort_buckets WHERE cohort_id = ?", [cid])
        since, until = newest - timedelta(minutes=2), newest + timedelta(minutes=1)
    edges = _edges(since, until, points)
    one_by_one = [read_profile(store, cid, lo, hi) for lo, hi in itertools.pairwise(edges)]
    grouped = read_step_profiles(store, cid, edges)
    assert len(grouped) == points
    assert grouped == one_by_one
    assert sum(p.events for p in grouped) > 0  # not a comparison of empty windows


@pytest.mark.parametrize("path", ["customer.tier", "entities[].type", "entities[].score", "flagged", "absent"])
def test_one_path_over_the_steps_equals_that_path_of_the_whole_profiles(store: Store, path: str) -> None:
    cid = _cohort(store)
    edges = _edges(T0 - timedelta(hours=7), T0 + SPAN, 42)
    whole = [read_profile(store, cid, lo, hi) for lo, hi in itertools.pairwise(edges)]
    grouped = read_step_profiles(store, cid, edges, [path])
    for g, w in zip(grouped, whole, strict=True):
        assert g.fields == ({path: w.fields[path]} if path in w.fields else {})
        assert g.violations == ({path: w.violations[path]} if path in w.violations else {})
        assert (g.events, g.served_models, g.contract_checks, g.since, g.until) == (
            w.events,
            w.served_models,
            w.contract_checks,
            w.since,
            w.until,
        )
    if path != "absent":
        assert any(path in g.fields for g in grouped)
        # a path under an array counts the array's items as its units, though only it was asked for
        assert [g.fields[path].units for g in grouped if path in g.fields] == [
            w.fields[path].units for w in whole if path in w.fields
        ]


def test_edges_of_no_length_fewer_than_two_or_decreasing(store: Store) -> None:
    cid = _cohort(store)
    t = T0 + timedelta(days=4)
    assert read_step_profiles(store, cid, []) == [] == read_step_profiles(store, cid, [t])
    same = read_step_profiles(store, cid, [t, t, t + timedelta(hours=1)])
    assert same == [read_profile(store, cid, t, t), read_profile(store, cid, t, t + timedelta(hours=1))]
    assert (same[0].events, same[0].fields) == (0, {}) and same[1].events > 0
    with pytest.raises(ValueError, match="step edges must not decrease"):
        read_step_profiles(store, cid, [t, t - timedelta(minutes=1)])
    with pytest.raises(LookupError, match="no cohort 999"):
        read_step_profiles(store, 999, [t, t + timedelta(hours=1)])
