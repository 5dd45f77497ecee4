"""Opening the file: the write-ahead log left by a crash, the lock of another process, the
memory the key index needs, and DuckDB's errors as the store's own."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb

from ..errors import StoreError, StoreInvalidated, StoreUnavailable

log = logging.getLogger(__name__)

_WAL_COPIES_KEPT = 5


def silence_progress_bar(con: duckdb.DuckDBPyConnection) -> None:
    """Keep DuckDB's progress bar off stdout on ``con``. DuckDB's Python client turns the bar on
    for a connection it opens (not for its cursors) and draws it on stdout for any statement over
    two seconds, in the middle of whatever the process prints there (a command's JSON summary, a
    report another program parses). Both settings are the session's only: DuckDB refuses them in
    ``connect``'s config and as ``SET GLOBAL``. Printing is turned off as well as the bar because
    setting ``progress_bar_time`` turns the bar back on."""
    con.execute("SET enable_progress_bar = false")
    con.execute("SET enable_progress_bar_print = false")


def _copy_wal(path: Path) -> Path | None:
    """Copy ``<db>.wal`` (when present and not empty) to ``quarantine/`` beside the database;
    the newest copies are kept, older ones deleted. None when there is none or it cannot be copied."""
    import shutil

    wal = Path(f"{path}.wal")
    try:
        if not wal.is_file() or wal.stat().st_size == 0:
            return None
        where = path.parent / "quarantine"
        where.mkdir(exist_ok=True)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
        copy = where / f"{path.name}.wal.{stamp}.unclean"
        shutil.copyfile(wal, copy)
    except OSError as exc:  # a full disk must not also keep the service from starting
        log.warning(
            "%s: a write-ahead log left by an unclean shutdown could not be copied aside (%s); replaying it", path, exc
        )
        return None
    for old in sorted(where.glob(f"{path.name}.wal.*.unclean"))[:-_WAL_COPIES_KEPT]:
        old.unlink(missing_ok=True)
    return copy


def _is_wal_error(exc: duckdb.Error) -> bool:
    msg = str(exc).lower()
    return "wal" in msg and ("replaying" in msg or "corrupt" in msg)


def _wal_refusal(path: Path, exc: duckdb.Error) -> str:
    wal = f"{path}.wal"
    detail = " ".join(str(exc).split())
    return (
        f"its write-ahead log {wal} is damaged and cannot be replayed, so the database is not opened and "
        f"nothing was changed ({detail}). To start anyway, move it aside (mv {wal} {wal}.damaged): the "
        f"database then opens without the writes the log holds (copies of it are kept in "
        f"{path.parent / 'quarantine'}); or restore the database from a backup"
    )


def _is_lock_error(exc: duckdb.Error) -> bool:
    msg = str(exc).lower()
    return "lock" in msg and ("conflicting" in msg or "could not set lock" in msg)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# DuckDB keeps the index of the idempotency key (an ART over md5_number(event_id)) in memory,
# and a write that needs more than memory_limit fails: measured about 45 bytes per stored event
# (a 512MB limit refused every insert past about 10.7M keys, even after a restart). So the
# configured limit is working memory, and the store adds room for the index on top of it,
# at open and as events are stored, a step at a time.
_INDEX_BYTES_PER_EVENT = 64
_INDEX_STEP_EVENTS = 100_000


def _epoch_us(t: datetime) -> int:
    """Exact microseconds since the epoch (float timestamp() can be 1 us short)."""
    return (t - _EPOCH) // timedelta(microseconds=1)


def _is_fatal(exc: duckdb.Error) -> bool:
    """DuckDB invalidated the database (this error, or an earlier one that every statement repeats)."""
    return isinstance(exc, duckdb.FatalException) or "database has been invalidated" in str(exc).lower()


def _store_error(doing: str, exc: duckdb.Error) -> StoreError:
    if _is_fatal(exc):
        return StoreInvalidated(doing, exc)
    if "out of memory" in str(exc).lower():
        return StoreUnavailable(
            f"DuckDB ran out of memory while {doing} ({' '.join(str(exc).split())[:300]}); "
            "raise memory_limit (import_memory_limit for shapewatch ingest)"
        )
    return StoreUnavailable(exc) if _is_space_error(exc) else StoreError(doing, exc)


def _is_space_error(exc: BaseException) -> bool:
    msg = str(exc).lower()
    return any(
        s in msg
        for s in ("no space left", "disk full", "out of disk", "could not write", "i/o error", "input/output error")
    )


@contextmanager
def explicit_transaction(con: duckdb.DuckDBPyConnection) -> Iterator[duckdb.DuckDBPyConnection]:
    """``BEGIN`` ... ``COMMIT`` on a connection of its own (a lake's, one attached to PostgreSQL),
    for a caller that maps errors itself: any exception rolls back and goes on. A failing
    rollback is ignored, so the error that caused it is the one raised. (The store's own
    transactions, with their error mapping, are ``StoreCore._transaction``.)"""
    con.execute("BEGIN TRANSACTION")
    try:
        yield con
        con.execute("COMMIT")
    except BaseException:
        try:
            con.execute("ROLLBACK")
        except duckdb.Error:
            pass
        raise
