"""The SDK client against a real HTTP receiver on loopback that injects faults.

The receiver implements the collector's ``POST /v1/outputs`` contract in memory
(event_id -> envelope, so a resent id is a duplicate) and can be told to answer
an error status, drop the connection, hang, or go away entirely.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import subprocess
import sys
import textwrap
import threading
import time
import uuid
import warnings
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
import pytest
from harness import ROOT

from shapewatch.collector import sdk
from shapewatch.collector.sdk import Client

# A fault is an HTTP status to answer with, or one of these:
#   "drop": read the request, close the connection without answering
#   "store_then_drop": store the batch, then drop the connection (lost reply)
#   "hang": hold the request until released, then drop it
Fault = int | str
MakeClient = Callable[..., Client]


@dataclass
class Seen:
    """One request as the receiver saw it."""

    at: float
    event_ids: list[str]
    headers: dict[str, str]
    status: int | None  # None: connection dropped


@dataclass
class Receiver:
    host: str = "127.0.0.1"
    port: int = 0
    token: str | None = None
    max_body: int | None = None
    down: Fault | None = None  # applies to every request while set
    store: dict[str, dict[str, Any]] = field(default_factory=dict)
    accepted_ids: list[str] = field(default_factory=list)
    requests: list[Seen] = field(default_factory=list)
    faults: deque[tuple[Fault, str | None]] = field(default_factory=deque)
    release: threading.Event = field(default_factory=threading.Event)
    hanging: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def fail_next(self, fault: Fault, times: int = 1, retry_after: str | None = None) -> None:
        for _ in range(times):
            self.faults.append((fault, retry_after))

    def start(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                receiver._handle(self)

        server = ThreadingHTTPServer((self.host, self.port), Handler)
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Close the listening socket: connections are refused until start()."""
        assert self._server is not None and self._thread is not None
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
        self._server = None

    # -- the contract ------------------------------------------------------

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        body = h.rfile.read(int(h.headers.get("Content-Length") or 0))
        try:
            parsed = orjson.loads(body)
            ids = [e.get("event_id") for e in parsed] if isinstance(parsed, list) else []
        except (orjson.JSONDecodeError, AttributeError):
            parsed, ids = None, []
        with self.lock:
            fault, retry_after = self.faults.popleft() if self.faults else (self.down, None)
            seen = Seen(time.monotonic(), ids, {k.lower(): v for k, v in h.headers.items()}, None)
            self.requests.append(seen)
        if fault == "hang":
            with self.lock:
                self.hanging += 1
            self.release.wait(10)
            fault = "drop"
        if fault == "drop":
            h.close_connection = True
            return
        if isinstance(fault, int):
            headers = {"Retry-After": retry_after} if retry_after else {}
            self._error(h, seen, fault, "injected fault", headers)
            return
        if self.token is not None and h.headers.get("Authorization") != f"Bearer {self.token}":
            self._error(h, seen, 401, "missing or wrong bearer token")
            return
        if h.headers.get("Content-Type") != "application/json":
            self._error(h, seen, 415, "expected application/json")
            return
        if self.max_body is not None and len(body) > self.max_body:
            self._error(h, seen, 413, f"body over {self.max_body} bytes")
            return
        if not isinstance(parsed, list):
            self._error(h, seen, 400, "expected a JSON array of envelopes")
            return
        results = []
        with self.lock:
            for index, envelope in enumerate(parsed):
                errors = _validate(envelope)
                event_id: Any = envelope.get("event_id") if isinstance(envelope, dict) else None
                if errors:
                    status = "rejected"
                elif event_id in self.store:
                    status = "duplicate"
                else:
                    status = "accepted"
                    self.store[event_id] = envelope
                    self.accepted_ids.append(event_id)
                # Like the service, an invalid envelope is named by its index only.
                results.append(
                    {
                        "index": index,
                        "event_id": None if errors else event_id,
                        "status": status,
                        "errors": errors,
                    }
                )
        if fault == "store_then_drop":
            h.close_connection = True
            return
        counts = Counter(r["status"] for r in results)
        self._send(
            h,
            seen,
            200,
            {
                "accepted": counts["accepted"],
                "duplicate": counts["duplicate"],
                "rejected": counts["rejected"],
                "results": results,
            },
        )

    def _error(
        self,
        h: BaseHTTPRequestHandler,
        seen: Seen,
        status: int,
        message: str,
        headers: dict[str, str] | None = None,
    ) -> None:
        error = {"status": status, "message": message, "fields": []}
        self._send(h, seen, status, {"error": error}, headers)

    @staticmethod
    def _send(
        h: BaseHTTPRequestHandler,
        seen: Seen,
        status: int,
        payload: dict[str, Any],
        headers: dict[str, str] | None = None,
    ) -> None:
        seen.status = status
        data = orjson.dumps(payload)
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            h.send_header(name, value)
        h.end_headers()
        h.wfile.write(data)


def _validate(envelope: Any) -> list[dict[str, str]]:
    if not isinstance(envelope, dict):
        return [{"path": "", "reason": "must be a JSON object"}]
    errors = []
    for key in ("event_id", "model", "prompt_version", "contract", "ts"):
        if not isinstance(envelope.get(key), str) or not envelope[key]:
            errors.append({"path": key, "reason": "must be a non-empty string"})
    if isinstance(envelope.get("ts"), str):
        try:
            if datetime.fromisoformat(envelope["ts"]).tzinfo is None:
                errors.append({"path": "ts", "reason": "must carry a time zone"})
        except ValueError:
            errors.append({"path": "ts", "reason": "not ISO 8601"})
    if not isinstance(envelope.get("output"), dict):
        errors.append({"path": "output", "reason": "must be a JSON object"})
    attributes = envelope.get("attributes")
    if attributes is not None and not (
        isinstance(attributes, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in attributes.items())
    ):
        errors.append({"path": "attributes", "reason": "must map strings to strings"})
    return errors


# -- fixtures and helpers -----------------------------------------------------


def wait_until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(0.005)


def spill_lines(spill_dir: Path) -> list[dict[str, Any]]:
    return [
        orjson.loads(line)
        for path in sorted(spill_dir.glob("*.jsonl"))
        for line in path.read_bytes().splitlines()
        if line.strip()
    ]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    rec = Receiver()
    rec.start()
    yield rec
    rec.release.set()
    if rec._server is not None:
        rec.stop()


@pytest.fixture
def spill_dir(tmp_path: Path) -> Path:
    return tmp_path / "spill"


@pytest.fixture
def make_client(receiver: Receiver, spill_dir: Path) -> Iterator[MakeClient]:
    clients: list[Client] = []

    def make(**overrides: Any) -> Client:
        # A long flush_interval makes batches deterministic: a batch leaves
        # when batch_size is reached or flush() asks for it.
        options: dict[str, Any] = {
            "url": receiver.url,
            "spill_dir": spill_dir,
            "flush_interval": 30.0,
            "max_backoff": 0.02,
            "timeout": 5.0,
        }
        options.update(overrides)
        client = Client(**options)
        clients.append(client)
        return client

    yield make
    receiver.release.set()
    for client in clients:
        client.close(timeout=0.5)


def record(client: Client, n: int, **kwargs: Any) -> list[str]:
    return [client.record({"i": i, "priority": "low"}, model="m", prompt_version="p", **kwargs) for i in range(n)]


# -- the envelope --------------------------------------------------------------


def test_envelope_carries_every_field_and_the_token(receiver: Receiver, make_client: MakeClient) -> None:
    receiver.token = "t0k"
    client = make_client(token="t0k")
    ts = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    given = client.record(
        {"intent": "refund", "priority": "high"},
        model="claude-x",
        prompt_version="intake-v3",
        contract="intake",
        ts=ts,
        event_id="evt-1",
        served_model="claude-x-20250929",
        contract_version="3",
        source="probe",
        run_id="run-9",
        agent_release="rel-2",
        finish_reason="stop",
        attributes={"team": "billing"},
    )
    generated = client.record({"priority": "low"}, model="m", prompt_version="p")

    assert given == "evt-1"
    assert client.flush(5)
    assert receiver.store["evt-1"] == {
        "event_id": "evt-1",
        "ts": "2026-11-29T12:00:00+00:00",
        "model": "claude-x",
        "prompt_version": "intake-v3",
        "contract": "intake",
        "output": {"intent": "refund", "priority": "high"},
        "served_model": "claude-x-20250929",
        "contract_version": "3",
        "source": "probe",
        "run_id": "run-9",
        "agent_release": "rel-2",
        "finish_reason": "stop",
        "attributes": {"team": "billing"},
    }
    envelope = receiver.store[generated]
    assert uuid.UUID(hex=generated).version == 4 and generated == uuid.UUID(hex=generated).hex
    assert set(envelope) == {"event_id", "ts", "model", "prompt_version", "contract", "output"}
    assert envelope["contract"] == "default"
    sent_at = datetime.fromisoformat(envelope["ts"])
    assert sent_at.utcoffset() == timedelta(0)
    assert abs(datetime.now(UTC) - sent_at) < timedelta(seconds=60)
    assert receiver.requests[0].headers["authorization"] == "Bearer t0k"
    assert receiver.requests[0].headers["content-type"] == "application/json"
    assert client.stats == {
        "recorded": 2,
        "sent": 2,
        "duplicate": 0,
        "rejected": 0,
        "spilled": 0,
        "dropped": 0,
        "retries": 0,
        "recovered": 0,
    }


def test_later_changes_to_the_output_are_not_sent(receiver: Receiver, make_client: MakeClient) -> None:
    client = make_client()
    output: dict[str, Any] = {"tags": ["a"]}
    event_id = client.record(output, model="m", prompt_version="p")
    output["tags"].append("b")
    output["extra"] = 1
    assert client.flush(5)
    assert receiver.store[event_id]["output"] == {"tags": ["a"]}


def test_a_partial_batch_leaves_after_flush_interval(receiver: Receiver, make_client: MakeClient) -> None:
    client = make_client(flush_interval=0.05)
    event_id = client.record({"a": 1}, model="m", prompt_version="p")
    wait_until(lambda: event_id in receiver.store)


# -- retries and idempotency ----------------------------------------------------------


def test_event_id_is_kept_across_retries_and_stored_once(receiver: Receiver, make_client: MakeClient) -> None:
    # The first attempt lands but its reply is lost, the second gets a 500:
    # the third carries the same ids, and the receiver counts them as duplicates.
    receiver.fail_next("store_then_drop")
    receiver.fail_next(500)
    client = make_client()
    ids = record(client, 3)

    assert client.flush(5)
    assert [seen.event_ids for seen in receiver.requests] == [ids, ids, ids]
    assert receiver.accepted_ids == ids
    assert sorted(receiver.store) == sorted(ids)
    stats = client.stats
    assert (stats["sent"], stats["duplicate"], stats["retries"]) == (0, 3, 2)


@pytest.mark.parametrize("fault", [500, 502, 503, 429, "drop"])
def test_transient_failures_are_retried(fault: Fault, receiver: Receiver, make_client: MakeClient) -> None:
    receiver.fail_next(fault, times=3)
    client = make_client()
    ids = record(client, 4)

    assert client.flush(5)
    assert [seen.status for seen in receiver.requests] == [None if fault == "drop" else fault] * 3 + [200]
    assert all(seen.event_ids == ids for seen in receiver.requests)
    assert receiver.accepted_ids == ids
    stats = client.stats
    assert (stats["sent"], stats["retries"], stats["rejected"]) == (4, 3, 0)


@pytest.mark.parametrize("status", [400, 401, 403, 408, 415, 422])
def test_other_4xx_drop_the_batch_without_retrying(
    status: int, receiver: Receiver, make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    receiver.fail_next(status)
    client = make_client()
    record(client, 2)

    assert client.flush(5)  # settled: refused for good
    assert len(receiver.requests) == 1
    stats = client.stats
    assert (stats["rejected"], stats["retries"], stats["sent"]) == (2, 0, 0)
    assert any(r.levelno == logging.ERROR and f"HTTP {status}" in r.getMessage() for r in caplog.records)
    # The client carries on with the next batch.
    later = client.record({"a": 1}, model="m", prompt_version="p")
    assert client.flush(5)
    assert list(receiver.store) == [later]


def test_rejected_events_are_logged_and_not_retried(
    receiver: Receiver, make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    client = make_client()
    good = client.record({"a": 1}, model="m", prompt_version="p")
    not_str: Any = {"n": 1}
    bad = client.record({"a": 1}, model="m", prompt_version="p", attributes=not_str)

    assert client.flush(5)
    assert len(receiver.requests) == 1
    assert list(receiver.store) == [good]
    stats = client.stats
    assert (stats["sent"], stats["rejected"], stats["retries"]) == (1, 1, 0)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(bad in m and "attributes" in m for m in warnings)


def test_retry_after_is_honoured(receiver: Receiver, make_client: MakeClient) -> None:
    receiver.fail_next(503, retry_after="1")
    client = make_client(max_backoff=5.0)
    record(client, 1)

    assert client.flush(5)
    first, second = receiver.requests
    # Without Retry-After the first retry would wait under 0.25 s.
    assert second.at - first.at >= 0.9


def test_retry_after_is_capped_by_max_backoff(receiver: Receiver, make_client: MakeClient) -> None:
    receiver.fail_next(503, retry_after="3600")
    client = make_client(max_backoff=0.05)
    record(client, 1)

    assert client.flush(5)
    first, second = receiver.requests
    assert second.at - first.at < 1.0


def test_retry_after_zero_still_backs_off(receiver: Receiver, make_client: MakeClient) -> None:
    receiver.fail_next(503, times=8, retry_after="0")
    client = make_client(max_backoff=0.4)
    record(client, 1)

    assert client.flush(10)
    assert [seen.status for seen in receiver.requests] == [503] * 8 + [200]
    # Eight jittered waits of up to 0.25 s, then 0.4 s: together under 0.2 s with a chance of
    # about 1e-7. Retried at once, as "Retry-After: 0" says, they took a few milliseconds.
    assert receiver.requests[-1].at - receiver.requests[0].at >= 0.2


def test_413_splits_the_batch_and_drops_only_the_oversized_event(
    receiver: Receiver, make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    receiver.max_body = 700
    client = make_client()
    small = record(client, 6)
    big = client.record({"blob": "x" * 2000}, model="m", prompt_version="p")

    assert client.flush(5)
    assert sorted(receiver.accepted_ids) == sorted(small)
    stats = client.stats
    assert (stats["sent"], stats["rejected"], stats["retries"]) == (6, 1, 0)
    assert [s.status for s in receiver.requests].count(413) >= 2
    assert [s.status for s in receiver.requests if s.event_ids == [big]] == [413]
    assert any(big in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)


# -- never blocking, never losing ---------------------------------------------------


def test_record_does_not_block_while_the_server_hangs_or_is_down(receiver: Receiver, make_client: MakeClient) -> None:
    receiver.down = "hang"
    client = make_client(timeout=5.0)

    started = time.perf_counter()
    ids = record(client, 1000)
    elapsed = time.perf_counter() - started

    wait_until(lambda: receiver.hanging >= 1)  # the sender is stuck in a request
    assert elapsed < 2.0
    assert not client.flush(timeout=0.1)

    receiver.down = "drop"
    receiver.release.set()
    wait_until(lambda: client.stats["retries"] >= 2)
    receiver.down = None

    assert client.flush(10)
    assert Counter(receiver.accepted_ids) == Counter(ids)
    assert len(receiver.store) == 1000
    stats = client.stats
    assert (stats["sent"], stats["duplicate"]) == (1000, 0)
    assert (stats["dropped"], stats["spilled"]) == (0, 0)


def test_buffer_overflow_spills_to_disk_and_is_delivered_later(
    receiver: Receiver, make_client: MakeClient, spill_dir: Path
) -> None:
    receiver.down = "drop"
    client = make_client(max_buffer=10, batch_size=5)
    ids = record(client, 100)

    stats = client.stats
    assert stats["spilled"] >= 100 - 10 - 5
    assert stats["dropped"] == 0
    on_disk = [line["event_id"] for line in spill_lines(spill_dir)]
    assert len(on_disk) == stats["spilled"] and set(on_disk) <= set(ids)

    receiver.down = None
    assert client.flush(10)
    assert Counter(receiver.accepted_ids) == Counter(ids)
    stats = client.stats
    assert (stats["sent"], stats["duplicate"], stats["dropped"]) == (100, 0, 0)
    assert list(spill_dir.glob("*.jsonl")) == []  # removed once delivered


def test_max_attempts_parks_the_batch_on_disk(receiver: Receiver, make_client: MakeClient, spill_dir: Path) -> None:
    receiver.down = "drop"
    client = make_client(max_attempts=2, batch_size=5)
    ids = record(client, 5)

    wait_until(lambda: client.stats["spilled"] == 5)
    assert sorted(line["event_id"] for line in spill_lines(spill_dir)) == sorted(ids)

    receiver.down = None
    assert client.flush(10)
    assert Counter(receiver.accepted_ids) == Counter(ids)
    assert list(spill_dir.glob("*.jsonl")) == []


def test_close_with_the_server_down_leaves_a_spill_file_that_the_next_client_sends(
    receiver: Receiver, make_client: MakeClient, spill_dir: Path
) -> None:
    receiver.stop()  # connections refused
    first = make_client()
    ids = record(first, 50)

    started = time.monotonic()
    first.close(timeout=0.3)
    assert time.monotonic() - started < 3.0
    assert sorted(line["event_id"] for line in spill_lines(spill_dir)) == sorted(ids)
    assert first.flush(0) is False  # closed with events left behind
    assert first.stats["dropped"] == 0

    receiver.start()  # same port, so the same service URL
    second = make_client()
    assert second.flush(10)
    assert Counter(receiver.accepted_ids) == Counter(ids)
    stats = second.stats
    assert (stats["recorded"], stats["recovered"], stats["sent"]) == (0, 50, 50)
    assert list(spill_dir.glob("*.jsonl")) == []


def test_record_after_close_goes_to_the_spill_file(
    receiver: Receiver, make_client: MakeClient, spill_dir: Path
) -> None:
    first = make_client()
    first.close()
    late = first.record({"a": 1}, model="m", prompt_version="p")
    assert [line["event_id"] for line in spill_lines(spill_dir)] == [late]

    second = make_client()
    assert second.flush(5)
    assert receiver.accepted_ids == [late]


def test_a_live_clients_spill_file_is_not_taken_over(
    receiver: Receiver, make_client: MakeClient, spill_dir: Path
) -> None:
    receiver.down = "drop"
    owner = make_client(max_buffer=1, batch_size=1)
    ids = record(owner, 5)
    assert owner.stats["spilled"] >= 3

    other = make_client()  # same URL and spill directory, owner still alive
    receiver.down = None
    assert other.flush(5)
    assert owner.flush(10)
    assert other.stats["recovered"] == 0
    assert Counter(receiver.accepted_ids) == Counter(ids)


def test_a_corrupt_spill_line_is_skipped_and_counted(
    receiver: Receiver, make_client: MakeClient, spill_dir: Path
) -> None:
    receiver.stop()
    first = make_client()
    ids = record(first, 3)
    first.close(timeout=0.1)
    (path,) = spill_dir.glob("*.jsonl")
    with path.open("ab") as fh:
        fh.write(b'{"event_id": "half-writ')  # a process killed mid-write

    receiver.start()
    second = make_client()
    assert second.flush(5)
    assert Counter(receiver.accepted_ids) == Counter(ids)
    assert second.stats["dropped"] == 1


# -- the caller is never hurt ---------------------------------------------------------


def test_a_non_dict_output_does_not_raise(
    receiver: Receiver, make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    client = make_client()
    outputs: list[Any] = ["text", None, [1, 2], 42, {"when": object()}]
    ids = [client.record(o, model="m", prompt_version="p") for o in outputs]

    assert all(isinstance(i, str) and i for i in ids) and len(set(ids)) == 5
    assert client.flush(1)
    assert receiver.requests == []
    stats = client.stats
    assert (stats["recorded"], stats["rejected"], stats["sent"]) == (5, 5, 0)
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert all(any(i in m for m in errors) for i in ids)


def test_nan_and_infinity_are_refused_not_sent_as_null(
    receiver: Receiver, make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    # orjson writes them as null: the number would have arrived as a null, drift nobody made
    client = make_client()
    shared: dict[str, Any] = {"x": 1.5}
    cyclic: dict[str, Any] = {"ok": shared, "again": shared}
    cyclic["self"] = cyclic
    outputs: list[Any] = [
        {"score": math.nan},
        {"a": [{"b": 1.0}, {"b": -math.inf}]},
        {"deep": {"t": (1, math.inf)}},
        cyclic,
    ]
    ids = [client.record(o, model="m", prompt_version="p") for o in outputs]
    fine = client.record({"score": 0.5, "big": 1e308}, model="m", prompt_version="p")
    assert client.flush(5)
    assert list(receiver.store) == [fine]
    assert client.stats["recorded"] == 5 and client.stats["rejected"] == 4
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    for i, where in zip(ids, ["output.score", "output.a[1].b", "output.deep.t[1]"], strict=False):
        assert f"shapewatch: event {i} not recorded: {where} is NaN or infinite, which JSON cannot carry" in errors
    assert any(m.startswith(f"shapewatch: event {ids[3]} not recorded: not JSON-serialisable") for m in errors)


def test_odd_arguments_are_counted_as_rejected_never_raised(
    receiver: Receiver, make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    client = make_client()
    ids = [
        client.record({"a": 1}, model="m", prompt_version="p", ts=12345),  # type: ignore[arg-type]
        client.record({"a": 1}, model="m", prompt_version="p", attributes=[1, 2]),
    ]  # type: ignore[arg-type]
    assert client.flush(1)
    assert receiver.requests == []
    assert (client.stats["recorded"], client.stats["rejected"]) == (2, 2)
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert all(any(m.startswith(f"shapewatch: event {i} not recorded: ") for m in errors) for i in ids)


def test_concurrent_record_from_many_threads(receiver: Receiver, make_client: MakeClient) -> None:
    client = make_client(batch_size=100)
    results: list[list[str]] = []

    def work() -> None:
        results.append(record(client, 250))

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)

    assert client.flush(10)
    ids = [i for chunk in results for i in chunk]
    assert len(ids) == 2000
    assert Counter(receiver.accepted_ids) == Counter(ids)
    assert client.stats["sent"] == 2000


def test_context_manager_flushes_on_exit(receiver: Receiver, make_client: MakeClient) -> None:
    with make_client() as client:
        event_id = client.record({"a": 1}, model="m", prompt_version="p")
    assert receiver.accepted_ids == [event_id]
    assert client.flush(0) is True  # closed with nothing left behind


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_sends_its_own_events_only(receiver: Receiver, make_client: MakeClient) -> None:
    client = make_client()
    (parent_id,) = record(client, 1)  # still buffered at fork time
    with warnings.catch_warnings():  # 3.12+ warns about forking with threads
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 1
        try:
            client.record({"child": True}, model="m", prompt_version="p", event_id="child-evt")
            code = 0 if client.flush(5) else 2
            client.close(timeout=0.5)
        finally:
            os._exit(code)
    deadline = time.monotonic() + 10
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("forked child did not finish")
        time.sleep(0.01)
    assert os.waitstatus_to_exitcode(status) == 0
    assert client.flush(5)
    assert Counter(receiver.accepted_ids) == Counter([parent_id, "child-evt"])


def test_many_open_clients_are_warned_about_once(
    receiver: Receiver, spill_dir: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sdk, "_warned_many", False)
    clients = []
    try:
        for _ in range(sdk._MANY_OPEN_CLIENTS + 3):
            clients.append(Client(receiver.url, spill_dir=spill_dir))
        warnings = [r.getMessage() for r in caplog.records if "clients are open" in r.getMessage()]
        assert warnings == [
            f"shapewatch: {sdk._MANY_OPEN_CLIENTS} clients are open in this process, each "
            "with its own sender thread until close(); create one Client and share it "
            "(record() is thread-safe)"
        ]
    finally:
        for c in clients:
            c.close(1)


def test_closed_clients_are_not_counted_as_open(
    receiver: Receiver, spill_dir: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sdk, "_warned_many", False)
    for _ in range(sdk._MANY_OPEN_CLIENTS + 3):
        with Client(receiver.url, spill_dir=spill_dir):
            pass
    assert not [r for r in caplog.records if "clients are open" in r.getMessage()]


def test_constructor_rejects_bad_settings(spill_dir: Path) -> None:
    with pytest.raises(ValueError, match="url"):
        Client("localhost:8000", spill_dir=spill_dir)
    with pytest.raises(ValueError, match="batch_size"):
        Client("http://127.0.0.1:1", batch_size=0, spill_dir=spill_dir)
    with pytest.raises(ValueError, match="max_attempts"):
        Client("http://127.0.0.1:1", max_attempts=0, spill_dir=spill_dir)


def _run_child(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_a_full_disk_while_spilling_loses_only_what_it_counts_and_never_raises(
    receiver: Receiver, spill_dir: Path
) -> None:
    # The disk is "full" past 3,000 bytes per file (RLIMIT_FSIZE, in a process of its own);
    # the service is down, so every event goes to disk.
    receiver.stop()
    child = _run_child(f"""
        import json, resource
        from shapewatch.collector import Client
        resource.setrlimit(resource.RLIMIT_FSIZE, (3000, resource.RLIM_INFINITY))
        c = Client({receiver.url!r}, spill_dir={str(spill_dir)!r}, max_buffer=5, batch_size=5,
                   flush_interval=0.05, max_backoff=0.1)
        ids = [c.record({{"i": i, "pad": "x" * 100}}, model="m", prompt_version="p") for i in range(60)]
        c.close(timeout=1)  # must not raise
        print(json.dumps({{"ids": ids, "stats": c.stats}}))
    """)
    assert child.returncode == 0, child.stderr
    out = orjson.loads(child.stdout)
    stats = out["stats"]
    assert stats["dropped"] > 0 and stats["spilled"] + stats["dropped"] == 60, stats
    lines = [line for f in spill_dir.iterdir() for line in f.read_bytes().splitlines()]
    assert all(isinstance(orjson.loads(line), dict) for line in lines)  # whole lines only, none cut
    on_disk = [orjson.loads(line)["event_id"] for line in lines]
    assert len(on_disk) == len(set(on_disk)) == stats["spilled"]
    receiver.start()
    with Client(receiver.url, spill_dir=spill_dir) as later:  # room again: the next client sends them
        assert later.flush(10)
    assert sorted(receiver.accepted_ids) == sorted(on_disk)
    assert set(on_disk) <= set(out["ids"])


def test_a_worker_forked_right_after_the_client_was_made_sends(receiver: Receiver, spill_dir: Path) -> None:
    # gunicorn --preload: the client is made in the master, workers are forked at once. A fork
    # while the sender thread made its TLS context (or imported httpcore) left the worker's
    # sender stuck or dead.
    child = _run_child(f"""
        import os, time
        from shapewatch.collector import Client
        c = Client({receiver.url!r}, spill_dir={str(spill_dir)!r}, flush_interval=0.05)
        pids = []
        for w in range(6):
            time.sleep(0.005 * w)
            pid = os.fork()
            if pid == 0:
                c.record({{"worker": w}}, model="m", prompt_version="p")
                os._exit(0 if c.flush(timeout=10) else 1)
            pids.append(pid)
        print([os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids])
        c.close()
    """)
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "[0, 0, 0, 0, 0, 0]", child.stderr
    assert len(receiver.accepted_ids) == 6


def test_events_recorded_in_a_multiprocessing_child_are_sent_at_its_end(receiver: Receiver, spill_dir: Path) -> None:
    # A multiprocessing child ends with os._exit: atexit never runs there.
    child = _run_child(f"""
        import multiprocessing, time
        from shapewatch.collector import Client
        c = Client({receiver.url!r}, spill_dir={str(spill_dir)!r}, flush_interval=30)

        def work() -> None:
            for i in range(20):
                c.record({{"i": i}}, model="m", prompt_version="p")

        p = multiprocessing.get_context("fork").Process(target=work)
        p.start()
        p.join(60)
        print(p.exitcode)
        c.close()
    """)
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "0"
    assert len(receiver.accepted_ids) == 20


def test_files_left_by_many_clients_are_claimed_a_few_at_a_time_and_all_sent(
    receiver: Receiver, spill_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sdk, "_MAX_CLAIMED", 4, raising=False)
    key = hashlib.sha256(receiver.url.encode()).hexdigest()[:12]
    spill_dir.mkdir(parents=True, exist_ok=True)
    ids = [f"orphan-{n}" for n in range(20)]
    for n, event_id in enumerate(ids):  # as 20 short-lived processes leave them
        envelope = {
            "event_id": event_id,
            "ts": "2026-11-30T00:00:00+00:00",
            "model": "m",
            "prompt_version": "p",
            "contract": "default",
            "output": {"n": n},
        }
        (spill_dir / f"shapewatch-{key}-{100000 + n}-deadbeef-000001.jsonl").write_bytes(orjson.dumps(envelope) + b"\n")
    with Client(receiver.url, spill_dir=spill_dir, flush_interval=0.05) as client:
        held = []
        deadline = time.monotonic() + 20
        while len(receiver.accepted_ids) < len(ids) and time.monotonic() < deadline:
            with client._lock:
                held.append(sum(1 for f in client._files if not f.own))
            time.sleep(0.01)  # polling the receiver with a deadline
    assert sorted(receiver.accepted_ids) == sorted(ids)
    assert max(held) <= 4
    assert list(spill_dir.iterdir()) == []
