"""Tests for collector.store: schema versions and migrations, the file lock,
idempotent batch writes, purge, provider outcomes and the health check.

Every test runs against a real DuckDB file under tmp_path. TIMESTAMPTZ columns
are read back as epoch seconds (``epoch(...)``): DuckDB's Python conversion of
TIMESTAMPTZ needs pytz, which is not a dependency.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pytest

from shapewatch.collector.envelope import LIMITS, Envelope, parse_envelope, validate_envelope
from shapewatch.collector.errors import StoreError, StoreUnavailable, StoreVersionTooNew
from shapewatch.collector.rollup import ROLLUP_TABLES
from shapewatch.collector.store import (
    MIGRATIONS,
    PROBES_SCHEMA,
    RUNS_SCHEMA,
    SCHEMA_VERSION,
    Purged,
    Store,
    WriteResult,
    WriteStatus,
)

ROOT = Path(__file__).resolve().parents[2]
MakeEnvelope = Callable[..., dict[str, Any]]

A = WriteStatus.accepted
D = WriteStatus.duplicate
C = WriteStatus.conflict

# 2026-11-29T12:00:00Z and 12:01:00Z as epoch seconds
T1200 = int(datetime(2026, 11, 29, 12, 0, tzinfo=UTC).timestamp())
T1201 = T1200 + 60


def parse(raw: dict[str, Any]) -> Envelope:
    return parse_envelope(orjson.dumps(raw), LIMITS)


def envs(make: MakeEnvelope, n: int, prefix: str, **overrides: Any) -> list[Envelope]:
    return [parse(make(event_id=f"{prefix}-{i}", **overrides)) for i in range(n)]


def statuses(results: list[WriteResult]) -> list[tuple[str, WriteStatus]]:
    return [(r.event_id, r.status) for r in results]


def committed_transactions(
    store: Store, monkeypatch: pytest.MonkeyPatch, after: Callable[[list[str]], None] | None = None
) -> list[str]:
    """What each transaction the store commits from now on was doing, in order; ``after`` runs
    after each commit with the list so far."""
    done: list[str] = []
    real = store._transaction

    @contextmanager
    def noting(doing: str, con: Any = None) -> Iterator[Any]:
        with real(doing, con) as c:
            yield c
        done.append(doing)
        if after is not None:
            after(done)

    monkeypatch.setattr(store, "_transaction", noting)
    return done


def count_events(store: Store) -> int:
    return int(store.query("SELECT count(*) FROM events")[0][0])


def rollup_sums(store: Store) -> dict[str, dict[tuple[Any, ...], tuple[int, ...]]]:
    """Every rollup table summed per key (cohort by name, bucket as epoch seconds)."""
    out: dict[str, dict[tuple[Any, ...], tuple[int, ...]]] = {}
    for table, (keys, sums) in ROLLUP_TABLES.items():
        other = [k for k in keys if k not in ("cohort_id", "bucket")]
        cols = ", ".join(
            ["c.model", "c.prompt_version", "c.contract", "epoch(t.bucket)::BIGINT", *(f"t.{k}" for k in other)]
        )
        aggs = ", ".join(f"sum(t.{s})::BIGINT" for s in sums)
        rows = store.query(f"SELECT {cols}, {aggs} FROM {table} t JOIN cohorts c USING (cohort_id) GROUP BY ALL")
        width = 4 + len(other)
        out[table] = {tuple(r[:width]): tuple(r[width:]) for r in rows}
    return out


# --- opening, versions, migrations ------------------------------------------------------------


def test_a_new_file_is_created_at_the_current_schema_version(db_path: Path) -> None:
    assert not db_path.exists()
    with Store.open(db_path) as store:
        assert sorted(store.query("SELECT key, value FROM meta")) == [
            ("bucket_seconds", "60"),
            ("rollups_through", "0"),
            ("schema_version", str(SCHEMA_VERSION)),
            ("schema_version.probes", str(PROBES_SCHEMA.version)),  # probe suite runs, opened with every store
            ("schema_version.runs", str(RUNS_SCHEMA.version)),  # the agent runs' tables, the collector's own
        ]
        assert store.healthcheck() == {"schema_version": SCHEMA_VERSION, "events": 0}
    assert db_path.exists()


def _storage_version(path: Path) -> str:
    con = duckdb.connect(str(path), read_only=True)
    try:
        row = con.execute(
            "SELECT tags['storage_version'] FROM duckdb_databases() WHERE path = ?", [str(path)]
        ).fetchone()
    finally:
        con.close()
    assert row is not None
    return str(row[0])


def test_a_new_file_is_written_in_the_newer_storage_format_and_an_older_one_keeps_its_own(
    tmp_path: Path, envelope: MakeEnvelope
) -> None:
    # The older format makes every checkpoint convert the key index back to its layout.
    new = tmp_path / "new.duckdb"
    with Store.open(new) as store:
        store.write_batch([parse(envelope(event_id="a"))])
    assert _storage_version(new) == "v1.2.0+"
    old = tmp_path / "old.duckdb"
    duckdb.connect(str(old)).close()  # DuckDB's default for a new file: the v1.0 format
    assert _storage_version(old) == "v1.0.0+"
    with Store.open(old) as store:
        assert statuses(store.write_batch([parse(envelope(event_id="b"))])) == [("b", A)]
        store.checkpoint()
    assert _storage_version(old) == "v1.0.0+"
    with Store.open(old, read_only=True) as store:
        assert store.query("SELECT event_id FROM events") == [("b",)]


_NAMED = {
    ("events", "output"): {"ZSTD"},
    ("events", "event_id"): {"FSST"},
    ("events", "payload_hash"): {"FSST"},
    ("event_keys", "payload_hash"): {"FSST"},
}


def _compressions(path: Path) -> dict[tuple[str, str], set[str]]:
    """The compressions DuckDB used for the text that never repeats (after a checkpoint)."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        return {
            (table, column): {
                r[0]
                for r in con.execute(
                    f"SELECT DISTINCT compression FROM pragma_storage_info('{table}') WHERE column_name = ?", [column]
                ).fetchall()
            }
            - {"Constant"}  # the validity mask's
            for table, column in _NAMED
        }
    finally:
        con.close()


def test_a_new_file_names_the_compression_of_text_that_never_repeats_and_an_older_format_keeps_duckdbs(
    tmp_path: Path, envelope: MakeEnvelope
) -> None:
    # text that compresses well whatever DuckDB samples of it: its own choice is never "Uncompressed"
    many = [envelope(event_id=f"e{i}", output={"note": "a refund for order " * 10 + str(i)}) for i in range(3000)]
    new = tmp_path / "new.duckdb"
    with Store.open(new) as store:
        store.write_batch([parse(e) for e in many])
    assert _compressions(new) == _NAMED
    # A file made before schema version 12 in DuckDB's v1.0 format, which has no zstd for text
    # (named for a column, DuckDB stores it uncompressed there): the columns keep DuckDB's choice.
    old = tmp_path / "old.duckdb"
    con = duckdb.connect(str(old))
    for step in MIGRATIONS[:11]:
        step(con) if callable(step) else con.execute(step.replace("{bucket}", "60"))
    con.execute("INSERT INTO meta VALUES ('schema_version', '11'), ('bucket_seconds', '60')")
    con.close()
    with Store.open(old) as store:
        store.write_batch([parse(e) for e in many])
    compression = _compressions(old)
    assert compression[("events", "output")] <= {"FSST", "Dictionary"} and compression[("events", "output")], (
        compression
    )  # DuckDB's choice, not zstd


def test_a_duckdb_that_refuses_the_compression_clause_leaves_duckdb_its_choice(
    tmp_path: Path, envelope: MakeEnvelope, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shapewatch.collector.store import schema

    assert schema._compression_clause()  # this DuckDB takes it
    monkeypatch.setattr(schema, "_compression_clause", lambda: False)
    path = tmp_path / "plain.duckdb"
    with Store.open(path) as store:
        store.write_batch(
            [
                parse(envelope(event_id=f"e{i}", output={"note": "a refund for order " * 10 + str(i)}))
                for i in range(3000)
            ]
        )
        assert store.query("SELECT value FROM meta WHERE key = 'schema_version'") == [(str(SCHEMA_VERSION),)]
    assert _storage_version(path) == "v1.2.0+"
    assert _compressions(path)[("events", "output")] <= {"FSST", "Dictionary"}  # DuckDB's choice, not zstd


def test_schema_version_12_rebuilds_a_newer_format_file_with_its_events_in_order(
    tmp_path: Path, envelope: MakeEnvelope
) -> None:
    path = tmp_path / "v11.duckdb"
    with Store.open(path) as store:  # the v1.2 format; written, then set back to schema version 11's table
        store.write_batch([parse(envelope(event_id=f"e{i}", output={"i": i})) for i in range(50)])
        held = store.query("SELECT * FROM events ORDER BY rowid")
        keys = store.query("SELECT * FROM event_keys ORDER BY id_key")
        viewed = store.query("SELECT event_id, cohort_id FROM cohort_events ORDER BY event_id")
    con = duckdb.connect(str(path))
    view = con.execute("SELECT sql FROM duckdb_views() WHERE view_name = 'cohort_events'").fetchone()
    assert view is not None
    con.execute("DROP VIEW cohort_events; CREATE TABLE plain AS SELECT * FROM events ORDER BY rowid")
    con.execute("DROP TABLE events; ALTER TABLE plain RENAME TO events")
    con.execute("""CREATE TABLE plain_keys (id_key UHUGEINT PRIMARY KEY, payload_hash VARCHAR NOT NULL,
                   received_at TIMESTAMPTZ NOT NULL)""")
    con.execute("INSERT INTO plain_keys SELECT * FROM event_keys; DROP TABLE event_keys")
    con.execute("ALTER TABLE plain_keys RENAME TO event_keys")
    con.execute(view[0])
    con.execute("UPDATE meta SET value = '11' WHERE key = 'schema_version'")
    con.close()
    with Store.open(path) as store:
        assert store.query("SELECT value FROM meta WHERE key = 'schema_version'") == [(str(SCHEMA_VERSION),)]
        assert store.query("SELECT * FROM events ORDER BY rowid") == held
        assert store.query("SELECT * FROM event_keys ORDER BY id_key") == keys
        assert store.query("SELECT event_id, cohort_id FROM cohort_events ORDER BY event_id") == viewed
        assert statuses(store.write_batch([parse(envelope(event_id="e7", output={"i": 7}))])) == [("e7", D)]
    assert _compressions(path) == _NAMED


def test_the_log_is_checkpointed_at_the_configured_size_not_at_16_mib(db_path: Path, envelope: MakeEnvelope) -> None:
    """DuckDB's default (16 MiB) checkpoints every few seconds of traffic, each one costing more as
    the file grows; the store asks for 256 MB unless told otherwise, and a batch stays in the log."""
    with Store.open(db_path) as store:
        assert store.query("SELECT current_setting('checkpoint_threshold')") == [("244.1 MiB",)]
        store.write_batch(envs(envelope, 50, "logged"))
        wal = db_path.with_name(db_path.name + ".wal")
        assert wal.stat().st_size > 0  # committed, in the log, not yet checkpointed
    with Store.open(db_path, checkpoint_threshold="1MB") as store:
        assert store.query("SELECT current_setting('checkpoint_threshold')") == [("976.5 KiB",)]
        assert count_events(store) == 50


def test_a_checkpoint_writes_the_log_into_the_file(db_path: Path, envelope: MakeEnvelope) -> None:
    wal = db_path.with_name(db_path.name + ".wal")
    with Store.open(db_path) as store:
        store.write_batch(envs(envelope, 50, "logged"))
        assert wal.stat().st_size > 0
        store.checkpoint()
        assert not wal.exists() or wal.stat().st_size == 0
        store.write_batch(envs(envelope, 2, "after"))  # the store writes on after it
        assert count_events(store) == 52
    with Store.open(db_path, read_only=True) as store:
        assert count_events(store) == 52
        with pytest.raises(StoreError, match="read-only"):
            store.checkpoint()


def test_reopening_a_current_file_changes_nothing(db_path: Path, envelope: MakeEnvelope) -> None:
    with Store.open(db_path) as store:
        store.write_batch(envs(envelope, 3, "e"))
        before = rollup_sums(store)
        tables = store.query("SELECT table_name FROM duckdb_tables() ORDER BY 1")
        meta = sorted(store.query("SELECT key, value FROM meta"))
    assert [k for k, _ in meta] == [
        "bucket_seconds",
        "rollups_through",
        "schema_version",
        "schema_version.probes",
        "schema_version.runs",
    ]
    with Store.open(db_path) as store:
        assert sorted(store.query("SELECT key, value FROM meta")) == meta
        assert store.query("SELECT table_name FROM duckdb_tables() ORDER BY 1") == tables
        assert rollup_sums(store) == before
        assert count_events(store) == 3


def _v1_file(path: Path) -> None:
    """A database as schema version 1 left it, built without the Store."""
    con = duckdb.connect(str(path))
    con.execute(MIGRATIONS[0])
    con.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    con.execute(
        "INSERT INTO cohorts VALUES (nextval('cohort_seq'), 'm-old', 'p1', 'intake', "
        "TIMESTAMPTZ '2026-11-29 12:00:00+00')"
    )
    rows = [  # event_id, ts, served_model
        ("old-1", "2026-11-29 12:00:05+00", "snap-a"),
        ("old-2", "2026-11-29 12:00:59.999+00", "snap-a"),
        ("old-3", "2026-11-29 12:00:10+00", "snap-b"),
        ("old-4", "2026-11-29 12:01:00+00", "snap-a"),
        ("old-5", "2026-11-29 12:01:30+00", None),
    ]
    for event_id, ts, served in rows:
        con.execute(
            """INSERT INTO events (id_key, event_id, payload_hash, generated_id, cohort_id, ts, received_at,
                                   served_model, contract_version, source, run_id, agent_release,
                                   finish_reason, attributes, output)
               VALUES (md5_number($id), $id, 'hash-' || $id, false, 1, $ts::TIMESTAMPTZ,
                       TIMESTAMPTZ '2026-11-29 12:05:00+00', $served, '3', 'production', NULL, NULL,
                       'stop', NULL, '{"intent":"refund"}')""",
            {"id": event_id, "ts": ts, "served": served},
        )
    con.close()


def test_an_older_file_is_migrated_keeping_its_rows(db_path: Path, envelope: MakeEnvelope) -> None:
    _v1_file(db_path)
    with Store.open(db_path) as store:
        assert store.query("SELECT value FROM meta WHERE key = 'schema_version'") == [(str(SCHEMA_VERSION),)]
        assert store.query("SELECT event_id, output FROM events ORDER BY event_id") == [
            (f"old-{i}", '{"intent":"refund"}') for i in range(1, 6)
        ]
        # served_models is backfilled from the raw events, per 60-second bucket
        assert sorted(store.query("SELECT cohort_id, epoch(bucket)::BIGINT, served_model, n FROM served_models")) == [
            (1, T1200, "snap-a", 2),
            (1, T1200, "snap-b", 1),
            (1, T1201, "snap-a", 1),
        ]
        assert store.query("SELECT count(*) FROM outcomes") == [(0,)]
        # the migrated file takes writes: the sequence and the idempotency index carried over
        results = store.write_batch([parse(envelope(event_id="old-1")), parse(envelope(event_id="new-1"))])
        assert statuses(results) == [("old-1", C), ("new-1", A)]
        # id 2 went to the first try of that batch, rolled back on meeting the stored old-1
        # (a sequence does not roll back); the retry created the cohort as 3
        assert store.query("SELECT cohort_id, model FROM cohorts ORDER BY 1") == [
            (1, "m-old"),
            (3, "claude-sonnet-4-5-20250929"),
        ]
        assert store.healthcheck() == {"schema_version": SCHEMA_VERSION, "events": 6}
        # the keys moved to event_keys (version 7), with their receipt times and payload hashes,
        # which version 8 computed again from the stored events (test_payload_identity.py);
        # events kept every row and column, and no longer carries the index
        assert store.query(
            "SELECT k.id_key = md5_number(e.event_id), e.event_id, k.payload_hash = e.payload_hash, "
            "e.payload_hash LIKE 'hash-%', epoch(k.received_at)::BIGINT "
            "FROM event_keys k JOIN events e USING (id_key) WHERE e.event_id LIKE 'old-%' "
            "ORDER BY e.event_id"
        ) == [(True, f"old-{i}", True, False, T1200 + 300) for i in range(1, 6)]
        assert (
            store.query(
                "SELECT constraint_type FROM duckdb_constraints() WHERE table_name = 'events' "
                "AND constraint_type <> 'NOT NULL'"
            )
            == []
        )
        # the view over events was made again (no cohort of snap-a or snap-b: each event once)
        assert store.query("SELECT event_id FROM cohort_events ORDER BY 1") == [
            ("new-1",),
            *((f"old-{i}",) for i in range(1, 6)),
        ]


def test_a_newer_file_is_refused_naming_both_versions(db_path: Path) -> None:
    Store.open(db_path).close()
    con = duckdb.connect(str(db_path))
    con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(SCHEMA_VERSION + 1)])
    con.close()
    with pytest.raises(StoreVersionTooNew) as info:
        Store.open(db_path)
    assert (info.value.found, info.value.supported) == (SCHEMA_VERSION + 1, SCHEMA_VERSION)
    assert str(info.value) == (
        f"database {db_path} has schema version {SCHEMA_VERSION + 1}, but this shapewatch supports up to "
        f"version {SCHEMA_VERSION}; upgrade shapewatch to a release that knows schema version "
        f"{SCHEMA_VERSION + 1}"
    )
    # refused, not damaged: the file still says the newer version
    con = duckdb.connect(str(db_path), read_only=True)
    assert con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchall() == [(str(SCHEMA_VERSION + 1),)]
    con.close()


_CHILD = """
import sys
from shapewatch.collector.errors import StoreLocked
from shapewatch.collector.store import Store
try:
    Store.open(sys.argv[1])
except StoreLocked as exc:
    print(exc, file=sys.stderr)
    sys.exit(3)
print("opened", file=sys.stderr)
"""


def test_a_second_process_is_told_the_file_is_locked(store: Store, db_path: Path) -> None:
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, str(db_path)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert child.returncode == 3, child.stderr
    assert child.stderr.startswith(
        f"database {db_path} is in use by another process (is `shapewatch serve` running on it?). "
        "Stop that process, or send to the running service over HTTP. ("
    ), child.stderr
    assert "lock" in child.stderr.lower()
    # the holder is unaffected
    assert store.healthcheck() == {"schema_version": SCHEMA_VERSION, "events": 0}


def test_the_file_opens_in_another_process_once_released(store: Store, db_path: Path) -> None:
    store.close()
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, str(db_path)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert (child.returncode, child.stderr) == (0, "opened\n")


_LONG_QUERY_CHILD = """
import sys, threading
from shapewatch.collector.store import Store
store = Store.open(sys.argv[1], read_only=sys.argv[2] == "ro")
# The bar's delay at 0 ms (which also turns the bar back on): any statement that reports progress
# would draw it now.
store._con.execute("SET progress_bar_time = 0")
store._con.execute("SELECT sum(i * i) FROM range(3000000) t(i)").fetchall()
# DuckDB opens the cursor each thread reads through with the bar off
seen = []
reader = threading.Thread(target=lambda: seen.append(store.query("SELECT current_setting('enable_progress_bar')")))
reader.start()
reader.join()
store.close()
print("done", seen)
"""


@pytest.mark.parametrize("mode", ["rw", "ro"])
def test_a_store_connection_never_draws_a_progress_bar_on_stdout(db_path: Path, mode: str) -> None:
    """DuckDB draws a progress bar on stdout for a long statement, inside what a command prints
    there (an import's JSON summary, a child's report): the store's connection has it off."""
    Store.open(db_path).close()
    child = subprocess.run(
        [sys.executable, "-c", _LONG_QUERY_CHILD, str(db_path), mode],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (child.returncode, child.stdout) == (0, "done [[(False,)]]\n"), child.stderr


def test_read_only_open_of_a_missing_file_is_a_store_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "missing.duckdb"
    with pytest.raises(StoreError) as info:
        Store.open(missing, read_only=True)
    assert type(info.value) is StoreError
    assert str(info.value) == f"store error while opening: database {missing} does not exist"
    assert not missing.parent.exists()


def test_read_only_open_of_an_older_file_asks_for_a_migration(db_path: Path) -> None:
    _v1_file(db_path)
    with pytest.raises(StoreError) as info:
        Store.open(db_path, read_only=True)
    assert f"has schema version 1 and needs migrating to {SCHEMA_VERSION}" in str(info.value)


# --- idempotent writes --------------------------------------------------------------------------


def test_write_batch_accepts_then_reports_duplicates_without_storing_twice(
    store: Store, envelope: MakeEnvelope
) -> None:
    batch = envs(envelope, 5, "e")
    assert statuses(store.write_batch(batch)) == [(f"e-{i}", A) for i in range(5)]
    sums = rollup_sums(store)
    assert sums["cohort_buckets"] == {("claude-sonnet-4-5-20250929", "intake-v3", "intake", T1200): (5,)}

    # a retry of the same envelopes (re-parsed, as a client's resend would be)
    again = envs(envelope, 5, "e")
    assert statuses(store.write_batch(again)) == [(f"e-{i}", D) for i in range(5)]
    assert count_events(store) == 5
    assert rollup_sums(store) == sums
    assert store.query("SELECT served_model, n FROM served_models") == [("claude-sonnet-4-5-20250929", 5)]


@pytest.mark.parametrize("scanned_per_id", [0, 10**9], ids=["in-lists", "join"])
def test_stored_keys_are_found_by_either_lookup_with_their_hashes(
    store: Store, envelope: MakeEnvelope, monkeypatch: pytest.MonkeyPatch, scanned_per_id: int
) -> None:
    """A probing write finds the stored keys among its ids the same way by IN lists (chunked)
    as by a join, and then stores only the rest: the same results, counts and rows."""
    import shapewatch.collector.store.writes as writes_module

    monkeypatch.setattr(writes_module, "_KEYS_SCANNED_PER_ID", scanned_per_id)
    monkeypatch.setattr(writes_module, "_PROBE_KEYS", 3)
    stored = envs(envelope, 7, "s")
    store.write_batch(stored)
    other = parse(envelope(event_id="s-3", output={"priority": "other"}))
    fresh = envs(envelope, 4, "f")
    batch = [*stored[:3], fresh[0], other, *fresh[1:], stored[6], fresh[0]]
    with store.transaction("probing") as con:
        assert store._stored_hashes(con, list(dict.fromkeys(e.event_id for e in batch))) == {
            e.event_id: e.payload_hash for e in [*stored[:4], stored[6]]
        }
    assert statuses(store.write_batch(batch)) == [
        ("s-0", D),
        ("s-1", D),
        ("s-2", D),
        ("f-0", A),
        ("s-3", C),
        ("f-1", A),
        ("f-2", A),
        ("f-3", A),
        ("s-6", D),
        ("f-0", D),
    ]
    assert count_events(store) == 11


def test_a_reused_key_with_another_payload_is_a_conflict_and_the_original_stays(
    store: Store, envelope: MakeEnvelope
) -> None:
    first = parse(envelope(event_id="k", output={"priority": "high"}))
    store.write_batch([first])
    sums = rollup_sums(store)
    other = parse(envelope(event_id="k", output={"priority": "low"}))
    assert statuses(store.write_batch([other])) == [("k", C)]
    assert store.query("SELECT event_id, payload_hash, output FROM events") == [
        ("k", first.payload_hash, '{"priority":"high"}')
    ]
    assert rollup_sums(store) == sums


def test_duplicates_inside_one_batch(store: Store, envelope: MakeEnvelope) -> None:
    x = envelope(event_id="x", output={"v": 1})
    batch = [
        parse(x),
        parse(envelope(event_id="y")),
        parse(x),
        parse(envelope(event_id="x", output={"v": 2})),
        parse(envelope(event_id="z")),
    ]
    assert statuses(store.write_batch(batch)) == [("x", A), ("y", A), ("x", D), ("x", C), ("z", A)]
    assert store.query("SELECT event_id, output FROM events WHERE event_id = 'x'") == [("x", '{"v":1}')]
    assert count_events(store) == 3
    assert store.query("SELECT sum(present)::BIGINT, sum(n_integer)::BIGINT FROM field_rollups WHERE path = 'v'") == [
        (1, 1)
    ]


@pytest.mark.parametrize("deferred", [False, True])
def test_batches_written_together_commit_once_or_each_alone_when_a_key_was_stored(
    store: Store, envelope: MakeEnvelope, monkeypatch: pytest.MonkeyPatch, deferred: bool
) -> None:
    """write_batches stores several batches in one transaction (bulk import, for DuckDB's
    direct writes); a key stored before rolls it back and each batch is written alone, with
    the results and counts write_batch would give."""
    if deferred:
        store.defer_rollups(max_events=10**6, max_seconds=float("inf"))
    transactions = committed_transactions(store, monkeypatch)
    first = [store.prepare_batch(envs(envelope, 3, f"b{i}")) for i in range(3)]
    assert [statuses(r) for r in store.write_batches(first)] == [[(f"b{i}-{j}", A) for j in range(3)] for i in range(3)]
    assert transactions == ["writing a batch"]  # the three in one
    transactions.clear()
    again = [
        store.prepare_batch(envs(envelope, 2, "n")),  # new
        store.prepare_batch(
            [
                parse(envelope(event_id="b0-0", output={"other": 1})),  # conflict
                parse(envelope(event_id="b1-1")),
            ]
        ),  # duplicate
        store.prepare_batch(envs(envelope, 2, "n") + envs(envelope, 1, "m")),
    ]  # repeats of batch 1, one new
    assert [statuses(r) for r in store.write_batches(again)] == [
        [("n-0", A), ("n-1", A)],
        [("b0-0", C), ("b1-1", D)],
        [("n-0", D), ("n-1", D), ("m-0", A)],
    ]
    assert transactions == ["writing a batch"] * 3  # rolled back, then each batch alone
    store.flush_rollups()
    assert count_events(store) == 12
    assert store.query("SELECT sum(events)::BIGINT FROM cohort_buckets") == [(12,)]  # each event counted once
    assert store.query("SELECT output FROM events WHERE event_id = 'b0-0'") == [
        (orjson.dumps(envelope(event_id="b0-0")["output"]).decode(),)
    ]


def test_a_batch_built_envelope_by_envelope_keeps_no_parsed_output(store: Store, envelope: MakeEnvelope) -> None:
    """Bulk import streams envelopes into a BatchBuilder and lets each parsed output go: the
    builder counts it at once and keeps only its text. The batch it builds is the one
    prepare_batch builds from the same envelopes, and stores the same."""
    raws = [
        envelope(event_id="a", output={"v": [1, 2]}),
        envelope(event_id="b", output={"v": "x"}),
        envelope(event_id="a", output={"v": [1, 2]}),
        envelope(event_id="a", output={"v": 9}),
    ]
    # parsed by the reference path (as provider adapters and unusual texts are): with outputs
    assert all(parse(raw).output is None for raw in raws)  # the C scanner parses none at all
    builder = store.batch_builder()
    outputs = []
    for raw in raws:
        env = validate_envelope(orjson.loads(orjson.dumps(raw)), LIMITS)
        assert env == parse(raw)._replace(output=env.output)  # the same envelope either way
        outputs.append(env.output)
        builder.add(env)
        del env
    assert len(builder) == 4
    # only this test's list holds each parsed output now, like a dict nothing else holds
    control: list[Any] = [{"v": 1}]
    held_by_list_alone = next(sys.getrefcount(o) for o in control)
    assert [sys.getrefcount(o) for o in outputs] == [held_by_list_alone] * 4
    built = builder.finish()
    with pytest.raises(RuntimeError, match="finish called twice"):
        builder.finish()
    with pytest.raises(RuntimeError, match="add after finish"):
        builder.add(parse(raws[0]))
    reference = store.prepare_batch([parse(r) for r in raws])
    assert (built.event_ids, built.hashes, built.early, built.cohorts, built.served_cohorts) == (
        reference.event_ids,
        reference.hashes,
        reference.early,
        reference.cohorts,
        reference.served_cohorts,
    )
    assert built.early == [None, None, WriteResult("a", D), WriteResult("a", C)]
    assert built.table.equals(reference.table)
    for mine, theirs in zip(built.rollups.tables(), reference.rollups.tables(), strict=True):
        assert mine.equals(theirs)
    assert statuses(store.write_batch(built)) == [("a", A), ("b", A), ("a", D), ("a", C)]
    assert store.query("SELECT event_id, output FROM events ORDER BY 1") == [("a", '{"v":[1,2]}'), ("b", '{"v":"x"}')]
    assert store.query("SELECT path, sum(present)::BIGINT FROM field_rollups GROUP BY path ORDER BY path") == [
        ("v", 2),
        ("v[]", 2),
    ]


def test_a_repeat_is_judged_against_what_the_key_holds_not_its_first_line_in_the_batch(
    store: Store, envelope: MakeEnvelope
) -> None:
    # Found by the bulk-import crash test: a rerun's batch met a conflicting line for a stored
    # key first, and the stored payload's own repeat after it was called a conflict too.
    stored = envelope(event_id="x", output={"v": 1})
    store.write_batch([parse(stored)])
    batch = [
        parse(envelope(event_id="x", output={"v": 2})),
        parse(stored),
        parse(envelope(event_id="x", output={"v": 2})),
    ]
    assert statuses(store.write_batch(batch)) == [("x", C), ("x", D), ("x", C)]
    # and in one batch with a new key: its first line is what the key holds
    first = envelope(event_id="y", output={"v": 1})
    assert statuses(
        store.write_batch([parse(first), parse(envelope(event_id="y", output={"v": 3})), parse(first)])
    ) == [("y", A), ("y", C), ("y", D)]
    assert store.query("SELECT event_id, output FROM events ORDER BY 1") == [("x", '{"v":1}'), ("y", '{"v":1}')]


@pytest.mark.parametrize("deferred", [False, True], ids=["rollups-in-transaction", "rollups-deferred"])
def test_a_batch_meeting_stored_keys_is_written_again_knowing_them(
    store: Store, envelope: MakeEnvelope, monkeypatch: pytest.MonkeyPatch, deferred: bool
) -> None:
    """Events go in with a plain INSERT; one stored key makes it fail and roll back, and the
    batch is written again after looking the stored keys up (in chunks of _PROBE_KEYS).
    Nothing of the failed try remains: each new event once, counted once."""
    import shapewatch.collector.store.writes as writes_module

    monkeypatch.setattr(writes_module, "_PROBE_KEYS", 3)  # 10 keys: four lookups
    if deferred:
        store.defer_rollups(max_events=1_000_000, max_seconds=float("inf"))
    stored = [envelope(event_id=f"s{i}", output={"v": i}) for i in range(6)]
    assert statuses(store.write_batch([parse(e) for e in stored])) == [(f"s{i}", A) for i in range(6)]
    batch = [
        parse(envelope(event_id="n0", output={"v": 10})),
        parse(stored[0]),
        parse(envelope(event_id="s1", output={"v": 99})),
        parse(stored[5]),
        parse(envelope(event_id="n1", output={"v": 11})),
        parse(stored[2]),
        parse(envelope(event_id="n0", output={"v": 10})),
        parse(stored[3]),
        parse(envelope(event_id="n2", output={"v": 12})),
        parse(stored[4]),
    ]
    assert statuses(store.write_batch(batch)) == [
        ("n0", A),
        ("s0", D),
        ("s1", C),
        ("s5", D),
        ("n1", A),
        ("s2", D),
        ("n0", D),
        ("s3", D),
        ("n2", A),
        ("s4", D),
    ]
    store.flush_rollups()
    assert store.query("SELECT event_id, output FROM events ORDER BY 1") == [
        ("n0", '{"v":10}'),
        ("n1", '{"v":11}'),
        ("n2", '{"v":12}'),
        *[(f"s{i}", f'{{"v":{i}}}') for i in range(6)],
    ]
    assert store.query("SELECT sum(present)::BIGINT, sum(n_integer)::BIGINT FROM field_rollups WHERE path = 'v'") == [
        (9, 9)
    ]
    assert store.query("SELECT sum(events)::BIGINT FROM cohort_buckets") == [(9,)]


def test_results_follow_the_input_order_in_a_mixed_batch(store: Store, envelope: MakeEnvelope) -> None:
    store.write_batch([parse(envelope(event_id=f"old-{i}", output={"i": i})) for i in range(3)])
    batch = [
        parse(envelope(event_id="new-0")),
        parse(envelope(event_id="old-2", output={"i": 2})),  # duplicate of a stored one
        parse(envelope(event_id="new-1")),
        parse(envelope(event_id="old-0", output={"i": 99})),  # conflict with a stored one
        parse(envelope(event_id="new-0")),  # same id and payload earlier in this batch
        parse(envelope(event_id="old-1", output={"i": 1})),
    ]
    assert statuses(store.write_batch(batch)) == [
        ("new-0", A),
        ("old-2", D),
        ("new-1", A),
        ("old-0", C),
        ("new-0", D),
        ("old-1", D),
    ]
    assert count_events(store) == 5


def test_concurrent_writers_store_each_event_once(store: Store, envelope: MakeEnvelope) -> None:
    shared = envs(envelope, 200, "shared")
    threads_n = 8
    own = {t: envs(envelope, 10, f"own{t}") for t in range(threads_n)}
    results: dict[int, list[WriteResult]] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(threads_n)

    def work(t: int) -> None:
        try:
            batch = shared[t * 25 :] + own[t] + shared[: t * 25]  # each thread in its own order
            barrier.wait(timeout=30)
            results[t] = store.write_batch(batch)
            expected_ids = [e.event_id for e in batch]
            assert [r.event_id for r in results[t]] == expected_ids
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(threads_n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert errors == []
    assert sorted(results) == list(range(threads_n))

    accepted_by: Counter[str] = Counter()
    for t, res in results.items():
        for r in res:
            assert r.status in (A, D), r
            if r.status is A:
                accepted_by[r.event_id] += 1
        # every thread's own events are its own to accept
        assert {r.event_id: r.status for r in res if r.event_id.startswith(f"own{t}-")} == {
            f"own{t}-{i}": A for i in range(10)
        }
    all_ids = {e.event_id for e in shared} | {e.event_id for t in own for e in own[t]}
    assert accepted_by == Counter(dict.fromkeys(all_ids, 1))
    # one thread accepted all 200 shared ones (its batch was one transaction)
    winners = [t for t, res in results.items() if any(r.status is A and r.event_id.startswith("shared") for r in res)]
    assert len(winners) == 1
    assert store.query("SELECT count(*), count(DISTINCT event_id) FROM events") == [(280, 280)]
    assert rollup_sums(store)["cohort_buckets"] == {
        ("claude-sonnet-4-5-20250929", "intake-v3", "intake", T1200): (280,)
    }


def test_a_retry_after_a_restart_with_a_clock_behind_is_still_a_duplicate(
    db_path: Path, envelope: MakeEnvelope
) -> None:
    raw = envelope(event_id="r")
    later = datetime(2026, 11, 29, 12, 10, tzinfo=UTC)
    with Store.open(db_path) as store:
        assert statuses(store.write_batch([parse(raw)], now=later)) == [("r", A)]
    with Store.open(db_path) as store:  # the wall clock stepped back across the restart
        result = store.write_batch([parse(raw)], now=later - timedelta(seconds=1))
        assert statuses(result) == [("r", D)]
        assert count_events(store) == 1


# --- purge, outcomes, health ---------------------------------------------------------------------


def test_purge_deletes_old_raw_events_and_keeps_rollups(store: Store, envelope: MakeEnvelope) -> None:
    old = datetime(2026, 11, 1, tzinfo=UTC)
    recent = datetime(2026, 11, 29, 12, 5, tzinfo=UTC)
    store.write_batch(envs(envelope, 4, "old"), now=old)
    store.write_batch(envs(envelope, 3, "new", ts="2026-11-29T12:01:00Z"), now=recent)
    sums = rollup_sums(store)
    assert sums["cohort_buckets"] == {
        ("claude-sonnet-4-5-20250929", "intake-v3", "intake", T1200): (4,),
        ("claude-sonnet-4-5-20250929", "intake-v3", "intake", T1201): (3,),
    }

    removed = store.purge(
        raw_retention=timedelta(days=7), dedup_ttl=timedelta(days=7), now=datetime(2026, 11, 30, tzinfo=UTC)
    )
    assert removed == Purged(events=4, keys=4)
    assert store.query("SELECT event_id FROM events ORDER BY event_id") == [(f"new-{i}",) for i in range(3)]
    assert rollup_sums(store) == sums
    assert store.query("SELECT epoch(bucket)::BIGINT, n FROM served_models ORDER BY 1") == [(T1200, 4), (T1201, 3)]
    # nothing left that old: a second purge removes nothing
    assert store.purge(
        raw_retention=timedelta(days=7), dedup_ttl=timedelta(days=7), now=datetime(2026, 11, 30, tzinfo=UTC)
    ) == Purged(0, 0)


def test_record_outcomes_counts_per_cohort_bucket_and_kind(store: Store) -> None:
    t0 = datetime(2026, 11, 29, 12, 0, 1, tzinfo=UTC)
    t1 = datetime(2026, 11, 29, 12, 1, 59, tzinfo=UTC)
    store.record_outcomes(
        [
            ("m1", "p1", "intake", t0, "refusal"),
            ("m1", "p1", "intake", t0 + timedelta(seconds=30), "refusal"),
            ("m1", "p1", "intake", t0, "truncated"),
            ("m1", "p1", "intake", t1, "refusal"),
            ("m2", "p1", "intake", t0, "refusal"),
        ]
    )
    store.record_outcomes([("m1", "p1", "intake", t0, "refusal")])
    store.record_outcomes([])
    rows = store.query(
        "SELECT c.model, c.prompt_version, c.contract, epoch(o.bucket)::BIGINT, o.kind, o.n "
        "FROM outcomes o JOIN cohorts c USING (cohort_id)"
    )
    assert sorted(rows) == [
        ("m1", "p1", "intake", T1200, "refusal", 3),
        ("m1", "p1", "intake", T1200, "truncated", 1),
        ("m1", "p1", "intake", T1201, "refusal", 1),
        ("m2", "p1", "intake", T1200, "refusal", 1),
    ]
    assert count_events(store) == 0


def test_an_alias_outcome_counts_in_the_served_cohort_too(store: Store) -> None:
    t0 = datetime(2026, 11, 29, 12, 0, 1, tzinfo=UTC)
    rows = [
        ("gpt-4o", "p1", "c", t0, "truncated"),
        ("gpt-4o", "p1", "c", t0, "refusal"),
        ("gpt-4o", "p1", "c", t0, "refusal"),
    ]
    # answered by a dated model, by the model asked for, and by an unnamed one
    assert store.record_outcomes(rows, keys=["r:0", "r:1", "r:2"], served=["gpt-4o-2024-08-06", "gpt-4o", None]) == [
        True,
        True,
        True,
    ]
    assert store.record_outcomes(rows[:1], keys=["r:0"], served=["gpt-4o-2024-08-06"]) == [False]  # re-posted
    counted = store.query("SELECT c.model, o.kind, o.n FROM outcomes o JOIN cohorts c USING (cohort_id)")
    assert sorted(counted) == [
        ("gpt-4o", "refusal", 2),
        ("gpt-4o", "truncated", 1),
        ("gpt-4o-2024-08-06", "truncated", 1),
    ]
    with pytest.raises(ValueError, match="parallel"):
        store.record_outcomes(rows, served=[None])


def test_outcomes_share_the_rollup_bucket_grid_for_any_width(tmp_path: Path, envelope: MakeEnvelope) -> None:
    with Store.open(tmp_path / "w.duckdb", bucket_seconds=1000) as store:
        store.write_batch([parse(envelope(ts="2026-11-29T12:00:00Z"))])
        store.record_outcomes(
            [
                (
                    "claude-sonnet-4-5-20250929",
                    "intake-v3",
                    "intake",
                    datetime(2026, 11, 29, 12, 0, tzinfo=UTC),
                    "refusal",
                )
            ]
        )
        buckets = store.query("SELECT epoch(bucket)::BIGINT FROM cohort_buckets")
        assert buckets == [(T1200 - T1200 % 1000,)]
        assert store.query("SELECT epoch(bucket)::BIGINT FROM outcomes") == buckets


def test_record_outcomes_on_a_broken_connection_is_a_store_error(store: Store) -> None:
    store.close()
    with pytest.raises(StoreError):
        store.record_outcomes([("m", "p", "c", datetime(2026, 11, 29, tzinfo=UTC), "refusal")])


def test_writes_on_a_broken_connection_are_store_errors(store: Store, envelope: MakeEnvelope) -> None:
    store.close()
    with pytest.raises(StoreError):
        store.write_batch([parse(envelope())])
    with pytest.raises(StoreError):
        store.purge(raw_retention=timedelta(days=1), dedup_ttl=timedelta(days=1))
    with pytest.raises(StoreError):
        store.healthcheck()


def test_healthcheck_reports_schema_version_and_events(store: Store, envelope: MakeEnvelope) -> None:
    assert store.healthcheck() == {"schema_version": SCHEMA_VERSION, "events": 0}
    store.write_batch(envs(envelope, 7, "h"))
    assert store.healthcheck() == {"schema_version": SCHEMA_VERSION, "events": 7}


def test_a_read_only_store_refuses_writes(db_path: Path, envelope: MakeEnvelope) -> None:
    Store.open(db_path).close()
    with Store.open(db_path, read_only=True) as ro:
        assert ro.healthcheck() == {"schema_version": SCHEMA_VERSION, "events": 0}
        with pytest.raises(StoreError) as info:
            ro.write_batch([parse(envelope())])
        assert str(info.value) == "store error while writing: the store was opened read-only"


def test_the_bucket_width_cannot_change_under_stored_rollups(db_path: Path, envelope: MakeEnvelope) -> None:
    with Store.open(db_path, bucket_seconds=60) as store:
        store.write_batch(envs(envelope, 2, "w"))
    with pytest.raises(StoreError) as info:
        Store.open(db_path, bucket_seconds=300)
    assert str(info.value) == (
        f"store error while opening: database {db_path} was created with bucket_seconds=60; "
        "set bucket_seconds to 60 (it cannot change once rollups are stored)"
    )
    with Store.open(db_path, bucket_seconds=60) as store:  # the refusal left it usable
        assert store.query("SELECT count(*) FROM events") == [(2,)]


def test_purge_deletes_in_chunks_and_counts_them_all(
    db_path: Path, envelope: MakeEnvelope, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("shapewatch.collector.store.maintenance._PURGE_CHUNK", 3)
    old = datetime(2026, 1, 1, tzinfo=UTC)
    with Store.open(db_path) as store:
        store.write_batch(envs(envelope, 7, "old"), now=old)
        store.write_batch(envs(envelope, 2, "new"), now=old + timedelta(days=40))
        assert store.purge(
            raw_retention=timedelta(days=30), dedup_ttl=timedelta(days=7), now=old + timedelta(days=41)
        ) == Purged(events=7, keys=7)
        assert store.query("SELECT count(*) FROM events") == [(2,)]
        assert store.query("SELECT count(*) FROM event_keys") == [(2,)]


def test_a_stopped_purge_stops_between_chunks_and_the_next_one_finishes(
    db_path: Path, envelope: MakeEnvelope, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("shapewatch.collector.store.maintenance._PURGE_CHUNK", 3)
    old = datetime(2026, 1, 1, tzinfo=UTC)
    later = {"raw_retention": timedelta(days=30), "dedup_ttl": timedelta(days=7), "now": old + timedelta(days=41)}
    with Store.open(db_path) as store:
        store.write_batch(envs(envelope, 7, "old"), now=old)

        def stop_after_two(done: list[str]) -> None:
            if len(done) == 2:
                store.stop_maintenance()  # as the service's shutdown would, during the purge

        chunks = committed_transactions(store, monkeypatch, stop_after_two)
        assert store.purge(**later) == Purged(events=6, keys=0)  # two chunks, then it stopped
        assert chunks == ["purging old raw events"] * 2 + ["purging old outcome keys"]
    with Store.open(db_path) as store:  # the next service's purge deletes the rest
        assert store.purge(**later) == Purged(events=1, keys=7)
        assert store.query("SELECT count(*) FROM events") == [(0,)]


def test_a_writer_waiting_for_a_long_purge_gets_in_between_its_chunks(
    db_path: Path, envelope: MakeEnvelope, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("shapewatch.collector.store.maintenance._PURGE_CHUNK", 50)
    old = datetime(2026, 1, 1, tzinfo=UTC)
    order: list[str] = []
    with Store.open(db_path) as store:
        for i in range(10):
            store.write_batch(envs(envelope, 100, f"old{i}"), now=old + timedelta(seconds=i))

        def start_writer(done: list[str]) -> None:
            order.append("purge" if done[-1].startswith("purging") else "write")
            if len(order) == 1:
                writer.start()  # waits for the lock from now on
                time.sleep(0.05)

        committed_transactions(store, monkeypatch, start_writer)
        writer = threading.Thread(target=lambda: store.write_batch(envs(envelope, 5, "new")))
        assert (
            store.purge(
                raw_retention=timedelta(days=30), dedup_ttl=timedelta(days=3650), now=old + timedelta(days=41)
            ).events
            == 1000
        )
        writer.join(10)
    # the writer, waiting since the first chunk, went before the second, not after all 21
    assert order[:3] == ["purge", "write", "purge"], order


def test_keys_are_kept_for_the_dedup_ttl_whatever_the_raw_retention(db_path: Path, envelope: MakeEnvelope) -> None:
    t0 = datetime(2026, 11, 1, tzinfo=UTC)
    day = timedelta(days=1)
    with Store.open(db_path) as store:
        assert statuses(store.write_batch(envs(envelope, 3, "k"), now=t0)) == [(f"k-{i}", A) for i in range(3)]
        # raw outputs kept one day, keys seven: the outputs go, a re-send is still a duplicate
        assert store.purge(raw_retention=day, dedup_ttl=7 * day, now=t0 + 2 * day) == Purged(events=3, keys=0)
        assert count_events(store) == 0
        assert statuses(store.write_batch(envs(envelope, 3, "k"), now=t0 + 3 * day)) == [
            (f"k-{i}", D) for i in range(3)
        ]
        assert count_events(store) == 0
        # and so is another payload under a kept key
        other = parse(envelope(event_id="k-0", output={"priority": "low"}))
        assert statuses(store.write_batch([other], now=t0 + 3 * day)) == [("k-0", C)]
        # past the TTL the keys go, and a re-send is a new event
        assert store.purge(raw_retention=day, dedup_ttl=7 * day, now=t0 + 8 * day) == Purged(events=0, keys=3)
        assert statuses(store.write_batch(envs(envelope, 3, "k"), now=t0 + 8 * day)) == [
            (f"k-{i}", A) for i in range(3)
        ]
        assert count_events(store) == 3
        assert store.query("SELECT count(*), min(epoch(received_at))::BIGINT FROM event_keys") == [
            (3, int((t0 + 8 * day).timestamp()))
        ]


def test_raw_events_outliving_their_keys_are_purged_by_age_only(db_path: Path, envelope: MakeEnvelope) -> None:
    t0 = datetime(2026, 11, 1, tzinfo=UTC)
    day = timedelta(days=1)
    with Store.open(db_path) as store:
        store.write_batch(envs(envelope, 2, "r"), now=t0)
        assert store.purge(raw_retention=30 * day, dedup_ttl=7 * day, now=t0 + 8 * day) == Purged(events=0, keys=2)
        # the key is gone: the same event_id is stored again, beside its old copy
        assert statuses(store.write_batch(envs(envelope, 2, "r"), now=t0 + 9 * day)) == [("r-0", A), ("r-1", A)]
        assert store.query("SELECT event_id, count(*) FROM events GROUP BY 1 ORDER BY 1") == [("r-0", 2), ("r-1", 2)]
        # the old copies age out on their own; the new ones (same event_id, same key) stay
        assert store.purge(raw_retention=30 * day, dedup_ttl=30 * day, now=t0 + 31 * day) == Purged(events=2, keys=0)
        assert store.query("SELECT event_id, epoch(received_at)::BIGINT FROM events ORDER BY 1") == [
            ("r-0", int((t0 + 9 * day).timestamp())),
            ("r-1", int((t0 + 9 * day).timestamp())),
        ]
        assert statuses(store.write_batch(envs(envelope, 2, "r"), now=t0 + 31 * day)) == [("r-0", D), ("r-1", D)]


def test_keyed_outcomes_count_once(store: Store) -> None:
    t0 = datetime(2026, 11, 29, 12, 0, 5, tzinfo=UTC)
    rows = [("m", "p", "c", t0, "truncated"), ("m", "p", "c", t0, "refusal")]
    assert store.record_outcomes(rows, keys=["r1:outcome:0", "r1:outcome:1"]) == [True, True]
    assert store.record_outcomes(rows, keys=["r1:outcome:0", "r1:outcome:1"]) == [False, False]  # re-posted
    assert store.record_outcomes(rows[:1], keys=[None]) == [True]  # without a key, always counted
    # a stored key beside a new one given twice in one call: the new one counts once
    assert store.record_outcomes(
        [rows[1], rows[0], rows[0]], keys=["r1:outcome:1", "r2:outcome:0", "r2:outcome:0"]
    ) == [False, True, False]
    assert sorted(store.query("SELECT kind, sum(n)::INT FROM outcomes GROUP BY kind")) == [
        ("refusal", 1),
        ("truncated", 3),
    ]
    assert store.query("SELECT key FROM outcome_keys ORDER BY 1") == [
        ("r1:outcome:0",),
        ("r1:outcome:1",),
        ("r2:outcome:0",),
    ]


def test_string_column_packs_str_or_none_items_as_an_arrow_column() -> None:
    """string_column gives the column Arrow would build from the same values: nulls, empty,
    non-ASCII and long strings; a column without nulls has no bitmap; wrong items are refused."""
    import pyarrow as pa
    import pytest

    from shapewatch.collector.accel import speedups

    string_column = speedups.string_column  # the implementation selected (SHAPEWATCH_ACCEL)

    def column(values: list[str | None]) -> pa.Array:
        rows = [("x", v) for v in values]
        validity, offsets, data, nulls = string_column(rows, 1)
        arr = pa.Array.from_buffers(
            pa.string(),
            len(rows),
            [None if validity is None else pa.py_buffer(validity), pa.py_buffer(offsets), pa.py_buffer(data)],
            null_count=nulls,
        )
        arr.validate(full=True)
        return arr

    cases: list[list[str | None]] = [
        [],
        [None],
        ["a"],
        [""],
        ["a", None, "", "é", None, "日本", "😀" * 100, None, "b"],
        [None] * 17,
        [f"v{i}" if i % 3 else None for i in range(30)],
        ["x" * 70_000, "y"],
    ]
    for values in cases:
        arr = column(values)
        assert arr.equals(pa.array(values, pa.string())), values
        assert arr.null_count == values.count(None)
    assert string_column([("a", "b")], 0)[0] is None  # no nulls: no bitmap
    with pytest.raises(TypeError, match="row 1: item 1 is not a str or None"):
        string_column([("a", "b"), ("a", 3)], 1)
    with pytest.raises(TypeError, match="row 0 is not a tuple with an item 2"):
        string_column([("a", "b")], 2)


@pytest.mark.slow
def test_the_memory_limit_grows_with_the_key_index_so_writes_never_run_out(tmp_path: Path) -> None:
    """DuckDB keeps the idempotency key's index in memory, and a write past memory_limit fails
    (with 16MB, after about 150,000 keys). The store adds room for the index of the stored
    events on top of the configured limit, at open and as events are stored."""
    from shapewatch.collector.settings import size_bytes

    assert (size_bytes("16MB"), size_bytes("1.5GB"), size_bytes("2 KiB"), size_bytes("100 bytes")) == (
        16_000_000,
        1_500_000_000,
        2048,
        100,
    )
    path = tmp_path / "memory.duckdb"
    store = Store.open(path, memory_limit="16MB")
    store.defer_rollups(max_events=10**9, max_seconds=float("inf"))  # counts are not the point here
    assert store.memory_limit_bytes == 16_000_000 + 100_000 * 64
    total = 0
    for b in range(60):
        batch = [
            parse_envelope(
                orjson.dumps(
                    {"event_id": f"k{b}-{i}", "model": "m", "prompt_version": "p", "contract": "c", "output": {"a": i}}
                ),
                LIMITS,
            )
            for i in range(5_000)
        ]
        assert {r.status for r in store.write_batch(batch)} == {WriteStatus.accepted}
        total += len(batch)
    assert store.query("SELECT count(*) FROM events") == [(total,)]
    assert store.memory_limit_bytes == 16_000_000 + (total + 100_000) * 64
    # DuckDB's own setting is what the store asked for (it shows MiB, to a tenth)
    shown = store.query("SELECT current_setting('memory_limit')")[0][0]
    assert shown.endswith(" MiB") and abs(float(shown.split()[0]) * 2**20 - store.memory_limit_bytes) < 0.1 * 2**20, (
        shown
    )
    store._con.close()  # no merge at close: only the keys matter
    with Store.open(path, memory_limit="16MB") as again:  # a restart starts with room for them all
        assert again.memory_limit_bytes == 16_000_000 + (total + 100_000) * 64
        assert {
            r.status
            for r in again.write_batch(
                [
                    parse_envelope(
                        orjson.dumps(
                            {"event_id": "after", "model": "m", "prompt_version": "p", "contract": "c", "output": {}}
                        ),
                        LIMITS,
                    )
                ]
            )
        } == {WriteStatus.accepted}


def test_running_out_of_memory_answers_503_naming_the_setting() -> None:
    from shapewatch.collector.store.connection import _store_error

    err = _store_error(
        "writing a batch",
        duckdb.OutOfMemoryException(
            "Out of Memory Error: failed to pin block of size 256.0 KiB (488.2 MiB/488.2 MiB used)"
        ),
    )
    assert isinstance(err, StoreUnavailable)
    assert str(err) == (
        "store cannot write right now: DuckDB ran out of memory while writing a batch (Out of "
        "Memory Error: failed to pin block of size 256.0 KiB (488.2 MiB/488.2 MiB used)); raise "
        "memory_limit (import_memory_limit for shapewatch ingest)"
    )
