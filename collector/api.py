"""The collector's HTTP routes, and the one JSON error shape every route answers with.

``POST /v1/outputs`` takes one envelope, a JSON array of envelopes, or NDJSON,
and answers per event; ``POST /v1/provider/{provider}`` takes a raw provider
response; ``GET /healthz`` runs a real query. The service (``analysis``)
mounts this router and installs ``install_error_handlers``.

Errors: ``{"error": {"status": 422, "message": "...", "fields": [{"path": ..., "reason": ...}]}}``.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import orjson
from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from .adapters import AdapterError, Provider, adapt_response
from .envelope import Envelope, Limits, parse_body, validate_envelope
from .errors import (
    BatchTooLarge,
    EnvelopeInvalid,
    FieldError,
    ShapewatchError,
    StoreError,
    StoreUnavailable,
)
from .metrics import CollectorMetrics
from .store import Store, WriteStatus
from .writer import Writer

__all__ = ["ApiError", "CollectorApi", "error_body", "install_error_handlers", "require_token"]

log = logging.getLogger(__name__)

_JSON_TYPES = ("application/json",)
_NDJSON_TYPES = ("application/x-ndjson", "application/jsonl", "application/x-jsonlines", "application/ndjson")


class ApiError(ShapewatchError):
    """An HTTP error with the shared JSON shape."""

    def __init__(self, status: int, message: str, fields: list[FieldError] | None = None,
                 headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.message = message
        self.fields = fields or []
        self.headers = headers or {}
        super().__init__(f"{status}: {message}")


def error_body(status: int, message: str, fields: list[FieldError] | None = None) -> dict[str, Any]:
    return {"error": {"status": status, "message": message,
                      "fields": [f.as_dict() for f in fields or []]}}


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json", headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    """Make every error the app can produce answer with the shared JSON shape."""

    async def api_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return _json(exc.status, error_body(exc.status, exc.message, exc.fields), exc.headers)

    async def http_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        return _json(exc.status_code, error_body(exc.status_code, str(exc.detail)),
                     dict(exc.headers or {}))

    async def validation_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        fields = [FieldError(".".join(str(p) for p in e.get("loc", ())), str(e.get("msg", "invalid")))
                  for e in exc.errors()]
        return _json(422, error_body(422, "request is invalid", fields))

    async def too_large(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, BatchTooLarge)
        return _json(413, error_body(413, str(exc), [FieldError("body", "too many events", "too_large")]))

    async def store_unavailable(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, StoreUnavailable)
        return _json(503, error_body(503, str(exc)), {"Retry-After": str(exc.retry_after)})

    async def store_error(_: Request, exc: Exception) -> Response:
        log.error("store error: %s", exc)
        return _json(503, error_body(503, str(exc)), {"Retry-After": "5"})

    async def unexpected(_: Request, exc: Exception) -> Response:
        log.exception("unexpected error", exc_info=exc)
        return _json(500, error_body(500, "internal error; see the service log"))

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(BatchTooLarge, too_large)
    app.add_exception_handler(StoreUnavailable, store_unavailable)
    app.add_exception_handler(StoreError, store_error)
    app.add_exception_handler(Exception, unexpected)


def require_token(tokens: tuple[str, ...]) -> Callable[[Request], Awaitable[None]]:
    """A dependency that checks the bearer token in constant time (no-op without tokens)."""
    encoded = [t.encode() for t in tokens]

    async def check(request: Request) -> None:
        if not encoded:
            return
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        ok = False
        if scheme.lower() == "bearer" and given:
            g = given.strip().encode()
            for t in encoded:  # compare with every token, so timing does not tell which matched
                ok |= hmac.compare_digest(g, t)
        if not ok:
            raise ApiError(401, "missing or invalid bearer token" if header else "authentication required",
                           headers={"WWW-Authenticate": "Bearer"})

    return check


def _tags_valid(model: str, prompt_version: str, contract: str, limits: Limits) -> bool:
    try:
        validate_envelope({"model": model, "prompt_version": prompt_version, "contract": contract,
                           "output": {}}, limits)
    except EnvelopeInvalid as exc:
        log.warning("a provider outcome has invalid tags and is not counted: %s", exc)
        return False
    return True


class CollectorApi:
    """Builds the collector's router around one store, writer and metrics."""

    def __init__(self, store: Store, writer: Writer, metrics: CollectorMetrics, limits: Limits, *,
                 max_body_bytes: int) -> None:
        self.store = store
        self.writer = writer
        self.metrics = metrics
        self.limits = limits
        self.max_body_bytes = max_body_bytes

    async def _read_body(self, request: Request) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise ApiError(413, f"body is {declared} bytes; the limit is {self.max_body_bytes}",
                           [FieldError("body", "too large", "body_too_large")])
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body_bytes:  # no or false Content-Length: stop reading at the limit
                raise ApiError(413, f"body exceeds the limit of {self.max_body_bytes} bytes",
                               [FieldError("body", "too large", "body_too_large")])
            chunks.append(chunk)
        return b"".join(chunks)

    def _content_kind(self, request: Request) -> bool:
        """True for NDJSON, False for JSON; 415 otherwise."""
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype in _JSON_TYPES:
            return False
        if ctype in _NDJSON_TYPES:
            return True
        raise ApiError(415, f"content type {ctype or '(none)'!r} is not supported; send application/json "
                       "(one envelope or an array) or application/x-ndjson (one envelope per line)",
                       [FieldError("content-type", "unsupported media type")])

    async def _store(self, items: list[Envelope | EnvelopeInvalid]) -> dict[str, Any]:
        valid = [e for e in items if isinstance(e, Envelope)]
        results = await asyncio.wrap_future(self.writer.submit(valid)) if valid else []
        by_pos = iter(results)
        out: list[dict[str, Any]] = []
        counts = {"accepted": 0, "duplicate": 0, "rejected": 0}
        stored: Counter[tuple[str, str, str]] = Counter()  # counted once per request, not per event
        for i, item in enumerate(items):
            if isinstance(item, EnvelopeInvalid):
                counts["rejected"] += 1
                self.metrics.count_rejected({f.code for f in item.fields})
                out.append({"index": i, "event_id": item.event_id, "status": "rejected",
                            "errors": [f.as_dict() for f in item.fields]})
                continue
            res = next(by_pos)
            if res.status is WriteStatus.conflict:
                counts["rejected"] += 1
                self.metrics.count_rejected({"conflict"})
                out.append({"index": i, "event_id": item.event_id, "status": "rejected", "errors": [
                    {"path": "event_id", "reason": "already stored with a different payload; "
                     "an event_id names one event and must not be reused"}]})
                continue
            counts[res.status.value] += 1
            stored[(res.status.value, item.model, item.prompt_version)] += 1
            entry: dict[str, Any] = {"index": i, "event_id": item.event_id, "status": res.status.value}
            if item.generated_id:
                entry["generated_id"] = True
            out.append(entry)
        for (outcome, model, prompt_version), n in stored.items():
            self.metrics.count_events(outcome, model, prompt_version, n)
        return {**counts, "results": out}

    def router(self, tokens: tuple[str, ...]) -> APIRouter:
        from fastapi import Depends

        router = APIRouter(dependencies=[Depends(require_token(tokens))])

        @router.post("/v1/outputs", summary="Ingest structured outputs",
                     description="One envelope (JSON object), a JSON array of envelopes, or NDJSON. "
                     "Answers per event once the transaction holding it committed.")
        async def post_outputs(request: Request) -> Response:
            t0 = time.perf_counter()
            ndjson = self._content_kind(request)
            body = await self._read_body(request)
            single = not ndjson and not body.lstrip().startswith(b"[")
            try:
                # Parsing a large body takes a while: off the event loop, so other requests
                # (and /healthz) are not held up by it.
                items = await asyncio.to_thread(lambda: list(parse_body(body, self.limits, ndjson=ndjson)))
            except EnvelopeInvalid as exc:
                self.metrics.count_rejected({f.code for f in exc.fields})
                raise ApiError(exc.status if exc.status != 422 or single else 400,
                               "the body is not a valid envelope" if single else "the body is not valid JSON",
                               exc.fields) from None
            reply = await self._store(items)
            self.metrics.request_seconds.labels("outputs").observe(time.perf_counter() - t0)
            if single and reply["rejected"]:
                errs = [FieldError(e["path"], e["reason"]) for e in reply["results"][0]["errors"]]
                raise ApiError(422, "the envelope was rejected", errs)
            return _json(200, reply)

        @router.post("/v1/provider/{provider}", summary="Ingest a raw provider response",
                     description="A raw OpenAI, Anthropic or Gemini response; query parameters "
                     "prompt_version (required), model (the requested model or alias), contract, "
                     "event_id, source, contract_version.")
        async def post_provider(request: Request, provider: str, prompt_version: str,
                                model: str | None = None, contract: str | None = None,
                                event_id: str | None = None, source: str | None = None,
                                contract_version: str | None = None) -> Response:
            t0 = time.perf_counter()
            try:
                prov = Provider(provider)
            except ValueError:
                raise ApiError(404, f"unknown provider {provider!r}; use one of "
                               + ", ".join(p.value for p in Provider)) from None
            self._content_kind(request)
            # The query's tags obey the envelope's rules (they also name the cohort of outcomes).
            try:
                validate_envelope({"model": model or "-", "prompt_version": prompt_version,
                                   "contract": contract, "source": source, "contract_version": contract_version,
                                   "event_id": event_id, "output": {}}, self.limits)
            except EnvelopeInvalid as exc:
                raise ApiError(422, "the query parameters are invalid", exc.fields) from None
            body = await self._read_body(request)
            try:
                raw = orjson.loads(body)
            except orjson.JSONDecodeError as exc:
                raise ApiError(400, "the body is not valid JSON", [FieldError("body", str(exc), "invalid_json")]) \
                    from None
            try:
                adapted = adapt_response(prov, raw, prompt_version=prompt_version, model=model,
                                         contract=contract, event_id=event_id, source=source,
                                         contract_version=contract_version)
            except AdapterError as exc:
                raise ApiError(422, f"not a {prov.value} response", [FieldError(exc.path, exc.reason)]) from None
            now = datetime.now(UTC)
            items: list[Envelope | EnvelopeInvalid] = []
            for env in adapted.envelopes:
                try:
                    items.append(validate_envelope(env, self.limits, now=now))
                except EnvelopeInvalid as exc:
                    items.append(exc)
            outcomes = [o for o in adapted.outcomes if _tags_valid(o.model, o.prompt_version, o.contract,
                                                                   self.limits)]
            if outcomes:
                # Keyed by response id and position: a re-posted response counts them once.
                counted = await asyncio.to_thread(
                    self.store.record_outcomes,
                    [(o.model, o.prompt_version, o.contract, now, o.kind.value) for o in outcomes],
                    keys=[o.key for o in outcomes])
                if counted:
                    for o in outcomes:
                        self.metrics.provider_outcomes.labels(prov.value, o.kind.value).inc()
            reply = await self._store(items)
            reply["outcomes"] = [{"kind": o.kind.value, "contract": o.contract, "finish_reason": o.finish_reason,
                                  "detail": o.detail} for o in adapted.outcomes]
            self.metrics.request_seconds.labels("provider").observe(time.perf_counter() - t0)
            return _json(200, reply)

        return router

    def health_router(self) -> APIRouter:
        router = APIRouter()

        @router.get("/healthz", summary="Health: runs a real query on the store")
        async def healthz() -> Response:
            try:
                info = await asyncio.to_thread(self.store.healthcheck)
            except StoreError as exc:
                return _json(503, error_body(503, str(exc)), {"Retry-After": "5"})
            if not self.writer.alive:
                return _json(503, error_body(503, "the writer thread has stopped; restart the service"),
                             {"Retry-After": "5"})
            if self.store.last_merge_error:
                return _json(503, error_body(503, f"rollups cannot be merged: {self.store.last_merge_error}"),
                             {"Retry-After": "5"})
            if self.writer.last_error:
                return _json(503, error_body(503, f"the last write failed: {self.writer.last_error}"),
                             {"Retry-After": "5"})
            return _json(200, {"status": "ok", **info, "queued_events": self.writer.queued_events})

        return router
