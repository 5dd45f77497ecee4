"""The scale-out cluster on loopback, under kills: 3 NATS JetStream nodes, PostgreSQL, 2
collectors, 2 workers (``make test-cluster``; not part of the default run).

Retrying clients send events with ids while a NATS node, a collector and a worker are each
SIGKILLed once at a random point of the ingest and restarted. Then every acknowledged event is
stored exactly once, the lake's rollups equal a recomputation from its stored events, and the
analyzer's alerts on the lake equal the embedded store's on the same events (one cohort drifts,
one does not). The tally is printed (and written to tally.json beside the cluster's logs).

``SHAPEWATCH_CLUSTER_EVENTS`` sets the number of events (default 20,000; the issue's figure,
200,000, takes long on a loaded 2-core machine: docs/scale-out.md gives measured times).
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from cluster_harness import Cluster, free_port, missing_tools

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "analysis"))
from drift_outputs import output

from shapewatch.analysis.analyzer import analyze_once
from shapewatch.analysis.config import AnalyzerConfig
from shapewatch.analysis.store_access import SCHEMAS
from shapewatch.baselines import Cohort, freeze_baseline
from shapewatch.collector import Store
from shapewatch.collector.envelope import Limits, parse_envelope
from shapewatch.collector.rollup import ROLLUP_TABLES

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(bool(missing_tools()), reason=f"scale-out cluster needs: {', '.join(missing_tools())}"),
]

EVENTS = int(os.environ.get("SHAPEWATCH_CLUSTER_EVENTS", "20000"))
AT = datetime(2026, 11, 30, tzinfo=UTC)  # the evaluation's time
BASE = (AT - timedelta(days=3), AT - timedelta(days=2))  # the baseline's window
DRIFTING = Cohort("gpt-4o-2024-08-06", "triage-v7", "intake")
STEADY = Cohort("gpt-4o-2024-08-06", "triage-v8", "intake")
REQUEST_EVENTS = 250


def _events(n: int) -> list[dict[str, Any]]:
    """Half of each cohort's events in the baseline window, half in the last 24 hours before AT;
    the drifting cohort's recent half drifts. Every event has its own time (no ties in samples)."""
    out = []
    per = n // 4
    for c, cohort in enumerate((DRIFTING, STEADY)):
        for half, (start, span) in enumerate(
            ((BASE[0], timedelta(days=1)), (AT - timedelta(days=1), timedelta(days=1)))
        ):
            for i in range(per):
                ts = start + span * (i / per) + timedelta(microseconds=c * 7 + half * 3)
                out.append(
                    {
                        "event_id": f"{c}-{half}-{i:07d}",
                        "ts": ts.isoformat().replace("+00:00", "Z"),
                        "model": cohort.model,
                        "served_model": cohort.model,
                        "prompt_version": cohort.prompt_version,
                        "contract": cohort.contract,
                        "source": "production",
                        "output": output(i, drift=(cohort is DRIFTING and half == 1)),
                    }
                )
    return out


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("cluster"))
    try:
        c.start()
        yield c
    except BaseException:
        print(c.logs())
        raise
    finally:
        c.stop()


class _Clients:
    """Threads posting batches of events to a random collector, each batch retried (same ids)
    until it is answered 200: the ids of a 200 are acknowledged."""

    def __init__(self, urls: list[str], events: list[dict[str, Any]]) -> None:
        self.urls = urls
        self.batches = [events[i : i + REQUEST_EVENTS] for i in range(0, len(events), REQUEST_EVENTS)]
        self.acked: set[str] = set()
        self.lock = threading.Lock()
        self.retries = 0
        self.statuses: dict[str, int] = {}
        self.rejected: list[Any] = []

    def send(self, batch: list[dict[str, Any]]) -> None:
        body = orjson.dumps(batch)
        with httpx.Client(timeout=30) as http:
            while True:
                url = random.choice(self.urls)
                try:
                    r = http.post(f"{url}/v1/outputs", content=body, headers={"content-type": "application/json"})
                    key = str(r.status_code)
                except httpx.HTTPError as exc:
                    r, key = None, type(exc).__name__
                with self.lock:
                    self.statuses[key] = self.statuses.get(key, 0) + 1
                if r is not None and r.status_code == 200:
                    reply = r.json()
                    with self.lock:
                        for res in reply["results"]:
                            if res["status"] in ("accepted", "duplicate"):
                                self.acked.add(res["event_id"])
                            else:
                                self.rejected.append(res)
                    return
                with self.lock:
                    self.retries += 1
                time.sleep(0.2)


def _chaos(cluster: Cluster, clients: _Clients, total: int, done: threading.Event, log: list[str]) -> None:
    """SIGKILL a NATS node, a collector and a worker, once each, at random points of the ingest
    (a fraction of the events acknowledged), and restart each after a random pause."""
    assert cluster.nats is not None
    targets = [
        ("nats", random.choice(cluster.nats.nodes).proc),
        ("collector", random.choice(cluster.collector_procs)),
        ("worker", random.choice(cluster.worker_procs)),
    ]
    random.shuffle(targets)
    points = sorted(random.uniform(0.1, 0.8) for _ in targets)
    for (_kind, proc), point in zip(targets, points, strict=True):
        assert proc is not None
        while len(clients.acked) < point * total:
            if done.wait(0.05):
                return
        proc.kill()
        log.append(f"SIGKILL {proc.name} at {len(clients.acked)} acknowledged")
        time.sleep(random.uniform(0.5, 2.0))
        proc.start()
        proc.wait_ready(120)
        log.append(f"restarted {proc.name} at {len(clients.acked)} acknowledged")


def _lake(cluster: Cluster) -> Any:
    from shapewatch.collector.store.lake import LakeConfig, LakeWriter

    assert cluster.pg is not None
    return LakeWriter.open(LakeConfig(cluster.pg.dsn, f"{cluster.root / 'lake'}/"))


def _rollup_sums(query: Any) -> dict[str, list[tuple[Any, ...]]]:
    """Every rollup table summed per key, cohorts named (their ids differ between stores)."""
    tables = {**ROLLUP_TABLES, "served_models": (["cohort_id", "bucket", "served_model"], ["n"])}
    out = {}
    for table, (keys, sums) in tables.items():
        k = ", ".join(f"t.{c}" for c in keys if c != "cohort_id")
        s = ", ".join(f"sum(t.{c})::BIGINT" for c in sums)
        out[table] = [
            tuple(r)
            for r in query(
                f"SELECT c.model, c.prompt_version, c.contract, {k}, {s} FROM {table} t JOIN cohorts c USING (cohort_id) "
                "GROUP BY ALL ORDER BY ALL"
            )
        ]
    return out


def _envelopes_of_rows(rows: list[tuple[Any, ...]]) -> list[Any]:
    lim = Limits()
    out = []
    for event_id, ts, model, pv, contract, served, version, source, text in rows:
        doc = {
            "event_id": event_id,
            "ts": ts.isoformat(),
            "model": model,
            "prompt_version": pv,
            "contract": contract,
            "served_model": served,
            "contract_version": version,
            "source": source,
            "output": orjson.loads(text),
        }
        out.append(parse_envelope(orjson.dumps({k: v for k, v in doc.items() if v is not None}), lim))
    return out


def _alerts(store: Any) -> list[dict[str, Any]]:
    for cohort in (DRIFTING, STEADY):
        freeze_baseline(store, cohort, *BASE, author="cluster-test", note="the reference day", now=BASE[1])
    _, alerts = analyze_once(store, AnalyzerConfig(), AT)
    return [a.to_json() for a in alerts]


def test_kills_during_ingest_lose_nothing_and_store_nothing_twice(cluster: Cluster, tmp_path: Path) -> None:
    events = _events(EVENTS)
    clients = _Clients(cluster.urls, events)
    done = threading.Event()
    chaos_log: list[str] = []
    chaos = threading.Thread(target=_chaos, args=(cluster, clients, len(events), done, chaos_log), daemon=True)
    t0 = time.monotonic()
    chaos.start()
    with ThreadPoolExecutor(6) as pool:
        list(pool.map(clients.send, clients.batches))
    ingest_s = time.monotonic() - t0
    done.set()
    chaos.join(180)
    assert not clients.rejected, clients.rejected[:3]
    assert len(chaos_log) == 6, (chaos_log, cluster.logs())  # three kills, three restarts

    lake = _lake(cluster)
    try:
        # The workers drain the stream: wait until every acknowledged event is stored.
        deadline = time.monotonic() + max(300, EVENTS / 50)
        while time.monotonic() < deadline:
            stored = lake.query("SELECT count(*), count(DISTINCT event_id) FROM events")[0]
            if stored[1] >= len(clients.acked):
                break
            time.sleep(1)
        drained_s = time.monotonic() - t0
        time.sleep(3)  # anything redelivered late would add a row now
        stored_rows, stored_distinct = lake.query("SELECT count(*), count(DISTINCT event_id) FROM events")[0]
        stored_ids = {r[0] for r in lake.query("SELECT event_id FROM events")}
        lost = clients.acked - stored_ids
        rows = lake.query(
            """SELECT e.event_id, e.ts, c.model, c.prompt_version, c.contract, e.served_model, e.contract_version,
                      e.source, e.output FROM events e JOIN cohorts c USING (cohort_id)"""
        )
        lake_sums = _rollup_sums(lake.query)
    finally:
        lake.close()

    # The rollups the lake holds, against the same events counted again by the embedded store.
    with Store.open(tmp_path / "recount.duckdb") as recount:
        envs = _envelopes_of_rows(rows)
        for i in range(0, len(envs), 5000):
            recount.write_batch(envs[i : i + 5000])
        want = _rollup_sums(recount.query)
    mismatches = sum(len(set(lake_sums[t]) ^ set(want[t])) for t in want)

    # The analyzer on the lake and on the embedded store, over the events the clients sent.
    from shapewatch.analysis.scaleout import open_lake_store
    from shapewatch.collector.scaleout import ScaleOutConfig
    from shapewatch.collector.store.lake import LakeBoundStore

    assert cluster.config is not None
    with open_lake_store(ScaleOutConfig.from_toml(cluster.config), tmp_path / "analyzer.duckdb") as lake_store:
        assert isinstance(lake_store, LakeBoundStore)
        lake_store.take_over("cluster-test", None)  # the writer of the shared records, as if elected
        lake_alerts = _alerts(lake_store)
    with Store.open(tmp_path / "embedded.duckdb", schemas=SCHEMAS) as embedded:
        lim = Limits()
        envs = [parse_envelope(orjson.dumps(e), lim) for e in events]
        for i in range(0, len(envs), 5000):
            embedded.write_batch(envs[i : i + 5000])
        embedded_alerts = _alerts(embedded)

    tally = {
        "events_sent": len(events),
        "acknowledged": len(clients.acked),
        "stored": stored_rows,
        "lost": len(lost),
        "duplicated": stored_rows - stored_distinct,
        "rollup_mismatches": mismatches,
        "alerts_lake": len(lake_alerts),
        "alerts_embedded": len(embedded_alerts),
        "alerts_equal": lake_alerts == embedded_alerts,
        "client_retries": clients.retries,
        "client_answers": clients.statuses,
        "ingest_seconds": round(ingest_s, 1),
        "stored_all_after_seconds": round(drained_s, 1),
        "chaos": chaos_log,
    }
    (cluster.root / "tally.json").write_bytes(orjson.dumps(tally, option=orjson.OPT_INDENT_2))
    print("\nscale-out cluster tally: " + orjson.dumps(tally, option=orjson.OPT_INDENT_2).decode())

    # no process of the cluster died on its own (a worker that crashes on a NATS failover would
    # leave its shards to the other one, and this test would pass without it otherwise)
    assert cluster.dead() == [], cluster.logs()
    assert len(clients.acked) == len(events)
    assert lost == set(), sorted(lost)[:10]
    assert stored_rows == stored_distinct == len(events)
    assert mismatches == 0, {t: sorted(set(lake_sums[t]) ^ set(want[t]))[:5] for t in want if lake_sums[t] != want[t]}
    assert lake_alerts == embedded_alerts
    # one cohort drifts (a page at least), the other does not
    drifting = {
        (a["field"], a["kind"]) for a in lake_alerts if a["cohort"]["prompt_version"] == DRIFTING.prompt_version
    }
    steady = [a for a in lake_alerts if a["cohort"]["prompt_version"] == STEADY.prompt_version]
    assert ("customer.tier", "presence_drop") in drifting, lake_alerts
    assert steady == []


def test_a_second_analyzer_takes_over_when_the_elected_one_dies(cluster: Cluster, tmp_path: Path) -> None:
    ports = [free_port(), free_port()]
    a = cluster.analyzer("a1", tmp_path / "a1.duckdb", ports[0])
    b = cluster.analyzer("a2", tmp_path / "a2.duckdb", ports[1])
    a.start()
    try:
        _wait_for(lambda: "analyzer a1 elected" in a.log.read_text(errors="replace"), 90)
        b.start()
        # the elected one serves the read API on the lake
        _wait_for(lambda: _status(ports[0], "/healthz") == 200, 60)
        cohorts = httpx.get(f"http://127.0.0.1:{ports[0]}/v1/cohorts", timeout=30)
        assert cohorts.status_code == 200, cohorts.text
        ingest = httpx.post(
            f"http://127.0.0.1:{ports[0]}/v1/outputs",
            content=orjson.dumps(_events(4)[0]),
            headers={"content-type": "application/json"},
            timeout=30,
        )
        assert ingest.status_code == 503, ingest.text  # events go to the collectors, never stored here
        assert "collector" in ingest.json()["error"]["message"]
        time.sleep(5)  # b asks every second: five refusals
        assert "elected" not in b.log.read_text(errors="replace")
        # the standby serves the same reads from the start (docs/scale-out.md: every node serves the API)
        _wait_for(lambda: _status(ports[1], "/healthz") == 200, 60)
        standby = httpx.get(f"http://127.0.0.1:{ports[1]}/v1/cohorts", timeout=30)
        assert standby.status_code == 200
        assert standby.json() == cohorts.json()
        a.kill()
        t0 = time.monotonic()
        _wait_for(lambda: "analyzer a2 elected" in b.log.read_text(errors="replace"), 60)
        print(f"\nanalyzer takeover after {time.monotonic() - t0:.1f} s")
        _wait_for(lambda: _status(ports[1], "/healthz") == 200, 60)
        again = httpx.get(f"http://127.0.0.1:{ports[1]}/v1/cohorts", timeout=30)
        assert again.status_code == 200
        assert again.json() == cohorts.json()
    finally:
        a.kill()
        b.kill()


def _status(port: int, path: str) -> int | None:
    try:
        return httpx.get(f"http://127.0.0.1:{port}{path}", timeout=5).status_code
    except httpx.HTTPError:
        return None


def _wait_for(predicate: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true after {timeout} s")
        time.sleep(0.2)
