"""Provider adapters: turn a raw OpenAI, Anthropic or Gemini response into envelopes.

This is the only module that knows provider response formats: the provider's
format is external, and nothing else depends on it. It reads one raw response body, already
decoded from JSON, and returns:

- one envelope dict per structured output it carries (a tool call, a function
  call, or JSON text from structured-output / JSON mode), not yet validated:
  the envelope module validates every envelope at one point, wherever it
  came from;
- one :class:`ProviderOutcome` per failure that never reaches a parser
  (truncated, refused, filtered, invalid JSON, no structured output at all),
  so those can be counted per cohort instead of vanishing.

Supported formats: OpenAI Chat Completions (``object: "chat.completion"``),
the OpenAI Responses API (``object: "response"``), Anthropic Messages and
Gemini ``generateContent`` (Google AI and Vertex AI share the shape).
Streaming chunks are not supported: aggregate them first.

Everything here is pure: no I/O, no clock, no randomness. The same response
adapted twice gives equal results, which is what lets a retried POST of a
provider response deduplicate on the derived ``event_id``.
"""

from __future__ import annotations

import copy
import enum
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from .envelope import loads_marking
from .errors import ShapewatchError
from .flatten import json_type_of

__all__ = [
    "FINISH_OUTCOMES",
    "WITH_OUTPUT",
    "AdaptedResponse",
    "AdapterError",
    "OutcomeKind",
    "Provider",
    "ProviderOutcome",
    "adapt_response",
    "finish_outcome",
]


class Provider(str, enum.Enum):
    """A provider whose raw response format :func:`adapt_response` understands."""

    openai = "openai"
    anthropic = "anthropic"
    gemini = "gemini"


class OutcomeKind(str, enum.Enum):
    """Why a response produced no usable output, or fewer than it meant to."""

    truncated = "truncated"
    refusal = "refusal"
    invalid_json = "invalid_json"
    no_structured_output = "no_structured_output"
    content_filter = "content_filter"
    # valid JSON, but an array, a string, a number or null: shapewatch watches objects (a Gemini
    # response schema may ask for an array; a tool call's arguments must be an object)
    not_an_object = "not_an_object"


#: What a ``finish_reason`` on an envelope says about its response, the names of every provider
#: and instrumentation folded to lower case (OpenAI ``length``, Anthropic ``max_tokens``, Gemini
#: ``MAX_TOKENS``/``SAFETY``, the OpenAI Responses API ``max_output_tokens``...). A reason not
#: listed (``stop``, ``tool_calls``, ``end_turn``...) says nothing went wrong.
FINISH_OUTCOMES: dict[str, OutcomeKind] = {
    **dict.fromkeys(
        ("length", "max_tokens", "max_output_tokens", "model_context_window_exceeded", "model_length"),
        OutcomeKind.truncated,
    ),
    **dict.fromkeys(
        ("content_filter", "safety", "prohibited_content", "blocklist", "spii", "image_safety"),
        OutcomeKind.content_filter,
    ),
    **dict.fromkeys(("refusal", "recitation"), OutcomeKind.refusal),
}
#: Outcome kinds counted from outputs that were stored (an envelope's ``finish_reason``) are
#: named with this prefix (``output:truncated``): the output is one of the cohort's responses
#: already, so a rate counts it in its numerator and not a second time among the responses.
WITH_OUTPUT = "output:"


def finish_outcome(finish_reason: str | None) -> str | None:
    """The outcome kind (``output:truncated``...) an output with this ``finish_reason`` counts as, if any."""
    if finish_reason is None:
        return None
    kind = FINISH_OUTCOMES.get(finish_reason.lower())
    return None if kind is None else WITH_OUTPUT + kind.value


@dataclass(frozen=True)
class ProviderOutcome:
    """A failure fact that never reaches a parser, counted per cohort.

    Example::

        ProviderOutcome(
            kind=OutcomeKind.truncated, model="gpt-4o", served_model="gpt-4o-2024-08-06",
            prompt_version="intake-v3", contract="triage", finish_reason="length",
            detail="finish_reason 'length': output cut off at the token limit",
        )
    """

    kind: OutcomeKind
    model: str
    served_model: str | None
    prompt_version: str
    contract: str
    finish_reason: str | None
    detail: str
    #: names this outcome for deduplication: the response id (or the event_id given) and
    #: its position, so re-posting a response does not count it twice; None without ids
    key: str | None = None


@dataclass(frozen=True)
class AdaptedResponse:
    """What one raw provider response became.

    Example::

        adapted = adapt_response("anthropic", body, prompt_version="intake-v3")
        for envelope in adapted.envelopes: ...   # validate, then ingest
        for outcome in adapted.outcomes: ...     # count per cohort
    """

    envelopes: list[dict[str, Any]]
    outcomes: list[ProviderOutcome]


class AdapterError(ShapewatchError, ValueError):
    """The raw response does not have the provider's shape.

    ``path`` names the offending place in the response
    (``choices[0].message.tool_calls[1].function.arguments``; ``$`` is the
    response itself) and ``reason`` says what is wrong with it.

    Example::

        try:
            adapt_response("openai", {"choices": "nope"}, prompt_version="v1")
        except AdapterError as exc:
            exc.path, exc.reason   # ("choices", "must be an array, got string")
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


def adapt_response(
    provider: Provider | str,
    response: Any,
    *,
    prompt_version: str,
    model: str | None = None,
    contract: str | None = None,
    event_id: str | None = None,
    source: str | None = None,
    contract_version: str | None = None,
) -> AdaptedResponse:
    """Turn one raw provider response into envelopes and outcomes.

    ``model`` is the model that was requested (possibly a floating alias); it
    names the cohort when given, otherwise the model the response names does.
    The envelope's ``served_model`` is always what the response says answered.

    Tool and function calls take their contract from the tool name; JSON text
    outputs use ``contract`` (default ``"default"``), as do outcomes that are
    not tied to a tool call.

    With ``event_id``, the only envelope gets it as is and several get
    ``f"{event_id}:{i}"``. Without it, ids derive from the provider's response
    id (and tool call id or position), so the same response posted twice
    yields the same ids; a response without an id yields envelopes without one.

    Raises :class:`AdapterError` when the response does not have the
    provider's shape, and ``ValueError`` for an unknown provider name.
    """
    try:
        prov = Provider(provider)
    except ValueError:
        known = ", ".join(p.value for p in Provider)
        raise ValueError(f"unknown provider {provider!r}; expected one of {known}") from None
    body = _expect_dict(response, "$")
    default_contract = contract or "default"
    parsed = _READERS[prov](body, default_contract)

    effective_model = model if model is not None else parsed.served_model
    if effective_model is None:
        raise AdapterError("model", "the response names no model and no model argument was given")
    ctx = _Context(
        model=effective_model,
        served_model=parsed.served_model,
        prompt_version=prompt_version,
        default_contract=default_contract,
    )

    produced: list[tuple[_Output, dict[str, Any], str | None]] = []
    outcomes: list[ProviderOutcome] = []
    for turn in parsed.turns:
        turn_outputs, turn_outcomes = _resolve_turn(turn, ctx)
        produced.extend((out, value, turn.finish_reason) for out, value in turn_outputs)
        outcomes.extend(turn_outcomes)

    envelopes: list[dict[str, Any]] = []
    for index, (out, value, finish_reason) in enumerate(produced):
        envelope: dict[str, Any] = {
            "model": ctx.model,
            "prompt_version": prompt_version,
            "contract": out.contract,
            "output": value,
        }
        if ctx.served_model is not None:
            envelope["served_model"] = ctx.served_model
        if event_id is not None:
            envelope["event_id"] = event_id if len(produced) == 1 else f"{event_id}:{index}"
        elif parsed.response_id is not None:
            envelope["event_id"] = parsed.response_id if out.suffix is None else f"{parsed.response_id}:{out.suffix}"
        if finish_reason is not None:
            envelope["finish_reason"] = finish_reason
        if source is not None:
            envelope["source"] = source
        if contract_version is not None:
            envelope["contract_version"] = contract_version
        envelopes.append(envelope)
    base = event_id if event_id is not None else parsed.response_id
    if base is not None:
        outcomes = [replace(o, key=f"{base}:outcome:{i}") for i, o in enumerate(outcomes)]
    return AdaptedResponse(envelopes=envelopes, outcomes=outcomes)


# --- the provider-neutral middle: turns and outputs ------------------------------------


@dataclass(frozen=True)
class _Output:
    """One structured output found in a response, before parsing."""

    contract: str
    what: str  # names it in details: "tool call 'triage' arguments", "message content"
    suffix: str | None  # appended to the response id for a derived event_id
    text: str | None = None  # JSON text still to parse
    value: dict[str, Any] | None = None  # already parsed by the provider
    is_text: bool = False  # model-written text: fences are stripped, prose is not JSON


@dataclass(frozen=True)
class _Turn:
    """One answer within a response: an OpenAI choice, a Gemini candidate, or the
    whole response for providers that have a single answer."""

    finish_reason: str | None
    outputs: list[_Output]
    nothing_detail: str
    # truncated, or a terminal kind (content_filter, refusal, invalid_json) that
    # withholds every output of the turn
    stop: OutcomeKind | None = None
    stop_detail: str = ""
    refusals: list[str] = field(default_factory=list)
    # The provider hands tool input over already parsed (Anthropic, Gemini), so a
    # call cut off by the token limit would still look like a valid object. When
    # the turn is truncated and its last block is such a call, that call is the
    # one being written when the limit hit: it is not trusted.
    last_output_open: bool = False


@dataclass(frozen=True)
class _Context:
    model: str
    served_model: str | None
    prompt_version: str
    default_contract: str

    def outcome(self, kind: OutcomeKind, contract: str, finish_reason: str | None, detail: str) -> ProviderOutcome:
        return ProviderOutcome(
            kind=kind,
            model=self.model,
            served_model=self.served_model,
            prompt_version=self.prompt_version,
            contract=contract,
            finish_reason=finish_reason,
            detail=detail,
        )


@dataclass(frozen=True)
class _Read:
    response_id: str | None
    served_model: str | None
    turns: list[_Turn]


def _resolve_turn(turn: _Turn, ctx: _Context) -> tuple[list[tuple[_Output, dict[str, Any]]], list[ProviderOutcome]]:
    outputs: list[tuple[_Output, dict[str, Any]]] = []
    outcomes: list[ProviderOutcome] = []
    finish = turn.finish_reason

    if turn.stop is not None and turn.stop is not OutcomeKind.truncated:
        # Filtered, refused or malformed output is not a sample of the model's
        # behaviour on the contract; whatever partial content came back is withheld.
        contract = turn.outputs[0].contract if turn.outputs else ctx.default_contract
        return [], [ctx.outcome(turn.stop, contract, finish, turn.stop_detail)]

    for refusal in turn.refusals:
        outcomes.append(ctx.outcome(OutcomeKind.refusal, ctx.default_contract, finish, f"refusal: {_shorten(refusal)}"))

    truncated = turn.stop is OutcomeKind.truncated
    cut: tuple[_Output, str] | None = None
    last = len(turn.outputs) - 1
    for index, out in enumerate(turn.outputs):
        if truncated and out.value is not None and index == last and turn.last_output_open:
            cut = cut or (out, f"{out.what} may be incomplete")
            continue
        value, kind, detail = _parse_output(out)
        if value is not None:
            outputs.append((out, value))
        elif truncated:
            # Unparseable because it was cut off: count the truncation once,
            # not an invalid_json on top of it.
            cut = cut or (out, detail)
        elif kind is not None:
            outcomes.append(ctx.outcome(kind, out.contract, finish, detail))

    if truncated:
        if cut is not None:
            contract, detail = cut[0].contract, f"{turn.stop_detail}; {cut[1]}"
        else:
            contract = turn.outputs[-1].contract if turn.outputs else ctx.default_contract
            detail = turn.stop_detail
        outcomes.append(ctx.outcome(OutcomeKind.truncated, contract, finish, detail))

    if not outputs and not outcomes:
        outcomes.append(
            ctx.outcome(OutcomeKind.no_structured_output, ctx.default_contract, finish, turn.nothing_detail)
        )
    return outputs, outcomes


_FENCE = re.compile(r"\A\s*```[ \t]*(?:json)?[ \t]*\r?\n(?P<body>.*?)\r?\n?[ \t]*```\s*\Z", re.S | re.I)


def _strip_fence(text: str) -> str:
    match = _FENCE.match(text)
    return match.group("body") if match else text


def _parse_output(out: _Output) -> tuple[dict[str, Any] | None, OutcomeKind | None, str]:
    """Return (object, None, "") or (None, kind of failure, detail)."""
    if out.value is not None:
        # A copy, so that an envelope never aliases the caller's response. Nested past Python's
        # recursion limit (orjson parsed up to 1,024 levels), it is refused as such.
        try:
            return copy.deepcopy(out.value), None, ""
        except RecursionError:
            return None, OutcomeKind.invalid_json, f"{out.what}: not valid JSON: nested too deeply"
    text = out.text or ""
    if out.is_text:
        text = _strip_fence(text)
    try:
        # Duplicate keys and integers beyond 64 bits come out marked, for the envelope
        # validator to refuse by name (json.loads would keep the last key silently).
        value = loads_marking(text)
    except json.JSONDecodeError as exc:
        if out.is_text and not text.lstrip().startswith(("{", "[")):
            return None, OutcomeKind.no_structured_output, f"{out.what}: prose, not JSON"
        # json's messages read "Expecting ',' delimiter" but also "Unterminated
        # string starting at": the position completes either.
        where = f"char {exc.pos}" if exc.msg.endswith(" at") else f"at char {exc.pos}"
        return None, OutcomeKind.invalid_json, f"{out.what}: not valid JSON: {exc.msg} {where}"
    except (ValueError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        return None, OutcomeKind.invalid_json, f"{out.what}: not valid JSON: {reason}"
    if not isinstance(value, dict):
        return None, OutcomeKind.not_an_object, (f"{out.what}: JSON {_json_type(value)}, not an object")
    return value, None, ""


def _shorten(text: str, limit: int = 200) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


# --- shape checks ------------------------------------------------------------------------


def _json_type(value: object) -> str:
    return json_type_of(value).value


def _join(path: str, key: str) -> str:
    return key if path in ("", "$") else f"{path}.{key}"


def _expect_dict(value: object, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise AdapterError(path, f"must be an object, got {_json_type(value)}")
    return value


def _api_error(obj: dict[str, Any]) -> str | None:
    # An API error body posted as if it were a response deserves a clearer word.
    error = obj.get("error")
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return f"the body is an API error: {_shorten(error['message'])}"
    return None


def _missing_reason(obj: dict[str, Any]) -> str:
    error = _api_error(obj)
    return "missing" if error is None else f"missing; {error}"


def _required(obj: dict[str, Any], key: str, path: str) -> Any:
    if obj.get(key) is None:
        raise AdapterError(_join(path, key), _missing_reason(obj) if path == "$" else "missing")
    return obj[key]


def _req_str(obj: dict[str, Any], key: str, path: str) -> str:
    value = _required(obj, key, path)
    if not isinstance(value, str):
        raise AdapterError(_join(path, key), f"must be a string, got {_json_type(value)}")
    return value


def _opt_str(obj: dict[str, Any], key: str, path: str) -> str | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, str):
        raise AdapterError(_join(path, key), f"must be a string, got {_json_type(value)}")
    return value


def _req_list(obj: dict[str, Any], key: str, path: str) -> list[Any]:
    value = _required(obj, key, path)
    if not isinstance(value, list):
        raise AdapterError(_join(path, key), f"must be an array, got {_json_type(value)}")
    return value


def _opt_list(obj: dict[str, Any], key: str, path: str) -> list[Any]:
    value = obj.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise AdapterError(_join(path, key), f"must be an array, got {_json_type(value)}")
    return value


def _opt_dict(obj: dict[str, Any], key: str, path: str) -> dict[str, Any]:
    value = obj.get(key)
    return {} if value is None else _expect_dict(value, _join(path, key))


# --- OpenAI ------------------------------------------------------------------------------


def _read_openai(body: dict[str, Any], default_contract: str) -> _Read:
    kind = _opt_str(body, "object", "$")
    if kind == "response" or (kind is None and "output" in body and "choices" not in body):
        return _read_openai_responses(body, default_contract)
    if kind not in (None, "chat.completion"):
        raise AdapterError(
            "object",
            f"expected 'chat.completion' or 'response', got {kind!r}"
            + ("; aggregate streamed chunks first" if kind == "chat.completion.chunk" else ""),
        )
    return _read_openai_chat(body, default_contract)


def _read_openai_chat(body: dict[str, Any], default_contract: str) -> _Read:
    response_id = _opt_str(body, "id", "$")
    served_model = _opt_str(body, "model", "$")
    turns: list[_Turn] = []
    for i, raw_choice in enumerate(_req_list(body, "choices", "$")):
        path = f"choices[{i}]"
        choice = _expect_dict(raw_choice, path)
        finish = _opt_str(choice, "finish_reason", path)
        mpath = f"{path}.message"
        message = _expect_dict(_required(choice, "message", path), mpath)
        refusal = _opt_str(message, "refusal", mpath)
        content = _opt_str(message, "content", mpath)

        calls: list[_Output] = []
        for j, raw_call in enumerate(_opt_list(message, "tool_calls", mpath)):
            tpath = f"{mpath}.tool_calls[{j}]"
            call = _expect_dict(raw_call, tpath)
            if _opt_str(call, "type", tpath) not in (None, "function"):
                continue  # custom tools take free text, not a JSON object
            call_id = _opt_str(call, "id", tpath)
            calls.append(_openai_function(call, tpath, call_id or f"{i}:{j}"))
        if not calls and message.get("function_call") is not None:
            # The deprecated single function call, still returned to old clients.
            calls.append(_openai_function(message, mpath, f"{i}", key="function_call"))

        outputs = calls
        if not outputs and content is not None and content.strip():
            outputs = [
                _Output(
                    contract=default_contract,
                    what="message content",
                    suffix=str(i),
                    text=content,
                    is_text=True,
                )
            ]
        stop, stop_detail = None, ""
        if finish == "length":
            stop, stop_detail = (
                OutcomeKind.truncated,
                "finish_reason 'length': output cut off at the token limit",
            )
        elif finish == "content_filter":
            stop, stop_detail = (
                OutcomeKind.content_filter,
                "finish_reason 'content_filter': output withheld by the content filter",
            )
        turns.append(
            _Turn(
                finish_reason=finish,
                outputs=outputs,
                nothing_detail="the message has no tool call and no content",
                stop=stop,
                stop_detail=stop_detail,
                refusals=[refusal] if refusal else [],
            )
        )
    if not turns:
        turns.append(_Turn(finish_reason=None, outputs=[], nothing_detail="no choices"))
    return _Read(response_id, served_model, turns)


def _openai_function(holder: dict[str, Any], path: str, suffix: str, key: str = "function") -> _Output:
    fpath = f"{path}.{key}"
    function = _expect_dict(_required(holder, key, path), fpath)
    name = _req_str(function, "name", fpath)
    arguments = _req_str(function, "arguments", fpath)
    return _Output(contract=name, what=f"tool call '{name}' arguments", suffix=suffix, text=arguments)


def _read_openai_responses(body: dict[str, Any], default_contract: str) -> _Read:
    response_id = _opt_str(body, "id", "$")
    served_model = _opt_str(body, "model", "$")
    status = _opt_str(body, "status", "$")
    reason = _opt_str(_opt_dict(body, "incomplete_details", "$"), "reason", "incomplete_details")
    # No finish_reason in this API: the incomplete reason when there is one
    # ("max_output_tokens", "content_filter"), else the status ("completed").
    finish = reason if reason is not None else status

    calls: list[_Output] = []
    texts: list[_Output] = []
    refusals: list[str] = []
    for k, raw_item in enumerate(_req_list(body, "output", "$")):
        path = f"output[{k}]"
        item = _expect_dict(raw_item, path)
        item_type = _req_str(item, "type", path)
        if item_type == "function_call":
            name = _req_str(item, "name", path)
            arguments = _req_str(item, "arguments", path)
            call_id = _opt_str(item, "call_id", path) or _opt_str(item, "id", path)
            calls.append(
                _Output(
                    contract=name,
                    what=f"function call '{name}' arguments",
                    suffix=call_id or str(k),
                    text=arguments,
                )
            )
        elif item_type == "message":
            pieces: list[str] = []
            for p, raw_part in enumerate(_req_list(item, "content", path)):
                ppath = f"{path}.content[{p}]"
                part = _expect_dict(raw_part, ppath)
                part_type = _req_str(part, "type", ppath)
                if part_type == "output_text":
                    pieces.append(_req_str(part, "text", ppath))
                elif part_type == "refusal":
                    refusals.append(_req_str(part, "refusal", ppath))
            text = "".join(pieces)
            if text.strip():
                texts.append(
                    _Output(
                        contract=default_contract,
                        what="message text",
                        suffix=_opt_str(item, "id", path) or str(k),
                        text=text,
                        is_text=True,
                    )
                )
        # reasoning, web_search_call and other item types carry no structured output

    stop, stop_detail = None, ""
    if reason == "max_output_tokens":
        stop, stop_detail = (
            OutcomeKind.truncated,
            "incomplete 'max_output_tokens': output cut off at the token limit",
        )
    elif reason == "content_filter":
        stop, stop_detail = (
            OutcomeKind.content_filter,
            "incomplete 'content_filter': output withheld by the content filter",
        )
    turn = _Turn(
        finish_reason=finish,
        outputs=calls or texts,
        nothing_detail=f"no function call and no message text (status {status!r})",
        stop=stop,
        stop_detail=stop_detail,
        refusals=refusals,
    )
    return _Read(response_id, served_model, [turn])


# --- Anthropic ---------------------------------------------------------------------------


def _read_anthropic(body: dict[str, Any], default_contract: str) -> _Read:
    kind = _opt_str(body, "type", "$")
    if kind not in (None, "message"):
        error = _api_error(body)
        raise AdapterError("type", f"expected 'message', got {kind!r}" + (f"; {error}" if error else ""))
    response_id = _opt_str(body, "id", "$")
    served_model = _opt_str(body, "model", "$")
    stop_reason = _opt_str(body, "stop_reason", "$")
    blocks = _req_list(body, "content", "$")

    calls: list[_Output] = []
    pieces: list[str] = []
    last_is_call = False
    for b, raw_block in enumerate(blocks):
        path = f"content[{b}]"
        block = _expect_dict(raw_block, path)
        block_type = _req_str(block, "type", path)
        last_is_call = block_type == "tool_use"
        if block_type == "tool_use":
            name = _req_str(block, "name", path)
            tool_input = _expect_dict(_required(block, "input", path), f"{path}.input")
            calls.append(
                _Output(
                    contract=name,
                    what=f"tool_use '{name}' input",
                    suffix=_opt_str(block, "id", path) or str(b),
                    value=tool_input,
                )
            )
        elif block_type == "text":
            pieces.append(_req_str(block, "text", path))
        # thinking, server_tool_use and the like carry no structured output

    outputs = calls
    text = "".join(pieces)
    if not outputs and text.strip():
        # One message, one answer: the JSON text output is the message itself.
        outputs = [_Output(contract=default_contract, what="text", suffix=None, text=text, is_text=True)]

    stop, stop_detail = None, ""
    if stop_reason in ("max_tokens", "model_context_window_exceeded"):
        stop, stop_detail = (
            OutcomeKind.truncated,
            f"stop_reason {stop_reason!r}: output cut off at the token limit",
        )
    elif stop_reason == "refusal":
        details = _opt_dict(body, "stop_details", "$")
        explanation = _opt_str(details, "explanation", "stop_details")
        category = _opt_str(details, "category", "stop_details")
        stop_detail = "stop_reason 'refusal'"
        if category:
            stop_detail += f" ({category})"
        if explanation or text.strip():
            stop_detail += f": {_shorten(explanation or text)}"
        stop = OutcomeKind.refusal
    turn = _Turn(
        finish_reason=stop_reason,
        outputs=outputs,
        nothing_detail="no tool_use block and no JSON text",
        stop=stop,
        stop_detail=stop_detail,
        last_output_open=last_is_call,
    )
    return _Read(response_id, served_model, [turn])


# --- Gemini ------------------------------------------------------------------------------

_GEMINI_FILTERED = frozenset(
    {
        "SAFETY",
        "PROHIBITED_CONTENT",
        "BLOCKLIST",
        "SPII",
        "IMAGE_SAFETY",
        "IMAGE_PROHIBITED_CONTENT",
    }
)


def _read_gemini(body: dict[str, Any], default_contract: str) -> _Read:
    response_id = _opt_str(body, "responseId", "$")
    served_model = _opt_str(body, "modelVersion", "$")
    feedback = _opt_dict(body, "promptFeedback", "$")
    block_reason = _opt_str(feedback, "blockReason", "promptFeedback")
    candidates = _opt_list(body, "candidates", "$")
    if not candidates:
        if block_reason is None:
            if "candidates" not in body:
                raise AdapterError("candidates", _missing_reason(body))
            turn = _Turn(finish_reason=None, outputs=[], nothing_detail="no candidates")
            return _Read(response_id, served_model, [turn])
        message = _opt_str(feedback, "blockReasonMessage", "promptFeedback")
        detail = f"prompt blocked: {block_reason}" + (f": {_shorten(message)}" if message else "")
        turn = _Turn(
            finish_reason=None,
            outputs=[],
            nothing_detail="",
            stop=OutcomeKind.refusal,
            stop_detail=detail,
        )
        return _Read(response_id, served_model, [turn])

    turns: list[_Turn] = []
    for c, raw_candidate in enumerate(candidates):
        path = f"candidates[{c}]"
        candidate = _expect_dict(raw_candidate, path)
        finish = _opt_str(candidate, "finishReason", path)
        finish_message = _opt_str(candidate, "finishMessage", path)
        content = _opt_dict(candidate, "content", path)
        calls: list[_Output] = []
        pieces: list[str] = []
        last_is_call = False
        for p, raw_part in enumerate(_opt_list(content, "parts", f"{path}.content")):
            ppath = f"{path}.content.parts[{p}]"
            part = _expect_dict(raw_part, ppath)
            last_is_call = part.get("functionCall") is not None
            if last_is_call:
                fpath = f"{ppath}.functionCall"
                call = _expect_dict(part["functionCall"], fpath)
                name = _req_str(call, "name", fpath)
                args = call.get("args")
                # args is omitted for a function without parameters
                args_dict = {} if args is None else _expect_dict(args, f"{fpath}.args")
                calls.append(
                    _Output(
                        contract=name,
                        what=f"functionCall '{name}' args",
                        suffix=f"{c}:{p}",
                        value=args_dict,
                    )
                )
            elif part.get("text") is not None:
                text = _req_str(part, "text", ppath)
                if part.get("thought") is not True:  # thought summaries are not the answer
                    pieces.append(text)
            # inlineData, executableCode and the like carry no structured output

        outputs = calls
        text = "".join(pieces)
        if not outputs and text.strip():
            outputs = [_Output(contract=default_contract, what="text", suffix=str(c), text=text, is_text=True)]

        suffix = f": {_shorten(finish_message)}" if finish_message else ""
        stop: OutcomeKind | None = None
        stop_detail = ""
        if finish == "MAX_TOKENS":
            stop = OutcomeKind.truncated
            stop_detail = "finishReason 'MAX_TOKENS': output cut off at the token limit"
        elif finish in _GEMINI_FILTERED:
            stop = OutcomeKind.content_filter
            stop_detail = f"finishReason {finish!r}: output withheld by the content filter{suffix}"
        elif finish == "RECITATION":
            stop = OutcomeKind.refusal
            stop_detail = f"finishReason 'RECITATION': output withheld as recitation{suffix}"
        elif finish == "MALFORMED_FUNCTION_CALL":
            stop = OutcomeKind.invalid_json
            stop_detail = f"finishReason 'MALFORMED_FUNCTION_CALL'{suffix}"
        turns.append(
            _Turn(
                finish_reason=finish,
                outputs=outputs,
                nothing_detail="no functionCall part and no JSON text",
                stop=stop,
                stop_detail=stop_detail,
                last_output_open=last_is_call,
            )
        )
    return _Read(response_id, served_model, turns)


_READERS: dict[Provider, Callable[[dict[str, Any], str], _Read]] = {
    Provider.openai: _read_openai,
    Provider.anthropic: _read_anthropic,
    Provider.gemini: _read_gemini,
}
