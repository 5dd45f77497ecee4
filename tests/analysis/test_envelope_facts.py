"""What plain envelopes say beyond their outputs, on real databases through the real analyzer:
a ``finish_reason`` that tells a cut, filtered or refused response counts toward the outcome
rates, and envelopes that name a ``run_id`` make runs that are judged like runs from traces.
Baselines keep the outcome counts of their window."""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from synth import CONTRACT, MODEL, PROMPT, synth_outputs, write_outputs

from shapewatch.analysis.analyzer import analyze_once
from shapewatch.analysis.config import AlertKind, AnalyzerConfig
from shapewatch.analysis.outcome_rates import responses
from shapewatch.analysis.runs import RUN_FIELD, judge_complete_runs
from shapewatch.analysis.store_access import SCHEMAS
from shapewatch.baselines import Cohort, freeze_baseline
from shapewatch.baselines.baseline import baseline_from_document
from shapewatch.baselines.errors import BaselineInvalid
from shapewatch.collector import Store
from shapewatch.collector.adapters import finish_outcome
from shapewatch.collector.envelope import Limits, validate_envelope
from shapewatch.collector.otlp import arguments_hash

T0 = datetime(2026, 11, 1, tzinfo=UTC)
DAY = timedelta(days=1)
HOUR = timedelta(hours=1)
COHORT = Cohort(MODEL, PROMPT, CONTRACT)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(tmp_path / "facts.duckdb", schemas=SCHEMAS) as s:
        yield s


# --- finish reasons as outcomes -------------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "kind"),
    [
        ("length", "output:truncated"),
        ("MAX_TOKENS", "output:truncated"),
        ("max_tokens", "output:truncated"),
        ("max_output_tokens", "output:truncated"),
        ("content_filter", "output:content_filter"),
        ("SAFETY", "output:content_filter"),
        ("refusal", "output:refusal"),
        ("stop", None),
        ("tool_calls", None),
        ("end_turn", None),
        ("", None),
        (None, None),
    ],
)
def test_finish_reasons_of_every_provider_map_to_one_outcome_kind(reason: str | None, kind: str | None) -> None:
    assert finish_outcome(reason) == kind


def test_an_output_counted_by_its_finish_reason_is_one_response_not_two() -> None:
    assert responses(1_000, {"truncated": 10, "output:truncated": 30, "refusal": 5}) == 1_015


def day_of_outputs(store: Store, day: int, n: int, truncated: int, seed: int) -> None:
    """``n`` outputs on ``day``, the first ``truncated`` of them stored with finish_reason 'length'."""
    start = T0 + day * DAY + timedelta(hours=6)
    write_outputs(
        store,
        synth_outputs(seed, n),
        start,
        HOUR,
        id_prefix=f"d{day}",
        finish_reasons=dict.fromkeys(range(truncated), "length") | {truncated: "stop"},
    )


def judge_truncation(store: Store, base: int, window: int) -> tuple[Any, list[Any]]:
    day_of_outputs(store, 0, 2_000, base, seed=1)
    frozen = freeze_baseline(store, COHORT, T0, T0 + DAY, author="ana", note="reference", now=T0 + DAY)
    assert frozen.outcomes == {"output:truncated": base}
    day_of_outputs(store, 7, 2_000, window, seed=2)
    evaluation, alerts = analyze_once(store, AnalyzerConfig(), T0 + 8 * DAY)
    (report,) = evaluation.cohorts
    return report, alerts


def test_envelopes_cut_at_the_token_limit_rising_from_1_to_8_percent_page_truncation_rate(store: Store) -> None:
    _report, alerts = judge_truncation(store, 20, 160)
    (alert,) = alerts
    j = alert.to_json()
    assert (j["field"], j["kind"], j["severity"], j["state"]) == ("$", "truncation_rate", "page", "firing")
    # 2,000 responses on each side: the truncated outputs are among the outputs, not added to them
    assert j["baseline"] == {"rate": 0.01, "samples": 2_000}
    assert j["current"] == {"rate": 0.08, "samples": 2_000, "outcomes": {"output:truncated": 160}}


def test_envelopes_cut_at_1_3_percent_against_1_raise_nothing(store: Store) -> None:
    report, alerts = judge_truncation(store, 20, 26)
    (check,) = [c for c in report.checks if c.kind is AlertKind.truncation_rate]
    assert (check.effect, check.breach, alerts) == (0.003, False, [])


def test_a_retried_batch_counts_its_finish_reasons_once(store: Store) -> None:
    for _ in range(3):
        day_of_outputs(store, 0, 500, 40, seed=1)
    assert store.outcomes_by_cohort(T0, T0 + DAY) == {store.cohort_id(*COHORT): {"output:truncated": 40}}


def test_an_output_answered_by_another_model_counts_in_both_cohorts(store: Store) -> None:
    start = T0 + timedelta(hours=6)
    write_outputs(
        store, synth_outputs(3, 50), start, HOUR, served_model="gpt-x-2026", finish_reasons={0: "length", 1: "SAFETY"}
    )
    by_id = store.outcomes_by_cohort(T0, T0 + DAY)
    both = {"output:content_filter": 1, "output:truncated": 1}
    assert by_id == {store.cohort_id(*COHORT): both, store.cohort_id("gpt-x-2026", PROMPT, CONTRACT): both}


def test_the_baseline_keeps_its_outcomes_and_refuses_a_document_with_an_unknown_kind(store: Store) -> None:
    day_of_outputs(store, 0, 300, 7, seed=1)
    frozen = freeze_baseline(store, COHORT, T0, T0 + DAY, author="ana", note="reference", now=T0 + DAY)
    doc = frozen.document()
    assert doc["outcomes"] == {"output:truncated": 7}
    assert baseline_from_document(doc) == frozen
    for bad, why in (
        ({"exploded": 1}, "'exploded' is not an outcome kind"),
        ({"truncated": -1}, ""),
        ({"truncated": "7"}, ""),
        ([1], "must be an object"),
    ):
        with pytest.raises(BaselineInvalid) as info:
            baseline_from_document({**doc, "outcomes": bad})
        assert any(f.path.startswith("/outcomes") and why in f.reason for f in info.value.fields), info.value.fields


# --- runs from envelopes --------------------------------------------------------------------


def run_envelopes(run_id: str, release: str, t: datetime, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One run as an application records it: each tool call (finish_reason 'tool_calls'), then the
    structured output of the run's contract."""
    envs = [
        {
            "event_id": f"{run_id}:{i}",
            "ts": (t + timedelta(milliseconds=i)).isoformat(),
            "model": "gpt-4o",
            "prompt_version": "booking-v2",
            "contract": "get_reservation",
            "contract_version": "3",
            "run_id": run_id,
            "agent_release": release,
            "finish_reason": "tool_calls",
            "output": args,
        }
        for i, args in enumerate(calls)
    ]
    envs.append(
        {
            "event_id": f"{run_id}:out",
            "ts": (t + timedelta(milliseconds=50)).isoformat(),
            "model": "gpt-4o",
            "prompt_version": "booking-v2",
            "contract": "booking",
            "contract_version": "4",
            "run_id": run_id,
            "agent_release": release,
            "finish_reason": "stop",
            "output": {"status": "confirmed", "count": len(calls)},
        }
    )
    return envs


def steady(rng: random.Random) -> list[dict[str, Any]]:
    n = rng.choices([1, 2, 3, 4], weights=[33, 30, 27, 10])[0]
    return [{"id": f"R{rng.randrange(10**6)}"} for _ in range(n)]


def write_runs(store: Store, start: datetime, release: str, n: int, make: Any, rng: random.Random) -> None:
    envs = []
    for r in range(n):
        t = start + timedelta(seconds=r * 3600 / n)
        envs += run_envelopes(f"{release}-{start:%d%H}-{r}", release, t, make(rng))
    store.write_batch([validate_envelope(e, Limits()) for e in envs], now=start + HOUR)


def test_envelopes_with_a_run_id_make_runs_and_120_looping_runs_page_retry_loop_rate(store: Store) -> None:
    base = Cohort("gpt-4o", "booking-v2", "booking")
    write_runs(store, T0, "1.0", 300, steady, random.Random(1))
    assert judge_complete_runs(store, idle=timedelta(minutes=5), now=T0 + 2 * HOUR)[0] == 300
    freeze_baseline(store, base, T0, T0 + HOUR, author="ana", note="release 1.0", now=T0 + 2 * HOUR)

    # The case: 120 runs each repeating one identical tool call five times.
    start = T0 + DAY
    write_runs(store, start, "2.0", 120, lambda rng: [{"id": "R1"}] * 5, random.Random(2))
    run = store.run_steps("2.0-0200-7")
    assert [(s.kind, s.tool, s.contract, s.contract_version, s.event_id) for s in run] == [
        *[("tool_call", "get_reservation", "get_reservation", "3", f"2.0-0200-7:{i}") for i in range(5)],
        ("output", None, "booking", "4", "2.0-0200-7:out"),
    ]
    assert {s.args_hash for s in run[:5]} == {arguments_hash({"id": "R1"})}
    assert judge_complete_runs(store, idle=timedelta(minutes=5), now=start + 2 * HOUR)[0] == 120

    config = AnalyzerConfig(window=HOUR)
    for minutes in (0, 5):
        _, alerts = analyze_once(store, config, start + HOUR + timedelta(minutes=minutes))
    by_kind = {a.kind: a for a in alerts if a.field == RUN_FIELD}
    loop = by_kind[AlertKind.retry_loop_rate]
    assert (loop.value, loop.severity.value, loop.state.value) == ("2.0", "page", "firing")
    assert AlertKind.repeated_call_rate in by_kind


def test_a_run_step_is_kept_once_however_often_its_event_is_sent(store: Store) -> None:
    envs = [validate_envelope(e, Limits()) for e in run_envelopes("r-1", "1.0", T0, [{"id": "A"}, {"id": "B"}])]
    for _ in range(3):
        store.write_batch(envs, now=T0 + HOUR)
    assert store.run("r-1").steps == 3  # type: ignore[union-attr]
    # an event that says its step kind outright is taken at its word
    said = run_envelopes("r-2", "1.0", T0, [])[0] | {
        "attributes": {"step": "tool_call", "run_contract": "booking"},
        "contract": "lookup",
        "finish_reason": "stop",
        "output": {"q": 1},
    }
    store.write_batch([validate_envelope(said, Limits())], now=T0 + HOUR)
    (step,) = store.run_steps("r-2")
    assert (step.kind, step.tool, step.run_contract, step.args_hash) == (
        "tool_call",
        "lookup",
        "booking",
        arguments_hash({"q": 1}),
    )


def test_the_weekly_review_shows_number_levels_and_outcome_shares(store: Store) -> None:
    from shapewatch.analysis.review import build_review, render_html, render_markdown

    day_of_outputs(store, 0, 400, 8, seed=1)  # 2% cut at the token limit
    freeze_baseline(store, COHORT, T0, T0 + DAY, author="ana", note="reference", now=T0 + DAY)
    day_of_outputs(store, 3, 400, 40, seed=2)  # 10% in the week
    review = build_review(store, AnalyzerConfig(), now=T0 + 9 * DAY)  # the week holds day 3 only
    (entry,) = review["cohorts"]
    assert entry["outcomes"] == {
        "responses": 400,
        "counts": {"output:truncated": 40},
        "shares": {"output:truncated": 0.1},
    }
    (confidence,) = [r for r in entry["fields"] if r["field"] == "confidence"]
    assert confidence["numbers"][0] is not None and len(confidence["numbers"][0]) == 3
    text = render_markdown(review)
    # every punctuation character of the line escaped, as the review escapes what it prints
    assert "- responses without a usable output: cut at the token limit 10\\.0\\% \\(40\\) of 400 responses" in text
    html = render_html(review)
    assert "responses without a usable output: cut at the token limit 10.0% (40) of 400 responses" in html
    p10, p50, p90 = confidence["numbers"][1]
    assert f"{p10:g}/{p50:g}/{p90:g}" in html


def test_a_probe_suites_envelopes_make_no_agent_run(store: Store) -> None:
    """A probe run's cases are independent first decisions: as steps of one run they would read
    as a run calling tools 30 times."""
    envs = run_envelopes("probe-run-1", "1.0", T0, [{"id": f"A{i}"} for i in range(30)])
    store.write_batch([validate_envelope({**e, "source": "probe"}, Limits()) for e in envs], now=T0 + HOUR)
    assert store.run("probe-run-1") is None
    shadow = run_envelopes("shadow-run-1", "1.0", T0, [{"id": "A"}])
    store.write_batch([validate_envelope({**e, "source": "shadow"}, Limits()) for e in shadow], now=T0 + HOUR)
    assert store.run("shadow-run-1").steps == 2  # type: ignore[union-attr]
