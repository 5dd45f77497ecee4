"""The analyzer: one evaluation of every cohort's window against its baseline, and the scheduled run.

``evaluate`` reads each cohort's window profile (a sum of rollup buckets, so
its cost does not grow with traffic), resolves the baseline it is compared
against (its own, a named parent's, or the previous prompt version's), runs
the rules and adjusts every p-value of the evaluation together
(Benjamini-Hochberg). ``Analyzer.run`` then moves the alerts (``alerts.step``),
attaches sample event ids to new alerts, records served-model changes and the
run itself, and enqueues pager notices in the same transaction. A failed run
is logged, recorded and counted, never raised into the scheduler.

A cohort that cannot be judged (its baseline unreadable, a rule raising on it)
fails alone: it is logged, named in the run's recorded error and counted
(``shapewatch_analyzer_cohort_failures_total``), its alerts keep their state,
and every other cohort is judged. A run in which no cohort could be judged is
a failed run.

``analyze_once`` is the offline form (``shapewatch analyze --once``): it
replays the evaluations that lead up to ``at`` (as many as a page alert needs
to be confirmed) with the states in memory, writing nothing.

>>> evaluation = evaluate(store, config, at)                       # doctest: +SKIP
>>> Analyzer(store, config, registry=registry).run()              # doctest: +SKIP
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from shapewatch.baselines import Activation, Cohort, Resolved, activation_history, is_unpinned, resolve_baseline
from shapewatch.collector import (
    Profile,
    Store,
    contract_changes,
    flatten_output,
    read_profiles,
    served_aliases,
    with_values,
)

from .alerts import Alert, AlertBook, AlertState, Judged, Transition, step
from .assertions import check_assertions
from .changes import compare_served_models, unknown_contract_versions, with_moved_fields
from .compare import production_twin, twin_baseline
from .config import AlertKind, AnalyzerConfig, FieldRules, ShortWindow
from .incidents import fold_related
from .oncall import TRAFFIC_FIELD, served_models, traffic_check, with_context
from .outcome_rates import FIELD as RESPONSES
from .outcome_rates import compare_outcomes
from .probes.scores import probe_checks
from .rules import Check, Insufficient, adjust_p_values, compare_profiles, compare_violations, enum_like
from .runs import run_checks
from .short_windows import as_presence_drop, merge_windows, scaled
from .value_shift import compare_numbers

__all__ = ["Analyzer", "CohortReport", "Evaluation", "RunResult", "analyze_once", "evaluate", "sample_event_ids"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CohortReport:
    """One cohort in one evaluation."""

    cohort: Cohort
    cohort_id: int
    events: int
    served_models: dict[str, int]
    baseline_id: str | None
    how: str | None  # own | parent | previous_prompt_version; None without a baseline
    baseline_cohort: Cohort | None
    checks: list[Check]
    insufficient: list[Insufficient]
    presence: dict[str, float]  # field -> presence rate in the window (for the gauges)
    # A served cohort whose outputs in the window are exactly those of one alias (the only
    # model behind it): judged there, not twice. Its open alerts clear here.
    mirror_of: Cohort | None = None
    # The contract versions live: the window's (version -> outputs tagged with it), the
    # baseline's, and versions first seen inside the window ("started when v4 went out").
    contracts: dict[str, Any] = field(default_factory=dict)
    # Why this cohort could not be judged (its baseline unreadable, a rule raising): it is left
    # out of this evaluation, its alerts keep their state, and every other cohort is judged.
    error: str | None = None
    # Each window judged (the analyzer's own first, then the short ones): its length, outputs and
    # fields too thin to judge there.
    windows: list[dict[str, Any]] = field(default_factory=list)
    # The served models of the baseline (outputs per model), beside ``served_models`` of the window.
    baseline_served: dict[str, int] = field(default_factory=dict)
    # Only the traffic was judged (no output in the window): the cohort's other alerts keep their state.
    silent: bool = False

    @property
    def unpinned(self) -> bool:
        return is_unpinned(self.cohort.model)

    @property
    def compared_with(self) -> str:
        if self.error is not None:
            return f"not judged: {self.error}"
        if self.mirror_of is not None:
            return f"the same outputs as {self.mirror_of} (the only model behind that alias): judged there"
        if self.baseline_id is None or self.baseline_cohort is None:
            return "no baseline"
        if self.how == "own":
            return f"baseline {self.baseline_id}"
        if self.how == "production_twin":
            return f"shadow vs production: {self.baseline_cohort} over the same window"
        why = {"parent": "named parent", "served_alias": "the alias this model answered for"}.get(
            self.how or "", "previous prompt version"
        )
        return (
            f"baseline {self.baseline_id} of {self.baseline_cohort.prompt_version} "
            f"({self.baseline_cohort.model}), inherited: {why}"
        )

    def judged(self) -> Judged | None:
        if self.error is not None or (self.baseline_id is None and not self.checks):
            return None  # nothing judged: alerts keep their state
        return Judged(
            self.cohort,
            self.checks,
            frozenset(i.field for i in self.insufficient),
            self.baseline_id,
            self.compared_with,
            self.contracts,
            served_models(self.served_models, self.baseline_served),
            partial=self.silent,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "cohort": self.cohort._asdict(),
            "events": self.events,
            "unpinned": self.unpinned,
            "served_models": self.served_models,
            "baseline_id": self.baseline_id,
            "compared_with": self.compared_with,
            "mirror_of": self.mirror_of._asdict() if self.mirror_of is not None else None,
            "contracts": self.contracts,
            "error": self.error,
            "windows": self.windows,
            "insufficient": [
                {
                    "field": i.field,
                    "baseline_samples": i.baseline_samples,
                    "current_samples": i.current_samples,
                    "needed": i.needed,
                }
                for i in self.insufficient
            ],
        }


@dataclass(frozen=True)
class Evaluation:
    at: datetime
    since: datetime
    cohorts: list[CohortReport]

    @property
    def checks(self) -> int:
        return sum(len(c.checks) for c in self.cohorts)

    @property
    def breaches(self) -> int:
        return sum(1 for c in self.cohorts for k in c.checks if k.breach)

    @property
    def failed(self) -> list[CohortReport]:
        """The cohorts that could not be judged."""
        return [c for c in self.cohorts if c.error is not None]

    @property
    def error(self) -> str | None:
        """The failed cohorts and why, for the run's record (None when every cohort was judged)."""
        failed = self.failed
        if not failed:
            return None
        shown = "; ".join(f"cohort {c.cohort}: {c.error}" for c in failed[:_FAILURES_SHOWN])
        more = f"; and {len(failed) - _FAILURES_SHOWN} more" if len(failed) > _FAILURES_SHOWN else ""
        return f"{len(failed)} of {len(self.cohorts)} cohorts not judged: {shown}{more}"

    @property
    def judged_nothing(self) -> bool:
        """Every cohort with a baseline to be judged against failed: the evaluation did not do its job."""
        return bool(self.failed) and all(
            c.error is not None for c in self.cohorts if c.baseline_id is not None or c.error is not None
        )


_FAILURES_SHOWN = 20  # failed cohorts named in a run's error; the rest are counted


def evaluate(
    store: Store,
    config: AnalyzerConfig,
    at: datetime,
    *,
    window: timedelta | None = None,
    all_values: bool = False,
) -> Evaluation:
    """Judge every cohort with traffic in ``[at - window, at)`` against its baseline (reads only),
    and over each shorter window of ``config.short_windows`` with its thresholds scaled.

    The windows' short-string values are read for the paths whose values a rule judges
    (``_value_keys``); ``all_values`` reads every path's, which judges the same (a test compares).
    """
    main = ShortWindow(window or config.window, 1.0)
    since = at - main.span
    # With number histograms (value_shift reads them); the short windows without (value_shift
    # judges the analyzer's window only). Values are read below, once the baselines are known.
    profiles = read_profiles(store, since, at, values=all_values)
    short_profiles = [
        (w, read_profiles(store, at - w.span, at, numbers=False, values=all_values))
        for w in config.short_windows
        if w.span < main.span
    ]
    current: dict[Cohort, Activation] = {a.cohort: a for a in activation_history(store)}
    first_seen = {Cohort(r.model, r.prompt_version, r.contract, r.source): r.first_seen for r in store.cohorts()}
    aliases = served_aliases(store)
    resolve = _Resolver(store, current, first_seen, aliases)
    if not all_values:
        keys = _value_keys(store, config, profiles, resolve)
        profiles = with_values(store, profiles, keys)
        short_profiles = [(w, with_values(store, ps, keys)) for w, ps in short_profiles]
    shorts = [(w, {p.cohort_id: p for p in ps}) for w, ps in short_profiles]
    shared = _Shared(store, since, at)
    in_window = {Cohort(*p.cohort): p for p in profiles}
    pending: list[
        tuple[Profile, Cohort, Any, list[Check], list[Insufficient], Cohort | None, str | None, list[dict[str, Any]]]
    ] = []
    run_rows = store.run_rollups(since, at)  # agent runs judged in the window, every cohort's (runs.py)
    # Probe suites' scores, on the cohort each suite names; one with no output in the window is
    # judged on its scores alone (probes/scores.py).
    probes = probe_checks(store, config, at)
    for cohort in probes.keys() - in_window.keys():
        cid = store.cohort_id(*cohort)
        profiles.append(Profile(cid or 0, *cohort[:3], since, at, 0, {}, {}, source=cohort.source))
    for profile in profiles:
        cohort = Cohort(*profile.cohort)
        mirror = _mirrored(profile, aliases.get(cohort, []), in_window)
        try:
            twin = _twin(cohort, in_window, config, at)
            resolved, checks, short, windows = _judge_cohort(
                store,
                config,
                profile,
                cohort,
                mirror,
                resolve,
                main,
                () if twin is not None else shorts,  # a shadow is judged over the same window only
                shared,
                twin,
            )
            if resolved is not None and mirror is None and run_rows:
                checks = checks + run_checks(store, cohort, resolved.baseline, since, at, rows=run_rows)
            checks = checks + probes.get(cohort, [])
        except Exception as exc:
            # One cohort's broken baseline (or a rule raising on it) must not blind the others:
            # logged with its cause, recorded in the run, counted by the analyzer.
            log.exception("evaluating cohort %s failed", cohort)
            pending.append((profile, cohort, None, [], [], mirror, f"{type(exc).__name__}: {exc}"[:500], []))
            continue
        pending.append((profile, cohort, resolved, checks, short, mirror, None, windows))
    # Significance is judged over every test of the evaluation at once, every window's.
    adjusted = iter(adjust_p_values([c for *_, checks, _, _, _, _ in pending for c in checks]))
    reports = []
    changes = contract_changes(store, None, since, at)
    # One check per alert: the window that breached, or that holds a firing alert.
    merged = [
        fold_related(merge_windows([next(adjusted) for _ in p[3]], hysteresis=config.hysteresis)) for p in pending
    ]
    period = config.oncall.traffic_period
    recent = store.events_by_cohort(at - period, at) if period is not None else None
    moved = {p[1]: {c.field for c in checks if c.breach} for p, checks in zip(pending, merged, strict=True)}
    for (profile, cohort, resolved, _, short, mirror, error, windows), mine in zip(pending, merged, strict=True):
        mine = [
            with_moved_fields(c, moved[cohort] | moved.get(Cohort(str(c.value), *cohort[1:]), set()))
            if c.kind is AlertKind.served_model_change
            else c
            for c in mine
        ]
        if recent is not None and resolved is not None and mirror is None and error is None:
            mine += _traffic(config, resolved, cohort, recent.get(profile.cohort_id, 0))
        contracts = {
            "window": {v: sum(by.values()) for v, by in sorted(profile.contract_checks.items()) if v},
            "live": profile.live_contract_version,
            "baseline": dict(resolved.baseline.contract_versions) if resolved else {},
            "changes": [
                {"version": c["version"], "first_seen": c["first_seen"].isoformat()}
                for c in changes.get(profile.cohort_id, [])
            ],
        }
        reports.append(
            CohortReport(
                cohort,
                profile.cohort_id,
                profile.events,
                profile.served_models,
                resolved.baseline.baseline_id if resolved else None,
                resolved.how if resolved else None,
                resolved.baseline.cohort if resolved else None,
                mine,
                short,
                {p: round(f.presence_rate, 6) for p, f in profile.fields.items() if f.scope is None},
                mirror,
                contracts,
                error,
                windows,
                dict(resolved.baseline.served_models) if resolved else {},
            )
        )
    if recent is not None:
        reports += _silent_cohorts(store, config, at, current, first_seen, aliases, in_window, recent)
    return Evaluation(at, since, reports)


def _traffic(config: AnalyzerConfig, resolved: Resolved, cohort: Cohort, recent: int) -> list[Check]:
    """The traffic_stopped check of a cohort judged against its own baseline (an inherited one
    says nothing of this cohort's rate)."""
    b = resolved.baseline
    if resolved.how != "own" or b.cohort != cohort:
        return []
    check = traffic_check(
        b.samples, b.until - b.since, recent, config, config.rules_for(cohort.contract, TRAFFIC_FIELD)
    )
    return [] if check is None else [check]


def _silent_cohorts(
    store: Store,
    config: AnalyzerConfig,
    at: datetime,
    current: dict[Cohort, Activation],
    first_seen: dict[Cohort, datetime],
    aliases: dict[tuple[str, str, str, str], list[tuple[str, str, str, str]]],
    in_window: dict[Cohort, Profile],
    recent: dict[int, int],
) -> list[CohortReport]:
    """Cohorts with an active baseline of their own and no output in the window: judged on their
    traffic alone (``traffic_stopped``), their other alerts keeping their state."""
    out = []
    ids = {Cohort(r.model, r.prompt_version, r.contract, r.source): r.cohort_id for r in store.cohorts()}
    for cohort, activation in current.items():
        if cohort in in_window or activation.baseline_id is None or cohort not in ids:
            continue
        try:
            resolved = resolve_baseline(store, cohort, current=current, first_seen=first_seen, aliases=aliases)
            checks = [] if resolved is None else _traffic(config, resolved, cohort, recent.get(ids[cohort], 0))
        except Exception:
            log.exception("judging the traffic of cohort %s failed", cohort)
            continue
        if resolved is None or not checks:
            continue
        out.append(
            CohortReport(
                cohort,
                ids[cohort],
                0,
                {},
                resolved.baseline.baseline_id,
                resolved.how,
                resolved.baseline.cohort,
                checks,
                [],
                {},
                baseline_served=dict(resolved.baseline.served_models),
                silent=True,
            )
        )
    return out


def _judge_cohort(
    store: Store,
    config: AnalyzerConfig,
    profile: Profile,
    cohort: Cohort,
    mirror: Cohort | None,
    resolve: Callable[[Cohort], Resolved | None],
    main: ShortWindow,
    shorts: Sequence[tuple[ShortWindow, dict[int, Profile]]] = (),
    shared: _Shared | None = None,
    twin: Resolved | None = None,
) -> tuple[Resolved | None, list[Check], list[Insufficient], list[dict[str, Any]]]:
    """The baseline one cohort is compared against, the checks of the comparison over every
    window (short windows' thresholds scaled), the fields too thin for the analyzer's window,
    and what each window held. A shadow cohort's ``twin`` (its production twin's window as a
    baseline) takes the place of a frozen baseline."""
    resolved = twin or resolve(cohort)
    if mirror is not None:
        return resolved, [], [], []
    rules_for = _rules_for(config, cohort.contract, _declared_enums(store, profile))
    # Declared assertions hold with or without a baseline, over the analyzer's window.
    a_checks, a_short = check_assertions(
        config.assertions.get(cohort.contract, ()),
        profile,
        rules_for,
        resolved.baseline.fields if resolved is not None else None,
    )
    if resolved is None:
        windows = [{"window": main.label, "scale": 1.0, "events": profile.events, "insufficient": len(a_short)}]
        return resolved, [replace(c, window=main.label) for c in a_checks], a_short, windows
    b = resolved.baseline

    def judge(p: Profile) -> tuple[list[Check], list[Insufficient]]:
        checks, short = compare_profiles(b.fields, b.samples, p.fields, p.events, rules_for)
        v_checks, v_short = compare_violations(b.violations, b.checked, p.violations, p.checked, rules_for)
        n_checks, n_short = compare_numbers(b.fields, p.fields, rules_for)
        return checks + v_checks + n_checks, short + v_short + n_short

    checks, short = judge(profile)
    checks, short = checks + a_checks, short + a_short
    if shared is not None:
        whole = rules_for(RESPONSES)  # the rules of the output as a whole ('$')
        o_checks, o_short = compare_outcomes(
            b.outcomes if b.outcomes is not None else shared.baseline_outcomes(b.cohort, b.since, b.until),
            b.samples,
            shared.outcomes.get(profile.cohort_id, {}),
            profile.events,
            whole,
        )
        checks, short = checks + o_checks, short + o_short
        # Served models are compared with the cohort's own model's baseline (its own or its previous
        # prompt version's); a served cohort's change is its alias cohort's alert.
        if b.cohort.model == cohort.model:
            checks += compare_served_models(b.served_models, profile.served_models, whole)
        checks += unknown_contract_versions(
            profile.contract_checks, profile.events, shared.registered(cohort.contract), whole
        )
    checks = [replace(c, window=main.label) for c in checks]
    windows = [{"window": main.label, "scale": 1.0, "events": profile.events, "insufficient": len(short)}]
    for w, by_cohort in shorts:
        p = by_cohort.get(profile.cohort_id)
        if p is None:
            windows.append({"window": w.label, "scale": w.scale, "events": 0, "insufficient": None})
            continue
        w_checks, w_short = judge(p)
        checks += [scaled(as_presence_drop(c, rules_for(c.field)), w) for c in w_checks]
        windows.append({"window": w.label, "scale": w.scale, "events": p.events, "insufficient": len(w_short)})
    return resolved, checks, short, windows


class _Resolver:
    """``resolve_baseline`` with the evaluation's shared inputs, each cohort resolved once (a cohort
    whose resolving raises is tried again, so that its error reaches the cohort's report)."""

    def __init__(
        self,
        store: Store,
        current: dict[Cohort, Activation],
        first_seen: dict[Cohort, datetime],
        aliases: dict[tuple[str, str, str, str], list[tuple[str, str, str, str]]],
    ) -> None:
        self._store = store
        self._current = current
        self._first_seen = first_seen
        self._aliases = aliases
        self._known: dict[Cohort, Resolved | None] = {}

    def __call__(self, cohort: Cohort) -> Resolved | None:
        if cohort not in self._known:
            self._known[cohort] = resolve_baseline(
                self._store, cohort, current=self._current, first_seen=self._first_seen, aliases=self._aliases
            )
        return self._known[cohort]


def _value_keys(
    store: Store, config: AnalyzerConfig, profiles: Sequence[Profile], resolve: Callable[[Cohort], Resolved | None]
) -> set[tuple[int, str]]:
    """The (cohort id, path) keys of the window whose short-string values the rules read.

    A day of busy traffic holds hundreds of thousands of distinct values, nearly all of them of
    paths that are not enums (ids, names, sentences), and reading them was most of an evaluation.
    The rules read a window's values only where the baseline's field is enum-like under its rules
    (``_shape``: new values, unknown share, cardinality), and for ``max_unknown_share``
    assertions. A shadow cohort is judged against its production twin's window, whose values
    then act as a baseline's: both read every path's values. A cohort whose baseline cannot be
    resolved reads every path's (its error is reported when it is judged).
    """
    keys: set[tuple[int, str]] = set()
    in_window = {Cohort(*p.cohort): p for p in profiles}
    for profile in profiles:
        cohort = Cohort(*profile.cohort)
        every = {(profile.cohort_id, path) for path in profile.fields}
        for a in config.assertions.get(cohort.contract, ()):
            if a.kind == "max_unknown_share":
                keys.add((profile.cohort_id, a.path))
        twin = production_twin(cohort, in_window, config.shadows) if cohort.source == "shadow" else None
        if twin is not None:
            keys |= every | {(in_window[twin].cohort_id, path) for path in in_window[twin].fields}
            continue
        try:
            resolved = resolve(cohort)
            if resolved is None:
                continue
            rules_for = _rules_for(config, cohort.contract, _declared_enums(store, profile))
            for path, base in resolved.baseline.fields.items():
                rules = rules_for(path)
                if not rules.ignore and enum_like(base, rules):
                    keys.add((profile.cohort_id, path))
        except Exception:  # a broken baseline or rule: the cohort's judging raises it again
            keys |= every
    return keys


class _Shared:
    """What every cohort of an evaluation reads alike, read once: provider outcome counts of the
    window (every cohort at once) and of each baseline's window, and registered contract versions."""

    def __init__(self, store: Store, since: datetime, until: datetime) -> None:
        self.store = store
        self.outcomes = store.outcomes_by_cohort(since, until)
        self._windows: dict[tuple[datetime, datetime], dict[int, dict[str, int]]] = {}
        self._registered: dict[str, frozenset[str]] = {}

    def registered(self, contract: str) -> frozenset[str]:
        if contract not in self._registered:
            self._registered[contract] = frozenset(r.version for r in self.store.contract_versions(contract))
        return self._registered[contract]

    def baseline_outcomes(self, cohort: Cohort, since: datetime, until: datetime) -> dict[str, int]:
        cohort_id = self.store.cohort_id(*cohort)
        if cohort_id is None:
            return {}
        if (since, until) not in self._windows:
            self._windows[(since, until)] = self.store.outcomes_by_cohort(since, until)
        return self._windows[(since, until)].get(cohort_id, {})


def _twin(cohort: Cohort, in_window: dict[Cohort, Profile], config: AnalyzerConfig, at: datetime) -> Resolved | None:
    """A shadow cohort's production twin over the same window, as what it is judged against."""
    if cohort.source != "shadow":
        return None
    twin = production_twin(cohort, in_window, config.shadows)
    if twin is None:
        return None
    return Resolved(twin_baseline(in_window[twin], twin, at), "production_twin")


def _mirrored(
    profile: Profile, aliases: list[tuple[str, str, str, str]], in_window: dict[Cohort, Profile]
) -> Cohort | None:
    """The alias cohort whose outputs in the window are exactly this served cohort's, if any.

    Most of the time an alias is answered by one model: its served cohort then holds the same
    outputs and judging both would raise every alert twice. Only while an alias is answered by
    several models (a snapshot rolling out behind it) does its served cohort say something new.
    """
    for alias in aliases:
        a = in_window.get(Cohort(*alias))
        if a is not None and a.events == profile.events == a.served_models.get(profile.model):
            return Cohort(*alias)
    return None


def _rules_for(
    config: AnalyzerConfig, contract: str, declared: dict[str, tuple[str, ...]] | None = None
) -> Callable[[str], FieldRules]:
    """The rules of a contract's fields; a field whose registered contract declares its enum, and
    whose configuration does not, takes the declared values as its known set (the unknown bucket)."""

    def rules(path: str) -> FieldRules:
        r = config.rules_for(contract, path)
        if declared and r.allowed is None and path in declared:
            return replace(r, allowed=declared[path])
        return r

    return rules


def _declared_enums(store: Store, profile: Profile) -> dict[str, tuple[str, ...]]:
    """The string enums declared by the registered contract version live in the window."""
    version = profile.live_contract_version
    if version is None:
        return {}
    facts = store.contract_validators.facts(profile.contract, version)
    if facts is None:
        return {}
    return {
        path: tuple(v for v in values if isinstance(v, str))
        for path, values in facts.enums.items()
        if any(isinstance(v, str) for v in values)
    }


# --- sample events --------------------------------------------------------------------------

_SAMPLE_SCAN = 2000  # newest outputs of the window looked at for examples


def _shows(alert: Alert, output: dict[str, Any]) -> bool:
    obs = [o for o in flatten_output(output) if o.path == alert.field]
    filled = [o for o in obs if o.type.value != "null"]
    kind = alert.kind
    if kind in (AlertKind.presence_drop, AlertKind.field_missing):
        return not filled
    if kind in (AlertKind.presence_rise, AlertKind.new_field):
        return bool(filled)
    if kind is AlertKind.new_type:
        return any(o.type.value == alert.value for o in obs)
    if kind is AlertKind.type_shift:
        base = alert.diff.get("baseline", {}).get("types", {})
        cur = alert.diff.get("current", {}).get("types", {})
        grown = max(cur, key=lambda t: cur[t] - base.get(t, 0.0), default=None)
        return any(("number" if o.type.value == "integer" else o.type.value) == grown for o in obs)
    if kind is AlertKind.new_enum_value:
        return any(o.string == alert.value for o in obs)
    if kind in (AlertKind.unknown_enum_growth, AlertKind.cardinality_jump):
        known = set(alert.diff.get("baseline", {}).get("known", ()))
        return any(o.string is not None and o.string not in known for o in obs)
    if kind is AlertKind.array_size_shift:
        b, c = alert.diff.get("baseline", {}), alert.diff.get("current", {})
        grew = (c.get("p90") or 0) >= (b.get("p90") or 0)
        edge = c.get("p90") if grew else c.get("p50")
        return any(
            o.length is not None and edge is not None and (o.length >= edge if grew else o.length <= edge) for o in obs
        )
    return False


def _breaks(store: Store, alert: Alert, version: str, output: dict[str, Any]) -> bool:
    """Whether ``output`` breaks its contract version at the alert's path."""
    _, found = store.contract_validators.check(alert.cohort.contract, version, output)
    return any((path or "$") == alert.field for path, _ in found)


def sample_event_ids(
    store: Store, cohort_id: int, since: datetime, until: datetime, alert: Alert, limit: int = 3
) -> list[str]:
    """Event ids of stored outputs in the window that show the alert's change (newest first)."""
    found = []
    for event_id, output, version in store.recent_outputs(cohort_id, since, until, _SAMPLE_SCAN):
        if alert.kind is AlertKind.schema_violation:
            shown = version is not None and _breaks(store, alert, version, orjson.loads(output))
        else:
            shown = _shows(alert, orjson.loads(output))
        if shown:
            found.append(event_id)
            if len(found) >= limit:
                break
    return found


def _with_samples(store: Store, evaluation: Evaluation, changed: dict[str, Alert], limit: int) -> dict[str, Alert]:
    ids = {r.cohort: r.cohort_id for r in evaluation.cohorts}
    out = {}
    for fp, a in changed.items():
        if not a.samples and a.state is not AlertState.resolved and a.cohort in ids:
            a = replace(
                a, samples=tuple(sample_event_ids(store, ids[a.cohort], evaluation.since, evaluation.at, a, limit))
            )
        out[fp] = a
    return out


# --- offline --------------------------------------------------------------------------------


def analyze_once(
    store: Store, config: AnalyzerConfig, at: datetime, *, window: timedelta | None = None
) -> tuple[Evaluation, list[Alert]]:
    """What the service would show at ``at``: the evaluations leading up to it, states in memory.

    Returns the last evaluation and the alerts it leaves pending or firing.
    """
    steps = max(config.confirm_evaluations, 1)
    alerts: dict[str, Alert] = {}
    evaluation = None
    for i in range(steps - 1, -1, -1):
        when = at - config.interval * i
        evaluation = evaluate(store, config, when, window=window)
        changed, _ = step(alerts, [j for r in evaluation.cohorts if (j := r.judged())], config, when)
        alerts.update(changed)
    assert evaluation is not None
    open_alerts = {fp: a for fp, a in alerts.items() if a.state is not AlertState.resolved}
    open_alerts = _with_samples(store, evaluation, open_alerts, config.samples_per_alert)
    open_alerts = with_context(store, config, {r.cohort: r.cohort_id for r in evaluation.cohorts}, open_alerts, at)
    return evaluation, _ordered(open_alerts.values())


def _ordered(alerts: Any) -> list[Alert]:
    return sorted(
        alerts,
        key=lambda a: (
            a.severity.value != "page",
            a.state.value != "firing",
            a.cohort,
            a.field,
            a.kind.value,
            a.value or "",
        ),
    )


# --- the scheduled run ----------------------------------------------------------------------


@dataclass(frozen=True)
class RunResult:
    ok: bool
    at: datetime
    duration_seconds: float
    evaluation: Evaluation | None
    transitions: list[Transition]
    error: str | None = None  # why it failed; for a run that did its job, the cohorts it could not judge


Enqueue = Callable[[Any, Sequence[Transition], datetime], None]


class Analyzer:
    """The scheduled evaluation: states in the store, metrics, and notices for the pager.

    >>> analyzer = Analyzer(store, config, registry=registry)     # doctest: +SKIP
    >>> analyzer.run()                                             # doctest: +SKIP
    """

    def __init__(
        self,
        store: Store,
        config: AnalyzerConfig,
        *,
        registry: CollectorRegistry,
        enqueue: Enqueue | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        max_presence_series: int = 200,
    ) -> None:
        self.store = store
        self.config = config
        self.book = AlertBook(store)
        self.enqueue = enqueue
        self.clock = clock
        self.last: Evaluation | None = None
        self.max_presence_series = max_presence_series
        self._one_at_a_time = threading.Lock()
        self.duration = Histogram(
            "shapewatch_analyzer_run_seconds",
            "Time of one analyzer evaluation",
            registry=registry,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120),
        )
        self.runs = Counter(
            "shapewatch_analyzer_runs_total", "Analyzer evaluations by result", ["result"], registry=registry
        )
        for result in ("ok", "failed"):
            self.runs.labels(result)
        self.cohort_failures = Counter(
            "shapewatch_analyzer_cohort_failures_total",
            "Cohorts an evaluation could not judge (an unreadable baseline, a rule raising); the run's "
            "recorded error names them",
            registry=registry,
        )
        self.last_success = Gauge(
            "shapewatch_analyzer_last_success_timestamp_seconds",
            "Unix time of the last successful evaluation (0: none yet)",
            registry=registry,
        )
        registry.register(_AlertGauges(self))

    def run(self, at: datetime | None = None) -> RunResult:
        """One evaluation, recorded; never raises (a failure is logged, recorded and counted).

        One at a time, whoever asks: the scheduler's ``max_instances=1`` keeps scheduled runs
        apart, but ``POST /v1/analyzer/run`` calls this from a request thread, and two
        evaluations at once would both step the same open alerts (a page confirmed twice, an
        episode counted twice). A requested run waits for a scheduled one, and the other way round.
        """
        with self._one_at_a_time:
            return self._run(at)

    def _run(self, at: datetime | None) -> RunResult:
        started = self.clock()
        at = at or started
        t0 = time.perf_counter()
        try:
            evaluation = evaluate(self.store, self.config, at)
            self.cohort_failures.inc(len(evaluation.failed))
            if evaluation.judged_nothing:
                # Some cohorts judged is a run that did its job (the others are named in its
                # error); none judged is a failed run, whatever the cause.
                return self._failed(started, at, time.perf_counter() - t0, evaluation.error or "", evaluation)
            judged = [j for r in evaluation.cohorts if (j := r.judged())]
            changed, moves = step(self.book.open_alerts(), judged, self.config, at)
            changed = _with_samples(self.store, evaluation, changed, self.config.samples_per_alert)
            changed = with_context(
                self.store, self.config, {r.cohort: r.cohort_id for r in evaluation.cohorts}, changed, at
            )
            moves = [replace(m, alert=changed.get(m.alert.fingerprint, m.alert)) for m in moves]
            served_moves = self.store.served_model_moves(evaluation.since, evaluation.at)
            duration = time.perf_counter() - t0
            with self.store.transaction("recording an evaluation") as con:
                self.book.save(con, changed, moves, at)
                self._served_model_changes(con, served_moves, evaluation.at)
                if self.enqueue is not None:
                    self.enqueue(con, moves, at)
                self._record(con, started, at, True, evaluation.error, duration, evaluation)
        except Exception as exc:  # a scheduled job never raises into the scheduler
            log.exception("analyzer run at %s failed", at.isoformat())
            return self._failed(started, at, time.perf_counter() - t0, f"{type(exc).__name__}: {exc}", None)
        self.duration.observe(duration)
        self.runs.labels("ok").inc()
        self.last_success.set(time.time())
        self.last = evaluation
        return RunResult(True, at, duration, evaluation, moves, evaluation.error)

    def _failed(
        self, started: datetime, at: datetime, duration: float, error: str, evaluation: Evaluation | None
    ) -> RunResult:
        if evaluation is not None:
            log.error("analyzer run at %s failed: %s", at.isoformat(), error)
        self.runs.labels("failed").inc()
        try:
            with self.store.transaction("recording a failed evaluation") as con:
                self._record(con, started, at, False, error, duration, evaluation)
        except Exception:
            log.exception("could not record the failed analyzer run")
        return RunResult(False, at, duration, evaluation, [], error)

    def _record(
        self,
        con: Any,
        started: datetime,
        at: datetime,
        ok: bool,
        error: str | None,
        duration: float,
        evaluation: Evaluation | None,
    ) -> None:
        report = (
            None
            if evaluation is None
            else orjson.dumps({"cohorts": [c.to_json() for c in evaluation.cohorts]}).decode()
        )
        self.store.add_analyzer_run(
            con,
            [
                started,
                self.clock(),
                at,
                ok,
                error,
                duration,
                len(evaluation.cohorts) if evaluation else 0,
                evaluation.checks if evaluation else 0,
                evaluation.breaches if evaluation else 0,
                report,
            ],
        )

    def _served_model_changes(self, con: Any, moves: list[tuple[str, str, str, str, str]], at: datetime) -> None:
        # A served model first seen in this window under a cohort that was answered by
        # another one before: the alias moved (Store.served_model_moves). Recorded once per
        # (previous, current).
        self.store.add_served_model_changes(con, moves, at)


class _AlertGauges(Collector):
    """Alerts by state and severity, per-field presence, and each judged cohort's last event,
    read at scrape time (bounded labels)."""

    def __init__(self, analyzer: Analyzer) -> None:
        self.analyzer = analyzer

    def _last_events(self) -> GaugeMetricFamily:
        # Cohorts with an active baseline of their own (the ones traffic_stopped judges), at most
        # max_presence_series: a Prometheus rule can see a cohort go silent even with the
        # analyzer's traffic check off.
        family = GaugeMetricFamily(
            "shapewatch_cohort_last_event_timestamp_seconds",
            "Unix time of the newest rollup bucket holding an output, per cohort with an active baseline",
            labels=["model", "prompt_version", "contract"],
        )
        try:
            store = self.analyzer.store
            active = {a.cohort: a.baseline_id for a in activation_history(store)}
            last = store.last_events()
            rows = [r for r in store.cohorts() if active.get(Cohort(r.model, r.prompt_version, r.contract, r.source))]
        except Exception:  # a scrape must not fail because the store is busy or closed
            log.warning("last-event gauges unavailable", exc_info=True)
            return family
        for r in rows[: self.analyzer.max_presence_series]:
            if r.cohort_id in last:
                family.add_metric([r.model, r.prompt_version, r.contract], last[r.cohort_id].timestamp())
        return family

    def collect(self) -> Iterator[GaugeMetricFamily]:
        firing = GaugeMetricFamily("shapewatch_alerts", "Alerts by state and severity", labels=["state", "severity"])
        counts = {(s, v): 0 for s in ("pending", "firing") for v in ("page", "warn")}
        try:
            counts.update(self.analyzer.store.unresolved_alert_counts())
        except Exception:  # a scrape must not fail because the store is busy or closed
            log.warning("alert gauges unavailable", exc_info=True)
        for (state, severity), n in sorted(counts.items()):
            firing.add_metric([state, severity], n)
        yield firing
        presence = GaugeMetricFamily(
            "shapewatch_field_presence_ratio",
            "Presence rate of each top-level field of cohorts with a baseline, last evaluation "
            "(at most max_presence_series series)",
            labels=["model", "prompt_version", "contract", "field"],
        )
        yield self._last_events()
        last = self.analyzer.last
        n = 0
        for report in last.cohorts if last else []:
            # production's series only: the labels name no source (probe and shadow cohorts have
            # their own alerts; their presence is read from the API)
            if report.baseline_id is None or report.cohort.source != "production":
                continue
            for path, rate in sorted(report.presence.items()):
                if n >= self.analyzer.max_presence_series:
                    break
                presence.add_metric([*report.cohort[:3], path], rate)
                n += 1
        yield presence
