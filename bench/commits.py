"""Commit cost against the size of the events table: does writing a batch slow down as the store grows?

A store's ``events`` table, and ``event_keys`` with their keys (every event within
the dedup TTL), are filled with synthetic events by SQL (not timed) to each size in turn; at each size, ``--rounds`` fresh batches of ``--batch``
generated envelopes are written with ``Store.write_batch`` (rollups deferred, as
the service writes) and the median time per batch is printed.

For reference, the same batch is also inserted with the statement the store used
before, ``INSERT ... ON CONFLICT DO NOTHING RETURNING``, in a transaction that is
rolled back: DuckDB plans it as a join against a scan of the whole key column,
so its time grows with the table.

Also at each size, a checkpoint (``Store.checkpoint``) after those batches: the
store's file is checkpointed after the table is filled (not timed), so it writes
the batches' rows and whatever DuckDB rewrites as a whole. A commit that takes the
write-ahead log past ``checkpoint_threshold`` runs one, and the requests of that
commit wait for it. In DuckDB 1.5 it writes the whole key index (``event_keys``;
duckdb/duckdb#24848), so it grows with the keys kept; it is printed, not checked.

The floor is the median write at the first size. The check: the median at the
largest size is within ``--max-ratio`` (default 2) of it. Exit code 0 when it
holds, 1 when not, 2 on a usage error.

    .venv/bin/python bench/commits.py                       # sizes 0, 200k, 1M, 4M; batches of 500
    .venv/bin/python bench/commits.py --sizes 0,1000000 --batch 2000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gen import make_envelopes  # noqa: E402

from shapewatch.collector.envelope import LIMITS, parse_envelope  # noqa: E402
from shapewatch.collector.store import Store  # noqa: E402

_FILL = """INSERT INTO events
SELECT md5_number('fill-' || i), 'fill-' || i, md5('fill-' || i), false, $cohort,
       TIMESTAMPTZ '2026-11-28 00:00:00+00' + to_milliseconds(i), now(), NULL, NULL, 'production', NULL, NULL,
       'stop', NULL, '{"intent":"refund","confidence":0.5,"tags":["a","b"]}'
FROM range($lo, $hi) r(i)"""
_FILL_KEYS = """INSERT INTO event_keys SELECT md5_number('fill-' || i), md5('fill-' || i), now() FROM range($lo, $hi) r(i)"""

# The old statement: the keys of a batch inserted with ON CONFLICT (on event_keys, which holds
# the key index since schema version 7).
_OLD = """INSERT INTO event_keys SELECT md5_number(event_id), payload_hash, now()
FROM _old ON CONFLICT DO NOTHING RETURNING id_key"""


class _RollBack(Exception):
    """Ends the transaction that timed the old statement, rolling it back."""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="0,200000,1000000,4000000",
                    help="events stored before each measurement, comma-separated, increasing")
    ap.add_argument("--batch", type=int, default=500, help="envelopes per batch (default 500, one HTTP request)")
    ap.add_argument("--rounds", type=int, default=15, help="batches written at each size (default 15)")
    ap.add_argument("--max-ratio", type=float, default=2.0, help="largest size's median over the floor (default 2)")
    args = ap.parse_args(argv)
    try:
        sizes = [int(x) for x in args.sizes.split(",")]
    except ValueError:
        ap.error(f"--sizes: {args.sizes!r} is not a comma-separated list of integers")
    if sizes != sorted(sizes) or sizes[0] < 0 or args.batch < 1 or args.rounds < 1:
        ap.error("--sizes must increase from 0 or more; --batch and --rounds must be positive")

    now = datetime.now(UTC)
    generated = iter(make_envelopes(args.batch * args.rounds * len(sizes) + 1, seed=7))
    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(Path(tmp) / "commits.duckdb")
        store.defer_rollups(max_events=10**12, max_seconds=float("inf"))  # merges are not measured
        first = parse_envelope(orjson.dumps(next(generated)), LIMITS, now=now)
        store.write_batch([first])
        cohort = store.query("SELECT cohort_id FROM cohorts")[0][0]
        stored = 0
        rows: list[tuple[int, float, float, float]] = []
        print(f"{'events stored':>14}  {'write_batch, median':>20}  {'ON CONFLICT (old), median':>26}"
              f"  {'checkpoint after them':>22}")
        for size in sizes:
            if size > stored:
                with store.transaction("filling the table") as con:
                    con.execute(_FILL, {"cohort": cohort, "lo": stored, "hi": size})
                    con.execute(_FILL_KEYS, {"lo": stored, "hi": size})
                stored = size
            store.checkpoint()  # the fill is in the file: the timed checkpoint writes only what follows
            writes: list[float] = []
            old: list[float] = []
            for _ in range(args.rounds):
                batch = [parse_envelope(orjson.dumps(next(generated)), LIMITS, now=now) for _ in range(args.batch)]
                prepared = store.prepare_batch(batch)
                try:
                    with store.transaction("timing the old statement") as con:
                        con.register("_old", prepared.table)
                        t0 = time.perf_counter()
                        con.execute(_OLD).fetchall()
                        old.append(time.perf_counter() - t0)
                        con.unregister("_old")
                        raise _RollBack
                except _RollBack:
                    pass
                t0 = time.perf_counter()
                store.write_batch(prepared, merge=False)
                writes.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            store.checkpoint()
            checkpoint = time.perf_counter() - t0
            rows.append((size, statistics.median(writes), statistics.median(old), checkpoint))
            print(f"{size:>14,}  {rows[-1][1] * 1000:>17.1f} ms  {rows[-1][2] * 1000:>23.1f} ms"
                  f"  {checkpoint * 1000:>19.0f} ms", flush=True)
        store.close()
    floor, last = rows[0][1], rows[-1][1]
    ratio = last / floor
    ok = ratio <= args.max_ratio
    print(f"\nfloor (write at {rows[0][0]:,} stored): {floor * 1000:.1f} ms; at {rows[-1][0]:,}: "
          f"{last * 1000:.1f} ms = {ratio:.2f}x the floor (target <= {args.max_ratio}x): {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
