"""Pager faults: a pager that answers 400, 429, 500, resets connections and accepts without
answering, and a service SIGKILLed between committing an alert and sending it.

A real ``shapewatch serve`` pages a local PagerDuty-like receiver (incidents by dedup key).
First life: the workspace drifts, an evaluation fires two page alerts (their triggers are
committed to the outbox with them), and the service is SIGKILLed before its first delivery
pass. Second life: the outbox is delivered through the scripted faults, then the drift
clears and both alerts resolve.

Pass: a 400 is final (that trigger is attempted exactly once, never retried); the other
trigger goes through 429, 500, a reset and a lost answer, and the pager ends with exactly
one incident for it; nothing is lost by the kill; every request carries the routing key
and the alert's fingerprint as dedup key; the resolve uses the same routing key and dedup
key (a resolve goes only where its trigger went: none for the refused one); no fingerprint
ever has more than one incident.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import fault_support  # noqa: F401  (registers the tests' helpers that rel_support loads)
import pytest
from fault_support import RESET, Daemon, FaultPager, spawn, wait_for
from fault_workspace import ROUTING_KEY, envelopes, evidence, seed_drift, utc_now, write_config
from pager_receiver import ACCEPT_THEN_DROP, Incident, Step


@pytest.mark.reliability
def test_pager_faults_and_a_kill_between_commit_and_send(tmp_path: Path, report: dict[str, object]) -> None:
    """Pager faults: 202/400/429/500/reset/lost answer, and a kill between commit and send"""
    now = utc_now()
    db = tmp_path / "pager.duckdb"
    procs: list[Daemon] = []
    with FaultPager() as pager, _killed_at_exit(procs):
        config = write_config(tmp_path / "shapewatch.toml", pager_url=pager.url, window="1h", interval="1h")
        svc = spawn(tmp_path, db, config=config)
        # --- life 1: fire, commit, die before the first delivery pass (10 s after start) ---
        t_start = time.monotonic()
        procs.append(svc)
        svc.start()
        with svc.client() as c:
            seed_drift(
                c,
                now,
                baseline_ago=timedelta(hours=3),
                drift_ago=timedelta(minutes=45),
                drift_span=timedelta(minutes=20),
            )
            r = c.post("/v1/analyzer/run")
            assert r.status_code == 200 and r.json()["transitions"] >= 2, r.text
            # keyed by incident (the pager's dedup key): one per page alert, grouped per field
            pages = {a["incident_id"]: a for a in c.get("/v1/alerts", params={"severity": "page"}).json()}
        committed_after = time.monotonic() - t_start
        assert pager.requests == [], "the delivery pass ran before the kill: the scenario tested nothing"
        svc.kill(signal.SIGKILL)
        outbox_at_kill = evidence(db)["outbox"]
        assert sorted(pages) == sorted(fp for fp, _ in outbox_at_kill) and len(pages) == 2
        assert all(state == "pending" for _, state in outbox_at_kill.values())

        # --- life 2: deliver through the faults ---
        pager.script(400, Step(429, {"Retry-After": "1"}), 500, RESET, ACCEPT_THEN_DROP)  # then 202
        svc.start()
        with svc.client() as c:
            wait_for(
                "both triggers settled (one failed for good, one delivered)",
                lambda: len(pager.requests) >= 6 and not _pending(c.get("/metrics").text),
                120,
                0.2,
            )
            refused = pager.requests[0].body["dedup_key"]
            delivered = next(fp for fp in pages if fp != refused)
            # The drift clears: normal traffic dilutes it far below the tolerance.
            r = c.post("/v1/outputs", json=envelopes(now - timedelta(minutes=20), 2160, timedelta(milliseconds=500)))
            assert r.status_code == 200 and r.json()["accepted"] == 2160, r.text
            for _ in range(2):  # resolve_evaluations defaults to 2
                assert c.post("/v1/analyzer/run").status_code == 200
            states = sorted(a["state"] for a in c.get("/v1/alerts", params={"severity": "page"}).json())
            assert states == ["resolved", "resolved"], states
            wait_for(
                "the resolve sent", lambda: len(pager.requests) >= 7 and not _pending(c.get("/metrics").text), 60, 0.2
            )
        svc.stop()
    ev = evidence(db)
    answers = [r.answer for r in pager.requests]
    by_fp = {
        fp: [(r.body["event_action"], r.answer) for r in pager.requests if r.body.get("dedup_key") == fp]
        for fp in pages
    }
    report.update(
        {
            "page fingerprints": len(pages),
            "seconds from start to committed alerts (life 1)": round(committed_after, 1),
            "requests to the pager": len(answers),
            "answers in order": answers,
            "attempts of the refused (400) trigger": sum(1 for a, _ in by_fp[refused] if a == "trigger"),
            "attempts of the delivered trigger": sum(1 for a, _ in by_fp[delivered] if a == "trigger"),
            "incidents per fingerprint": sorted(len(pager.incidents_for(fp)) for fp in pages),
            "outbox (fingerprint, action) -> state": sorted((fp[:8], a, s) for (fp, a), (_, s) in ev["outbox"].items()),
        }
    )
    assert answers == [400, 429, 500, RESET, ACCEPT_THEN_DROP, 202, 202], answers
    assert by_fp[refused] == [("trigger", 400)]  # never retried, and no resolve for what never opened
    assert by_fp[delivered] == [
        ("trigger", 429),
        ("trigger", 500),
        ("trigger", RESET),
        ("trigger", ACCEPT_THEN_DROP),
        ("trigger", 202),
        ("resolve", 202),
    ]
    assert pager.incidents_for(refused) == []
    assert pager.incidents_for(delivered) == [Incident(delivered, open=False, triggers=2)]  # one incident
    bodies = [r.body for r in pager.requests]
    assert all(b["routing_key"] == ROUTING_KEY and b["dedup_key"] in pages for b in bodies)
    assert [b for b in bodies if b["event_action"] == "resolve"] == [
        {"routing_key": ROUTING_KEY, "event_action": "resolve", "dedup_key": delivered}
    ]
    triggers = [b for b in bodies if b["event_action"] == "trigger" and b["dedup_key"] == delivered]
    assert all(t == triggers[0] for t in triggers)  # every retry is the same trigger
    assert {k: s for k, (_, s) in ev["outbox"].items()} == {
        (refused, "trigger"): "failed",
        (delivered, "trigger"): "sent",
        (delivered, "resolve"): "sent",
    }
    assert all(ep == 1 for _, ep in ev["alerts"].values())


@contextmanager
def _killed_at_exit(procs: list[Daemon]) -> Iterator[None]:
    try:
        yield
    finally:
        for p in procs:
            p.kill()


def _pending(metrics_text: str) -> bool:
    """Whether the outbox still holds pending notices for target pd (from /metrics)."""
    for line in metrics_text.splitlines():
        if line.startswith('shapewatch_notifications_pending{target="pd"}'):
            return float(line.split()[-1]) > 0
    return True
