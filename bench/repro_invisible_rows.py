"""Reproduces rows that one session cannot see after it inserted them (found 2026-11-30, DuckDB 1.5.6).

Imports 10,000 generated envelopes with ``collector.import_files`` into a fresh store, then,
in the same session, copies every ``value_rollups`` row with ``INSERT ... SELECT`` from the
table itself. With DuckDB on 2 threads the session still counts the rows it had; after a
reopen the copies are there. On 1 thread the session sees them at once. It is what makes
``bench/analyze.py``'s "replication = import" check fail on 2 threads (its SQL side reads
the profiles in the session that copied the rows).

    .venv/bin/python bench/repro_invisible_rows.py [--threads 2]

Prints the counts and exits 1 when the session's count differs from the reopened file's.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gen import make_envelopes  # noqa: E402

from shapewatch.collector import Limits, Store, import_files  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2, help="DuckDB threads (default 2)")
    ap.add_argument("--n", type=int, default=10_000, help="envelopes imported (default 10,000)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        src, db = Path(tmp) / "in.jsonl", Path(tmp) / "r.duckdb"
        src.write_bytes(b"".join(orjson.dumps(e, option=orjson.OPT_APPEND_NEWLINE)
                                 for e in make_envelopes(args.n, seed=1001)))
        count = "SELECT count(*) FROM value_rollups"
        with Store.open(db, threads=args.threads) as store:
            import_files([src], store, Limits())
            before = store.query(count)[0][0]
            with store.transaction("copying value rollups") as con:
                con.execute("INSERT INTO value_rollups SELECT cohort_id, bucket, path, value, n FROM value_rollups")
            in_session = store.query(count)[0][0]
        with Store.open(db, threads=args.threads) as store:
            reopened = store.query(count)[0][0]
    print(f"threads={args.threads}: value_rollups rows {before:,} after the import; after copying them, "
          f"{in_session:,} seen by the session, {reopened:,} after a reopen (expected {2 * before:,})")
    return 0 if in_session == reopened == 2 * before else 1


if __name__ == "__main__":
    sys.exit(main())
