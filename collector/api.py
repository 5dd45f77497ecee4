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
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from concurrent.futures import Future
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import orjson
from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from .adapters import AdapterError, Provider, ProviderOutcome, adapt_response
from .envelope import Envelope, Limits, envelope_json_schema, parse_body, validate_envelope
from .errors import (
    BatchTooLarge,
    EnvelopeInvalid,
    FieldError,
    ShapewatchError,
    StoreError,
    StoreUnavailable,
)
from .metrics import CollectorMetrics
from .settings import Scope, parse_token
from .store import Store, WriteResult, WriteStatus
from .writer import Writer

__all__ = [
    "ApiError",
    "CollectorApi",
    "TokenGuard",
    "error_body",
    "error_responses",
    "install_error_handlers",
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
    """An HTTP error with the shared JSON shape."""

    def __init__(
        self, status: int, message: str, fields: list[FieldError] | None = None, headers: dict[str, str] | None = None
    ) -> None:
        self.status = status
        self.message = message
        self.fields = fields or []
        self.headers = headers or {}
        super().__init__(f"{status}: {message}")


def error_body(status: int, message: str, fields: list[FieldError] | None = None) -> dict[str, Any]:
    return {"error": {"status": status, "message": message, "fields": [f.as_dict() for f in fields or []]}}


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json", headers=headers)


_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "additionalProperties": False,
    "properties": {
        "error": {
            "type": "object",
            "required": ["status", "message", "fields"],
            "properties": {
                "status": {"type": "integer"},
                "message": {"type": "string"},
                "fields": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["path", "reason"],
                        "properties": {"path": {"type": "string"}, "reason": {"type": "string"}},
                    },
                },
            },
        }
    },
}

_ERROR_MEANING = {
    400: "The body is not JSON (or not an array where one was sent)",
    404: "Unknown resource",
    413: "The body is over max_body_bytes (with or without Content-Length), or holds too many events",
    415: "Unsupported content type",
    422: "Invalid envelope, query parameters or reused event_id; each failing field is named",
    503: "The store cannot take writes or be read right now; retry after Retry-After seconds",
}


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` entries for these statuses, each in the shared error shape."""
    return {
        c: {"description": _ERROR_MEANING.get(c, "Error"), "content": {"application/json": {"schema": _ERROR_SCHEMA}}}
        for c in codes
    }


def _allowed_methods(request: Request) -> set[str]:
    """The methods the app documents for this path, from its most specific templates:
    ``/v1/baselines/import`` is POST only, though GET ``/v1/baselines/{id}`` matches it too
    (and answers 404 for it)."""
    import re

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


def install_error_handlers(app: FastAPI) -> None:
    """Make every error the app can produce answer with the shared JSON shape."""

    async def api_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return _json(exc.status, error_body(exc.status, exc.message, exc.fields), exc.headers)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            # Starlette names only the methods of the first route matching the path; a path
            # served by several routes (GET and POST /v1/baselines) allows all of theirs.
            headers["Allow"] = ", ".join(sorted(_allowed_methods(request))) or headers.get("Allow", "")
        return _json(
            exc.status_code, error_body(exc.status_code, str(exc.detail), getattr(exc, "fields", None)), headers
        )

    async def validation_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        fields = [
            FieldError(_parameter_path(tuple(e.get("loc", ()))), str(e.get("msg", "invalid"))) for e in exc.errors()
        ]
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
        log.error("unexpected error", exc_info=exc)
        return _json(500, error_body(500, "internal error; see the service log"))

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(BatchTooLarge, too_large)
    app.add_exception_handler(StoreUnavailable, store_unavailable)
    app.add_exception_handler(StoreError, store_error)
    app.add_exception_handler(Exception, unexpected)


_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

_AUTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"description": "No bearer token, or one the service does not know (shared error shape)"},
    403: {"description": "A valid token without the scope this route needs (shared error shape)"},
}


class TokenGuard:
    """The dependency ``require_token`` builds; ``responses`` documents its 401 and 403.

    >>> guard = require_token(("read:s3cret",), "read", writes="admin")
    >>> router = APIRouter(route_class=guard.route_class, responses=guard.responses)  # doctest: +SKIP
    >>> app.get("/metrics", dependencies=[Depends(guard)], responses=guard.responses)  # doctest: +SKIP
    """

    def __init__(self, tokens: tuple[str, ...], scope: Scope | str, writes: Scope | str | None) -> None:
        self.read_scope, self.write_scope = Scope(scope), Scope(writes or scope)
        self.entries = [(e.secret.encode(), e.scopes) for e in map(parse_token, tokens)]
        #: OpenAPI responses of the routes it guards (none without tokens: nothing is refused)
        self.responses: dict[int | str, dict[str, Any]] = dict(_AUTH_RESPONSES) if self.entries else {}
        #: for ``APIRouter(route_class=...)``: checks the token before anything else of the request
        #: is read. A dependency runs only after FastAPI parsed the body, so a caller without a
        #: token would learn from a 400 or 422 how the body is checked.
        self.route_class: type[APIRoute] = type("GuardedRoute", (_GuardedRoute,), {"guard": self})

    async def __call__(self, request: Request) -> None:
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
        need = self.read_scope if request.method in _SAFE_METHODS else self.write_scope
        if need not in granted:
            has = "+".join(sorted(s.value for s in granted))
            raise ApiError(
                403,
                f"this token lacks the {need.value!r} scope that {request.method} {request.url.path} needs",
                [FieldError("authorization", f"needs scope {need.value}; the token has {has}", "forbidden")],
                headers={"WWW-Authenticate": f'Bearer error="insufficient_scope", scope="{need.value}"'},
            )


class _GuardedRoute(APIRoute):
    guard: TokenGuard

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler, guard = super().get_route_handler(), self.guard

        async def guarded(request: Request) -> Response:
            await guard(request)
            return await handler(request)

        return guarded


def require_token(tokens: tuple[str, ...], scope: Scope | str, *, writes: Scope | str | None = None) -> TokenGuard:
    """A dependency: the bearer token must be known (else 401) and grant the route's scope (else 403).

    ``scope`` is what GET, HEAD and OPTIONS need; ``writes`` what the other methods of the
    same router need (``require_token(tokens, "read", writes="admin")``), by default ``scope``.
    Entries are ``SECRET`` (every scope) or ``SCOPE[+SCOPE]:SECRET`` (``parse_token``). The
    given token is compared with every secret in constant time, so timing tells neither
    whether nor which one matched. No tokens: no authentication.
    """
    return TokenGuard(tokens, scope, writes)


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
    """Builds the collector's router around one store, writer and metrics."""

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
        for (outcome, model, prompt_version), n in stored.items():
            self.metrics.count_events(outcome, model, prompt_version, n)
        return {
            **counts,
            "results": out,
            "rejected_by_reason": dict(sorted(by_reason.items())),
            "rejections_omitted": omitted,
        }

    def router(self, tokens: tuple[str, ...]) -> APIRouter:
        guard = require_token(tokens, Scope.ingest)
        router = APIRouter(route_class=guard.route_class, responses=guard.responses)

        envelope = envelope_json_schema(self.limits)

        @router.post(
            "/v1/outputs",
            summary="Ingest structured outputs",
            description="One envelope (JSON object), a JSON array of envelopes, or NDJSON. "
            "Answers per event once the transaction holding it committed. A single envelope "
            "that is refused answers 422; in an array or NDJSON each event has its own result.",
            responses=error_responses(400, 413, 415, 422, 503),
            openapi_extra={
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {
                                "oneOf": [
                                    envelope,
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
            },
        )
        async def post_outputs(request: Request) -> Response:
            t0 = time.perf_counter()
            ndjson = self._content_kind(request)
            async with self._body(request) as body:
                single = not ndjson and not body.lstrip().startswith(b"[")

                def parse_and_submit() -> tuple[
                    list[Envelope | EnvelopeInvalid | frozenset[str]], Future[list[WriteResult]] | None
                ]:
                    items: list[Envelope | EnvelopeInvalid | frozenset[str]] = list(
                        parse_body(body, self.limits, ndjson=ndjson, max_items=self.max_request_events)
                    )
                    _compact(items)
                    return items, self._submit(items)

                try:
                    # Parsing and preparing a large body take a while: off the event loop, so other
                    # requests (and /healthz) are not held up by them.
                    async with self._parsing(len(body)):
                        items, submitted = await asyncio.to_thread(parse_and_submit)
                except EnvelopeInvalid as exc:
                    self.metrics.count_rejected({f.code for f in exc.fields})
                    raise ApiError(
                        exc.status if exc.status != 422 or single else 400,
                        "the body is not a valid envelope" if single else "the body is not valid JSON",
                        exc.fields,
                    ) from None
                reply = await self._reply(items, submitted)
                self.metrics.request_seconds.labels("outputs").observe(time.perf_counter() - t0)
                if single and reply["rejected"]:
                    errs = [FieldError(e["path"], e["reason"]) for e in reply["results"][0]["errors"]]
                    raise ApiError(422, "the envelope was rejected", errs)
                return _json(200, reply)

        @router.post(
            "/v1/provider/{provider}",
            summary="Ingest a raw provider response",
            description="A raw OpenAI, Anthropic or Gemini response; query parameters "
            "prompt_version (required), model (the requested model or alias), contract, "
            "event_id, source, contract_version.",
            responses=error_responses(400, 404, 413, 415, 422, 503),
            openapi_extra={
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {"type": "object", "description": "the provider's response, as it came"}
                        }
                    },
                }
            },
        )
        async def post_provider(
            request: Request,
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
            self._content_kind(request)
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
                    self.limits,
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
            async with self._body(request) as body:

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
                        raise ApiError(
                            422, f"not a {prov.value} response", [FieldError(exc.path, exc.reason)]
                        ) from None
                    many = len(adapted.envelopes) + len(adapted.outcomes)
                    if many > self.max_request_events:
                        raise BatchTooLarge(many, self.max_request_events)
                    items: list[Envelope | EnvelopeInvalid | frozenset[str]] = []
                    for env in adapted.envelopes:
                        try:
                            items.append(validate_envelope(env, self.limits, now=now))
                        except EnvelopeInvalid as exc:
                            items.append(exc)
                    _compact(items)
                    # Tags are checked once per cohort, not per outcome: a response may hold thousands.
                    ok: dict[tuple[str, str, str], bool] = {}
                    for o in adapted.outcomes:
                        tags = (o.model, o.prompt_version, o.contract)
                        if tags not in ok:
                            ok[tags] = _tags_valid(*tags, self.limits)
                    countable = [o for o in adapted.outcomes if ok[(o.model, o.prompt_version, o.contract)]]
                    return items, list(adapted.outcomes), countable

                now = datetime.now(UTC)
                async with self._parsing(len(body)):
                    items, outcomes, countable = await asyncio.to_thread(adapt)
                counted_ids: set[int] = set()
                if countable:
                    # Keyed by response id and position: a re-posted response counts them once.
                    counted = await asyncio.to_thread(
                        self.store.record_outcomes,
                        [(o.model, o.prompt_version, o.contract, now, o.kind.value) for o in countable],
                        keys=[o.key for o in countable],
                        served=[_served_cohort(o, self.limits) for o in countable],
                    )
                    for o, new in zip(countable, counted, strict=True):
                        if new:
                            counted_ids.add(id(o))
                            self.metrics.provider_outcomes.labels(prov.value, o.kind.value).inc()
                # submit prepares the events and may wait for another request's turn: off the loop
                reply = await self._reply(items, await asyncio.to_thread(self._submit, items))
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
                self.metrics.request_seconds.labels("provider").observe(time.perf_counter() - t0)
                return _json(200, reply)

        return router

    def health_router(self) -> APIRouter:
        router = APIRouter()

        @router.get(
            "/healthz",
            summary="Health: runs a real query on the store",
            description="Open without a token (liveness and readiness probes).",
            responses=error_responses(503),
        )
        async def healthz() -> Response:
            if self.store.invalidated is not None:  # every query would fail: say why, once
                return _json(503, error_body(503, str(self.store.invalidated)))
            try:
                info = await asyncio.to_thread(self.store.healthcheck)
            except StoreError as exc:
                return _json(503, error_body(503, str(exc)), {"Retry-After": "5"})
            if not self.writer.alive:
                return _json(
                    503, error_body(503, "the writer thread has stopped; restart the service"), {"Retry-After": "5"}
                )
            if self.store.last_merge_error:
                return _json(
                    503,
                    error_body(503, f"rollups cannot be merged: {self.store.last_merge_error}"),
                    {"Retry-After": "5"},
                )
            if self.writer.last_error:
                return _json(
                    503, error_body(503, f"the last write failed: {self.writer.last_error}"), {"Retry-After": "5"}
                )
            return _json(200, {"status": "ok", **info, "queued_events": self.writer.queued_events})

        return router
