"""The rules both implementations of the accelerator follow, stated once, in Python.

The envelope's known fields and sources, the range of ``ts``, the limits, the tag rule, the
payload identity, the ids made up for lines without one, and the number bins of the rollups.
``envelope``, ``ingest`` and ``rollup`` use them (and re-export them under their old names); the
pure-Python twin of the accelerator calls them; the C copies them, and
``tests/collector/test_speedups_rules.py`` holds its copies to these. This module imports
neither accelerator, so neither depends on the modules that use it (no import cycle).
"""

from __future__ import annotations

import hashlib
import math
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from .errors import FieldError
from .flatten import json_type_of

SOURCES = frozenset({"production", "probe", "shadow"})
#: The source of an envelope sent without one, and of everything a view shows unless asked for
#: another: a cohort is (model, prompt version, contract, source).
PRODUCTION = "production"
TAGS = ("served_model", "contract_version", "run_id", "agent_release", "finish_reason")
KNOWN_FIELDS = frozenset(
    {"event_id", "ts", "model", "prompt_version", "contract", "output", "source", "attributes", *TAGS}
)
#: The times ``ts`` may name, from TS_MIN up to, not including, TS_END: a ts in year 1 or 9999
#: was stored and then could not be read back.
TS_MIN = datetime(1971, 1, 1, tzinfo=UTC)
TS_END = datetime(2200, 1, 1, tzinfo=UTC)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def epoch_us(t: datetime) -> int:
    return (t - _EPOCH) // _MICROSECOND


@dataclass(frozen=True)
class Limits:
    """Bounds an envelope must respect; built from Settings (see ``limits_from_settings``)."""

    max_event_bytes: int = 1024 * 1024
    max_depth: int = 32
    max_array_length: int = 10_000
    max_key_length: int = 256
    max_leaves: int = 10_000
    max_attributes: int = 32
    max_tag_length: int = 256

    @property
    def scanner(self) -> tuple[int, int, int, int, int]:
        """The bounds the accelerator's envelope checks take, in the order they take them: the
        longest tag, the deepest nesting, the longest array, the longest key, the most leaves."""
        return (self.max_tag_length, self.max_depth, self.max_array_length, self.max_key_length, self.max_leaves)


LIMITS = Limits()


class BigInt:
    """An integer literal too large to keep exactly (only built by the exact re-parse)."""

    def __init__(self, text: str) -> None:
        self.digits = len(text.lstrip("-"))


def json_type_name(v: Any) -> str:
    return "integer" if type(v) is BigInt else json_type_of(v).value


def check_tag(obj: dict[str, Any], name: str, errors: list[FieldError], lim: Limits, required: bool) -> str | None:
    v = obj.get(name)
    if type(v) is str and 0 < len(v) <= lim.max_tag_length and "\x00" not in v and not v.isspace():
        return v  # the common case, checked in one line
    if v is None:
        if required:
            errors.append(FieldError(name, "is required" if name not in obj else "must not be null", code="missing"))
        return None
    if type(v) is not str:
        errors.append(FieldError(name, f"must be a string, got {json_type_name(v)}", code="wrong_type"))
    elif not v.strip():
        errors.append(FieldError(name, "must not be empty", code="invalid_value"))
    elif len(v) > lim.max_tag_length:
        errors.append(
            FieldError(name, f"is {len(v)} characters long; the limit is {lim.max_tag_length}", code="too_large")
        )
    else:
        errors.append(FieldError(name, "must not contain NUL characters", code="invalid_value"))
    return None


def payload_hash(
    sorted_output: bytes,
    model: str,
    prompt_version: str,
    contract: str,
    ts_us: int | None,
    source: str | None,
    attributes_json: str | None,
    tags: tuple[str | None, str | None, str | None, str | None, str | None],
) -> str:
    """The payload identity: what tells a retry (same payload) from a reused ``event_id``.

    It covers what the client sent, formatting aside: the output as canonical JSON with the keys
    of every object in order (``sorted_output``, what ``orjson.dumps(output,
    option=OPT_SORT_KEYS)`` writes: a client or proxy that re-serializes a retry must not turn
    it into a conflict), then the tags, ``ts`` as the instant it names (microseconds since the
    epoch; None when it was left out, so a defaulted ts is not part of it) and the attributes
    as sorted JSON text. Only what the store keeps, so stored identities can be computed again
    (``store`` migrates them with this). ``tags``: served_model, contract_version, run_id,
    agent_release, finish_reason. The C scanner computes the same (tests hold the two together).
    """
    h = hashlib.blake2b(sorted_output, digest_size=16)
    h.update(orjson.dumps([model, prompt_version, contract, ts_us, source, attributes_json, *tags]))
    return h.hexdigest()


def line_id(prefix: str, n: int, line: bytes) -> str:
    return f"{prefix}:{n}:{hashlib.blake2b(line, digest_size=8).hexdigest()}"


# Number bins: the C accumulator implements the same (see _speedups_src/rollup.c, NB_*).
_EXACT_INT = 100  # integers up to this magnitude are their own bin: counts, ratings, small enums
_TINY = 1e-9  # below this magnitude, 0: a log bin per decade of tiny values would be noise
_GAMMA = 1.02  # bin k holds (gamma**(k-1), gamma**k]; its representative is within 1% of each
_LOG_GAMMA = math.log(_GAMMA)
_TOP_SCALE = 2.0 * _GAMMA / (_GAMMA + 1.0)


def number_bin(x: float | int) -> float:
    """The representative value of the histogram bin of a JSON number.

    An integer (``int``, not ``bool``) with ``|x| <= 100`` is kept exactly; ``|x| < 1e-9`` is
    0.0; any other number falls in the logarithmic bin ``k = ceil(log|x| / log(1.02))``,
    represented by ``sign(x) * 2 * 1.02**k / 2.02``, within 1% of every number in it. (In the
    top bin ``1.02**k`` overflows a double; the same value is computed from ``1.02**(k-1)``.)
    A whole float is binned like any float: ``3`` and ``3.0`` may land 1% apart. Infinities
    (an integer too large for a double) are their own bins; NaN has none and is returned as
    is (JSON has neither, and the accumulator skips NaN).

    >>> number_bin(7), number_bin(0.5), number_bin(-1000)
    (7.0, 0.49507684491019494, -993.4329743148143)
    """
    if isinstance(x, bool):
        raise TypeError("a boolean is not a number")
    if isinstance(x, int):
        if -_EXACT_INT <= x <= _EXACT_INT:
            return float(x)
        try:
            x = float(x)
        except OverflowError:
            return math.inf if x > 0 else -math.inf
    a = abs(x)
    if a < _TINY:
        return 0.0
    if math.isinf(a) or math.isnan(a):
        return x
    k = math.ceil(math.log(a) / _LOG_GAMMA)
    try:
        rep = 2.0 * _GAMMA**k / (_GAMMA + 1.0)
    except OverflowError:
        rep = math.inf
    if math.isinf(rep):  # the top bin: gamma**(k-1) does not overflow
        try:
            rep = _GAMMA ** (k - 1) * _TOP_SCALE
        except OverflowError:  # not for a finite double; kept finite in any case
            rep = math.inf
        if math.isinf(rep):
            rep = sys.float_info.max
    return -rep if x < 0 else rep
