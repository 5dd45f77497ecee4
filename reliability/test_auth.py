"""Authentication and scopes on every route of a real service.

The routes are enumerated from the app itself (``create_app(...).routes``), never from a
hand-written list, so a route added later is covered the day it appears. Tokens
``ingest:...``, ``read:...``, ``admin:...`` and a bare one (every scope) are configured. For
every route and method: no token, a wrong token and a malformed Authorization header answer
401; each token whose scopes lack the route's scope answers 403 naming that scope; the token
that has it is let through. The scope a route needs follows one rule: ingest for the ingest
routes (/v1/outputs, /v1/provider/...), read for every other GET, admin for every other
write. Deliberately open: ``/healthz`` (liveness probes must not hold a secret), the runbooks
(``/v1/runbooks/{kind}``: page links open in a browser) and the API description (``/openapi.json``, ``/docs``, ``/redoc``: no data in them); the test pins that
list so nothing else becomes open by accident. And the service binds loopback by default.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from hostile_support import Service, start_service
from starlette.routing import Route

from shapewatch.analysis.service import create_app
from shapewatch.collector import Settings

TOKENS = {"ingest": "ingest-secret-1", "read": "read-secret-2", "admin": "admin-secret-3"}
FULL = "full-secret-4"
ENTRIES = ",".join(f"{scope}:{secret}" for scope, secret in TOKENS.items()) + "," + FULL
OPEN = {
    ("GET", "/healthz"),
    ("GET", "/openapi.json"),
    ("GET", "/docs"),
    ("GET", "/docs/oauth2-redirect"),
    ("GET", "/redoc"),
    ("GET", "/v1/runbooks/{kind}"),  # a page's runbook link opens in a browser without a token; no data in it
}
INGEST = re.compile(r"^/v1/(outputs|provider/|traces)")


def app_routes(tmp_path: Path) -> list[tuple[str, str]]:
    """Every (method, path template) the service app answers, from the app itself."""
    settings = dataclasses.replace(Settings(), db_path=tmp_path / "enumerate.duckdb", tokens=tuple(ENTRIES.split(",")))
    app = create_app(settings, analyze=False)
    try:
        # The documented operations, and the routes the app serves outside its API description.
        documented = {(m.upper(), path) for path, ops in app.openapi()["paths"].items() for m in ops}
        plain = {(m, r.path) for r in app.routes if isinstance(r, Route) and r.methods for m in r.methods}
        return sorted(r for r in documented | plain if r[0] != "HEAD")
    finally:
        app.state.store.close()


def needed_scope(method: str, path: str) -> str:
    if INGEST.match(path):
        return "ingest"
    return "read" if method == "GET" else "admin"


def concrete(path: str) -> str:
    return re.sub(
        r"\{[^}]+\}",
        lambda m: "1" if m.group(0) == "{cohort_id}" else "openai" if m.group(0) == "{provider}" else "feedbeef01",
        path,
    )


_CLIENTS: dict[str, httpx.Client] = {}


def call(svc: Service, method: str, path: str, headers: dict[str, str], body: bytes | None = b"{}") -> httpx.Response:
    c = _CLIENTS.setdefault(svc.url, httpx.Client(base_url=svc.url, timeout=30))  # keep-alive: one connection
    h = {"content-type": "application/json", **headers}
    return c.request(
        method, concrete(path), headers=h, content=body, params={"prompt_version": "p", "ids": "x", "field": "f"}
    )


def is_error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, (r.request.method, r.request.url, r.status_code, r.text[:300])
    body = r.json()
    assert set(body) == {"error"} and body["error"]["status"] == status, body
    return dict(body["error"])


BAD_HEADERS = (
    {},
    {"Authorization": "Bearer wrong"},
    {"Authorization": f"Basic {FULL}"},
    {"Authorization": "Bearer"},
    {"Authorization": f"Bearer {FULL}x"},
)


@pytest.mark.reliability
def test_every_route_wants_a_token_with_its_scope(tmp_path: Path, report: dict[str, object]) -> None:
    """Authentication: every route, no / wrong / other-scope token -> 401 / 403; loopback by default"""
    _run(tmp_path, report, BAD_HEADERS, (b"{}", b"{not json", None))


@pytest.mark.slow
def test_every_route_wants_a_token_with_its_scope_smoke(tmp_path: Path, report: dict[str, object]) -> None:
    """Authentication, smoke: every route, no token -> 401, other scope -> 403"""
    _run(tmp_path, report, BAD_HEADERS[:1], (b"{not json",))


def _run(
    tmp_path: Path, report: dict[str, object], bad_headers: tuple[dict[str, str], ...], bodies: tuple[bytes | None, ...]
) -> None:
    routes = app_routes(tmp_path)
    guarded = [r for r in routes if r not in OPEN]
    svc = start_service(tmp_path / "auth.duckdb", env={"SHAPEWATCH_TOKENS": ENTRIES})
    answers: Counter[str] = Counter()
    try:
        listening = {
            c.laddr.ip for c in psutil.Process(svc.proc.pid).net_connections("inet") if c.status == psutil.CONN_LISTEN
        }
        for method, path in guarded:
            need = needed_scope(method, path)
            for headers in bad_headers:
                for body in bodies:  # authentication comes before reading the body
                    err = is_error(call(svc, method, path, headers, body), 401)
                    assert err["message"] in ("missing or invalid bearer token", "authentication required")
                    answers["401"] += 1
            for scope, secret in TOKENS.items():
                r = call(svc, method, path, {"Authorization": f"Bearer {secret}"})
                if scope == need:
                    assert r.status_code not in (401, 403), (method, path, r.text)
                    answers["let through"] += 1
                else:
                    err = is_error(r, 403)
                    assert need in err["message"] and err["fields"][0]["path"] == "authorization", err
                    assert r.headers["www-authenticate"] == f'Bearer error="insufficient_scope", scope="{need}"'
                    answers["403"] += 1
            r = call(svc, method, path, {"Authorization": f"Bearer {FULL}"})
            assert r.status_code not in (401, 403), (method, path, r.text)
            answers["let through"] += 1
        for method, path in sorted(OPEN & set(routes)):
            concrete = path.replace("{kind}", "presence_drop")
            assert httpx.request(method, svc.url + concrete, timeout=30).status_code == 200, path
    finally:
        client = _CLIENTS.pop(svc.url, None)
        if client is not None:
            client.close()
        svc.stop()
    report["routes enumerated"] = len(routes)
    report["routes guarded"] = len(guarded)
    report["routes open (healthz, API description)"] = len(OPEN & set(routes))
    report["requests answered 401"] = answers["401"]
    report["requests answered 403"] = answers["403"]
    report["requests let through"] = answers["let through"]
    report["listening on"] = ", ".join(sorted(listening))
    assert len(guarded) >= 20  # the enumeration found the API, not an empty app
    assert {needed_scope(m, p) for m, p in guarded} == {"ingest", "read", "admin"}
    assert Settings().host == "127.0.0.1" and listening == {"127.0.0.1"}
