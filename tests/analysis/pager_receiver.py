"""A local pager for tests: a threaded HTTP server on 127.0.0.1 that keeps incidents like PagerDuty.

Incident logic (PagerDuty Events API v2, by ``dedup_key``): a trigger with no open
incident for its key opens one; a trigger for an open one is folded into it
(deduplicated); a resolve closes the open one (and is a no-op without one).
Bodies without ``event_action`` (Alertmanager, generic webhooks) are recorded only.

Answers are scripted, one step per request, then 202 for every request:

- an int: that status; a 2xx processes the event, anything else does not;
- ``Step(status, headers={"Retry-After": "0"})``: the same with headers;
- ``DROP``: read the request, close the connection without answering (not processed);
- ``ACCEPT_THEN_DROP``: process the event, then close without answering
  (the sender cannot know the pager accepted it);
- ``HANG``: answer nothing until the receiver closes (the client times out).

Every request is recorded (path, headers, parsed body, what was answered).

>>> with PagerReceiver() as pager:          # doctest: +SKIP
...     pager.script(500, Step(429, {"Retry-After": "0"}), DROP)
...     ...  # point a target at pager.url
...     pager.open_incidents()
"""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["ACCEPT_THEN_DROP", "DROP", "HANG", "Incident", "PagerReceiver", "Recorded", "Step"]

DROP = "drop"
ACCEPT_THEN_DROP = "accept_then_drop"
HANG = "hang"


@dataclass(frozen=True)
class Step:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: str = ""


@dataclass
class Incident:
    dedup_key: str
    open: bool = True
    triggers: int = 1  # trigger events folded into it (1 = no duplicate ever arrived)


@dataclass(frozen=True)
class Recorded:
    path: str
    headers: dict[str, str]  # lower-case names
    body: Any  # parsed JSON, or the text when it was not JSON
    answer: int | str  # the status sent, or DROP / ACCEPT_THEN_DROP / HANG


class PagerReceiver:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._steps: deque[int | str | Step] = deque()
        self._release = threading.Event()
        self.requests: list[Recorded] = []
        self.incidents: list[Incident] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                receiver._handle(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        # A short poll interval: shutdown() returns once the serving loop next looks.
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.02,), name="pager-receiver", daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v2/enqueue"

    def script(self, *steps: int | str | Step) -> None:
        """Answer the next requests with these steps, in order (then 202)."""
        with self._lock:
            self._steps.extend(steps)

    def open_incidents(self) -> list[Incident]:
        with self._lock:
            return [i for i in self.incidents if i.open]

    def incidents_for(self, dedup_key: str) -> list[Incident]:
        with self._lock:
            return [i for i in self.incidents if i.dedup_key == dedup_key]

    def bodies(self) -> list[Any]:
        with self._lock:
            return [r.body for r in self.requests]

    def close(self) -> None:
        self._release.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def __enter__(self) -> PagerReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- request handling (server threads) ---------------------------------------------------

    @staticmethod
    def read_body(h: BaseHTTPRequestHandler) -> Any:
        """The request's JSON body, or its text when it is not JSON."""
        raw = h.rfile.read(int(h.headers.get("Content-Length") or 0))
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode("utf-8", "replace")

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        body = self.read_body(h)
        with self._lock:
            step: int | str | Step = self._steps.popleft() if self._steps else 202
            answer = step.status if isinstance(step, Step) else step
            self.requests.append(Recorded(h.path, {k.lower(): v for k, v in h.headers.items()}, body, answer))
            if step == ACCEPT_THEN_DROP or (isinstance(answer, int) and 200 <= answer < 300):
                self._process(body)
        if step in (DROP, ACCEPT_THEN_DROP):
            h.close_connection = True  # nothing written: the client sees the connection end
            return
        if step == HANG:
            self._release.wait(30)
            h.close_connection = True
            return
        status = step.status if isinstance(step, Step) else int(step)
        headers = step.headers if isinstance(step, Step) else {}
        text = (
            step.body
            if isinstance(step, Step) and step.body
            else (
                json.dumps({"status": "success", "message": "Event processed"})
                if 200 <= status < 300
                else json.dumps({"status": "error", "message": f"scripted {status}"})
            )
        )
        data = text.encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        for name, value in headers.items():
            h.send_header(name, value)
        h.end_headers()
        h.wfile.write(data)

    def _process(self, body: Any) -> None:
        if not isinstance(body, dict) or "event_action" not in body:
            return
        key = str(body.get("dedup_key"))
        current = next((i for i in self.incidents if i.dedup_key == key and i.open), None)
        if body["event_action"] == "trigger":
            if current is None:
                self.incidents.append(Incident(key))
            else:
                current.triggers += 1
        elif body["event_action"] == "resolve" and current is not None:
            current.open = False
