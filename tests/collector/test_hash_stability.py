"""Stored hashes never change: the payload hash and the ids bulk import makes up, as literal values.

Both are stored (``payload_hash`` tells a retry from a reused ``event_id``; a made-up id is the
event's key), so a change of how the accelerator computes them (its own BLAKE2b, then hashlib's)
must give the very same hex digests, byte for byte, for what earlier releases stored. The
expected values were taken from the C build that still carried its own copy of BLAKE2b; the
accelerator in use is held to them (the C by default, the pure-Python twin with
SHAPEWATCH_ACCEL=python), and so is the Python reference (``envelope.payload_hash``,
``ingest._line_id``), so that no side can drift alone. The inputs cross BLAKE2b's 128-byte block
edges (the hashed text is the output's sorted text followed by the tags).
"""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
import pytest

from shapewatch.collector.accel import speedups
from shapewatch.collector.envelope import LIMITS, Envelope, _epoch_us, payload_hash
from shapewatch.collector.ingest import _line_id

NOW = datetime(2026, 11, 29, 12, 30, tzinfo=UTC)

ALL_TAGS = (
    b'{"event_id":"e-1","ts":"2026-11-29T12:00:00.123456+02:00","model":"gpt","prompt_version":"v1","contract":"c",'
    b'"served_model":"gpt-x","contract_version":"3","source":"probe","run_id":"r","agent_release":"a1",'
    b'"finish_reason":"stop","output":{"s":"\\t \\" \\\\ \\n","n":-0.25}}'
)


def _plain(output: str) -> bytes:
    return b'{"model":"m","prompt_version":"p","output":' + output.encode() + b"}"


#: (envelope text, its payload hash as stored)
PAYLOAD_HASHES = [
    (_plain("{}"), "62ba174a3babab7896bad643e942e71b"),
    (_plain('{"b":1,"a":[true,null,"x"]}'), "d43b23f9428fbc0ca65437d687026d44"),  # keys out of order
    (_plain(' {"b" : 1, "a" : {"d":2,"c":3}}'), "8bc9c36fd5895e5974ff24b18bcb6ed9"),  # and white space
    (_plain('{ "a" : 1 }'), "c2fec05adfee41956652a907b60f828d"),  # white space only
    (ALL_TAGS, "2380875ccd3d46f13ff7fbd37daa52e9"),
    (_plain('{"x":"' + "y" * 100 + '"}'), "1e06baa880bbdeba8ab27fccbebbc495"),
    (_plain('{"x":"' + "y" * 107 + '"}'), "9c8668dd255a75d4e7d221303f5c06a9"),
    (_plain('{"x":"' + "y" * 108 + '"}'), "a8467550d347bcdc98585ae432d850ea"),
    (_plain('{"x":"' + "y" * 109 + '"}'), "29d07cfd1f2518fccc1a24c206dfffac"),
    (_plain('{"x":"' + "y" * 235 + '"}'), "8cf6a4b86af5300ff0ec5d5ac499ea9f"),
    (_plain('{"x":"' + "y" * 236 + '"}'), "df5d95252fcaa17dfa5f72adc6b4c207"),
    (_plain('{"x":"' + "y" * 237 + '"}'), "3f5cbc402330147a1eceaac440486322"),
    (_plain('{"x":"' + "y" * 1000 + '"}'), "ddb85fefc3a5e511511418495881aebc"),
    (_plain('{"é":"日本語 🎉","z":{"y":[1,2.5,100.0]}}'), "6687fe465ecd3a30957d572732b3fd6a"),
]

#: bulk import's lines without an event_id: (line as in the file, id made up for it, payload hash)
LINES = [
    (
        b'{"model":"m","prompt_version":"p","output":{"a":1}}',
        "f:1:860f1c584f9f219e",
        "c2fec05adfee41956652a907b60f828d",
    ),
    (
        b'  {"model":"m","prompt_version":"p","output":{"x":"' + b"z" * 200 + b'"}}\r',
        "f:2:60a18a0bc631bc1c",
        "e102bf566e1438c079bf19902bbba895",
    ),
    (
        b'{"model":"m","prompt_version":"p","output":{"x":"' + b"q" * 120 + b'"}}',
        "f:3:9d92c54df5405995",
        "8826daca7689c1f4edb7f33ae3d2abc1",
    ),
]


@pytest.mark.parametrize(("raw", "expected"), PAYLOAD_HASHES)
def test_the_scanner_gives_the_stored_payload_hash(raw: bytes, expected: str) -> None:
    fields = speedups.scan_envelope(raw, *LIMITS.scanner)
    assert fields is not None, "the scanner must take these plain envelopes"
    assert fields[-1] == expected


@pytest.mark.parametrize(("raw", "expected"), PAYLOAD_HASHES)
def test_the_reference_gives_the_stored_payload_hash(raw: bytes, expected: str) -> None:
    env = orjson.loads(raw)
    ts = env.get("ts")
    tags = (env.get("served_model"), env.get("contract_version"), env.get("run_id"), env.get("agent_release"))
    got = payload_hash(
        orjson.dumps(env["output"], option=orjson.OPT_SORT_KEYS),
        env["model"],
        env["prompt_version"],
        env.get("contract") or "default",
        None if ts is None else _epoch_us(datetime.fromisoformat(ts)),
        env.get("source"),
        None,
        (*tags, env.get("finish_reason")),
    )
    assert got == expected


def test_scan_lines_makes_up_the_stored_ids_and_hashes() -> None:
    text = b"\n".join(line for line, _, _ in LINES)
    out: list[Envelope] = []
    origin: list[int] = []
    answer = speedups.scan_lines(
        text,
        0,
        0,
        "f",
        Envelope,
        NOW,
        10,
        out,
        origin,
        LIMITS.max_event_bytes,
        *LIMITS.scanner,
    )
    assert answer == (len(text), 3, -1, -1)
    assert origin == [1, 2, 3]
    assert [(e.event_id, e.generated_id, e.payload_hash) for e in out] == [(i, True, h) for _, i, h in LINES]


def test_the_reference_makes_up_the_stored_ids() -> None:
    assert [_line_id("f", n, line.strip()) for n, (line, _, _) in enumerate(LINES, 1)] == [i for _, i, _ in LINES]
