"""The alert lifecycle: one alert per fingerprint, pending -> firing -> resolved, hysteresis, episodes.

``alerts.step`` is driven with hand-built checks (exact effects, exact timing);
then the real ``Analyzer`` runs over a DuckDB file whose hourly windows carry
an exact presence (deterministic outputs), with states, history, acknowledgement,
silences, recorded runs and metrics in the store and a fresh registry.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry
from synth import write_outputs

from shapewatch.analysis.alerts import (
    ALERTS_SCHEMA,
    Alert,
    AlertBook,
    AlertError,
    AlertNotFound,
    AlertState,
    Judged,
    Transition,
    fingerprint,
    step,
)
from shapewatch.analysis.analyzer import Analyzer
from shapewatch.analysis.config import DEFAULT_SEVERITY, AlertKind, AnalyzerConfig, FieldRules, Severity
from shapewatch.analysis.rules import Check
from shapewatch.baselines import BASELINES_SCHEMA, Cohort, freeze_baseline
from shapewatch.collector import Store

MODEL = "claude-sonnet-4-5-20250929"
COHORT = Cohort(MODEL, "intake-v3", "intake")
OTHER = Cohort(MODEL, "intake-v4", "intake")
T = datetime(2026, 11, 8, 12, tzinfo=UTC)
EVERY = timedelta(minutes=5)
EMAIL = "customer.email"


def chk(
    effect: float,
    *,
    kind: AlertKind = AlertKind.presence_drop,
    q: float = 1e-9,
    value: str | None = None,
    path: str = EMAIL,
    threshold: float = 0.10,
    escalate_at: float | None = None,
) -> Check:
    return Check(
        path,
        kind,
        value,
        DEFAULT_SEVERITY[kind],
        effect,
        threshold,
        q,
        0.01,
        {"presence_rate": 0.7, "samples": 5000},
        {"presence_rate": round(0.7 - effect, 6), "samples": 3000},
        f"effect {effect}",
        escalate_at,
        q_value=q,
    )


def judged(*checks: Check, insufficient: tuple[str, ...] = (), cohort: Cohort = COHORT) -> Judged:
    return Judged(cohort, list(checks), frozenset(insufficient), "b" * 16, "baseline " + "b" * 16)


class Memory:
    """States kept in memory across evaluations five minutes apart, as ``analyze --once`` keeps them."""

    def __init__(self, config: AnalyzerConfig | None = None) -> None:
        self.config = config or AnalyzerConfig()
        self.alerts: dict[str, Alert] = {}
        self.moves: list[Transition] = []
        self.n = 0

    def now(self) -> datetime:
        return T + (self.n - 1) * EVERY

    def evaluate(self, *evaluated: Judged) -> list[Transition]:
        self.n += 1
        changed, moves = step(self.alerts, evaluated, self.config, self.now())
        self.alerts.update(changed)
        self.moves.extend(moves)
        return moves

    def one(self) -> Alert:
        (alert,) = self.alerts.values()
        return alert

    def states(self) -> tuple[str, int, int]:
        a = self.one()
        return (a.state.value, a.streak, a.episode)


def moves_of(moves: list[Transition]) -> list[tuple[str | None, str, int, bool]]:
    return [(m.previous.value if m.previous else None, m.alert.state.value, m.alert.episode, m.notify) for m in moves]


# --- step: identity and confirmation ----------------------------------------------------------


def test_one_alert_per_fingerprint_across_many_evaluations() -> None:
    mem = Memory()
    for _ in range(12):
        mem.evaluate(judged(chk(0.3)))
    fp = fingerprint(COHORT, EMAIL, AlertKind.presence_drop, None)
    assert list(mem.alerts) == [fp]
    a = mem.one()
    assert (a.state, a.severity, a.episode, a.streak, a.first_seen, a.fired_at, a.last_seen, a.resolved_at) == (
        AlertState.firing,
        Severity.page,
        1,
        0,
        T,
        T + EVERY,
        T + 11 * EVERY,
        None,
    )
    assert moves_of(mem.moves) == [(None, "pending", 0, False), ("pending", "firing", 1, True)]
    assert a.diff == {
        "baseline": {"presence_rate": 0.7, "samples": 5000},
        "current": {"presence_rate": 0.4, "samples": 3000},
        "p_value": 1e-9,
        "q_value": 1e-9,
        "effect": 0.3,
        "threshold": 0.1,
        "detail": "effect 0.3 (p < 1e-6)",
        "baseline_id": "b" * 16,
        "compared_with": "baseline " + "b" * 16,
        "contracts": {},
        "window": None,
    }


def test_the_fingerprint_is_cohort_field_kind_and_value() -> None:
    fp = fingerprint(COHORT, EMAIL, AlertKind.new_enum_value, "URGENT")
    others = {
        fingerprint(OTHER, EMAIL, AlertKind.new_enum_value, "URGENT"),
        fingerprint(COHORT, "priority", AlertKind.new_enum_value, "URGENT"),
        fingerprint(COHORT, EMAIL, AlertKind.unknown_enum_growth, "URGENT"),
        fingerprint(COHORT, EMAIL, AlertKind.new_enum_value, "urgent"),
        fingerprint(COHORT, EMAIL, AlertKind.new_enum_value, None),
    }
    assert fp == fingerprint(Cohort(*COHORT), EMAIL, AlertKind.new_enum_value, "URGENT")
    assert fp not in others and len(others) == 5
    mem = Memory()
    mem.evaluate(
        judged(
            chk(9, kind=AlertKind.new_enum_value, value="URGENT", threshold=5),
            chk(7, kind=AlertKind.new_enum_value, value="CRITICAL", threshold=5),
        ),
        judged(chk(9, kind=AlertKind.new_enum_value, value="URGENT", threshold=5), cohort=OTHER),
    )
    assert sorted((a.cohort.prompt_version, a.value, a.state.value) for a in mem.alerts.values()) == [
        ("intake-v3", "CRITICAL", "firing"),
        ("intake-v3", "URGENT", "firing"),
        ("intake-v4", "URGENT", "firing"),
    ]


def test_a_page_is_pending_first_and_fires_on_the_second_evaluation() -> None:
    mem = Memory()
    assert moves_of(mem.evaluate(judged(chk(0.3)))) == [(None, "pending", 0, False)]
    assert mem.states() == ("pending", 1, 0)
    assert mem.one().fired_at is None
    assert moves_of(mem.evaluate(judged(chk(0.3)))) == [("pending", "firing", 1, True)]
    assert mem.states() == ("firing", 0, 1)
    assert mem.one().fired_at == T + EVERY


def test_a_warn_fires_at_once() -> None:
    mem = Memory()
    moves = mem.evaluate(judged(chk(0.3, kind=AlertKind.presence_rise)))
    assert moves_of(moves) == [(None, "firing", 1, True)]
    a = mem.one()
    assert (a.severity, a.first_seen, a.fired_at) == (Severity.warn, T, T)


def test_confirm_evaluations_is_configurable() -> None:
    mem = Memory(AnalyzerConfig(confirm_evaluations=3))
    seen = []
    for _ in range(3):
        mem.evaluate(judged(chk(0.3)))
        seen.append(mem.states())
    assert seen == [("pending", 1, 0), ("pending", 2, 0), ("firing", 0, 1)]


def test_a_pending_page_that_does_not_hold_resolves_without_firing() -> None:
    mem = Memory()
    mem.evaluate(judged(chk(0.3)))
    mem.evaluate(judged(chk(0.09)))  # in the hysteresis band, but a pending alert needs a breach
    a = mem.one()
    assert (a.state, a.episode, a.fired_at, a.resolved_at) == (AlertState.resolved, 0, None, T + EVERY)
    assert [(p, s, e) for p, s, e, _ in moves_of(mem.moves)] == [(None, "pending", 0), ("pending", "resolved", 0)]
    # The breach comes back: a fresh confirmation, and the first episode.
    mem.evaluate(judged(chk(0.3)))
    mem.evaluate(judged(chk(0.3)))
    assert mem.states() == ("firing", 0, 1)


def test_a_pending_alert_whose_check_disappears_resolves_silently() -> None:
    mem = Memory()
    mem.evaluate(judged(chk(0.3)))
    mem.evaluate(judged())  # no check at all for it (the field is judged, the condition is gone)
    assert moves_of(mem.moves) == [(None, "pending", 0, False), ("pending", "resolved", 0, False)]


def test_a_pending_alert_that_clears_is_not_told_to_the_pager() -> None:
    mem = Memory()
    mem.evaluate(judged(chk(0.3)))
    mem.evaluate(judged(chk(0.0)))
    assert moves_of(mem.moves) == [(None, "pending", 0, False), ("pending", "resolved", 0, False)]


# --- step: hysteresis and resolving -----------------------------------------------------------


def test_an_effect_hovering_below_the_threshold_keeps_firing_until_clear_twice() -> None:
    # threshold 0.10, hysteresis 0.8: the band is [0.08, 0.10); clear is under 0.08 or not significant.
    mem = Memory()
    seen = []
    for effect, q in [
        (0.30, 1e-9),
        (0.09, 1e-9),
        (0.081, 1e-9),
        (0.0999, 1e-9),
        (0.10, 1e-9),
        (0.05, 1e-9),
        (0.085, 1e-9),
        (0.079, 1e-9),
        (0.09, 1e-9),
        (0.30, 0.5),
        (0.0, 1.0),
    ]:
        mem.evaluate(judged(chk(effect, kind=AlertKind.presence_rise, q=q)))
        seen.append(mem.states())
    assert seen == [
        ("firing", 0, 1),  # a warn fires at once
        ("firing", 0, 1),
        ("firing", 0, 1),
        ("firing", 0, 1),  # in the band: no flapping
        ("firing", 0, 1),  # a breach again
        ("firing", 1, 1),  # clear once
        ("firing", 0, 1),  # back in the band: the clear streak starts over
        ("firing", 1, 1),
        ("firing", 0, 1),
        ("firing", 1, 1),  # a large effect that is not significant is clear
        ("resolved", 0, 1),  # the second clear evaluation in a row
    ]
    assert moves_of(mem.moves) == [(None, "firing", 1, True), ("firing", "resolved", 1, True)]
    assert mem.one().resolved_at == T + 10 * EVERY


def test_resolve_evaluations_is_configurable() -> None:
    mem = Memory(AnalyzerConfig(resolve_evaluations=3, hysteresis=1.0))
    mem.evaluate(judged(chk(0.3, kind=AlertKind.presence_rise)))
    seen = []
    for _ in range(3):
        mem.evaluate(judged(chk(0.099, kind=AlertKind.presence_rise)))  # hysteresis 1.0: no band
        seen.append(mem.states())
    assert seen == [("firing", 1, 1), ("firing", 2, 1), ("resolved", 0, 1)]


def test_a_resolved_alert_that_breaches_again_is_episode_2() -> None:
    mem = Memory()
    for effect in (0.3, 0.3, 0.0, 0.0):
        mem.evaluate(judged(chk(effect)))
    first = mem.one()
    assert (first.state, first.episode) == (AlertState.resolved, 1)
    for effect in (0.3, 0.3):
        mem.evaluate(judged(chk(effect)))
    again = mem.one()
    assert (again.fingerprint, again.state, again.episode, again.first_seen, again.fired_at, again.resolved_at) == (
        first.fingerprint,
        AlertState.firing,
        2,
        T,
        T + 5 * EVERY,
        None,
    )
    assert moves_of(mem.moves) == [
        (None, "pending", 0, False),
        ("pending", "firing", 1, True),
        ("firing", "resolved", 1, True),
        ("resolved", "pending", 1, False),
        ("pending", "firing", 2, True),
    ]


def test_a_field_that_cannot_be_judged_keeps_its_state() -> None:
    mem = Memory()
    mem.evaluate(judged(chk(0.3)))
    mem.evaluate(judged(chk(0.3)))
    before = mem.one()
    for _ in range(3):
        assert mem.evaluate(judged(insufficient=(EMAIL,))) == []  # too few samples: not judged
        mem.evaluate(judged(chk(0.3), cohort=OTHER))  # another cohort's evaluation leaves it alone
    assert mem.alerts[before.fingerprint] == before
    assert len(mem.alerts) == 2 and {a.state for a in mem.alerts.values()} == {AlertState.firing}
    # Judged again with no check: the condition is gone, which counts as clear.
    mem.evaluate(judged())
    mem.evaluate(judged())
    assert mem.alerts[before.fingerprint].state is AlertState.resolved


def test_unknown_growth_escalates_to_page_and_back_while_firing() -> None:
    mem = Memory()
    seen = []
    for effect in (0.10, 0.30, 0.30, 0.10):
        moves = mem.evaluate(judged(chk(effect, kind=AlertKind.unknown_enum_growth, threshold=0.05, escalate_at=0.20)))
        a = mem.one()
        seen.append((a.state.value, a.severity.value, moves_of(moves)))
    assert seen == [
        ("firing", "warn", [(None, "firing", 1, True)]),
        ("firing", "page", [("firing", "firing", 1, True)]),
        ("firing", "page", []),
        ("firing", "warn", [("firing", "firing", 1, True)]),
    ]
    # Above the page threshold from the start, it needs confirming like any page.
    mem = Memory()
    mem.evaluate(judged(chk(0.3, kind=AlertKind.unknown_enum_growth, threshold=0.05, escalate_at=0.20)))
    assert (mem.one().state, mem.one().severity) == (AlertState.pending, Severity.page)


# --- the real analyzer ------------------------------------------------------------------------

DAY1 = datetime(2026, 11, 2, tzinfo=UTC)
HOUR = timedelta(hours=1)


def outputs(n: int, with_email: int) -> list[dict[str, Any]]:
    """n outputs of which exactly the first ``with_email`` carry customer.email."""
    out = []
    for i in range(n):
        o: dict[str, Any] = {"priority": ("low", "medium", "high")[i % 3], "customer": {"tier": "gold"}}
        if i < with_email:
            o["customer"]["email"] = f"user{i}@example.com"
        out.append(o)
    return out


@pytest.fixture
def store(tmp_path: Path) -> Any:
    s = Store.open(tmp_path / "lifecycle.duckdb", schemas=[BASELINES_SCHEMA, ALERTS_SCHEMA])
    write_outputs(s, outputs(1000, 700), DAY1 - 12 * HOUR, HOUR)  # presence 70%
    freeze_baseline(s, COHORT, DAY1 - 24 * HOUR, DAY1, author="ana", note="reference", now=DAY1)
    yield s
    s.close()


def hour(k: int) -> datetime:
    return DAY1 + k * HOUR


def analyzer(store: Store, registry: CollectorRegistry, now: list[datetime]) -> Analyzer:
    return Analyzer(store, AnalyzerConfig(window=HOUR), registry=registry, clock=lambda: now[0])


def test_the_analyzer_keeps_one_alert_through_its_whole_life(store: Store) -> None:
    # Presence per hour (baseline 70%): 40% pages; 61% and 62% sit in the hysteresis band
    # (effect 0.09 and 0.084 in [0.08, 0.10)); 58% breaches; 70% is clear.
    plan = [200, 200, 305, 290, 350, 308, 350, 350, 200, 200]
    for k, with_email in enumerate(plan):
        write_outputs(store, outputs(500, with_email), hour(k), HOUR, id_prefix=f"h{k}")
    registry = CollectorRegistry()
    now = [hour(1)]
    az = analyzer(store, registry, now)
    book = AlertBook(store)
    fp = fingerprint(COHORT, EMAIL, AlertKind.presence_drop, None)
    seen = []
    for k in range(len(plan)):
        now[0] = hour(k + 1)
        result = az.run(hour(k + 1))
        assert result.ok, result.error
        a = book.get(fp)
        assert a is not None
        seen.append((a.state.value, a.episode, a.streak, moves_of(result.transitions)))
        if k == 1:
            acked = book.acknowledge(fp, by="ana", now=hour(k + 1) + timedelta(minutes=1))
            assert (acked.acknowledged_by, acked.acknowledged_at) == ("ana", hour(2) + timedelta(minutes=1))
        if k == 2:
            assert (a.acknowledged_by, a.state) == ("ana", AlertState.firing)  # still acknowledged
            book.silence(starts_at=hour(3), ends_at=hour(12), author="ana", reason="known rollout", fingerprint=fp)
    assert seen == [
        ("pending", 0, 1, [(None, "pending", 0, False)]),
        ("firing", 1, 0, [("pending", "firing", 1, True)]),
        ("firing", 1, 0, []),  # 61%: in the band
        ("firing", 1, 0, []),  # 58%: a breach
        ("firing", 1, 1, []),  # 70%: clear once
        ("firing", 1, 0, []),  # 61.6%: in the band again, the clear streak starts over
        ("firing", 1, 1, []),
        ("resolved", 1, 0, [("firing", "resolved", 1, True)]),  # silenced, and resolved all the same
        ("pending", 1, 1, [("resolved", "pending", 1, False)]),
        ("firing", 2, 0, [("pending", "firing", 2, True)]),  # a new episode of the same alert
    ]
    # One alert, whatever the number of evaluations, and every transition in its history.
    assert [a.fingerprint for a in book.alerts()] == [fp]
    final = book.get(fp)
    assert final is not None
    assert (final.first_seen, final.fired_at, final.last_seen, final.resolved_at, final.acknowledged_by) == (
        hour(1),
        hour(10),
        hour(10),
        None,
        None,
    )  # a new episode is not acknowledged
    # Examples are attached when an episode opens: the newest outputs without an email then.
    assert final.samples == ("h8/499", "h8/498", "h8/497")
    assert [(h["at"], h["from"], h["to"], h["episode"], h["actor"]) for h in book.history(fp)] == [
        ("2026-11-02T01:00:00Z", None, "pending", 0, None),
        ("2026-11-02T02:00:00Z", "pending", "firing", 1, None),
        ("2026-11-02T02:01:00Z", "firing", "firing", 1, "ana"),
        ("2026-11-02T08:00:00Z", "firing", "resolved", 1, None),
        ("2026-11-02T09:00:00Z", "resolved", "pending", 1, None),
        ("2026-11-02T10:00:00Z", "pending", "firing", 2, None),
    ]
    assert book.history(fp)[2]["detail"] == "acknowledged"
    (silenced,) = book.alerts(now=hour(10))
    assert silenced.silenced_until == hour(12)
    assert book.alerts(now=hour(12))[0].silenced_until is None
    # Every run recorded; metrics from this registry only.
    runs = store.query("SELECT evaluated_at, ok, error, cohorts FROM analyzer_runs ORDER BY run_id")
    assert runs == [(hour(k + 1), True, None, 1) for k in range(len(plan))]
    assert registry.get_sample_value("shapewatch_analyzer_runs_total", {"result": "ok"}) == len(plan)
    assert registry.get_sample_value("shapewatch_analyzer_runs_total", {"result": "failed"}) == 0
    assert registry.get_sample_value("shapewatch_alerts", {"state": "firing", "severity": "page"}) == 1
    assert (
        registry.get_sample_value(
            "shapewatch_field_presence_ratio",
            {"model": MODEL, "prompt_version": "intake-v3", "contract": "intake", "field": "priority"},
        )
        == 1.0
    )


def test_acknowledge_and_silence_refuse_what_cannot_be_done(store: Store) -> None:
    book = AlertBook(store)
    with pytest.raises(AlertNotFound, match="no alert with fingerprint 'nope'"):
        book.acknowledge("nope", by="ana", now=T)
    with pytest.raises(AlertError, match="must end after it starts"):
        book.silence(starts_at=T, ends_at=T, author="ana", reason="x", field=EMAIL)
    with pytest.raises(AlertError, match="needs a reason"):
        book.silence(starts_at=T, ends_at=T + HOUR, author="ana", reason=" ", field=EMAIL)
    with pytest.raises(AlertError, match="must match something"):
        book.silence(starts_at=T, ends_at=T + HOUR, author="ana", reason="maintenance")
    s = book.silence(
        starts_at=T, ends_at=T + HOUR, author="ana", reason="maintenance", model=MODEL, kind="presence_drop"
    )
    assert book.silences(now=T) == [s]
    assert book.silences(now=T + HOUR) == []
    assert store.query("SELECT count(*) FROM alert_history") == [(0,)]


def test_a_failing_run_is_recorded_counted_and_does_not_raise(store: Store, caplog: pytest.LogCaptureFixture) -> None:
    write_outputs(store, outputs(500, 200), hour(0), HOUR)
    registry = CollectorRegistry()
    # A broken configuration: comparing a sample count with None raises inside evaluate.
    broken = AnalyzerConfig(window=HOUR, defaults=replace(FieldRules(), min_samples=None))  # type: ignore[arg-type]
    az = Analyzer(store, broken, registry=registry, clock=lambda: hour(1))
    with caplog.at_level(logging.ERROR, logger="shapewatch.analysis.analyzer"):
        result = az.run(hour(1))
    # The rule raises for the only cohort: no cohort judged is a failed run, naming the cohort.
    cause = "TypeError: '<' not supported between instances of 'int' and 'NoneType'"
    error = f"1 of 1 cohorts not judged: cohort {MODEL} / intake-v3 / intake: {cause}"
    assert (result.ok, result.at, result.transitions, result.error) == (False, hour(1), [], error)
    assert result.evaluation is not None and [c.error for c in result.evaluation.cohorts] == [cause]
    (row,) = store.query("SELECT evaluated_at, ok, error, cohorts, checks, breaches, report FROM analyzer_runs")
    assert row[:6] == (hour(1), False, error, 1, 0, 0)
    assert [c["error"] for c in orjson.loads(row[6])["cohorts"]] == [cause]
    assert registry.get_sample_value("shapewatch_analyzer_runs_total", {"result": "failed"}) == 1
    assert registry.get_sample_value("shapewatch_analyzer_runs_total", {"result": "ok"}) == 0
    assert registry.get_sample_value("shapewatch_analyzer_cohort_failures_total") == 1
    assert registry.get_sample_value("shapewatch_analyzer_last_success_timestamp_seconds") == 0
    assert [(r.levelname, r.getMessage(), r.exc_info is not None) for r in caplog.records] == [
        ("ERROR", f"evaluating cohort {MODEL} / intake-v3 / intake failed", True),
        ("ERROR", f"analyzer run at {hour(1).isoformat()} failed: {error}", False),
    ]
    assert AlertBook(store).alerts() == []


def test_a_run_on_a_closed_store_fails_without_raising(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "closed.duckdb"
    s = Store.open(path, schemas=[BASELINES_SCHEMA, ALERTS_SCHEMA])
    registry = CollectorRegistry()
    az = Analyzer(s, AnalyzerConfig(), registry=registry, clock=lambda: T)
    s.close()
    with caplog.at_level(logging.ERROR, logger="shapewatch.analysis.analyzer"):
        result = az.run(T)
    assert (result.ok, result.evaluation, result.transitions) == (False, None, [])
    assert result.error is not None and result.error.startswith("StoreError: ")
    assert registry.get_sample_value("shapewatch_analyzer_runs_total", {"result": "failed"}) == 1
    assert [r.getMessage() for r in caplog.records] == [
        f"analyzer run at {T.isoformat()} failed",
        "could not record the failed analyzer run",
    ]
    # The scrape does not fail either.
    assert registry.get_sample_value("shapewatch_alerts", {"state": "firing", "severity": "page"}) == 0
