"""The store's read API (``collector/store/reads.py``) against a real DuckDB file: what the rest
of shapewatch reads instead of running SQL, as whole values, and that ``Store`` offers every
operation of ``StoreBackend``, the boundary a second backend implements."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

from shapewatch.collector.envelope import LIMITS, Envelope, parse_envelope
from shapewatch.collector.store import ALERTS_SCHEMA, AnalyzerRun, CohortRow, Store, StoreBackend, StoredEvent

MakeEnvelope = Callable[..., dict[str, Any]]
T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
DAY = timedelta(days=1)
ALIAS, SNAPSHOT = "claude-sonnet-4-5", "claude-sonnet-4-5-20250929"


def parse(raw: dict[str, Any]) -> Envelope:
    return parse_envelope(orjson.dumps(raw), LIMITS)


def at(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def seed(store: Store, envelope: MakeEnvelope) -> None:
    """Two cohorts: the alias (answered by its snapshot from day 1 on, before that by itself) and
    another prompt version, on two days."""
    rows = [
        envelope(event_id="a0", ts=at(T0), model=ALIAS, served_model=ALIAS, contract_version="3"),
        envelope(event_id="a1", ts=at(T0 + DAY), model=ALIAS, served_model=SNAPSHOT, contract_version="3"),
        envelope(
            event_id="a2",
            ts=at(T0 + DAY + timedelta(minutes=5)),
            model=ALIAS,
            served_model=SNAPSHOT,
            contract_version=None,
        ),
        envelope(event_id="b0", ts=at(T0 + timedelta(minutes=1)), model=ALIAS, prompt_version="v4", served_model=None),
    ]
    store.write_batch([parse(r) for r in rows])
    store.flush_rollups()


def test_store_implements_every_operation_of_the_boundary(store: Store) -> None:
    declared = {n for n in vars(StoreBackend) if not n.startswith("_")} | set(StoreBackend.__annotations__)
    assert len(declared) > 60
    assert sorted(n for n in declared if not hasattr(store, n)) == []
    # the methods take the parameters the boundary names
    for name in sorted(declared):
        member = getattr(StoreBackend, name, None)
        if inspect.isfunction(member):
            want = list(inspect.signature(member).parameters)
            assert list(inspect.signature(getattr(Store, name)).parameters) == want, name


def test_cohorts_are_read_by_id_and_by_names(store: Store, envelope: MakeEnvelope) -> None:
    seed(store, envelope)
    rows = store.cohorts()
    ids = {(r.model, r.prompt_version): r.cohort_id for r in rows}
    assert rows == [
        CohortRow(ids[(ALIAS, "intake-v3")], ALIAS, "intake-v3", "intake", T0),
        CohortRow(ids[(ALIAS, "v4")], ALIAS, "v4", "intake", T0 + timedelta(minutes=1)),
        CohortRow(ids[(SNAPSHOT, "intake-v3")], SNAPSHOT, "intake-v3", "intake", T0 + DAY),  # the served cohort
    ]
    assert [store.cohort(r.cohort_id) for r in rows] == rows
    assert store.cohort(max(ids.values()) + 1) is None
    assert store.cohort_id(ALIAS, "v4", "intake") == ids[(ALIAS, "v4")]
    assert store.cohort_id(ALIAS, "v5", "intake") is None
    # the served cohort has no raw event requested under its own id
    assert store.requested_cohort_ids() == {ids[(ALIAS, "intake-v3")], ids[(ALIAS, "v4")]}


def test_window_counts(store: Store, envelope: MakeEnvelope) -> None:
    seed(store, envelope)
    ids = {(r.model, r.prompt_version): r.cohort_id for r in store.cohorts()}
    alias, v4, snap = ids[(ALIAS, "intake-v3")], ids[(ALIAS, "v4")], ids[(SNAPSHOT, "intake-v3")]
    assert store.events_by_cohort(T0, T0 + 2 * DAY) == {alias: 3, v4: 1, snap: 2}
    assert store.events_by_cohort(T0 + DAY, T0 + 2 * DAY) == {alias: 2, snap: 2}
    assert store.events_by_day(alias, T0 - DAY, T0 + 3 * DAY) == {"2026-11-29": 1, "2026-11-30": 2}
    assert store.served_by_cohort(T0, T0 + 2 * DAY) == {alias: {SNAPSHOT: 2, ALIAS: 1}, snap: {SNAPSHOT: 2}}
    assert store.contract_versions_by_cohort(T0, T0 + 2 * DAY) == {
        alias: {"3": 2, "": 1},
        v4: {"3": 1},
        snap: {"3": 1, "": 1},
    }
    assert store.outcomes_by_cohort(T0, T0 + 2 * DAY) == {}
    assert store.served_aliases() == [(SNAPSHOT, "intake-v3", "intake", ALIAS, "production")]
    # the alias moved from itself to the snapshot on day 1
    assert store.served_model_moves(T0 + DAY, T0 + 2 * DAY) == [(ALIAS, "intake-v3", "intake", ALIAS, SNAPSHOT)]
    assert store.served_model_moves(T0, T0 + DAY) == []
    window = store.window_rollups(T0, T0 + 2 * DAY, alias)
    assert window.events == {alias: 3}
    assert window.served == {alias: {SNAPSHOT: 2, ALIAS: 1}}
    # (cohort, path, scope, present, null, boolean, integer, number, string, array, object, long, overflow,
    #  true, booleans whose trues are known)
    number, string, array, obj = (
        (0, 0, 0, 3, 0, 0, 0),
        (0, 0, 0, 0, 3, 0, 0),
        (0, 0, 0, 0, 0, 3, 0),
        (0, 0, 0, 0, 0, 0, 3),
    )
    assert window.fields == [
        (alias, "confidence", None, 3, *number, 0, 0, 0, 0),
        (alias, "customer", None, 3, *obj, 0, 0, 0, 0),
        (alias, "customer.id", None, 3, *string, 0, 0, 0, 0),
        (alias, "customer.tier", None, 3, *string, 0, 0, 0, 0),
        (alias, "entities", None, 3, *array, 0, 0, 0, 0),
        (alias, "entities[]", "entities", 3, *obj, 0, 0, 0, 0),
        (alias, "entities[].type", "entities", 3, *string, 0, 0, 0, 0),
        (alias, "entities[].value", "entities", 3, *string, 0, 0, 0, 0),
        (alias, "intent", None, 3, *string, 0, 0, 0, 0),
        (alias, "priority", None, 3, *string, 0, 0, 0, 0),
        (alias, "tags", None, 3, *array, 0, 0, 0, 0),
        (alias, "tags[]", "tags", 3, *string, 0, 0, 0, 0),
    ]
    assert window.lengths == {(alias, "entities"): {1: 3}, (alias, "tags"): {1: 3}}
    assert window.values[(alias, "intent")] == {"refund": 3}
    assert store.window_rollups(T0, T0 + 2 * DAY, alias, numbers=False).numbers == {}
    assert store.window_rollups(T0, T0 + 2 * DAY, alias).numbers[(alias, "confidence")] != {}


def test_raw_events_by_id_and_newest_first(store: Store, envelope: MakeEnvelope) -> None:
    seed(store, envelope)
    output = orjson.dumps(envelope()["output"]).decode()
    ids = {(r.model, r.prompt_version): r.cohort_id for r in store.cohorts()}
    assert store.events_by_id(["b0", "a0", "nope"]) == [
        StoredEvent("a0", T0, ALIAS, "intake-v3", "intake", ALIAS, "3", "production", output),
        StoredEvent("b0", T0 + timedelta(minutes=1), ALIAS, "v4", "intake", None, "3", "production", output),
    ]
    alias, snap = ids[(ALIAS, "intake-v3")], ids[(SNAPSHOT, "intake-v3")]
    assert store.recent_outputs(alias, T0, T0 + 2 * DAY, 2) == [("a2", output, None), ("a1", output, "3")]
    # a served cohort's raw events are those of the alias it answered
    assert store.recent_outputs(snap, T0, T0 + 2 * DAY, 10) == [("a2", output, None), ("a1", output, "3")]
    assert store.contract_versions_of_events(alias, T0, T0 + 2 * DAY) == {"3": 2, "": 1}
    assert store.contract_versions_of_events(alias, T0 + DAY, T0 + 2 * DAY) == {"3": 1, "": 1}


def test_analyzer_runs_newest_first(tmp_path: Path) -> None:
    """The read behind GET /v1/analyzer/runs; the runs are written as the analyzer does."""
    with Store.open(tmp_path / "runs.duckdb", schemas=[ALERTS_SCHEMA]) as store:
        assert store.analyzer_runs(5) == []
        for i in range(3):
            with store.transaction("recording an evaluation") as con:
                t = T0 + timedelta(minutes=i)
                store.add_analyzer_run(con, [t, t, t, i != 1, "boom" if i == 1 else None, 0.5, i, 2 * i, 0, None])
        assert store.analyzer_runs(2) == [
            AnalyzerRun(3, T0 + timedelta(minutes=2), T0 + timedelta(minutes=2), True, None, 0.5, 2, 4, 0),
            AnalyzerRun(2, T0 + timedelta(minutes=1), T0 + timedelta(minutes=1), False, "boom", 0.5, 1, 2, 0),
        ]
