"""Disk full and store faults: the database on a small filesystem that fills up, and a damaged
write-ahead log after a kill.

Disk full: the service runs on a 40 MB tmpfs; a filler file leaves a few MB, and clients
post batches until writes fail. Pass: every answer is a 200 (then every event in it is
stored at the end) or a 503 with Retry-After, never another status; /healthz fails while
writes fail; once the filler is deleted, new writes succeed without a restart, /healthz
recovers, and after a clean stop and reopen everything acknowledged is present once.

Damaged WAL: events are acknowledged, the service is SIGKILLed (so the events live in
``<db>.wal``), then the WAL is truncated, overwritten in the middle, or has its header
overwritten. Pass: ``shapewatch serve`` either refuses with exit code 2 and one clear line
naming the write-ahead log and what to do (no traceback), or starts and logs a warning
naming the write-ahead log and where a copy of it was kept (the quarantine); never a silent
start, never a crash after start-up.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import fault_support  # noqa: F401  (registers the tests' helpers that rel_support loads)
import httpx
import pytest
from fault_support import spawn, tmpfs, wait_for
from rel_support import ROOT, SHAPEWATCH, make_envelope

from shapewatch.collector import Store


def _envs(prefix: str, n: int) -> list[dict[str, object]]:
    return [
        make_envelope(
            event_id=f"{prefix}-{i}", served_model=None, output={"i": i, "pad": "x" * 300, "tags": ["a", "b"]}
        )
        for i in range(n)
    ]


def _fill(where: Path, leave: int) -> Path:
    """A filler file taking all but ``leave`` bytes of the filesystem at ``where``."""
    filler = where / "filler.bin"
    chunk = b"\0" * (1 << 20)
    with filler.open("wb") as f:
        while True:
            st = os.statvfs(where)
            free = st.f_bavail * st.f_frsize
            if free <= leave:
                break
            f.write(chunk[: max(4096, min(len(chunk), free - leave))])
            f.flush()
    return filler


@pytest.mark.reliability
def test_disk_full_answers_503_and_recovers_when_space_is_freed(tmp_path: Path, report: dict[str, object]) -> None:
    """Disk full: 503 with Retry-After, /healthz fails, recovery once space is freed"""
    with tmpfs(tmp_path / "fs", "40m") as fs:
        db = fs / "full.duckdb"
        svc = spawn(tmp_path, db)
        svc.start()
        acked: set[str] = set()
        refused = 0
        bad: list[str] = []
        health_while_failing: list[int] = []
        try:
            with svc.client() as c:
                assert c.post("/v1/outputs", json=_envs("warm", 50)).status_code == 200
                acked.update(f"warm-{i}" for i in range(50))
                filler = _fill(fs, 3 << 20)
                k = 0
                while refused < 5 and k < 400:  # until writes have failed a few times in a row
                    envs = _envs(f"b{k}", 100)
                    k += 1
                    r = c.post("/v1/outputs", json=envs)
                    if r.status_code == 200:
                        statuses = {x["status"] for x in r.json()["results"]}
                        if statuses != {"accepted"}:
                            bad.append(f"200 with statuses {statuses}")
                        acked.update(str(e["event_id"]) for e in envs)
                        refused = 0
                    elif r.status_code == 503 and r.headers.get("retry-after", "").isdigit():
                        refused += 1
                        health_while_failing.append(c.get("/healthz").status_code)
                    else:
                        bad.append(f"HTTP {r.status_code} {r.headers.get('retry-after')} {r.text[:200]}")
                        refused += 1
                batches_before_full = k
                full_free = os.statvfs(fs).f_bavail * os.statvfs(fs).f_frsize
                filler.unlink()

                def writes_again() -> bool:
                    r = c.post("/v1/outputs", json=_envs("probe", 1))
                    return r.status_code == 200

                recovery = wait_for("a write to succeed after freeing space", writes_again, 60, 0.5)
                acked.add("probe-0")
                health_after = wait_for("/healthz to recover", lambda: c.get("/healthz").status_code == 200, 30)
                r = c.post("/v1/outputs", json=_envs("after", 500))
                assert r.status_code == 200 and r.json()["accepted"] == 500, r.text
                acked.update(f"after-{i}" for i in range(500))
                alive = svc.proc is not None and svc.proc.poll() is None
        finally:
            svc.stop()
        log = svc.log_tail(100_000)
        with Store.open(db) as store:
            stored = dict(store.query("SELECT event_id, count(*) FROM events GROUP BY ALL"))
            counted = store.query("SELECT coalesce(sum(events), 0) FROM cohort_buckets")[0][0]
    lost = acked - stored.keys()
    report.update(
        {
            "filesystem": "tmpfs 40 MB",
            "batches of 100 posted before writes failed": batches_before_full,
            "free bytes when writes failed": full_free,
            "events acknowledged": len(acked),
            "stored": len(stored),
            "lost (acknowledged, absent)": len(lost),
            "answers other than 200 or 503+Retry-After": len(bad),
            "/healthz while writes failed": sorted(set(health_while_failing)),
            "seconds to the first good write after freeing space": round(recovery, 2),
            "seconds to a healthy /healthz after that": round(health_after, 2),
            "rollup events counted / stored": f"{counted} / {len(stored)}",
        }
    )
    assert bad == [], bad[:5]
    assert health_while_failing and set(health_while_failing) == {503}, health_while_failing
    assert alive, "the service died while the disk was full"
    assert lost == set(), sorted(lost)[:10]
    assert max(stored.values()) == 1 and counted == len(stored)
    assert "Traceback" not in log, log[-3000:]


def _damaged_wal(tmp_path: Path, damage: str) -> tuple[Path, int, int]:
    """A database whose WAL holds acknowledged events (SIGKILL), then damaged; (db, events, wal bytes)."""
    db = tmp_path / "wal.duckdb"
    svc = spawn(tmp_path, db)
    svc.start()
    try:
        with svc.client() as c:
            for k in range(5):
                r = c.post("/v1/outputs", json=_envs(f"w{k}", 100))
                assert r.status_code == 200 and r.json()["accepted"] == 100, r.text
    finally:
        svc.kill(signal.SIGKILL)
    wal = Path(f"{db}.wal")
    size = wal.stat().st_size
    assert size > 0, "nothing in the WAL after the kill: the scenario would test nothing"
    if damage == "truncated":
        os.truncate(wal, size // 2)
    elif damage == "garbage in the middle":
        with wal.open("r+b") as f:
            f.seek(size // 3)
            f.write(os.urandom(4096))
    else:  # the header
        with wal.open("r+b") as f:
            f.write(os.urandom(64))
    return db, 500, size


@pytest.mark.reliability
@pytest.mark.parametrize("damage", ["truncated", "garbage in the middle", "garbage in the header"])
def test_a_damaged_wal_is_refused_clearly_or_quarantined_with_a_warning(
    tmp_path: Path, report: dict[str, object], damage: str
) -> None:
    """Damaged WAL after a kill: a clear refusal, or a start with a warning and a kept copy"""
    db, acked, wal_bytes = _damaged_wal(tmp_path, damage)
    svc = spawn(tmp_path, db)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SHAPEWATCH_")}, "PYTHONPATH": str(ROOT)}
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [*SHAPEWATCH, "serve", "--db", str(db), "--port", str(svc.port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )
    outcome, err = "", ""
    try:

        def decided() -> bool:
            if proc.poll() is not None:
                return True
            try:
                return httpx.get(svc.url + "/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for("the service to start or refuse", decided, 60, 0.1)
        seconds = time.monotonic() - t0
        if proc.poll() is None:
            outcome = "started"
            with httpx.Client(base_url=svc.url, timeout=10) as c:
                events = c.get("/healthz").json()["events"]
                r = c.post("/v1/outputs", json=_envs("after", 10))
                assert r.status_code == 200 and r.json()["accepted"] == 10, r.text
            proc.send_signal(signal.SIGTERM)
            _, err_b = proc.communicate(timeout=60)
            err = err_b.decode(errors="replace")
            assert proc.returncode in (0, -signal.SIGTERM), err[-3000:]  # uvicorn re-raises SIGTERM
        else:
            outcome = f"refused (exit {proc.returncode})"
            events = -1
            err = proc.communicate(timeout=10)[1].decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    copies = sorted(p.name for p in (db.parent / "quarantine").glob("*wal*")) if outcome == "started" else []
    warnings = [line for line in err.splitlines() if "WARNING" in line and "write-ahead log" in line]
    report.update(
        {
            "damage": damage,
            "WAL bytes before damage": wal_bytes,
            "events acknowledged": acked,
            "outcome": outcome,
            "seconds to decide": round(seconds, 2),
            "events after start (started only)": events,
            "WAL copies kept": len(copies),
            "message": (warnings[0] if warnings else err.strip().splitlines()[-1] if err.strip() else "")[:300],
        }
    )
    assert "Traceback" not in err, err[-3000:]
    if outcome == "started":
        assert warnings, f"started without a warning about the write-ahead log:\n{err[-3000:]}"
        assert len(copies) == 1 and copies[0] in warnings[0], (copies, warnings)
    else:
        assert proc.returncode == 2, err
        lines = [line for line in err.strip().splitlines() if line.strip()]
        assert (
            len(lines) == 1
            and lines[0].startswith("error: ")
            and "write-ahead log" in lines[0]
            and f"{db}.wal" in lines[0]
            and "move it aside" in lines[0]
        ), err
        # The refusal is stable: a second start says the same, and the file was not touched.
        again = subprocess.run(
            [*SHAPEWATCH, "serve", "--db", str(db), "--port", str(svc.port)],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            timeout=60,
        )
        assert (again.returncode, again.stderr.strip()) == (2, lines[0])
