"""``shapewatch ingest`` as a user runs it: a subprocess on real JSONL files and a real DuckDB file."""

from __future__ import annotations

import base64
import gzip
import io
import json
import os
import subprocess
import zlib
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import pytest
from harness import ROOT, SHAPEWATCH, Service, make_envelope

from shapewatch.collector import quarantine_path


def ingest(*files: Path, db: Path, fmt: str = "json") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SHAPEWATCH, "ingest", *map(str, files), "--db", str(db), "--format", fmt],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def summary_of(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def summary(
    accepted: int = 0,
    duplicate: int = 0,
    rejected: int = 0,
    rejected_by_reason: dict[str, int] | None = None,
    quarantine: list[str] | None = None,
    unreadable: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    return {
        "accepted": accepted,
        "duplicate": duplicate,
        "rejected": rejected,
        "rejected_by_reason": rejected_by_reason or {},
        "quarantine": quarantine or [],
        "unreadable": unreadable or [],
    }


def stored(db: Path) -> dict[str, int]:
    """event_id -> how many rows hold it."""
    with duckdb.connect(str(db), read_only=True) as con:
        return dict(con.execute("SELECT event_id, count(*) FROM events GROUP BY event_id").fetchall())


def write_lines(path: Path, lines: list[str]) -> Path:
    data = ("\n".join(lines) + "\n").encode()
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def valid_lines() -> list[str]:
    """Four valid envelopes: two with an event_id, two without (one of them without ts),
    and the two without ids are byte-identical apart from the line they are on."""
    no_id = json.dumps(make_envelope(event_id=None, ts=None, output={"priority": "low"}))
    return [json.dumps(make_envelope()), no_id, json.dumps(make_envelope(output={"x": [1, 2]})), no_id]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "var" / "shapewatch.duckdb"


@pytest.mark.parametrize("name", ["outputs.jsonl", "outputs.jsonl.gz"])
def test_ingest_stores_every_line_and_a_rerun_adds_nothing(tmp_path: Path, db: Path, name: str) -> None:
    src = write_lines(tmp_path / name, [*valid_lines(), ""])  # a trailing blank line is skipped
    first = ingest(src, db=db)
    assert first.returncode == 0, first.stderr
    assert summary_of(first) == summary(accepted=4)
    ids = stored(db)
    assert len(ids) == 4 and set(ids.values()) == {1}  # identical outputs on two lines both count

    again = ingest(src, db=db)
    assert again.returncode == 0, again.stderr
    assert summary_of(again) == summary(duplicate=4)  # including the lines without event_id
    assert stored(db) == ids
    assert not quarantine_path(db, src).exists()


def test_ingest_table_format_prints_a_summary(tmp_path: Path, db: Path) -> None:
    proc = ingest(write_lines(tmp_path / "o.jsonl", valid_lines()), db=db, fmt="table")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "accepted 4, duplicate 0, rejected 0"


@pytest.mark.slow
def test_rejected_lines_go_to_a_quarantine_that_a_rerun_rewrites(tmp_path: Path, db: Path) -> None:
    good = valid_lines()
    bad_output = json.dumps(make_envelope(output=["not", "an", "object"]))
    bad_json = '{"model": "m", "prompt_version": "p", "output": {"a": NaN}}'
    bad_two = json.dumps(make_envelope(model=None, ts="2026-11-29 12:00"))
    src = write_lines(tmp_path / "mixed.jsonl", [good[0], bad_output, good[1], "", bad_json, bad_two, good[2]])
    qfile = quarantine_path(db, src)

    proc = ingest(src, db=db)
    assert proc.returncode == 1, proc.stderr
    assert summary_of(proc) == summary(
        accepted=3,
        rejected=3,
        quarantine=[str(qfile)],
        rejected_by_reason={"invalid_json": 1, "invalid_timestamp": 1, "missing": 1, "wrong_type": 1},
    )
    expected = [
        {
            "file": str(src),
            "line": 2,
            "raw": bad_output,
            "errors": [{"path": "output", "reason": "must be a JSON object, got array", "code": "wrong_type"}],
        },
        {
            "file": str(src),
            "line": 5,
            "raw": bad_json,
            "errors": [
                {
                    "path": "output.a",
                    "reason": "not valid JSON: unexpected character, expected a JSON value: "
                    f"line 1 column {bad_json.index('NaN') + 1} (char {bad_json.index('NaN')})",
                    "code": "invalid_json",
                }
            ],
        },
        {
            "file": str(src),
            "line": 6,
            "raw": bad_two,
            "errors": [
                {"path": "model", "reason": "is required", "code": "missing"},
                {
                    "path": "ts",
                    "reason": "'2026-11-29 12:00' has no time zone; add 'Z' or an offset like +00:00",
                    "code": "invalid_timestamp",
                },
            ],
        },
    ]
    assert [json.loads(x) for x in qfile.read_text().splitlines()] == expected
    assert len(stored(db)) == 3

    proc = ingest(src, db=db)  # rerun: the quarantine is rewritten, not appended to
    assert proc.returncode == 1
    assert summary_of(proc)["duplicate"] == 3 and summary_of(proc)["accepted"] == 0
    assert [json.loads(x) for x in qfile.read_text().splitlines()] == expected

    # The file fixed in part, every kept line on its old line number (a line without
    # event_id is identified by its number): the quarantine follows the file.
    write_lines(src, [good[0], "", good[1], "", "", bad_output, good[2]])
    proc = ingest(src, db=db)
    assert summary_of(proc) == summary(
        duplicate=3, rejected=1, rejected_by_reason={"wrong_type": 1}, quarantine=[str(qfile)]
    )
    assert [json.loads(x) for x in qfile.read_text().splitlines()] == [{**expected[0], "line": 6}]

    write_lines(src, [good[0], "", good[1], "", "", "", good[2]])  # fully fixed: no quarantine left
    proc = ingest(src, db=db)
    assert proc.returncode == 0
    assert summary_of(proc) == summary(duplicate=3)
    assert not qfile.exists()
    assert len(stored(db)) == 3


@pytest.mark.slow
def test_a_conflicting_line_is_quarantined_too(tmp_path: Path, db: Path) -> None:
    env = make_envelope()
    reused = json.dumps({**env, "output": {"intent": "other"}})
    src = write_lines(tmp_path / "conflict.jsonl", [json.dumps(env), reused])
    proc = ingest(src, db=db)
    assert proc.returncode == 1
    qfile = quarantine_path(db, src)
    assert summary_of(proc) == summary(
        accepted=1, rejected=1, rejected_by_reason={"conflict": 1}, quarantine=[str(qfile)]
    )
    assert [(q["line"], q["raw"]) for q in map(json.loads, qfile.read_text().splitlines())] == [(2, reused)]


def test_a_batch_mixing_every_outcome_counts_each_and_quarantines_only_the_conflict(tmp_path: Path, db: Path) -> None:
    first, second, third = (make_envelope() for _ in range(3))
    reused = json.dumps({**first, "output": {"intent": "other"}})
    lines = [json.dumps(first), json.dumps(second), json.dumps(first), reused, json.dumps(third), json.dumps(second)]
    src = write_lines(tmp_path / "mixed.jsonl", lines)
    proc = ingest(src, db=db)
    assert proc.returncode == 1
    qfile = quarantine_path(db, src)
    assert summary_of(proc) == summary(
        accepted=3, duplicate=2, rejected=1, rejected_by_reason={"conflict": 1}, quarantine=[str(qfile)]
    )
    assert [(q["line"], q["raw"]) for q in map(json.loads, qfile.read_text().splitlines())] == [(4, reused)]
    assert len(stored(db)) == 3


def test_inputs_with_the_same_name_keep_their_own_quarantine(tmp_path: Path, db: Path) -> None:
    (tmp_path / "day1").mkdir()
    (tmp_path / "day2").mkdir()
    a = write_lines(tmp_path / "day1" / "outputs.jsonl", [json.dumps(make_envelope(output=[1]))])
    b = write_lines(tmp_path / "day2" / "outputs.jsonl", [json.dumps(make_envelope(output="s"))])
    proc = ingest(a, b, db=db)
    out = summary_of(proc)
    assert out["rejected"] == 2
    kept = [json.loads(line)["file"] for q in set(out["quarantine"]) for line in Path(q).read_text().splitlines()]
    assert sorted(kept) == sorted([str(a), str(b)])


@pytest.mark.slow
def test_a_db_held_by_a_service_exits_2_saying_so(tmp_path: Path, service_factory: Callable[..., Service]) -> None:
    svc = service_factory(tmp_path / "held.duckdb")
    src = write_lines(tmp_path / "o.jsonl", valid_lines())
    proc = ingest(src, db=svc.db_path)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert f"database {svc.db_path} is in use by another process" in proc.stderr
    assert "send to the running service over HTTP" in proc.stderr  # says what to do instead
    assert "Traceback" not in proc.stderr
    with svc.client() as c:
        assert c.get("/healthz").json()["events"] == 0


def test_a_missing_file_is_a_usage_error(tmp_path: Path, db: Path) -> None:
    proc = ingest(tmp_path / "nope.jsonl", db=db)
    assert proc.returncode == 2
    assert "does not exist" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not db.exists()  # nothing was created for a command that could not run


def test_unreadable_inputs_are_listed_and_the_other_files_imported(tmp_path: Path, db: Path) -> None:
    first = write_lines(tmp_path / "first.jsonl", [json.dumps(make_envelope(event_id=f"a{i}")) for i in range(3)])
    not_gzip = tmp_path / "not.jsonl.gz"
    not_gzip.write_bytes(b"this is not gzip\n")
    last = write_lines(tmp_path / "last.jsonl.gz", [json.dumps(make_envelope(event_id=f"z{i}")) for i in range(2)])
    proc = ingest(first, not_gzip, last, db=db)
    assert proc.returncode == 2, proc.stderr
    reason = f"cannot read {not_gzip}: not a gzip file (Error -3 while decompressing data: incorrect header check)"
    assert summary_of(proc) == summary(accepted=5, unreadable=[{"file": str(not_gzip), "error": reason}])
    assert proc.stderr == (
        f"error: {reason} (the lines read before the fault were imported; once the file is "
        "whole, an import of it adds the rest)\n"
    )
    assert sorted(stored(db)) == ["a0", "a1", "a2", "z0", "z1"]
    assert not quarantine_path(db, not_gzip).exists()


@pytest.mark.slow
def test_a_truncated_gzip_keeps_every_line_read_before_the_cut(tmp_path: Path, db: Path) -> None:
    # GzipFile dropped what a read had decompressed when the stream broke: a file under 4 MiB
    # unpacked gave no line at all
    lines = [
        json.dumps(make_envelope(event_id=f"e{i:04d}", output={"n": i, "pad": "x" * (i % 50)})) for i in range(2000)
    ]
    whole = gzip.compress(("\n".join(lines) + "\n").encode())
    src = tmp_path / "cut.jsonl.gz"
    src.write_bytes(whole[: len(whole) * 3 // 4])
    readable = zlib.decompressobj(31).decompress(src.read_bytes())
    complete, _, tail = readable.rpartition(b"\n")
    n = complete.count(b"\n") + 1
    assert 0 < n < 2000 and tail  # the cut falls inside a line
    proc = ingest(src, db=db)
    assert proc.returncode == 2, proc.stderr
    got = summary_of(proc)
    # the cut line is not a rejected line: it is what "unreadable" says was not read
    assert got == summary(
        accepted=n,
        unreadable=[
            {
                "file": str(src),
                "error": f"cannot read {src}: compressed file ended before the end-of-stream marker was reached",
            }
        ],
    )
    assert sorted(stored(db)) == [f"e{i:04d}" for i in range(n)]
    assert not quarantine_path(db, src).exists()
    src.write_bytes(whole)  # the whole file: the rest comes in, nothing twice
    proc = ingest(src, db=db)
    assert proc.returncode == 0, proc.stderr
    assert summary_of(proc) == summary(accepted=2000 - n, duplicate=n)
    assert sorted(stored(db)) == [f"e{i:04d}" for i in range(2000)] and set(stored(db).values()) == {1}


def test_a_file_given_twice_is_imported_once(tmp_path: Path, db: Path) -> None:
    src = write_lines(tmp_path / "o.jsonl", [*valid_lines(), '{"model": "m"}'])
    qfile = quarantine_path(db, src)
    proc = ingest(src, tmp_path / "." / "o.jsonl", src, db=db)
    assert proc.returncode == 1, proc.stderr
    assert summary_of(proc) == summary(
        accepted=4, rejected=1, rejected_by_reason={"missing": 1}, quarantine=[str(qfile)]
    )
    assert len(qfile.read_text().splitlines()) == 1


def test_an_unwritable_quarantine_stops_the_import_before_storing(tmp_path: Path, db: Path) -> None:
    src = write_lines(tmp_path / "o.jsonl", valid_lines())
    db.parent.mkdir(parents=True)
    (db.parent / "quarantine").write_text("a file where the folder should be")
    proc = ingest(src, db=db)
    assert proc.returncode == 2
    qfile = quarantine_path(db, src)
    assert proc.stderr.startswith(f"error: cannot write rejected lines to {qfile} (")
    assert proc.stderr.endswith(
        f"); nothing of {src} was imported (the import stopped there; the summary counts what was stored before)\n"
    ), proc.stderr
    assert "Traceback" not in proc.stderr
    assert summary_of(proc) == summary()
    assert stored(db) == {}


def test_a_failure_in_a_later_file_still_reports_what_the_earlier_ones_added(tmp_path: Path, db: Path) -> None:
    first = write_lines(tmp_path / "a.jsonl", valid_lines())
    second = write_lines(tmp_path / "b.jsonl", [json.dumps(make_envelope(event_id="b-1"))])
    quarantine_path(db, second).mkdir(parents=True)  # a folder where its rejected lines would go
    proc = ingest(first, second, db=db)
    assert proc.returncode == 2
    assert summary_of(proc) == summary(accepted=4)
    assert f"nothing of {second} was imported (the import stopped there" in proc.stderr
    assert len(stored(db)) == 4


def test_a_byte_order_mark_is_not_part_of_the_first_line(tmp_path: Path, db: Path) -> None:
    src = tmp_path / "bom.jsonl"
    src.write_bytes(b"\xef\xbb\xbf" + ("\n".join(valid_lines()) + "\n").encode())
    assert summary_of(ingest(src, db=db)) == summary(accepted=4)


def test_a_line_that_is_not_utf8_is_quarantined_byte_for_byte(tmp_path: Path, db: Path) -> None:
    raw = b'{"model": "m\xff", "prompt_version": "p", "output": {}}'
    src = tmp_path / "bytes.jsonl"
    src.write_bytes(raw + b"\n")
    proc = ingest(src, db=db)
    (held,) = [json.loads(x) for x in quarantine_path(db, src).read_text().splitlines()]
    assert (held["raw"], base64.b64decode(held["raw_base64"])) == (raw.decode(errors="replace"), raw)
    assert summary_of(proc)["rejected_by_reason"] == {held["errors"][0]["code"]: 1}


@pytest.mark.slow
def test_same_named_files_in_different_folders_do_not_collide(tmp_path: Path, db: Path) -> None:
    line = json.dumps(make_envelope(event_id=None, ts=None))  # no id, no ts: ids come from the file
    (tmp_path / "day1").mkdir()
    (tmp_path / "day2").mkdir()
    a = write_lines(tmp_path / "day1" / "out.jsonl", [line])
    b = write_lines(tmp_path / "day2" / "out.jsonl", [line])
    assert summary_of(ingest(a, db=db)) == summary(accepted=1)
    assert summary_of(ingest(b, db=db)) == summary(accepted=1)
    assert summary_of(ingest(a, db=db)) == summary(duplicate=1)


@pytest.mark.parametrize("block", [1, 2, 3, 7, 64, 1 << 22])
@pytest.mark.parametrize("gz", [False, True])
def test_lines_read_in_blocks_are_the_lines_of_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block: int, gz: bool
) -> None:
    """The import reads blocks and splits them: every line, its number and its bytes are those a
    line-by-line read gives, whatever the block size (lines across blocks, longer than a block,
    empty, with CR, a last line without a newline)."""
    from shapewatch.collector import ingest as ingest_module

    data = b"".join(
        [
            b'{"a": 1}\n',
            b"\n",
            b"x" * 150 + b"\n",
            b"  \r\n",
            b"cr\rlf\r\n",
            b"\n\n",
            "é€😀".encode() + b"\n",
            b"last, no newline",
        ]
    )
    path = tmp_path / ("in.jsonl.gz" if gz else "in.jsonl")
    path.write_bytes(gzip.compress(data) if gz else data)
    monkeypatch.setattr(ingest_module, "_READ_BLOCK", block)
    reader = ingest_module._Lines(path)
    # the reference: a binary file's own line iteration (a lone CR is no line break)
    expected = [(n, line.removesuffix(b"\n")) for n, line in enumerate(io.BytesIO(data), 1)]
    assert list(reader) == expected
    assert len(expected) == 9 and reader.error is None


@pytest.mark.parametrize("block", [1, 2, 5, 1 << 22])
def test_concatenated_gzip_members_a_bom_and_progress_in_file_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    from shapewatch.collector import ingest as ingest_module

    monkeypatch.setattr(ingest_module, "_READ_BLOCK", block)
    monkeypatch.setattr(ingest_module, "_GZ_CHUNK", max(block, 3))
    path = tmp_path / "two.jsonl.gz"
    # `cat a.gz b.gz` is a valid .gz of both; the BOM is dropped however the first block falls
    path.write_bytes(gzip.compress(b"\xef\xbb\xbfone\ntw") + gzip.compress(b"o\nthree\n"))
    reader = ingest_module._Lines(path)
    assert list(reader) == [(1, b"one"), (2, b"two"), (3, b"three")]
    assert reader.error is None
    assert reader.consumed == path.stat().st_size  # compressed bytes: what the progress bar counts
    plain = tmp_path / "bom.jsonl"
    plain.write_bytes(b"\xef\xbb\xbf\xef\xbb\xbfx\n")  # only the first mark goes
    assert list(ingest_module._Lines(plain)) == [(1, b"\xef\xbb\xbfx")]


def test_conflicts_found_in_several_batches_are_quarantined_with_their_lines(tmp_path: Path) -> None:
    """In-process, two events a batch: the store finds the conflicts batch by batch; their lines
    are read again from the file (gzip too) into the quarantine, after the line rejected on read."""
    from shapewatch.collector import Limits, Store, import_files

    envs = [make_envelope() for _ in range(4)]
    reused = [json.dumps({**envs[i], "output": {"intent": f"other {i}"}}) for i in (0, 2)]
    lines = [*map(json.dumps, envs), reused[0], "{not json", json.dumps(envs[1]), reused[1]]
    for gz in (False, True):
        src = tmp_path / ("in.jsonl.gz" if gz else "in.jsonl")
        data = ("\n".join(lines) + "\n").encode()
        src.write_bytes(gzip.compress(data) if gz else data)
        with Store.open(tmp_path / f"db{gz}" / "x.duckdb") as store:
            result = import_files([src], store, Limits(), batch_size=2, tx_batches=2)
        assert result.as_dict() == summary(
            accepted=4,
            duplicate=1,
            rejected=3,
            rejected_by_reason={"conflict": 2, "invalid_json": 1},
            quarantine=[str(quarantine_path(tmp_path / f"db{gz}" / "x.duckdb", src))],
        )
        entries = [json.loads(x) for x in Path(result.quarantine[0]).read_text().splitlines()]
        assert [(q["line"], q["raw"], [e["code"] for e in q["errors"]]) for q in entries] == [
            (6, "{not json", ["invalid_json"]),
            (5, reused[0], ["conflict"]),
            (8, reused[1], ["conflict"]),
        ]


def test_a_conflicting_line_the_file_no_longer_holds_as_imported_is_quarantined_as_it_is_now(tmp_path: Path) -> None:
    from shapewatch.collector.envelope import LIMITS, parse_envelope
    from shapewatch.collector.ingest import _conflict_entries

    first = make_envelope(event_id="a")
    src = write_lines(tmp_path / "in.jsonl", [json.dumps(first), "changed", json.dumps(first)])
    stored = parse_envelope(json.dumps(first).encode(), LIMITS).payload_hash
    entries = [
        json.loads(x)
        for x in _conflict_entries(src, [(2, "h2"), (3, stored), (5, "h5")], LIMITS, datetime.now(UTC), "p")
    ]
    assert [(q["line"], q["raw"], [e["code"] for e in q["errors"]]) for q in entries] == [
        (2, "changed", ["conflict", "changed"]),
        (3, json.dumps(first), ["conflict"]),
        (5, "", ["conflict", "changed"]),
    ]


def test_rollups_merged_by_the_storing_thread_when_merging_falls_behind_count_each_event_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no room for pending rollups, the storing thread merges after every transaction,
    beside the merging thread: the same rollups as an import that leaves merging to it."""
    import threading

    from shapewatch.collector import Limits, Store, import_files
    from shapewatch.collector import ingest as ingest_module
    from shapewatch.collector.rollup import ROLLUP_TABLES

    merged_by: list[str] = []  # the thread of each merge that found counts waiting
    merge_pending = Store.merge_pending

    def recording(store: Store) -> None:
        if store.pending_rollup_events:
            merged_by.append(threading.current_thread().name)
        merge_pending(store)

    monkeypatch.setattr(Store, "merge_pending", recording)
    src = write_lines(
        tmp_path / "in.jsonl", [json.dumps(make_envelope(output={"i": i, "k": f"v{i % 3}"})) for i in range(40)]
    )
    sums = []
    for room in (10**6, 0):  # never, and after every transaction
        monkeypatch.setattr(ingest_module, "_PENDING_TRANSACTIONS", room)
        merged_by.clear()
        with Store.open(tmp_path / f"db{room}" / "x.duckdb") as store:
            assert import_files([src], store, Limits(), batch_size=3, tx_batches=2).accepted == 40
            sums.append(
                {
                    table: store.query(  # both files number their cohorts alike
                        f"SELECT {', '.join(keys)}, {', '.join(f'sum({c})' for c in cols)} FROM {table} GROUP BY ALL ORDER BY ALL"
                    )
                    for table, (keys, cols) in ROLLUP_TABLES.items()
                }
            )
            assert store.query("SELECT sum(events) FROM cohort_buckets") == [(40,)]
        # with room to spare, only the merging thread merges; without, the storing thread does too
        assert ("shapewatch-import" in merged_by) == (room == 0), merged_by
    assert sums[0] == sums[1]
    assert sums[0]["value_rollups"]  # the values were counted at all
