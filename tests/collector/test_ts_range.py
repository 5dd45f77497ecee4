"""``ts`` outside the documented range (1971-01-01T00:00:00Z up to, not including,
2200-01-01T00:00:00Z) is refused at ingest, naming ``ts`` and the reason: through the real service
and the real bulk import. A year 1 or 9999 used to be stored, and then could not be read back.
(The C paths against the Python rules at the edges: test_scanner.py.)"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import duckdb
import httpx
import pytest
from harness import ROOT, SHAPEWATCH, make_envelope, start_service

from shapewatch.collector import quarantine_path

JSON = {"content-type": "application/json"}
OUTSIDE = [
    "0001-01-01T00:00:00Z",
    "9999-12-31T23:59:59Z",
    "1970-12-31T23:59:59Z",
    "2200-01-01T00:00:00Z",
    "1971-01-01T00:59:59+01:00",
    "2199-12-31T23:30:00-00:30",
    "9999-12-31T23:59:59-01:00",
]
INSIDE = [
    "1971-01-01T00:00:00Z",
    "2199-12-31T23:59:59.999999Z",
    "1970-12-31T23:00:00-01:00",
    "2200-01-01T00:30:00+00:31",
]


def reason(ts: str) -> str:
    return f"{ts!r} is outside the accepted range: from 1971-01-01T00:00:00Z up to, not including, 2200-01-01T00:00:00Z"


def post(c: httpx.Client, body: Any) -> httpx.Response:
    return c.post("/v1/outputs", content=json.dumps(body).encode(), headers=JSON)


@pytest.mark.slow
def test_the_service_refuses_ts_outside_the_range_naming_it(tmp_path: Path) -> None:
    svc = start_service(tmp_path / "svc.duckdb")
    try:
        with svc.client() as c:
            for ts in OUTSIDE:
                r = post(c, make_envelope(ts=ts))
                assert r.status_code == 422, (ts, r.text)
                assert r.json()["error"]["fields"] == [{"path": "ts", "reason": reason(ts)}]
            items = [make_envelope(event_id=f"e{i}", ts=ts) for i, ts in enumerate(INSIDE + OUTSIDE)]
            r = post(c, items)
            assert r.status_code == 200, r.text
            assert [(x["event_id"], x["status"], x.get("errors")) for x in r.json()["results"]] == [
                *((f"e{i}", "accepted", None) for i in range(len(INSIDE))),
                *(
                    (f"e{len(INSIDE) + i}", "rejected", [{"path": "ts", "reason": reason(ts)}])
                    for i, ts in enumerate(OUTSIDE)
                ),
            ]
            assert c.get("/healthz").json()["events"] == len(INSIDE)
    finally:
        svc.stop()
    with duckdb.connect(str(svc.db_path), read_only=True) as con:
        assert sorted(con.execute("SELECT event_id, epoch_us(ts) FROM events").fetchall()) == [
            ("e0", 31_536_000_000_000),
            ("e1", 7_258_118_399_999_999),
            ("e2", 31_536_000_000_000),
            ("e3", 7_258_118_340_000_000),
        ]


@pytest.mark.slow
def test_bulk_import_quarantines_ts_outside_the_range_naming_it(tmp_path: Path) -> None:
    lines = [json.dumps(make_envelope(event_id=f"e{i}", ts=ts)) for i, ts in enumerate(INSIDE + OUTSIDE)]
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(lines) + "\n")
    db = tmp_path / "bulk.duckdb"
    proc = subprocess.run(
        [*SHAPEWATCH, "ingest", str(src), "--db", str(db), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 1, proc.stderr
    summary = json.loads(proc.stdout)
    assert (summary["accepted"], summary["rejected"], summary["rejected_by_reason"]) == (
        len(INSIDE),
        len(OUTSIDE),
        {"invalid_timestamp": len(OUTSIDE)},
    )
    entries = [json.loads(x) for x in quarantine_path(db, src).read_text().splitlines()]
    assert [(q["line"], q["raw"], [(e["path"], e["reason"]) for e in q["errors"]]) for q in entries] == [
        (len(INSIDE) + i + 1, lines[len(INSIDE) + i], [("ts", reason(ts))]) for i, ts in enumerate(OUTSIDE)
    ]
    with duckdb.connect(str(db), read_only=True) as con:
        assert sorted(con.execute("SELECT event_id FROM events").fetchall()) == [(f"e{i}",) for i in range(len(INSIDE))]
