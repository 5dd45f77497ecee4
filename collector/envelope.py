"""The envelope: the one point where incoming events are validated.

Every path into shapewatch (HTTP body, NDJSON line, JSONL file, provider
adapter) ends here. Parsing is orjson's (fast, refuses NaN, Infinity and
invalid UTF-8); the two things orjson lets through silently, duplicate keys
and integers too large for 64 bits (it turns them into floats), are caught by
a cheap test on the raw text (keys written vs keys kept) and, only when it
finds something, by an exact re-parse that marks them so the walk can name
the field.

The rules are written once, in Python (``_validate_slowly``). A C check
(``_speedups.check_envelope``) runs first and only recognises an envelope that
is plainly valid, returning its fields; anything else goes to the Python rules,
which name every fault. Bulk import and HTTP ingest spend about half as long
per envelope that way; tests/collector/test_envelope_fast_path.py holds the two
to the same answers.

Before either, JSON text (a line, an HTTP body's items) meets a third, quicker
reader: ``_speedups.scan_envelope`` checks the plain case of the same rules on
the text itself and writes the output's canonical text and the payload hash
without parsing the output into Python objects (the rollups count the text:
``Acc.add_json``). It too only recognises; whatever it declines takes the way
above. tests/collector/test_scanner.py holds it to that way's envelopes.

>>> env = parse_envelope(b'{"model": "m", "prompt_version": "p", "output": {"a": 1}}', LIMITS)
>>> env.contract, env.output_json
('default', '{"a":1}')
"""

from __future__ import annotations

import json
import math
import re
import sys
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any, NamedTuple, NoReturn

import orjson

from .accel import speedups as _speedups
from .errors import BatchTooLarge, EnvelopeInvalid, FieldError
from .rules import KNOWN_FIELDS as _KNOWN
from .rules import LIMITS, PRODUCTION, SOURCES, TS_END, TS_MIN, Limits, payload_hash
from .rules import TAGS as _TAGS
from .rules import BigInt as _BigInt
from .rules import check_tag as _tag
from .rules import epoch_us as _epoch_us
from .rules import json_type_name as _jtype
from .settings import Settings

__all__ = [
    "LIMITS",
    "PRODUCTION",
    "SOURCES",
    "TS_END",
    "TS_MIN",
    "Envelope",
    "Limits",
    "envelope_json_schema",
    "limits_from_settings",
    "loads_marking",
    "parse_body",
    "parse_envelope",
    "payload_hash",
    "tag_problem",
    "validate_envelope",
]

_MAX_SAFE_INT = 2**64  # orjson parses up to u64; beyond that it silently yields a float
# The C paths accept the same range (one definition: this one); until told, they accept none.
_speedups.set_ts_range(_epoch_us(TS_MIN), _epoch_us(TS_END))


def limits_from_settings(s: Settings) -> Limits:
    return Limits(
        max_event_bytes=s.max_event_bytes,
        max_depth=s.max_depth,
        max_array_length=s.max_array_length,
        max_key_length=s.max_key_length,
        max_leaves=s.max_leaves,
        max_attributes=s.max_attributes,
        max_tag_length=s.max_tag_length,
    )


class Envelope(NamedTuple):
    """A validated event, ready for the store. ``output_json`` is the output's JSON text.

    A NamedTuple rather than a frozen dataclass: bulk import builds a million of
    these, and a frozen dataclass's ``__init__`` costs more than the parse.
    """

    event_id: str
    generated_id: bool
    ts: datetime
    model: str
    prompt_version: str
    contract: str
    output_json: str
    payload_hash: str
    served_model: str | None = None
    contract_version: str | None = None
    source: str | None = None
    run_id: str | None = None
    agent_release: str | None = None
    finish_reason: str | None = None
    attributes_json: str | None = None
    #: the parsed output, kept while the event travels to the store (rollups count it
    #: without parsing again); never stored as such. None when the C scanner read the
    #: envelope: its output was never parsed, and rollups count ``output_json`` itself
    output: dict[str, Any] | None = None


def envelope_json_schema(lim: Limits) -> dict[str, Any]:
    """The envelope as a JSON Schema (the OpenAPI document publishes it).

    It states what a schema can: types, lengths, counts and the closed sets. The rest
    (a time zone on ``ts`` and its range, nesting, leaves and 64-bit integers inside ``output``, an id
    reused with another payload) is checked by ``validate_envelope`` and answered 422.
    """
    tag = {
        "type": "string",
        "minLength": 1,
        "maxLength": lim.max_tag_length,
        "pattern": "^[^\\x00]*\\S[^\\x00]*$",
        "description": "no NUL, not only white space",
    }
    optional = {**tag, "type": ["string", "null"]}  # null means absent
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["model", "prompt_version", "output"],
        "properties": {
            "event_id": {
                "type": ["string", "null"],
                "minLength": 1,
                "maxLength": 128,
                "pattern": "\\S",
                "description": "the idempotency key: created once per event, before any retry",
            },
            "ts": {
                "type": ["string", "null"],
                "format": "date-time",
                "description": f"ISO 8601 with a zone, naming a time from {TS_MIN:%Y-%m-%dT%H:%M:%SZ} up to, "
                f"not including, {TS_END:%Y-%m-%dT%H:%M:%SZ}; default: receipt",
            },
            "model": tag,
            "prompt_version": tag,
            "contract": {**optional, "default": "default"},
            **dict.fromkeys(_TAGS, optional),
            "source": {"enum": [*sorted(SOURCES), None]},
            "attributes": {
                "type": ["object", "null"],
                "maxProperties": lim.max_attributes,
                "propertyNames": {"maxLength": 64},
                "additionalProperties": {"type": "string", "maxLength": lim.max_tag_length},
            },
            "output": {"type": "object", "description": "the structured output itself"},
        },
    }


# --- exact re-parse markers -------------------------------------------------------------


class _DupKeys(dict[str, Any]):
    """A JSON object that had a key twice (only built by the exact re-parse)."""

    dup: str = ""


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d = dict(pairs)
    if len(d) == len(pairs):
        return d
    marked = _DupKeys(d)
    seen: set[str] = set()
    for k, _ in pairs:
        if k in seen:
            marked.dup = k
            break
        seen.add(k)
    return marked


def _int(text: str) -> int | _BigInt:
    v = int(text)
    return _BigInt(text) if not -(2**63) <= v < _MAX_SAFE_INT else v


def loads_marking(text: str | bytes) -> Any:
    """Parse JSON with Python's parser, marking duplicate keys and too-large integers.

    For JSON that reaches shapewatch other than through orjson (provider adapters
    parse tool arguments with it): ``validate_envelope`` then names each marked
    field, exactly as for an HTTP body. NaN and Infinity raise ValueError, and so does a
    number too large for a float (``1e400``), which Python's parser would make infinite
    (orjson refuses it too).
    """
    return json.loads(
        text, object_pairs_hook=_pairs, parse_int=_int, parse_float=_finite_float, parse_constant=_no_constant
    )


def _finite_float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"number {text[:40]} is too large for a 64-bit float")
    return v


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _exact_loads(raw: bytes) -> Any:
    try:
        return json.loads(raw, object_pairs_hook=_pairs, parse_int=_int)
    except RecursionError:
        # orjson parsed it (it allows 1,024 levels), Python's parser gives up sooner:
        # far deeper than any limit we accept either way.
        raise _TooDeepToReparse([FieldError("", "nested too deeply to parse", code="too_deep")]) from None


class _TooDeepToReparse(EnvelopeInvalid):
    """The exact re-parse hit Python's recursion limit."""


def _may_hide_something(raw: bytes, keys: int, huge_float: bool) -> bool:
    """Cheap test: could orjson have merged duplicate keys or rounded a huge integer?

    ``count_keys`` counts the keys written in the text (exactly: it skips strings
    with their escapes); fewer keys in the parsed objects means one was merged.
    A float beyond 2**63 may be a rounded integer literal.
    """
    return huge_float or _speedups.count_keys(raw) != keys


# --- the walk over an output --------------------------------------------------------------


class _Bad(Exception):
    def __init__(self, code: str, reason: str, parts: list[str] | None = None) -> None:
        self.code = code
        self.reason = reason
        self.parts = parts or []


class _Walk:
    """Counts keys and leaves and enforces limits; names the field on failure."""

    __slots__ = ("huge_float", "keys", "leaves", "lim")

    def __init__(self, lim: Limits) -> None:
        self.lim = lim
        self.keys = 0
        self.leaves = 0
        self.huge_float = False

    def value(self, v: Any, depth: int) -> None:
        # Hot path: scalars are counted inline, only containers recurse.
        t = type(v)
        lim = self.lim
        if depth > lim.max_depth:
            raise _Bad("too_deep", f"nested deeper than {lim.max_depth} levels")
        if t is dict:
            self.keys += len(v)
            maxk = lim.max_key_length
            items: Any = v.items()
        elif t is list:
            if len(v) > lim.max_array_length:
                raise _Bad("too_large", f"array has {len(v)} items; the limit is {lim.max_array_length}")
            maxk = -1
            items = enumerate(v)
        elif t is _DupKeys:
            raise _Bad("duplicate_key", "duplicate key", [_key(v.dup)])
        else:
            raise _Bad(
                "number_too_large", f"integer with {v.digits} digits is too large to keep exactly (64-bit limit)"
            )
        leaves = 0
        for k, x in items:
            if maxk >= 0 and len(k) > maxk:
                raise _Bad("too_large", f"key is {len(k)} characters long; the limit is {maxk}", [_key(k[:40] + "...")])
            tx = type(x)
            if tx is dict or tx is list or tx is _DupKeys or tx is _BigInt:
                try:
                    self.value(x, depth + 1)
                except _Bad as e:
                    e.parts.append(_key(k) if maxk >= 0 else f"[{k}]")
                    raise
            else:
                leaves += 1
                if tx is float and not -9.2e18 < x < 9.2e18:
                    if not math.isfinite(x):  # only from a Python object: no parser here makes one
                        raise _Bad("invalid_value", f"{x} is not a JSON number", [_key(k) if maxk >= 0 else f"[{k}]"])
                    self.huge_float = True
        self.leaves += leaves
        if self.leaves > lim.max_leaves:
            raise _Bad("too_large", f"has more than {lim.max_leaves} leaf values")


def _key(k: str) -> str:
    return "." + k


def _field_path(base: str, parts: list[str]) -> str:
    return base + "".join(reversed(parts))


# --- envelope validation --------------------------------------------------------------------


def tag_problem(value: object, *, path: str, max_length: int | None = None) -> FieldError | None:
    """Why ``value`` is not a valid tag (a ``FieldError`` at ``path``), or None when it is one: the
    rule above, for a tag that reaches the store by another door (an imported baseline document).

    A tag is a non-empty string of at most ``max_length`` characters (default: the
    ``max_tag_length`` setting's default, 256) that is not only whitespace and holds no NUL.

    >>> tag_problem(" ", path="/cohort/model")
    FieldError(path='/cohort/model', reason='must not be empty', code='invalid_value')
    """
    errors: list[FieldError] = []
    _tag({"tag": value}, "tag", errors, LIMITS if max_length is None else Limits(max_tag_length=max_length), True)
    return FieldError(path, errors[0].reason, errors[0].code) if errors else None


def _parse_ts(v: Any, errors: list[FieldError], now: datetime) -> datetime:
    if v is None:
        return now
    if type(v) is not str:
        errors.append(
            FieldError("ts", f"must be an ISO 8601 string with a zone, got {_jtype(v)}", code="invalid_timestamp")
        )
        return now
    try:
        ts = datetime.fromisoformat(v.upper())  # RFC 3339 allows a lowercase 't' and 'z'
    except ValueError:
        errors.append(FieldError("ts", f"{v[:40]!r} is not an ISO 8601 timestamp", code="invalid_timestamp"))
        return now
    if ts.tzinfo is None:
        errors.append(
            FieldError("ts", f"{v[:40]!r} has no time zone; add 'Z' or an offset like +00:00", code="invalid_timestamp")
        )
        return now
    try:
        utc: datetime | None = ts.astimezone(UTC)
    except OverflowError:
        utc = None
    if utc is None or not TS_MIN <= utc < TS_END:
        errors.append(
            FieldError(
                "ts",
                f"{v[:40]!r} is outside the accepted range: from {TS_MIN:%Y-%m-%dT%H:%M:%SZ} "
                f"up to, not including, {TS_END:%Y-%m-%dT%H:%M:%SZ}",
                code="invalid_timestamp",
            )
        )
        return now
    return utc


def validate_envelope(
    obj: Any,
    lim: Limits,
    *,
    keys_seen: list[int] | None = None,
    now: datetime | None = None,
    default_id: str | Callable[[], str] | None = None,
) -> Envelope:
    """Check one parsed envelope; raise EnvelopeInvalid naming every failing field.

    ``keys_seen`` (a one-item counter) accumulates the keys of the document so
    the caller can run the duplicate-key test over a whole body at once.
    """
    fast = _speedups.check_envelope(obj, *lim.scanner)
    if fast is not None:  # plainly valid (the C twin of the rules below): skip to the end
        (
            event_id,
            ts,
            model,
            prompt_version,
            contract,
            served_model,
            contract_version,
            source,
            run_id,
            agent_release,
            finish_reason,
            output,
            keys,
            huge,
        ) = fast
        if keys_seen is not None:
            keys_seen[0] += keys
            if huge:
                keys_seen[1] = 1
        generated = event_id is None
        if event_id is None:
            event_id = (default_id() if callable(default_id) else default_id) or uuid.uuid4().hex
        return _finish(
            lim,
            event_id,
            generated,
            ts or now or datetime.now(UTC),
            model,
            prompt_version,
            contract or "default",
            ts,
            source,
            None,
            output,
            (served_model, contract_version, run_id, agent_release, finish_reason),
        )
    return _validate_slowly(obj, lim, keys_seen=keys_seen, now=now, default_id=default_id)


_UNKNOWN_NAMED = 5


def _validate_slowly(
    obj: Any,
    lim: Limits,
    *,
    keys_seen: list[int] | None = None,
    now: datetime | None = None,
    default_id: str | Callable[[], str] | None = None,
) -> Envelope:
    """``validate_envelope`` itself: the reference for every rule and every error message."""
    now = now or datetime.now(UTC)
    if type(obj) is _DupKeys:
        raise EnvelopeInvalid([FieldError(obj.dup, "duplicate key", code="duplicate_key")])
    if type(obj) is not dict:
        raise EnvelopeInvalid(
            [FieldError("", f"an envelope must be a JSON object, got {_jtype(obj)}", code="wrong_type")]
        )
    errors: list[FieldError] = []
    unknown = [] if _KNOWN.issuperset(obj) else [k for k in obj if k not in _KNOWN]
    # A few are named; the rest counted in one line: each name would otherwise be an error of
    # its own, and 95,000 keys made a 20 MB reply.
    for k in unknown[:_UNKNOWN_NAMED]:
        errors.append(
            FieldError(
                k[:80], "unknown envelope field; known fields: " + ", ".join(sorted(_KNOWN)), code="unknown_field"
            )
        )
    if len(unknown) > _UNKNOWN_NAMED:
        errors.append(
            FieldError("", f"{len(unknown) - _UNKNOWN_NAMED} more unknown envelope fields", code="unknown_field")
        )
    model = _tag(obj, "model", errors, lim, True)
    prompt_version = _tag(obj, "prompt_version", errors, lim, True)
    contract = _tag(obj, "contract", errors, lim, False) or "default"
    tags = {n: _tag(obj, n, errors, lim, False) for n in _TAGS}
    source = _tag(obj, "source", errors, lim, False)
    if source is not None and source not in SOURCES:
        errors.append(
            FieldError("source", f"{source[:40]!r} is not one of {', '.join(sorted(SOURCES))}", code="invalid_value")
        )
    event_id = obj.get("event_id")
    generated = event_id is None
    if generated:
        # Without a client key a retry cannot be recognised: the server makes one up.
        event_id = (default_id() if callable(default_id) else default_id) or uuid.uuid4().hex
    elif type(event_id) is not str or not event_id.strip():
        errors.append(FieldError("event_id", "must be a non-empty string", code="invalid_value"))
    elif len(event_id) > 128:
        errors.append(FieldError("event_id", f"is {len(event_id)} characters long; the limit is 128", code="too_large"))
    ts = _parse_ts(obj.get("ts"), errors, now)
    attrs = obj.get("attributes")
    attributes_json = None
    if attrs is not None:
        if type(attrs) is _DupKeys:
            errors.append(FieldError("attributes." + attrs.dup, "duplicate key", code="duplicate_key"))
        elif type(attrs) is not dict:
            errors.append(
                FieldError("attributes", f"must be an object of strings, got {_jtype(attrs)}", code="wrong_type")
            )
        elif len(attrs) > lim.max_attributes:
            errors.append(
                FieldError(
                    "attributes", f"has {len(attrs)} entries; the limit is {lim.max_attributes}", code="too_large"
                )
            )
        else:
            before = len(errors)
            for k, v in attrs.items():
                if type(v) is not str:
                    errors.append(
                        FieldError(f"attributes.{k[:64]}", f"must be a string, got {_jtype(v)}", code="wrong_type")
                    )
                elif len(v) > lim.max_tag_length or len(k) > 64:
                    errors.append(
                        FieldError(
                            f"attributes.{k[:64]}",
                            f"key over 64 or value over {lim.max_tag_length} characters",
                            code="too_large",
                        )
                    )
            if len(errors) == before:  # only strings: nothing the exact re-parse marked
                attributes_json = orjson.dumps(attrs, option=orjson.OPT_SORT_KEYS).decode()
    if "output" not in obj:
        errors.append(FieldError("output", "is required", code="missing"))
    output = obj.get("output")
    walk = _Walk(lim)
    if "output" in obj:
        if type(output) is _DupKeys:
            errors.append(FieldError("output." + output.dup, "duplicate key", code="duplicate_key"))
        elif type(output) is not dict:
            errors.append(FieldError("output", f"must be a JSON object, got {_jtype(output)}", code="wrong_type"))
        else:
            fast = _speedups.walk(output, lim.max_depth, lim.max_array_length, lim.max_key_length, lim.max_leaves)
            if fast is not None:
                walk.keys, walk.leaves, walk.huge_float = fast[0], fast[1], bool(fast[2])
            else:  # something is off: the Python walk names it
                try:
                    walk.value(output, 1)
                except _Bad as bad:
                    errors.append(FieldError(_field_path("output", bad.parts), bad.reason, bad.code))
    if keys_seen is not None:
        keys_seen[0] += len(obj) + walk.keys + (len(attrs) if type(attrs) is dict else 0)
        if walk.huge_float:
            keys_seen[1] = 1
    if errors:
        exc = EnvelopeInvalid(errors)
        exc.event_id = None if generated or type(event_id) is not str else event_id[:128]
        raise exc
    assert isinstance(event_id, str) and model and prompt_version
    assert isinstance(output, dict)
    return _finish(
        lim,
        event_id,
        generated,
        ts,
        model,
        prompt_version,
        contract,
        None if obj.get("ts") is None else ts,
        source,
        attributes_json,
        output,
        (tags["served_model"], tags["contract_version"], tags["run_id"], tags["agent_release"], tags["finish_reason"]),
    )


def _finish(
    lim: Limits,
    event_id: str,
    generated: bool,
    ts: datetime,
    model: str,
    prompt_version: str,
    contract: str,
    ts_given: datetime | None,
    source: str | None,
    attributes_json: str | None,
    output: dict[str, Any],
    tags: tuple[str | None, str | None, str | None, str | None, str | None],
) -> Envelope:
    """The envelope of validated fields: the output's text and the payload hash."""
    try:
        output_bytes = orjson.dumps(output)
        sorted_bytes = orjson.dumps(output, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError as err:  # only from a Python-built dict: a lone surrogate
        _refuse(
            FieldError("output", f"holds text that is not valid Unicode ({err})", "invalid_value"),
            None if generated else event_id,
        )
    if len(output_bytes) > lim.max_event_bytes:  # an output built by a provider adapter has no line either
        _refuse(
            FieldError(
                "output",
                f"is {len(output_bytes)} bytes; the limit for one envelope is {lim.max_event_bytes}",
                "too_large",
            ),
            None if generated else event_id,
        )
    served_model, contract_version, run_id, agent_release, finish_reason = tags
    return Envelope(
        event_id,
        generated,
        ts,
        model,
        prompt_version,
        contract,
        output_bytes.decode(),
        payload_hash(
            sorted_bytes,
            model,
            prompt_version,
            contract,
            None if ts_given is None else _epoch_us(ts_given),
            source,
            attributes_json,
            tags,
        ),
        served_model,
        contract_version,
        source,
        run_id,
        agent_release,
        finish_reason,
        attributes_json,
        output,
    )


def _refuse(error: FieldError, event_id: str | None) -> NoReturn:
    exc = EnvelopeInvalid([error])
    exc.event_id = None if event_id is None else event_id[:128]
    raise exc


def _loads(raw: bytes, path: str) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        msg = str(exc)
        if "recursion" in msg or "depth limit" in msg:
            msg = "nested too deeply to parse"
            where = path
        else:
            msg, where = _locate(raw, exc, path)
        raise EnvelopeInvalid([FieldError(where, f"not valid JSON: {msg}", code="invalid_json")], status=400) from None


# A string literal (escapes included; one the text ends inside runs to the end) or one structural
# character: enough to follow the nesting.
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*(?:"|\\?$)|[{}\[\],:]')
# Text that is not JSON is located in its first bytes only: a path is a courtesy, and following
# the nesting of a whole large body in Python would let a bad request cost far more than a good one.
_LOCATE_LIMIT = 1 << 22


def _locate(raw: bytes, exc: orjson.JSONDecodeError, base: str) -> tuple[str, str]:
    """(reason, field path) for text orjson refused: the path of the value being read where it
    failed (``output.deep.x`` for an ``Infinity`` there), under ``base``."""
    msg = str(exc)
    try:
        text = raw.decode()
        pos = exc.pos  # orjson counts characters
    except UnicodeDecodeError as bad:  # orjson's message for this ("surrogates") misleads
        text = raw[: bad.start].decode()
        pos = len(text)
        msg = f"invalid UTF-8 (byte 0x{raw[bad.start]:02x} at offset {bad.start})"
    if pos > _LOCATE_LIMIT:
        return msg, base
    return msg, _path_at(text, pos, base)


def _path_at(text: str, pos: int, base: str) -> str:
    """The field path of the value being read at character ``pos`` of JSON text (valid up to
    about there): keys as ``.key``, array items as ``[i]``, after ``base``."""
    stack: list[list[Any]] = []  # [is an object, key (None before it is read) or index, a key is next]
    for m in _TOKENS.finditer(text, 0, pos):
        tok = m.group()
        if tok[0] == '"':
            closed = len(tok) > 1 and tok[-1] == '"' and m.end() <= pos
            if closed and stack and stack[-1][0] and stack[-1][2]:
                try:
                    stack[-1][1] = json.loads(tok)
                except ValueError:
                    stack[-1][1] = tok[1:-1]
                stack[-1][2] = False
        elif tok == "{":
            stack.append([True, None, True])
        elif tok == "[":
            stack.append([False, 0, False])
        elif tok in "}]":
            if stack:
                stack.pop()
        elif tok == "," and stack:
            top = stack[-1]
            if top[0]:
                top[1], top[2] = None, True
            else:
                top[1] += 1
    parts = [base]
    for is_object, at, _ in stack:
        if at is None:
            break
        parts.append(_key(at) if is_object else f"[{at}]")
    return "".join(parts).lstrip(".")


def parse_envelope(
    raw: bytes, lim: Limits, *, now: datetime | None = None, default_id: str | Callable[[], str] | None = None
) -> Envelope:
    """Parse and validate one envelope given as JSON text (a JSONL line, an HTTP body)."""
    if len(raw) > lim.max_event_bytes:
        raise EnvelopeInvalid(
            [FieldError("", f"envelope is {len(raw)} bytes; the limit is {lim.max_event_bytes}", code="too_large")],
            status=413,
        )
    # The common case in one pass of C over the text (no parsed output at all); anything it
    # is not sure of goes the reference way, which accepts it or names the fault.
    fast = _speedups.scan_envelope(raw, *lim.scanner)
    if fast is not None:
        return _scanned(fast, now, default_id)
    return _parse_reference(raw, lim, now=now, default_id=default_id)


def _scanned(fast: tuple[Any, ...], now: datetime | None, default_id: str | Callable[[], str] | None) -> Envelope:
    """The envelope of what ``_speedups.scan_envelope`` read: its output is never parsed."""
    (
        event_id,
        ts,
        model,
        prompt_version,
        contract,
        served_model,
        contract_version,
        source,
        run_id,
        agent_release,
        finish_reason,
        output_json,
        payload_hash,
    ) = fast
    generated = event_id is None
    if event_id is None:
        event_id = (default_id() if callable(default_id) else default_id) or uuid.uuid4().hex
    return Envelope(
        event_id,
        generated,
        ts or now or datetime.now(UTC),
        model,
        prompt_version,
        contract or "default",
        output_json,
        payload_hash,
        served_model,
        contract_version,
        source,
        run_id,
        agent_release,
        finish_reason,
        None,
        None,
    )


def _parse_reference(
    raw: bytes, lim: Limits, *, now: datetime | None = None, default_id: str | Callable[[], str] | None = None
) -> Envelope:
    """``parse_envelope`` the reference way: orjson's parse, then ``validate_envelope``."""
    obj = _loads(raw, "")
    counter = [0, 0]
    try:
        env = validate_envelope(obj, lim, keys_seen=counter, now=now, default_id=default_id)
    except EnvelopeInvalid as first:
        if counter[0] and _may_hide_something(raw, counter[0], bool(counter[1])):
            try:
                exact = _exact_loads(raw)
            except _TooDeepToReparse:
                raise first from None  # the walk already named the nesting
            validate_envelope(exact, lim, now=now)  # names a hidden fault, if any
        raise
    if _may_hide_something(raw, counter[0], bool(counter[1])):
        return validate_envelope(_exact_loads(raw), lim, now=now, default_id=default_id)
    return env


def parse_body(
    raw: bytes, lim: Limits, *, ndjson: bool, now: datetime | None = None, max_items: int | None = None
) -> Iterator[Envelope | EnvelopeInvalid]:
    """Split an HTTP body into validated envelopes or the error of each item, in order.

    A body is one envelope, a JSON array of envelopes, or NDJSON (one per line).
    A body that is not JSON at all raises EnvelopeInvalid (status 400); one with more
    than ``max_items`` items raises BatchTooLarge before any item is validated (a
    16 MB body of ``[1,1,...]`` would otherwise answer eight million per-item errors).
    """
    now = now or datetime.now(UTC)
    if ndjson and max_items is not None and raw.count(b"\n") + 1 > max_items:
        lines = sum(1 for line in raw.split(b"\n") if line.strip())
        if lines > max_items:
            raise BatchTooLarge(lines, max_items)
    if ndjson:
        for n, line in enumerate(raw.split(b"\n")):
            line = line.strip()
            if not line:
                continue
            try:
                yield parse_envelope(line, lim, now=now)
            except EnvelopeInvalid as exc:
                yield _prefix(exc, f"line {n + 1}")
        return
    stripped = raw.lstrip()
    if not stripped.startswith(b"["):
        yield parse_envelope(raw, lim, now=now)
        return
    scanned = _scan_items(raw, lim, now, max_items)
    if scanned is not None:
        yield from scanned
        return
    items = _loads(raw, "body")
    assert isinstance(items, list)
    if max_items is not None and len(items) > max_items:
        raise BatchTooLarge(len(items), max_items)
    counter = [0, 0]
    results: list[Envelope | EnvelopeInvalid] = []
    # Each item's text as sent (its span in the body) meets max_event_bytes as a line does. Only
    # a body over the limit can hold an item over it, so only such a body is split.
    spans = _item_spans(raw, len(items)) if len(raw) > lim.max_event_bytes else None
    for i, obj in enumerate(items):
        try:
            if spans is not None and (size := spans[i][1] - spans[i][0]) > lim.max_event_bytes:
                big = EnvelopeInvalid(
                    [FieldError("", f"envelope is {size} bytes; the limit is {lim.max_event_bytes}", code="too_large")]
                )
                event_id = obj.get("event_id") if type(obj) is dict else None
                big.event_id = event_id[:128] if type(event_id) is str else None
                raise big
            results.append(validate_envelope(obj, lim, keys_seen=counter, now=now))
        except EnvelopeInvalid as exc:
            # kept without its traceback: that held the raising frames, and the item with them,
            # for as long as the answer is built (a batch of invalid items is most of a body)
            results.append(exc.with_traceback(None))
    if _may_hide_something(raw, counter[0], bool(counter[1])):
        try:
            exact: list[Any] | None = _exact_loads(raw)
        except _TooDeepToReparse:
            exact = None  # an item nested past Python's parser (and past max_depth): one at a time
            spans = spans or _item_spans(raw, len(items))
        for i, result in enumerate(results):
            if isinstance(result, EnvelopeInvalid):
                continue
            try:
                if exact is not None:
                    validate_envelope(exact[i], lim, now=now)
                else:  # an item that passed is within max_depth, so Python's parser takes it
                    assert spans is not None
                    start, end = spans[i]
                    validate_envelope(_exact_loads(raw[start:end]), lim, now=now)
            except EnvelopeInvalid as exc:
                results[i] = exc.with_traceback(None)
    yield from results


def _scan_items(raw: bytes, lim: Limits, now: datetime, max_items: int | None) -> list[Envelope] | None:
    """The envelopes of a JSON array body when the C scanner reads every item (see
    ``parse_envelope``); None sends the whole body the reference way, which then answers each
    item (errors, limits and all) exactly as it always has. The scanner reads the items' text
    with the GIL let go (``_speedups.scan_items``): a request's parse then holds up the writer's
    commits, which need the GIL between DuckDB's calls, only while it makes Python objects."""
    return _speedups.scan_items(
        bytes(raw),
        sys.maxsize if max_items is None else max_items,
        Envelope,
        now,
        _new_event_id,
        lim.max_event_bytes,
        *lim.scanner,
    )


def _new_event_id() -> str:
    """The event_id of an envelope sent without one (``generated_id`` is then True)."""
    return uuid.uuid4().hex


def _item_spans(raw: bytes, n: int) -> list[tuple[int, int]]:
    """The [start, end) of each of the ``n`` items of a JSON array body orjson has parsed."""
    spans = _speedups.item_spans(raw)
    if spans is None or len(spans) != n:  # orjson read it as an array of n: cannot happen
        raise RuntimeError(f"the body's items could not be delimited ({n} parsed)")
    return spans


def _prefix(exc: EnvelopeInvalid, where: str) -> EnvelopeInvalid:
    fields = [FieldError(f.path, f"{where}: {f.reason}", f.code) for f in exc.fields]
    new = EnvelopeInvalid(fields, status=exc.status)
    new.event_id = exc.event_id
    return new
