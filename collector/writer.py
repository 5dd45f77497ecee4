"""Group commit: one thread writes, many requests share each transaction.

A request hands its validated envelopes to ``Writer.submit`` and waits on the
returned future; the writer thread takes everything queued (up to a batch
limit), stores it in one transaction, and only then resolves the futures. So
a 2xx always means committed, and throughput comes from sharing commits, not
from answering early. When the store defers rollups (``Store.defer_rollups``),
the writer also merges them when they are due, between commits or when idle.

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
from concurrent.futures import Future

from .envelope import Envelope
from .errors import StoreError, StoreUnavailable
from .store import Store, WriteResult

__all__ = ["Writer"]

log = logging.getLogger(__name__)


class Writer:
    """The one thread that writes events to the store, committing requests in groups."""

    def __init__(self, store: Store, *, max_events: int = 5000, max_wait: float = 0.002,
                 max_queued: int = 200_000,
                 on_batch: Callable[[int, float], None] | None = None) -> None:
        self._store = store
        self._max_events = max_events
        self._max_wait = max_wait
        self._max_queued = max_queued
        self._on_batch = on_batch
        self._queue: deque[tuple[Sequence[Envelope], Future[list[WriteResult]]]] = deque()
        self._queued_events = 0
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._writer_loop, name="shapewatch-writer", daemon=True)
        self._tick = 0.25  # how often an idle writer checks whether deferred rollups are due
        self.last_error: str | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Commit what is queued, then stop the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout)

    @property
    def queued_events(self) -> int:
        return self._queued_events

    def submit(self, envelopes: Sequence[Envelope]) -> Future[list[WriteResult]]:
        """Queue envelopes for the next commit; raises StoreUnavailable when the queue is full."""
        fut: Future[list[WriteResult]] = Future()
        if not envelopes:
            fut.set_result([])
            return fut
        with self._cond:
            if self._stopping:
                raise StoreUnavailable("the service is shutting down")
            if self._queued_events + len(envelopes) > self._max_queued:
                raise StoreUnavailable(f"{self._queued_events} events are waiting to be written", retry_after=1)
            self._queue.append((envelopes, fut))
            self._queued_events += len(envelopes)
            self._cond.notify()
        return fut

    def _take(self) -> list[tuple[Sequence[Envelope], Future[list[WriteResult]]]] | None:
        """The next requests to commit; [] when idle long enough to merge rollups; None to stop."""
        with self._cond:
            while not self._queue and not self._stopping:
                if self._store.rollups_due:
                    return []
                self._cond.wait(self._tick)
            if not self._queue:
                return None
            # A short wait lets concurrent requests join this commit.
            deadline = time.monotonic() + self._max_wait
            while self._queued_events < self._max_events and not self._stopping:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            taken: list[tuple[Sequence[Envelope], Future[list[WriteResult]]]] = []
            n = 0
            while self._queue and (not taken or n + len(self._queue[0][0]) <= self._max_events):
                item = self._queue.popleft()
                taken.append(item)
                n += len(item[0])
            self._queued_events -= n
            return taken

    def _writer_loop(self) -> None:
        # The only thread that writes events to DuckDB: one transaction per batch keeps
        # commits cheap, and a request is answered only after its batch committed.
        while True:
            taken = self._take()
            if taken is None:
                self._merge_rollups()
                return
            if not taken:
                self._merge_rollups()
                continue
            batch = [e for envs, _ in taken for e in envs]
            t0 = time.perf_counter()
            try:
                results = self._store.write_batch(batch)
            except StoreError as exc:
                self.last_error = str(exc)
                log.error("writing a batch of %d events failed: %s", len(batch), exc)
                err = exc if isinstance(exc, StoreUnavailable) else StoreUnavailable(exc)
                for _, fut in taken:
                    fut.set_exception(err)
                continue
            except Exception as exc:  # a bug must fail the requests, not kill the writer
                log.exception("unexpected error writing a batch")
                for _, fut in taken:
                    fut.set_exception(StoreUnavailable(exc))
                continue
            self.last_error = None
            if self._on_batch is not None:
                self._on_batch(len(batch), time.perf_counter() - t0)
            i = 0
            for envs, fut in taken:
                fut.set_result(results[i:i + len(envs)])
                i += len(envs)
            if self._store.rollups_due:
                self._merge_rollups()

    def _merge_rollups(self) -> None:
        # Deferred rollups: events are already committed and acknowledged; if this fails
        # the counts stay pending (and are rebuilt from the events at the next open).
        try:
            self._store.flush_rollups()
        except StoreError as exc:
            self.last_error = str(exc)
            log.error("merging rollups failed: %s", exc)
