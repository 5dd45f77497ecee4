"""The pure-Python twin of the C accelerator (``_speedups_src/``): the interface of ``_speedups.pyi``,
the same answers, about ten times slower.

It runs when the C extension could not be built (``accel.py`` makes the choice once per process),
and ``make test`` runs the accelerator-dependent suites against it as well as against the C.

Where a rule already has a statement in Python, it is called here rather than written again:
``rules.py`` holds the tag rule, the known fields and sources, the payload hash, the id made up
for an imported line and the number bins (and imports no accelerator, so this module depends on
nothing that loads it); the ts range comes through ``set_ts_range`` as for the C, JSON types from
``flatten.json_type_of``, JSON itself from orjson, as on the reference path. Written out here is
only what belongs to the fast paths themselves: which envelopes count as the plain case they
recognise (anything else is answered None, and the reference path decides), and the packed
buffers the store wraps as Arrow columns.
"""

from __future__ import annotations

import itertools
import math
import operator
import re
import threading
from array import array
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any, Literal, overload

import orjson

from .flatten import json_type_of
from .rules import KNOWN_FIELDS as _KNOWN
from .rules import SOURCES, Limits, line_id, number_bin, payload_hash
from .rules import check_tag as _tag
from .rules import epoch_us as _epoch_us

__all__ = [
    "Acc",
    "bucket_starts",
    "check_envelope",
    "count_keys",
    "epoch_micros",
    "group_ids",
    "item_spans",
    "scan_envelope",
    "scan_items",
    "scan_lines",
    "set_ts_range",
    "string_column",
    "walk",
]

# --- walk ------------------------------------------------------------------------------------------


def walk(obj: Any, max_depth: int, max_array: int, max_key: int, max_leaves: int, /) -> tuple[int, int, int] | None:
    """(keys, leaves, huge) of a parsed output within the limits, or None: a limit is crossed or a
    value is of a kind JSON does not make (the Python walk, ``envelope._Walk``, then names it).
    ``huge`` is 1 when a float that may be a rounded huge integer literal was seen."""
    state = [0, 0, 0]  # keys, leaves, huge
    if not _walk(obj, 1, (max_depth, max_array, max_key, max_leaves), state):
        return None
    return state[0], state[1], state[2]


def _walk(v: Any, depth: int, lim: tuple[int, int, int, int], state: list[int]) -> bool:
    max_depth, max_array, max_key, max_leaves = lim
    if depth > max_depth:
        return False
    t = type(v)
    if t is dict:
        state[0] += len(v)
        for k, x in v.items():
            if type(k) is not str or len(k) > max_key or not _walk_item(x, depth, lim, state):
                return False
    elif t is list:
        if len(v) > max_array:
            return False
        for x in v:
            if not _walk_item(x, depth, lim, state):
                return False
    else:
        return False
    return state[1] <= max_leaves


def _walk_item(x: Any, depth: int, lim: tuple[int, int, int, int], state: list[int]) -> bool:
    t = type(x)
    if t is dict or t is list:
        return _walk(x, depth + 1, lim, state)
    if t is float:
        if not math.isfinite(x):  # NaN or infinity: the Python walk names it
            return False
        if x >= 9.2e18 or x <= -9.2e18:
            state[2] = 1
    elif not (t is str or t is int or t is bool or x is None):
        return False
    state[1] += 1
    return True


# --- the raw text: keys, array items ---------------------------------------------------------------

# A string (escapes skipped; one the text ends inside runs to the end), then, when it is a key, the
# colon after optional blanks: group 1.
_STRING_THEN_COLON = re.compile(rb'"(?:[^"\\]++|\\.)*+(?:"|\\?\Z)(?:[ \t\n\r]*+(:))?', re.S)


def _type_name(obj: object) -> str:
    """The name the C's messages give a type (its tp_name): a C type's is qualified by its
    module unless it is a builtin, a class defined in Python has its bare name."""
    t = type(obj)
    if t.__flags__ & _HEAP_TYPE or t.__module__ == "builtins":
        return t.__name__
    return f"{t.__module__}.{t.__name__}"


_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE


def _need_bytes(raw: object) -> bytes:
    if not isinstance(raw, bytes):
        raise TypeError(f"expected bytes, {_type_name(raw)} found")
    return raw


def _buffer(raw: object) -> memoryview:
    try:
        return memoryview(raw)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"a bytes-like object is required, not '{_type_name(raw)}'") from None


def count_keys(raw: bytes, /) -> int:
    """The number of object keys in JSON text that orjson already accepted: string tokens
    followed (after optional blanks) by a colon. Compared with the keys orjson kept, a difference
    means a duplicate key was merged."""
    return _STRING_THEN_COLON.findall(_need_bytes(raw)).count(b":")


# A string (group 1: empty when the text ends inside it), one structural character, or a run of
# anything else that is not blank: enough to follow the nesting of an array's items.
_ITEM_TOKENS = re.compile(rb'"(?:[^"\\]++|\\.)*+("?)|[\[\]{},]|[^ \t\n\r"\[\]{},]++', re.S)
_BLANKS = re.compile(rb"[ \t\n\r]*+")
_QUOTE, _COMMA, _OPEN, _CLOSE, _OPEN_OBJ, _CLOSE_OBJ = b'",[]{}'


def item_spans(raw: bytes, /) -> list[tuple[int, int]] | None:
    """The [start, end) byte offsets of each item of a JSON array body (blanks around an item left
    out), or None when the text is not an array whose brackets and strings close."""
    raw = _need_bytes(raw)
    m = _BLANKS.match(raw)
    i = m.end() if m else 0
    if i >= len(raw) or raw[i] != _OPEN:
        return None
    spans: list[tuple[int, int]] = []
    depth, start, last = 1, -1, -1
    for tok in _ITEM_TOKENS.finditer(raw, i + 1):
        at = tok.start()
        c = raw[at]
        if depth == 1 and c in (_COMMA, _CLOSE):
            if start >= 0:
                spans.append((start, last + 1))
                start = -1
            if c == _CLOSE:
                depth = 0
                break
            continue
        if start < 0:
            start = at
        if c == _QUOTE:
            if not tok.group(1):  # the text ends inside the string
                break
        elif c in (_OPEN, _OPEN_OBJ):
            depth += 1
        elif c in (_CLOSE, _CLOSE_OBJ):
            depth -= 1
        last = tok.end() - 1
    return spans if depth == 0 else None


# --- the envelope: its plain case ----------------------------------------------------------------------

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_OPTIONAL_TAGS = ("contract", "served_model", "contract_version", "source", "run_id", "agent_release", "finish_reason")
_SOURCE = _OPTIONAL_TAGS.index("source")
_MAX_EVENT_ID = 128  # validate_envelope's limit on an event_id

# The accepted ts, [min, end) in microseconds since the epoch: envelope.py sets it (it defines the
# range). Empty until then, so every ts is declined and the reference decides.
_ts_range = (0, 0)


def set_ts_range(min_us: int, end_us: int, /) -> None:
    """The ts the fast paths accept: [min_us, end_us) in microseconds since the epoch."""
    global _ts_range
    lo, hi = operator.index(min_us), operator.index(end_us)
    if lo < 0:  # as the C, which writes it unsigned into the payload hash
        raise ValueError("the range of ts must start at or after the epoch")
    _ts_range = (lo, hi)


# RFC 3339's form, the only one the fast paths read: YYYY-MM-DDTHH:MM:SS[.f{1,6}](Z|+HH:MM|-HH:MM).
_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,6}))?"
    r"(?:[Zz]|([+-])([0-9]{2}):([0-9]{2}))"
)


def _plain_ts(v: Any) -> datetime | None:
    """The UTC datetime of an RFC 3339 timestamp inside the accepted range, or None for any other
    form or time (``datetime.fromisoformat``, on the reference path, then decides)."""
    if type(v) is not str or not 20 <= len(v) <= 32 or not v.isascii():
        return None
    m = _RFC3339.fullmatch(v)
    if m is None:
        return None
    y, mo, d, h, mi, s = (int(g) for g in m.groups()[:6])
    if not (1000 <= y <= 9998 and h <= 23 and mi <= 59 and s <= 59):
        return None
    frac, sign, oh, om = m.group(7, 8, 9, 10)
    offset = 0
    if sign is not None:
        if int(oh) > 23 or int(om) > 59:
            return None
        offset = (int(oh) * 60 + int(om)) * (-1 if sign == "-" else 1)
    try:
        local = datetime(y, mo, d, h, mi, s, int(frac.ljust(6, "0")) if frac else 0, tzinfo=UTC)
    except ValueError:  # no such month or day
        return None
    at = local - timedelta(minutes=offset)
    at_us = (at - _EPOCH) // _MICROSECOND
    lo, end = _ts_range
    return at if lo <= at_us < end else None


@cache
def _tag_limits(max_tag: int) -> Limits:
    return Limits(max_tag_length=max_tag)


def _plain_fields(obj: dict[str, Any], max_tag: int) -> tuple[Any, ...] | None:
    """The tags and the event_id of an envelope (absent or null: None) when each is plainly valid,
    by the rules of ``validate_envelope``; None otherwise."""
    lim = _tag_limits(max_tag)
    errors: list[Any] = []
    model = _tag(obj, "model", errors, lim, True)
    prompt_version = _tag(obj, "prompt_version", errors, lim, True)
    tags = [_tag(obj, name, errors, lim, False) for name in _OPTIONAL_TAGS]
    if errors or (tags[_SOURCE] is not None and tags[_SOURCE] not in SOURCES):
        return None
    event_id = obj.get("event_id")
    if event_id is not None and (type(event_id) is not str or len(event_id) > _MAX_EVENT_ID or not event_id.strip()):
        return None
    return event_id, model, prompt_version, *tags


def check_envelope(
    obj: Any, max_tag: int, max_depth: int, max_array: int, max_key: int, max_leaves: int, /
) -> tuple[Any, ...] | None:
    """The fields of an envelope that is plainly valid (known fields only, no attributes, good
    tags, ts absent or in RFC 3339's form, an output within the limits): (event_id, ts, model,
    prompt_version, contract, served_model, contract_version, source, run_id, agent_release,
    finish_reason, output, keys, huge), or None for anything else."""
    if type(obj) is not dict or not _KNOWN.issuperset(obj) or obj.get("attributes") is not None:
        return None
    fields = _plain_fields(obj, max_tag)
    output = obj.get("output")
    if fields is None or type(output) is not dict:
        return None
    counted = walk(output, max_depth, max_array, max_key, max_leaves)
    if counted is None:
        return None
    ts = obj.get("ts")
    if ts is not None and (ts := _plain_ts(ts)) is None:
        return None
    event_id, model, prompt_version, *tags = fields
    return (event_id, ts, model, prompt_version, *tags, output, len(obj) + counted[0], counted[2])


# The envelope's text, token by token: a string (group 1: its content; group 2: the colon after a
# key), a number literal (3), an opening (4) or a closing (5) bracket.
_SCAN_TOKENS = re.compile(
    rb'"((?:[^"\\]++|\\.)*+)"([ \t\n\r]*+:)?|(-?[0-9][0-9.eE+\-]*+)|([{\[])|([}\]])',
    re.S,
)
# A string's content whose escapes are all ones orjson writes back the same: \" \\ \b \f \n \r \t.
_PLAIN_ESCAPES = re.compile(rb'(?:[^\\]++|\\["\\bfnrt])*+', re.S)
_NUMBER = re.compile(rb"(-?)(0|[1-9][0-9]*+)(?:\.([0-9]++))?")
_MAX_KEYS = 64  # keys of one object the C scanner holds to find a repeated one


def _plain_number(literal: bytes) -> bool:
    """A number literal in the form orjson writes back unchanged."""
    m = _NUMBER.fullmatch(literal)
    if m is None:  # an exponent, a leading zero, a bare sign or point
        return False
    sign, whole, frac = m.groups()
    if frac is None:
        return len(whole) <= 18 and not (sign and whole == b"0")  # -0 comes back as 0
    if frac == b"0":  # X.0: a whole float, written as such
        return len(whole) <= 15
    if frac.endswith(b"0"):  # 1.50 comes back as 1.5
        return False
    if whole == b"0":
        lead = len(frac) - len(frac.lstrip(b"0"))
        return lead <= 3 and len(frac) - lead <= 15  # under 1e-4, repr turns to an exponent
    return len(whole) + len(frac) <= 15  # more digits than a double keeps


# A string, or a number literal (group 1): the numbers of a text without escapes.
_STRING_OR_NUMBER = re.compile(rb'"[^"]*+"|(-?[0-9][0-9.eE+\-]*+)')


def _plain_text(raw: bytes, keys: int) -> bool:
    """What the parsed envelope cannot tell: no escape at all in the envelope's own keys and tags,
    only the escapes orjson writes back inside the output, every number literal in the form orjson
    writes, and at most 64 keys per object (``keys``: how many the text has in all)."""
    if b"\\" in raw or keys > _MAX_KEYS:
        return _plain_tokens(raw)
    # the usual text: no escape, few keys; only its numbers need a look (each distinct one once)
    literals = set(_STRING_OR_NUMBER.findall(raw))
    literals.discard(b"")
    return all(_plain_number(literal) for literal in literals)


def _plain_tokens(raw: bytes) -> bool:
    """``_plain_text`` token by token, following the nesting: where escapes are, and each
    object's keys."""
    depth = 0
    keys: list[int] = []
    for tok in _SCAN_TOKENS.finditer(raw):
        text = tok.group(1)
        if text is not None:
            if b"\\" in text and (depth <= 1 or _PLAIN_ESCAPES.fullmatch(text) is None):
                return False
            if tok.group(2) is not None:
                keys[-1] += 1
                if keys[-1] > _MAX_KEYS:
                    return False
        elif tok.group(3) is not None:
            if not _plain_number(tok.group(3)):
                return False
        elif tok.group(4) is not None:
            depth += 1
            keys.append(0)
        else:
            depth -= 1
            keys.pop()
    return True


def scan_envelope(
    raw: bytes | memoryview, max_tag: int, max_depth: int, max_array: int, max_key: int, max_leaves: int, /
) -> tuple[Any, ...] | None:
    """(event_id, ts, model, prompt_version, contract, served_model, contract_version, source,
    run_id, agent_release, finish_reason, canonical output text, payload hash) of an envelope's
    JSON text that is plainly valid, or None: the reference path then decides.

    Plain is what ``check_envelope`` accepts, from text with no repeated key, no ``attributes``
    field (not even null) and nothing that orjson would write back otherwise (see
    ``_plain_text``): the output's canonical text is then the text as sent, compacted."""
    raw = raw if type(raw) is bytes else _buffer(raw).tobytes()
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if type(obj) is not dict or "attributes" in obj or "output" not in obj:
        return None
    fields = check_envelope(obj, max_tag, max_depth, max_array, max_key, max_leaves)
    if fields is None or count_keys(raw) != fields[12] or not _plain_text(raw, fields[12]):
        return None
    event_id, ts, model, prompt_version, contract, served, version, source, run_id, release, finish, output = fields[
        :12
    ]
    digest = payload_hash(
        orjson.dumps(output, option=orjson.OPT_SORT_KEYS),
        model,
        prompt_version,
        contract or "default",
        None if ts is None else _epoch_us(ts),
        source,
        None,
        (served, version, run_id, release, finish),
    )
    text = orjson.dumps(output).decode()
    return (
        event_id,
        ts,
        model,
        prompt_version,
        contract,
        served,
        version,
        source,
        run_id,
        release,
        finish,
        text,
        digest,
    )


_NEWLINE = re.compile(b"\n")


def _envelope_of(envelope_type: type, fast: tuple[Any, ...], event_id: str, generated: bool, now: datetime) -> Any:
    """The Envelope of what ``scan_envelope`` read, as envelope._scanned makes it (ts ``now`` and
    the default contract when absent)."""
    items = (event_id, generated, fast[1] or now, fast[2], fast[3], fast[4] or "default", fast[11], fast[12])
    return tuple.__new__(envelope_type, (*items, *fast[5:11], None, None))


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
    start, end): ``text[start:end]`` is the declined line, the caller's to read (-1, -1: none)."""
    view = _buffer(text)
    if not isinstance(id_prefix, str):
        raise TypeError(f"argument 4 must be str, not {_type_name(id_prefix)}")
    for i, arg in ((8, out), (9, origin)):
        if type(arg) is not list:
            raise TypeError(f"argument {i} must be list, not {_type_name(arg)}")
    if not isinstance(envelope_type, type) or not issubclass(envelope_type, tuple):
        raise TypeError("envelope_type must be a tuple type")
    if not 0 <= pos <= len(view):
        raise ValueError("pos is outside the text")
    limits = (max_tag, max_depth, max_array, max_key, max_leaves)
    added, declined_start, declined_end = 0, -1, -1
    while pos < len(view) and added < room:
        nl = _NEWLINE.search(view, pos)
        line_at, line_end = pos, nl.start() if nl else len(view)
        pos = line_end + (nl is not None)
        line_no += 1
        line = view[line_at:line_end].tobytes().strip()  # bytes.strip(): the ASCII blanks, as the C
        if not line:
            continue
        fast = scan_envelope(line, *limits) if len(line) <= max_event_bytes else None
        if fast is None:
            declined_start, declined_end = line_at, line_end
            break
        event_id = fast[0]
        generated = event_id is None
        if generated:
            event_id = line_id(id_prefix, line_no, line)
        out.append(_envelope_of(envelope_type, fast, event_id, generated, now))
        origin.append(line_no)
        added += 1
    return pos, line_no, declined_start, declined_end


_JSON_BLANKS = b" \t\n\r"


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
    """The envelopes of a JSON array body (bytes) when every item is the plain case, in order (ts
    ``now`` when absent; event_id ``new_id()`` when absent, generated True); None for anything
    else: more than ``max_items`` items, one over ``max_event_bytes``, one declined, or a body
    that is not blanks, "[", objects separated by commas, "]" and blanks (JSON's blanks only)."""
    if not isinstance(raw, bytes):
        raise TypeError(f"argument 1 must be bytes, not {_type_name(raw)}")
    if not isinstance(envelope_type, type) or not issubclass(envelope_type, tuple):
        raise TypeError("envelope_type must be a tuple type")
    if not callable(new_id):
        raise TypeError("new_id must be callable")
    spans = item_spans(raw)
    if not spans or len(spans) > max_items:
        return None
    gaps = [raw[: spans[0][0]], *(raw[a:b] for (_, a), (b, _) in itertools.pairwise(spans)), raw[spans[-1][1] :]]
    if [gap.strip(_JSON_BLANKS) for gap in gaps] != [b"[", *[b","] * (len(spans) - 1), b"]"]:
        return None
    limits = (max_tag, max_depth, max_array, max_key, max_leaves)
    found = []
    for start, end in spans:
        fast = scan_envelope(raw[start:end], *limits) if end - start <= max_event_bytes else None
        if fast is None:
            return None
        found.append(fast)
    out = []
    for fast in found:
        event_id = fast[0]
        if event_id is None and not isinstance(event_id := new_id(), str):
            raise TypeError("new_id must return a str")
        out.append(_envelope_of(envelope_type, fast, event_id, fast[0] is None, now))
    return out


# --- timestamps and string columns -----------------------------------------------------------------


def _ts_parts(ts: Any) -> tuple[int, int]:
    """(microseconds, whole seconds toward zero) since the epoch: exact for a UTC datetime,
    through timestamp() for any other (naive: local time), as the Python they replace computed."""
    if not isinstance(ts, datetime):
        raise TypeError(f"a timestamp must be a datetime, not {_type_name(ts)}")
    if ts.tzinfo is UTC:
        us = (ts - _EPOCH) // _MICROSECOND
        return us, (us // 1_000_000 if us >= 0 else -(-us // 1_000_000))
    f = ts.timestamp()
    return round(f * 1_000_000), int(f)


def _row_item(row: Any, i: int, index: int) -> Any:
    if not isinstance(row, tuple) or not 0 <= index < len(row):
        raise TypeError(f"row {i} is not a tuple with an item {index}")
    return row[index]


def _need_list(rows: Any) -> list[Any]:
    if type(rows) is not list:
        raise TypeError(f"argument 1 must be list, not {_type_name(rows)}")
    return rows


def epoch_micros(rows: list[Any], index: int, /) -> bytes:
    """Item ``index`` (a datetime) of every tuple in ``rows`` as microseconds since the epoch,
    packed int64 (an Arrow column's buffer)."""
    rows, index = _need_list(rows), operator.index(index)
    return array("q", [_ts_parts(_row_item(row, i, index))[0] for i, row in enumerate(rows)]).tobytes()


def bucket_starts(tss: Sequence[datetime], width: int, /) -> list[int]:
    """``e - e % width`` for ``e = int(ts.timestamp())`` of each datetime (exact for UTC ones)."""
    width = operator.index(width)
    if width <= 0:
        raise ValueError("width must be positive")
    starts = []
    for ts in _as_list(tss, "tss"):
        e = _ts_parts(ts)[1]
        starts.append(e - e % width)
    return starts


def _as_list(seq: Any, name: str) -> list[Any]:
    if type(seq) is list:
        return seq
    try:
        return list(seq)
    except TypeError:
        raise TypeError(f"{name} must be a sequence") from None


_INT32_MAX = 2**31 - 1


def string_column(rows: list[Any], index: int, /) -> tuple[bytes | None, bytes, bytes, int]:
    """Item ``index`` (str or None) of every tuple in ``rows`` as an Arrow string column's buffers:
    validity bitmap (None without nulls), int32 offsets, UTF-8 data; and the null count."""
    rows, index = _need_list(rows), operator.index(index)
    parts: list[bytes] = []
    offsets = array("i", [0])
    bits = bytearray((len(rows) + 7) // 8)
    at = nulls = 0
    for i, row in enumerate(rows):
        v = _row_item(row, i, index)
        if v is None:
            nulls += 1
        elif isinstance(v, str):
            b = v.encode()
            parts.append(b)
            at += len(b)
            if at > _INT32_MAX:
                raise OverflowError("a string column over 2 GiB")
            bits[i >> 3] |= 1 << (i & 7)
        else:
            raise TypeError(f"row {i}: item {index} is not a str or None")
        offsets.append(at)
    return (bytes(bits) if nulls else None), offsets.tobytes(), b"".join(parts), nulls


def group_ids(
    groups: dict[Any, int],
    cohorts: Sequence[tuple[str, str, str, str]],
    served_models: Sequence[str | None],
    starts: Sequence[int],
    /,
) -> list[int]:
    """The id in ``groups`` (grown as keys first appear) of each output's rollup group:
    (model, prompt_version, contract, source, served model unless None or the model, bucket start)."""
    if type(groups) is not dict:
        raise TypeError(f"argument 1 must be dict, not {_type_name(groups)}")
    cs, ss, bs = _as_list(cohorts, "cohorts"), _as_list(served_models, "served_models"), _as_list(starts, "starts")
    if not len(cs) == len(ss) == len(bs):
        raise ValueError("cohorts, served_models and starts differ in length")
    ids = []
    for c, s, b in zip(cs, ss, bs, strict=True):
        if not isinstance(c, tuple) or len(c) != 4:
            raise TypeError("a cohort is a (model, prompt_version, contract, source) tuple")
        model = c[0]
        key = (model, c[1], c[2], c[3], None if s is None or s is model or s == model else s, b)
        gid = groups.get(key)
        if gid is None:
            gid = groups[key] = len(groups)
        ids.append(gid)
    return ids


# --- the rollup accumulator ------------------------------------------------------------------------

# counts() columns after (group, path): present, then one per JSON type, then long strings
_PRESENT, _LONG, _TRUE = 2, 10, 11


class Acc:
    """Rollup accumulator: flattens outputs into counts per (group, path).

    ``add(output, group)`` walks one output and counts, per (group, path) slot: presence, each JSON
    type (``flatten.json_type_of``), long strings; per slot and short string, array length and
    number bin (``rules.number_bin``): occurrences. Paths are named on first sight by
    ``namer(parent id, key)`` (key None for an array's items, parent -1 for the output itself),
    which owns the path syntax. Slots, and each slot's values, are in order of first appearance;
    a slot's lengths and number bins too (the C lists those in its table order: callers read them
    as sets).
    """

    __slots__ = (
        "_bin",
        "_bins",
        "_column",
        "_depth",
        "_float_column",
        "_lengths",
        "_max_value_length",
        "_namer",
        "_owner",
        "_paths",
        "_rows",
        "_slots",
        "_values",
        "_walking",
    )

    def __init__(self, namer: Callable[[int, str | None], int], max_value_length: int, /) -> None:
        if hasattr(self, "_namer"):
            raise RuntimeError("Acc is initialised once")
        from .flatten import JsonType

        self._namer = namer
        # One call at a time, as the C: a counting call owns the accumulator until it returns (its
        # thread, and how many such calls that thread is in: its namer may count or read too);
        # while add_many counts texts (the C without the GIL) no call at all.
        self._owner = 0
        self._depth = 0
        self._walking = False
        self._max_value_length = operator.index(max_value_length)
        self._bin = number_bin
        # the column of each JSON type (null, boolean, ..., object), and of each Python type whose
        # values all have one; a float's depends on the value (json_type_of says)
        self._float_column = {t: 3 + i for i, t in enumerate(JsonType)}
        samples: tuple[Any, ...] = (None, True, 0, "", [], {})
        self._column = {type(x): self._float_column[json_type_of(x)] for x in samples}
        self._paths: dict[tuple[int, str | None], int] = {}  # (parent id, key) -> path id
        self._slots: dict[tuple[int, int], int] = {}  # (group, path) -> slot
        self._rows: list[list[int]] = []  # slot -> [group, path, present, types..., long, true]
        self._values: list[dict[str, int]] = []  # slot -> short string -> count
        self._lengths: list[dict[int, int]] = []  # slot -> array length -> count
        self._bins: list[dict[float, int]] = []  # slot -> number bin -> count

    def _path(self, parent: int, key: str | None) -> int:
        known = self._paths.get((parent, key))
        if known is not None:
            return known
        new = self._namer(parent, key)
        if not isinstance(new, int):
            raise TypeError(f"namer returned {_type_name(new)}, not an int")
        if new < 0:
            raise ValueError("namer returned a negative id")
        self._paths[(parent, key)] = new
        return new

    def _slot(self, group: int, path: int) -> int:
        """A new slot for (group, path)."""
        slot = self._slots[(group, path)] = len(self._rows)
        self._rows.append([group, path] + [0] * 10)
        self._values.append({})
        self._lengths.append({})
        self._bins.append({})
        return slot

    def _value(self, v: Any, group: int, path: int) -> None:
        slot = self._slots.get((group, path))
        if slot is None:
            slot = self._slot(group, path)
        row = self._rows[slot]
        row[_PRESENT] += 1  # before the kind is known, as the C counts
        t = type(v)
        column = self._column.get(t)
        if column is None:
            if t is not float:
                raise TypeError(f"unexpected {_type_name(v)} in an output")
            column = self._float_column[json_type_of(v)]
        row[column] += 1
        if v is True:
            row[_TRUE] += 1
        elif t is int or t is float:
            if v == v:  # NaN has no bin
                bins = self._bins[slot]
                b = self._bin(v)
                bins[b] = bins.get(b, 0) + 1
        elif t is str:
            if len(v) <= self._max_value_length:
                values = self._values[slot]
                n = values.get(v)
                if n is None:
                    v.encode()  # a value becomes Arrow text: it must be valid Unicode
                    values[v] = 1
                else:
                    values[v] = n + 1
            else:
                row[_LONG] += 1
        elif t is list:
            lengths = self._lengths[slot]
            lengths[len(v)] = lengths.get(len(v), 0) + 1
            if v:
                items = self._path(path, None)
                for x in v:
                    self._value(x, group, items)
        elif t is dict:
            self._members(v, group, path)

    def _members(self, obj: dict[str, Any], group: int, path: int) -> None:
        for k, x in obj.items():
            self._value(x, group, self._path(path, k))

    @staticmethod
    def _group(group: int) -> int:
        group = operator.index(group)
        if group < 0:
            raise ValueError("group must be >= 0")
        return group

    def _free(self) -> None:
        """Refuse a call while add_many counts texts (from its namer, say), or while another
        thread is inside a counting call: the C walks texts without the GIL, and another thread's
        call may find its arrays half grown."""
        if self._walking or (self._depth and self._owner != threading.get_ident()):
            raise RuntimeError("the accumulator is in use by another call")

    def _enter(self) -> None:
        self._free()
        self._owner = threading.get_ident()
        self._depth += 1

    def _leave(self) -> None:
        self._depth -= 1
        if not self._depth:
            self._owner = 0

    def add(self, output: dict[str, Any], group: int, /) -> None:
        """Count one parsed output (a dict, not a subclass) in its group."""
        self._enter()
        try:
            if type(output) is not dict:
                raise TypeError(f"an output is a dict or its JSON text, not {_type_name(output)}")
            self._members(output, self._group(group), -1)
        finally:
            self._leave()

    def add_json(self, text: str | bytes, group: int, /) -> None:
        """Count one output given as JSON text, as ``add(json.loads(text), group)`` would."""
        self._enter()
        try:
            self._add_json(text, group)
        finally:
            self._leave()

    def _add_json(self, text: str | bytes, group: int) -> None:
        if not isinstance(text, str | bytes):
            raise TypeError(f"an output's text is str or bytes, not {_type_name(text)}")
        group = self._group(group)
        try:
            output = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"add_json: {exc}") from None
        if type(output) is not dict:
            raise ValueError("add_json: an output is a JSON object")
        self._members(output, group, -1)

    def add_many(self, outputs: Sequence[dict[str, Any] | str], groups: Sequence[int], /) -> None:
        """``add`` or ``add_json`` of each (output, group), in order, of the outputs and groups as
        they are when it is called (the namer may change the caller's lists meanwhile)."""
        self._enter()
        try:
            os_, gs = tuple(_as_list(outputs, "outputs")), tuple(_as_list(groups, "groups"))
            if len(os_) != len(gs):
                raise ValueError("outputs and groups differ in length")
            if all(isinstance(o, str) for o in os_):
                self._walking = True
                try:
                    for o, g in zip(os_, gs, strict=True):
                        self._add_json(o, g)
                finally:
                    self._walking = False
                return
            for o, g in zip(os_, gs, strict=True):
                if isinstance(o, str):
                    self.add_json(o, g)
                else:
                    self.add(o, g)
        finally:
            self._leave()

    def counts(self) -> list[tuple[int, ...]]:
        """Per slot: (group, path, present, null, boolean, integer, number, string, array, object,
        long, true); slot i is row i."""
        self._free()
        return [tuple(row) for row in self._rows]

    def count_rows(self) -> bytes:
        """``counts`` packed: per slot, its twelve values as native int64, slot after slot."""
        self._free()
        return array("q", [x for row in self._rows for x in row]).tobytes()

    def value_rows(self) -> tuple[bytes, bytes, bytes, bytes]:
        """Short string values: slots (int64), offsets (int32, rows + 1) and UTF-8 data of an
        Arrow string column, counts (int64), packed native."""
        self._free()
        slots, counts, parts = array("q"), array("q"), []
        offsets = array("i", [0])
        at = 0
        for slot, values in enumerate(self._values):
            for v, n in values.items():
                b = v.encode()
                at += len(b)
                if at > _INT32_MAX:
                    raise OverflowError("value rows exceed 2 GiB of text")
                parts.append(b)
                slots.append(slot)
                offsets.append(at)
                counts.append(n)
        return slots.tobytes(), offsets.tobytes(), b"".join(parts), counts.tobytes()

    @overload
    def rows(self, which: Literal[0], /) -> tuple[list[int], list[str], list[int]]: ...
    @overload
    def rows(self, which: Literal[1, 2], /) -> tuple[bytes, bytes, bytes]: ...
    def rows(self, which: int, /) -> tuple[list[int], list[str], list[int]] | tuple[bytes, bytes, bytes]:
        """The values (0) as three lists: slots, values, counts; array lengths (1): slots, lengths,
        counts (int64 each); number bins (2): slots (int64), representative values (float64),
        counts (int64); packed native."""
        self._free()
        which = operator.index(which)
        if which == 0:
            rows = [(slot, v, n) for slot, values in enumerate(self._values) for v, n in values.items()]
            return [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]
        if which not in (1, 2):
            raise ValueError("rows(which): which is 0, 1 or 2")
        tables: list[dict[Any, int]] = self._lengths if which == 1 else self._bins
        slots, counts = array("q"), array("q")
        keys = array("q" if which == 1 else "d")
        for slot, table in enumerate(tables):
            for k, n in table.items():
                slots.append(slot)
                keys.append(k)
                counts.append(n)
        return slots.tobytes(), keys.tobytes(), counts.tobytes()
