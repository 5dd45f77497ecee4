"""Deferred rollups: events commit alone, counts are merged later and rebuilt after a crash.

The invariant in every test: whatever the batching, deferral or crash, the
rollups end equal to those of the same events written with rollups committed
alongside them (the default).
"""

from __future__ import annotations

import random
from pathlib import Path

import orjson
from harness import make_envelope
from test_store import rollup_sums

from collector import Store
from collector.envelope import LIMITS, Envelope, parse_envelope

MINUTES = ["2026-11-29T12:00:10Z", "2026-11-29T12:01:20Z", "2026-11-29T12:02:30Z"]


# Outputs counted in the cohorts they were requested under (an alias's outputs count in
# their served cohort as well: rollup.py).
REQUESTED_EVENTS = "SELECT sum(events) FROM cohort_buckets WHERE cohort_id IN (SELECT cohort_id FROM events)"


def events(n: int, seed: int = 7) -> list[Envelope]:
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        output = {"priority": rnd.choice(["low", "high", "urgent"]),
                  "items": [{"k": rnd.choice("abc")} for _ in range(rnd.randint(0, 3))]}
        if rnd.random() < 0.5:
            output["tier"] = rnd.choice(["gold", None])
        env = make_envelope(event_id=f"e{i}", ts=rnd.choice(MINUTES), output=output,
                            model=rnd.choice(["m1", "m2"]))
        out.append(parse_envelope(orjson.dumps(env), LIMITS))
    return out


def reference(tmp_path: Path, evs: list[Envelope]) -> dict[str, dict[tuple[object, ...], tuple[int, ...]]]:
    with Store.open(tmp_path / "reference.duckdb") as store:
        store.write_batch(evs)
        return rollup_sums(store)


def test_deferred_rollups_wait_then_merge_to_the_same_sums(tmp_path: Path) -> None:
    evs = events(300)
    with Store.open(tmp_path / "d.duckdb") as store:
        store.defer_rollups(max_events=10_000, max_seconds=3600)
        for i in range(0, 300, 25):
            store.write_batch(evs[i:i + 25])
        assert store.query("SELECT count(*) FROM events") == [(300,)]
        assert store.query("SELECT count(*) FROM field_rollups") == [(0,)]  # not merged yet
        assert store.flush_rollups() == 300
        assert store.flush_rollups() == 0
        assert rollup_sums(store) == reference(tmp_path, evs)


def test_deferred_rollups_merge_by_themselves_past_max_events(tmp_path: Path) -> None:
    evs = events(100)
    with Store.open(tmp_path / "d.duckdb") as store:
        store.defer_rollups(max_events=40, max_seconds=3600)
        for i in range(0, 100, 10):
            store.write_batch(evs[i:i + 10])
        merged = store.query(REQUESTED_EVENTS)[0][0]
        assert merged == 80  # merged at 40 and at 80; the last 20 wait
        store.flush_rollups()
        assert rollup_sums(store) == reference(tmp_path, evs)


def test_a_crash_before_the_merge_loses_no_count(tmp_path: Path) -> None:
    evs = events(200)
    db = tmp_path / "crash.duckdb"
    store = Store.open(db)
    store.defer_rollups(max_events=120, max_seconds=3600)
    for i in range(0, 200, 20):
        store.write_batch(evs[i:i + 20])
    # 120 merged, 80 only in memory; the process dies without closing the store.
    assert store.query(REQUESTED_EVENTS) == [(120,)]
    store._con.close()  # private on purpose: this is the crash
    with Store.open(db) as reopened:  # rolls up the 80 events stored after the watermark
        assert rollup_sums(reopened) == reference(tmp_path, evs)
    with Store.open(db) as again:  # and does so once only
        assert rollup_sums(again) == reference(tmp_path, evs)


def test_duplicates_are_not_counted_when_deferred(tmp_path: Path) -> None:
    evs = events(50)
    with Store.open(tmp_path / "d.duckdb") as store:
        store.defer_rollups(max_events=10_000, max_seconds=3600)
        store.write_batch(evs[:30])
        store.write_batch(evs)  # 30 retries, 20 new
        store.flush_rollups()
        assert rollup_sums(store) == reference(tmp_path, evs)
