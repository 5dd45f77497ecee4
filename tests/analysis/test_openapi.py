"""The HTTP contract the service publishes at ``/openapi.json``, and that the bodies keep to it.

The description is read from the app itself: every operation has a stable operation id and one
tag (pinned below, so a rename is a deliberate change), a schema for each 2xx body and for the
shared error shape, and the bearer scheme on every operation that refuses a caller without a
token (found by calling each one without a token, not from a hand-written list). Every path is
listed in the README's API section. Then a real service holding the sample workspace answers
each operation, and every 2xx body is validated against the schema the description gives it.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from harness import ROOT, Service, make_envelope, start_service
from jsonschema import Draft202012Validator
from prometheus_client import CollectorRegistry

from shapewatch.analysis.errors import AlertNotFound, ConfigInvalid, ParameterInvalid, ReviewPeriodTooLong
from shapewatch.analysis.sample import seed_sample
from shapewatch.analysis.service import create_app
from shapewatch.baselines import BaselineError, BaselineInvalid, BaselineNotFound, BaselineRefused
from shapewatch.collector import Settings
from shapewatch.collector.api import ApiError, install_error_handlers
from shapewatch.collector.errors import (
    BatchTooLarge,
    ContractConflict,
    ContractInvalid,
    ContractNotFound,
    FieldError,
    ShapewatchError,
    StoreError,
    StoreUnavailable,
)

TOKEN = "openapi-token"

#: (method, path) -> (operation id, tag): the names clients generate code from.
OPERATIONS = {
    ("POST", "/v1/outputs"): ("ingest_events", "ingest"),
    ("POST", "/v1/provider/{provider}"): ("ingest_provider_response", "ingest"),
    ("POST", "/v1/traces"): ("ingest_traces", "ingest"),
    ("GET", "/v1/runs"): ("list_runs", "runs"),
    ("GET", "/v1/runs/{run_id}"): ("get_run", "runs"),
    ("GET", "/v1/cases"): ("list_cases", "runs"),
    ("POST", "/v1/cases/{case_id}/accept"): ("accept_case", "runs"),
    ("POST", "/v1/cases/{case_id}/dismiss"): ("dismiss_case", "runs"),
    ("GET", "/healthz"): ("get_health", "health"),
    ("GET", "/metrics"): ("get_metrics", "health"),
    ("GET", "/v1/alerts"): ("list_alerts", "alerts"),
    ("GET", "/v1/alerts/{fingerprint}"): ("get_alert", "alerts"),
    ("POST", "/v1/alerts/{fingerprint}/ack"): ("acknowledge_alert", "alerts"),
    ("POST", "/v1/silences"): ("create_silence", "alerts"),
    ("GET", "/v1/silences"): ("list_silences", "alerts"),
    ("GET", "/v1/incidents"): ("list_incidents", "alerts"),
    ("GET", "/v1/runbooks/{kind}"): ("get_runbook", "alerts"),
    ("GET", "/v1/cohorts"): ("list_cohorts", "cohorts"),
    ("GET", "/v1/compare"): ("compare_cohorts", "cohorts"),
    ("POST", "/v1/probes/runs"): ("record_probe_run", "probes"),
    ("GET", "/v1/probes/runs"): ("list_probe_runs", "probes"),
    ("GET", "/v1/probes/runs/{run_id}"): ("get_probe_run", "probes"),
    ("GET", "/v1/cohorts/{cohort_id}/fields"): ("get_cohort_fields", "cohorts"),
    ("GET", "/v1/cohorts/{cohort_id}/series"): ("get_field_series", "cohorts"),
    ("GET", "/v1/events"): ("get_events", "cohorts"),
    ("GET", "/v1/served-model-changes"): ("list_served_model_changes", "cohorts"),
    ("GET", "/v1/baselines"): ("list_baselines", "baselines"),
    ("POST", "/v1/baselines"): ("freeze_baseline", "baselines"),
    ("POST", "/v1/baselines/import"): ("import_baseline", "baselines"),
    ("POST", "/v1/baselines/retire"): ("retire_baseline", "baselines"),
    ("POST", "/v1/baselines/inherit"): ("inherit_baseline", "baselines"),
    ("GET", "/v1/baselines/{baseline_id}"): ("get_baseline", "baselines"),
    ("POST", "/v1/baselines/{baseline_id}/activate"): ("activate_baseline", "baselines"),
    ("GET", "/v1/review"): ("get_review", "review"),
    ("GET", "/v1/contracts"): ("list_contracts", "contracts"),
    ("GET", "/v1/contracts/item"): ("get_contract", "contracts"),
    ("POST", "/v1/contracts"): ("register_contract", "contracts"),
    ("GET", "/v1/contracts/diff"): ("diff_contract_versions", "contracts"),
    ("POST", "/v1/silences/{silence_id}/expire"): ("expire_silence", "alerts"),
    ("GET", "/v1/contracts/usage"): ("get_contract_usage", "contracts"),
    ("GET", "/v1/analyzer/runs"): ("list_analyzer_runs", "admin"),
    ("POST", "/v1/analyzer/run"): ("run_analyzer", "admin"),
}
ERROR_SCHEMA = {"$ref": "#/components/schemas/ErrorBody"}


@pytest.fixture(scope="module")
def app_and_spec(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, dict[str, Any]]]:
    db = tmp_path_factory.mktemp("openapi") / "openapi.duckdb"
    settings = dataclasses.replace(Settings(), db_path=db, tokens=(TOKEN,))
    app = create_app(settings, registry=CollectorRegistry(), analyze=False)
    with TestClient(app) as c:
        r = c.get("/openapi.json")
        assert r.status_code == 200, r.text
        yield c, r.json()


def operations(spec: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(m.upper(), path): op for path, ops in spec["paths"].items() for m, op in ops.items()}


def test_every_operation_has_its_stable_id_and_tag(app_and_spec: tuple[TestClient, dict[str, Any]]) -> None:
    ops = operations(app_and_spec[1])
    assert {k: (op["operationId"], op["tags"]) for k, op in ops.items()} == {
        k: (op_id, [tag]) for k, (op_id, tag) in OPERATIONS.items()
    }
    ids = [op["operationId"] for op in ops.values()]
    assert len(ids) == len(set(ids))
    assert [i for i in ids if not re.fullmatch(r"[a-z][a-z0-9]*(_[a-z0-9]+)*", i)] == []
    assert {t["name"] for t in app_and_spec[1]["tags"]} == {tag for _, tag in OPERATIONS.values()}


def test_every_operation_documents_a_2xx_body_with_a_schema(app_and_spec: tuple[TestClient, dict[str, Any]]) -> None:
    missing = []
    for key, op in operations(app_and_spec[1]).items():
        ok = {code: r for code, r in op["responses"].items() if code.startswith("2")}
        schemas = [media.get("schema") for r in ok.values() for media in r.get("content", {}).values()]
        if not ok or not schemas or not all(schemas):
            missing.append(key)
    assert missing == []


def test_every_error_response_is_the_shared_error_shape(app_and_spec: tuple[TestClient, dict[str, Any]]) -> None:
    spec = app_and_spec[1]
    wrong = [
        (key, code)
        for key, op in operations(spec).items()
        for code, r in op["responses"].items()
        if code[0] in "45" and r.get("content") != {"application/json": {"schema": ERROR_SCHEMA}}
    ]
    assert wrong == []
    body = spec["components"]["schemas"]["ErrorBody"]
    assert (body["required"], body["additionalProperties"]) == (["error"], False)
    detail = spec["components"]["schemas"]["ErrorDetail"]
    assert (sorted(detail["required"]), detail["additionalProperties"]) == (["fields", "message", "status"], False)


def test_every_operation_that_wants_a_token_declares_the_bearer_scheme(
    app_and_spec: tuple[TestClient, dict[str, Any]],
) -> None:
    c, spec = app_and_spec
    assert spec["components"]["securitySchemes"]["bearer"]["type"] == "http"
    assert spec["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    refused, declared = set(), set()
    for (method, path), op in operations(spec).items():
        concrete = re.sub(r"\{provider\}", "openai", re.sub(r"\{cohort_id\}", "1", path))
        r = c.request(method, re.sub(r"\{[^}]+\}", "feedbeef01", concrete), json={})
        if r.status_code == 401:
            refused.add((method, path))
            assert {"401", "403"} <= set(op["responses"]), (method, path)
        if op.get("security") == [{"bearer": []}]:
            declared.add((method, path))
    assert refused == declared
    # open: probes, and runbooks that page links open in a browser without a token
    assert set(OPERATIONS) - declared == {("GET", "/healthz"), ("GET", "/v1/runbooks/{kind}")}


# --- one error map -----------------------------------------------------------------------------------

ERRORS: list[tuple[Exception, int, list[dict[str, str]], dict[str, str]]] = [
    (BaselineNotFound("'feedbe'"), 404, [], {}),
    (AlertNotFound("feedbeef"), 404, [], {}),
    (ContractNotFound("c", "1"), 404, [], {}),
    (BaselineRefused(["too few samples"]), 409, [], {}),
    (ContractConflict("c", "1", "a" * 64, "b" * 64), 409, [], {}),
    (BaselineError("an empty window"), 422, [], {}),
    (
        BaselineInvalid("body", [FieldError("/format", "must be 1")]),
        422,
        [{"path": "/format", "reason": "must be 1"}],
        {},
    ),
    (
        ContractInvalid("the contract version", "must be a non-empty string"),
        422,
        [{"path": "version", "reason": "must be a non-empty string"}],
        {},
    ),
    (ParameterInvalid("since", "too long"), 422, [{"path": "since", "reason": "too long"}], {}),
    (ConfigInvalid("window", "not a duration"), 422, [{"path": "window", "reason": "not a duration"}], {}),
    (
        ReviewPeriodTooLong(timedelta(days=100), timedelta(days=90)),
        422,
        [
            {
                "path": "since",
                "reason": "a review period of 100 days is longer than the limit of 90 days; review a shorter period",
            }
        ],
        {},
    ),
    (BatchTooLarge(10, 5), 413, [{"path": "body", "reason": "too many events"}], {}),
    (StoreUnavailable("disk full", retry_after=7), 503, [], {"retry-after": "7"}),
    (StoreError("reading", "I/O error"), 503, [], {"retry-after": "5"}),
    (
        ApiError(415, "content type", [FieldError("content-type", "unsupported")]),
        415,
        [{"path": "content-type", "reason": "unsupported"}],
        {},
    ),
]


@pytest.mark.parametrize(
    ("exc", "status", "fields", "headers"), ERRORS, ids=lambda v: type(v).__name__ if isinstance(v, Exception) else None
)
def test_each_error_class_answers_with_its_own_status(
    exc: Exception, status: int, fields: list[dict[str, str]], headers: dict[str, str]
) -> None:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/raise")
    def raising() -> None:
        raise exc

    with TestClient(app, raise_server_exceptions=False) as c:
        r = c.get("/raise")
    message = exc.message if isinstance(exc, ApiError) else str(exc)
    assert (r.status_code, r.json()) == (status, {"error": {"status": status, "message": message, "fields": fields}})
    assert {k: r.headers[k] for k in headers} == headers


def test_an_error_without_a_status_of_its_own_is_the_services_fault() -> None:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/raise")
    def raising() -> None:
        raise ShapewatchError("no analyzer in this process")

    with TestClient(app, raise_server_exceptions=False) as c:
        r = c.get("/raise")
    assert (r.status_code, r.json()["error"]["message"]) == (500, "internal error; see the service log")


def test_the_app_installs_one_error_map(app_and_spec: tuple[TestClient, dict[str, Any]]) -> None:
    handled = set(app_and_spec[0].app.exception_handlers)  # type: ignore[attr-defined]
    assert {getattr(k, "__name__", k) for k in handled} == {
        "ShapewatchError",
        "HTTPException",
        "RequestValidationError",
        "WebSocketRequestValidationError",  # FastAPI's own (the service has no websocket)
        "Exception",
    }


def _readme_api_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("\n## HTTP API")
    return text[start : text.index("\n## ", start + 1)]


def test_every_path_is_in_the_readme_api_section(app_and_spec: tuple[TestClient, dict[str, Any]]) -> None:
    section = _readme_api_section()
    documented = set(re.findall(r"`(?:GET|POST) (/[^ `?]*)", section))
    assert set(app_and_spec[1]["paths"]) - documented == set()
    for (method, path), (op_id, _) in OPERATIONS.items():
        assert re.search(rf"`{method} {re.escape(path)}[` ?].*`{op_id}`", section), (method, path, op_id)


# --- the bodies keep to the description ------------------------------------------------------------


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    db = tmp_path_factory.mktemp("sample") / "sample.duckdb"
    svc = start_service(db, env={"SHAPEWATCH_TOKENS": TOKEN, "SHAPEWATCH_RUN_IDLE_SECONDS": "1"})
    try:
        assert seed_sample(svc.url, token=TOKEN).seeded
        yield svc
    finally:
        svc.stop()


class Checked:
    """Calls the service and validates each 2xx JSON body against the schema of its operation."""

    def __init__(self, c: httpx.Client, spec: dict[str, Any]) -> None:
        self.c, self.spec = c, spec
        self.seen: set[tuple[str, str]] = set()

    def __call__(self, method: str, template: str, status: int = 200, **kw: Any) -> Any:
        path = template.format(**kw.pop("path", {}))
        r = self.c.request(method, path, **kw)
        assert r.status_code == status, (method, path, r.text[:2000])
        schema = self.spec["paths"][template][method.lower()]["responses"][str(status)]["content"]
        body = r.json()
        validator = Draft202012Validator(
            {**schema["application/json"]["schema"], "components": self.spec["components"]}
        )
        errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(body)]
        assert errors == [], (method, template, errors[:5])
        self.seen.add((method, template))
        return body


def test_every_2xx_body_keeps_to_its_schema(sample: Service) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=sample.url, headers=headers, timeout=60) as c:
        spec = c.get("/openapi.json").json()
        call = Checked(c, spec)
        call("GET", "/healthz")
        ingest = call("POST", "/v1/outputs", json=[make_envelope(), make_envelope(model=None)])
        assert (ingest["accepted"], ingest["rejected"]) == (1, 1)
        fixture = (ROOT / "tests" / "collector" / "fixtures" / "providers" / "anthropic_max_tokens.json").read_bytes()
        reply = call(
            "POST",
            "/v1/provider/{provider}",
            path={"provider": "anthropic"},
            params={"prompt_version": "openapi-v1"},
            content=fixture,
            headers={"content-type": "application/json"},
        )
        assert len(reply["outcomes"]) == 1
        call("POST", "/v1/analyzer/run")
        alerts = call("GET", "/v1/alerts")
        firing = next(a for a in alerts if a["samples"])
        fp = {"fingerprint": firing["fingerprint"]}
        call("GET", "/v1/alerts/{fingerprint}", path=fp)
        call("POST", "/v1/alerts/{fingerprint}/ack", path=fp, json={"author": "ana"})
        made = call("POST", "/v1/silences", 201, json={"duration": "1h", "author": "ana", "reason": "r", **fp})
        assert call("POST", "/v1/silences/{silence_id}/expire", path={"silence_id": made["silence_id"]})
        assert call("GET", "/v1/silences", params={"active": "false"})
        cohorts = call("GET", "/v1/cohorts")
        judged = next(c for c in cohorts if c["baseline"] is not None)
        cid = {"cohort_id": judged["cohort_id"]}
        fields = call("GET", "/v1/cohorts/{cohort_id}/fields", path=cid)
        field = fields["fields"][0]["path"]
        call("GET", "/v1/cohorts/{cohort_id}/series", path=cid, params={"field": field, "points": 4})
        assert call("GET", "/v1/events", params={"ids": firing["samples"][:3]})
        call("GET", "/v1/served-model-changes")
        baselines = call("GET", "/v1/baselines")
        bid = {"baseline_id": baselines[0]["baseline_id"]}
        document = call("GET", "/v1/baselines/{baseline_id}", path=bid)
        assert call("POST", "/v1/baselines/import", json=document)["imported"] is False
        call("POST", "/v1/baselines/{baseline_id}/activate", path=bid, json={"author": "ana"})
        tags = {k: baselines[0]["cohort"][k] for k in ("model", "prompt_version", "contract")}
        window = baselines[0]["window"]
        call(
            "POST",
            "/v1/baselines",
            201,
            json={**tags, **window, "note": "again", "author": "ana", "force": "test", "activate": False},
        )
        call(
            "POST",
            "/v1/baselines/inherit",
            json={**tags, "prompt_version": "next-v1", "parent": bid["baseline_id"], "author": "ana"},
        )
        call("POST", "/v1/baselines/retire", json={**tags, "prompt_version": "next-v1", "author": "ana"})
        call("GET", "/v1/review")
        contract = {"contract": "openapi-c", "version": "1"}
        schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
        created = call("POST", "/v1/contracts", 201, json={**contract, "document": schema, "author": "ana"})
        again = call("POST", "/v1/contracts", 200, json={**contract, "document": schema, "author": "ana"})
        assert (created["created"], again["created"]) == (True, False)
        assert [x["version"] for x in call("GET", "/v1/contracts", params={"contract": "openapi-c"})] == ["1"]
        assert call("GET", "/v1/contracts/item", params=contract)["document"] == schema
        diff = call("GET", "/v1/contracts/diff", params={"contract": "sample-intake", "from": "1", "to": "2"})
        assert diff["verdict"] == "breaking"
        usage = call("GET", "/v1/contracts/usage", params={"contract": "sample-intake", "points": 3})
        assert [v["version"] for v in usage["versions"]] == ["1", "2"]
        assert len(call("GET", "/v1/analyzer/runs")) >= 2
        span = {
            "traceId": "ab" * 16,
            "spanId": "cd" * 8,
            "endTimeUnixNano": "1764590401000000000",
            "attributes": [
                {"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
                {"key": "gen_ai.request.model", "value": {"stringValue": "m"}},
                {
                    "key": "gen_ai.output.messages",
                    "value": {
                        "stringValue": json.dumps(
                            [{"parts": [{"type": "tool_call", "name": "t", "arguments": {"a": 1}}] * 3}]
                        )
                    },
                },
            ],
        }
        traces = {"resourceSpans": [{"scopeSpans": [{"spans": [span, {**span, "spanId": "00" * 8}]}]}]}
        assert call("POST", "/v1/traces", json=traces)["partialSuccess"]["rejectedSpans"] == 1
        assert call("GET", "/v1/runs")[0]["run_id"] == "ab" * 16
        assert call("GET", "/v1/runs/{run_id}", path={"run_id": "ab" * 16})["tool_calls"] == 3
        deadline = time.monotonic() + 60  # the run is judged once idle for a second (a scheduled job)
        while not (mined := call("GET", "/v1/cases")["cases"]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert sorted(x["rule"] for x in mined) == ["repeated_call", "retry_loop"]
        call("POST", "/v1/cases/{case_id}/accept", path={"case_id": mined[0]["case_id"]}, json={"author": "ana"})
        call("POST", "/v1/cases/{case_id}/dismiss", path={"case_id": mined[1]["case_id"]}, json={"author": "ana"})
        # two cohorts side by side, and a probe run recorded, listed and read
        a = "/".join(str(judged["cohort"][k]) for k in ("source", "model", "prompt_version", "contract"))
        compared = call("GET", "/v1/compare", params={"a": a, "b": a})
        assert compared["breaches"] == [] and compared["a"]["events"] == compared["b"]["events"]
        score = {"value": 1.0, "hits": 1, "n": 1}
        run = {
            "run_id": "probe-0123456789abcdef", "suite": "s", "model": "m-2026-01-01", "served_model": None,
            "prompt_version": "p", "contract": "c", "trigger": "manual",
            "started_at": "2026-11-29T12:00:00Z", "finished_at": "2026-11-29T12:01:00Z",
            "scores": {"tool_accuracy": score, "argument_accuracy": score, "spurious_calls": {**score, "value": 0.0, "hits": 0}},
            "thresholds": {"tool_accuracy": 0.95, "argument_accuracy": 0.9, "spurious_calls": 0.02},
            "cases": [{"case": "a", "negative": False, "expected": {"tool": "t", "arguments": {}},
                       "actual": {"tool": "t", "arguments": {}}, "error": None, "failed": []}],
        }  # fmt: skip
        assert call("POST", "/v1/probes/runs", 201, json=run) == {"run_id": run["run_id"], "accepted": True}
        assert [r["run_id"] for r in call("GET", "/v1/probes/runs")] == [run["run_id"]]
        one = call("GET", "/v1/probes/runs/{run_id}", path={"run_id": run["run_id"]})
        assert [c["case_id"] for c in one["results"]] == ["a"]
        assert c.get("/metrics").headers["content-type"].startswith("text/plain")
        call("GET", "/v1/incidents", params={"state": "all"})
        runbook = c.get("/v1/runbooks/presence_drop", headers={"Authorization": ""})
        assert runbook.status_code == 200 and runbook.headers["content-type"] == "text/markdown; charset=utf-8"
        assert runbook.text.startswith("# Runbook: presence_drop")
    assert call.seen == set(OPERATIONS) - {("GET", "/metrics"), ("GET", "/v1/runbooks/{kind}")}


@pytest.mark.parametrize(
    "path",
    [
        "/docs/assets/../../../../etc/passwd",
        "/docs/assets/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
        "/docs/assets/..%2f..%2fservice.py",
        "/docs/assets/" + "a" * 5000,
        "/docs/assets/",
    ],
)
def test_the_docs_assets_serve_nothing_outside_their_folder(
    app_and_spec: tuple[TestClient, dict[str, Any]], path: str
) -> None:
    client, _ = app_and_spec
    assert client.get("/docs/assets/swagger-ui.css").status_code == 200  # the folder is served
    r = client.get(path)
    assert r.status_code == 404
    assert b"root:" not in r.content and b"import" not in r.content
