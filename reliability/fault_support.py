"""Helpers for the fault scenarios of the reliability suite: a real ``shapewatch serve`` with a
config file and an optional command prefix (libfaketime), bounded polling, a small tmpfs, a
local pager that can also reset connections, and Debian tools installed on demand.

Everything here drives real parts (subprocesses, DuckDB files, sockets); only the pager,
which lives outside the machine in production, is a local stand-in.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import struct
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from pager_receiver import PagerReceiver, Recorded
from rel_support import ROOT, SHAPEWATCH, free_port

__all__ = ["RESET", "Daemon", "FaultPager", "ensure_faketime", "spawn", "tmpfs", "wait_for"]

RESET = "reset"  # a FaultPager step: read the request, then abort the connection with a TCP RST


def wait_for(what: str, condition: Callable[[], bool], timeout: float, interval: float = 0.05) -> float:
    """Poll ``condition`` until true; returns the seconds it took; AssertionError after ``timeout``."""
    t0 = time.monotonic()
    while not condition():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)  # polling a condition with a deadline
    return time.monotonic() - t0


@dataclass
class Daemon:
    """One ``shapewatch serve`` process (restartable on the same port and file)."""

    db: Path
    port: int
    log: Path
    config: Path | None = None
    env: dict[str, str] | None = None
    prefix: tuple[str, ...] = ()
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, timeout: float = 30) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=timeout)

    def start(self, *, timeout: float = 60.0, healthy: bool = True) -> float:
        """Start the process; with ``healthy``, wait until /healthz answers 200 and return the seconds."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("SHAPEWATCH_")},
            "PYTHONPATH": str(ROOT),
            **(self.env or {}),
        }
        cmd = [*self.prefix, *SHAPEWATCH]
        if self.config is not None:
            cmd += ["--config", str(self.config)]
        cmd += ["serve", "--db", str(self.db), "--port", str(self.port)]
        t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=self.log.open("ab"), stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        if not healthy:
            return 0.0
        deadline = t0 + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"service exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return time.monotonic() - t0
            except httpx.HTTPError:
                pass
            time.sleep(0.05)  # polling a start-up with a deadline
        self.kill()
        raise RuntimeError(f"service not healthy in {timeout:.0f} s: {self.log_tail()}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            if sig == signal.SIGSTOP:
                self.proc.send_signal(signal.SIGCONT)  # a stopped process cannot act on SIGTERM
            self.proc.send_signal(sig)
            self.proc.wait(60)

    def stop(self) -> None:
        """SIGTERM: commit what is queued, close the file."""
        self.kill(signal.SIGTERM)

    def log_tail(self, n: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""


def spawn(
    tmp: Path, db: Path, *, config: Path | None = None, env: dict[str, str] | None = None, prefix: tuple[str, ...] = ()
) -> Daemon:
    port = free_port()
    return Daemon(db, port, tmp / f"serve-{port}.log", config, env, prefix)


@contextmanager
def tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``where`` (root only), unmounted at the end."""
    import pytest

    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root and mount(8); this scenario cannot run here")
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True, text=True, timeout=30
    )
    if r.returncode != 0:
        pytest.skip(f"mount -t tmpfs is not permitted here ({r.stderr.strip()}); this scenario cannot run")
    try:
        yield where
    finally:
        for _ in range(50):
            if subprocess.run(["umount", str(where)], capture_output=True, timeout=30).returncode == 0:
                break
            time.sleep(0.1)  # a process may still be closing its files: retry, bounded
        else:
            subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)


def ensure_faketime() -> str | None:
    """The path of libfaketime's shared library, installing Debian's ``faketime`` once if missing."""

    def find() -> str | None:
        for d in ("/usr/lib/x86_64-linux-gnu/faketime", "/usr/lib/aarch64-linux-gnu/faketime", "/usr/lib/faketime"):
            lib = Path(d) / "libfaketime.so.1"
            if lib.exists():
                return str(lib)
        return None

    if find() is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "faketime"]
        if subprocess.run(cmd, env=env, capture_output=True, timeout=600).returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=600)
            subprocess.run(cmd, env=env, capture_output=True, timeout=600)
    return find()


class FaultPager(PagerReceiver):
    """``PagerReceiver`` (incidents by dedup key, scripted answers) plus a ``RESET`` step: the
    request is read and not processed, and the connection is aborted with a TCP RST."""

    def _handle(self, h: Any) -> None:
        with self._lock:
            reset = bool(self._steps) and self._steps[0] == RESET
            if reset:
                self._steps.popleft()
        if not reset:
            super()._handle(h)
            return
        body = self.read_body(h)
        with self._lock:
            self.requests.append(Recorded(h.path, {k.lower(): v for k, v in h.headers.items()}, body, RESET))
        sock: socket.socket = h.connection
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        h.close_connection = True
        sock.close()  # linger 0: the peer gets a reset, not a clean end
