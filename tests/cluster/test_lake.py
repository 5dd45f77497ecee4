"""The lake store (collector/store/lake.py) against a real PostgreSQL catalog and Parquet files:
the conflict rule, rollups equal to the embedded store's, maintenance keeping sums, the
analyzer's view of the lake, and the DuckLake 1.5.5 behaviours the store works around."""

from __future__ import annotations

import itertools
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from cluster_harness import Postgres, missing_tools, own_database
from harness import make_envelope

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "analysis"))
from drift_outputs import output

from shapewatch.collector import Store, read_profile, read_step_profiles
from shapewatch.collector.envelope import Limits, parse_envelope
from shapewatch.collector.store.lake import LakeBoundStore, LakeConfig, LakeWriter, _lake_connection

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(bool(missing_tools()), reason=f"the lake needs: {', '.join(missing_tools())}"),
]


@pytest.fixture
def lake(pg: Postgres, tmp_path: Path) -> LakeConfig:
    return LakeConfig(own_database(pg, tmp_path, "lake"), f"{tmp_path / 'data'}/")


def _envs(n: int, start: int = 0, **kw: Any) -> list[Any]:
    lim = Limits()
    return [
        parse_envelope(
            orjson.dumps(
                make_envelope(
                    event_id=f"e{i}",
                    ts=f"2026-11-29T{(i // 3600) % 24:02d}:{(i // 60) % 60:02d}:{i % 60:02d}Z",
                    output=output(i),
                    served_model="snap-1" if i % 5 == 0 else None,
                    **kw,
                )
            ),
            lim,
        )
        for i in range(start, start + n)
    ]


def _sums(query: Any) -> list[tuple[Any, ...]]:
    return [
        tuple(r)
        for r in query(
            """SELECT 'f', c.model, path, sum(present), sum(n_string), sum(n_null), sum(values_overflow)
               FROM field_rollups JOIN cohorts c USING (cohort_id) GROUP BY ALL
               UNION ALL SELECT 'v', c.model, path || '=' || value, sum(n), 0, 0, 0
               FROM value_rollups JOIN cohorts c USING (cohort_id) GROUP BY ALL
               UNION ALL SELECT 'a', c.model, path || '#' || length, sum(n), 0, 0, 0
               FROM array_rollups JOIN cohorts c USING (cohort_id) GROUP BY ALL
               UNION ALL SELECT 's', c.model, served_model, sum(n), 0, 0, 0
               FROM served_models JOIN cohorts c USING (cohort_id) GROUP BY ALL
               UNION ALL SELECT 'b', c.model, bucket::VARCHAR, sum(events), 0, 0, 0
               FROM cohort_buckets JOIN cohorts c USING (cohort_id) GROUP BY ALL
               ORDER BY ALL"""
        )
    ]


def test_retries_are_duplicates_other_payloads_conflicts_and_nothing_is_stored_twice(lake: LakeConfig) -> None:
    w = LakeWriter.open(lake)
    try:
        first = w.write_batch(_envs(600), shard=0)
        assert [r.status.value for r in first] == ["accepted"] * 600
        again = w.write_batch(_envs(600, start=500), shard=0)
        assert [r.status.value for r in again] == ["duplicate"] * 100 + ["accepted"] * 500
        other = w.write_batch(_envs(3, start=10, attributes={"changed": "yes"}), shard=0)
        assert [r.status.value for r in other] == ["conflict"] * 3
        assert w.query("SELECT count(*), count(DISTINCT event_id) FROM events") == [(1100, 1100)]
        # repeats inside one batch, as the embedded store answers them
        inside = w.write_batch([*_envs(2, start=2000), *_envs(1, start=2000)], shard=0)
        assert [r.status.value for r in inside] == ["accepted", "accepted", "duplicate"]
    finally:
        w.close()


def test_the_lakes_rollups_equal_the_embedded_stores_on_the_same_events(lake: LakeConfig, tmp_path: Path) -> None:
    envs = _envs(3000)
    w = LakeWriter.open(lake)
    try:
        for i in range(0, 3000, 700):  # in several commits, as workers write
            w.write_batch(envs[i : i + 700], shard=[i % 3] * len(envs[i : i + 700]))
        got = _sums(w.query)
        with Store.open(tmp_path / "e.duckdb") as embedded:
            embedded.write_batch(envs)
            want = _sums(embedded.query)
        assert got == want
        assert len(got) > 50
        # maintenance folds rows and merges files, and changes no sum
        done = w.compact(older_than=__import__("datetime").timedelta(0))
        assert done["rollup_rows_removed"] > 0
        assert _sums(w.query) == want
    finally:
        w.close()


def test_the_analyzers_store_reads_the_lake_with_the_embedded_reads(lake: LakeConfig, tmp_path: Path) -> None:
    w = LakeWriter.open(lake)
    try:
        w.write_batch(_envs(50), shard=1)
    finally:
        w.close()
    with LakeBoundStore.open(tmp_path / "a.duckdb", external_access=True) as store:
        assert isinstance(store, LakeBoundStore)
        store.bind_lake(lake)
        assert store.healthcheck()["events"] == 50
        assert {c.model for c in store.cohorts()} == {"claude-sonnet-4-5-20250929", "snap-1"}
        # events_by_id matches on md5_number(event_id), shown by the bound store's view
        found = store.events_by_id(["e3", "e10", "nope"])
        assert sorted(e.event_id for e in found) == ["e10", "e3"]
        # a thread's own connection sees the lake too
        seen: list[int] = []
        t = threading.Thread(target=lambda: seen.append(store.healthcheck()["events"]))
        t.start()
        t.join()
        assert seen == [50]
        # a chart's steps read at once over the lake's views equal its windows read one by one
        cid = store.cohort_id("claude-sonnet-4-5-20250929", "intake-v3", "intake")
        assert cid is not None
        t0 = datetime(2026, 11, 29, tzinfo=UTC)
        edges = [t0 + timedelta(seconds=20 * i) for i in range(-3, 10)]
        steps = read_step_profiles(store, cid, edges)
        assert steps == [read_profile(store, cid, lo, hi) for lo, hi in itertools.pairwise(edges)]
        assert sum(p.events for p in steps) == read_profile(store, cid, edges[0], edges[-1]).events == 50


def test_ducklake_stores_a_uhugeint_through_a_double_so_the_lake_keeps_keys_as_text(lake: LakeConfig) -> None:
    # The finding behind id_key being md5 text in the lake: if this starts to fail, DuckLake
    # keeps UHUGEINT exactly and the store could go back to md5_number (cheaper to compare).
    con = _lake_connection(lake)
    try:
        con.execute("CREATE TABLE probe (k UHUGEINT, e VARCHAR)")
        con.execute("INSERT INTO probe SELECT md5_number('e' || i), 'e' || i FROM range(20) t(i)")
        exact = con.execute("SELECT count(*) FROM probe WHERE k = md5_number(e)").fetchone()
        assert exact == (0,)
    finally:
        con.close()


def test_workers_attaching_a_new_catalog_together_all_succeed(lake: LakeConfig) -> None:
    # two processes creating DuckLake's catalog tables at once failed on PostgreSQL's unique
    # type names; attach_lake serializes them with an advisory lock
    errors: list[BaseException] = []
    writers: list[LakeWriter] = []

    def attach() -> None:
        try:
            writers.append(LakeWriter.open(lake))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=attach) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for w in writers:
        w.close()
    assert errors == []
    assert len(writers) == 3
