"""Analysis benchmark: one full evaluation at two traffic levels, beside a raw scan of the outputs.

    .venv/bin/python bench/analyze.py [--small] [--workdir DIR] [--keep] [--strict] [--json OUT]

Steps (see bench/README.md, "The analysis benchmark"):

1. generate a baseline day and a 24-hour window of envelopes (``gen.py``, spread over
   10 cohorts) and import both for real (``collector.import_files``);
2. compact the rollups, freeze and activate one baseline per cohort over the baseline day;
3. keep a copy of that database, then grow the window tenfold inside DuckDB (copies of its
   events with new ids and timestamps in the same buckets, and the same counts added to the
   rollups, which is what importing the copies would give; checked on a small sample first)
   and compact;
4. measure both sizes in turn, each in a fresh process, three rounds: ``evaluate`` and
   ``Analyzer.run`` at the end of the window (one warm-up, then three of each), and in the
   first round DuckDB scanning the window's raw outputs; a ratio between the sizes is the
   median of the rounds' ratios, which a drift of the machine's speed moves little;
5. distinct-value density: copies add counts, never rollup rows, so for each size the
   first hour at that rate is imported for real, its rollups repeated over 24 hours,
   and the evaluations measured again (``--skip-density`` leaves this out).

It prints the figures and a PASS/FAIL line per target; the exit code is 1 on a FAIL
only with ``--strict`` (2 on a usage error).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime, timedelta
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import orjson
from gen import END, SPAN, make_envelopes  # bench/ is sys.path[0] when this file runs as a script
from ingest import MeasuredProcess

MAX_EVAL_SECONDS = 2.0  # one evaluation at the larger size
MAX_GROWTH = 1.5  # evaluation time at the larger size / at the smaller one
GROWTH_FACTOR = 10  # the larger size is this many times the smaller one
REPEAT = 3
ROUNDS = 3  # the two sizes measured in turn, each in a fresh process, this many times
CHECK_N, CHECK_FACTOR = 10_000, 4  # the replication check: events imported, copies made by SQL

AT = END  # evaluations are made at the end of the window
WINDOW_SINCE = END - SPAN
BASELINE_SINCE = END - 2 * SPAN
COPY_MARK = "~r"  # event ids of copies: f"{event_id}~r{k}"
SUFFIX = "-eu"  # half the traffic of each of gen.py's five cohorts goes to a second prompt version


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _mib(n: float) -> str:
    return f"{n / (1 << 20):,.0f} MiB"


def _peak_rss() -> int:
    """Bytes: ru_maxrss of this process (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# --- data ------------------------------------------------------------------------------------

def envelopes(n: int, seed: int, start: datetime) -> Iterator[dict[str, Any]]:
    """``gen.make_envelopes`` over 10 cohorts: every other envelope moves to prompt version + ``-eu``."""
    for i, env in enumerate(make_envelopes(n, seed=seed, start=start)):
        if i & 1:
            env["prompt_version"] += SUFFIX
        yield env


def write_file(path: Path, n: int, seed: int, start: datetime) -> tuple[int, float]:
    """Write ``n`` envelopes as JSONL; returns (bytes, seconds)."""
    began = time.perf_counter()
    dumps, newline = orjson.dumps, orjson.OPT_APPEND_NEWLINE
    written = 0
    chunk: list[bytes] = []
    with open(path, "wb") as out:
        for env in envelopes(n, seed, start):
            chunk.append(dumps(env, option=newline))
            if len(chunk) == 10_000:
                written += out.write(b"".join(chunk))
                chunk.clear()
        written += out.write(b"".join(chunk))
    return written, time.perf_counter() - began


def _write_job(job: tuple[str, int, int, str]) -> tuple[int, float]:
    path, n, seed, start = job
    return write_file(Path(path), n, seed, datetime.fromisoformat(start))


def write_files(jobs: list[tuple[Path, int, int, datetime]]) -> list[tuple[int, float]]:
    """Write several files at once, one process each (the generator is pure Python)."""
    with ProcessPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1),
                             mp_context=get_context("fork")) as pool:
        return list(pool.map(_write_job, [(str(p), n, s, t.isoformat()) for p, n, s, t in jobs]))


def open_store(path: Path, args: argparse.Namespace) -> Any:
    from shapewatch.analysis.alerts import ALERTS_SCHEMA
    from shapewatch.baselines import BASELINES_SCHEMA
    from shapewatch.collector import Store
    from shapewatch.collector.tiers import TierPolicy
    # Rollup tiers as the service keeps them by default (the baseline day, a day back, in hours).
    return Store.open(path, memory_limit=args.memory_limit, threads=args.threads,
                      schemas=[BASELINES_SCHEMA, ALERTS_SCHEMA], tiers=TierPolicy())


def import_all(store: Any, paths: list[Path]) -> tuple[dict[str, Any], float]:
    from shapewatch.collector import Limits, import_files
    began = time.perf_counter()
    summary = import_files(paths, store, Limits())
    return summary.as_dict(), time.perf_counter() - began


# --- growing the window inside DuckDB -------------------------------------------------------

def shift_us(k: int, factor: int, bucket_us: int) -> int:
    """How far copy ``k`` moves within its bucket (whole milliseconds, so ts stay ms-precise)."""
    return k * (bucket_us // factor) // 1000 * 1000


def copy_ts(ts_us: int, k: int, factor: int, bucket_us: int) -> int:
    """The timestamp of copy ``k`` of an event at ``ts_us``: the same bucket, moved by ``shift_us``."""
    start = ts_us - ts_us % bucket_us
    return start + (ts_us - start + shift_us(k, factor, bucket_us)) % bucket_us


def replicate(store: Any, since: datetime, until: datetime, factor: int) -> dict[str, float]:
    """Make the events of ``[since, until)`` ``factor`` times as many, rollups included.

    Copy k (1 .. factor - 1) of an event has event id ``{id}~r{k}``, the key
    ``md5_number`` of it, a timestamp moved within its bucket (``copy_ts``), and the
    original's output, cohort, tags and received_at (at or before the rollup watermark,
    so a later open does not roll it up again). Its payload hash is a stand-in
    (md5 of the original's and k): ingest would hash the moved ts too.

    Rollups: importing an output again into the same bucket adds exactly its counts
    (kept values are kept again, overflowed ones overflow again), so every rollup row
    of those buckets is added once more with its counts times ``factor - 1``; served
    models (one row per key) are multiplied in place. Call it with no rollups pending.
    """
    from shapewatch.collector.rollup import ROLLUP_TABLES
    bucket_us = store.bucket_seconds * 1_000_000
    if (since.timestamp() * 1_000_000) % bucket_us or (until.timestamp() * 1_000_000) % bucket_us:
        raise ValueError("the window must start and end on bucket boundaries")
    store.flush_rollups()
    times: dict[str, float] = {}
    window = {"since": since, "until": until}
    m = factor - 1
    began = time.perf_counter()
    # One transaction: each commit of a table with a primary key costs a checkpoint that
    # grows with the table (measured: 15 s per commit at 10M events).
    with store.transaction("copying events and rollups") as con:
        for k in range(1, factor):
            shift = shift_us(k, factor, bucket_us)
            con.execute(
                f"""INSERT INTO events (id_key, event_id, payload_hash, generated_id, cohort_id, ts, received_at,
                                        served_model, contract_version, source, run_id, agent_release,
                                        finish_reason, attributes, output)
                    SELECT md5_number(event_id || '{COPY_MARK}{k}'), event_id || '{COPY_MARK}{k}',
                           md5(payload_hash || '{COPY_MARK}{k}'), generated_id, cohort_id,
                           ts + to_microseconds((epoch_us(ts) % {bucket_us} + {shift}) % {bucket_us}
                                                - epoch_us(ts) % {bucket_us}),
                           received_at, served_model, contract_version, source, run_id, agent_release,
                           finish_reason, attributes, output
                    FROM events
                    WHERE ts >= $since AND ts < $until AND NOT contains(event_id, '{COPY_MARK}')""", window)
            _log(f"    events, copy {k} of {m}: {time.perf_counter() - began:.1f} s")
        times["events"] = time.perf_counter() - began
        began = time.perf_counter()
        for table, (keys, sums) in ROLLUP_TABLES.items():
            k_cols = ", ".join(keys)
            con.execute(f"""INSERT INTO {table} ({k_cols}, {', '.join(sums)})
                            SELECT {k_cols}, {', '.join(f'{c} * {m}' for c in sums)} FROM {table}
                            WHERE bucket >= $since AND bucket < $until""", window)
        con.execute("UPDATE served_models SET n = n * $f WHERE bucket >= $since AND bucket < $until",
                    {**window, "f": factor})
        times["rollups"] = time.perf_counter() - began
        began = time.perf_counter()
    times["commit"] = time.perf_counter() - began
    return times


def _copy_envelope(env: dict[str, Any], k: int, factor: int, bucket_us: int) -> dict[str, Any]:
    """What ``replicate`` makes of ``env`` as copy ``k``, as an envelope to import."""
    ts = datetime.fromisoformat(env["ts"].replace("Z", "+00:00"))
    us = (ts - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    moved = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=copy_ts(us, k, factor, bucket_us))
    return {**env, "event_id": f"{env['event_id']}{COPY_MARK}{k}",
            "ts": moved.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moved.microsecond // 1000:03d}Z"}


_EVENTS_DIGEST = """SELECT count(*), sum(hash(id_key, event_id, cohort_id, ts, served_model, contract_version,
                                           source, attributes, output)::HUGEINT) FROM events"""


def check_replication(workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Replicate a small window by SQL in one file and import the same copies in another; compare."""
    from shapewatch.collector import read_profiles
    from shapewatch.collector.rollup import ROLLUP_TABLES
    n, factor = CHECK_N, CHECK_FACTOR
    sample = list(envelopes(n, seed=args.seed + 1000, start=WINDOW_SINCE))
    dumps, newline = orjson.dumps, orjson.OPT_APPEND_NEWLINE
    originals, copies = workdir / "check-originals.jsonl", workdir / "check-copies.jsonl"
    originals.write_bytes(b"".join(dumps(e, option=newline) for e in sample))
    out: dict[str, Any] = {"events": n, "factor": factor}
    results = []
    for name in ("sql", "ingest"):
        with open_store(workdir / f"check-{name}.duckdb", args) as store:
            bucket_us = store.bucket_seconds * 1_000_000
            if name == "sql":
                import_all(store, [originals])
                replicate(store, WINDOW_SINCE, AT, factor)
            else:
                copies.write_bytes(b"".join(dumps(_copy_envelope(e, k, factor, bucket_us), option=newline)
                                            for k in range(1, factor) for e in sample))
                import_all(store, [originals, copies])
            store.compact_by_day()
            profiles = read_profiles(store, WINDOW_SINCE, AT)
            rows = {t: store.query(f"SELECT count(*) FROM {t}")[0][0] for t in [*ROLLUP_TABLES, "served_models"]}
            results.append((profiles, store.query(_EVENTS_DIGEST)[0], rows))
    (p_sql, e_sql, r_sql), (p_ing, e_ing, r_ing) = results
    out["events_stored"] = int(e_sql[0])
    out["cohorts"] = len(p_sql)
    out["fields"] = sum(len(p.fields) for p in p_sql)
    out["profiles_equal"] = p_sql == p_ing
    out["events_equal"] = e_sql == e_ing
    out["rollup_rows_equal"] = r_sql == r_ing
    if not out["profiles_equal"]:
        out["first_difference"] = _first_difference(p_sql, p_ing)
    out["passed"] = bool(out["profiles_equal"] and out["events_equal"] and out["rollup_rows_equal"]
                         and out["events_stored"] == n * factor)
    return out


def _first_difference(a: list[Any], b: list[Any]) -> str:
    if len(a) != len(b):
        return f"{len(a)} profiles against {len(b)}"
    for pa, pb in zip(a, b, strict=True):
        if pa.events != pb.events or pa.served_models != pb.served_models:
            return f"cohort {pa.cohort_id}: events {pa.events}/{pb.events}, served {pa.served_models}/{pb.served_models}"
        for path in sorted(set(pa.fields) | set(pb.fields)):
            if pa.fields.get(path) != pb.fields.get(path):
                return f"cohort {pa.cohort_id}, {path}: {pa.fields.get(path)} != {pb.fields.get(path)}"
    return "profiles differ outside their fields"


# --- the measured child -----------------------------------------------------------------------

def _timed(fn: Callable[[], Any], repeat: int) -> tuple[list[float], Any]:
    """One warm-up call, then ``repeat`` timed ones; returns the times and the last result."""
    result = fn()
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - began)
    return times, result


def measure(db: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Runs in a fresh process: open the store, time the evaluations, then the raw scans."""
    from prometheus_client import CollectorRegistry

    from shapewatch.analysis.analyzer import Analyzer, evaluate
    from shapewatch.analysis.config import AnalyzerConfig
    out: dict[str, Any] = {"load_before": os.getloadavg()[0]}
    began = time.perf_counter()
    store = open_store(db, args)
    out["open_seconds"] = time.perf_counter() - began
    with store:
        config = AnalyzerConfig()
        since = AT - config.window
        out["events_in_window"] = store.query("SELECT count(*) FROM events WHERE ts >= ? AND ts < ?",
                                              [since, AT])[0][0]
        out["rollup_rows"] = {t: store.query(f"SELECT count(*) FROM {t}")[0][0] for t in
                              ("cohort_buckets", "field_rollups", "value_rollups", "array_rollups",
                               "number_rollups", "served_models")}
        out["evaluate"], evaluation = _timed(lambda: evaluate(store, config, AT), args.repeat)
        out["cohorts"] = len(evaluation.cohorts)
        out["with_baseline"] = sum(1 for c in evaluation.cohorts if c.baseline_id is not None)
        out["fields"] = sum(len(c.presence) for c in evaluation.cohorts)
        out["checks"], out["breaches"] = evaluation.checks, evaluation.breaches
        analyzer = Analyzer(store, config, registry=CollectorRegistry())

        def run_once() -> Any:
            result = analyzer.run(AT)
            if not result.ok:
                raise RuntimeError(f"Analyzer.run failed: {result.error}")
            return result

        out["run"], result = _timed(run_once, args.repeat)
        out["run_internal"] = result.duration_seconds  # evaluate + alert steps, before its commit
        out["open_alerts"] = store.query("SELECT count(*) FROM alerts WHERE state <> 'resolved'")[0][0]
        out["peak_rss_evaluation"] = out["peak_rss"] = _peak_rss()
        out["load_after"] = os.getloadavg()[0]
        if args.no_scans:
            return out
        window = [since, AT]
        out["scan_plain"], _ = _timed(lambda: store.query(
            "SELECT count(*), sum(length(output)) FROM events WHERE ts >= ? AND ts < ?", window), args.repeat)
        out["scan_json"], _ = _timed(lambda: store.query(
            "SELECT count(json_extract_string(output, '$.priority')) FROM events WHERE ts >= ? AND ts < ?",
            window), args.repeat)
        out["peak_rss"] = _peak_rss()
    return out


def measure_in_child(db: Path, args: argparse.Namespace, workdir: Path, name: str, *,
                     scans: bool = True) -> dict[str, Any]:
    """``measure`` in a fresh interpreter (started through ingest.py's launcher, so that its peak
    RSS is its own and not this process's)."""
    argv = [sys.executable, str(Path(__file__).resolve()), "--measure", str(db),
            "--memory-limit", args.memory_limit, "--threads", str(args.threads), "--repeat", str(args.repeat),
            *([] if scans else ["--no-scans"])]
    child = MeasuredProcess(argv, workdir, name)
    finished = child.wait()
    if finished.returncode != 0:
        raise RuntimeError(f"the measuring child failed ({finished.returncode}):\n{child.stderr_tail(30)}")
    figures: dict[str, Any] = json.loads(child.stdout_path.read_text())
    figures["process_seconds"] = finished.seconds
    figures["process_peak_rss"] = finished.peak_rss
    return figures


def measure_alternating(dbs: Sequence[tuple[int, Path]], args: argparse.Namespace, workdir: Path, name: str, *,
                        scans: bool = True) -> list[dict[str, Any]]:
    """Each (size, database) measured in a fresh child, the sizes in turn, ``args.rounds`` times.

    The raw scans run in the first round only (they take minutes at the larger size). Each size's
    figures are those of its first round, with the evaluations and runs of every round (``evaluate``
    and ``run``), each round's median (``evaluate_rounds``, ``run_rounds``), so that a ratio between
    sizes is taken round by round, between measurements a few seconds apart.
    """
    rounds: list[list[dict[str, Any]]] = []
    for r in range(args.rounds):
        row = []
        for i, (size, db) in enumerate(dbs):
            _log(f"measuring at {size:,} events, round {r + 1} of {args.rounds} (fresh process)...")
            row.append(measure_in_child(db, args, workdir, f"{name}-{i}-{r}", scans=scans and r == 0))
        rounds.append(row)
    out = []
    for i, (size, _) in enumerate(dbs):
        m = {"size": size, **rounds[0][i]}
        for key in ("evaluate", "run"):
            m[f"{key}_rounds"] = [statistics.median(row[i][key]) for row in rounds]
            m[key] = [t for row in rounds for t in row[i][key]]
        out.append(m)
    return out


# --- distinct-value density -----------------------------------------------------------------

def repeat_first_hour(store: Any, since: datetime, hours: int) -> None:
    """Copy the rollup rows of ``[since, since + 1 h)`` into each following hour up to ``hours``."""
    from shapewatch.collector.rollup import ROLLUP_TABLES
    tables = {**ROLLUP_TABLES, "served_models": (["cohort_id", "bucket", "served_model"], ["n"])}
    with store.transaction("repeating an hour of rollups") as con:
        for table, (keys, sums) in tables.items():
            cols = [*keys, *sums]
            picked = ", ".join("bucket + to_hours(r.h)" if c == "bucket" else c for c in cols)
            con.execute(f"""INSERT INTO {table} ({', '.join(cols)}) SELECT {picked}
                            FROM {table}, range(1, $hours) r(h) WHERE bucket >= $since AND bucket < $until""",
                        {"hours": hours, "since": since, "until": since + timedelta(hours=1)})


def density_check(main_db: Path, workdir: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Evaluations over rollups with the distinct values of real traffic at each size.

    Copies of the same outputs (``replicate``) add counts to the rollup rows that exist,
    never rows: the number of distinct values and number bins per bucket stays that of the
    smaller size. Real traffic at ten times the rate meets more distinct values in each
    bucket (up to ``enum_values_per_path`` per path). Here the first hour at each rate is
    imported for real and its rollups repeated over the other 23 hours (every hour of
    gen.py's traffic is alike), with the main database's baselines. No raw events beyond
    that hour: only the evaluation is measured.
    """
    with open_store(main_db, args) as store:
        baselines = store.query("SELECT * FROM baselines")
        activations = store.query("SELECT * FROM baseline_activations")
    built: list[tuple[int, Path]] = []
    hours: dict[int, int] = {}
    for i, size in enumerate(args.sizes):
        hour_n = size // 24
        path, db = workdir / f"density-{i}.jsonl", workdir / f"density-{i}.duckdb"
        _log(f"distinct-value density at {size:,}/day: importing the first hour ({hour_n:,} events)...")
        dumps, newline = orjson.dumps, orjson.OPT_APPEND_NEWLINE
        with open(path, "wb") as f:
            for env in itertools.islice(envelopes(size, args.seed, WINDOW_SINCE), hour_n):
                f.write(dumps(env, option=newline))
        with open_store(db, args) as store:
            import_all(store, [path])
            store.compact_by_day()
            repeat_first_hour(store, WINDOW_SINCE, 24)
            with store.transaction("copying baselines") as con:
                for table, rows in (("baselines", baselines), ("baseline_activations", activations)):
                    if rows:
                        con.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(rows[0]))})",
                                        [list(r) for r in rows])
        path.unlink()
        built.append((size, db))
        hours[size] = hour_n
    out = [{"hour_events": hours[m["size"]], **m}
           for m in measure_alternating(built, args, workdir, "density", scans=False)]
    for _, db in built:
        db.unlink()
    return out


# --- the run ---------------------------------------------------------------------------------

def build(workdir: Path, args: argparse.Namespace, report: dict[str, Any]) -> Path:
    """Generate, import, compact and freeze baselines; returns the database path."""
    from shapewatch.baselines import Cohort, freeze_baseline
    small = args.sizes[0]
    base_n = args.baseline_n if args.baseline_n is not None else small
    base_file, window_file = workdir / "baseline-day.jsonl", workdir / "window.jsonl"
    _log(f"generating {base_n:,} envelopes for the baseline day and {small:,} for the window...")
    began = time.perf_counter()
    written = write_files([(base_file, base_n, args.seed + 1, BASELINE_SINCE),
                           (window_file, small, args.seed, WINDOW_SINCE)])
    report["generate"] = {"seconds": time.perf_counter() - began, "baseline_events": base_n,
                          "window_events": small, "bytes": sum(b for b, _ in written)}
    db = workdir / "analyze.duckdb"
    with open_store(db, args) as store:
        _log("importing both files (collector.import_files)...")
        summary, seconds = import_all(store, [base_file, window_file])
        report["import"] = {"seconds": seconds, "events_per_s": summary["accepted"] / seconds, **{
            k: summary[k] for k in ("accepted", "duplicate", "rejected")}}
        if summary["accepted"] != base_n + small:
            raise RuntimeError(f"import accepted {summary['accepted']:,} of {base_n + small:,}: {summary}")
        began = time.perf_counter()
        folded = store.compact_by_day()
        report["compact_1"] = {"seconds": time.perf_counter() - began, "rows_folded": folded}
        _log("freezing a baseline per cohort over the baseline day...")
        began = time.perf_counter()
        cohorts = [Cohort(str(m), str(p), str(c)) for m, p, c in store.query(
            "SELECT model, prompt_version, contract FROM cohorts ORDER BY cohort_id")]
        for cohort in cohorts:
            freeze_baseline(store, cohort, BASELINE_SINCE, WINDOW_SINCE, author="bench/analyze.py",
                            note="the day before the benchmark window")
        report["baselines"] = {"seconds": time.perf_counter() - began, "cohorts": len(cohorts),
                               "document_bytes": store.query(
                                   "SELECT sum(length(document)) FROM baselines")[0][0]}
    for path in (base_file, window_file):
        path.unlink()
    return db


def grow(db: Path, args: argparse.Namespace, report: dict[str, Any]) -> None:
    factor = args.sizes[1] // args.sizes[0]
    _log(f"growing the window {factor}x inside DuckDB...")
    with open_store(db, args) as store:
        times = replicate(store, WINDOW_SINCE, AT, factor)
        began = time.perf_counter()
        folded = store.compact_by_day()
        report["grow"] = {**times, "compact_seconds": time.perf_counter() - began, "rows_folded": folded,
                          "factor": factor}
        store.query("CHECKPOINT")


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    report: dict[str, Any] = {"sizes": args.sizes, "workdir": str(workdir)}
    _log(f"replication check: {CHECK_N:,} events x{CHECK_FACTOR}, by SQL and by import...")
    report["replication_check"] = check_replication(workdir, args)
    for f in workdir.glob("check-*"):
        f.unlink()
    db = build(workdir, args, report)
    # The smaller size's database is kept as it is, so that both sizes are measured in turn,
    # after the growing: this machine's speed moves by 2x within minutes, and one size measured
    # before the growing and the other after it compared two machines, not two sizes.
    small = workdir / "analyze-small.duckdb"
    shutil.copyfile(db, small)
    grow(db, args, report)
    report["db_bytes"] = db.stat().st_size
    report["measured"] = measure_alternating(list(zip(args.sizes, [small, db], strict=True)), args, workdir, "measure")
    small.unlink()
    if not args.skip_density:
        report["density"] = density_check(db, workdir, args)
    report["build_peak_rss"] = _peak_rss()
    return report


# --- the report ------------------------------------------------------------------------------

def _label(n: int) -> str:
    return f"{n // 1_000_000}M" if n % 1_000_000 == 0 else f"{n // 1000}k" if n % 1000 == 0 else str(n)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*header), fmt.format(*("-" * w for w in widths)), *(fmt.format(*r) for r in rows)]


def growth(large: dict[str, Any], small: dict[str, Any], key: str) -> float:
    """The larger size's time over the smaller's: the median of the ratios of the rounds."""
    return statistics.median(b / a for a, b in zip(small[f"{key}_rounds"], large[f"{key}_rounds"], strict=True))


def _growth_checks(label: str, small: dict[str, Any], large: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    e2, r2 = statistics.median(large["evaluate"]), statistics.median(large["run"])
    eg, rg = growth(large, small, "evaluate"), growth(large, small, "run")
    big, ratio = _label(large["size"]), f"{_label(large['size'])}/{_label(small['size'])}"
    return [
        (f"evaluate at {big}{label}", f"{e2:.3f} s", f"< {MAX_EVAL_SECONDS:g} s", e2 < MAX_EVAL_SECONDS),
        (f"Analyzer.run at {big}{label}", f"{r2:.3f} s", f"< {MAX_EVAL_SECONDS:g} s", r2 < MAX_EVAL_SECONDS),
        (f"evaluate {ratio}{label}", f"{eg:.2f}x", f"<= {MAX_GROWTH:g}x", eg <= MAX_GROWTH),
        (f"Analyzer.run {ratio}{label}", f"{rg:.2f}x", f"<= {MAX_GROWTH:g}x", rg <= MAX_GROWTH),
    ]


def checks(report: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    rc = report["replication_check"]
    out = _growth_checks("", *report["measured"])
    out.append(("replication = import", "equal" if rc["passed"] else "DIFFERENT", "equal", bool(rc["passed"])))
    if "density" in report:
        out += _growth_checks(" (distinct-value density)", *report["density"])
    return out


def _ratio(m: dict[str, Any], first: dict[str, Any]) -> str:
    if m is first:
        return "-"
    return f"{growth(m, first, 'evaluate'):.2f}x / {growth(m, first, 'run'):.2f}x"


def _details(m: dict[str, Any], scans: bool) -> list[str]:
    out = [f"  {_label(m['size'])}: evaluate {_runs(m['evaluate'])}; run {_runs(m['run'])}"
           + (f"; raw scan {_runs(m['scan_plain'])}; json scan {_runs(m['scan_json'])}" if scans else "")]
    out.append(f"    medians by round: evaluate {_runs(m['evaluate_rounds'])}; run {_runs(m['run_rounds'])}")
    out.append(f"    {m['cohorts']} cohorts ({m['with_baseline']} with a baseline), {m['fields']} top-level "
               f"fields, {m['checks']} checks, {m['breaches']} breaches, {m['open_alerts']} open alerts; "
               "rollup rows: " + ", ".join(f"{t} {n:,}" for t, n in m["rollup_rows"].items()))
    out.append(f"    store open {m['open_seconds']:.2f} s, child process {m['process_seconds']:.1f} s, "
               f"child peak RSS {_mib(m['process_peak_rss'])}, load average {m['load_before']:.1f} "
               f"before, {m['load_after']:.1f} after the evaluations")
    return out


def render(report: dict[str, Any]) -> str:
    med = statistics.median
    out = []
    rc = report["replication_check"]
    out.append(f"replication check ({rc['events']:,} events x{rc['factor']}, {rc['cohorts']} cohorts, "
               f"{rc['fields']} field profiles): profiles {'equal' if rc['profiles_equal'] else 'DIFFER'}, "
               f"events {'equal' if rc['events_equal'] else 'DIFFER'}, rollup rows after compaction "
               f"{'equal' if rc['rollup_rows_equal'] else 'DIFFER'}"
               + (f"; first difference: {rc['first_difference']}" if "first_difference" in rc else ""))
    g, imp, b = report["generate"], report["import"], report["baselines"]
    out.append(f"built: {g['baseline_events']:,} baseline-day + {g['window_events']:,} window envelopes "
               f"generated in {g['seconds']:.1f} s ({g['bytes'] / 1e6:,.0f} MB), imported in {imp['seconds']:.1f} s "
               f"({imp['events_per_s']:,.0f}/s), compacted in {report['compact_1']['seconds']:.1f} s; "
               f"{b['cohorts']} baselines frozen in {b['seconds']:.1f} s ({b['document_bytes'] / 1e6:.1f} MB of documents)")
    if "grow" in report:
        gr = report["grow"]
        out.append(f"grown x{gr['factor']} inside DuckDB: events {gr['events']:.1f} s, rollups {gr['rollups']:.1f} s, "
                   f"commit {gr['commit']:.1f} s, compaction {gr['compact_seconds']:.1f} s; "
                   f"database {report['db_bytes'] / 1e9:.2f} GB")
    out.append("")
    first = report["measured"][0]
    rows = [(_label(m["size"]), f"{m['events_in_window']:,}", f"{med(m['evaluate']):.3f}", f"{med(m['run']):.3f}",
             f"{med(m['scan_plain']):.3f}", f"{med(m['scan_json']):.3f}", _ratio(m, first),
             _mib(m["peak_rss_evaluation"]), _mib(m["peak_rss"])) for m in report["measured"]]
    out += _table(("size", "events in window", "evaluate s", "run s", "raw scan s", "json scan s",
                   f"ratio to {_label(first['size'])} (eval / run)", "peak RSS (eval)", "peak RSS (+scans)"), rows)
    if "density" in report:
        out += ["", "distinct-value density: the first hour at each rate imported, its rollups repeated "
                "over 24 h (no raw scan)"]
        first = report["density"][0]
        dense: list[tuple[str, ...]] = [(_label(m["size"]), f"{m['hour_events']:,} x 24", f"{m['rollup_rows']['value_rollups']:,}",
                 f"{m['rollup_rows']['number_rollups']:,}", f"{med(m['evaluate']):.3f}", f"{med(m['run']):.3f}",
                 _ratio(m, first), _mib(m["peak_rss_evaluation"])) for m in report["density"]]
        out += _table(("size", "events", "value rows", "number rows", "evaluate s", "run s",
                       f"ratio to {_label(first['size'])} (eval / run)", "peak RSS (eval)"), dense)
    out.append("")
    rounds = len(first["evaluate_rounds"])
    out.append(f"{rounds} rounds, the sizes measured in turn in each (fresh processes; the raw scans in the "
               f"first); each round {len(first['evaluate']) // rounds} runs after one warm-up; medians of all "
               "runs, ratios the median of the rounds' ratios; all runs (s):")
    for m in report["measured"]:
        out += _details(m, True)
    for m in report.get("density", []):
        out += [line.replace(f"  {_label(m['size'])}:", f"  {_label(m['size'])} (density):", 1) if i == 0 else line
                for i, line in enumerate(_details(m, False))]
    out.append(f"build process peak RSS {_mib(report['build_peak_rss'])}")
    out.append("")
    cs = checks(report)
    out += _table(("target", "measured", "required", "result"),
                  [(n, v, t, "PASS" if ok else "FAIL") for n, v, t, ok in cs])
    out.append("")
    out.append("overall: " + ("PASS" if all(ok for *_, ok in cs) else "FAIL"))
    return "\n".join(out)


def _runs(times: list[float]) -> str:
    return " ".join(f"{t:.3f}" for t in times)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true",
                        help="measure at 100k and 1M events instead of 1M and 10M (a quick check)")
    parser.add_argument("--baseline-n", type=int, default=None,
                        help="envelopes in the baseline day (default: the smaller size)")
    parser.add_argument("--seed", type=int, default=1, help="generator seed (default 1)")
    parser.add_argument("--workdir", type=Path,
                        help="work here (created; kept afterwards) instead of a temporary directory")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--memory-limit", default="4GB", help="DuckDB memory_limit (default 4GB)")
    parser.add_argument("--threads", type=int, default=1, help="DuckDB threads (default 1, as the product: see bench/repro_invisible_rows.py)")
    parser.add_argument("--repeat", type=int, default=REPEAT, help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help=f"rounds of measuring the two sizes in turn (default {ROUNDS})")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target fails")
    parser.add_argument("--json", type=Path, metavar="OUT", help="also write every figure to OUT as JSON")
    parser.add_argument("--skip-density", action="store_true",
                        help="leave out the distinct-value density measurement")
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)  # the child's mode
    parser.add_argument("--no-scans", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    smaller = 100_000 if args.small else 1_000_000
    args.sizes = [smaller, smaller * GROWTH_FACTOR]
    if args.baseline_n is not None and args.baseline_n < 1:
        parser.error("--baseline-n must be >= 1")
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.measure is not None:
        print(json.dumps(measure(args.measure, args)))
        return 0
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
        if any(args.workdir.iterdir()):
            print(f"--workdir {args.workdir} is not empty", file=sys.stderr)
            return 2
        workdir, keep = args.workdir, True
    else:
        workdir, keep = Path(tempfile.mkdtemp(prefix="shapewatch-analyze-")), args.keep
    began = time.perf_counter()
    try:
        report = run(args, workdir)
    finally:
        if keep:
            _log(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    report["seconds"] = time.perf_counter() - began
    print(render(report))
    print(f"whole benchmark: {report['seconds']:.0f} s")
    if args.json is not None:
        args.json.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    passed = all(ok for *_, ok in checks(report))
    return 1 if args.strict and not passed else 0


if __name__ == "__main__":
    sys.exit(main())
