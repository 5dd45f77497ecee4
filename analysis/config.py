"""The analyzer's configuration: rule defaults, overrides per contract and field, notifiers.

Read from a TOML file (``--rules PATH`` or the ``rules_file`` setting); every
key has a default (DESIGN.md's: tolerance 10 points, 200 samples minimum, ...),
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
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields, replace
from datetime import timedelta
from enum import Enum
from pathlib import Path
from typing import Any

from .errors import ConfigInvalid

__all__ = ["AlertKind", "AnalyzerConfig", "ConfigInvalid", "EnumMode", "FieldRules", "Severity", "load_config", "parse_config",
           "parse_duration"]


class AlertKind(str, Enum):
    """What changed against the baseline (DESIGN.md's rules table)."""

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


class Severity(str, Enum):
    page = "page"
    warn = "warn"


DEFAULT_SEVERITY: dict[AlertKind, Severity] = {
    AlertKind.presence_drop: Severity.page, AlertKind.field_missing: Severity.page,
    AlertKind.presence_rise: Severity.warn, AlertKind.new_type: Severity.page,
    AlertKind.type_shift: Severity.warn, AlertKind.new_enum_value: Severity.warn,
    AlertKind.unknown_enum_growth: Severity.warn,  # page above unknown_page
    AlertKind.cardinality_jump: Severity.warn, AlertKind.array_size_shift: Severity.warn,
    AlertKind.new_field: Severity.warn,
    AlertKind.schema_violation: Severity.page,  # callers that parse by the contract break now
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
_ANALYZER_KEYS = {"window", "interval", "max_baseline_age", "confirm_evaluations", "resolve_evaluations", "hysteresis",
                  "samples_per_alert"}


def parse_duration(text: str, *, key: str = "duration") -> timedelta:
    """``90s``, ``15m``, ``24h``, ``7d`` -> timedelta."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    t = text.strip()
    try:
        if not t or t[-1] not in units:
            raise ValueError
        n = float(t[:-1])
        if n <= 0:
            raise ValueError
    except ValueError:
        raise ConfigInvalid(key, f"{text!r} is not a duration; write e.g. 90s, 15m, 24h or 7d") from None
    return timedelta(seconds=n * units[t[-1]])


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
                    raise ConfigInvalid(f"{k}.{kind}", f"{kind!r} = {s!r}: the kind must be one of "
                                        f"{', '.join(a.value for a in AlertKind)} and the severity page or warn"
                                        ) from None
            changes[key] = sev
        elif key == "ignore":
            if not isinstance(value, bool):
                raise ConfigInvalid(k, "must be true or false")
            changes[key] = value
        else:
            want = int if spec.type in ("int", int) else float
            if isinstance(value, bool) or not isinstance(value, (int, float)) or (want is int and
                                                                                  not isinstance(value, int)):
                raise ConfigInvalid(k, f"must be a{'n integer' if want is int else ' number'}, not {value!r}")
            if value < 0 or (key in ("alpha", "tolerance", "violation_tolerance", "hysteresis") and value > 1):
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
            extra[key] = parse_duration(value, key=f"analyzer.{key}")
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

