"""One real browser: headless Chromium loads the dashboard (``shapewatch dashboard``) in front of a real
``shapewatch serve`` that holds the sample workspace, and sees the page alert.

Slow (two processes and a browser): ``make test-slow`` runs it. Screenshots of
the alerts page and of a field detail page are saved under the test's
temporary folder.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
from dashboard_live import free_port
from harness import ROOT, ensure_tool, start_service

from shapewatch.analysis.sample import seed_sample

pytestmark = pytest.mark.slow

CHROMIUM = ensure_tool("chromium")  # installed from Debian by the test when missing


def _chromium(*args: str, timeout: float = 60) -> str:
    assert CHROMIUM is not None
    done = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--virtual-time-budget=15000",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return done.stdout


def _dom_with(url: str, text: str, deadline: float) -> str:
    """The rendered DOM once it shows ``text`` (the first run of a fresh Streamlit process imports its
    libraries, so the first load may still be running)."""
    dom = ""
    while time.monotonic() < deadline:
        dom = _chromium("--dump-dom", url)
        if text in dom:
            return dom
    raise AssertionError(f"{text!r} never appeared at {url}; last DOM ends with {dom[-2000:]}")


def _screenshot(path: Path, url: str, window: str, deadline: float) -> None:
    """A screenshot of ``url`` with content painted: a page whose charts are still loading makes
    a PNG of under 20 KB (the field page once measured 15 KB under load), so take it again
    until it is bigger, or the deadline passes."""
    while True:
        _chromium(f"--window-size={window}", f"--screenshot={path}", url)
        if path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 20_000:
            return
        if time.monotonic() >= deadline:
            raise AssertionError(f"the screenshot of {url} stayed at {path.stat().st_size} bytes")


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium) on PATH")
def test_the_alerts_page_in_a_real_browser_shows_the_page_alert(tmp_path: Path) -> None:
    svc = start_service(tmp_path / "browser.duckdb")
    dash = None
    try:
        assert seed_sample(svc.url).seeded
        port = free_port()
        dash = subprocess.Popen(
            [sys.executable, "-m", "shapewatch.analysis.cli", "dashboard", "--url", svc.url, "--port", str(port)],
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            assert dash.poll() is None, "the dashboard exited"
            assert time.monotonic() < deadline, "the dashboard did not start"
            try:
                if httpx.get(url + "/_stcore/health", timeout=2).text == "ok":
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)  # polling a start-up, with a deadline

        dom = _dom_with(url + "/", "presence_drop", deadline)
        assert "customer.tier" in dom and "Page (2)" in dom and "Warn (4)" in dom
        assert dom.index("Page (2)") < dom.index("customer.tier") < dom.index("Warn (4)")
        assert 'data-testid="stException"' not in dom
        assert "not reachable" not in dom

        shots = tmp_path / "screenshots"
        shots.mkdir()
        _screenshot(shots / "alerts.png", url + "/", "1400,1800", deadline)
        cohorts = httpx.get(svc.url + "/v1/cohorts").json()
        cid = next(
            c["cohort_id"]
            for c in cohorts
            if c["cohort"]["contract"] == "sample-intake" and c["cohort"]["prompt_version"] == "intake-v3"
        )
        field_url = f"{url}/field?cohort={cid}&field=customer.tier"
        field_dom = _dom_with(field_url, "Type shares", deadline)
        assert 'data-testid="stException"' not in field_dom
        _screenshot(shots / "field.png", field_url, "1400,2200", deadline)

        # Stopping `shapewatch dashboard` (SIGTERM) stops Streamlit with it.
        children = psutil.Process(dash.pid).children(recursive=True)
        assert children
        dash.terminate()
        assert dash.wait(30) == 0
        _, alive = psutil.wait_procs(children, timeout=30)
        assert alive == []
    finally:
        if dash is not None and dash.poll() is None:
            dash.terminate()
            dash.wait(30)
        svc.stop()
