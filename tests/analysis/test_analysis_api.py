"""The analysis HTTP routes (baselines, alerts, silences, cohorts, analyzer runs) through the ASGI app.

Each app runs its lifespan (``with TestClient(app)``), so the writer commits the
events posted to ``/v1/outputs`` into a real DuckDB file under tmp_path.
``POST /v1/analyzer/run`` evaluates at the real current time, so event times are
placed relative to now (aligned to the one-minute rollup buckets): a baseline
period days ago (on whole hours, where rollups are hour buckets), a drifted window in the last hours.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from drift_outputs import iso, output
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from shapewatch.analysis.service import create_app
from shapewatch.collector import Settings

MODEL = "claude-sonnet-4-5-20250929"
PROMPT = "intake-v3"
CONTRACT = "intake"
NAMES = {"model": MODEL, "prompt_version": PROMPT, "contract": CONTRACT}  # as a baseline document holds them
COHORT = {**NAMES, "source": "production"}  # as alerts, cohorts and decisions carry a cohort
DESIGN_ALERT_KEYS = {
    "cohort",
    "field",
    "kind",
    "severity",
    "state",
    "fingerprint",
    "baseline",
    "current",
    "detail",
    "onset",
    "served_models",
    "links",
    "incident_id",
}


def envelopes(
    start: datetime,
    n: int,
    *,
    drift: bool = False,
    model: str = MODEL,
    prompt_version: str = PROMPT,
    step: timedelta = timedelta(seconds=30),
) -> list[dict[str, Any]]:
    return [
        {
            "event_id": uuid.uuid4().hex,
            "ts": iso(start + i * step),
            "model": model,
            "served_model": model,
            "prompt_version": prompt_version,
            "contract": CONTRACT,
            "contract_version": "3",
            "output": output(i, drift),
        }
        for i in range(n)
    ]


def seed(c: TestClient, events: list[dict[str, Any]]) -> None:
    r = c.post("/v1/outputs", json=events)
    assert r.status_code == 200, r.text
    assert (r.json()["accepted"], r.json()["rejected"]) == (len(events), 0)


def assert_error(r: Any, status: int, message: str | None = None) -> dict[str, Any]:
    """The shared error shape, exactly; ``message`` (if given) must equal the message."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"status", "message", "fields"}, body
    assert body["error"]["status"] == status and isinstance(body["error"]["fields"], list)
    assert isinstance(body["error"]["message"], str) and body["error"]["message"].strip()
    if message is not None:
        assert body["error"]["message"] == message
    return body["error"]  # type: ignore[no-any-return]


def metric(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out: dict[tuple[tuple[str, str], ...], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


@dataclasses.dataclass(frozen=True)
class Times:
    now: datetime  # the current minute
    base: datetime  # baseline period: 400 normal events from here (30 s apart)
    normal: datetime  # a second normal period (another candidate baseline)
    drift: datetime  # drifted window: 400 events from here, inside the analyzer's 24h window

    @property
    def base_window(self) -> tuple[str, str]:
        return iso(self.base), iso(self.base + timedelta(hours=4))

    @property
    def normal_window(self) -> tuple[str, str]:
        return iso(self.normal), iso(self.normal + timedelta(hours=4))


def times() -> Times:
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    # Periods days back start on the hour: their rollups are hour buckets by then (rollup tiers),
    # and a baseline window on whole hours holds exactly its events.
    hour = now.replace(minute=0)
    return Times(now, hour - timedelta(days=3), hour - timedelta(days=2), now - timedelta(hours=5))


def make_app(db: Path, tokens: tuple[str, ...] = ()) -> Any:
    settings = dataclasses.replace(Settings(), db_path=db, tokens=tokens)
    return create_app(settings, registry=CollectorRegistry(), analyze=False)


def freeze_body(since: str, until: str, **kw: Any) -> dict[str, Any]:
    return {**COHORT, "since": since, "until": until, "note": "reviewed: week 48", "author": "ana", **kw}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(make_app(tmp_path / "api.duckdb")) as c:
        yield c


# --- a judged database, shared by the read-only tests ------------------------------------------


@dataclasses.dataclass
class Judged:
    c: TestClient
    t: Times
    baseline: dict[str, Any]
    runs_started: float
    alerts: dict[tuple[str, str], dict[str, Any]]  # (field, kind) -> alert


@pytest.fixture(scope="module")
def judged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Judged]:
    """Baseline period + drifted window of the main cohort, a little traffic of an unpinned model
    (gpt-4o) and of the next prompt version; the baseline frozen; two evaluations run."""
    t = times()
    app = make_app(tmp_path_factory.mktemp("judged") / "judged.duckdb")
    with TestClient(app) as c:
        seed(c, envelopes(t.base, 400))
        seed(c, envelopes(t.drift, 400, drift=True))
        seed(c, envelopes(t.now - timedelta(hours=2), 20, model="gpt-4o"))
        seed(c, envelopes(t.now - timedelta(hours=2), 20, prompt_version="intake-v4"))
        r = c.post("/v1/baselines", json=freeze_body(*t.base_window))
        assert r.status_code == 201, r.text
        started = time.time()
        for _ in range(2):  # a page breach is confirmed by the second evaluation
            r = c.post("/v1/analyzer/run")
            assert r.status_code == 200 and r.json()["ok"], r.text
        alerts = {(a["field"], a["kind"]): a for a in c.get("/v1/alerts").json()}
        (listed,) = c.get("/v1/baselines").json()
        yield Judged(c, t, c.get(f"/v1/baselines/{listed['baseline_id']}").json(), started, alerts)


# --- freezing ------------------------------------------------------------------------------------


def test_freezing_under_the_sample_minimum_is_refused_with_409(client: TestClient) -> None:
    t = times()
    seed(client, envelopes(t.base, 150))
    since, until = t.base_window
    r = client.post("/v1/baselines", json=freeze_body(since, until))
    assert_error(
        r,
        409,
        f"baseline not frozen: cohort {MODEL} / {PROMPT} / {CONTRACT} has 150 samples in "
        f"{since} .. {until}, fewer than the minimum of 200 "
        "(freeze another window, or pass --force with a reason)",
    )
    assert client.get("/v1/baselines").json() == []
    # With a reason the same freeze goes through, and the reason is kept.
    r = client.post("/v1/baselines", json=freeze_body(since, until, force="small but reviewed"))
    assert r.status_code == 201, r.text
    assert (r.json()["samples"], r.json()["forced"], r.json()["active"]) == (150, "small but reviewed", True)


def test_freeze_list_show_and_a_baseline_never_changes(client: TestClient) -> None:
    t = times()
    seed(client, envelopes(t.base, 400))
    seed(client, envelopes(t.normal, 400))
    seed(client, envelopes(t.drift, 400, drift=True))
    since, until = t.base_window
    r = client.post("/v1/baselines", json=freeze_body(since, until))
    assert r.status_code == 201, r.text
    frozen = r.json()
    bid = frozen["baseline_id"]
    assert frozen == {
        "format": 1,
        "baseline_id": bid,
        "hash": frozen["hash"],
        "created_at": frozen["created_at"],
        "cohort": NAMES,
        "window": {"since": since, "until": until},
        "samples": 400,
        "served_models": {MODEL: 400},
        "contract_versions": {"3": 400},
        "outcomes": {},  # no truncated, refused or invalid response in the window
        "author": "ana",
        "note": "reviewed: week 48",
        "forced": None,
        "fields": 6,
        "unpinned": False,
        "active": True,
    }
    assert frozen["hash"].startswith(bid) and len(frozen["hash"]) == 64

    doc = client.get(f"/v1/baselines/{bid}")
    assert doc.status_code == 200
    original = doc.content
    document = doc.json()
    assert {k: v for k, v in document.items() if k != "fields"} == {
        k: v for k, v in frozen.items() if k not in ("fields", "unpinned", "active")
    }
    assert sorted(document["fields"]) == ["customer", "customer.tier", "intent", "priority", "tags", "tags[]"]
    assert document["fields"]["customer.tier"]["present"] == 400
    assert client.get(f"/v1/baselines/{bid[:6]}").content == original  # a unique prefix finds it

    calls: list[tuple[str, str, Any]] = []

    def call(method: str, path: str, body: Any = None) -> Any:
        """Any request; afterwards the frozen document must be byte for byte what it was."""
        resp = client.request(method, path, json=body)
        calls.append((method, path, resp.status_code))
        assert client.get(f"/v1/baselines/{bid}").content == original, (method, path)
        return resp

    # No route changes or removes a frozen baseline.
    for method in ("PUT", "PATCH", "DELETE"):
        assert_error(call(method, f"/v1/baselines/{bid}", document), 405, "Method Not Allowed")
    assert call("POST", f"/v1/baselines/{bid}", document).status_code == 405

    # Freezing the same content again returns the same baseline (same id, nothing new).
    again = call("POST", "/v1/baselines", freeze_body(since, until))
    assert again.status_code == 201 and again.json()["baseline_id"] == bid
    assert call("POST", "/v1/baselines/import", document).json() == {
        "baseline_id": bid,
        "hash": frozen["hash"],
        "imported": False,
    }

    # A second, inactive baseline; then the history moves around both.
    n_since, n_until = t.normal_window
    second = call("POST", "/v1/baselines", freeze_body(n_since, n_until, note="candidate", activate=False)).json()
    assert (second["active"], second["samples"]) == (False, 400)
    listing = call("GET", "/v1/baselines").json()
    assert [(b["baseline_id"], b["active"]) for b in listing] == [(second["baseline_id"], False), (bid, True)]
    assert listing[1] == {**frozen, "active": True}
    for step in range(2):
        assert call("POST", "/v1/analyzer/run").json()["ok"], step
    fp = call("GET", "/v1/alerts").json()[0]["fingerprint"]
    assert call("POST", f"/v1/alerts/{fp}/ack", {"author": "ana"}).status_code == 200
    assert (
        call(
            "POST", "/v1/silences", {"duration": "1h", "author": "ana", "reason": "known", "fingerprint": fp}
        ).status_code
        == 201
    )
    assert call("POST", f"/v1/baselines/{second['baseline_id']}/activate", {"author": "ana"}).status_code == 200
    assert call("POST", "/v1/baselines/retire", {**COHORT, "author": "ana"}).status_code == 200
    assert (
        call(
            "POST", "/v1/baselines/inherit", {**COHORT, "prompt_version": "intake-v4", "parent": bid, "author": "ana"}
        ).status_code
        == 200
    )
    assert call("POST", "/v1/analyzer/run").json()["ok"]
    assert call("GET", "/v1/cohorts").status_code == 200
    assert call("GET", "/v1/analyzer/runs").status_code == 200
    assert [status for *_, status in calls] == [
        405,
        405,
        405,
        405,
        201,
        200,
        201,
        200,
        200,
        200,
        200,
        200,
        201,
        200,
        200,
        200,
        200,
        200,
        200,
    ]


def test_freezing_over_an_open_page_alert_is_refused_with_409(judged: Judged) -> None:
    drop = judged.alerts[("customer.tier", "presence_drop")]
    r = judged.c.post("/v1/baselines", json=freeze_body(iso(judged.t.drift), iso(judged.t.now)))
    assert_error(
        r,
        409,
        "baseline not frozen: the window holds 1 unresolved page alert(s): presence_drop on "
        f"customer.tier since {drop['first_seen']} "
        "(freeze another window, or pass --force with a reason)",
    )
    # Too few samples and an open page alert: both objections are named.
    r = judged.c.post(
        "/v1/baselines", json=freeze_body(iso(judged.t.drift), iso(judged.t.drift + timedelta(minutes=50)))
    )
    err = assert_error(r, 409)
    assert err["message"].startswith(
        f"baseline not frozen: cohort {MODEL} / {PROMPT} / {CONTRACT} has 100 samples in "
        f"{iso(judged.t.drift)} .. {iso(judged.t.drift + timedelta(minutes=50))}, "
        "fewer than the minimum of 200; the window holds 1 unresolved page alert(s)"
    )
    assert [b["baseline_id"] for b in judged.c.get("/v1/baselines").json()] == [judged.baseline["baseline_id"]]


def test_the_freeze_answer_says_whether_the_baseline_is_active(client: TestClient) -> None:
    t = times()
    seed(client, envelopes(t.base, 300))
    first = client.post("/v1/baselines", json=freeze_body(*t.base_window)).json()
    again = client.post("/v1/baselines", json=freeze_body(*t.base_window, activate=False))
    assert again.status_code == 201 and again.json()["baseline_id"] == first["baseline_id"]
    listed = {b["baseline_id"]: b["active"] for b in client.get("/v1/baselines").json()}
    assert listed == {first["baseline_id"]: True}
    assert again.json()["active"] is listed[first["baseline_id"]]


def _break_the_stored_baseline(db: Path) -> str:
    """Freeze a baseline in the file, then edit its stored document in place (a corrupted row):
    every evaluation that resolves it then fails."""
    from shapewatch.analysis import admin
    from shapewatch.analysis.config import AnalyzerConfig
    from shapewatch.analysis.store_access import open_store

    t = times()
    with TestClient(make_app(db)) as c:
        seed(c, envelopes(t.base, 300))
        seed(c, envelopes(t.drift, 300))
    store = open_store(dataclasses.replace(Settings(), db_path=db))
    try:
        bid = admin.freeze(
            store, AnalyzerConfig(), **COHORT, since=t.base, until=t.base + timedelta(hours=4), author="ana", note="n"
        )["baseline_id"]
        (raw,) = store.query("SELECT document FROM baselines WHERE baseline_id = ?", [bid])[0]
        doc = {**json.loads(raw), "note": "edited in place"}
        with store.transaction("corrupting a baseline for a test") as con:
            con.execute("UPDATE baselines SET document = ? WHERE baseline_id = ?", [json.dumps(doc), bid])
    finally:
        store.close()
    return str(bid)


def test_a_failed_evaluation_is_recorded_and_counted(tmp_path: Path) -> None:
    bid = _break_the_stored_baseline(tmp_path / "broken.duckdb")
    with TestClient(make_app(tmp_path / "broken.duckdb")) as c:
        r = c.post("/v1/analyzer/run")
        assert r.status_code >= 400 or r.json()["ok"] is False
        (run,) = c.get("/v1/analyzer/runs").json()
        # The only cohort could not be judged: a failed run, naming the cohort and why.
        assert (run["ok"], run["cohorts"], run["checks"], run["breaches"]) == (False, 1, 0, 0)
        assert run["error"].startswith(
            f"1 of 1 cohorts not judged: cohort {MODEL} / {PROMPT} / {CONTRACT}: "
            f"BaselineTampered: stored baseline {bid}: the baseline's hash says "
        )
        text = c.get("/metrics").text
        assert metric(text, "shapewatch_analyzer_runs_total") == {
            (("result", "ok"),): 0.0,
            (("result", "failed"),): 1.0,
        }
        assert metric(text, "shapewatch_analyzer_last_success_timestamp_seconds") == {(): 0.0}
        assert c.get("/v1/alerts").json() == []


def test_a_failed_evaluation_answers_in_the_error_shape(tmp_path: Path) -> None:
    _break_the_stored_baseline(tmp_path / "broken.duckdb")
    with TestClient(make_app(tmp_path / "broken.duckdb")) as c:
        r = c.post("/v1/analyzer/run")
        if r.status_code >= 400:  # an error status: the one error shape, saying what failed
            err = assert_error(r, r.status_code)
            assert "the file was edited after export and is refused" in err["message"]
        else:  # or a successful request reporting a failed run
            assert r.json()["ok"] is False


def test_import_into_a_fresh_database_once_and_refuse_a_tampered_document(tmp_path: Path) -> None:
    t = times()
    with TestClient(make_app(tmp_path / "a.duckdb")) as a:
        seed(a, envelopes(t.base, 300))
        bid = a.post("/v1/baselines", json=freeze_body(*t.base_window)).json()["baseline_id"]
        exported = a.get(f"/v1/baselines/{bid}")
    document = exported.json()
    with TestClient(make_app(tmp_path / "b.duckdb")) as b:
        assert_error(b.get(f"/v1/baselines/{bid}"), 404, f"no baseline {bid!r}")
        first = b.post("/v1/baselines/import", json=document)
        assert (first.status_code, first.json()) == (
            200,
            {"baseline_id": bid, "hash": document["hash"], "imported": True},
        )
        second = b.post("/v1/baselines/import", json=document)
        assert (second.status_code, second.json()) == (200, {**first.json(), "imported": False})
        assert b.get(f"/v1/baselines/{bid}").content == exported.content
        # Imported, not activated: it is listed as inactive.
        assert [(x["baseline_id"], x["active"]) for x in b.get("/v1/baselines").json()] == [(bid, False)]

        tampered = {**document, "samples": document["samples"] + 1}
        err = assert_error(b.post("/v1/baselines/import", json=tampered), 422)
        assert err["message"] == (
            f"request body: the baseline's hash says {document['hash'][:16]}... but its "
            f"content hashes to {err['message'].split('hashes to ')[1][:16]}...; the file "
            "was edited after export and is refused"
        )
        assert err["message"].split("hashes to ")[1][:16] != document["hash"][:16]
        assert_error(b.post("/v1/baselines/import", json={"format": 1}), 422)
        assert_error(b.post("/v1/baselines/import", json=[document]), 422)
        assert len(b.get("/v1/baselines").json()) == 1


def test_activate_retire_and_inherit_decide_what_a_cohort_is_compared_against(client: TestClient) -> None:
    t = times()
    seed(client, envelopes(t.base, 300))
    seed(client, envelopes(t.normal, 300))
    seed(client, envelopes(t.now - timedelta(hours=1), 10, prompt_version="intake-v4"))
    v4 = {**COHORT, "prompt_version": "intake-v4"}
    first = client.post("/v1/baselines", json=freeze_body(*t.base_window)).json()
    second = client.post("/v1/baselines", json=freeze_body(*t.normal_window, note="candidate", activate=False)).json()

    def compared() -> dict[str, tuple[str | None, str | None]]:
        out = {}
        for c in client.get("/v1/cohorts").json():
            b = c["baseline"]
            out[c["cohort"]["prompt_version"]] = (b["baseline_id"], b["how"]) if b else (None, None)
        return out

    def active() -> list[tuple[str, bool]]:
        return [(b["baseline_id"], b["active"]) for b in client.get("/v1/baselines").json()]

    assert active() == [(second["baseline_id"], False), (first["baseline_id"], True)]
    # The next prompt version has no baseline of its own: it is compared against the previous one's.
    assert compared() == {
        PROMPT: (first["baseline_id"], "own"),
        "intake-v4": (first["baseline_id"], "previous_prompt_version"),
    }

    r = client.post(f"/v1/baselines/{second['baseline_id']}/activate", json={"author": "bo", "note": "week 49"})
    assert (r.status_code, r.json()) == (200, {**second, "active": True})
    assert active() == [(second["baseline_id"], True), (first["baseline_id"], False)]
    assert compared() == {
        PROMPT: (second["baseline_id"], "own"),
        "intake-v4": (second["baseline_id"], "previous_prompt_version"),
    }

    r = client.post("/v1/baselines/inherit", json={**v4, "parent": first["baseline_id"], "author": "bo"})
    assert r.status_code == 200, r.text
    assert r.json() == {"cohort": v4, "parent": {k: v for k, v in first.items() if k != "active"}}
    assert compared() == {PROMPT: (second["baseline_id"], "own"), "intake-v4": (first["baseline_id"], "parent")}

    r = client.post("/v1/baselines/retire", json={**COHORT, "author": "bo", "note": "prompt replaced"})
    assert (r.status_code, r.json()) == (200, {"cohort": COHORT, "retired": True})
    assert active() == [(second["baseline_id"], False), (first["baseline_id"], False)]
    assert compared() == {PROMPT: (None, None), "intake-v4": (first["baseline_id"], "parent")}
    # Retired, not deleted: both documents are still there.
    assert client.get(f"/v1/baselines/{first['baseline_id']}").status_code == 200
    assert client.get(f"/v1/baselines/{second['baseline_id']}").status_code == 200


def test_unknown_ids_answer_404_in_the_error_shape(client: TestClient) -> None:
    seed(client, envelopes(times().base, 5))
    unknown = "0123456789abcdef"
    assert_error(client.get(f"/v1/baselines/{unknown}"), 404, f"no baseline {unknown!r}")
    assert_error(client.get("/v1/baselines/abc"), 404, "no baseline 'abc' (give at least 6 characters of the id)")
    assert_error(
        client.post(f"/v1/baselines/{unknown}/activate", json={"author": "ana"}), 404, f"no baseline {unknown!r}"
    )
    assert_error(
        client.post("/v1/baselines/inherit", json={**COHORT, "parent": unknown, "author": "ana"}),
        404,
        f"no baseline {unknown!r}",
    )
    assert_error(
        client.post("/v1/baselines/retire", json={**COHORT, "author": "ana"}),
        404,
        f"no baseline active for cohort {MODEL} / {PROMPT} / {CONTRACT}",
    )
    assert_error(client.get("/v1/alerts/feedbeef"), 404, "no alert with fingerprint 'feedbeef'")
    assert_error(
        client.post("/v1/alerts/feedbeef/ack", json={"author": "ana"}), 404, "no alert with fingerprint 'feedbeef'"
    )
    assert_error(client.get("/v1/cohorts/999/fields"), 404, "no cohort 999")
    assert_error(
        client.post("/v1/baselines", json={**freeze_body(*times().base_window), "model": "nobody"}),
        422,
        f"no events were ever stored for cohort nobody / {PROMPT} / {CONTRACT}; no cohort has model 'nobody'",
    )


# --- alerts --------------------------------------------------------------------------------------


def test_analyzer_runs_then_alerts_show_what_changed_in_the_design_shape(judged: Judged) -> None:
    bid = judged.baseline["baseline_id"]
    alerts = judged.c.get("/v1/alerts").json()
    # Page first; then (same last_seen) by fingerprint.
    assert [(a["field"], a["kind"], a["value"], a["severity"], a["state"]) for a in alerts[:1]] + sorted(
        (a["field"], a["kind"], a["value"], a["severity"], a["state"]) for a in alerts[1:]
    ) == [
        ("customer.tier", "presence_drop", None, "page", "firing"),
        ("priority", "unknown_enum_growth", None, "warn", "firing"),  # with the new value URGENT folded in
    ]
    for a in alerts:
        assert set(a) >= DESIGN_ALERT_KEYS, a
        assert a["cohort"] == COHORT and a["baseline_id"] == bid and a["compared_with"] == f"baseline {bid}"
        assert len(a["fingerprint"]) == 24 and a["episode"] == 1
        assert a["acknowledged_by"] is None and a["silenced_until"] is None and a["resolved_at"] is None
        assert len(a["samples"]) == 3  # event ids that show the change
    drop = judged.alerts[("customer.tier", "presence_drop")]
    assert (drop["baseline"], drop["current"], drop["detail"], drop["threshold"], drop["effect"]) == (
        {"presence_rate": 1.0, "samples": 400},
        {"presence_rate": 0.5, "samples": 400},
        "presence 100.0% -> 50.0% (p < 1e-6)",
        0.1,
        0.5,
    )
    unknown = judged.alerts[("priority", "unknown_enum_growth")]
    assert (unknown["baseline"], unknown["current"], unknown["detail"]) == (
        {"unknown_share": 0.0, "samples": 400, "known": ["high", "low", "medium"]},
        {"unknown_share": 0.1, "samples": 400, "new_values": {"URGENT": 40}},
        "unknown values 0.0% -> 10.0%; new values: URGENT (p < 1e-6)",
    )
    # The page alert needed two evaluations; the warn alerts fired at the first.
    assert drop["fired_at"] == drop["last_seen"] != drop["first_seen"]
    assert unknown["fired_at"] == unknown["first_seen"]

    one = judged.c.get(f"/v1/alerts/{drop['fingerprint']}").json()
    assert {k: v for k, v in one.items() if k != "history"} == drop
    assert [(h["from"], h["to"], h["severity"], h["episode"]) for h in one["history"]] == [
        (None, "pending", "page", 0),
        ("pending", "firing", "page", 1),
    ]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"severity": "page"}, [("customer.tier", "presence_drop")]),
        ({"severity": "warn"}, [("priority", "unknown_enum_growth")]),
        ({"state": "open"}, [("customer.tier", "presence_drop"), ("priority", "unknown_enum_growth")]),
        ({"state": "firing", "kind": "unknown_enum_growth"}, [("priority", "unknown_enum_growth")]),
        ({"state": "firing", "kind": "new_enum_value"}, []),  # folded into the unknown growth
        ({"state": "pending"}, []),
        ({"state": "resolved"}, []),
        (
            {"model": MODEL, "prompt_version": PROMPT, "contract": CONTRACT, "severity": "page"},
            [("customer.tier", "presence_drop")],
        ),
        ({"model": "gpt-4o"}, []),
        ({"contract": "other"}, []),
        ({"kind": "presence_drop"}, [("customer.tier", "presence_drop")]),
    ],
)
def test_alert_filters(judged: Judged, query: dict[str, str], expected: list[tuple[str, str]]) -> None:
    r = judged.c.get("/v1/alerts", params=query)
    assert r.status_code == 200, r.text
    assert sorted((a["field"], a["kind"]) for a in r.json()) == expected
    assert all(a == judged.alerts[(a["field"], a["kind"])] for a in r.json())


@pytest.mark.parametrize("query", [{"severity": "critical"}, {"state": "closed"}])
def test_an_unknown_filter_value_is_a_422_in_the_error_shape(judged: Judged, query: dict[str, str]) -> None:
    err = assert_error(judged.c.get("/v1/alerts", params=query), 422, "request is invalid")
    assert [f["path"] for f in err["fields"]] == [next(iter(query))]  # the parameter's name, as sent


def test_acknowledge_and_silence(client: TestClient) -> None:
    t = times()
    seed(client, envelopes(t.base, 400))
    seed(client, envelopes(t.drift, 400, drift=True))
    assert client.post("/v1/baselines", json=freeze_body(*t.base_window)).status_code == 201
    assert client.post("/v1/analyzer/run").json()["ok"]
    by_kind = {a["kind"]: a for a in client.get("/v1/alerts").json()}
    drop = by_kind["presence_drop"]
    assert drop["state"] == "pending"

    before = datetime.now(UTC)
    r = client.post(f"/v1/alerts/{drop['fingerprint']}/ack", json={"author": "ana"})
    assert r.status_code == 200, r.text
    acked = r.json()
    assert before <= datetime.fromisoformat(acked["acknowledged_at"]) <= datetime.now(UTC)
    assert acked == {**drop, "acknowledged_by": "ana", "acknowledged_at": acked["acknowledged_at"]}
    assert {a["kind"]: a for a in client.get("/v1/alerts").json()}["presence_drop"] == acked
    history = client.get(f"/v1/alerts/{drop['fingerprint']}").json()["history"]
    assert [(h["from"], h["to"], h["detail"], h["actor"]) for h in history][-1] == (
        "pending",
        "pending",
        "acknowledged",
        "ana",
    )
    assert_error(client.post(f"/v1/alerts/{drop['fingerprint']}/ack", json={}), 422, "request is invalid")

    assert_error(
        client.post("/v1/silences", json={"duration": "soon", "author": "ana", "reason": "deploy", "model": MODEL}),
        422,
        "duration: 'soon' is not a duration; write e.g. 90s, 15m, 24h or 7d",
    )
    assert_error(
        client.post("/v1/silences", json={"duration": "-2h", "author": "ana", "reason": "deploy", "model": MODEL}), 422
    )
    assert_error(
        client.post("/v1/silences", json={"duration": "2h", "author": "ana", "reason": "deploy"}),
        422,
        "a silence must match something: a fingerprint, or a model, prompt version, contract, field or kind",
    )
    assert_error(
        client.post("/v1/silences", json={"duration": "2h", "author": "ana", "reason": " ", "kind": "new_enum_value"}),
        422,
        "a silence needs a reason",
    )

    before = datetime.now(UTC)
    r = client.post(
        "/v1/silences",
        json={
            "duration": "2h",
            "author": "ana",
            "reason": "URGENT is being added",
            "kind": "unknown_enum_growth",
            "model": MODEL,
        },
    )
    assert r.status_code == 201, r.text
    s = r.json()
    starts, ends = datetime.fromisoformat(s["starts_at"]), datetime.fromisoformat(s["ends_at"])
    assert before <= starts <= datetime.now(UTC) and ends - starts == timedelta(hours=2)
    assert s == {
        "silence_id": 1,
        "starts_at": s["starts_at"],
        "ends_at": s["ends_at"],
        "author": "ana",
        "reason": "URGENT is being added",
        "match": {"model": MODEL, "kind": "unknown_enum_growth"},
    }
    silenced = {a["kind"]: a["silenced_until"] for a in client.get("/v1/alerts").json()}
    assert silenced == {"presence_drop": None, "unknown_enum_growth": s["ends_at"]}
    assert client.get("/v1/silences").json() == [s]
    assert {a["cohort_id"] for a in client.get("/v1/alerts").json()} == {
        c["cohort_id"]
        for c in client.get("/v1/cohorts").json()
        if c["cohort"]["model"] == MODEL and c["cohort"]["prompt_version"] == drop["cohort"]["prompt_version"]
    }


# --- cohorts, runs, metrics --------------------------------------------------------------------


ZERO_RATES = {"truncation_rate": 0.0, "refusal_rate": 0.0, "invalid_output_rate": 0.0}


def test_cohorts_show_traffic_baseline_unpinned_models_and_alert_counts(judged: Judged) -> None:
    b = judged.baseline
    cohorts = judged.c.get("/v1/cohorts").json()
    assert [c["cohort"] for c in cohorts] == [
        {**COHORT},
        {**COHORT, "prompt_version": "intake-v4"},
        {**COHORT, "model": "gpt-4o"},
    ]
    main, v4, alias = cohorts
    summary = {
        "baseline_id": b["baseline_id"],
        "cohort": COHORT,
        "created_at": b["created_at"],
        "author": "ana",
        "note": "reviewed: week 48",
        "window": b["window"],
        "samples": 400,
    }
    assert {k: v for k, v in main.items() if k not in ("cohort_id", "first_seen", "last_event_at")} == {
        "cohort": COHORT,
        "events": 800,
        "unpinned": False,
        "served_models": {MODEL: 800},
        "baseline": {**summary, "how": "own", "age_days": 0.0},
        "alerts_firing": {"page": 1, "warn": 1},
        "provider_outcomes": {},
        "outcome_rates": ZERO_RATES,
        "answered_for": [],
        "contract_versions": {"3": 800},
        "events_total": 800,  # since the first, from the rollups: a restart does not zero it
    }
    assert main["first_seen"] == iso(judged.t.base)
    for c in cohorts:  # the newest bucket with an event: after the first, not in the future
        assert c["first_seen"][:16] <= c["last_event_at"] <= iso(datetime.now(UTC))
    assert {k: v for k, v in v4.items() if k not in ("cohort_id", "first_seen", "last_event_at")} == {
        "cohort": {**COHORT, "prompt_version": "intake-v4"},
        "events": 20,
        "unpinned": False,
        "served_models": {MODEL: 20},
        "baseline": {**summary, "how": "previous_prompt_version", "age_days": 0.0},
        "alerts_firing": {},
        "provider_outcomes": {},
        "outcome_rates": ZERO_RATES,
        "answered_for": [],
        "contract_versions": {"3": 20},
        "events_total": 20,
    }
    assert {k: v for k, v in alias.items() if k not in ("cohort_id", "first_seen", "last_event_at")} == {
        "cohort": {**COHORT, "model": "gpt-4o"},
        "events": 20,
        "unpinned": True,
        "served_models": {"gpt-4o": 20},
        "baseline": None,
        "alerts_firing": {},
        "provider_outcomes": {},
        "outcome_rates": ZERO_RATES,
        "answered_for": [],
        "contract_versions": {"3": 20},
        "events_total": 20,
    }
    # A window that holds only the baseline period.
    since, until = judged.t.base_window
    narrow = judged.c.get("/v1/cohorts", params={"since": since, "until": until}).json()
    assert [c["events"] for c in narrow] == [400, 0, 0]


def test_cohort_fields_are_the_window_profile(judged: Judged) -> None:
    cid = judged.c.get("/v1/cohorts").json()[0]["cohort_id"]
    since, until = iso(judged.t.drift), iso(judged.t.now)
    r = judged.c.get(f"/v1/cohorts/{cid}/fields", params={"since": since, "until": until})
    assert r.status_code == 200, r.text
    body = r.json()
    assert {k: v for k, v in body.items() if k != "fields"} == {
        "cohort_id": cid,
        "cohort": COHORT,
        "since": since,
        "until": until,
        "events": 400,
        "served_models": {MODEL: 400},
    }
    fields = {f["path"]: f for f in body["fields"]}
    assert {p: (f["scope"], f["units"], f["filled"], f["presence_rate"]) for p, f in fields.items()} == {
        "customer": (None, 400, 400, 1.0),
        "customer.tier": (None, 400, 200, 0.5),
        "intent": (None, 400, 400, 1.0),
        "priority": (None, 400, 400, 1.0),
        "tags": (None, 400, 400, 1.0),
        "tags[]": ("tags", 133 + 2 * 133, 399, 1.0),
    }  # the items of tags: their units are the array lengths
    assert fields["priority"]["values"] == {"URGENT": 40, "high": 120, "low": 120, "medium": 120}
    assert (fields["tags"]["array_lengths"], fields["tags"]["array_p50"], fields["tags"]["array_p90"]) == (
        {"0": 134, "1": 133, "2": 133},
        1,
        2,
    )
    assert (fields["priority"]["number_p50"], fields["tags"]["numbers"]) == (None, {})  # no numbers there
    # Without since/until: the configured window (24h) up to now holds the same events.
    assert judged.c.get(f"/v1/cohorts/{cid}/fields").json()["events"] == 400


def test_analyzer_runs_are_listed_newest_first(judged: Judged) -> None:
    runs = judged.c.get("/v1/analyzer/runs").json()
    assert [(r["run_id"], r["ok"], r["error"], r["cohorts"]) for r in runs] == [(2, True, None, 3), (1, True, None, 3)]
    # a presence drop, and an unknown growth carrying its new value (one breach, not two)
    assert all(r["checks"] > 0 and r["breaches"] == 2 and r["duration_seconds"] >= 0 for r in runs)
    assert runs[0]["evaluated_at"] > runs[1]["evaluated_at"]
    assert [r["run_id"] for r in judged.c.get("/v1/analyzer/runs", params={"limit": 1}).json()] == [2]
    assert_error(judged.c.get("/v1/analyzer/runs", params={"limit": 0}), 422, "request is invalid")


def test_metrics_after_a_run(judged: Judged) -> None:
    text = judged.c.get("/metrics").text
    assert metric(text, "shapewatch_analyzer_runs_total") == {(("result", "ok"),): 2.0, (("result", "failed"),): 0.0}
    (last,) = metric(text, "shapewatch_analyzer_last_success_timestamp_seconds").values()
    assert judged.runs_started <= last <= time.time()
    assert metric(text, "shapewatch_alerts") == {
        (("severity", "page"), ("state", "firing")): 1.0,
        (("severity", "warn"), ("state", "firing")): 1.0,
        (("severity", "page"), ("state", "pending")): 0.0,
        (("severity", "warn"), ("state", "pending")): 0.0,
    }
    presence = metric(text, "shapewatch_field_presence_ratio")

    def key(prompt_version: str, field: str) -> tuple[tuple[str, str], ...]:
        return (("contract", CONTRACT), ("field", field), ("model", MODEL), ("prompt_version", prompt_version))

    fields = ["customer", "customer.tier", "intent", "priority", "tags"]
    # Cohorts judged against a baseline only (gpt-4o has none).
    assert presence == {
        **{key(PROMPT, f): (0.5 if f == "customer.tier" else 1.0) for f in fields},
        **{key("intake-v4", f): 1.0 for f in fields},
    }


def test_openapi_lists_the_analysis_routes(judged: Judged) -> None:
    paths = judged.c.get("/openapi.json").json()["paths"]
    expected = {
        "/v1/alerts": {"get"},
        "/v1/alerts/{fingerprint}": {"get"},
        "/v1/alerts/{fingerprint}/ack": {"post"},
        "/v1/silences": {"get", "post"},
        "/v1/cohorts": {"get"},
        "/v1/cohorts/{cohort_id}/fields": {"get"},
        "/v1/served-model-changes": {"get"},
        "/v1/baselines": {"get", "post"},
        "/v1/baselines/import": {"post"},
        "/v1/baselines/retire": {"post"},
        "/v1/baselines/inherit": {"post"},
        "/v1/baselines/{baseline_id}": {"get"},
        "/v1/baselines/{baseline_id}/activate": {"post"},
        "/v1/analyzer/runs": {"get"},
        "/v1/analyzer/run": {"post"},
        "/metrics": {"get"},
    }
    assert {p: set(paths[p]) for p in expected if p in paths} == expected
    for p, methods in expected.items():
        for m in methods:
            assert paths[p][m].get("summary"), (p, m)


# --- authentication ------------------------------------------------------------------------------

COLLECTOR_PATHS = {"/v1/outputs", "/v1/provider/{provider}", "/healthz"}
OPEN_PATHS = {"/v1/runbooks/{kind}"}  # open without a token: page links open in a browser
SAMPLE_BODIES: dict[tuple[str, str], Any] = {
    ("POST", "/v1/alerts/{fingerprint}/ack"): {"author": "ana"},
    ("POST", "/v1/silences"): {"duration": "1h", "author": "ana", "reason": "r", "model": MODEL},
    ("POST", "/v1/baselines"): freeze_body("2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"),
    ("POST", "/v1/baselines/import"): {"format": 1},
    ("POST", "/v1/baselines/retire"): {**COHORT, "author": "ana"},
    ("POST", "/v1/baselines/inherit"): {**COHORT, "parent": "0123456789", "author": "ana"},
    ("POST", "/v1/baselines/{baseline_id}/activate"): {"author": "ana"},
}


def _concrete(path: str) -> str:
    return path.replace("{fingerprint}", "feedbeef").replace("{cohort_id}", "1").replace("{baseline_id}", "0123456789")


def test_every_analysis_route_wants_a_valid_token(tmp_path: Path) -> None:
    app = make_app(tmp_path / "auth.duckdb", tokens=("t1", "t2"))
    # Every route the app documents, but the collector's own (tested in tests/collector).
    routes = sorted(
        (m.upper(), path)
        for path, ops in app.openapi()["paths"].items()
        if path not in COLLECTOR_PATHS | OPEN_PATHS
        for m in ops
    )
    assert set(SAMPLE_BODIES) | {
        ("GET", "/v1/alerts"),
        ("GET", "/v1/cohorts"),
        ("GET", "/v1/cohorts/{cohort_id}/fields"),
        ("GET", "/v1/baselines"),
        ("GET", "/v1/baselines/{baseline_id}"),
        ("GET", "/v1/alerts/{fingerprint}"),
        ("GET", "/v1/served-model-changes"),
        ("GET", "/v1/analyzer/runs"),
        ("POST", "/v1/analyzer/run"),
        ("GET", "/metrics"),
    } <= set(routes)
    with TestClient(app) as c:
        for method, path in routes:
            body = SAMPLE_BODIES.get((method, path))
            for headers in ({"Authorization": "Bearer wrong"}, {}, {"Authorization": "Basic dDE="}):
                r = c.request(method, _concrete(path), json=body, headers=headers)
                err = assert_error(r, 401)
                assert r.headers["www-authenticate"] == "Bearer", (method, path)
                assert err["message"] in ("missing or invalid bearer token", "authentication required")
            ok = c.request(method, _concrete(path), json=body, headers={"Authorization": "Bearer t2"})
            assert ok.status_code != 401, (method, path, ok.text)
        assert c.get("/v1/alerts", headers={"Authorization": "Bearer t1"}).json() == []


def test_cohorts_count_provider_outcomes_that_never_reached_a_parser(tmp_path: Path) -> None:
    fixture = Path(__file__).parents[1] / "collector" / "fixtures" / "providers" / "openai_chat_truncated.json"
    app = create_app(
        dataclasses.replace(Settings(), db_path=tmp_path / "o.duckdb"), registry=CollectorRegistry(), analyze=False
    )
    with TestClient(app) as c:
        for _ in range(2):  # the same response twice counts once
            r = c.post(
                "/v1/provider/openai",
                params={"prompt_version": "p1", "contract": "intake"},
                content=fixture.read_bytes(),
                headers={"content-type": "application/json"},
            )
            assert r.status_code < 300, r.text
        cohorts = c.get("/v1/cohorts").json()
    assert [(x["cohort"]["prompt_version"], x["provider_outcomes"]) for x in cohorts] == [("p1", {"truncated": 1})]


def test_runbooks_are_served_for_every_kind_and_refuse_anything_else(tmp_path: Path) -> None:
    from shapewatch.analysis.config import AlertKind

    app = make_app(tmp_path / "runbooks.duckdb", tokens=("t1",))
    with TestClient(app) as c:
        for kind in AlertKind:  # every kind has a page (its own, or the general one), without a token
            r = c.get(f"/v1/runbooks/{kind.value}")
            assert r.status_code == 200, kind
            assert r.text.startswith("# Runbook: ") and "What to do" in r.text, kind
        assert c.get("/v1/runbooks/presence_drop").text.startswith("# Runbook: presence_drop")
        assert "pin the previous model snapshot" in c.get("/v1/runbooks/assertion").text.lower()
        for bad in ("nope", "presence_drop.md", "%00", "default"):
            err = assert_error(c.get(f"/v1/runbooks/{bad}"), 404)
            assert err["message"].startswith("no runbook for ") and err["message"].endswith(": not an alert kind")
        assert_error(c.get("/v1/runbooks/..%2F..%2Fpyproject.toml"), 404)  # no route: nothing read from disk
        assert_error(c.get("/v1/runbooks/" + "x" * 5000), 422)


def test_incidents_list_and_refuse_bad_parameters(judged: Judged) -> None:
    # The judged workspace has one page alert firing: one incident, kept without a pager too.
    drop = judged.alerts[("customer.tier", "presence_drop")]
    (incident,) = judged.c.get("/v1/incidents").json()
    assert {k: v for k, v in incident.items() if k != "opened_at"} == {
        "incident_id": drop["incident_id"],
        "group": [*drop["cohort"].values()],  # model, prompt version, contract, source
        "resolved_at": None,
        "summary": f"presence_drop on customer.tier ({', '.join(NAMES.values())}): {drop['detail']}",
        "fingerprints": [drop["fingerprint"]],
    }
    assert incident["opened_at"] == drop["fired_at"]
    assert judged.c.get("/v1/incidents", params={"state": "open", "limit": 1}).json() == [incident]
    for params in ({"state": "closed"}, {"limit": 0}, {"limit": 10**9}, {"limit": "x"}, {"state": "o" * 5000}):
        assert_error(judged.c.get("/v1/incidents", params=params), 422)
