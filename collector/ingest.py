"""Bulk import of JSONL and .jsonl.gz files, streamed in constant memory.

Lines are parsed and validated on the calling thread while a second thread
stores the previous batch (DuckDB releases the GIL while it works), so the
two cores are both busy. Rejected lines go, with their line number and
reasons, to a quarantine file beside the database; nothing is dropped.

A line without an ``event_id`` gets one derived from the file's absolute path,
the line number and the line's bytes: importing the same file again (grown
at the end, or with quarantined lines fixed in place) adds nothing twice,
and same-named files in different folders never collide. A moved or renamed
file is a new file.

>>> summary = import_files([Path("outputs.jsonl")], store)   # doctest: +SKIP
>>> summary.as_dict()["accepted"]                            # doctest: +SKIP
"""

from __future__ import annotations

import gc
import gzip
import hashlib
import io
import queue
import threading
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from operator import attrgetter
from pathlib import Path
from typing import IO, Any

import orjson

from .envelope import Limits, parse_envelope
from .errors import EnvelopeInvalid, FieldError, ImportInputError, StoreError
from .store import PreparedBatch, Store, WriteStatus

__all__ = ["ImportSummary", "import_files", "quarantine_path"]

_BATCH = 40_000
# Prepared batches waiting for the storing thread. With room for two, reading goes on through
# a rollup merge (every fourth batch stores for about a second): 1M lines took 27.9-28.3 s
# against 28.9-29.4 s with room for one, peak RSS 20-50 MB higher; with three, 27.5 s and
# 120-140 MB higher (bench/README.md).
_QUEUED_BATCHES = 2
_READ_BLOCK = 1 << 22
_STATUS = attrgetter("status")


@dataclass
class ImportSummary:
    accepted: int = 0
    duplicate: int = 0
    rejected: int = 0
    rejected_by_reason: Counter[str] = field(default_factory=Counter)
    quarantine: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"accepted": self.accepted, "duplicate": self.duplicate, "rejected": self.rejected,
                "rejected_by_reason": dict(sorted(self.rejected_by_reason.items())),
                "quarantine": self.quarantine}


def quarantine_path(db_path: Path, source: Path) -> Path:
    """Where the rejected lines of ``source`` go: beside the database, one file per input path."""
    where = hashlib.blake2b(str(source.resolve()).encode(), digest_size=4).hexdigest()
    return db_path.parent / "quarantine" / f"{source.name}.{where}.rejected.jsonl"


def _open(path: Path) -> IO[bytes]:
    raw = path.open("rb")
    if path.suffix == ".gz":
        return io.BufferedReader(gzip.GzipFile(fileobj=raw), buffer_size=1 << 20)
    return raw


class _Lines:
    """The numbered lines of a file; a read fault (a truncated or corrupt .gz) ends them
    and is kept in ``error``, so what was read before it is still stored."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.error: BaseException | None = None

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        """(line number, line without its newline); a last line without one is a line too."""
        n = 0
        try:
            with _open(self.path) as f:
                # Blocks, not lines: each read lets go of the GIL, and a thread waiting for it
                # (the store's) takes it. Read line by line, the reading thread spent about a
                # seventh of its time getting it back (measured during a 1M-line import).
                unfinished: list[bytes] = []
                while block := f.read(_READ_BLOCK):
                    lines = block.split(b"\n")
                    if unfinished:
                        lines[0] = b"".join([*unfinished, lines[0]])
                        unfinished = []
                    last = lines.pop()
                    if last:
                        unfinished.append(last)
                    for line in lines:
                        n += 1
                        yield n, line
                if unfinished:
                    yield n + 1, b"".join(unfinished)
        except (OSError, EOFError, zlib.error) as exc:
            self.error = exc


def _line_id(prefix: str, n: int, line: bytes) -> str:
    return f"{prefix}:{n}:{hashlib.blake2b(line, digest_size=8).hexdigest()}"


def _file_key(path: Path) -> str:
    return hashlib.blake2b(str(path.resolve()).encode(), digest_size=8).hexdigest()


def import_files(paths: list[Path], store: Store, limits: Limits, *,
                 progress: Callable[[int], None] | None = None, batch_size: int = _BATCH) -> ImportSummary:
    """Import every file; return the summary. Raises StoreError if the store fails."""
    summary = ImportSummary()
    # Parsed JSON holds no reference cycles, so the cyclic collector only costs here:
    # with a batch of parsed outputs alive it rescans them over and over (measured:
    # validation 1.7x slower). Reference counting still frees everything.
    was_enabled = gc.isenabled()
    gc.disable()
    # Rollups of several batches are merged at once (and at the end); a crash before a
    # merge is repaired from the stored events when the file is next opened.
    store.defer_rollups(max_events=4 * batch_size, max_seconds=float("inf"))
    try:
        for path in paths:
            _import_one(path, store, limits, summary, progress, batch_size)
        store.flush_rollups()
    finally:
        if was_enabled:
            gc.enable()
    return summary


def _import_one(path: Path, store: Store, limits: Limits, summary: ImportSummary,
                progress: Callable[[int], None] | None, batch_size: int) -> None:
    qpath = quarantine_path(store.path, path)
    qpath.parent.mkdir(parents=True, exist_ok=True)
    rejected_here = 0
    prefix = _file_key(path)
    # The reading thread validates and prepares (columns, rollup counts); this thread only
    # runs the transaction, during which DuckDB releases the GIL.
    # Each batch travels with the line number and bytes of each envelope, so a line the
    # store refuses (an event_id reused with another payload) is quarantined like the rest.
    todo: queue.Queue[tuple[PreparedBatch, list[tuple[int, bytes]]] | None] = queue.Queue(maxsize=_QUEUED_BATCHES)
    failure: list[BaseException] = []
    conflicts: list[bytes] = []

    def store_batches() -> None:
        while (item := todo.get()) is not None:
            if failure:
                continue
            batch, origin = item
            try:
                results = store.write_batch(batch)
                if len(results) != len(origin):
                    raise RuntimeError(f"the store answered {len(results)} results for {len(origin)} lines")
                # Counted in C (this thread's Python takes the GIL from the reading thread, the
                # import's busiest); only a batch with conflicts is walked result by result.
                counts = Counter(map(_STATUS, results))
                summary.accepted += counts[WriteStatus.accepted]
                summary.duplicate += counts[WriteStatus.duplicate]
                if counts[WriteStatus.conflict]:  # counted by the reading thread after the join
                    conflicts.extend(
                        _quarantine_line(path, n, [FieldError(
                            "event_id", "already stored with a different payload", "conflict")], raw)
                        for r, (n, raw) in zip(results, origin, strict=True) if r.status is WriteStatus.conflict)
            except BaseException as exc:  # handed to the reading thread, which re-raises
                failure.append(exc)

    worker = threading.Thread(target=store_batches, name="shapewatch-import", daemon=True)
    worker.start()
    now = datetime.now(UTC)
    # Each envelope goes into the batch as soon as it is parsed, and its parsed output is
    # counted and let go then (see BatchBuilder).
    batch = store.batch_builder()
    origin: list[tuple[int, bytes]] = []
    reader = _Lines(path)
    try:
        with qpath.open("wb") as quarantine:
            unreported = 0
            for n, line in reader:
                unreported += len(line) + 1
                if progress is not None and unreported >= 1 << 20:
                    progress(unreported)  # per MiB, not per line: a call per line costs a few %
                    unreported = 0
                stripped = line.strip()
                if not stripped:
                    continue
                try:
                    batch.add(parse_envelope(stripped, limits, now=now,
                                             default_id=partial(_line_id, prefix, n, stripped)))
                    origin.append((n, stripped))
                except EnvelopeInvalid as exc:
                    rejected_here += 1
                    summary.rejected += 1
                    for code in {f.code for f in exc.fields}:
                        summary.rejected_by_reason[code] += 1
                    quarantine.write(_quarantine_line(path, n, exc.fields, stripped))
                if len(batch) >= batch_size:
                    todo.put((batch.finish(), origin))
                    batch, origin = store.batch_builder(), []
                    if failure:
                        break
            if progress is not None and unreported:
                progress(unreported)
            if len(batch) and not failure:
                todo.put((batch.finish(), origin))
            todo.put(None)
            worker.join()
            rejected_here += len(conflicts)
            summary.rejected += len(conflicts)
            if conflicts:
                summary.rejected_by_reason["conflict"] += len(conflicts)
            quarantine.writelines(conflicts)
    finally:
        if worker.is_alive():
            todo.put(None)
            worker.join()
    if failure:
        cause = failure[0]
        qpath.unlink(missing_ok=True)
        raise cause if isinstance(cause, StoreError) else StoreError(f"importing {path}", cause)
    if reader.error is not None:  # what was read before the fault is stored; a rerun adds the rest
        raise ImportInputError(path, reader.error)
    if rejected_here:
        summary.quarantine.append(str(qpath))
    else:
        qpath.unlink(missing_ok=True)


def _quarantine_line(path: Path, n: int, fields: list[FieldError], raw: bytes) -> bytes:
    return orjson.dumps({"file": str(path), "line": n, "errors": [f.as_dict() for f in fields],
                         "raw": raw.decode("utf-8", errors="replace")}) + b"\n"
