"""A field's series (``GET /v1/cohorts/{id}/series``, ``admin.field_series``) reads its steps in one
grouped read; what it answers is exactly what it answered when it read each step as a window
profile of its own (``read_profile`` per step), on the same store: minute, hour and day buckets,
against a baseline, with values, numbers, booleans, arrays and contract violations."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from harness import make_envelope

from shapewatch.analysis import admin
from shapewatch.analysis.alerts import ALERTS_SCHEMA
from shapewatch.analysis.config import AnalyzerConfig
from shapewatch.baselines import BASELINES_SCHEMA, Cohort, freeze_baseline
from shapewatch.collector import Profile, Store, read_profile, register_contract
from shapewatch.collector.envelope import LIMITS, parse_envelope
from shapewatch.collector.tiers import TierPolicy

T0 = datetime(2026, 11, 25, 0, 0, tzinfo=UTC)
SPAN = timedelta(days=5)
COHORT = Cohort("gpt-4o", "triage-v2", "intake")
SCHEMA = {
    "type": "object",
    "required": ["intent"],
    "properties": {"intent": {"type": "string", "enum": ["refund", "billing", "other"]}},
}


def _output(rnd: random.Random, late: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "intent": rnd.choice(["refund", "billing", "other"] + (["URGENT"] if late else [])),
        "entities": [{"type": rnd.choice(["order", "person"]), "score": rnd.choice([1, 2.5, 40])}] * rnd.randint(0, 3),
        "flagged": rnd.choice([True, False]),
        "latency_ms": rnd.randrange(0, 5000) if not late else str(rnd.randrange(0, 5000)),
    }
    if rnd.random() < (0.3 if late else 0.9):
        out["customer"] = {"tier": rnd.choice(["gold", "free"])}
    if late and rnd.random() < 0.2:
        del out["intent"]
    return out


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    path: Path = tmp_path_factory.mktemp("series") / "series.duckdb"
    s = Store.open(path, schemas=[BASELINES_SCHEMA, ALERTS_SCHEMA], tiers=TierPolicy())
    register_contract(s, "intake", "3", SCHEMA)
    rnd = random.Random(7)
    envelopes = []
    for i in range(1200):
        ts = T0 + timedelta(seconds=rnd.randrange(0, int(SPAN.total_seconds())))
        raw = make_envelope(
            event_id=f"e{i}",
            ts=ts.isoformat(),
            model=COHORT.model,
            served_model=COHORT.model,
            prompt_version=COHORT.prompt_version,
            contract=COHORT.contract,
            output=_output(rnd, late=ts > T0 + SPAN - timedelta(hours=12)),
        )
        envelopes.append(parse_envelope(orjson.dumps(raw), LIMITS))
    # 30 codes twice each in one minute: a tie across the top-20 cut of a step's values
    tied = T0 + SPAN - timedelta(hours=2)
    for i in range(60):
        raw = make_envelope(
            event_id=f"code{i}",
            ts=(tied + timedelta(seconds=i)).isoformat(),
            model=COHORT.model,
            served_model=COHORT.model,
            prompt_version=COHORT.prompt_version,
            contract=COHORT.contract,
            output={**_output(rnd, late=False), "code": f"c{29 - i % 30:02d}"},
        )
        envelopes.append(parse_envelope(orjson.dumps(raw), LIMITS))
    for i in range(0, len(envelopes), 100):
        s.write_batch(envelopes[i : i + 100])
    s.flush_rollups()
    s.fold_tiers()
    freeze_baseline(s, COHORT, T0, T0 + timedelta(days=2), author="ana", note="reference", now=T0 + SPAN)
    yield s
    s.close()


def _one_by_one(store: Store, cohort_id: int, edges: Sequence[datetime], paths: Sequence[str] | None) -> list[Profile]:
    """How the series read its steps before: a whole window profile per step."""
    return [read_profile(store, cohort_id, lo, hi) for lo, hi in itertools.pairwise(edges)]


@pytest.mark.parametrize(
    "path", ["customer.tier", "intent", "entities", "entities[].score", "flagged", "latency_ms", "code"]
)
@pytest.mark.parametrize(
    ("since", "until", "points"),
    [
        (T0 + SPAN - timedelta(hours=24), T0 + SPAN, 24),  # the field page's default
        (T0 - timedelta(hours=5), T0 + SPAN, 42),  # across day, hour and minute buckets
        (T0 + SPAN - timedelta(hours=13, minutes=7), T0 + SPAN, 200),  # a linked period, finer steps
    ],
)
def test_the_series_is_what_one_window_per_step_gave(
    store: Store, monkeypatch: pytest.MonkeyPatch, path: str, since: datetime, until: datetime, points: int
) -> None:
    cid = store.cohort_id(*COHORT)
    assert cid is not None
    grouped = admin.field_series(store, AnalyzerConfig(), cid, path, since=since, until=until, points=points)
    with monkeypatch.context() as m:
        m.setattr(admin, "read_step_profiles", _one_by_one)
        before = admin.field_series(store, AnalyzerConfig(), cid, path, since=since, until=until, points=points)
    assert grouped == before
    assert len(grouped["series"]) == points and sum(p["units"] for p in grouped["series"]) > 0
    assert grouped["baseline"] is not None and grouped["baseline"]["present"] == (path != "code")  # code is new


def test_the_comparison_sees_drift_values_and_violations(store: Store) -> None:
    """What the equality above covers: the late hours drift, break the contract and add a value."""
    cid = store.cohort_id(*COHORT)
    assert cid is not None
    doc = admin.field_series(
        store, AnalyzerConfig(), cid, "intent", since=T0 + SPAN - timedelta(days=1), until=T0 + SPAN
    )
    assert any(p["unknown_share"] for p in doc["series"]) and any(p["violation_rate"] for p in doc["series"])
    assert any("URGENT" in p["values"] for p in doc["series"])
    tier = admin.field_series(
        store, AnalyzerConfig(), cid, "customer.tier", since=T0 + SPAN - timedelta(days=1), until=T0 + SPAN
    )
    rates = [p["presence_rate"] for p in tier["series"] if p["presence_rate"] is not None]
    assert max(rates) > 0.7 and min(rates) < 0.5


def test_a_step_gives_its_twenty_most_frequent_values_ties_by_value(store: Store) -> None:
    cid = store.cohort_id(*COHORT)
    assert cid is not None
    until = T0 + SPAN
    doc = admin.field_series(store, AnalyzerConfig(), cid, "code", since=until - timedelta(hours=24), until=until)
    (step,) = [p for p in doc["series"] if p["values"]]
    assert step["values"] == {f"c{i:02d}": 2 for i in range(20)}  # 30 tied: the first 20 by value
    assert list(step["values"]) == [f"c{i:02d}" for i in range(20)]
