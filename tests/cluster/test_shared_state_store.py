"""The analyzer's shared records (collector/store/shared_state.py) between two stores on one
real PostgreSQL and lake, no NATS: only the elected node writes, every write reaches the other
before it returns, a deposed leader can never overwrite its successor, a takeover continues the
numbering, and a PostgreSQL copy made by an older release (a column fewer) is read and then
rewritten whole."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cluster_harness import Postgres, missing_tools, own_database

from shapewatch.analysis.alerts import AlertBook
from shapewatch.analysis.scaleout import open_lake_store
from shapewatch.collector.errors import StoreUnavailable
from shapewatch.collector.scaleout import ScaleOutConfig
from shapewatch.collector.store.lake import LakeBoundStore
from shapewatch.collector.store.shared_state import PG_SCHEMA, NotLeader

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(bool(missing_tools()), reason=f"the shared records need: {', '.join(missing_tools())}"),
]

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)


@pytest.fixture
def cfg(pg: Postgres, tmp_path: Path) -> ScaleOutConfig:
    return ScaleOutConfig.from_mapping(
        {
            "nats_servers": ["nats://127.0.0.1:1"],
            "pg_dsn": own_database(pg, tmp_path, "state"),
            "data_path": f"{tmp_path / 'lake'}/",
        }
    )


@pytest.fixture
def two(cfg: ScaleOutConfig, tmp_path: Path) -> Iterator[tuple[LakeBoundStore, LakeBoundStore]]:
    a = open_lake_store(cfg, tmp_path / "a.duckdb")
    b = open_lake_store(cfg, tmp_path / "b.duckdb")
    yield a, b
    a.close()
    b.close()


def _silence(store: LakeBoundStore, author: str) -> int:
    return (
        AlertBook(store)
        .silence(starts_at=NOW, ends_at=NOW + timedelta(hours=1), author=author, reason="deploy", model="m")
        .silence_id
    )


def _silences(store: LakeBoundStore) -> list[tuple[int, str]]:
    return [(s.silence_id, s.author) for s in AlertBook(store).silences(now=NOW)]


def test_only_the_elected_node_writes_and_the_other_reads_each_write(
    two: tuple[LakeBoundStore, LakeBoundStore],
) -> None:
    a, b = two
    assert (a.is_leader, b.is_leader) == (False, False)
    with pytest.raises(StoreUnavailable, match="adding a silence: this node is not the elected analyzer"):
        _silence(a, "ana")
    assert a.take_over("a", "http://a:8000") == 1
    assert b.leader_url() == ("a", "http://a:8000")
    assert _silence(a, "ana") == 1
    assert b.refresh() is True
    assert b.refresh() is False  # nothing new: one query, no copy
    assert _silences(b) == [(1, "ana")]
    with pytest.raises(StoreUnavailable, match="this node is not the elected analyzer"):
        _silence(b, "bob")
    assert _silences(b) == [(1, "ana")]


def test_a_deposed_leader_cannot_overwrite_its_successor_and_ids_continue(
    two: tuple[LakeBoundStore, LakeBoundStore],
) -> None:
    a, b = two
    a.take_over("a", None)
    assert [_silence(a, "ana"), _silence(a, "ana")] == [1, 2]
    assert b.take_over("b", None) == 2  # a's session died, say; b continues the numbering
    assert _silence(b, "bob") == 3
    with pytest.raises(NotLeader, match=r"another analyzer was elected after this one \(epoch 1\)"):
        _silence(a, "ana")
    assert a.is_leader is False
    # a's refused write stayed local: its next pull rewrites everything from PostgreSQL
    assert a.refresh() is True
    assert _silences(a) == _silences(b) == [(1, "ana"), (2, "ana"), (3, "bob")]


def test_a_copy_written_by_an_older_release_is_read_then_rewritten_with_every_column(
    two: tuple[LakeBoundStore, LakeBoundStore], cfg: ScaleOutConfig
) -> None:
    import psycopg

    a, b = two
    a.take_over("a", None)
    _silence(a, "ana")
    with psycopg.connect(cfg.pg_dsn, autocommit=True) as pg:  # as a release without silences.kind wrote it
        pg.execute(f"ALTER TABLE {PG_SCHEMA}.silences DROP COLUMN kind")
        pg.execute(f"UPDATE {PG_SCHEMA}.state_meta SET version = version + 1")
    assert b.refresh() is True  # its cached catalog has the column: the failed read drops the cache
    assert _silences(b) == [(1, "ana")]
    b.take_over("b", None)
    assert _silence(b, "bob") == 2
    with psycopg.connect(cfg.pg_dsn, autocommit=True) as pg:
        cols = [
            r[0]
            for r in pg.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND table_name = 'silences' "
                "ORDER BY ordinal_position",
                [PG_SCHEMA],
            )
        ]
        rows = pg.execute(f"SELECT silence_id, author, kind FROM {PG_SCHEMA}.silences ORDER BY 1").fetchall()
    assert "kind" in cols
    assert rows == [(1, "ana", None), (2, "bob", None)]


def test_the_records_shared_are_every_table_of_the_analyzer_and_none_of_the_lake(
    two: tuple[LakeBoundStore, LakeBoundStore],
) -> None:
    a, _ = two
    assert a.shared is not None
    assert a.shared.tables == [
        "alert_history",
        "alerts",
        "analyzer_runs",
        "baseline_activations",
        "baselines",
        "cases",
        "cases_over",
        "contract_versions",
        "incident_alerts",
        "incidents",
        "notifications",
        "probe_results",
        "probe_runs",
        "run_rollups",
        "run_steps",
        "runs",
        "served_model_changes",
        "silences",
    ]
