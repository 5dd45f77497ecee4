"""A small agent program instrumented with the real OpenTelemetry SDK, as the GenAI semantic
conventions describe it: an ``invoke_agent`` span around ``chat`` spans (the model's answers:
tool calls and a final structured output in ``gen_ai.output.messages``) and ``execute_tool``
spans. The tests and bench/otlp.py export it with the real OTLP HTTP exporter.

>>> provider, memory = tracer_provider("1.4.0")            # doctest: +SKIP
>>> run_agent(provider.get_tracer("agent"), lookups=["A1", "A2"])  # doctest: +SKIP
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Tracer

MODEL = "gpt-4o"
SERVED = "gpt-4o-2024-08-06"
QUESTION = [{"role": "user", "parts": [{"type": "text", "content": "Is my booking A1 confirmed?"}]}]


def tracer_provider(release: str, *exporters: SpanExporter) -> tuple[TracerProvider, InMemorySpanExporter]:
    """A provider whose resource names the agent's release, exporting to each exporter at span end,
    and to memory (for the same spans sent again, or encoded as OTLP JSON)."""
    provider = TracerProvider(resource=Resource.create({"service.name": "booking-agent", "service.version": release}))
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    for exporter in exporters:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, memory


def _chat(tracer: Tracer, messages: list[dict[str, Any]], finish: str, *, capture: bool = True) -> None:
    with tracer.start_as_current_span(f"chat {MODEL}") as span:
        span.set_attribute("gen_ai.operation.name", "chat")
        span.set_attribute("gen_ai.provider.name", "openai")
        span.set_attribute("gen_ai.request.model", MODEL)
        span.set_attribute("gen_ai.response.model", SERVED)
        span.set_attribute("gen_ai.response.finish_reasons", [finish])
        span.set_attribute("shapewatch.prompt_version", "booking-v2")
        span.set_attribute("shapewatch.contract", "booking")
        span.set_attribute("shapewatch.contract_version", "4")
        if capture:
            span.set_attribute("gen_ai.input.messages", json.dumps(QUESTION))
            span.set_attribute("gen_ai.output.messages", json.dumps(messages))


def run_agent(
    tracer: Tracer, lookups: Sequence[str], *, capture: bool = True, answer: dict[str, Any] | None = None
) -> None:
    """One run: the model asks for ``get_reservation`` once per id in ``lookups`` (one chat turn
    each, the tool run after it), then answers with a structured output."""
    with tracer.start_as_current_span("invoke_agent booking") as root:
        root.set_attribute("gen_ai.operation.name", "invoke_agent")
        for i, rid in enumerate(lookups):
            call = {"type": "tool_call", "id": f"call_{i}", "name": "get_reservation", "arguments": {"id": rid}}
            _chat(
                tracer,
                [{"role": "assistant", "parts": [call], "finish_reason": "tool_calls"}],
                "tool_calls",
                capture=capture,
            )
            with tracer.start_as_current_span("execute_tool get_reservation") as tool:
                tool.set_attribute("gen_ai.operation.name", "execute_tool")
                tool.set_attribute("gen_ai.tool.name", "get_reservation")
                tool.set_attribute("gen_ai.tool.call.id", f"call_{i}")
        out = answer or {"status": "confirmed", "reservations": list(lookups), "refund": False}
        text = {"type": "text", "content": json.dumps(out)}
        _chat(tracer, [{"role": "assistant", "parts": [text], "finish_reason": "stop"}], "stop", capture=capture)


def otlp_json(spans: Sequence[ReadableSpan]) -> bytes:
    """The spans as an OTLP JSON ExportTraceServiceRequest: the SDK's own protobuf encoding, in
    proto3 JSON with trace and span ids in hex, as the OTLP specification writes JSON."""
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    doc = MessageToDict(encode_spans(spans))

    def fix(node: Any) -> None:
        if isinstance(node, dict):
            for key in ("traceId", "spanId", "parentSpanId"):
                if isinstance(node.get(key), str):
                    node[key] = base64.b64decode(node[key]).hex()
            for v in node.values():
                fix(v)
        elif isinstance(node, list):
            for v in node:
                fix(v)

    fix(doc)
    return json.dumps(doc).encode()


def otlp_protobuf(spans: Sequence[ReadableSpan]) -> bytes:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    return bytes(encode_spans(spans).SerializeToString())
