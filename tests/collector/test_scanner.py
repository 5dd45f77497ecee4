"""The scanner (``speedups.scan_envelope``: the C one, or its pure-Python twin under
SHAPEWATCH_ACCEL=python) against the reference path, and counting an
output from its text (``Acc.add_json``) against counting it parsed (``Acc.add``).

The scanner may always decline (None sends the text the reference way); what it must never do
is accept what the reference refuses, or answer anything but the reference's envelope: the same
fields, the same canonical output text and the same payload hash.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from datetime import UTC, datetime, timedelta, timezone
from functools import partial
from typing import Any

import orjson
import pytest
from harness import counted_beside, make_envelope
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shapewatch.collector import envelope
from shapewatch.collector.accel import IMPLEMENTATION, speedups
from shapewatch.collector.envelope import LIMITS, Envelope, Limits, parse_body, parse_envelope
from shapewatch.collector.errors import EnvelopeInvalid

NOW = datetime(2026, 11, 29, 12, 30, tzinfo=UTC)
PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def scan(raw: bytes, lim: Limits = LIMITS) -> tuple[Any, ...] | None:
    return speedups.scan_envelope(raw, *lim.scanner)


def reference(raw: bytes, lim: Limits = LIMITS) -> Envelope | None:
    try:
        return envelope._parse_reference(raw, lim, now=NOW)
    except EnvelopeInvalid:
        return None


def agrees(raw: bytes, lim: Limits = LIMITS) -> bool:
    """Assert the scanner answers as the reference does; True when it answered at all."""
    fast = scan(raw, lim)
    ref = reference(raw, lim)
    if fast is None:
        return False
    assert ref is not None, f"the scanner accepted text the reference refuses: {raw!r}"
    got = envelope._scanned(fast, NOW, None)
    if ref.generated_id:  # both made one up
        got = got._replace(event_id="generated")
        ref = ref._replace(event_id="generated")
    assert got == ref._replace(output=None)  # the canonical text and the payload hash included
    return True


# --- plain envelopes take the scanner -------------------------------------------------------------


def test_plain_envelopes_take_the_scanner_and_get_the_reference_envelope() -> None:
    outputs = [
        {},
        {"a": None, "b": True, "c": False, "d": [], "e": {}},
        {"n": [0, -1, 17, 123456789012345678, -123456789012345678, 0.5, -0.25, 100.0, -0.0, 0.0001, 3.14159]},
        {"s": 'quote " back \\ nl \n tab \t cr \r bs \b ff \f', "é": "日本語 🎉", "long": "x" * 1000},
        {"deep": {"a": [{"b": [{"c": [1, 2, {"d": "e"}]}]}]}},
        {"k.with[dots]": 1, "": "empty key"},
    ]
    for output in outputs:
        for env in (
            make_envelope(output=output),
            make_envelope(output=output, event_id=None, ts=None, contract=None),
            {"model": "m", "prompt_version": "p", "output": output},
        ):
            for raw in (
                orjson.dumps(env),
                json.dumps(env, ensure_ascii=False).encode(),
                json.dumps(env, ensure_ascii=False, indent=2).encode(),
            ):
                assert agrees(raw), raw


def test_the_payload_hash_is_blake2b_of_the_sorted_output_then_the_tags() -> None:
    env = make_envelope(
        output={"z": "x" * 300, "a": [1.5, {"y": 1, "b": 2}]}, ts="2026-11-29T12:00:00+02:00", contract=None
    )
    fast = scan(json.dumps(env, indent=1).encode())
    assert fast is not None
    output_json, payload_hash = fast[-2], fast[-1]
    assert output_json == '{"z":"' + "x" * 300 + '","a":[1.5,{"y":1,"b":2}]}'  # stored as sent, compacted
    ts_us = int(datetime(2026, 11, 29, 10, tzinfo=UTC).timestamp()) * 1_000_000
    tags = orjson.dumps(
        [
            env["model"],
            env["prompt_version"],
            "default",
            ts_us,
            env["source"],
            None,
            env["served_model"],
            env["contract_version"],
            env.get("run_id"),
            env.get("agent_release"),
            env.get("finish_reason"),
        ]
    )
    sorted_text = b'{"a":[1.5,{"b":2,"y":1}],"z":"' + b"x" * 300 + b'"}'
    assert payload_hash == hashlib.blake2b(sorted_text + tags, digest_size=16).hexdigest()


def test_what_the_scanner_declines_still_goes_the_reference_way() -> None:
    plain = orjson.dumps(make_envelope(output={"a": 1}))
    texts = [
        orjson.dumps(make_envelope(output={"a": 1e20})),  # an exponent
        orjson.dumps(make_envelope(attributes={"team": "x"})),  # attributes
        orjson.dumps(make_envelope(output={"a": "\u0001"})),  # a \u escape
        plain.replace(b'"a":1', b'"a":1.50'),  # a trailing zero
        plain.replace(b'"a":1', b'"a":1,"a":2'),
    ]  # a repeated key
    for raw in texts:
        assert scan(raw) is None
        ref = reference(raw)
        if ref is None:  # refused: parse_envelope names the fault as it always did
            assert b'"a":1,"a":2' in raw  # only the repeated key is refused
            continue
        assert parse_envelope(raw, LIMITS, now=NOW)._replace(event_id=ref.event_id) == ref


def test_a_json_array_body_is_scanned_item_by_item_or_not_at_all() -> None:
    items = [make_envelope(event_id=f"e{i}", output={"i": i}) for i in range(3)]
    body = orjson.dumps(items)
    got = list(parse_body(body, LIMITS, ndjson=False, now=NOW))
    assert [type(g) for g in got] == [Envelope] * 3
    assert all(isinstance(g, Envelope) and g.output is None for g in got)  # scanned
    assert got == [parse_envelope(orjson.dumps(i), LIMITS, now=NOW) for i in items]
    # one item the scanner declines: the whole body goes the reference way, with the same envelopes
    odd = body.replace(b'{"i":1}', b'{"i":1e0}')
    again = list(parse_body(odd, LIMITS, ndjson=False, now=NOW))
    assert [g.output for g in again if isinstance(g, Envelope)] == [{"i": 0}, {"i": 1.0}, {"i": 2}]
    # text that only looks like an array of envelopes is never scanned into one
    for broken in (body[:-1] + b",]", b"[," + body[1:], body.replace(b"},{", b"},,{", 1), body + b"x"):
        results = list(_results(broken))
        assert all(not isinstance(r, Envelope) or r.output is not None for r in results)


def _results(body: bytes) -> list[Any]:
    try:
        return list(parse_body(body, LIMITS, ndjson=False, now=NOW))
    except EnvelopeInvalid as exc:
        return [exc]


# --- properties: the scanner never disagrees ---------------------------------------------------------

_CHARS = st.sampled_from(list('ab":\\ .[]{},/é\t\n\r\b\f\x00\x1f\x7f\u2028日🎉'))
_TEXT = st.text(_CHARS, max_size=8) | st.text(max_size=4)
_NUMBERS = (
    st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.floats(-1e6, 1e6).map(lambda x: round(x, 3))
    | st.sampled_from([0.0, -0.0, 1e-4, 1e-5, 1e15, 1e16])
)
_VALUES = st.recursive(
    st.none() | st.booleans() | _NUMBERS | _TEXT,
    lambda c: st.lists(c, max_size=4) | st.dictionaries(_TEXT, c, max_size=4),
    max_leaves=25,
)
_TAG = st.none() | st.text(st.sampled_from(list("ab -_.é\t\u200b")), max_size=5)
_LIMITS = st.builds(
    Limits,
    max_depth=st.integers(1, 6),
    max_array_length=st.integers(0, 5),
    max_key_length=st.integers(0, 5),
    max_leaves=st.integers(0, 25),
    max_tag_length=st.integers(1, 6),
)


@st.composite
def _envelopes(draw: st.DrawFn) -> dict[str, Any]:
    env: dict[str, Any] = {
        "model": draw(_TAG),
        "prompt_version": draw(_TAG),
        "output": draw(st.dictionaries(_TEXT, _VALUES, max_size=5)),
    }
    for name in (
        "event_id",
        "contract",
        "served_model",
        "contract_version",
        "run_id",
        "agent_release",
        "finish_reason",
    ):
        if draw(st.booleans()):
            env[name] = draw(_TAG)
    if draw(st.booleans()):
        env["source"] = draw(st.sampled_from([None, "production", "probe", "shadow", "other"]))
    if draw(st.booleans()):
        env["ts"] = draw(
            st.sampled_from(
                [
                    None,
                    "2026-11-29T12:00:00Z",
                    "2026-11-29T12:00:00.123456+05:30",
                    "2026-11-29 12:00:00Z",
                    "2026-02-30T00:00:00Z",
                    "2026-11-29T12:00:00",
                ]
            )
        )
    return env


def _dumps(env: dict[str, Any], how: int) -> bytes:
    if how == 0:
        return orjson.dumps(env)
    return json.dumps(env, ensure_ascii=how == 1, indent=2 if how == 2 else None).encode()


@PROPERTY
@given(env=_envelopes(), how=st.integers(0, 3), lim=st.none() | _LIMITS)
def test_the_scanner_answers_what_the_reference_answers(env: dict[str, Any], how: int, lim: Limits | None) -> None:
    agrees(_dumps(env, how), lim or LIMITS)


def _shuffled(v: Any, draw: st.DrawFn) -> Any:
    """``v`` with the keys of every object in an order drawn at random."""
    if isinstance(v, dict):
        keys = draw(st.permutations(list(v)))
        return {k: _shuffled(v[k], draw) for k in keys}
    if isinstance(v, list):
        return [_shuffled(x, draw) for x in v]
    return v


@PROPERTY
@given(env=_envelopes(), how=st.integers(0, 3), data=st.data())
def test_a_payload_in_another_key_order_has_the_same_hash_on_both_paths(
    env: dict[str, Any], how: int, data: st.DataObject
) -> None:
    """A retry that a client or proxy re-serialized: each object's keys in another order, the
    output stored as sent, the payload hash the same, whichever path read either text."""
    again = {**env, "output": _shuffled(env["output"], data.draw)}
    again = dict(data.draw(st.permutations(list(again.items()))))  # the envelope's own fields too
    first, second = _dumps(env, how), _dumps(again, how)
    answered = agrees(first), agrees(second)
    ref_first, ref_second = reference(first), reference(second)
    if ref_first is None:  # refused: both are (the same fields, the same faults)
        assert ref_second is None
        return
    assert ref_second is not None
    assert ref_second.payload_hash == ref_first.payload_hash
    assert ref_second.output_json == orjson.dumps(again["output"]).decode()
    if all(answered):  # agrees() held each scanned envelope to its reference one
        fast_first, fast_second = scan(first), scan(second)
        assert fast_first is not None and fast_second is not None
        assert fast_first[-1] == fast_second[-1] == ref_first.payload_hash


def test_keys_are_put_in_order_by_code_point_at_every_level() -> None:
    """What orjson's OPT_SORT_KEYS does with escaped keys and non-ASCII ones (the C compares
    what an escape stands for, and UTF-8 bytes, whose order is code point order)."""
    output = {
        "😀": 1,
        "\uffff": {"b": [{"z": 0, "a": 1}], "a": None},
        "b": 3,
        'a"': 4,
        "a": 5,
        "a\n": 6,
        "é": 7,
        "a\\": 8,
        "a\t": {"": 0, " ": 1},
    }
    shuffles = [output, dict(reversed(output.items())), dict(sorted(output.items()))]
    hashes = set()
    for out in shuffles:
        raw = orjson.dumps(make_envelope(output=out))
        assert agrees(raw), raw
        hashes.add(parse_envelope(raw, LIMITS, now=NOW).payload_hash)
    assert len(hashes) == 1


_LITERALS = st.builds(
    lambda sign, whole, frac, exp: sign + whole + frac + exp,
    st.sampled_from(["", "-"]),
    st.sampled_from(["0", "00", "1", "9", "10", "100"]) | st.integers(0, 10**19).map(str),
    st.sampled_from(["", ".", ".0", ".00", ".5", ".50", ".05", ".0001", ".00001", ".000123"])
    | st.integers(0, 10**17).map(lambda n: f".{n}"),
    st.sampled_from(["", "", "", "e5", "E-3", "e+0", "e"]),
)


@PROPERTY
@given(literal=_LITERALS, where=st.sampled_from(['{"x":%s}', '{"x":[%s,1]}', '{"x":%s }', '{"x":%s,"y":0}']))
def test_number_literals_are_kept_only_when_orjson_writes_them_back_the_same(literal: str, where: str) -> None:
    raw = b'{"model":"m","prompt_version":"p","output":' + (where % literal).encode() + b"}"
    if agrees(raw):
        ref = reference(raw)
        assert ref is not None and literal in ref.output_json


_NOISE = st.sampled_from(
    [
        b'"',
        b"\\",
        b",",
        b":",
        b"{",
        b"}",
        b"[",
        b"]",
        b"\x00",
        b"\x1f",
        b"\x80",
        b"\xc3",
        b"\xed\xa0\x80",
        b"\xf4\x90\x80\x80",
        b"\xff",
        b"e",
        b"0",
        b"-",
        b".",
        b" ",
        b"n",
        b"u",
        b"\\u0041",
        b"\\/",
        b"null",
        b"1e400",
        b"18446744073709551616",
    ]
)


@PROPERTY
@given(env=_envelopes(), at=st.floats(0, 1), cut=st.integers(0, 2), noise=_NOISE)
def test_a_damaged_text_is_never_scanned_into_an_envelope_the_reference_refuses(
    env: dict[str, Any], at: float, cut: int, noise: bytes
) -> None:
    raw = orjson.dumps(env)
    i = int(at * len(raw))
    agrees(raw[:i] + noise + raw[i + cut :])


# --- properties: counting from text is counting the parsed output ----------------------------------------


def _acc() -> tuple[speedups.Acc, list[tuple[int, Any]]]:
    names: list[tuple[int, Any]] = []

    def namer(parent: int, key: Any) -> int:
        names.append((parent, key))
        return len(names) - 1

    return speedups.Acc(namer, 5), names


def _state(acc: speedups.Acc) -> tuple[Any, ...]:
    return acc.counts(), acc.value_rows(), acc.rows(1), acc.rows(2)


@PROPERTY
@given(outputs=st.lists(st.dictionaries(_TEXT, _VALUES, max_size=5), min_size=1, max_size=4), how=st.integers(0, 3))
def test_add_json_counts_what_add_counts(outputs: list[dict[str, Any]], how: int) -> None:
    parsed, parsed_names = _acc()
    text, text_names = _acc()
    for i, output in enumerate(outputs):
        parsed.add(output, i % 2)
        text.add_json(_dumps(output, how).decode(), i % 2)
    assert (_state(text), text_names) == (_state(parsed), parsed_names)


@pytest.mark.slow
@PROPERTY
@given(outputs=st.lists(st.dictionaries(_TEXT, _VALUES, max_size=5), min_size=1, max_size=6))
def test_values_and_lengths_are_counted_as_a_python_walk_counts_them(outputs: list[dict[str, Any]]) -> None:
    """The accumulator's own tables of short strings and array lengths, against a plain count."""
    acc, names = _acc()
    for output in outputs:
        acc.add_json(orjson.dumps(output).decode(), 0)
    want_values: Counter[tuple[int, str]] = Counter()
    want_lengths: Counter[tuple[int, int]] = Counter()
    paths = {(parent, key): i for i, (parent, key) in enumerate(names)}

    def walk(v: Any, path: int) -> None:
        if isinstance(v, str) and len(v) <= 5:
            want_values[(path, v)] += 1
        elif isinstance(v, list):
            want_lengths[(path, len(v))] += 1
            for x in v:
                walk(x, paths[(path, None)])
        elif isinstance(v, dict):
            for k, x in v.items():
                walk(x, paths[(path, k)])

    for output in outputs:
        walk(output, -1)
    slot_path = {slot: row[1] for slot, row in enumerate(acc.counts())}
    slots, keys, counts = acc.rows(0)
    assert Counter({(slot_path[s], k): n for s, k, n in zip(slots, keys, counts, strict=True)}) == want_values
    assert len(slots) == len(want_values)  # one row per (slot, value)
    ls, lv, ln = (memoryview(b).cast("q").tolist() for b in acc.rows(1))
    assert Counter({(slot_path[s], k): n for s, k, n in zip(ls, lv, ln, strict=True)}) == want_lengths
    assert len(ls) == len(want_lengths)


# --- scan_lines: bulk import's lines, a block at a time ---------------------------------------------

_LINE_KINDS = st.sampled_from(["plain", "no id", "padded", "blank", "declined", "invalid", "big", "crlf"])


@st.composite
def _lines(draw: st.DrawFn) -> bytes:
    kind = draw(_LINE_KINDS)
    env = {
        "model": "m",
        "prompt_version": "p",
        "output": draw(st.dictionaries(_TEXT, _VALUES, max_size=3)),
        "event_id": draw(st.sampled_from(["a", "b", "c"])),
    }
    if kind == "no id" or kind == "crlf":
        del env["event_id"]
    if kind == "declined":  # an exponent: valid, read the reference way
        env["output"] = {"x": 1e300}
    raw = orjson.dumps(env)
    if kind == "padded":
        raw = b" \t" + json.dumps(env, indent=1).replace("\n", " ").encode() + b"\x0c "
    elif kind == "blank":
        raw = draw(st.sampled_from([b"", b"  ", b"\r", b"\t\x0b"]))
    elif kind == "invalid":
        raw = draw(st.sampled_from([b"{not json", b'{"model":"m"}', b"[]", raw[:-1]]))
    elif kind == "big":
        raw = orjson.dumps({**env, "output": {"x": "y" * 300}})
    elif kind == "crlf":
        raw += b"\r"
    return raw


def _per_line(lines: list[bytes], lim: Limits) -> list[tuple[int, Any]]:
    """What the import read line by line makes of each line: (number, envelope or error codes)."""
    from functools import partial

    from shapewatch.collector.ingest import _line_id

    out: list[tuple[int, Any]] = []
    for n, line in enumerate(lines, 1):
        stripped = line.strip()
        if not stripped:
            continue
        try:
            env = parse_envelope(stripped, lim, now=NOW, default_id=partial(_line_id, "f", n, stripped))
            out.append((n, env._replace(output=None)))
        except EnvelopeInvalid as exc:
            out.append((n, sorted(f.code for f in exc.fields)))
    return out


@PROPERTY
@given(
    lines=st.lists(_lines(), max_size=12),
    rooms=st.lists(st.integers(1, 4), min_size=1, max_size=5),
    newline_at_end=st.booleans(),
)
def test_scan_lines_makes_what_parse_envelope_makes_of_each_line(
    lines: list[bytes], rooms: list[int], newline_at_end: bool
) -> None:
    """scan_lines stops where it is told (room) and at a line it declines; the caller reads that
    line the reference way and goes on: together, the same envelopes (ids made up from the file,
    the line number and its bytes included) and the same line numbers as a line-by-line read."""
    from functools import partial

    from shapewatch.collector.ingest import _line_id

    lim = Limits(max_event_bytes=250)
    text = b"\n".join(lines) + (b"\n" if newline_at_end and lines else b"")
    got: list[tuple[int, Any]] = []
    at = n = calls = 0
    while at < len(text):
        out: list[Envelope] = []
        origin: list[int] = []
        room = rooms[calls % len(rooms)]
        calls += 1
        at, n, start, end = speedups.scan_lines(
            memoryview(text),
            at,
            n,
            "f",
            Envelope,
            NOW,
            room,
            out,
            origin,
            lim.max_event_bytes,
            *lim.scanner,
        )
        assert len(out) == len(origin) <= room
        got.extend(zip(origin, out, strict=True))
        if start >= 0:
            assert text[start:end] == lines[n - 1]  # the declined line, whole
            stripped = text[start:end].strip()
            try:
                env = parse_envelope(stripped, lim, now=NOW, default_id=partial(_line_id, "f", n, stripped))
                got.append((n, env._replace(output=None)))
            except EnvelopeInvalid as exc:
                got.append((n, sorted(f.code for f in exc.fields)))
    assert got == _per_line(lines, lim)
    assert all(type(v) is Envelope for _, v in got if not isinstance(v, list))


def test_scan_lines_leaves_a_line_over_the_size_limit_to_the_reference() -> None:
    line = orjson.dumps({"model": "m", "prompt_version": "p", "event_id": "a", "output": {"x": "y" * 50}})
    text = b"\n  " + line + b"\r\n"
    for limit, declined in ((len(line), False), (len(line) - 1, True)):
        lim = Limits(max_event_bytes=limit)
        out: list[Envelope] = []
        origin: list[int] = []
        answer = speedups.scan_lines(
            text,
            0,
            7,
            "f",
            Envelope,
            NOW,
            10,
            out,
            origin,
            lim.max_event_bytes,
            *lim.scanner,
        )
        # the blank line is line 8, this one line 9 (declined: text[1:-1] is the caller's to read)
        assert answer == ((len(text), 9, 1, len(text) - 1) if declined else (len(text), 9, -1, -1))
        assert origin == ([] if declined else [9])
        assert [e.event_id for e in out] == ([] if declined else ["a"])


# --- the range of ts -------------------------------------------------------------------------------

_TS_EDGES = [  # (ts as sent, accepted)
    ("1970-12-31T23:59:59Z", False),
    ("1970-12-31T23:59:59.999999Z", False),
    ("1971-01-01T00:00:00Z", True),
    ("2199-12-31T23:59:59.999999Z", True),
    ("2200-01-01T00:00:00Z", False),
    ("2200-01-01T00:00:00.000001Z", False),
    ("1971-01-01T00:59:59+01:00", False),
    ("1970-12-31T23:00:00-01:00", True),
    ("1971-01-01T00:30:00+00:30", True),
    ("2199-12-31T23:30:00-00:30", False),
    ("2200-01-01T00:30:00+00:31", True),
    ("2199-12-31T23:59:59.999999-00:01", False),
    ("0001-01-01T00:00:00Z", False),
    ("9999-12-31T23:59:59Z", False),
    ("1000-01-01T00:00:00Z", False),
    ("9998-12-31T23:59:59-23:59", False),
    ("2026-11-29t12:00:00z", True),
]


def test_ts_at_the_edges_of_the_range_is_accepted_or_refused_the_same_way_on_every_path() -> None:
    for ts, accepted in _TS_EDGES:
        env = make_envelope(ts=ts)
        raw = orjson.dumps(env)
        agrees(raw)  # the scanner declines (or agrees with) what is out of range
        assert (scan(raw) is not None) <= accepted, ts
        fast = speedups.check_envelope(
            env,
            *LIMITS.scanner,
        )
        assert (fast is not None) <= accepted, ts
        for read in (partial(parse_envelope, raw, LIMITS, now=NOW), partial(envelope.validate_envelope, env, LIMITS)):
            if accepted:
                assert read().ts == datetime.fromisoformat(ts.upper()).astimezone(UTC)
                continue
            try:
                read()
            except EnvelopeInvalid as exc:
                assert [(f.path, f.code, f.reason) for f in exc.fields] == [
                    (
                        "ts",
                        "invalid_timestamp",
                        f"{ts!r} is outside the accepted range: from 1971-01-01T00:00:00Z "
                        "up to, not including, 2200-01-01T00:00:00Z",
                    )
                ]
            else:
                raise AssertionError(f"{ts} was accepted")


_NEAR_EDGES = st.sampled_from([datetime(1971, 1, 1, tzinfo=UTC), datetime(2200, 1, 1, tzinfo=UTC)]).flatmap(
    lambda edge: st.integers(-90_000_000_000, 90_000_000_000).map(lambda us: edge + timedelta(microseconds=us))
)


@PROPERTY
@given(at=_NEAR_EDGES, offset=st.integers(-(24 * 60 - 1), 24 * 60 - 1), fraction=st.sampled_from([0, 3, 6]))
def test_ts_near_either_edge_in_any_offset_is_judged_by_the_instant_it_names(
    at: datetime, offset: int, fraction: int
) -> None:
    zone = timezone(timedelta(minutes=offset))
    local = at.astimezone(zone)
    if fraction < 6:  # fewer digits: the instant named is the truncated one
        local = local.replace(microsecond=local.microsecond // 10 ** (6 - fraction) * 10 ** (6 - fraction))
    text = local.isoformat(timespec={0: "seconds", 3: "milliseconds", 6: "microseconds"}[fraction])
    raw = orjson.dumps(make_envelope(ts=text))
    named = local.astimezone(UTC)
    inside = datetime(1971, 1, 1, tzinfo=UTC) <= named < datetime(2200, 1, 1, tzinfo=UTC)
    agrees(raw)
    ref = reference(raw)
    assert (ref is not None) == inside, text
    assert ref is None or ref.ts == named


# --- timestamps as columns -------------------------------------------------------------------------

_ZONES = st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-8)), None])


@PROPERTY
@given(
    tss=st.lists(
        st.datetimes(min_value=datetime(1000, 1, 2), max_value=datetime(9998, 12, 30), timezones=_ZONES), max_size=20
    ),
    width=st.sampled_from([1, 7, 60, 3600, 86400]),
)
def test_timestamp_columns_are_what_python_computes(tss: list[datetime], width: int) -> None:
    """epoch_micros and bucket_starts against Python: exact integers for UTC datetimes (every ts
    the envelope rules make; a float timestamp() loses microseconds past 2255), the float
    timestamp() for the others, as the Python they replace computed every one."""

    def micros(ts: datetime) -> int:
        if ts.tzinfo is UTC:
            return (ts - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
        return round(ts.timestamp() * 1_000_000)

    def seconds(ts: datetime) -> int:
        if ts.tzinfo is UTC:
            us = micros(ts)
            return us // 10**6 if us >= 0 else -(-us // 10**6)  # toward zero, as int()
        return int(ts.timestamp())

    rows = [(ts,) for ts in tss]
    assert memoryview(speedups.epoch_micros(rows, 0)).cast("q").tolist() == [micros(ts) for ts in tss]
    assert speedups.bucket_starts(tss, width) == [seconds(ts) - seconds(ts) % width for ts in tss]


@PROPERTY
@given(
    rows=st.lists(
        st.tuples(
            st.sampled_from(["m", "n"]),
            st.sampled_from(["p", "q"]),
            st.sampled_from([None, "m", "n", "o"]),
            st.sampled_from([0, 60, 120]),
            st.sampled_from(["production", "probe", "shadow"]),
        ),
        max_size=12,
    )
)
def test_group_ids_are_the_first_appearance_of_each_group_key(
    rows: list[tuple[str, str, str | None, int, str]],
) -> None:
    cohorts = [(m, p, "c", src) for m, p, _, _, src in rows]
    served = [None if s is None else "".join(s) for _, _, s, _, _ in rows]  # equal, not the same object
    starts = [r[3] for r in rows]
    want: dict[Any, int] = {"earlier": 0}
    expected = [
        want.setdefault((c[0], c[1], c[2], c[3], s if s is not None and s != c[0] else None, b), len(want))
        for c, s, b in zip(cohorts, served, starts, strict=True)
    ]
    groups: dict[Any, int] = {"earlier": 0}
    assert speedups.group_ids(groups, cohorts, served, starts) == expected
    assert groups == want


@PROPERTY
@given(
    outputs=st.lists(st.dictionaries(_TEXT, _VALUES, max_size=4), min_size=1, max_size=5),
    as_text=st.lists(st.booleans(), min_size=5, max_size=5),
)
def test_acc_add_many_counts_as_add_and_add_json_one_at_a_time(
    outputs: list[dict[str, Any]], as_text: list[bool]
) -> None:
    given_ = [orjson.dumps(o).decode() if t else o for o, t in zip(outputs, as_text, strict=False)]
    one, one_names = _acc()
    for i, o in enumerate(given_):
        if isinstance(o, str):
            one.add_json(o, i % 2)
        else:
            one.add(o, i % 2)
    many, many_names = _acc()
    many.add_many(given_, [i % 2 for i in range(len(given_))])
    assert (_state(many), many_names) == (_state(one), one_names)


@PROPERTY
@given(
    literal=st.builds(
        lambda sign, whole, frac: sign + whole + frac,
        st.sampled_from(["", "-"]),
        st.sampled_from(["0", "1", "7", "123456789012345", "9007199254740993"]) | st.integers(0, 10**16).map(str),
        st.sampled_from(
            [".0", ".5", ".05", ".1", ".333333333333333", ".1234567890123456789012", ".0000000000000000000001"]
        )
        | st.integers(0, 10**22).map(lambda n: f".{n}"),
    )
)
def test_a_decimal_is_binned_from_text_as_from_its_float(literal: str) -> None:
    """add_json reads short decimals without strtod: the same bin and kind as the parsed float."""
    text, _ = _acc()
    text.add_json('{"x": %s}' % literal, 0)
    parsed, _ = _acc()
    parsed.add({"x": float(literal)}, 0)
    assert _state(text) == _state(parsed)


def test_an_output_that_is_not_a_plain_dict_or_text_is_refused_by_name() -> None:
    from collections import OrderedDict

    import pytest

    acc, _ = _acc()
    for bad in (OrderedDict(a=1), [1], 3):
        with pytest.raises(TypeError, match="an output is a dict or its JSON text"):
            acc.add(bad, 0)
        with pytest.raises(TypeError, match="an output is a dict or its JSON text"):
            acc.add_many([bad], [0])
    assert acc.counts() == []  # nothing counted half-way


# --- scan_items: the objects of a JSON array body, all or none --------------------------------------


def _scan_items(body: bytes, lim: Limits = LIMITS, max_items: int = 100, ids: list[str] | None = None) -> Any:
    made = iter(ids or [f"new{i}" for i in range(100)])
    return speedups.scan_items(
        body,
        max_items,
        Envelope,
        NOW,
        lambda: next(made),
        lim.max_event_bytes,
        *lim.scanner,
    )


@PROPERTY
@given(
    lines=st.lists(_lines(), min_size=1, max_size=8),
    blanks=st.lists(st.sampled_from([b"", b" ", b"\n", b"\t\r\n "]), min_size=2, max_size=2),
)
def test_scan_items_makes_what_the_reference_makes_of_every_item_or_declines(
    lines: list[bytes], blanks: list[bytes]
) -> None:
    """Every item is taken (each the reference's envelope, a made-up id where it has none, in
    order) or the whole body is declined: never a part of it."""
    lim = Limits(max_event_bytes=250)
    body = blanks[0] + b"[" + blanks[1] + (blanks[1] + b"," + blanks[0]).join(lines) + blanks[0] + b"]" + blanks[1]
    got = _scan_items(body, lim)
    refs = [reference(line, lim) if len(line.strip()) <= 250 else None for line in lines]
    if got is None:
        return
    assert all(ref is not None for ref in refs), body
    assert all(line.strip().startswith(b"{") for line in lines)  # an item is one object
    made = iter(f"new{i}" for i in range(100))
    want = [
        ref._replace(event_id=next(made), output=None) if ref.generated_id else ref._replace(output=None)
        for ref in refs
        if ref is not None
    ]
    assert got == want
    assert all(type(env) is Envelope for env in got)


def test_scan_items_takes_a_plain_array_and_declines_anything_else() -> None:
    items = [orjson.dumps(make_envelope(event_id=f"e{i}", output={"i": i})) for i in range(3)]
    items.append(orjson.dumps({"model": "m", "prompt_version": "p", "output": {"z": [1, {"k": "v"}]}}))
    body = b" [ " + b" ,\n".join(items) + b" ]\n"
    got = _scan_items(body, ids=["made-up"])
    assert got == [parse_envelope(i, LIMITS, now=NOW) for i in items[:3]] + [
        parse_envelope(items[3], LIMITS, now=NOW, default_id="made-up")
    ]
    assert [env.generated_id for env in got] == [False, False, False, True]
    assert _scan_items(body, max_items=4) is not None
    longest = max(len(i) for i in items)
    assert _scan_items(body, Limits(max_event_bytes=longest)) is not None
    declined = {
        "more items than max_items": _scan_items(body, max_items=3),
        "an item over max_event_bytes": _scan_items(body, Limits(max_event_bytes=longest - 1)),
        "an empty array": _scan_items(b"[]"),
        "an item that is not an object": _scan_items(b"[" + items[0] + b",1]"),
        "an array in an array": _scan_items(b"[[" + items[0] + b"]]"),
        "a blank JSON does not allow": _scan_items(b"\x0b" + body),
        "text after the array": _scan_items(body + b"x"),
        "a second array": _scan_items(body + body),
        "two commas": _scan_items(body.replace(b" ,\n", b",,", 1)),
        "a trailing comma": _scan_items(b"[" + items[0] + b",]"),
        "no comma": _scan_items(b"[" + items[0] + items[1] + b"]"),
        "an unclosed array": _scan_items(b"[" + items[0]),
        "an unclosed item": _scan_items(b"[" + items[0][:-1] + b"]"),
        "an unclosed string": _scan_items(b'[{"model":"m]'),
        "a declined item": _scan_items(body.replace(b'{"i":1}', b'{"i":1e0}')),
        "an invalid item": _scan_items(body.replace(b'"model":"m"', b'"model":""', 1)),
        "an object, not an array": _scan_items(items[0]),
    }
    assert declined == dict.fromkeys(declined)


def test_scan_items_refuses_what_is_not_bytes() -> None:
    for body in ("[]", bytearray(b"[]"), memoryview(b"[]")):
        with pytest.raises(TypeError):
            _scan_items(body)  # type: ignore[arg-type]


@pytest.mark.skipif(IMPLEMENTATION != "c", reason="the pure-Python twin holds the GIL, as Python does")
def test_scan_items_lets_other_threads_run_while_it_reads_the_text() -> None:
    """The first phase runs without the GIL: another thread counts while the body is read."""
    item = orjson.dumps(make_envelope(output={"a": [1, 2, {"b": "c" * 40}], "d": {"e": True}}))
    body = b"[" + b",".join([item] * 20_000) + b"]"
    got, during = counted_beside(lambda: _scan_items(body, max_items=20_000, ids=["x"] * 20_000))
    assert got is not None and len(got) == 20_000
    assert during > 0
