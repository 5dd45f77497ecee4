"""Test helpers shared by every suite (tests/ and reliability/): valid envelopes with overrides,
a real service (``shapewatch serve`` in a subprocess on a free loopback port), Debian tools.

A module of its own, not conftest.py: two suites each have a conftest module, and a test that
imported its helpers ``from conftest`` got whichever conftest was loaded last. Import from here:
``from harness import make_envelope, start_service``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
SHAPEWATCH = [sys.executable, "-m", "shapewatch.analysis.cli"]


def make_envelope(**overrides: Any) -> dict[str, Any]:
    """A valid envelope; keyword arguments replace top-level fields (None removes one)."""
    env: dict[str, Any] = {
        "event_id": uuid.uuid4().hex,
        "ts": "2026-11-29T12:00:00Z",
        "model": "claude-sonnet-4-5-20250929",
        "served_model": "claude-sonnet-4-5-20250929",
        "prompt_version": "intake-v3",
        "contract": "intake",
        "contract_version": "3",
        "source": "production",
        "output": {
            "intent": "refund",
            "priority": "high",
            "confidence": 0.87,
            "customer": {"tier": "gold", "id": "c-1"},
            "entities": [{"type": "order", "value": "A-1"}],
            "tags": ["billing"],
        },
    }
    for k, v in overrides.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def counted_beside(call: Callable[[], Any]) -> tuple[Any, int]:
    """``call()``'s answer, and how often a second thread counted while it ran. Forced switches are
    put off (a 30 s interval), so the second thread gets the GIL only when ``call`` lets it go (it
    lets it go itself between counts): a count above 0 says the call ran part of its work without
    the GIL. The count is read before the thread can take the GIL again."""
    go, stop = threading.Event(), threading.Event()
    counted = [0]

    def count() -> None:
        go.wait()
        while not stop.is_set():
            counted[0] += 1
            time.sleep(0)

    interval = sys.getswitchinterval()
    thread = threading.Thread(target=count)
    thread.start()
    sys.setswitchinterval(30)
    try:
        go.set()
        answer = call()
        during = counted[0]
    finally:
        stop.set()
        sys.setswitchinterval(interval)
        thread.join()
    return answer, during


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Service:
    url: str
    db_path: Path
    proc: subprocess.Popen[bytes]
    log: Path

    def client(self, token: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def stop(self, sig: int | None = None) -> None:
        if self.proc.poll() is None:
            if sig is None:
                self.proc.terminate()
            else:
                self.proc.send_signal(sig)
            self.proc.wait(30)


def start_service(
    db_path: Path, *, env: dict[str, str] | None = None, port: int | None = None, timeout: float = 60.0
) -> Service:
    """Start ``shapewatch serve`` and wait (bounded) until /healthz answers 200."""
    port = port or free_port()
    log = db_path.parent / f"serve-{port}.log"
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    proc = subprocess.Popen(
        [*SHAPEWATCH, "serve", "--db", str(db_path), "--port", str(port)],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        env=full_env,
        cwd=ROOT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"service exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return Service(url, db_path, proc, log)
        except httpx.HTTPError:
            pass
        time.sleep(0.05)  # polling a start-up with a deadline, not waiting blindly
    proc.kill()
    raise RuntimeError(f"service did not become healthy in {timeout}s: {log.read_text()[-2000:]}")


def ensure_tool(name: str) -> str | None:
    """The path of a Debian-packaged tool a test needs (chromium, promtool), installing it once
    through .ci/install-tools when it is missing (root with apt only); None if that cannot be done."""
    import shutil

    found = shutil.which(name)
    if found is None:
        subprocess.run(
            [str(ROOT / ".ci" / "install-tools")],
            check=False,
            timeout=900,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        found = shutil.which(name)
    return found


class SchemaServer:
    """A local HTTP server that answers every GET with a JSON Schema and records the paths asked for:
    what a contract's remote ``$ref`` would reach if anything fetched it.

    >>> with SchemaServer() as server:            # doctest: +SKIP
    ...     server.url, server.hits               # ('http://127.0.0.1:PORT', [])
    """

    def __init__(self) -> None:
        import http.server
        import threading

        hits: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                hits.append(self.path)
                body = b'{"type": "string"}'
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.hits = hits
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> SchemaServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
