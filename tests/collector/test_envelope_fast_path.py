"""The fast envelope check (``speedups.check_envelope``: the C one, or its pure-Python twin under
SHAPEWATCH_ACCEL=python) against the Python rules.

``validate_envelope`` first asks the C function whether an envelope is plainly
valid; only when it answers None do the Python rules (``_validate_slowly``, the
reference for every rule and message) run. So the C function must never accept
what the Python rules refuse, and what it accepts must become the very same
Envelope. These tests hold it to that on generated envelopes, on every edge of
the fields it reads (timestamps above all), and on random documents.
"""

from __future__ import annotations

import copy
import sys
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from harness import ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shapewatch.collector.accel import speedups
from shapewatch.collector.envelope import LIMITS, Limits, _validate_slowly, validate_envelope
from shapewatch.collector.errors import EnvelopeInvalid

sys.path.insert(0, str(ROOT / "bench"))
from gen import make_envelopes

GENERATED = list(make_envelopes(300, seed=11))


def make_envelope(i: int) -> dict[str, Any]:
    return copy.deepcopy(GENERATED[i])


NOW = datetime(2026, 11, 29, 12, 30, tzinfo=UTC)


def _fast(obj: Any, lim: Limits = LIMITS) -> Any:
    return speedups.check_envelope(obj, *lim.scanner)


def _outcome(fn: Any, obj: Any, lim: Limits) -> Any:
    keys = [0, 0]
    try:
        env = fn(copy.deepcopy(obj), lim, keys_seen=keys, now=NOW, default_id="generated-id")
    except EnvelopeInvalid as exc:
        return ("invalid", [(f.path, f.reason, f.code) for f in exc.fields], keys)
    return ("valid", env, keys)


def _agree(obj: Any, lim: Limits = LIMITS) -> bool:
    """Both paths give the same answer (envelope or errors, and the key count); returns
    whether the C check took the envelope (so a test can also assert that it did)."""
    assert _outcome(validate_envelope, obj, lim) == _outcome(_validate_slowly, obj, lim)
    taken = _fast(obj, lim) is not None
    if taken:  # only the last step, encoding a Python-built output (a 65-bit integer), may still refuse
        verdict, found, _ = _outcome(_validate_slowly, obj, lim)
        assert verdict == "valid" or [(path, code) for path, _, code in found] == [("output", "invalid_value")]
    return taken


def test_generated_envelopes_take_the_fast_path_and_equal_the_reference() -> None:
    for env in GENERATED:
        assert _agree(env), env


@pytest.mark.parametrize(
    "ts",
    [
        "2026-11-28T00:00:00Z",
        "2026-11-28t00:00:00z",
        "2026-11-28T23:59:59.999999Z",
        "2026-11-28T00:00:00.1Z",
        "2026-11-28T00:00:00.12Z",
        "2026-11-28T00:00:00.123Z",
        "2026-11-28T00:00:00.1234Z",
        "2026-11-28T00:00:00.12345Z",
        "2026-11-28T00:00:00+00:00",
        "2026-11-28T00:30:00+05:30",
        "2026-11-28T00:30:00-05:30",
        "2026-01-01T00:10:00+23:59",
        "2026-12-31T23:50:00-23:59",
        "2024-02-29T12:00:00Z",
        "2000-02-29T12:00:00Z",
        "1971-01-01T00:00:00Z",
        "1970-12-31T23:30:00-00:30",
        "2199-12-31T23:59:59.999999Z",
        "2200-01-01T00:29:00+00:30",
    ],
)
def test_timestamps_the_fast_path_reads_equal_the_reference(ts: str) -> None:
    assert _agree({**make_envelope(1), "ts": ts})


@pytest.mark.parametrize(
    "ts",
    [
        # other forms and faults: the C check steps aside and the Python rules decide
        "2026-11-28T00:00:00.1234567Z",
        "2026-11-28T00:00:00",
        "2026-11-28 00:00:00Z",
        "2026-11-28T00:00Z",
        "2026-11-28T00:00:00+0530",
        "2026-11-28T00:00:00+05:30:10",
        "2026-11-28T24:00:00Z",
        "2026-11-28T00:60:00Z",
        "2026-11-28T00:00:60Z",
        "2023-02-29T00:00:00Z",
        "2100-02-29T00:00:00Z",
        "2026-04-31T00:00:00Z",
        "2026-13-01T00:00:00Z",
        "2026-00-10T00:00:00Z",
        "2026-11-00T00:00:00Z",
        "2026-11-28T00:00:00+24:00",
        "2026-11-28T00:00:00.Z",
        "0001-01-01T00:00:00Z",
        "9999-12-31T23:59:59Z",
        # outside the accepted range (1971 up to 2200): refused by the reference, naming ts
        "1970-01-01T00:00:00Z",
        "1969-12-31T23:59:59.5Z",
        "1000-01-01T12:00:00Z",
        "9998-12-31T12:00:00Z",
        "1970-12-31T23:59:59.999999Z",
        "1971-01-01T00:29:59+00:30",
        "2200-01-01T00:00:00Z",
        "2199-12-31T23:59:59-00:01",
        "2026-11-28T00:00:00ZZ",
        "2026-11-28T00:00:00.000Z ",
        "２０２６-11-28T00:00:00Z",
        "2026-W48-6T00:00:00Z",
        "20261128T000000Z",
        "",
        "Z",
        17,
        1.5,
        True,
        ["2026-11-28T00:00:00Z"],
        {"t": 1},
    ],
)
def test_other_timestamps_leave_the_decision_to_the_reference(ts: Any) -> None:
    assert not _agree({**make_envelope(1), "ts": ts})


@pytest.mark.parametrize(
    "field",
    [
        "model",
        "prompt_version",
        "contract",
        "served_model",
        "contract_version",
        "run_id",
        "agent_release",
        "finish_reason",
        "source",
    ],
)
@pytest.mark.parametrize(
    "value",
    [
        "",
        " ",
        "\t\n",
        "\u3000",
        "\u00a0\u2003",
        "a\x00b",
        "x" * 257,
        5,
        1.0,
        False,
        [],
        {},
        None,
        "x" * 256,
        " a ",
        "\u00e9t\u00e9",
        "\U0001f600",
    ],
)
def test_tags_agree_with_the_reference(field: str, value: Any) -> None:
    env = make_envelope(2)
    env[field] = value
    _agree(env)


@pytest.mark.parametrize("source", ["production", "probe", "shadow", "Production", "prod", "shadow "])
def test_source_agrees_with_the_reference(source: str) -> None:
    assert _agree({**make_envelope(3), "source": source}) == (source in {"production", "probe", "shadow"})


@pytest.mark.parametrize("event_id", ["a", " a", "x" * 128, "x" * 129, "", " ", "\u2003", 7, None, "\x00"])
def test_event_ids_agree_with_the_reference(event_id: Any) -> None:
    _agree({**make_envelope(4), "event_id": event_id})


@pytest.mark.parametrize(
    "change",
    [
        {"attributes": {"team": "a"}},
        {"attributes": None},
        {"attributes": {}},
        {"attributes": {"a": 1}},
        {"unknown": 1},
        {"output": None},
        {"output": []},
        {"output": "{}"},
        {"output": {}},
        {"output": {"a": {"b": [1, 2, {"c": None}]}}},
        {"output": {"k" * 257: 1}},
        {"output": {"a": [0] * 10_001}},
        {"output": {"a": float(2**63)}},
        {"output": {"a": 2**64 - 1}},
        {"model": None},
        {"contract": None},
    ],
)
def test_other_fields_agree_with_the_reference(change: dict[str, Any]) -> None:
    _agree({**make_envelope(5), **change})


def test_missing_required_fields_agree() -> None:
    for name in ("model", "prompt_version", "output"):
        env = make_envelope(6)
        del env[name]
        assert not _agree(env)
    for name in ("event_id", "ts", "contract", "source", "served_model", "contract_version"):
        env = make_envelope(6)
        env.pop(name, None)
        _agree(env)


def test_limits_agree_with_the_reference() -> None:
    deep: dict[str, Any] = {"leaf": 1}
    for _ in range(6):
        deep = {"d": deep}
    tight = Limits(max_depth=4, max_array_length=3, max_key_length=5, max_leaves=4, max_tag_length=8)
    for output in (
        {"a": [1, 2, 3]},
        {"a": [1, 2, 3, 4]},
        {"abcde": 1},
        {"abcdef": 1},
        {"a": 1, "b": 2, "c": 3, "d": 4},
        {"a": 1, "b": 2, "c": 3, "d": 4, "e": 5},
        deep,
        {"d": {"d": {"d": 1}}},
    ):
        _agree({"model": "m", "prompt_version": "p", "output": output}, tight)
    _agree({"model": "m" * 8, "prompt_version": "p", "output": {}}, tight)
    _agree({"model": "m" * 9, "prompt_version": "p", "output": {}}, tight)


_TEXT = st.one_of(st.text(max_size=12), st.sampled_from(["production", "probe", "shadow", " ", ""]))
_VALUE = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), _TEXT)
_JSON = st.recursive(
    _VALUE,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=12,
)
_TS = st.one_of(
    st.datetimes(min_value=datetime(1000, 1, 2), max_value=datetime(9998, 12, 30)).flatmap(
        lambda d: st.sampled_from(
            [
                d.isoformat() + "Z",
                d.isoformat(timespec="milliseconds") + "+01:00",
                d.isoformat(timespec="seconds") + "-09:45",
                d.isoformat(),
            ]
        )
    ),
    st.text(alphabet="0123456789-T:.Z+ tz", max_size=30),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.fixed_dictionaries(
        {"model": _TEXT, "prompt_version": _TEXT, "output": st.dictionaries(st.text(max_size=6), _JSON, max_size=5)},
        optional={
            "event_id": st.one_of(st.none(), _TEXT),
            "ts": st.one_of(st.none(), _TS),
            "contract": _TEXT,
            "source": _TEXT,
            "served_model": _TEXT,
            "contract_version": st.one_of(st.none(), _TEXT),
            "run_id": _VALUE,
            "attributes": st.one_of(st.none(), st.dictionaries(_TEXT, _TEXT, max_size=2)),
            "extra": _VALUE,
        },
    )
)
def test_random_envelopes_agree_with_the_reference(env: dict[str, Any]) -> None:
    _agree(env)


def test_the_payload_hash_is_the_one_stored_before_the_fast_path() -> None:
    """Retries of events stored before must still match their payload hash. Since schema version
    8 it is the hash of the canonical payload (keys in order, ts as an instant), and stored ones
    migrate to it (test_payload_identity.py; before: 8cc4c804ea715f3bf2087b8a48076c17)."""
    line = orjson.dumps(
        {
            "event_id": "e-1",
            "ts": "2026-11-28T10:00:00.5+02:00",
            "model": "m",
            "prompt_version": "p",
            "contract": "c",
            "output": {"a": [1, "x", None], "b": 0.25},
        }
    )
    env = validate_envelope(orjson.loads(line), LIMITS)
    assert env.payload_hash == "b4563d377d07ae878f4cac377db6e894"
    assert env.ts == datetime(2026, 11, 28, 8, 0, 0, 500_000, tzinfo=UTC)
