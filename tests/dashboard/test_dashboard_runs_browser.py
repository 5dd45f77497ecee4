"""The Agent runs and Cases pages in a real browser: headless Chromium loads them from
``shapewatch dashboard`` in front of a real ``shapewatch serve`` that received a looping run from
the real OpenTelemetry SDK. Slow (two processes and a browser): ``make test-slow`` runs it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from dashboard_live import free_port
from harness import ROOT, start_service
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from otlp_agent import run_agent, tracer_provider
from test_dashboard_browser import CHROMIUM, _dom_with, _screenshot

pytestmark = pytest.mark.slow


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium) on PATH")
def test_the_runs_and_cases_pages_render_in_a_real_browser(tmp_path: Path) -> None:
    svc = start_service(tmp_path / "browser-runs.duckdb", env={"SHAPEWATCH_RUN_IDLE_SECONDS": "1"})
    dash = None
    try:
        provider, memory = tracer_provider("4.0.0", OTLPSpanExporter(endpoint=f"{svc.url}/v1/traces", timeout=30))
        run_agent(provider.get_tracer("agent"), ["B7", "B7", "B7", "B7"])
        provider.force_flush()
        run_id = format(memory.get_finished_spans()[0].context.trace_id, "032x")
        provider.shutdown()
        deadline = time.monotonic() + 120
        while not httpx.get(f"{svc.url}/v1/cases").json()["cases"]:
            assert time.monotonic() < deadline, "the run was never judged"
            time.sleep(0.2)  # polling the scheduled judgement, with a deadline
        port = free_port()
        dash = subprocess.Popen(
            [sys.executable, "-m", "shapewatch.analysis.cli", "dashboard", "--url", svc.url, "--port", str(port)],
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        url = f"http://127.0.0.1:{port}"
        while True:
            assert dash.poll() is None, "the dashboard exited"
            assert time.monotonic() < deadline, "the dashboard did not start"
            try:
                if httpx.get(url + "/_stcore/health", timeout=2).text == "ok":
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)  # polling a start-up, with a deadline
        runs_dom = _dom_with(f"{url}/runs?run={run_id}", "tool_execution", deadline)
        assert run_id in runs_dom and "4.0.0" in runs_dom
        assert 'data-testid="stException"' not in runs_dom
        cases_dom = _dom_with(f"{url}/cases", "retry_loop", deadline)
        assert "repeated_call" in cases_dom and "Accept as a probe case" in cases_dom
        assert 'data-testid="stException"' not in cases_dom
        shots = tmp_path / "screenshots"
        shots.mkdir()
        _screenshot(shots / "runs.png", f"{url}/runs?run={run_id}", "1400,1600", deadline)
        _screenshot(shots / "cases.png", f"{url}/cases", "1400,1600", deadline)
    finally:
        if dash is not None and dash.poll() is None:
            dash.terminate()
            dash.wait(30)
        svc.stop()
