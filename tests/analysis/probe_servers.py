"""Local provider servers for probe suite tests: real HTTP servers (stdlib ``ThreadingHTTPServer``
on loopback) that replay recorded responses, in the OpenAI chat completions, Anthropic Messages
and Gemini ``generateContent`` shapes.

A recording maps each case's user message to the decision the model made (a tool and its
arguments, or no tool); the server answers a request with that decision in its provider's
shape. ``fail_first`` makes the first request of a case answer 429 (with ``Retry-After``) or 503.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SERVED = {"openai": "gpt-4o-2024-08-06", "anthropic": "claude-sonnet-4-5-20250929", "gemini": "gemini-2.0-flash-001"}

#: A decision: (tool, arguments) or None for a plain text answer (no tool).
Decision = tuple[str, dict[str, Any]] | None


def openai_response(case: str, decision: Decision, model: str) -> dict[str, Any]:
    if decision is None:
        message: dict[str, Any] = {"role": "assistant", "content": "Happy to help with anything else."}
        finish = "stop"
    else:
        tool, args = decision
        call = {"id": f"call_{case}", "type": "function", "function": {"name": tool, "arguments": json.dumps(args)}}
        message, finish = {"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"
    return {
        "id": f"chatcmpl-{case}",
        "object": "chat.completion",
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    }


def anthropic_response(case: str, decision: Decision, model: str) -> dict[str, Any]:
    if decision is None:
        content: list[dict[str, Any]] = [{"type": "text", "text": "Happy to help with anything else."}]
        stop = "end_turn"
    else:
        tool, args = decision
        content = [
            {"type": "text", "text": "Let me do that."},
            {"type": "tool_use", "id": f"toolu_{case}", "name": tool, "input": args},
        ]
        stop = "tool_use"
    return {"id": f"msg_{case}", "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": stop}  # fmt: skip


def gemini_response(case: str, decision: Decision, model: str) -> dict[str, Any]:
    parts: list[dict[str, Any]]
    if decision is None:
        parts = [{"text": "Happy to help with anything else."}]
    else:
        tool, args = decision
        parts = [{"functionCall": {"name": tool, "args": args}}]
    return {
        "candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
        "modelVersion": model,
        "responseId": f"resp-{case}",
    }


_SHAPES = {"openai": openai_response, "anthropic": anthropic_response, "gemini": gemini_response}


def _last_user_text(provider: str, body: dict[str, Any]) -> str:
    if provider == "gemini":
        return str(body["contents"][-1]["parts"][0]["text"])
    return str(body["messages"][-1]["content"])


@dataclass
class Recorder:
    provider: str
    recording: dict[str, tuple[str, Decision]]  # user message -> (case id, decision)
    fail_first: dict[str, tuple[int, str | None]] = field(default_factory=dict)  # case -> (status, Retry-After)
    requests: list[dict[str, Any]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, path: str, headers: dict[str, str], body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        with self.lock:
            self.requests.append(body)
            self.paths.append(path)
            self.headers.append(headers)
            case, decision = self.recording[_last_user_text(self.provider, body)]
            failing = self.fail_first.pop(case, None)
        if failing is not None:
            status, retry_after = failing
            extra = {"Retry-After": retry_after} if retry_after is not None else {}
            return status, extra, b'{"error": {"message": "slow down"}}'
        doc = _SHAPES[self.provider](case, decision, SERVED[self.provider])
        return 200, {}, json.dumps(doc).encode()


@contextmanager
def provider_server(recorder: Recorder) -> Iterator[str]:
    """A server on loopback answering from ``recorder``; yields its base URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length))
            status, extra, payload = recorder.answer(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            for k, v in extra.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
