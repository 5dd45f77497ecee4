"""value_shift: a number field's distribution moved, judged on real databases through the real analyzer.

A baseline of 10,000 synthetic outputs (``synth.py``: ``confidence`` uniform in 0.50..0.99) is
frozen once per module; each test copies the file, writes a window whose numbers are transformed,
and runs ``analyze_once``. Expected percentiles are computed from the raw outputs with the
collector's own binning (``number_bin``) and nearest rank, apart from the rollups.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from synth import CONTRACT, MODEL, PROMPT, synth_outputs, write_outputs

from shapewatch.analysis.alerts import ALERTS_SCHEMA
from shapewatch.analysis.analyzer import analyze_once
from shapewatch.analysis.config import AlertKind, AnalyzerConfig, ConfigInvalid, FieldRules, NumberKind, parse_config
from shapewatch.analysis.value_shift import compare_numbers, number_bins, quantity_like
from shapewatch.baselines import BASELINES_SCHEMA, Cohort, freeze_baseline
from shapewatch.collector import FieldProfile, Store
from shapewatch.collector.rules import number_bin

T0 = datetime(2026, 11, 1, tzinfo=UTC)
DAY = timedelta(days=1)
SPAN = timedelta(minutes=20)
COHORT = Cohort(MODEL, PROMPT, CONTRACT)
SCHEMAS = [BASELINES_SCHEMA, ALERTS_SCHEMA]


def with_ids(outputs: list[dict[str, Any]], day: int) -> list[dict[str, Any]]:
    """A ticket id per output: fresh every day, whole numbers in the millions."""
    for i, o in enumerate(outputs):
        o["ticket_id"] = 4_000_000 + day * 20_000 + i
    return outputs


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    path = tmp_path_factory.mktemp("numbers") / "baseline.duckdb"
    outputs = with_ids(synth_outputs(0, 10_000), 0)
    with Store.open(path, schemas=SCHEMAS) as store:
        write_outputs(store, outputs, T0 + timedelta(hours=6), SPAN)
        freeze_baseline(store, COHORT, T0, T0 + DAY, author="ana", note="reference", now=T0 + DAY)
    return path, outputs


@pytest.fixture
def store(template: tuple[Path, list[dict[str, Any]]], tmp_path: Path) -> Iterator[Store]:
    path = tmp_path / "window.duckdb"
    shutil.copyfile(template[0], path)
    s = Store.open(path, schemas=SCHEMAS)
    yield s
    s.close()


def window(store: Store, move: Callable[[float], float] | None = None, *, seed: int = 1, n: int = 3_000) -> list[Any]:
    outputs = with_ids(synth_outputs(seed, n), 7)
    if move is not None:
        for o in outputs:
            o["confidence"] = round(move(o["confidence"]), 2)
    write_outputs(store, outputs, T0 + 7 * DAY + timedelta(hours=6), SPAN)
    return outputs


def at() -> datetime:
    return T0 + 8 * DAY


def percentiles(values: list[float]) -> dict[str, Any]:
    bins = sorted(number_bin(v) for v in values)
    pick = {q: bins[max(1, math.ceil(round(q * len(bins), 9))) - 1] for q in (0.1, 0.5, 0.9)}
    return {"p10": pick[0.1], "p50": pick[0.5], "p90": pick[0.9], "samples": len(bins)}


def value_checks(store: Store, config: AnalyzerConfig) -> tuple[list[Any], list[Any]]:
    evaluation, alerts = analyze_once(store, config, at())
    (report,) = evaluation.cohorts
    return [c for c in report.checks if c.kind is AlertKind.value_shift], alerts


def test_a_confidence_median_falling_from_075_to_012_warns(store: Store, template: Any) -> None:
    cur = window(store, lambda c: c * 0.16)
    checks, alerts = value_checks(store, AnalyzerConfig())
    base = percentiles([o["confidence"] for o in template[1]])
    now = percentiles([o["confidence"] for o in cur])
    assert 0.72 <= base["p50"] <= 0.78 and 0.10 <= now["p50"] <= 0.14
    (alert,) = [a for a in alerts if a.kind is AlertKind.value_shift]
    j = alert.to_json()
    spread = base["p90"] - base["p10"]
    effect = max(abs(now[q] - base[q]) for q in ("p10", "p50", "p90"))
    assert (j["field"], j["kind"], j["severity"], j["state"], j["window"]) == (
        "confidence",
        "value_shift",
        "warn",
        "firing",
        "24h",
    )
    assert (j["baseline"], j["current"]) == (base, now)
    assert j["effect"] == pytest.approx(effect)
    assert j["threshold"] == pytest.approx(0.5 * spread)
    assert j["q_value"] < 1e-6
    assert j["detail"].startswith(f"median {base['p50']:.4g} -> {now['p50']:.4g}, p10 ")
    # Only the field that moved: entities[].confidence, amount, quantity, eta_days are the same.
    assert {c.field for c in checks if c.breach} == {"confidence"}
    assert {c.field for c in checks} == {
        "amount",
        "confidence",
        "entities[].confidence",
        "eta_days",
        "follow_up.within_hours",
        "quantity",
    }


def test_a_significant_move_under_the_tolerance_stays_quiet(store: Store, template: Any) -> None:
    cur = window(store, lambda c: c + 0.05)  # 0.05 against a tolerance of about 0.2 (half of 0.55..0.94)
    checks, alerts = value_checks(store, AnalyzerConfig())
    (conf,) = [c for c in checks if c.field == "confidence"]
    base = percentiles([o["confidence"] for o in template[1]])
    now = percentiles([o["confidence"] for o in cur])
    assert conf.q_value < 1e-6  # the move is real ...
    assert conf.effect == pytest.approx(max(abs(now[q] - base[q]) for q in ("p10", "p50", "p90")))
    assert conf.effect < 0.1 < 0.18 < conf.threshold  # ... and under the tolerance
    assert (conf.breach, [a for a in alerts if a.kind is AlertKind.value_shift]) == (False, [])


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_a_rerun_of_the_same_distribution_stays_quiet(store: Store, seed: int) -> None:
    window(store, seed=seed)
    checks, alerts = value_checks(store, AnalyzerConfig())
    assert len(checks) == 6
    assert ([(c.field, c.effect, c.q_value) for c in checks if c.breach], alerts) == ([], [])


def test_fresh_integer_ids_every_day_are_no_quantity(store: Store) -> None:
    window(store)
    checks, alerts = value_checks(store, AnalyzerConfig())
    assert "ticket_id" not in {c.field for c in checks}
    assert alerts == []
    # Declared a quantity, the same field is judged: every id of the window is above the baseline's.
    declared = parse_config({"contracts": {CONTRACT: {"fields": {"ticket_id": {"numbers": "quantity"}}}}})
    checks, alerts = value_checks(store, declared)
    (ids,) = [c for c in checks if c.field == "ticket_id"]
    assert ids.breach
    assert [(a.field, a.kind.value) for a in alerts] == [("ticket_id", "value_shift")]


def test_a_tolerance_in_the_fields_units(store: Store) -> None:
    window(store, lambda c: c * 0.16)
    loose = parse_config({"contracts": {CONTRACT: {"fields": {"confidence": {"value_tolerance_units": 0.9}}}}})
    checks, alerts = value_checks(store, loose)
    (conf,) = [c for c in checks if c.field == "confidence"]
    assert (conf.threshold, conf.breach, alerts) == (0.9, False, [])  # p90 moved most: 0.94 -> 0.15
    assert "(tolerance 0.9)" in conf.detail
    off = parse_config({"contracts": {CONTRACT: {"fields": {"confidence": {"numbers": "code"}}}}})
    checks, alerts = value_checks(store, off)
    assert ("confidence" in {c.field for c in checks}, alerts) == (False, [])


def test_under_the_sample_minimum_it_says_insufficient(store: Store) -> None:
    window(store, lambda c: c * 0.16, n=150)
    evaluation, alerts = analyze_once(store, AnalyzerConfig(), at())
    (report,) = evaluation.cohorts
    # The items of entities (about 300) are enough for entities[].confidence, unchanged.
    assert [c.field for c in report.checks if c.kind is AlertKind.value_shift] == ["entities[].confidence"]
    assert ("confidence", 10_000, 150, 200) in {
        (i.field, i.baseline_samples, i.current_samples, i.needed) for i in report.insufficient
    }
    assert alerts == []


# --- parts --------------------------------------------------------------------------------------


def field(numbers: dict[float, int], types: dict[str, int] | None = None) -> FieldProfile:
    n = sum(numbers.values())
    return FieldProfile("x", None, n, n, types or {"integer": n}, 0, {}, 0, {}, numbers)


def test_number_bins_count_between_the_baselines_deciles() -> None:
    base = {float(v): 10 for v in range(1, 11)}  # deciles 1..9
    assert number_bins(base, base) == {str(i): 10 for i in range(9)} | {"9": 10}
    assert number_bins(base, {0.5: 3, 1.0: 1, 9.5: 2, 50.0: 4}) == {"0": 4, "9": 6}
    constant = {7.0: 100}
    assert number_bins(constant, {7.0: 5, 8.0: 2, 6.0: 1}) == {"0": 6, "1": 2}


def test_quantity_like_tells_codes_from_counts() -> None:
    rules = FieldRules()
    assert quantity_like(field({3.0: 50, 14.0: 50}), rules)  # small whole numbers: a count
    assert not quantity_like(field({4_000_000.0: 60, 5.0: 40}), rules)  # mostly above 100: an id
    assert quantity_like(field({4_000_000.0: 60}, {"number": 60}), rules)  # fractions: a measure
    assert quantity_like(field({4_000_000.0: 60}), FieldRules(numbers=NumberKind.quantity))
    assert not quantity_like(field({3.0: 50}), FieldRules(numbers=NumberKind.code))


def test_compare_numbers_on_a_constant_baseline_breaches_on_any_move() -> None:
    base = {"x": field({1.0: 500})}
    cur = {"x": field({1.0: 250, 2.0: 250})}
    (c,), short = compare_numbers(base, cur, lambda _: FieldRules())
    assert (c.effect, c.threshold, short) == (1.0, 1e-9, [])
    assert c.p_value < 1e-6


@pytest.mark.parametrize(
    ("table", "key", "says"),
    [
        ({"numbers": "maybe"}, "defaults.numbers", "not one of auto, quantity, code"),
        ({"value_tolerance": -1}, "defaults.value_tolerance", "out of range"),
        ({"value_tolerance": float("inf")}, "defaults.value_tolerance", "out of range"),
        ({"value_tolerance_units": "0.1"}, "defaults.value_tolerance_units", "must be a number"),
        ({"value_tolerance_units": True}, "defaults.value_tolerance_units", "must be a number"),
    ],
)
def test_number_keys_refuse_bad_values(table: dict[str, Any], key: str, says: str) -> None:
    with pytest.raises(ConfigInvalid) as e:
        parse_config({"defaults": table})
    assert (e.value.key, says in e.value.problem) == (key, True)


def test_the_review_shows_number_percentiles(store: Store, template: Any) -> None:
    from shapewatch.analysis.review import build_review

    cur = window(store, lambda c: c * 0.16)
    review = build_review(store, AnalyzerConfig(), now=at(), period=timedelta(days=2))
    (entry,) = review["cohorts"]
    (row,) = [r for r in entry["fields"] if r["field"] == "confidence"]
    base = percentiles([o["confidence"] for o in template[1]])
    now = percentiles([o["confidence"] for o in cur])
    assert row["numbers"] == [[base[q] for q in ("p10", "p50", "p90")], [now[q] for q in ("p10", "p50", "p90")]]
    (summary,) = [r for r in entry["fields"] if r["field"] == "summary"]
    assert summary["numbers"] == [None, None]
