"""Tests for collector.writer: group commit over a real store.

The writer is the one thread that writes; requests wait on futures that
resolve only after their transaction committed. Nothing here sleeps: tests
wait on futures, thread joins or barriers, each with a bounded timeout.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import orjson
import pytest

from shapewatch.collector.envelope import LIMITS, Envelope, parse_envelope
from shapewatch.collector.errors import StoreUnavailable
from shapewatch.collector.store import BatchBuilder, PreparedBatch, Store, WriteResult, WriteStatus
from shapewatch.collector.writer import Writer

MakeEnvelope = Callable[..., dict[str, Any]]
TIMEOUT = 30

A = WriteStatus.accepted
D = WriteStatus.duplicate
C = WriteStatus.conflict


def parse(raw: dict[str, Any]) -> Envelope:
    return parse_envelope(orjson.dumps(raw), LIMITS)


def envs(make: MakeEnvelope, n: int, prefix: str, **overrides: Any) -> list[Envelope]:
    return [parse(make(event_id=f"{prefix}-{i}", **overrides)) for i in range(n)]


def ids(results: Sequence[WriteResult] | Sequence[Envelope]) -> list[str]:
    return [r.event_id for r in results]


def count_events(store: Store) -> int:
    return int(store.query("SELECT count(*) FROM events")[0][0])


class Batches:
    """An on_batch callback recording the size of every committed batch."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self._lock = threading.Lock()

    def __call__(self, n: int, seconds: float) -> None:
        assert seconds >= 0
        with self._lock:
            self.sizes.append(n)


def run_threads(n: int, target: Callable[[int], None]) -> None:
    errors: list[BaseException] = []

    def wrapped(i: int) -> None:
        try:
            target(i)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=wrapped, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert not any(t.is_alive() for t in threads)
    assert errors == []


def test_concurrent_submits_resolve_with_results_aligned_to_their_envelopes(
    store: Store, envelope: MakeEnvelope
) -> None:
    writer = Writer(store, max_events=50, max_wait=0.002)
    writer.start()
    n_threads, per_thread = 12, 8
    shared = envs(envelope, 5, "shared")  # every thread also sends these: one accept each, overall
    collected: dict[int, list[tuple[list[Envelope], list[WriteResult]]]] = {}

    def work(t: int) -> None:
        mine = []
        for r in range(per_thread):
            batch = envs(envelope, 1 + (t + r) % 4, f"t{t}-r{r}")
            if r % 3 == 0:
                batch.insert(len(batch) // 2, shared[(t + r) % 5])
            fut = writer.submit(batch)
            mine.append((batch, fut.result(TIMEOUT)))
        collected[t] = mine

    try:
        run_threads(n_threads, work)
    finally:
        writer.stop()
    accepted: Counter[str] = Counter()
    submitted: set[str] = set()
    for t in range(n_threads):
        for batch, results in collected[t]:
            assert ids(results) == ids(batch)
            for env, res in zip(batch, results, strict=True):
                submitted.add(env.event_id)
                if env.event_id.startswith("shared"):
                    assert res.status in (A, D)
                else:
                    assert res.status is A
                if res.status is A:
                    accepted[env.event_id] += 1
    assert accepted == Counter(dict.fromkeys(submitted, 1))
    assert store.query("SELECT count(*), count(DISTINCT event_id) FROM events") == [(len(submitted), len(submitted))]
    assert writer.queued_events == 0
    assert writer.last_error is None


def test_group_commit_puts_several_requests_in_one_transaction(store: Store, envelope: MakeEnvelope) -> None:
    batches = Batches()
    writer = Writer(store, max_wait=0.05, on_batch=batches)
    writer.start()
    n, size = 20, 3
    barrier = threading.Barrier(n)
    results: dict[int, tuple[list[Envelope], list[WriteResult]]] = {}

    def work(t: int) -> None:
        batch = envs(envelope, size, f"g{t}")
        barrier.wait(TIMEOUT)
        results[t] = (batch, writer.submit(batch).result(TIMEOUT))

    try:
        run_threads(n, work)
    finally:
        writer.stop()
    for batch, res in results.values():
        assert [(r.event_id, r.status) for r in res] == [(e.event_id, A) for e in batch]
    assert sum(batches.sizes) == n * size
    assert max(batches.sizes) > size, batches.sizes  # at least one commit held several requests
    assert len(batches.sizes) < n
    assert count_events(store) == n * size


def test_batches_respect_max_events_and_keep_a_big_request_whole(store: Store, envelope: MakeEnvelope) -> None:
    batches = Batches()
    writer = Writer(store, max_events=5, max_wait=0.001, on_batch=batches)
    sizes = [3, 3, 7, 2, 1]
    futures = [writer.submit(envs(envelope, k, f"m{i}")) for i, k in enumerate(sizes)]  # queued before start
    writer.start()
    for i, (k, fut) in enumerate(zip(sizes, futures, strict=True)):
        assert ids(fut.result(TIMEOUT)) == [f"m{i}-{j}" for j in range(k)]
    writer.stop()
    assert batches.sizes == [3, 3, 7, 3]


def test_a_full_queue_refuses_with_store_unavailable(store: Store, envelope: MakeEnvelope) -> None:
    writer = Writer(store, max_queued=5)  # not started: nothing drains the queue
    first = writer.submit(envs(envelope, 3, "q0"))
    assert writer.queued_events == 3
    with pytest.raises(StoreUnavailable) as info:
        writer.submit(envs(envelope, 3, "q1"))
    assert str(info.value) == "store cannot write right now: 3 events are waiting to be written"
    assert info.value.retry_after == 1
    assert writer.queued_events == 3
    second = writer.submit(envs(envelope, 2, "q2"))  # what still fits is taken
    assert writer.queued_events == 5
    # an empty request never waits
    empty = writer.submit([])
    assert empty.done() and empty.result() == []
    writer.start()
    assert [r.status for r in first.result(TIMEOUT) + second.result(TIMEOUT)] == [A] * 5
    writer.stop()
    assert store.query("SELECT event_id FROM events ORDER BY event_id") == [
        ("q0-0",),
        ("q0-1",),
        ("q0-2",),
        ("q2-0",),
        ("q2-1",),
    ]


def test_stop_commits_what_is_queued_before_returning(store: Store, envelope: MakeEnvelope) -> None:
    # a long max_wait: stop() must not wait it out, and must not drop the queue
    writer = Writer(store, max_events=10_000, max_wait=60)
    writer.start()
    futures = [writer.submit(envs(envelope, 4, f"s{i}")) for i in range(5)]
    t0 = time.monotonic()
    writer.stop()
    assert time.monotonic() - t0 < 20
    assert all(f.done() for f in futures)
    assert [[r.status for r in f.result(0)] for f in futures] == [[A] * 4] * 5
    assert count_events(store) == 20
    with pytest.raises(StoreUnavailable) as info:
        writer.submit(envs(envelope, 1, "late"))
    assert str(info.value) == "store cannot write right now: the service is shutting down"


class SwappableStore:
    """Delegates to a store that the test can replace, as a restart of the file would."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def batch_builder(self) -> BatchBuilder:
        return self.store.batch_builder()

    def write_batch(self, batch: PreparedBatch, *, merge: bool = True) -> list[WriteResult]:
        return self.store.write_batch(batch, merge=merge)

    @property
    def rollups_due(self) -> bool:
        return self.store.rollups_due

    def merge_pending(self) -> None:
        self.store.merge_pending()


def test_a_store_error_fails_the_requests_and_the_writer_keeps_running(
    store: Store, db_path: Path, envelope: MakeEnvelope
) -> None:
    batches = Batches()
    target = SwappableStore(store)
    writer = Writer(target, max_wait=0.001, on_batch=batches)  # type: ignore[arg-type]
    writer.start()
    try:
        ok = writer.submit(envs(envelope, 2, "before")).result(TIMEOUT)
        assert [r.status for r in ok] == [A, A]

        store.close()  # the connection goes away under the writer
        failed: list[Future[list[WriteResult]]] = [writer.submit(envs(envelope, 2, f"lost{i}")) for i in range(3)]
        for fut in failed:
            exc = fut.exception(TIMEOUT)
            assert isinstance(exc, StoreUnavailable), exc
            assert "Connection already closed" in str(exc)
        assert writer.last_error is not None and "Connection already closed" in writer.last_error
        assert batches.sizes == [2]  # failed batches are not reported as committed

        # the writer thread survived: once the file is back, the same writer commits again
        target.store = Store.open(db_path)
        again = writer.submit(envs(envelope, 2, "lost0") + envs(envelope, 1, "after")).result(TIMEOUT)
        assert [(r.event_id, r.status) for r in again] == [("lost0-0", A), ("lost0-1", A), ("after-0", A)]
        assert writer.last_error is None
        assert target.store.query("SELECT event_id FROM events ORDER BY event_id") == [
            ("after-0",),
            ("before-0",),
            ("before-1",),
            ("lost0-0",),
            ("lost0-1",),
        ]
    finally:
        writer.stop()
        target.store.close()


def test_requests_are_answered_and_commits_go_on_while_rollups_merge(
    store: Store, envelope: MakeEnvelope, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch that brings deferred rollups to max_events is answered at its commit; the merge
    (hundreds of milliseconds on a busy store) runs on its own thread, and later batches commit
    while it runs. What it merged, and what was pending at stop, all end up counted."""
    import shapewatch.collector.store.merge as merge_module

    real_merge = merge_module.merge_rollups
    merging, release = threading.Event(), threading.Event()

    def held_merge(*args: Any, **kwargs: Any) -> None:
        merging.set()
        assert release.wait(TIMEOUT)
        real_merge(*args, **kwargs)

    monkeypatch.setattr(merge_module, "merge_rollups", held_merge)
    store.defer_rollups(max_events=3, max_seconds=3600)
    writer = Writer(store, max_wait=0.001)
    writer.start()
    try:
        first = writer.submit(envs(envelope, 3, "due"))
        assert [r.status for r in first.result(TIMEOUT)] == [A] * 3
        assert merging.wait(TIMEOUT)  # the merge started, and is held
        # commits go on meanwhile: a new event, and a retry of one the held merge counts
        later = writer.submit(envs(envelope, 2, "next") + envs(envelope, 1, "due")).result(TIMEOUT)
        assert [(r.event_id, r.status) for r in later] == [("next-0", A), ("next-1", A), ("due-0", D)]
        assert count_events(store) == 5
        assert store.query("SELECT count(*) FROM cohort_buckets") == [(0,)]  # nothing merged yet
        assert writer.alive
        release.set()
    finally:
        release.set()
        writer.stop()
    assert store.last_merge_error is None
    # the three of the held merge, and the two merged when the writer stopped; each once
    assert store.query("SELECT sum(events)::BIGINT FROM cohort_buckets") == [(5,)]
    assert store.query("SELECT sum(present)::BIGINT FROM field_rollups WHERE path = 'intent'") == [(5,)]


def test_a_request_that_cannot_be_prepared_fails_alone(
    store: Store, envelope: MakeEnvelope, monkeypatch: pytest.MonkeyPatch
) -> None:
    """submit prepares a request into the batch gathering for the next commit. If that fails
    halfway, the batch holds part of the request: the request is refused and the batch is
    prepared again from the requests already in it, which commit as if nothing happened (they
    used to fail with it: one bad request took every request sharing its commit down)."""
    from shapewatch.collector.rollup import RollupBatch

    add_many = RollupBatch.add_many

    def failing_add(self: RollupBatch, outputs: list[dict[str, Any] | str], *args: Any, **kwargs: Any) -> None:
        if any("boom" in output for output in outputs):  # parsed, or its JSON text
            raise RuntimeError("cannot count this output")
        add_many(self, outputs, *args, **kwargs)

    monkeypatch.setattr(RollupBatch, "add_many", failing_add)
    batches = Batches()
    writer = Writer(store, max_wait=0.001, on_batch=batches)  # not started: batches gather
    earlier = writer.submit(envs(envelope, 2, "a"))
    bad = envs(envelope, 2, "b")
    bad[1] = parse(envelope(event_id="b-1", output={"boom": True}))
    with pytest.raises(StoreUnavailable) as info:
        writer.submit(bad)
    assert str(info.value) == "store cannot write right now: cannot count this output"
    later = writer.submit(envs(envelope, 3, "c"))
    assert writer.queued_events == 5
    writer.start()
    try:
        assert ids(earlier.result(TIMEOUT)) == ["a-0", "a-1"]
        assert ids(later.result(TIMEOUT)) == ["c-0", "c-1", "c-2"]
        assert [r.status for r in writer.submit(envs(envelope, 2, "a")).result(TIMEOUT)] == [D, D]
    finally:
        writer.stop()
    # one commit of a-0, a-1 and the c's (b-0 was taken out with its request), then the repeat
    assert batches.sizes == [5, 2]
    assert store.query("SELECT event_id FROM events ORDER BY 1") == [("a-0",), ("a-1",), ("c-0",), ("c-1",), ("c-2",)]
    # the rollups count exactly the stored events: nothing of b-0, nothing twice
    assert store.query("SELECT sum(events)::BIGINT FROM cohort_buckets") == [(5,)]
    assert writer.queued_events == 0
