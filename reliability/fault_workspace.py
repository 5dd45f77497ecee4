"""A drifting workspace for the scheduler and pager scenarios: a frozen baseline and a window
that breaches it (two page alerts: customer.tier presence_drop, priority unknown_enum_growth),
written through a running service's HTTP API, and the evidence read back from its file."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import httpx
from drift_outputs import envelopes as drift_envelopes

from shapewatch.collector import Store

MODEL = "claude-sonnet-4-5-20250929"
PROMPT = "intake-v3"
CONTRACT = "intake"
COHORT = {"model": MODEL, "prompt_version": PROMPT, "contract": CONTRACT}
ROUTING_KEY = "R0UT1NGKEY0000000000000000000000"


# The cohort's outputs; drifted: customer.tier missing from every second one (presence_drop) and
# a quarter of priorities "URGENT" (unknown_enum_growth above its page level).
envelopes = partial(drift_envelopes, model=MODEL, prompt_version=PROMPT, contract=CONTRACT, urgent_every=4)


def write_config(path: Path, *, pager_url: str, window: str, interval: str, confirm: int = 1) -> Path:
    path.write_text(f"""
[analyzer]
window = "{window}"
interval = "{interval}"
confirm_evaluations = {confirm}

[oncall]
grouping = "field"  # an incident per page alert's field: the scenarios follow each page on its own

[[notify.targets]]
name = "pd"
kind = "pagerduty"
url = "{pager_url}"
routing_key = "{ROUTING_KEY}"
timeout_seconds = 5
""")
    return path


def seed_drift(
    c: httpx.Client, now: datetime, *, baseline_ago: timedelta, drift_ago: timedelta, drift_span: timedelta
) -> None:
    """400 baseline events from ``baseline_ago`` (frozen), then 240 drifting ones over ``drift_span``
    starting at ``drift_ago``."""
    base = envelopes(now - baseline_ago, 400, timedelta(seconds=10))
    r = c.post("/v1/outputs", json=base)
    assert r.status_code == 200 and r.json()["accepted"] == 400, r.text
    r = c.post("/v1/outputs", json=envelopes(now - drift_ago, 240, drift_span / 240, drift=True))
    assert r.status_code == 200 and r.json()["accepted"] == 240, r.text
    r = c.post(
        "/v1/baselines",
        json={
            **COHORT,
            "since": (now - baseline_ago).isoformat(),
            "until": (now - baseline_ago + timedelta(seconds=4000)).isoformat(),
            "note": "reviewed",
            "author": "ana",
        },
    )
    assert r.status_code == 201, r.text


def evidence(db: Path) -> dict[str, Any]:
    """What the file says after the service stopped: runs, alerts, the outbox."""
    with Store.open(db, read_only=True) as store:
        runs = store.query(
            "SELECT run_id, started_at, finished_at, ok, duration_seconds FROM analyzer_runs ORDER BY run_id"
        )
        alerts = store.query(
            "SELECT fingerprint, count(*), max(episode) FROM alerts WHERE severity = 'page' GROUP BY ALL"
        )
        outbox = store.query("SELECT fingerprint, action, count(*), max(state) FROM notifications GROUP BY ALL")
    return {
        "runs": runs,
        "alerts": {fp: (int(n), int(ep)) for fp, n, ep in alerts},
        "outbox": {(fp, a): (int(n), str(s)) for fp, a, n, s in outbox},
    }


def overlaps(runs: list[tuple[Any, ...]]) -> int:
    """Runs that started before the previous one (in start order) finished."""
    ordered = sorted(runs, key=lambda r: r[1])
    return sum(1 for a, b in itertools.pairwise(ordered) if b[1] < a[2])


def utc_now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)
