"""The analyzer's records shared by every scale-out node, through a takeover: a loopback cluster
(3 NATS nodes, PostgreSQL, a collector, a worker), two analyzers serving the API (one elected,
one standby) and an API node that never runs for election, paging a local PagerDuty-shaped
receiver (``pager_receiver.PagerReceiver``).

One cohort drifts (four fields lose their values five hours before now). Writes are sent to the
nodes that are not elected (they forward them): the baseline is frozen through the standby, the
evaluation asked of the API node, an alert acknowledged through the API node and a silence set
through the standby. Every node then answers the same alerts, incidents, silences and baselines.
The elected analyzer is SIGKILLed; the standby takes over with all of it, evaluates again, and
the pager, which heard the incident's trigger once, hears nothing more.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from cluster_harness import SHAPEWATCH, Cluster, Proc, free_port, missing_tools, shapewatch_proc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "analysis"))
from pager_receiver import PagerReceiver

from shapewatch.collector import Settings

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(bool(missing_tools()), reason=f"scale-out cluster needs: {', '.join(missing_tools())}"),
]

MODEL, PROMPT, CONTRACT = "gpt-4o-2024-08-06", "triage-v2", "triage"
COHORT = {"model": MODEL, "prompt_version": PROMPT, "contract": CONTRACT}
DRIFTING = ["customer.email", "customer.tier", "language", "sentiment"]
ROUTING_KEY = "R0UT1NGKEY0000000000000000000000"
BASELINE_EVENTS, DRIFT_EVENTS = 420, 300


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


def envelopes(start: datetime, n: int, *, drift: bool) -> list[dict[str, Any]]:
    return [
        {
            "event_id": uuid.uuid4().hex,
            "ts": iso(start + i * timedelta(minutes=1)),
            **COHORT,
            "served_model": MODEL,
            "output": output(i, drift),
        }
        for i in range(n)
    ]


def wait_for(what: str, condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            if condition():
                return
        except (httpx.HTTPError, AssertionError, KeyError) as exc:
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")
        time.sleep(0.2)  # polling processes of the cluster with a deadline


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("shared"), collectors=1, workers=1, shards=4)
    try:
        c.start()
        yield c
    except BaseException:
        print(c.logs())
        raise
    finally:
        c.stop()


class Node:
    def __init__(self, proc: Proc, port: int) -> None:
        self.proc, self.url = proc, f"http://127.0.0.1:{port}"

    def get(self, path: str, **params: Any) -> Any:
        r = httpx.get(self.url + path, params=params, timeout=60)
        assert r.status_code == 200, (self.proc.name, path, r.status_code, r.text[:500])
        return r.json()

    def get_text(self, path: str) -> str:
        r = httpx.get(self.url + path, timeout=60)
        assert r.status_code == 200, (self.proc.name, path, r.status_code, r.text[:500])
        return r.text

    def post(self, path: str, body: Any = None) -> httpx.Response:
        return httpx.post(self.url + path, json=body, timeout=120)

    def log(self) -> str:
        return self.proc.log.read_text(errors="replace")


DASHBOARD = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"
DASHBOARD_PAGES = ["views/cohorts.py", "views/field.py", "views/baselines.py", "views/ingestion.py"]


def dash(url: str, monkeypatch: pytest.MonkeyPatch, page: str | None = None) -> Any:
    """The dashboard (Streamlit's AppTest, in this process) reading the node at ``url``."""
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("SHAPEWATCH_URL", url)
    monkeypatch.setenv("SHAPEWATCH_AUTHOR", "ana")
    monkeypatch.delenv("SHAPEWATCH_TOKEN", raising=False)
    at = AppTest.from_file(DASHBOARD, default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    if page is not None:
        at.switch_page(page).run()
    return at


def shared_view(node: Node) -> dict[str, Any]:
    """What every node must answer alike: alerts, incidents, silences, baselines."""
    return {
        "alerts": node.get("/v1/alerts"),
        "incidents": node.get("/v1/incidents"),
        "silences": node.get("/v1/silences"),
        "baselines": node.get("/v1/baselines"),
    }


def test_an_api_node_refuses_what_it_cannot_forward_naming_the_reason(cluster: Cluster, tmp_path: Path) -> None:
    """Run first (no analyzer elected yet in this cluster): an API node behind tokens checks the
    token and the body itself, and answers a write it has nowhere to send with 503."""
    assert cluster.config is not None
    conf = tmp_path / "tokens.toml"
    conf.write_text(cluster.config.read_text() + 'tokens = ["read:r-secret", "admin:a-secret"]\n')
    port = free_port()
    proc = shapewatch_proc(
        "api-tokens",
        ["scaleout", "api", "--config", str(conf), "--state", str(tmp_path / "t.duckdb"), "--port", str(port)],
        tmp_path / "api-tokens.log",
        port,
    )
    proc.start()
    url = f"http://127.0.0.1:{port}"
    silence = {"field": "language", "duration": "1h", "author": "carol", "reason": "r"}
    try:
        proc.wait_ready(120)
        cases: list[tuple[httpx.Response, int, str]] = [
            (httpx.get(f"{url}/v1/alerts", timeout=30), 401, "authentication required"),
            (httpx.post(f"{url}/v1/silences", json=silence, timeout=30), 401, "authentication required"),
            (
                httpx.post(f"{url}/v1/silences", json=silence, headers={"authorization": "Bearer nope"}, timeout=30),
                401,
                "missing or invalid bearer token",
            ),
            (
                httpx.post(
                    f"{url}/v1/silences",
                    content=b"{" + b" " * (2 << 20) + b"}",
                    headers={"authorization": "Bearer a-secret", "content-type": "application/json"},
                    timeout=30,
                ),
                413,
                f"body is {(2 << 20) + 2} bytes; the limit is {Settings().max_admin_body_bytes}",
            ),
            (
                httpx.post(
                    f"{url}/v1/silences", json=silence, headers={"authorization": "Bearer a-secret"}, timeout=30
                ),
                503,
                "no analyzer is elected yet: writes (acknowledgements, silences, baselines) go to the elected analyzer",
            ),
        ]
        for r, status, message in cases:
            assert (r.status_code, r.json()["error"]["message"]) == (status, message), r.text[:300]
        assert cases[-1][0].headers["retry-after"] == "1"
        assert cases[3][0].json()["error"]["fields"] == [{"path": "body", "reason": "too large"}]
        read = httpx.get(f"{url}/v1/alerts", headers={"authorization": "Bearer r-secret"}, timeout=30)
        assert (read.status_code, read.json()) == (200, [])
    finally:
        proc.kill()

    # Options refused at start, naming the option and the reason.
    bad_url = subprocess.run(
        [
            *SHAPEWATCH,
            *("scaleout", "analyzer", "--config", str(conf), "--state", str(tmp_path / "x.duckdb")),
            *("--port", str(free_port()), "--advertise-url", "ftp://analyzer-1"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad_url.returncode == 2
    assert "Invalid value for '--advertise-url': must be an http:// or https:// URL with a host" in bad_url.stderr
    no_rules = subprocess.run(
        [
            *SHAPEWATCH,
            *("scaleout", "api", "--config", str(conf), "--state", str(tmp_path / "x.duckdb")),
            *("--rules", str(tmp_path / "missing.toml")),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert no_rules.returncode == 2
    assert f"{tmp_path / 'missing.toml'}" in no_rules.stderr and "cannot read the rules file" in no_rules.stderr


def test_every_node_answers_the_shared_records_and_a_takeover_keeps_them_without_paging_again(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    t0 = now - timedelta(hours=5)
    with PagerReceiver() as pager:
        rules = tmp_path / "rules.toml"
        rules.write_text(f"""
[analyzer]
window = "4h"
interval = "1h"
confirm_evaluations = 1
short_windows = []

[[notify.targets]]
name = "pd"
kind = "pagerduty"
url = "{pager.url}"
routing_key = "{ROUTING_KEY}"
timeout_seconds = 5
""")
        ports = [free_port(), free_port(), free_port()]
        a1 = Node(cluster.analyzer("a1", tmp_path / "a1.duckdb", ports[0], rules), ports[0])
        a2 = Node(cluster.analyzer("a2", tmp_path / "a2.duckdb", ports[1], rules), ports[1])
        api = Node(cluster.api("api", tmp_path / "api.duckdb", ports[2], rules), ports[2])
        nodes = [a1, a2, api]
        a1.proc.start()
        try:
            wait_for("a1 elected", lambda: "analyzer a1 elected" in a1.log(), 120)
            a2.proc.start()
            api.proc.start()
            for n in nodes:
                n.proc.wait_ready(120)
            assert "elected" not in a2.log() and "elected" not in api.log()

            events = envelopes(t0 - timedelta(hours=7), BASELINE_EVENTS, drift=False)
            events += envelopes(t0, DRIFT_EVENTS, drift=True)
            for i in range(0, len(events), 250):
                r = httpx.post(f"{cluster.urls[0]}/v1/outputs", json=events[i : i + 250], timeout=60)
                assert r.status_code == 200 and r.json()["accepted"] == len(events[i : i + 250]), r.text[:300]
            window = {"since": iso(t0 - timedelta(hours=8)), "until": iso(now + timedelta(minutes=1))}
            wait_for(
                "every event stored in the lake",
                lambda: [c["events"] for c in a2.get("/v1/cohorts", **window)] == [len(events)],
                120,
            )

            # The baseline frozen through the standby (forwarded to a1), the evaluation asked of
            # the API node (forwarded too).
            frozen = a2.post(
                "/v1/baselines",
                {**COHORT, "since": iso(t0 - timedelta(hours=7)), "until": iso(t0), "note": "ok", "author": "ana"},
            )
            assert frozen.status_code == 201, frozen.text
            assert frozen.json()["samples"] == BASELINE_EVENTS
            run = api.post("/v1/analyzer/run")
            assert run.status_code == 200, run.text

            pages = [a for a in a1.get("/v1/alerts", severity="page") if a["state"] == "firing"]
            assert sorted((a["field"], a["kind"]) for a in pages) == [(f, "presence_drop") for f in DRIFTING]
            (incident,) = a1.get("/v1/incidents")
            wait_for("the page delivered", lambda: len(pager.requests) == 1, 60)
            assert pager.incidents_for(incident["incident_id"])[0].triggers == 1

            # An acknowledgement through the API node, a silence through the standby.
            acked = api.post(f"/v1/alerts/{pages[0]['fingerprint']}/ack", {"author": "bob"})
            assert acked.status_code == 200, acked.text
            assert acked.json()["acknowledged_by"] == "bob"
            silenced = a2.post(
                "/v1/silences",
                {"field": "language", "duration": "2h", "author": "carol", "reason": "known: new snapshot"},
            )
            assert silenced.status_code == 201, silenced.text

            # Every node answers the same records, read from itself.
            before = shared_view(a1)
            assert [s["author"] for s in before["silences"]] == ["carol"]
            assert [b["samples"] for b in before["baselines"]] == [BASELINE_EVENTS]
            assert {a["fingerprint"]: a["acknowledged_by"] for a in before["alerts"]}[pages[0]["fingerprint"]] == "bob"
            for n in (a2, api):
                assert shared_view(n) == before, n.proc.name

            # The elected analyzer dies; the standby takes over with all of it.
            a1.proc.kill()
            t_kill = time.monotonic()
            wait_for("a2 elected", lambda: "analyzer a2 elected" in a2.log(), 60)
            print(f"\nanalyzer takeover after {time.monotonic() - t_kill:.1f} s")
            for n in (a2, api):
                assert shared_view(n) == before, n.proc.name

            # The new leader evaluates (asked through the API node, which now forwards to a2):
            # the incident is the one already paged, so the pager hears nothing new.
            for _ in range(2):
                again = api.post("/v1/analyzer/run")
                assert again.status_code == 200, again.text
            after = a2.get("/v1/alerts", severity="page")
            assert {a["fingerprint"]: (a["state"], a["episode"]) for a in after} == {
                a["fingerprint"]: ("firing", a["episode"]) for a in pages
            }
            assert a2.get("/v1/incidents") == before["incidents"]
            runs = a2.get("/v1/analyzer/runs")
            assert len(runs) >= 3 and all(r["ok"] for r in runs[:3]), runs[:3]
            time.sleep(12)  # the new leader's delivery job runs every 10 s: a page would be out by now
            assert len(pager.requests) == 1
            assert pager.incidents_for(incident["incident_id"])[0].triggers == 1
            notifications = [
                line
                for line in a2.get_text("/metrics").splitlines()
                if line.startswith("shapewatch_notifications_pending")
            ]
            assert notifications == ['shapewatch_notifications_pending{target="pd"} 0.0'], notifications

            # The dashboard pointed at the API node: every page opens, the alerts page lists what
            # it lists pointed at the elected analyzer, and an acknowledgement from it lands there.
            dash(api.url, monkeypatch)
            for page in DASHBOARD_PAGES:
                assert not dash(api.url, monkeypatch, page).exception, page
            heads = [h.value for h in dash(api.url, monkeypatch).subheader]
            assert heads == [h.value for h in dash(a2.url, monkeypatch).subheader]
            assert heads[0] == "Page (4)", heads
            other = next(a for a in pages[1:] if a["field"] != "language")
            at = dash(api.url, monkeypatch)
            at.button(key=f"ack-{other['fingerprint']}").click().run()
            assert not at.exception, [e.value for e in at.exception]
            assert a2.get(f"/v1/alerts/{other['fingerprint']}")["acknowledged_by"] == "ana"
            assert api.get(f"/v1/alerts/{other['fingerprint']}")["acknowledged_by"] == "ana"

            # A write to the dead analyzer's old address is gone; the standby answers it now.
            expire = a2.post(f"/v1/silences/{before['silences'][0]['silence_id']}/expire")
            assert expire.status_code == 200, expire.text
            assert api.get("/v1/silences") == []
        except BaseException:
            print(cluster.logs())
            raise
        finally:
            for n in nodes:
                n.proc.kill()
