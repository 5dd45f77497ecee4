"""Declared assertions on real databases through the real analyzer, with and without a baseline.

Synthetic outputs (``synth.py``) satisfy every assertion below; each crafted window breaks one.
The configuration is read from TOML text as a user writes it.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from synth import CONTRACT, MODEL, NO_DRIFT, PROMPT, Drift, synth_outputs, write_outputs

from shapewatch.analysis.alerts import ALERTS_SCHEMA
from shapewatch.analysis.analyzer import analyze_once
from shapewatch.analysis.config import AlertKind, ConfigInvalid, parse_config
from shapewatch.baselines import BASELINES_SCHEMA, Cohort, freeze_baseline
from shapewatch.collector import Store

T0 = datetime(2026, 11, 1, tzinfo=UTC)
DAY = timedelta(days=1)
COHORT = Cohort(MODEL, PROMPT, CONTRACT)
SCHEMAS = [BASELINES_SCHEMA, ALERTS_SCHEMA]

RULES = f"""
[[contracts.{CONTRACT}.assertions]]
path = "confidence"
range = [0, 1]
severity = "page"

[[contracts.{CONTRACT}.assertions]]
path = "customer.email"
min_presence = 0.6

[[contracts.{CONTRACT}.assertions]]
path = "reference"
max_null_share = 0.25

[[contracts.{CONTRACT}.assertions]]
path = "intent"
max_unknown_share = 0.05
allowed = ["refund", "billing", "shipping", "cancel", "other"]

[[contracts.{CONTRACT}.assertions]]
path = "entities"
max_array_length = 4
"""
CONFIG = parse_config(tomllib.loads(RULES))
TEXT = {
    "confidence": "range = [0, 1]",
    "customer.email": "min_presence = 0.6",
    "reference": "max_null_share = 0.25",
    "intent": "max_unknown_share = 0.05, allowed = ['refund', 'billing', 'shipping', 'cancel', 'other']",
    "entities": "max_array_length = 4",
}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store.open(tmp_path / "assert.duckdb", schemas=SCHEMAS)
    yield s
    s.close()


def scenario(store: Store, with_baseline: bool, outputs: list[dict[str, Any]]) -> tuple[Any, Any]:
    if with_baseline:
        write_outputs(store, synth_outputs(1, 3_000), T0 + timedelta(hours=6), timedelta(hours=1), id_prefix="b")
        freeze_baseline(store, COHORT, T0, T0 + DAY, author="ana", note="reference", now=T0 + DAY)
    write_outputs(store, outputs, T0 + 7 * DAY + timedelta(hours=6), timedelta(hours=1), id_prefix="w")
    evaluation, alerts = analyze_once(store, CONFIG, T0 + 8 * DAY)
    (report,) = evaluation.cohorts
    return report, [a for a in alerts if a.kind is AlertKind.assertion]


def crafted(kind: str) -> list[dict[str, Any]]:
    drift = {
        "customer.email": Drift(email_presence=0.45),
        "intent": Drift(extra_values={"intent": {"complaint": 0.10}}),
        "entities": Drift(entities_extra=2),
    }.get(kind, NO_DRIFT)
    outputs = synth_outputs(2, 3_000, drift)
    for i, o in enumerate(outputs):
        if kind == "confidence" and i % 20 == 0:
            o["confidence"] = 1.5  # 5% out of range
        if kind == "reference" and i % 5 < 2:
            o["reference"] = None  # 40% null, over the baseline's 20%
    return outputs


@pytest.mark.parametrize("with_baseline", [True, False], ids=["baseline", "no-baseline"])
def test_compliant_outputs_raise_nothing(store: Store, with_baseline: bool) -> None:
    report, alerts = scenario(store, with_baseline, synth_outputs(2, 3_000))
    checks = [c for c in report.checks if c.kind is AlertKind.assertion]
    assert sorted((c.field, c.value) for c in checks) == sorted(TEXT.items())
    assert ([c for c in checks if c.breach], alerts) == ([], [])
    assert report.compared_with == ("baseline " + str(report.baseline_id) if with_baseline else "no baseline")


@pytest.mark.parametrize("with_baseline", [True, False], ids=["baseline", "no-baseline"])
@pytest.mark.parametrize(
    ("path", "severity", "current", "words"),
    [
        ("confidence", "page", {"samples": 3_000, "share": 0.05, "count": 150}, "5.0% of values outside [0, 1]"),
        ("customer.email", "warn", None, "(at least 60.0% asserted)"),
        ("reference", "warn", None, "(at most 25.0% asserted)"),
        ("intent", "warn", None, "of values unknown (at most 5.0% asserted)"),
        ("entities", "warn", {"samples": 3_000, "p99": 6, "longer": None}, "array length p99 6 (at most 4 asserted)"),
    ],
)
def test_each_assertion_breaches_on_a_crafted_window(
    store: Store, with_baseline: bool, path: str, severity: str, current: dict[str, Any] | None, words: str
) -> None:
    outputs = crafted(path)
    _, alerts = scenario(store, with_baseline, outputs)
    (alert,) = alerts
    j = alert.to_json()
    assert (j["field"], j["kind"], j["value"], j["severity"], j["state"]) == (
        path,
        "assertion",
        TEXT[path],
        severity,
        "firing",
    )
    assert j["baseline"]["assertion"] == TEXT[path]
    assert j["detail"].startswith(f"assertion {path}: {TEXT[path]} does not hold: ")
    assert words in j["detail"]
    assert j["effect"] > 0 and j["q_value"] < 0.01
    if path == "entities":
        longer = sum(1 for o in outputs if len(o["entities"]) > 4)
        assert j["current"] == {**(current or {}), "longer": longer}
    elif current is not None:
        assert j["current"] == current


def test_unknown_share_without_a_known_set_or_baseline_is_insufficient(store: Store) -> None:
    config = parse_config(
        tomllib.loads(f'[[contracts.{CONTRACT}.assertions]]\npath = "priority"\nmax_unknown_share = 0.05\n')
    )
    write_outputs(store, synth_outputs(2, 3_000), T0 + 7 * DAY, timedelta(hours=1))
    evaluation, alerts = analyze_once(store, config, T0 + 8 * DAY)
    (report,) = evaluation.cohorts
    assert (report.checks, alerts) == ([], [])
    assert [(i.field, i.current_samples) for i in report.insufficient] == [("priority", 0)]


def test_under_the_minimum_an_assertion_is_insufficient(store: Store) -> None:
    outputs = crafted("confidence")[:150]
    write_outputs(store, outputs, T0 + 7 * DAY, timedelta(hours=1))
    evaluation, alerts = analyze_once(store, CONFIG, T0 + 8 * DAY)
    (report,) = evaluation.cohorts
    assert (report.checks, alerts) == ([], [])
    assert {i.field: (i.current_samples, i.needed) for i in report.insufficient} == {
        "confidence": (150, 200),
        "customer.email": (150, 200),
        "reference": (150, 200),
        "intent": (150, 200),
        "entities": (150, 200),
    }
    assert report.to_json()["insufficient"][0] == {
        "field": "confidence",
        "baseline_samples": 0,
        "current_samples": 150,
        "needed": 200,
    }


def test_a_firing_assertion_resolves_when_it_holds_again(store: Store) -> None:
    from prometheus_client import CollectorRegistry

    from shapewatch.analysis.alerts import AlertBook
    from shapewatch.analysis.analyzer import Analyzer

    write_outputs(store, crafted("confidence"), T0, timedelta(hours=1), id_prefix="bad")
    write_outputs(store, synth_outputs(3, 3_000), T0 + 2 * DAY, timedelta(hours=1), id_prefix="good")
    az = Analyzer(store, CONFIG, registry=CollectorRegistry())
    at = T0 + timedelta(hours=2)
    for minutes in (0, 5):
        assert az.run(at + timedelta(minutes=minutes)).ok
    assert [(a.field, a.state.value) for a in AlertBook(store).alerts()] == [("confidence", "firing")]
    later = T0 + 2 * DAY + timedelta(hours=2)  # the day's window holds only compliant outputs
    for minutes in (0, 5):
        assert az.run(later + timedelta(minutes=minutes)).ok
    assert [(a.field, a.state.value) for a in AlertBook(store).alerts()] == [("confidence", "resolved")]


A = f"contracts.{CONTRACT}.assertions"


@pytest.mark.parametrize(
    ("value", "key", "says"),
    [
        ({"path": "x", "range": [0, 1]}, A, "must be an array of tables"),
        (["x"], f"{A}[0]", "must be a table"),
        ([{"range": [0, 1]}], f"{A}[0].path", "field path of 1 to 1000"),
        ([{"path": "x" * 1001, "range": [0, 1]}], f"{A}[0].path", "field path of 1 to 1000"),
        ([{"path": "x"}], f"{A}[0]", "exactly one of range"),
        ([{"path": "x", "range": [0, 1], "min_presence": 0.5}], f"{A}[0]", "(found 2)"),
        ([{"path": "x", "range": [0, 1], "allowed": ["a"]}], f"{A}[0].allowed", "unknown key for a range"),
        ([{"path": "x", "min_presence": 0.5, "max_outside": 0.1}], f"{A}[0].max_outside", "unknown key"),
        ([{"path": "x", "range": [1]}], f"{A}[0].range", "[low, high]"),
        ([{"path": "x", "range": [2, 1]}], f"{A}[0].range", "low 2 is above high 1"),
        ([{"path": "x", "range": [0, float("nan")]}], f"{A}[0].range", "finite number"),
        ([{"path": "x", "range": [0, "1"]}], f"{A}[0].range", "finite number"),
        ([{"path": "x", "range": [0, 1], "max_outside": 2}], f"{A}[0].max_outside", "out of range"),
        ([{"path": "x", "min_presence": -0.1}], f"{A}[0].min_presence", "out of range"),
        ([{"path": "x", "min_presence": True}], f"{A}[0].min_presence", "must be a number from 0 to 1"),
        ([{"path": "x", "max_null_share": float("inf")}], f"{A}[0].max_null_share", "must be a number"),
        ([{"path": "x", "max_array_length": 2.5}], f"{A}[0].max_array_length", "whole number"),
        ([{"path": "x", "max_array_length": -1}], f"{A}[0].max_array_length", "whole number"),
        ([{"path": "x", "max_unknown_share": 0.1, "allowed": "a"}], f"{A}[0].allowed", "list of at most"),
        ([{"path": "x", "max_true_share": 1.5}], f"{A}[0].max_true_share", "out of range"),
        ([{"path": "x", "min_true_share": "0.5"}], f"{A}[0].min_true_share", "must be a number from 0 to 1"),
        ([{"path": "x", "min_true_share": 0.5, "allowed": ["a"]}], f"{A}[0].allowed", "unknown key"),
        ([{"path": "x", "min_presence": 0.5, "severity": "loud"}], f"{A}[0].severity", "not page or warn"),
        ([{"path": "x", "min_presence": 0.5}] * 201, A, "at most 200"),
    ],
)
def test_assertion_errors_name_the_table_and_key(value: Any, key: str, says: str) -> None:
    with pytest.raises(ConfigInvalid) as e:
        parse_config({"contracts": {CONTRACT: {"assertions": value}}})
    assert (e.value.key, says in e.value.problem) == (key, True), e.value


TRUE_RULES = f"""
[[contracts.{CONTRACT}.assertions]]
path = "needs_review"
max_true_share = 0.05
severity = "page"

[[contracts.{CONTRACT}.assertions]]
path = "verified"
min_true_share = 0.8
"""


def with_flags(n: int, review_every: int, verified_of_10: int, seed: int = 2) -> list[dict[str, Any]]:
    """Synthetic outputs with two boolean fields: needs_review true once in ``review_every``,
    verified true in ``verified_of_10`` of every 10."""
    outputs = synth_outputs(seed, n)
    for i, o in enumerate(outputs):
        o["needs_review"] = i % review_every == 0
        o["verified"] = i % 10 < verified_of_10
    return outputs


def true_checks(store: Store, with_baseline: bool, outputs: list[dict[str, Any]]) -> tuple[Any, Any]:
    config = parse_config(tomllib.loads(TRUE_RULES))
    if with_baseline:
        write_outputs(
            store, with_flags(3_000, 50, 9, seed=1), T0 + timedelta(hours=6), timedelta(hours=1), id_prefix="b"
        )
        freeze_baseline(store, COHORT, T0, T0 + DAY, author="ana", note="reference", now=T0 + DAY)
    write_outputs(store, outputs, T0 + 7 * DAY + timedelta(hours=6), timedelta(hours=1), id_prefix="w")
    evaluation, alerts = analyze_once(store, config, T0 + 8 * DAY)
    (report,) = evaluation.cohorts
    return report, alerts


@pytest.mark.parametrize("with_baseline", [True, False], ids=["baseline", "no-baseline"])
def test_true_share_assertions_hold_on_a_compliant_window(store: Store, with_baseline: bool) -> None:
    report, alerts = true_checks(store, with_baseline, with_flags(3_000, 50, 9))  # 2% review, 90% verified
    checks = {c.field: c for c in report.checks if c.kind is AlertKind.assertion}
    assert {f: (c.breach, c.current) for f, c in checks.items()} == {
        "needs_review": (False, {"samples": 3_000, "share": 0.02, "count": 60}),
        "verified": (False, {"samples": 3_000, "share": 0.9, "count": 2_700}),
    }
    assert alerts == []


@pytest.mark.parametrize("with_baseline", [True, False], ids=["baseline", "no-baseline"])
def test_true_share_assertions_breach_on_a_crafted_window(store: Store, with_baseline: bool) -> None:
    _, alerts = true_checks(store, with_baseline, with_flags(3_000, 8, 6))  # 12.5% review, 60% verified
    got = {a.field: a.to_json() for a in alerts}
    assert set(got) == {"needs_review", "verified"}
    review, verified = got["needs_review"], got["verified"]
    assert (review["severity"], review["value"], review["current"]) == (
        "page",
        "max_true_share = 0.05",
        {"samples": 3_000, "share": 0.125, "count": 375},
    )
    assert review["detail"].endswith("true in 12.5% (at most 5.0% asserted) (p < 1e-6)")
    assert (verified["severity"], verified["value"], verified["current"]) == (
        "warn",
        "min_true_share = 0.8",
        {"samples": 3_000, "share": 0.6, "count": 1_800},
    )
    assert verified["detail"].endswith("true in 60.0% (at least 80.0% asserted) (p < 1e-6)")


def test_true_shares_are_insufficient_under_the_minimum_and_when_counted_before_trues_were_kept(
    store: Store,
) -> None:
    report, alerts = true_checks(store, False, with_flags(150, 8, 6))
    assert (report.checks, alerts) == ([], [])
    assert {i.field: i.current_samples for i in report.insufficient} == {"needs_review": 150, "verified": 150}
    # Rows counted before true counts were kept: the trues are not known, so nothing is judged.
    write_outputs(store, with_flags(3_000, 8, 6), T0 + 7 * DAY + timedelta(hours=8), timedelta(hours=1), id_prefix="x")
    store.flush_rollups()
    with store.transaction("forgetting true counts, as before version 11") as con:
        con.execute("UPDATE field_rollups SET n_true = NULL WHERE bucket < ?", [T0 + 7 * DAY + timedelta(hours=7)])
    evaluation, alerts = analyze_once(store, parse_config(tomllib.loads(TRUE_RULES)), T0 + 8 * DAY)
    (report,) = evaluation.cohorts
    assert ([c for c in report.checks if c.kind is AlertKind.assertion], alerts) == ([], [])
    assert {i.field: i.current_samples for i in report.insufficient} == {"needs_review": 0, "verified": 0}
