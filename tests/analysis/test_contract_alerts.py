"""Contract checks in the analyzer (issue 6, item 3): the share of outputs breaking their registered
contract at a path is a monitored series with its own alert kind, ``schema_violation``, and a
contract's declared enum is the known set of its field (the unknown bucket).

Real DuckDB files, the real ingest path (outputs checked as they are stored) and the real analyzer;
expected shares are computed from the outputs written.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from harness import make_envelope
from synth import CONTRACT, MODEL, PROMPT, synth_outputs

from shapewatch.analysis.alerts import ALERTS_SCHEMA
from shapewatch.analysis.analyzer import analyze_once, evaluate
from shapewatch.analysis.config import AnalyzerConfig
from shapewatch.baselines import BASELINES_SCHEMA, Cohort, freeze_baseline
from shapewatch.collector import Store, register_contract
from shapewatch.collector.envelope import LIMITS, parse_envelope

T0 = datetime(2026, 11, 1, tzinfo=UTC)
DAY = timedelta(days=1)
COHORT = Cohort(MODEL, PROMPT, CONTRACT)
SCHEMA = {
    "type": "object",
    "required": ["intent", "priority"],
    "properties": {
        "intent": {"type": "string"},
        "priority": {"type": "string", "enum": ["low", "medium", "high", "urgent"]},
    },
}


def write(store: Store, outputs: list[dict[str, Any]], day: int, version: str | None = "3") -> None:
    start = T0 + day * DAY + timedelta(hours=6)
    envs = [
        parse_envelope(
            orjson.dumps(
                make_envelope(
                    event_id=f"{day}-{version}-{i}",
                    ts=(start + timedelta(seconds=i % 1200)).isoformat(),
                    model=MODEL,
                    served_model=MODEL,
                    prompt_version=PROMPT,
                    contract=CONTRACT,
                    contract_version=version,
                    output=o,
                )
            ),
            LIMITS,
        )
        for i, o in enumerate(outputs)
    ]
    for i in range(0, len(envs), 2000):
        store.write_batch(envs[i : i + 2000])


def without(outputs: list[dict[str, Any]], key: str, share: float, seed: int) -> list[dict[str, Any]]:
    rnd = random.Random(seed)
    return [{k: v for k, v in o.items() if k != key} if rnd.random() < share else o for o in outputs]


def with_priority(outputs: list[dict[str, Any]], value: str, share: float, seed: int) -> list[dict[str, Any]]:
    rnd = random.Random(seed)
    return [{**o, "priority": value} if rnd.random() < share else o for o in outputs]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(tmp_path / "c.duckdb", schemas=[BASELINES_SCHEMA, ALERTS_SCHEMA]) as s:
        register_contract(s, CONTRACT, "3", SCHEMA)
        write(s, synth_outputs(1, 4_000), day=0)
        freeze_baseline(s, COHORT, T0, T0 + DAY, author="ana", note="contract v3 reference", now=T0 + DAY)
        yield s


def brief(alerts: list[Any]) -> list[tuple[str, str, str | None, str]]:
    return sorted((a.field, a.kind.value, a.value, a.severity.value) for a in alerts)


def test_outputs_breaking_the_contract_page_before_presence_moves_a_tolerance(store: Store) -> None:
    outputs = without(synth_outputs(2, 3_000), "intent", 0.06, seed=3)
    missing = sum("intent" not in o for o in outputs)
    write(store, outputs, day=6)
    evaluation, alerts = analyze_once(store, AnalyzerConfig(), T0 + 7 * DAY)
    # six points of presence is under the presence tolerance; six points of violations is not
    assert brief(alerts) == [("intent", "schema_violation", None, "page")]
    a = alerts[0]
    assert a.diff["baseline"] == {"violation_rate": 0.0, "samples": 4_000}
    assert a.diff["current"] == {
        "violation_rate": round(missing / 3_000, 6),
        "samples": 3_000,
        "keywords": {"required": missing},
    }
    # its samples are outputs without intent
    rows = store.query("SELECT output FROM events WHERE list_contains(?, event_id)", [list(a.samples)])
    assert len(rows) == len(a.samples) > 0 and all("intent" not in orjson.loads(r[0]) for r in rows)
    (report,) = evaluation.cohorts
    assert (report.events, report.baseline_id is not None) == (3_000, True)


def test_declared_enum_values_are_known_and_others_are_unknown(store: Store) -> None:
    declared = with_priority(synth_outputs(4, 3_000), "urgent", 0.15, seed=5)  # in the contract's enum
    write(store, declared, day=6)
    checks = {
        (c.field, c.kind.value, c.value): c
        for r in evaluate(store, AnalyzerConfig(), T0 + 7 * DAY).cohorts
        for c in r.checks
    }
    # a declared value is no new enum value and not unknown; the shares moved, which type rules do not judge
    assert ("priority", "new_enum_value", "urgent") not in checks
    unknown = checks[("priority", "unknown_enum_growth", None)]
    assert (unknown.baseline["unknown_share"], unknown.current["unknown_share"], unknown.breach) == (0.0, 0.0, False)
    assert "urgent" in unknown.baseline["known"]

    undeclared = with_priority(synth_outputs(6, 3_000), "URGENT", 0.15, seed=7)
    write(store, undeclared, day=8)
    _, alerts = analyze_once(store, AnalyzerConfig(), T0 + 9 * DAY)
    assert brief(alerts) == [
        ("priority", "schema_violation", None, "page"),
        ("priority", "unknown_enum_growth", None, "warn"),  # the new value URGENT folded in
    ]


def test_a_baseline_frozen_before_its_contract_expects_no_violation(tmp_path: Path) -> None:
    with Store.open(tmp_path / "late.duckdb", schemas=[BASELINES_SCHEMA, ALERTS_SCHEMA]) as s:
        write(s, synth_outputs(1, 4_000), day=0)  # "3" unregistered yet: nothing checked
        b = freeze_baseline(s, COHORT, T0, T0 + DAY, author="ana", note="before contracts", now=T0 + DAY)
        assert (b.checked, b.violations, "contract_checks" in b.document()) == (0, {}, False)
        register_contract(s, CONTRACT, "3", SCHEMA)
        write(s, without(synth_outputs(2, 3_000), "intent", 0.06, seed=3), day=6)
        _, alerts = analyze_once(s, AnalyzerConfig(), T0 + 7 * DAY)
        assert brief(alerts) == [("intent", "schema_violation", None, "page")]
        assert alerts[0].diff["baseline"] == {"violation_rate": 0.0, "samples": 0}


V4 = {**SCHEMA, "required": ["intent", "priority", "language"]}  # a new required field


def test_the_alert_cohort_review_and_charts_say_which_contract_was_live_and_when_it_changed(store: Store) -> None:
    from shapewatch.analysis import admin
    from shapewatch.analysis.review import build_review, render_markdown

    register_contract(store, CONTRACT, "4", V4)
    write(store, synth_outputs(2, 1_500), day=6)  # 06:00-06:20, still v3
    late = without(synth_outputs(3, 1_500), "language", 0.3, seed=9)  # v4 from 07:00: language often missing
    start = T0 + 6 * DAY + timedelta(hours=7)
    store.write_batch(
        [
            parse_envelope(
                orjson.dumps(
                    make_envelope(
                        event_id=f"v4-{i}",
                        ts=(start + timedelta(seconds=i % 1200)).isoformat(),
                        model=MODEL,
                        served_model=MODEL,
                        prompt_version=PROMPT,
                        contract=CONTRACT,
                        contract_version="4",
                        output=o,
                    )
                ),
                LIMITS,
            )
            for i, o in enumerate(late)
        ]
    )
    at = T0 + 7 * DAY
    _, alerts = analyze_once(store, AnalyzerConfig(), at)
    language = [a for a in alerts if (a.field, a.kind.value) == ("language", "schema_violation")]
    assert len(language) == 1
    contracts = language[0].to_json()["contracts"]
    assert contracts == {
        "window": {"3": 1_500, "4": 1_500},
        "live": "3",
        "baseline": {"3": 4_000},
        "changes": [{"version": "4", "first_seen": start.isoformat()}],
    }

    (cohort,) = admin.cohorts(store, since=at - DAY, until=at)
    assert cohort["contract_versions"] == {"3": 1_500, "4": 1_500}
    series = admin.field_series(
        store, AnalyzerConfig(), cohort["cohort_id"], "language", since=at - DAY, until=at, points=24
    )
    assert series["contract_changes"] == [{"version": "4", "at": start.isoformat().replace("+00:00", "Z")}]
    rates = {item["since"][11:13]: item["violation_rate"] for item in series["series"] if item["violation_rate"]}
    missing = sum("language" not in o for o in late)
    assert rates == {"07": round(missing / 1_500, 6)}  # only the hour v4 went out breaks it

    review = build_review(store, AnalyzerConfig(), now=at, period=timedelta(days=7))
    (entry,) = review["cohorts"]
    k = entry["contracts"]
    assert (k["window"], k["checked"], k["violations"]) == ({"3": 5_500, "4": 1_500}, 7_000, {"language": missing})
    assert k["changes"] == [{"version": "4", "first_seen": start.isoformat().replace("+00:00", "Z")}]
    declared = {r["field"]: r["declared"] for r in entry["fields"]}
    assert declared["intent"] == "required" and declared["customer"] is None
    text = render_markdown(review)
    assert f"**`4` went out {start.isoformat().replace('+00:00', 'Z')}**" in text
    assert f"- outputs breaking the contract: `language` {missing}" in text
