"""Tests for collector.adapters: raw provider responses become envelopes and outcomes.

Fixtures under fixtures/providers/ are hand-written copies of real response
shapes (OpenAI Chat Completions and Responses API, Anthropic Messages, Gemini
generateContent). Tests that need a variant load a fixture and change the one
field that matters, so the rest of the body stays realistic.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from shapewatch.collector.adapters import (
    AdaptedResponse,
    AdapterError,
    OutcomeKind,
    Provider,
    ProviderOutcome,
    adapt_response,
)

FIXTURES = Path(__file__).parent / "fixtures" / "providers"


def load(name: str) -> dict[str, Any]:
    with (FIXTURES / f"{name}.json").open(encoding="utf-8") as fh:
        body: dict[str, Any] = json.load(fh)
    return body


def unkeyed(adapted: AdaptedResponse) -> AdaptedResponse:
    """The response with outcome keys cleared (test_outcome_keys checks the keys)."""
    return AdaptedResponse(envelopes=adapted.envelopes, outcomes=without_keys(adapted.outcomes))


def without_keys(outcomes: list[ProviderOutcome]) -> list[ProviderOutcome]:
    """Outcomes with their dedup key cleared (test_outcome_keys checks the keys)."""
    return [dataclasses.replace(o, key=None) for o in outcomes]


def outcome(
    kind: OutcomeKind,
    *,
    model: str,
    served_model: str | None,
    contract: str,
    finish_reason: str | None,
    detail: str,
    prompt_version: str = "intake-v3",
) -> ProviderOutcome:
    return ProviderOutcome(
        kind=kind,
        model=model,
        served_model=served_model,
        prompt_version=prompt_version,
        contract=contract,
        finish_reason=finish_reason,
        detail=detail,
    )


# --- OpenAI Chat Completions -----------------------------------------------------------

CHAT_TOOLS_ID = "chatcmpl-BzK3f9aQe1xT7m2LrV0pWc8sYd4nH"


def test_openai_chat_two_tool_calls_give_two_envelopes() -> None:
    adapted = adapt_response(
        Provider.openai,
        load("openai_chat_tool_calls"),
        prompt_version="intake-v3",
        source="production",
        contract_version="3",
    )
    assert unkeyed(adapted) == AdaptedResponse(
        envelopes=[
            {
                "event_id": f"{CHAT_TOOLS_ID}:call_9VfJ2kQwZr4XmT1bN8yLh3Ds",
                "model": "gpt-4o-2024-08-06",
                "served_model": "gpt-4o-2024-08-06",
                "prompt_version": "intake-v3",
                "contract": "classify_ticket",
                "contract_version": "3",
                "source": "production",
                "finish_reason": "tool_calls",
                "output": {"intent": "refund", "priority": "high", "customer": {"tier": "gold"}},
            },
            {
                "event_id": f"{CHAT_TOOLS_ID}:call_2hQmC7pRt5YwE0sKa9ZvUx6G",
                "model": "gpt-4o-2024-08-06",
                "served_model": "gpt-4o-2024-08-06",
                "prompt_version": "intake-v3",
                "contract": "extract_entities",
                "contract_version": "3",
                "source": "production",
                "finish_reason": "tool_calls",
                "output": {
                    "entities": [
                        {"type": "order_id", "value": "A-10293"},
                        {"type": "amount", "value": "49.90"},
                    ]
                },
            },
        ],
        outcomes=[],
    )


def test_openai_chat_alias_requested_dated_model_served() -> None:
    adapted = adapt_response("openai", load("openai_chat_structured"), prompt_version="intake-v3", model="gpt-4o")
    assert unkeyed(adapted) == AdaptedResponse(
        envelopes=[
            {
                "event_id": "chatcmpl-BzK4aT2nVb8qP1sXe6RmYw3Lk0jDf:0",
                "model": "gpt-4o",
                "served_model": "gpt-4o-2024-08-06",
                "prompt_version": "intake-v3",
                "contract": "default",
                "finish_reason": "stop",
                "output": {
                    "intent": "billing_question",
                    "priority": "low",
                    "customer": {"tier": None},
                    "tags": [],
                },
            }
        ],
        outcomes=[],
    )


def test_openai_chat_structured_output_takes_contract_argument() -> None:
    adapted = adapt_response("openai", load("openai_chat_structured"), prompt_version="intake-v3", contract="intake")
    assert [e["contract"] for e in adapted.envelopes] == ["intake"]


def test_openai_chat_tool_calls_ignore_contract_argument() -> None:
    adapted = adapt_response("openai", load("openai_chat_tool_calls"), prompt_version="intake-v3", contract="intake")
    assert [e["contract"] for e in adapted.envelopes] == ["classify_ticket", "extract_entities"]


def test_openai_chat_truncated_counts_only_truncation() -> None:
    adapted = adapt_response("openai", load("openai_chat_truncated"), prompt_version="intake-v3", model="gpt-4o")
    assert unkeyed(adapted) == AdaptedResponse(
        envelopes=[],
        outcomes=[
            outcome(
                OutcomeKind.truncated,
                model="gpt-4o",
                served_model="gpt-4o-2024-08-06",
                contract="default",
                finish_reason="length",
                detail=(
                    "finish_reason 'length': output cut off at the token limit; "
                    "message content: not valid JSON: Unterminated string starting at char 47"
                ),
            )
        ],
    )


def test_openai_chat_truncated_but_complete_content_is_kept_and_counted() -> None:
    # json_object mode can close the object and then pad with whitespace until
    # the limit: the output is whole, the truncation is still a fact.
    body = load("openai_chat_structured")
    body["choices"][0]["finish_reason"] = "length"
    body["choices"][0]["message"]["content"] += "\n\n\n\n"
    adapted = adapt_response("openai", body, prompt_version="intake-v3", contract="intake")
    assert [e["output"]["intent"] for e in adapted.envelopes] == ["billing_question"]
    assert without_keys(adapted.outcomes) == [
        outcome(
            OutcomeKind.truncated,
            model="gpt-4o-2024-08-06",
            served_model="gpt-4o-2024-08-06",
            contract="intake",
            finish_reason="length",
            detail="finish_reason 'length': output cut off at the token limit",
        )
    ]


def test_openai_chat_refusal() -> None:
    adapted = adapt_response("openai", load("openai_chat_refusal"), prompt_version="intake-v3", contract="intake")
    assert unkeyed(adapted) == AdaptedResponse(
        envelopes=[],
        outcomes=[
            outcome(
                OutcomeKind.refusal,
                model="gpt-4o-2024-08-06",
                served_model="gpt-4o-2024-08-06",
                contract="intake",
                finish_reason="stop",
                detail="refusal: I'm sorry, I can't help with that request.",
            )
        ],
    )


def test_openai_chat_invalid_arguments_give_outcome_and_keep_the_valid_call() -> None:
    adapted = adapt_response("openai", load("openai_chat_invalid_arguments"), prompt_version="intake-v3")
    assert unkeyed(adapted) == AdaptedResponse(
        envelopes=[
            {
                "event_id": "chatcmpl-BzK7eV4zAp6cO8sNt1XuYg3Jd9aMq:call_Hq2vB9mZt4Rx7Wc1Nd6Ye3Lj",
                "model": "gpt-4o-mini-2024-07-18",
                "served_model": "gpt-4o-mini-2024-07-18",
                "prompt_version": "intake-v3",
                "contract": "extract_entities",
                "finish_reason": "tool_calls",
                "output": {"entities": []},
            }
        ],
        outcomes=[
            outcome(
                OutcomeKind.invalid_json,
                model="gpt-4o-mini-2024-07-18",
                served_model="gpt-4o-mini-2024-07-18",
                contract="classify_ticket",
                finish_reason="tool_calls",
                detail=("tool call 'classify_ticket' arguments: not valid JSON: Expecting ',' delimiter at char 19"),
            )
        ],
    )


@pytest.mark.parametrize(
    ("arguments", "kind", "detail"),
    [
        # valid JSON, but not an object: a kind of its own, not invalid_json
        ('["refund", "high"]', OutcomeKind.not_an_object, "JSON array, not an object"),
        ('"refund"', OutcomeKind.not_an_object, "JSON string, not an object"),
        ("null", OutcomeKind.not_an_object, "JSON null, not an object"),
        ("", OutcomeKind.invalid_json, "not valid JSON: Expecting value at char 0"),
        ('{"score": NaN}', OutcomeKind.invalid_json, "not valid JSON: NaN is not a JSON value"),
        # Python's parser would make it infinite; stored, it became null while rollups counted it
        (
            '{"score": [1, -1e400]}',
            OutcomeKind.invalid_json,
            "not valid JSON: number -1e400 is too large for a 64-bit float",
        ),
    ],
)
def test_openai_chat_arguments_that_are_not_a_json_object(arguments: str, kind: OutcomeKind, detail: str) -> None:
    body = load("openai_chat_invalid_arguments")
    body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = arguments
    adapted = adapt_response("openai", body, prompt_version="intake-v3")
    assert [e["contract"] for e in adapted.envelopes] == ["extract_entities"]
    assert without_keys(adapted.outcomes) == [
        outcome(
            kind,
            model="gpt-4o-mini-2024-07-18",
            served_model="gpt-4o-mini-2024-07-18",
            contract="classify_ticket",
            finish_reason="tool_calls",
            detail=f"tool call 'classify_ticket' arguments: {detail}",
        )
    ]


def test_openai_chat_content_filter_withholds_content() -> None:
    body = load("openai_chat_structured")
    body["choices"][0]["finish_reason"] = "content_filter"
    adapted = adapt_response("openai", body, prompt_version="intake-v3")
    assert unkeyed(adapted) == AdaptedResponse(
        envelopes=[],
        outcomes=[
            outcome(
                OutcomeKind.content_filter,
                model="gpt-4o-2024-08-06",
                served_model="gpt-4o-2024-08-06",
                contract="default",
                finish_reason="content_filter",
                detail="finish_reason 'content_filter': output withheld by the content filter",
            )
        ],
    )


def test_openai_chat_prose_content_is_no_structured_output() -> None:
    body = load("openai_chat_structured")
    body["choices"][0]["message"]["content"] = "Sure! The ticket is about a refund."
    adapted = adapt_response("openai", body, prompt_version="intake-v3")
    assert unkeyed(adapted) == AdaptedResponse(
        envelopes=[],
        outcomes=[
            outcome(
                OutcomeKind.no_structured_output,
                model="gpt-4o-2024-08-06",
                served_model="gpt-4o-2024-08-06",
                contract="default",
                finish_reason="stop",
                detail="message content: prose, not JSON",
            )
        ],
    )


def test_openai_chat_event_id_argument_is_indexed_over_several_outputs() -> None:
    adapted = adapt_response("openai", load("openai_chat_tool_calls"), prompt_version="intake-v3", event_id="ev-42")
    assert [e["event_id"] for e in adapted.envelopes] == ["ev-42:0", "ev-42:1"]


def test_openai_chat_event_id_argument_is_used_as_is_for_one_output() -> None:
    adapted = adapt_response("openai", load("openai_chat_structured"), prompt_version="intake-v3", event_id="ev-42")
    assert [e["event_id"] for e in adapted.envelopes] == ["ev-42"]


def test_response_without_id_gives_envelopes_without_event_id() -> None:
    body = load("openai_chat_structured")
    del body["id"]
    adapted = adapt_response("openai", body, prompt_version="intake-v3")
    assert len(adapted.envelopes) == 1
    assert "event_id" not in adapted.envelopes[0]


def test_adapting_twice_gives_equal_results_and_does_not_alias_the_response() -> None:
    body = load("anthropic_tool_use")
    pristine = copy.deepcopy(body)
    first = adapt_response("anthropic", body, prompt_version="intake-v3")
    second = adapt_response("anthropic", body, prompt_version="intake-v3")
    assert first == second
    first.envelopes[0]["output"]["priority"] = "changed"
    assert body == pristine


# --- OpenAI Responses API -------------------------------------------------------------

RESP_TOOLS_ID = "resp_68a1f0c2b9d48190a4e3c2f71b5d9e0a0c7f3b2a1d4e5f60"


def test_openai_responses_two_function_calls() -> None:
    adapted = adapt_response(
        "openai",
        load("openai_responses_function_calls"),
        prompt_version="intake-v3",
        model="gpt-4.1",
    )
    assert unkeyed(adapted) == AdaptedResponse(
        envelopes=[
            {
                "event_id": f"{RESP_TOOLS_ID}:call_Qw3eR5tY7uI9oP1aS2dF4gH6",
                "model": "gpt-4.1",
                "served_model": "gpt-4.1-2025-04-14",
                "prompt_version": "intake-v3",
                "contract": "classify_ticket",
                "finish_reason": "completed",
                "output": {"intent": "cancel", "priority": "medium", "customer": {"tier": "silver"}},
            },
            {
                "event_id": f"{RESP_TOOLS_ID}:call_Zx8cV6bN4mL2kJ0hG9fD7sA5",
                "model": "gpt-4.1",
                "served_model": "gpt-4.1-2025-04-14",
                "prompt_version": "intake-v3",
                "contract": "extract_entities",
                "finish_reason": "completed",
                "output": {"entities": [{"type": "subscription_id", "value": "S-7781"}]},
            },
        ],
        outcomes=[],
    )


def test_openai_responses_structured_output() -> None:
    adapted = adapt_response(
        "openai",
        load("openai_responses_structured"),
        prompt_version="intake-v3",
        contract="intake",
    )
    assert unkeyed(adapted) == AdaptedResponse(
        envelopes=[
            {
                "event_id": (
                    "resp_68a1f1a7c3e08190d9c8b7a6f5e4d3c20c7f3b2a1d4e5f70:"
                    "msg_68a1f1a9b2c38190f1e0d9c8b7a6f5e40c7f3b2a1d4e5f72"
                ),
                "model": "gpt-5-mini-2025-08-07",
                "served_model": "gpt-5-mini-2025-08-07",
                "prompt_version": "intake-v3",
                "contract": "intake",
                "finish_reason": "completed",
                "output": {
                    "intent": "refund",
                    "priority": "high",
                    "customer": {"tier": "gold"},
                    "tags": ["damaged", "repeat"],
                },
            }
        ],
        outcomes=[],
    )


def test_openai_responses_incomplete_is_truncated() -> None:
    adapted = adapt_response(
        "openai",
        load("openai_responses_incomplete"),
        prompt_version="intake-v3",
        contract="intake",
    )
    assert unkeyed(adapted) == AdaptedResponse(
        envelopes=[],
        outcomes=[
            outcome(
                OutcomeKind.truncated,
                model="gpt-4.1-2025-04-14",
                served_model="gpt-4.1-2025-04-14",
                contract="intake",
                finish_reason="max_output_tokens",
                detail=(
                    "incomplete 'max_output_tokens': output cut off at the token limit; "
                    "message text: not valid JSON: Unterminated string starting at char 47"
                ),
            )
        ],
    )


def test_openai_responses_content_filter() -> None:
    body = load("openai_responses_incomplete")
    body["incomplete_details"] = {"reason": "content_filter"}
    adapted = adapt_response("openai", body, prompt_version="intake-v3")
    assert unkeyed(adapted) == AdaptedResponse(
        envelopes=[],
        outcomes=[
            outcome(
                OutcomeKind.content_filter,
                model="gpt-4.1-2025-04-14",
                served_model="gpt-4.1-2025-04-14",
                contract="default",
                finish_reason="content_filter",
                detail="incomplete 'content_filter': output withheld by the content filter",
            )
        ],
    )


def test_openai_responses_refusal() -> None:
    adapted = adapt_response("openai", load("openai_responses_refusal"), prompt_version="intake-v3")
    assert unkeyed(adapted) == AdaptedResponse(
        envelopes=[],
        outcomes=[
            outcome(
                OutcomeKind.refusal,
                model="gpt-4.1-2025-04-14",
                served_model="gpt-4.1-2025-04-14",
                contract="default",
                finish_reason="completed",
                detail="refusal: I'm sorry, but I can't assist with that.",
            )
        ],
    )


def test_openai_responses_invalid_function_arguments() -> None:
    body = load("openai_responses_function_calls")
    body["output"][1]["arguments"] = '{"entities": [}'
    adapted = adapt_response("openai", body, prompt_version="intake-v3")
    assert [e["contract"] for e in adapted.envelopes] == ["classify_ticket"]
    assert without_keys(adapted.outcomes) == [
        outcome(
            OutcomeKind.invalid_json,
            model="gpt-4.1-2025-04-14",
            served_model="gpt-4.1-2025-04-14",
            contract="extract_entities",
            finish_reason="completed",
            detail=("function call 'extract_entities' arguments: not valid JSON: Expecting value at char 14"),
        )
    ]


# --- Anthropic Messages ---------------------------------------------------------------


def test_anthropic_two_tool_use_blocks() -> None:
    adapted = adapt_response(
        "anthropic",
        load("anthropic_tool_use"),
        prompt_version="intake-v3",
        model="claude-sonnet-4-5",
    )
    assert unkeyed(adapted) == AdaptedResponse(
        envelopes=[
            {
                "event_id": "msg_01XFDUDYJgAACzvnptvVoYEL:toolu_01A09q90qw90lq917835lq9",
                "model": "claude-sonnet-4-5",
                "served_model": "claude-sonnet-4-5-20250929",
                "prompt_version": "intake-v3",
                "contract": "classify_ticket",
                "finish_reason": "tool_use",
                "output": {"intent": "refund", "priority": "high", "customer": {"tier": "gold"}},
            },
            {
                "event_id": "msg_01XFDUDYJgAACzvnptvVoYEL:toolu_01T1x1fJ34qAmk2tNTrN7Up6",
                "model": "claude-sonnet-4-5",
                "served_model": "claude-sonnet-4-5-20250929",
                "prompt_version": "intake-v3",
                "contract": "extract_entities",
                "finish_reason": "tool_use",
                "output": {"entities": [{"type": "order_id", "value": "A-10293"}]},
            },
        ],
        outcomes=[],
    )


def test_anthropic_fenced_json_text_is_a_structured_output() -> None:
    adapted = adapt_response(
        "anthropic",
        load("anthropic_json_text"),
        prompt_version="intake-v3",
        contract="intake",
        contract_version="3",
        source="shadow",
    )
    assert unkeyed(adapted) == AdaptedResponse(
        envelopes=[
            {
                "event_id": "msg_013Zva2CMHLNnXjNJJKqJ2EF",
                "model": "claude-sonnet-4-5-20250929",
                "served_model": "claude-sonnet-4-5-20250929",
                "prompt_version": "intake-v3",
                "contract": "intake",
                "contract_version": "3",
                "source": "shadow",
                "finish_reason": "end_turn",
                "output": {
                    "intent": "shipping_delay",
                    "priority": "medium",
                    "customer": {"tier": "bronze"},
                    "tags": ["carrier"],
                },
            }
        ],
        outcomes=[],
    )


def test_anthropic_max_tokens_distrusts_the_last_tool_use() -> None:
    # The API hands tool input over already parsed, so a call cut off by the
    # limit still looks like an object; only the earlier, complete call counts.
    adapted = adapt_response("anthropic", load("anthropic_max_tokens"), prompt_version="intake-v3")
    assert unkeyed(adapted) == AdaptedResponse(
        envelopes=[
            {
                "event_id": "msg_01Gp5hTw8R3vYkLq2NzXc4Bd:toolu_01Rk7Wm3Qz9Tb5Yc2Nd8Vf4H",
                "model": "claude-sonnet-4-5-20250929",
                "served_model": "claude-sonnet-4-5-20250929",
                "prompt_version": "intake-v3",
                "contract": "classify_ticket",
                "finish_reason": "max_tokens",
                "output": {"intent": "refund", "priority": "high", "customer": {"tier": "gold"}},
            }
        ],
        outcomes=[
            outcome(
                OutcomeKind.truncated,
                model="claude-sonnet-4-5-20250929",
                served_model="claude-sonnet-4-5-20250929",
                contract="extract_entities",
                finish_reason="max_tokens",
                detail=(
                    "stop_reason 'max_tokens': output cut off at the token limit; "
                    "tool_use 'extract_entities' input may be incomplete"
                ),
            )
        ],
    )


def test_anthropic_refusal() -> None:
    adapted = adapt_response(
        "anthropic",
        load("anthropic_refusal"),
        prompt_version="intake-v3",
        model="claude-sonnet-4-5",
    )
    assert unkeyed(adapted) == AdaptedResponse(
        envelopes=[],
        outcomes=[
            outcome(
                OutcomeKind.refusal,
                model="claude-sonnet-4-5",
                served_model="claude-sonnet-4-5-20250929",
                contract="default",
                finish_reason="refusal",
                detail=("stop_reason 'refusal' (cyber): This request was declined by a safety classifier."),
            )
        ],
    )


def test_anthropic_broken_json_text_is_invalid_json() -> None:
    body = load("anthropic_json_text")
    body["content"][0]["text"] = '{"intent": "refund", "priority": }'
    adapted = adapt_response("anthropic", body, prompt_version="intake-v3")
    assert unkeyed(adapted) == AdaptedResponse(
        envelopes=[],
        outcomes=[
            outcome(
                OutcomeKind.invalid_json,
                model="claude-sonnet-4-5-20250929",
                served_model="claude-sonnet-4-5-20250929",
                contract="default",
                finish_reason="end_turn",
                detail="text: not valid JSON: Expecting value at char 33",
            )
        ],
    )


def test_anthropic_prose_is_no_structured_output() -> None:
    body = load("anthropic_json_text")
    body["content"][0]["text"] = "I need the order number before I can classify this."
    adapted = adapt_response("anthropic", body, prompt_version="intake-v3", contract="intake")
    assert unkeyed(adapted) == AdaptedResponse(
        envelopes=[],
        outcomes=[
            outcome(
                OutcomeKind.no_structured_output,
                model="claude-sonnet-4-5-20250929",
                served_model="claude-sonnet-4-5-20250929",
                contract="intake",
                finish_reason="end_turn",
                detail="text: prose, not JSON",
            )
        ],
    )


def test_anthropic_empty_content_is_no_structured_output() -> None:
    body = load("anthropic_json_text")
    body["content"] = []
    adapted = adapt_response("anthropic", body, prompt_version="intake-v3")
    assert without_keys(adapted.outcomes) == [
        outcome(
            OutcomeKind.no_structured_output,
            model="claude-sonnet-4-5-20250929",
            served_model="claude-sonnet-4-5-20250929",
            contract="default",
            finish_reason="end_turn",
            detail="no tool_use block and no JSON text",
        )
    ]


# --- Gemini generateContent ----------------------------------------------------------


def test_gemini_two_function_calls() -> None:
    adapted = adapt_response(
        "gemini",
        load("gemini_function_calls"),
        prompt_version="intake-v3",
        model="gemini-flash-latest",
    )
    assert unkeyed(adapted) == AdaptedResponse(
        envelopes=[
            {
                "event_id": "mdlsaOrfJ-mdz7IPx8W2oQ4:0:0",
                "model": "gemini-flash-latest",
                "served_model": "gemini-2.5-flash-preview-09-2025",
                "prompt_version": "intake-v3",
                "contract": "classify_ticket",
                "finish_reason": "STOP",
                "output": {"intent": "refund", "priority": "high", "customer": {"tier": "gold"}},
            },
            {
                "event_id": "mdlsaOrfJ-mdz7IPx8W2oQ4:0:1",
                "model": "gemini-flash-latest",
                "served_model": "gemini-2.5-flash-preview-09-2025",
                "prompt_version": "intake-v3",
                "contract": "extract_entities",
                "finish_reason": "STOP",
                "output": {"entities": [{"type": "order_id", "value": "A-10293"}]},
            },
        ],
        outcomes=[],
    )


def test_gemini_json_text_is_a_structured_output() -> None:
    adapted = adapt_response(
        "gemini",
        load("gemini_json_text"),
        prompt_version="intake-v3",
        contract="intake",
        model="gemini-2.0-flash",
    )
    assert unkeyed(adapted) == AdaptedResponse(
        envelopes=[
            {
                "event_id": "Y2tsaKCrOpSXz7IP0bPBqQw:0",
                "model": "gemini-2.0-flash",
                "served_model": "gemini-2.0-flash-001",
                "prompt_version": "intake-v3",
                "contract": "intake",
                "finish_reason": "STOP",
                "output": {
                    "intent": "refund",
                    "priority": "low",
                    "customer": {"tier": "silver"},
                    "tags": [],
                },
            }
        ],
        outcomes=[],
    )


def test_gemini_max_tokens_is_truncated() -> None:
    adapted = adapt_response("gemini", load("gemini_max_tokens"), prompt_version="intake-v3", contract="intake")
    assert unkeyed(adapted) == AdaptedResponse(
        envelopes=[],
        outcomes=[
            outcome(
                OutcomeKind.truncated,
                model="gemini-2.0-flash-001",
                served_model="gemini-2.0-flash-001",
                contract="intake",
                finish_reason="MAX_TOKENS",
                detail=(
                    "finishReason 'MAX_TOKENS': output cut off at the token limit; "
                    "text: not valid JSON: Unterminated string starting at char 52"
                ),
            )
        ],
    )


def test_gemini_prompt_blocked_is_a_refusal() -> None:
    adapted = adapt_response("gemini", load("gemini_prompt_blocked"), prompt_version="intake-v3")
    assert unkeyed(adapted) == AdaptedResponse(
        envelopes=[],
        outcomes=[
            outcome(
                OutcomeKind.refusal,
                model="gemini-2.0-flash-001",
                served_model="gemini-2.0-flash-001",
                contract="default",
                finish_reason=None,
                detail="prompt blocked: PROHIBITED_CONTENT",
            )
        ],
    )


def test_gemini_recitation_is_a_refusal() -> None:
    body = load("gemini_json_text")
    body["candidates"][0]["finishReason"] = "RECITATION"
    adapted = adapt_response("gemini", body, prompt_version="intake-v3")
    assert unkeyed(adapted) == AdaptedResponse(
        envelopes=[],
        outcomes=[
            outcome(
                OutcomeKind.refusal,
                model="gemini-2.0-flash-001",
                served_model="gemini-2.0-flash-001",
                contract="default",
                finish_reason="RECITATION",
                detail="finishReason 'RECITATION': output withheld as recitation",
            )
        ],
    )


@pytest.mark.parametrize("reason", ["SAFETY", "PROHIBITED_CONTENT", "BLOCKLIST", "SPII"])
def test_gemini_safety_finish_reasons_are_content_filter(reason: str) -> None:
    body = load("gemini_safety")
    body["candidates"][0]["finishReason"] = reason
    adapted = adapt_response("gemini", body, prompt_version="intake-v3")
    assert unkeyed(adapted) == AdaptedResponse(
        envelopes=[],
        outcomes=[
            outcome(
                OutcomeKind.content_filter,
                model="gemini-2.0-flash-001",
                served_model="gemini-2.0-flash-001",
                contract="default",
                finish_reason=reason,
                detail=f"finishReason {reason!r}: output withheld by the content filter",
            )
        ],
    )


def test_gemini_malformed_function_call_is_invalid_json() -> None:
    adapted = adapt_response("gemini", load("gemini_malformed_function_call"), prompt_version="intake-v3")
    assert unkeyed(adapted) == AdaptedResponse(
        envelopes=[],
        outcomes=[
            outcome(
                OutcomeKind.invalid_json,
                model="gemini-2.5-flash",
                served_model="gemini-2.5-flash",
                contract="default",
                finish_reason="MALFORMED_FUNCTION_CALL",
                detail=(
                    "finishReason 'MALFORMED_FUNCTION_CALL': Malformed function call: "
                    "print(default_api.classify_ticket(intent='refund', priority=))"
                ),
            )
        ],
    )


def test_gemini_json_array_text_is_not_an_object() -> None:
    # a Gemini response schema may ask for an array: valid JSON, counted apart from invalid_json
    body = load("gemini_json_text")
    body["candidates"][0]["content"]["parts"][0]["text"] = '[{"intent": "refund"}]'
    adapted = adapt_response("gemini", body, prompt_version="intake-v3")
    assert adapted.envelopes == []
    assert without_keys(adapted.outcomes) == [
        outcome(
            OutcomeKind.not_an_object,
            model="gemini-2.0-flash-001",
            served_model="gemini-2.0-flash-001",
            contract="default",
            finish_reason="STOP",
            detail="text: JSON array, not an object",
        )
    ]


def test_gemini_thought_parts_are_not_the_answer() -> None:
    body = load("gemini_json_text")
    body["candidates"][0]["content"]["parts"].insert(
        0, {"text": "**Classifying the ticket**\nThe customer wants money back.", "thought": True}
    )
    adapted = adapt_response("gemini", body, prompt_version="intake-v3")
    assert [e["output"]["intent"] for e in adapted.envelopes] == ["refund"]
    assert without_keys(adapted.outcomes) == []


# --- models and errors ----------------------------------------------------------------


def test_no_model_anywhere_is_an_adapter_error() -> None:
    body = load("gemini_json_text")
    del body["modelVersion"]
    with pytest.raises(AdapterError) as info:
        adapt_response("gemini", body, prompt_version="intake-v3")
    assert (info.value.path, str(info.value)) == (
        "model",
        "model: the response names no model and no model argument was given",
    )


def test_model_argument_without_served_model_omits_served_model() -> None:
    body = load("gemini_json_text")
    del body["modelVersion"]
    adapted = adapt_response("gemini", body, prompt_version="intake-v3", model="gemini-2.0-flash")
    assert adapted.envelopes == [
        {
            "event_id": "Y2tsaKCrOpSXz7IP0bPBqQw:0",
            "model": "gemini-2.0-flash",
            "prompt_version": "intake-v3",
            "contract": "default",
            "finish_reason": "STOP",
            "output": {"intent": "refund", "priority": "low", "customer": {"tier": "silver"}, "tags": []},
        }
    ]


def _set(body: dict[str, Any], keys: list[str | int], value: Any) -> None:
    target: Any = body
    for key in keys[:-1]:
        target = target[key]
    target[keys[-1]] = value


@pytest.mark.parametrize(
    ("provider", "fixture", "keys", "value", "path", "reason"),
    [
        ("openai", "openai_chat_tool_calls", ["choices"], "nope", "choices", "must be an array, got string"),
        ("openai", "openai_chat_tool_calls", ["choices", 0, "message"], None, "choices[0].message", "missing"),
        (
            "openai",
            "openai_chat_tool_calls",
            ["choices", 0, "message", "tool_calls", 1, "function", "arguments"],
            {"entities": []},
            "choices[0].message.tool_calls[1].function.arguments",
            "must be a string, got object",
        ),
        (
            "openai",
            "openai_chat_tool_calls",
            ["choices", 0, "message", "tool_calls", 0, "function"],
            None,
            "choices[0].message.tool_calls[0].function",
            "missing",
        ),
        (
            "openai",
            "openai_chat_tool_calls",
            ["choices", 0, "message", "tool_calls"],
            {},
            "choices[0].message.tool_calls",
            "must be an array, got object",
        ),
        ("openai", "openai_chat_tool_calls", ["model"], 4, "model", "must be a string, got integer"),
        (
            "openai",
            "openai_chat_tool_calls",
            ["object"],
            "chat.completion.chunk",
            "object",
            "expected 'chat.completion' or 'response', got 'chat.completion.chunk'; aggregate streamed chunks first",
        ),
        ("openai", "openai_responses_function_calls", ["output", 0, "name"], None, "output[0].name", "missing"),
        (
            "openai",
            "openai_responses_structured",
            ["output", 1, "content", 0, "text"],
            7,
            "output[1].content[0].text",
            "must be a string, got integer",
        ),
        (
            "anthropic",
            "anthropic_tool_use",
            ["content", 2, "input"],
            '{"entities": []}',
            "content[2].input",
            "must be an object, got string",
        ),
        ("anthropic", "anthropic_tool_use", ["content", 1], "tool_use", "content[1]", "must be an object, got string"),
        ("anthropic", "anthropic_tool_use", ["content"], None, "content", "missing"),
        (
            "gemini",
            "gemini_function_calls",
            ["candidates", 0, "content", "parts", 1, "functionCall", "args"],
            [],
            "candidates[0].content.parts[1].functionCall.args",
            "must be an object, got array",
        ),
        (
            "gemini",
            "gemini_function_calls",
            ["candidates", 0, "content"],
            "text",
            "candidates[0].content",
            "must be an object, got string",
        ),
        ("gemini", "gemini_function_calls", ["candidates"], {"0": {}}, "candidates", "must be an array, got object"),
    ],
)
def test_wrong_shape_names_the_path(
    provider: str, fixture: str, keys: list[str | int], value: Any, path: str, reason: str
) -> None:
    body = load(fixture)
    _set(body, keys, value)
    with pytest.raises(AdapterError) as info:
        adapt_response(provider, body, prompt_version="intake-v3")
    error = info.value
    assert (error.path, error.reason, str(error)) == (path, reason, f"{path}: {reason}")


@pytest.mark.parametrize("provider", list(Provider))
def test_response_that_is_not_an_object(provider: Provider) -> None:
    with pytest.raises(AdapterError) as info:
        adapt_response(provider, [{"id": "x"}], prompt_version="intake-v3")
    assert (info.value.path, info.value.reason) == ("$", "must be an object, got array")


@pytest.mark.parametrize(
    ("provider", "body", "path", "reason"),
    [
        (
            "openai",
            {
                "error": {
                    "message": "Rate limit reached for gpt-4o",
                    "type": "requests",
                    "param": None,
                    "code": "rate_limit_exceeded",
                }
            },
            "choices",
            "missing; the body is an API error: Rate limit reached for gpt-4o",
        ),
        (
            "anthropic",
            {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
            "type",
            "expected 'message', got 'error'; the body is an API error: Overloaded",
        ),
        (
            "gemini",
            {"error": {"code": 400, "message": "API key not valid.", "status": "INVALID_ARGUMENT"}},
            "candidates",
            "missing; the body is an API error: API key not valid.",
        ),
    ],
)
def test_api_error_bodies_are_adapter_errors(provider: str, body: dict[str, Any], path: str, reason: str) -> None:
    with pytest.raises(AdapterError) as info:
        adapt_response(provider, body, prompt_version="intake-v3")
    assert (info.value.path, info.value.reason) == (path, reason)


def test_adapter_error_is_a_value_error() -> None:
    error = AdapterError("choices[0]", "must be an object, got null")
    assert isinstance(error, ValueError)
    assert (error.path, error.reason, str(error)) == (
        "choices[0]",
        "must be an object, got null",
        "choices[0]: must be an object, got null",
    )


def test_unknown_provider_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="unknown provider 'mistral'"):
        adapt_response("mistral", load("openai_chat_structured"), prompt_version="intake-v3")


def test_lenient_on_optional_fields() -> None:
    # A bare-bones chat completion with none of the optional fields still adapts.
    body = {
        "choices": [{"message": {"role": "assistant", "content": '{"intent": "refund"}'}}],
        "model": "gpt-4o-2024-08-06",
    }
    adapted = adapt_response("openai", body, prompt_version="intake-v3")
    assert unkeyed(adapted) == AdaptedResponse(
        envelopes=[
            {
                "model": "gpt-4o-2024-08-06",
                "served_model": "gpt-4o-2024-08-06",
                "prompt_version": "intake-v3",
                "contract": "default",
                "output": {"intent": "refund"},
            }
        ],
        outcomes=[],
    )


def test_outcome_keys_name_the_response_and_position() -> None:
    body = load("openai_chat_refusal")
    keyed = adapt_response("openai", body, prompt_version="p").outcomes
    assert [o.key for o in keyed] == [f"{body['id']}:outcome:{i}" for i in range(len(keyed))] and keyed
    given = adapt_response("openai", body, prompt_version="p", event_id="req-7").outcomes
    assert [o.key for o in given] == [f"req-7:outcome:{i}" for i in range(len(given))]
    anonymous = {k: v for k, v in body.items() if k != "id"}
    assert [o.key for o in adapt_response("openai", anonymous, prompt_version="p").outcomes] == [None] * len(keyed)
