"""Changes as alerts: a new model answering behind an alias, and outputs tagged with an unregistered
contract version.

- ``served_model_change`` (warn; ``severity = { served_model_change = "page" }`` per contract):
  a served model the baseline never saw answers at least ``served_model_share`` (10%) of a
  cohort's outputs in the window. The notes call a silent model swap the riskiest event: the
  alert names both models (the new one is its value, the baseline's in ``baseline``) and, once
  the evaluation is judged, the fields whose shape moved in the cohort and in the new model's
  own served cohort (``with_moved_fields``). A baseline with no served model recorded (outputs
  sent without ``served_model``) says nothing about one: no check. A served cohort judged
  against its alias's baseline gets no check either: the alias's cohort carries it.
- ``unknown_contract_version`` (warn): outputs tagged with a contract version that is not
  registered for their contract, while other versions of it are, reach ``new_field_min_share``
  (1%) of the window's outputs; significance by a one-sided binomial test against half that
  share (the baseline is not asked: an unregistered version is wrong however old).

Both use the field ``$`` (the output itself) and the version or model as the alert's value.

>>> compare_served_models(baseline.served_models, profile.served_models, rules)   # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import replace

from scipy import stats

from .config import AlertKind, FieldRules
from .rules import Check, two_proportion_p

__all__ = ["FIELD", "compare_served_models", "unknown_contract_versions", "with_moved_fields"]

FIELD = "$"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _shares(counts: dict[str, int]) -> dict[str, float]:
    total = sum(counts.values())
    return {k: round(v / total, 6) for k, v in sorted(counts.items())} if total else {}


def compare_served_models(baseline: dict[str, int], current: dict[str, int], rules: FieldRules) -> list[Check]:
    """A check per served model new since the baseline (by outputs answered in the window)."""
    b_total, c_total = sum(baseline.values()), sum(current.values())
    if not b_total or not c_total:
        return []
    before = ", ".join(f"{m} {_pct(s)}" for m, s in _shares(baseline).items())
    checks = []
    for model, n in sorted(current.items()):
        if model in baseline or not n:
            continue
        share = n / c_total
        checks.append(
            Check(
                FIELD,
                AlertKind.served_model_change,
                model,
                rules.severity_of(AlertKind.served_model_change),
                round(share, 9),
                rules.served_model_share,
                two_proportion_p(0, b_total, n, c_total),
                rules.alpha,
                {"served_models": _shares(baseline), "samples": b_total},
                {"served_models": _shares(current), "samples": c_total, "share": round(share, 6)},
                f"served model {model} answers {_pct(share)} of outputs (baseline: {before})",
            )
        )
    return checks


def unknown_contract_versions(
    tagged: dict[str, dict[str, int]], outputs: int, registered: Collection[str], rules: FieldRules
) -> list[Check]:
    """A check per contract version tagged in the window (version -> status -> outputs) that is not
    in ``registered``, when some version is."""
    if not registered or not outputs:
        return []
    floor = max(rules.new_field_min_share / 2, 1e-9)
    checks = []
    for version, by_status in sorted(tagged.items()):
        if not version or version in registered:
            continue
        n = sum(by_status.values())
        if not n:
            continue
        share = n / outputs
        checks.append(
            Check(
                FIELD,
                AlertKind.unknown_contract_version,
                version,
                rules.severity_of(AlertKind.unknown_contract_version),
                round(share, 9),
                rules.new_field_min_share,
                float(stats.binomtest(min(n, outputs), outputs, floor, alternative="greater").pvalue),
                rules.alpha,
                {"registered": sorted(registered)[:50]},
                {"outputs": n, "share": round(share, 6), "samples": outputs},
                f"contract version {version!r} on {_pct(share)} of outputs is not registered "
                f"(registered: {', '.join(sorted(registered)[:10])})",
            )
        )
    return checks


def with_moved_fields(check: Check, moved: Iterable[str]) -> Check:
    """A served_model_change check with the fields whose shape moved in the same evaluation."""
    fields = sorted(set(moved) - {FIELD})
    detail = check.detail + (f"; fields moved since: {', '.join(fields[:10])}" if fields else "")
    return replace(check, current={**check.current, "fields_moved": fields[:50]}, detail=detail)
