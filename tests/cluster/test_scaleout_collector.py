"""The scale-out collector (``shapewatch scaleout collector``) against a real NATS JetStream node:
hostile requests answered with the error shape naming the field and the reason, and no 2xx
without JetStream's acknowledgement (503 with Retry-After while NATS is down)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import orjson
import pytest
from cluster_harness import NatsCluster, Proc, free_port, missing_tools, shapewatch_proc
from harness import make_envelope

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(bool(missing_tools()), reason=f"the collector needs: {', '.join(missing_tools())}"),
]

JSON = {"content-type": "application/json"}


class One:
    def __init__(self, nats: NatsCluster, proc: Proc, url: str) -> None:
        self.nats, self.proc, self.url = nats, proc, url


@pytest.fixture(scope="module")
def one(tmp_path_factory: pytest.TempPathFactory) -> Iterator[One]:
    root = tmp_path_factory.mktemp("collector")
    nats = NatsCluster(root / "nats", size=1)
    nats.start()
    conf = root / "scaleout.toml"
    conf.write_text(
        f"""[scaleout]
nats_servers = ["{nats.urls[0]}"]
pg_dsn = "host=127.0.0.1 dbname=unused"
data_path = "{root / "lake"}/"
replicas = 1
publish_timeout_seconds = 2
max_body_bytes = 100000
max_request_events = 50
"""
    )
    port = free_port()
    proc = shapewatch_proc(
        "collector", ["scaleout", "collector", "--config", str(conf), "--port", str(port)], root / "c.log", port
    )
    proc.start()
    try:
        proc.wait_ready(60)
        yield One(nats, proc, f"http://127.0.0.1:{port}")
    finally:
        proc.stop()
        nats.stop()


def _post(one: One, body: bytes, headers: dict[str, str] = JSON) -> httpx.Response:
    return httpx.post(f"{one.url}/v1/outputs", content=body, headers=headers, timeout=30)


def test_an_accepted_event_is_answered_after_jetstream_and_a_retry_is_a_duplicate(one: One) -> None:
    env = make_envelope()
    first = _post(one, orjson.dumps(env))
    assert first.status_code == 200
    assert first.json() == {
        "accepted": 1,
        "duplicate": 0,
        "rejected": 0,
        "results": [{"index": 0, "event_id": env["event_id"], "status": "accepted"}],
    }
    again = _post(one, orjson.dumps([env]))
    assert again.json()["results"] == [{"index": 0, "event_id": env["event_id"], "status": "duplicate"}]


@pytest.mark.parametrize(
    ("body", "headers", "status", "fragment"),
    [
        (b"{not json", JSON, 400, "not a valid envelope"),
        (b'{"model": 5, "output": []}', JSON, 422, "must be a string"),
        (b"[1, 2", JSON, 400, "not valid JSON"),
        (b"x" * 200_000, JSON, 413, "limit"),
        (orjson.dumps([make_envelope() for _ in range(51)]), JSON, 413, "50"),
        (b"{}", {"content-type": "text/plain"}, 415, "content-type"),
    ],
)
def test_hostile_bodies_get_the_error_shape_with_the_reason(
    one: One, body: bytes, headers: dict[str, str], status: int, fragment: str
) -> None:
    r = _post(one, body, headers)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["status"] == status
    assert fragment in (err["message"] + " " + " ".join(f["reason"] for f in err["fields"]))


def test_a_bad_item_is_rejected_alone_naming_its_field(one: One) -> None:
    good = make_envelope()
    r = _post(one, orjson.dumps([good, {**make_envelope(), "output": "text"}]))
    assert r.status_code == 200
    reply = r.json()
    assert (reply["accepted"], reply["rejected"]) == (1, 1)
    bad = reply["results"][1]
    assert bad["status"] == "rejected"
    assert [(f["path"], f["reason"]) for f in bad["errors"]] == [("output", "must be a JSON object, got string")]


def test_while_nats_is_down_nothing_is_acknowledged_and_health_says_so(one: One) -> None:
    node = one.nats.nodes[0].proc
    assert node is not None
    node.kill()
    try:
        r = _post(one, orjson.dumps(make_envelope()))
        assert r.status_code == 503
        assert r.headers["retry-after"] == "1"
        assert "retry" in r.json()["error"]["message"]
        assert httpx.get(f"{one.url}/healthz", timeout=5).status_code == 503
    finally:
        node.start()
        node.wait_ready(60)
    # back: the same event is accepted once NATS is (the collector reconnects by itself)
    deadline = time.monotonic() + 30
    while httpx.get(f"{one.url}/healthz", timeout=5).status_code != 200:
        assert time.monotonic() < deadline, "the collector did not reconnect"
        time.sleep(0.2)
    assert _post(one, orjson.dumps(make_envelope())).status_code == 200
