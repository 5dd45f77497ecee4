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

from shapewatch.collector import Store
from shapewatch.collector.envelope import LIMITS, Envelope, parse_envelope

MINUTES = ["2026-11-29T12:00:10Z", "2026-11-29T12:01:20Z", "2026-11-29T12:02:30Z"]


# Outputs counted in the cohorts they were requested under (an alias's outputs count in
# their served cohort as well: rollup.py).
REQUESTED_EVENTS = "SELECT sum(events) FROM cohort_buckets WHERE cohort_id IN (SELECT cohort_id FROM events)"


def events(n: int, seed: int = 7) -> list[Envelope]:
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        output = {
            "priority": rnd.choice(["low", "high", "urgent"]),
            "items": [{"k": rnd.choice("abc")} for _ in range(rnd.randint(0, 3))],
        }
        if rnd.random() < 0.5:
            output["tier"] = rnd.choice(["gold", None])
        env = make_envelope(event_id=f"e{i}", ts=rnd.choice(MINUTES), output=output, model=rnd.choice(["m1", "m2"]))
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
            store.write_batch(evs[i : i + 25])
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
            store.write_batch(evs[i : i + 10])
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
        store.write_batch(evs[i : i + 20])
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


def test_merges_beside_concurrent_commits_count_every_event_once(tmp_path: Path) -> None:
    """The service's writer merges on its own thread while commits go on: with a merge due
    after every few events, four submitting threads, repeats, and aliases answered by another
    model (whose served cohorts the commits create, so merges never insert a cohort), the
    rollups end equal to those of the same events written in one batch."""
    import threading

    from shapewatch.collector.writer import Writer

    rnd = random.Random(5)
    evs = []
    for i in range(600):
        served = rnd.choice(["gpt-4o-2024-08-06", "gpt-4o-2024-11-20", None])
        env = make_envelope(
            event_id=f"c{i}",
            ts=rnd.choice(MINUTES),
            model="gpt-4o",
            served_model=served,
            output={"priority": rnd.choice(["low", "high"]), "n": rnd.randint(0, 3)},
        )
        evs.append(parse_envelope(orjson.dumps(env), LIMITS))
    expected = reference(tmp_path, evs)
    store = Store.open(tmp_path / "concurrent.duckdb")
    store.defer_rollups(max_events=7, max_seconds=0.01)
    writer = Writer(store, max_events=40, max_wait=0.0005)
    writer.start()
    parts = [evs[i::4] for i in range(4)]
    errors: list[BaseException] = []

    def submit(part: list[Envelope]) -> None:
        try:
            for lo in range(0, len(part), 9):
                chunk = part[lo : lo + 9]
                statuses = {r.status.value for r in writer.submit(chunk + chunk[:1]).result(30)}
                assert statuses <= {"accepted", "duplicate"}, statuses
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=submit, args=(p,)) for p in parts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    writer.stop()
    assert errors == [] and store.last_merge_error is None
    assert store.query("SELECT count(*) FROM events") == [(600,)]
    assert rollup_sums(store) == expected
    store.close()
