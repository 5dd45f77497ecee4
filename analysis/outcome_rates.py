"""Provider outcome rates: truncation, refusal and invalid output as shares of a cohort's responses.

The provider route counts per cohort the responses that never gave a usable output
(``collector.adapters.OutcomeKind``: a ``length``/``max_tokens`` stop, a refusal, a content
filter, arguments that are no JSON, JSON that is no object). A model that starts cutting 8% of
its answers at the token limit changes no field's shape: its outputs simply stop coming. These
checks judge each rate against the baseline's (the same kinds counted over the baseline's own
window) and, when configured, against an absolute ceiling:

- ``truncation_rate``: ``truncated``;
- ``refusal_rate``: ``refusal`` and ``content_filter``;
- ``invalid_output_rate``: ``invalid_json``, ``not_an_object`` and ``no_structured_output``.

A rate is a share of responses: outputs stored plus outcomes counted (an outcome is a response
that produced no output). An output stored with a ``finish_reason`` that says its response was
cut, filtered or refused (``collector.adapters.FINISH_OUTCOMES``) counts too, as ``output:<kind>``:
in the rate's numerator, and once among the responses (as the output it is). Against the baseline it breaches when it rises by
``outcome_tolerance`` (2 points) with significance (two-proportion test); against a ceiling
(``max_truncation_rate``, ...) when it exceeds the ceiling with significance (a one-sided
binomial test against the ceiling). Both checks of a kind share the alert's fingerprint
(field ``$``: the response itself), so one alert says the rate is wrong, for either reason.
A cohort that never had an outcome of a kind gets no check for it.

>>> checks, short = compare_outcomes(base_counts, base_outputs, counts, outputs, rules)   # doctest: +SKIP
"""

from __future__ import annotations

from scipy import stats

from shapewatch.collector.adapters import WITH_OUTPUT

from .config import AlertKind, FieldRules
from .rules import Check, Insufficient, two_proportion_p

__all__ = ["OUTCOME_KINDS", "compare_outcomes", "responses"]

#: The alert kinds and the provider outcome kinds each counts.
OUTCOME_KINDS: dict[AlertKind, tuple[str, ...]] = {
    AlertKind.truncation_rate: ("truncated",),
    AlertKind.refusal_rate: ("refusal", "content_filter"),
    AlertKind.invalid_output_rate: ("invalid_json", "not_an_object", "no_structured_output"),
}
FIELD = "$"  # the response itself


def responses(outputs: int, outcomes: dict[str, int]) -> int:
    """A cohort's responses: its outputs, and its outcomes that gave no output (an outcome
    counted from a stored output's finish reason, ``output:...``, is one of the outputs)."""
    return outputs + sum(n for k, n in outcomes.items() if not k.startswith(WITH_OUTPUT))


def _ceiling(rules: FieldRules, kind: AlertKind) -> float | None:
    return {
        AlertKind.truncation_rate: rules.max_truncation_rate,
        AlertKind.refusal_rate: rules.max_refusal_rate,
        AlertKind.invalid_output_rate: rules.max_invalid_output_rate,
    }[kind]


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def compare_outcomes(
    baseline: dict[str, int],
    baseline_outputs: int,
    current: dict[str, int],
    current_outputs: int,
    rules: FieldRules,
) -> tuple[list[Check], list[Insufficient]]:
    """The outcome-rate checks of one cohort: counts per outcome kind and outputs, baseline and window."""
    checks: list[Check] = []
    short: list[Insufficient] = []
    b_total = responses(baseline_outputs, baseline)
    c_total = responses(current_outputs, current)
    for kind, counted in OUTCOME_KINDS.items():
        counted = (*counted, *(WITH_OUTPUT + k for k in counted))
        c_n = sum(current.get(k, 0) for k in counted)
        b_n = sum(baseline.get(k, 0) for k in counted)
        if not c_n:
            continue  # none in the window: nothing rose
        if c_total < rules.min_samples:
            short.append(Insufficient(FIELD, b_total, c_total, rules.min_samples))
            continue
        c_rate = c_n / c_total
        b_rate = b_n / b_total if b_total else 0.0
        counts = {k: current[k] for k in counted if current.get(k)}
        base = {"rate": round(b_rate, 6), "samples": b_total}
        cur = {"rate": round(c_rate, 6), "samples": c_total, "outcomes": counts}
        severity = rules.severity_of(kind)
        words = kind.value.replace("_", " ")
        if b_total >= rules.min_samples and c_rate > b_rate:
            checks.append(
                Check(
                    FIELD,
                    kind,
                    None,
                    severity,
                    round(c_rate - b_rate, 9),
                    rules.outcome_tolerance,
                    two_proportion_p(b_n, b_total, c_n, c_total),
                    rules.alpha,
                    base,
                    cur,
                    f"{words} {_pct(b_rate)} -> {_pct(c_rate)} of responses",
                )
            )
        ceiling = _ceiling(rules, kind)
        if ceiling is not None and c_rate > ceiling:
            p = float(stats.binomtest(c_n, c_total, ceiling, alternative="greater").pvalue) if ceiling < 1 else 1.0
            checks.append(
                Check(
                    FIELD,
                    kind,
                    None,
                    severity,
                    round(c_rate, 9),
                    # Just above the ceiling: a rate at the ceiling is allowed.
                    ceiling + 1e-9,
                    p,
                    rules.alpha,
                    {**base, "ceiling": ceiling},
                    cur,
                    f"{words} {_pct(c_rate)} of responses, over the ceiling of {_pct(ceiling)}",
                )
            )
    return checks, short
