"""Rollup tiers: outputs counted into minute, hour or day buckets by their age against their
cohort's newest data, the fold that moves buckets as they age, and reads across tiers compared
with the minute-only rollups of the same events."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from shapewatch.collector import Envelope, parse_envelope
from shapewatch.collector.rollup import ROLLUP_TABLES, RollupConfig
from shapewatch.collector.rules import LIMITS
from shapewatch.collector.store import Store
from shapewatch.collector.tiers import DAY, HOUR, Horizons, TierPolicy

MakeEnvelope = Callable[..., dict[str, Any]]
END = datetime(2026, 11, 29, tzinfo=UTC)
E = int(END.timestamp())
POLICY = TierPolicy(minute_seconds=24 * HOUR, hour_seconds=7 * DAY)
FOLDED = [*ROLLUP_TABLES, "served_models"]
SUMS = {**{t: s for t, (_, s) in ROLLUP_TABLES.items()}, "served_models": ["n"]}
KEYS = {**{t: k for t, (k, _) in ROLLUP_TABLES.items()}, "served_models": ["cohort_id", "bucket", "served_model"]}


def parse(raw: dict[str, Any]) -> Envelope:
    return parse_envelope(orjson.dumps(raw), LIMITS)


def at(seconds_before_end: float) -> str:
    return (END - timedelta(seconds=seconds_before_end)).isoformat()


# --- the policy ---------------------------------------------------------------------------------


def test_tier_bounds_are_aligned_and_starts_follow_them() -> None:
    newest = E + 37 * 60  # 00:37 on the 29th
    minute_from, hour_from = POLICY.bounds(newest)
    assert minute_from == E - 24 * HOUR  # 00:00 on the 28th: newest - 24 h, down to the hour
    assert hour_from == E - 7 * DAY  # the day of newest - 7 days
    assert POLICY.start(E + 120, newest) == (E + 120, False)
    assert POLICY.start(minute_from, newest) == (minute_from, False)
    assert POLICY.start(minute_from - 60, newest) == (minute_from - HOUR, True)
    assert POLICY.start(E - 3 * DAY + 59 * 60, newest) == (E - 3 * DAY, True)
    assert POLICY.start(hour_from, newest) == (hour_from, True)
    assert POLICY.start(hour_from - 60, newest) == (hour_from - DAY, True)
    assert POLICY.start(E - 40 * DAY + 5 * HOUR, newest) == (E - 40 * DAY, True)


@pytest.mark.parametrize(
    ("minute", "hour", "message"),
    [
        (HOUR - 60, 7 * DAY, "at least one hour"),
        (24 * HOUR, 24 * HOUR + DAY - 1, "one day further back"),
    ],
)
def test_a_policy_out_of_range_is_refused(minute: int, hour: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TierPolicy(minute, hour)


def test_a_cohorts_newest_data_only_rises_and_never_past_the_clock() -> None:
    h = Horizons(POLICY, clock=lambda: float(E))
    c = ("m", "p", "c", "production")
    h.raise_to({c: E - DAY})
    h.raise_to({c: E - 2 * DAY})
    assert h.newest(c) == E - DAY
    h.raise_to({c: int(datetime(2199, 1, 1, tzinfo=UTC).timestamp())})  # one output dated far ahead
    assert h.newest(c) == E + HOUR  # the wall clock plus an hour of slack
    assert h.coarsen(
        [("m", "p", "c", "production", None, E - 60), ("m", "p", "c", "production", None, E - 2 * DAY - 60)]
    ) == [
        (E - 60, False),
        (E - 2 * DAY - HOUR, True),
    ]
    # answered by another model: the finer tier of the two cohorts (x's newest data is that very minute)
    assert h.coarsen([("m", "p", "c", "production", "x", E - 2 * DAY - 60)]) == [(E - 2 * DAY - 60, False)]
    h.raise_to({("x", "p", "c", "production"): E})
    assert h.coarsen([("m", "p", "c", "production", "x", E - 2 * DAY - 60)]) == [(E - 2 * DAY - HOUR, True)]
    assert h.coarsen([("m", "p", "c", "production", "x", E - 9 * DAY - 60)]) == [(E - 10 * DAY, True)]


# --- counting into tiers ------------------------------------------------------------------------


def buckets(store: Store) -> dict[int, int]:
    return {int(b): int(n) for b, n in store.query("SELECT epoch(bucket)::BIGINT, events FROM cohort_buckets")}


def test_outputs_older_than_the_minute_tier_go_straight_into_hour_and_day_buckets(
    tmp_path: Path, envelope: MakeEnvelope
) -> None:
    store = Store.open(tmp_path / "t.duckdb", tiers=POLICY)
    store.write_batch([parse(envelope(ts=at(30)))])  # the cohort's newest data: 23:59:30 on the 28th
    late = [at(3 * DAY - 125), at(3 * DAY - 65), at(10 * DAY - 7 * HOUR), at(10 * DAY - 3 * HOUR), at(90)]
    store.write_batch([parse(envelope(ts=t)) for t in late])
    assert buckets(store) == {
        E - 60: 1,  # 23:59
        E - 120: 1,  # 23:58: minutes, within a day of the newest data
        E - 3 * DAY: 2,  # two outputs of 00:01 and 00:02, three days back: their hour
        E - 10 * DAY: 2,  # ten days back: their day
    }
    store.close()


def test_an_output_dated_far_ahead_does_not_push_its_cohort_into_coarse_buckets(
    tmp_path: Path, envelope: MakeEnvelope
) -> None:
    store = Store.open(tmp_path / "f.duckdb", tiers=POLICY)
    store.write_batch([parse(envelope(ts="2199-06-01T00:00:00Z"))])
    now = datetime.now(UTC)
    recent = (now - timedelta(minutes=10)).replace(second=0, microsecond=0)
    store.write_batch([parse(envelope(ts=recent.isoformat()))])
    assert int(recent.timestamp()) in buckets(store)  # still a minute bucket
    store.close()


# --- the fold, against the minute-only rollups of the same events -------------------------------


def history(envelope: MakeEnvelope, n: int, seed: int) -> list[dict[str, Any]]:
    """Two cohorts over 20 days (the second stops 12 days before the end), an alias answered by
    another model now and then, enums, numbers, arrays, and a contract version."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        model = rng.choice(["m-a", "m-a", "m-b"])
        age = rng.uniform(0, 20 * DAY) if model == "m-a" else rng.uniform(12 * DAY, 20 * DAY)
        out.append(
            envelope(
                event_id=f"h{seed}-{i}",
                ts=at(age),
                model=model,
                served_model=rng.choice([model, model, "snap-1"]),
                contract_version=rng.choice(["1", "2"]),
                output={
                    "intent": rng.choice(["refund", "bug", "billing"]),
                    "score": round(rng.random(), 3),
                    "tags": rng.sample(["a", "b", "c", "d"], rng.randrange(0, 4)),
                    **({"note": None} if rng.random() < 0.2 else {}),
                },
            )
        )
    return out


def table_sums(store: Store, table: str, coarse: dict[int, tuple[int, int]] | None = None) -> Counter[tuple[Any, ...]]:
    """A table summed per key, cohorts by name; with ``coarse`` (cohort id -> (minute_from,
    hour_from)), each bucket moved to the one the tiers give it."""
    keys = [k for k in KEYS[table] if k not in ("cohort_id", "bucket")]
    sums = SUMS[table]
    rows = store.query(
        f"SELECT t.cohort_id, c.model, epoch(t.bucket)::BIGINT, {''.join(f't.{k}, ' for k in keys)}"
        f"{', '.join(f'sum(t.{s})::BIGINT' for s in sums)} FROM {table} t JOIN cohorts c USING (cohort_id) GROUP BY ALL"
    )
    out: Counter[tuple[Any, ...]] = Counter()
    for cohort_id, model, b, *rest in rows:
        if coarse is not None and cohort_id in coarse:
            minute_from, hour_from = coarse[cohort_id]
            b = b if b >= minute_from else b - b % HOUR if b >= hour_from else b - b % DAY
        key = (model, b, *rest[: len(keys)])
        for i, s in enumerate(sums):
            out[(*key, s)] += rest[len(keys) + i]
    return +out


def totals(sums: Counter[tuple[Any, ...]]) -> Counter[tuple[Any, ...]]:
    """The sums with the bucket summed away (the second item of each key)."""
    out: Counter[tuple[Any, ...]] = Counter()
    for key, n in sums.items():
        out[(key[0], *key[2:])] += n
    return out


def bounds_by_id(store: Store) -> dict[int, tuple[int, int]]:
    return {i: (int(m.timestamp()), int(h.timestamp())) for i, (m, h) in store.tier_bounds().items()}


@pytest.mark.parametrize("seed", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_folded_tiers_hold_the_sums_of_the_minute_buckets_they_replace(
    tmp_path: Path, envelope: MakeEnvelope, seed: int
) -> None:
    raws = history(envelope, 3000, seed)
    rng = random.Random(seed)
    cfg = RollupConfig(enum_values_per_path=1000)
    minute = Store.open(tmp_path / "minute.duckdb", rollup=cfg)
    tiered = Store.open(tmp_path / "tiered.duckdb", rollup=cfg, tiers=POLICY)
    # In time order, the way a backfill arrives, then a shuffled tail of late arrivals.
    ordered = sorted(raws[:2500], key=lambda r: r["ts"]) + raws[2500:]
    for k in range(0, len(ordered), 300):
        chunk = [parse(r) for r in ordered[k : k + 300]]
        minute.write_batch(chunk)
        tiered.write_batch(chunk)
        if rng.random() < 0.4:
            tiered.fold_tiers()
    tiered.fold_tiers()
    coarse = bounds_by_id(tiered)
    ids = {m: i for i, m in tiered.query("SELECT cohort_id, model FROM cohorts")}
    assert coarse[ids["m-a"]] == POLICY.bounds(max(buckets_of(tiered, ids["m-a"])))
    for table in FOLDED:
        # (the buckets of a cohort answering an alias follow the finer tier of the two cohorts:
        # a few of its buckets may be finer than its own tier, never coarser; mapped on both sides)
        assert table_sums(tiered, table, coarse) == table_sums(minute, table, coarse_for(minute, tiered, coarse)), table
    # Outputs that arrive late for a folded range are appended to its coarse buckets; the daily
    # compaction folds those rows, and then there is one row per key before the minute tier.
    tiered.compact_by_day()
    for table in FOLDED:
        assert table_sums(tiered, table, coarse) == table_sums(minute, table, coarse_for(minute, tiered, coarse)), table
        keys = ", ".join(f"t.{k}" for k in KEYS[table])
        assert tiered.query(
            f"""SELECT count(*) FROM (SELECT {keys} FROM {table} t JOIN tier_marks m USING (cohort_id)
                WHERE t.bucket < m.minute_from GROUP BY ALL HAVING count(*) > 1)"""
        ) == [(0,)], table
    # far fewer rows
    rows = {t: tiered.query(f"SELECT count(*) FROM {t}")[0][0] for t in FOLDED}
    minute_rows = {t: minute.query(f"SELECT count(*) FROM {t}")[0][0] for t in FOLDED}
    assert sum(rows.values()) < 0.5 * sum(minute_rows.values())
    minute.close()
    tiered.close()


def buckets_of(store: Store, cohort_id: int) -> list[int]:
    return [
        int(b)
        for (b,) in store.query("SELECT epoch(bucket)::BIGINT FROM cohort_buckets WHERE cohort_id = ?", [cohort_id])
    ]


def coarse_for(minute: Store, tiered: Store, coarse: dict[int, tuple[int, int]]) -> dict[int, tuple[int, int]]:
    """The tiered store's bounds, keyed by the minute store's cohort ids (same names)."""
    by_name = {m: coarse[i] for i, m in tiered.query("SELECT cohort_id, model FROM cohorts") if i in coarse}
    return {i: by_name[m] for i, m in minute.query("SELECT cohort_id, model FROM cohorts") if m in by_name}


def test_window_reads_across_tiers_equal_the_minute_only_reads_on_aligned_windows(
    tmp_path: Path, envelope: MakeEnvelope
) -> None:
    raws = history(envelope, 2000, 7)
    cfg = RollupConfig(enum_values_per_path=1000)
    minute = Store.open(tmp_path / "minute.duckdb", rollup=cfg)
    tiered = Store.open(tmp_path / "tiered.duckdb", rollup=cfg, tiers=POLICY)
    for k in range(0, len(raws), 500):
        chunk = [parse(r) for r in raws[k : k + 500]]
        minute.write_batch(chunk)
        tiered.write_batch(chunk)
    tiered.fold_tiers()
    cohort = tiered.cohort_id("m-a", "intake-v3", "intake")
    mcohort = minute.cohort_id("m-a", "intake-v3", "intake")
    assert cohort is not None and mcohort is not None
    windows = [
        (END - timedelta(hours=1), END),  # minute tier
        (END - timedelta(minutes=17), END - timedelta(minutes=3)),  # minute tier, unaligned
        (END - timedelta(days=3), END - timedelta(days=2)),  # hour tier, aligned to hours
        (END - timedelta(days=6, hours=5), END - timedelta(days=4, hours=2)),
        (END - timedelta(days=19), END - timedelta(days=8)),  # day tier, aligned to days
        (END - timedelta(days=30), END),  # every tier
    ]
    for since, until in windows:
        a, b = tiered.window_rollups(since, until, cohort), minute.window_rollups(since, until, mcohort)
        assert (a.events[cohort], a.values, a.numbers, a.lengths) == (
            b.events[mcohort],
            {(cohort, p): v for (_, p), v in b.values.items()},
            {(cohort, p): v for (_, p), v in b.numbers.items()},
            {(cohort, p): v for (_, p), v in b.lengths.items()},
        ), (since, until)
        assert [r[1:] for r in a.fields] == [r[1:] for r in b.fields]
    minute.close()
    tiered.close()


def test_a_fold_keeps_the_value_cap_and_counts_the_rest_as_overflow(tmp_path: Path, envelope: MakeEnvelope) -> None:
    store = Store.open(tmp_path / "cap.duckdb", rollup=RollupConfig(enum_values_per_path=3), tiers=POLICY)
    # the hour before END, in minutes: each minute holds 3 values (all kept), 8 across the hour
    raws = [envelope(ts=at(60 * m + 55), output={"intent": f"v{(m + j) % 8}"}) for m in range(10) for j in range(3)]
    raws += [envelope(ts=at(60 * m + 50), output={"intent": "v0"}) for m in range(5)]
    store.write_batch([parse(r) for r in raws])
    assert store.query("SELECT count(DISTINCT bucket), count(*) FROM value_rollups") == [(10, 30 + 0)]
    store.write_batch([parse(envelope(ts=(END + timedelta(days=3)).isoformat()))])  # three days later
    store.fold_tiers()
    counts = Counter(r["output"]["intent"] for r in raws)
    kept = dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:3])
    hour = E - HOUR
    rows = store.query(
        f"SELECT value, n FROM value_rollups WHERE path = 'intent' AND epoch(bucket) = {hour} ORDER BY ALL"
    )
    assert rows == sorted(kept.items())
    ((present, overflow),) = store.query(
        f"SELECT sum(present)::BIGINT, sum(values_overflow)::BIGINT FROM field_rollups "
        f"WHERE path = 'intent' AND epoch(bucket) = {hour}"
    )
    assert (present, overflow) == (len(raws), len(raws) - sum(kept.values()))
    store.close()


def test_free_text_keeps_its_values_in_minutes_and_none_in_coarse_buckets(
    tmp_path: Path, envelope: MakeEnvelope
) -> None:
    cfg = RollupConfig(enum_values_per_path=1000, free_text_min_distinct=20)
    store = Store.open(tmp_path / "free.duckdb", rollup=cfg, tiers=POLICY)
    newest = [envelope(ts=at(30 + i), output={"note": f"recent-{i}", "kind": "k"}) for i in range(40)]
    old = [
        envelope(ts=at(3 * DAY + 60 * i), output={"note": f"old-{i}", "kind": f"k{i % 2}", "code": f"c{i % 3}"})
        for i in range(60)
    ]
    store.write_batch([parse(r) for r in newest])  # minutes: every value kept, unique as they are
    store.write_batch([parse(r) for r in old])  # hours: `note` holds 60 distinct values, once each
    values = Counter()
    for path, value, n in store.query("SELECT path, value, sum(n)::BIGINT FROM value_rollups GROUP BY ALL"):
        values[(path, value)] = n
    assert {v for (p, v) in values if p == "note"} == {f"recent-{i}" for i in range(40)}
    assert values[("kind", "k0")] == 30 and values[("code", "c2")] == 20  # enums of the old hours are kept
    overflow = dict(store.query("SELECT path, sum(values_overflow)::BIGINT FROM field_rollups GROUP BY ALL"))
    assert overflow == {"note": 60, "kind": 0, "code": 0}

    # The minutes age into hours: the fold drops the free text they held, and keeps the enum.
    store.write_batch([parse(envelope(ts=(END + timedelta(days=3)).isoformat(), output={"kind": "k"}))])
    store.fold_tiers()
    assert store.query("SELECT DISTINCT path FROM value_rollups WHERE path = 'note'") == []
    overflow = dict(store.query("SELECT path, sum(values_overflow)::BIGINT FROM field_rollups GROUP BY ALL"))
    assert overflow == {"note": 100, "kind": 0, "code": 0}
    assert store.query("SELECT sum(n)::BIGINT FROM value_rollups WHERE path = 'kind'") == [(101,)]
    store.close()


def test_tiers_and_marks_survive_a_reopen_and_a_second_fold_does_nothing(
    tmp_path: Path, envelope: MakeEnvelope
) -> None:
    path = tmp_path / "re.duckdb"
    with Store.open(path, tiers=POLICY) as store:
        store.write_batch([parse(r) for r in history(envelope, 800, 3)])
        assert store.fold_tiers() > 0
        marks = store.tier_bounds()
        rows = {t: store.query(f"SELECT count(*) FROM {t}") for t in FOLDED}
    with Store.open(path, tiers=POLICY) as store:
        assert store.tier_bounds() == marks
        assert store.fold_tiers() == 0
        assert {t: store.query(f"SELECT count(*) FROM {t}") for t in FOLDED} == rows
        # the newest data was remembered: an output three days back still goes into its hour
        store.write_batch([parse(envelope(model="m-a", ts=at(3 * DAY + 61)))])
        assert store.query(f"SELECT count(*) FROM cohort_buckets WHERE epoch(bucket) = {E - 3 * DAY - HOUR}")[0][0] >= 1


def test_a_store_without_tiers_keeps_minutes_and_its_fold_does_nothing(tmp_path: Path, envelope: MakeEnvelope) -> None:
    with Store.open(tmp_path / "plain.duckdb") as store:
        store.write_batch([parse(envelope(ts=at(30))), parse(envelope(ts=at(10 * DAY)))])
        assert store.fold_tiers() == 0
        assert sorted(buckets(store)) == [E - 10 * DAY, E - 60]
        assert store.tier_bounds() == {}


def test_tiers_need_a_bucket_width_that_divides_an_hour(tmp_path: Path) -> None:
    from shapewatch.collector.errors import StoreError

    with pytest.raises(StoreError, match="divides an hour"):
        Store.open(tmp_path / "w.duckdb", bucket_seconds=7, tiers=POLICY)


# --- bulk import ----------------------------------------------------------------------------------


def test_an_import_tiers_history_as_it_reads_it_whatever_the_end_of_the_file_holds(
    tmp_path: Path, envelope: MakeEnvelope
) -> None:
    """History written oldest first goes into hours and days as it is read (the import looked at
    the file's end first); junk at the end (not JSON, binary, a line cut by the look) costs only
    its own lines; a compressed copy of the file ends with the same rollups after the fold at the
    end of its import."""
    import gzip

    from shapewatch.collector import Limits, import_files

    raws = sorted(history(envelope, 1500, 9), key=lambda r: r["ts"])
    body = b"".join(orjson.dumps(r) + b"\n" for r in raws)
    junk = b"not json\n\xff\xfe\x00binary\n{" + b'"a":' * 10 + b"\n"
    plain = tmp_path / "history.jsonl"
    plain.write_bytes(body + junk)
    packed = tmp_path / "history.jsonl.gz"
    packed.write_bytes(gzip.compress(body + junk))
    from shapewatch.collector.ingest import _newest_at_the_end

    looked = _newest_at_the_end(plain, 60, LIMITS)  # what the import learns before reading
    last = {}
    for r in raws:
        start = int(datetime.fromisoformat(r["ts"]).timestamp()) // 60 * 60
        for model in {r["model"], r["served_model"]}:
            cohort = (model, "intake-v3", "intake", "production")
            last[cohort] = max(last.get(cohort, 0), start)
    assert looked == last
    assert _newest_at_the_end(packed, 60, LIMITS) == {}  # not seekable: folded at the end instead
    sums = {}
    for name, path in (("plain", plain), ("packed", packed)):
        store = Store.open(tmp_path / f"{name}.duckdb", tiers=POLICY)
        summary = import_files([path], store, Limits())
        assert (summary.accepted, summary.rejected) == (1500, 3)
        newest = {m: max(buckets_of(store, i)) for i, m in store.query("SELECT cohort_id, model FROM cohorts")}
        # no minute bucket before a cohort's minute tier: it was counted coarse, or folded at the end
        for cohort_id, model in store.query("SELECT cohort_id, model FROM cohorts"):
            minute_from, hour_from = POLICY.bounds(newest[model])
            starts = buckets_of(store, cohort_id)
            assert all(b % HOUR == 0 for b in starts if b < minute_from), model
            assert all(b % DAY == 0 for b in starts if b < hour_from), model
        sums[name] = {t: table_sums(store, t) for t in FOLDED}
        store.close()
    assert sums["plain"] == sums["packed"]


def test_a_long_history_folds_in_steps_that_each_move_the_boundaries_a_bounded_way(
    tmp_path: Path, envelope: MakeEnvelope
) -> None:
    """The first fold of three weeks of minute buckets runs as several transactions, the tier
    boundaries moving at most a step each, so writes get in between; each step keeps every sum, and
    stopping after one leaves a store the next fold finishes as one fold would."""
    import shutil

    raws = history(envelope, 1200, 4)
    cfg = RollupConfig(enum_values_per_path=1000)
    with Store.open(tmp_path / "stepped.duckdb", rollup=cfg) as minute:  # minute buckets only, so far
        minute.write_batch([parse(r) for r in raws])
    shutil.copy(tmp_path / "stepped.duckdb", tmp_path / "whole.duckdb")
    with Store.open(tmp_path / "whole.duckdb", rollup=cfg, tiers=POLICY) as whole:
        whole.fold_tiers(step=timedelta(days=100))  # in one step
        folded = {t: table_sums(whole, t) for t in FOLDED}
    with Store.open(tmp_path / "stepped.duckdb", rollup=cfg, tiers=POLICY) as store:  # tiers from now on
        start = min(buckets(store)) // DAY * DAY
        before = {t: totals(table_sums(store, t)) for t in FOLDED}
        store.fold_tiers(step=timedelta(days=2), max_steps=1)
        marks = bounds_by_id(store)
        assert marks and all(m <= start + 2 * DAY and h <= start + 2 * DAY for m, h in marks.values())
        assert {t: totals(table_sums(store, t)) for t in FOLDED} == before  # a step loses and doubles nothing
        store.fold_tiers(step=timedelta(days=2))  # the rest, step by step
        assert {t: table_sums(store, t) for t in FOLDED} == folded
        assert store.fold_tiers() == 0


def test_history_counted_coarse_as_it_arrived_folds_in_one_step_that_rewrites_no_row(
    tmp_path: Path, envelope: MakeEnvelope
) -> None:
    """An import learns each cohort's newest data first and counts older history straight into
    hours and days: the fold after it has nothing to move, so it reaches the tiers in one step
    (however long the history) and leaves every row as it was. (No alias here: an alias's
    served cohort takes the finer tier of the two, which its fold then moves.)"""
    raws = sorted(({**r, "served_model": r["model"]} for r in history(envelope, 1500, 5)), key=lambda r: r["ts"])
    cfg = RollupConfig(enum_values_per_path=1000)
    with Store.open(tmp_path / "imported.duckdb", rollup=cfg, tiers=POLICY) as store:
        assert store.horizons is not None
        newest: dict[tuple[str, str, str, str], int] = {}
        for r in raws:
            start = int(datetime.fromisoformat(r["ts"]).timestamp()) // 60 * 60
            cohort = (r["model"], "intake-v3", "intake", "production")
            newest[cohort] = max(newest.get(cohort, 0), start)
        store.horizons.raise_to(newest)  # as the import does, from the end of its file
        store.write_batch([parse(r) for r in raws])
        rows = {t: sorted(store.query(f"SELECT * FROM {t}"), key=repr) for t in FOLDED}
        assert store.fold_tiers(step=timedelta(days=2), max_steps=1) == 0
        ids = {m: i for i, m in store.query("SELECT cohort_id, model FROM cohorts")}
        assert bounds_by_id(store) == {ids[c[0]]: POLICY.bounds(n) for c, n in newest.items()}  # all the way
        assert {t: sorted(store.query(f"SELECT * FROM {t}"), key=repr) for t in FOLDED} == rows


def test_an_output_dated_1971_does_not_make_the_fold_step_through_fifty_years(
    tmp_path: Path, envelope: MakeEnvelope
) -> None:
    """Steps skip time that holds no rows: outputs in 1971 and last month fold in a handful of
    steps, not one per two days since 1971."""
    with Store.open(tmp_path / "plain.duckdb") as plain:  # the same outputs in minute buckets, then tiers
        plain.write_batch([parse(envelope(ts=t)) for t in ("1971-01-01T00:00:30Z", at(20 * DAY), at(5 * DAY), at(30))])
    with Store.open(tmp_path / "plain.duckdb", tiers=POLICY) as tiered:
        tiered.fold_tiers(step=timedelta(days=2), max_steps=4)
        ((minute_from, hour_from),) = bounds_by_id(tiered).values()
        assert (minute_from, hour_from) == POLICY.bounds(E - 60)  # reached the tiers within four steps
        assert sorted(buckets(tiered)) == [31_536_000, E - 20 * DAY, E - 5 * DAY, E - 60]
