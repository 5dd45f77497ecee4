"""Bulk import under crash: ``shapewatch ingest FILE --db PATH`` SIGKILLed at random offsets and rerun.

The file mixes valid lines with an ``event_id``, valid lines without one (ids derived from
the file path, line number and bytes), invalid lines (not JSON, a required field missing,
an output that is not an object, a time without a zone), exact repeats of earlier lines
(duplicates) and reused ids with another payload (conflicts), plus blank lines.

Quarantine: ``ingest`` writes every rejected line (invalid, or a conflict found by the
store) with its line number, reasons and raw text to
``quarantine/<file>.<hash>.rejected.jsonl`` beside the database, rewritten at each run.

Pass: after the kills and a complete rerun, the stored rows are exactly the distinct valid
lines (first occurrence of each id, its payload), rollups count each stored event once, a
further rerun adds nothing (accepted 0, the whole summary as expected, exit code 1 for
the rejected lines), and the quarantine holds exactly the invalid and conflicting lines.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import fault_support  # noqa: F401  (registers the tests' helpers that rel_support loads)
import pytest
from rel_support import ROOT, SHAPEWATCH

from shapewatch.collector import Store

MODEL = "claude-sonnet-4-5-20250929"


def _write_file(path: Path, n: int, rng: random.Random) -> dict[str, Any]:
    """Write the JSONL file; return what a correct import must end with."""
    valid_ids: dict[str, dict[str, Any]] = {}  # event_id -> first stored output
    generated = 0
    quarantined: dict[int, str] = {}  # line number -> expected reason code
    stored_lines: list[dict[str, Any]] = []
    lines: list[str] = []
    for i in range(n):
        no = len(lines) + 1
        roll = rng.random()
        if roll < 0.06 and stored_lines:  # an exact repeat of an earlier line with an id
            lines.append(json.dumps(rng.choice(stored_lines)))
            continue
        if roll < 0.09 and valid_ids:  # an id reused with another payload
            eid = rng.choice(list(valid_ids))
            lines.append(
                json.dumps(
                    {
                        "event_id": eid,
                        "model": MODEL,
                        "served_model": MODEL,
                        "prompt_version": "bulk-v1",
                        "output": {"i": -1, "conflict": no},
                    }
                )
            )
            quarantined[no] = "conflict"
            continue
        if roll < 0.15:
            kind = rng.randrange(4)
            bad = [
                "{not json",
                json.dumps({"prompt_version": "bulk-v1", "output": {"i": i}}),
                json.dumps({"model": MODEL, "prompt_version": "bulk-v1", "output": [i]}),
                json.dumps(
                    {"model": MODEL, "prompt_version": "bulk-v1", "ts": "2026-11-29T12:00:00", "output": {"i": i}}
                ),
            ][kind]
            lines.append(bad)
            quarantined[no] = ("invalid_json", "missing", "wrong_type", "invalid_timestamp")[kind]
            continue
        if roll < 0.16:
            lines.append("")  # blank lines are skipped
            continue
        env: dict[str, Any] = {
            "model": MODEL,
            "served_model": MODEL,
            "prompt_version": "bulk-v1",
            "ts": f"2026-11-29T{i % 24:02d}:{i % 60:02d}:00Z",
            "output": {
                "i": i,
                "tier": ("gold", "silver", "bronze")[i % 3],
                "tags": ["x"] * (i % 4),
                "text": "y" * (i % 50),
            },
        }
        if roll < 0.5:
            # No event_id: derived from the file, the line number and its bytes, so a repeat
            # of this line elsewhere is another event (README); only lines with ids are repeated.
            generated += 1
        else:
            env["event_id"] = f"bulk-{i}"
            valid_ids[env["event_id"]] = env["output"]
            stored_lines.append(env)
        lines.append(json.dumps(env))
    path.write_text("\n".join(lines) + "\n")
    return {
        "lines": len(lines),
        "ids": valid_ids,
        "generated": generated,
        "quarantined": quarantined,
        "valid_lines": sum(1 for line in lines if line) - len(quarantined),
    }


def _ingest(src: Path, db: Path) -> subprocess.Popen[bytes]:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SHAPEWATCH_")}, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [*SHAPEWATCH, "ingest", str(src), "--db", str(db), "--format", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )


def _finish(proc: subprocess.Popen[bytes], timeout: float) -> tuple[int, dict[str, Any], str]:
    out, err = proc.communicate(timeout=timeout)
    summary = json.loads(out) if out.strip() else {}
    return proc.returncode, summary, err.decode(errors="replace")


def _quarantine_stamp(db: Path) -> tuple[tuple[str, int, int], ...]:
    return tuple(
        sorted(
            (p.name, p.stat().st_mtime_ns, p.stat().st_ino) for p in (db.parent / "quarantine").glob("*.rejected.jsonl")
        )
    )


def _wait_for_lines(proc: subprocess.Popen[bytes], db: Path, before: tuple[tuple[str, int, int], ...]) -> None:
    """Until the run reads the file: ``ingest`` opens (creates or truncates) its quarantine
    file with the store open, just before the first line. Offsets count from there, not from
    the process start, so a kill falls during the import itself however long the interpreter
    takes to start (with 3,000 lines, runs once ended before a kill 0.3-0.6 s after the start)."""
    deadline = time.monotonic() + 60
    while _quarantine_stamp(db) == before and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)


def _scenario(
    tmp_path: Path,
    report: dict[str, object],
    *,
    lines: int,
    kills: int,
    seed: int,
    min_offset: float,
    max_offset: float,
) -> None:
    rng = random.Random(seed)
    src, db = tmp_path / "outputs.jsonl", tmp_path / "db" / "import.duckdb"
    want = _write_file(src, lines, rng)
    killed, completed, offsets = 0, 0, []
    for _ in range(kills):
        offset = rng.uniform(min_offset, max_offset)
        before = _quarantine_stamp(db)
        proc = _ingest(src, db)
        _wait_for_lines(proc, db, before)
        try:
            proc.wait(offset)  # a run may finish before its kill: then it is a plain rerun
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        if proc.returncode == -signal.SIGKILL:
            killed += 1
            offsets.append(round(offset, 2))
        else:
            completed += 1
            assert proc.returncode in (0, 1), _finish(proc, 10)
        proc.communicate(timeout=10)

    t0 = time.monotonic()
    code, first, err = _finish(_ingest(src, db), 300)
    rerun_seconds = time.monotonic() - t0
    assert code == 1, err
    code2, again, err2 = _finish(_ingest(src, db), 300)

    reasons: dict[str, int] = {}
    for r in want["quarantined"].values():
        reasons[r] = reasons.get(r, 0) + 1
    qfile = db.parent / "quarantine"
    qfiles = sorted(str(p) for p in qfile.glob("*.rejected.jsonl"))
    with Store.open(db) as store:
        ids = store.query("SELECT event_id, generated_id, output FROM events")
        counted = store.query("SELECT coalesce(sum(events), 0) FROM cohort_buckets")[0][0]
        present_i = store.query(
            "SELECT coalesce(sum(present), 0) FROM field_rollups WHERE scope IS NULL AND path = 'i'"
        )[0][0]
    named = {i: json.loads(o) for i, g, o in ids if not g}
    n_generated = sum(1 for _, g, _ in ids if g)
    quarantine_lines = [json.loads(x) for p in qfiles for x in Path(p).read_text().splitlines()]
    got_q = {q["line"]: q for q in quarantine_lines}
    src_lines = src.read_text().split("\n")

    report.update(
        {
            "lines in file": want["lines"],
            "valid lines": want["valid_lines"],
            "distinct valid events": len(want["ids"]) + want["generated"],
            "invalid or conflicting lines": len(want["quarantined"]),
            "runs SIGKILLed": killed,
            "runs that finished before their kill": completed,
            "kill offsets after reading began, s": offsets,
            "rows stored": len(ids),
            "accepted by the completing rerun": first.get("accepted"),
            "completing rerun, s": round(rerun_seconds, 2),
            "accepted by the final rerun": again.get("accepted"),
            "quarantined lines": len(got_q),
            "rollup events counted": counted,
        }
    )
    assert killed >= max(1, kills // 2), f"too few runs were killed mid-import: {report}"
    assert named == want["ids"], "the stored events with an id differ from the first valid line of each id"
    assert n_generated == want["generated"]
    assert len(ids) == len(want["ids"]) + want["generated"]
    assert (counted, present_i) == (len(ids), len(ids)), "rollups do not count each stored event once"
    assert (code2, again) == (
        1,
        {
            "accepted": 0,
            "duplicate": want["valid_lines"],
            "rejected": len(want["quarantined"]),
            "rejected_by_reason": dict(sorted(reasons.items())),
            "quarantine": qfiles,
            "unreadable": [],
        },
    ), err2
    assert first["rejected"] == len(want["quarantined"]) and first["rejected_by_reason"] == again["rejected_by_reason"]
    assert len(qfiles) == 1 and len(quarantine_lines) == len(got_q)  # one line per rejected input line
    assert sorted(got_q) == sorted(want["quarantined"])
    assert all(
        got_q[n]["raw"] == src_lines[n - 1] and got_q[n]["file"] == str(src) and got_q[n]["errors"] for n in got_q
    )


@pytest.mark.slow
def test_bulk_import_killed_once_smoke(tmp_path: Path, report: dict[str, object]) -> None:
    """Bulk import under crash (smoke: one SIGKILL, then reruns)"""
    _scenario(tmp_path, report, lines=30_000, kills=1, seed=11, min_offset=0.02, max_offset=0.2)


@pytest.mark.reliability
def test_bulk_import_killed_at_random_offsets(tmp_path: Path, report: dict[str, object]) -> None:
    """Bulk import under crash: SIGKILL at random offsets, reruns add nothing twice"""
    _scenario(tmp_path, report, lines=150_000, kills=6, seed=7, min_offset=0.05, max_offset=1.0)
