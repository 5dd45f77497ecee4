"""The OTLP mapping (collector/otlp.py): each convention instrumentations emit gives the same
envelopes; runs, ids and tags come from where the module docstring says; skips are counted."""

from __future__ import annotations

import gzip
import json
from typing import Any

import pytest

from shapewatch.collector.api import ApiError
from shapewatch.collector.otlp import (
    OtlpDecodeError,
    OtlpMapping,
    OtlpSpan,
    StepKind,
    arguments_hash,
    decode_json,
    map_spans,
)
from shapewatch.collector.traces import decompress

TRACE, SPAN = "a" * 32, "b" * 16
END = 1_764_590_401_000_000_000  # 2025-12-01T12:00:01Z


def span(attrs: dict[str, Any], *, resource: dict[str, Any] | None = None, events: tuple[Any, ...] = ()) -> OtlpSpan:
    return OtlpSpan(TRACE, SPAN, "chat", END - 10**9, END, attrs, resource or {}, events)


CHAT = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o", "gen_ai.response.model": "gpt-4o-2024-08-06"}
WANT_OUTPUT = {
    "event_id": f"otlp:{TRACE}:{SPAN}:0",
    "ts": "2025-12-01T12:00:01+00:00",
    "model": "gpt-4o",
    "served_model": "gpt-4o-2024-08-06",
    "prompt_version": "unversioned",
    "contract": "default",
    "output": {"intent": "refund"},
    "run_id": TRACE,
    "finish_reason": "stop",
}
WANT_TOOL = {**WANT_OUTPUT, "event_id": f"otlp:{TRACE}:{SPAN}:1", "contract": "lookup", "output": {"id": "A1"}}


@pytest.mark.parametrize(
    "attrs,events",
    [
        (  # the current semantic conventions
            {
                "gen_ai.response.finish_reasons": ["stop"],
                "gen_ai.output.messages": json.dumps(
                    [
                        {
                            "role": "assistant",
                            "finish_reason": "stop",
                            "parts": [
                                {"type": "text", "content": '{"intent": "refund"}'},
                                {"type": "tool_call", "name": "lookup", "arguments": {"id": "A1"}},
                            ],
                        }
                    ]
                ),
            },
            (),
        ),
        (  # the older per-index attributes (OpenLLMetry)
            {
                "gen_ai.completion.0.content": '```json\n{"intent": "refund"}\n```',
                "gen_ai.completion.0.finish_reason": "stop",
                "gen_ai.completion.0.tool_calls.0.name": "lookup",
                "gen_ai.completion.0.tool_calls.0.arguments": '{"id": "A1"}',
            },
            (),
        ),
        (  # gen_ai.choice span events
            {"gen_ai.response.finish_reasons": ["stop"]},
            (
                (
                    "gen_ai.choice",
                    END,
                    {
                        "index": 0,
                        "message": json.dumps(
                            {
                                "content": '{"intent": "refund"}',
                                "tool_calls": [{"function": {"name": "lookup", "arguments": '{"id": "A1"}'}}],
                            }
                        ),
                    },
                ),
            ),
        ),
        (  # OpenInference
            {
                "openinference.span.kind": "LLM",
                "gen_ai.operation.name": None,
                "gen_ai.response.finish_reasons": ["stop"],
                "llm.output_messages.0.message.content": '{"intent": "refund"}',
                "llm.output_messages.0.message.tool_calls.0.tool_call.function.name": "lookup",
                "llm.output_messages.0.message.tool_calls.0.tool_call.function.arguments": '{"id": "A1"}',
            },
            (),
        ),
    ],
    ids=["semconv", "indexed", "choice-events", "openinference"],
)
def test_every_convention_gives_the_same_envelopes(attrs: dict[str, Any], events: tuple[Any, ...]) -> None:
    merged = {k: v for k, v in {**CHAT, **attrs}.items() if v is not None}
    mapped = map_spans([span(merged, events=events)], OtlpMapping())
    assert mapped.envelopes == [WANT_OUTPUT, WANT_TOOL]
    assert [(s.kind, s.tool, s.args_hash) for s in mapped.steps] == [
        (StepKind.output, None, None),
        (StepKind.tool_call, "lookup", arguments_hash({"id": "A1"})),
    ]
    assert not mapped.errors and not mapped.skipped
    assert map_spans([span(merged, events=events)], OtlpMapping()).envelopes == mapped.envelopes  # pure


def test_run_id_release_prompt_version_and_contract_come_from_the_configured_attributes() -> None:
    attrs = {
        **CHAT,
        "gen_ai.conversation.id": "conv-7",
        "team.prompt": "p9",
        "gen_ai.output.messages": json.dumps([{"parts": [{"type": "text", "content": '{"x": 1}'}]}]),
    }
    resource = {"service.version": "3.1.0", "team.contract": "triage", "shapewatch.source": "shadow"}
    m = OtlpMapping(prompt_version_attribute="team.prompt", contract_attribute="team.contract")
    (env,) = map_spans([span(attrs, resource=resource)], m).envelopes
    assert (env["run_id"], env["agent_release"], env["prompt_version"], env["contract"], env["source"]) == (
        "conv-7",
        "3.1.0",
        "p9",
        "triage",
        "shadow",
    )
    assert "finish_reason" not in env


def test_spans_without_output_are_skipped_and_counted_by_reason() -> None:
    prose = {**CHAT, "gen_ai.output.messages": json.dumps([{"parts": [{"type": "text", "content": "Hello!"}]}])}
    spans = [
        span(CHAT),  # content capture off
        span(prose),
        span({"gen_ai.operation.name": "embeddings", "gen_ai.request.model": "e"}),
        span({"http.method": "GET"}),
    ]
    mapped = map_spans(spans, OtlpMapping())
    assert mapped.envelopes == [] and mapped.errors == []
    assert dict(mapped.skipped) == {
        "content_not_captured": 1,
        "no_structured_output": 1,
        "operation_not_mapped": 1,
        "not_genai": 1,
    }


def test_execute_tool_spans_are_run_steps_without_envelopes() -> None:
    tool = span(
        {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "lookup",
            "gen_ai.tool.call.arguments": '{"id": 1}',
        }
    )
    mapped = map_spans([tool], OtlpMapping())
    assert mapped.envelopes == []
    assert [(s.kind, s.tool, s.args_hash, s.event_id) for s in mapped.extra_steps] == [
        (StepKind.tool_execution, "lookup", arguments_hash({"id": 1}), None)
    ]
    nameless = map_spans([span({"gen_ai.operation.name": "execute_tool"})], OtlpMapping())
    assert nameless.errors[0].fields[0].path == "gen_ai.tool.name"


def test_a_tag_attribute_of_the_wrong_type_is_an_error_of_its_span() -> None:
    mapped = map_spans([span({**CHAT, "gen_ai.conversation.id": ["a", "b"]})], OtlpMapping())
    assert [(e.fields[0].path, e.fields[0].reason) for e in mapped.errors] == [
        ("gen_ai.conversation.id", "must be a string, got array")
    ]


def test_json_ids_times_and_values_decode_as_the_specification_writes_them() -> None:
    doc = {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "service.version", "value": {"stringValue": "1"}}]},
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": TRACE.upper(),
                                "spanId": SPAN,
                                "endTimeUnixNano": END,
                                "startTimeUnixNano": str(END),
                                "attributes": [
                                    {"key": "i", "value": {"intValue": "42"}},
                                    {"key": "a", "value": {"arrayValue": {"values": [{"boolValue": True}]}}},
                                    {
                                        "key": "kv",
                                        "value": {
                                            "kvlistValue": {"values": [{"key": "x", "value": {"doubleValue": 1.5}}]}
                                        },
                                    },
                                ],
                                "unknownField": {"ignored": True},
                            }
                        ]
                    }
                ],
            }
        ]
    }
    (s,) = decode_json(json.dumps(doc).encode())
    assert (s.trace_id, s.span_id, s.end_ns, s.start_ns) == (TRACE, SPAN, END, END)
    assert s.attributes == {"i": 42, "a": [True], "kv": {"x": 1.5}}
    assert s.resource == {"service.version": "1"} and s.problem is None
    with pytest.raises(OtlpDecodeError) as exc:
        decode_json(b'{"resourceSpans": [{"resource": {"attributes": [{"key": 1}]}}]}')
    assert exc.value.fields[0].path == "resourceSpans[0].resource.attributes[0].key"


def test_decompress_reads_every_gzip_member_and_stops_at_the_limit() -> None:
    assert decompress(gzip.compress(b"ab") + gzip.compress(b"cd"), 4) == b"abcd"
    with pytest.raises(ApiError) as exc:
        decompress(gzip.compress(b"ab") + gzip.compress(b"cde"), 4)
    assert exc.value.status == 413
    with pytest.raises(ApiError) as exc:
        decompress(gzip.compress(b"x" * 10_000)[:-20], 100_000)
    assert exc.value.status == 400


def test_a_request_of_more_spans_than_the_limit_is_refused_before_they_are_built() -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from shapewatch.collector.otlp import MAX_SPANS, TooManySpans, decode_protobuf

    req = ExportTraceServiceRequest()
    scope = req.resource_spans.add().scope_spans.add()
    for _ in range(MAX_SPANS + 1):
        scope.spans.add()
    with pytest.raises(TooManySpans) as exc:
        decode_protobuf(req.SerializeToString())
    assert (exc.value.status, exc.value.fields[0].path) == (413, "body")
    doc = {"resourceSpans": [{"scopeSpans": [{"spans": [{}] * (MAX_SPANS // 2 + 1)}] * 2}]}
    with pytest.raises(TooManySpans):
        decode_json(json.dumps(doc).encode())
    with pytest.raises(OtlpDecodeError) as bad:
        decode_json(b'{"resourceSpans": [{"scopeSpans": 3}]}')
    assert bad.value.fields[0].path == "resourceSpans[0].scopeSpans"
