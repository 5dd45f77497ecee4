"""The ``alertmanager`` notifier against a real Alertmanager (Debian's ``prometheus-alertmanager``,
installed by ``.ci/install-tools``): started by the test on a free port with a temporary
configuration and storage, it receives shapewatch's alerts through ``POST /api/v2/alerts``,
groups them by cohort, keeps them active while the notifier re-posts them, and marks them
resolved when the notifier ends them. What Alertmanager itself then notifies arrives at a local
webhook receiver (``pager_receiver.PagerReceiver``), grouped, then resolved.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from harness import free_port
from pager_receiver import PagerReceiver
from prometheus_client import CollectorRegistry

from shapewatch.analysis.notify import NoticeAction, Notifier, enqueue, notice_for, targets_from_config
from shapewatch.analysis.store_access import SCHEMAS
from shapewatch.collector import Store

BINARY = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
pytestmark = pytest.mark.skipif(
    BINARY is None,
    reason="no Alertmanager binary: run .ci/install-tools as root (Debian package prometheus-alertmanager)",
)

MODEL, PROMPT, CONTRACT = "gpt-4o", "triage-v2", "triage"
FIELDS = ["customer.tier", "language", "sentiment"]
DASHBOARD = "http://dashboard.test:8501"


def wait_for(what: str, condition: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)  # polling another process with a deadline
    return found


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[tuple[str, PagerReceiver]]:
    """A real Alertmanager on a free port, notifying a local webhook receiver: its URL and the receiver."""
    with PagerReceiver() as hook:
        port = free_port()
        config = tmp_path / "alertmanager.yml"
        config.write_text(f"""
route:
  receiver: hook
  group_by: [model, prompt_version, contract]
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: hook
    webhook_configs:
      - url: {hook.url.replace("/v2/enqueue", "/hook")}
        send_resolved: true
""")
        log = (tmp_path / "alertmanager.log").open("wb")
        proc = subprocess.Popen(
            [
                str(BINARY),
                f"--config.file={config}",
                f"--storage.path={tmp_path / 'am-data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--cluster.listen-address=",  # no gossip port: one instance
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"
        try:

            def ready() -> bool:
                assert proc.poll() is None, (tmp_path / "alertmanager.log").read_text()[-2000:]
                try:
                    return httpx.get(url + "/-/ready", timeout=1).status_code == 200
                except httpx.HTTPError:
                    return False

            wait_for("Alertmanager to be ready", ready)
            yield url, hook
        finally:
            proc.terminate()
            proc.wait(20)
            log.close()


def alert_json(field: str) -> dict[str, Any]:
    return {
        "cohort": {"model": MODEL, "prompt_version": PROMPT, "contract": CONTRACT},
        "field": field,
        "kind": "presence_drop",
        "severity": "page",
        "state": "firing",
        "fingerprint": f"fp-{field}",
        "detail": f"presence 100.0% -> 40.0% on {field}",
        "onset": {"at": "2026-11-29T03:10:00Z", "low": "2026-11-29T03:05:00Z", "high": "2026-11-29T03:15:00Z"},
        "links": {"dashboard": f"{DASHBOARD}/field?cohort=1&field={field}", "runbook": "http://sw.test/v1/runbooks/x"},
    }


def test_a_real_alertmanager_receives_groups_and_resolves(
    tmp_path: Path, alertmanager: tuple[str, PagerReceiver]
) -> None:
    url, hook = alertmanager
    (target,) = targets_from_config(
        {"targets": [{"name": "am", "kind": "alertmanager", "url": url, "repeat_seconds": 1}]}
    )
    assert target.url == f"{url}/api/v2/alerts"
    store = Store.open(tmp_path / "am.duckdb", schemas=SCHEMAS)
    notifier = Notifier(store, [target], registry=CollectorRegistry())
    try:
        now = datetime.now(UTC)
        with store.transaction("alerts fire") as con:
            notices = [notice_for(alert_json(f), episode=1, action=NoticeAction.trigger) for f in FIELDS]
            assert enqueue(con, [target], notices, now) == 3
        assert notifier.deliver(now).sent == 3

        with httpx.Client(base_url=url, timeout=5) as am:
            alerts = wait_for(
                "three active alerts",
                lambda: len(am.get("/api/v2/alerts").json()) == 3 and am.get("/api/v2/alerts").json(),
            )
            assert sorted(a["labels"]["field"] for a in alerts) == FIELDS
            for a in alerts:
                assert a["labels"] | {"field": "-"} == {
                    "alertname": "ShapewatchPresenceDrop",
                    "severity": "critical",
                    "model": MODEL,
                    "prompt_version": PROMPT,
                    "contract": CONTRACT,
                    "fingerprint": f"fp-{a['labels']['field']}",
                    "field": "-",
                }
                assert a["generatorURL"] == f"{DASHBOARD}/field?cohort=1&field={a['labels']['field']}"
                assert a["annotations"]["runbook_url"] == "http://sw.test/v1/runbooks/x"
                assert a["annotations"]["onset"] == "2026-11-29T03:10:00Z"
                assert a["status"]["state"] == "active"
            (group,) = am.get("/api/v2/alerts/groups").json()
            assert group["labels"] == {"model": MODEL, "prompt_version": PROMPT, "contract": CONTRACT}
            assert sorted(a["labels"]["field"] for a in group["alerts"]) == FIELDS

            # Alertmanager told its receiver once, the three alerts in one group.
            firing = wait_for("the grouped notification", lambda: [b for b in hook.bodies() if b["status"] == "firing"])
            assert firing[0]["groupLabels"] == {"model": MODEL, "prompt_version": PROMPT, "contract": CONTRACT}
            assert sorted(a["labels"]["field"] for a in firing[0]["alerts"]) == FIELDS

            # A firing alert is posted again (Alertmanager forgets what it does not hear of).
            before = {a["labels"]["field"]: a["updatedAt"] for a in am.get("/api/v2/alerts").json()}
            time.sleep(1.1)  # repeat_seconds = 1: the next pass re-posts
            assert notifier.deliver().sent == 0  # a repeat is no new notification
            after = {a["labels"]["field"]: a["updatedAt"] for a in am.get("/api/v2/alerts").json()}
            assert set(after) == set(FIELDS) and all(after[f] > before[f] for f in FIELDS)

            ended = datetime.now(UTC)
            with store.transaction("alerts resolve") as con:
                resolves = [
                    notice_for({**alert_json(f), "state": "resolved"}, episode=1, action=NoticeAction.resolve)
                    for f in FIELDS
                ]
                assert enqueue(con, [target], resolves, ended) == 3
            assert notifier.deliver(ended + timedelta(seconds=1)).sent == 3
            wait_for("no active alert", lambda: am.get("/api/v2/alerts").json() == [])
            resolved = wait_for(
                "the resolved notification", lambda: [b for b in hook.bodies() if b["status"] == "resolved"]
            )
            assert sorted(a["labels"]["field"] for a in resolved[-1]["alerts"]) == FIELDS
            for a in resolved[-1]["alerts"]:
                ends = datetime.fromisoformat(a["endsAt"].replace("Z", "+00:00"))
                assert a["status"] == "resolved" and ends <= datetime.now(UTC)
            # Resolved stays resolved: the notifier re-posts only what fires.
            time.sleep(1.1)
            notifier.deliver()
            assert am.get("/api/v2/alerts").json() == []
    finally:
        notifier.close()
        store.close()
