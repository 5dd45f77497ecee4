"""Group commit: one thread writes, many requests share each transaction.

A request hands its validated envelopes to ``Writer.submit`` and waits on the
returned future. ``submit`` prepares them, on the request's own thread, into
the batch gathering for the next commit (rollup counts and columns: one
``BatchBuilder`` per commit, so rollups are as coarse as the commit); the
writer thread takes the oldest batch (up to a batch limit), stores it in one
transaction, and only then resolves the futures. So a 2xx always means
committed, throughput comes from sharing commits, not from answering early,
and the writer thread's own Python work is small: while it commits (DuckDB
lets go of the GIL) the requests of the next batch are parsed and prepared.

When the store defers rollups (``Store.defer_rollups``), a second thread
merges them when they are due, beside the commits: a merge writes only rollup
tables, on its own connection.

>>> writer = Writer(store, max_events=5000, max_wait=0.002, max_queued=200_000)  # doctest: +SKIP
>>> writer.start()                                                                 # doctest: +SKIP
>>> results = writer.submit(envelopes).result()                                    # doctest: +SKIP
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError

from .envelope import Envelope
from .errors import BatchTooLarge, StoreError, StoreUnavailable
from .store import BatchBuilder, Store, WriteResult

__all__ = ["RollupMerger", "Writer"]

log = logging.getLogger(__name__)


class RollupMerger:
    """A thread that merges a store's deferred rollups beside the commits.

    The committing thread calls ``wake`` after a commit; the merger merges when
    ``Store.rollups_due`` (by count, or by age: it also looks every ``tick``
    seconds), and once more at ``stop``. A merge writes only rollup tables, on
    the store's merge connection, so commits go on while it runs. A failed merge
    leaves the counts pending and the error in ``Store.last_merge_error``.

    >>> merger = RollupMerger(store); merger.start()   # doctest: +SKIP
    >>> store.write_batch(batch, merge=False); merger.wake()   # doctest: +SKIP
    >>> merger.stop()                                  # doctest: +SKIP
    """

    def __init__(self, store: Store, *, tick: float = 0.25) -> None:
        self._store = store
        self._tick = tick
        self._now = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="shapewatch-merge", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        """Merge now if rollups are due (cheap to call after every commit)."""
        if self._store.rollups_due:
            self._now.set()

    def stop(self, timeout: float | None = 30.0) -> None:
        """Merge what is pending, then end the thread (call after the last commit; None: no time limit)."""
        self._done.set()
        self._now.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.error("the rollup merge did not finish within %s s", timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _loop(self) -> None:
        # Nothing may end this loop but stop(): after the last commit, one last merge.
        while True:
            self._now.wait(self._tick)
            self._now.clear()
            done = self._done.is_set()
            try:
                if done or self._store.rollups_due:
                    self._store.merge_pending()
            except Exception:
                log.exception("unexpected error merging rollups; the merge thread carries on")
            if done:
                return


class _Gathering:
    """One commit's worth of requests, prepared as they arrive."""

    __slots__ = ("builder", "envelopes", "events", "failed", "requests")

    def __init__(self, builder: BatchBuilder) -> None:
        self.builder = builder
        self.requests: list[tuple[int, Future[list[WriteResult]]]] = []  # (events, its answer)
        # Each request's envelopes, to prepare the batch again without a request that failed
        # halfway. The request handlers hold them until their answer anyway: no memory is added.
        self.envelopes: list[Sequence[Envelope]] = []
        self.events = 0
        self.failed: BaseException | None = None  # preparing failed and could not be undone: no commit


class Writer:
    """The one thread that writes events to the store, committing requests in groups."""

    def __init__(
        self,
        store: Store,
        *,
        max_events: int = 5000,
        max_wait: float = 0.002,
        max_queued: int = 200_000,
        on_batch: Callable[[int, float], None] | None = None,
    ) -> None:
        self._store = store
        self._max_events = max_events
        self._max_wait = max_wait
        self._max_queued = max_queued
        self._on_batch = on_batch
        # Batches gathering requests, oldest first: each is prepared as its requests submit.
        self._queue: deque[_Gathering] = deque()
        self._queued_events = 0
        self._cond = threading.Condition()
        self._adding = threading.Lock()  # held by a request adding to a batch, and to take one
        self._stopping = False
        self._thread = threading.Thread(target=self._writer_loop, name="shapewatch-writer", daemon=True)
        self._merger = RollupMerger(store)
        self.last_error: str | None = None

    def start(self) -> None:
        self._thread.start()
        self._merger.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Commit what is queued, merge what is pending, then stop both threads."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.error("the writer did not finish within %s s", timeout)
        self._merger.stop(timeout)

    @property
    def queued_events(self) -> int:
        return self._queued_events

    def submit(self, envelopes: Sequence[Envelope]) -> Future[list[WriteResult]]:
        """Queue envelopes for the next commit; raises StoreUnavailable when the queue is full.

        The envelopes are prepared here, on the caller's thread, into the batch of the next
        commit (``BatchBuilder``: rollup counts and columns), so the writer thread is left
        little but the commit. Requests join a batch whole, in the order they submit.
        """
        fut: Future[list[WriteResult]] = Future()
        n = len(envelopes)
        if not n:
            fut.set_result([])
            return fut
        if n > self._max_queued:
            raise BatchTooLarge(n, self._max_queued)
        with self._adding:  # one request adds at a time; the writer takes a batch between two
            with self._cond:
                if self._stopping:
                    raise StoreUnavailable("the service is shutting down")
                if self._queued_events + n > self._max_queued:
                    raise StoreUnavailable(f"{self._queued_events} events are waiting to be written", retry_after=1)
                last = self._queue[-1] if self._queue else None
                if last is None or last.failed is not None or (last.events and last.events + n > self._max_events):
                    last = _Gathering(self._store.batch_builder())
                    self._queue.append(last)
            try:
                last.builder.add_many(envelopes)
            except Exception as exc:  # the batch holds part of this request: prepared again without it
                log.exception(
                    "preparing a request's events failed; the request is refused, the others "
                    "in its batch are prepared again"
                )
                try:
                    rebuilt = self._store.batch_builder()
                    for earlier in last.envelopes:
                        rebuilt.add_many(earlier)
                    last.builder = rebuilt  # under _adding: the writer cannot take the batch meanwhile
                except Exception:
                    log.exception("preparing the batch again failed; every request in it fails")
                    with self._cond:
                        last.failed = exc
                        self._cond.notify()
                raise StoreUnavailable(exc) from exc
            with self._cond:
                last.envelopes.append(envelopes)
                last.requests.append((n, fut))
                last.events += n
                self._queued_events += n
                self._cond.notify()
        return fut

    def _take(self) -> _Gathering | None:
        """The next batch to commit; None to stop."""
        with self._cond:
            while not self._queue and not self._stopping:
                self._cond.wait()
            if not self._queue:
                return None
            # A short wait lets concurrent requests join this commit (not when another batch is
            # already gathering behind it: this one is full).
            deadline = time.monotonic() + self._max_wait
            while (
                len(self._queue) == 1
                and self._queue[0].events < self._max_events
                and self._queue[0].failed is None
                and not self._stopping
            ):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
        with self._adding, self._cond:  # no request is halfway into it
            taken = self._queue.popleft()
            self._queued_events -= taken.events
            return taken

    def _writer_loop(self) -> None:
        # The only thread that writes events to DuckDB: one transaction per batch keeps
        # commits cheap, and a request is answered only after its batch committed.
        # Nothing may end this loop but stop(): a dead writer would hang every request.
        while True:
            try:
                if not self._step():
                    return
            except Exception:
                log.exception("unexpected error in the writer loop; it carries on")

    def _step(self) -> bool:
        """One commit; False when stopping."""
        taken = self._take()
        if taken is None:
            return False
        if not taken.requests:
            return True
        t0 = time.perf_counter()
        try:
            if taken.failed is not None:
                raise taken.failed
            # Rollups due are merged by the merge thread, beside the next commits: a merge
            # takes a few hundred milliseconds that neither these requests nor the next wait for.
            results = self._store.write_batch(taken.builder.finish(), merge=False)
        except StoreError as exc:
            self.last_error = str(exc)
            log.error("writing a batch of %d events failed: %s", taken.events, exc)
            err = exc if isinstance(exc, StoreUnavailable) else StoreUnavailable(exc)
            for _, fut in taken.requests:
                _settle(fut, error=err)
            return True
        except Exception as exc:  # a bug must fail the requests, not kill the writer
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.exception("unexpected error writing a batch")
            for _, fut in taken.requests:
                _settle(fut, error=StoreUnavailable(exc))
            return True
        self.last_error = None
        i = 0
        for n, fut in taken.requests:
            _settle(fut, result=results[i : i + n])
            i += n
        if self._on_batch is not None:
            self._on_batch(taken.events, time.perf_counter() - t0)
        self._merger.wake()
        return True

    @property
    def alive(self) -> bool:
        """Both threads run (a stopped merge thread would leave rollups behind the events)."""
        return self._thread.is_alive() and self._merger.alive


def _settle(
    fut: Future[list[WriteResult]], *, result: list[WriteResult] | None = None, error: BaseException | None = None
) -> None:
    """Resolve a request's future unless its caller gave up on it (a cancelled request).

    The events of a cancelled request are committed all the same; a retry finds them
    as duplicates.
    """
    try:
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result or [])
    except InvalidStateError:
        pass
