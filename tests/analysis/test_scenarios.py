"""Scenarios: synthetic cohorts in a real DuckDB file, a frozen baseline, a window, the analyzer's verdict.

One baseline of 10,000 realistic outputs (``synth.py``) is written and frozen
once per module; each test copies that file and writes its own window through
the ingest path, then runs ``analyze_once`` (two evaluations five minutes apart,
as a page alert needs) or ``evaluate``. Expected numbers are computed from the
raw outputs with the reference flattener, not read back from the rollups.
"""

from __future__ import annotations

import shutil
import tomllib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats
from synth import (
    CONTRACT,
    MODEL,
    NO_DRIFT,
    PROMPT,
    Drift,
    PathStats,
    merge_fields,
    path_stats,
    synth_outputs,
    write_outputs,
)

from shapewatch.analysis.admin import freeze
from shapewatch.analysis.alerts import ALERTS_SCHEMA, Alert, step
from shapewatch.analysis.analyzer import analyze_once, evaluate
from shapewatch.analysis.config import AlertKind, AnalyzerConfig, ConfigInvalid, parse_config
from shapewatch.analysis.rules import Insufficient, adjust_p_values, compare_profiles
from shapewatch.baselines import BASELINES_SCHEMA, Cohort, freeze_baseline, get_baseline, inherit_baseline
from shapewatch.collector import Store, read_profiles

T0 = datetime(2026, 11, 1, tzinfo=UTC)  # day 0: the baseline; day k: a window
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
# Outputs of a window are spread over 20 one-minute buckets: the 10,000 of the baseline overflow the
# 200 short strings kept per bucket and path on free-text fields, as busy traffic does.
SPAN = timedelta(minutes=20)
N_BASE = 10_000
N_WIN = 3_000
COHORT = Cohort(MODEL, PROMPT, CONTRACT)
SCHEMAS = [BASELINES_SCHEMA, ALERTS_SCHEMA]


def day(k: int) -> datetime:
    return T0 + k * DAY


def at(k: int) -> datetime:
    """The evaluation time whose 24-hour window is day k (and 5 minutes earlier, still all of it)."""
    return day(k + 1)


@dataclass
class Template:
    path: Path
    baseline_id: str
    outputs: list[dict[str, Any]]

    def stats(self, path: str) -> PathStats:
        return path_stats(self.outputs, path)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Template:
    path = tmp_path_factory.mktemp("template") / "baseline.duckdb"
    outputs = synth_outputs(0, N_BASE)
    with Store.open(path, schemas=SCHEMAS) as store:
        write_outputs(store, outputs, day(0) + 6 * HOUR, SPAN)
        b = freeze_baseline(store, COHORT, day(0), day(1), author="ana", note="reference week", now=day(1) + HOUR)
    return Template(path, b.baseline_id, outputs)


@pytest.fixture
def store(template: Template, tmp_path: Path) -> Iterator[Store]:
    path = tmp_path / "scenario.duckdb"
    shutil.copyfile(template.path, path)
    s = Store.open(path, schemas=SCHEMAS)
    yield s
    s.close()


def write_window(
    store: Store,
    drift: Drift = NO_DRIFT,
    *,
    seed: int = 1,
    n: int = N_WIN,
    k: int = 7,
    prompt_version: str = PROMPT,
    model: str = MODEL,
) -> list[dict[str, Any]]:
    outputs = synth_outputs(seed, n, drift)
    write_outputs(store, outputs, day(k) + 6 * HOUR, SPAN, prompt_version=prompt_version, model=model)
    return outputs


def brief(a: Alert) -> tuple[str, str, str | None, str, str]:
    return (a.field, a.kind.value, a.value, a.severity.value, a.state.value)


def whole(a: Alert) -> dict[str, Any]:
    j = a.to_json()
    return {k: j[k] for k in ("cohort", "field", "kind", "value", "severity", "state", "baseline", "current")}


def expect(
    field: str,
    kind: str,
    value: str | None,
    severity: str,
    state: str,
    baseline: dict[str, Any],
    current: dict[str, Any],
    cohort: Cohort = COHORT,
) -> dict[str, Any]:
    return {
        "cohort": cohort._asdict(),
        "field": field,
        "kind": kind,
        "value": value,
        "severity": severity,
        "state": state,
        "baseline": baseline,
        "current": current,
    }


def only(alerts: list[Alert], field: str, kind: str, value: str | None = None) -> Alert:
    found = [a for a in alerts if (a.field, a.kind.value, a.value) == (field, kind, value)]
    assert len(found) == 1, [brief(a) for a in alerts]
    return found[0]


def presence(s: PathStats | None, n: int) -> dict[str, Any]:
    return {"presence_rate": s.presence_rate if s else 0.0, "samples": n}


def share(part: int, whole_: int) -> float:
    return round(part / whole_, 6)


# --- 1. every rule fires with its severity ----------------------------------------------------


def test_presence_drop_pages(store: Store, template: Template) -> None:
    cur = path_stats(write_window(store, Drift(email_presence=0.40)), "customer.email")
    base = template.stats("customer.email")
    _, alerts = analyze_once(store, AnalyzerConfig(), at(7))
    assert [whole(a) for a in alerts] == [
        expect("customer.email", "presence_drop", None, "page", "firing", presence(base, N_BASE), presence(cur, N_WIN))
    ]
    assert base.presence_rate - cur.presence_rate > 0.25
    a = alerts[0]
    assert a.episode == 1 and a.fired_at == at(7) and a.first_seen == at(7) - timedelta(minutes=5)
    assert a.detail.startswith(f"presence {100 * base.presence_rate:.1f}% -> ")
    assert a.detail.endswith("(p < 1e-6)")
    assert a.diff["compared_with"] == f"baseline {template.baseline_id}"
    assert len(a.samples) == 3  # event ids of outputs without an email


def test_field_missing_pages(store: Store) -> None:
    write_window(store, Drift(language_presence=0.0))
    _, alerts = analyze_once(store, AnalyzerConfig(), at(7))
    assert [whole(a) for a in alerts] == [
        expect(
            "language",
            "field_missing",
            None,
            "page",
            "firing",
            {"presence_rate": 1.0, "samples": N_BASE},
            {"presence_rate": 0.0, "samples": N_WIN},
        )
    ]


def test_presence_rise_warns(store: Store, template: Template) -> None:
    cur = path_stats(write_window(store, Drift(email_presence=0.95)), "customer.email")
    _evaluation, alerts = analyze_once(store, AnalyzerConfig(), at(7))
    assert [whole(a) for a in alerts] == [
        expect(
            "customer.email",
            "presence_rise",
            None,
            "warn",
            "firing",
            presence(template.stats("customer.email"), N_BASE),
            presence(cur, N_WIN),
        )
    ]
    assert alerts[0].first_seen == alerts[0].fired_at == at(7) - timedelta(minutes=5)  # a warn fires at once


def test_new_type_pages_when_confidence_arrives_as_a_string(store: Store) -> None:
    cur = path_stats(write_window(store, Drift(confidence_string_share=1 / 3)), "confidence")
    _, alerts = analyze_once(store, AnalyzerConfig(), at(7))
    assert cur.raw_shares()["string"] == pytest.approx(1 / 3, abs=0.03)
    assert [whole(a) for a in alerts] == [
        expect(
            "confidence",
            "new_type",
            "string",
            "page",
            "firing",
            {"types": {"number": 1.0}, "samples": N_BASE},
            {"types": cur.raw_shares(), "samples": N_WIN},
        )
    ]
    assert alerts[0].detail.startswith(f"new type string: {100 * cur.raw_shares()['string']:.1f}% of values")


def test_type_shift_warns_when_mixed_shares_move(store: Store, template: Template) -> None:
    cur = path_stats(write_window(store, Drift(eta_string_share=0.45)), "eta_days")
    base = template.stats("eta_days")
    _, alerts = analyze_once(store, AnalyzerConfig(), at(7))
    assert [whole(a) for a in alerts] == [
        expect(
            "eta_days",
            "type_shift",
            None,
            "warn",
            "firing",
            {"types": base.shares(), "samples": N_BASE},
            {"types": cur.shares(), "samples": N_WIN},
        )
    ]
    assert cur.shares()["string"] - base.shares()["string"] > 0.15


def test_new_enum_value_warns_when_priority_gains_urgent(store: Store, template: Template) -> None:
    cur = path_stats(write_window(store, Drift(extra_values={"priority": {"URGENT": 0.10}})), "priority")
    base = template.stats("priority")
    _, alerts = analyze_once(store, AnalyzerConfig(), at(7))
    # The new value and the unknown bucket's growth are one fact about one field: one alert.
    assert sorted(brief(a) for a in alerts) == [("priority", "unknown_enum_growth", None, "warn", "firing")]
    urgent = cur.values["URGENT"]
    assert whole(only(alerts, "priority", "unknown_enum_growth")) == expect(
        "priority",
        "unknown_enum_growth",
        None,
        "warn",
        "firing",
        {"unknown_share": 0.0, "samples": N_BASE, "known": ["high", "low", "medium"]},
        {"unknown_share": share(urgent, N_WIN), "samples": N_WIN, "new_values": {"URGENT": urgent}},
    )
    assert only(alerts, "priority", "unknown_enum_growth").detail.endswith("; new values: URGENT (p < 1e-6)")
    assert base.values.get("URGENT") is None


@pytest.mark.parametrize(("new_share", "severity"), [(0.08, "warn"), (0.30, "page")])
def test_unknown_enum_growth_warns_and_pages_above_unknown_page(store: Store, new_share: float, severity: str) -> None:
    # Unknown intents spread over three new values.
    extra = {f"intent_{i}": new_share / 3 for i in range(3)}
    cur = path_stats(write_window(store, Drift(extra_values={"intent": extra})), "intent")
    _, alerts = analyze_once(store, AnalyzerConfig(), at(7))
    unknown = sum(cur.values[v] for v in extra)
    assert sorted(brief(a) for a in alerts) == [("intent", "unknown_enum_growth", None, severity, "firing")]
    assert whole(only(alerts, "intent", "unknown_enum_growth")) == expect(
        "intent",
        "unknown_enum_growth",
        None,
        severity,
        "firing",
        {"unknown_share": 0.0, "samples": N_BASE, "known": ["billing", "cancel", "other", "refund", "shipping"]},
        {"unknown_share": share(unknown, N_WIN), "samples": N_WIN, "new_values": {v: cur.values[v] for v in extra}},
    )


def test_cardinality_jump_warns(store: Store) -> None:
    moods = {f"mood_{i}": 0.012 for i in range(6)}
    cur = path_stats(write_window(store, Drift(extra_values={"sentiment": moods})), "sentiment")
    _, alerts = analyze_once(store, AnalyzerConfig(), at(7))
    assert whole(only(alerts, "sentiment", "cardinality_jump")) == expect(
        "sentiment",
        "cardinality_jump",
        None,
        "warn",
        "firing",
        {"distinct": 3, "samples": N_BASE},
        {"distinct": 9, "samples": N_WIN},
    )
    assert only(alerts, "sentiment", "cardinality_jump").diff["effect"] == 3.0
    unknown = sum(cur.values[v] for v in moods)
    assert sorted(brief(a) for a in alerts) == sorted(
        [
            ("sentiment", "cardinality_jump", None, "warn", "firing"),
            ("sentiment", "unknown_enum_growth", None, "warn", "firing"),
        ]
    )  # the new values are folded into the unknown growth
    assert only(alerts, "sentiment", "unknown_enum_growth").diff["current"]["unknown_share"] == share(unknown, N_WIN)


def test_array_size_shift_warns(store: Store, template: Template) -> None:
    cur = path_stats(write_window(store, Drift(entities_extra=2)), "entities")
    base = template.stats("entities")

    def sizes(s: PathStats, n: int) -> dict[str, Any]:
        return {
            "p50": s.percentile(0.5),
            "p90": s.percentile(0.9),
            "p99": s.percentile(0.99),
            "empty_share": share(s.lengths[0], n),
            "samples": n,
        }

    _, alerts = analyze_once(store, AnalyzerConfig(), at(7))
    assert [whole(a) for a in alerts] == [
        expect("entities", "array_size_shift", None, "warn", "firing", sizes(base, N_BASE), sizes(cur, N_WIN))
    ]
    assert (sizes(base, N_BASE)["p50"], sizes(cur, N_WIN)["p50"]) == (2, 4)
    assert alerts[0].diff["effect"] == 4.0  # p50 moved by 2 items on 2: 100%, four times the 25% tolerance


def test_new_field_warns_once_for_a_new_key(store: Store) -> None:
    cur = path_stats(write_window(store, Drift(new_key_share=0.2)), "escalation_reason")
    _, alerts = analyze_once(store, AnalyzerConfig(), at(7))
    assert [whole(a) for a in alerts] == [
        expect(
            "escalation_reason",
            "new_field",
            None,
            "warn",
            "firing",
            {"presence_rate": 0.0, "samples": N_BASE},
            {"presence_rate": cur.presence_rate, "samples": N_WIN, "types": {"string": 1.0}},
        )
    ]


# --- 2. no false alarms -----------------------------------------------------------------------


def _no_alerts_for_seeds(store: Store, seeds: list[int]) -> None:
    for k, seed in enumerate(seeds, start=1):
        write_window(store, seed=seed, n=10_000, k=k)
    for k, seed in enumerate(seeds, start=1):
        evaluation, alerts = analyze_once(store, AnalyzerConfig(), at(k))
        (report,) = evaluation.cohorts
        assert (report.events, report.insufficient) == (10_000, []), seed
        assert len(report.checks) >= 35, seed  # every rule that applies ran
        breaches = [(c.field, c.kind.value, c.value, c.effect, c.q_value) for c in report.checks if c.breach]
        assert (seed, breaches, [brief(a) for a in alerts]) == (seed, [], [])
        # Right after the window's 20 minutes every short window holds it too (15m: 7,500 outputs).
        evaluation, alerts = analyze_once(store, AnalyzerConfig(), day(k) + 6 * HOUR + SPAN)
        (report,) = evaluation.cohorts
        assert [(w["window"], w["events"]) for w in report.windows] == [
            ("24h", 10_000),
            ("15m", 7_500),
            ("1h", 10_000),
            ("6h", 10_000),
        ], seed
        breaches = [(c.field, c.kind.value, c.window, c.effect, c.q_value) for c in report.checks if c.breach]
        assert (seed, breaches, [brief(a) for a in alerts]) == (seed, [], [])


@pytest.mark.slow
def test_a_window_of_the_baseline_distribution_fires_nothing(store: Store) -> None:
    _no_alerts_for_seeds(store, [101, 102, 103])


@pytest.mark.slow
def test_a_window_of_the_baseline_distribution_fires_nothing_for_20_seeds(store: Store) -> None:
    _no_alerts_for_seeds(store, list(range(101, 121)))


# --- 3. under the sample minimum --------------------------------------------------------------


def test_a_cohort_under_the_minimum_fires_nothing_and_says_why(tmp_path: Path) -> None:
    cohort = Cohort(MODEL, "tiny-v1", CONTRACT)
    with Store.open(tmp_path / "tiny.duckdb", schemas=SCHEMAS) as store:
        base = [{"priority": ["low", "high"][i % 2], "tags": ["a", "b"]} for i in range(300)]
        write_outputs(store, base, day(0) + 6 * HOUR, HOUR, prompt_version="tiny-v1")
        freeze_baseline(store, cohort, day(0), day(1), author="ana", note="small but enough")
        # Every priority is a new value: it would alert if it were judged.
        window = [{"priority": "URGENT", "tags": ["a", "b"]} for _ in range(150)]
        write_outputs(store, window, day(7) + 6 * HOUR, HOUR, prompt_version="tiny-v1")
        evaluation, alerts = analyze_once(store, AnalyzerConfig(), at(7))
    (report,) = evaluation.cohorts
    assert alerts == []
    assert report.insufficient == [Insufficient("priority", 300, 150, 200), Insufficient("tags", 300, 150, 200)]
    assert report.to_json()["insufficient"] == [
        {"field": "priority", "baseline_samples": 300, "current_samples": 150, "needed": 200},
        {"field": "tags", "baseline_samples": 300, "current_samples": 150, "needed": 200},
    ]
    # The items of tags (2 per output: 300 units) are enough to be judged, and are unchanged.
    assert {c.field for c in report.checks} == {"tags[]"}
    assert [c for c in report.checks if c.breach] == []


# --- 4. a 10% rollout is seen in its own cohort -----------------------------------------------


def test_a_change_on_10_percent_of_traffic_is_caught_in_its_cohort(store: Store, template: Template) -> None:
    v4 = Cohort(MODEL, "intake-v4", CONTRACT)
    # Day 0 again: intake-v4 served 10% of traffic (1,000 besides intake-v3's 10,000); both frozen.
    write_outputs(store, synth_outputs(40, 1_000), day(0) + 8 * HOUR, SPAN, prompt_version="intake-v4")
    b4 = freeze_baseline(store, v4, day(0), day(1), author="ana", note="v4 canary", now=day(1) + HOUR)
    # The window: intake-v4 (10%) fills customer.email far less often; intake-v3 (90%) does not change.
    write_window(store, seed=41, n=3_600)
    write_window(store, Drift(email_presence=0.20), seed=42, n=400, prompt_version="intake-v4")
    evaluation, alerts = analyze_once(store, AnalyzerConfig(), at(7))

    # The aggregate over both cohorts (what a per-endpoint monitor sees) moves less than the tolerance.
    b3 = get_baseline(store, template.baseline_id)
    agg_base = merge_fields(b3.fields, b4.fields)
    profiles = read_profiles(store, at(7) - DAY, at(7))
    agg_cur = merge_fields(*(p.fields for p in profiles))
    drop = agg_base["customer.email"].presence_rate - agg_cur["customer.email"].presence_rate
    assert 0.03 < drop < 0.10
    checks, _ = compare_profiles(
        agg_base, b3.samples + b4.samples, agg_cur, sum(p.events for p in profiles), lambda _: AnalyzerConfig().defaults
    )
    (email,) = [c for c in adjust_p_values(checks) if c.field == "customer.email"]
    assert (email.kind, email.breach, round(email.effect, 6)) == (AlertKind.presence_drop, False, round(drop, 6))

    # Per cohort, the rollout's change pages; intake-v3 stays quiet.
    assert [brief(a) for a in alerts] == [("customer.email", "presence_drop", None, "page", "firing")]
    assert alerts[0].cohort == v4
    assert alerts[0].diff["compared_with"] == f"baseline {b4.baseline_id}"
    v4_base = b4.fields["customer.email"].presence_rate
    assert v4_base - alerts[0].diff["current"]["presence_rate"] > 0.4
    assert {r.cohort: len([c for c in r.checks if c.breach]) for r in evaluation.cohorts} == {COHORT: 0, v4: 1}


def test_significance_is_adjusted_over_every_check_of_the_evaluation(store: Store) -> None:
    write_window(store, Drift(email_presence=0.62), seed=51, n=2_700)
    write_window(store, Drift(email_presence=0.55), seed=52, n=300, prompt_version="intake-v4")
    evaluation = evaluate(store, AnalyzerConfig(), at(7))
    checks = [c for r in evaluation.cohorts for c in r.checks]
    assert len(evaluation.cohorts) == 2 and len(checks) > 60
    # Benjamini-Hochberg over both cohorts' checks at once, not per cohort nor per field.
    expected = stats.false_discovery_control(np.array([c.p_value for c in checks]), method="bh")
    assert [c.q_value for c in checks] == pytest.approx(list(expected), rel=1e-9)
    assert evaluation.breaches == sum(1 for c in checks if c.effect >= c.threshold and c.q_value < c.alpha)


# --- 5. integers are numbers, fractions are not integers --------------------------------------


def test_whole_numbers_on_a_number_field_are_no_new_type(store: Store) -> None:
    cur = path_stats(write_window(store, Drift(confidence_whole_share=0.3)), "confidence")
    evaluation, alerts = analyze_once(store, AnalyzerConfig(), at(7))
    assert set(cur.raw_shares()) == {"integer", "number"}  # whole numbers did arrive
    # No type alert; the values moved (30% are now 0 or 1, p10 0.55 -> 0): value_shift warns.
    assert [(a.field, a.kind.value, a.severity.value) for a in alerts] == [("confidence", "value_shift", "warn")]
    confidence = [c.kind for c in evaluation.cohorts[0].checks if c.field == "confidence"]
    assert confidence == [AlertKind.presence_drop, AlertKind.value_shift]  # numbers only: no type rule applies


def test_fractions_on_a_field_of_whole_numbers_are_a_new_type(store: Store) -> None:
    cur = path_stats(write_window(store, Drift(quantity_fraction_share=0.3)), "quantity")
    _, alerts = analyze_once(store, AnalyzerConfig(), at(7))
    assert [whole(a) for a in alerts] == [
        expect(
            "quantity",
            "new_type",
            "number",
            "page",
            "firing",
            {"types": {"integer": 1.0}, "samples": N_BASE},
            {"types": cur.raw_shares(), "samples": N_WIN},
        )
    ]


# --- 6. free text is not an enum --------------------------------------------------------------


def _kept_summaries(outputs: list[dict[str, Any]]) -> tuple[set[str], int]:
    """The summaries the rollups keep (the 200 most frequent of each minute, ties by value), and the rest."""
    per_bucket = len(outputs) // 20  # SPAN is 20 one-minute buckets
    kept: set[str] = set()
    for b in range(20):
        counts = Counter(o["summary"] for o in outputs[b * per_bucket : (b + 1) * per_bucket])
        kept.update(v for v, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:200])
    return kept, len(outputs) - sum(1 for o in outputs if o["summary"] in kept)


def test_free_text_never_raises_enum_alerts_unless_declared_an_enum(store: Store, template: Template) -> None:
    n = 1_000  # every new value is a check of its own when the field is declared an enum: keep it small
    cur = path_stats(write_window(store, n=n), "summary")
    kept, overflow = _kept_summaries(template.outputs)
    new = sum(count for v, count in cur.values.items() if v not in kept)
    assert cur.units == n and len(cur.values) > 0.99 * n  # free text: (almost) every value unique
    assert set(cur.values).isdisjoint(template.stats("summary").values)  # and never seen in the baseline

    evaluation, alerts = analyze_once(store, AnalyzerConfig(), at(7))
    assert alerts == []
    assert [c.kind for c in evaluation.cohorts[0].checks if c.field == "summary"] == [AlertKind.presence_drop]

    # The baseline kept no value of this free text (collector/privacy.py): declared an enum, the
    # field's values are kept by a freeze that knows it (analysis.admin.freeze passes the rules).
    assert get_baseline(store, template.baseline_id).fields["summary"].values == {}
    config = parse_config(tomllib.loads('[contracts.intake.fields.summary]\nmode = "enum"\n'))
    freeze(
        store,
        config,
        **COHORT._asdict(),
        since=day(0),
        until=day(1),
        author="ana",
        note="summary declared an enum",
        now=day(1) + HOUR,
    )
    # Declared an enum: the values the baseline could not keep (overflow) and every new one are unknown.
    _, alerts = analyze_once(store, config, at(7))
    assert overflow == 6_000
    assert [whole(a) for a in alerts] == [
        expect(
            "summary",
            "unknown_enum_growth",
            None,
            "page",
            "firing",
            {"unknown_share": share(overflow, N_BASE), "samples": N_BASE, "known": sorted(kept)[:50]},
            {"unknown_share": share(new, n), "samples": n},
        )
    ]


# --- 7. configuration -------------------------------------------------------------------------


def _kinds(alerts: list[Alert]) -> list[tuple[str, str, str | None, str, str]]:
    return sorted(brief(a) for a in alerts)


def breaches(store: Store, config: AnalyzerConfig) -> list[tuple[str, str, str | None, str]]:
    """The breaches of one evaluation at the end of day 7 (what would open alerts)."""
    evaluation = evaluate(store, config, at(7))
    return sorted(
        (c.field, c.kind.value, c.value, c.effective_severity.value)
        for r in evaluation.cohorts
        for c in r.checks
        if c.breach
    )


def test_tolerance_overrides_per_contract_and_field(store: Store) -> None:
    write_window(store, Drift(email_presence=0.55))  # about 15 points down
    drop = [("customer.email", "presence_drop", None, "page")]

    def run(toml: str) -> list[tuple[str, str, str | None, str]]:
        return breaches(store, parse_config(tomllib.loads(toml)))

    assert run("") == drop
    assert run('[contracts.intake.fields."customer.email"]\ntolerance = 0.2\n') == []
    assert run("[contracts.intake]\ntolerance = 0.2\n") == []
    assert run("[defaults]\ntolerance = 0.2\n") == []
    assert run("[contracts.other]\ntolerance = 0.2\n") == drop  # another contract's rules do not apply
    assert (
        run('[contracts.intake]\ntolerance = 0.2\n[contracts.intake.fields."customer.email"]\ntolerance = 0.1\n')
        == drop
    )  # the field's rule beats its contract's
    assert run("[contracts.intake.fields.customer]\ntolerance = 0.2\n") == drop  # per path, not per parent
    # The analyze command's view: the same alert, firing after the confirming evaluation.
    assert _kinds(analyze_once(store, AnalyzerConfig(), at(7))[1]) == [
        ("customer.email", "presence_drop", None, "page", "firing")
    ]


def test_ignore_suppresses_a_field(store: Store) -> None:
    write_window(store, Drift(email_presence=0.40, confidence_string_share=0.3))
    config = parse_config(tomllib.loads('[contracts.intake.fields."customer.email"]\nignore = true\n'))
    evaluation, alerts = analyze_once(store, config, at(7))
    assert _kinds(alerts) == [("confidence", "new_type", "string", "page", "firing")]
    assert [c for c in evaluation.cohorts[0].checks if c.field == "customer.email"] == []


def test_allowed_declares_the_known_set(store: Store, template: Template) -> None:
    base = template.stats("priority")
    cur = path_stats(
        write_window(store, Drift(weights={"priority": {"low": 0.35, "medium": 0.30, "high": 0.35}})), "priority"
    )
    # Against the baseline's own values, nothing is unknown: no alert.
    assert breaches(store, AnalyzerConfig()) == []
    # Declared low and medium only: "high" counts as unknown, and it grew by about 15 points.
    config = parse_config(tomllib.loads('[contracts.intake.fields.priority]\nallowed = ["low", "medium"]\n'))
    _, alerts = analyze_once(store, config, at(7))
    assert [whole(a) for a in alerts] == [
        expect(
            "priority",
            "unknown_enum_growth",
            None,
            "warn",
            "firing",
            {"unknown_share": share(base.values["high"], N_BASE), "samples": N_BASE, "known": ["low", "medium"]},
            {"unknown_share": share(cur.values["high"], N_WIN), "samples": N_WIN},
        )
    ]


def test_an_allowed_value_is_no_new_enum_value(store: Store) -> None:
    write_window(store, Drift(extra_values={"priority": {"URGENT": 0.10}}))
    config = parse_config(
        tomllib.loads('[contracts.intake.fields.priority]\nallowed = ["low", "medium", "high", "URGENT"]\n')
    )
    assert breaches(store, config) == []
    assert breaches(store, AnalyzerConfig()) == [("priority", "unknown_enum_growth", None, "warn")]  # URGENT folded


def test_severity_override(store: Store) -> None:
    write_window(store, Drift(extra_values={"priority": {"URGENT": 0.10}}))
    config = parse_config(tomllib.loads('[contracts.intake.fields.priority]\nseverity = { new_enum_value = "page" }\n'))
    evaluation = evaluate(store, config, at(7) - timedelta(minutes=5))
    # URGENT is folded into the unknown growth of priority, which takes its declared page severity.
    assert not [c for c in evaluation.cohorts[0].checks if c.kind is AlertKind.new_enum_value]
    (growth,) = [
        c for c in evaluation.cohorts[0].checks if c.kind is AlertKind.unknown_enum_growth and c.field == "priority"
    ]
    assert (growth.kind, growth.severity.value, growth.breach) == (AlertKind.unknown_enum_growth, "page", True)
    assert list(growth.current["new_values"]) == ["URGENT"]
    _, alerts = analyze_once(store, config, at(7))
    assert _kinds(alerts) == [("priority", "unknown_enum_growth", None, "page", "firing")]
    # After one evaluation only, the page is pending (not yet confirmed).
    changed, _ = step({}, [j for r in evaluation.cohorts if (j := r.judged())], config, evaluation.at)
    assert sorted(brief(a) for a in changed.values()) == [("priority", "unknown_enum_growth", None, "page", "pending")]


@pytest.mark.parametrize(
    ("data", "key", "says"),
    [
        ({"defaults": {"tolerence": 0.1}}, "defaults.tolerence", "unknown key"),
        ({"defaults": {"tolerance": 10}}, "defaults.tolerance", "out of range"),
        ({"defaults": {"tolerance": "10%"}}, "defaults.tolerance", "must be a number"),
        ({"defaults": {"min_samples": 1.5}}, "defaults.min_samples", "must be an integer"),
        ({"defaults": {"min_samples": True}}, "defaults.min_samples", "must be an integer"),
        ({"defaults": {"unknown_warn": 0.3}}, "defaults.unknown_page", "must not be lower than unknown_warn"),
        ({"defaults": {"severity": {"presence_drop": "critical"}}}, "defaults.severity.presence_drop", "page or warn"),
        ({"defaults": {"severity": {"presence_dip": "page"}}}, "defaults.severity.presence_dip", "the kind must be"),
        (
            {"contracts": {"intake": {"fields": {"summary": {"mode": "freetext"}}}}},
            'contracts.intake.fields."summary".mode',
            "not one of auto, enum, free_text",
        ),
        (
            {"contracts": {"intake": {"fields": {"priority": {"allowed": "low"}}}}},
            'contracts.intake.fields."priority".allowed',
            "must be a list of strings",
        ),
        (
            {"contracts": {"intake": {"fields": {"priority": {"ignore": "yes"}}}}},
            'contracts.intake.fields."priority".ignore',
            "must be true or false",
        ),
        ({"contracts": {"intake": {"fields": ["priority"]}}}, "contracts.intake.fields", "must be a table"),
        ({"contracts": {"intake": 3}}, "contracts.intake", "must be a table"),
        ({"analyzer": {"window": 24}}, "analyzer.window", "duration string"),
        ({"analyzer": {"window": "24 hours"}}, "analyzer.window", "is not a duration"),
        ({"analyzer": {"confirm_evaluations": 0}}, "analyzer.confirm_evaluations", "positive integer"),
        ({"analyzer": {"hysteresis": 1.5}}, "analyzer.hysteresis", "(0, 1]"),
        ({"analyzer": {"windows": "24h"}}, "analyzer.windows", "unknown key"),
        ({"rules": {}}, "rules", "unknown table"),
    ],
)
def test_parse_config_errors_name_the_key(data: dict[str, Any], key: str, says: str) -> None:
    with pytest.raises(ConfigInvalid) as info:
        parse_config(data)
    assert info.value.key == key
    assert str(info.value).startswith(f"{key}: ")
    assert says in str(info.value)


def test_parse_config_reads_the_documented_example() -> None:
    config = parse_config(
        tomllib.loads("""
        [defaults]
        tolerance = 0.10
        min_samples = 200
        [analyzer]
        window = "6h"
        confirm_evaluations = 3
        [contracts.intake]
        tolerance = 0.15
        [contracts.intake.fields."customer.tier"]
        mode = "enum"
        allowed = ["gold", "silver", "bronze"]
        severity = { new_enum_value = "page" }
        [contracts.intake.fields.summary]
        ignore = true
    """)
    )
    tier = config.rules_for("intake", "customer.tier")
    assert (
        tier.tolerance,
        tier.mode.value,
        tier.allowed,
        tier.severity_of(AlertKind.new_enum_value).value,
        tier.severity_of(AlertKind.presence_drop).value,
    ) == (0.15, "enum", ("gold", "silver", "bronze"), "page", "page")
    assert config.rules_for("intake", "summary").ignore
    assert config.rules_for("intake", "priority").tolerance == 0.15
    assert config.rules_for("other", "priority").tolerance == 0.10
    assert (config.window, config.confirm_evaluations) == (timedelta(hours=6), 3)


# --- 8. inheritance ---------------------------------------------------------------------------


def test_a_new_prompt_version_is_compared_with_the_previous_ones_baseline(store: Store, template: Template) -> None:
    v4 = Cohort(MODEL, "intake-v4", CONTRACT)
    write_window(store, Drift(email_presence=0.40), prompt_version="intake-v4")
    evaluation, alerts = analyze_once(store, AnalyzerConfig(), at(7))
    (report,) = evaluation.cohorts
    assert (report.cohort, report.baseline_id, report.how, report.baseline_cohort) == (
        v4,
        template.baseline_id,
        "previous_prompt_version",
        COHORT,
    )
    said = f"baseline {template.baseline_id} of intake-v3 ({MODEL}), inherited: previous prompt version"
    assert [(brief(a), a.cohort, a.to_json()["compared_with"], a.to_json()["baseline_id"]) for a in alerts] == [
        (("customer.email", "presence_drop", None, "page", "firing"), v4, said, template.baseline_id)
    ]


def test_a_named_parent_baseline_is_inherited(store: Store, template: Template) -> None:
    other = Cohort("gpt-4o-2024-08-06", PROMPT, CONTRACT)
    write_window(store, Drift(email_presence=0.40), model="gpt-4o-2024-08-06")
    # Another model has no previous prompt version to fall back on: not compared at all.
    evaluation, alerts = analyze_once(store, AnalyzerConfig(), at(7))
    assert ([(r.cohort, r.baseline_id, r.compared_with) for r in evaluation.cohorts], alerts) == (
        [(other, None, "no baseline")],
        [],
    )
    inherit_baseline(store, other, template.baseline_id, author="ana", note="same prompt on the new model")
    evaluation, alerts = analyze_once(store, AnalyzerConfig(), at(7))
    (report,) = evaluation.cohorts
    assert (report.baseline_id, report.how) == (template.baseline_id, "parent")
    said = f"baseline {template.baseline_id} of intake-v3 ({MODEL}), inherited: named parent"
    assert [(brief(a), a.cohort, a.to_json()["compared_with"]) for a in alerts] == [
        (("customer.email", "presence_drop", None, "page", "firing"), other, said)
    ]
