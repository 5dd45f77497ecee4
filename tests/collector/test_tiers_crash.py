"""A fold killed with SIGKILL loses and doubles nothing: the crash test of the rollup tiers.

A minute-only store holds three weeks of history; a child process opens it with tiers and folds
(minutes into hours and days, one transaction), and is killed at a random moment of the fold.
Whatever the moment, the reopened file holds the same counts per tier bucket as before the fold
(the rows of the minute store summed into the buckets the tiers give them): the fold moves the
tier boundaries a step per transaction, and a kill leaves the steps that committed, each whole;
a fold run to the end afterwards gives what one uninterrupted fold gives. A fold changes no count but the values it stops keeping (beyond the cap,
or free text in hours and days), which move to the overflow count of their field: checked too.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from shapewatch.collector import Limits, import_files
from shapewatch.collector.rollup import ROLLUP_TABLES
from shapewatch.collector.store import Store
from shapewatch.collector.tiers import DAY, HOUR, TierPolicy

ROOT = Path(__file__).resolve().parents[2]
POLICY = TierPolicy(minute_seconds=24 * HOUR, hour_seconds=3 * DAY)
TABLES = {**ROLLUP_TABLES, "served_models": (["cohort_id", "bucket", "served_model"], ["n"])}
KILLS = 5

# The child: open with tiers, say it is folding, fold, say it is done.
CHILD = """
import sys
from shapewatch.collector.store import Store
from shapewatch.collector.tiers import TierPolicy
store = Store.open(sys.argv[1], tiers=TierPolicy(int(sys.argv[2]), int(sys.argv[3])))
print("folding", flush=True)
removed = store.fold_tiers()
print("folded", removed, flush=True)
store.close()
"""


def tier_sums(store: Store) -> dict[str, Counter[tuple[Any, ...]]]:
    """Every folded table summed per key, cohorts by name, each bucket moved to the one the tiers
    give it against its cohort's newest bucket (the same whether or not a fold ran)."""
    newest = {
        int(c): int(b)
        for c, b in store.query("SELECT cohort_id, epoch(max(bucket))::BIGINT FROM cohort_buckets GROUP BY ALL")
    }
    # a folded cohort's newest bucket may be an hour or a day one: tier_marks keeps its newest data
    for c, n in store.query("SELECT cohort_id, epoch(newest)::BIGINT FROM tier_marks"):
        newest[int(c)] = max(newest.get(int(c), 0), int(n))
    names = {
        int(i): (m, p, c)
        for i, m, p, c in store.query("SELECT cohort_id, model, prompt_version, contract FROM cohorts")
    }
    out = {}
    for table, (keys, sums) in TABLES.items():
        others = [k for k in keys if k not in ("cohort_id", "bucket")]
        rows = store.query(
            f"SELECT cohort_id, epoch(bucket)::BIGINT, {''.join(f'{k}, ' for k in others)}"
            f"{', '.join(f'sum({s})::BIGINT' for s in sums)} FROM {table} GROUP BY ALL"
        )
        total: Counter[tuple[Any, ...]] = Counter()
        for cohort_id, bucket, *rest in rows:
            b, _ = POLICY.start(bucket, newest[cohort_id])
            for i, s in enumerate(sums):
                total[(names[cohort_id], b, *rest[: len(others)], s)] += rest[len(others) + i]
        out[table] = +total
    return out


def strings(sums: dict[str, Counter[tuple[Any, ...]]]) -> Counter[tuple[Any, ...]]:
    """Per (cohort, bucket, path): values kept plus values counted as overflow."""
    out: Counter[tuple[Any, ...]] = Counter()
    for (cohort, bucket, path, _value, _), n in sums["value_rollups"].items():
        out[(cohort, bucket, path)] += n
    for (cohort, bucket, path, _scope, col), n in sums["field_rollups"].items():
        if col == "values_overflow":
            out[(cohort, bucket, path)] += n
    return +out


def history(path: Path) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    from gen import make_envelopes  # bench/ is not a package

    path.write_bytes(
        b"".join(
            orjson.dumps(e, option=orjson.OPT_APPEND_NEWLINE)
            for e in make_envelopes(40_000, seed=5, span=timedelta(days=21), cohorts=4)
        )
    )


def fold_child(db: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(db), str(POLICY.minute_seconds), str(POLICY.hour_seconds)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


@pytest.mark.slow
def test_a_fold_killed_at_any_moment_loses_and_doubles_nothing(tmp_path: Path) -> None:
    src = tmp_path / "history.jsonl"
    history(src)
    base = tmp_path / "base.duckdb"
    with Store.open(base) as store:  # minute buckets only: the fold has three weeks to move
        summary = import_files([src], store, Limits())
        assert summary.accepted == 40_000
        expected = tier_sums(store)
        minute_rows = sum(store.query(f"SELECT count(*) FROM {t}")[0][0] for t in TABLES)

    # How long a whole fold takes here, so the kills land inside it.
    whole = tmp_path / "whole.duckdb"
    shutil.copy(base, whole)
    child = fold_child(whole)
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "folding"
    began = time.monotonic()
    out, err = child.communicate(timeout=300)
    took = time.monotonic() - began
    assert child.returncode == 0, err
    # the report is all the child prints: nothing of DuckDB's (its progress bar, drawn on stdout
    # for a statement over two seconds, is off on the store's connection)
    report = out.removesuffix("\n")
    assert "\n" not in report, out
    assert report.startswith("folded ") and int(report.split()[1]) > 0
    with Store.open(whole, tiers=POLICY) as store:
        after = tier_sums(store)
        folded_rows = sum(store.query(f"SELECT count(*) FROM {t}")[0][0] for t in TABLES)
    assert folded_rows < minute_rows / 3
    assert {t: after[t] for t in TABLES if t not in ("value_rollups", "field_rollups")} == {
        t: expected[t] for t in TABLES if t not in ("value_rollups", "field_rollups")
    }
    assert strings(after) == strings(expected)  # kept values plus overflow, per field and bucket
    assert after["value_rollups"] != expected["value_rollups"]  # some values did go to overflow

    rng = random.Random(20261202)
    outcomes = Counter()
    for k in range(KILLS):
        db = tmp_path / f"kill{k}.duckdb"
        shutil.copy(base, db)
        child = fold_child(db)
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "folding"
        time.sleep(rng.uniform(0.05, 0.95) * took)
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=60)
        with Store.open(db, tiers=POLICY) as store:
            now = tier_sums(store)
            state = "untouched" if now == expected else "whole" if now == after else "between steps"
            outcomes[state] += 1
            # A fold moves the boundaries a step (two days) per transaction: killed between two,
            # the file holds the steps that committed, each whole. Every count but the values a
            # step stopped keeping is as before, and those are in their field's overflow.
            for t in TABLES:
                if t not in ("value_rollups", "field_rollups"):
                    assert now[t] == expected[t], f"kill {k}: {t} changed"
            assert strings(now) == strings(expected), f"kill {k}: values lost or doubled"
            assert {key: n for key, n in now["field_rollups"].items() if key[-1] != "values_overflow"} == {
                key: n for key, n in expected["field_rollups"].items() if key[-1] != "values_overflow"
            }, f"kill {k}: field counts changed"
            store.fold_tiers()  # the fold run again, to its end
            assert tier_sums(store) == after, f"kill {k}: the fold after the kill counts otherwise"
            assert store.fold_tiers() == 0
    assert outcomes["whole"] < KILLS, outcomes  # the kills did land inside folds
