"""Run-level signals (analysis/runs.py) on a real DuckDB file: complete runs are counted once
into run rollups, cases are mined and bounded, and an evaluation judges each agent release's
runs against the runs of the baseline's window; steady runs raise nothing."""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from shapewatch.analysis.analyzer import analyze_once, evaluate
from shapewatch.analysis.config import AlertKind, AnalyzerConfig
from shapewatch.analysis.runs import RUN_FIELD, judge_complete_runs, run_signals
from shapewatch.analysis.store_access import SCHEMAS
from shapewatch.baselines import Cohort, freeze_baseline
from shapewatch.collector import Store
from shapewatch.collector.envelope import Limits, validate_envelope
from shapewatch.collector.otlp import RunStep, StepKind, arguments_hash

T0 = datetime(2026, 11, 2, tzinfo=UTC)
HOUR = timedelta(hours=1)
COHORT = Cohort("gpt-4o", "booking-v2", "booking")
IDLE = timedelta(minutes=5)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(tmp_path / "runs.duckdb", schemas=SCHEMAS) as s:
        yield s


def _step(
    run_id: str, i: int, ts: datetime, kind: StepKind, release: str, tool: str | None, args: dict | None
) -> RunStep:
    return RunStep(
        key=f"{run_id}:{i}",
        run_id=run_id,
        ts=ts,
        position=i,
        kind=kind,
        trace_id=run_id,
        span_id=f"{i:016x}",
        model="gpt-4o",
        served_model=None,
        prompt_version="booking-v2",
        contract=tool or "booking",
        contract_version="1",
        tool=tool,
        args_hash=arguments_hash(args) if args is not None else None,
        finish_reason=None,
        agent_release=release,
        source=None,
        event_id=f"{run_id}:{i}",
        run_contract="booking",
    )


def steady_calls(rng: random.Random) -> list[dict]:
    """Normal work: usually one or two lookups, three or more in about 37% of runs (several
    reservations), an identical call back to back in about 2.5%."""
    n = rng.choices([1, 2, 3, 4], weights=[33, 30, 27, 10])[0]
    calls = [{"id": f"R{rng.randrange(10**6)}"} for _ in range(n)]
    if rng.random() < 0.025:
        calls.insert(1, dict(calls[0]))
    return calls


def looping_calls(rng: random.Random) -> list[dict]:
    """After a bad change: the same tool four times, one call repeated."""
    rid = f"R{rng.randrange(10**6)}"
    return [{"id": rid}, {"id": rid}, {"id": rid, "retry": 1}, {"id": rid, "retry": 2}]


def add_runs(store: Store, start: datetime, release: str, n: int, rng: random.Random, make=steady_calls) -> None:
    """n runs within the hour after ``start``: tool calls, then a structured output (an event of the cohort)."""
    steps: list[RunStep] = []
    envelopes = []
    for r in range(n):
        run_id = f"{release}-{start:%d%H}-{r}-{rng.randrange(10**9)}"
        t = start + timedelta(seconds=r * 3600 / n)
        calls = make(rng)
        for i, args in enumerate(calls):
            steps.append(
                _step(run_id, i, t + timedelta(milliseconds=i), StepKind.tool_call, release, "get_reservation", args)
            )
        steps.append(_step(run_id, len(calls), t + timedelta(milliseconds=50), StepKind.output, release, None, None))
        envelopes.append(
            validate_envelope(
                {
                    # the output step's key: the events' write keeps the step recorded above
                    "event_id": f"{run_id}:{len(calls)}",
                    "ts": (t + timedelta(milliseconds=50)).isoformat(),
                    "model": "gpt-4o",
                    "prompt_version": "booking-v2",
                    "contract": "booking",
                    "run_id": run_id,
                    "agent_release": release,
                    "output": {"status": rng.choice(["confirmed", "pending"]), "count": len(calls)},
                },
                Limits(),
            )
        )
    store.record_run_steps(steps, now=start + HOUR)
    store.write_batch(envelopes, now=start + HOUR)


def baseline(store: Store, seed: int = 0) -> None:
    add_runs(store, T0, "1.0", 300, random.Random(seed))
    assert judge_complete_runs(store, idle=IDLE, now=T0 + 2 * HOUR)[0] == 300
    freeze_baseline(store, COHORT, T0, T0 + HOUR, author="ana", note="release 1.0", now=T0 + 2 * HOUR)


def run_checks_of(store: Store, at: datetime) -> list:
    evaluation = evaluate(store, AnalyzerConfig(), at, window=HOUR)
    (report,) = [r for r in evaluation.cohorts if r.cohort == COHORT]
    return [c for c in report.checks if c.field == RUN_FIELD]


def test_a_release_whose_runs_loop_on_one_tool_pages_retry_loop_rate(store: Store) -> None:
    baseline(store)
    rng = random.Random(7)
    start = T0 + 24 * HOUR
    add_runs(store, start, "2.0", 120, rng, make=lambda r: looping_calls(r) if r.random() < 0.5 else steady_calls(r))
    judged, _ = judge_complete_runs(store, idle=IDLE, now=start + 2 * HOUR)
    assert judged == 120
    checks = {c.kind: c for c in run_checks_of(store, start + HOUR)}
    assert set(checks) == {
        AlertKind.retry_loop_rate,
        AlertKind.repeated_call_rate,
        AlertKind.undeclared_call_rate,
        AlertKind.run_length_shift,
    }
    loop = checks[AlertKind.retry_loop_rate]
    assert loop.breach and loop.value == "2.0" and loop.effective_severity.value == "page"
    assert loop.baseline["runs"] == 300 and loop.current["runs"] == 120
    assert 0.30 < loop.baseline["rate"] < 0.45 and loop.current["rate"] > 0.6
    assert checks[AlertKind.repeated_call_rate].breach
    assert not checks[AlertKind.undeclared_call_rate].breach  # no contract declares tools here
    # Through the analyzer: one alert per kind and release, the retry loop paging once confirmed.
    config = AnalyzerConfig(window=HOUR)
    for minutes in (0, 5):
        _, alerts = analyze_once(store, config, start + HOUR + timedelta(minutes=minutes))
    loops = [a for a in alerts if a.kind is AlertKind.retry_loop_rate]
    assert [(a.field, a.value, a.severity.value, a.state.value) for a in loops] == [
        (RUN_FIELD, "2.0", "page", "firing")
    ]


# 5 seeds by default, all 20 in the slow run
@pytest.mark.parametrize("seed", [*range(5), *(pytest.param(s, marks=pytest.mark.slow) for s in range(5, 20))])
def test_steady_runs_under_a_new_release_raise_nothing(store: Store, seed: int) -> None:
    baseline(store, seed=1000 + seed)
    start = T0 + 24 * HOUR
    add_runs(store, start, "1.1", 150, random.Random(seed))
    judge_complete_runs(store, idle=IDLE, now=start + 2 * HOUR)
    checks = run_checks_of(store, start + HOUR)
    assert len(checks) == 4
    assert [c.kind for c in checks if c.breach] == []


def test_runs_are_judged_once_and_only_when_complete(store: Store) -> None:
    add_runs(store, T0, "1.0", 10, random.Random(1))
    assert judge_complete_runs(store, idle=IDLE, now=T0 + HOUR + IDLE / 2) == (0, 0)  # not idle long enough
    judged, _ = judge_complete_runs(store, idle=IDLE, now=T0 + 2 * HOUR)
    assert judged == 10
    assert judge_complete_runs(store, idle=IDLE, now=T0 + 3 * HOUR) == (0, 0)
    assert sum(r.runs for r in store.run_rollups(T0, T0 + HOUR)) == 10


def test_mined_cases_are_bounded_per_rule_and_day_and_the_rest_counted(store: Store) -> None:
    add_runs(store, T0, "2.0", 30, random.Random(3), make=looping_calls)
    judged, queued = judge_complete_runs(store, idle=IDLE, cases_per_rule_day=4, now=T0 + 2 * HOUR)
    assert (judged, queued) == (30, 8)  # 4 retry loops, 4 repeated calls
    cases = store.case_rows()
    assert sorted({c.rule for c in cases}) == ["repeated_call", "retry_loop"]
    assert all(c.state == "open" and c.agent_release == "2.0" for c in cases)
    assert store.cases_over() == {"repeated_call": 26, "retry_loop": 26}


def test_signals_of_one_run() -> None:
    steps = [
        _step("r", 0, T0, StepKind.tool_call, "1", "search", {"q": 1}),
        _step("r", 1, T0, StepKind.tool_call, "1", "search", {"q": 1}),
        _step("r", 2, T0, StepKind.tool_call, "1", "refund", {"id": 2}),
        _step("r", 3, T0, StepKind.tool_call, "1", "human_agent", {}),
        _step("r", 4, T0, StepKind.output, "1", None, None),
    ]
    s = run_signals(steps, declared=frozenset({"search", "human_agent"}), handoff_tools=["human_agent"])
    assert s is not None
    assert (s.tool_calls, s.retry_loop, s.repeated_call, s.undeclared, s.handoff) == (
        4,
        None,
        "search",
        ("refund",),
        ("human_agent",),
    )
    # three different calls to one tool are a loop by count, not a repeat
    loop = [_step("r", i, T0, StepKind.tool_call, "1", "search", {"q": i}) for i in range(3)]
    s = run_signals(loop)
    assert s is not None and (s.retry_loop, s.repeated_call) == ("search", None)
    assert run_signals([_step("r", 0, T0, StepKind.tool_execution, "1", "search", None)]) is not None


def test_outputs_breaking_their_contract_and_handoffs_are_mined(store: Store) -> None:
    from shapewatch.collector import register_contract

    schema = {
        "type": "object",
        "properties": {"status": {"enum": ["confirmed", "pending"]}, "count": {"type": "integer"}},
        "required": ["status", "count"],
    }
    register_contract(store, "booking", "1", schema, author="ana")
    rng = random.Random(5)
    add_runs(store, T0, "1.0", 4, rng, make=lambda r: [{"id": "x"}])
    # one more run whose output breaks the contract (no count) and that hands off to a person
    run_id = "broken-run"
    t = T0 + timedelta(minutes=30)
    steps = [
        _step(run_id, 0, t, StepKind.tool_call, "1.0", "human_agent", {"why": "angry"}),
        _step(run_id, 1, t + timedelta(milliseconds=5), StepKind.output, "1.0", None, None),
    ]
    store.record_run_steps(steps, now=T0 + HOUR)
    env = {
        "event_id": f"{run_id}:1",
        "ts": (t + timedelta(milliseconds=5)).isoformat(),
        "model": "gpt-4o",
        "prompt_version": "booking-v2",
        "contract": "booking",
        "contract_version": "1",
        "output": {"status": "lost"},
    }
    store.write_batch([validate_envelope(env, Limits())])
    judged, queued = judge_complete_runs(store, idle=IDLE, handoff_tools=["human_agent"], now=T0 + 2 * HOUR)
    assert (judged, queued) == (5, 2)
    assert sorted((c.rule, c.run_id, c.detail) for c in store.case_rows()) == [
        ("handoff", run_id, "handed off to a human: human_agent"),
        ("invalid_output", run_id, "an output breaks its contract: booking@1"),
    ]


def test_old_runs_are_purged_with_their_steps_and_their_counts_stay(store: Store) -> None:
    add_runs(store, T0, "1.0", 3, random.Random(9))
    add_runs(store, T0 + 48 * HOUR, "1.0", 2, random.Random(10))
    judge_complete_runs(store, idle=IDLE, now=T0 + 72 * HOUR)
    old = [r.run_id for r in store.recent_runs() if r.last_received < T0 + 24 * HOUR]
    assert len(old) == 3
    assert store.purge_runs(T0 + 24 * HOUR) == 3
    assert [store.run(r) for r in old] == [None, None, None]
    assert all(store.run_steps(r) == [] for r in old)
    assert len(store.recent_runs()) == 2
    assert sum(r.runs for r in store.run_rollups(T0, T0 + 72 * HOUR)) == 5
