"""Types of the C fast paths (collector/_speedups_src/, built as the module _speedups)."""

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Literal, overload

def walk(obj: Any, max_depth: int, max_array: int, max_key: int, max_leaves: int, /) -> tuple[int, int, int] | None: ...
def count_keys(raw: bytes, /) -> int: ...
def item_spans(raw: bytes, /) -> list[tuple[int, int]] | None: ...
def string_column(rows: list[Any], index: int, /) -> tuple[bytes | None, bytes, bytes, int]:
    """Item ``index`` (str or None) of every tuple in ``rows`` as an Arrow string column's buffers:
    validity bitmap (None without nulls), int32 offsets, UTF-8 data; and the null count."""

def epoch_micros(rows: list[Any], index: int, /) -> bytes:
    """Item ``index`` (a datetime) of every tuple in ``rows`` as microseconds since the epoch,
    ``round(ts.timestamp() * 1_000_000)``, packed int64 (exact for a UTC datetime)."""

def bucket_starts(tss: Sequence[datetime], width: int, /) -> list[int]:
    """``e - e % width`` for ``e = int(ts.timestamp())`` of each datetime (exact for UTC ones)."""

def group_ids(
    groups: dict[Any, int],
    cohorts: Sequence[tuple[str, str, str, str]],
    served_models: Sequence[str | None],
    starts: Sequence[int],
    /,
) -> list[int]:
    """The id in ``groups`` (grown as keys first appear) of each output's rollup group:
    (model, prompt_version, contract, source, served model unless None or the model, bucket start)."""

def set_ts_range(min_us: int, end_us: int, /) -> None:
    """The ts the C paths accept: [min_us, end_us) in microseconds since the epoch (empty until
    set, so every ts is declined and the reference path decides)."""

def check_envelope(
    obj: Any, max_tag: int, max_depth: int, max_array: int, max_key: int, max_leaves: int, /
) -> (
    tuple[
        str | None,
        datetime | None,
        str,
        str,
        str | None,
        str | None,
        str | None,
        str | None,
        str | None,
        str | None,
        str | None,
        dict[str, Any],
        int,
        int,
    ]
    | None
): ...
def scan_envelope(
    raw: bytes | memoryview, max_tag: int, max_depth: int, max_array: int, max_key: int, max_leaves: int, /
) -> (
    tuple[
        str | None,
        datetime | None,
        str,
        str,
        str | None,
        str | None,
        str | None,
        str | None,
        str | None,
        str | None,
        str | None,
        str,
        str,
    ]
    | None
):
    """(event_id, ts, model, prompt_version, contract, served_model, contract_version, source, run_id,
    agent_release, finish_reason, canonical output text, payload hash) of an envelope's JSON text
    that is plainly valid, or None: the reference path then decides. The text is the output as
    sent, compacted; the hash covers it with its keys in order (envelope._finish)."""

def scan_lines(
    text: bytes | memoryview,
    pos: int,
    line_no: int,
    id_prefix: str,
    envelope_type: type,
    now: datetime,
    room: int,
    out: list[Any],
    origin: list[int],
    max_event_bytes: int,
    max_tag: int,
    max_depth: int,
    max_array: int,
    max_key: int,
    max_leaves: int,
    /,
) -> tuple[int, int, int, int]:
    """Bulk import's envelopes from the lines of ``text`` (split at b"\\n") from offset ``pos`` on
    (the line before numbered ``line_no``), each stripped, blank ones skipped: each plain one's
    envelope goes to ``out`` and its number to ``origin``, until ``room`` were added, the text
    ends or a line is declined. Returns (offset of the next line, number of the last line read,
    start, end): ``text[start:end]`` is the declined line, the caller's to read (-1, -1: none).
    The lines are read with the GIL released: a mutable ``text`` must not change during the call."""

def scan_items(
    raw: bytes,
    max_items: int,
    envelope_type: type,
    now: datetime,
    new_id: Callable[[], str],
    max_event_bytes: int,
    max_tag: int,
    max_depth: int,
    max_array: int,
    max_key: int,
    max_leaves: int,
    /,
) -> list[Any] | None:
    """The envelopes of a JSON array body when every item is the plain case, in order (ts ``now``
    when absent; event_id ``new_id()`` when absent, generated True, called once every item is
    taken, so never for a body declined); None for anything else (more
    than ``max_items`` items, one over ``max_event_bytes``, one declined, a body of another
    shape): the reference path then answers each item. The items' text is read with the GIL
    released; only the Python objects are made with it."""

class Acc:
    def __init__(self, namer: Any, max_value_length: int, /) -> None: ...
    def add(self, output: dict[str, Any], group: int, /) -> None: ...
    def add_many(self, outputs: Sequence[dict[str, Any] | str], groups: Sequence[int], /) -> None:
        """``add`` or ``add_json`` of each (output, group), in order, of the sequences as they are at
        the call. One call at a time: a call from another thread while one counts (or from any
        thread while add_many walks texts without the GIL) raises RuntimeError."""
    def add_json(self, text: str | bytes, group: int, /) -> None:
        """Count one output given as JSON text, as ``add(json.loads(text), group)`` would."""
    def counts(self) -> list[tuple[int, ...]]: ...
    def count_rows(self) -> bytes:
        """``counts`` packed: per slot, its twelve values as native int64, slot after slot."""
    def value_rows(self) -> tuple[bytes, bytes, bytes, bytes]:
        """Short string values: slots (int64), offsets (int32, rows + 1) and UTF-8 data of an
        Arrow string column, counts (int64), packed native."""
    @overload
    def rows(self, which: Literal[0], /) -> tuple[list[int], list[str], list[int]]: ...
    @overload
    def rows(self, which: Literal[1, 2], /) -> tuple[bytes, bytes, bytes]:
        """Array lengths (1): slots, lengths, counts (int64 each); number bins (2): slots (int64),
        representative values (float64), counts (int64); packed native."""
