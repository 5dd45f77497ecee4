"""The source is part of the cohort (issue 25, item 1): probe and shadow traffic never pools with
production, and each has its own baseline, alerts and series.

Before, 600 production and 600 drifted probe outputs of one model and prompt version landed in
one cohort and production paged. Real DuckDB files, the real ingest path and the real analyzer.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from synth import NO_DRIFT, Drift, synth_outputs, write_outputs

from shapewatch.analysis.alerts import ALERTS_SCHEMA
from shapewatch.analysis.analyzer import analyze_once
from shapewatch.analysis.config import AnalyzerConfig
from shapewatch.baselines import BASELINES_SCHEMA, Cohort, freeze_baseline, list_baselines, resolve_baseline
from shapewatch.collector import Store

MODEL, PV, CONTRACT = "gpt-4o-2024-08-06", "triage-v1", "triage"
PROD, PROBE = Cohort(MODEL, PV, CONTRACT), Cohort(MODEL, PV, CONTRACT, "probe")
T0 = datetime(2026, 11, 1, tzinfo=UTC)
DAY, SPAN = timedelta(days=1), timedelta(minutes=20)
DROPPED = Drift(email_presence=0.10)  # customer.email filled 70% of the time before


def write(store: Store, seed: int, n: int, day: int, source: str | None, drift: Drift = NO_DRIFT) -> None:
    write_outputs(
        store,
        synth_outputs(seed, n, drift),
        T0 + day * DAY + timedelta(hours=6),
        SPAN,
        model=MODEL,
        prompt_version=PV,
        contract=CONTRACT,
        source=source,
        id_prefix=f"{source}/{day}/{seed}",
    )


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(tmp_path / "sources.duckdb", schemas=[BASELINES_SCHEMA, ALERTS_SCHEMA]) as s:
        # production sent without a source (the default) and as "production": one cohort
        write(s, seed=1, n=3_000, day=0, source=None)
        write(s, seed=2, n=1_000, day=0, source="production")
        write(s, seed=3, n=600, day=0, source="probe")
        freeze_baseline(s, PROD, T0, T0 + DAY, author="ana", note="production", now=T0 + DAY)
        freeze_baseline(s, PROBE, T0, T0 + DAY, author="ana", note="probe suite", now=T0 + DAY)
        yield s


def test_drifted_probe_traffic_alerts_in_its_own_cohort_and_production_stays_quiet(store: Store) -> None:
    write(store, seed=4, n=600, day=6, source="production")
    write(store, seed=5, n=600, day=6, source="probe", drift=DROPPED)
    evaluation, alerts = analyze_once(store, AnalyzerConfig(), T0 + 7 * DAY)

    reports = {r.cohort: r for r in evaluation.cohorts}
    assert {c: (r.events, r.how) for c, r in reports.items()} == {PROD: (600, "own"), PROBE: (600, "own")}
    # each judged against its own baseline: production's holds 4,000 outputs, the probe's 600
    baselines = {b.baseline.cohort: b.baseline for b in list_baselines(store)}
    assert {c: b.samples for c, b in baselines.items()} == {PROD: 4_000, PROBE: 600}
    assert {c: r.baseline_id for c, r in reports.items()} == {c: b.baseline_id for c, b in baselines.items()}
    assert [(a.cohort, a.field, a.kind.value, a.severity.value) for a in alerts] == [
        (PROBE, "customer.email", "presence_drop", "page")
    ]
    doc = alerts[0].to_json()
    assert doc["cohort"] == {"model": MODEL, "prompt_version": PV, "contract": CONTRACT, "source": "probe"}
    # production's alerts, read per cohort, are none
    assert store.alert_rows(cohort=PROD) == []


def test_cohorts_are_listed_production_first_and_ids_are_per_source(store: Store) -> None:
    rows = store.cohorts()
    assert [(r.model, r.prompt_version, r.contract, r.source) for r in rows] == [
        (MODEL, PV, CONTRACT, "production"),
        (MODEL, PV, CONTRACT, "probe"),
    ]
    assert store.cohort_id(MODEL, PV, CONTRACT) == rows[0].cohort_id
    assert store.cohort_id(MODEL, PV, CONTRACT, "probe") == rows[1].cohort_id
    assert store.cohort_id(MODEL, PV, CONTRACT, "shadow") is None
    # the events table keeps each event's source as sent (None when absent)
    assert dict(store.query("SELECT coalesce(source, 'none'), count(*) FROM events GROUP BY ALL")) == {
        "none": 3_000,
        "production": 1_000,
        "probe": 600,
    }


def test_a_probe_cohort_never_inherits_production_s_baseline_by_prompt_version(store: Store) -> None:
    # a new prompt version of the probe inherits from the probe's previous one, never production's
    write_outputs(
        store, synth_outputs(6, 50), T0 + 2 * DAY, SPAN, model=MODEL, prompt_version="triage-v2",
        contract=CONTRACT, source="probe", id_prefix="v2",
    )  # fmt: skip
    resolved = resolve_baseline(store, Cohort(MODEL, "triage-v2", CONTRACT, "probe"))
    assert resolved is not None and (resolved.how, resolved.baseline.cohort) == ("previous_prompt_version", PROBE)
    assert resolve_baseline(store, Cohort(MODEL, "triage-v2", CONTRACT)) is None
