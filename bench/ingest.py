"""Ingest benchmark: the parse floor, bulk import and HTTP batch ingest, in one run.

    .venv/bin/python bench/ingest.py [--n 1000000] [--file FILE] [--http-n 200000]
                                     [--skip-bulk] [--skip-contracts] [--skip-http] [--keep] [--json OUT]
                                     [--shapes dense,fortnight,sparse] [--repeat 3]

Steps, each measured as a whole, fresh process (interpreter start included):

1. generate N envelopes with ``bench/gen.py`` into a temporary directory
   (or reuse ``--file``);
2. the floor: a child that reads the file and ``orjson.loads`` every line;
3. bulk import: ``shapewatch ingest FILE --db TMP/bulk.duckdb --format json``; then again into a
   database where bench/contracts/support_ticket.json is registered for the file's contract
   versions, so outputs are checked against it as they are stored (the cost of contract checks);
4. HTTP: ``shapewatch serve`` on a free loopback port, then the first M
   envelopes POSTed to ``/v1/outputs`` as JSON arrays from concurrent clients.

It prints the figures, then each target with PASS or FAIL, and exits 1 if
any target failed (2 on a usage error). See bench/README.md.
"""

from __future__ import annotations

import argparse
import gzip
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import orjson
from gen import write_jsonl  # bench/ is sys.path[0] when this file runs as a script

GIB = 1 << 30
MAX_BULK_TO_FLOOR = 4.0
MAX_BULK_RSS = int(1.5 * GIB)
MIN_HTTP_EVENTS_PER_S = 20_000
SERVER_START_TIMEOUT_S = 60.0
SERVER_STOP_TIMEOUT_S = 30.0
ANSWER_KEYS = ("accepted", "duplicate", "rejected")

# Runs in a child so that its time and peak RSS are those of a whole process.
FLOOR_CODE = """\
import gzip, sys, orjson
path = sys.argv[1]
loads = orjson.loads
n = 0
with (gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")) as f:
    for line in f:
        loads(line)
        n += 1
print(n)
"""

# Starts the measured command and reports the command's own time, peak RSS, exit
# code and CPU time (user + system, all of its threads). On Linux a child's ru_maxrss includes the memory it had before
# exec, and a child forked or vforked from this benchmark has all of the
# benchmark's pages (hundreds of MB once HTTP bodies are built), so measured
# commands start from this small `python -S` instead. SIGTERM is passed on.
LAUNCHER_CODE = """\
import os, signal, sys, time
began = time.perf_counter()
pid = os.posix_spawnp(sys.argv[2], sys.argv[2:], os.environ)
signal.signal(signal.SIGTERM, lambda signum, frame: os.kill(pid, signum))
_, status, usage = os.wait4(pid, 0)
seconds = time.perf_counter() - began
signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(sys.argv[1], "w") as out:
    out.write(f"{seconds} {usage.ru_maxrss} {os.waitstatus_to_exitcode(status)} {usage.ru_utime + usage.ru_stime}")
"""


@dataclass(frozen=True)
class Finished:
    """How a measured command ended."""

    seconds: float
    peak_rss: int
    """Bytes: ``ru_maxrss`` of the command itself (Linux reports KiB; its own children not included)."""
    returncode: int
    cpu_seconds: float
    """User + system time of the command, every thread of it (its own children not included)."""


class MeasuredProcess:
    """A command started through the launcher, its output in ``workdir/NAME.out`` and ``.err``.

    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     MeasuredProcess(["true"], Path(tmp), "true").wait().returncode
    0
    """

    def __init__(self, argv: Sequence[str], workdir: Path, name: str, *, own_session: bool = False) -> None:
        self.argv = list(argv)
        self.stdout_path, self.stderr_path = workdir / f"{name}.out", workdir / f"{name}.err"
        self._result_path = workdir / f"{name}.rusage"
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-S", "-c", LAUNCHER_CODE, str(self._result_path), *self.argv],
                stdout=out, stderr=err, start_new_session=own_session)

    def wait(self, timeout: float | None = None) -> Finished:
        """Wait for the command; raises ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
        self.proc.wait(timeout)
        if not self._result_path.exists():
            raise RuntimeError(f"could not run {self.argv[0]}:\n{self.stderr_tail()}")
        seconds, peak_kib, returncode, cpu = self._result_path.read_text().split()
        return Finished(float(seconds), int(peak_kib) * 1024, int(returncode), float(cpu))

    def cpu_seconds_now(self) -> float:
        """CPU time the running command has used so far (user + system, from /proc)."""
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        if len(children) != 1:
            raise RuntimeError(f"the launcher has {len(children)} children, expected the command alone")
        # The fields after the command name (which may hold spaces): utime and stime are the 12th and 13th.
        fields = Path(f"/proc/{children[0]}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def running(self) -> bool:
        return self.proc.poll() is None

    def stderr_tail(self, lines: int = 15) -> str:
        return _tail(self.stderr_path.read_bytes(), lines)


@dataclass
class Check:
    """One target: the measured value, the bar it must meet, and the verdict."""

    name: str
    value: str
    target: str
    passed: bool


@dataclass
class Report:
    """Every figure of a run; written as-is by ``--json``."""

    file: str
    n: int
    generate: dict[str, Any] | None = None
    floor: dict[str, Any] | None = None
    bulk: dict[str, Any] | None = None
    shapes: dict[str, dict[str, Any]] = field(default_factory=dict)
    """--shapes: per shape, each run's floor and import, and the rollup rows per event."""
    bulk_contracts: dict[str, Any] | None = None
    """The bulk import again, with the bench contracts registered (outputs checked as stored)."""
    http: dict[str, Any] | None = None
    checks: list[Check] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    """Why a step could not be measured, by step name."""

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)


def _tail(data: bytes, lines: int = 15) -> str:
    return "\n".join(data.decode(errors="replace").rstrip().splitlines()[-lines:])


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _parse_summary(stdout: bytes) -> dict[str, Any]:
    """The ingest summary: the whole of stdout, or else its last non-empty line."""
    try:
        summary = orjson.loads(stdout)
    except orjson.JSONDecodeError:
        lines = stdout.strip().splitlines()
        summary = orjson.loads(lines[-1]) if lines else None
    if not isinstance(summary, dict):
        raise ValueError("the summary is not a JSON object")
    return summary


def measure_floor(path: Path, workdir: Path) -> dict[str, Any]:
    """Read and parse every line in a fresh interpreter; returns the figures."""
    child = MeasuredProcess([sys.executable, "-c", FLOOR_CODE, str(path)], workdir, "floor")
    run = child.wait()
    if run.returncode != 0:
        raise RuntimeError(f"the floor child failed ({run.returncode}):\n{child.stderr_tail()}")
    lines = int(child.stdout_path.read_bytes())
    return {"seconds": run.seconds, "events": lines, "events_per_s": lines / run.seconds,
            "peak_rss": run.peak_rss, "cpu_seconds": run.cpu_seconds}


# The contracts of bench/gen.py's cohorts (each tags its outputs with one of these versions).
CONTRACT_FILE = Path(__file__).resolve().parent / "contracts" / "support_ticket.json"
BENCH_CONTRACTS = (("intake", "3"), ("triage", "1"))


def register_contracts(shapewatch: Path, db: Path, workdir: Path) -> None:
    """Register the bench contracts in ``db`` (before the measured import)."""
    for contract, version in BENCH_CONTRACTS:
        run = subprocess.run([str(shapewatch), "contract", "register", "--contract", contract, "--version", version,
                              str(CONTRACT_FILE), "--db", str(db)], capture_output=True, cwd=workdir, timeout=300)
        if run.returncode != 0:
            raise RuntimeError(f"registering {contract} {version} failed:\n{_tail(run.stderr)}")


def measure_bulk(shapewatch: Path, path: Path, workdir: Path, *, contracts: bool = False,
                 name: str | None = None) -> dict[str, Any]:
    """``shapewatch ingest`` into a fresh database; returns the figures and its summary.

    With ``contracts``, the database first gets the bench contracts registered, so every output
    is checked against its contract version as it is stored (up to the checks' per-bucket quota).
    """
    name = name or ("bulk-contracts" if contracts else "bulk")
    db = workdir / f"{name}.duckdb"
    if contracts:
        register_contracts(shapewatch, db, workdir)
    argv = [str(shapewatch), "ingest", str(path), "--db", str(db), "--format", "json"]
    child = MeasuredProcess(argv, workdir, name)
    run = child.wait()
    # Exit 1 means "worked, some lines rejected": the summary still says how many.
    if run.returncode not in (0, 1):
        raise RuntimeError(f"shapewatch ingest exited {run.returncode}:\n{child.stderr_tail()}")
    stdout = child.stdout_path.read_bytes()
    try:
        summary = _parse_summary(stdout)
    except ValueError as exc:
        raise RuntimeError(f"shapewatch ingest (exit {run.returncode}) printed no JSON summary "
                           f"({exc}); stdout:\n{_tail(stdout)}\nstderr:\n{child.stderr_tail()}") from exc
    accepted = int(summary.get("accepted", 0))
    return {"seconds": run.seconds, "events_per_s": accepted / run.seconds,
            "peak_rss": run.peak_rss, "cpu_seconds": run.cpu_seconds, "returncode": run.returncode,
            "summary": summary}


# The shapes of traffic the import is measured on (--shapes): (days, cohorts, envelopes). dense is
# bench/gen.py's default file (about 139 outputs per cohort-minute); fortnight holds about 20 per
# cohort-minute over two weeks, sparse about 2 over four weeks across 16 cohorts: a backfill, or
# the quiet cohorts most teams have most of.
SHAPES: dict[str, tuple[float, int | None, int]] = {
    "dense": (1.0, None, 1_000_000),
    "fortnight": (14.0, 3, 20 * 3 * 14 * 1440),
    "sparse": (28.0, 16, 2 * 16 * 28 * 1440),
}
SPARSE_SHAPES = ("fortnight", "sparse")
MAX_SPARSE_ROWS_PER_EVENT = 3.0
# Every table that holds rollup rows (the store's, and the served models beside them).
ROLLUP_ROW_TABLES = ("cohort_buckets", "field_rollups", "value_rollups", "array_rollups", "number_rollups",
                     "served_models", "contract_rollups", "violation_rollups")


def rollup_rows(db: Path) -> dict[str, int]:
    """Rows of each rollup table, and of ``events``, in a database no process holds open."""
    import duckdb  # the service's dependency: only this step needs it

    con = duckdb.connect(str(db), read_only=True)
    try:
        return {t: int(con.execute(f"SELECT count(*) FROM {t}").fetchone()[0])  # type: ignore[index]
                for t in (*ROLLUP_ROW_TABLES, "events")}
    finally:
        con.close()


def measure_shape(shapewatch: Path, shape: str, workdir: Path, repeat: int, seed: int) -> dict[str, Any]:
    """Generate the shape's file, then ``repeat`` times: the floor and the import, one after the
    other (a pair: their ratio is taken run by run). Returns every run and the rows per event."""
    days, cohorts, n = SHAPES[shape]
    path = workdir / f"{shape}.jsonl"
    _log(f"  generating {shape}: {n:,} envelopes over {days:g} days, {cohorts or 5} cohorts...")
    write_jsonl(path, n, seed=seed, span=timedelta(days=days), cohorts=cohorts)
    with open(path, "rb") as f:  # into the page cache before anything is measured
        while f.read(1 << 24):
            pass
    runs = []
    for r in range(repeat):
        floor = measure_floor(path, workdir)
        bulk = measure_bulk(shapewatch, path, workdir, name=f"bulk-{shape}-{r}")
        runs.append({"floor_seconds": floor["seconds"], "bulk_seconds": bulk["seconds"],
                     "ratio": bulk["seconds"] / floor["seconds"], "peak_rss": bulk["peak_rss"],
                     "cpu_seconds": bulk["cpu_seconds"], "accepted": int(bulk["summary"].get("accepted", -1))})
        _log(f"    run {r + 1}: floor {floor['seconds']:.2f} s, import {bulk['seconds']:.2f} s, "
             f"{runs[-1]['ratio']:.2f}x, peak RSS {_mib(bulk['peak_rss'])}")
        rows = rollup_rows(workdir / f"bulk-{shape}-{r}.duckdb")
        for leftover in workdir.glob(f"bulk-{shape}-{r}.duckdb*"):
            leftover.unlink()
    path.unlink()
    events = rows.pop("events")
    return {"days": days, "cohorts": cohorts or 5, "n": n, "runs": runs, "rows": rows,
            "rows_per_event": sum(rows.values()) / max(events, 1)}


def _free_port() -> int:
    # Another process could take the port before the server binds it; unlikely on loopback.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _read_batches(path: Path, limit: int, size: int) -> tuple[list[bytes], int]:
    """The first ``limit`` lines as JSON-array bodies of ``size`` envelopes, and their count."""
    lines: list[bytes] = []
    with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as f:
        for line in f:
            if len(lines) == limit:
                break
            lines.append(line.rstrip(b"\r\n"))
    bodies = [b"[" + b",".join(lines[i:i + size]) + b"]" for i in range(0, len(lines), size)]
    return bodies, len(lines)


def _wait_healthy(server: MeasuredProcess, base_url: str) -> float:
    """Poll ``/healthz`` until it answers 200; returns the seconds it took."""
    began = time.monotonic()
    with httpx.Client(base_url=base_url, timeout=1.0) as client:
        while time.monotonic() - began < SERVER_START_TIMEOUT_S:
            if not server.running():
                raise RuntimeError(f"shapewatch serve exited {server.wait().returncode} before it "
                                   f"was healthy:\n{server.stderr_tail()}")
            try:
                if client.get("/healthz").status_code == 200:
                    return time.monotonic() - began
            except httpx.TransportError:
                pass
            time.sleep(0.1)
    raise RuntimeError(f"/healthz did not answer 200 within {SERVER_START_TIMEOUT_S:.0f} s:\n"
                       f"{server.stderr_tail()}")


def _post_all(base_url: str, bodies: list[bytes], clients: int) -> tuple[float, Counter[str], list[str]]:
    """POST every body from ``clients`` threads; returns seconds, tallies and error samples."""
    work: queue.SimpleQueue[bytes] = queue.SimpleQueue()
    for body in bodies:
        work.put(body)
    tallies = [Counter[str]() for _ in range(clients)]
    errors: list[str] = []  # list.append is atomic: threads share it without a lock
    sessions = [httpx.Client(base_url=base_url, timeout=120.0,
                             headers={"content-type": "application/json"}) for _ in range(clients)]

    def client_loop(session: httpx.Client, tally: Counter[str]) -> None:
        while True:
            try:
                body = work.get_nowait()
            except queue.Empty:
                return
            try:
                response = session.post("/v1/outputs", content=body)
            except httpx.HTTPError as exc:
                tally["transport_errors"] += 1
                errors.append(repr(exc))
                continue
            tally[f"http_{response.status_code}"] += 1
            try:
                answer = response.json()
                counts = {key: int(answer[key]) for key in ANSWER_KEYS}
            except (KeyError, TypeError, ValueError):
                counts = None
            if response.is_success and counts is not None:
                tally.update(counts)
            else:
                errors.append(f"{response.status_code}: {response.text[:300]}")

    threads = [threading.Thread(target=client_loop, args=pair)
               for pair in zip(sessions, tallies, strict=True)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - began
    for session in sessions:
        session.close()
    return seconds, sum(tallies, Counter[str]()), errors


def _stop(server: MeasuredProcess) -> Finished:
    """SIGTERM (the launcher passes it on), then SIGKILL to the whole session after a grace period."""
    if server.running():
        server.proc.send_signal(signal.SIGTERM)
    try:
        return server.wait(SERVER_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _log(f"shapewatch serve ignored SIGTERM for {SERVER_STOP_TIMEOUT_S:.0f} s: killing it")
        os.killpg(server.proc.pid, signal.SIGKILL)
        server.proc.wait()
        raise RuntimeError("shapewatch serve did not stop on SIGTERM") from None


def measure_http(shapewatch: Path, path: Path, workdir: Path, limit: int, batch: int,
                 clients: int) -> dict[str, Any]:
    """Serve a fresh database and POST the first ``limit`` envelopes to it in batches."""
    bodies, events = _read_batches(path, limit, batch)
    port = _free_port()
    base_url = f"http://127.0.0.1:{port}"
    argv = [str(shapewatch), "serve", "--db", str(workdir / "http.duckdb"),
            "--port", str(port), "--host", "127.0.0.1"]
    # Its own session, so that a kill after a failed SIGTERM reaches the server too.
    server = MeasuredProcess(argv, workdir, "serve", own_session=True)
    try:
        startup = _wait_healthy(server, base_url)
        _log(f"  server healthy after {startup:.1f} s; posting {events:,} envelopes "
             f"in {len(bodies):,} batches from {clients} clients")
        cpu_before = server.cpu_seconds_now()
        seconds, tally, errors = _post_all(base_url, bodies, clients)
        posting_cpu = server.cpu_seconds_now() - cpu_before
    finally:
        stopped = _stop(server)
    acknowledged = tally["accepted"] + tally["duplicate"]
    return {"events": events, "batches": len(bodies), "batch_size": batch, "clients": clients,
            "startup_seconds": startup, "seconds": seconds, "events_per_s": acknowledged / seconds,
            "accepted": tally["accepted"], "duplicate": tally["duplicate"],
            "rejected": tally["rejected"],
            "responses": {k: v for k, v in sorted(tally.items()) if k.startswith(("http_", "transport"))},
            "errors": errors[:5], "server_exit_code": stopped.returncode, "server_peak_rss": stopped.peak_rss,
            "server_cpu_seconds_posting": posting_cpu}


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.0f} MiB"


def _exit(returncode: int) -> str:
    # uvicorn re-raises SIGTERM once it has shut down gracefully, so -15 is the normal end.
    return f"ended by {signal.Signals(-returncode).name}" if returncode < 0 else f"exit {returncode}"


def _cpu(seconds: float, events: int, wall: float) -> str:
    """CPU time, per event and in cores: on a noisy machine the work done varies less than the time."""
    return f"CPU {seconds:.1f} s ({seconds / events * 1e6:.0f} us/event, {seconds / wall:.2f} cores)"


def _count(value: object) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


def _run_step(report: Report, name: str, measure: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
    """Run one measurement; a failure becomes a failed check, not a traceback."""
    _log(f"{name}...")
    try:
        figures = measure()
    except (OSError, RuntimeError, ValueError) as exc:
        report.checks.append(Check(f"{name} ran", "error", "completes", False))
        report.errors[name] = str(exc)
        _log(f"  {name} failed: {exc}")
        return None
    setattr(report, name, figures)
    return figures


def evaluate(report: Report) -> None:
    """Append the checks for every figure that was measured."""
    floor, bulk, http = report.floor, report.bulk, report.http
    add = report.checks.append
    if bulk is not None:
        accepted = int(bulk["summary"].get("accepted", -1))
        add(Check("bulk accepted", f"{accepted:,}", f"== {report.n:,}", accepted == report.n))
        if floor is not None:
            ratio = bulk["seconds"] / floor["seconds"]
            add(Check("bulk time / floor time", f"{ratio:.2f}x", f"<= {MAX_BULK_TO_FLOOR:g}x",
                      ratio <= MAX_BULK_TO_FLOOR))
        add(Check("bulk peak RSS", _mib(bulk["peak_rss"]), f"< {_mib(MAX_BULK_RSS)}",
                  bulk["peak_rss"] < MAX_BULK_RSS))
    if report.bulk_contracts is not None:
        accepted = int(report.bulk_contracts["summary"].get("accepted", -1))
        add(Check("bulk (contracts) accepted", f"{accepted:,}", f"== {report.n:,}", accepted == report.n))
    for shape, s in report.shapes.items():
        ratios = sorted(run["ratio"] for run in s["runs"])
        median = ratios[len(ratios) // 2]
        add(Check(f"{shape}: accepted", f"{min(r['accepted'] for r in s['runs']):,}", f"== {s['n']:,}",
                  all(r["accepted"] == s["n"] for r in s["runs"])))
        add(Check(f"{shape}: import / floor (median of {len(ratios)})", f"{median:.2f}x",
                  f"<= {MAX_BULK_TO_FLOOR:g}x", median <= MAX_BULK_TO_FLOOR))
        peak = max(r["peak_rss"] for r in s["runs"])
        add(Check(f"{shape}: peak RSS", _mib(peak), f"< {_mib(MAX_BULK_RSS)}", peak < MAX_BULK_RSS))
        if shape in SPARSE_SHAPES:
            add(Check(f"{shape}: rollup rows per event", f"{s['rows_per_event']:.2f}",
                      f"< {MAX_SPARSE_ROWS_PER_EVENT:g}", s["rows_per_event"] < MAX_SPARSE_ROWS_PER_EVENT))
    if http is not None:
        add(Check("http accepted", f"{http['accepted']:,}", f"== {http['events']:,}",
                  http["accepted"] == http["events"]))
        add(Check("http events/s", f"{http['events_per_s']:,.0f}", f">= {MIN_HTTP_EVENTS_PER_S:,}",
                  http["events_per_s"] >= MIN_HTTP_EVENTS_PER_S))


def render(report: Report) -> str:
    """The figures and the checks as two plain-text tables."""
    rows: list[tuple[str, str, str, str]] = []
    if (g := report.generate) is not None:
        rows.append(("generate", f"{g['seconds']:.1f} s", f"{g['events_per_s']:,.0f}/s",
                     f"{g['bytes'] / 1e6:,.0f} MB, {g['bytes'] / report.n:.0f} B/line"))
    if (f := report.floor) is not None:
        rows.append(("floor (orjson parse)", f"{f['seconds']:.2f} s", f"{f['events_per_s']:,.0f}/s",
                     f"peak RSS {_mib(f['peak_rss'])}; {_cpu(f['cpu_seconds'], f['events'], f['seconds'])}"))
    if (b := report.bulk) is not None:
        s = b["summary"]
        rows.append(("bulk (shapewatch ingest)", f"{b['seconds']:.2f} s", f"{b['events_per_s']:,.0f}/s",
                     f"peak RSS {_mib(b['peak_rss'])}; {_cpu(b['cpu_seconds'], report.n, b['seconds'])}; "
                     "accepted/duplicate/rejected " + "/".join(_count(s.get(k)) for k in ANSWER_KEYS)))
    if (b := report.bulk_contracts) is not None:
        s = b["summary"]
        rows.append(("bulk, contracts registered", f"{b['seconds']:.2f} s", f"{b['events_per_s']:,.0f}/s",
                     f"peak RSS {_mib(b['peak_rss'])}; {_cpu(b['cpu_seconds'], report.n, b['seconds'])}; "
                     "accepted/duplicate/rejected " + "/".join(_count(s.get(k)) for k in ANSWER_KEYS)
                     + (f"; {report.bulk['seconds'] / b['seconds']:.2f}x the events/s without"
                        if report.bulk else "")))
    if (h := report.http) is not None:
        rows.append(("http (POST /v1/outputs)", f"{h['seconds']:.2f} s", f"{h['events_per_s']:,.0f}/s",
                     f"{h['events']:,} events, {h['clients']} clients x {h['batch_size']}; "
                     f"accepted/duplicate/rejected {'/'.join(_count(h[k]) for k in ANSWER_KEYS)}; "
                     f"server: {_cpu(h['server_cpu_seconds_posting'], h['events'], h['seconds'])} while "
                     f"posting, peak RSS {_mib(h['server_peak_rss'])}, {_exit(h['server_exit_code'])}"))
    out = [f"{report.n:,} envelopes from {report.file}", ""]
    out += _table(("step", "time", "events/s", "notes"), rows)
    if report.shapes:
        srows = []
        for shape, s in report.shapes.items():
            ratios = sorted(r["ratio"] for r in s["runs"])
            floors = sorted(r["floor_seconds"] for r in s["runs"])
            bulks = sorted(r["bulk_seconds"] for r in s["runs"])
            mid = len(ratios) // 2
            srows.append((shape, f"{s['n']:,} over {s['days']:g} d, {s['cohorts']} cohorts",
                          f"{floors[0]:.2f} / {floors[mid]:.2f} s", f"{bulks[0]:.2f} / {bulks[mid]:.2f} s",
                          f"{ratios[0]:.2f}x / {ratios[mid]:.2f}x",
                          _mib(max(r["peak_rss"] for r in s["runs"])), f"{s['rows_per_event']:.2f}"))
        out += ["", "shapes (best / median of the runs; ratio taken run by run):"]
        out += _table(("shape", "envelopes", "floor", "import", "import / floor", "peak RSS", "rollup rows/event"),
                      srows)
    if report.http is not None and report.http["errors"]:
        out += ["", "first HTTP errors:", *("  " + e for e in report.http["errors"])]
    for name, error in report.errors.items():
        out += ["", f"{name} failed:", *("  " + line for line in error.splitlines())]
    out += [""]
    out += _table(("target", "measured", "required", "result"),
                  [(c.name, c.value, c.target, "PASS" if c.passed else "FAIL") for c in report.checks])
    out += ["", "overall: " + ("PASS" if report.passed else "FAIL")]
    return "\n".join(out)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*header), fmt.format(*("-" * w for w in widths)),
            *(fmt.format(*r) for r in rows)]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line options; exits 2 on a usage error."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1_000_000,
                        help="envelopes to generate (default 1,000,000; ignored with --file)")
    parser.add_argument("--file", type=Path,
                        help="reuse this JSONL (or .jsonl.gz) file instead of generating one; "
                             "N is then its line count")
    parser.add_argument("--seed", type=int, default=1, help="generator seed (default 1)")
    parser.add_argument("--http-n", type=int, default=200_000,
                        help="envelopes sent over HTTP, the first of the file (default 200,000)")
    parser.add_argument("--http-batch", type=int, default=500, help="envelopes per request (default 500)")
    parser.add_argument("--http-clients", type=int, default=4, help="concurrent client threads (default 4)")
    parser.add_argument("--skip-bulk", action="store_true", help="do not run shapewatch ingest")
    parser.add_argument("--skip-http", action="store_true", help="do not run shapewatch serve")
    parser.add_argument("--skip-contracts", action="store_true",
                        help="do not repeat the bulk import with the bench contracts registered")
    parser.add_argument("--keep", action="store_true",
                        help="keep the temporary directory (data, databases, child logs)")
    parser.add_argument("--json", type=Path, metavar="OUT", help="also write every figure to OUT as JSON")
    parser.add_argument("--shapes", type=lambda s: [x for x in s.split(",") if x], default=[],
                        help=f"also import these generated shapes, each --repeat times beside its floor: "
                             f"{', '.join(SHAPES)} (comma-separated; with --skip-bulk --skip-http, only them)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per shape (default 3)")
    parser.add_argument("--shapewatch", type=Path, default=Path(sys.executable).parent / "shapewatch",
                        help="the shapewatch executable (default: next to this Python)")
    args = parser.parse_args(argv)
    if args.n < 1 or args.http_n < 1 or args.http_batch < 1 or args.http_clients < 1 or args.repeat < 1:
        parser.error("--n, --http-n, --http-batch, --http-clients and --repeat must be >= 1")
    unknown = sorted(set(args.shapes) - set(SHAPES))
    if unknown:
        parser.error(f"--shapes: unknown {', '.join(unknown)}; choose from {', '.join(SHAPES)}")
    if args.file is not None and not args.file.is_file():
        parser.error(f"--file {args.file}: no such file")
    if not (args.skip_bulk and args.skip_http) and not os.access(args.shapewatch, os.X_OK):
        parser.error(f"{args.shapewatch} is not an executable; install the project "
                     f"(make venv) or pass --shapewatch")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run every step asked for; 0 if all targets pass, 1 otherwise."""
    args = parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="shapewatch-bench-"))
    try:
        report = _run(args, workdir)
    finally:
        if args.keep:
            _log(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print(render(report))
    if args.json is not None:
        args.json.write_bytes(orjson.dumps(asdict(report) | {"passed": report.passed},
                                           option=orjson.OPT_INDENT_2))
    return 0 if report.passed else 1


def _run(args: argparse.Namespace, workdir: Path) -> Report:
    if args.shapes and args.skip_bulk and args.skip_http:  # the shapes alone
        report = Report(file="(shapes)", n=0)
        _run_shapes(args, workdir, report)
        evaluate(report)
        return report
    if args.file is not None:
        report = Report(file=str(args.file.resolve()), n=0)  # counted by the floor
    else:
        report = Report(file=str(workdir / "envelopes.jsonl"), n=args.n)
        _log(f"generating {args.n:,} envelopes into {report.file}...")
        began = time.perf_counter()
        written = write_jsonl(Path(report.file), args.n, seed=args.seed)
        seconds = time.perf_counter() - began
        report.generate = {"seconds": seconds, "events_per_s": args.n / seconds, "bytes": written}
    path = Path(report.file)
    # Read the file once so no measured step pays for the disk rather than the page cache.
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass
    floor = _run_step(report, "floor", lambda: measure_floor(path, workdir))
    if floor is not None:
        report.n = floor["events"]  # the same as --n unless --file was given
    if not args.skip_bulk:
        _run_step(report, "bulk", lambda: measure_bulk(args.shapewatch, path, workdir))
        if not args.skip_contracts:
            _run_step(report, "bulk_contracts",
                      lambda: measure_bulk(args.shapewatch, path, workdir, contracts=True))
    if not args.skip_http:
        _run_step(report, "http", lambda: measure_http(args.shapewatch, path, workdir, args.http_n,
                                                      args.http_batch, args.http_clients))
    _run_shapes(args, workdir, report)
    evaluate(report)
    return report


def _run_shapes(args: argparse.Namespace, workdir: Path, report: Report) -> None:
    for shape in args.shapes:
        _log(f"shape {shape}...")
        try:
            report.shapes[shape] = measure_shape(args.shapewatch, shape, workdir, args.repeat, args.seed)
        except (OSError, RuntimeError, ValueError) as exc:
            report.checks.append(Check(f"{shape} ran", "error", "completes", False))
            report.errors[shape] = str(exc)
            _log(f"  {shape} failed: {exc}")


if __name__ == "__main__":
    sys.exit(main())
