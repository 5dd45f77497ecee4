"""The SDK ``collector.Client`` against the real service (``shapewatch serve``), including a SIGKILL."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from harness import Service, free_port, start_service

from shapewatch.collector.sdk import Client


def stored(db: Path) -> dict[str, int]:
    with duckdb.connect(str(db), read_only=True) as con:
        return dict(con.execute("SELECT event_id, count(*) FROM events GROUP BY event_id").fetchall())


def wait_for(cond: object, timeout: float, what: str) -> None:
    """Poll a condition with a deadline (not a blind sleep)."""
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


@pytest.fixture
def clients(tmp_path: Path) -> Iterator[list[Client]]:
    made: list[Client] = []
    yield made
    for c in made:
        c.close(timeout=1)


@pytest.mark.slow  # a service and 500 outputs through the SDK's retries (about 10 s)
def test_sdk_delivers_500_outputs_once(service: Service, tmp_path: Path, clients: list[Client]) -> None:
    client = Client(service.url, spill_dir=tmp_path / "spill", batch_size=64, flush_interval=0.05)
    clients.append(client)
    ids = [
        client.record(
            {"priority": ["low", "high"][i % 2], "n": i}, model="gpt-4o", prompt_version="v1", contract="triage"
        )
        for i in range(500)
    ]
    assert len(set(ids)) == 500
    assert client.flush(timeout=30)
    assert client.stats == {
        "recorded": 500,
        "sent": 500,
        "duplicate": 0,
        "rejected": 0,
        "spilled": 0,
        "dropped": 0,
        "retries": 0,
        "recovered": 0,
    }
    with service.client() as c:
        assert c.get("/healthz").json()["events"] == 500
    service.stop()
    assert stored(service.db_path) == dict.fromkeys(ids, 1)


@pytest.mark.slow
def test_sdk_survives_a_sigkill_of_the_service_mid_stream(tmp_path: Path, clients: list[Client]) -> None:
    db, port = tmp_path / "sdk.duckdb", free_port()
    svc = start_service(db, port=port)
    try:
        client = Client(
            svc.url, spill_dir=tmp_path / "spill", batch_size=20, flush_interval=0.01, max_backoff=0.2, timeout=5
        )
        clients.append(client)
        total = 600

        def record(n: int) -> list[str]:
            return [client.record({"n": i, "ok": i % 3 != 0}, model="gpt-4o", prompt_version="v1") for i in range(n)]

        ids = record(total // 2)
        wait_for(lambda: client.stats["sent"] >= 100, 30, "the first deliveries")
        svc.stop(signal.SIGKILL)  # mid-stream: a batch may be in flight, more are waiting
        assert svc.proc.returncode == -signal.SIGKILL
        assert client.stats["sent"] < total // 2, "everything was delivered before the kill: not mid-stream"
        ids += record(total // 2)  # the application keeps recording while the service is down
        wait_for(lambda: client.stats["retries"] > 0, 30, "a failed delivery while the service is down")
        t0 = time.monotonic()
        svc = start_service(db, port=port, timeout=30)
        assert time.monotonic() - t0 < 30
        assert client.flush(timeout=60), client.stats
        stats = client.stats
        assert stats["recorded"] == total
        assert stats["sent"] + stats["duplicate"] == total, stats
        assert (stats["rejected"], stats["dropped"]) == (0, 0), stats
        with svc.client() as c:
            assert c.get("/healthz").json()["events"] == total
    finally:
        svc.stop()
    assert stored(db) == dict.fromkeys(ids, 1)  # every recorded event once, nothing else
