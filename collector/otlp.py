"""OpenTelemetry traces (OTLP) to envelopes: the one place that knows the GenAI span conventions.

``POST /v1/traces`` (collector/traces.py) hands this module the request body, decoded from
OTLP protobuf (``decode_protobuf``) or OTLP JSON (``decode_json``) into ``OtlpSpan`` values,
and ``map_spans`` turns them into what the collector stores:

- an **inference span** (``gen_ai.operation.name`` ``chat``, ``generate_content``,
  ``text_completion``; OpenInference's ``openinference.span.kind = LLM``) gives one envelope per
  structured output: a text part of ``gen_ai.output.messages`` that parses as a JSON object
  (contract: the configured contract attribute), and each ``tool_call`` part (contract: the tool
  name, output: its arguments). The older per-index attributes (``gen_ai.completion.0.content``,
  ``gen_ai.completion.0.tool_calls.0.name``), ``gen_ai.choice`` span events and OpenInference's
  ``llm.output_messages.*`` are read the same way. ``model`` is ``gen_ai.request.model``,
  ``served_model`` ``gen_ai.response.model``, ``finish_reason`` the message's or
  ``gen_ai.response.finish_reasons``;
- an ``execute_tool`` span (OpenInference: ``TOOL``) is a step of its run, with no envelope;
- ``run_id`` is ``gen_ai.conversation.id`` (OpenInference: ``session.id``) or else the trace id;
  ``agent_release``, ``prompt_version``, ``contract``, ``contract_version`` and ``source`` come
  from configured attributes (``OtlpMapping``), looked up on the span, then on its resource;
- ``event_id`` is ``otlp:<trace id>:<span id>:<part>``: an exporter that retries the same spans
  sends the same ids, and the store keeps each event once; ``ts`` is the span's end.

A span that carries no output at all (content capture is off by default in most
instrumentations) and a span that is not a GenAI span are **skipped and counted by reason**
(``SkipReason``); a span that cannot be mapped (no model, an invalid id, a value nested too
deeply) is a **span error**, which the route reports as OTLP's partial success.

Everything here is pure: no I/O, no clock. The same spans mapped twice give equal results.

>>> spans = decode_json(b'{"resourceSpans": []}')
>>> map_spans(spans, OtlpMapping()).envelopes
[]
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from .envelope import loads_marking
from .errors import FieldError, ShapewatchError

__all__ = [
    "INFERENCE_OPERATIONS",
    "MAX_INPUT_CHARS",
    "MAX_SPANS",
    "MAX_VALUE_DEPTH",
    "OtlpDecodeError",
    "OtlpMapping",
    "OtlpSpan",
    "RunStep",
    "SkipReason",
    "SpanError",
    "SpansMapped",
    "StepKind",
    "TooManySpans",
    "arguments_hash",
    "decode_json",
    "decode_protobuf",
    "map_spans",
]

#: ``gen_ai.operation.name`` values whose spans carry a model's answer.
INFERENCE_OPERATIONS = frozenset({"chat", "generate_content", "text_completion", "completion"})
_TOOL_OPERATIONS = frozenset({"execute_tool"})
#: Most spans one request may hold (413 beyond): SDKs send 512 per export and the OpenTelemetry
#: Collector's batch processor 8,192; decoding 400,000 empty spans took 3.4 s and 240 MB.
MAX_SPANS = 50_000
#: The longest input a run step keeps (JSON text of the messages); longer inputs are not kept.
MAX_INPUT_CHARS = 64_000
#: How deep an attribute value (arrays and key-value lists inside each other) may nest. OTLP
#: attributes are flat maps in practice; a deeper one is an error of its span, not a recursion.
MAX_VALUE_DEPTH = 32
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_HEX = re.compile(r"[0-9a-f]*")
_FENCE = re.compile(r"\A\s*```[ \t]*(?:json)?[ \t]*\r?\n(?P<body>.*?)\r?\n?[ \t]*```\s*\Z", re.S | re.I)


class OtlpDecodeError(ShapewatchError, ValueError):
    """The body is not an OTLP trace export in the encoding it claims: 400, naming where.

    >>> OtlpDecodeError("resourceSpans[0]", "must be an object, got string").fields[0].path
    'resourceSpans[0]'
    """

    status = 400

    def __init__(self, path: str, reason: str) -> None:
        self.fields = [FieldError(path, reason, "invalid_otlp")]
        super().__init__(f"not an OTLP trace export: {path}: {reason}")


class TooManySpans(ShapewatchError, ValueError):
    """A request with more spans than ``MAX_SPANS`` (413): send smaller batches."""

    status = 413

    def __init__(self, spans: int, limit: int) -> None:
        self.fields = [FieldError("body", f"{spans} spans; at most {limit} per request", "too_large")]
        super().__init__(
            f"the request holds {spans} spans, more than the {limit} one request may hold; send smaller batches"
        )


class SkipReason(str, enum.Enum):
    """Why a span gave no envelope and is no error: counted and reported, never dropped unseen."""

    #: an inference span with no output content (the instrumentation's content capture is off)
    content_not_captured = "content_not_captured"
    #: output content with no JSON object and no tool call in it (prose)
    no_structured_output = "no_structured_output"
    #: a GenAI span of another operation (embeddings, invoke_agent, create_agent, ...)
    operation_not_mapped = "operation_not_mapped"
    #: not a GenAI span at all (an HTTP client span, a database span)
    not_genai = "not_genai"


class StepKind(str, enum.Enum):
    """What a step of an agent run is."""

    #: a structured output (a JSON object the model wrote)
    output = "output"
    #: a tool call the model decided on (a ``tool_call`` part)
    tool_call = "tool_call"
    #: a tool that ran (an ``execute_tool`` span), arguments only when the span holds them
    tool_execution = "tool_execution"


@dataclass(frozen=True)
class OtlpSpan:
    """One span as decoded from either encoding; ids in lowercase hex, times in Unix nanoseconds."""

    trace_id: str
    span_id: str
    name: str
    start_ns: int
    end_ns: int
    attributes: Mapping[str, Any]
    resource: Mapping[str, Any]
    #: (name, time in ns, attributes) of each span event
    events: tuple[tuple[str, int, Mapping[str, Any]], ...] = ()
    #: its position in the request, for a span error's path
    index: int = 0
    #: set when decoding found the span unusable (an invalid id, a value nested too deeply)
    problem: FieldError | None = None


@dataclass(frozen=True)
class OtlpMapping:
    """Which attributes name what an envelope needs that GenAI conventions do not say.

    Each ``*_attribute`` is looked up on the span, then on its resource. Defaults:

    >>> m = OtlpMapping()
    >>> m.prompt_version_attribute, m.default_prompt_version, m.agent_release_attribute
    ('shapewatch.prompt_version', 'unversioned', 'service.version')
    """

    prompt_version_attribute: str = "shapewatch.prompt_version"
    default_prompt_version: str = "unversioned"
    contract_attribute: str = "shapewatch.contract"
    default_contract: str = "default"
    contract_version_attribute: str = "shapewatch.contract_version"
    agent_release_attribute: str = "service.version"
    source_attribute: str = "shapewatch.source"


@dataclass(frozen=True)
class RunStep:
    """One step of an agent run, in the order the run took it (``ts``, then ``position``).

    ``key`` names it for deduplication (an exporter's retry brings the same key); ``event_id``
    is the envelope it became (None for a tool execution); ``args_hash`` the SHA-256 of the
    arguments' canonical JSON (keys sorted), which tells an identical call from another.
    """

    key: str
    run_id: str
    ts: datetime
    position: int
    kind: StepKind
    trace_id: str
    span_id: str
    model: str | None
    served_model: str | None
    prompt_version: str
    contract: str
    contract_version: str | None
    tool: str | None
    args_hash: str | None
    finish_reason: str | None
    agent_release: str | None
    source: str | None
    event_id: str | None
    #: the contract the span's structured outputs answer (its tools are the run's declared ones)
    run_contract: str
    #: the messages the model was given (``gen_ai.input.messages`` as JSON text), on the first step
    #: of each inference span when the instrumentation captured them and they fit MAX_INPUT_CHARS
    input_messages: str | None = None


@dataclass(frozen=True)
class SpanError:
    """A span that could not be mapped: which (position, ids) and why (field errors)."""

    index: int
    trace_id: str
    span_id: str
    fields: tuple[FieldError, ...]


@dataclass
class SpansMapped:
    """What a request's spans became: envelope dicts (not yet validated), each with its run step
    (``steps[i]`` belongs to ``envelopes[i]``, ``extra_steps`` have no envelope), span errors, and
    the skipped spans counted by reason."""

    envelopes: list[dict[str, Any]] = field(default_factory=list)
    steps: list[RunStep] = field(default_factory=list)
    extra_steps: list[RunStep] = field(default_factory=list)
    errors: list[SpanError] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)
    #: the span each envelope came from (its index in the request), parallel to ``envelopes``
    span_of: list[int] = field(default_factory=list)
    spans: int = 0


def arguments_hash(arguments: Any) -> str:
    """The identity of a tool call's arguments: SHA-256 of their JSON with keys sorted.

    >>> arguments_hash({"b": 1, "a": 2}) == arguments_hash({"a": 2, "b": 1})
    True
    """
    return hashlib.sha256(orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS)).hexdigest()


# --- decoding ---------------------------------------------------------------------------------


class _TooDeep(Exception):
    pass


def _ts(ns: int) -> datetime:
    return _EPOCH + timedelta(microseconds=ns // 1000)


def decode_protobuf(body: bytes) -> list[OtlpSpan]:
    """The spans of an ``ExportTraceServiceRequest`` in protobuf; ``OtlpDecodeError`` when the
    bytes are not one (protobuf's runtime refuses truncated input and nesting past 100 levels)."""
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(body)
    except (DecodeError, RecursionError, ValueError) as exc:
        raise OtlpDecodeError("body", f"not an ExportTraceServiceRequest in protobuf: {exc}") from None
    total = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
    if total > MAX_SPANS:
        raise TooManySpans(total, MAX_SPANS)
    spans: list[OtlpSpan] = []
    for rs in request.resource_spans:
        resource = _pb_attributes(rs.resource.attributes)
        for ss in rs.scope_spans:
            for sp in ss.spans:
                index = len(spans)
                problem = None
                try:
                    attrs = _pb_attributes(sp.attributes)
                    events = tuple((e.name, int(e.time_unix_nano), _pb_attributes(e.attributes)) for e in sp.events)
                except _TooDeep:
                    attrs, events = {}, ()
                    problem = FieldError("attributes", f"nested more than {MAX_VALUE_DEPTH} levels deep", "too_deep")
                trace_id, span_id = sp.trace_id.hex(), sp.span_id.hex()
                problem = problem or _id_problem(trace_id, span_id)
                spans.append(
                    OtlpSpan(
                        trace_id=trace_id,
                        span_id=span_id,
                        name=sp.name,
                        start_ns=int(sp.start_time_unix_nano),
                        end_ns=int(sp.end_time_unix_nano),
                        attributes=attrs,
                        resource=resource,
                        events=events,
                        index=index,
                        problem=problem,
                    )
                )
    return spans


def _pb_attributes(kvs: Iterable[Any]) -> dict[str, Any]:
    return {kv.key: _pb_value(kv.value, 0) for kv in kvs}


def _pb_value(v: Any, depth: int) -> Any:
    if depth > MAX_VALUE_DEPTH:
        raise _TooDeep
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_pb_value(x, depth + 1) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _pb_value(kv.value, depth + 1) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return bytes(v.bytes_value).hex()
    return getattr(v, kind)


def _id_problem(trace_id: str, span_id: str) -> FieldError | None:
    if len(trace_id) != 32 or trace_id == "0" * 32:
        return FieldError("traceId", "must be 16 bytes and not all zero", "invalid_id")
    if len(span_id) != 16 or span_id == "0" * 16:
        return FieldError("spanId", "must be 8 bytes and not all zero", "invalid_id")
    return None


def decode_json(body: bytes) -> list[OtlpSpan]:
    """The spans of an ``ExportTraceServiceRequest`` in OTLP JSON (field names in lowerCamelCase,
    or as in the proto; ids in hex; 64-bit integers as strings or numbers; unknown fields
    ignored, as the specification asks); ``OtlpDecodeError`` names what is wrong."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise OtlpDecodeError("body", f"not valid JSON: {exc}") from None
    root = _obj(doc, "$")
    total = 0  # counted before anything is built; the pass below names what is malformed
    for rs in _list(root, "resourceSpans"):
        for ss in _list(rs, "scopeSpans"):
            total += len(_list(ss, "spans"))
    if total > MAX_SPANS:
        raise TooManySpans(total, MAX_SPANS)
    spans: list[OtlpSpan] = []
    for i, rs in enumerate(_arr(root, "resourceSpans", "$")):
        where = f"resourceSpans[{i}]"
        rs = _obj(rs, where)
        res = _get(rs, "resource")
        res_where = f"{where}.resource"
        try:
            resource = _json_attributes(_obj(res, res_where) if res is not None else {}, res_where)
        except _TooDeep:
            raise OtlpDecodeError(res_where, f"attributes nested more than {MAX_VALUE_DEPTH} levels deep") from None
        for j, ss in enumerate(_arr(rs, "scopeSpans", where)):
            ss_where = f"{where}.scopeSpans[{j}]"
            ss = _obj(ss, ss_where)
            for k, sp in enumerate(_arr(ss, "spans", ss_where)):
                sp_where = f"{ss_where}.spans[{k}]"
                sp = _obj(sp, sp_where)
                spans.append(_json_span(sp, sp_where, resource, len(spans)))
    return spans


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _get(obj: dict[str, Any], name: str) -> Any:
    value = obj.get(name)
    return obj.get(_snake(name)) if value is None else value


def _list(obj: Any, name: str) -> list[Any]:
    v = _get(obj, name) if isinstance(obj, dict) else None
    return v if isinstance(v, list) else []


def _obj(v: Any, where: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise OtlpDecodeError(where, f"must be an object, got {_jtype(v)}")
    return v


def _arr(obj: dict[str, Any], name: str, where: str) -> list[Any]:
    v = _get(obj, name)
    if v is None:
        return []
    if not isinstance(v, list):
        raise OtlpDecodeError(f"{where}.{name}", f"must be an array, got {_jtype(v)}")
    return v


def _jtype(v: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(v), "number")


def _json_span(sp: dict[str, Any], where: str, resource: dict[str, Any], index: int) -> OtlpSpan:
    problem: FieldError | None = None
    trace_id = _get(sp, "traceId")
    span_id = _get(sp, "spanId")
    trace_id = trace_id.lower() if isinstance(trace_id, str) and _HEX.fullmatch(trace_id.lower()) else ""
    span_id = span_id.lower() if isinstance(span_id, str) and _HEX.fullmatch(span_id.lower()) else ""
    problem = _id_problem(trace_id, span_id)
    times: list[int] = []
    for name in ("startTimeUnixNano", "endTimeUnixNano"):
        raw = _get(sp, name)
        value = 0 if raw is None else _nanos(raw)  # proto3 JSON leaves out fields at their default
        if value is None:
            problem = problem or FieldError(
                name, f"must be an unsigned 64-bit integer, got {str(raw)[:40]!r}", "invalid_time"
            )
            value = 0
        times.append(value)
    name = _get(sp, "name")
    attrs: dict[str, Any] = {}
    events: list[tuple[str, int, Mapping[str, Any]]] = []
    try:
        attrs = _json_attributes(sp, where)
        for n, ev in enumerate(_arr(sp, "events", where)):
            ev = _obj(ev, f"{where}.events[{n}]")
            events.append(
                (
                    str(_get(ev, "name") or ""),
                    _nanos(_get(ev, "timeUnixNano")) or 0,
                    _json_attributes(ev, f"{where}.events[{n}]"),
                )
            )
    except _TooDeep:
        problem = problem or FieldError("attributes", f"nested more than {MAX_VALUE_DEPTH} levels deep", "too_deep")
    except OtlpDecodeError as exc:  # one span's malformed attributes are its own error
        problem = problem or exc.fields[0]
    return OtlpSpan(
        trace_id=trace_id,
        span_id=span_id,
        name=name if isinstance(name, str) else "",
        start_ns=times[0],
        end_ns=times[1],
        attributes=attrs,
        resource=resource,
        events=tuple(events),
        index=index,
        problem=problem,
    )


def _nanos(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v if 0 <= v < 2**64 else None
    if isinstance(v, str) and v.isdigit() and len(v) <= 20:
        n = int(v)
        return n if n < 2**64 else None
    return None


def _json_attributes(holder: dict[str, Any], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n, kv in enumerate(_arr(holder, "attributes", where)):
        kv = _obj(kv, f"{where}.attributes[{n}]")
        key = kv.get("key")
        if not isinstance(key, str):
            raise OtlpDecodeError(f"{where}.attributes[{n}].key", f"must be a string, got {_jtype(key)}")
        out[key] = _json_value(kv.get("value"), 0)
    return out


def _json_value(v: Any, depth: int) -> Any:
    if depth > MAX_VALUE_DEPTH:
        raise _TooDeep
    if not isinstance(v, dict):
        return None
    for name, value in v.items():
        if name in ("stringValue", "string_value", "boolValue", "bool_value", "doubleValue", "double_value"):
            return value
        if name in ("intValue", "int_value"):
            if isinstance(value, str) and re.fullmatch(r"-?\d{1,20}", value):
                return int(value)
            return value if isinstance(value, int) else None
        if name in ("arrayValue", "array_value"):
            items = value.get("values") if isinstance(value, dict) else None
            return [_json_value(x, depth + 1) for x in items] if isinstance(items, list) else []
        if name in ("kvlistValue", "kvlist_value"):
            items = value.get("values") if isinstance(value, dict) else None
            if not isinstance(items, list):
                return {}
            return {
                kv["key"]: _json_value(kv.get("value"), depth + 1)
                for kv in items
                if isinstance(kv, dict) and isinstance(kv.get("key"), str)
            }
        if name in ("bytesValue", "bytes_value"):
            return value if isinstance(value, str) else None
    return None


# --- mapping ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Part:
    """One output part of a message: JSON text to try, or a tool call with its arguments."""

    finish_reason: str | None
    text: str | None = None
    tool: str | None = None
    arguments: Any = None


def map_spans(spans: Iterable[OtlpSpan], mapping: OtlpMapping) -> SpansMapped:
    """Map decoded spans to envelopes, run steps, span errors and skip counts (module docstring)."""
    out = SpansMapped()
    for span in spans:
        out.spans += 1
        if span.problem is not None:
            out.errors.append(SpanError(span.index, span.trace_id, span.span_id, (span.problem,)))
            continue
        try:
            _map_span(span, mapping, out)
        except _SpanInvalid as exc:
            out.errors.append(SpanError(span.index, span.trace_id, span.span_id, (exc.field,)))
    return out


class _SpanInvalid(Exception):
    def __init__(self, path: str, reason: str, code: str = "invalid_value") -> None:
        self.field = FieldError(path, reason, code)


def _attr(span: OtlpSpan, name: str) -> Any:
    value = span.attributes.get(name)
    return span.resource.get(name) if value is None else value


def _str_attr(span: OtlpSpan, name: str) -> str | None:
    value = _attr(span, name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise _SpanInvalid(name, f"must be a string, got {_jtype(value)}")
    return str(value)


def _operation(span: OtlpSpan) -> str | None:
    op = span.attributes.get("gen_ai.operation.name")
    if isinstance(op, str):
        return op
    kind = span.attributes.get("openinference.span.kind")
    if isinstance(kind, str):
        return {"LLM": "chat", "TOOL": "execute_tool"}.get(kind.upper(), kind.lower())
    request_type = span.attributes.get("llm.request.type")  # OpenLLMetry before gen_ai.operation.name
    if isinstance(request_type, str):
        return request_type
    if any(k.startswith(("gen_ai.request.", "gen_ai.response.", "gen_ai.completion.")) for k in span.attributes):
        return "chat"
    return None


def _map_span(span: OtlpSpan, m: OtlpMapping, out: SpansMapped) -> None:
    op = _operation(span)
    if op is None:
        out.skipped[SkipReason.not_genai.value] += 1
        return
    if op not in INFERENCE_OPERATIONS and op not in _TOOL_OPERATIONS:
        out.skipped[SkipReason.operation_not_mapped.value] += 1
        return
    run_id = _str_attr(span, "gen_ai.conversation.id") or _str_attr(span, "session.id") or span.trace_id
    ts = _ts(span.end_ns)
    prompt_version = _str_attr(span, m.prompt_version_attribute) or m.default_prompt_version
    contract_version = _str_attr(span, m.contract_version_attribute)
    agent_release = _str_attr(span, m.agent_release_attribute)
    source = _str_attr(span, m.source_attribute)
    tags = {
        "prompt_version": prompt_version,
        "contract_version": contract_version,
        "agent_release": agent_release,
        "source": source,
    }
    contract = _str_attr(span, m.contract_attribute) or m.default_contract
    if op in _TOOL_OPERATIONS:
        tool = _str_attr(span, "gen_ai.tool.name") or _str_attr(span, "tool.name")
        if tool is None:
            raise _SpanInvalid("gen_ai.tool.name", "missing: an execute_tool span names its tool")
        args = _parsed(_attr(span, "gen_ai.tool.call.arguments") or _attr(span, "tool.parameters"))
        out.extra_steps.append(
            RunStep(
                key=f"otlp:{span.trace_id}:{span.span_id}:tool",
                run_id=run_id,
                ts=ts,
                position=0,
                kind=StepKind.tool_execution,
                trace_id=span.trace_id,
                span_id=span.span_id,
                model=None,
                served_model=None,
                contract=tool,
                tool=tool,
                args_hash=arguments_hash(args) if isinstance(args, dict) else None,
                finish_reason=None,
                event_id=None,
                run_contract=contract,
                prompt_version=prompt_version,
                contract_version=contract_version,
                agent_release=agent_release,
                source=source,
            )
        )
        return
    model = _str_attr(span, "gen_ai.request.model") or _str_attr(span, "llm.model_name")
    served = _str_attr(span, "gen_ai.response.model") or _str_attr(span, "llm.model_name")
    model = model or served
    if model is None:
        raise _SpanInvalid("gen_ai.request.model", "missing: an inference span names the model it asked")
    finish = _finish_reasons(span)
    parts = list(_parts(span, finish))
    if not parts:
        out.skipped[SkipReason.content_not_captured.value] += 1
        return
    found = 0
    inputs = _input_messages(span)
    for n, part in enumerate(parts):
        if part.tool is not None:
            value, kind, part_contract, tool = part.arguments, StepKind.tool_call, part.tool, part.tool
        else:
            value, kind, part_contract, tool = _json_object(part.text or ""), StepKind.output, contract, None
        if not isinstance(value, dict):
            continue
        found += 1
        event_id = f"otlp:{span.trace_id}:{span.span_id}:{n}"
        env: dict[str, Any] = {
            "event_id": event_id,
            "ts": ts.isoformat(),
            "model": model,
            "contract": part_contract,
            "output": value,
            "run_id": run_id,
        }
        if served is not None:
            env["served_model"] = served
        if part.finish_reason is not None:
            env["finish_reason"] = part.finish_reason
        env.update({k: v for k, v in tags.items() if v is not None})
        out.envelopes.append(env)
        out.span_of.append(span.index)
        out.steps.append(
            RunStep(
                key=event_id,
                run_id=run_id,
                ts=ts,
                position=n,
                kind=kind,
                trace_id=span.trace_id,
                span_id=span.span_id,
                model=model,
                served_model=served,
                contract=part_contract,
                tool=tool,
                args_hash=arguments_hash(value) if kind is StepKind.tool_call else None,
                finish_reason=part.finish_reason,
                event_id=event_id,
                run_contract=contract,
                prompt_version=prompt_version,
                contract_version=contract_version,
                agent_release=agent_release,
                source=source,
                input_messages=inputs if found == 1 else None,
            )
        )
    if not found:
        out.skipped[SkipReason.no_structured_output.value] += 1


def _input_messages(span: OtlpSpan) -> str | None:
    """The span's input messages as JSON text: ``gen_ai.input.messages``, or the older per-index
    ``gen_ai.prompt.<i>.role`` / ``.content``; None when not captured or too long to keep."""
    raw = span.attributes.get("gen_ai.input.messages")
    if isinstance(raw, list):
        raw = orjson.dumps(raw).decode()
    if not isinstance(raw, str):
        messages = []
        for i in _indexed(span.attributes, "gen_ai.prompt."):
            role, content = (
                span.attributes.get(f"gen_ai.prompt.{i}.role"),
                span.attributes.get(f"gen_ai.prompt.{i}.content"),
            )
            if isinstance(content, str):
                messages.append({"role": role if isinstance(role, str) else "user", "content": content})
        raw = orjson.dumps(messages).decode() if messages else None
    return raw if raw is not None and len(raw) <= MAX_INPUT_CHARS else None


def _finish_reasons(span: OtlpSpan) -> list[str]:
    raw = span.attributes.get("gen_ai.response.finish_reasons")
    if isinstance(raw, str):
        raw = [raw]
    return [r for r in raw if isinstance(r, str)] if isinstance(raw, list) else []


def _parsed(value: Any) -> Any:
    """An attribute that holds JSON as text (most instrumentations serialize structured values)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except (ValueError, RecursionError):
            return value
    return value


def _json_object(text: str) -> Any:
    match = _FENCE.match(text)
    text = match.group("body") if match else text
    if not text.lstrip().startswith("{"):
        return None
    try:
        return loads_marking(text)
    except (ValueError, RecursionError):
        return None


def _parts(span: OtlpSpan, finish: list[str]) -> Iterator[_Part]:
    """The output parts of an inference span, from the first convention that has any."""
    for reader in (_semconv_parts, _indexed_parts, _event_parts, _openinference_parts):
        parts = list(reader(span, finish))
        if parts:
            yield from parts
            return


def _reason(i: int, finish: list[str], own: Any) -> str | None:
    if isinstance(own, str):
        return own
    if i < len(finish):
        return finish[i]
    return finish[0] if finish else None


def _semconv_parts(span: OtlpSpan, finish: list[str]) -> Iterator[_Part]:
    messages = _parsed(span.attributes.get("gen_ai.output.messages"))
    if not isinstance(messages, list):
        return
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            continue
        reason = _reason(i, finish, message.get("finish_reason"))
        parts = message.get("parts")
        for part in parts if isinstance(parts, list) else []:
            if not isinstance(part, dict):
                continue
            kind = part.get("type")
            if kind == "text" and isinstance(part.get("content"), str):
                yield _Part(reason, text=part["content"])
            elif kind == "tool_call" and isinstance(part.get("name"), str):
                yield _Part(reason, tool=part["name"], arguments=_parsed(part.get("arguments")))


def _indexed(attrs: Mapping[str, Any], prefix: str) -> list[str]:
    """The indexes ``0``, ``1``... present under ``prefix`` (``gen_ai.completion.``), in order."""
    seen = {
        int(k[len(prefix) :].split(".", 1)[0])
        for k in attrs
        if k.startswith(prefix) and k[len(prefix) :].split(".", 1)[0].isdigit()
    }
    return [str(i) for i in sorted(seen) if i < 10_000]


def _indexed_parts(span: OtlpSpan, finish: list[str]) -> Iterator[_Part]:
    attrs = span.attributes
    for n, i in enumerate(_indexed(attrs, "gen_ai.completion.")):
        base = f"gen_ai.completion.{i}."
        reason = _reason(n, finish, attrs.get(base + "finish_reason"))
        if isinstance(attrs.get(base + "content"), str):
            yield _Part(reason, text=attrs[base + "content"])
        for j in _indexed(attrs, base + "tool_calls."):
            name = attrs.get(f"{base}tool_calls.{j}.name")
            if isinstance(name, str):
                yield _Part(reason, tool=name, arguments=_parsed(attrs.get(f"{base}tool_calls.{j}.arguments")))
        name = attrs.get(base + "function_call.name")
        if isinstance(name, str):
            yield _Part(reason, tool=name, arguments=_parsed(attrs.get(base + "function_call.arguments")))


def _event_parts(span: OtlpSpan, finish: list[str]) -> Iterator[_Part]:
    n = 0
    for name, _, attrs in span.events:
        if name != "gen_ai.choice":
            continue
        message = _parsed(attrs.get("message"))
        if not isinstance(message, dict):
            body = _parsed(attrs.get("gen_ai.event.content") or attrs.get("body"))
            message = body.get("message") if isinstance(body, dict) else None
            own = body.get("finish_reason") if isinstance(body, dict) else None
        else:
            own = attrs.get("finish_reason")
        reason = _reason(n, finish, own)
        n += 1
        if not isinstance(message, dict):
            continue
        if isinstance(message.get("content"), str):
            yield _Part(reason, text=message["content"])
        calls = message.get("tool_calls")
        for call in calls if isinstance(calls, list) else []:
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                yield _Part(reason, tool=fn["name"], arguments=_parsed(fn.get("arguments")))


def _openinference_parts(span: OtlpSpan, finish: list[str]) -> Iterator[_Part]:
    attrs = span.attributes
    messages = _indexed(attrs, "llm.output_messages.")
    for n, i in enumerate(messages):
        base = f"llm.output_messages.{i}.message."
        reason = _reason(n, finish, attrs.get(base + "finish_reason"))
        if isinstance(attrs.get(base + "content"), str):
            yield _Part(reason, text=attrs[base + "content"])
        for j in _indexed(attrs, base + "tool_calls."):
            call = f"{base}tool_calls.{j}.tool_call.function."
            if isinstance(attrs.get(call + "name"), str):
                yield _Part(reason, tool=attrs[call + "name"], arguments=_parsed(attrs.get(call + "arguments")))
