"""DuckDB 1.5.6, plain SQL: rows a table's scans stop seeing after an empty INSERT ... SELECT.

In one transaction, an ``INSERT ... SELECT`` of at least one row group (122,880 rows) into a
table, then one into the same table that inserts no row; after ``COMMIT``, rows appended to the
table are invisible to every scan until ``CHECKPOINT`` or a reopen (they are in the file). With
``--empty-first`` the empty insert comes first and the committed rows themselves are invisible,
in an in-memory database too. It needs more than one thread and ``preserve_insertion_order``
(the default), so the inserts run as BATCH_INSERT; 1.5.5 shows it too, 2.0.1 does not.

This is the cause of what ``repro_invisible_rows.py`` shows through the store: a rollup merge
inserts the easy value rows (over a row group for about 10,000 events), then the admitted ones,
which can be none. Why shapewatch runs DuckDB on one thread (``duckdb_threads``, bench/README.md).

    .venv/bin/python bench/repro_duckdb_empty_insert.py [THREADS=2] [--memory] [--empty-first]

Exit code 1 when the rows are missing (the bug shows), 0 when every count is right.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import duckdb

ROWS = 122_880  # one full row group


def main(argv: list[str]) -> int:
    threads = int(next((a for a in argv if a.isdigit()), 2))
    memory, empty_first = "--memory" in argv, "--empty-first" in argv
    db = ":memory:" if memory else str(Path(tempfile.mkdtemp(prefix="duckdb-repro-")) / "repro.duckdb")
    con = duckdb.connect(db)
    con.execute(f"SET threads = {threads}")
    con.execute(f"CREATE TABLE src AS SELECT range AS a FROM range({ROWS})")
    con.execute("CREATE TABLE t (a BIGINT)")
    big = "INSERT INTO t SELECT a FROM src"
    empty = "INSERT INTO t SELECT a FROM src WHERE a % 7 = 100"  # runs, and inserts no row
    con.execute("BEGIN")
    for sql in ([empty, big] if empty_first else [big, empty]):
        con.execute(sql)
    con.execute("COMMIT")
    count = "SELECT count(*) FROM t"
    before = con.execute(count).fetchone()[0]  # type: ignore[index]
    con.execute("INSERT INTO t VALUES (1), (2), (3)")
    after = con.execute(count).fetchone()[0]  # type: ignore[index]
    line = (f"duckdb {duckdb.__version__}, threads={threads}, {'in-memory' if memory else 'file'}"
            f"{', empty insert first' if empty_first else ''}: after the transaction {before:,} rows "
            f"(expected {ROWS:,}), after inserting 3 more {after:,} (expected {ROWS + 3:,})")
    if not memory:
        con.close()
        line += f", after a reopen {duckdb.connect(db).execute(count).fetchone()[0]:,}"  # type: ignore[index]
    print(line)
    return 0 if (before, after) == (ROWS, ROWS + 3) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
