"""Two cohorts side by side over one window: ``shapewatch compare`` and the shadow's production twin.

A comparison judges cohort A's window against cohort B's window over the same time, with the
analyzer's rules and significance: B's window plays the baseline (``rules.compare_profiles``,
``compare_violations``, ``value_shift.compare_numbers``; Benjamini-Hochberg over every test of the
comparison). A shadow cohort (a candidate answering a copy of live traffic) is judged this way in
every scheduled evaluation against its production twin: the production cohort of the same prompt
version and contract whose model the configuration names (``[shadows]``) or, failing that, the
one with the most outputs in the window.

A cohort on the command line is ``source/model/prompt_version/contract``; the source is optional
(production) and a model id may itself hold ``/`` (``meta-llama/Llama-3.1-8B``).

>>> a = parse_cohort("shadow/gpt-5-2026-01-01/triage-v1/triage")                  # doctest: +SKIP
>>> compare_cohorts(store, config, a, parse_cohort("gpt-4o-2024-08-06/triage-v1/triage"),
...                 since, until)["breaches"]                                       # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from shapewatch.baselines import Baseline, Cohort
from shapewatch.collector import PRODUCTION, SOURCES, Profile, Store, read_profile

from .config import AnalyzerConfig, FieldRules
from .errors import CohortNotFound, ParameterInvalid
from .rules import Check, Insufficient, adjust_p_values, compare_profiles, compare_violations
from .value_shift import compare_numbers

__all__ = [
    "MAX_COHORT_TEXT",
    "compare_cohorts",
    "parse_cohort",
    "production_twin",
    "twin_baseline",
]

#: The longest cohort text accepted (four tags of at most 200 characters and their slashes).
MAX_COHORT_TEXT = 803


def _invalid(name: str, text: str, reason: str) -> ParameterInvalid:
    shown = text if len(text) <= 60 else text[:60] + "..."
    return ParameterInvalid(name, f"{shown!r} {reason}")


def parse_cohort(text: str, name: str = "cohort") -> Cohort:
    """``source/model/prompt_version/contract`` (source optional) as a cohort.

    The last part is the contract, the one before it the prompt version; a first part that names
    a source (production, probe, shadow) is the source, and what lies between is the model id.
    """
    if len(text) > MAX_COHORT_TEXT:
        raise _invalid(name, text, f"is {len(text)} characters long; at most {MAX_COHORT_TEXT}")
    parts = text.split("/")
    source = PRODUCTION
    if len(parts) >= 4 and parts[0] in SOURCES:
        source, parts = parts[0], parts[1:]
    if len(parts) < 3:
        raise _invalid(name, text, "is not source/model/prompt_version/contract (the source is optional)")
    model, prompt_version, contract = "/".join(parts[:-2]), parts[-2], parts[-1]
    for label, value in (("model", model), ("prompt version", prompt_version), ("contract", contract)):
        if not value or value != value.strip():
            raise _invalid(name, text, f"has an empty or padded {label}")
    return Cohort(model, prompt_version, contract, source)


def _rules(config: AnalyzerConfig, contract: str) -> Any:
    def rules_for(path: str) -> FieldRules:
        return config.rules_for(contract, path)

    return rules_for


def _profile(store: Store, cohort: Cohort, name: str, since: datetime, until: datetime) -> Profile:
    cid = store.cohort_id(*cohort)
    if cid is None:
        raise CohortNotFound(name, cohort)
    return read_profile(store, cid, since, until)


def twin_baseline(profile: Profile, cohort: Cohort, at: datetime) -> Baseline:
    """A window profile dressed as a baseline (never stored): what a shadow, or ``compare``'s
    cohort A, is judged against. Its id says what it is: ``twin:<cohort id>``."""
    return Baseline(
        baseline_id=f"twin:{profile.cohort_id}",
        hash="",
        cohort=cohort,
        since=profile.since,
        until=profile.until,
        samples=profile.events,
        served_models=dict(profile.served_models),
        contract_versions={v: sum(by.values()) for v, by in profile.contract_checks.items() if v},
        author="",
        note="the production twin over the same window",
        created_at=at,
        forced=None,
        fields=profile.fields,
        checked=profile.checked,
        violations=profile.violations,
    )


def _judge(
    b: Baseline, p: Profile, rules_for: Any
) -> tuple[list[Check], list[Insufficient]]:  # the analyzer's field rules, less the baseline-only ones
    checks, short = compare_profiles(b.fields, b.samples, p.fields, p.events, rules_for)
    v_checks, v_short = compare_violations(b.violations, b.checked, p.violations, p.checked, rules_for)
    n_checks, n_short = compare_numbers(b.fields, p.fields, rules_for)
    return checks + v_checks + n_checks, short + v_short + n_short


def compare_cohorts(
    store: Store, config: AnalyzerConfig, a: Cohort, b: Cohort, since: datetime, until: datetime
) -> dict[str, Any]:
    """Cohort A's window judged against cohort B's over ``[since, until)``, with the rules of A's
    contract: every check that breached, the fields too thin to judge, and both sides of every
    field (presence and types) for a side-by-side view."""
    if until <= since:
        raise ParameterInvalid("until", f"{_iso(until)} must be after since ({_iso(since)})")
    store.flush_rollups()
    pa = _profile(store, a, "a", since, until)
    pb = _profile(store, b, "b", since, until)
    checks, short = _judge(twin_baseline(pb, b, until), pa, _rules(config, a.contract))
    judged = adjust_p_values(checks)
    breaches = [c for c in judged if c.breach]
    return {
        "a": {**a._asdict(), "events": pa.events},
        "b": {**b._asdict(), "events": pb.events},
        "window": {"since": _iso(since), "until": _iso(until)},
        "breaches": [_check_json(c) for c in breaches],
        "checks": len(judged),
        "insufficient": [
            {"field": i.field, "a_samples": i.current_samples, "b_samples": i.baseline_samples, "needed": i.needed}
            for i in short
        ],
        "fields": _side_by_side(pa, pb),
    }


def _iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def _check_json(c: Check) -> dict[str, Any]:
    return {
        "field": c.field,
        "kind": c.kind.value,
        "value": c.value,
        "severity": c.effective_severity.value,
        "effect": round(c.effect, 6),
        "threshold": c.threshold,
        "p_value": c.p_value,
        "q_value": c.q_value,
        "b": c.baseline,
        "a": c.current,
        "detail": c.detail,
    }


def _side_by_side(pa: Profile, pb: Profile) -> list[dict[str, Any]]:
    out = []
    for path in sorted(set(pa.fields) | set(pb.fields)):
        row: dict[str, Any] = {"field": path}
        for side, p in (("a", pa), ("b", pb)):
            f = p.fields.get(path)
            row[side] = (
                None
                if f is None
                else {"units": f.units, "presence_rate": round(f.presence_rate, 6), "types": dict(f.types)}
            )
        out.append(row)
    return out


@dataclass(frozen=True)
class _Candidate:
    cohort: Cohort
    events: int


def production_twin(
    shadow: Cohort, in_window: Mapping[Cohort, Profile], named: Mapping[str, str] | None = None
) -> Cohort | None:
    """The production cohort a shadow cohort is judged against: same prompt version and contract,
    the model ``named`` maps the shadow's model to, or else the production cohort of that prompt
    version and contract with the most outputs in the window (ties: by model id). None if none."""
    wanted = (named or {}).get(shadow.model)
    candidates: Sequence[_Candidate] = sorted(
        (
            _Candidate(c, p.events)
            for c, p in in_window.items()
            if c.source == PRODUCTION
            and c.prompt_version == shadow.prompt_version
            and c.contract == shadow.contract
            and (wanted is None or c.model == wanted)
        ),
        key=lambda x: (-x.events, x.cohort.model),
    )
    return candidates[0].cohort if candidates else None
