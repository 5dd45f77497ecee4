"""One body policy for every route, and bounded connections, through a real service on loopback.

Each test reproduces a defect seen against ``shapewatch serve``: an admin route read a 300 MB
body whole, a stalled body on ``/v1/silences`` got no answer, half-sent request heads were never
timed out and 20,100 of them took every file descriptor.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from harness import Service, start_service


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    service = start_service(
        tmp_path_factory.mktemp("policy") / "svc.duckdb",
        env={
            "SHAPEWATCH_BODY_IDLE_SECONDS": "1",
            "SHAPEWATCH_HEADER_TIMEOUT_SECONDS": "1",
            "SHAPEWATCH_MAX_CONNECTIONS": "40",
            "SHAPEWATCH_MAX_ADMIN_BODY_BYTES": "4096",
            "SHAPEWATCH_MAX_DOCUMENT_BYTES": "65536",
        },
    )
    yield service
    service.stop()


def _connect(svc: Service) -> socket.socket:
    host, port = svc.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _read_response(s: socket.socket) -> tuple[int, dict[str, str], dict[str, object]]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            raise AssertionError(f"connection closed after {data!r}")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = s.recv(65536)
        if not chunk:
            break
        rest += chunk
    return int(lines[0].split()[1]), headers, json.loads(rest[:length] or b"null")


def _closed_by_server(s: socket.socket) -> bool:
    try:
        return s.recv(1) == b""
    except ConnectionResetError:  # closed with bytes of ours unread
        return True
    except TimeoutError:
        return False


@pytest.mark.parametrize(
    ("path", "limit"),
    [("/v1/silences", 4096), ("/v1/alerts/x/ack", 4096), ("/v1/baselines/import", 65536), ("/v1/contracts", 65536)],
)
def test_a_declared_body_over_the_route_limit_is_refused_before_it_is_read(svc: Service, path: str, limit: int) -> None:
    with _connect(svc) as s:
        # 300 MB announced, 10 bytes sent: the answer comes without waiting for the rest
        s.sendall(
            f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f'content-length: 300000000\r\n\r\n{{"a": 1, '.encode()
        )
        status, _, body = _read_response(s)
    assert (status, body) == (
        413,
        {
            "error": {
                "status": 413,
                "message": f"body is 300000000 bytes; the limit is {limit}",
                "fields": [{"path": "body", "reason": "too large"}],
            }
        },
    )


def test_a_chunked_body_over_an_admin_limit_is_cut_off(svc: Service) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(100):
            yield b" " * 1000

    r = httpx.post(svc.url + "/v1/silences", content=chunks(), headers={"content-type": "application/json"})
    assert (r.status_code, r.json()) == (
        413,
        {
            "error": {
                "status": 413,
                "message": "body exceeds the limit of 4096 bytes",
                "fields": [{"path": "body", "reason": "too large"}],
            }
        },
    )


@pytest.mark.parametrize("path", ["/v1/silences", "/v1/baselines/import", "/v1/outputs"])
def test_a_stalled_body_is_answered_408_on_every_route(svc: Service, path: str) -> None:
    with _connect(svc) as s:
        s.sendall(
            f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f'content-length: 100\r\n\r\n{{"dur'.encode()
        )
        status, _, body = _read_response(s)  # body_idle_seconds is 1 here
    assert (status, body) == (
        408,
        {
            "error": {
                "status": 408,
                "message": "the body did not arrive in time (no data for 1 s, or not all of it within 300 s)",
                "fields": [{"path": "body", "reason": "too slow"}],
            }
        },
    )


def test_a_half_sent_request_head_is_closed_after_the_header_timeout(svc: Service) -> None:
    with _connect(svc) as s:
        s.sendall(b"POST /v1/outputs HTTP/1.1\r\nhost: x\r\ncontent-")
        assert _closed_by_server(s)  # header_timeout_seconds is 1 here; recv would wait 10 s
    with _connect(svc) as s:  # a connection that sends nothing at all
        assert _closed_by_server(s)


def test_a_keep_alive_connection_that_starts_a_head_and_stalls_is_closed(svc: Service) -> None:
    with _connect(svc) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        status, _, _ = _read_response(s)
        assert status == 200
        s.sendall(b"GET /healthz HTTP/1.1\r\nho")  # cancels uvicorn's keep-alive timer
        assert _closed_by_server(s)


def test_half_open_connections_beyond_the_cap_cannot_starve_the_service(svc: Service) -> None:
    # max_connections is 40: 200 half-open connections push each other out, oldest first,
    # and a real request still gets its answer.
    flood = [_connect(svc) for _ in range(200)]
    try:
        for s in flood:
            s.sendall(b"GET /healthz HTTP/1.1\r\nhost")
        r = httpx.get(svc.url + "/healthz", timeout=5)
        assert r.status_code == 200
        for s in flood:
            s.settimeout(5)
        closed = sum(_closed_by_server(s) for s in flood[:150])
        assert closed == 150  # the oldest were pushed out (or timed out): none held on
    finally:
        for s in flood:
            s.close()


@pytest.mark.slow
def test_beyond_the_cap_with_every_connection_busy_a_new_one_gets_503(tmp_path: Path) -> None:
    svc = start_service(
        tmp_path / "busy.duckdb", env={"SHAPEWATCH_MAX_CONNECTIONS": "2", "SHAPEWATCH_BODY_IDLE_SECONDS": "30"}
    )
    busy = [_connect(svc) for _ in range(2)]
    try:
        for s in busy:  # heads sent, bodies pending: busy with a request, not waiting for one
            s.sendall(
                b"POST /v1/outputs HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                b"expect: 100-continue\r\ncontent-length: 1000\r\n\r\n"
            )
            # "100 Continue" comes once the service parsed the head and the route reads the body
            assert s.recv(64) == b"HTTP/1.1 100 Continue\r\n\r\n"
            s.sendall(b"[")
        with _connect(svc) as third:
            status, headers, body = _read_response(third)
        assert (status, headers["retry-after"], body) == (
            503,
            "1",
            {
                "error": {
                    "status": 503,
                    "message": "the service holds its most connections, all of them busy; retry shortly",
                    "fields": [{"path": "connection", "reason": "too many connections"}],
                }
            },
        )
    finally:
        for s in busy:
            s.close()
        svc.stop()


@pytest.mark.slow  # a service of its own with tokens (about 10 s)
def test_a_request_without_its_token_is_refused_before_its_body_is_read(tmp_path: Path) -> None:
    svc = start_service(tmp_path / "auth.duckdb", env={"SHAPEWATCH_TOKENS": "s3cret"})
    try:
        with _connect(svc) as s:
            s.sendall(
                b"POST /v1/outputs HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                b"content-length: 10000000\r\n\r\n["
            )
            status, _, body = _read_response(s)
        assert status == 401, body
    finally:
        svc.stop()
