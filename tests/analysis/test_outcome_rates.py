"""Provider outcome rates on real databases through the real analyzer: truncation, refusal, invalid output.

Each test writes a baseline day of outputs and provider outcomes (``Store.record_outcomes``, as
the provider route counts them), freezes it, writes a window, and runs ``analyze_once``.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from synth import CONTRACT, MODEL, PROMPT, synth_outputs, write_outputs

from shapewatch.analysis.alerts import ALERTS_SCHEMA
from shapewatch.analysis.analyzer import analyze_once
from shapewatch.analysis.config import AlertKind, AnalyzerConfig, ConfigInvalid, FieldRules, parse_config
from shapewatch.analysis.outcome_rates import compare_outcomes
from shapewatch.baselines import BASELINES_SCHEMA, Cohort, freeze_baseline
from shapewatch.collector import Store

T0 = datetime(2026, 11, 1, tzinfo=UTC)
DAY = timedelta(days=1)
COHORT = Cohort(MODEL, PROMPT, CONTRACT)
SCHEMAS = [BASELINES_SCHEMA, ALERTS_SCHEMA]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store.open(tmp_path / "outcomes.duckdb", schemas=SCHEMAS)
    yield s
    s.close()


def responses(store: Store, day: int, n: int, outcomes: dict[str, int], seed: int) -> None:
    """``n`` responses on ``day``: the outcomes counted, the rest stored as outputs."""
    start = T0 + day * DAY + timedelta(hours=6)
    bad = sum(outcomes.values())
    write_outputs(store, synth_outputs(seed, n - bad), start, timedelta(hours=1), id_prefix=f"d{day}")
    rows = [
        (MODEL, PROMPT, CONTRACT, start + timedelta(seconds=i), kind) for kind, k in outcomes.items() for i in range(k)
    ]
    assert all(store.record_outcomes(rows))


def judge(store: Store, baseline: dict[str, int], window: dict[str, int], config: AnalyzerConfig) -> tuple[Any, Any]:
    responses(store, 0, 2_000, baseline, seed=1)
    freeze_baseline(store, COHORT, T0, T0 + DAY, author="ana", note="reference", now=T0 + DAY)
    responses(store, 7, 2_000, window, seed=2)
    evaluation, alerts = analyze_once(store, config, T0 + 8 * DAY)
    (report,) = evaluation.cohorts
    return report, alerts


def test_truncation_rising_from_1_to_8_percent_pages(store: Store) -> None:
    _report, alerts = judge(store, {"truncated": 20}, {"truncated": 160}, AnalyzerConfig())
    (alert,) = alerts
    j = alert.to_json()
    assert (j["field"], j["kind"], j["severity"], j["state"], j["window"]) == (
        "$",
        "truncation_rate",
        "page",
        "firing",
        "24h",
    )
    assert j["baseline"] == {"rate": 0.01, "samples": 2_000}
    assert j["current"] == {"rate": 0.08, "samples": 2_000, "outcomes": {"truncated": 160}}
    assert (j["effect"], j["threshold"]) == (0.07, 0.02)
    assert j["q_value"] < 1e-6
    assert j["detail"].startswith("truncation rate 1.0% -> 8.0% of responses")


def test_truncation_rising_from_1_to_1_3_percent_does_not(store: Store) -> None:
    report, alerts = judge(store, {"truncated": 20}, {"truncated": 26}, AnalyzerConfig())
    (check,) = [c for c in report.checks if c.kind is AlertKind.truncation_rate]
    assert (check.effect, check.breach, alerts) == (0.003, False, [])


def test_refusals_and_content_filters_count_together(store: Store) -> None:
    report, alerts = judge(
        store, {"refusal": 10}, {"refusal": 60, "content_filter": 40, "invalid_json": 3}, AnalyzerConfig()
    )
    assert sorted((a.kind.value, a.severity.value, a.state.value) for a in alerts) == [
        ("refusal_rate", "page", "firing")
    ]
    (refusal,) = [c for c in report.checks if c.kind is AlertKind.refusal_rate]
    assert refusal.current == {"rate": 0.05, "samples": 2_000, "outcomes": {"content_filter": 40, "refusal": 60}}
    # Three invalid outputs against none in the baseline: a check, no breach (0.15 points).
    (invalid,) = [c for c in report.checks if c.kind is AlertKind.invalid_output_rate]
    assert (invalid.effect, invalid.breach) == (0.0015, False)


def test_an_absolute_ceiling_breaches_without_a_rise(store: Store) -> None:
    config = parse_config({"contracts": {CONTRACT: {"max_truncation_rate": 0.05}}})
    _report, alerts = judge(store, {"truncated": 160}, {"truncated": 170}, config)
    assert [(a.kind.value, a.diff["baseline"].get("ceiling"), a.diff["effect"]) for a in alerts] == [
        ("truncation_rate", 0.05, 0.085)
    ]
    assert "over the ceiling of 5.0%" in alerts[0].detail


def test_under_the_sample_minimum_it_says_insufficient(store: Store) -> None:
    responses(store, 0, 2_000, {"truncated": 20}, seed=1)
    freeze_baseline(store, COHORT, T0, T0 + DAY, author="ana", note="reference", now=T0 + DAY)
    responses(store, 7, 150, {"truncated": 100}, seed=2)
    evaluation, alerts = analyze_once(store, AnalyzerConfig(), T0 + 8 * DAY)
    (report,) = evaluation.cohorts
    assert [c for c in report.checks if c.kind is AlertKind.truncation_rate] == []
    assert ("$", 2_000, 150, 200) in {
        (i.field, i.baseline_samples, i.current_samples, i.needed) for i in report.insufficient
    }
    assert alerts == []


def test_compare_outcomes_gives_no_check_without_outcomes() -> None:
    assert compare_outcomes({"truncated": 5}, 1000, {}, 1000, FieldRules()) == ([], [])


@pytest.mark.parametrize(
    ("table", "key"),
    [
        ({"max_truncation_rate": 1.5}, "defaults.max_truncation_rate"),
        ({"max_refusal_rate": -0.1}, "defaults.max_refusal_rate"),
        ({"outcome_tolerance": float("nan")}, "defaults.outcome_tolerance"),
        ({"max_invalid_output_rate": "5%"}, "defaults.max_invalid_output_rate"),
    ],
)
def test_outcome_keys_refuse_bad_values(table: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigInvalid) as e:
        parse_config({"defaults": table})
    assert e.value.key == key


def test_the_review_shows_outcome_shares(store: Store) -> None:
    from shapewatch.analysis.review import build_review

    responses(store, 0, 2_000, {"truncated": 20}, seed=1)
    freeze_baseline(store, COHORT, T0, T0 + DAY, author="ana", note="reference", now=T0 + DAY)
    responses(store, 7, 2_000, {"truncated": 160, "refusal": 40}, seed=2)
    review = build_review(store, AnalyzerConfig(), now=T0 + 8 * DAY, period=timedelta(days=2))
    (entry,) = review["cohorts"]
    assert entry["outcomes"] == {
        "responses": 2_000,
        "counts": {"refusal": 40, "truncated": 160},
        "shares": {"refusal": 0.02, "truncated": 0.08},
    }
