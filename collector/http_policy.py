"""How a request reaches the service: one body policy for every route, bounded connections.

Every route, ingest or admin, reads its body through ``BodyPolicy``, an ASGI middleware in
front of the whole app, as the route reads it (after its token was checked):

- **a size limit by route:** ingest routes (``/v1/outputs``, ``/v1/provider/...``,
  ``/v1/traces``) take ``max_body_bytes``; the routes that take a document (a baseline to
  import, a contract to register) ``max_document_bytes``; every other route
  ``max_admin_body_bytes``. A declared ``Content-Length`` over the limit is refused before a
  byte is read, a body that runs over it as soon as it does (413);
- **a read timeout:** 408 when no byte came for ``body_idle_seconds``, or the whole body not
  within ``body_total_seconds``;
- **bodies held at once:** their sum is bounded (``_BODIES_HELD`` ingest bodies' worth); a
  request beyond it is answered 503 with ``Retry-After`` instead of being read.

Before that, the connection itself (``guarded_protocol``, uvicorn's h11 protocol with two
additions): a connection must deliver a request's headers within ``header_timeout_seconds``
of opening (or of its first byte after a keep-alive pause), and the service holds at most
``max_connections``: a new one beyond the cap closes the oldest connection still waiting for
its headers among those of the client address holding the most connections, or, when every
connection is busy with a request, is answered 503 with ``Retry-After`` and closed. Uvicorn's own limits cover the rest: ``timeout_keep_alive`` for
idle keep-alive connections, ``h11_max_incomplete_event_size`` for the request head.

>>> app = BodyPolicy(app, BodyLimits.from_settings(settings))                 # doctest: +SKIP
>>> uvicorn.Config(app, http=guarded_protocol(10.0, 1000), timeout_keep_alive=5)  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

import h11
import orjson
import uvicorn
from fastapi import HTTPException
from uvicorn.protocols.http.h11_impl import H11Protocol

from .errors import FieldError
from .settings import Settings

__all__ = ["BodyLimits", "BodyPolicy", "BodyRefused", "guarded_protocol", "server_for"]

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

#: Bodies held at once, in ingest bodies (max_body_bytes): 150 clients each sending 16 MB took
#: the service from 260 MB to 2.6 GB of RSS.
_BODIES_HELD = 8
_INGEST_PREFIXES = ("/v1/outputs", "/v1/provider/", "/v1/traces")
_DOCUMENT_PATHS = ("/v1/baselines/import", "/v1/contracts")


@dataclass(frozen=True)
class BodyLimits:
    """The body policy's figures (see the module docstring).

    >>> BodyLimits(ingest_bytes=16 << 20, document_bytes=16 << 20, admin_bytes=1 << 20,
    ...            idle_seconds=30, total_seconds=300).limit_for("/v1/silences")
    1048576
    """

    ingest_bytes: int
    document_bytes: int
    admin_bytes: int
    idle_seconds: float
    total_seconds: float

    @classmethod
    def from_settings(cls, s: Settings) -> BodyLimits:
        return cls(
            ingest_bytes=s.max_body_bytes,
            document_bytes=s.max_document_bytes,
            admin_bytes=s.max_admin_body_bytes,
            idle_seconds=s.body_idle_seconds,
            total_seconds=s.body_total_seconds,
        )

    @property
    def held_bytes(self) -> int:
        """The most bytes of request bodies held at once."""
        return _BODIES_HELD * max(self.ingest_bytes, self.document_bytes, self.admin_bytes)

    def limit_for(self, path: str) -> int:
        if path.startswith(_INGEST_PREFIXES):
            return self.ingest_bytes
        if path in _DOCUMENT_PATHS:
            return self.document_bytes
        return self.admin_bytes


class BodyRefused(HTTPException):
    """A request body refused by the policy: 408, 413 or 503, with the field it names.

    An ``HTTPException`` on purpose: FastAPI passes one raised while it reads a body through to
    the error handlers (any other exception becomes its own 400)."""

    def __init__(self, status: int, message: str, field: FieldError, headers: dict[str, str] | None = None) -> None:
        super().__init__(status, message, headers)
        self.fields = [field]


class BodyPolicy:
    """The ASGI middleware that polices every request's body under ``BodyLimits`` (module docstring).

    It reads nothing itself: the body is checked as the route reads it, so a request refused
    before its body is read (a missing token) costs no body at all.
    """

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], limits: BodyLimits) -> None:
        self.app = app
        self.limits = limits
        # Bytes of request bodies held now (on the event loop only: no lock).
        self.held = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limits = self.limits
        limit = limits.limit_for(str(scope.get("path", "")))
        declared = next((v for k, v in scope.get("headers") or () if k == b"content-length"), None)
        held = [0]
        size = 0
        done = False
        deadline = time.monotonic() + limits.total_seconds

        async def policed() -> Message:
            nonlocal size, done
            if done:  # what follows the body: a disconnect, whenever it comes
                return await receive()
            if declared is not None and declared.isdigit() and int(declared) > limit:
                raise BodyRefused(
                    413,
                    f"body is {int(declared)} bytes; the limit is {limit}",
                    FieldError("body", "too large", "body_too_large"),
                )
            # A client that stops sending (or drips a byte at a time) must not hold a connection
            # and its bytes for ever: 408 after a pause, or past the deadline.
            wait = min(limits.idle_seconds, deadline - time.monotonic())
            try:
                message = await asyncio.wait_for(receive(), max(wait, 0.001))
            except TimeoutError:
                raise BodyRefused(
                    408,
                    f"the body did not arrive in time (no data for {limits.idle_seconds:g} s, "
                    f"or not all of it within {limits.total_seconds:g} s)",
                    FieldError("body", "too slow", "body_timeout"),
                ) from None
            if message["type"] != "http.request":
                done = True
                return message
            n = len(message.get("body", b""))
            size += n
            if size > limit:  # no or false Content-Length: stop reading at the limit
                raise BodyRefused(
                    413, f"body exceeds the limit of {limit} bytes", FieldError("body", "too large", "body_too_large")
                )
            if self.held + n > limits.held_bytes:
                raise BodyRefused(
                    503,
                    f"the service is receiving {self.held} bytes of request bodies, its limit "
                    f"({limits.held_bytes}); retry shortly",
                    FieldError("body", "too many bodies at once", "busy"),
                    {"Retry-After": "1"},
                )
            self.held += n
            held[0] += n
            done = not message.get("more_body", False)
            return message

        try:
            await self.app(scope, policed, send)
        finally:
            self.held -= held[0]


_BUSY = orjson.dumps(
    {
        "error": {
            "status": 503,
            "message": "the service holds its most connections, all of them busy; retry shortly",
            "fields": [{"path": "connection", "reason": "too many connections"}],
        }
    }
)
_BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
    b"connection: close\r\ncontent-length: " + str(len(_BUSY)).encode() + b"\r\n\r\n" + _BUSY
)


class _Holders:
    """Connections held, per client address, with the address holding the most found in O(1): the
    one a new connection beyond the cap takes a connection from (a flood from one address pushes
    out its own connections, not another client's)."""

    def __init__(self) -> None:
        self.count: dict[str, int] = {}
        self.by_count: dict[int, dict[str, None]] = {}
        self.most = 0
        # per address, its connections waiting for a request head, oldest first
        self.waiting: dict[str, OrderedDict[Any, None]] = {}

    def add(self, who: str) -> None:
        n = self.count.get(who, 0)
        self._move(who, n, n + 1)

    def remove(self, who: str) -> None:
        n = self.count.get(who, 0)
        if n:
            self._move(who, n, n - 1)

    def _move(self, who: str, old: int, new: int) -> None:
        if old:
            bucket = self.by_count[old]
            bucket.pop(who, None)
            if not bucket:
                del self.by_count[old]
        if new:
            self.count[who] = new
            self.by_count.setdefault(new, {})[who] = None
        else:
            self.count.pop(who, None)
            self.waiting.pop(who, None)
        if new > self.most:
            self.most = new
        while self.most and self.most not in self.by_count:
            self.most -= 1

    def victim(self, exclude: Any) -> Any:
        """The oldest waiting connection of the address holding the most connections (else of the
        next ones), other than ``exclude``; None when every connection is busy with a request."""
        for n in range(self.most, 0, -1):
            for who in self.by_count.get(n, ()):
                for conn in self.waiting.get(who, ()):
                    if conn is not exclude:
                        return conn
        return None


def guarded_protocol(header_timeout: float, max_connections: int) -> type[H11Protocol]:
    """Uvicorn's h11 protocol with a header timeout and a connection cap (module docstring).

    Beyond the cap, the connection pushed out is the oldest one still waiting for its request head
    among those of the client address that holds the most connections. Each call makes a class
    with its own bookkeeping (one per server)."""
    holders = _Holders()

    class GuardedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None
        _who: str | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._who = self.client[0] if self.client else ""
            holders.add(self._who)
            if len(self.connections) > max_connections:
                victim = holders.victim(self)
                if victim is None:
                    transport.write(_BUSY_RESPONSE)
                    transport.close()
                    return
                victim._expire()
            self._await_headers()

        def _await_headers(self) -> None:
            assert self._who is not None
            holders.waiting.setdefault(self._who, OrderedDict())[self] = None
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(header_timeout, self._expire)

        def _headers_done(self) -> None:
            waiting = holders.waiting.get(self._who or "")
            if waiting is not None:
                waiting.pop(self, None)
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _expire(self) -> None:
            self._headers_done()
            if not self.transport.is_closing():
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.transport.is_closing():
                self._headers_done()
            elif self.conn.their_state is h11.IDLE:
                self._await_headers()  # part of a head (a keep-alive timer was cancelled by it)
            else:
                self._headers_done()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE and self._who is not None:
                # idle keep-alive: uvicorn's own timer closes it; it may be pushed out meanwhile
                holders.waiting.setdefault(self._who, OrderedDict())[self] = None

        def connection_lost(self, exc: Exception | None) -> None:
            self._headers_done()
            if self._who is not None:
                holders.remove(self._who)
                self._who = None
            super().connection_lost(exc)

    return GuardedH11Protocol


def server_for(app: Any, settings: Settings) -> uvicorn.Server:
    """The uvicorn server of ``app`` on the settings' address, with the connection's own limits:
    a request head within the header timeout and at most 16 KiB, idle keep-alive closed, at most
    ``max_connections`` held (``guarded_protocol``). The service and the scale-out processes serve
    through it."""
    return uvicorn.Server(
        uvicorn.Config(
            app,
            host=settings.host,
            port=settings.port,
            log_level="warning",
            access_log=False,
            http=guarded_protocol(settings.header_timeout_seconds, settings.max_connections),
            timeout_keep_alive=settings.keep_alive_seconds,
            h11_max_incomplete_event_size=16 * 1024,
        )
    )
