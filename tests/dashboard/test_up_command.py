"""``shapewatch up`` (what ``make up`` runs): the service and the dashboard, the sample workspace in an empty
database only, and Ctrl-C stopping both."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import psutil
import pytest
from dashboard_live import free_port, live_service

from shapewatch.analysis.sample import seed_sample

ROOT = Path(__file__).resolve().parents[2]


def test_the_sample_is_never_written_into_a_service_that_holds_events(tmp_path: Path) -> None:
    with live_service(tmp_path / "busy.duckdb") as url:
        env = {"event_id": uuid.uuid4().hex, "model": "m-2026-01-01", "prompt_version": "p", "output": {"a": 1}}
        assert httpx.post(url + "/v1/outputs", json=env).status_code == 200
        before = httpx.get(url + "/v1/cohorts").json()
        summary = seed_sample(url)
        assert (summary.seeded, summary.events, summary.baselines) == (False, 0, ())
        assert httpx.get(url + "/v1/cohorts").json() == before
        assert httpx.get(url + "/v1/baselines").json() == []


def _lines(proc: subprocess.Popen[str]) -> queue.Queue[str]:
    q: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            q.put(line.rstrip("\n"))

    threading.Thread(target=pump, daemon=True).start()
    return q


def _wait_for(q: queue.Queue[str], prefix: str, seen: list[str], timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = q.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            break
        seen.append(line)
        if line.startswith(prefix):
            return line
    raise AssertionError(f"no line starting {prefix!r} in {timeout}s; output so far: {seen}")


@pytest.mark.parametrize(
    "stop",
    [pytest.param(signal.SIGINT, marks=pytest.mark.slow), pytest.param(signal.SIGTERM, marks=pytest.mark.slow)],
    ids=["ctrl-c", "sigterm"],
)
def test_up_runs_the_service_and_the_dashboard_with_the_sample_and_a_signal_stops_both(
    tmp_path: Path, stop: signal.Signals
) -> None:
    port, dash_port = free_port(), free_port()
    db = tmp_path / "var" / "shapewatch.duckdb"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SHAPEWATCH_DASHBOARD_REFRESH": "60"}
    env.pop("SHAPEWATCH_TOKENS", None)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "shapewatch.analysis.cli",
            "up",
            "--db",
            str(db),
            "--port",
            str(port),
            "--dashboard-port",
            str(dash_port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    seen: list[str] = []
    try:
        out = _lines(proc)
        assert _wait_for(out, "shapewatch service:", seen).startswith(f"shapewatch service:   http://127.0.0.1:{port}")
        assert _wait_for(out, "loaded the sample workspace:", seen).startswith(
            "loaded the sample workspace: 4730 events of contracts named sample-..., 3 baselines, 6 alerts"
        )
        assert _wait_for(out, "ready:", seen) == (
            f"ready: open http://127.0.0.1:{dash_port} (Ctrl-C stops the service and the dashboard)"
        )
        assert f"shapewatch dashboard: http://127.0.0.1:{dash_port}" in seen
        alerts = httpx.get(f"http://127.0.0.1:{port}/v1/alerts", params={"severity": "page"}).json()
        assert {a["field"] for a in alerts} == {"customer.tier", "score"}
        assert httpx.get(f"http://127.0.0.1:{dash_port}/_stcore/health").text == "ok"
        children = psutil.Process(proc.pid).children(recursive=True)
        assert any("streamlit" in " ".join(c.cmdline()) for c in children)

        proc.send_signal(stop)
        assert proc.wait(60) == 0, seen
        _gone, alive = psutil.wait_procs(children, timeout=20)
        assert alive == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert db.exists()
