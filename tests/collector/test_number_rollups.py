"""Number histograms in the rollups: the bins, the C accumulator held to the Python
reference ``rollup.number_bin``, windows that are the merge of their parts and a
recomputation from the raw outputs, compaction, and a database of schema version 3
migrated (and its unmerged events re-rolled) on open.

TIMESTAMPTZ values are read as epoch seconds (DuckDB's Python conversion needs pytz).
"""

from __future__ import annotations

import itertools
import math
import sys
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pytest
from harness import make_envelope
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_rollup import (
    T1200,
    chunks,
    numbers_of,
    open_store,
    random_envelopes,
    rollup_sums,
    rows_per_key,
    write_all,
)

from shapewatch.collector.accel import speedups
from shapewatch.collector.envelope import LIMITS, Envelope, parse_envelope
from shapewatch.collector.profile import read_profile
from shapewatch.collector.rollup import ROLLUP_TABLES, RollupBatch, RollupConfig, number_bin
from shapewatch.collector.store import MIGRATIONS, SCHEMA_VERSION, Store

PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DBL_MAX = sys.float_info.max
GAMMA = 1.02
NumberRows = Counter[tuple[Any, ...]]


def parse(raw: dict[str, Any]) -> Envelope:
    return parse_envelope(orjson.dumps(raw), LIMITS)


def log_bin(x: float) -> float:
    """The representative of x's logarithmic bin, written out from the definition."""
    k = math.ceil(math.log(abs(x)) / math.log(GAMMA))
    return math.copysign(2 * GAMMA**k / (GAMMA + 1), x)


# --- the bins -----------------------------------------------------------------------------------------


def test_small_integers_are_exact_and_everything_else_is_binned() -> None:
    assert [number_bin(i) for i in (-100, -7, 0, 1, 42, 100)] == [-100.0, -7.0, 0.0, 1.0, 42.0, 100.0]
    assert [number_bin(x) for x in (101, -101, 1.0, 3.0, 0.5, 1234.5, -1e15)] == [
        log_bin(101),
        log_bin(-101),
        2 / 2.02,
        log_bin(3.0),
        log_bin(0.5),
        log_bin(1234.5),
        log_bin(-1e15),
    ]
    assert number_bin(1.02) == 2 * 1.02 / 2.02  # log(1.02) / log(1.02) is exactly 1: the top of bin 1
    assert number_bin(-3.0) == -number_bin(3.0)
    assert number_bin(2**64 - 1) == log_bin(float(2**64 - 1))


def test_tiny_values_are_zero_and_the_extremes_stay_finite_or_infinite() -> None:
    for tiny in (1e-10, -1e-10, 5e-324, -0.0, 0.0, 9.99e-10):
        assert number_bin(tiny) == 0.0 and math.copysign(1.0, number_bin(tiny)) == 1.0
    assert number_bin(1e-9) == log_bin(1e-9) != 0.0
    # in the top bin 1.02**k overflows a double, its representative does not
    top = 1.7849871279102503e308
    assert number_bin(DBL_MAX) == top and number_bin(-DBL_MAX) == -top and number_bin(top) == top
    assert abs(top - DBL_MAX) <= 0.01 * DBL_MAX
    assert number_bin(10**400) == math.inf and number_bin(-(10**400)) == -math.inf  # no double holds them
    assert number_bin(math.inf) == math.inf
    assert math.isnan(number_bin(math.nan))
    with pytest.raises(TypeError):
        number_bin(True)


_FINITE = st.floats(allow_nan=False, allow_infinity=False)
_BIG_INTS = st.integers(-(10**307), 10**307)


@PROPERTY
@given(x=_FINITE | _BIG_INTS | st.sampled_from([1e-9, -1e-9, DBL_MAX, -DBL_MAX, 1.7e308, 101, 2**53 + 1]))
def test_the_relative_error_of_a_bin_is_at_most_one_percent(x: float | int) -> None:
    rep = number_bin(x)
    if abs(x) < 1e-9:
        assert rep == 0.0
    else:
        assert math.isfinite(rep) and (rep > 0) == (x > 0)
        assert abs(rep - x) <= 0.01 * abs(x)
    if isinstance(x, int) and abs(x) <= 100:
        assert rep == x


@PROPERTY
@given(x=_FINITE, y=_FINITE)
def test_bins_keep_the_order_of_numbers(x: float, y: float) -> None:
    lo, hi = min(x, y), max(x, y)
    assert number_bin(lo) <= number_bin(hi)


# --- the C accumulator against the reference ------------------------------------------------------------


def accumulated(outputs: list[dict[str, Any]]) -> NumberRows:
    """(path, representative) -> count, as the accumulator built them for one batch."""
    batch = RollupBatch(RollupConfig(), bucket_seconds=60)
    for output in outputs:
        batch.add(output, ("m", "p", "c", "production"), datetime(2026, 11, 29, 12, tzinfo=UTC))
    _, f, _, _, _ = batch.tables()
    paths = f.column("path").to_pylist()
    out: NumberRows = Counter()
    for row in batch.number_table().to_pylist():
        key = (paths[row["slot"]], row["value"])
        assert key not in out, f"two rows for {key}"  # one row per bin and slot
        out[key] = row["n"]
    return out


def reference(outputs: list[dict[str, Any]]) -> NumberRows:
    return Counter(pair for output in outputs for pair in numbers_of(output))


_EDGES = st.sampled_from(
    [
        0,
        -0.0,
        100,
        -100,
        101,
        -101,
        1.0,
        1.02,
        1e-9,
        -1e-9,
        9.999999999e-10,
        5e-324,
        DBL_MAX,
        -DBL_MAX,
        2**63 - 1,
        -(2**63),
        2**63,
        2**64 - 1,
        2**64,
        10**400,
        -(10**400),
        math.inf,
        -math.inf,
        0.1,
        1e300,
        True,
        False,
        None,
        "5",
    ]
)
_NUMBERS = st.integers() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | _EDGES
_OUTPUTS = st.lists(
    st.fixed_dictionaries(
        {"x": _NUMBERS, "items": st.lists(_NUMBERS, max_size=4), "nested": st.fixed_dictionaries({"y": _NUMBERS})}
    ),
    max_size=6,
)


@PROPERTY
@given(outputs=_OUTPUTS)
def test_the_accumulator_bins_numbers_as_number_bin_does(outputs: list[dict[str, Any]]) -> None:
    assert accumulated(outputs) == reference(outputs)


def test_the_accumulator_on_a_hand_written_batch() -> None:
    outputs: list[dict[str, Any]] = [
        {"a": 7, "b": [1, 1, 2.5, True, None, [3]], "c": {"d": -0.0}},
        {"a": 7.0, "b": [], "c": {"d": 1e-12}, "e": "7"},
        {"a": False, "b": [250]},
    ]
    assert accumulated(outputs) == {
        ("a", 7.0): 1,
        ("a", log_bin(7.0)): 1,  # an int up to 100 is exact, a float is binned
        ("b[]", 1.0): 2,
        ("b[]", log_bin(2.5)): 1,
        ("b[]", log_bin(250)): 1,
        ("b[][]", 3.0): 1,
        ("c.d", 0.0): 2,
    }


def test_every_bin_has_its_own_value_in_both_implementations() -> None:
    # One number inside each logarithmic bin of the finite doubles, both signs. The merge
    # relies on this: within a batch, (path, value) is one row (no two bins share a value).
    inside = [GAMMA ** (k - 0.5) for k in range(-1045, 35844)]
    reps = [number_bin(x) for x in inside]
    assert all(a < b for a, b in itertools.pairwise(reps))  # one value per bin, in order
    assert not {r for r in reps if r <= 100 and r == int(r)}  # never an exact small integer's value
    outputs = [{"x": inside}, {"x": [-x for x in inside]}, {"x": list(range(-100, 101))}]
    got = accumulated(outputs)
    assert got == reference(outputs) and len(got) == 2 * len(inside) + 201


def test_nan_has_no_bin_in_the_accumulator() -> None:
    names: list[tuple[int, str | None]] = []

    def namer(parent: int, key: str | None) -> int:
        names.append((parent, key))
        return len(names) - 1

    acc = speedups.Acc(namer, 64)
    acc.add({"x": math.nan, "y": [math.nan, 2]}, 0)
    slots, values, counts = acc.rows(2)
    assert (len(slots), len(values), len(counts)) == (8, 8, 8)  # one row: y[] = 2
    with pytest.raises(ValueError):
        acc.rows(3)


# --- in the store: windows, recomputation, compaction ------------------------------------------------------


def number_rows(store: Store, since: int | None = None, until: int | None = None) -> NumberRows:
    """(cohort id, path, value) -> n over [since, until), buckets summed away."""
    where = [f"epoch(bucket) >= {since}"] if since is not None else []
    where += [f"epoch(bucket) < {until}"] if until is not None else []
    cond = f"WHERE {' AND '.join(where)}" if where else ""
    return Counter(
        {
            (c, p, v): n
            for c, p, v, n in store.query(
                f"SELECT cohort_id, path, value, sum(n)::BIGINT FROM number_rollups {cond} GROUP BY ALL"
            )
        }
    )


def recomputed(store: Store, since: int, until: int) -> NumberRows:
    out: NumberRows = Counter()
    for cohort_id, output in store.query(
        f"SELECT cohort_id, output FROM cohort_events WHERE epoch(ts) >= {since} AND epoch(ts) < {until}"
    ):
        for path, value in numbers_of(orjson.loads(output)):
            out[(cohort_id, path, value)] += 1
    return out


def test_a_window_histogram_is_the_merge_of_its_parts_and_the_recomputation(store: Store, tmp_path: Path) -> None:
    events = random_envelopes(make_envelope, 400, seed=21)
    write_all(store, chunks(events, [30, 1, 70]))
    window = number_rows(store, T1200, T1200 + 180)
    parts = [number_rows(store, T1200 + 60 * m, T1200 + 60 * (m + 1)) for m in range(3)]
    assert window == sum(parts, Counter()) == recomputed(store, T1200, T1200 + 180)
    assert sum(window.values()) > 400 and len({v for _, _, v in window}) > 50
    # another store, another batching and order: the same histograms
    other = open_store(tmp_path, "other")
    write_all(other, chunks(events[::-1], [200]))
    assert rollup_sums(other)["number_rollups"] == rollup_sums(store)["number_rollups"]
    other.close()


def test_deferred_merges_add_up_to_the_same_histograms(tmp_path: Path) -> None:
    events = random_envelopes(make_envelope, 200, seed=22)
    with Store.open(tmp_path / "now.duckdb") as now:
        write_all(now, chunks(events, [200]))
        expected = rollup_sums(now)
    db = tmp_path / "deferred.duckdb"
    store = Store.open(db)
    store.defer_rollups(max_events=120, max_seconds=3600)
    write_all(store, chunks(events, [20]))  # 120 merged at once from 6 batches, 80 pending
    store._con.close()  # a crash before the last merge (private on purpose)
    with Store.open(db) as reopened:  # rolls up the 80 again, numbers included
        assert rollup_sums(reopened) == expected
        assert rows_per_key(reopened)["number_rollups"] > 1


def test_compaction_keeps_number_sums_and_leaves_one_row_per_bin(store: Store) -> None:
    write_all(store, chunks(random_envelopes(make_envelope, 150, seed=23), [5, 11]))
    before = rollup_sums(store)["number_rollups"]
    assert rows_per_key(store)["number_rollups"] > 1
    assert store.compact() > 0
    assert rollup_sums(store)["number_rollups"] == before
    assert rows_per_key(store)["number_rollups"] == 1
    assert "number_rollups" in ROLLUP_TABLES


# --- migration from schema version 3 --------------------------------------------------------------------------


def _v3_file(path: Path, outputs: list[tuple[str, dict[str, Any]]], watermark: str) -> None:
    """A database as schema version 3 left it (built without the Store): events received at
    12:05 (rolled up, up to the watermark) and at 12:10 (stored, not yet rolled up)."""
    con = duckdb.connect(str(path))
    for migration in MIGRATIONS[:3]:
        con.execute(migration.replace("{bucket}", "60"))
    con.execute("INSERT INTO meta VALUES ('schema_version', '3'), ('bucket_seconds', '60')")
    con.execute("INSERT INTO meta SELECT 'rollups_through', epoch_us(?::TIMESTAMPTZ)::VARCHAR", [watermark])
    con.execute(
        "INSERT INTO cohorts VALUES (nextval('cohort_seq'), 'm-old', 'p1', 'intake', "
        "TIMESTAMPTZ '2026-11-29 12:00:00+00')"
    )
    for i, (received, output) in enumerate(outputs):
        con.execute(
            """INSERT INTO events (id_key, event_id, payload_hash, generated_id, cohort_id, ts, received_at,
                                   served_model, contract_version, source, run_id, agent_release,
                                   finish_reason, attributes, output)
               VALUES (md5_number($id), $id, 'hash-' || $id, false, 1, TIMESTAMPTZ '2026-11-29 12:00:30+00',
                       $received::TIMESTAMPTZ, NULL, '3', 'production', NULL, NULL, 'stop', NULL, $output)""",
            {"id": f"old-{i}", "received": received, "output": orjson.dumps(output).decode()},
        )
    con.close()


def test_a_v3_file_gets_the_table_and_its_unmerged_events_are_rolled_up(db_path: Path) -> None:
    rolled = ("2026-11-29 12:05:00+00", {"score": 0.75, "n": 3})
    unmerged = [
        ("2026-11-29 12:10:00+00", {"score": 12.5, "n": [1, 2, 1000]}),
        ("2026-11-29 12:10:01+00", {"score": -0.75, "flag": True}),
    ]
    _v3_file(db_path, [rolled, *unmerged], watermark="2026-11-29 12:05:00+00")
    with Store.open(db_path) as store:
        assert store.query("SELECT value FROM meta WHERE key = 'schema_version'") == [(str(SCHEMA_VERSION),)]
        assert store.query(
            "SELECT column_name, data_type FROM duckdb_columns() WHERE table_name = 'number_rollups'"
            " ORDER BY column_index"
        ) == [
            ("cohort_id", "INTEGER"),
            ("bucket", "TIMESTAMP WITH TIME ZONE"),
            ("path", "VARCHAR"),
            ("value", "DOUBLE"),
            ("n", "BIGINT"),
        ]
        # events after the watermark are rolled up, numbers included; the history is not re-read
        assert number_rows(store) == Counter(
            {
                (1, "score", number_bin(12.5)): 1,
                (1, "score", number_bin(-0.75)): 1,
                (1, "n[]", 1.0): 1,
                (1, "n[]", 2.0): 1,
                (1, "n[]", number_bin(1000)): 1,
            }
        )
        assert store.query("SELECT epoch(bucket)::BIGINT, sum(events)::BIGINT FROM cohort_buckets GROUP BY ALL") == [
            (T1200, 2)
        ]
        # and the migrated file takes writes with their numbers
        store.write_batch(
            [
                parse(
                    make_envelope(
                        event_id="new",
                        ts="2026-11-29T12:00:40Z",
                        model="m-old",
                        served_model=None,
                        prompt_version="p1",
                        output={"score": 0.75},
                    )
                )
            ]
        )
        assert number_rows(store)[(1, "score", number_bin(0.75))] == 1
    with Store.open(db_path) as again:  # reopening re-rolls nothing twice
        assert sum(number_rows(again).values()) == 6


def test_an_empty_v3_file_migrates_to_an_empty_table(db_path: Path) -> None:
    _v3_file(db_path, [], watermark="2026-11-29 12:00:00+00")
    with Store.open(db_path) as store:
        assert store.query("SELECT count(*) FROM number_rollups") == [(0,)]
        assert store.healthcheck() == {"schema_version": SCHEMA_VERSION, "events": 0}


def test_profiles_read_a_window_through_the_migration(db_path: Path) -> None:
    _v3_file(db_path, [("2026-11-29 12:10:00+00", {"score": 5})], watermark="2026-11-29 12:05:00+00")
    with Store.open(db_path) as store:
        t0 = datetime(2026, 11, 29, 12, tzinfo=UTC)
        p = read_profile(store, 1, t0, t0 + timedelta(hours=1))
        assert p.fields["score"].numbers == {5.0: 1}
        assert p.fields["score"].number_percentile(0.5) == 5.0


def test_value_rows_are_the_values_as_arrow_buffers() -> None:
    """value_rows() packs what rows(0) lists: the same (slot, value, count) rows, in the same
    order, as the buffers of Arrow columns (non-ASCII, empty and 64-character values included)."""
    import pyarrow as pa

    names: list[tuple[int, str | None]] = []

    def namer(parent: int, key: str | None) -> int:
        names.append((parent, key))
        return len(names) - 1

    acc = speedups.Acc(namer, 64)
    values = ["", "a", "é", "日本語", "😀x", "z" * 64, "z" * 65, "a"]
    for i, v in enumerate(values):
        acc.add({"s": v, "t": {"u": [v, "k"]}, "n": i}, i % 3)
    slots, keys, counts = acc.rows(0)
    vs, voff, vdata, vn = acc.value_rows()
    rows = len(vs) // 8
    column = pa.Array.from_buffers(pa.string(), rows, [None, pa.py_buffer(voff), pa.py_buffer(vdata)])
    column.validate(full=True)
    got = list(
        zip(
            pa.Array.from_buffers(pa.int64(), rows, [None, pa.py_buffer(vs)]).to_pylist(),
            column.to_pylist(),
            pa.Array.from_buffers(pa.int64(), rows, [None, pa.py_buffer(vn)]).to_pylist(),
            strict=True,
        )
    )
    assert got == list(zip(slots, keys, counts, strict=True))
    assert len(voff) == 4 * (rows + 1) and len(vdata) == sum(len(k.encode()) for k in keys)
    assert sorted({k for _, k, _ in got}) == sorted(set(values) - {"z" * 65} | {"k"})  # 65 chars: too long
    assert speedups.Acc(namer, 64).value_rows() == (b"", b"\x00\x00\x00\x00", b"", b"")
