"""Calling a provider for one probe case: the one place that knows the request formats (the
response formats are ``collector/adapters.py``'s).

OpenAI-compatible chat completions (OpenAI, Azure, vLLM, Ollama, llama.cpp servers), Anthropic
Messages, Gemini ``generateContent``, and ``command``: a program run with the case as JSON on
stdin, printing the provider's raw response on stdout (``response_shape`` says whose). Requests go
over httpx; 429, 5xx and transport errors are retried with exponential backoff by tenacity,
waiting what a ``Retry-After`` header asks (up to ``MAX_RETRY_AFTER``), at most the suite's
``max_attempts`` times. Requests of one suite start at most ``rate_per_second`` apart (a shared
pacer), ``concurrency`` at a time (the runner's pool). The API key is read from the environment
variable the suite names, at call time, and never logged.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import orjson
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from shapewatch.collector import ShapewatchError, parse_retry_after

from .suite import Case, Suite

__all__ = ["DEFAULT_BASE_URLS", "MAX_RESPONSE_BYTES", "MAX_RETRY_AFTER", "Pacer", "ProbeCallFailed", "call_case"]

DEFAULT_BASE_URLS = {
    "openai": "https://api.openai.com/v1",
    "anthropic": "https://api.anthropic.com",
    "gemini": "https://generativelanguage.googleapis.com",
}
#: The longest Retry-After honoured (seconds); the largest response read.
MAX_RETRY_AFTER = 120.0
MAX_RESPONSE_BYTES = 8 << 20


class ProbeCallFailed(ShapewatchError):
    """A case got no usable answer: the provider refused it, kept failing, or answered garbage."""

    def __init__(self, reason: str, *, retryable: bool = False, retry_after: float | None = None) -> None:
        self.reason = reason
        self.retryable = retryable
        self.retry_after = retry_after
        super().__init__(reason)


class Pacer:
    """Starts at most ``rate`` calls per second across threads: each call waits for its slot."""

    def __init__(self, rate: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._gap = 1.0 / rate
        self._next = 0.0
        self._lock = threading.Lock()
        self._clock = clock

    def wait(self, sleep: Callable[[float], None] = time.sleep) -> None:
        with self._lock:
            now = self._clock()
            at = max(now, self._next)
            self._next = at + self._gap
        if at > now:
            sleep(at - now)


def _request(suite: Suite, case: Case) -> tuple[str, dict[str, str], dict[str, Any]]:
    """(url, headers, JSON body) of one case's request."""
    key = os.environ.get(suite.api_key_env, "") if suite.api_key_env else ""
    base = suite.base_url or DEFAULT_BASE_URLS[suite.provider]
    system = "\n\n".join(m["content"] for m in case.messages if m["role"] == "system")
    turns = [m for m in case.messages if m["role"] != "system"]
    if suite.provider == "openai":
        body: dict[str, Any] = {"model": suite.model, "messages": list(case.messages), "max_tokens": suite.max_tokens}
        if suite.tools:
            body["tools"] = [{"type": "function", "function": t} for t in suite.tools]
        if suite.response_format is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": suite.contract.replace("/", "_")[:64], "schema": suite.response_format},
            }
        return f"{base}/chat/completions", ({"Authorization": f"Bearer {key}"} if key else {}), body
    if suite.provider == "anthropic":
        body = {"model": suite.model, "max_tokens": suite.max_tokens, "messages": turns}
        if system:
            body["system"] = system
        if suite.tools:
            body["tools"] = [
                {"name": t["name"], "description": t["description"], "input_schema": t["parameters"]}
                for t in suite.tools
            ]
        headers = {"anthropic-version": "2023-06-01", **({"x-api-key": key} if key else {})}
        return f"{base}/v1/messages", headers, body
    body = {
        "contents": [
            {"role": "model" if m["role"] == "assistant" else "user", "parts": [{"text": m["content"]}]} for m in turns
        ],
        "generationConfig": {"maxOutputTokens": suite.max_tokens},
    }
    if system:
        body["systemInstruction"] = {"parts": [{"text": system}]}
    if suite.tools:
        body["tools"] = [{"functionDeclarations": list(suite.tools)}]
    if suite.response_format is not None:
        body["generationConfig"].update(responseMimeType="application/json", responseSchema=suite.response_format)
    return (
        f"{base}/v1beta/models/{suite.model}:generateContent",
        ({"x-goog-api-key": key} if key else {}),
        body,
    )


def _post(client: httpx.Client, url: str, headers: dict[str, str], body: dict[str, Any]) -> Any:
    try:
        r = client.post(url, headers=headers, content=orjson.dumps(body), timeout=client.timeout)
    except httpx.TransportError as exc:
        raise ProbeCallFailed(f"{type(exc).__name__}: {exc}", retryable=True) from exc
    if r.status_code == 429 or r.status_code >= 500:
        raise ProbeCallFailed(
            f"the provider answered {r.status_code}",
            retryable=True,
            retry_after=parse_retry_after(r.headers.get("retry-after")),
        )
    if r.status_code >= 400:
        raise ProbeCallFailed(f"the provider answered {r.status_code}: {r.text[:300]}")
    if len(r.content) > MAX_RESPONSE_BYTES:
        raise ProbeCallFailed(f"the response is {len(r.content)} bytes; at most {MAX_RESPONSE_BYTES} are read")
    try:
        return orjson.loads(r.content)
    except orjson.JSONDecodeError:
        raise ProbeCallFailed(f"the response is not JSON: {r.text[:100]!r}") from None


def _run_command(suite: Suite, case: Case) -> Any:
    payload = {
        "model": suite.model,
        "case": case.id,
        "messages": list(case.messages),
        "tools": list(suite.tools),
        "response_format": suite.response_format,
    }
    try:
        done = subprocess.run(
            list(suite.command),
            input=orjson.dumps(payload),
            capture_output=True,
            timeout=suite.timeout_seconds,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        retryable = isinstance(exc, subprocess.TimeoutExpired)
        raise ProbeCallFailed(f"the command failed to run: {exc}", retryable=retryable) from exc
    if done.returncode != 0:
        raise ProbeCallFailed(f"the command exited {done.returncode}: {done.stderr[-300:].decode(errors='replace')}")
    if len(done.stdout) > MAX_RESPONSE_BYTES:
        raise ProbeCallFailed(f"the command printed {len(done.stdout)} bytes; at most {MAX_RESPONSE_BYTES} are read")
    try:
        return orjson.loads(done.stdout)
    except orjson.JSONDecodeError:
        raise ProbeCallFailed(f"the command printed no JSON: {done.stdout[:100]!r}") from None


def _wait(backoff: Callable[[RetryCallState], float]) -> Callable[[RetryCallState], float]:
    def wait(state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome is not None else None
        if isinstance(exc, ProbeCallFailed) and exc.retry_after is not None:
            return min(max(exc.retry_after, 0.0), MAX_RETRY_AFTER)
        return backoff(state)

    return wait


def call_case(
    suite: Suite,
    case: Case,
    client: httpx.Client,
    pacer: Pacer,
    *,
    sleep: Callable[[float], None] = time.sleep,
    backoff_seconds: float = 1.0,
) -> Any:
    """The provider's raw response to one case (decoded JSON), after retries; raises
    ``ProbeCallFailed`` when there is none."""
    retrying = Retrying(
        stop=stop_after_attempt(suite.max_attempts),
        wait=_wait(wait_exponential(multiplier=backoff_seconds, max=60)),
        retry=retry_if_exception(lambda e: isinstance(e, ProbeCallFailed) and e.retryable),
        reraise=True,
        sleep=sleep,
    )

    def attempt() -> Any:
        pacer.wait(sleep)
        if suite.provider == "command":
            return _run_command(suite, case)
        url, headers, body = _request(suite, case)
        return _post(client, url, headers, body)

    return retrying(attempt)
