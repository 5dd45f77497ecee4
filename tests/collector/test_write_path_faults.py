"""Faults around the write path: leaks, cancelled requests, failed merges, a clock gone back."""

from __future__ import annotations

import gc
import resource
import weakref
from concurrent.futures import Future
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import orjson
import pytest
from harness import make_envelope

from shapewatch.collector import Store
from shapewatch.collector.envelope import LIMITS, Envelope, parse_envelope
from shapewatch.collector.errors import BatchTooLarge, StoreError, StoreInvalidated, StoreUnavailable
from shapewatch.collector.rollup import RollupBatch, RollupConfig
from shapewatch.collector.store import WriteStatus
from shapewatch.collector.writer import Writer


def envs(n: int, prefix: str) -> list[Envelope]:
    return [parse_envelope(orjson.dumps(make_envelope(event_id=f"{prefix}{i}")), LIMITS) for i in range(n)]


def test_a_rollup_batch_is_freed_once_dropped() -> None:
    gc.collect()
    batch = RollupBatch(RollupConfig(), bucket_seconds=60)
    batch.add({"a": [{"b": "x"}]}, ("m", "p", "c", "production"), datetime(2026, 11, 29, tzinfo=UTC))
    batch.tables()
    ref = weakref.ref(batch)
    del batch
    assert ref() is None  # freed by reference counting alone: no cycle through the C accumulator


def test_the_writer_survives_a_request_that_gave_up(store: Store) -> None:
    writer = Writer(store, max_wait=0.05)
    writer.start()
    try:
        abandoned = writer.submit(envs(3, "a"))
        assert abandoned.cancel()  # what asyncio does to the future when the request is cancelled
        later = writer.submit(envs(2, "b"))
        assert [r.status for r in later.result(timeout=30)] == [WriteStatus.accepted] * 2
        assert writer.alive
        # the abandoned events were committed all the same: a retry finds them
        again = writer.submit(envs(3, "a"))
        assert [r.status for r in again.result(timeout=30)] == [WriteStatus.duplicate] * 3
    finally:
        writer.stop()


def test_a_request_larger_than_the_queue_is_refused_outright(store: Store) -> None:
    writer = Writer(store, max_queued=5)
    with pytest.raises(BatchTooLarge) as info:
        writer.submit(envs(6, "x"))
    assert str(info.value) == "the request holds 6 events; send at most 5 per request"


def test_a_failed_merge_after_the_commit_does_not_fail_the_events(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store.open(db_path)
    store.defer_rollups(max_events=1, max_seconds=3600)

    def broken(*args: object, **kwargs: object) -> None:
        raise StoreError("merging rollups", "simulated failure")

    monkeypatch.setattr("shapewatch.collector.store.merge.merge_rollups", broken)
    results = store.write_batch(envs(4, "e"))
    assert [r.status for r in results] == [WriteStatus.accepted] * 4  # committed, so acknowledged
    assert store.last_merge_error == "store error while merging rollups: simulated failure"
    assert store.query("SELECT count(*) FROM events") == [(4,)]
    monkeypatch.undo()
    assert store.flush_rollups() == 4  # the counts waited, and merge once the store can
    assert store.last_merge_error is not None  # cleared by the next successful merge after a commit
    store.write_batch(envs(1, "f"))
    assert store.last_merge_error is None
    assert store.query("SELECT sum(events) FROM cohort_buckets") == [(5,)]
    store.close()


def test_received_at_keeps_growing_after_a_restart_with_the_clock_behind(db_path: Path) -> None:
    later = datetime(2030, 1, 1, tzinfo=UTC)
    with Store.open(db_path) as store:
        store.write_batch(envs(2, "a"), now=later)
    with Store.open(db_path) as store:
        store.defer_rollups(max_events=10_000, max_seconds=3600)
        store.write_batch(envs(2, "b"), now=later - timedelta(days=365))  # the clock went back a year
        received = dict(store.query("SELECT event_id, epoch_us(received_at) FROM events"))
        assert min(received["b0"], received["b1"]) > max(received["a0"], received["a1"])
        store._con.close()  # crash before the deferred merge (private on purpose)
    with Store.open(db_path) as store:  # the two later events are rolled up at open
        assert store.query("SELECT sum(events) FROM cohort_buckets") == [(4,)]


def test_a_cancelled_future_is_not_an_error_for_settle() -> None:
    from shapewatch.collector.writer import _settle

    fut: Future[list[object]] = Future()
    fut.cancel()
    _settle(fut, result=[])  # type: ignore[arg-type]  # must not raise InvalidStateError
    assert fut.cancelled()


def test_a_duckdb_error_outside_the_batch_transaction_is_a_store_error(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A new cohort is inserted in a statement of its own, before the batch's transaction.
    def failing(*_: object) -> None:
        raise duckdb.IOException('Could not write file "x.wal": No space left on device')

    monkeypatch.setattr(store, "_cohort_ids", failing)
    with pytest.raises(StoreUnavailable, match="No space left on device"):
        store.write_batch(envs(2, "c"))
    writer = Writer(store, max_wait=0.01)
    writer.start()
    try:
        with pytest.raises(StoreUnavailable):
            writer.submit(envs(2, "d")).result(timeout=30)
        assert writer.last_error is not None and "No space left on device" in writer.last_error
    finally:
        writer.stop()


def test_an_invalidated_database_is_remembered_and_reported_once(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    told: list[StoreInvalidated] = []
    store.on_invalidated = told.append

    def fatal(*_: object) -> None:
        raise duckdb.FatalException("FATAL Error: Failed to create checkpoint because of error: File too large")

    monkeypatch.setattr(store, "_cohort_ids", fatal)
    for _ in range(2):
        with pytest.raises(StoreInvalidated) as info:
            store.write_batch(envs(1, "f"))
    assert str(info.value).startswith(
        "DuckDB invalidated the database after a fatal error while writing a batch "
        "(FATAL Error: Failed to create checkpoint because of error: File too large)"
    )
    assert told == [store.invalidated] and store.invalidated is not None


def test_a_read_that_meets_an_invalidated_database_reports_it_once(store: Store) -> None:
    """A read can be the first statement to meet an invalidated database (a checkpoint ran on
    another connection): it must stop the service as a failed write does. The invalidation is
    real: a checkpoint that cannot grow the file (a file-size limit; Python ignores SIGXFSZ, so
    the write fails with EFBIG)."""
    store.write_batch(envs(2000, "r"))
    store.checkpoint()
    told: list[StoreInvalidated] = []
    store.on_invalidated = told.append
    other = store.cursor()  # in the WAL, more than the file has room for: the checkpoint must grow it
    other.execute("CREATE TABLE scratch AS SELECT md5(i::VARCHAR) AS s FROM range(100000) r(i)")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (store.path.stat().st_size, hard))
    try:
        with pytest.raises(duckdb.FatalException, match="Failed to create checkpoint"):
            other.execute("CHECKPOINT")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    for _ in range(2):
        with pytest.raises(
            StoreInvalidated, match=r"^DuckDB invalidated the database after a fatal error while reading"
        ):
            store.pending_notifications(["pager"])
    assert told == [store.invalidated] and store.invalidated is not None
    with pytest.raises(StoreInvalidated):
        store.write_batch(envs(1, "w"))
    assert len(told) == 1


def test_a_failure_after_the_commit_neither_fails_the_batch_nor_loses_its_counts(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Store.open(db_path) as store:
        store.defer_rollups(max_events=10**6, max_seconds=3600)

        def failing() -> None:
            raise duckdb.OutOfMemoryException("could not set the memory limit")

        monkeypatch.setattr(store, "_fit_memory", failing)
        store._memory_until = 0  # due now
        assert [r.status for r in store.write_batch(envs(3, "m"))] == [WriteStatus.accepted] * 3
        store.flush_rollups()
        assert store.query("SELECT sum(events)::INT FROM cohort_buckets") == [(3,)]
