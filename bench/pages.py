"""Page load times of the dashboard in a real browser, on the sample workspace; and screenshots.

    .venv/bin/python bench/pages.py [--runs 5] [--limit 1.5] [--screenshots dashboard/screenshots]
                                    [--url SERVICE --dashboard DASHBOARD] [--json OUT]

Without ``--url`` it starts what ``make up`` starts, on a fresh database in a temporary folder:
``shapewatch serve``, the sample workspace written through the API (analysis/sample.py) and
``shapewatch dashboard``. Then headless Chromium, driven over the Chrome DevTools Protocol (one
browser, one tab, a 1,400 x 1,000 window), opens each page: Alerts, Cohorts, Field detail (the
intake cohort's ``customer.tier``), Baselines and review, Contracts, Ingestion health.

A load is timed from ``Page.navigate`` until Streamlit is idle: the app root reports its script
``notRunning`` over a ``CONNECTED`` session, the page's title is drawn, no skeleton is left and
every chart element has drawn its canvas or SVG (polled every 20 ms in the page). Each page is
loaded once cold (the first load after start-up: the dashboard's cache is empty) and then
``--runs`` times warm, one after the other, as someone moving between pages does (the
dashboard's reads are cached for 10 seconds, so a warm load is the page's own cost plus any
read whose cache ran out). Between loads the tab goes to ``about:blank``, so every load is a
new Streamlit session.

It prints one row per page (cold, warm median and worst) and exits 1 when a page's warm median
is over ``--limit`` seconds (1.5 s). With ``--screenshots DIR`` it saves a PNG of each page
after its last load (the whole page height, 1,400 px wide): the README's pictures. Figures
depend on the machine and on what else runs on it: they are indicative.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect

ROOT = Path(__file__).resolve().parent.parent
SHAPEWATCH = [sys.executable, "-m", "shapewatch.analysis.cli"]
WIDTH, HEIGHT = 1400, 1000

# (name, path and query, a text the page shows once drawn; {cohort} is the intake cohort's id)
PAGES = [
    ("Alerts", "/", "Alerts"),
    ("Cohorts", "/cohorts", "Cohorts"),
    ("Field", "/field?cohort={cohort}&field=customer.tier", "Field detail"),
    ("Baselines", "/baselines", "Baselines"),
    ("Contracts", "/contracts?contract=sample-intake", "Contracts"),
    ("Ingestion", "/ingestion", "Ingestion"),
]

# Streamlit is idle: the script ran to its end over a live session, the title is drawn, nothing
# is still a skeleton, and every chart has drawn (vega-embed puts a canvas or an svg in it).
IDLE = """(() => {
  const app = document.querySelector('[data-testid="stApp"]');
  if (!app || app.dataset.testScriptState !== 'notRunning' || app.dataset.testConnectionState !== 'CONNECTED') return false;
  if (!document.querySelector('h1')) return false;
  if (!document.body.innerText.includes(%s)) return false;
  if (document.querySelector('[data-testid="stSkeleton"]')) return false;
  for (const c of document.querySelectorAll('[data-testid="stVegaLiteChart"]'))
    if (!c.querySelector('canvas, svg')) return false;
  return true;
})()"""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, proc: subprocess.Popen[bytes] | None, timeout: float, ok: str | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"{url}: the process exited with {proc.returncode}")
        try:
            r = httpx.get(url, timeout=2)
            if r.status_code == 200 and (ok is None or r.text == ok):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)  # polling a start-up, with a deadline
    raise SystemExit(f"{url} did not answer within {timeout:.0f} s")


@contextmanager
def sample_workspace(workdir: Path) -> Iterator[tuple[str, str]]:
    """``make up`` on a fresh database: the service, the sample, the dashboard; their URLs."""
    from shapewatch.analysis.sample import seed_sample

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    port, dport = free_port(), free_port()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        log = (workdir / "serve.log").open("ab")
        procs.append(
            subprocess.Popen(
                [*SHAPEWATCH, "serve", "--db", str(workdir / "pages.duckdb"), "--port", str(port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=workdir,
            )
        )
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/healthz", procs[0], 60)
        print(f"sample workspace: {seed_sample(url).events} events", file=sys.stderr)
        dlog = (workdir / "dashboard.log").open("ab")
        procs.append(
            subprocess.Popen(
                [*SHAPEWATCH, "dashboard", "--url", url, "--port", str(dport)],
                stdout=dlog,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=workdir,
            )
        )
        dash = f"http://127.0.0.1:{dport}"
        wait_http(dash + "/_stcore/health", procs[1], 120, ok="ok")
        yield url, dash
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


@contextmanager
def chromium(workdir: Path) -> Iterator[str]:
    """Headless Chromium with the DevTools protocol on a free port; the page target's socket URL."""
    port = free_port()
    proc = subprocess.Popen(
        [
            os.environ.get("CHROMIUM", "chromium"),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--remote-debugging-port={port}",
            f"--user-data-dir={workdir / 'chromium'}",
            f"--window-size={WIDTH},{HEIGHT}",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=2).json()
                page = next(t for t in targets if t.get("type") == "page")
                break
            except (httpx.HTTPError, StopIteration, ValueError):
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit("chromium did not start (is it installed? .ci/install-tools)") from None
                time.sleep(0.1)  # polling a start-up, with a deadline
        yield str(page["webSocketDebuggerUrl"])
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


class Tab:
    """One Chromium tab over the DevTools protocol: commands in, their results out."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.next_id = 0

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        mine = self.next_id
        await self.ws.send(json.dumps({"id": mine, "method": method, "params": params}))
        while True:
            msg = json.loads(await self.ws.recv())
            if msg.get("id") == mine:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return dict(msg.get("result") or {})

    async def evaluate(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result.get("result", {}).get("value")

    async def load(self, url: str, text: str, timeout: float = 60.0) -> float:
        """Seconds from navigating to ``url`` until Streamlit is idle on it (``IDLE``)."""
        await self.call("Page.navigate", url="about:blank")
        started = time.perf_counter()
        await self.call("Page.navigate", url=url)
        probe = IDLE % json.dumps(text)
        while True:
            if await self.evaluate(probe) is True:
                return time.perf_counter() - started
            if time.perf_counter() - started > timeout:
                raise SystemExit(f"{url} was not idle within {timeout:.0f} s")
            await asyncio.sleep(0.02)

    async def screenshot(self, path: Path) -> None:
        height = int(await self.evaluate("document.querySelector('[data-testid=\"stMain\"]')?.scrollHeight || 1000"))
        height = max(HEIGHT, min(height + 40, 6000))
        await self.call(
            "Emulation.setDeviceMetricsOverride", width=WIDTH, height=height, deviceScaleFactor=1, mobile=False
        )
        await asyncio.sleep(0.5)  # the layout follows the new height; charts re-flow
        shot = await self.call("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(shot["data"]))
        await self.call(
            "Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT, deviceScaleFactor=1, mobile=False
        )


async def measure(socket_url: str, dash: str, cohort: int, runs: int, shots: Path | None) -> list[dict[str, Any]]:
    rows = []
    async with connect(socket_url, max_size=None) as ws:
        tab = Tab(ws)
        await tab.call("Page.enable")
        await tab.call(
            "Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT, deviceScaleFactor=1, mobile=False
        )
        for name, path, text in PAGES:
            url = dash + path.format(cohort=cohort)
            cold = await tab.load(url, text)
            warm = [await tab.load(url, text) for _ in range(runs)]
            if shots is not None:
                await tab.screenshot(shots / f"{name.lower()}.png")
            rows.append({"page": name, "url": url, "cold": cold, "warm": warm})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("--runs", type=int, default=5, help="warm loads per page (default 5)")
    p.add_argument("--limit", type=float, default=1.5, help="warm median limit per page, seconds (default 1.5)")
    p.add_argument("--screenshots", type=Path, help="save a PNG of each page here")
    p.add_argument("--url", help="a running service holding the sample workspace (with --dashboard)")
    p.add_argument("--dashboard", help="the dashboard in front of --url")
    p.add_argument("--json", type=Path, help="write the figures as JSON here")
    args = p.parse_args(argv)
    if not 1 <= args.runs <= 100:
        p.error("--runs: give 1 to 100")
    if bool(args.url) != bool(args.dashboard):
        p.error("--url and --dashboard go together")
    if args.screenshots:
        args.screenshots.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="shapewatch-pages-") as tmp:
        workdir = Path(tmp)
        with sample_workspace(workdir) if not args.url else _given(args.url, args.dashboard) as (url, dash):
            cohorts = httpx.get(url + "/v1/cohorts", timeout=30).json()
            cohort = next(
                (c["cohort_id"] for c in cohorts if c["cohort"]["contract"] == "sample-intake"), cohorts[0]["cohort_id"]
            )
            with chromium(workdir) as socket_url:
                rows = asyncio.run(measure(socket_url, dash, cohort, args.runs, args.screenshots))
    print(f"{'page':<12} {'cold s':>7} {'warm median s':>14} {'warm worst s':>13}  (limit {args.limit:g} s warm)")
    over = []
    for r in rows:
        median, worst = statistics.median(r["warm"]), max(r["warm"])
        flag = "" if median <= args.limit else "  OVER"
        if flag:
            over.append(r["page"])
        print(f"{r['page']:<12} {r['cold']:7.2f} {median:14.2f} {worst:13.2f}{flag}")
    print(f"{len(os.sched_getaffinity(0))} cores; figures are indicative (machine shared with other work)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    if over:
        print("over the limit: " + ", ".join(over), file=sys.stderr)
        return 1
    return 0


@contextmanager
def _given(url: str, dash: str) -> Iterator[tuple[str, str]]:
    yield url.rstrip("/"), dash.rstrip("/")


if __name__ == "__main__":
    sys.exit(main())
