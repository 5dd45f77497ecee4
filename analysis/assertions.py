"""Declared assertions: absolute expectations of a contract's fields, held with or without a baseline.

Every other rule compares a window with a baseline; an assertion says what must always hold,
as written in the configuration (``[[contracts.NAME.assertions]]``, parsed by ``config.py``):

- ``range = [low, high]`` with ``max_outside`` (0): the share of a number field's values outside
  the range (read from the number histogram: exact for integers up to 100, within 1% otherwise);
- ``min_presence``: the share of the field's units in which it is filled;
- ``max_null_share``: the share of its units in which it is null;
- ``max_unknown_share``: the share of its strings outside its known set (the assertion's
  ``allowed``, else the field's configured or contract-declared enum, else the baseline's values);
- ``max_true_share`` / ``min_true_share``: the share of a boolean field's booleans that are true
  (a review rate: ``needs_review`` true in at most 5%); booleans counted before true counts were
  kept make it unknown, reported as *insufficient*;
- ``max_array_length``: the p99 of an array field's lengths.

Each is judged over the analyzer's window when the field has ``min_samples`` samples there (fewer
is reported as *insufficient*), with a one-sided binomial test that the true share lies beyond
the limit (for ``max_array_length``: that more than 1% of arrays are longer), joined to the
evaluation's Benjamini-Hochberg adjustment. The effect is the excess beyond the limit; any
significant excess breaches. The alert's kind is ``assertion`` and its value the assertion as
written (``range = [0, 1], max_outside = 0.01``), with the severity the assertion declares.

>>> checks, short = check_assertions(config.assertions["intake"], profile, rules_for, None)   # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from scipy import stats

from shapewatch.collector import FieldProfile, Profile

from .config import AlertKind, Assertion, FieldRules
from .rules import Check, Insufficient

__all__ = ["check_assertions"]

_TINY = 1e-9  # any excess beyond the limit breaches (with significance)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _beyond(k: int, n: int, limit: float, above: bool) -> float:
    """One-sided p-value that a share observed as k/n lies above (or below) ``limit``."""
    if above:
        if limit <= 0:
            return 0.0 if k > 0 else 1.0
        return float(stats.binomtest(k, n, min(limit, 1.0), alternative="greater").pvalue) if limit < 1 else 1.0
    if limit >= 1:
        return 0.0 if k < n else 1.0
    return float(stats.binomtest(k, n, max(limit, 0.0), alternative="less").pvalue) if limit > 0 else 1.0


def _counts(a: Assertion, f: FieldProfile | None, events: int, known: set[str] | None) -> tuple[int, int] | None:
    """(k, n) of the share an assertion bounds; None when the field gives nothing to count."""
    if a.kind == "min_presence":
        return (f.filled, f.units) if f is not None else (0, events)
    if f is None:
        return None
    if a.kind == "range":
        assert a.low is not None and a.high is not None
        n = sum(f.numbers.values())
        return sum(c for v, c in f.numbers.items() if not a.low <= v <= a.high), n
    if a.kind == "max_null_share":
        return f.types.get("null", 0), f.units
    if a.kind == "max_unknown_share":
        if known is None:
            return None
        strings = f.types.get("string", 0)
        unknown = sum(c for v, c in f.values.items() if v not in known) + f.values_overflow + f.long_strings
        return min(unknown, strings), strings
    if a.kind in ("max_true_share", "min_true_share"):
        if f.trues is None:
            return None
        return f.trues, f.types.get("boolean", 0)
    if a.kind == "max_array_length":
        n = sum(f.array_lengths.values())
        return sum(c for length, c in f.array_lengths.items() if length > a.limit), n
    raise ValueError(f"unknown assertion kind {a.kind!r}")


def check_assertions(
    assertions: Sequence[Assertion],
    profile: Profile,
    rules_for: Callable[[str], FieldRules],
    baseline: dict[str, FieldProfile] | None,
) -> tuple[list[Check], list[Insufficient]]:
    """A check per assertion the window can judge, and the assertions with too few samples."""
    checks: list[Check] = []
    short: list[Insufficient] = []
    for a in assertions:
        rules = rules_for(a.path)
        f = profile.fields.get(a.path)
        known: set[str] | None = None
        if a.kind == "max_unknown_share":
            if a.allowed is not None:
                known = set(a.allowed)
            elif rules.allowed is not None:
                known = set(rules.allowed)
            elif baseline is not None and a.path in baseline:
                known = set(baseline[a.path].values)
        counted = _counts(a, f, profile.events, known)
        if counted is None:
            short.append(Insufficient(a.path, 0, 0, rules.min_samples))
            continue
        k, n = counted
        if n < rules.min_samples:
            short.append(Insufficient(a.path, 0, n, rules.min_samples))
            continue
        current: dict[str, Any] = {"samples": n}
        if a.kind == "max_array_length":
            assert f is not None
            p99 = f.array_percentile(0.99) or 0
            excess = p99 - a.limit
            p = _beyond(k, n, 0.01, above=True)
            current |= {"p99": p99, "longer": k}
            words = f"array length p99 {p99} (at most {a.limit:g} asserted)"
        else:
            share = k / n
            above = a.kind not in ("min_presence", "min_true_share")
            excess = share - a.limit if above else a.limit - share
            p = _beyond(k, n, a.limit, above=above)
            current |= {"share": round(share, 6), "count": k}
            bound = f"({'at most' if above else 'at least'} {_pct(a.limit)} asserted)"
            words = {
                "range": f"{_pct(share)} of values outside [{a.low:g}, {a.high:g}]" if a.kind == "range" else "",
                "min_presence": f"filled in {_pct(share)}",
                "max_null_share": f"null in {_pct(share)}",
                "max_unknown_share": f"{_pct(share)} of values unknown",
                "max_true_share": f"true in {_pct(share)}",
                "min_true_share": f"true in {_pct(share)}",
            }[a.kind] + f" {bound}"
        checks.append(
            Check(
                a.path,
                AlertKind.assertion,
                a.text,
                a.severity,
                round(max(excess, 0.0), 9),
                _TINY,
                p,
                rules.alpha,
                {"assertion": a.text, "limit": a.limit},
                current,
                f"assertion {a.path}: {a.text} does not hold: {words}",
            )
        )
    return checks, short
