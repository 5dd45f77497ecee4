"""OTLP/HTTP trace ingest (``POST /v1/traces``) and the run view (``GET /v1/runs``,
``GET /v1/runs/{run_id}``).

``POST /v1/traces`` follows the OTLP/HTTP specification: an ``ExportTraceServiceRequest`` in
protobuf (``application/x-protobuf``) or OTLP JSON (``application/json``), optionally gzipped
(``Content-Encoding: gzip``; the body limit of every ingest route applies to the compressed body
*and* to what it decompresses to), the ingest token as bearer. The answer has the request's
content type: an ``ExportTraceServiceResponse``, with ``partial_success`` when spans were
rejected (``rejected_spans`` and a message naming the first errors) or skipped (a warning with
``rejected_spans`` 0, as the specification allows). JSON answers also carry ``shapewatch``:
the events accepted, duplicate and rejected, the spans skipped by reason, and each span error.
A request refused as a whole (not OTLP, a gzip bomb, too many spans) answers, as OTLP asks, a
``google.rpc.Status`` in protobuf when it was protobuf; JSON requests, and refusals made before
the encoding is known (a token, a content type) or by the service itself (5xx), answer the
service's one error shape in JSON.

Spans become envelopes in ``collector/otlp.py``; envelopes go through the same validation and
group commit as ``POST /v1/outputs``, and the steps of their runs into the store's run tables
(after the events committed; the answer waits for both, so an exporter's retry after a
failure stores what was missing and nothing twice).
"""

from __future__ import annotations

import asyncio
import threading
import time
import zlib
from collections import Counter
from concurrent.futures import Future
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request, Security
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict

from .api import (
    AUTH_ERRORS,
    COMMON_ERRORS,
    ApiError,
    Collector,
    CollectorApi,
    bearer,
    error_responses,
    guarded_route,
    json_response,
    operation_id,
)
from .envelope import Envelope, validate_envelope
from .errors import BatchTooLarge, EnvelopeInvalid, FieldError, ShapewatchError
from .otlp import OtlpMapping, RunStep, SpanError, SpansMapped, decode_json, decode_protobuf, map_spans
from .settings import Scope
from .store import StoreBackend, WriteResult, WriteStatus

__all__ = [
    "RunNotFound",
    "RunReply",
    "TracesReply",
    "decompress",
    "run_view",
    "runs_router",
    "status_pb",
    "traces_router",
]

_PROTOBUF = "application/x-protobuf"
_JSON = "application/json"
#: span errors named in the partial-success message and listed in a JSON answer
_ERRORS_LISTED = 20
#: the longest run id the run routes take (the envelope's tag limit)
MAX_RUN_ID = 256
#: most steps one run answer lists
MAX_RUN_STEPS = 5000


def decompress(body: bytes, limit: int) -> bytes:
    """A gzip body decompressed, refused (413) as soon as it grows past ``limit`` bytes, so a
    small bomb never becomes a large buffer; several gzip members are read one after the other.

    >>> import gzip
    >>> decompress(gzip.compress(b"abc"), 10)
    b'abc'
    """
    out: list[bytes] = []
    size = 0
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    data = body
    while True:
        try:
            chunk = d.decompress(data, limit - size + 1)
        except zlib.error as exc:
            raise ApiError(
                400, "the body is not valid gzip", [FieldError("content-encoding", f"gzip: {exc}", "invalid_gzip")]
            ) from None
        size += len(chunk)
        if size > limit:
            raise ApiError(
                413,
                f"the body decompresses to more than {limit} bytes, the limit of an ingest request",
                [FieldError("body", f"over {limit} bytes once decompressed", "too_large")],
            )
        out.append(chunk)
        if d.eof:
            data = d.unused_data
            if not data:
                break
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            continue
        data = d.unconsumed_tail
        if not data and not chunk:
            raise ApiError(
                400,
                "the body is not valid gzip",
                [FieldError("content-encoding", "gzip: the stream ends before its end", "invalid_gzip")],
            )
    return b"".join(out)


# --- the documented shapes ------------------------------------------------------------------------


class PartialSuccess(BaseModel):
    """OTLP's partial success: spans rejected, and a message (a warning when none was rejected)."""

    rejectedSpans: int
    errorMessage: str


class TracesSpanError(BaseModel):
    """One span that could not be stored: its position in the request, ids, and why."""

    index: int
    trace_id: str
    span_id: str
    errors: list[dict[str, str]]


class TracesSummary(BaseModel):
    """What shapewatch made of the spans (JSON answers only)."""

    spans: int
    accepted: int
    duplicate: int
    rejected: int
    rejected_spans: int
    skipped_by_reason: dict[str, int]
    #: the run steps of this request now stored (a retry's steps are stored once)
    run_steps: int
    errors: list[TracesSpanError]
    errors_omitted: int


class TracesReply(BaseModel):
    """An ``ExportTraceServiceResponse`` (in the request's encoding); in JSON, with ``shapewatch``."""

    model_config = ConfigDict(extra="allow")

    partialSuccess: PartialSuccess | None = None
    shapewatch: TracesSummary | None = None


class RunStepOut(BaseModel):
    """One step of a run, in order."""

    position: int
    ts: datetime
    kind: str
    tool: str | None
    args_hash: str | None
    contract: str
    contract_version: str | None
    model: str | None
    served_model: str | None
    finish_reason: str | None
    agent_release: str | None
    source: str | None
    event_id: str | None
    trace_id: str
    span_id: str


class RunReply(BaseModel):
    """One agent run: when, how many steps, the contract versions and releases it used, its steps."""

    run_id: str
    first_ts: datetime
    last_ts: datetime
    last_received: datetime
    judged_at: datetime | None
    steps: int
    tool_calls: int
    agent_releases: list[str]
    contract_versions: dict[str, list[str]]
    events: list[RunStepOut]
    events_omitted: int


class RunEntry(BaseModel):
    """A run in the list of recent runs."""

    run_id: str
    first_ts: datetime
    last_ts: datetime
    last_received: datetime
    steps: int
    judged_at: datetime | None


# --- POST /v1/traces ------------------------------------------------------------------------------


#: The OTLP receiver: a token with the ingest scope.
traces_router = APIRouter(
    tags=["ingest"],
    route_class=guarded_route(Scope.ingest),
    dependencies=[Security(bearer)],
    responses=error_responses(*AUTH_ERRORS, *COMMON_ERRORS),
    generate_unique_id_function=operation_id,
)


def _traces_kind(request: Request) -> tuple[bool, bool]:
    """(protobuf?, gzip?) of a request; 415 for another content type or encoding."""
    encoding = request.headers.get("content-encoding", "").strip().lower()
    if encoding not in ("", "identity", "gzip"):
        raise ApiError(
            415,
            f"content encoding {encoding!r} is not supported; send gzip or an uncompressed body",
            [FieldError("content-encoding", "unsupported encoding")],
        )
    ctype, *params = request.headers.get("content-type", "").split(";")
    ctype = ctype.strip().lower()
    if ctype == _JSON:
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in ("utf-8", "utf8"):
                raise ApiError(415, "send OTLP JSON as UTF-8", [FieldError("content-type", "unsupported charset")])
    elif ctype != _PROTOBUF:
        raise ApiError(
            415,
            f"content type {ctype or '(none)'!r} is not supported; send OTLP as application/x-protobuf "
            "or application/json",
            [FieldError("content-type", "unsupported media type")],
        )
    return ctype == _PROTOBUF, encoding == "gzip"


class RunStepWriter:
    """Group commit for run steps: the steps of requests that arrive while a commit is under way
    are written together in the next one (one transaction each, not one per request: a commit
    per 512-span request held OTLP ingest to a seventh of /v1/outputs' events/s).

    >>> writer = RunStepWriter(store)                           # doctest: +SKIP
    >>> new = await asyncio.wrap_future(writer.submit(steps))   # doctest: +SKIP
    """

    def __init__(self, store: StoreBackend) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._queued: list[tuple[list[RunStep], Future[int]]] = []
        self._busy = False

    def submit(self, steps: list[RunStep]) -> Future[int]:
        """The steps queued; the future gives their number once their transaction committed."""
        done: Future[int] = Future()
        with self._lock:
            self._queued.append((steps, done))
            if self._busy:
                return done
            self._busy = True
        threading.Thread(target=self._drain, name="run-steps", daemon=True).start()
        return done

    def _drain(self) -> None:
        while True:
            with self._lock:
                batch, self._queued = self._queued, []
                if not batch:
                    self._busy = False
                    return
            try:
                self._write(batch)
            except BaseException as exc:  # every waiting request hears of it; the thread goes on
                for _, done in batch:
                    done.set_exception(exc)

    def _write(self, batch: list[tuple[list[RunStep], Future[int]]]) -> None:
        everything = [s for steps, _ in batch for s in steps]
        self.store.record_run_steps(everything)
        for steps, done in batch:
            done.set_result(len(steps))


def _step_writer(request: Request, store: StoreBackend) -> RunStepWriter:
    writer = getattr(request.app.state, "run_step_writer", None)
    if not isinstance(writer, RunStepWriter) or writer.store is not store:
        writer = RunStepWriter(store)
        request.app.state.run_step_writer = writer
    return writer


def _mapping(request: Request) -> OtlpMapping:
    mapping = getattr(request.app.state, "otlp_mapping", None)
    return mapping if isinstance(mapping, OtlpMapping) else OtlpMapping()


def _span_error(err: SpanError) -> dict[str, Any]:
    return {
        "index": err.index,
        "trace_id": err.trace_id,
        "span_id": err.span_id,
        "errors": [{"path": f.path, "reason": f.reason} for f in err.fields],
    }


def _message(errors: list[SpanError], skipped: Counter[str]) -> str:
    said = []
    if errors:
        first = "; ".join(
            f"span {e.index} ({e.span_id or '?'}): " + ", ".join(f"{f.path} {f.reason}" for f in e.fields)
            for e in errors[:3]
        )
        said.append(f"{len(errors)} spans rejected: {first}" + ("; ..." if len(errors) > 3 else ""))
    if skipped:
        said.append(
            "spans skipped, counted, not stored: " + ", ".join(f"{n} {reason}" for reason, n in sorted(skipped.items()))
        )
    return ". ".join(said)


@traces_router.post(
    "/v1/traces",
    summary="Ingest OpenTelemetry traces (OTLP/HTTP) of GenAI spans",
    description="An OTLP ExportTraceServiceRequest, application/x-protobuf or application/json, "
    "optionally Content-Encoding: gzip. Inference spans' structured outputs and tool calls become "
    "events (one per output, event_id from trace, span and part, so an exporter's retry is stored "
    "once); execute_tool spans become run steps; spans without output content are counted by reason. "
    "Answers an ExportTraceServiceResponse in the request's encoding, with partial_success naming "
    "rejected spans. A protobuf request refused as a whole (400, 413) is answered with a "
    "google.rpc.Status in protobuf; other refusals use the shared JSON error shape.",
    responses={
        200: {
            "model": TracesReply,
            "description": "Stored; partial_success names the rejected spans and the skipped ones",
            "content": {_PROTOBUF: {"schema": {"type": "string", "format": "binary"}}},
        },
        **error_responses(400, 415),
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                _PROTOBUF: {"schema": {"type": "string", "format": "binary"}},
                _JSON: {"schema": {"type": "object", "description": "OTLP JSON: {resourceSpans: [...]}"}},
            },
        }
    },
)
async def ingest_traces(request: Request, api: Collector) -> Response:
    protobuf, gzipped = _traces_kind(request)
    if not protobuf:
        return await _ingest(request, api, protobuf=False, gzipped=gzipped)
    try:
        return await _ingest(request, api, protobuf=True, gzipped=gzipped)
    except ShapewatchError as exc:
        # OTLP/HTTP answers a refused protobuf request with a google.rpc.Status in protobuf; the
        # service's own failures (5xx, with Retry-After) keep the shared JSON shape.
        status = int(getattr(exc, "status", 500))
        if not 400 <= status < 500:
            raise
        fields = getattr(exc, "fields", None) or []
        said = "; ".join(f"{f.path}: {f.reason}" for f in fields if isinstance(f, FieldError))
        return Response(
            status_pb(_GRPC_CODES.get(status, 3), f"{exc}" + (f" ({said})" if said else "")),
            status_code=status,
            media_type=_PROTOBUF,
        )


#: HTTP status -> google.rpc.Code of the Status a refused protobuf request gets
_GRPC_CODES = {400: 3, 404: 5, 409: 6, 413: 8, 422: 3}


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def status_pb(code: int, message: str) -> bytes:
    r"""A ``google.rpc.Status`` (code = field 1, message = field 2) in protobuf, encoded here: two
    fields do not need the googleapis package in the service.

    >>> status_pb(3, "no")
    b'\x08\x03\x12\x02no'
    """
    text = message[:4000].encode()
    return b"\x08" + _varint(code) + b"\x12" + _varint(len(text)) + text


async def _ingest(request: Request, api: CollectorApi, *, protobuf: bool, gzipped: bool) -> Response:
    t0 = time.perf_counter()
    mapping = _mapping(request)
    now = datetime.now(UTC)
    async with api._body(request) as raw:

        def work() -> tuple[SpansMapped, list[Envelope | EnvelopeInvalid], Future[list[WriteResult]] | None]:
            body = decompress(raw, api.max_body_bytes) if gzipped else raw
            spans = decode_protobuf(body) if protobuf else decode_json(body)
            mapped = map_spans(spans, mapping)
            if len(mapped.envelopes) > api.max_request_events:
                raise BatchTooLarge(len(mapped.envelopes), api.max_request_events)
            items: list[Envelope | EnvelopeInvalid] = []
            for env in mapped.envelopes:
                try:
                    items.append(validate_envelope(env, api.limits, now=now))
                except EnvelopeInvalid as exc:
                    exc.__traceback__ = None
                    items.append(exc)
            valid = [e for e in items if isinstance(e, Envelope)]
            return mapped, items, api.writer.submit(valid) if valid else None

        # A gzipped body may be many times its size once read: parsed with the large ones.
        async with api._parsing(len(raw) * (64 if gzipped else 1)):
            mapped, items, submitted = await asyncio.to_thread(work)
    results = await asyncio.wrap_future(submitted) if submitted is not None else []
    by_pos = iter(results)
    counts = {"accepted": 0, "duplicate": 0, "rejected": 0}
    errors: dict[int, SpanError] = {e.index: e for e in mapped.errors}
    steps = list(mapped.extra_steps)
    stored: Counter[tuple[str, str, str]] = Counter()
    for item, step, span_index in zip(items, mapped.steps, mapped.span_of, strict=True):
        problem: tuple[FieldError, ...] = ()
        if isinstance(item, EnvelopeInvalid):
            problem = tuple(item.fields)
            api.metrics.count_rejected({f.code for f in item.fields})
        else:
            res = next(by_pos)
            if res.status is WriteStatus.conflict:
                problem = (FieldError("event_id", f"{item.event_id} is stored with a different payload", "conflict"),)
                api.metrics.count_rejected({"conflict"})
            else:
                counts[res.status.value] += 1
                stored[(res.status.value, item.model, item.prompt_version)] += 1
                steps.append(step)
        if problem:
            counts["rejected"] += 1
            prior = errors.get(span_index)
            errors[span_index] = SpanError(
                span_index,
                step.trace_id,
                step.span_id,
                (*(prior.fields if prior else ()), *problem),
            )
    for (outcome, model, prompt_version), n in stored.items():
        api.metrics.count_events(outcome, model, prompt_version, n)
    new_steps = await asyncio.wrap_future(_step_writer(request, api.store).submit(steps)) if steps else 0
    span_errors = sorted(errors.values(), key=lambda e: e.index)
    mapped_spans = mapped.spans - len(span_errors) - sum(mapped.skipped.values())
    api.metrics.otlp_spans.labels("mapped").inc(max(mapped_spans, 0))
    if span_errors:
        api.metrics.otlp_spans.labels("error").inc(len(span_errors))
    for reason, n in mapped.skipped.items():
        api.metrics.otlp_spans.labels(reason).inc(n)
    message = _message(span_errors, mapped.skipped)
    api.metrics.request_seconds.labels("traces").observe(time.perf_counter() - t0)
    if protobuf:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

        reply = ExportTraceServiceResponse()
        if message:
            reply.partial_success.rejected_spans = len(span_errors)
            reply.partial_success.error_message = message
        return Response(reply.SerializeToString(), media_type=_PROTOBUF)
    body: dict[str, Any] = {}
    if message:
        body["partialSuccess"] = {"rejectedSpans": len(span_errors), "errorMessage": message}
    body["shapewatch"] = {
        "spans": mapped.spans,
        **counts,
        "rejected_spans": len(span_errors),
        "skipped_by_reason": dict(sorted(mapped.skipped.items())),
        "run_steps": new_steps,
        "errors": [_span_error(e) for e in span_errors[:_ERRORS_LISTED]],
        "errors_omitted": max(len(span_errors) - _ERRORS_LISTED, 0),
    }
    return json_response(body)


# --- the run view -------------------------------------------------------------------------------


#: Runs, read with a token of the read scope.
runs_router = APIRouter(
    tags=["runs"],
    route_class=guarded_route(Scope.read),
    dependencies=[Security(bearer)],
    responses=error_responses(*AUTH_ERRORS, *COMMON_ERRORS),
    generate_unique_id_function=operation_id,
)

RunId = Annotated[
    str, Path(min_length=1, max_length=MAX_RUN_ID, description="The run's id (a trace id, or gen_ai.conversation.id)")
]


@runs_router.get("/v1/runs", summary="Recent agent runs, newest first", response_model=list[RunEntry])
async def list_runs(api: Collector, limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> Response:
    rows = await asyncio.to_thread(api.store.recent_runs, limit)
    return json_response([r._asdict() for r in rows])


@runs_router.get(
    "/v1/runs/{run_id}",
    summary="One agent run, its steps in order",
    response_model=RunReply,
    responses=error_responses(404),
)
async def get_run(api: Collector, run_id: RunId) -> Response:
    view = await asyncio.to_thread(run_view, api.store, run_id)
    if view is None:
        raise RunNotFound(run_id)
    return json_response(view)


class RunNotFound(ShapewatchError, LookupError):
    """No run of that id is stored (404)."""

    status = 404

    def __init__(self, run_id: str) -> None:
        self.fields = [FieldError("run_id", "unknown run", "not_found")]
        super().__init__(f"no run {run_id[:300]!r} is stored")


def run_view(store: StoreBackend, run_id: str, limit: int = MAX_RUN_STEPS) -> dict[str, Any] | None:
    """One run as ``GET /v1/runs/{run_id}`` and ``shapewatch run show`` give it (``RunReply``), or None."""
    run = store.run(run_id)
    if run is None:
        return None
    steps = store.run_steps(run_id, limit)
    versions: dict[str, set[str]] = {}
    for s in steps:
        if s.contract_version is not None:
            versions.setdefault(s.contract, set()).add(s.contract_version)
    return {
        **run._asdict(),
        "tool_calls": sum(1 for s in steps if s.kind == "tool_call"),
        "agent_releases": sorted({s.agent_release for s in steps if s.agent_release is not None}),
        "contract_versions": {c: sorted(v) for c, v in sorted(versions.items())},
        "events": [
            {
                "position": i,
                "ts": s.ts,
                "kind": s.kind,
                "tool": s.tool,
                "args_hash": s.args_hash,
                "contract": s.contract,
                "contract_version": s.contract_version,
                "model": s.model,
                "served_model": s.served_model,
                "finish_reason": s.finish_reason,
                "agent_release": s.agent_release,
                "source": s.source,
                "event_id": s.event_id,
                "trace_id": s.trace_id,
                "span_id": s.span_id,
            }
            for i, s in enumerate(steps)
        ],
        "events_omitted": max(run.steps - len(steps), 0),
    }
