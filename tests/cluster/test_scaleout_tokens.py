"""The scale-out collector's bearer tokens against the embedded service's: the same tokens
configured on both (``tokens`` in the ``[scaleout]`` table, ``SHAPEWATCH_TOKENS`` for ``shapewatch
serve``), the same requests, the same answers: status, error body and ``WWW-Authenticate``.
Both run as real processes (a JetStream node behind the collector)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from cluster_harness import NatsCluster, free_port, missing_tools, shapewatch_proc
from harness import Service, make_envelope, start_service

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(bool(missing_tools()), reason=f"the collector needs: {', '.join(missing_tools())}"),
]

TOKENS = ["ingest:ingest-secret", "read+admin:reader-secret"]


class Both:
    def __init__(self, scaleout: str, embedded: Service) -> None:
        self.scaleout, self.embedded = scaleout, embedded


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Both]:
    root = tmp_path_factory.mktemp("tokens")
    nats = NatsCluster(root / "nats", size=1)
    nats.start()
    conf = root / "scaleout.toml"
    conf.write_text(
        f"""[scaleout]
nats_servers = ["{nats.urls[0]}"]
pg_dsn = "host=127.0.0.1 dbname=unused"
data_path = "{root / "lake"}/"
replicas = 1
tokens = {orjson.dumps(TOKENS).decode()}
"""
    )
    port = free_port()
    proc = shapewatch_proc(
        "collector", ["scaleout", "collector", "--config", str(conf), "--port", str(port)], root / "c.log", port
    )
    proc.start()
    embedded = start_service(Path(root / "embedded.duckdb"), env={"SHAPEWATCH_TOKENS": ",".join(TOKENS)})
    try:
        proc.wait_ready(60)
        yield Both(f"http://127.0.0.1:{port}", embedded)
    finally:
        embedded.stop()
        proc.stop()
        nats.stop()


def _answer(url: str, body: bytes, authorization: str | None) -> tuple[int, dict[str, object], str | None]:
    headers = {"content-type": "application/json"}
    if authorization is not None:
        headers["authorization"] = authorization
    r = httpx.post(f"{url}/v1/outputs", content=body, headers=headers, timeout=30)
    return r.status_code, r.json(), r.headers.get("www-authenticate")


@pytest.mark.parametrize(
    ("authorization", "status", "message"),
    [
        (None, 401, "authentication required"),
        ("Bearer wrong-secret", 401, "missing or invalid bearer token"),
        ("Bearer " + "x" * 4000, 401, "missing or invalid bearer token"),
        ("Basic aW5nZXN0LXNlY3JldA==", 401, "missing or invalid bearer token"),
        ("Bearer", 401, "missing or invalid bearer token"),
        ("Bearer reader-secret", 403, "this token lacks the 'ingest' scope that POST /v1/outputs needs"),
    ],
)
def test_a_missing_or_wrong_token_is_refused_as_the_embedded_collector_refuses_it(
    both: Both, authorization: str | None, status: int, message: str
) -> None:
    # the body is not even JSON: the token is checked before the body is read, on both
    for body in (orjson.dumps(make_envelope()), b"{not json"):
        scaled = _answer(both.scaleout, body, authorization)
        embedded = _answer(both.embedded.url, body, authorization)
        assert scaled == embedded
        assert scaled[0] == status
        assert scaled[1]["error"]["message"] == message  # type: ignore[index]
    if status == 401:
        assert scaled[2] == "Bearer"
        assert scaled[1] == {"error": {"status": 401, "message": message, "fields": []}}
    else:
        assert scaled[2] == 'Bearer error="insufficient_scope", scope="ingest"'
        assert scaled[1]["error"]["fields"] == [  # type: ignore[index]
            {"path": "authorization", "reason": "needs scope ingest; the token has admin+read"}
        ]


def test_the_ingest_token_is_accepted_and_health_stays_open(both: Both) -> None:
    env = make_envelope()
    status, reply, _ = _answer(both.scaleout, orjson.dumps(env), "Bearer ingest-secret")
    assert (status, reply) == (
        200,
        {
            "accepted": 1,
            "duplicate": 0,
            "rejected": 0,
            "results": [{"index": 0, "event_id": env["event_id"], "status": "accepted"}],
        },
    )
    health = httpx.get(f"{both.scaleout}/healthz", timeout=10)
    assert health.status_code == 200
    assert health.json()["status"] == "ok"
