"""The client SDK: applications send structured outputs to the collector.

``Client.record`` is the only call on the application's hot path. It builds the
envelope, encodes it once (later changes to the caller's dict are not seen),
appends it to a bounded in-memory buffer and returns the event id; it never
raises and never waits on the network. A daemon thread batches envelopes and
posts them to ``POST {url}/v1/outputs``. Transient failures (network errors,
timeouts, 429, 5xx) are retried with capped exponential backoff and the
*same* ``event_id``: the id names the intent, not the attempt, so the service
stores and counts a retried event once.

When the buffer is full, envelopes overflow to a JSONL spill file on local
disk; the thread sends them back, oldest first, once the service accepts
again, and deletes each file once every line in it is delivered. ``close()``
(also run at interpreter exit) writes whatever is still undelivered to the
spill directory, and the next ``Client`` for the same service URL and spill
directory (in this process or a later one) sends it. Nothing is dropped unless
the disk fails; ``Client.stats`` counts every outcome.

Usage::

    from shapewatch.collector.sdk import Client

    client = Client("http://localhost:8000", token="s3cret")
    event_id = client.record(
        {"intent": "refund", "priority": "high"},
        model="claude-sonnet-4-5",
        served_model="claude-sonnet-4-5-20250929",
        prompt_version="intake-v3",
        contract="intake",
    )
    client.flush(timeout=5.0)  # optional: wait until delivered
    client.close()             # also registered with atexit

Pass your own ``event_id`` (for instance the provider's request id) when the
same output may be recorded again after a crash: the service then
deduplicates it. Without one, each ``record`` call is a new event.
"""

from __future__ import annotations

import atexit
import email.utils
import hashlib
import logging
import math
import os
import random
import sys
import tempfile
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, Final, Literal

import httpcore  # noqa: F401  imported now, not by the sender thread: see _run
import httpx
import orjson

from .accel import speedups as _speedups

__all__ = ["Client", "parse_retry_after"]

logger = logging.getLogger(__name__)

_USER_AGENT: Final = "shapewatch-sdk/0.1"
# First retry waits up to this long (full jitter), doubling per consecutive
# failure up to max_backoff.
_BACKOFF_BASE: Final = 0.25
# Spill files left by processes that have since exited (or clients that
# closed) are looked for at start-up and then this often.
_ORPHAN_SCAN_INTERVAL: Final = 30.0
# Files left by other clients that one client holds (open and locked) at a time, oldest
# first; the next are claimed as these are delivered. Claiming all at once took a file
# descriptor each: 3,000 left by short-lived processes exhausted the application's.
_MAX_CLAIMED: Final = 8
# An empty spill file this old whose owner is gone is debris from a crash
# between creating and writing it.
_EMPTY_SPILL_MAX_AGE: Final = 60.0
_REJECTIONS_LOGGED_PER_BATCH: Final = 10
_NEVER: Final = sys.maxsize

_STAT_NAMES: Final = (
    "recorded",  # record() calls
    "sent",  # accepted by the service
    "duplicate",  # already stored by the service (a retry that had landed)
    "rejected",  # refused for good: invalid locally, 4xx, or per-event rejection
    "spilled",  # envelopes written to a spill file
    "dropped",  # lost: spill write failed or a spill line was corrupt
    "retries",  # failed attempts that were retried
    "recovered",  # events read back from spill files of earlier clients
)

if sys.platform != "win32":
    import fcntl

    def _lock_file(fd: int, *, wait: bool) -> bool:
        # flock, not fcntl/lockf: flock locks belong to the open file
        # description, so two clients in one process exclude each other, and
        # the kernel releases them when the owning process dies.
        flags = fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB
        try:
            fcntl.flock(fd, flags)
        except OSError:
            return False
        return True

else:  # pragma: no cover - no advisory locks: never take over another's file

    def _lock_file(fd: int, *, wait: bool) -> bool:
        return wait


# Deeper than orjson writes (255 levels): the C walk gives up, and so would the encoder.
_MAX_DEPTH: Final = 254
_NO_LIMIT: Final = 1 << 62


def _non_finite(value: Any, path: str) -> str | None:
    """The path of a NaN or infinite float in ``value``, or None. Each container is looked
    at once (a cycle, or one shared, is not walked again: the encoder judges those)."""
    seen: set[int] = set()
    stack = [(path, value)]
    while stack:
        where, v = stack.pop()
        if isinstance(v, float):
            if not math.isfinite(v):
                return where
        elif isinstance(v, (Mapping, list, tuple)) and id(v) not in seen:
            seen.add(id(v))
            if isinstance(v, Mapping):
                stack.extend((f"{where}.{k}", x) for k, x in reversed(list(v.items())))
            else:
                stack.extend((f"{where}[{i}]", x) for i, x in reversed(list(enumerate(v))))
    return None


def _append(fd: int, data: bytes) -> None:
    """Append ``data`` to a spill file whole, or not at all: on a failed write (a full disk)
    the file is cut back to where it ended. Written to the descriptor, not through the
    buffered handle, which would keep the bytes it failed to write and raise again at its
    next seek or close (the sender's, or close()'s)."""
    end = os.fstat(fd).st_size
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view) :]
    except OSError:
        try:
            os.ftruncate(fd, end)
        except OSError:
            pass
        raise


def _format_ts(ts: datetime | str | None) -> str:
    if ts is None:
        return datetime.now(UTC).isoformat()
    if isinstance(ts, str):
        return ts
    if ts.tzinfo is None:  # documented: a naive datetime is taken as UTC
        ts = ts.replace(tzinfo=UTC)
    return ts.isoformat()


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date; a date without a
    zone is UTC), or None when absent or unreadable. ``now`` is the clock for a date."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - (now or datetime.now(UTC))).total_seconds()
    if math.isnan(seconds):
        return None
    return max(0.0, seconds)


def _error_summary(response: httpx.Response) -> str:
    """The service's ``{"error": {...}}`` message, or the start of the body."""
    try:
        payload = orjson.loads(response.content)
        error = payload["error"]
        message = str(error.get("message", ""))
        fields = error.get("fields") or []
        if fields:
            message += " [" + "; ".join(f"{f.get('path', '?')}: {f.get('reason', '?')}" for f in fields[:5]) + "]"
        return message
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        return response.text[:200]


@dataclass
class _SpillFile:
    """A locked JSONL spill file: ours (being written or drained) or claimed."""

    path: Path
    fh: BinaryIO
    # Lowest record sequence number the file may hold: flush() waits for the
    # whole file when it holds anything recorded before the flush call.
    pin: int
    own: bool
    lines: int = 0  # lines this client wrote (own files)
    offset: int = 0  # bytes delivered (or skipped as corrupt) from the start


@dataclass
class _Batch:
    """The one batch in flight; shrinks as parts of it settle."""

    parts: deque[list[bytes]]
    pin: int
    source: _SpillFile | None = None  # None: taken from memory
    end: int = 0  # offset in source after this batch
    attempts: int = 0


@dataclass(frozen=True)
class _Reply:
    kind: Literal["done", "transient", "too_large", "permanent"]
    detail: str = ""
    retry_after: float | None = None
    accepted: int = 0
    duplicate: int = 0
    rejected: int = 0
    rejections: list[tuple[str, str]] = field(default_factory=list)


_live_clients: weakref.WeakSet[Client] = weakref.WeakSet()


def _close_at_process_exit(client: Client) -> None:
    """In a multiprocessing child, close ``client`` when the child ends too: it ends with
    os._exit, which skips atexit, so events recorded there were lost. (Registered on the
    child's first use: multiprocessing clears its finalizers when the child starts.)"""
    import multiprocessing
    import multiprocessing.util

    if multiprocessing.parent_process() is not None:
        multiprocessing.util.Finalize(client, client._close_at_exit, exitpriority=10)


def _reinit_clients_after_fork() -> None:
    for client in list(_live_clients):
        client._reinit_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reinit_clients_after_fork)


# A client keeps a sender thread, an HTTP connection and an exit hook until close(): one
# made per request and never closed is a leak, said once per process from this many on.
_MANY_OPEN_CLIENTS: Final = 16
_warned_many = False


def _warn_if_many_open() -> None:
    global _warned_many
    if _warned_many:
        return
    n = sum(1 for c in list(_live_clients) if not (c._closing or c._closed))
    if n >= _MANY_OPEN_CLIENTS:
        _warned_many = True
        logger.warning(
            "shapewatch: %d clients are open in this process, each with its own sender thread "
            "until close(); create one Client and share it (record() is thread-safe)",
            n,
        )


class Client:
    """Records structured outputs and delivers them to the collector.

    Example::

        with Client("http://localhost:8000") as client:
            client.record({"priority": "low"}, model="gpt-4o", prompt_version="v7")

    ``record`` is thread-safe, cheap and never raises. ``flush`` waits until
    everything recorded so far is delivered (or rejected for good); ``close``
    flushes for up to ``timeout`` seconds, stops the sender and leaves anything
    undelivered in ``spill_dir`` for the next client.

    Parameters: ``batch_size`` envelopes per request at most; a partial batch
    is sent after ``flush_interval`` seconds. ``max_buffer`` envelopes are held
    in memory (plus one batch in flight); beyond that, envelopes are appended
    to a spill file in ``spill_dir`` (default: ``shapewatch-spill`` in the
    system temp directory). ``timeout`` applies to each HTTP request.
    Retries back off exponentially with full jitter up to ``max_backoff``
    seconds; a ``Retry-After`` from the service is honoured (capped at
    ``max_backoff``) but never shortens that backoff. ``max_attempts`` (None: unlimited) is how often a batch
    from memory is tried before it is parked in the spill file to free memory;
    spilled envelopes are retried for as long as the process lives.

    Spill files are named per service URL, so clients of different services
    sharing a directory never send each other's events. A file is locked
    (``flock``) by the client writing or sending it, and is taken over by
    another client only once that lock is gone (its client closed or its
    process died). A spilled line may be sent twice (for instance when a
    process dies mid-batch); the service counts it as a duplicate.
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        batch_size: int = 500,
        flush_interval: float = 1.0,
        max_buffer: int = 10_000,
        spill_dir: str | os.PathLike[str] | None = None,
        timeout: float = 10.0,
        max_backoff: float = 30.0,
        max_attempts: int | None = None,
    ) -> None:
        try:
            parsed = httpx.URL(url)
        except httpx.InvalidURL as exc:
            raise ValueError(f"url: not a valid URL: {url!r} ({exc})") from exc
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ValueError(f"url: expected http(s)://host[:port], got {url!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size: must be at least 1, got {batch_size}")
        if max_buffer < 1:
            raise ValueError(f"max_buffer: must be at least 1, got {max_buffer}")
        if flush_interval < 0:
            raise ValueError(f"flush_interval: must be >= 0, got {flush_interval}")
        if timeout <= 0:
            raise ValueError(f"timeout: must be > 0, got {timeout}")
        if max_backoff < 0:
            raise ValueError(f"max_backoff: must be >= 0, got {max_backoff}")
        if max_attempts is not None and max_attempts < 1:
            raise ValueError(f"max_attempts: must be None or >= 1, got {max_attempts}")

        self._url = url.rstrip("/")
        self._endpoint = self._url + "/v1/outputs"
        self._headers = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": _USER_AGENT,
        }
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._batch_size = batch_size
        self._flush_interval = flush_interval
        self._max_buffer = max_buffer
        self._timeout = timeout
        self._max_backoff = max_backoff
        self._max_attempts = max_attempts
        self._spill_dir = Path(spill_dir) if spill_dir is not None else Path(tempfile.gettempdir()) / "shapewatch-spill"
        url_key = hashlib.sha256(self._url.encode()).hexdigest()[:12]
        self._spill_prefix = f"shapewatch-{url_key}-"

        self._ssl = httpx.create_ssl_context()  # here, not on the sender thread: see _run
        self._init_state()
        with self._lock:
            # Synchronously, so that a flush() right after construction also
            # waits for what an earlier process left behind.
            self._scan_orphans()
            self._start_thread()
        atexit.register(self._close_at_exit)
        _live_clients.add(self)
        _warn_if_many_open()

    def _init_state(self) -> None:
        # RLock: a logging handler that itself calls record() from inside the
        # sender must not deadlock. Log calls are still made outside the lock
        # where that is easy.
        self._lock = threading.RLock()
        self._wake = threading.Condition(self._lock)  # the sender waits here
        self._settled = threading.Condition(self._lock)  # flush() waits here
        self._stop = threading.Event()
        self._instance = uuid.uuid4().hex[:8]
        self._file_counter = 0
        self._seq = 0
        # (sequence number, monotonic time recorded, encoded envelope)
        self._memory: deque[tuple[int, float, bytes]] = deque()
        self._inflight: _Batch | None = None
        self._files: deque[_SpillFile] = deque()  # sealed or claimed, oldest first
        self._active: _SpillFile | None = None  # where overflow is appended
        self._stats = dict.fromkeys(_STAT_NAMES, 0)
        self._flushers = 0
        self._disk_turn = False
        self._next_scan = time.monotonic() + _ORPHAN_SCAN_INTERVAL
        self._more_orphans = False  # a scan left files for later (_MAX_CLAIMED)
        self._thread: threading.Thread | None = None
        self._closing = False
        self._stopping = False
        self._closed = False  # everything undelivered has been evacuated to disk
        self._forked = False  # in a forked child, until its first use (_start_thread)
        self._left_behind = False
        self._spill_warned = False
        # Touched by the sender thread only.
        self._failures = 0

    # ------------------------------------------------------------------ API

    @property
    def stats(self) -> dict[str, int]:
        """A snapshot of the counters: recorded, sent, duplicate, rejected,
        spilled, dropped, retries, recovered."""
        with self._lock:
            return dict(self._stats)

    def record(
        self,
        output: Mapping[str, Any],
        *,
        model: str,
        prompt_version: str,
        contract: str = "default",
        ts: datetime | str | None = None,
        event_id: str | None = None,
        served_model: str | None = None,
        contract_version: str | None = None,
        source: str | None = None,
        run_id: str | None = None,
        agent_release: str | None = None,
        finish_reason: str | None = None,
        attributes: Mapping[str, str] | None = None,
    ) -> str:
        """Queue one output for delivery and return its event id.

        Never raises and never waits on the network. An output that is not a
        JSON object, or cannot be encoded, is logged and counted as rejected.
        ``ts`` defaults to now; a naive datetime is taken as UTC.
        """
        eid = event_id if event_id is not None else uuid.uuid4().hex
        try:
            if not isinstance(output, Mapping):
                self._reject(eid, f"output must be a JSON object (a dict), got {type(output).__name__}")
                return eid
            envelope: dict[str, Any] = {
                "event_id": eid,
                "ts": _format_ts(ts),
                "model": model,
                "prompt_version": prompt_version,
                "contract": contract,
                "output": output if isinstance(output, dict) else dict(output),
            }
            for key, value in (
                ("served_model", served_model),
                ("contract_version", contract_version),
                ("source", source),
                ("run_id", run_id),
                ("agent_release", agent_release),
                ("finish_reason", finish_reason),
            ):
                if value is not None:
                    envelope[key] = value
            if attributes is not None:
                envelope["attributes"] = dict(attributes)
            # orjson writes NaN and infinities as null: the number would arrive as a null,
            # which is drift the application never produced. The C walk answers for the
            # common output; only one it cannot vouch for is looked through here.
            out = envelope["output"]
            if _speedups.walk(out, _MAX_DEPTH, _NO_LIMIT, _NO_LIMIT, _NO_LIMIT) is None:
                where = _non_finite(out, "output")
                if where is not None:
                    self._reject(eid, f"{where} is NaN or infinite, which JSON cannot carry")
                    return eid
            try:
                line = orjson.dumps(envelope)
            except TypeError as exc:  # orjson.JSONEncodeError is a TypeError
                self._reject(eid, f"not JSON-serialisable: {exc}")
                return eid
            self._enqueue(line)
        except Exception as exc:  # record() must never raise into the application
            self._reject(eid, f"{type(exc).__name__}: {exc}")
        return eid

    def _reject(self, eid: str, reason: str) -> None:
        """Count an event record() could not queue, and say why (never raises)."""
        with self._lock:
            self._stats["recorded"] += 1
            self._stats["rejected"] += 1
        logger.error("shapewatch: event %s not recorded: %s", eid, reason)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything recorded so far is delivered or rejected.

        Returns True when it is, False when ``timeout`` seconds passed first
        (or the client is closed with events left in the spill directory).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            if self._closed:
                return not self._left_behind
            self._start_thread()
            target = self._seq
            self._flushers += 1
            self._wake.notify_all()  # partial batches are due now
            try:
                while self._oldest_pending() <= target:
                    if self._closed:
                        return False
                    if deadline is None:
                        self._settled.wait()
                    else:
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            return False
                        self._settled.wait(remaining)
                return True
            finally:
                self._flushers -= 1

    def close(self, timeout: float = 5.0) -> None:
        """Flush for up to ``timeout`` seconds, stop the sender, and write
        whatever is still undelivered to the spill directory. Idempotent."""
        with self._lock:
            if self._closing or self._closed:
                return
            self._closing = True
            thread = self._thread
        deadline = time.monotonic() + max(timeout, 0.0)
        try:
            self.flush(timeout)
        finally:
            with self._lock:
                self._stopping = True
                self._wake.notify_all()
            self._stop.set()
            if thread is not None and thread.is_alive() and thread is not threading.current_thread():
                # A request under way is not interrupted; if it outlives the
                # deadline, its batch is spilled here and may later arrive twice
                # (the service counts the second copy as a duplicate).
                thread.join(max(deadline - time.monotonic(), 0.05))
            with self._lock:
                try:
                    self._evacuate()
                finally:  # closed whatever the disk did: close() never raises into the caller
                    self._closed = True
                    self._settled.notify_all()
            atexit.unregister(self._close_at_exit)

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------- recording side

    def _enqueue(self, line: bytes) -> None:
        warn_spill: Path | None = None
        spill_error: OSError | None = None
        with self._lock:
            self._stats["recorded"] += 1
            self._seq += 1
            seq = self._seq
            if self._thread is None:
                self._start_thread()  # first record() in a forked child
            if self._closed:
                spill_error = self._spill_after_close(line)
            elif len(self._memory) < self._max_buffer:
                self._memory.append((seq, time.monotonic(), line))
                self._spill_warned = False
                if len(self._memory) == 1 or len(self._memory) >= self._batch_size:
                    self._wake.notify()
            else:
                spill_error = self._spill([line], seq)
                if spill_error is None and not self._spill_warned:
                    self._spill_warned = True
                    warn_spill = self._active.path if self._active else None
                self._wake.notify()
        if warn_spill is not None:
            logger.warning(
                "shapewatch: buffer full (%d events); spilling to %s until the collector catches up",
                self._max_buffer,
                warn_spill,
            )
        if spill_error is not None:
            logger.error(
                "shapewatch: could not write to spill directory %s; event lost: %s",
                self._spill_dir,
                spill_error,
            )

    def _new_spill_file(self) -> _SpillFile:
        self._spill_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._file_counter += 1
        path = self._spill_dir / (f"{self._spill_prefix}{os.getpid()}-{self._instance}-{self._file_counter:06d}.jsonl")
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND
        fd = os.open(path, flags | getattr(os, "O_BINARY", 0), 0o600)
        try:
            # Another client may hold the lock for a moment while it looks at
            # the (still empty) file; it leaves empty files alone.
            _lock_file(fd, wait=True)
            fh = os.fdopen(fd, "a+b")
        except BaseException:
            os.close(fd)
            raise
        return _SpillFile(path=path, fh=fh, pin=_NEVER, own=True)

    def _spill(self, lines: list[bytes], pin: int) -> OSError | None:
        """Append to our open spill file (under the lock)."""
        try:
            if self._active is None:
                self._active = self._new_spill_file()
            active = self._active
            _append(active.fh.fileno(), b"".join(line + b"\n" for line in lines))
        except OSError as exc:
            self._stats["dropped"] += len(lines)
            if self._active is not None:
                # Stop appending to it; the lines before this write are whole
                # and still sent.
                self._seal_active()
            return exc
        active.lines += len(lines)
        active.pin = min(active.pin, pin)
        self._stats["spilled"] += len(lines)
        return None

    def _spill_after_close(self, line: bytes) -> OSError | None:
        # After close() nobody sends from memory; a file of its own, unlocked
        # again at once, is picked up by the next client.
        try:
            spill = self._new_spill_file()
            try:
                _append(spill.fh.fileno(), line + b"\n")
            finally:
                spill.fh.close()
        except OSError as exc:
            self._stats["dropped"] += 1
            return exc
        self._stats["spilled"] += 1
        self._left_behind = True
        return None

    def _seal_active(self) -> None:
        if self._active is not None:
            self._files.append(self._active)
            self._active = None

    # ---------------------------------------------------------- bookkeeping

    def _oldest_pending(self) -> int:
        """Lowest sequence number not yet settled (under the lock)."""
        oldest = _NEVER
        if self._memory:
            oldest = self._memory[0][0]
        if self._inflight is not None:
            oldest = min(oldest, self._inflight.pin)
        for spill in self._files:
            oldest = min(oldest, spill.pin)
        if self._active is not None:
            oldest = min(oldest, self._active.pin)
        return oldest

    def _scan_orphans(self) -> None:
        """Claim spill files for our URL that no live client holds (locked)."""
        try:
            candidates = list(self._spill_dir.glob(self._spill_prefix + "*.jsonl"))
        except OSError:
            return
        known = {spill.path for spill in self._files}
        if self._active is not None:
            known.add(self._active.path)
        room = _MAX_CLAIMED - sum(1 for spill in self._files if not spill.own)
        self._more_orphans = False
        aged: list[tuple[float, Path]] = []
        for path in candidates:
            if path in known:
                continue
            try:
                aged.append((path.stat().st_mtime, path))
            except OSError:
                continue
        found: list[tuple[float, _SpillFile]] = []
        for _, path in sorted(aged):
            if len(found) >= room:
                self._more_orphans = True  # claimed as these are delivered (_finish_file)
                break
            try:
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
            except OSError:
                continue
            claimed = False
            try:
                if not _lock_file(fd, wait=False):
                    continue  # its client is alive
                st = os.fstat(fd)
                if st.st_nlink == 0:
                    continue  # delivered and removed meanwhile
                if st.st_size == 0:
                    if time.time() - st.st_mtime > _EMPTY_SPILL_MAX_AGE:
                        path.unlink(missing_ok=True)
                    continue
                spill = _SpillFile(path=path, fh=os.fdopen(fd, "rb"), pin=self._seq, own=False)
                claimed = True
                found.append((st.st_mtime, spill))
            except OSError:
                continue
            finally:
                if not claimed:
                    os.close(fd)
        for _, spill in sorted(found, key=lambda item: item[0]):
            logger.info("shapewatch: sending events left in %s", spill.path)
            self._files.append(spill)

    def _finish_file(self, spill: _SpillFile) -> None:
        # Unlink while still holding the lock, so no other client claims a
        # file that is fully delivered.
        try:
            spill.path.unlink(missing_ok=True)
        except OSError as exc:
            logger.warning(
                "shapewatch: could not remove delivered spill file %s (%s); "
                "its events will be sent again and counted as duplicates",
                spill.path,
                exc,
            )
        spill.fh.close()
        self._files.remove(spill)
        if not spill.own and self._more_orphans:
            self._next_scan = 0.0  # the next files left behind, at once
        self._settled.notify_all()

    def _read_spill_batch(self) -> _Batch | None:
        """The next batch from the oldest spill file, or None if that file
        was used up (it is then removed). Under the lock."""
        if not self._files:
            self._seal_active()
        spill = self._files[0]
        lines: list[bytes] = []
        corrupt = 0
        fh = spill.fh
        fh.seek(spill.offset)
        end = spill.offset
        while len(lines) < self._batch_size:
            raw = fh.readline()
            if not raw:
                break
            end += len(raw)
            line = raw.strip()
            if not line:
                continue
            try:
                valid = isinstance(orjson.loads(line), dict)
            except orjson.JSONDecodeError:
                valid = False
            if valid:
                lines.append(line)
            else:  # e.g. the last line of a process killed mid-write
                corrupt += 1
        if corrupt:
            self._stats["dropped"] += corrupt
            logger.error(
                "shapewatch: skipped %d unreadable line(s) in spill file %s",
                corrupt,
                spill.path,
            )
        if not lines:
            spill.offset = end
            self._finish_file(spill)
            return None
        return _Batch(parts=deque([lines]), pin=spill.pin, source=spill, end=end)

    def _take_memory_batch(self) -> _Batch:
        count = min(self._batch_size, len(self._memory))
        first = self._memory[0][0]
        lines = [self._memory.popleft()[2] for _ in range(count)]
        return _Batch(parts=deque([lines]), pin=first)

    def _park(self, batch: _Batch) -> None:
        """Move a memory batch that ran out of attempts to disk (locked)."""
        lines = [line for part in batch.parts for line in part]
        self._inflight = None
        error = self._spill(lines, batch.pin)
        if error is not None:
            logger.error(
                "shapewatch: could not park %d events in %s; lost: %s",
                len(lines),
                self._spill_dir,
                error,
            )
        self._settled.notify_all()

    def _evacuate(self) -> None:
        """Write all undelivered events to disk and release every file."""
        lines: list[bytes] = []
        pin = _NEVER
        if self._inflight is not None and self._inflight.source is None:
            lines.extend(line for part in self._inflight.parts for line in part)
            pin = self._inflight.pin
        self._inflight = None
        if self._memory:
            pin = min(pin, self._memory[0][0])
            lines.extend(item[2] for item in self._memory)
            self._memory.clear()
        if lines:
            error = self._spill(lines, pin)
            if error is not None:
                logger.error(
                    "shapewatch: could not spill %d undelivered events to %s: %s",
                    len(lines),
                    self._spill_dir,
                    error,
                )
        self._seal_active()
        left = 0
        for spill in list(self._files):
            try:
                size = os.fstat(spill.fh.fileno()).st_size
            except OSError:
                size = spill.offset + 1
            if size <= spill.offset:
                self._finish_file(spill)
            else:
                left += 1
                try:
                    spill.fh.close()  # releases the lock: the next client takes it
                except OSError:
                    pass
        self._files.clear()
        if left:
            self._left_behind = True
            logger.warning(
                "shapewatch: undelivered events left in %s; the next client for "
                "%s with this spill directory will send them",
                self._spill_dir,
                self._url,
            )

    # ------------------------------------------------------------- sending

    def _start_thread(self) -> None:
        if self._forked and not self._closing and not self._closed:
            self._forked = False
            _close_at_process_exit(self)
        if self._thread is None and not self._closing and not self._closed:
            self._thread = threading.Thread(target=self._run, name="shapewatch-sender", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        http: httpx.Client | None = None
        try:
            while True:
                try:
                    # Built here, retried on failure (no file descriptor left, say). What
                    # it would otherwise make on this thread is made by the constructor, on
                    # the caller's: httpcore (imported with this module) and the TLS context.
                    # A fork landing while this thread made either left the child's sender
                    # stuck for good (a half-imported module, OpenSSL's lock held).
                    if http is None:
                        http = httpx.Client(
                            timeout=self._timeout,
                            headers=self._headers,
                            follow_redirects=False,
                            verify=self._ssl,
                        )
                    batch = self._next_batch()
                    if batch is None:
                        return
                    self._deliver(http, batch)
                except Exception:
                    # Nothing may kill the sender (a spill file it cannot read, a
                    # bug); a batch in flight stays there and is tried again.
                    logger.exception("shapewatch: unexpected error in the sender")
                    if self._stop.wait(self._max_backoff):
                        return
        except BaseException:  # pragma: no cover - keep the thread quiet
            logger.exception("shapewatch: sender thread stopped")
        finally:
            if http is not None:
                http.close()

    def _next_batch(self) -> _Batch | None:
        with self._lock:
            while True:
                if self._stopping:
                    return None
                if self._inflight is not None:
                    return self._inflight
                now = time.monotonic()
                if now >= self._next_scan:
                    self._scan_orphans()
                    self._next_scan = now + _ORPHAN_SCAN_INTERVAL
                disk = bool(self._files) or (self._active is not None and self._active.lines > 0)
                live = False
                wait = self._next_scan - now
                if self._memory:
                    due = self._memory[0][1] + self._flush_interval
                    if len(self._memory) >= self._batch_size or self._flushers or now >= due:
                        live = True
                    else:
                        wait = min(wait, due - now)
                if disk and live:
                    # Both have work: take turns, so neither starves.
                    self._disk_turn = not self._disk_turn
                    disk = self._disk_turn
                if disk:
                    batch = self._read_spill_batch()
                    if batch is None:
                        continue
                    self._inflight = batch
                    return batch
                if live:
                    self._inflight = self._take_memory_batch()
                    return self._inflight
                self._wake.wait(max(wait, 0.0))

    def _deliver(self, http: httpx.Client, batch: _Batch) -> None:
        while batch.parts:
            lines = batch.parts[0]
            reply = self._post(http, lines)
            self._log_reply(reply, lines)
            with self._lock:
                retry = self._apply(batch, reply, lines)
                if self._closed or self._inflight is not batch:
                    return  # close() has spilled it meanwhile
                if (
                    retry
                    and self._max_attempts is not None
                    and batch.source is None
                    and batch.attempts >= self._max_attempts
                ):
                    self._park(batch)
                    return
            if retry and self._stop.wait(self._delay(reply)):
                return  # stopping: close() spills the batch
        with self._lock:
            if self._closed or self._inflight is not batch:
                return
            self._inflight = None
            if batch.source is not None:
                batch.source.offset = batch.end
            self._settled.notify_all()

    def _post(self, http: httpx.Client, lines: list[bytes]) -> _Reply:
        body = b"[" + b",".join(lines) + b"]"
        try:
            response = http.post(self._endpoint, content=body)
        except httpx.HTTPError as exc:
            return _Reply("transient", detail=f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # e.g. OSError outside httpx's mapping
            return _Reply("transient", detail=f"{type(exc).__name__}: {exc}")
        status = response.status_code
        if 200 <= status < 300:
            return self._parse_accepted(response, lines)
        if status == 413:
            return _Reply("too_large", detail=_error_summary(response))
        if status == 429 or status >= 500:
            return _Reply(
                "transient",
                detail=f"HTTP {status}: {_error_summary(response)}",
                retry_after=parse_retry_after(response.headers.get("retry-after")),
            )
        return _Reply("permanent", detail=f"HTTP {status}: {_error_summary(response)}")

    @classmethod
    def _parse_accepted(cls, response: httpx.Response, lines: list[bytes]) -> _Reply:
        try:
            payload = orjson.loads(response.content)
            results = payload.get("results")
            rejections: list[tuple[str, str]] = []
            # The totals count every event; ``results`` lists the rejected ones only up to a cap.
            counts = {key: int(payload[key]) for key in ("accepted", "duplicate", "rejected")}
            if isinstance(results, list):
                for result in results:
                    if result.get("status") == "rejected":
                        event_id = result.get("event_id")
                        index = result.get("index")
                        # The service may not name an event it could not parse; the batch position does.
                        if event_id is None and isinstance(index, int) and 0 <= index < len(lines):
                            event_id = cls._event_id_of(lines[index])
                        errors = "; ".join(
                            f"{e.get('path', '?')}: {e.get('reason', '?')}" for e in result.get("errors") or []
                        )
                        rejections.append((str(event_id), errors))
            return _Reply(
                "done",
                accepted=counts["accepted"],
                duplicate=counts["duplicate"],
                rejected=counts["rejected"],
                rejections=rejections,
            )
        except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError):
            # A 2xx means durable; only the breakdown is unknown.
            return _Reply(
                "done",
                accepted=len(lines),
                detail="unreadable reply body; counted as sent",
            )

    def _log_reply(self, reply: _Reply, lines: list[bytes]) -> None:
        # Sender thread only, outside the lock.
        if reply.kind == "transient":
            self._failures += 1
            if self._failures == 1:
                logger.warning(
                    "shapewatch: delivery to %s failed (%s); retrying with "
                    "backoff (further failures are logged at DEBUG)",
                    self._endpoint,
                    reply.detail,
                )
            else:
                logger.debug(
                    "shapewatch: delivery failed again (%d): %s",
                    self._failures,
                    reply.detail,
                )
            return
        if self._failures:
            logger.info(
                "shapewatch: delivery to %s recovered after %d failed attempts",
                self._endpoint,
                self._failures,
            )
            self._failures = 0
        if reply.kind == "done":
            if reply.detail:
                logger.warning("shapewatch: %s", reply.detail)
            for event_id, errors in reply.rejections[:_REJECTIONS_LOGGED_PER_BATCH]:
                logger.warning(
                    "shapewatch: event %s rejected by the collector: %s",
                    event_id,
                    errors,
                )
            hidden = reply.rejected - min(len(reply.rejections), _REJECTIONS_LOGGED_PER_BATCH)
            if hidden > 0:
                logger.warning("shapewatch: %d more events rejected in the same batch", hidden)
        elif reply.kind == "too_large":
            if len(lines) == 1:
                logger.error(
                    "shapewatch: event %s dropped: too large for the collector (%s)",
                    self._event_id_of(lines[0]),
                    reply.detail,
                )
        else:
            logger.error(
                "shapewatch: collector refused a batch of %d events, not retried: %s",
                len(lines),
                reply.detail,
            )

    @staticmethod
    def _event_id_of(line: bytes) -> str:
        try:
            return str(orjson.loads(line).get("event_id"))
        except (orjson.JSONDecodeError, AttributeError):
            return "?"

    def _apply(self, batch: _Batch, reply: _Reply, lines: list[bytes]) -> bool:
        """Count the reply and advance the batch (locked); True: retry it."""
        stats = self._stats
        if reply.kind == "transient":
            batch.attempts += 1
            stats["retries"] += 1
            return True
        batch.parts.popleft()
        batch.attempts = 0
        if reply.kind == "too_large" and len(lines) > 1:
            # Each half is tried on its own; halves still too large split
            # again, down to single events, which are then dropped.
            middle = len(lines) // 2
            batch.parts.appendleft(lines[middle:])
            batch.parts.appendleft(lines[:middle])
            return False
        if batch.source is not None and not batch.source.own:
            stats["recovered"] += len(lines)
        if reply.kind == "done":
            stats["sent"] += reply.accepted
            stats["duplicate"] += reply.duplicate
            stats["rejected"] += reply.rejected
        else:  # refused for good, or a single event too large
            stats["rejected"] += len(lines)
        return False

    def _delay(self, reply: _Reply) -> float:
        ceiling = min(self._max_backoff, _BACKOFF_BASE * 2 ** min(self._failures - 1, 30))
        backoff = random.uniform(0.0, ceiling)
        if reply.retry_after is not None:
            # Never sooner than asked, nor sooner than the backoff: a "Retry-After: 0"
            # (or a date in the past) from a proxy would otherwise retry in a tight loop.
            return max(min(reply.retry_after, self._max_backoff), backoff)
        return backoff

    # ---------------------------------------------------- process lifecycle

    def _close_at_exit(self) -> None:
        try:
            self.close()
        except Exception:  # pragma: no cover - never fail interpreter exit
            logger.exception("shapewatch: closing the client at exit failed")

    def _reinit_after_fork(self) -> None:
        # The child has no sender thread and shares the parent's file locks
        # and buffered events; the parent delivers those. Start afresh.
        closed = self._closed
        for spill in [*self._files, *([self._active] if self._active else [])]:
            try:
                spill.fh.close()  # the parent's lock stays: it still has the fd
            except OSError:
                pass
        self._init_state()
        self._closed = closed
        self._forked = True  # see _close_at_process_exit
        # The sender starts on the child's first record() or flush().
