"""Short windows: a large change pages within minutes of its onset, and stable traffic stays quiet.

A real DuckDB file holds a baseline day (frozen) and a day of the same traffic at 20 outputs a
minute; at ``T0`` one thing changes. The real ``Analyzer`` runs every 5 minutes from ``T0``
(states in the store, as the service keeps them) and the tests assert when the page fires and
on which window. Stable traffic of 20 seeds, judged on every window at several times, raises
nothing. The scaling and merging of checks and the ``short_windows`` key are tested on their own.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from synth import CONTRACT, MODEL, PROMPT, Drift, synth_outputs, write_outputs

from shapewatch.analysis.alerts import ALERTS_SCHEMA, AlertBook, AlertState
from shapewatch.analysis.analyzer import Analyzer, analyze_once, evaluate
from shapewatch.analysis.config import (
    DEFAULT_SHORT_WINDOWS,
    AlertKind,
    AnalyzerConfig,
    ConfigInvalid,
    Severity,
    ShortWindow,
    parse_config,
)
from shapewatch.analysis.rules import Check
from shapewatch.analysis.short_windows import merge_windows, scaled
from shapewatch.baselines import BASELINES_SCHEMA, Cohort, freeze_baseline
from shapewatch.collector import Store

DAY0 = datetime(2026, 11, 1, tzinfo=UTC)
T0 = DAY0 + timedelta(days=2)  # the onset: a baseline day, then a day of the same traffic
MIN = timedelta(minutes=1)
RATE = 20  # outputs a minute
COHORT = Cohort(MODEL, PROMPT, CONTRACT)
SCHEMAS = [BASELINES_SCHEMA, ALERTS_SCHEMA]


def stable(store: Store, since: datetime, minutes: int, seed: int) -> None:
    write_outputs(store, synth_outputs(seed, RATE * minutes), since, minutes * MIN, id_prefix=f"s{seed}/{since}")


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("short") / "template.duckdb"
    with Store.open(path, schemas=SCHEMAS) as store:
        write_outputs(store, synth_outputs(0, 10_000), DAY0, timedelta(days=1), id_prefix="base")
        freeze_baseline(store, COHORT, DAY0, DAY0 + timedelta(days=1), author="ana", note="day 0", now=T0 - MIN)
        stable(store, DAY0 + timedelta(days=1), 24 * 60, seed=1)
    return path


@pytest.fixture
def store(template: Path, tmp_path: Path) -> Iterator[Store]:
    path = tmp_path / "short.duckdb"
    shutil.copyfile(template, path)
    s = Store.open(path, schemas=SCHEMAS)
    yield s
    s.close()


def changed(store: Store, drift: Drift, minutes: int = 120) -> None:
    write_outputs(store, synth_outputs(7, RATE * minutes, drift), T0, minutes * MIN, id_prefix="drift")


def run_until(store: Store, config: AnalyzerConfig, field: str, kinds: set[AlertKind], limit: int) -> dict[str, Any]:
    """Run the real analyzer every 5 minutes from T0 until a page on ``field`` fires; its alert JSON and
    the minutes it took (None past ``limit`` minutes)."""
    analyzer = Analyzer(store, config, registry=CollectorRegistry())
    book = AlertBook(store)
    for minutes in range(5, limit + 1, 5):
        result = analyzer.run(T0 + minutes * MIN)
        assert result.ok, result.error
        firing = [a for a in book.alerts(state=AlertState.firing) if a.field == field and a.kind in kinds]
        if firing:
            (alert,) = firing
            return {"minutes": minutes, **alert.to_json()}
    return {"minutes": None}


# --- time to page -------------------------------------------------------------------------------


def test_a_vanishing_field_pages_within_15_minutes_on_the_15_minute_window(store: Store) -> None:
    changed(store, Drift(language_presence=0.0))
    got = run_until(store, AnalyzerConfig(), "language", {AlertKind.presence_drop, AlertKind.field_missing}, 15)
    # T0+5: a third of the 15-minute window lacks it (33 points >= 30); T0+10: two thirds; confirmed.
    assert (got["minutes"], got["kind"], got["severity"], got["window"]) == (10, "presence_drop", "page", "15m")
    assert got["threshold"] == pytest.approx(0.30)
    assert got["baseline"]["presence_rate"] == 1.0
    assert got["current"] == {"presence_rate": pytest.approx(1 / 3, abs=0.01), "samples": 300}
    assert got["detail"].startswith("presence 100.0% -> 33.")
    assert "over the last 15m" in got["detail"]


@pytest.mark.slow
def test_a_vanished_field_stays_one_alert_as_the_short_window_empties(store: Store) -> None:
    changed(store, Drift(language_presence=0.0))
    analyzer = Analyzer(store, AnalyzerConfig(), registry=CollectorRegistry())
    for minutes in range(5, 65, 5):  # from T0+15 the 15-minute window has no language at all
        assert analyzer.run(T0 + minutes * MIN).ok
    alerts = [a for a in AlertBook(store).alerts() if a.field == "language"]
    assert [(a.kind.value, a.state.value, a.episode) for a in alerts] == [("presence_drop", "firing", 1)]
    assert alerts[0].diff["current"]["presence_rate"] == 0.0
    assert alerts[0].diff["detail"].startswith("presence 100.0% -> 0.0% (absent from the window) over the last")


@pytest.mark.slow
def test_without_short_windows_the_same_field_pages_hours_later(store: Store) -> None:
    changed(store, Drift(language_presence=0.0))
    got = run_until(store, replace(AnalyzerConfig(), short_windows=()), "language", {AlertKind.presence_drop}, 60)
    assert got == {"minutes": None}  # the day's window has diluted it under 10 points for an hour


def test_a_new_type_on_25_percent_pages_within_15_minutes(store: Store) -> None:
    changed(store, Drift(confidence_string_share=0.25))
    got = run_until(store, AnalyzerConfig(), "confidence", {AlertKind.new_type}, 15)
    assert (got["minutes"] <= 15, got["kind"], got["value"], got["severity"]) == (True, "new_type", "string", "page")
    assert got["window"] in ("15m", "1h", "6h", "24h")


def test_a_30_point_presence_drop_pages_within_60_minutes(store: Store) -> None:
    changed(store, Drift(email_presence=0.40))
    got = run_until(store, AnalyzerConfig(), "customer.email", {AlertKind.presence_drop}, 60)
    assert got["minutes"] is not None and got["minutes"] <= 60, got
    assert (got["kind"], got["severity"]) == ("presence_drop", "page")
    assert got["window"] in ("15m", "1h")
    # The effect is judged against the window's scaled threshold: 3x or 2x the 10-point tolerance.
    assert got["threshold"] == {"15m": pytest.approx(0.30), "1h": pytest.approx(0.20)}[got["window"]]
    assert got["effect"] >= got["threshold"]


def test_the_evaluation_reports_each_window(store: Store) -> None:
    changed(store, Drift(), minutes=30)
    evaluation = evaluate(store, AnalyzerConfig(), T0 + 30 * MIN)
    (report,) = evaluation.cohorts
    assert [(w["window"], w["scale"], w["events"]) for w in report.to_json()["windows"]] == [
        ("24h", 1.0, 24 * 60 * RATE),
        ("15m", 3.0, 15 * RATE),
        ("1h", 2.0, 60 * RATE),
        ("6h", 1.5, 6 * 60 * RATE),
    ]
    assert {c.window for c in report.checks} <= {"24h", "15m", "1h", "6h"}
    assert [c for c in report.checks if c.breach] == []


def test_a_window_longer_than_the_analyzers_is_left_out(store: Store) -> None:
    changed(store, Drift(), minutes=30)
    evaluation = evaluate(store, AnalyzerConfig(window=timedelta(hours=1)), T0 + 30 * MIN)
    (report,) = evaluation.cohorts
    assert [w["window"] for w in report.windows] == ["1h", "15m"]


# --- no false alarms ----------------------------------------------------------------------------


def _quiet(store: Store, seeds: list[int]) -> None:
    """Stable traffic at 20 outputs a minute, a seed per day, judged at 15 min, 1 h, 3 h and 6 h into it:
    every short window full of it, and the analyzer's day window too."""
    for k, seed in enumerate(seeds):
        stable(store, T0 + k * timedelta(days=1), 6 * 60, seed)
    for k, seed in enumerate(seeds):
        for minutes in (15, 60, 180, 360):
            at = T0 + k * timedelta(days=1) + minutes * MIN
            evaluation, alerts = analyze_once(store, AnalyzerConfig(), at)
            (report,) = evaluation.cohorts
            judged = {w["window"] for w in report.windows if w["events"] >= 200}
            assert judged == {"24h", "15m", "1h", "6h"}, (seed, minutes, report.windows)
            breaches = [(c.field, c.kind.value, c.window, c.effect, c.threshold) for c in report.checks if c.breach]
            assert (seed, minutes, breaches, [a.fingerprint for a in alerts]) == (seed, minutes, [], [])


@pytest.mark.slow
def test_stable_traffic_raises_nothing_on_any_window(store: Store) -> None:
    _quiet(store, [201, 202])


@pytest.mark.slow
def test_stable_traffic_raises_nothing_on_any_window_for_20_seeds(store: Store) -> None:
    _quiet(store, list(range(201, 221)))


# --- scaling and merging ----------------------------------------------------------------------------


def chk(
    effect: float, threshold: float, q: float, window: str | None, kind: AlertKind = AlertKind.presence_drop
) -> Check:
    return Check("f", kind, None, Severity.page, effect, threshold, q, 0.01, {}, {}, "d", None, q, window)


def test_scaled_multiplies_thresholds_and_names_the_window() -> None:
    w = ShortWindow(timedelta(minutes=15), 3.0)
    c = scaled(chk(0.2, 0.1, 1e-9, None), w)
    assert (c.threshold, c.window, c.detail, c.breach) == (0.3, "15m", "d over the last 15m", False)
    jump = scaled(chk(5.0, 2.0, 1e-9, None, AlertKind.cardinality_jump), w)
    assert jump.threshold == 4.0  # the excess of the ratio over 1 is scaled
    growth = replace(chk(0.3, 0.05, 1e-9, None, AlertKind.unknown_enum_growth), escalate_at=0.2)
    assert scaled(growth, w).escalate_at == pytest.approx(0.6)


def test_merge_keeps_the_breaching_window() -> None:
    day = chk(0.05, 0.1, 1e-9, "24h")
    quarter = chk(0.5, 0.3, 1e-9, "15m")
    hour = chk(0.25, 0.2, 0.5, "1h")  # large but not significant: no breach
    assert merge_windows([day, quarter, hour], hysteresis=0.8) == [quarter]


def test_merge_keeps_the_window_that_holds_a_firing_alert() -> None:
    # No breach anywhere; the 1h window is in the hysteresis band (0.17 >= 0.2 x 0.8): it is kept.
    day = chk(0.05, 0.1, 1e-9, "24h")
    hour = chk(0.17, 0.2, 1e-9, "1h")
    assert merge_windows([day, hour], hysteresis=0.8) == [hour]
    assert merge_windows([day], hysteresis=0.8) == [day]


def test_merge_keeps_one_check_per_fingerprint_in_order() -> None:
    a = chk(0.05, 0.1, 1e-9, "24h")
    b = replace(a, field="g")
    c = replace(a, window="15m", effect=0.01)
    assert merge_windows([a, b, c], hysteresis=0.8) == [a, b]


# --- configuration ------------------------------------------------------------------------------


def test_short_windows_default_and_parsed() -> None:
    assert AnalyzerConfig().short_windows == DEFAULT_SHORT_WINDOWS
    cfg = parse_config({"analyzer": {"short_windows": [{"window": "2h", "scale": 2}, {"window": "10m", "scale": 4}]}})
    assert cfg.short_windows == (ShortWindow(timedelta(minutes=10), 4.0), ShortWindow(timedelta(hours=2), 2.0))
    assert parse_config({"analyzer": {"short_windows": []}}).short_windows == ()


@pytest.mark.parametrize(
    ("value", "key", "says"),
    [
        ("1h", "analyzer.short_windows", "must be a list"),
        ([{"window": "1h"}], "analyzer.short_windows[0]", "exactly window and scale"),
        ([{"window": "1h", "scale": 2, "extra": 1}], "analyzer.short_windows[0]", "exactly window and scale"),
        (["1h"], "analyzer.short_windows[0]", "exactly window and scale"),
        ([{"window": 60, "scale": 2}], "analyzer.short_windows[0].window", "duration string"),
        ([{"window": "soon", "scale": 2}], "analyzer.short_windows[0].window", "not a duration"),
        ([{"window": "30s", "scale": 2}], "analyzer.short_windows[0].window", "shorter than 1m"),
        ([{"window": "1h", "scale": 0.5}], "analyzer.short_windows[0].scale", "out of range"),
        ([{"window": "1h", "scale": 1e9}], "analyzer.short_windows[0].scale", "out of range"),
        ([{"window": "1h", "scale": float("nan")}], "analyzer.short_windows[0].scale", "must be a number"),
        ([{"window": "1h", "scale": True}], "analyzer.short_windows[0].scale", "must be a number"),
        ([{"window": "1h", "scale": "2"}], "analyzer.short_windows[0].scale", "must be a number"),
        ([{"window": "1h", "scale": 2}, {"window": "60m", "scale": 3}], "analyzer.short_windows[1].window", "twice"),
        ([{"window": "24h", "scale": 2}], "analyzer.short_windows", "not shorter than the window"),
        ([{"window": f"{i + 1}m", "scale": 2} for i in range(7)], "analyzer.short_windows", "at most 6"),
        ([{"window": "9" * 5000 + "m", "scale": 2}], "analyzer.short_windows[0].window", "longer than the limit"),
    ],
)
def test_short_windows_errors_name_the_key(value: Any, key: str, says: str) -> None:
    with pytest.raises(ConfigInvalid) as e:
        parse_config({"analyzer": {"short_windows": value}})
    assert e.value.key == key
    assert says in str(e.value)
