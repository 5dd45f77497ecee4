"""A checkpoint that cannot write the file (a full disk) makes DuckDB invalidate the database:
every later statement fails, until the process restarts. The service must not answer 503
("retry later") forever then: it stops, exits 3 naming the cause, and a restart on the same
file has every acknowledged event, once, with its counts.

The full disk is a file-size limit on the service process (RLIMIT_FSIZE; Python ignores the
SIGXFSZ it raises, so a write past it fails with EFBIG), with a small checkpoint threshold so
that a checkpoint is what meets it.
"""

from __future__ import annotations

import os
import resource
import subprocess
import time
import uuid
from pathlib import Path

import duckdb
import httpx
import pytest
from harness import ROOT, SHAPEWATCH, free_port, start_service


@pytest.mark.slow
def test_an_invalidated_database_stops_the_service_and_a_restart_recovers_it(tmp_path: Path) -> None:
    db, port = tmp_path / "full.duckdb", free_port()
    log = tmp_path / "serve.log"
    limit = 8 << 20

    def full_disk() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))

    env = {**os.environ, "PYTHONPATH": str(ROOT), "SHAPEWATCH_CHECKPOINT_THRESHOLD": "1MB"}
    proc = subprocess.Popen(
        [*SHAPEWATCH, "serve", "--db", str(db), "--port", str(port)],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env=env,
        cwd=ROOT,
        preexec_fn=full_disk,
    )
    url = f"http://127.0.0.1:{port}"
    acked: set[str] = set()
    answers: list[int] = []
    invalidated_seen = False
    try:
        with httpx.Client(base_url=url, timeout=30) as http:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # polling a start-up with a deadline
                assert proc.poll() is None, log.read_text()[-3000:]
                try:
                    if http.get("/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.05)
            for k in range(3000):  # until the service stops (or the bound, which fails below)
                body = [
                    {
                        "event_id": f"b{k}-{i}",
                        "model": "m",
                        "prompt_version": "p",
                        "output": {"i": i, "pad": uuid.uuid4().hex * 8},
                    }
                    for i in range(100)
                ]
                try:
                    r = http.post("/v1/outputs", json=body)
                except httpx.HTTPError:
                    break  # stopped
                answers.append(r.status_code)
                if r.status_code == 200:
                    acked.update(e["event_id"] for e in body)
                else:
                    assert r.status_code == 503, r.text
                    if "invalidated" in r.text:
                        invalidated_seen = True
                        try:
                            health = http.get("/healthz")
                        except httpx.HTTPError:
                            continue  # already stopped
                        assert health.status_code == 503 and "restart" in health.text, health.text
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert code == 3, text[-3000:]
    assert "error: DuckDB invalidated the database after a fatal error while" in text, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert acked and invalidated_seen

    svc = start_service(db, port=free_port())  # no limit now: recovered at open
    try:
        with svc.client() as http:
            r = http.post(
                "/v1/outputs", json=[{"event_id": "after", "model": "m", "prompt_version": "p", "output": {"i": 1}}]
            )
            assert r.status_code == 200, r.text
    finally:
        svc.stop()
    with duckdb.connect(str(db), read_only=True) as con:
        stored = dict(con.execute("SELECT event_id, count(*) FROM events GROUP BY ALL").fetchall())
        counted = con.execute("SELECT sum(events) FROM cohort_buckets").fetchone()
    assert acked | {"after"} <= stored.keys()
    assert set(stored.values()) == {1}
    assert counted == (len(stored),)  # every stored event counted once, none twice
