"""Served cohorts: an output requested under one model id (an alias) and answered by another
counts in its own cohort and in the cohort of the model that answered (same prompt version and
contract), so each served model can be analysed on its own.

On real DuckDB files: the served cohort's rollups equal those of the same outputs requested
under the served model directly; the alias cohort keeps every output once; pinned requests and
outputs without a served model add nothing; the ``cohort_events`` view lists the raw outputs of
every cohort the same way (so a recomputation from raw outputs matches); deferred merges and the
recovery after a crash give the same counts.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson
from harness import make_envelope
from test_store import rollup_sums

from shapewatch.collector import Store, served_aliases
from shapewatch.collector.envelope import LIMITS, Envelope, parse_envelope

ALIAS, OLD, NEW = "gpt-4o", "gpt-4o-2024-08-06", "gpt-4o-2024-11-20"
PV, CONTRACT = "triage-v1", "triage"


def _output(rnd: random.Random) -> dict[str, Any]:
    out: dict[str, Any] = {
        "priority": rnd.choice(["low", "high"]),
        "score": rnd.choice([0.5, 0.75, 12.5]),
        "items": [{"k": rnd.choice("ab")} for _ in range(rnd.randint(0, 3))],
    }
    if rnd.random() < 0.5:
        out["tier"] = rnd.choice(["gold", None])
    return out


Row = tuple[str, str, dict[str, Any], str, str | None]  # event id, ts, output, requested model, served model


def traffic(seed: int = 3) -> dict[str, list[Row]]:
    """Outputs by kind, over three one-minute buckets."""
    rnd = random.Random(seed)
    counts = {
        "alias_old": (ALIAS, OLD, 40),
        "alias_new": (ALIAS, NEW, 25),
        "pinned_old": (OLD, OLD, 30),
        "alias_unknown": (ALIAS, None, 10),
    }
    return {
        kind: [
            (f"{kind}-{i}", f"2026-11-29T12:0{rnd.randrange(3)}:{rnd.randrange(60):02d}Z", _output(rnd), model, served)
            for i in range(n)
        ]
        for kind, (model, served, n) in counts.items()
    }


def envelopes(kinds: dict[str, list[Row]], *names: str) -> list[Envelope]:
    return [
        parse_envelope(
            orjson.dumps(
                make_envelope(
                    event_id=event_id,
                    ts=ts,
                    model=model,
                    served_model=served,
                    prompt_version=PV,
                    contract=CONTRACT,
                    output=output,
                )
            ),
            LIMITS,
        )
        for name in names
        for event_id, ts, output, model, served in kinds[name]
    ]


def cohort_sums(store: Store, model: str) -> dict[str, dict[tuple[Any, ...], tuple[int, ...]]]:
    """The rollup sums of one (model, PV, CONTRACT) cohort, keys without the cohort's name."""
    return {
        table: {k[3:]: v for k, v in rows.items() if k[:3] == (model, PV, CONTRACT)}
        for table, rows in rollup_sums(store).items()
    }


def events_per_cohort(store: Store, table: str) -> dict[str, int]:
    return dict(store.query(f"SELECT c.model, count(*) FROM {table} JOIN cohorts c USING (cohort_id) GROUP BY ALL"))


def test_an_alias_answered_by_two_models_counts_in_each_served_cohort(tmp_path: Path) -> None:
    kinds = traffic()
    with Store.open(tmp_path / "a.duckdb") as store:
        store.write_batch(envelopes(kinds, "alias_old", "alias_new", "pinned_old", "alias_unknown"))
        # each output is stored once, under the model it was requested as
        assert events_per_cohort(store, "events") == {ALIAS: 75, OLD: 30}
        # the rollups: the alias holds all of its outputs; a served model holds what it answered
        buckets = {m: sum(v[0] for v in cohort_sums(store, m)["cohort_buckets"].values()) for m in (ALIAS, OLD, NEW)}
        assert buckets == {ALIAS: 75, OLD: 30 + 40, NEW: 25}
        # and the raw view agrees
        assert events_per_cohort(store, "cohort_events") == buckets
        assert served_aliases(store) == {
            (OLD, PV, CONTRACT, "production"): [(ALIAS, PV, CONTRACT, "production")],
            (NEW, PV, CONTRACT, "production"): [(ALIAS, PV, CONTRACT, "production")],
        }
        assert store.query(
            "SELECT model, served_model, sum(n)::BIGINT FROM served_models JOIN cohorts "
            "USING (cohort_id) GROUP BY ALL ORDER BY ALL"
        ) == [(ALIAS, OLD, 40), (ALIAS, NEW, 25), (OLD, OLD, 70), (NEW, NEW, 25)]
        new_sums = cohort_sums(store, NEW)
        old_sums = cohort_sums(store, OLD)

    # the served cohort's counts are those of the same outputs requested under the served model
    direct = {k: [(i, ts, out, served, served) for i, ts, out, _, served in rows] for k, rows in kinds.items()}
    with Store.open(tmp_path / "direct.duckdb") as ref:
        ref.write_batch(envelopes(direct, "alias_new"))
        assert cohort_sums(ref, NEW) == new_sums
    with Store.open(tmp_path / "direct-old.duckdb") as ref:
        ref.write_batch(envelopes(direct, "alias_old", "pinned_old"))
        assert cohort_sums(ref, OLD) == old_sums


def test_pinned_requests_and_unknown_served_models_make_no_served_cohort(tmp_path: Path) -> None:
    kinds = traffic()
    with Store.open(tmp_path / "p.duckdb") as store:
        store.write_batch(envelopes(kinds, "pinned_old", "alias_unknown"))
        assert store.query("SELECT model FROM cohorts ORDER BY ALL") == [(ALIAS,), (OLD,)]
        assert served_aliases(store) == {}
        assert events_per_cohort(store, "cohort_events") == events_per_cohort(store, "events") == {ALIAS: 10, OLD: 30}


def test_deferred_merges_and_recovery_after_a_crash_count_served_cohorts_once(tmp_path: Path) -> None:
    kinds = traffic()
    evs = envelopes(kinds, "alias_old", "alias_new", "pinned_old", "alias_unknown")
    random.Random(5).shuffle(evs)
    with Store.open(tmp_path / "sync.duckdb") as sync:
        for i in range(0, len(evs), 7):
            sync.write_batch(evs[i : i + 7])
        expected = rollup_sums(sync)
    db = tmp_path / "deferred.duckdb"
    store = Store.open(db)
    store.defer_rollups(max_events=50, max_seconds=3600)
    for i in range(0, len(evs), 7):
        store.write_batch(evs[i : i + 7])
    store._con.close()  # private on purpose: the process dies with counts only in memory
    with Store.open(db) as reopened:
        assert rollup_sums(reopened) == expected
    with Store.open(db) as again:
        assert rollup_sums(again) == expected
