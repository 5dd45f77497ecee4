"""The load scenario's parts: a clock-paced ingest generator, a dashboard-like poller, the
workspace it runs against (a baseline per cohort so the analyzer compares for real), and
the figures computed from what each request saw.

The generator is open-loop: batch ``k`` is due at ``t0 + k * batch / rate``, whatever happened
to the batches before it. A dispatcher thread sleeps until each due time and hands the batch
to a few worker threads (one keep-alive ``httpx.Client`` each); a batch that waits for a free
worker is *late*, and its lateness is measured, never hidden: latency is reported both from
the moment the request was sent (what the service took) and from the moment it was due (what
a client at that rate would have seen). Nothing is dropped when the service falls behind, so
a slow service shows as lateness and a lower achieved rate, not as fewer events.

Envelopes come from ``bench/gen.py`` (realistic: five cohorts, 24 leaf paths); each body is
built at send time from pre-serialised outputs, with a fresh ``event_id`` (``PREFIX`` + a
sequence number, so the acknowledged ids can be checked against the file afterwards) and the
current time as ``ts``, so the analyzer's window sees the load as it happens.
"""

from __future__ import annotations

import os
import queue
import re
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import orjson
from rel_support import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from gen import COHORTS, make_envelopes

__all__ = [
    "LoadPlan",
    "LoadResult",
    "PollResult",
    "Poller",
    "cpu_seconds",
    "histogram_counts",
    "log_problems",
    "mean",
    "pct",
    "run_load",
    "seed_baselines",
    "stored_sequence_numbers",
    "summary",
    "write_config",
]


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) by nearest rank; 0.0 for no values."""
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * len(s) + 0.5) - 1))]


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# --- the workspace -------------------------------------------------------------------------------


def write_config(path: Path, *, interval: str, window: str = "1h") -> Path:
    """Service settings and the analyzer's schedule in one TOML file (``shapewatch --config``)."""
    path.write_text(f"""
# the collector's settings are top-level keys (collector/settings.py); defaults kept
batch_max_events = 5000

[analyzer]
window = "{window}"
interval = "{interval}"
""")
    return path


def seed_baselines(c: httpx.Client, now: datetime, n: int = 10_000) -> dict[str, int]:
    """``n`` envelopes over ``[now - 3h, now - 2h)`` (outside a 1 h window), then one frozen,
    active baseline per cohort over that hour; returns the events seeded per cohort."""
    since, until = now - timedelta(hours=3), now - timedelta(hours=2)
    step = (until - since) / n
    batch: list[dict[str, Any]] = []
    per_cohort: Counter[str] = Counter()
    for i, env in enumerate(make_envelopes(n, seed=11)):
        env["event_id"] = f"seed-{i:07d}"
        env["ts"] = _iso(since + i * step)
        per_cohort[f"{env['model']}|{env['prompt_version']}|{env['contract']}"] += 1
        batch.append(env)
        if len(batch) == 1000:
            r = c.post("/v1/outputs", content=orjson.dumps(batch), headers={"content-type": "application/json"})
            assert r.status_code == 200 and r.json()["accepted"] == len(batch), r.text[:500]
            batch = []
    assert not batch
    for co in COHORTS:
        r = c.post(
            "/v1/baselines",
            json={
                "model": co.model,
                "prompt_version": co.prompt_version,
                "contract": co.contract,
                "since": since.isoformat(),
                "until": until.isoformat(),
                "note": "load scenario baseline",
                "author": "reliability",
            },
        )
        assert r.status_code == 201, r.text[:500]
    return dict(per_cohort)


# --- the generator ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadPlan:
    """What the generator offers: ``rate`` events/s in bodies of ``batch`` for ``seconds``."""

    rate: float
    batch: int
    seconds: float
    workers: int = 4
    prefix: str = "load-"
    timeout: float = 30.0

    @property
    def period(self) -> float:
        return self.batch / self.rate

    @property
    def batches(self) -> int:
        return max(1, round(self.seconds / self.period))


@dataclass
class Sent:
    """One ingest request as the generator saw it (times: ``time.monotonic()``)."""

    k: int
    due: float
    started: float = 0.0
    finished: float = 0.0
    outcome: str = ""  # "ok", "http_<status>", "transport:<ExceptionName>", "answer:<what>"
    acked: list[int] = field(default_factory=list)  # sequence numbers accepted or duplicate
    counts: dict[str, int] = field(default_factory=dict)


class _Bodies:
    """Request bodies built at send time from pre-serialised envelopes (no event_id or ts)."""

    def __init__(self, prefix: str, pool_size: int = 4000) -> None:
        self.prefix = prefix.encode()
        self.tails: list[bytes] = []
        for env in make_envelopes(pool_size, seed=23):
            del env["event_id"], env["ts"]
            self.tails.append(orjson.dumps(env)[1:])  # '"model":...}' : the object without its '{'

    def body(self, first: int, n: int) -> bytes:
        ts = _iso(datetime.now(UTC)).encode()
        tails, size = self.tails, len(self.tails)
        parts = [
            b'{"event_id":"%s%09d","ts":"%s",%s' % (self.prefix, seq, ts, tails[seq % size])
            for seq in range(first, first + n)
        ]
        return b"[" + b",".join(parts) + b"]"


@dataclass
class LoadResult:
    plan: LoadPlan
    t0: float
    sent: list[Sent]

    @property
    def acked_events(self) -> int:
        return sum(len(s.acked) for s in self.sent)

    @property
    def offered_events(self) -> int:
        return self.plan.batches * self.plan.batch

    def outcomes(self) -> Counter[str]:
        return Counter(s.outcome for s in self.sent)

    def elapsed(self) -> float:
        """From the first due time to the last answer."""
        return max((s.finished for s in self.sent), default=self.t0) - self.t0

    def achieved_rate(self) -> float:
        """Acknowledged events per second from the first due time to the last answer."""
        return self.acked_events / self.elapsed() if self.sent else 0.0

    def sustained_rate(self) -> float:
        """Events per second acknowledged between the first answer and the last: the rate held,
        insensitive to a constant latency (which only shifts both ends), not to falling behind
        (which stretches the span)."""
        done = sorted(self.sent, key=lambda s: s.finished)
        if len(done) < 2 or done[-1].finished <= done[0].finished:
            return 0.0
        return (self.acked_events - len(done[0].acked)) / (done[-1].finished - done[0].finished)

    def slice_rates(self, width: float = 10.0) -> list[float]:
        """Events acknowledged per second in each whole ``width``-second slice of the planned run."""
        n = int(self.plan.seconds // width)
        per = [0] * n
        for s in self.sent:
            i = int((s.finished - self.t0) // width)
            if 0 <= i < n:
                per[i] += len(s.acked)
        return [p / width for p in per]

    def latencies(self) -> list[float]:
        """Seconds from sending a request to its answer."""
        return [s.finished - s.started for s in self.sent]

    def latencies_from_due(self) -> list[float]:
        """Seconds from a batch's due time to its answer (what a client at this rate saw)."""
        return [s.finished - s.due for s in self.sent]

    def lateness(self) -> list[float]:
        return [s.started - s.due for s in self.sent]

    def acked_sequence_numbers(self) -> set[int]:
        return {seq for s in self.sent for seq in s.acked}


def _post(client: httpx.Client, bodies: _Bodies, plan: LoadPlan, item: Sent) -> None:
    first = item.k * plan.batch
    body = bodies.body(first, plan.batch)
    item.started = time.monotonic()
    try:
        r = client.post("/v1/outputs", content=body)
    except httpx.HTTPError as exc:
        item.finished = time.monotonic()
        item.outcome = f"transport:{type(exc).__name__}"
        return
    item.finished = time.monotonic()
    if r.status_code != 200:
        item.outcome = f"http_{r.status_code}"
        return
    try:
        answer = orjson.loads(r.content)
        item.counts = {k: int(answer[k]) for k in ("accepted", "duplicate", "rejected")}
        results = answer["results"]
    except (KeyError, TypeError, ValueError):
        item.outcome = "answer:unreadable"
        return
    if len(results) != plan.batch:
        item.outcome = "answer:wrong_length"
        return
    item.acked = [first + res["index"] for res in results if res["status"] in ("accepted", "duplicate")]
    item.outcome = "ok" if len(item.acked) == plan.batch else "answer:some_rejected"


def run_load(url: str, plan: LoadPlan, *, on_tick: Callable[[float], None] | None = None) -> LoadResult:
    """Offer ``plan`` to ``url``'s ``POST /v1/outputs``; returns every request's record."""
    bodies = _Bodies(plan.prefix)
    work: queue.SimpleQueue[Sent | None] = queue.SimpleQueue()
    sent: list[Sent] = []

    def worker() -> None:
        with httpx.Client(base_url=url, timeout=plan.timeout, headers={"content-type": "application/json"}) as client:
            while (item := work.get()) is not None:
                _post(client, bodies, plan, item)

    threads = [threading.Thread(target=worker, name=f"load-{i}", daemon=True) for i in range(plan.workers)]
    for t in threads:
        t.start()
    t0 = time.monotonic() + 0.2
    for k in range(plan.batches):
        due = t0 + k * plan.period
        # Pace by the clock: wait for this batch's due time, not for a fixed gap after the last.
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        item = Sent(k, due)
        sent.append(item)
        work.put(item)
        if on_tick is not None:
            on_tick(due - t0)
    for _ in threads:
        work.put(None)
    for t in threads:
        t.join(plan.timeout + 60)
    return LoadResult(plan, t0, sent)


# --- the dashboard's reads ------------------------------------------------------------------------


@dataclass
class PollResult:
    latencies: dict[str, list[float]] = field(default_factory=dict)
    outcomes: Counter[str] = field(default_factory=Counter)


class Poller:
    """A thread reading what the dashboard reads, every ``every`` seconds, until stopped.

    >>> with Poller(url, every=5.0) as poller: ...      # doctest: +SKIP
    >>> poller.result.latencies["/v1/cohorts"]           # doctest: +SKIP
    """

    def __init__(self, url: str, every: float, cohort_id: int | None = None) -> None:
        self.url, self.every = url, every
        self.paths = [
            ("/v1/alerts", {"state": "open"}),
            ("/v1/cohorts", {}),
            ("/v1/analyzer/runs", {"limit": 50}),
            ("/metrics", {}),
        ]
        if cohort_id is not None:  # the field page: a window profile read back from the rollups
            self.paths.append((f"/v1/cohorts/{cohort_id}/fields", {}))
        self.result = PollResult()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="load-poller", daemon=True)

    def __enter__(self) -> Poller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def _loop(self) -> None:
        # Idle connections are dropped after 2 s, before the service's keep-alive timeout (5 s) closes
        # them: with both at 5 s (httpx's default) a refresh every 5 s raced the server's close and
        # was answered with a reset (ReadError) once in 185 reads. The dashboard itself opens a
        # connection per request and never meets that race.
        limits = httpx.Limits(keepalive_expiry=2.0)
        with httpx.Client(base_url=self.url, timeout=30, limits=limits) as client:
            t0 = time.monotonic()
            k = 0
            while not self._stop.is_set():
                for path, params in self.paths:
                    key = re.sub(r"/\d+/", "/{id}/", path)
                    began = time.monotonic()
                    try:
                        r = client.get(path, params=params)
                        outcome = "ok" if r.status_code == 200 else f"http_{r.status_code}"
                    except httpx.HTTPError as exc:
                        outcome = f"transport:{type(exc).__name__}"
                    self.result.latencies.setdefault(key, []).append(time.monotonic() - began)
                    self.result.outcomes[outcome] += 1
                k += 1
                # The next refresh is due at a fixed time, like the dashboard's timer.
                self._stop.wait(max(0.0, t0 + k * self.every - time.monotonic()))


# --- evidence -------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


_PROBLEM = re.compile(
    r"Traceback|\bERROR\b|\bCRITICAL\b|\block(ed)?\b|could not set lock|writer|"
    r"Exception|failed",
    re.IGNORECASE,
)


def log_problems(text: str) -> list[str]:
    """Lines of a service log that name an error, a lock or the writer."""
    return [line for line in text.splitlines() if _PROBLEM.search(line)]


def stored_sequence_numbers(db: Path, prefix: str) -> Iterator[int]:
    """The sequence numbers of the load's events in the file (the service must be stopped)."""
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        rows = con.execute(
            "SELECT CAST(substr(event_id, ?) AS BIGINT) FROM events WHERE starts_with(event_id, ?)",
            [len(prefix) + 1, prefix],
        ).fetchall()
    finally:
        con.close()
    return (int(r[0]) for r in rows)


def histogram_counts(metrics: str, name: str) -> dict[str, float]:
    """A Prometheus histogram's cumulative bucket counts by ``le`` (and ``count``), from /metrics text."""
    out: dict[str, float] = {}
    for m in re.finditer(rf'^{name}_bucket{{le="([^"]+)"}} (\S+)$', metrics, re.MULTILINE):
        out[m.group(1)] = float(m.group(2))
    if (m2 := re.search(rf"^{name}_count (\S+)$", metrics, re.MULTILINE)) is not None:
        out["count"] = float(m2.group(1))
    return out


def summary(values: list[float]) -> str:
    """``p50 / p99 / max`` in milliseconds."""
    return f"{pct(values, 0.5) * 1000:.0f} / {pct(values, 0.99) * 1000:.0f} / {max(values, default=0) * 1000:.0f}"


def mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else 0.0
