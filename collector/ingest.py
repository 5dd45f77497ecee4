"""Bulk import of JSONL and .jsonl.gz files, streamed in constant memory.

Three threads share the work. The calling thread reads the file a block at a
time and hands each block's lines to C (``_speedups.scan_lines``: envelope
rules, canonical output text, payload hash), which declines anything that is
not plainly valid to the reference path here; it then prepares batches
(columns, rollup counts). A second thread stores each batch as it comes, a
row group's worth (122,880 events) per transaction, and a third merges the
rollups of committed transactions; DuckDB releases the GIL while it works, so
both cores are busy. Rejected lines go, with their line number and reasons, to
a quarantine file beside the database; nothing is dropped. A line the store
refuses as a conflict is read again from the file for it at the end, so no
line's bytes are held while its batch waits to be stored.

A line without an ``event_id`` gets one derived from the file's absolute path,
the line number and the line's bytes: importing the same file again (grown
at the end, or with quarantined lines fixed in place) adds nothing twice,
and same-named files in different folders never collide. A moved or renamed
file is a new file.

>>> summary = import_files([Path("outputs.jsonl")], store)   # doctest: +SKIP
>>> summary.as_dict()["accepted"]                            # doctest: +SKIP
"""

from __future__ import annotations

import base64
import gc
import hashlib
import queue
import sys
import tempfile
import threading
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from operator import attrgetter
from pathlib import Path
from typing import IO, Any

import orjson

from .accel import speedups
from .envelope import Envelope, Limits, parse_envelope
from .errors import EnvelopeInvalid, FieldError, ImportInputError, QuarantineUnwritable, StoreError
from .rules import PRODUCTION
from .rules import line_id as _line_id
from .store import PreparedBatch, Store, WriteStatus

__all__ = ["ImportSummary", "import_files", "quarantine_path"]

_BATCH = 30_720
# Batches stored per transaction: 4 x 30,720 is one DuckDB row group (122,880 rows), which
# DuckDB writes into the file as it goes instead of into its log and again at the next
# checkpoint (Store.write_batches).
_TX_BATCHES = 4
# Prepared batches waiting for the storing thread while it stores a transaction's (reading goes on).
_QUEUED_BATCHES = 2
# 1 MiB: a 4 MiB block is a fresh allocation the kernel maps and zeroes each time (reading a
# 167 MB file in 4 MiB blocks took 0.58 s, in 1 MiB blocks 0.19 s; measured).
_READ_BLOCK = 1 << 20
# Envelopes are added to their batch this many at a time (BatchBuilder.add_many): its bookkeeping
# then loops in C, while a parsed output (one the C scanner declined) is let go soon after.
_ADD_EVERY = 1024
_STATUS = attrgetter("status")
# Transactions whose rollups may wait for the merging thread before the storing thread merges them
# itself (it never did in the 1M-line bench: merging takes less CPU than storing).
_PENDING_TRANSACTIONS = 3
_SWITCH_INTERVAL = 0.0005


@dataclass
class ImportSummary:
    accepted: int = 0
    duplicate: int = 0
    rejected: int = 0
    rejected_by_reason: Counter[str] = field(default_factory=Counter)
    quarantine: list[str] = field(default_factory=list)
    # files that could not be read to their end (what was read before the fault is counted above)
    unreadable: list[ImportInputError] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "accepted": self.accepted,
            "duplicate": self.duplicate,
            "rejected": self.rejected,
            "rejected_by_reason": dict(sorted(self.rejected_by_reason.items())),
            "quarantine": self.quarantine,
            "unreadable": [{"file": str(e.path), "error": str(e)} for e in self.unreadable],
        }


def quarantine_path(db_path: Path, source: Path) -> Path:
    """Where the rejected lines of ``source`` go: beside the database, one file per input path."""
    where = hashlib.blake2b(str(source.resolve()).encode(), digest_size=4).hexdigest()
    return db_path.parent / "quarantine" / f"{source.name}.{where}.rejected.jsonl"


_GZ_CHUNK = 1 << 18
_BOM = b"\xef\xbb\xbf"


class _Lines:
    """The numbered lines of a file; a read fault (a truncated or corrupt .gz) ends them
    and is kept in ``error``, so what was read before it is still stored. ``consumed``: the
    bytes of the file read so far (compressed ones for .gz), for a progress bar."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.error: BaseException | None = None
        self.consumed = 0

    def _gz_blocks(self, f: IO[bytes]) -> Iterator[bytes]:
        """The decompressed text of a .gz file, at most _READ_BLOCK bytes at a time, none empty."""
        # zlib by hand, not GzipFile: a GzipFile read that meets a truncated or corrupt stream
        # raises and drops what it had decompressed, up to a whole block of lines. Here every
        # byte decompressed before the fault is handed on.
        d = zlib.decompressobj(31)
        fed = False  # d has taken input: a file may not end inside it
        out = 0  # bytes decompressed so far
        pending = b""
        while True:
            if not pending:
                pending = f.read(_GZ_CHUNK)
                self.consumed += len(pending)
                if not pending:
                    break
            try:
                data = d.decompress(pending, _READ_BLOCK)
            except zlib.error as exc:
                raise OSError(
                    f"not a gzip file ({exc})" if not out else f"corrupt gzip data after {out:,} bytes ({exc})"
                ) from None
            out += len(data)
            fed = True
            pending = d.unconsumed_tail
            if d.eof:  # a member ends; another may follow (concatenated .gz files are one)
                pending = d.unused_data
                d = zlib.decompressobj(31)
                fed = False
            if data:
                yield data
        if fed:
            raise EOFError("compressed file ended before the end-of-stream marker was reached")

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        """(line number, line without its newline); a last line without one is a line too.
        A UTF-8 byte order mark before the first line is not part of it."""
        n = 0
        for chunk in self.chunks():
            lines = bytes(chunk).split(b"\n")
            if not lines[-1]:  # the chunk ends with its last line's newline
                lines.pop()
            for line in lines:
                n += 1
                yield n, line

    def chunks(self) -> Iterator[bytes | memoryview]:
        """The text of the file a block at a time, each cut after a newline (a line is never
        split between two; only the last may end without one), so that the import reads a
        block's lines with one call into C, and no Python object is made for a line.

        A block is a view of one buffer that the next block overwrites: use it, or copy it,
        before asking for the next. The file is read into that buffer (and a line begun at the
        end of a block moved to its front), not into a new object a block: a 1M-line import
        spent about 0.4 s of its reading thread's time on a copy of each block, to put the line
        begun before in front, and on the kernel mapping fresh pages for each (measured)."""
        try:
            with self.path.open("rb") as f:
                # Blocks, not lines: each read lets go of the GIL, and a thread waiting for it
                # (the store's) takes it. Read line by line, the reading thread spent about a
                # seventh of its time getting it back (measured during a 1M-line import).
                fill = self._gz_fill(f) if self.path.suffix == ".gz" else self._plain_fill(f)
                buf = bytearray(2 * _READ_BLOCK)
                held = 0  # buf[:held]: a line begun in earlier blocks (or the start of a BOM)
                first = True
                while True:
                    if len(buf) - held < _READ_BLOCK:  # a line longer than the buffer so far
                        # a new buffer, not a resized one: a block handed out may still be viewed
                        bigger = bytearray(2 * len(buf))
                        bigger[:held] = buf[:held]
                        buf = bigger
                    got = fill(memoryview(buf)[held : held + _READ_BLOCK])
                    if not got:
                        break
                    end = held + got
                    if first:
                        if end < len(_BOM) and _BOM.startswith(buf[:end]):
                            held = end  # too short to tell yet
                            continue
                        first = False
                        if buf.startswith(_BOM):
                            end -= len(_BOM)
                            buf[:end] = buf[len(_BOM) : end + len(_BOM)]
                    cut = buf.rfind(b"\n", 0, end) + 1
                    if cut:
                        yield memoryview(buf)[:cut]
                        buf[: end - cut] = buf[cut:end]
                    held = end - cut
                if held:
                    yield bytes(buf[:held])
        except (OSError, EOFError, zlib.error) as exc:
            self.error = exc

    def _plain_fill(self, f: IO[bytes]) -> Callable[[memoryview], int]:
        def fill(into: memoryview) -> int:
            got = f.readinto(into) or 0  # type: ignore[attr-defined]  # a file opened "rb" has it
            self.consumed += got
            return got

        return fill

    def _gz_fill(self, f: IO[bytes]) -> Callable[[memoryview], int]:
        blocks = self._gz_blocks(f)

        def fill(into: memoryview) -> int:
            data = next(blocks, b"")
            into[: len(data)] = data
            return len(data)

        return fill


def _file_key(path: Path) -> str:
    return hashlib.blake2b(str(path.resolve()).encode(), digest_size=8).hexdigest()


def import_files(
    paths: list[Path],
    store: Store,
    limits: Limits,
    *,
    progress: Callable[[int], None] | None = None,
    batch_size: int = _BATCH,
    summary: ImportSummary | None = None,
    tx_batches: int = _TX_BATCHES,
) -> ImportSummary:
    """Import every file (a path given twice, once); return the summary.

    A file that cannot be read to its end is listed in ``unreadable``, the lines read before
    the fault stored, and the import goes on with the next file. Raises StoreError if the
    store fails, QuarantineUnwritable if rejected lines cannot be written (before any line of
    that file is stored); a ``summary`` given is filled as the import goes, so a caller can
    still say what the files before the failure added.
    """
    first: dict[Path, Path] = {}
    for path in paths:
        first.setdefault(path.resolve(), path)
    summary = ImportSummary() if summary is None else summary
    # Parsed JSON holds no reference cycles, so the cyclic collector only costs here:
    # with a batch of parsed outputs alive it rescans them over and over (measured:
    # validation 1.7x slower). Reference counting still frees everything.
    was_enabled = gc.isenabled()
    gc.disable()
    # The storing and merging threads take the GIL back after each DuckDB call; at the default
    # 5 ms switch interval they waited for it behind the reading thread (1M lines in-process,
    # 9.03 s at 5 ms against 8.62 s at 0.5 ms, with the reading thread no longer waiting for them).
    switch = sys.getswitchinterval()
    sys.setswitchinterval(_SWITCH_INTERVAL)
    # Rollups of several batches are merged at once (and at the end); a crash before a
    # merge is repaired from the stored events when the file is next opened.
    store.defer_rollups(max_events=tx_batches * batch_size, max_seconds=float("inf"))
    try:
        if store.horizons is not None:
            for path in first.values():
                store.horizons.raise_to(_newest_at_the_end(path, store.bucket_seconds, limits))
        for path in first.values():
            try:
                _import_one(path, store, limits, summary, progress, batch_size, tx_batches)
            except ImportInputError as exc:
                summary.unreadable.append(exc)
        store.flush_rollups()
        store.fold_tiers()
    finally:
        if was_enabled:
            gc.enable()
        sys.setswitchinterval(switch)
    return summary


def _newest_at_the_end(path: Path, bucket_seconds: int, limits: Limits) -> dict[tuple[str, str, str, str], int]:
    """The newest bucket start per cohort among the valid lines of the file's last ``_TAIL_BYTES``.

    An import counts each output into the tier its age calls for against its cohort's newest data
    (tiers.py). History is usually written oldest first, so without a look at its end every
    output would be the newest so far, counted into minute buckets, to be folded later at about
    the cost of the import itself; with it, a backfill goes into hours and days as it is read and
    keeps minutes only for its last day. A file in another order, a compressed one (not
    seekable), or one whose last lines are invalid only loses that shortcut: what is left in
    minutes is folded at the end of the import.
    """
    if path.suffix == ".gz":
        return {}
    try:
        with path.open("rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - _TAIL_BYTES))
            tail = f.read(_TAIL_BYTES)
    except OSError:
        return {}  # the import itself reports the file
    lines = tail.split(b"\n")
    if size > _TAIL_BYTES:
        lines = lines[1:]  # the first one was cut
    newest: dict[tuple[str, str, str, str], int] = {}
    for line in lines:
        try:
            e = parse_envelope(line, limits)
        except EnvelopeInvalid:
            continue
        start = int(e.ts.timestamp()) // bucket_seconds * bucket_seconds
        source = e.source or PRODUCTION
        for cohort in {
            (e.model, e.prompt_version, e.contract, source),
            (e.served_model or e.model, e.prompt_version, e.contract, source),
        }:
            if start > newest.get(cohort, start - 1):
                newest[cohort] = start
    return newest


# The end of a file read before its import (_newest_at_the_end): about 5,000 lines of 800 bytes.
_TAIL_BYTES = 4 << 20


def _import_one(
    path: Path,
    store: Store,
    limits: Limits,
    summary: ImportSummary,
    progress: Callable[[int], None] | None,
    batch_size: int,
    tx_batches: int,
) -> None:
    qpath = quarantine_path(store.path, path)
    try:
        qpath.parent.mkdir(parents=True, exist_ok=True)
        quarantine = qpath.open("wb")
    except OSError as exc:  # before any line is stored: a rejected line must have somewhere to go
        raise QuarantineUnwritable(qpath, path, exc) from exc
    try:
        # The store's conflicts, "line_number payload_hash" a line, in line order: spilled to a file,
        # so that a file of conflicts (the same ids with new payloads) is imported in bounded memory.
        conflicted = tempfile.TemporaryFile("w+", dir=qpath.parent)  # noqa: SIM115  closed in the finally below
    except OSError as exc:
        quarantine.close()
        raise QuarantineUnwritable(qpath, path, exc) from exc
    rejected_here = 0
    prefix = _file_key(path)
    # The reading thread validates and prepares (columns, rollup counts); this thread only
    # runs the transaction, during which DuckDB releases the GIL.
    # Each batch travels with the line number of each envelope. A line the store refuses (an
    # event_id reused with another payload) is quarantined like the rest, its text read again
    # from the file once every batch is stored: keeping every line's bytes until its batch was
    # stored held about 230 MB at the peak of a 1M-line import (bench/README.md).
    todo: queue.Queue[tuple[PreparedBatch, list[int]] | None] = queue.Queue(maxsize=_QUEUED_BATCHES)
    failure: list[BaseException] = []
    conflicts = [0]  # counted by the storing thread alone; added to the summary after the join

    def store_batches() -> None:
        ended = False

        def group(taken: list[tuple[PreparedBatch, list[int]]]) -> Iterator[PreparedBatch]:
            # A transaction's batches, each handed to the store as the reading thread prepares it
            # (and kept in ``taken`` with its line numbers): storing one overlaps preparing the next.
            nonlocal ended
            while len(taken) < tx_batches:
                if (item := todo.get()) is None:
                    ended = True
                    return
                taken.append(item)
                yield item[0]

        while not ended:
            taken: list[tuple[PreparedBatch, list[int]]] = []
            if failure:
                for _ in group(taken):  # the reading thread stops soon: let it go on to its end
                    pass
                continue
            try:
                for results, (batch, numbers) in zip(
                    store.write_batches(group(taken), merge=False), taken, strict=True
                ):
                    if len(results) != len(numbers):
                        raise RuntimeError(f"the store answered {len(results)} results for {len(numbers)} lines")
                    # Counted in C (this thread's Python takes the GIL from the reading thread, the
                    # import's busiest); only a batch with conflicts is walked result by result.
                    counts = Counter(map(_STATUS, results))
                    summary.accepted += counts[WriteStatus.accepted]
                    summary.duplicate += counts[WriteStatus.duplicate]
                    if counts[WriteStatus.conflict]:
                        found = [
                            f"{n} {payload_hash}\n"
                            for r, n, payload_hash in zip(results, numbers, batch.hashes, strict=True)
                            if r.status is WriteStatus.conflict
                        ]
                        conflicted.writelines(found)
                        conflicts[0] += len(found)
                if store.rollups_due:
                    merges.put(True)
                if store.pending_rollup_events > _PENDING_TRANSACTIONS * tx_batches * batch_size:
                    # the merging thread has fallen behind: merge here, so that memory stays bounded
                    store.merge_pending()
            except BaseException as exc:  # handed to the reading thread, which re-raises
                failure.append(exc)
        merges.put(False)

    # Rollups are merged on a third thread, beside the next transaction's inserts (the merge has
    # its own connection and lock, as in the service): storing then keeps pace with reading,
    # which never waits for the store (1M lines: 2.8 of 7.7 s of the storing thread's CPU was
    # merging; bench/README.md). A failed merge keeps its counts pending; the last flush raises.
    merges: queue.Queue[bool] = queue.Queue()

    def merge_rollups() -> None:
        while merges.get():
            store.merge_pending()

    worker = threading.Thread(target=store_batches, name="shapewatch-import", daemon=True)
    merger = threading.Thread(target=merge_rollups, name="shapewatch-merge", daemon=True)
    now = datetime.now(UTC)
    # Envelopes go into the batch a thousand or so at a time, and their parsed outputs (if any)
    # are counted and let go then (see BatchBuilder).
    batch = store.batch_builder()
    parsed: list[Envelope] = []  # added to the batch _ADD_EVERY at a time
    origin: list[int] = []  # the line number of each envelope of the batch
    reader = _Lines(path)
    try:
        with quarantine, conflicted:
            worker.start()
            merger.start()
            reported = 0
            n = 0  # the number of the last line read
            args = (limits.max_event_bytes, *limits.scanner)
            for chunk in reader.chunks():
                if progress is not None and reader.consumed - reported >= 1 << 20:
                    progress(reader.consumed - reported)  # per MiB, not per line: a call per line costs a few %
                    reported = reader.consumed
                at = 0
                while at < len(chunk) and not failure:
                    # The plain lines in C, a block at a time (speedups.scan_lines: the reading loop, the scan,
                    # the envelope); a line it declines goes the reference way, here.
                    room = min(batch_size - len(batch), _ADD_EVERY) - len(parsed)
                    at, n, start, end = speedups.scan_lines(
                        chunk, at, n, prefix, Envelope, now, room, parsed, origin, *args
                    )
                    if start >= 0:
                        stripped = bytes(chunk[start:end]).strip()
                        try:
                            parsed.append(
                                parse_envelope(
                                    stripped, limits, now=now, default_id=partial(_line_id, prefix, n, stripped)
                                )
                            )
                            origin.append(n)
                        except EnvelopeInvalid as exc:
                            rejected_here += 1
                            summary.rejected += 1
                            for code in {f.code for f in exc.fields}:
                                summary.rejected_by_reason[code] += 1
                            quarantine.write(_quarantine_line(path, n, exc.fields, stripped))
                    if len(parsed) >= _ADD_EVERY or len(batch) + len(parsed) >= batch_size:
                        batch.add_many(parsed)
                        parsed = []
                    if len(batch) >= batch_size:
                        todo.put((batch.finish(), origin))
                        batch, origin = store.batch_builder(), []
                if failure:
                    break
            if progress is not None and reader.consumed > reported:
                progress(reader.consumed - reported)
            batch.add_many(parsed)
            if len(batch) and not failure:
                todo.put((batch.finish(), origin))
            todo.put(None)
            worker.join()
            merger.join()
            if conflicts[0] and not failure:
                rejected_here += conflicts[0]
                summary.rejected += conflicts[0]
                summary.rejected_by_reason["conflict"] += conflicts[0]
                conflicted.seek(0)
                found = ((int(n), payload_hash) for n, payload_hash in map(str.split, conflicted))
                quarantine.writelines(_conflict_entries(path, found, limits, now, prefix))
    finally:
        if worker.is_alive():
            todo.put(None)
            worker.join()
        if merger.is_alive():
            merges.put(False)
            merger.join()
    if failure:
        cause = failure[0]
        qpath.unlink(missing_ok=True)
        raise cause if isinstance(cause, StoreError) else StoreError(f"importing {path}", cause)
    if rejected_here:
        summary.quarantine.append(str(qpath))
    else:
        qpath.unlink(missing_ok=True)
    if reader.error is not None:  # what was read before the fault is stored; a rerun adds the rest
        raise ImportInputError(path, reader.error)


def _conflict_entries(
    path: Path, conflicted: Iterable[tuple[int, str]], limits: Limits, now: datetime, prefix: str
) -> Iterator[bytes]:
    """The quarantine entries of the lines the store refused as conflicts ((line number, payload
    hash) in line order, as batches are stored), their text read again from the file in one
    pass. A line that no longer reads as the envelope imported (the file changed meanwhile) is
    still quarantined, its entry saying so."""
    reason = FieldError("event_id", "already stored with a different payload", "conflict")
    wanted = iter(conflicted)
    if (pending := next(wanted, None)) is None:
        return
    for n, line in _Lines(path):
        while pending is not None and pending[0] < n:  # out of line order: not read again
            yield _quarantine_line(path, pending[0], [reason, _CHANGED], b"")
            pending = next(wanted, None)
        if pending is None:
            return
        if pending[0] > n:
            continue
        stripped = line.strip()
        try:
            same = (
                parse_envelope(
                    stripped, limits, now=now, default_id=partial(_line_id, prefix, n, stripped)
                ).payload_hash
                == pending[1]
            )
        except EnvelopeInvalid:
            same = False
        yield _quarantine_line(path, n, [reason] if same else [reason, _CHANGED], stripped)
        if (pending := next(wanted, None)) is None:
            return
    while pending is not None:  # the file is shorter now (or could not be read again)
        yield _quarantine_line(path, pending[0], [reason, _CHANGED], b"")
        pending = next(wanted, None)


_CHANGED = FieldError("", "the file changed during the import: this is not the text that was imported", "changed")


def _quarantine_line(path: Path, n: int, fields: list[FieldError], raw: bytes) -> bytes:
    """One rejected line: where it was, each reason with its code (the summary's keys), and the
    line itself; a line that is not UTF-8 also as base64, byte for byte."""
    entry: dict[str, Any] = {"file": str(path), "line": n, "errors": [{**f.as_dict(), "code": f.code} for f in fields]}
    try:
        entry["raw"] = raw.decode()
    except UnicodeDecodeError:
        entry["raw"] = raw.decode("utf-8", errors="replace")
        entry["raw_base64"] = base64.b64encode(raw).decode()
    return orjson.dumps(entry) + b"\n"
