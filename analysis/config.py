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
    "Assertion",
    "ConfigInvalid",
    "EnumMode",
    "FieldRules",
    "Grouping",
    "NumberKind",
    "OnCallConfig",
    "Severity",
    "ShortWindow",
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
    value_shift = "value_shift"  # the distribution of a number field moved (median, p10, p90)
    truncation_rate = "truncation_rate"  # share of responses cut off at the token limit
    refusal_rate = "refusal_rate"  # share of responses refused or withheld by a content filter
    invalid_output_rate = "invalid_output_rate"  # share of responses whose output is no JSON object
    served_model_change = "served_model_change"  # a new model answers a share of an alias's traffic
    unknown_contract_version = "unknown_contract_version"  # outputs tagged with an unregistered version
    assertion = "assertion"  # a declared absolute expectation does not hold (its text is the value)
    # agent runs (analysis/runs.py), per agent release, judged once each run is complete
    retry_loop_rate = "retry_loop_rate"  # share of runs calling one tool 3 or more times
    repeated_call_rate = "repeated_call_rate"  # share of runs repeating an identical call back to back
    run_length_shift = "run_length_shift"  # tool calls per run (p90)
    undeclared_call_rate = "undeclared_call_rate"  # share of runs calling a tool their contract does not declare
    # probe suites (analysis/probes/), first decisions: under threshold, or dropped from the last accepted run
    probe_tool_accuracy = "probe_tool_accuracy"  # share of cases whose first call is the expected tool
    probe_argument_accuracy = "probe_argument_accuracy"  # share whose critical arguments match
    probe_spurious_calls = "probe_spurious_calls"  # share of negative cases that called a tool
    traffic_stopped = "traffic_stopped"  # a cohort with an active baseline receives (almost) nothing


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
    AlertKind.value_shift: Severity.warn,
    AlertKind.truncation_rate: Severity.page,  # outputs lost: the caller gets nothing usable
    AlertKind.refusal_rate: Severity.page,
    AlertKind.invalid_output_rate: Severity.page,
    AlertKind.served_model_change: Severity.warn,
    AlertKind.unknown_contract_version: Severity.warn,
    AlertKind.assertion: Severity.warn,  # each assertion says its own severity
    AlertKind.retry_loop_rate: Severity.page,  # the costliest agent incident
    AlertKind.repeated_call_rate: Severity.warn,
    AlertKind.run_length_shift: Severity.warn,
    AlertKind.undeclared_call_rate: Severity.warn,
    AlertKind.probe_tool_accuracy: Severity.page,
    AlertKind.probe_argument_accuracy: Severity.page,
    AlertKind.probe_spurious_calls: Severity.page,
    AlertKind.traffic_stopped: Severity.warn,
}


class NumberKind(str, Enum):
    """Whether a number field is a quantity (its distribution is judged: value_shift) or a code."""

    auto = "auto"  # a quantity, unless whole numbers with many distinct values (ids, codes)
    quantity = "quantity"
    code = "code"  # ids and codes: no order meaning, never judged as quantities


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
    # value_shift: the largest move of a number field's p10, median or p90 allowed, as a share of
    # the baseline's p10..p90 spread, or in the field's own units when value_tolerance_units is set.
    value_tolerance: float = 0.5
    value_tolerance_units: float | None = None
    numbers: NumberKind = NumberKind.auto
    # Provider outcome rates (truncation, refusal, invalid output) as shares of responses: the rise
    # over the baseline's share that breaches, and optional absolute ceilings.
    outcome_tolerance: float = 0.02
    max_truncation_rate: float | None = None
    max_refusal_rate: float | None = None
    max_invalid_output_rate: float | None = None
    # served_model_change: a model new behind an alias answers at least this share of its outputs.
    served_model_share: float = 0.10
    ignore: bool = False
    mode: EnumMode = EnumMode.auto
    allowed: tuple[str, ...] | None = None  # declared enum values: the known set
    severity: dict[AlertKind, Severity] = field(default_factory=dict)  # overrides per kind

    def severity_of(self, kind: AlertKind) -> Severity:
        return self.severity.get(kind, DEFAULT_SEVERITY[kind])


#: The assertion kinds, each a key of an ``[[contracts.NAME.assertions]]`` table.
ASSERTION_KINDS = (
    "range",
    "min_presence",
    "max_null_share",
    "max_unknown_share",
    "max_true_share",
    "min_true_share",
    "max_array_length",
)
MAX_ASSERTIONS = 200  # per contract
MAX_PATH_LENGTH = 1000


@dataclass(frozen=True)
class Assertion:
    """A declared absolute expectation of one field of a contract's outputs (analysis/assertions.py).

    ``limit`` is the share (or, for ``max_array_length``, the p99 length) that must hold; ``low``
    and ``high`` bound a ``range``, whose ``limit`` is the share allowed outside it. ``text`` is the
    assertion as written, which names its alerts.
    """

    path: str
    kind: str
    limit: float
    text: str
    severity: Severity = Severity.warn
    low: float | None = None
    high: float | None = None
    allowed: tuple[str, ...] | None = None


@dataclass(frozen=True)
class ShortWindow:
    """A window judged beside the main one: its length, and how much larger an effect it needs.

    Every effect threshold of a check on it is multiplied by ``scale`` (a ratio threshold,
    ``cardinality_factor``, has its excess over 1 multiplied), so a short window only sees large
    changes, and sees them within minutes instead of once a day's window has diluted them.
    """

    span: timedelta
    scale: float

    @property
    def label(self) -> str:
        """``15m``, ``6h``, ``24h`` (hours up to two days, as windows are usually spoken of)."""
        seconds = self.span.total_seconds()
        if seconds % 3600 == 0 and seconds <= 48 * 3600:
            return f"{int(seconds // 3600)}h"
        return _duration_text(self.span)


#: 15 minutes at 3x the effect, 1 hour at 2x, 6 hours at 1.5x (the README's *Time to page*).
DEFAULT_SHORT_WINDOWS = (
    ShortWindow(timedelta(minutes=15), 3.0),
    ShortWindow(timedelta(hours=1), 2.0),
    ShortWindow(timedelta(hours=6), 1.5),
)
#: At most this many short windows: each is one more read of the rollups per evaluation.
MAX_SHORT_WINDOWS = 6


class Grouping(str, Enum):
    """What one incident gathers: the page alerts of a cohort, or of one field of it."""

    cohort = "cohort"
    field = "field"


@dataclass(frozen=True)
class OnCallConfig:
    """The ``[oncall]`` table: incidents, onset, links, runbooks and the traffic check.

    .. code-block:: toml

        [oncall]
        grouping = "cohort"                 # cohort | field: what one incident (one page) gathers
        onset_lookback = "7d"               # how far back the onset of a change is looked for
        dashboard_url = "https://shapewatch.example.com"   # deep links in every notice
        service_url = "https://shapewatch-api.example.com" # where /v1/runbooks/KIND is served
        traffic_period = "1h"               # traffic_stopped: judged over this period (off if unset) ...
        traffic_min_share = 0.1             # ... below this share of the baseline's rate
    """

    grouping: Grouping = Grouping.cohort
    onset_lookback: timedelta = timedelta(days=7)
    dashboard_url: str | None = None
    service_url: str | None = None
    # None: traffic_stopped is not judged (a rate is the team's to state: a nightly batch cohort
    # is silent most of the day)
    traffic_period: timedelta | None = None
    traffic_min_share: float = 0.1


#: The longest onset lookback: the search reads the field's buckets over it, per alert.
MAX_ONSET_LOOKBACK = timedelta(days=31)
_ONCALL_KEYS = ("dashboard_url", "grouping", "onset_lookback", "service_url", "traffic_min_share", "traffic_period")
_URL = re.compile(r"https?://[^\s/?#]+(/[^\s?#]*)?")


def _oncall(table: Any) -> OnCallConfig:
    if not isinstance(table, dict):
        raise ConfigInvalid("oncall", "must be a table")
    out: dict[str, Any] = {}
    for key, value in table.items():
        k = f"oncall.{key}"
        if key not in _ONCALL_KEYS:
            raise ConfigInvalid(k, f"unknown key; known keys are {', '.join(_ONCALL_KEYS)}")
        if key == "grouping":
            try:
                out[key] = Grouping(value)
            except ValueError:
                raise ConfigInvalid(k, f"{_shown(str(value))} is not one of cohort, field") from None
        elif key in ("onset_lookback", "traffic_period"):
            if not isinstance(value, str):
                raise ConfigInvalid(k, 'must be a duration string such as "7d"')
            out[key] = parse_duration(
                value,
                key=k,
                minimum=timedelta(minutes=5),
                maximum=MAX_ONSET_LOOKBACK if key == "onset_lookback" else timedelta(days=7),
            )
        elif key in ("dashboard_url", "service_url"):
            if not isinstance(value, str) or len(value) > 2000 or not _URL.fullmatch(value):
                raise ConfigInvalid(k, f"{_shown(str(value))} is not an http(s) URL with a host, without ? or #")
            out[key] = value.rstrip("/")
        else:
            out[key] = _share(value, k)
    return OnCallConfig(**out)


def _runbook_url(value: Any, key: str) -> str:
    if not isinstance(value, str) or len(value) > 2000 or not _URL.fullmatch(value.split("#")[0].split("?")[0]):
        raise ConfigInvalid(key, f"{_shown(str(value))} is not an http(s) URL")
    return value


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
    # Shorter windows judged beside ``window``, each with its effects scaled up (analysis/short_windows.py).
    short_windows: tuple[ShortWindow, ...] = field(default_factory=lambda: DEFAULT_SHORT_WINDOWS)
    # Declared assertions per contract ([[contracts.NAME.assertions]], analysis/assertions.py).
    assertions: dict[str, tuple[Assertion, ...]] = field(default_factory=dict)
    # The production model each shadow model is judged against ([shadows], analysis/compare.py);
    # a shadow model not named here is judged against the production model with the most outputs.
    shadows: dict[str, str] = field(default_factory=dict)
    # Probe suites the service runs ([probes], analysis/probes/schedule.py): suite files, how often
    # each runs, and how often the scheduler looks for a served-model or contract change.
    probe_suites: tuple[str, ...] = ()
    probe_interval: timedelta = timedelta(days=1)
    probe_tick: timedelta = timedelta(minutes=1)
    # Incidents, onset, links, runbooks, traffic_stopped ([oncall]); runbook_url per contract.
    oncall: OnCallConfig = field(default_factory=OnCallConfig)
    runbook_urls: dict[str, str] = field(default_factory=dict)

    def rules_for(self, contract: str, path: str) -> FieldRules:
        return self.fields.get((contract, path)) or self.contracts.get(contract) or self.defaults


_RULE_KEYS = {f.name: f for f in fields(FieldRules)}
# Keys that are shares of something (0..1).
_SHARES = {
    "alpha",
    "tolerance",
    "violation_tolerance",
    "hysteresis",
    "outcome_tolerance",
    "max_truncation_rate",
    "max_refusal_rate",
    "max_invalid_output_rate",
    "served_model_share",
}
_TOP = {"defaults", "contracts", "analyzer", "notify", "shadows", "probes", "oncall"}
MAX_PROBE_SUITES = 100
#: At most this many [shadows] entries, each name at most MAX_SHADOW_NAME characters.
MAX_SHADOWS, MAX_SHADOW_NAME = 1000, 200
_ANALYZER_KEYS = {
    "window",
    "interval",
    "max_baseline_age",
    "confirm_evaluations",
    "resolve_evaluations",
    "hysteresis",
    "samples_per_alert",
    "short_windows",
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
        if allow_fields and key in ("fields", "assertions", "runbook_url"):
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
        elif key == "numbers":
            try:
                changes[key] = NumberKind(value)
            except ValueError:
                raise ConfigInvalid(k, f"{value!r} is not one of auto, quantity, code") from None
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
            if not math.isfinite(value) or value < 0 or (key in _SHARES and value > 1):
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
    assertions: dict[str, tuple[Assertion, ...]] = {}
    runbook_urls: dict[str, str] = {}
    for name, table in raw_contracts.items():
        crules = _rules(defaults, table, f"contracts.{name}", allow_fields=True)
        contracts[name] = crules
        if "runbook_url" in table:
            runbook_urls[name] = _runbook_url(table["runbook_url"], f"contracts.{name}.runbook_url")
        if "assertions" in table:
            assertions[name] = _assertions(table["assertions"], f"contracts.{name}.assertions")
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
        if key == "short_windows":
            extra[key] = _short_windows(value)
        elif key in ("window", "interval", "max_baseline_age"):
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
    main = extra.get("window", AnalyzerConfig.window)
    for w in extra.get("short_windows", ()):
        if w.span >= main:
            raise ConfigInvalid(
                "analyzer.short_windows", f"{w.label} is not shorter than the window ({_duration_text(main)})"
            )
    return AnalyzerConfig(
        defaults=defaults,
        contracts=contracts,
        fields=per_field,
        notify=notify,
        assertions=assertions,
        shadows=_shadows(data.get("shadows", {})),
        **_probes(data.get("probes", {})),
        oncall=_oncall(data.get("oncall", {})),
        runbook_urls=runbook_urls,
        **extra,
    )


def _probes(value: Any) -> dict[str, Any]:
    """``[probes]``: ``suites`` (paths of suite files), ``interval`` (default 24h), ``tick`` (1m)."""
    if not isinstance(value, dict):
        raise ConfigInvalid("probes", "must be a table: suites, interval, tick")
    unknown = set(value) - {"suites", "interval", "tick"}
    if unknown:
        raise ConfigInvalid(f"probes.{sorted(unknown)[0]}", "unknown key; known keys are interval, suites, tick")
    out: dict[str, Any] = {}
    suites = value.get("suites", [])
    if not isinstance(suites, list) or not all(isinstance(s, str) and 0 < len(s) <= 4096 for s in suites):
        raise ConfigInvalid("probes.suites", 'must be an array of suite file paths, e.g. ["probes/triage.toml"]')
    if len(suites) > MAX_PROBE_SUITES:
        raise ConfigInvalid("probes.suites", f"{len(suites)} suites; at most {MAX_PROBE_SUITES}")
    out["probe_suites"] = tuple(suites)
    for key, name, low in (("interval", "probe_interval", timedelta(minutes=5)), ("tick", "probe_tick", MIN_INTERVAL)):
        if key in value:
            if not isinstance(value[key], str):
                raise ConfigInvalid(f"probes.{key}", 'must be a duration string such as "24h"')
            out[name] = parse_duration(value[key], key=f"probes.{key}", maximum=MAX_BASELINE_AGE, minimum=low)
    return out


def _shadows(value: Any) -> dict[str, str]:
    """``[shadows]``: shadow model id -> the production model id it is judged against."""
    if not isinstance(value, dict):
        raise ConfigInvalid("shadows", 'must be a table of "shadow model" = "production model"')
    if len(value) > MAX_SHADOWS:
        raise ConfigInvalid("shadows", f"{len(value)} entries; at most {MAX_SHADOWS}")
    out: dict[str, str] = {}
    for shadow, production in value.items():
        key = f'shadows."{_shown(shadow)[1:-1]}"'
        if not 1 <= len(shadow) <= MAX_SHADOW_NAME:
            raise ConfigInvalid(key, f"a model id has 1 to {MAX_SHADOW_NAME} characters")
        if not isinstance(production, str) or not 1 <= len(production) <= MAX_SHADOW_NAME:
            raise ConfigInvalid(key, f"must be the production model id, a string of 1 to {MAX_SHADOW_NAME} characters")
        out[shadow] = production
    return out


def _share(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigInvalid(key, f"must be a number from 0 to 1, not {_shown(repr(value))}")
    if not 0 <= value <= 1:
        raise ConfigInvalid(key, f"{value!r} is out of range: a share from 0 to 1")
    return float(value)


def _number(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigInvalid(key, f"must be a finite number, not {_shown(repr(value))}")
    return float(value)


def _written(table: dict[str, Any]) -> str:
    """An assertion as written, without its severity: ``range = [0, 1], max_outside = 0.01``."""

    def show(v: Any) -> str:
        if isinstance(v, list):
            return "[" + ", ".join(show(x) for x in v) + "]"
        if isinstance(v, str):
            return repr(v)
        return f"{v:g}" if isinstance(v, float) else str(v)

    return ", ".join(f"{k} = {show(v)}" for k, v in table.items() if k not in ("path", "severity"))


def _assertions(value: Any, where: str) -> tuple[Assertion, ...]:
    """``[[contracts.NAME.assertions]]`` tables -> assertions; errors name the table and key."""
    if not isinstance(value, list):
        raise ConfigInvalid(where, "must be an array of tables ([[contracts.NAME.assertions]])")
    if len(value) > MAX_ASSERTIONS:
        raise ConfigInvalid(where, f"{len(value)} assertions; at most {MAX_ASSERTIONS} per contract")
    out: list[Assertion] = []
    for i, table in enumerate(value):
        k = f"{where}[{i}]"
        if not isinstance(table, dict):
            raise ConfigInvalid(k, "must be a table with path and one of " + ", ".join(ASSERTION_KINDS))
        path = table.get("path")
        if not isinstance(path, str) or not path or len(path) > MAX_PATH_LENGTH:
            raise ConfigInvalid(f"{k}.path", f"must be a field path of 1 to {MAX_PATH_LENGTH} characters")
        kinds = [key for key in table if key in ASSERTION_KINDS]
        if len(kinds) != 1:
            raise ConfigInvalid(k, f"must hold exactly one of {', '.join(ASSERTION_KINDS)} (found {len(kinds)})")
        kind = kinds[0]
        extra = {"path", "severity", kind} | ({"max_outside"} if kind == "range" else set())
        extra |= {"allowed"} if kind == "max_unknown_share" else set()
        unknown = sorted(set(table) - extra)
        if unknown:
            raise ConfigInvalid(
                f"{k}.{unknown[0]}", f"unknown key for a {kind} assertion; known: {', '.join(sorted(extra))}"
            )
        severity = Severity.warn
        if "severity" in table:
            try:
                severity = Severity(table["severity"])
            except ValueError:
                raise ConfigInvalid(f"{k}.severity", f"{_shown(repr(table['severity']))} is not page or warn") from None
        spec: dict[str, Any] = {}
        if kind == "range":
            bounds = table["range"]
            if not isinstance(bounds, list) or len(bounds) != 2:
                raise ConfigInvalid(f"{k}.range", "must be [low, high]")
            low, high = _number(bounds[0], f"{k}.range"), _number(bounds[1], f"{k}.range")
            if low > high:
                raise ConfigInvalid(f"{k}.range", f"low {low:g} is above high {high:g}")
            spec = {"low": low, "high": high, "limit": _share(table.get("max_outside", 0), f"{k}.max_outside")}
        elif kind == "max_array_length":
            n = table[kind]
            if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= 10**9:
                raise ConfigInvalid(
                    f"{k}.{kind}", f"must be a whole number of items from 0 to 10^9, not {_shown(repr(n))}"
                )
            spec = {"limit": float(n)}
        else:
            spec = {"limit": _share(table[kind], f"{k}.{kind}")}
        if "allowed" in table:
            allowed = table["allowed"]
            if not isinstance(allowed, list) or not all(isinstance(v, str) for v in allowed) or len(allowed) > 10_000:
                raise ConfigInvalid(f"{k}.allowed", "must be a list of at most 10,000 strings")
            spec["allowed"] = tuple(allowed)
        out.append(Assertion(path, kind, text=_written(table)[:500], severity=severity, **spec))
    return tuple(out)


def _short_windows(value: Any) -> tuple[ShortWindow, ...]:
    """``[{window = "15m", scale = 3}, ...]`` -> short windows, shortest first; [] turns them off."""
    key = "analyzer.short_windows"
    if not isinstance(value, list):
        raise ConfigInvalid(key, 'must be a list of tables such as { window = "1h", scale = 2 }')
    if len(value) > MAX_SHORT_WINDOWS:
        raise ConfigInvalid(key, f"{len(value)} windows; at most {MAX_SHORT_WINDOWS}")
    out: list[ShortWindow] = []
    for i, item in enumerate(value):
        k = f"{key}[{i}]"
        if not isinstance(item, dict) or set(item) != {"window", "scale"}:
            raise ConfigInvalid(k, 'must be a table of exactly window and scale, such as { window = "1h", scale = 2 }')
        if not isinstance(item["window"], str):
            raise ConfigInvalid(f"{k}.window", 'must be a duration string such as "1h"')
        span = parse_duration(item["window"], key=f"{k}.window", minimum=timedelta(minutes=1))
        scale = item["scale"]
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
            raise ConfigInvalid(f"{k}.scale", f"must be a number, not {scale!r}")
        if not 1 <= scale <= 100:
            raise ConfigInvalid(f"{k}.scale", f"{scale!r} is out of range: 1 (the window's own thresholds) to 100")
        if any(w.span == span for w in out):
            raise ConfigInvalid(f"{k}.window", f"{_duration_text(span)} is given twice")
        out.append(ShortWindow(span, float(scale)))
    return tuple(sorted(out, key=lambda w: w.span))


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
