"""``value_shift``: the values of a number field moved, though they are still numbers and still there.

A ``confidence`` whose median falls from 0.75 to 0.12 passes every shape rule. Number histograms
are collected at ingest (``number_rollups``: exact for integers up to 100, within 1% otherwise)
and frozen into baselines; this rule compares a window's histogram of each number path with the
baseline's.

- **Test**: a chi-square test of homogeneity on the baseline's deciles. The window's values and
  the baseline's are counted in the (up to ten) intervals between the baseline's deciles, and
  the 2 x k table is tested. This is the test behind the population stability index, it works
  on binned data as it is (no raw values are kept), it sees a move of location and of spread
  alike (a rank test sees location only), and every interval holds about a tenth of the
  baseline, so the chi-square approximation holds at the sample minimum.
- **Effect**, in the field's own units: the largest move of its p10, median and p90. It breaches
  at ``value_tolerance`` (0.5) times the baseline's p10..p90 spread, or at
  ``value_tolerance_units`` when a field declares its tolerance in its units. The p-value joins
  the evaluation's Benjamini-Hochberg adjustment like every other check.
- **Codes are not quantities**: a field of whole numbers most of which exceed 100 in magnitude is
  taken for an id or a code (fresh ids every day would otherwise "shift" daily) and is not
  judged unless declared ``numbers = "quantity"``; ``numbers = "code"`` turns any field off.

>>> checks, short = compare_numbers(baseline.fields, profile.fields, rules_for)   # doctest: +SKIP
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any

from shapewatch.collector import FieldProfile

from .config import AlertKind, FieldRules, NumberKind
from .rules import Check, Insufficient, chi_square_p

__all__ = ["compare_numbers", "number_bins", "quantity_like"]

_QUANTILES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
_SMALL = 100  # whole numbers up to this magnitude are counts; beyond, a field of them is a code


def quantity_like(f: FieldProfile, rules: FieldRules) -> bool:
    """Whether a number field's values are judged as quantities (see the module docstring)."""
    if rules.numbers is not NumberKind.auto:
        return rules.numbers is NumberKind.quantity
    if f.types.get("number", 0) > 0:
        return True  # fractions: a measure
    total = sum(f.numbers.values())
    large = sum(n for v, n in f.numbers.items() if abs(v) > _SMALL)
    return large * 2 <= total


def number_bins(baseline: dict[float, int], histogram: dict[float, int]) -> dict[str, int]:
    """``histogram`` counted in the intervals between the baseline's distinct deciles."""
    edges = sorted({_quantile(baseline, q) for q in _QUANTILES})
    out: dict[str, int] = {}
    for v, n in histogram.items():
        i = bisect.bisect_left(edges, v)  # interval i: (edges[i-1], edges[i]]
        out[str(i)] = out.get(str(i), 0) + n
    return out


def _quantile(h: dict[float, int], q: float) -> float:
    f = FieldProfile("", None, 0, 0, {}, 0, {}, 0, {}, h)
    value = f.number_percentile(q)
    assert value is not None
    return value


def _summary(f: FieldProfile) -> dict[str, Any]:
    return {
        "p10": f.number_percentile(0.1),
        "p50": f.number_percentile(0.5),
        "p90": f.number_percentile(0.9),
        "samples": sum(f.numbers.values()),
    }


def _num(x: float) -> str:
    return f"{x:.4g}"


def compare_numbers(
    baseline: dict[str, FieldProfile],
    current: dict[str, FieldProfile],
    rules_for: Callable[[str], FieldRules],
) -> tuple[list[Check], list[Insufficient]]:
    """A ``value_shift`` check per number path with numbers on both sides, and the paths with too few."""
    checks: list[Check] = []
    short: list[Insufficient] = []
    for path in sorted(set(baseline) & set(current)):
        base, cur = baseline[path], current[path]
        b_n, c_n = sum(base.numbers.values()), sum(cur.numbers.values())
        if not b_n or not c_n:
            continue  # no numbers on one side: the shape rules say what happened
        rules = rules_for(path)
        if rules.ignore or not quantity_like(base, rules):
            continue
        if b_n < rules.min_samples or c_n < rules.min_samples:
            short.append(Insufficient(path, b_n, c_n, rules.min_samples))
            continue
        b, c = _summary(base), _summary(cur)
        effect = max(abs(c[q] - b[q]) for q in ("p10", "p50", "p90"))
        if rules.value_tolerance_units is not None:
            threshold, how = rules.value_tolerance_units, f"tolerance {_num(rules.value_tolerance_units)}"
        else:
            spread = b["p90"] - b["p10"]
            threshold = rules.value_tolerance * spread
            how = f"tolerance {_num(threshold)} = {rules.value_tolerance:g} x the baseline's p10..p90 spread"
        p = chi_square_p(number_bins(base.numbers, base.numbers), number_bins(base.numbers, cur.numbers))
        checks.append(
            Check(
                path,
                AlertKind.value_shift,
                None,
                rules.severity_of(AlertKind.value_shift),
                round(effect, 9),
                # A constant baseline has no spread: any move of its percentiles is a breach (with significance).
                max(round(threshold, 9), 1e-9),
                p,
                rules.alpha,
                b,
                c,
                f"median {_num(b['p50'])} -> {_num(c['p50'])}, p10 {_num(b['p10'])} -> {_num(c['p10'])}, "
                f"p90 {_num(b['p90'])} -> {_num(c['p90'])} ({how})",
            )
        )
    return checks, short
