"""The envelope rules written into the C accelerator are the Python ones.

The C scanner and validator recognise the plain case of the envelope rules without calling
Python, so they carry copies of a few definitions: the known fields, the sources, the limit on an
event_id, the contract of an envelope that names none, how the payload hash and a made-up line id
are computed, which number literals orjson writes back unchanged, the number bins. Each copy is a
named constant in the C source (its rules block); this test reads them from the source and holds
each to its Python definition, so that a rule changed on one side only fails here. (The ts range
needs no copy: envelope.py hands it to the C at import.)
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import re
import sys
from datetime import UTC, datetime

import orjson
import pytest
from harness import ROOT

from shapewatch.collector import envelope, ingest, rules
from shapewatch.collector.envelope import LIMITS, Envelope, payload_hash
from shapewatch.collector.errors import EnvelopeInvalid, FieldError


def _source() -> str:
    """The accelerator's C source: the files of its folder."""
    files = sorted((ROOT / "collector" / "_speedups_src").glob("*.[ch]"))
    assert files, "the accelerator's C source is missing"
    return "\n".join(f.read_text() for f in files)


SOURCE = _source()


def _define(name: str) -> str:
    found = re.findall(rf"^#define {name} (.+?)(?:\s*/\*.*)?$", SOURCE, re.MULTILINE)
    assert len(found) == 1, f"#define {name}: {len(found)} definitions"
    return str(found[0]).strip()


def _strings(declaration: str) -> list[str]:
    """The string literals of the C array initializer that starts with ``declaration``."""
    at = SOURCE.index(declaration)
    body = SOURCE[at : SOURCE.index("};", at)]
    return re.findall(r'"([^"]*)"', body.split("=", 1)[1])


def _k_names() -> list[str]:
    """The K_ names of the key enum, in order, as field names (K_EVENT_ID: event_id)."""
    enum = re.search(r"enum \{ (K_EVENT_ID,.*?), NKEYS \};", SOURCE, re.DOTALL)
    assert enum is not None
    return [k.strip()[2:].lower() for k in enum.group(1).split(",")]


def test_the_known_fields_are_envelope_known_fields_in_the_order_of_their_names() -> None:
    names = _strings("static const char *key_names[NKEYS]")
    assert names == _k_names()
    assert len(names) == len(set(names))
    assert set(names) == envelope._KNOWN


def test_the_sources_are_envelope_sources() -> None:
    assert sorted(_strings("static const char *sources[]")) == sorted(envelope.SOURCES)


def test_the_event_id_limit_is_the_published_one() -> None:
    published = envelope.envelope_json_schema(LIMITS)["properties"]["event_id"]
    assert int(_define("EVENT_ID_MAX")) == published["maxLength"]
    too_long = {"model": "m", "prompt_version": "p", "output": {}, "event_id": "e" * (published["maxLength"] + 1)}
    fields = [f.code for f in _refusal(orjson.dumps(too_long))]
    assert fields == ["too_large"]


def _refusal(raw: bytes) -> list[FieldError]:
    try:
        envelope.parse_envelope(raw, LIMITS, now=datetime(2026, 11, 29, tzinfo=UTC))
    except EnvelopeInvalid as exc:
        return list(exc.fields)
    raise AssertionError("accepted")


def test_the_default_contract_is_the_reference_one() -> None:
    env = envelope.parse_envelope(
        b'{"model":"m","prompt_version":"p","output":{},"event_id":"e"}',
        LIMITS,
        now=datetime(2026, 11, 29, tzinfo=UTC),
    )
    assert _define("DEFAULT_CONTRACT") == f'"{env.contract}"'
    assert envelope.envelope_json_schema(LIMITS)["properties"]["contract"]["default"] == env.contract


def test_the_envelope_scan_lines_builds_has_the_fields_of_envelope() -> None:
    assert int(_define("ENVELOPE_ITEMS")) == len(Envelope._fields)


def test_the_payload_hash_covers_the_tags_in_the_order_of_envelope_payload_hash() -> None:
    at = SOURCE.index("static const int order[] = {")
    order = [k.strip()[2:].lower() for k in SOURCE[at : SOURCE.index("};", at)].split("{", 1)[1].split(",")]
    assert order == ["model", "prompt_version", "contract", "ts", "source", "attributes", *envelope._TAGS]
    # every tag a different value: the reference's hash is the one of the list in the C's order
    values = {k: f"<{k}>" for k in order}
    hashed: list[object] = [1_234_567 if k == "ts" else values[k] for k in order]
    sorted_output = b'{"a":1}'
    expected = hashlib.blake2b(sorted_output, digest_size=int(_define("PAYLOAD_DIGEST_SIZE")))
    expected.update(orjson.dumps(hashed))
    got = payload_hash(
        sorted_output,
        values["model"],
        values["prompt_version"],
        values["contract"],
        1_234_567,
        values["source"],
        values["attributes"],
        (
            values["served_model"],
            values["contract_version"],
            values["run_id"],
            values["agent_release"],
            values["finish_reason"],
        ),
    )
    assert got == expected.hexdigest()


def test_a_made_up_line_id_is_ingest_line_id() -> None:
    assert _define("LINE_ID_FORMAT") == '"%U:%zd:%U"'  # prefix, line number, hex digest
    size = int(_define("LINE_ID_DIGEST_SIZE"))
    line = b'{"model":"m"}'
    assert ingest._line_id("f", 7, line) == f"f:7:{hashlib.blake2b(line, digest_size=size).hexdigest()}"


def test_a_line_is_stripped_as_bytes_strip_does() -> None:
    at = SOURCE.index("static inline int ascii_space(unsigned char c)")
    body = SOURCE[at : SOURCE.index("}", at)]
    escapes = {"' '": " ", "'\\t'": "\t", "'\\n'": "\n", "'\\r'": "\r", "'\\x0b'": "\x0b", "'\\x0c'": "\x0c"}
    chars = re.findall(r"c == ('[^']+')", body)
    assert all(c in escapes for c in chars), chars
    stripped_by_c = {ord(escapes[c]) for c in chars}
    assert stripped_by_c == {b for b in range(256) if bytes([b]).strip() == b""}


def test_the_number_literals_the_scanner_takes_are_ones_orjson_writes_back() -> None:
    """The scanner's output text is the reference's (orjson.dumps of the parsed output) only if
    every literal it takes comes back unchanged: the longest of each kind it takes does. (It may
    decline more than it must, 0.00001 for one: the reference then answers, more slowly.)"""
    digits = int(_define("FLOAT_MAX_DIGITS"))
    zeros = int(_define("FLOAT_MAX_LEADING_ZEROS"))
    int_digits = int(_define("INT_MAX_DIGITS"))
    assert digits == sys.float_info.dig
    for literal in (
        "0." + "1" * (digits - 1) + "3",  # the most significant digits after the point
        "-" + "9" * (digits - 1) + ".5",
        "0." + "0" * zeros + "1" * (digits - 1) + "3",  # the most leading zeros
        "9" * digits + ".0",  # the longest whole float
        "-" + "9" * int_digits,  # the longest integers
        "9" * int_digits,
    ):
        assert orjson.dumps(orjson.loads(literal)).decode() == literal
    assert int("9" * int_digits) < 2**63


def test_the_number_bins_are_rules_number_bin() -> None:
    assert int(_define("NB_EXACT")) == rules._EXACT_INT
    assert float(_define("NB_TINY")) == rules._TINY
    assert float(_define("NB_GAMMA")) == rules._GAMMA


def test_the_source_has_no_second_copy_of_a_rule() -> None:
    """A literal copy elsewhere in the C would not be checked: each appears once, in the rules."""
    for literal in ('"production"', '"default"', '"event_id"'):
        assert SOURCE.count(literal) == 1, literal
    assert re.search(r"\b128\)", SOURCE) is None  # the event_id limit only through EVENT_ID_MAX


def test_a_module_not_told_the_ts_range_declines_every_ts_and_keeps_its_own() -> None:
    """The ts range is the module's own state, empty until envelope.py sets it: a second instance
    of the C module (multi-phase init) declines every ts, and the imported one is not changed."""
    compiled = pytest.importorskip("shapewatch.collector._speedups")
    loader = importlib.machinery.ExtensionFileLoader(compiled.__name__, compiled.__file__)
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    second = importlib.util.module_from_spec(spec)
    loader.exec_module(second)
    raw = b'{"ts":"2026-11-29T12:00:00Z","model":"m","prompt_version":"p","output":{"a":1}}'
    limits = (LIMITS.max_tag_length, LIMITS.max_depth, LIMITS.max_array_length, LIMITS.max_key_length)
    assert second is not compiled
    assert second.scan_envelope(raw, *limits, LIMITS.max_leaves) is None
    fields = compiled.scan_envelope(raw, *limits, LIMITS.max_leaves)
    assert fields is not None
    assert fields[1] == datetime(2026, 11, 29, 12, tzinfo=UTC)
    second.set_ts_range(0, 1)  # its own range: the imported module's is the same as before
    assert compiled.scan_envelope(raw, *limits, LIMITS.max_leaves) == fields
