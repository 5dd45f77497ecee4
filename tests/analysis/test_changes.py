"""Changes as alerts, on real databases through the real analyzer: a new model behind an alias
(served_model_change) and an unregistered contract version (unknown_contract_version)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from harness import make_envelope
from synth import CONTRACT, NO_DRIFT, PROMPT, Drift, synth_outputs, write_outputs

from shapewatch.analysis.alerts import ALERTS_SCHEMA
from shapewatch.analysis.analyzer import analyze_once
from shapewatch.analysis.changes import compare_served_models, unknown_contract_versions
from shapewatch.analysis.config import AlertKind, AnalyzerConfig, ConfigInvalid, FieldRules, parse_config
from shapewatch.baselines import BASELINES_SCHEMA, Cohort, freeze_baseline
from shapewatch.collector import Store, register_contract
from shapewatch.collector.envelope import LIMITS, parse_envelope

T0 = datetime(2026, 11, 1, tzinfo=UTC)
DAY = timedelta(days=1)
ALIAS = "gpt-4o"
OLD, NEW = "gpt-4o-2024-08-06", "gpt-4o-2024-11-20"
COHORT = Cohort(ALIAS, PROMPT, CONTRACT)
SCHEMAS = [BASELINES_SCHEMA, ALERTS_SCHEMA]
SCHEMA = {"type": "object", "required": ["intent"], "properties": {"intent": {"type": "string"}}}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store.open(tmp_path / "changes.duckdb", schemas=SCHEMAS)
    yield s
    s.close()


def served(store: Store, day: int, n: int, model: str, seed: int, drift: Drift = NO_DRIFT) -> None:
    start = T0 + day * DAY + timedelta(hours=6)
    write_outputs(
        store,
        synth_outputs(seed, n, drift),
        start,
        timedelta(hours=1),
        model=ALIAS,
        served_model=model,
        id_prefix=f"{day}/{model}",
    )


def alias_day0(store: Store) -> None:
    served(store, 0, 3_000, OLD, seed=1)
    freeze_baseline(store, COHORT, T0, T0 + DAY, author="ana", note="gpt-4o served by 08-06", now=T0 + DAY)


def test_a_new_model_on_30_percent_of_an_alias_warns_naming_both(store: Store) -> None:
    alias_day0(store)
    served(store, 7, 2_100, OLD, seed=2)
    served(store, 7, 900, NEW, seed=3, drift=Drift(email_presence=0.20))  # and it fills email far less
    _evaluation, alerts = analyze_once(store, AnalyzerConfig(), T0 + 8 * DAY)
    (alert,) = [a for a in alerts if a.kind is AlertKind.served_model_change]
    j = alert.to_json()
    assert (j["cohort"]["model"], j["field"], j["value"], j["severity"], j["state"]) == (
        ALIAS,
        "$",
        NEW,
        "warn",
        "firing",
    )
    assert j["baseline"] == {"served_models": {OLD: 1.0}, "samples": 3_000}
    assert j["current"] == {
        "served_models": {OLD: 0.7, NEW: 0.3},
        "samples": 3_000,
        "share": 0.3,
        # moved in the new model's own cohort (judged against the alias's baseline) and in the alias's
        "fields_moved": ["customer.email"],
    }
    assert j["detail"].startswith(f"served model {NEW} answers 30.0% of outputs (baseline: {OLD} 100.0%)")
    assert "fields moved since: customer.email" in j["detail"]
    # One alert: the new model's served cohort does not raise it again.
    assert [a.cohort.model for a in alerts if a.kind is AlertKind.served_model_change] == [ALIAS]


def test_a_page_can_be_configured_per_contract(store: Store) -> None:
    alias_day0(store)
    served(store, 7, 2_100, OLD, seed=2)
    served(store, 7, 900, NEW, seed=3)
    config = parse_config({"contracts": {CONTRACT: {"severity": {"served_model_change": "page"}}}})
    _, alerts = analyze_once(store, config, T0 + 8 * DAY)
    assert [(a.kind.value, a.severity.value, a.state.value) for a in alerts] == [
        ("served_model_change", "page", "firing")
    ]


def test_a_new_model_under_the_share_stays_quiet(store: Store) -> None:
    alias_day0(store)
    served(store, 7, 2_850, OLD, seed=2)
    served(store, 7, 150, NEW, seed=3)
    evaluation, alerts = analyze_once(store, AnalyzerConfig(), T0 + 8 * DAY)
    (report,) = [r for r in evaluation.cohorts if r.cohort == COHORT]
    (check,) = [c for c in report.checks if c.kind is AlertKind.served_model_change]
    assert (check.value, check.effect, check.breach, alerts) == (NEW, 0.05, False, [])


def write_tagged(store: Store, day: int, versions: dict[str, int], seed: int) -> None:
    start = T0 + day * DAY + timedelta(hours=6)
    outputs = synth_outputs(seed, sum(versions.values()))
    tags = [v for v, n in versions.items() for _ in range(n)]
    envs = [
        parse_envelope(
            orjson.dumps(
                make_envelope(
                    event_id=f"{day}-{i}",
                    ts=(start + timedelta(seconds=i % 1200)).isoformat(),
                    model=OLD,
                    served_model=OLD,
                    prompt_version=PROMPT,
                    contract=CONTRACT,
                    contract_version=version,
                    output=o,
                )
            ),
            LIMITS,
        )
        for i, (o, version) in enumerate(zip(outputs, tags, strict=True))
    ]
    store.write_batch(envs)


def test_an_unregistered_contract_version_warns(store: Store) -> None:
    register_contract(store, CONTRACT, "3", SCHEMA)
    write_tagged(store, 0, {"3": 2_000}, seed=1)
    freeze_baseline(store, Cohort(OLD, PROMPT, CONTRACT), T0, T0 + DAY, author="ana", note="v3", now=T0 + DAY)
    write_tagged(store, 7, {"3": 1_700, "4": 300}, seed=2)
    _, alerts = analyze_once(store, AnalyzerConfig(), T0 + 8 * DAY)
    (alert,) = alerts
    j = alert.to_json()
    assert (j["field"], j["kind"], j["value"], j["severity"], j["state"]) == (
        "$",
        "unknown_contract_version",
        "4",
        "warn",
        "firing",
    )
    assert (j["baseline"], j["current"]) == ({"registered": ["3"]}, {"outputs": 300, "share": 0.15, "samples": 2_000})
    assert j["detail"].startswith("contract version '4' on 15.0% of outputs is not registered (registered: 3)")


def test_no_version_registered_for_a_contract_is_no_alert(store: Store) -> None:
    write_tagged(store, 0, {"3": 2_000}, seed=1)
    freeze_baseline(store, Cohort(OLD, PROMPT, CONTRACT), T0, T0 + DAY, author="ana", note="v3", now=T0 + DAY)
    write_tagged(store, 7, {"3": 1_700, "4": 300}, seed=2)
    evaluation, alerts = analyze_once(store, AnalyzerConfig(), T0 + 8 * DAY)
    (report,) = evaluation.cohorts
    assert ([c for c in report.checks if c.kind is AlertKind.unknown_contract_version], alerts) == ([], [])


def test_parts() -> None:
    rules = FieldRules()
    assert compare_served_models({}, {NEW: 10}, rules) == []  # nothing known of the baseline's
    assert compare_served_models({OLD: 10}, {OLD: 10}, rules) == []
    (c,) = compare_served_models({OLD: 1000}, {OLD: 500, NEW: 500}, rules)
    assert (c.value, c.effect, c.threshold) == (NEW, 0.5, 0.1)
    assert unknown_contract_versions({"4": {"unregistered": 5}}, 100, (), rules) == []
    assert unknown_contract_versions({"": {"untagged": 50}, "3": {"valid": 50}}, 100, {"3"}, rules) == []
    (u,) = unknown_contract_versions({"9": {"unregistered": 5}, "3": {"valid": 95}}, 100, {"3"}, rules)
    assert (u.value, u.effect, u.threshold) == ("9", 0.05, 0.01)


def test_the_dashboard_filters_by_every_alert_kind() -> None:
    # Read from the page's source: importing a Streamlit page renders it.
    source = (Path(__file__).resolve().parents[2] / "dashboard" / "views" / "alerts.py").read_text()
    (kinds,) = [
        node.value
        for node in ast.parse(source).body
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["ALERT_KINDS"]
    ]
    assert sorted(ast.literal_eval(kinds)) == sorted(k.value for k in AlertKind)


@pytest.mark.parametrize("value", [1.5, -0.1, float("nan"), "10%", True])
def test_served_model_share_refuses_bad_values(value: Any) -> None:
    with pytest.raises(ConfigInvalid) as e:
        parse_config({"contracts": {CONTRACT: {"served_model_share": value}}})
    assert e.value.key == f"contracts.{CONTRACT}.served_model_share"
