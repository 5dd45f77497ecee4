"""Comparison rules: one cohort's window profile against its baseline, field by field.

``compare_profiles`` runs every rule of the README's table on every field and
returns a ``Check`` per test it could run (with its effect size and raw
p-value) and an ``Insufficient`` per field with too few samples. It does not
decide breaches: significance is judged over *all* tests of an evaluation at
once (``adjust_p_values``, Benjamini-Hochberg), because with many fields and
cohorts some p-value is small by chance, and with large samples every
p-value is tiny, which is why a breach also needs an effect beyond tolerance.

Tests: presence and single shares with a two-proportion z-test (Fisher's
exact test when an expected count is under 5); type shares with a chi-square
test of the contingency table; array sizes with a Mann-Whitney U test
computed from the two length histograms (tie-corrected normal approximation).

Types: ``integer`` is a kind of ``number``: whole numbers on a field that
carries fractions are no new type (and type shares count them as numbers),
fractions on a field of whole numbers are. Null is left to presence: type
shares are over filled values.

>>> checks, insufficient = compare_profiles(baseline_fields, baseline_events,
...                                         profile.fields, profile.events, rules_for)   # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from scipy import stats

from shapewatch.collector import FieldProfile

from .config import AlertKind, EnumMode, FieldRules, Severity

__all__ = [
    "Check",
    "Insufficient",
    "adjust_p_values",
    "compare_profiles",
    "compare_violations",
    "enum_like",
    "parent_path",
]


@dataclass(frozen=True)
class Check:
    """One test of one rule on one field: how big the change is, and how surprising.

    A breach needs ``effect >= threshold`` and an adjusted p-value under alpha;
    a firing alert clears below ``threshold * hysteresis`` (see alerts.py).
    """

    field: str
    kind: AlertKind
    value: str | None  # the new type or enum value (part of the fingerprint); None otherwise
    severity: Severity
    effect: float
    threshold: float
    p_value: float
    alpha: float
    baseline: dict[str, Any]
    current: dict[str, Any]
    detail: str  # what changed, in words; the p-value is appended when judged
    escalate_at: float | None = None  # effect from which the severity is page (unknown_enum_growth)
    q_value: float = 1.0  # p adjusted for every test of the evaluation
    window: str | None = None  # the window judged ("24h", "15m"); None: the analyzer's window

    @property
    def breach(self) -> bool:
        return self.effect >= self.threshold and self.q_value < self.alpha

    @property
    def effective_severity(self) -> Severity:
        if self.escalate_at is not None and self.effect >= self.escalate_at:
            return Severity.page
        return self.severity


@dataclass(frozen=True)
class Insufficient:
    """A field that could not be judged: fewer samples than the minimum."""

    field: str
    baseline_samples: int
    current_samples: int
    needed: int


# --- statistics -----------------------------------------------------------------------------


def two_proportion_p(k1: int, n1: int, k2: int, n2: int) -> float:
    """Two-sided p-value that k1/n1 and k2/n2 come from one proportion."""
    if n1 <= 0 or n2 <= 0:
        return 1.0
    pooled = (k1 + k2) / (n1 + n2)
    if pooled in (0.0, 1.0):
        return 1.0
    if min(n1 * pooled, n1 * (1 - pooled), n2 * pooled, n2 * (1 - pooled)) < 5:
        return float(stats.fisher_exact([[k1, n1 - k1], [k2, n2 - k2]]).pvalue)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
    z = (k2 / n2 - k1 / n1) / se
    return float(2 * stats.norm.sf(abs(z)))


def chi_square_p(a: dict[str, int], b: dict[str, int]) -> float:
    """p-value that two categorical count vectors share one distribution."""
    cats = [c for c in sorted(set(a) | set(b)) if a.get(c, 0) + b.get(c, 0) > 0]
    if len(cats) < 2 or not sum(a.values()) or not sum(b.values()):
        return 1.0
    table = [[a.get(c, 0) for c in cats], [b.get(c, 0) for c in cats]]
    return float(stats.chi2_contingency(table, correction=False).pvalue)


def mann_whitney_p(h1: dict[int, int], h2: dict[int, int]) -> float:
    """Two-sided Mann-Whitney U p-value from two histograms (value -> count), tie-corrected."""
    n1, n2 = sum(h1.values()), sum(h2.values())
    if not n1 or not n2:
        return 1.0
    n = n1 + n2
    rank_sum1 = 0.0
    ties = 0.0
    below = 0
    for v in sorted(set(h1) | set(h2)):
        c1, c2 = h1.get(v, 0), h2.get(v, 0)
        t = c1 + c2
        avg_rank = below + (t + 1) / 2
        rank_sum1 += c1 * avg_rank
        ties += t**3 - t
        below += t
    u1 = rank_sum1 - n1 * (n1 + 1) / 2
    var = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1))) if n > 1 else 0.0
    if var <= 0:
        return 1.0
    z = (u1 - n1 * n2 / 2) / math.sqrt(var)
    return float(2 * stats.norm.sf(abs(z)))


def adjust_p_values(checks: Sequence[Check]) -> list[Check]:
    """Benjamini-Hochberg over every check of an evaluation: each gets its q-value."""
    m = len(checks)
    if not m:
        return []
    order = sorted(range(m), key=lambda i: checks[i].p_value)
    q = [1.0] * m
    running = 1.0
    for rank in range(m, 0, -1):
        i = order[rank - 1]
        running = min(running, checks[i].p_value * m / rank)
        q[i] = min(1.0, running)
    return [_with_q(c, q[i]) for i, c in enumerate(checks)]


def _with_q(c: Check, q: float) -> Check:
    return replace(c, q_value=q)


# --- paths ----------------------------------------------------------------------------------


def parent_path(path: str) -> str | None:
    """The path of the object or array a path lives in (None at the top), respecting escapes."""
    if path.endswith("[]") and not _escaped(path, len(path) - 2):
        return path[:-2]
    i = len(path) - 1
    while i >= 0:
        if path[i] == "." and not _escaped(path, i):
            return path[:i]
        i -= 1
    return None


def _escaped(path: str, i: int) -> bool:
    n = 0
    j = i - 1
    while j >= 0 and path[j] == "\\":
        n += 1
        j -= 1
    return n % 2 == 1


# --- the rules ------------------------------------------------------------------------------


def _numberish(types: dict[str, int]) -> dict[str, int]:
    """Filled types with integer counted as number (integer is a kind of number)."""
    out: dict[str, int] = {}
    for t, n in types.items():
        if t == "null" or not n:
            continue
        key = "number" if t == "integer" else t
        out[key] = out.get(key, 0) + n
    return out


def enum_like(f: FieldProfile, rules: FieldRules) -> bool:
    """Whether a field's strings are an enum (few, short, repeated values) or free text."""
    if rules.mode is not EnumMode.auto:
        return rules.mode is EnumMode.enum
    if rules.allowed is not None:
        return True
    strings = f.types.get("string", 0)
    filled = f.filled
    if strings < 1 or strings < 0.9 * filled:
        return False
    distinct = len(f.values)
    if distinct > rules.enum_max_distinct or f.long_strings + f.values_overflow > 0.01 * strings:
        return False
    return strings >= 10 * distinct  # values repeat: free text rarely does


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _shares(counts: dict[str, int]) -> dict[str, float]:
    total = sum(counts.values())
    return {k: round(v / total, 6) for k, v in sorted(counts.items())} if total else {}


@dataclass
class _Comparison:
    path: str
    base: FieldProfile | None
    cur: FieldProfile | None
    rules: FieldRules
    out: list[Check] = field(default_factory=list)

    def add(
        self,
        kind: AlertKind,
        value: str | None,
        effect: float,
        threshold: float,
        p: float,
        baseline: dict[str, Any],
        current: dict[str, Any],
        detail: str,
        escalate_at: float | None = None,
    ) -> None:
        # Effects are rounded so that a move of exactly the tolerance (70% -> 60%) breaches
        # whatever the float error of the subtraction.
        effect = round(effect, 9)
        self.out.append(
            Check(
                self.path,
                kind,
                value,
                self.rules.severity_of(kind),
                effect,
                threshold,
                p,
                self.rules.alpha,
                baseline,
                current,
                detail,
                escalate_at,
            )
        )


def compare_profiles(
    baseline: dict[str, FieldProfile],
    baseline_events: int,
    current: dict[str, FieldProfile],
    current_events: int,
    rules_for: Callable[[str], FieldRules],
) -> tuple[list[Check], list[Insufficient]]:
    """Every check that can be run between a baseline's fields and a window's, and the fields that
    had too few samples. ``rules_for(path)`` gives the thresholds of a field."""
    checks: list[Check] = []
    short: list[Insufficient] = []
    vanished: set[str] = set()  # paths absent from the window: their subtrees say nothing more
    for path in sorted(set(baseline) | set(current)):
        rules = rules_for(path)
        if rules.ignore:
            continue
        base, cur = baseline.get(path), current.get(path)
        if base is not None and (cur is None or cur.present == 0):
            if _under(path, vanished):
                continue
            vanished.add(path)
        if base is None and (parent := parent_path(path)) is not None and parent not in baseline:
            continue  # inside a new subtree: its topmost key is the one new_field reports
        b_units = base.units if base else _units(baseline, baseline_events, cur)
        c_units = cur.units if cur else _units(current, current_events, base)
        if b_units < rules.min_samples or c_units < rules.min_samples:
            short.append(Insufficient(path, b_units, c_units, rules.min_samples))
            continue
        cmp = _Comparison(path, base, cur, rules)
        if base is None:
            assert cur is not None
            _new_field(cmp, cur, b_units)
        elif _presence(cmp, base, cur, c_units) and cur is not None:
            _shape(cmp, base, cur)
        checks.extend(cmp.out)
    return checks, short


def compare_violations(
    baseline: dict[str, dict[str, int]],
    baseline_checked: int,
    current: dict[str, dict[str, int]],
    current_checked: int,
    rules_for: Callable[[str], FieldRules],
) -> tuple[list[Check], list[Insufficient]]:
    """``schema_violation`` checks: per path, the share of checked outputs breaking their registered
    contract there, against the baseline's share.

    ``baseline``/``current`` map a path ('$': the output itself) to outputs per JSON Schema
    keyword; an output is counted once per keyword, so a path's share is that of its most
    frequent keyword (a lower bound when one output breaks a path two ways). A baseline frozen
    before its contract was registered (nothing checked) expects no violation: the share is
    then judged against half the tolerance (binomial test), so a breach needs evidence.
    """
    checks: list[Check] = []
    short: list[Insufficient] = []
    if not current_checked:
        return checks, short
    for path in sorted(set(baseline) | set(current)):
        rules = rules_for(path)
        if rules.ignore:
            continue
        if current_checked < rules.min_samples or (baseline_checked and baseline_checked < rules.min_samples):
            short.append(Insufficient(path, baseline_checked, current_checked, rules.min_samples))
            continue
        b_n = max(baseline.get(path, {}).values(), default=0)
        c_n = max(current.get(path, {}).values(), default=0)
        b_rate = b_n / baseline_checked if baseline_checked else 0.0
        c_rate = c_n / current_checked
        if c_rate <= b_rate:
            continue  # fewer violations are no alert
        threshold = rules.violation_tolerance
        if baseline_checked:
            p = two_proportion_p(b_n, baseline_checked, c_n, current_checked)
        else:
            p = float(stats.binomtest(c_n, current_checked, max(threshold / 2, 1e-9), alternative="greater").pvalue)
        keywords = ", ".join(f"{k} {n}" for k, n in sorted(current.get(path, {}).items(), key=lambda kv: -kv[1]))
        cmp = _Comparison(path, None, None, rules)
        cmp.add(
            AlertKind.schema_violation,
            None,
            c_rate - b_rate,
            threshold,
            p,
            {"violation_rate": round(b_rate, 6), "samples": baseline_checked},
            {
                "violation_rate": round(c_rate, 6),
                "samples": current_checked,
                "keywords": dict(sorted(current.get(path, {}).items())),
            },
            f"outputs breaking the contract at {path}: {_pct(b_rate)} -> {_pct(c_rate)} ({keywords})",
        )
        checks.extend(cmp.out)
    return checks, short


def _under(path: str, roots: set[str]) -> bool:
    parent = parent_path(path)
    while parent is not None:
        if parent in roots:
            return True
        parent = parent_path(parent)
    return False


def _shape(cmp: _Comparison, base: FieldProfile, cur: FieldProfile) -> None:
    """Types, enum values and array sizes of a field present on both sides."""
    rules = cmp.rules
    if base.filled >= rules.min_samples and cur.filled >= rules.min_samples:
        _types(cmp, base, cur)
        if enum_like(base, rules):
            _enums(cmp, base, cur)
    if sum(base.array_lengths.values()) >= rules.min_samples and sum(cur.array_lengths.values()) >= rules.min_samples:
        _arrays(cmp, base, cur)


def _units(fields: dict[str, FieldProfile], events: int, other: FieldProfile | None) -> int:
    """Units of a path absent from one side: the outputs, or the items of its array scope there."""
    if other is None or other.scope is None:
        return events
    scope = fields.get(other.scope)
    return sum(k * n for k, n in scope.array_lengths.items()) if scope else 0


def _presence(cmp: _Comparison, base: FieldProfile, cur: FieldProfile | None, c_units: int) -> bool:
    """Presence checks; False when the field vanished (field_missing says it all)."""
    r = cmp.rules
    b_rate = base.presence_rate
    c_filled = cur.filled if cur else 0
    c_rate = c_filled / c_units if c_units else 0.0
    p = two_proportion_p(base.filled, base.units, c_filled, c_units)
    b = {"presence_rate": round(b_rate, 6), "samples": base.units}
    c = {"presence_rate": round(c_rate, 6), "samples": c_units}
    if cur is None or cur.present == 0:
        # Absent altogether: judged at the same low share a new field is (a rare field vanishing is
        # news too); significance says whether the baseline's rate makes the absence surprising.
        cmp.add(
            AlertKind.field_missing,
            None,
            b_rate,
            r.new_field_min_share,
            p,
            b,
            c,
            f"field absent from the window (baseline presence {_pct(b_rate)})",
        )
        return False
    if c_rate <= b_rate:
        cmp.add(
            AlertKind.presence_drop,
            None,
            b_rate - c_rate,
            r.tolerance,
            p,
            b,
            c,
            f"presence {_pct(b_rate)} -> {_pct(c_rate)}",
        )
    else:
        cmp.add(
            AlertKind.presence_rise,
            None,
            c_rate - b_rate,
            r.tolerance,
            p,
            b,
            c,
            f"presence {_pct(b_rate)} -> {_pct(c_rate)}",
        )
    return True


def _types(cmp: _Comparison, base: FieldProfile, cur: FieldProfile) -> None:
    r = cmp.rules
    b_types = {t: n for t, n in base.types.items() if t != "null" and n}
    c_types = {t: n for t, n in cur.types.items() if t != "null" and n}
    b_total, c_total = sum(b_types.values()), sum(c_types.values())
    new_types = []
    for t, n in sorted(c_types.items()):
        if t in b_types or (t == "integer" and "number" in b_types):
            continue  # whole numbers on a field carrying fractions are no new type
        new_types.append(t)
        share = n / c_total
        p = two_proportion_p(0, b_total, n, c_total)
        cmp.add(
            AlertKind.new_type,
            t,
            share,
            r.new_type_min_share,
            p,
            {"types": _shares(b_types), "samples": b_total},
            {"types": _shares(c_types), "samples": c_total},
            f"new type {t}: {_pct(share)} of values (never in the baseline)",
        )
    if new_types:
        return  # a new type moves every share; new_type says what happened
    b_num, c_num = _numberish(b_types), _numberish(c_types)
    if len(set(b_num) | set(c_num)) < 2:
        return
    bs, cs = _shares(b_num), _shares(c_num)
    moves = {t: cs.get(t, 0.0) - bs.get(t, 0.0) for t in set(bs) | set(cs)}
    effect = max(abs(v) for v in moves.values())
    top = sorted(moves, key=lambda t: (-abs(moves[t]), t))[:3]
    cmp.add(
        AlertKind.type_shift,
        None,
        effect,
        r.tolerance,
        chi_square_p(b_num, c_num),
        {"types": bs, "samples": b_total},
        {"types": cs, "samples": c_total},
        "type shares " + ", ".join(f"{t} {_pct(bs.get(t, 0.0))} -> {_pct(cs.get(t, 0.0))}" for t in top),
    )


def _enums(cmp: _Comparison, base: FieldProfile, cur: FieldProfile) -> None:
    r = cmp.rules
    known = set(r.allowed) if r.allowed is not None else set(base.values)
    b_strings, c_strings = base.types.get("string", 0), cur.types.get("string", 0)
    if not c_strings:
        return

    def unknown(f: FieldProfile) -> int:
        # Values outside the known set, and values not kept (overflow, too long) which cannot be known.
        return sum(n for v, n in f.values.items() if v not in known) + f.values_overflow + f.long_strings

    b_unknown, c_unknown = unknown(base), unknown(cur)
    b_share, c_share = b_unknown / b_strings if b_strings else 0.0, c_unknown / c_strings
    p_unknown = two_proportion_p(b_unknown, b_strings, c_unknown, c_strings)
    b_top = dict(sorted(base.values.items(), key=lambda kv: (-kv[1], kv[0]))[:20])
    cmp.add(
        AlertKind.unknown_enum_growth,
        None,
        c_share - b_share,
        r.unknown_warn,
        p_unknown,
        {"unknown_share": round(b_share, 6), "samples": b_strings, "known": sorted(known)[:50]},
        {"unknown_share": round(c_share, 6), "samples": c_strings},
        f"unknown values {_pct(b_share)} -> {_pct(c_share)}",
        # A severity set in the configuration wins over the built-in escalation to page.
        escalate_at=None if AlertKind.unknown_enum_growth in r.severity else r.unknown_page,
    )
    # Values too rare to breach (or to keep an alert firing) get no check: a firing alert without
    # a check clears. At most 50 per field: an explosion of values is cardinality_jump's to report.
    floor = r.new_enum_min_count * 0.5
    new_values = [
        (v, n)
        for v, n in sorted(cur.values.items(), key=lambda kv: (-kv[1], kv[0]))
        if v not in known and v not in base.values and n >= floor
    ][:50]
    for value, n in new_values:
        cmp.add(
            AlertKind.new_enum_value,
            value,
            float(n),
            float(r.new_enum_min_count),
            two_proportion_p(base.values.get(value, 0), b_strings, n, c_strings),
            {"values": b_top, "samples": b_strings},
            {"count": n, "share": round(n / c_strings, 6), "samples": c_strings},
            f"new value {value!r}: {n} times ({_pct(n / c_strings)} of values)",
        )
    b_distinct, c_distinct = len(base.values), len(cur.values)
    ratio = c_distinct / max(b_distinct, 1)
    if c_distinct - b_distinct >= 5:
        cmp.add(
            AlertKind.cardinality_jump,
            None,
            ratio,
            r.cardinality_factor,
            p_unknown,
            {"distinct": b_distinct, "samples": b_strings},
            {"distinct": c_distinct, "samples": c_strings},
            f"distinct values {b_distinct} -> {c_distinct}",
        )


def _arrays(cmp: _Comparison, base: FieldProfile, cur: FieldProfile) -> None:
    r = cmp.rules

    def summary(f: FieldProfile) -> dict[str, Any]:
        return {
            "p50": f.array_percentile(0.5),
            "p90": f.array_percentile(0.9),
            "p99": f.array_percentile(0.99),
            "empty_share": round(f.empty_array_share, 6),
            "samples": sum(f.array_lengths.values()),
        }

    b, c = summary(base), summary(cur)
    # Normalised so that 1.0 is the tolerance: the larger of a percentile's relative move
    # (p50, p90; p99 is shown but too noisy to judge) and the empty share's move in points.
    moves = [0.0]
    for q in ("p50", "p90"):
        diff = abs(c[q] - b[q])
        if diff >= r.array_min_change:
            moves.append(diff / max(b[q], 1) / r.array_tolerance)
    moves.append(abs(c["empty_share"] - b["empty_share"]) / r.tolerance if r.tolerance else 0.0)
    cmp.add(
        AlertKind.array_size_shift,
        None,
        max(moves),
        1.0,
        mann_whitney_p(base.array_lengths, cur.array_lengths),
        b,
        c,
        f"array size p50 {b['p50']} -> {c['p50']}, p90 {b['p90']} -> {c['p90']}, p99 {b['p99']} -> {c['p99']}, "
        f"empty {_pct(b['empty_share'])} -> {_pct(c['empty_share'])}",
    )


def _new_field(cmp: _Comparison, cur: FieldProfile, b_units: int) -> None:
    r = cmp.rules
    rate = cur.filled / cur.units if cur.units else 0.0
    cmp.add(
        AlertKind.new_field,
        None,
        rate,
        r.new_field_min_share,
        two_proportion_p(0, b_units, cur.filled, cur.units),
        {"presence_rate": 0.0, "samples": b_units},
        {"presence_rate": round(rate, 6), "samples": cur.units, "types": _shares(_numberish(cur.types))},
        f"new field, filled in {_pct(rate)} of its units",
    )
