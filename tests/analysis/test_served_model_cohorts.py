"""Each served model behind an alias is analysed as its own cohort too (issue 3, item 7).

A floating alias (``gpt-4o``) is frozen while one snapshot answers it. When a new snapshot
starts answering a tenth of its traffic with a changed output shape, the alias's own cohort
moves less than the tolerance (diluted), while the new snapshot's served cohort, judged against
the alias's baseline, pages. When one snapshot answers all of the alias's traffic, its served
cohort holds the same outputs as the alias and is not judged twice. Real DuckDB files, the real
ingest path and the real analyzer.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest
from synth import NO_DRIFT, Drift, synth_outputs, write_outputs

from shapewatch.analysis.alerts import ALERTS_SCHEMA
from shapewatch.analysis.analyzer import analyze_once, evaluate
from shapewatch.analysis.config import AnalyzerConfig
from shapewatch.baselines import BASELINES_SCHEMA, Cohort, freeze_baseline, resolve_baseline
from shapewatch.collector import Store

ALIAS, OLD, NEW = "gpt-4o", "gpt-4o-2024-08-06", "gpt-4o-2024-11-20"
PV, CONTRACT = "triage-v1", "triage"
A, S_OLD, S_NEW = Cohort(ALIAS, PV, CONTRACT), Cohort(OLD, PV, CONTRACT), Cohort(NEW, PV, CONTRACT)
T0 = datetime(2026, 11, 1, tzinfo=UTC)
DAY, SPAN = timedelta(days=1), timedelta(minutes=20)
DROPPED = Drift(email_presence=0.10)  # the new snapshot rarely fills customer.email (0.70 before)


def write(store: Store, seed: int, n: int, day: int, served: str, drift: Drift = NO_DRIFT, hour: int = 6) -> None:
    write_outputs(
        store,
        synth_outputs(seed, n, drift),
        T0 + day * DAY + timedelta(hours=hour),
        SPAN,
        model=ALIAS,
        served_model=served,
        prompt_version=PV,
        contract=CONTRACT,
        id_prefix=f"{served}/{day}/{hour}/{seed}",
    )


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(tmp_path / "alias.duckdb", schemas=[BASELINES_SCHEMA, ALERTS_SCHEMA]) as s:
        write(s, seed=1, n=4_000, day=0, served=OLD)  # the reference: one snapshot behind the alias
        freeze_baseline(s, A, T0, T0 + DAY, author="ana", note="gpt-4o as of the 2024-08-06 snapshot", now=T0 + DAY)
        yield s


def test_a_new_snapshot_on_a_tenth_of_the_alias_pages_in_its_served_cohort(store: Store) -> None:
    write(store, seed=2, n=2_700, day=6, served=OLD)
    write(store, seed=3, n=300, day=6, served=NEW, drift=DROPPED, hour=7)
    evaluation, alerts = analyze_once(store, AnalyzerConfig(), T0 + 7 * DAY)

    reports = {r.cohort: r for r in evaluation.cohorts}
    assert {c: (r.events, r.served_models, r.how, r.mirror_of) for c, r in reports.items()} == {
        A: (3_000, {OLD: 2_700, NEW: 300}, "own", None),
        S_OLD: (2_700, {OLD: 2_700}, "served_alias", None),
        S_NEW: (300, {NEW: 300}, "served_alias", None),
    }
    # every cohort is judged against the alias's frozen baseline
    assert len({r.baseline_id for r in reports.values()}) == 1
    # the alias moves by a tenth of the change: under the tolerance; the new snapshot pages, and the
    # alias warns that a model it never had answers a tenth of it (served_model_share, 10%)
    assert [(a.cohort, a.field, a.kind.value, a.value, a.severity.value, a.state.value) for a in alerts] == [
        (S_NEW, "customer.email", "presence_drop", None, "page", "firing"),
        (A, "$", "served_model_change", NEW, "warn", "firing"),
    ]
    alert = alerts[0]
    assert alert.diff["compared_with"] == (
        f"baseline {reports[A].baseline_id} of {PV} ({ALIAS}), inherited: the alias this model answered for"
    )
    assert alert.diff["current"]["samples"] == 300
    assert alert.diff["current"]["presence_rate"] < 0.2 < 0.6 < alert.diff["baseline"]["presence_rate"]
    alias_email = next(c for c in reports[A].checks if c.field == "customer.email")
    assert not alias_email.breach and 0.03 < alias_email.effect < 0.10
    # its samples are outputs the new snapshot answered, without customer.email
    rows = store.query(
        "SELECT event_id, served_model, output FROM events WHERE list_contains(?, event_id)", [list(alert.samples)]
    )
    assert len(rows) == len(alert.samples) > 0
    assert {r[1] for r in rows} == {NEW}
    assert all(orjson.loads(r[2]).get("customer", {}).get("email") is None for r in rows)


def test_one_snapshot_answering_all_of_the_alias_is_judged_once(store: Store) -> None:
    write(store, seed=4, n=3_000, day=8, served=NEW, drift=DROPPED)
    evaluation = evaluate(store, AnalyzerConfig(), T0 + 9 * DAY)
    reports = {r.cohort: r for r in evaluation.cohorts}
    assert set(reports) == {A, S_NEW}
    # the served cohort holds the alias's outputs: no checks of its own, its alerts clear
    assert (reports[S_NEW].mirror_of, reports[S_NEW].checks, reports[S_NEW].events) == (A, [], 3_000)
    assert reports[S_NEW].to_json()["mirror_of"] == A._asdict()
    assert reports[S_NEW].compared_with == (f"the same outputs as {A} (the only model behind that alias): judged there")
    # the change is judged (and breaches) in the alias's cohort, as is the snapshot answering all of it
    assert [(c.field, c.kind.value, c.value) for c in reports[A].checks if c.breach] == [
        ("customer.email", "presence_drop", None),
        ("$", "served_model_change", NEW),
    ]


def test_a_served_cohort_with_its_own_baseline_uses_it(store: Store) -> None:
    write(store, seed=5, n=1_000, day=2, served=NEW)
    assert resolve_baseline(store, S_NEW).how == "served_alias"  # type: ignore[union-attr]
    own = freeze_baseline(
        store, S_NEW, T0 + 2 * DAY, T0 + 3 * DAY, author="ana", note="the new snapshot", now=T0 + 3 * DAY
    )
    resolved = resolve_baseline(store, S_NEW)
    assert resolved is not None and (resolved.how, resolved.baseline.baseline_id) == ("own", own.baseline_id)
    # a snapshot that never answered the alias inherits nothing from it
    assert resolve_baseline(store, Cohort("gpt-4o-2099-01-01", PV, CONTRACT)) is None
