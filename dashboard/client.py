"""The dashboard's client of the service HTTP API: the only way the dashboard reaches any data.

The dashboard never opens the DuckDB file (the service is its one writer) and
imports nothing from the backend packages; it speaks the documented HTTP API.
Failures become one of a few typed errors whose message a page can show as
it is: the service cannot be reached, the token was refused, the service
failed (5xx), or it refused the request (another 4xx, with the service's own
message, such as the objections to a freeze).

>>> api = ApiClient("http://127.0.0.1:8000", token=None)
>>> api.alerts(state="open")                       # doctest: +SKIP
[{"field": "customer.tier", "kind": "presence_drop", "severity": "page", ...}]
"""

from __future__ import annotations

from typing import Any

import httpx

__all__ = ["ApiClient", "AuthRejected", "DashboardError", "RequestRefused", "ServiceFailed", "ServiceUnreachable"]


class DashboardError(Exception):
    """Something the dashboard could not get from the service; ``str()`` is a message for people."""


class ServiceUnreachable(DashboardError):
    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        super().__init__(
            f"Cannot reach the shapewatch service at {url} ({reason}). Start it with "
            "`shapewatch serve` or `make up`, or point the dashboard at it with SHAPEWATCH_URL "
            "(`shapewatch dashboard --url URL`)."
        )


class AuthRejected(DashboardError):
    def __init__(self, url: str, status: int, message: str) -> None:
        self.url = url
        self.status = status
        fix = (
            "Give the dashboard a token with the read scope, and admin for acknowledging, silencing, "
            "freezing and activating (a SHAPEWATCH_TOKENS entry `read+admin:SECRET`, or a bare SECRET)."
            if status == 403
            else "Set SHAPEWATCH_TOKEN (`shapewatch dashboard --token T`) to one of the service's tokens."
        )
        super().__init__(f"The service at {url} refused the dashboard's token ({status}: {message}). {fix}")


class ServiceFailed(DashboardError):
    def __init__(self, url: str, status: int, message: str) -> None:
        self.url = url
        self.status = status
        super().__init__(
            f"The service at {url} failed to answer ({status}: {message}). Its log says more; try again in a moment."
        )


class RequestRefused(DashboardError):
    """A 4xx other than authentication: the service's message says what to change."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = message
        super().__init__(f"The service refused the request ({status}): {message}")


def _message(r: httpx.Response) -> str:
    try:
        err = r.json()["error"]
        fields = "; ".join(f"{f['path']}: {f['reason']}" for f in err.get("fields") or [])
        return str(err["message"]) + (f" ({fields})" if fields else "")
    except (ValueError, KeyError, TypeError):
        return r.text[:300] or r.reason_phrase


class ApiClient:
    """The service routes the dashboard uses, as JSON values; every failure is a ``DashboardError``."""

    def __init__(self, url: str, token: str | None = None, *, timeout: float = 20.0) -> None:
        self.url = url.rstrip("/")
        self.token = token or None
        self.timeout = timeout

    def request(
        self, method: str, path: str, *, params: dict[str, Any] | None = None, json: Any = None
    ) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        clean = {k: v for k, v in (params or {}).items() if v is not None and v != ""}
        try:
            r = httpx.request(
                method,
                self.url + path,
                params=clean,
                json=json,
                headers=headers,
                timeout=httpx.Timeout(self.timeout, connect=3.0),
            )
        except httpx.HTTPError as exc:
            raise ServiceUnreachable(
                self.url, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            ) from exc
        if r.status_code in (401, 403):
            raise AuthRejected(self.url, r.status_code, _message(r))
        if r.status_code >= 500:
            raise ServiceFailed(self.url, r.status_code, _message(r))
        if r.status_code >= 400:
            raise RequestRefused(r.status_code, _message(r))
        return r

    def get(self, path: str, **params: Any) -> Any:
        r = self.request("GET", path, params=params)
        try:
            return r.json()
        except ValueError as exc:
            raise ServiceFailed(self.url, r.status_code, f"{path} did not answer JSON") from exc

    def get_text(self, path: str, **params: Any) -> str:
        return self.request("GET", path, params=params).text

    def post(self, path: str, body: Any) -> Any:
        return self.request("POST", path, json=body).json()

    # --- reads ---------------------------------------------------------------------------------

    def alerts(self, **filters: str | None) -> list[dict[str, Any]]:
        return list(self.get("/v1/alerts", **filters))

    def events(self, ids: list[str]) -> list[dict[str, Any]]:
        return list(self.get("/v1/events", ids=ids[:100])) if ids else []

    def cohorts(self) -> list[dict[str, Any]]:
        return list(self.get("/v1/cohorts"))

    def metrics_text(self) -> str:
        return self.get_text("/metrics")

    # --- writes --------------------------------------------------------------------------------

    def acknowledge(self, fingerprint: str, *, author: str) -> dict[str, Any]:
        return dict(self.post(f"/v1/alerts/{fingerprint}/ack", {"author": author}))

    def silence(self, *, duration: str, author: str, reason: str, **match: str | None) -> dict[str, Any]:
        body = {
            "duration": duration,
            "author": author,
            "reason": reason,
            **{k: v for k, v in match.items() if v is not None},
        }
        return dict(self.post("/v1/silences", body))

    def freeze(
        self,
        *,
        model: str,
        prompt_version: str,
        contract: str,
        since: str,
        until: str,
        note: str,
        author: str,
        activate: bool = True,
        force: str | None = None,
        source: str = "production",
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "source": source,
            "model": model,
            "prompt_version": prompt_version,
            "contract": contract,
            "since": since,
            "until": until,
            "note": note,
            "author": author,
            "activate": activate,
        }
        if force:
            body["force"] = force
        return dict(self.post("/v1/baselines", body))

    def activate(self, baseline_id: str, *, author: str, note: str) -> dict[str, Any]:
        return dict(self.post(f"/v1/baselines/{baseline_id}/activate", {"author": author, "note": note}))
