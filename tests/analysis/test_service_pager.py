"""End to end: a real ``shapewatch serve`` pages a local PagerDuty-like receiver, once per alert.

The service runs as a subprocess with a TOML file passed with ``--config``
(analyzer: a one-hour window, an interval long enough that the scheduler does
not interfere, a page confirmed by one evaluation; one PagerDuty target pointed
at ``pager_receiver.PagerReceiver``). Evaluations are triggered with
``POST /v1/analyzer/run``; the analyzer judges the window ending at the real
current time, so event times are placed relative to now. The receiver first
answers 500, then 429, then drops the connection, then accepts: the incident
must be opened exactly once per page fingerprint across those retries, across
a SIGKILL and restart, and be resolved once the window no longer breaches.

Delivery runs every 10 s inside the service, so waiting for the pager is
polling with a deadline (no fixed sleeps). Four delivery passes for the
trigger, one for the resolve and two start-ups take about a minute: the test
is marked slow (run it with ``pytest -m slow tests/analysis/test_service_pager.py``).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
from drift_outputs import envelopes as drift_envelopes
from harness import ROOT, SHAPEWATCH, Service, free_port
from pager_receiver import DROP, Incident, PagerReceiver, Step
from prometheus_client.parser import text_string_to_metric_families

MODEL = "claude-sonnet-4-5-20250929"
PROMPT = "intake-v3"
CONTRACT = "intake"
COHORT = {"model": MODEL, "prompt_version": PROMPT, "contract": CONTRACT}
ROUTING_KEY = "R0UT1NGKEY0000000000000000000000"
DELIVERY_DEADLINE = 75.0  # four delivery passes, 10 s apart, plus start-up, on a loaded machine


# The cohort's outputs; drifted: customer.tier missing from every second one (presence_drop) and
# a quarter of priorities "URGENT" (unknown_enum_growth above its page level).
envelopes = partial(drift_envelopes, model=MODEL, prompt_version=PROMPT, contract=CONTRACT, urgent_every=4)


def write_config(path: Path, pager_url: str) -> Path:
    path.write_text(f"""
[analyzer]
window = "1h"
interval = "1h"
confirm_evaluations = 1
short_windows = []

[oncall]
grouping = "field"  # an incident per field: each page alert its own incident, as this test is about

[[notify.targets]]
name = "pd"
kind = "pagerduty"
url = "{pager_url}"
routing_key = "{ROUTING_KEY}"
timeout_seconds = 5
""")
    return path


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[[Path, Path], Service]]:
    """``shapewatch --config FILE serve --db DB`` on a free port, healthy; stopped at the end."""
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
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"service exited with {proc.returncode}: {log.read_text()[-2000:]}"
            try:
                if httpx.get(svc.url + "/healthz", timeout=1).status_code == 200:
                    return svc
            except httpx.HTTPError:
                pass
            time.sleep(0.05)  # polling a start-up with a deadline
        raise AssertionError(f"service not healthy in 60 s: {log.read_text()[-2000:]}")

    yield start
    for svc in started:
        if svc.proc.poll() is None:
            svc.proc.kill()
            svc.proc.wait(30)


def wait_for(what: str, condition: Callable[[], bool], timeout: float = DELIVERY_DEADLINE) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)  # polling a background job with a deadline


def notification_metrics(c: httpx.Client) -> dict[str, float]:
    out = {}
    for fam in text_string_to_metric_families(c.get("/metrics").text):
        for s in fam.samples:
            if s.name == "shapewatch_notifications_total" and s.labels.get("target") == "pd":
                out[s.labels["result"]] = s.value
            elif s.name == "shapewatch_notifications_pending" and s.labels.get("target") == "pd":
                out["pending"] = s.value
    return out


def seed(c: httpx.Client, events: list[dict[str, Any]]) -> None:
    r = c.post("/v1/outputs", json=events)
    assert r.status_code == 200, r.text
    assert (r.json()["accepted"], r.json()["rejected"]) == (len(events), 0)


def run_analyzer(c: httpx.Client) -> dict[str, Any]:
    r = c.post("/v1/analyzer/run")
    assert r.status_code == 200 and r.json()["ok"], r.text
    return r.json()  # type: ignore[no-any-return]


def page_alerts(c: httpx.Client) -> dict[str, dict[str, Any]]:
    return {a["fingerprint"]: a for a in c.get("/v1/alerts", params={"severity": "page"}).json()}


@pytest.mark.slow
def test_one_incident_per_fingerprint_across_retries_and_a_restart_then_resolved(
    tmp_path: Path, serve: Callable[[Path, Path], Service]
) -> None:
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    db = tmp_path / "pager.duckdb"
    with PagerReceiver() as pager:
        pager.script(500, Step(429, {"Retry-After": "1"}), DROP)  # then 202 for every request
        config = write_config(tmp_path / "shapewatch.toml", pager.url)

        svc = serve(db, config)
        with svc.client() as c:
            # Baseline period (outside the one-hour window), then drift inside the window.
            seed(c, envelopes(now - timedelta(hours=3), 400, timedelta(seconds=10)))
            seed(c, envelopes(now - timedelta(minutes=45), 240, timedelta(seconds=5), drift=True))
            r = c.post(
                "/v1/baselines",
                json={
                    **COHORT,
                    "since": (now - timedelta(hours=3)).isoformat(),
                    "until": (now - timedelta(minutes=90)).isoformat(),
                    "note": "reviewed",
                    "author": "ana",
                },
            )
            assert r.status_code == 201, r.text
            assert r.json()["samples"] == 400

            run_analyzer(c)  # confirm_evaluations = 1: a page fires at its first breach
            pages = page_alerts(c)
            assert sorted((a["field"], a["kind"], a["state"], a["episode"]) for a in pages.values()) == [
                ("customer.tier", "presence_drop", "firing", 1),
                ("priority", "unknown_enum_growth", "firing", 1),
            ]
            # URGENT is folded into the unknown growth of priority: no warn alert of its own
            assert c.get("/v1/alerts", params={"severity": "warn"}).json() == []
            incidents = {a["incident_id"] for a in pages.values()}
            assert len(incidents) == 2 and None not in incidents

            wait_for(
                "an open incident per page alert, everything sent",
                lambda: (
                    {i.dedup_key for i in pager.open_incidents()} == incidents
                    and notification_metrics(c).get("pending") == 0
                ),
            )
            assert notification_metrics(c) == {"sent": 2.0, "retried": 3.0, "failed": 0.0, "pending": 0.0}

        assert [r.answer for r in pager.requests] == [500, 429, DROP, 202, 202]
        bodies = pager.bodies()
        assert all(b["routing_key"] == ROUTING_KEY and b["event_action"] == "trigger" for b in bodies)
        assert {b["dedup_key"] for b in bodies} == incidents
        # The retried request is the same trigger, with the same dedup key.
        assert bodies[0] == bodies[1] == bodies[2] == bodies[3]
        for iid in incidents:
            assert pager.incidents_for(iid) == [Incident(iid, open=True, triggers=1)]

        # A crash, then the same file again: the alert is still the same firing alert, and
        # nothing new is queued for the pager.
        svc.stop(signal.SIGKILL)
        assert svc.proc.returncode == -signal.SIGKILL
        svc = serve(db, config)
        with svc.client() as c:

            def episodes() -> dict[str, tuple[str, int, str, str]]:
                # last_seen moves with every evaluation (the scheduler's first one included)
                return {
                    fp: (a["state"], a["episode"], a["first_seen"], a["fired_at"]) for fp, a in page_alerts(c).items()
                }

            fired = {fp: ("firing", 1, a["first_seen"], a["fired_at"]) for fp, a in pages.items()}
            assert episodes() == fired
            assert run_analyzer(c)["transitions"] == 0
            assert episodes() == fired
            assert notification_metrics(c)["pending"] == 0

            # The condition clears: normal traffic dilutes the drift far below the tolerance
            # (and its hysteresis) in the window ending now.
            seed(c, envelopes(now - timedelta(minutes=20), 2160, timedelta(milliseconds=500)))
            states = []
            for _ in range(2):  # resolve_evaluations defaults to 2
                run_analyzer(c)
                states.append(sorted(a["state"] for a in page_alerts(c).values()))
            assert states[-1] == ["resolved", "resolved"], states
            resolved = page_alerts(c)
            assert all(a["resolved_at"] is not None and a["episode"] == 1 for a in resolved.values())
            assert {(a["kind"], a["state"]) for a in c.get("/v1/alerts", params={"severity": "warn"}).json()} == {
                ("new_enum_value", "firing")
            }  # 60 URGENT values are still a new value, now the unknown growth no longer breaches

            wait_for(
                "the incidents resolved",
                lambda: not pager.open_incidents() and notification_metrics(c).get("pending") == 0,
            )
            assert notification_metrics(c) == {"sent": 2.0, "retried": 0.0, "failed": 0.0, "pending": 0.0}

        for iid in incidents:
            assert pager.incidents_for(iid) == [Incident(iid, open=False, triggers=1)]
        resolves = [b for b in pager.bodies() if b["event_action"] == "resolve"]
        assert sorted(resolves, key=lambda b: b["dedup_key"]) == [
            {"routing_key": ROUTING_KEY, "event_action": "resolve", "dedup_key": iid} for iid in sorted(incidents)
        ]
        assert len(pager.requests) == 7  # 4 attempts + 1 for the two triggers, 2 resolves: nothing else


def test_a_repeated_accept_failure_is_logged_once_a_minute_with_a_count() -> None:
    from shapewatch.analysis.service import RepeatedLogLimit

    now = [0.0]
    limit = RepeatedLogLimit("socket.accept() out of system resource", every=60, clock=lambda: now[0])

    def passes(msg: str) -> str | None:
        record = logging.LogRecord("asyncio", logging.ERROR, __file__, 1, msg, None, None)
        return record.getMessage() if limit.filter(record) else None

    accept = "socket.accept() out of system resource"
    assert passes(accept) == accept
    assert [passes(accept) for _ in range(1000)] == [None] * 1000
    assert passes("Task exception was never retrieved") == "Task exception was never retrieved"  # others pass
    now[0] = 61.0
    assert passes(accept) == f"{accept} (and 1000 more like it in the last 60 s)"
    assert passes(accept) is None


def test_a_failure_caused_by_an_invalidated_database_is_logged_without_its_traceback() -> None:
    """The invalidation is logged once with its cause; a job still running when it happens (the
    notifier's read, say) fails on it too, and says so in one line."""
    import io

    from shapewatch.analysis.service import QuietAfterInvalidation
    from shapewatch.collector.errors import StoreError, StoreInvalidated

    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(QuietAfterInvalidation())
    logger = logging.getLogger("shapewatch.test-quiet-after-invalidation")
    logger.addHandler(handler)
    logger.propagate = False
    fatal = StoreInvalidated("reading", "FATAL Error: database has been invalidated")
    wrapper = StoreError("rendering", "a wrapper")
    other = StoreError("reading", "Binder Error: no such column")

    def log_failure(what: str, exc: BaseException, cause: BaseException | None = None) -> None:
        try:
            raise exc from cause
        except BaseException:
            logger.exception(what)

    try:
        log_failure("notification delivery failed", fatal)
        log_failure("notification delivery failed", wrapper, cause=fatal)  # raised from it
        log_failure("daily digest failed", other)
    finally:
        logger.removeHandler(handler)
    lines = out.getvalue().splitlines()
    assert lines[:2] == [f"notification delivery failed: {fatal}", f"notification delivery failed: {wrapper}"]
    assert lines[2] == "daily digest failed"  # any other failure keeps its traceback
    assert lines[3] == "Traceback (most recent call last):"
    assert lines[-1] == f"shapewatch.collector.errors.StoreError: {other}"
