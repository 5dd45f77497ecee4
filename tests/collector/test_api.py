"""The collector's HTTP API, over real HTTP against ``shapewatch serve`` on loopback.

One service per module serves most tests (counts are read as deltas of
``/healthz`` so tests do not depend on each other); tests that need exact
metric values, a token, or to read the database after stopping the service
start their own.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import os
import socket
import subprocess
import threading
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import duckdb
import httpx
import pytest
from harness import ROOT, SHAPEWATCH, Service, free_port, make_envelope, start_service
from prometheus_client.parser import text_string_to_metric_families

FIXTURES = Path(__file__).parent / "fixtures" / "providers"
MAX_BODY = 256 * 1024  # the module service's body limit (SHAPEWATCH_MAX_BODY_BYTES)
JSON = {"content-type": "application/json"}
NDJSON = {"content-type": "application/x-ndjson"}


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    db = tmp_path_factory.mktemp("api") / "api.duckdb"
    s = start_service(db, env={"SHAPEWATCH_MAX_BODY_BYTES": str(MAX_BODY)})
    yield s
    s.stop()


@pytest.fixture(scope="module")
def auth_svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    db = tmp_path_factory.mktemp("auth") / "auth.duckdb"
    s = start_service(db, env={"SHAPEWATCH_TOKENS": "t1,t2"})
    yield s
    s.stop()


@pytest.fixture
def http(svc: Service) -> Iterator[httpx.Client]:
    with svc.client() as c:
        yield c


def events_stored(c: httpx.Client) -> int:
    r = c.get("/healthz")
    assert r.status_code == 200, r.text
    return int(r.json()["events"])


def post(c: httpx.Client, body: Any) -> httpx.Response:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return c.post("/v1/outputs", content=raw, headers=JSON)


def assert_error_shape(r: httpx.Response, status: int) -> dict[str, Any]:
    """The one error shape: exactly {"error": {"status", "message", "fields"}}, status = HTTP status."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"status", "message", "fields"}, err
    assert err["status"] == status
    assert isinstance(err["message"], str) and err["message"].strip()
    assert isinstance(err["fields"], list)
    for f in err["fields"]:
        assert set(f) == {"path", "reason"} and all(isinstance(v, str) for v in f.values()), f
    return err


def metric_samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Samples of one metric (``name`` is the sample name, e.g. ``shapewatch_events_total``)."""
    out: dict[tuple[tuple[str, str], ...], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def ev(outcome: str, model: str, prompt_version: str) -> tuple[tuple[str, str], ...]:
    return (("model", model), ("outcome", outcome), ("prompt_version", prompt_version))


# --- the one error shape --------------------------------------------------------------------


def _conflict(c: httpx.Client) -> httpx.Response:
    env = make_envelope()
    assert post(c, env).status_code == 200
    return post(c, {**env, "output": {"intent": "other"}})


def _chunked_too_large(c: httpx.Client) -> httpx.Response:
    def body() -> Iterator[bytes]:  # no Content-Length: the server must stop reading at the limit
        chunk = b" " * 65536
        for _ in range(MAX_BODY // len(chunk) + 2):
            yield chunk

    return c.post("/v1/outputs", content=body(), headers=JSON)


ERRORS: list[tuple[str, int, Callable[[httpx.Client], httpx.Response]]] = [
    ("bad_json_single", 400, lambda c: post(c, b'{"model": ')),
    ("bad_json_array", 400, lambda c: post(c, b'[{"model": "m"}, ')),
    ("unknown_route", 404, lambda c: c.get("/v1/nope")),
    ("unknown_provider", 404, lambda c: c.post("/v1/provider/acme", params={"prompt_version": "p"}, json={})),
    ("wrong_method", 405, lambda c: c.get("/v1/outputs")),
    ("too_large_content_length", 413, lambda c: post(c, b" " * (MAX_BODY + 1))),
    ("too_large_chunked", 413, _chunked_too_large),
    (
        "unsupported_media_type",
        415,
        lambda c: c.post("/v1/outputs", content=b"{}", headers={"content-type": "text/plain"}),
    ),
    ("missing_content_type", 415, lambda c: c.post("/v1/outputs", content=b"{}")),
    ("invalid_single_envelope", 422, lambda c: post(c, make_envelope(output=[1]))),
    ("conflict_single_envelope", 422, _conflict),
    ("missing_query_parameter", 422, lambda c: c.post("/v1/provider/openai", json={})),
]


@pytest.mark.parametrize(("status", "call"), [(s, f) for _, s, f in ERRORS], ids=[n for n, _, _ in ERRORS])
def test_every_error_answers_the_one_json_shape(
    http: httpx.Client, status: int, call: Callable[[httpx.Client], httpx.Response]
) -> None:
    assert_error_shape(call(http), status)


def test_401_answers_the_one_json_shape(auth_svc: Service) -> None:
    with auth_svc.client() as c:
        err = assert_error_shape(post(c, make_envelope()), 401)
    assert err["fields"] == []


def test_413_names_the_body_and_stores_nothing(http: httpx.Client) -> None:
    before = events_stored(http)
    envs = [make_envelope() for _ in range(MAX_BODY // 300)]  # a valid array, just too large
    raw = json.dumps(envs).encode()
    assert len(raw) > MAX_BODY
    err = assert_error_shape(post(http, raw), 413)
    assert err["fields"] == [{"path": "body", "reason": "too large"}]
    err = assert_error_shape(_chunked_too_large(http), 413)
    assert err["fields"] == [{"path": "body", "reason": "too large"}]
    assert events_stored(http) == before


def test_single_envelope_conflict_names_event_id(http: httpx.Client) -> None:
    err = assert_error_shape(_conflict(http), 422)
    assert err["fields"] == [
        {
            "path": "event_id",
            "reason": "already stored with a different payload; an event_id names one event and must not be reused",
        }
    ]


# --- each validation rule, naming the field ------------------------------------------------


def _nested(depth: int) -> dict[str, Any]:
    d: dict[str, Any] = {}
    cur = d
    for _ in range(depth - 1):
        cur["k"] = {}
        cur = cur["k"]
    return d


def _raw(env: dict[str, Any], output_text: str) -> bytes:
    """An envelope whose output is given as literal JSON text (for what json.dumps cannot write)."""
    env = {**env, "output": "__OUTPUT__"}
    return json.dumps(env).replace('"__OUTPUT__"', output_text).encode()


_NAN = _raw(make_envelope(), '{"a": NaN}')
_NAN_AT = _NAN.index(b"NaN")

# name, body of one envelope, status, the full `fields` list
RULES: list[tuple[str, bytes, int, list[dict[str, str]]]] = [
    (
        "missing_model",
        json.dumps(make_envelope(model=None)).encode(),
        422,
        [{"path": "model", "reason": "is required"}],
    ),
    (
        "output_array",
        json.dumps(make_envelope(output=[{"a": 1}])).encode(),
        422,
        [{"path": "output", "reason": "must be a JSON object, got array"}],
    ),
    (
        "ts_without_zone",
        json.dumps(make_envelope(ts="2026-11-29T12:00:00")).encode(),
        422,
        [{"path": "ts", "reason": "'2026-11-29T12:00:00' has no time zone; add 'Z' or an offset like +00:00"}],
    ),
    # NaN is not JSON: the body does not parse; the field is named from the text before the fault
    (
        "nan",
        _NAN,
        400,
        [
            {
                "path": "output.a",
                "reason": "not valid JSON: unexpected character, expected a JSON value: "
                f"line 1 column {_NAN_AT + 1} (char {_NAN_AT})",
            }
        ],
    ),
    (
        "duplicate_key_in_output",
        _raw(make_envelope(), '{"a": 1, "b": {"c": 1, "c": 2}}'),
        422,
        [{"path": "output.b.c", "reason": "duplicate key"}],
    ),
    (
        "integer_30_digits",
        _raw(make_envelope(), '{"n": {"big": 123456789012345678901234567890}}'),
        422,
        [{"path": "output.n.big", "reason": "integer with 30 digits is too large to keep exactly (64-bit limit)"}],
    ),
    # output is level 1, so the object at level 33 (under 32 keys) is the first too deep
    (
        "depth_40",
        json.dumps(make_envelope(output=_nested(40))).encode(),
        422,
        [{"path": "output" + ".k" * 32, "reason": "nested deeper than 32 levels"}],
    ),
    (
        "key_300_chars",
        json.dumps(make_envelope(output={"ok": 1, "x" * 300: 1})).encode(),
        422,
        [{"path": "output." + "x" * 40 + "...", "reason": "key is 300 characters long; the limit is 256"}],
    ),
]


@pytest.mark.parametrize(("body", "status", "fields"), [r[1:] for r in RULES], ids=[r[0] for r in RULES])
def test_validation_rule_single_envelope_names_the_field(
    http: httpx.Client, body: bytes, status: int, fields: list[dict[str, str]]
) -> None:
    before = events_stored(http)
    err = assert_error_shape(post(http, body), status)
    assert err["fields"] == fields
    assert events_stored(http) == before  # nothing stored half-way


@pytest.mark.parametrize(
    ("body", "fields"), [(r[1], r[3]) for r in RULES if r[2] == 422], ids=[r[0] for r in RULES if r[2] == 422]
)
def test_validation_rule_in_an_array_rejects_only_that_event(
    http: httpx.Client, body: bytes, fields: list[dict[str, str]]
) -> None:
    good = make_envelope()
    bad_id = json.loads(body)["event_id"] if b"NaN" not in body else None
    r = post(http, b"[" + json.dumps(good).encode() + b"," + body + b"]")
    assert r.status_code == 200, r.text
    reply = r.json()
    assert (reply["accepted"], reply["duplicate"], reply["rejected"]) == (1, 0, 1)
    assert reply["results"] == [
        {"index": 0, "event_id": good["event_id"], "status": "accepted"},
        {"index": 1, "event_id": bad_id, "status": "rejected", "errors": fields},
    ]


def test_every_failing_field_is_named_at_once(http: httpx.Client) -> None:
    env = make_envelope(model=None, output=[1], ts="yesterday", source="staging", colour="red")
    err = assert_error_shape(post(http, env), 422)
    assert err["fields"] == [
        {
            "path": "colour",
            "reason": "unknown envelope field; known fields: agent_release, attributes, "
            "contract, contract_version, event_id, finish_reason, model, output, prompt_version, run_id, "
            "served_model, source, ts",
        },
        {"path": "model", "reason": "is required"},
        {"path": "source", "reason": "'staging' is not one of probe, production, shadow"},
        {"path": "ts", "reason": "'yesterday' is not an ISO 8601 timestamp"},
        {"path": "output", "reason": "must be a JSON object, got array"},
    ]


# --- batches: per-event results, NDJSON, idempotency ---------------------------------------


def model_missing(index: int, event_id: str) -> dict[str, Any]:
    """A batch reply's entry for an envelope rejected for having no model."""
    return {
        "index": index,
        "event_id": event_id,
        "status": "rejected",
        "errors": [{"path": "model", "reason": "is required"}],
    }


def test_array_answers_per_event_and_a_resend_stores_nothing(http: httpx.Client) -> None:
    a, b, c = make_envelope(), make_envelope(output={"x": [1, 2]}), make_envelope(model=None)
    before = events_stored(http)
    r = post(http, [a, b, c])
    assert r.status_code == 200, r.text
    expected = {
        "accepted": 2,
        "duplicate": 0,
        "rejected": 1,
        "results": [
            {"index": 0, "event_id": a["event_id"], "status": "accepted"},
            {"index": 1, "event_id": b["event_id"], "status": "accepted"},
            model_missing(2, c["event_id"]),
        ],
        "rejected_by_reason": {"missing": 1},
        "rejections_omitted": 0,
    }
    assert r.json() == expected
    assert events_stored(http) == before + 2

    r = post(http, [a, b, c])  # a retry of the same request
    assert r.status_code == 200
    assert r.json() == {
        **expected,
        "accepted": 0,
        "duplicate": 2,
        "results": [
            {**expected["results"][0], "status": "duplicate"},
            {**expected["results"][1], "status": "duplicate"},
            expected["results"][2],
        ],
    }
    assert events_stored(http) == before + 2

    reused = {**a, "output": {"intent": "cancel"}}  # same id, different payload
    r = post(http, [reused])
    assert r.status_code == 200
    assert r.json() == {
        "accepted": 0,
        "duplicate": 0,
        "rejected": 1,
        "results": [
            {
                "index": 0,
                "event_id": a["event_id"],
                "status": "rejected",
                "errors": [
                    {
                        "path": "event_id",
                        "reason": "already stored with a different payload; "
                        "an event_id names one event and must not be reused",
                    }
                ],
            }
        ],
        "rejected_by_reason": {"conflict": 1},
        "rejections_omitted": 0,
    }
    assert events_stored(http) == before + 2


def test_same_id_twice_in_one_array_is_stored_once(http: httpx.Client) -> None:
    a = make_envelope()
    before = events_stored(http)
    r = post(http, [a, a, {**a, "output": {"other": True}}])
    assert [x["status"] for x in r.json()["results"]] == ["accepted", "duplicate", "rejected"]
    assert events_stored(http) == before + 1


def test_envelopes_without_event_id_each_count(http: httpx.Client) -> None:
    """No client key: the server makes one up per event, so a resend is a new event (documented)."""
    env = make_envelope(event_id=None)
    before = events_stored(http)
    replies = [post(http, [env]).json() for _ in range(2)]
    results = [r["results"][0] for r in replies]
    assert [(x["status"], x["generated_id"]) for x in results] == [("accepted", True)] * 2
    assert results[0]["event_id"] != results[1]["event_id"]
    assert events_stored(http) == before + 2


def test_ndjson_body_answers_per_line(http: httpx.Client) -> None:
    a, b = make_envelope(), make_envelope()
    lines = [json.dumps(a), "", json.dumps(make_envelope(output="text")), json.dumps(b)]
    raw = "\n".join(lines).encode() + b"\n"
    before = events_stored(http)
    r = http.post("/v1/outputs", content=raw, headers=NDJSON)
    assert r.status_code == 200, r.text
    reply = r.json()
    assert (reply["accepted"], reply["duplicate"], reply["rejected"]) == (2, 0, 1)
    assert [(x["index"], x["status"]) for x in reply["results"]] == [(0, "accepted"), (1, "rejected"), (2, "accepted")]
    # blank lines are skipped: the index counts events, the reason names the line
    assert reply["results"][1]["errors"] == [{"path": "output", "reason": "line 3: must be a JSON object, got string"}]
    assert reply["results"][2]["event_id"] == b["event_id"]
    assert events_stored(http) == before + 2

    r = http.post("/v1/outputs", content=raw, headers={"content-type": "application/x-ndjson; charset=utf-8"})
    assert [x["status"] for x in r.json()["results"]] == ["duplicate", "rejected", "duplicate"]
    assert events_stored(http) == before + 2


def test_ndjson_rejected_line_names_its_event_id(http: httpx.Client) -> None:
    bad = make_envelope(output="text")
    r = http.post("/v1/outputs", content=json.dumps(bad).encode(), headers=NDJSON)
    assert r.json()["results"][0]["event_id"] == bad["event_id"]


def test_concurrent_duplicates_are_stored_once(http: httpx.Client, svc: Service) -> None:
    envs = [make_envelope(output={"n": i}) for i in range(50)]
    raw = json.dumps(envs).encode()
    ids = [e["event_id"] for e in envs]
    before = events_stored(http)
    threads = 16
    start = threading.Barrier(threads)
    replies: list[dict[str, Any] | str] = [""] * threads

    def send(i: int) -> None:
        with svc.client() as c:
            start.wait(timeout=30)
            r = post(c, raw)
            replies[i] = r.json() if r.status_code == 200 else f"{r.status_code}: {r.text}"

    workers = [threading.Thread(target=send, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert not any(w.is_alive() for w in workers)
    assert all(isinstance(r, dict) for r in replies), replies
    accepted: Counter[str] = Counter()
    statuses: Counter[str] = Counter()
    for reply in replies:
        assert isinstance(reply, dict)
        assert [x["event_id"] for x in reply["results"]] == ids
        for x in reply["results"]:
            statuses[x["status"]] += 1
            if x["status"] == "accepted":
                accepted[x["event_id"]] += 1
    assert statuses == {"accepted": 50, "duplicate": 50 * (threads - 1)}
    assert accepted == dict.fromkeys(ids, 1)
    assert events_stored(http) == before + 50


# --- authentication ---------------------------------------------------------------------------


def test_auth_tokens_guard_ingest_and_metrics(auth_svc: Service) -> None:
    with (
        auth_svc.client() as anon,
        auth_svc.client("nope") as wrong,
        auth_svc.client("t1") as t1,
        auth_svc.client("t2") as t2,
    ):
        r = post(anon, make_envelope())
        assert_error_shape(r, 401)
        assert r.headers["www-authenticate"] == "Bearer"
        r = post(wrong, make_envelope())
        assert_error_shape(r, 401)
        assert r.headers["www-authenticate"] == "Bearer"
        r = anon.post("/v1/outputs", content=b"{}", headers={**JSON, "Authorization": "Basic dDE6dDE="})
        assert_error_shape(r, 401)
        assert post(t1, make_envelope()).status_code == 200
        assert post(t2, make_envelope()).status_code == 200
        assert anon.post("/v1/provider/openai", params={"prompt_version": "p"}, json={}).status_code == 401
        assert_error_shape(anon.get("/metrics"), 401)
        assert_error_shape(wrong.get("/metrics"), 401)
        assert t2.get("/metrics").status_code == 200
        assert t2.get("/healthz").json()["events"] == 2


@pytest.fixture(scope="module")
def scoped_svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    db = tmp_path_factory.mktemp("scoped") / "scoped.duckdb"
    s = start_service(db, env={"SHAPEWATCH_TOKENS": "ingest:in1,read+admin:ra2,all3"})
    yield s
    s.stop()


def test_token_scopes_give_403_naming_the_scope(scoped_svc: Service) -> None:
    with (
        scoped_svc.client("in1") as ingest,
        scoped_svc.client("ra2") as reader,
        scoped_svc.client("all3") as full,
        scoped_svc.client("ingest:in1") as entry,
    ):
        assert post(ingest, make_envelope()).status_code == 200
        assert post(full, make_envelope()).status_code == 200
        err = assert_error_shape(post(reader, make_envelope()), 403)
        assert err == {
            "status": 403,
            "message": "this token lacks the 'ingest' scope that POST /v1/outputs needs",
            "fields": [{"path": "authorization", "reason": "needs scope ingest; the token has admin+read"}],
        }
        err = assert_error_shape(ingest.get("/metrics"), 403)
        assert err["fields"] == [{"path": "authorization", "reason": "needs scope read; the token has ingest"}]
        assert reader.get("/metrics").status_code == 200 and full.get("/metrics").status_code == 200
        assert_error_shape(post(entry, make_envelope()), 401)  # the client sends the secret, not the entry
        # the token is checked before the body is read: no hint about the body without the scope
        r = reader.post("/v1/outputs", content=b"{not json", headers=JSON)
        assert r.status_code == 403
        assert ingest.get("/healthz").json()["events"] == 2


def test_healthz_is_intentionally_open_for_probes_even_with_tokens(auth_svc: Service) -> None:
    with auth_svc.client() as anon:
        r = anon.get("/healthz")
    assert r.status_code == 200
    assert r.json()["status"] == "ok"


# --- openapi, metrics --------------------------------------------------------------------------


def test_openapi_lists_the_ingest_routes(http: httpx.Client) -> None:
    r = http.get("/openapi.json")
    assert r.status_code == 200
    paths = r.json()["paths"]
    assert "post" in paths["/v1/outputs"]
    assert "post" in paths["/v1/provider/{provider}"]


def test_metrics_count_events_by_outcome_and_rejections_by_reason(service: Service) -> None:
    with service.client() as c:
        a, b, dup = make_envelope(model="m-metrics"), make_envelope(model="m-metrics"), make_envelope(model="m-metrics")
        assert post(c, [a, b, dup]).json()["accepted"] == 3
        assert post(c, dup).status_code == 200  # duplicate
        assert post(c, make_envelope(model="m-metrics", output=[1])).status_code == 422  # wrong_type
        assert post(c, make_envelope(model=None)).status_code == 422  # missing
        assert post(c, {**a, "output": {}}).status_code == 422  # conflict
        text = c.get("/metrics").text
    pv = "intake-v3"
    assert metric_samples(text, "shapewatch_events_total") == {
        ev("accepted", "m-metrics", pv): 3.0,
        ev("duplicate", "m-metrics", pv): 1.0,
        ev("rejected", "other", "other"): 3.0,
    }
    assert metric_samples(text, "shapewatch_events_rejected_total") == {
        (("reason", "wrong_type"),): 1.0,
        (("reason", "missing"),): 1.0,
        (("reason", "conflict"),): 1.0,
    }
    assert metric_samples(text, "shapewatch_dedup_hits_total") == {(): 1.0}


def test_a_request_without_rejections_is_answered_and_counted_as_one_with_them(service: Service) -> None:
    """A request whose every event is stored or found stored takes a shorter path to its answer
    (no loop over the events): the same answer and counts as a request that also holds a rejection."""
    a, b = make_envelope(model="m-a"), make_envelope(model="m-b", prompt_version="p2")
    anon = make_envelope(model="m-a", event_id=None)
    bad = make_envelope(model=None)
    with service.client() as c:
        clean = post(c, [a, b, anon, a]).json()  # a twice: the second a duplicate within the request
        mixed = post(c, [a, b, anon, a, bad]).json()
        text = c.get("/metrics").text
    ids = [x["event_id"] for x in clean["results"]]
    assert clean == {
        "accepted": 3,
        "duplicate": 1,
        "rejected": 0,
        "results": [
            {"index": 0, "event_id": a["event_id"], "status": "accepted"},
            {"index": 1, "event_id": b["event_id"], "status": "accepted"},
            {"index": 2, "event_id": ids[2], "status": "accepted", "generated_id": True},
            {"index": 3, "event_id": a["event_id"], "status": "duplicate"},
        ],
        "rejected_by_reason": {},
        "rejections_omitted": 0,
    }
    assert mixed == {
        "accepted": 1,  # the id-less event again: a new event
        "duplicate": 3,
        "rejected": 1,
        "results": [
            {"index": 0, "event_id": a["event_id"], "status": "duplicate"},
            {"index": 1, "event_id": b["event_id"], "status": "duplicate"},
            {"index": 2, "event_id": mixed["results"][2]["event_id"], "status": "accepted", "generated_id": True},
            {"index": 3, "event_id": a["event_id"], "status": "duplicate"},
            model_missing(4, bad["event_id"]),
        ],
        "rejected_by_reason": {"missing": 1},
        "rejections_omitted": 0,
    }
    assert mixed["results"][2]["event_id"] != ids[2]
    pv = a["prompt_version"]
    assert metric_samples(text, "shapewatch_events_total") == {
        ev("accepted", "m-a", pv): 3.0,
        ev("duplicate", "m-a", pv): 3.0,
        ev("accepted", "m-b", "p2"): 1.0,
        ev("duplicate", "m-b", "p2"): 1.0,
        ev("rejected", "other", "other"): 1.0,
    }
    assert metric_samples(text, "shapewatch_dedup_hits_total") == {(): 4.0}


def test_metrics_count_a_rejected_event_once_whatever_its_faults(service: Service) -> None:
    with service.client() as c:
        r = post(c, make_envelope(model=None, output=[1]))  # missing + wrong_type
        assert_error_shape(r, 422)
        r = post(c, [make_envelope(model=None, output=[1])])
        assert r.json()["rejected"] == 1
        text = c.get("/metrics").text
    assert metric_samples(text, "shapewatch_events_total") == {ev("rejected", "other", "other"): 2.0}
    assert metric_samples(text, "shapewatch_events_rejected_total") == {
        (("reason", "missing"),): 2.0,
        (("reason", "wrong_type"),): 2.0,
    }


@pytest.mark.slow
def test_metrics_label_sets_stay_bounded_with_10000_models(service: Service) -> None:
    n = 10_000
    with service.client() as c:
        for start in range(0, n, 2500):
            envs = [make_envelope(model=f"model-{i}", output={"i": i}) for i in range(start, start + 2500)]
            r = post(c, envs)
            assert r.status_code == 200 and r.json()["accepted"] == 2500, r.text[:500]
        text = c.get("/metrics").text
    series = metric_samples(text, "shapewatch_events_total")
    assert len(series) <= 30, len(series)  # 25 model/prompt pairs, then "other"
    assert sum(series.values()) == n
    assert series[ev("accepted", "other", "other")] == n - 25


# --- the provider route -------------------------------------------------------------------------


def _provider_post(c: httpx.Client, provider: str, fixture: str, **params: str) -> httpx.Response:
    return c.post(f"/v1/provider/{provider}", params=params, content=(FIXTURES / fixture).read_bytes(), headers=JSON)


def test_provider_tool_calls_are_stored_with_the_tool_name_as_contract(service: Service) -> None:
    with service.client() as c:
        r = _provider_post(c, "openai", "openai_chat_tool_calls.json", prompt_version="p1")
        assert r.status_code == 200, r.text
        reply = r.json()
        rid = "chatcmpl-BzK3f9aQe1xT7m2LrV0pWc8sYd4nH"
        ids = [f"{rid}:call_9VfJ2kQwZr4XmT1bN8yLh3Ds", f"{rid}:call_2hQmC7pRt5YwE0sKa9ZvUx6G"]
        assert reply == {
            "accepted": 2,
            "duplicate": 0,
            "rejected": 0,
            "outcomes": [],
            "results": [
                {"index": 0, "event_id": ids[0], "status": "accepted"},
                {"index": 1, "event_id": ids[1], "status": "accepted"},
            ],
            "rejected_by_reason": {},
            "rejections_omitted": 0,
        }
        # the same response posted again derives the same ids
        again = _provider_post(c, "openai", "openai_chat_tool_calls.json", prompt_version="p1").json()
        assert [x["status"] for x in again["results"]] == ["duplicate", "duplicate"]
    service.stop()
    with duckdb.connect(str(service.db_path), read_only=True) as con:
        rows = con.execute("""SELECT e.event_id, c.model, c.prompt_version, c.contract, e.served_model,
                                     e.output FROM events e JOIN cohorts c USING (cohort_id) ORDER BY 1""").fetchall()
    assert [(r[0], r[1], r[2], r[3], r[4], json.loads(r[5])) for r in rows] == sorted(
        [
            (
                ids[0],
                "gpt-4o-2024-08-06",
                "p1",
                "classify_ticket",
                "gpt-4o-2024-08-06",
                {"intent": "refund", "priority": "high", "customer": {"tier": "gold"}},
            ),
            (
                ids[1],
                "gpt-4o-2024-08-06",
                "p1",
                "extract_entities",
                "gpt-4o-2024-08-06",
                {"entities": [{"type": "order_id", "value": "A-10293"}, {"type": "amount", "value": "49.90"}]},
            ),
        ]
    )


def test_provider_truncated_response_answers_an_outcome(http: httpx.Client) -> None:
    before = events_stored(http)
    r = _provider_post(http, "openai", "openai_chat_truncated.json", prompt_version="p1", model="gpt-4o")
    assert r.status_code == 200, r.text
    reply = r.json()
    assert (reply["accepted"], reply["duplicate"], reply["rejected"], reply["results"]) == (0, 0, 0, [])
    assert len(reply["outcomes"]) == 1
    outcome = reply["outcomes"][0]
    assert {k: outcome[k] for k in ("kind", "contract", "finish_reason")} == {
        "kind": "truncated",
        "contract": "default",
        "finish_reason": "length",
    }
    assert "token limit" in outcome["detail"]
    assert events_stored(http) == before
    assert 'shapewatch_provider_outcomes_total{kind="truncated",provider="openai"}' in http.get("/metrics").text


def test_an_alias_outcome_counts_in_the_cohort_of_the_model_that_answered(service: Service) -> None:
    with service.client() as c:
        r = _provider_post(c, "openai", "openai_chat_truncated.json", prompt_version="alias-outcome", model="gpt-4o")
        assert r.status_code == 200, r.text
        assert [o["kind"] for o in r.json()["outcomes"]] == ["truncated"]
        # the same response from a probe run (another id): its outcome counts in the probe's cohorts
        r = _provider_post(
            c,
            "openai",
            "openai_chat_truncated.json",
            prompt_version="alias-outcome",
            model="gpt-4o",
            source="probe",
            event_id="probe-run-1",
        )
        assert r.status_code == 200, r.text
        assert [(o["kind"], o["counted"]) for o in r.json()["outcomes"]] == [("truncated", True)]
    service.stop()
    with duckdb.connect(str(service.db_path), read_only=True) as con:
        rows = con.execute("""SELECT c.model, c.source, o.kind, o.n FROM outcomes o JOIN cohorts c USING (cohort_id)
                              WHERE c.prompt_version = 'alias-outcome' ORDER BY 1, 2""").fetchall()
    # as its outputs would: in the cohort asked for, and in the dated model's that answered, each
    # of the source it was sent with (a probe's truncation never counts against production)
    assert rows == [
        ("gpt-4o", "probe", "truncated", 1),
        ("gpt-4o", "production", "truncated", 1),
        ("gpt-4o-2024-08-06", "probe", "truncated", 1),
        ("gpt-4o-2024-08-06", "production", "truncated", 1),
    ]


def test_provider_unknown_name_is_404(http: httpx.Client) -> None:
    err = assert_error_shape(_provider_post(http, "mistral", "openai_chat_tool_calls.json", prompt_version="p"), 404)
    assert "openai, anthropic, gemini" in err["message"]


def test_provider_route_refuses_a_body_that_is_not_a_provider_response(http: httpx.Client) -> None:
    before = events_stored(http)
    r = http.post("/v1/provider/anthropic", params={"prompt_version": "p"}, json=make_envelope())
    err = assert_error_shape(r, 422)
    assert err["fields"], err
    r = http.post("/v1/provider/openai", params={"prompt_version": "p"}, content=b"[1, 2]", headers=JSON)
    assert_error_shape(r, 422)
    r = http.post("/v1/provider/openai", params={"prompt_version": "p"}, content=b"{nope", headers=JSON)
    assert_error_shape(r, 400)
    assert events_stored(http) == before


def test_provider_query_an_empty_model_or_an_event_id_with_no_room_for_positions_is_422(http: httpx.Client) -> None:
    before = events_stored(http)
    # an empty model passed the check (as "-") and then left every outcome uncounted
    err = assert_error_shape(
        _provider_post(http, "openai", "openai_chat_refusal.json", prompt_version="p", model=""), 422
    )
    assert (err["message"], err["fields"]) == (
        "the query parameters are invalid",
        [{"path": "model", "reason": "must not be empty"}],
    )
    # with several outputs each id is f"{event_id}:{position}": from 127 characters on they were
    # over the envelope's 128 and every output was rejected one by one
    err = assert_error_shape(
        _provider_post(http, "anthropic", "anthropic_tool_use.json", prompt_version="p", event_id="e" * 121), 422
    )
    assert err["fields"] == [
        {
            "path": "event_id",
            "reason": "is 121 characters long; the limit here is 120, leaving room for each output's ':<position>'",
        }
    ]
    assert events_stored(http) == before
    r = _provider_post(http, "openai", "openai_chat_tool_calls.json", prompt_version="p", event_id="e" * 120)
    assert r.status_code == 200, r.text
    assert [(x["event_id"], x["status"]) for x in r.json()["results"]] == [
        ("e" * 120 + ":0", "accepted"),
        ("e" * 120 + ":1", "accepted"),
    ]


def test_provider_arguments_nested_past_the_parser_are_an_outcome_not_a_500(http: httpx.Client) -> None:
    body = json.loads((FIXTURES / "anthropic_tool_use.json").read_bytes())
    tool_use = next(b for b in body["content"] if b["type"] == "tool_use")
    tool_use["input"] = "DEEP"
    # orjson parses up to 1,024 levels; copying the input recursed past Python's limit (500)
    deep = '{"k":' * 900 + "{}" + "}" * 900
    raw = json.dumps(body).replace('"DEEP"', deep).encode()
    r = http.post("/v1/provider/anthropic", params={"prompt_version": "p"}, headers=JSON, content=raw)
    assert r.status_code == 200, r.text
    assert [(o["kind"], o["detail"]) for o in r.json()["outcomes"]] == [
        ("invalid_json", f"tool_use '{tool_use['name']}' input: not valid JSON: nested too deeply")
    ]


@pytest.mark.parametrize(
    "ctype",
    ["application/json; charset=utf-16", "application/x-ndjson; charset=latin-1", 'application/json; charset=""'],
)
def test_a_charset_other_than_utf8_is_415(http: httpx.Client, ctype: str) -> None:
    err = assert_error_shape(
        http.post("/v1/outputs", content=json.dumps(make_envelope()).encode(), headers={"content-type": ctype}), 415
    )
    assert err["fields"] == [{"path": "content-type", "reason": "unsupported charset"}]
    for ok in ("application/json; charset=UTF-8", 'application/json;charset="utf-8"', "application/json; x=1"):
        r = http.post("/v1/outputs", content=json.dumps(make_envelope()).encode(), headers={"content-type": ok})
        assert r.status_code == 200, (ok, r.text)


# --- process: bind address, one writer -----------------------------------------------------------


def _other_address() -> str | None:
    psutil = pytest.importorskip("psutil")
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return str(a.address)
    return None


def test_binds_loopback_only_by_default(svc: Service) -> None:
    addr = _other_address()
    if addr is None:
        pytest.skip("the host has no non-loopback IPv4 address")
    port = int(svc.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass  # reachable on loopback
    with pytest.raises(OSError):  # refused (or unreachable) on the machine's other address
        socket.create_connection((addr, port), timeout=2).close()


def test_second_serve_on_the_same_db_exits_saying_it_is_in_use(svc: Service) -> None:
    proc = subprocess.run(
        [*SHAPEWATCH, "serve", "--db", str(svc.db_path), "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 2, proc.stderr
    assert f"database {svc.db_path} is in use by another process" in proc.stderr
    assert "Traceback" not in proc.stderr
    with svc.client() as c:  # the first one is unharmed
        assert c.get("/healthz").status_code == 200


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ('{"a": 1, "a": 2}', {"path": "output.a", "reason": "duplicate key"}),
        (
            '{"a": 123456789012345678901234567890}',
            {"path": "output.a", "reason": "integer with 30 digits is too large to keep exactly (64-bit limit)"},
        ),
        (
            '{"a": "\\ud800"}',
            {
                "path": "output",
                "reason": "holds text that is not valid Unicode (str is not valid UTF-8: surrogates not allowed)",
            },
        ),
    ],
)
def test_provider_arguments_get_the_same_rules_as_envelopes(
    http: httpx.Client, arguments: str, error: dict[str, str]
) -> None:
    response = {
        "id": f"chatcmpl-{abs(hash(arguments))}",
        "object": "chat.completion",
        "model": "gpt-4o",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "call_1", "type": "function", "function": {"name": "t", "arguments": arguments}}
                    ],
                },
            }
        ],
    }
    r = http.post("/v1/provider/openai", params={"prompt_version": "p"}, json=response)
    assert r.status_code == 200, r.text
    reply = r.json()
    assert (reply["accepted"], reply["rejected"]) == (0, 1)
    assert reply["results"][0]["errors"] == [error]


def test_a_reposted_response_counts_its_outcomes_once(svc: Service) -> None:
    body = json.loads((FIXTURES / "anthropic_max_tokens.json").read_text())
    body["id"] = "msg_repost_check"  # a response id no other test posts

    def truncated_count(c: httpx.Client) -> float:
        samples = metric_samples(c.get("/metrics").text, "shapewatch_provider_outcomes_total")
        return sum(v for k, v in samples.items() if ("kind", "truncated") in k and ("provider", "anthropic") in k)

    with svc.client() as c:
        before = truncated_count(c)
        for _ in range(3):
            r = c.post("/v1/provider/anthropic", params={"prompt_version": "repost"}, json=body)
            assert r.status_code == 200, r.text
            assert [o["kind"] for o in r.json()["outcomes"]] == ["truncated"]
        assert truncated_count(c) == before + 1


def test_a_response_posted_again_with_more_outcomes_counts_only_the_new_ones(svc: Service) -> None:
    truncated = json.loads((FIXTURES / "openai_chat_truncated.json").read_text())
    refused = json.loads((FIXTURES / "openai_chat_refusal.json").read_text())
    truncated["id"] = "chatcmpl-partial-repost"  # a response id no other test posts
    both = {**truncated, "choices": [truncated["choices"][0], {**refused["choices"][0], "index": 1}]}

    def counts(c: httpx.Client) -> dict[str, float]:
        samples = metric_samples(c.get("/metrics").text, "shapewatch_provider_outcomes_total")
        return {
            kind: sum(v for k, v in samples.items() if ("kind", kind) in k and ("provider", "openai") in k)
            for kind in ("truncated", "refusal")
        }

    with svc.client() as c:
        before = counts(c)
        for body, kinds in ((truncated, ["truncated"]), (both, ["truncated", "refusal"])):
            r = c.post("/v1/provider/openai", params={"prompt_version": "partial-repost"}, json=body)
            assert r.status_code == 200, r.text
            assert [o["kind"] for o in r.json()["outcomes"]] == kinds
        # the second post's truncation is the first one's, counted once; its refusal is new
        assert counts(c) == {"truncated": before["truncated"] + 1, "refusal": before["refusal"] + 1}


def test_a_client_gone_mid_body_is_answered_quietly_not_as_a_500(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from shapewatch.analysis.service import create_app
    from shapewatch.collector import load_settings

    app = create_app(load_settings({"db_path": str(tmp_path / "gone.duckdb")}, env={}), analyze=False)
    sent: list[dict[str, Any]] = []
    parts = iter(
        [{"type": "http.request", "body": b'[{"model": "m", ', "more_body": True}, {"type": "http.disconnect"}]
    )

    async def receive() -> dict[str, Any]:
        return next(parts)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/outputs",
        "raw_path": b"/v1/outputs",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"content-length", b"500")],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8000),
    }
    try:
        with caplog.at_level(logging.WARNING):
            asyncio.run(app(scope, receive, send))
    finally:
        app.state.store.close()
    assert sent[0]["status"] == 400
    assert json.loads(sent[1]["body"])["error"]["fields"] == [{"path": "body", "reason": "incomplete"}]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_a_compressed_body_is_refused_naming_its_encoding(http: httpx.Client) -> None:
    r = http.post(
        "/v1/outputs",
        content=gzip.compress(json.dumps(make_envelope()).encode()),
        headers={"content-type": "application/json", "content-encoding": "gzip"},
    )
    err = assert_error_shape(r, 415)
    assert err["fields"] == [{"path": "content-encoding", "reason": "unsupported encoding"}]
    assert err["message"] == "content encoding 'gzip' is not supported; send the body uncompressed"


def test_many_unknown_fields_are_named_a_few_and_counted(http: httpx.Client) -> None:
    body = {**make_envelope(), **{f"x{i}": i for i in range(1000)}}
    err = assert_error_shape(http.post("/v1/outputs", json=body), 422)
    known = err["fields"][0]["reason"]
    assert err["fields"] == [{"path": f"x{i}", "reason": known} for i in range(5)] + [
        {"path": "", "reason": "995 more unknown envelope fields"}
    ]


def test_a_provider_response_over_the_request_limit_is_refused_whole(tmp_path: Path) -> None:
    db = tmp_path / "p.duckdb"
    svc = start_service(db, env={"SHAPEWATCH_WRITER_QUEUE_EVENTS": "10"})
    try:
        truncated = json.loads((FIXTURES / "openai_chat_truncated.json").read_text())
        many = {**truncated, "choices": [{**truncated["choices"][0], "index": i} for i in range(11)]}
        with svc.client() as c:
            r = c.post("/v1/provider/openai", params={"prompt_version": "p"}, json=many)
            err = assert_error_shape(r, 413)
            assert err["message"] == "the request holds 11 events; send at most 10 per request"
            ten = {**many, "choices": many["choices"][:10]}
            r = c.post("/v1/provider/openai", params={"prompt_version": "p"}, json=ten)
            assert r.status_code == 200, r.text
            assert [o["counted"] for o in r.json()["outcomes"]] == [True] * 10
            again = c.post("/v1/provider/openai", params={"prompt_version": "p"}, json=ten)
            assert [o["counted"] for o in again.json()["outcomes"]] == [False] * 10  # counted the first time
    finally:
        svc.stop()


def test_outcomes_whose_model_cannot_name_a_cohort_are_listed_not_counted(http: httpx.Client) -> None:
    truncated = json.loads((FIXTURES / "openai_chat_truncated.json").read_text())
    body = {
        **truncated,
        "id": "chatcmpl-long-model",
        "model": "m" * 300,
        "choices": [{**truncated["choices"][0], "index": i} for i in range(3)],
    }
    r = http.post("/v1/provider/openai", params={"prompt_version": "long-model"}, json=body)
    assert r.status_code == 200, r.text
    assert [(o["kind"], o["counted"]) for o in r.json()["outcomes"]] == [("truncated", False)] * 3


def _asgi_post(
    app: Any, parts: list[dict[str, Any]], hold: asyncio.Event | None = None, length: int = 500
) -> Coroutine[Any, Any, list[dict[str, Any]]]:
    """POST /v1/outputs to the app in-process; ``parts`` are the body's receive messages, and
    after them the client waits on ``hold`` (or for ever) without sending more."""
    sent: list[dict[str, Any]] = []
    queue = iter(parts)

    async def receive() -> dict[str, Any]:
        for part in queue:
            return part
        await (hold.wait() if hold is not None else asyncio.sleep(3600))
        return {"type": "http.request", "body": b"]", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/outputs",
        "raw_path": b"/v1/outputs",
        "query_string": b"",
        "root_path": "",
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8000),
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(length).encode())],
    }

    async def run() -> list[dict[str, Any]]:
        await app(scope, receive, send)
        return sent

    return run()


def test_a_body_that_stops_arriving_gets_408(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from shapewatch.analysis.service import create_app
    from shapewatch.collector import load_settings

    app = create_app(
        load_settings({"db_path": str(tmp_path / "slow.duckdb"), "body_idle_seconds": 0.2}, env={}), analyze=False
    )
    try:
        sent = asyncio.run(_asgi_post(app, [{"type": "http.request", "body": b"[", "more_body": True}]))
    finally:
        app.state.store.close()
    assert sent[0]["status"] == 408
    assert json.loads(sent[1]["body"])["error"]["fields"] == [{"path": "body", "reason": "too slow"}]


def test_bodies_held_at_once_are_bounded_and_given_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from shapewatch.analysis.service import create_app
    from shapewatch.collector import load_settings

    monkeypatch.setattr("shapewatch.collector.http_policy._BODIES_HELD", 1)
    settings = load_settings(
        {
            "db_path": str(tmp_path / "busy.duckdb"),
            "max_body_bytes": 2048,
            "max_document_bytes": 2048,
            "max_admin_body_bytes": 2048,
        },
        env={},
    )
    app = create_app(settings, analyze=False)

    async def scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
        hold = asyncio.Event()
        first = asyncio.create_task(
            _asgi_post(app, [{"type": "http.request", "body": b"[" + b" " * 1500, "more_body": True}], hold)
        )
        await asyncio.sleep(0.05)  # the first request holds 1,501 bytes of the 2,048 now
        second = await _asgi_post(app, [{"type": "http.request", "body": b" " * 1000, "more_body": False}])
        hold.set()
        first_sent = await first  # "[ ... ]": an empty array, answered
        third = await _asgi_post(
            app, [{"type": "http.request", "body": b"[" + b" " * 999, "more_body": True}], hold
        )  # room again: this one is read whole
        return first_sent, second, third

    try:
        first, second, third = asyncio.run(scenario())
    finally:
        app.state.store.close()
    assert second[0]["status"] == 503 and (b"retry-after", b"1") in second[0]["headers"]
    assert json.loads(second[1]["body"])["error"]["fields"] == [{"path": "body", "reason": "too many bodies at once"}]
    assert first[0]["status"] == 200 and third[0]["status"] == 200


def test_a_missing_query_parameter_is_named_as_the_client_writes_it(http: httpx.Client) -> None:
    # FastAPI's own validation names parameters the way every check of the service does:
    # `prompt_version`, not its location `query.prompt_version`.
    r = http.post("/v1/provider/openai", content=(FIXTURES / "openai_chat_tool_calls.json").read_bytes(), headers=JSON)
    assert (r.status_code, r.json()) == (
        422,
        {
            "error": {
                "status": 422,
                "message": "request is invalid",
                "fields": [{"path": "prompt_version", "reason": "Field required"}],
            }
        },
    )
