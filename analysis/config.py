"""The analyzer's configuration: rule defaults, overrides per contract and field, notifiers.

Read from a TOML file (``--rules PATH`` or the ``rules_file`` setting); every
key has a default (tolerance 10 points, 200 samples minimum, ...: the README's rules table),
and a wrong key or value is refused at start-up with a message naming the key.

.. code-block:: toml

    [defaults]
    tolerance = 0.10          # presence and type shares, in points (0.10 = 10 points)
    min_samples = 200

    [contracts.intake]
    tolerance = 0.15          # everything of contract "intake"

    [contracts.intake.fields."customer.tier"]
    mode = "enum"             # enum | free_text | auto (decided from the baseline)
    allowed = ["gold", "silver", "bronze"]
    severity = { new_enum_value = "page" }

    [contracts.intake.fields.summary]
    ignore = true

>>> cfg = load_config(Path("shapewatch.toml"))            # doctest: +SKIP
>>> cfg.rules_for("intake", "customer.tier").tolerance    # doctest: +SKIP
0.15

Durations and times given to the HTTP routes, the CLI and this file are read by
``parse_duration`` and ``parse_time`` here, each with the bound of its use
(``MAX_WINDOW``, ``MAX_REVIEW_PERIOD``, ``MAX_SILENCE``, ``EARLIEST_TIME`` ..
``LATEST_TIME``; the README's "Limits" lists them): a value outside it is
refused naming the parameter, before anything is read, so no parameter makes a
request's cost or its date arithmetic unbounded.
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime, timedelta
from enum import Enum
from pathlib import Path
from typing import Any

from .errors import ConfigInvalid

__all__ = [
    "EARLIEST_TIME",
    "LATEST_TIME",
    "MAX_BASELINE_AGE",
    "MAX_REVIEW_PERIOD",
    "MAX_SILENCE",
    "MAX_WINDOW",
    "MIN_DURATION",
    "AlertKind",
    "AnalyzerConfig",
    "ConfigInvalid",
    "EnumMode",
    "FieldRules",
    "Severity",
    "check_window",
    "load_config",
    "parse_config",
    "parse_duration",
    "parse_time",
]

#: The shortest duration anything takes: a window, a silence or a period under a second is a typo.
MIN_DURATION = timedelta(seconds=1)
#: The shortest analyzer interval: evaluations may run back to back (one at a time, never overlapping).
MIN_INTERVAL = timedelta(milliseconds=1)
#: The longest window read at once (``analyze --window``, ``[analyzer] window`` and ``interval``,
#: ``/v1/cohorts``, a cohort's ``fields`` and ``series``): a window is summed from one-minute
#: rollup buckets, so its cost grows with its length; 400 days covers a year against the last.
MAX_WINDOW = timedelta(days=400)
#: The longest review period (``/v1/review?since=``, ``review --since``): the review looks for a
#: candidate window day by day through the period, once per cohort (10000 days took 18 s of CPU).
MAX_REVIEW_PERIOD = timedelta(days=90)
#: The longest silence: a longer one is a retired baseline or an ignored field, said in the config.
MAX_SILENCE = timedelta(days=90)
#: The oldest ``[analyzer] max_baseline_age`` (ten years).
MAX_BASELINE_AGE = timedelta(days=3650)
#: Times given to the routes and the CLI (``since``, ``until``, ``--at``) lie in
#: [EARLIEST_TIME, LATEST_TIME): the years observations are stored for, far from the ends of
#: ``datetime``, so a window computed from them never overflows.
EARLIEST_TIME = datetime(1971, 1, 1, tzinfo=UTC)
LATEST_TIME = datetime(2200, 1, 1, tzinfo=UTC)


class AlertKind(str, Enum):
    """What changed against the baseline (the README's rules table, *Analyzer and alerts*)."""

    presence_drop = "presence_drop"
    field_missing = "field_missing"
    presence_rise = "presence_rise"
    new_type = "new_type"
    type_shift = "type_shift"
    new_enum_value = "new_enum_value"
    unknown_enum_growth = "unknown_enum_growth"
    cardinality_jump = "cardinality_jump"
    array_size_shift = "array_size_shift"
    new_field = "new_field"
    schema_violation = "schema_violation"  # outputs breaking their registered contract at a path
    # agent runs (analysis/runs.py), per agent release, judged once each run is complete
    retry_loop_rate = "retry_loop_rate"  # share of runs calling one tool 3 or more times
    repeated_call_rate = "repeated_call_rate"  # share of runs repeating an identical call back to back
    run_length_shift = "run_length_shift"  # tool calls per run (p90)
    undeclared_call_rate = "undeclared_call_rate"  # share of runs calling a tool their contract does not declare


class Severity(str, Enum):
    page = "page"
    warn = "warn"


DEFAULT_SEVERITY: dict[AlertKind, Severity] = {
    AlertKind.presence_drop: Severity.page,
    AlertKind.field_missing: Severity.page,
    AlertKind.presence_rise: Severity.warn,
    AlertKind.new_type: Severity.page,
    AlertKind.type_shift: Severity.warn,
    AlertKind.new_enum_value: Severity.warn,
    AlertKind.unknown_enum_growth: Severity.warn,  # page above unknown_page
    AlertKind.cardinality_jump: Severity.warn,
    AlertKind.array_size_shift: Severity.warn,
    AlertKind.new_field: Severity.warn,
    AlertKind.schema_violation: Severity.page,  # callers that parse by the contract break now
    AlertKind.retry_loop_rate: Severity.page,  # the costliest agent incident
    AlertKind.repeated_call_rate: Severity.warn,
    AlertKind.run_length_shift: Severity.warn,
    AlertKind.undeclared_call_rate: Severity.warn,
}


class EnumMode(str, Enum):
    auto = "auto"  # enum-like when the baseline's strings are few, short and repeated
    enum = "enum"
    free_text = "free_text"


@dataclass(frozen=True)
class FieldRules:
    """The thresholds one field is judged by (defaults, then contract, then field overrides)."""

    min_samples: int = 200  # per field: units of the field in both baseline and window
    tolerance: float = 0.10  # presence and type shares, absolute (0.10 = 10 points)
    alpha: float = 0.01  # significance after Benjamini-Hochberg over every test of an evaluation
    new_type_min_share: float = 0.01  # a new type must reach this share of the field's values
    new_enum_min_count: int = 5  # a new enum value must be seen this often in the window
    unknown_warn: float = 0.05  # growth of the unknown-bucket share (points) that warns
    unknown_page: float = 0.20  # ... and that pages
    cardinality_factor: float = 2.0  # distinct values multiplied by this is a jump
    array_tolerance: float = 0.25  # relative change of array-size p50 or p90
    array_min_change: int = 1  # ... and at least this many items
    new_field_min_share: float = 0.01  # a new key must be filled in this share of its units
    enum_max_distinct: int = 50  # auto mode: more distinct values than this is free text
    violation_tolerance: float = 0.02  # rise of the share of outputs breaking the contract at a path
    ignore: bool = False
    mode: EnumMode = EnumMode.auto
    allowed: tuple[str, ...] | None = None  # declared enum values: the known set
    severity: dict[AlertKind, Severity] = field(default_factory=dict)  # overrides per kind

    def severity_of(self, kind: AlertKind) -> Severity:
        return self.severity.get(kind, DEFAULT_SEVERITY[kind])


@dataclass(frozen=True)
class AnalyzerConfig:
    """Everything the analyzer is configured with."""

    defaults: FieldRules = field(default_factory=FieldRules)
    contracts: dict[str, FieldRules] = field(default_factory=dict)
    fields: dict[tuple[str, str], FieldRules] = field(default_factory=dict)  # (contract, path)
    window: timedelta = timedelta(hours=24)
    interval: timedelta = timedelta(minutes=5)
    confirm_evaluations: int = 2  # a page breach must hold this many evaluations in a row to page
    resolve_evaluations: int = 2  # a firing alert resolves after this many clear evaluations
    hysteresis: float = 0.8  # a firing alert clears only below threshold * hysteresis
    samples_per_alert: int = 3
    max_baseline_age: timedelta = timedelta(days=30)  # the weekly review flags older baselines
    notify: dict[str, Any] = field(default_factory=dict)  # the [notify] table, read by notify.py

    def rules_for(self, contract: str, path: str) -> FieldRules:
        return self.fields.get((contract, path)) or self.contracts.get(contract) or self.defaults


_RULE_KEYS = {f.name: f for f in fields(FieldRules)}
_TOP = {"defaults", "contracts", "analyzer", "notify"}
_ANALYZER_KEYS = {
    "window",
    "interval",
    "max_baseline_age",
    "confirm_evaluations",
    "resolve_evaluations",
    "hysteresis",
    "samples_per_alert",
}


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
# A plain decimal and a unit: no sign, exponent, underscore, nan or inf (float() takes them all).
_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)([smhdw])")


def _shown(text: str) -> str:
    """``text`` quoted for a message, cut short: a refused value is echoed, never a megabyte of it."""
    return repr(text if len(text) <= 40 else text[:40] + "...")


def _duration_text(d: timedelta) -> str:
    if d.total_seconds() != int(d.total_seconds()):
        return f"{d.total_seconds():g}s"
    seconds = int(d.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def parse_duration(
    text: str, *, key: str = "duration", maximum: timedelta = MAX_WINDOW, minimum: timedelta = MIN_DURATION
) -> timedelta:
    """``90s``, ``15m``, ``1.5h``, ``7d``, ``2w`` -> timedelta, between ``minimum`` and ``maximum``.

    >>> parse_duration("1.5h")
    datetime.timedelta(seconds=5400)
    >>> parse_duration("nanh", key="duration")
    Traceback (most recent call last):
    ...
    analysis.errors.ConfigInvalid: duration: 'nanh' is not a duration; write e.g. 90s, 15m, 24h or 7d
    >>> parse_duration("100d", key="since", maximum=timedelta(days=90))
    Traceback (most recent call last):
    ...
    analysis.errors.ConfigInvalid: since: '100d' is longer than the limit of 90d
    """
    m = _DURATION.fullmatch(text.strip()) if isinstance(text, str) else None
    if m is None:
        raise ConfigInvalid(key, f"{_shown(str(text))} is not a duration; write e.g. 90s, 15m, 24h or 7d")
    # Decided on the float before a timedelta is made (a huge one overflows it; this is at worst inf).
    seconds = float(m[1]) * _UNITS[m[2]]
    if seconds < minimum.total_seconds():
        raise ConfigInvalid(key, f"{_shown(text)} is shorter than {_duration_text(minimum)}")
    if seconds > maximum.total_seconds():
        raise ConfigInvalid(key, f"{_shown(text)} is longer than the limit of {_duration_text(maximum)}")
    return timedelta(seconds=seconds)


def _iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def parse_time(text: str, *, key: str) -> datetime:
    """An ISO 8601 time with a zone, in UTC, in [EARLIEST_TIME, LATEST_TIME).

    >>> parse_time("2026-11-29T12:00:00+01:00", key="until")
    datetime.datetime(2026, 11, 29, 11, 0, tzinfo=datetime.timezone.utc)
    """
    t = text.strip()
    try:
        when = datetime.fromisoformat(t[:-1] + "+00:00" if t[-1:] in ("Z", "z") else t)
    except ValueError:
        raise ConfigInvalid(key, f"{_shown(text)} is not an ISO 8601 time; write e.g. 2026-11-29T12:00:00Z") from None
    if when.tzinfo is None:
        raise ConfigInvalid(key, f"{_shown(text)} has no time zone; add Z or an offset such as +02:00")
    try:
        when = when.astimezone(UTC)  # year 1 at +05:00 is before the first datetime
    except OverflowError:
        when = EARLIEST_TIME - timedelta(days=1) if when.year < 2000 else LATEST_TIME
    if not EARLIEST_TIME <= when < LATEST_TIME:
        raise ConfigInvalid(
            key, f"{_shown(text)} is outside the times taken, {_iso(EARLIEST_TIME)} to {_iso(LATEST_TIME)}"
        )
    return when


def check_window(
    since: datetime,
    until: datetime,
    *,
    maximum: timedelta = MAX_WINDOW,
    since_key: str = "since",
    until_key: str = "until",
) -> None:
    """Refuse a window that ends before it begins (naming ``until_key``) or is longer than
    ``maximum`` (naming ``since_key``: the start is what reaches back too far)."""
    if until <= since:
        raise ConfigInvalid(until_key, f"{_iso(until)} is not after {since_key} {_iso(since)}")
    if until - since > maximum:
        raise ConfigInvalid(
            since_key,
            f"the window {_iso(since)} .. {_iso(until)} is longer than the limit of {_duration_text(maximum)}",
        )


def _rules(base: FieldRules, table: Any, where: str, *, allow_fields: bool = False) -> FieldRules:
    if not isinstance(table, dict):
        raise ConfigInvalid(where, "must be a table")
    changes: dict[str, Any] = {}
    for key, value in table.items():
        if allow_fields and key == "fields":
            continue
        spec = _RULE_KEYS.get(key)
        if spec is None:
            raise ConfigInvalid(f"{where}.{key}", f"unknown key; known keys are {', '.join(sorted(_RULE_KEYS))}")
        k = f"{where}.{key}"
        if key == "mode":
            try:
                changes[key] = EnumMode(value)
            except ValueError:
                raise ConfigInvalid(k, f"{value!r} is not one of auto, enum, free_text") from None
        elif key == "allowed":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigInvalid(k, "must be a list of strings")
            changes[key] = tuple(value)
        elif key == "severity":
            if not isinstance(value, dict):
                raise ConfigInvalid(k, 'must be a table of kind = "page" | "warn"')
            sev: dict[AlertKind, Severity] = dict(base.severity)
            for kind, s in value.items():
                try:
                    sev[AlertKind(kind)] = Severity(s)
                except ValueError:
                    raise ConfigInvalid(
                        f"{k}.{kind}",
                        f"{kind!r} = {s!r}: the kind must be one of "
                        f"{', '.join(a.value for a in AlertKind)} and the severity page or warn",
                    ) from None
            changes[key] = sev
        elif key == "ignore":
            if not isinstance(value, bool):
                raise ConfigInvalid(k, "must be true or false")
            changes[key] = value
        else:
            want = int if spec.type in ("int", int) else float
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or (want is int and not isinstance(value, int))
            ):
                raise ConfigInvalid(k, f"must be a{'n integer' if want is int else ' number'}, not {value!r}")
            # TOML has nan and inf: neither is a threshold (every comparison with nan is false).
            if (
                not math.isfinite(value)
                or value < 0
                or (key in ("alpha", "tolerance", "violation_tolerance", "hysteresis") and value > 1)
            ):
                raise ConfigInvalid(k, f"{value!r} is out of range")
            changes[key] = want(value)
    rules = replace(base, **changes)
    if rules.unknown_page < rules.unknown_warn:
        raise ConfigInvalid(f"{where}.unknown_page", "must not be lower than unknown_warn")
    return rules


def parse_config(data: dict[str, Any], *, source: str = "config") -> AnalyzerConfig:
    """An AnalyzerConfig from a parsed TOML document; errors name the key and the fix."""
    for key, value in data.items():
        # The same file holds the service settings: top-level values and [shapewatch] are theirs.
        if key not in _TOP and key != "shapewatch" and isinstance(value, dict):
            raise ConfigInvalid(key, f"unknown table in {source}; known: {', '.join(sorted(_TOP | {'shapewatch'}))}")
    defaults = _rules(FieldRules(), data.get("defaults", {}), "defaults")
    contracts: dict[str, FieldRules] = {}
    per_field: dict[tuple[str, str], FieldRules] = {}
    raw_contracts = data.get("contracts", {})
    if not isinstance(raw_contracts, dict):
        raise ConfigInvalid("contracts", "must be a table of contract name -> rules")
    for name, table in raw_contracts.items():
        crules = _rules(defaults, table, f"contracts.{name}", allow_fields=True)
        contracts[name] = crules
        fields_table = table.get("fields", {})
        if not isinstance(fields_table, dict):
            raise ConfigInvalid(f"contracts.{name}.fields", 'must be a table of "field path" -> rules')
        for path, ftable in fields_table.items():
            per_field[(name, path)] = _rules(crules, ftable, f'contracts.{name}.fields."{path}"')
    analyzer = data.get("analyzer", {})
    if not isinstance(analyzer, dict):
        raise ConfigInvalid("analyzer", "must be a table")
    extra: dict[str, Any] = {}
    for key, value in analyzer.items():
        if key not in _ANALYZER_KEYS:
            raise ConfigInvalid(f"analyzer.{key}", f"unknown key; known keys are {', '.join(sorted(_ANALYZER_KEYS))}")
        if key in ("window", "interval", "max_baseline_age"):
            if not isinstance(value, str):
                raise ConfigInvalid(f"analyzer.{key}", 'must be a duration string such as "24h"')
            # An interval may be under a second (the scheduler's own tests run evaluations back to back).
            extra[key] = parse_duration(
                value,
                key=f"analyzer.{key}",
                maximum=MAX_BASELINE_AGE if key == "max_baseline_age" else MAX_WINDOW,
                minimum=MIN_INTERVAL if key == "interval" else MIN_DURATION,
            )
        elif key == "hysteresis":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise ConfigInvalid("analyzer.hysteresis", "must be a number in (0, 1]")
            extra[key] = float(value)
        else:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigInvalid(f"analyzer.{key}", "must be a positive integer")
            extra[key] = value
    notify = data.get("notify", {})
    if not isinstance(notify, dict):
        raise ConfigInvalid("notify", "must be a table")
    return AnalyzerConfig(defaults=defaults, contracts=contracts, fields=per_field, notify=notify, **extra)


def load_config(path: Path | None) -> AnalyzerConfig:
    """The configuration in ``path`` (TOML), or the defaults when None."""
    if path is None:
        return AnalyzerConfig()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigInvalid(str(path), f"cannot read the rules file ({exc.strerror})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigInvalid(str(path), f"not valid TOML: {exc}") from exc
    return parse_config(data, source=str(path))
