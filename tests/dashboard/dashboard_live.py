"""A real service for the dashboard tests: the service app under uvicorn on loopback, in a thread.

Cheaper than a ``shapewatch serve`` subprocess and just as real for a client:
the dashboard reaches it over HTTP only. ``seeded`` holds the sample workspace
that ``shapewatch up`` loads, written through the HTTP API.
"""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import uvicorn
from prometheus_client import CollectorRegistry

from shapewatch.analysis.service import create_app
from shapewatch.collector import Settings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def live_service(db_path: Path, *, tokens: tuple[str, ...] = ()) -> Iterator[str]:
    """The service on a free loopback port until the block ends; yields its URL."""
    app = create_app(
        dataclasses.replace(Settings(), db_path=db_path, tokens=tokens), registry=CollectorRegistry(), analyze=False
    )
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)  # polling a start-up with a deadline
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
