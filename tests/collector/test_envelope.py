"""Tests for collector.envelope: the one point where incoming events are validated.

Every refusal is asserted as the whole list of FieldErrors (path, reason, code),
so a rule that starts answering for the wrong field, or twice, fails here.
Property tests hold the two fast paths to their definitions: the C duplicate-key
count (``speedups.count_keys``) must never hide a duplicate, and the fast walk
(``speedups.walk``) must agree with the Python walk (``envelope._Walk``); each runs against the C
implementation or, under SHAPEWATCH_ACCEL=python, its pure-Python twin.
"""

from __future__ import annotations

import copy
import json
import math
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from harness import make_envelope
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shapewatch.collector import envelope
from shapewatch.collector.accel import speedups
from shapewatch.collector.envelope import (
    LIMITS,
    SOURCES,
    Envelope,
    Limits,
    _Bad,  # private: the Python walk, held to the C walk below
    _Walk,
    limits_from_settings,
    loads_marking,
    parse_body,
    parse_envelope,
    validate_envelope,
)
from shapewatch.collector.errors import EnvelopeInvalid, FieldError
from shapewatch.collector.settings import Settings

NOW = datetime(2026, 11, 29, 12, 30, tzinfo=UTC)
TS = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)  # make_envelope's ts
TAGS = [
    "model",
    "prompt_version",
    "contract",
    "served_model",
    "contract_version",
    "run_id",
    "agent_release",
    "finish_reason",
    "source",
]
KNOWN_FIELDS_MSG = (
    "unknown envelope field; known fields: agent_release, attributes, contract, "
    "contract_version, event_id, finish_reason, model, output, prompt_version, run_id, "
    "served_model, source, ts"
)
PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def dumps(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def parse(obj: Any, lim: Limits = LIMITS, **kw: Any) -> Envelope:
    return parse_envelope(obj if isinstance(obj, bytes) else dumps(obj), lim, now=NOW, **kw)


def stored(env: Envelope) -> Any:
    """The output as the store keeps it (its JSON text), parsed back."""
    return orjson.loads(env.output_json)


def refused(obj: Any, lim: Limits = LIMITS, **kw: Any) -> EnvelopeInvalid:
    with pytest.raises(EnvelopeInvalid) as info:
        parse(obj, lim, **kw)
    return info.value


def small(**fields: Any) -> dict[str, Any]:
    """The smallest valid envelope, plus ``fields`` (for limits tighter than make_envelope's values)."""
    return {"model": "m", "prompt_version": "p", "output": {}, **fields}


def env_raw(output_text: str, **fields: str) -> bytes:
    """An envelope as text with ``output_text`` spliced in verbatim (for what json.dumps cannot write)."""
    head = "".join(f'"{k}":{v},' for k, v in fields.items())
    return ('{%s"model":"m","prompt_version":"p","output":%s}' % (head, output_text)).encode()


def orjson_error(raw: bytes) -> str:
    with pytest.raises(orjson.JSONDecodeError) as info:
        orjson.loads(raw)
    return str(info.value)


def invalid_json(raw: bytes, path: str = "") -> list[FieldError]:
    return [FieldError(path, f"not valid JSON: {orjson_error(raw)}", "invalid_json")]


# --- a valid envelope ---------------------------------------------------------------------------


def test_a_full_envelope_becomes_every_field_of_the_envelope() -> None:
    env = make_envelope(
        event_id="ev-1",
        run_id="run-9",
        agent_release="r-2",
        finish_reason="stop",
        attributes={"team": "billing", "region": "eu"},
    )
    got = parse(env)
    output = env["output"]
    assert got._replace(payload_hash="") == Envelope(
        event_id="ev-1",
        generated_id=False,
        ts=TS,
        model="claude-sonnet-4-5-20250929",
        prompt_version="intake-v3",
        contract="intake",
        output_json=orjson.dumps(output).decode(),
        payload_hash="",
        served_model="claude-sonnet-4-5-20250929",
        contract_version="3",
        source="production",
        run_id="run-9",
        agent_release="r-2",
        finish_reason="stop",
        attributes_json='{"region":"eu","team":"billing"}',
        output=output,
    )
    assert re.fullmatch(r"[0-9a-f]{32}", got.payload_hash)


def test_defaults_contract_ts_and_a_generated_event_id() -> None:
    got = parse({"model": "m", "prompt_version": "p", "output": {}})
    assert re.fullmatch(r"[0-9a-f]{32}", got.event_id)
    assert got._replace(event_id="", payload_hash="") == Envelope(
        event_id="",
        generated_id=True,
        ts=NOW,
        model="m",
        prompt_version="p",
        contract="default",
        output_json="{}",
        payload_hash="",
        output=None,
    )  # read by the C scanner: never parsed


def test_two_envelopes_without_event_id_get_different_ids() -> None:
    raw = dumps(make_envelope(event_id=None))
    assert parse(raw).event_id != parse(raw).event_id


def test_default_id_is_used_when_the_envelope_has_none() -> None:
    got = parse(make_envelope(event_id=None), default_id="file.jsonl:7")
    assert (got.event_id, got.generated_id) == ("file.jsonl:7", True)
    # the client's own id always wins over a default
    got = parse(make_envelope(event_id="client-1"), default_id="file.jsonl:7")
    assert (got.event_id, got.generated_id) == ("client-1", False)


def test_a_null_event_id_counts_as_absent() -> None:
    got = parse(make_envelope(event_id=None) | {"event_id": None})
    assert got.generated_id is True and re.fullmatch(r"[0-9a-f]{32}", got.event_id)


def test_ts_with_an_offset_is_converted_to_utc() -> None:
    assert parse(make_envelope(ts="2026-11-29T13:00:00+01:00")).ts == TS
    assert parse(make_envelope(ts="2026-11-29T12:00:00.250Z")).ts == TS + timedelta(milliseconds=250)


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_each_known_source_is_accepted(source: str) -> None:
    assert parse(make_envelope(source=source)).source == source


def test_limits_from_settings_copies_every_limit() -> None:
    s = Settings(
        max_event_bytes=1000,
        max_depth=3,
        max_array_length=4,
        max_key_length=5,
        max_leaves=6,
        max_attributes=7,
        max_tag_length=8,
    )
    assert limits_from_settings(s) == Limits(
        max_event_bytes=1000,
        max_depth=3,
        max_array_length=4,
        max_key_length=5,
        max_leaves=6,
        max_attributes=7,
        max_tag_length=8,
    )
    assert limits_from_settings(Settings()) == LIMITS


# --- required fields, tag fields ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["model", "prompt_version"])
def test_a_missing_required_tag_is_refused(name: str) -> None:
    exc = refused(make_envelope(**{name: None}))
    assert (exc.fields, exc.status) == ([FieldError(name, "is required", "missing")], 422)


@pytest.mark.parametrize("name", ["model", "prompt_version"])
def test_a_null_required_tag_is_refused(name: str) -> None:
    assert refused(make_envelope() | {name: None}).fields == [FieldError(name, "must not be null", "missing")]


def test_a_missing_output_is_refused() -> None:
    assert refused(make_envelope(output=None)).fields == [FieldError("output", "is required", "missing")]


def test_every_missing_required_field_is_named_at_once() -> None:
    assert refused({"event_id": "e"}).fields == [
        FieldError("model", "is required", "missing"),
        FieldError("prompt_version", "is required", "missing"),
        FieldError("output", "is required", "missing"),
    ]


@pytest.mark.parametrize("name", TAGS)
@pytest.mark.parametrize(
    ("value", "jtype"),
    [(5, "integer"), (1.5, "number"), (2.0, "integer"), (True, "boolean"), (["m"], "array"), ({"m": 1}, "object")],
)
def test_a_tag_field_of_the_wrong_type_is_refused(name: str, value: Any, jtype: str) -> None:
    assert refused(make_envelope(**{name: value})).fields == [
        FieldError(name, f"must be a string, got {jtype}", "wrong_type")
    ]


@pytest.mark.parametrize("name", TAGS)
@pytest.mark.parametrize("value", ["", " ", "\t\n "])
def test_an_empty_tag_field_is_refused(name: str, value: str) -> None:
    assert refused(make_envelope(**{name: value})).fields == [FieldError(name, "must not be empty", "invalid_value")]


@pytest.mark.parametrize("name", TAGS)
def test_a_tag_field_with_nul_is_refused(name: str) -> None:
    assert refused(make_envelope(**{name: "prod\x00uction"})).fields == [
        FieldError(name, "must not contain NUL characters", "invalid_value")
    ]


@pytest.mark.parametrize("name", [n for n in TAGS if n != "source"])
def test_a_tag_field_longer_than_max_tag_length_is_refused(name: str) -> None:
    lim = Limits(max_tag_length=8)
    assert getattr(parse(small(**{name: "x" * 8}), lim), name) == "x" * 8
    assert refused(small(**{name: "x" * 9}), lim).fields == [
        FieldError(name, "is 9 characters long; the limit is 8", "too_large")
    ]


def test_a_tag_with_surrounding_blanks_is_kept_as_sent() -> None:
    assert parse(make_envelope(model=" m ")).model == " m "


def test_a_source_outside_the_known_set_is_refused() -> None:
    assert refused(make_envelope(source="staging")).fields == [
        FieldError("source", "'staging' is not one of probe, production, shadow", "invalid_value")
    ]
    assert refused(make_envelope(source="Production")).fields == [
        FieldError("source", "'Production' is not one of probe, production, shadow", "invalid_value")
    ]


def test_an_unknown_top_level_field_is_refused() -> None:
    assert refused(make_envelope(priority="high")).fields == [FieldError("priority", KNOWN_FIELDS_MSG, "unknown_field")]


def test_an_unknown_field_name_is_cut_to_80_characters() -> None:
    assert refused(make_envelope(**{"k" * 300: 1})).fields == [FieldError("k" * 80, KNOWN_FIELDS_MSG, "unknown_field")]


def test_every_fault_of_one_envelope_is_named_in_field_order() -> None:
    env = make_envelope(model=None, extra=1, source="staging", ts="noon", event_id=7, attributes=[], output=["x"])
    exc = refused(env)
    assert exc.fields == [
        FieldError("extra", KNOWN_FIELDS_MSG, "unknown_field"),
        FieldError("model", "is required", "missing"),
        FieldError("source", "'staging' is not one of probe, production, shadow", "invalid_value"),
        FieldError("event_id", "must be a non-empty string", "invalid_value"),
        FieldError("ts", "'noon' is not an ISO 8601 timestamp", "invalid_timestamp"),
        FieldError("attributes", "must be an object of strings, got array", "wrong_type"),
        FieldError("output", "must be a JSON object, got array", "wrong_type"),
    ]
    assert str(exc) == "; ".join(f"{f.path}: {f.reason}" for f in exc.fields)


@pytest.mark.parametrize(("raw", "jtype"), [(b"[]", "array"), (b'"x"', "string"), (b"null", "null"), (b"3", "integer")])
def test_an_envelope_that_is_not_an_object_is_refused(raw: bytes, jtype: str) -> None:
    assert refused(raw).fields == [FieldError("", f"an envelope must be a JSON object, got {jtype}", "wrong_type")]


# --- event_id --------------------------------------------------------------------------------------


def test_event_id_of_128_characters_is_accepted_and_129_refused() -> None:
    assert parse(make_envelope(event_id="e" * 128)).event_id == "e" * 128
    exc = refused(make_envelope(event_id="e" * 129))
    assert exc.fields == [FieldError("event_id", "is 129 characters long; the limit is 128", "too_large")]
    assert exc.event_id == "e" * 128  # reported, cut to the limit


@pytest.mark.parametrize("value", ["", "   ", 5, 1.5, True, ["e"], {"e": 1}])
def test_an_empty_or_non_string_event_id_is_refused(value: Any) -> None:
    assert refused(make_envelope(event_id=value)).fields == [
        FieldError("event_id", "must be a non-empty string", "invalid_value")
    ]


def test_a_rejected_envelope_reports_its_event_id() -> None:
    assert refused(make_envelope(event_id="ev-7", model=None)).event_id == "ev-7"
    assert refused(make_envelope(event_id=None, model=None)).event_id is None
    assert refused(make_envelope(event_id=12, model=None)).event_id is None
    # also when the fault is one only the exact re-parse finds
    assert refused(env_raw('{"a":1,"a":2}', event_id='"ev-8"')).event_id == "ev-8"


# --- ts -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("2026-11-29T12:00:00", "'2026-11-29T12:00:00' has no time zone; add 'Z' or an offset like +00:00"),
        ("2026-11-29", "'2026-11-29' has no time zone; add 'Z' or an offset like +00:00"),
        ("yesterday", "'yesterday' is not an ISO 8601 timestamp"),
        ("29/11/2026 12:00", "'29/11/2026 12:00' is not an ISO 8601 timestamp"),
        ("", "'' is not an ISO 8601 timestamp"),
        ("x" * 100, f"{'x' * 40!r} is not an ISO 8601 timestamp"),
        (1764417600, "must be an ISO 8601 string with a zone, got integer"),
        (1764417600.5, "must be an ISO 8601 string with a zone, got number"),
        (["2026-11-29T12:00:00Z"], "must be an ISO 8601 string with a zone, got array"),
        (False, "must be an ISO 8601 string with a zone, got boolean"),
    ],
)
def test_a_bad_ts_is_refused(value: Any, reason: str) -> None:
    assert refused(make_envelope(ts=value)).fields == [FieldError("ts", reason, "invalid_timestamp")]


@pytest.mark.parametrize("value", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"])
def test_a_ts_that_leaves_the_calendar_in_utc_is_refused(value: str) -> None:
    exc = refused(make_envelope(ts=value))
    assert [(f.path, f.code) for f in exc.fields] == [("ts", "invalid_timestamp")]


# --- attributes ---------------------------------------------------------------------------------------


def test_attributes_are_stored_as_sorted_json() -> None:
    got = parse(make_envelope(attributes={"b": "2", "a": "1"}))
    assert got.attributes_json == '{"a":"1","b":"2"}'
    assert parse(make_envelope(attributes={})).attributes_json == "{}"
    assert parse(make_envelope()).attributes_json is None


@pytest.mark.parametrize(("value", "jtype"), [("team=x", "string"), (["a"], "array"), (1, "integer")])
def test_attributes_that_are_not_an_object_are_refused(value: Any, jtype: str) -> None:
    assert refused(make_envelope(attributes=value)).fields == [
        FieldError("attributes", f"must be an object of strings, got {jtype}", "wrong_type")
    ]


def test_attributes_over_max_attributes_are_refused() -> None:
    lim = Limits(max_attributes=2)
    assert parse(make_envelope(attributes={"a": "1", "b": "2"}), lim).attributes_json == '{"a":"1","b":"2"}'
    assert refused(make_envelope(attributes={"a": "1", "b": "2", "c": "3"}), lim).fields == [
        FieldError("attributes", "has 3 entries; the limit is 2", "too_large")
    ]


def test_attributes_with_non_string_values_name_each_one() -> None:
    attrs = {"a": 1, "b": "ok", "c": None, "d": {"x": "y"}}
    assert refused(make_envelope(attributes=attrs)).fields == [
        FieldError("attributes.a", "must be a string, got integer", "wrong_type"),
        FieldError("attributes.c", "must be a string, got null", "wrong_type"),
        FieldError("attributes.d", "must be a string, got object", "wrong_type"),
    ]


def test_attributes_with_a_long_key_or_value_are_refused() -> None:
    lim = Limits(max_tag_length=4)
    reason = "key over 64 or value over 4 characters"
    assert refused(small(attributes={"a": "12345"}), lim).fields == [FieldError("attributes.a", reason, "too_large")]
    assert refused(small(attributes={"k" * 65: "1"}), lim).fields == [
        FieldError("attributes." + "k" * 64, reason, "too_large")
    ]
    assert parse(small(attributes={"k" * 64: "1234"}), lim).attributes_json == '{"%s":"1234"}' % ("k" * 64)


def test_attributes_with_a_duplicate_key_are_refused() -> None:
    raw = env_raw("{}", attributes='{"team":"a","team":"b"}')
    assert refused(raw).fields == [FieldError("attributes.team", "duplicate key", "duplicate_key")]


# --- output --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "jtype"), [([{"a": 1}], "array"), ("{}", "string"), (None, "null"), (3, "integer"), (True, "boolean")]
)
def test_an_output_that_is_not_an_object_is_refused(value: Any, jtype: str) -> None:
    assert refused(make_envelope() | {"output": value}).fields == [
        FieldError("output", f"must be a JSON object, got {jtype}", "wrong_type")
    ]


def test_nesting_at_max_depth_is_accepted_and_one_deeper_names_the_path() -> None:
    lim = Limits(max_depth=4)
    ok = {"a": [{"b": {"c": 1}}]}  # output, a, a[0], b: four levels
    assert stored(parse(make_envelope(output=ok), lim)) == ok
    deep = {"x": 1, "a": [{"b": {"c": [1]}}, 2]}
    assert refused(make_envelope(output=deep), lim).fields == [
        FieldError("output.a[0].b.c", "nested deeper than 4 levels", "too_deep")
    ]


def test_nesting_beyond_the_default_depth_names_the_path() -> None:
    deep: dict[str, Any] = {"leaf": 1}
    for _ in range(32):
        deep = {"a": deep}
    assert refused(make_envelope(output=deep)).fields == [
        FieldError("output" + ".a" * 32, "nested deeper than 32 levels", "too_deep")
    ]


def test_nesting_of_arrays_names_each_index() -> None:
    lim = Limits(max_depth=3)
    assert refused(make_envelope(output={"a": [0, [1, [2]]]}), lim).fields == [
        FieldError("output.a[1][1]", "nested deeper than 3 levels", "too_deep")
    ]


def test_an_array_longer_than_max_array_length_is_refused() -> None:
    lim = Limits(max_array_length=3)
    assert stored(parse(make_envelope(output={"a": {"b": [1, 2, 3]}}), lim)) == {"a": {"b": [1, 2, 3]}}
    assert refused(make_envelope(output={"a": {"b": [1, 2, 3, 4]}}), lim).fields == [
        FieldError("output.a.b", "array has 4 items; the limit is 3", "too_large")
    ]
    assert refused(make_envelope(output={"items": [{"tags": []}, {"tags": list(range(9))}]}), lim).fields == [
        FieldError("output.items[1].tags", "array has 9 items; the limit is 3", "too_large")
    ]


def test_a_key_longer_than_max_key_length_is_refused() -> None:
    lim = Limits(max_key_length=5)
    assert stored(parse(make_envelope(output={"a": {"abcde": 1}}), lim)) == {"a": {"abcde": 1}}
    assert refused(make_envelope(output={"a": {"abcdef": 1}}), lim).fields == [
        FieldError("output.a.abcdef...", "key is 6 characters long; the limit is 5", "too_large")
    ]
    long_key = "k" * 100
    assert refused(make_envelope(output={"a": [{long_key: 1}]}), lim).fields == [
        FieldError("output.a[0]." + "k" * 40 + "...", "key is 100 characters long; the limit is 5", "too_large")
    ]


def test_more_leaves_than_max_leaves_is_refused() -> None:
    lim = Limits(max_leaves=3)
    assert stored(parse(make_envelope(output={"a": 1, "b": [2, None]}), lim)) == {"a": 1, "b": [2, None]}
    assert refused(make_envelope(output={"a": 1, "b": 2, "c": 3, "d": 4}), lim).fields == [
        FieldError("output", "has more than 3 leaf values", "too_large")
    ]
    # empty containers are not leaves
    sparse = {"a": {}, "b": [], "c": [[], {}], "d": 1}
    assert stored(parse(make_envelope(output=sparse), lim)) == sparse


def test_an_envelope_over_max_event_bytes_is_refused_with_413() -> None:
    lim = Limits(max_event_bytes=300)
    pad = "x" * (300 - len(dumps(small(output={"pad": ""}))))
    fits = dumps(small(output={"pad": pad}))
    assert len(fits) == 300
    assert stored(parse(fits, lim)) == {"pad": pad}
    too_big = dumps(small(output={"pad": pad + "x"}))
    exc = refused(too_big, lim)
    assert (exc.fields, exc.status) == ([FieldError("", "envelope is 301 bytes; the limit is 300", "too_large")], 413)


# --- what orjson lets through, and what it refuses ----------------------------------------------------


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "nan", "1e400", "-1e400"])
def test_non_finite_numbers_are_refused_as_invalid_json(literal: str) -> None:
    raw = env_raw('{"a":%s}' % literal)
    exc = refused(raw)
    assert (exc.fields, exc.status) == (invalid_json(raw, "output.a"), 400)


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_a_non_finite_float_in_a_python_object_is_refused_naming_its_field(value: float) -> None:
    # No parser hands one over (orjson and loads_marking refuse them), but validate_envelope takes
    # Python objects: a float that orjson would store as null must not get past it.
    obj = orjson.loads(env_raw('{"a":{"b":[1,2.5]}}'))
    obj["output"]["a"]["b"][1] = value
    with pytest.raises(EnvelopeInvalid) as info:
        validate_envelope(obj, LIMITS)
    assert info.value.fields == [FieldError("output.a.b[1]", f"{value} is not a JSON number", "invalid_value")]


def test_loads_marking_refuses_a_number_too_large_for_a_float() -> None:
    with pytest.raises(ValueError, match="number 1e400 is too large for a 64-bit float"):
        loads_marking('{"a": 1e400}')
    assert loads_marking('{"a": 1e308}') == {"a": 1e308}


def test_invalid_utf8_is_refused_as_invalid_json_naming_the_field_and_the_byte() -> None:
    in_output = env_raw('{"a":"x"}').replace(b"x", b"\xff")
    in_model = env_raw("{}").replace(b'"m"', b'"\xc3\x28"')
    for raw, path, byte in ((in_output, "output.a", 0xFF), (in_model, "model", 0xC3)):
        exc = refused(raw)
        at = raw.index(bytes([byte]))
        assert (exc.fields, exc.status) == (
            [FieldError(path, f"not valid JSON: invalid UTF-8 (byte 0x{byte:02x} at offset {at})", "invalid_json")],
            400,
        )
    surrogate = env_raw('{"a":"\\ud800"}')  # UTF-8 text, but an escape no string may hold
    exc = refused(surrogate)
    assert (exc.fields, exc.status) == (invalid_json(surrogate, "output.a"), 400)


@pytest.mark.parametrize(
    ("raw", "path"),
    [
        (b"", ""),
        (b"{", ""),
        (b"model=m", ""),
        (b"{'model': 'm'}", ""),
        (b'{"model": "m",}', "model"),  # the fault comes after model's value
        (env_raw('{"a": {"b": [1, {"c": Infinity}]}}'), "output.a.b[1].c"),
        (env_raw('{"a.b": {"\\u00e9": [NaN]}}'), "output.a.b.\u00e9[0]"),
        (env_raw('{"a": 1, "b": tru}'), "output.b"),
        (env_raw('{"a": "unterminated'), "output.a"),
    ],
)
def test_text_that_is_not_json_is_refused_with_400_naming_where(raw: bytes, path: str) -> None:
    exc = refused(raw)
    assert (exc.fields, exc.status) == (invalid_json(raw, path), 400)


def test_an_array_body_that_is_not_json_names_the_item_and_field() -> None:
    raw = b"[" + env_raw("{}") + b"," + env_raw('{"x": NaN}') + b"]"
    with pytest.raises(EnvelopeInvalid) as info:
        list(parse_body(raw, Limits(), ndjson=False))
    assert (info.value.fields, info.value.status) == (invalid_json(raw, "body[1].output.x"), 400)


def test_not_json_far_into_a_huge_body_is_not_located(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(envelope, "_LOCATE_LIMIT", 100)
    raw = env_raw('{"pad": "' + "x" * 200 + '", "x": NaN}')
    assert refused(raw).fields == invalid_json(raw, "")  # past the limit: by position only


def test_nesting_beyond_the_parser_limit_gets_a_plain_reason() -> None:
    raw = env_raw('{"a":' + "[" * 1100 + "]" * 1100 + "}")
    exc = refused(raw)
    assert (exc.fields, exc.status) == (
        [FieldError("", "not valid JSON: nested too deeply to parse", "invalid_json")],
        400,
    )


@pytest.mark.parametrize(
    ("raw", "path"),
    [
        (b'{"model":"a","model":"m","prompt_version":"p","output":{}}', "model"),
        (b'{"model":"m","prompt_version":"p","output":{},"output":{}}', "output"),
        (env_raw('{"a":1,"b":2,"a":1}'), "output.a"),
        (env_raw('{"a":{"b":{"c":1,"c":"1"}}}'), "output.a.b.c"),
        (env_raw('{"items":[{"k":1},{"k":1,"k":2}]}'), "output.items[1].k"),
        (env_raw('{"items":[[{"k":1}],[{"j":0},{"k":1,"k":2}]]}'), "output.items[1][1].k"),
        (env_raw('{"a" : 1, "a" : 2}'), "output.a"),
        (env_raw('{\n  "a"\n:1,\n  "a"\t:2}'), "output.a"),
        (env_raw('{"q":"say \\"hi\\"","q":"x"}'), "output.q"),
        (env_raw('{"a\\"b":1,"a\\"b":2}'), 'output.a"b'),
        (env_raw('{"a":1,"\\u0061":2}'), "output.a"),
        (env_raw('{"s":"x\\":","s":1}'), "output.s"),
    ],
)
def test_a_duplicate_key_anywhere_is_refused_with_its_path(raw: bytes, path: str) -> None:
    assert refused(raw).fields == [FieldError(path, "duplicate key", "duplicate_key")]


def test_a_duplicate_key_is_named_beside_the_other_faults() -> None:
    raw = b'{"prompt_version":"p","source":"x","output":{"a":[{"k":1,"k":2}]}}'
    assert refused(raw).fields == [
        FieldError("model", "is required", "missing"),
        FieldError("source", "'x' is not one of probe, production, shadow", "invalid_value"),
        FieldError("output.a[0].k", "duplicate key", "duplicate_key"),
    ]


@pytest.mark.parametrize(
    ("literal", "path", "digits"),
    [
        ("1" * 30, "output.a", 30),
        ("-" + "9" * 30, "output.a", 30),
        (str(2**64), "output.a", 20),
        (str(2**64 + 1), "output.a", 20),
        (str(-(2**63) - 1), "output.a", 19),
    ],
)
def test_an_integer_too_large_for_64_bits_is_refused(literal: str, path: str, digits: int) -> None:
    assert refused(env_raw('{"a":%s}' % literal)).fields == [
        FieldError(
            path, f"integer with {digits} digits is too large to keep exactly (64-bit limit)", "number_too_large"
        )
    ]


def test_a_huge_integer_in_an_array_names_its_index() -> None:
    assert refused(env_raw('{"x":{"xs":[1,2,%d]}}' % 2**64)).fields == [
        FieldError(
            "output.x.xs[2]", "integer with 20 digits is too large to keep exactly (64-bit limit)", "number_too_large"
        )
    ]


@pytest.mark.parametrize("value", [2**63 - 1, -(2**63), 0, -1])
def test_integers_within_64_bits_are_kept_exactly(value: int) -> None:
    got = parse(env_raw('{"a":%d,"b":[%d]}' % (value, value)))
    assert (stored(got), got.output_json) == ({"a": value, "b": [value]}, '{"a":%d,"b":[%d]}' % (value, value))


@pytest.mark.parametrize(
    ("literal", "value"),
    [("1e20", 1e20), ("1.0e19", 1e19), ("-1e20", -1e20), ("100000000000000000000.0", 1e20), ("9.3e18", 9.3e18)],
)
def test_a_large_float_written_as_a_float_is_accepted(literal: str, value: float) -> None:
    got = parse(env_raw('{"a":%s}' % literal))
    assert got.output == {"a": value}
    assert type(got.output["a"]) is float


def test_a_large_float_beside_a_huge_integer_still_names_the_integer() -> None:
    assert refused(env_raw('{"f":1e20,"n":%s}' % ("7" * 25))).fields == [
        FieldError("output.n", "integer with 25 digits is too large to keep exactly (64-bit limit)", "number_too_large")
    ]


@pytest.mark.parametrize(
    ("raw", "path"),
    [
        # nested objects: the walk stops at max_depth, so the key count cannot match
        (env_raw('{"a":' * 1000 + "1" + "}" * 1000), "output" + ".a" * 32),
        # nested arrays, with a blank before one colon
        (
            b'{"model" : "m","prompt_version":"p","output":{"a":' + b"[" * 1000 + b"]" * 1000 + b"}}",
            "output.a" + "[0]" * 31,
        ),
    ],
)
def test_deep_nesting_within_the_parser_limit_is_refused_as_too_deep(raw: bytes, path: str) -> None:
    assert refused(raw).fields == [FieldError(path, "nested deeper than 32 levels", "too_deep")]


# --- property: the cheap duplicate-key test never hides a duplicate ------------------------------------

# Characters that make JSON text hard to scan: quotes, backslashes, colons, blanks, brackets.
# Plain text (no quote or backslash) is where the cheap count is conclusive, so it is drawn as often.
_TRICKY = st.sampled_from(list('ab":\\ .[]{},\t\n/é'))
_PLAIN = st.sampled_from(list("ab: .[]{},\t\n/é"))
_KEYS = (
    st.text(_PLAIN, max_size=6)
    | st.text(_TRICKY, max_size=6)
    | st.sampled_from([":", ":a", '":', '\\"', " : ", '"', "\\", "a\\"])
)
_STRINGS = (
    st.text(_PLAIN, max_size=8)
    | st.text(_TRICKY, max_size=8)
    | st.sampled_from([":", ": x", '":', '" :', "\\", '\\":'])
)
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | _STRINGS
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([9.2e18, -9.3e18, 1e20])
)
_VALUES = st.recursive(
    _SCALARS, lambda c: st.lists(c, max_size=4) | st.dictionaries(_KEYS, c, max_size=4), max_leaves=20
)
_OUTPUTS = st.dictionaries(_KEYS, _VALUES, max_size=5)
_ATTRIBUTES = st.none() | st.dictionaries(_KEYS, _STRINGS, max_size=3)
# JSON's four blanks only: anything else around ':' or ',' is not JSON.
_BLANK = st.sampled_from(["", " ", "\t", "\n", "\r\n", "  "])
_MARK_KEY, _MARK_VALUE = "DUPKEYMARK", "DUPVALUEMARK"  # never produced by _TRICKY
_WIDE = Limits(max_depth=200)  # generated outputs may nest deeper than 32; depth is not under test here


@st.composite
def _serialization(draw: st.DrawFn) -> dict[str, Any]:
    before_colon, after_colon = draw(st.just("") | _BLANK), draw(_BLANK)  # no blank before ':' half the time
    before_comma, after_comma = draw(_BLANK), draw(_BLANK)
    return {
        "separators": (before_comma + "," + after_comma, before_colon + ":" + after_colon),
        "indent": draw(st.none() | st.integers(0, 3) | st.just("\t")),
        "ensure_ascii": draw(st.booleans()),
        "sort_keys": draw(st.booleans()),
    }


def _objects(value: Any, path: str) -> list[tuple[dict[str, Any], str]]:
    """Every object inside ``value``, each with the prefix the walk gives a key inside it."""
    found: list[tuple[dict[str, Any], str]] = []
    if type(value) is dict:
        found.append((value, path + "."))
        for k, v in value.items():
            found += _objects(v, f"{path}.{k}")
    elif type(value) is list:
        for i, v in enumerate(value):
            found += _objects(v, f"{path}[{i}]")
    return found


def _pairs_in(raw: bytes) -> int:
    n = 0

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal n
        n += len(pairs)
        return dict(pairs)

    json.loads(raw, object_pairs_hook=hook)
    return n


@PROPERTY
@given(output=_OUTPUTS, attributes=_ATTRIBUTES, how=_serialization(), data=st.data())
def test_a_duplicate_key_is_never_hidden(
    output: dict[str, Any], attributes: dict[str, str] | None, how: dict[str, Any], data: st.DataObject
) -> None:
    env = make_envelope(output=copy.deepcopy(output), attributes=copy.deepcopy(attributes))
    raw = json.dumps(env, **how).encode()
    # Without duplicates: accepted, and the output is exactly what was sent.
    got = parse_envelope(raw, _WIDE, now=NOW)
    sent = json.loads(raw)["output"]  # in the order written (sort_keys may reorder)
    assert (stored(got), got.output_json) == (output, orjson.dumps(sent).decode())
    assert speedups.count_keys(raw) == _pairs_in(raw)  # the cheap test is exact

    # Insert one duplicate key into one object (the envelope, attributes, or anywhere in output).
    targets = [(env, ""), *_objects(env["output"], "output")]
    if type(env.get("attributes")) is dict:
        targets.append((env["attributes"], "attributes."))
    target, prefix = data.draw(st.sampled_from(targets))
    added = 0 if target else 1
    if added:
        target["k"] = 1
    key = data.draw(st.sampled_from(sorted(target)))
    target[_MARK_KEY] = _MARK_VALUE
    text = json.dumps(env, **how)
    text = text.replace(json.dumps(_MARK_KEY), json.dumps(key, ensure_ascii=data.draw(st.booleans())), 1)
    dup_raw = text.replace(json.dumps(_MARK_VALUE), json.dumps(data.draw(_SCALARS)), 1).encode()
    assert _pairs_in(dup_raw) == _pairs_in(raw) + added + 1  # valid JSON, one key more
    with pytest.raises(EnvelopeInvalid) as info:
        parse_envelope(dup_raw, _WIDE, now=NOW)
    assert info.value.fields == [FieldError(prefix + key, "duplicate key", "duplicate_key")]


@PROPERTY
@given(output=_OUTPUTS, how=_serialization())
def test_count_keys_is_exact(output: dict[str, Any], how: dict[str, Any]) -> None:
    raw = json.dumps(make_envelope(output=output), **how).encode()
    assert speedups.count_keys(raw) == _pairs_in(raw)


def test_count_keys_on_hand_written_text() -> None:
    assert speedups.count_keys(b'{"a":1,"b":{"c":"d:"}}') == 3
    assert speedups.count_keys(b'{"a":":","b":":x"}') == 2  # ':' at a string's start is not a key
    assert speedups.count_keys(b'{"a" :1}') == 1  # a blank before a colon
    assert speedups.count_keys(b'{"a\\"":1}') == 1  # an escaped quote inside a key
    assert speedups.count_keys(b'{"a\\\\":1}') == 1  # an escaped backslash before the closing quote
    assert speedups.count_keys(b'{"a":"x\\":y","b" \n :"\\\\"}') == 2  # quotes and colons inside values
    assert speedups.count_keys(b"[1,2]") == 0


# --- property: the C walk agrees with the Python walk ---------------------------------------------------

_WALK_KEYS = st.text(st.sampled_from("abc.[\\"), max_size=5)
_WALK_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.text(max_size=3)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([9.2e18, -9.2e18, 9.19e18, -9.19e18, 1e19, 3.0])
)
_WALK_VALUES = st.recursive(
    _WALK_SCALARS, lambda c: st.lists(c, max_size=5) | st.dictionaries(_WALK_KEYS, c, max_size=5), max_leaves=30
)
_RANDOM_LIMITS = st.builds(
    Limits,
    max_depth=st.integers(1, 6),
    max_array_length=st.integers(0, 5),
    max_key_length=st.integers(0, 5),
    max_leaves=st.integers(0, 25),
)


@PROPERTY
@given(output=st.dictionaries(_WALK_KEYS, _WALK_VALUES, max_size=5), lim=_RANDOM_LIMITS)
def test_the_c_walk_agrees_with_the_python_walk(output: dict[str, Any], lim: Limits) -> None:
    fast = speedups.walk(output, lim.max_depth, lim.max_array_length, lim.max_key_length, lim.max_leaves)
    slow = _Walk(lim)
    try:
        slow.value(output, 1)
    except _Bad:
        assert fast is None
    else:
        assert fast == (slow.keys, slow.leaves, int(slow.huge_float))


@PROPERTY
@given(output=st.dictionaries(_WALK_KEYS, _WALK_VALUES, max_size=5), lim=_RANDOM_LIMITS)
def test_validation_refuses_exactly_what_the_python_walk_refuses(output: dict[str, Any], lim: Limits) -> None:
    slow = _Walk(lim)
    try:
        slow.value(output, 1)
    except _Bad as bad:
        exc = refused(make_envelope(output=output), lim)
        path = "output" + "".join(reversed(bad.parts))
        assert exc.fields == [FieldError(path, bad.reason, bad.code)]
    else:
        assert stored(parse(make_envelope(output=output), lim)) == output


# --- parse_body ------------------------------------------------------------------------------------------


def test_a_json_array_body_yields_each_result_in_order() -> None:
    items = [
        make_envelope(event_id="e1"),
        make_envelope(event_id="e2", model=None),
        "nope",
        make_envelope(event_id="e3", output=[]),
        make_envelope(event_id="e4", contract=None),
    ]
    got = list(parse_body(dumps(items), LIMITS, ndjson=False, now=NOW))
    assert [type(r).__name__ for r in got] == [
        "Envelope",
        "EnvelopeInvalid",
        "EnvelopeInvalid",
        "EnvelopeInvalid",
        "Envelope",
    ]
    ok1, bad2, bad3, bad4, ok5 = got
    assert isinstance(ok1, Envelope) and isinstance(ok5, Envelope)
    assert (ok1.event_id, ok1.contract, ok5.event_id, ok5.contract) == ("e1", "intake", "e4", "default")
    assert ok1._replace(output=None) == parse(make_envelope(event_id="e1"))  # the reference path parsed it
    assert isinstance(bad2, EnvelopeInvalid) and isinstance(bad3, EnvelopeInvalid)
    assert isinstance(bad4, EnvelopeInvalid)
    assert (bad2.fields, bad2.event_id) == ([FieldError("model", "is required", "missing")], "e2")
    assert bad3.fields == [FieldError("", "an envelope must be a JSON object, got string", "wrong_type")]
    assert (bad4.fields, bad4.event_id) == (
        [FieldError("output", "must be a JSON object, got array", "wrong_type")],
        "e3",
    )


def test_a_json_array_body_finds_hidden_faults_per_item() -> None:
    e1, e3 = dumps(make_envelope(event_id="e1")).decode(), dumps(make_envelope(event_id="e3")).decode()
    body = (
        "[%s, %s, %s, %s]"
        % (
            e1,
            '{"event_id":"e2","model":"m","prompt_version":"p","output":{"xs":[{"k":1,"k":2}]}}',
            e3,
            '{"model":"m","prompt_version":"p","output":{"n":%d}}' % 2**64,
        )
    ).encode()
    got = list(parse_body(body, LIMITS, ndjson=False, now=NOW))
    assert [type(r).__name__ for r in got] == ["Envelope", "EnvelopeInvalid", "Envelope", "EnvelopeInvalid"]
    assert isinstance(got[0], Envelope) and isinstance(got[2], Envelope)
    assert (got[0].event_id, got[2].event_id) == ("e1", "e3")
    assert isinstance(got[1], EnvelopeInvalid) and isinstance(got[3], EnvelopeInvalid)
    assert (got[1].fields, got[1].event_id) == ([FieldError("output.xs[0].k", "duplicate key", "duplicate_key")], "e2")
    assert got[3].fields == [
        FieldError("output.n", "integer with 20 digits is too large to keep exactly (64-bit limit)", "number_too_large")
    ]


def test_an_empty_json_array_yields_nothing() -> None:
    assert list(parse_body(b" [ ] ", LIMITS, ndjson=False, now=NOW)) == []


def test_ndjson_skips_blank_lines_and_names_the_line_of_each_fault() -> None:
    lines = [
        dumps(make_envelope(event_id="e1")),
        b"",
        b"   ",
        b"{not json",
        dumps(make_envelope(event_id="e2")) + b"\r",
        dumps(make_envelope(model=None)),
        env_raw('{"a":1,"a":2}'),
        b"",
    ]
    got = list(parse_body(b"\n".join(lines), LIMITS, ndjson=True, now=NOW))
    assert [type(r).__name__ for r in got] == [
        "Envelope",
        "EnvelopeInvalid",
        "Envelope",
        "EnvelopeInvalid",
        "EnvelopeInvalid",
    ]
    ok1, bad4, ok5, bad6, bad7 = got
    assert isinstance(ok1, Envelope) and isinstance(ok5, Envelope)
    assert (ok1.event_id, ok5.event_id) == ("e1", "e2")
    assert isinstance(bad4, EnvelopeInvalid) and isinstance(bad6, EnvelopeInvalid)
    assert isinstance(bad7, EnvelopeInvalid)
    assert (bad4.fields, bad4.status) == (
        [FieldError("", f"line 4: not valid JSON: {orjson_error(b'{not json')}", "invalid_json")],
        400,
    )
    assert (bad6.fields, bad6.status) == ([FieldError("model", "line 6: is required", "missing")], 422)
    assert bad7.fields == [FieldError("output.a", "line 7: duplicate key", "duplicate_key")]


def test_ndjson_applies_max_event_bytes_per_line() -> None:
    lim = Limits(max_event_bytes=300)
    small, big = dumps(make_envelope(output={})), dumps(make_envelope(output={"pad": "x" * 400}))
    got = list(parse_body(small + b"\n" + big, lim, ndjson=True, now=NOW))
    assert isinstance(got[0], Envelope) and isinstance(got[1], EnvelopeInvalid)
    assert (got[1].fields, got[1].status) == (
        [FieldError("", f"line 2: envelope is {len(big)} bytes; the limit is 300", "too_large")],
        413,
    )


def test_ndjson_keeps_the_event_id_of_a_rejected_line() -> None:
    body = dumps(make_envelope(event_id="e-9", model=None))
    (got,) = parse_body(body, LIMITS, ndjson=True, now=NOW)
    assert isinstance(got, EnvelopeInvalid)
    assert got.event_id == "e-9"


def test_a_json_array_applies_max_event_bytes_per_item() -> None:
    lim = Limits(max_event_bytes=300)
    big = make_envelope(event_id="big", output={"pad": "x" * 400})
    # the output alone fits, the envelope does not: the same answer as the same envelope on a line
    tagged = make_envelope(event_id="tagged", output={"pad": "x" * 150}, attributes={"note": "y" * 150})
    assert len(dumps(tagged["output"])) < 300 < len(dumps(tagged))
    fits = make_envelope(
        event_id="fits", output={"pad": "x" * (300 - len(dumps(make_envelope(event_id="fits", output={"pad": ""}))))}
    )
    assert len(dumps(fits)) == 300
    body = (
        b"[\n  " + b",\n  ".join(dumps(e) for e in (fits, big, tagged)) + b"\n]"
    )  # space between items is not counted
    got = list(parse_body(body, lim, ndjson=False, now=NOW))
    assert isinstance(got[0], Envelope) and got[0].event_id == "fits"
    for item, sent in zip(got[1:], (big, tagged), strict=True):
        assert isinstance(item, EnvelopeInvalid)
        assert (item.fields, item.event_id) == (
            [FieldError("", f"envelope is {len(dumps(sent))} bytes; the limit is 300", "too_large")],
            sent["event_id"],
        )
        on_a_line = next(iter(parse_body(dumps(sent), lim, ndjson=True, now=NOW)))
        assert isinstance(on_a_line, EnvelopeInvalid) and [f.code for f in on_a_line.fields] == ["too_large"]


def test_a_json_array_with_an_item_too_deep_to_reparse_answers_per_item() -> None:
    # orjson takes 1,024 levels, Python's parser fewer: the exact re-parse (for a duplicate key
    # hidden somewhere in the body) could not run, and the whole body was refused with 400
    deep = '{"model":"m","prompt_version":"p","output":{"a":' + "[" * 1000 + "]" * 1000 + "}}"
    hidden = '{"event_id":"e3","model":"m","prompt_version":"p","output":{"k":1,"k":2}}'
    body = ("[%s, %s, %s]" % (dumps(make_envelope(event_id="e1")).decode(), deep, hidden)).encode()
    got = list(parse_body(body, LIMITS, ndjson=False, now=NOW))
    assert isinstance(got[0], Envelope) and got[0]._replace(output=None) == parse(make_envelope(event_id="e1"))
    assert isinstance(got[1], EnvelopeInvalid) and isinstance(got[2], EnvelopeInvalid)
    assert got[1].fields == [FieldError("output.a" + "[0]" * 31, "nested deeper than 32 levels", "too_deep")]
    assert (got[2].fields, got[2].event_id) == ([FieldError("output.k", "duplicate key", "duplicate_key")], "e3")


def test_item_spans_find_each_item_of_an_array() -> None:
    body = b' [ 1 , {"a":[1,"]\\",\\\\"]} ,"x\\\\" , [[]] ] '
    spans = speedups.item_spans(body)
    assert spans is not None
    assert [body[a:b] for a, b in spans] == [b"1", b'{"a":[1,"]\\",\\\\"]}', b'"x\\\\"', b"[[]]"]
    assert [orjson.loads(body[a:b]) for a, b in spans] == orjson.loads(body)
    assert speedups.item_spans(b"[]") == []
    for broken in (b"[1,2", b"{}", b"", b'["]', b"[[1]"):
        assert speedups.item_spans(broken) is None


@pytest.mark.parametrize(
    ("body", "path"), [(b"not json", ""), (b"{", ""), (b"", ""), (b"[1,", "body[1]"), (b"  [{}] trailing", "body")]
)
def test_a_body_that_is_not_json_raises_400(body: bytes, path: str) -> None:
    with pytest.raises(EnvelopeInvalid) as info:
        list(parse_body(body, LIMITS, ndjson=False, now=NOW))
    assert (info.value.fields, info.value.status) == (invalid_json(body, path), 400)


def test_a_single_object_body_yields_one_envelope() -> None:
    assert list(parse_body(dumps(make_envelope(event_id="one")), LIMITS, ndjson=False, now=NOW)) == [
        parse(make_envelope(event_id="one"))
    ]


def test_a_single_invalid_object_body_raises_422() -> None:
    with pytest.raises(EnvelopeInvalid) as info:
        list(parse_body(dumps(make_envelope(event_id="one", output=None)), LIMITS, ndjson=False, now=NOW))
    assert (info.value.fields, info.value.status, info.value.event_id) == (
        [FieldError("output", "is required", "missing")],
        422,
        "one",
    )


def test_validate_envelope_counts_keys_for_the_caller() -> None:
    counter = [0, 0]
    validate_envelope(
        {
            "model": "m",
            "prompt_version": "p",
            "attributes": {"a": "b"},
            "output": {"a": {"b": 1}, "c": [{"d": 2.5e19}]},
        },
        LIMITS,
        keys_seen=counter,
        now=NOW,
    )
    # 4 top-level keys + 4 output keys (a, b, c, d) + 1 attribute; and a float that may be a rounded integer
    assert counter == [9, 1]


# --- payload_hash ----------------------------------------------------------------------------------------


def test_payload_hash_ignores_formatting() -> None:
    env = make_envelope(attributes={"a": "1", "b": "2"})
    compact = json.dumps(env, separators=(",", ":")).encode()
    spaced = json.dumps(env, indent=4, ensure_ascii=True).encode()
    escaped = json.dumps(env | {"attributes": {"b": "2", "a": "1"}}, separators=(" , ", " : ")).encode()
    hashes = {parse(raw).payload_hash for raw in (compact, spaced, escaped)}
    assert len(hashes) == 1


def test_payload_hash_differs_for_every_field_the_client_sent() -> None:
    base = make_envelope(event_id="e")
    variants = [
        base,
        make_envelope(event_id="e", output={"intent": "other"}),
        make_envelope(event_id="e", model="m2"),
        make_envelope(event_id="e", prompt_version="p2"),
        make_envelope(event_id="e", contract="c2"),
        make_envelope(event_id="e", contract=None),
        make_envelope(event_id="e", ts="2026-11-29T12:00:01Z"),
        make_envelope(event_id="e", ts=None),
        make_envelope(event_id="e", source="probe"),
        make_envelope(event_id="e", source=None),
        make_envelope(event_id="e", served_model="s2"),
        make_envelope(event_id="e", contract_version="4"),
        make_envelope(event_id="e", run_id="r"),
        make_envelope(event_id="e", agent_release="a"),
        make_envelope(event_id="e", finish_reason="stop"),
        make_envelope(event_id="e", attributes={}),
        make_envelope(event_id="e", attributes={"k": "v"}),
    ]
    hashes = [parse(v).payload_hash for v in variants]
    assert len(set(hashes)) == len(variants)


def test_payload_hash_ignores_the_event_id() -> None:
    assert parse(make_envelope(event_id="a")).payload_hash == parse(make_envelope(event_id="b")).payload_hash


def test_a_defaulted_ts_is_not_part_of_the_payload_hash() -> None:
    raw = dumps(make_envelope(ts=None, event_id="e"))
    first = parse_envelope(raw, LIMITS, now=NOW)
    later = parse_envelope(raw, LIMITS, now=NOW + timedelta(hours=3))
    assert (first.ts, later.ts) == (NOW, NOW + timedelta(hours=3))
    assert first.payload_hash == later.payload_hash


def test_the_exact_re_parse_gives_the_same_envelope() -> None:
    # A blank before a colon sends the text through the exact re-parse; the result must not differ.
    env = make_envelope(event_id="e", output={"a": [1, 2.5, None, {"b": "c"}], "n": 2**63 - 1})
    plain = parse(dumps(env))
    spaced = parse(json.dumps(env, separators=(", ", " : ")).encode())
    assert spaced == plain


def test_payload_hash_does_not_confuse_fields_that_contain_the_separator() -> None:
    a = parse(make_envelope(event_id="e", model="m\x1fp", prompt_version="q"))
    b = parse(make_envelope(event_id="e", model="m", prompt_version="p\x1fq"))
    assert a.payload_hash != b.payload_hash


_LEAF = "\x00LEAF\x00"  # a string no generated key or value holds


def _docs() -> st.SearchStrategy[Any]:
    keys = st.text(alphabet='ab.["]\\é\n', min_size=0, max_size=4)
    leaves = st.one_of(
        st.integers(),
        st.floats(allow_nan=False, allow_infinity=False),
        st.booleans(),
        st.none(),
        st.text(alphabet='xy"\\{}[],:é', max_size=5),
    )
    return st.recursive(
        leaves,
        lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=4)),
        max_leaves=20,
    )


def _leaf_paths(v: Any, at: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    """Where the scalars and empty containers of ``v`` are, as keys and indexes."""
    if isinstance(v, dict) and v:
        return [p for k, x in v.items() for p in _leaf_paths(x, (*at, k))]
    if isinstance(v, list) and v:
        return [p for i, x in enumerate(v) for p in _leaf_paths(x, (*at, i))]
    return [at]


def _with_leaf(v: Any, where: tuple[str | int, ...], at: tuple[str | int, ...] = ()) -> Any:
    if at == where:
        return _LEAF
    if isinstance(v, dict) and v:
        return {k: _with_leaf(x, where, (*at, k)) for k, x in v.items()}
    if isinstance(v, list) and v:
        return [_with_leaf(x, where, (*at, i)) for i, x in enumerate(v)]
    return v


@given(
    doc=st.dictionaries(st.text(alphabet="ab.é", max_size=3), _docs(), min_size=1, max_size=4),
    pick=st.integers(min_value=0),
    literal=st.sampled_from(["NaN", "Infinity", "-Infinity", "tru", "01"]),
    ascii_only=st.booleans(),
    spaced=st.booleans(),
)
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_text_that_is_not_json_is_located_at_the_leaf_that_breaks_it(
    doc: dict[str, Any], pick: int, literal: str, ascii_only: bool, spaced: bool
) -> None:
    leaves = _leaf_paths(doc)
    where = leaves[pick % len(leaves)]
    path = "output" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in where)
    text = json.dumps(
        {"output": _with_leaf(doc, where)}, ensure_ascii=ascii_only, separators=(", ", ": ") if spaced else (",", ":")
    )
    leaf = json.dumps(_LEAF, ensure_ascii=ascii_only)
    assert text.count(leaf) == 1
    raw = text.replace(leaf, literal).encode()
    exc = refused(raw)
    assert (exc.fields, exc.status) == (invalid_json(raw, path), 400)
