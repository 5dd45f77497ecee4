"""End to end, as an on-call engineer lives it: four fields of one cohort drift from T0, the
analyzer first runs five hours later, and a real ``shapewatch serve`` pages a local
PagerDuty-shaped receiver (``pager_receiver.PagerReceiver``) exactly once for the incident:
the trigger names the four fields and the worst, carries the onset (within 15 minutes of T0),
a deep link to the field page on a period that starts before the onset, the runbook, and the
served model that started answering. When the drift ends the pager hears one resolve.

The service judges the window ending at the real current time, so T0 is placed five hours
before now; evaluations are triggered with ``POST /v1/analyzer/run``. The alias ``gpt-4o`` is
answered by snapshot ``gpt-4o-2024-08-06`` in the baseline and by ``gpt-4o-2024-11-20`` from
T0 on. The drift ends the way a provider fix looks from here: outputs of the new snapshot with
every field filled again, dense enough to bring the window back under the tolerance's
hysteresis. Delivery runs every 10 s inside the service: slow (about a minute).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from harness import ROOT, SHAPEWATCH, Service, ensure_tool, free_port
from pager_receiver import PagerReceiver

ALIAS = "gpt-4o"
OLD, NEW = "gpt-4o-2024-08-06", "gpt-4o-2024-11-20"
PROMPT, CONTRACT = "triage-v2", "triage"
COHORT = {"model": ALIAS, "prompt_version": PROMPT, "contract": CONTRACT}
ROUTING_KEY = "R0UT1NGKEY0000000000000000000000"
DASHBOARD_PORT = free_port()
DASHBOARD = f"http://127.0.0.1:{DASHBOARD_PORT}"
SERVICE = "http://shapewatch.test:8000"
DRIFTING = ["customer.email", "customer.tier", "language", "sentiment"]
DEADLINE = 75.0


def iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


def output(i: int, drift: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "intent": ("refund", "billing", "shipping", "cancel")[i % 4],
        "priority": ("low", "medium", "high")[i % 3],
        "customer": {"tier": ("gold", "silver", "bronze")[i % 3], "email": f"user{i}@example.com"},
        "language": ("en", "de", "fr")[i % 3],
        "sentiment": ("positive", "neutral", "negative")[i % 3],
    }
    if drift and i % 5 < 3:  # three outputs in five lose the four fields
        del out["customer"]["tier"], out["customer"]["email"], out["language"], out["sentiment"]
    return out


def envelopes(start: datetime, n: int, step: timedelta, served: str, *, drift: bool = False) -> list[dict[str, Any]]:
    return [
        {
            "event_id": uuid.uuid4().hex,
            "ts": iso(start + i * step),
            "model": ALIAS,
            "served_model": served,
            "prompt_version": PROMPT,
            "contract": CONTRACT,
            "output": output(i, drift),
        }
        for i in range(n)
    ]


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[[Path, Path], Service]]:
    started: list[Service] = []

    def start(db: Path, config: Path) -> Service:
        port = free_port()
        log = tmp_path / f"serve-{port}.log"
        proc = subprocess.Popen(
            [*SHAPEWATCH, "--config", str(config), "serve", "--db", str(db), "--port", str(port)],
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**{k: v for k, v in os.environ.items() if not k.startswith("SHAPEWATCH_")}, "PYTHONPATH": str(ROOT)},
        )
        svc = Service(f"http://127.0.0.1:{port}", db, proc, log)
        started.append(svc)
        wait_for("the service to be healthy", lambda: _healthy(svc), 60)
        return svc

    yield start
    for svc in started:
        if svc.proc.poll() is None:
            svc.proc.kill()
            svc.proc.wait(30)


def _healthy(svc: Service) -> bool:
    assert svc.proc.poll() is None, f"service exited: {svc.log.read_text()[-2000:]}"
    try:
        return httpx.get(svc.url + "/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def wait_for(what: str, condition: Callable[[], bool], timeout: float = DEADLINE) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)  # polling a background job with a deadline


def seed(c: httpx.Client, events: list[dict[str, Any]]) -> None:
    for i in range(0, len(events), 2000):
        r = c.post("/v1/outputs", json=events[i : i + 2000])
        assert r.status_code == 200 and r.json()["rejected"] == 0, r.text[:500]


def pending(c: httpx.Client) -> float:
    for line in c.get("/metrics").text.splitlines():
        if line.startswith('shapewatch_notifications_pending{target="pd"}'):
            return float(line.split()[-1])
    raise AssertionError("no pending gauge for pd")


@pytest.mark.slow
def test_one_page_per_incident_with_onset_link_runbook_and_served_model_then_one_resolve(
    tmp_path: Path, serve: Callable[[Path, Path], Service]
) -> None:
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    t0 = now - timedelta(hours=5)
    with PagerReceiver() as pager:
        config = tmp_path / "shapewatch.toml"
        config.write_text(f"""
[analyzer]
window = "4h"
interval = "1h"
confirm_evaluations = 1
short_windows = []

[oncall]
dashboard_url = "{DASHBOARD}/"
service_url = "{SERVICE}"

[[notify.targets]]
name = "pd"
kind = "pagerduty"
url = "{pager.url}"
routing_key = "{ROUTING_KEY}"
timeout_seconds = 5
""")
        svc = serve(tmp_path / "oncall.duckdb", config)
        with svc.client() as c:
            # A baseline week-end's worth of normal outputs, one a minute until T0; then the drift.
            seed(c, envelopes(t0 - timedelta(hours=7), 420, timedelta(minutes=1), OLD))
            seed(c, envelopes(t0, 300, timedelta(minutes=1), NEW, drift=True))
            r = c.post(
                "/v1/baselines",
                json={**COHORT, "since": iso(t0 - timedelta(hours=7)), "until": iso(t0), "note": "ok", "author": "ana"},
            )
            assert r.status_code == 201 and r.json()["samples"] == 420, r.text

            assert c.post("/v1/analyzer/run").status_code == 200  # T0 + 5 h: the first look
            pages = [a for a in c.get("/v1/alerts", params={"severity": "page"}).json() if a["state"] == "firing"]
            assert sorted((a["field"], a["kind"]) for a in pages) == [(f, "presence_drop") for f in DRIFTING]
            (incident,) = c.get("/v1/incidents").json()
            assert {a["incident_id"] for a in pages} == {incident["incident_id"]}
            assert sorted(incident["fingerprints"]) == sorted(a["fingerprint"] for a in pages)
            assert incident["group"] == [ALIAS, PROMPT, CONTRACT, "production"] and incident["resolved_at"] is None

            wait_for("the page delivered", lambda: len(pager.requests) >= 1 and pending(c) == 0)
            assert c.post("/v1/analyzer/run").status_code == 200  # still firing: nothing new for the pager
            assert pending(c) == 0

            # Every alert answers since when, which model, where to look and what to do.
            for a in pages:
                onset = a["onset"]
                at, low, high = (datetime.fromisoformat(onset[k].replace("Z", "+00:00")) for k in ("at", "low", "high"))
                assert abs(at - t0) <= timedelta(minutes=15), (a["field"], onset, iso(t0))
                assert low <= at <= high and high - low <= timedelta(minutes=15), onset
                assert a["served_models"] == {
                    "window": [{"model": NEW, "share": 1.0}],
                    "baseline": [{"model": OLD, "share": 1.0}],
                    "new": [NEW],
                }
                link = urlsplit(a["links"]["dashboard"])
                query = {k: v[0] for k, v in parse_qs(link.query).items()}
                assert (f"{link.scheme}://{link.netloc}{link.path}", query["field"]) == (
                    f"{DASHBOARD}/field",
                    a["field"],
                )
                assert query["cohort"] == str(a["cohort_id"])
                assert query["since"] < iso(low) and query["until"] >= iso(now)  # the period shows the onset
                assert a["links"]["runbook"] == f"{SERVICE}/v1/runbooks/presence_drop"

        (trigger,) = pager.bodies()
        assert trigger["event_action"] == "trigger" and trigger["dedup_key"] == incident["incident_id"]
        details = trigger["payload"]["custom_details"]
        assert details["fields"] == DRIFTING and details["alerts_total"] == 4
        assert sorted(a["field"] for a in details["alerts"]) == DRIFTING
        summary = trigger["payload"]["summary"]
        assert summary.startswith("4 page alerts; worst: presence_drop on ") and all(f in summary for f in DRIFTING)
        assert abs(datetime.fromisoformat(details["onset"]["at"].replace("Z", "+00:00")) - t0) <= timedelta(minutes=15)
        assert details["served_models"]["new"] == [NEW]
        assert [link["text"] for link in trigger["links"]] == ["shapewatch dashboard", "runbook"]
        assert trigger["links"][0]["href"].startswith(f"{DASHBOARD}/field?cohort=")
        assert pager.incidents_for(incident["incident_id"])[0].triggers == 1

        # The link opens the field page in a real browser, on a period from before the onset, saying since when.
        if ensure_tool("chromium") is not None:
            first = min(pages, key=lambda a: a["field"])
            at = datetime.fromisoformat(first["onset"]["at"].replace("Z", "+00:00"))
            dom = open_in_browser(tmp_path, svc.url, first["links"]["dashboard"], f"since {at:%H:%M} UTC")
            assert f"since {at:%H:%M} UTC on {at:%Y-%m-%d}" in dom and 'data-testid="stException"' not in dom

        with svc.client() as c:
            # The provider fixes the snapshot: dense complete outputs bring the window back.
            seed(c, envelopes(now - timedelta(minutes=30), 3000, timedelta(milliseconds=600), NEW))
            for _ in range(2):  # resolve_evaluations defaults to 2
                assert c.post("/v1/analyzer/run").status_code == 200
            states = {a["field"]: a["state"] for a in c.get("/v1/alerts", params={"severity": "page"}).json()}
            assert states == dict.fromkeys(DRIFTING, "resolved")
            (closed,) = c.get("/v1/incidents").json()
            assert closed["incident_id"] == incident["incident_id"] and closed["resolved_at"] is not None
            wait_for("the resolve delivered", lambda: not pager.open_incidents() and pending(c) == 0)

        bodies = pager.bodies()
        assert [b["event_action"] for b in bodies] == ["trigger", "resolve"]
        assert bodies[1] == {
            "routing_key": ROUTING_KEY,
            "event_action": "resolve",
            "dedup_key": incident["incident_id"],
        }


def open_in_browser(tmp_path: Path, service_url: str, link: str, text: str) -> str:
    """``shapewatch dashboard`` on DASHBOARD_PORT, and headless Chromium's DOM of ``link`` once it shows
    ``text`` (a fresh Streamlit process imports its libraries on the first load)."""
    chromium = shutil.which("chromium")
    assert chromium is not None
    dash = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "shapewatch.analysis.cli",
            "dashboard",
            "--url",
            service_url,
            "--port",
            str(DASHBOARD_PORT),
        ],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:

        def healthy() -> bool:
            assert dash.poll() is None, "the dashboard exited"
            try:
                return httpx.get(f"{DASHBOARD}/_stcore/health", timeout=2).text == "ok"
            except httpx.HTTPError:
                return False

        wait_for("the dashboard to start", healthy, 120)
        deadline = time.monotonic() + 120
        dom = ""
        while time.monotonic() < deadline:
            dom = subprocess.run(
                [
                    chromium,
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--virtual-time-budget=15000",
                    "--dump-dom",
                    link,
                ],
                capture_output=True,
                text=True,
                timeout=60,
            ).stdout
            if text in dom:
                return dom
        raise AssertionError(f"{text!r} never appeared at {link}; the DOM ends with {dom[-2000:]}")
    finally:
        dash.terminate()
        dash.wait(30)
