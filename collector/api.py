"""The collector's HTTP routes, the one JSON error shape every route answers with, and the token check.

``POST /v1/outputs`` takes one envelope, a JSON array of envelopes, or NDJSON,
and answers per event; ``POST /v1/provider/{provider}`` takes a raw provider
response; ``GET /healthz`` runs a real query. The routers are built once, at import
(``ingest_router``, ``health_router``); what they serve (the store, the writer, the metrics)
they reach through ``Depends(collector_of)``, the ``CollectorApi`` the service puts in
``app.state.collector``, and the tokens through ``app.state.token_guard``. The service
installs ``install_error_handlers`` once for every router.

Errors: ``{"error": {"status": 422, "message": "...", "fields": [{"path": ..., "reason": ...}]}}``;
the status of each error class is its ``status`` attribute (collector/errors.py and the
errors of the other packages).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from concurrent.futures import Future
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from itertools import compress, count
from operator import attrgetter
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Depends, FastAPI, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.routing import APIRoute
from fastapi.security import HTTPBearer
from pydantic import BaseModel, ConfigDict
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from .adapters import AdapterError, Provider, ProviderOutcome, adapt_response
from .envelope import Envelope, Limits, envelope_json_schema, parse_body, validate_envelope
from .errors import (
    BatchTooLarge,
    ContractInvalid,
    EnvelopeInvalid,
    FieldError,
    ShapewatchError,
    StoreError,
    StoreUnavailable,
)
from .metrics import CollectorMetrics
from .rules import PRODUCTION
from .settings import Scope, parse_token
from .store import Store, WriteResult, WriteStatus
from .writer import Writer

__all__ = [
    "ApiError",
    "CollectorApi",
    "ErrorBody",
    "TokenGuard",
    "bearer",
    "collector_of",
    "error_body",
    "error_responses",
    "guarded_route",
    "health_router",
    "ingest_router",
    "install_error_handlers",
    "json_response",
    "operation_id",
    "require_token",
]

log = logging.getLogger(__name__)

_JSON_TYPES = ("application/json",)
_NDJSON_TYPES = ("application/x-ndjson", "application/jsonl", "application/x-jsonlines", "application/ndjson")
# The longest event_id the provider route takes: 128 (the envelope's limit) less ":<position>".
_PROVIDER_EVENT_ID = 120
#: Rejected events a reply lists in full (index, event_id, errors); the rest are counted in
#: ``rejected_by_reason`` only. A 12 MB array of 150,000 invalid envelopes was answered with
#: 164 MB, and six at once took the service from 0.3 to 8.1 GB.
MAX_REJECTIONS_LISTED = 100
# A body of this size or more is parsed with at most _LARGE_PARSES others like it (CollectorApi._parsing).
_LARGE_BODY = 1 << 20
_LARGE_PARSES = 2


def _compact(items: list[Envelope | EnvelopeInvalid | frozenset[str]]) -> None:
    """Keep the first ``MAX_REJECTIONS_LISTED`` rejections whole, the others as their reason codes.

    An error kept for the reply drops its traceback: each one held the frame that raised it,
    and with it the parsed item, until the reply was sent."""
    listed = 0
    shared: dict[frozenset[str], frozenset[str]] = {}
    for i, item in enumerate(items):
        if isinstance(item, EnvelopeInvalid):
            item.__traceback__ = None
            if listed >= MAX_REJECTIONS_LISTED:
                codes = frozenset(f.code for f in item.fields)
                items[i] = shared.setdefault(codes, codes)
            listed += 1


class ApiError(ShapewatchError):
    """An HTTP error with the shared JSON shape, for a refusal no error class of a package names
    (a content type, a closed connection): its status is given where it is raised."""

    def __init__(
        self, status: int, message: str, fields: list[FieldError] | None = None, headers: dict[str, str] | None = None
    ) -> None:
        self.status = status
        self.message = message
        self.fields = fields or []
        self.headers = headers or {}
        super().__init__(f"{status}: {message}")


_STATUS_VALUE = attrgetter("status._value_")  # a WriteResult's status as its string
_EVENT_ID = attrgetter("event_id")
_GENERATED_ID = attrgetter("generated_id")
_MODEL = attrgetter("model")
_PROMPT_VERSION = attrgetter("prompt_version")


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """A JSON reply serialized by orjson: every route answers through it, not through pydantic,
    so the bodies keep their shape and the hot ingest path pays no validation."""
    return Response(orjson.dumps(body), status_code=status, media_type="application/json", headers=headers)


def error_body(status: int, message: str, fields: list[FieldError] | None = None) -> dict[str, Any]:
    return {"error": {"status": status, "message": message, "fields": [f.as_dict() for f in fields or []]}}


# --- the documented shapes ------------------------------------------------------------------------


class FieldProblem(BaseModel):
    """One refused field: where (a field path or a parameter's name) and why."""

    path: str
    reason: str


class ErrorDetail(BaseModel):
    model_config = ConfigDict(extra="forbid")

    status: int
    message: str
    fields: list[FieldProblem]


class ErrorBody(BaseModel):
    """The one error shape of every route."""

    model_config = ConfigDict(extra="forbid")

    error: ErrorDetail


class EventResult(BaseModel):
    """One event of an ingest request: accepted, duplicate (stored before), or rejected with its errors."""

    index: int
    event_id: str | None
    status: Literal["accepted", "duplicate", "rejected"]
    errors: list[FieldProblem] | None = None
    generated_id: bool | None = None


class IngestReply(BaseModel):
    """What ``POST /v1/outputs`` answers: counts, the per-event results (the first
    ``MAX_REJECTIONS_LISTED`` rejections in full), and every rejection counted by reason."""

    accepted: int
    duplicate: int
    rejected: int
    results: list[EventResult]
    rejected_by_reason: dict[str, int]
    rejections_omitted: int


class OutcomeResult(BaseModel):
    """A response that never reached a parser (truncated, refused, filtered, invalid JSON)."""

    kind: str
    contract: str
    finish_reason: str | None
    detail: str
    counted: bool


class ProviderReply(IngestReply):
    """What ``POST /v1/provider/{provider}`` answers: the ingest reply and the provider outcomes."""

    outcomes: list[OutcomeResult]


class Health(BaseModel):
    """The store answered a real query; its figures and the writer's queue."""

    model_config = ConfigDict(extra="allow")

    status: Literal["ok"]
    schema_version: int
    events: int
    queued_events: int


_ERROR_MEANING = {
    400: "The body is not JSON (or not an array where one was sent), or the request is malformed",
    401: "No bearer token, or one the service does not know",
    403: "A valid token without the scope this route needs",
    404: "Unknown resource",
    408: "The body did not arrive in time",
    409: "Conflicts with what is stored (a refused freeze, a contract version registered with other content)",
    413: "The body is over its size limit (with or without Content-Length), or holds too many events",
    415: "Unsupported content type",
    422: "Invalid envelope, body or parameters, or a request that cannot be done; each failing field is named",
    500: "Internal error (the service log says more)",
    503: "The store cannot take writes or be read right now, or the service is busy; retry after Retry-After seconds",
}


def error_responses(*codes: int, by_reference: bool = False) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` entries for these statuses, each in the shared error shape.

    ``by_reference`` names the schema instead of the model, for a route whose own replies are
    not JSON (``/metrics``): FastAPI would list a model's schema under the route's media type,
    but errors are always JSON. The schema is in the description through the other routes."""
    if by_reference:
        content = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
        return {c: {"description": _ERROR_MEANING.get(c, "Error"), "content": content} for c in codes}
    return {c: {"description": _ERROR_MEANING.get(c, "Error"), "model": ErrorBody} for c in codes}


#: what every route may answer: a body refused by the body policy (408, 413, 503), a parameter
#: refused (422), an error of the service (500)
COMMON_ERRORS = (408, 413, 422, 500, 503)
#: what a route behind a token adds
AUTH_ERRORS = (401, 403)


def operation_id(route: APIRoute) -> str:
    """A route's OpenAPI operation id: its function's name (``ingest_events``, ``list_alerts``),
    stable across releases, where FastAPI's default is made of the path and the method."""
    return route.name


# --- one error map --------------------------------------------------------------------------------


def _allowed_methods(request: Request) -> set[str]:
    """The methods the app documents for this path, from its most specific templates:
    ``/v1/baselines/import`` is POST only, though GET ``/v1/baselines/{id}`` matches it too
    (and answers 404 for it)."""
    found: dict[str, int] = {}  # method -> fewest path parameters of a template serving it
    for template, ops in request.app.openapi().get("paths", {}).items():
        pattern = "".join(
            "[^/]+" if part.startswith("{") else re.escape(part) for part in re.split(r"(\{[^}]+\})", template)
        )
        if re.fullmatch(pattern, request.url.path):
            n = template.count("{")
            for m in ops:
                found[m.upper()] = min(n, found.get(m.upper(), n))
    fewest = min(found.values(), default=0)
    return {m for m, n in found.items() if n == fewest}


def _parameter_path(loc: tuple[Any, ...]) -> str:
    """``("query", "since")`` -> ``since``: a parameter is named as the client wrote it, as every
    check of the service names it. The location stays when nothing follows it or a position does
    (``body.12``: the body is not JSON)."""
    parts = [str(p) for p in loc]
    return ".".join(parts[1:] if len(loc) > 1 and isinstance(loc[1], str) else parts)


_CONTRACT_PARTS = {"the contract name": "contract", "the contract version": "version"}


def _error_fields(exc: ShapewatchError) -> list[FieldError]:
    """The fields an error names, whatever package raised it: its own ``fields``, or the one
    parameter or key it is about (``ParameterInvalid``: name and reason; ``ConfigInvalid``: key
    and problem), or the part of a contract that was refused."""
    if isinstance(exc, BatchTooLarge):
        return [FieldError("body", "too many events", "too_large")]
    if isinstance(exc, ContractInvalid):
        path = _CONTRACT_PARTS.get(exc.where, "document")
        return [FieldError(path, exc.problem if path != "document" else str(exc))]
    fields = getattr(exc, "fields", None)
    if isinstance(fields, list):
        return [f for f in fields if isinstance(f, FieldError)]
    for name, reason in (("name", "reason"), ("key", "problem")):
        n, r = getattr(exc, name, None), getattr(exc, reason, None)
        if isinstance(n, str) and isinstance(r, str):
            return [FieldError(n, r)]
    return []


def _shapewatch_error(exc: ShapewatchError) -> Response:
    """Any error of shapewatch, answered with its class's status in the shared shape."""
    status = exc.status
    if isinstance(exc, ApiError):
        return json_response(error_body(status, exc.message, exc.fields), status, exc.headers)
    if isinstance(exc, StoreUnavailable):  # expected under a full disk: the client retries
        return json_response(error_body(status, str(exc)), status, {"Retry-After": str(exc.retry_after)})
    if isinstance(exc, StoreError):
        log.error("store error: %s", exc)
        return json_response(error_body(status, str(exc)), status, {"Retry-After": "5"})
    if status >= 500:  # not written for a client: said in the log, not in the reply
        log.error("unexpected error", exc_info=exc)
        return json_response(error_body(500, "internal error; see the service log"), 500)
    return json_response(error_body(status, str(exc), _error_fields(exc)), status)


def install_error_handlers(app: FastAPI) -> None:
    """Make every error the app can produce answer with the shared JSON shape: the one error map,
    installed once by the app for every router."""

    async def shapewatch_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, ShapewatchError)
        return _shapewatch_error(exc)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            # Starlette names only the methods of the first route matching the path; a path
            # served by several routes (GET and POST /v1/baselines) allows all of theirs.
            headers["Allow"] = ", ".join(sorted(_allowed_methods(request))) or headers.get("Allow", "")
        return json_response(
            error_body(exc.status_code, str(exc.detail), getattr(exc, "fields", None)), exc.status_code, headers
        )

    async def validation_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        fields = [
            FieldError(_parameter_path(tuple(e.get("loc", ()))), str(e.get("msg", "invalid"))) for e in exc.errors()
        ]
        return json_response(error_body(422, "request is invalid", fields), 422)

    async def unexpected(_: Request, exc: Exception) -> Response:
        log.error("unexpected error", exc_info=exc)
        return json_response(error_body(500, "internal error; see the service log"), 500)

    app.add_exception_handler(ShapewatchError, shapewatch_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(Exception, unexpected)


# --- tokens ---------------------------------------------------------------------------------------

_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

#: The bearer scheme the API description declares on every route behind a token. It checks
#: nothing itself (``auto_error=False``): ``guarded_route`` does, before the body is read.
bearer = HTTPBearer(
    auto_error=False,
    scheme_name="bearer",
    description="A token of SHAPEWATCH_TOKENS (SECRET, or SCOPE[+SCOPE]:SECRET with the scopes ingest, "
    "read, admin). Ingest routes need ingest, other GETs read, other writes admin. Without "
    "configured tokens the service asks for none.",
)


class TokenGuard:
    """The service's tokens, checked in constant time; one per app (``app.state.token_guard``).

    >>> guard = require_token(("read:s3cret",), "read", writes="admin")
    >>> app.state.token_guard = guard  # doctest: +SKIP
    >>> router = APIRouter(route_class=guarded_route("read", writes="admin"))  # doctest: +SKIP
    """

    def __init__(self, tokens: tuple[str, ...], scope: Scope | str, writes: Scope | str | None) -> None:
        self.read_scope, self.write_scope = Scope(scope), Scope(writes or scope)
        self.entries = [(e.secret.encode(), e.scopes) for e in map(parse_token, tokens)]

    def check(self, request: Request, read_scope: Scope | None = None, write_scope: Scope | None = None) -> None:
        """Raise 401 without a known token, 403 when it lacks the scope this method needs
        (``read_scope`` for GET, HEAD and OPTIONS, ``write_scope`` for the others; by default
        the guard's own). No tokens: nothing is checked."""
        if not self.entries:
            return
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        granted: frozenset[Scope] | None = None
        if scheme.lower() == "bearer" and given:
            g = given.strip().encode()
            for secret, scopes in self.entries:  # no early exit: every secret is compared
                if hmac.compare_digest(g, secret):
                    granted = scopes
        if granted is None:
            raise ApiError(
                401,
                "missing or invalid bearer token" if header else "authentication required",
                headers={"WWW-Authenticate": "Bearer"},
            )
        safe = request.method in _SAFE_METHODS
        need = (read_scope or self.read_scope) if safe else (write_scope or self.write_scope)
        if need not in granted:
            has = "+".join(sorted(s.value for s in granted))
            raise ApiError(
                403,
                f"this token lacks the {need.value!r} scope that {request.method} {request.url.path} needs",
                [FieldError("authorization", f"needs scope {need.value}; the token has {has}", "forbidden")],
                headers={"WWW-Authenticate": f'Bearer error="insufficient_scope", scope="{need.value}"'},
            )

    async def __call__(self, request: Request) -> None:
        self.check(request)


def require_token(tokens: tuple[str, ...], scope: Scope | str, *, writes: Scope | str | None = None) -> TokenGuard:
    """The guard of these tokens: the bearer token must be known (else 401) and grant the route's
    scope (else 403).

    ``scope`` is what GET, HEAD and OPTIONS need; ``writes`` what the other methods need
    (``require_token(tokens, "read", writes="admin")``), by default ``scope``.
    Entries are ``SECRET`` (every scope) or ``SCOPE[+SCOPE]:SECRET`` (``parse_token``). The
    given token is compared with every secret in constant time, so timing tells neither
    whether nor which one matched. No tokens: no authentication.
    """
    return TokenGuard(tokens, scope, writes)


def guarded_route(scope: Scope | str, *, writes: Scope | str | None = None) -> type[APIRoute]:
    """A route class (``APIRouter(route_class=...)``) whose routes check the app's token guard
    before anything else of the request is read: a dependency runs only after FastAPI parsed the
    body, so a caller without a token would learn from a 400 or 422 how the body is checked.
    ``scope`` is what GET, HEAD and OPTIONS need, ``writes`` what the other methods need."""
    read_scope, write_scope = Scope(scope), Scope(writes or scope)

    class GuardedRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()

            async def guarded(request: Request) -> Response:
                guard = getattr(request.app.state, "token_guard", None)
                if not isinstance(guard, TokenGuard):  # fail closed: an app that forgot its tokens
                    raise ApiError(500, "the service has no token guard installed")
                guard.check(request, read_scope, write_scope)
                return await handler(request)

            return guarded

    return GuardedRoute


def _served_cohort(o: ProviderOutcome, limits: Limits) -> str | None:
    """The model that answered an alias, when it names a cohort of its own: a model name a
    response gives that breaks the tag rules is not made a cohort (the outcome still counts
    in the requested one)."""
    if o.served_model is None or o.served_model == o.model:
        return None
    return o.served_model if _tags_error(o.served_model, o.prompt_version, o.contract, limits) is None else None


def _tags_error(model: str, prompt_version: str, contract: str, limits: Limits) -> EnvelopeInvalid | None:
    """Why these tags cannot name a cohort (the envelope's rules), or None."""
    try:
        validate_envelope(
            {"model": model, "prompt_version": prompt_version, "contract": contract, "output": {}}, limits
        )
    except EnvelopeInvalid as exc:
        return exc
    return None


def _tags_valid(model: str, prompt_version: str, contract: str, limits: Limits) -> bool:
    error = _tags_error(model, prompt_version, contract, limits)
    if error is not None:
        log.warning("provider outcomes with invalid tags are not counted: %s", str(error)[:300])
    return error is None


class CollectorApi:
    """What the collector's routes serve: one store, writer and metrics (``app.state.collector``),
    and the checks of a request they share."""

    def __init__(
        self,
        store: Store,
        writer: Writer,
        metrics: CollectorMetrics,
        limits: Limits,
        *,
        max_body_bytes: int,
        max_request_events: int | None = None,
    ) -> None:
        self.store = store
        self.writer = writer
        self.metrics = metrics
        self.limits = limits
        self.max_body_bytes = max_body_bytes
        # More events than the writer's whole queue can never be taken (BatchTooLarge, 413):
        # refuse them before validating each one, whatever they hold.
        self.max_request_events = max_request_events or writer._max_queued
        # Large bodies parsed at once: a parsed body takes 10-30 times its size in Python objects,
        # and six 13 MB batches parsed together took the service from 0.3 to 2.6 GB. Small bodies
        # never wait for this (a large body's parse must not delay everybody's small requests).
        self._large_parses = asyncio.Semaphore(_LARGE_PARSES)

    @asynccontextmanager
    async def _parsing(self, size: int) -> AsyncIterator[None]:
        if size < _LARGE_BODY:
            yield
            return
        async with self._large_parses:
            yield

    @asynccontextmanager
    async def _body(self, request: Request) -> AsyncIterator[bytes]:
        """The request's body, read already by ``http_policy.BodyPolicy`` (its size, timeouts and
        the bodies held at once are that policy's, the same for every route)."""
        try:
            yield await request.body()
        except ClientDisconnect:  # nobody to answer, nothing stored: not an error of the service
            raise ApiError(
                400,
                "the client closed the connection before sending the whole body",
                [FieldError("body", "incomplete", "incomplete_body")],
            ) from None

    def _content_kind(self, request: Request) -> bool:
        """True for NDJSON, False for JSON; 415 otherwise (also for a charset other than UTF-8:
        the body would be read as UTF-8 all the same, and refused as invalid JSON)."""
        encoding = request.headers.get("content-encoding", "").strip().lower()
        if encoding not in ("", "identity"):
            raise ApiError(
                415,
                f"content encoding {encoding!r} is not supported; send the body uncompressed",
                [FieldError("content-encoding", "unsupported encoding")],
            )
        ctype, *params = request.headers.get("content-type", "").split(";")
        ctype = ctype.strip().lower()
        for param in params:
            name, _, value = param.partition("=")
            charset = value.strip().strip('"').lower()
            if name.strip().lower() == "charset" and charset not in ("utf-8", "utf8"):
                raise ApiError(
                    415,
                    f"charset {charset or '(empty)'!r} is not supported; send UTF-8 (charset=utf-8, or no charset)",
                    [FieldError("content-type", "unsupported charset")],
                )
        if ctype in _JSON_TYPES:
            return False
        if ctype in _NDJSON_TYPES:
            return True
        raise ApiError(
            415,
            f"content type {ctype or '(none)'!r} is not supported; send application/json "
            "(one envelope or an array) or application/x-ndjson (one envelope per line)",
            [FieldError("content-type", "unsupported media type")],
        )

    def _submit(self, items: Sequence[Envelope | EnvelopeInvalid | frozenset[str]]) -> Future[list[WriteResult]] | None:
        """Queue the valid envelopes for a commit (None when there are none). Preparing them
        is Python work (``Writer.submit``): call it off the event loop for a large request."""
        valid = [e for e in items if isinstance(e, Envelope)]
        return self.writer.submit(valid) if valid else None

    async def _reply(
        self, items: Sequence[Envelope | EnvelopeInvalid | frozenset[str]], submitted: Future[list[WriteResult]] | None
    ) -> dict[str, Any]:
        """The per-event answer, once the commit holding the request's events is done: every event
        accepted or duplicate, the first ``MAX_REJECTIONS_LISTED`` rejected ones with their errors
        (``_compact`` left the others as their reason codes), and every rejection counted by reason."""
        results = await asyncio.wrap_future(submitted) if submitted is not None else []
        if len(results) == len(items):  # every item an envelope: the usual request
            statuses = list(map(_STATUS_VALUE, results))
            if "conflict" not in statuses:
                return self._stored_reply(items, results, statuses)
        by_pos = iter(results)
        out: list[dict[str, Any]] = []
        counts = {"accepted": 0, "duplicate": 0, "rejected": 0}
        by_reason: Counter[str] = Counter()
        omitted = 0
        stored: Counter[tuple[str, str, str]] = Counter()  # counted once per request, not per event
        for i, item in enumerate(items):
            if isinstance(item, frozenset):
                counts["rejected"] += 1
                omitted += 1
                by_reason.update(item)
                self.metrics.count_rejected(item)
                continue
            if isinstance(item, EnvelopeInvalid):
                counts["rejected"] += 1
                codes = {f.code for f in item.fields}
                by_reason.update(codes)
                self.metrics.count_rejected(codes)
                out.append(
                    {
                        "index": i,
                        "event_id": item.event_id,
                        "status": "rejected",
                        "errors": [f.as_dict() for f in item.fields],
                    }
                )
                continue
            res = next(by_pos)
            if res.status is WriteStatus.conflict:
                counts["rejected"] += 1
                by_reason["conflict"] += 1
                self.metrics.count_rejected({"conflict"})
                if counts["rejected"] - omitted > MAX_REJECTIONS_LISTED:
                    omitted += 1
                    continue
                out.append(
                    {
                        "index": i,
                        "event_id": item.event_id,
                        "status": "rejected",
                        "errors": [
                            {
                                "path": "event_id",
                                "reason": "already stored with a different payload; "
                                "an event_id names one event and must not be reused",
                            }
                        ],
                    }
                )
                continue
            counts[res.status.value] += 1
            stored[(res.status.value, item.model, item.prompt_version)] += 1
            entry: dict[str, Any] = {"index": i, "event_id": item.event_id, "status": res.status.value}
            if item.generated_id:
                entry["generated_id"] = True
            out.append(entry)
        self._count_stored(stored)
        return {
            **counts,
            "results": out,
            "rejected_by_reason": dict(sorted(by_reason.items())),
            "rejections_omitted": omitted,
        }

    def _count_stored(self, stored: Counter[tuple[str, str, str]]) -> None:
        """Count the events stored or found stored, per (outcome, model, prompt version)."""
        for (outcome, model, prompt_version), n in stored.items():
            self.metrics.count_events(outcome, model, prompt_version, n)

    def _stored_reply(self, items: Sequence[Any], results: list[WriteResult], statuses: list[str]) -> dict[str, Any]:
        """``_reply`` for a request whose every event was stored or found stored (no rejection,
        no conflict): the same answer, built without a Python loop over the events. It runs on
        the event loop, where every request waits: with the reply's serialization, the loop took
        2.6-4.2 us an event, this 1.5 (500-event requests, measured in turn)."""
        out = [
            {"index": i, "event_id": event_id, "status": status}
            for i, (event_id, status) in enumerate(zip(map(_EVENT_ID, items), statuses, strict=True))
        ]
        for i in compress(count(), map(_GENERATED_ID, items)):
            out[i]["generated_id"] = True
        self._count_stored(Counter(zip(statuses, map(_MODEL, items), map(_PROMPT_VERSION, items), strict=True)))
        accepted = statuses.count("accepted")
        return {
            "accepted": accepted,
            "duplicate": len(statuses) - accepted,
            "rejected": 0,
            "results": out,
            "rejected_by_reason": {},
            "rejections_omitted": 0,
        }


async def collector_of(request: Request) -> CollectorApi:
    """The collector the app serves (``app.state.collector``), for ``Depends``."""
    api: CollectorApi = request.app.state.collector
    return api


Collector = Annotated[CollectorApi, Depends(collector_of)]


def _outputs_body(limits: Limits) -> dict[str, Any]:
    """The request body ``POST /v1/outputs`` documents, with the envelope of these limits."""
    return {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "oneOf": [
                        envelope_json_schema(limits),
                        {
                            "type": "array",
                            "items": {},
                            "description": "envelopes, each accepted or rejected on its own",
                        },
                    ]
                }
            },
            "application/x-ndjson": {"schema": {"type": "string", "description": "one envelope per line"}},
        },
    }


def publish_limits(openapi: dict[str, Any], limits: Limits) -> dict[str, Any]:
    """The API description with the envelope of the service's own limits (the routes are built
    at import, with the default ones)."""
    openapi["paths"]["/v1/outputs"]["post"]["requestBody"] = _outputs_body(limits)
    return openapi


#: The ingest routes: a token with the ingest scope, whatever the method.
ingest_router = APIRouter(
    tags=["ingest"],
    route_class=guarded_route(Scope.ingest),
    dependencies=[Security(bearer)],
    responses=error_responses(*AUTH_ERRORS, *COMMON_ERRORS),
    generate_unique_id_function=operation_id,
)


@ingest_router.post(
    "/v1/outputs",
    summary="Ingest structured outputs",
    description="One envelope (JSON object), a JSON array of envelopes, or NDJSON. "
    "Answers per event once the transaction holding it committed. A single envelope "
    "that is refused answers 422; in an array or NDJSON each event has its own result.",
    # The reply is documented, not validated: it is serialized by orjson on the hot path.
    responses={200: {"model": IngestReply, "description": "Each event's result"}, **error_responses(400, 415)},
    openapi_extra={"requestBody": _outputs_body(Limits())},
)
async def ingest_events(request: Request, api: Collector) -> Response:
    t0 = time.perf_counter()
    ndjson = api._content_kind(request)
    async with api._body(request) as body:
        single = not ndjson and not body.lstrip().startswith(b"[")

        def parse_and_submit() -> tuple[
            list[Envelope | EnvelopeInvalid | frozenset[str]], Future[list[WriteResult]] | None
        ]:
            items: list[Envelope | EnvelopeInvalid | frozenset[str]] = list(
                parse_body(body, api.limits, ndjson=ndjson, max_items=api.max_request_events)
            )
            _compact(items)
            return items, api._submit(items)

        try:
            # Parsing and preparing a large body take a while: off the event loop, so other
            # requests (and /healthz) are not held up by them.
            async with api._parsing(len(body)):
                items, submitted = await asyncio.to_thread(parse_and_submit)
        except EnvelopeInvalid as exc:
            api.metrics.count_rejected({f.code for f in exc.fields})
            raise ApiError(
                exc.status if exc.status != 422 or single else 400,
                "the body is not a valid envelope" if single else "the body is not valid JSON",
                exc.fields,
            ) from None
        reply = await api._reply(items, submitted)
        api.metrics.request_seconds.labels("outputs").observe(time.perf_counter() - t0)
        if single and reply["rejected"]:
            errs = [FieldError(e["path"], e["reason"]) for e in reply["results"][0]["errors"]]
            raise ApiError(422, "the envelope was rejected", errs)
        return json_response(reply)


@ingest_router.post(
    "/v1/provider/{provider}",
    summary="Ingest a raw provider response",
    description="A raw OpenAI, Anthropic or Gemini response; query parameters "
    "prompt_version (required), model (the requested model or alias), contract, "
    "event_id, source, contract_version.",
    responses={
        200: {"model": ProviderReply, "description": "Each event's result and the provider outcomes"},
        **error_responses(400, 404, 415),
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"type": "object", "description": "the provider's response, as it came"}}
            },
        }
    },
)
async def ingest_provider_response(
    request: Request,
    api: Collector,
    provider: str,
    prompt_version: str,
    model: str | None = None,
    contract: str | None = None,
    event_id: str | None = None,
    source: str | None = None,
    contract_version: str | None = None,
) -> Response:
    t0 = time.perf_counter()
    try:
        prov = Provider(provider)
    except ValueError:
        raise ApiError(
            404, f"unknown provider {provider!r}; use one of " + ", ".join(p.value for p in Provider)
        ) from None
    api._content_kind(request)
    # The query's tags obey the envelope's rules (they also name the cohort of outcomes).
    fields: list[FieldError] = []
    try:
        validate_envelope(
            {
                "model": "-" if model is None else model,
                "prompt_version": prompt_version,
                "contract": contract,
                "source": source,
                "contract_version": contract_version,
                "event_id": event_id,
                "output": {},
            },
            api.limits,
        )
    except EnvelopeInvalid as exc:
        fields = exc.fields
    if event_id is not None and len(event_id) > _PROVIDER_EVENT_ID and not fields:
        # several outputs get f"{event_id}:{position}", which must fit the envelope's 128
        fields = [
            FieldError(
                "event_id",
                f"is {len(event_id)} characters long; the limit here is "
                f"{_PROVIDER_EVENT_ID}, leaving room for each output's ':<position>'",
                "too_large",
            )
        ]
    if fields:
        raise ApiError(422, "the query parameters are invalid", fields)
    async with api._body(request) as body:

        def adapt() -> tuple[
            list[Envelope | EnvelopeInvalid | frozenset[str]], list[ProviderOutcome], list[ProviderOutcome]
        ]:
            # Parsing and adapting a large response take a while: off the event loop.
            try:
                raw = orjson.loads(body)
            except orjson.JSONDecodeError as exc:
                raise ApiError(
                    400, "the body is not valid JSON", [FieldError("body", str(exc), "invalid_json")]
                ) from None
            try:
                adapted = adapt_response(
                    prov,
                    raw,
                    prompt_version=prompt_version,
                    model=model,
                    contract=contract,
                    event_id=event_id,
                    source=source,
                    contract_version=contract_version,
                )
            except AdapterError as exc:
                raise ApiError(422, f"not a {prov.value} response", [FieldError(exc.path, exc.reason)]) from None
            many = len(adapted.envelopes) + len(adapted.outcomes)
            if many > api.max_request_events:
                raise BatchTooLarge(many, api.max_request_events)
            items: list[Envelope | EnvelopeInvalid | frozenset[str]] = []
            for env in adapted.envelopes:
                try:
                    items.append(validate_envelope(env, api.limits, now=now))
                except EnvelopeInvalid as exc:
                    items.append(exc)
            _compact(items)
            # Tags are checked once per cohort, not per outcome: a response may hold thousands.
            ok: dict[tuple[str, str, str], bool] = {}
            for o in adapted.outcomes:
                tags = (o.model, o.prompt_version, o.contract)
                if tags not in ok:
                    ok[tags] = _tags_valid(*tags, api.limits)
            countable = [o for o in adapted.outcomes if ok[(o.model, o.prompt_version, o.contract)]]
            return items, list(adapted.outcomes), countable

        now = datetime.now(UTC)
        async with api._parsing(len(body)):
            items, outcomes, countable = await asyncio.to_thread(adapt)
        counted_ids: set[int] = set()
        if countable:
            # Keyed by response id and position: a re-posted response counts them once.
            counted = await asyncio.to_thread(
                api.store.record_outcomes,
                [(o.model, o.prompt_version, o.contract, now, o.kind.value) for o in countable],
                keys=[o.key for o in countable],
                served=[_served_cohort(o, api.limits) for o in countable],
                source=PRODUCTION if source is None else source,
            )
            for o, new in zip(countable, counted, strict=True):
                if new:
                    counted_ids.add(id(o))
                    api.metrics.provider_outcomes.labels(prov.value, o.kind.value).inc()
        # submit prepares the events and may wait for another request's turn: off the loop
        reply = await api._reply(items, await asyncio.to_thread(api._submit, items))
        # counted: whether this post counted the outcome (not when a post before it did, nor
        # when its tags cannot name a cohort: a model name from the response over the limits)
        reply["outcomes"] = [
            {
                "kind": o.kind.value,
                "contract": o.contract,
                "finish_reason": o.finish_reason,
                "detail": o.detail,
                "counted": id(o) in counted_ids,
            }
            for o in outcomes
        ]
        api.metrics.request_seconds.labels("provider").observe(time.perf_counter() - t0)
        return json_response(reply)


#: Open without a token: liveness and readiness probes must not hold a secret.
health_router = APIRouter(tags=["health"], generate_unique_id_function=operation_id)


@health_router.get(
    "/healthz",
    summary="Health: runs a real query on the store",
    description="Open without a token (liveness and readiness probes).",
    response_model=Health,
    responses=error_responses(500, 503),
)
async def get_health(api: Collector) -> Response:
    store, writer = api.store, api.writer
    if store.invalidated is not None:  # every query would fail: say why, once
        raise ApiError(503, str(store.invalidated))
    try:
        info = await asyncio.to_thread(store.healthcheck)
    except StoreError as exc:
        raise ApiError(503, str(exc), headers={"Retry-After": "5"}) from None
    if not writer.alive:
        raise ApiError(503, "the writer thread has stopped; restart the service", headers={"Retry-After": "5"})
    if store.last_merge_error:
        raise ApiError(503, f"rollups cannot be merged: {store.last_merge_error}", headers={"Retry-After": "5"})
    if writer.last_error:
        raise ApiError(503, f"the last write failed: {writer.last_error}", headers={"Retry-After": "5"})
    return json_response({"status": "ok", **info, "queued_events": writer.queued_events})
