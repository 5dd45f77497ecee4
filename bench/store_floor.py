"""The storage floor: what DuckDB alone takes to store a file's events, with nothing else done.

The envelopes are loaded into Arrow by DuckDB's own JSON reader first (not timed),
then appended to an ``events`` table shaped like the store's, in transactions of
``--chunk`` rows, once with the idempotency key's index (as the store has it) and
once without. No validation, no rollups, no Python per event: whatever bulk
import does costs at least this, so it bounds how close to the parse floor an
import that keeps raw outputs and deduplicates them can get.

    .venv/bin/python bench/store_floor.py --file envelopes.jsonl [--chunk 40000 --chunk 250000]

Prints one line per (chunk, index) with the insert, commit and total seconds.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import pyarrow as pa

_TABLE = """CREATE TABLE events (
    id_key UHUGEINT {key}, event_id VARCHAR NOT NULL, payload_hash VARCHAR NOT NULL,
    generated_id BOOLEAN NOT NULL, cohort_id INTEGER NOT NULL, ts TIMESTAMPTZ NOT NULL,
    received_at TIMESTAMPTZ NOT NULL, served_model VARCHAR, contract_version VARCHAR, source VARCHAR,
    run_id VARCHAR, agent_release VARCHAR, finish_reason VARCHAR, attributes VARCHAR, output VARCHAR NOT NULL)"""

_LOAD = """SELECT event_id, md5(event_id) AS payload_hash, false AS generated_id, 1::INTEGER AS cohort_id,
       ts::TIMESTAMPTZ AS ts, served_model, contract_version, source, NULL::VARCHAR AS run_id,
       NULL::VARCHAR AS agent_release, NULL::VARCHAR AS finish_reason, NULL::VARCHAR AS attributes,
       output::VARCHAR AS output
FROM read_json(?, columns = {event_id: 'VARCHAR', ts: 'VARCHAR', served_model: 'VARCHAR',
                             contract_version: 'VARCHAR', source: 'VARCHAR', output: 'JSON'})"""

_INSERT = """INSERT INTO events SELECT md5_number(event_id), event_id, payload_hash, generated_id, cohort_id, ts,
       now(), served_model, contract_version, source, run_id, agent_release, finish_reason, attributes, output
FROM _batch"""


def store_once(table: pa.Table, workdir: Path, chunk: int, keyed: bool) -> tuple[float, float, float]:
    """(insert, commit, total) seconds to append every row of ``table`` in transactions of ``chunk`` rows."""
    path = workdir / f"floor-{chunk}-{'key' if keyed else 'nokey'}.duckdb"
    con = duckdb.connect(str(path), config={"checkpoint_threshold": "256MB", "threads": "2"})
    con.execute(_TABLE.format(key="PRIMARY KEY" if keyed else ""))
    rows = table.num_rows
    inserting = committing = 0.0
    start = time.perf_counter()
    for lo in range(0, rows, chunk):
        con.register("_batch", table.slice(lo, chunk))
        t0 = time.perf_counter()
        con.execute("BEGIN TRANSACTION")
        con.execute(_INSERT)  # the store's plain INSERT: with the key, the index refuses a repeat
        t1 = time.perf_counter()
        con.execute("COMMIT")
        t2 = time.perf_counter()
        con.unregister("_batch")
        inserting += t1 - t0
        committing += t2 - t1
    total = time.perf_counter() - start
    con.close()
    for p in workdir.glob(path.name + "*"):
        p.unlink()
    return inserting, committing, total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--file", type=Path, required=True, help="JSONL envelopes (bench/gen.py writes them)")
    ap.add_argument("--chunk", type=int, action="append", help="rows per transaction (repeatable; default 40000)")
    args = ap.parse_args(argv)
    chunks = args.chunk or [40_000]
    src = duckdb.connect()
    t0 = time.perf_counter()
    table = src.sql(_LOAD, params=[str(args.file)]).to_arrow_table()
    print(f"loaded {table.num_rows:,} events into Arrow in {time.perf_counter() - t0:.2f} s (not counted)")
    with tempfile.TemporaryDirectory(prefix="shapewatch-floor-") as tmp:
        for chunk in chunks:
            for keyed in (True, False):
                ins, com, total = store_once(table, Path(tmp), chunk, keyed)
                print(f"chunk {chunk:>7,}  {'with' if keyed else 'without':>7} key index: insert {ins:6.2f} s  "
                      f"commit {com:6.2f} s  total {total:6.2f} s  ({table.num_rows / total:,.0f} events/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
