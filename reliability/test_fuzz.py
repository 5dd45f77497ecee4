"""Fuzzing the three parsers of untrusted input: the envelope validator, the flattener, the JSONL reader.

Hypothesis generates raw bytes, JSON texts of every shape (huge integers, NaN, duplicate
keys, deep nesting, lone surrogates, NUL), valid envelopes with one field replaced, and
valid envelopes with a slice of their bytes replaced. Pass criterion, for every input: the
only exception is the collector's own validation error (``EnvelopeInvalid``; the flattener
and the JSONL reader raise nothing at all), and no input takes more than 1 s (hypothesis
``deadline``). The unmarked tests are a short, derandomized smoke run; the marked ones run
thousands of random examples each.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hostile_support import make_envelope
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shapewatch.collector import EnvelopeInvalid, Store, flatten_output, import_files, parse_body, parse_envelope
from shapewatch.collector.envelope import LIMITS, validate_envelope
from shapewatch.collector.rollup import RollupConfig

DEADLINE_MS = 1000

# --- strategies --------------------------------------------------------------------------------

_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=40)
    | st.sampled_from(["", "\x00", "\ud800", "a.b[]\\", "'; DROP TABLE events; --", '"', "é" * 70])
)
json_values = st.recursive(
    _scalars, lambda c: st.lists(c, max_size=6) | st.dictionaries(st.text(max_size=12), c, max_size=6), max_leaves=40
)
json_objects = st.dictionaries(st.text(max_size=12), json_values, max_size=8)

_FIELDS = [
    "event_id",
    "ts",
    "model",
    "prompt_version",
    "contract",
    "output",
    "source",
    "attributes",
    "served_model",
    "contract_version",
    "run_id",
    "agent_release",
    "finish_reason",
    "extra",
]


def _dumps(v: Any) -> bytes:
    # allow_nan writes NaN / Infinity tokens: exactly the hostile text we want to send
    return json.dumps(v, allow_nan=True, ensure_ascii=False).encode("utf-8", "surrogatepass")


@st.composite
def envelope_texts(draw: st.DrawFn) -> bytes:
    kind = draw(st.integers(0, 5))
    env = make_envelope()
    if kind == 0:  # one field replaced by anything
        env[draw(st.sampled_from(_FIELDS))] = draw(json_values)
        return _dumps(env)
    if kind == 1:  # an arbitrary output
        env["output"] = draw(json_objects)
        return _dumps(env)
    if kind == 2:  # a slice of valid bytes replaced by random bytes
        raw = _dumps(env)
        i = draw(st.integers(0, len(raw)))
        j = draw(st.integers(i, min(len(raw), i + 20)))
        return raw[:i] + draw(st.binary(max_size=20)) + raw[j:]
    if kind == 3:  # a duplicate key, written into the text (json.dumps cannot)
        key = draw(st.sampled_from(["model", "output", "intent", "a"]))
        raw = _dumps({**env, "output": {"intent": "x"}})
        return (
            raw.replace(b'"intent": "x"', b'"intent": "x", "' + key.encode() + b'": 1', 1)
            if key != "model"
            else raw[:-1] + b', "model": "again"}'
        )
    if kind == 4:  # deep nesting inside the output
        depth = draw(st.integers(1, 5000))
        opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
        return (
            b'{"model":"m","prompt_version":"p","output":{"x":'
            + (opener * depth).encode()
            + b"1"
            + (closer * depth).encode()
            + b"}}"
        )
    return draw(st.binary(max_size=200))


_SMOKE = settings(
    max_examples=150,
    deadline=DEADLINE_MS,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
_LONG = settings(
    max_examples=2000,
    deadline=DEADLINE_MS,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _only_validation_errors(fn: Callable[[], Any]) -> str:
    """Run ``fn``; 'ok' or 'rejected'; any other exception propagates and fails the test."""
    try:
        fn()
    except EnvelopeInvalid:
        return "rejected"
    return "ok"


class Tally:
    def __init__(self) -> None:
        self.outcomes: dict[str, int] = {}
        self.slowest = 0.0

    def run(self, fn: Callable[[], Any]) -> None:
        t0 = time.perf_counter()
        outcome = _only_validation_errors(fn)
        self.slowest = max(self.slowest, time.perf_counter() - t0)
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    def record(self, report: dict[str, object]) -> None:
        report["inputs tried"] = sum(self.outcomes.values())
        for k in ("ok", "rejected"):
            report[f"inputs {k}"] = self.outcomes.get(k, 0)
        report["slowest input ms"] = round(self.slowest * 1000, 1)


# --- the envelope validator ---------------------------------------------------------------------


def _fuzz_envelope(cfg: settings, report: dict[str, object]) -> None:
    tally = Tally()

    @cfg
    @given(raw=envelope_texts(), ndjson=st.booleans(), as_array=st.booleans())
    def check(raw: bytes, ndjson: bool, as_array: bool) -> None:
        tally.run(lambda: parse_envelope(raw, LIMITS))
        body = b"[" + raw + b"," + raw + b"]" if as_array else raw + b"\n" + raw
        tally.run(lambda: list(parse_body(body, LIMITS, ndjson=ndjson and not as_array)))

    @cfg
    @given(obj=json_values | json_objects)
    def check_objects(obj: Any) -> None:  # Python-built input (provider adapters): lone surrogates too
        tally.run(lambda: validate_envelope({**make_envelope(), "output": obj}, LIMITS))
        tally.run(lambda: validate_envelope(obj, LIMITS))

    check()
    check_objects()
    tally.record(report)
    assert tally.outcomes.get("rejected", 0) > 0 and tally.outcomes.get("ok", 0) > 0  # both paths exercised
    assert tally.slowest < DEADLINE_MS / 1000


def test_fuzz_envelope_validator_smoke(report: dict[str, object]) -> None:
    """Fuzz, smoke: the envelope validator raises only EnvelopeInvalid, each input under 1 s"""
    _fuzz_envelope(_SMOKE, report)


@pytest.mark.reliability
def test_fuzz_envelope_validator(report: dict[str, object]) -> None:
    """Fuzz: the envelope validator raises only EnvelopeInvalid, each input under 1 s"""
    _fuzz_envelope(_LONG, report)


# --- the flattener ------------------------------------------------------------------------------


def _count(v: Any) -> int:
    if isinstance(v, dict):
        return 1 + sum(_count(x) for x in v.values())
    if isinstance(v, list):
        return 1 + sum(_count(x) for x in v)
    return 1


def _fuzz_flatten(cfg: settings, report: dict[str, object]) -> None:
    tally = Tally()

    @cfg
    @given(obj=json_objects)
    def check(obj: dict[str, Any]) -> None:
        seen: list[Any] = []
        tally.run(lambda: seen.extend(flatten_output(obj)))  # the flattener raises nothing at all
        assert len(seen) == _count(obj) - 1  # one observation per value, the output itself aside

    check()
    tally.record(report)
    assert tally.outcomes == {"ok": report["inputs tried"]}


@pytest.mark.slow
def test_fuzz_flattener_smoke(report: dict[str, object]) -> None:
    """Fuzz, smoke: the flattener never raises and sees every value once"""
    _fuzz_flatten(_SMOKE, report)


@pytest.mark.reliability
def test_fuzz_flattener(report: dict[str, object]) -> None:
    """Fuzz: the flattener never raises and sees every value once"""
    _fuzz_flatten(_LONG, report)


# --- the JSONL reader ---------------------------------------------------------------------------


def _fuzz_jsonl(cfg: settings, tmp_path: Path, report: dict[str, object]) -> None:
    store = Store.open(tmp_path / "fuzz.duckdb", rollup=RollupConfig(enum_values_per_path=50))
    totals = {"files": 0, "lines": 0, "accepted": 0, "duplicate": 0, "rejected": 0}
    slowest = 0.0
    try:

        @cfg
        @given(lines=st.lists(envelope_texts(), min_size=1, max_size=8), sep=st.sampled_from([b"\n", b"\r\n"]))
        def check(lines: list[bytes], sep: bytes) -> None:
            nonlocal slowest
            totals["files"] += 1
            path = tmp_path / f"in-{totals['files']}.jsonl"
            path.write_bytes(sep.join(lines) + sep)
            t0 = time.perf_counter()
            summary = import_files([path], store, LIMITS)  # the reader raises nothing: bad lines are quarantined
            slowest = max(slowest, time.perf_counter() - t0)
            counted = summary.accepted + summary.duplicate + summary.rejected
            # every non-blank line is counted once, whatever it holds (a UTF-8 byte order mark
            # opening the file is not part of its first line)
            text = (sep.join(lines) + sep).removeprefix(b"\xef\xbb\xbf")
            nonblank = sum(1 for chunk in text.split(b"\n") if chunk.strip())
            assert counted == nonblank
            totals["lines"] += nonblank
            for k in ("accepted", "duplicate", "rejected"):
                totals[k] += getattr(summary, k)

        check()
    finally:
        store.close()
    report.update({f"JSONL {k}": v for k, v in totals.items()})
    report["slowest file ms"] = round(slowest * 1000, 1)
    assert totals["rejected"] > 0 and totals["accepted"] > 0


def test_fuzz_jsonl_reader_smoke(tmp_path: Path, report: dict[str, object]) -> None:
    """Fuzz, smoke: the JSONL reader counts every line once and never raises"""
    _fuzz_jsonl(settings(_SMOKE, max_examples=40), tmp_path, report)


@pytest.mark.reliability
def test_fuzz_jsonl_reader(tmp_path: Path, report: dict[str, object]) -> None:
    """Fuzz: the JSONL reader counts every line once and never raises"""
    _fuzz_jsonl(settings(_LONG, max_examples=300), tmp_path, report)
