"""Rollup tiers in the store: where each cohort's tiers begin, and the fold that moves aged
minute buckets into hours and hours into days (``collector/tiers.py`` has the policy).

A fold is a few transactions, each moving every cohort's tier boundaries at most ``FOLD_STEP``
and writing the marks (``tier_marks``: per cohort, the boundaries its rollups were last folded
to, and its newest data) with the rows, so a crash during a fold leaves the steps that
committed, each whole: sums never change, only rows.

What a fold reads is bounded by the marks: rows between the last fold's boundary and the new
one, for each of the two tiers. Rows older than the last boundary were either folded then or
counted into their coarse bucket when they arrived (the boundary only ever moves forward).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import duckdb
import pyarrow as pa

from ..rollup import ROLLUP_TABLES, summed
from ..tiers import DAY, HOUR, Horizons, TierPolicy
from .maintenance import Maintenance

__all__ = ["FOLD_STEP", "TieredRollups", "fold_cohorts"]

#: How far one fold transaction moves a cohort's tier boundaries (fold_tiers).
FOLD_STEP = timedelta(days=2)

# served_models is keyed like the rollups and folded with them (its primary key holds one row per key).
_FOLDED = {**ROLLUP_TABLES, "served_models": (["cohort_id", "bucket", "served_model"], ["n"])}


def _coarse(col: str = "bucket") -> str:
    """The bucket a folded row moves to: a day before the cohort's hour_from, else an hour."""
    return (
        f"CASE WHEN {col} < h.hour_from THEN to_timestamp(epoch({col})::BIGINT // {DAY} * {DAY}) "
        f"ELSE to_timestamp(epoch({col})::BIGINT // {HOUR} * {HOUR}) END"
    )


_IN_RANGE = "((t.bucket >= h.lo_m AND t.bucket < h.minute_from) OR (t.bucket >= h.lo_h AND t.bucket < h.hour_from))"
# Rows a fold moves: in range, and in a coarse bucket (_mv) that holds a finer row in some table. A
# coarse bucket whose rows all start at its start (counted coarse when they arrived: an import's
# history, a late arrival) folds into itself, so it is left alone: the first fold after an import
# of four weeks read, summed, deleted and wrote back every row of its history (2.6 s of a 17 s import).
_MOVED = _IN_RANGE + f" AND m.cohort_id = t.cohort_id AND m.cb = {_coarse('t.bucket')}"


def fold_cohorts(
    con: duckdb.DuckDBPyConnection,
    newest: dict[int, int],
    policy: TierPolicy,
    cap: int,
    free_text: int,
    step: int | None = None,
) -> tuple[int, bool]:
    """Fold cohorts' rollups toward the tiers of their newest data (cohort id -> epoch seconds);
    returns the rows removed and whether every cohort reached its tiers.

    With ``step`` (seconds), each boundary moves at most that far past the cohort's last fold
    (the first fold of a cohort starts at its oldest bucket), so a long history is folded in
    several short transactions rather than one long one (the caller loops).

    The caller holds the transaction. ``cap``: the most values kept per (cohort, bucket, path);
    values beyond it after folding go to the field's overflow count, as at merge; so do all the
    values of a folded (cohort, bucket, path) holding free text (more than ``free_text`` distinct
    values, repeated fewer than ten times each on average; 0: never), as a merge does for coarse
    buckets.
    """
    if not newest:
        return 0, True
    marks = {
        int(i): (int(m), int(h))
        for i, m, h in con.execute(
            "SELECT cohort_id, epoch(minute_from)::BIGINT, epoch(hour_from)::BIGINT FROM tier_marks"
        ).fetchall()
    }
    lows = {c: marks.get(c, (0, 0)) for c in newest}
    nxt: dict[int, tuple[int | None, int | None]] = {}
    if step is not None:
        # Where each cohort's next rows to fold lie, so that a step skips time that holds none: one
        # output dated 1971 must not turn a fold into thousands of empty steps. A bucket already as
        # coarse as its tier (counted so when it arrived: an import's history) folds into itself,
        # so it does not count: the first fold after importing four weeks is then one step.
        con.register(
            "_lo",
            pa.table(
                {
                    "cohort_id": pa.array(list(lows), pa.int64()),
                    "lo_m": pa.array([lo[0] for lo in lows.values()], pa.int64()),
                    "lo_h": pa.array([lo[1] for lo in lows.values()], pa.int64()),
                }
            ),
        )
        try:
            nxt = {
                int(c): (None if m is None else int(m), None if h is None else int(h))
                for c, m, h in con.execute(
                    """SELECT l.cohort_id,
                              epoch(min(b.bucket) FILTER (WHERE b.bucket >= to_timestamp(l.lo_m)
                                                           AND epoch(b.bucket)::BIGINT % $hour <> 0))::BIGINT,
                              epoch(min(b.bucket) FILTER (WHERE b.bucket >= to_timestamp(l.lo_h)
                                                           AND epoch(b.bucket)::BIGINT % $day <> 0))::BIGINT
                       FROM _lo l JOIN cohort_buckets b ON b.cohort_id = l.cohort_id GROUP BY 1""",
                    {"hour": HOUR, "day": DAY},
                ).fetchall()
            }
        finally:
            con.unregister("_lo")
    rows = []
    done = True
    for cohort_id, n in newest.items():
        minute_from, hour_from = policy.bounds(n)
        lo_m, lo_h = lows[cohort_id]
        # boundaries only move forward, and with a step, by at most the step past the next rows
        target_m, target_h = max(minute_from, lo_m), max(hour_from, lo_h)
        minute_from, hour_from = target_m, target_h
        if step is not None:
            next_m, next_h = nxt.get(cohort_id, (None, None))
            if next_m is not None:
                minute_from = min(target_m, max(lo_m, next_m // DAY * DAY) + step)
            if next_h is not None:
                hour_from = min(target_h, max(lo_h, next_h // DAY * DAY) + step)
            done = done and (minute_from, hour_from) == (target_m, target_h)
        rows.append((cohort_id, n, lo_m, minute_from, lo_h, hour_from))
    con.register(
        "_marks",
        pa.table({k: pa.array(col, pa.int64()) for k, col in zip(_MARK_COLUMNS, zip(*rows, strict=True), strict=True)}),
    )
    try:
        con.execute(
            """CREATE OR REPLACE TEMP TABLE _h AS
               SELECT cohort_id::INTEGER AS cohort_id, to_timestamp(newest) AS newest, to_timestamp(lo_m) AS lo_m,
                      to_timestamp(minute_from) AS minute_from, to_timestamp(lo_h) AS lo_h,
                      to_timestamp(hour_from) AS hour_from
               FROM _marks"""
        )
    finally:
        con.unregister("_marks")
    con.execute("DELETE FROM tier_marks WHERE cohort_id IN (SELECT cohort_id FROM _h)")
    con.execute("INSERT INTO tier_marks SELECT cohort_id, newest, minute_from, hour_from FROM _h")
    # only the cohorts whose boundaries moved have anything to fold
    con.execute("DELETE FROM _h WHERE minute_from = lo_m AND hour_from = lo_h")
    removed = 0
    if con.execute("SELECT count(*) FROM _h").fetchone() != (0,):
        con.execute(
            "CREATE OR REPLACE TEMP TABLE _mv AS "
            + " UNION ".join(
                f"SELECT t.cohort_id, {_coarse('t.bucket')} AS cb FROM {table} t JOIN _h h USING (cohort_id) "
                f"WHERE {_IN_RANGE} AND t.bucket <> {_coarse('t.bucket')}"
                for table in _FOLDED
            )
        )
        if con.execute("SELECT count(*) FROM _mv").fetchone() != (0,):
            removed += _fold_values(con, cap, free_text)
            for table, (keys, sums) in _FOLDED.items():
                if table != "value_rollups":
                    removed += _fold_table(con, table, keys, sums)
    for t in ("_h", "_mv", "_fv", "_excess"):
        con.execute(f"DROP TABLE IF EXISTS {t}")
    return removed, done


_MARK_COLUMNS = ("cohort_id", "newest", "lo_m", "minute_from", "lo_h", "hour_from")


def _fold_table(con: duckdb.DuckDBPyConnection, table: str, keys: list[str], sums: list[str]) -> int:
    others = [k for k in keys if k not in ("cohort_id", "bucket")]
    sel = "".join(f"t.{k}, " for k in others)
    agg = ", ".join(f"{summed(c, 't.')}::BIGINT AS {c}" for c in sums)
    if table == "field_rollups":  # values beyond the cap after folding overflow (_fold_values)
        agg = agg.replace(
            "sum(t.values_overflow)::BIGINT AS values_overflow",
            "(sum(t.values_overflow) + coalesce(any_value(x.n), 0))::BIGINT AS values_overflow",
        )
        join = (
            " LEFT JOIN _excess x ON x.cohort_id = t.cohort_id AND x.bucket = "
            + _coarse("t.bucket")
            + " AND x.path = t.path"
        )
    else:
        join = ""
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE _fold AS
            SELECT t.cohort_id, {_coarse("t.bucket")} AS bucket, {sel}{agg}
            FROM {table} t JOIN _h h USING (cohort_id) JOIN _mv m ON {_MOVED}{join} GROUP BY ALL"""
    )
    deleted = _changed(
        con.execute(f"DELETE FROM {table} t USING _h h, _mv m WHERE t.cohort_id = h.cohort_id AND {_MOVED}")
    )
    inserted = _changed(con.execute(f"INSERT INTO {table} ({', '.join(keys)}, {', '.join(sums)}) SELECT * FROM _fold"))
    con.execute("DROP TABLE _fold")
    return deleted - inserted


def _fold_values(con: duckdb.DuckDBPyConnection, cap: int, free_text: int) -> int:
    """Fold value rows; a folded (cohort, bucket, path) keeps its ``cap`` most frequent values (then
    by value), none if it holds free text, and the rest is left in ``_excess`` for the field rows'
    overflow."""
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE _fv AS
            WITH f AS (SELECT t.cohort_id, {_coarse("t.bucket")} AS bucket, t.path, t.value, sum(t.n)::BIGINT AS n
                       FROM value_rollups t JOIN _h h USING (cohort_id) JOIN _mv m ON {_MOVED} GROUP BY ALL)
            SELECT *, row_number() OVER (PARTITION BY cohort_id, bucket, path ORDER BY n DESC, value) <= $cap
                      AND NOT ($free > 0 AND count(*) OVER w > $free AND sum(n) OVER w < 10 * count(*) OVER w) AS kept
            FROM f WINDOW w AS (PARTITION BY cohort_id, bucket, path)""",
        {"cap": cap, "free": free_text},
    )
    con.execute(
        "CREATE OR REPLACE TEMP TABLE _excess AS SELECT cohort_id, bucket, path, sum(n) AS n FROM _fv "
        "WHERE NOT kept GROUP BY ALL"
    )
    deleted = _changed(
        con.execute(f"DELETE FROM value_rollups t USING _h h, _mv m WHERE t.cohort_id = h.cohort_id AND {_MOVED}")
    )
    inserted = _changed(
        con.execute("INSERT INTO value_rollups SELECT cohort_id, bucket, path, value, n FROM _fv WHERE kept")
    )
    return deleted - inserted


def _changed(cur: duckdb.DuckDBPyConnection) -> int:
    row = cur.fetchone()
    return int(row[0]) if row else 0


class TieredRollups(Maintenance):
    """The tiers of a store: each cohort's newest data at open, and the fold."""

    horizons: Horizons | None

    def _load_horizons(self) -> None:
        """Each cohort's newest data, from its newest bucket and its last fold's mark."""
        if self.horizons is None:
            return
        rows = self._con.execute(
            """SELECT c.model, c.prompt_version, c.contract, c.source,
                      greatest(max(epoch(b.bucket))::BIGINT, max(epoch(m.newest))::BIGINT)
               FROM cohorts c LEFT JOIN cohort_buckets b USING (cohort_id) LEFT JOIN tier_marks m USING (cohort_id)
               GROUP BY ALL HAVING greatest(max(b.bucket), max(m.newest)) IS NOT NULL"""
        ).fetchall()
        self.horizons.raise_to({(str(m), str(p), str(c), str(s)): int(n) for m, p, c, s, n in rows})

    def fold_tiers(self, *, step: timedelta = FOLD_STEP, max_steps: int | None = None) -> int:
        """Move every cohort's aged buckets into their tier; returns the rows removed.

        Each transaction moves the boundaries at most ``step`` further (every cohort at once),
        letting writes in between: the first fold of a store with weeks of minute buckets (an
        upgrade, an import of a .gz file) would otherwise hold the write lock for all of it.
        ``max_steps`` stops after that many transactions (the next fold goes on from there).
        Does nothing when the store keeps minute buckets only (opened without a tier policy).
        """
        if self.horizons is None:
            return 0
        self.flush_rollups()  # counts still in memory were tiered when counted: merge them first
        newest = self.horizons.snapshot()
        ids = {
            (m, p, c, s): i
            for i, m, p, c, s in self.query("SELECT cohort_id, model, prompt_version, contract, source FROM cohorts")
        }
        by_id = {ids[c]: n for c, n in newest.items() if c in ids}
        removed, steps, done = 0, 0, False
        while not done and (max_steps is None or steps < max_steps):
            with self._write_lock, self._merge_lock, self._transaction("folding rollups into their tiers") as con:
                n, done = fold_cohorts(
                    con,
                    by_id,
                    self.horizons.policy,
                    self.rollup.enum_values_per_path,
                    self.rollup.free_text_min_distinct,
                    int(step.total_seconds()),
                )
            removed += n
            steps += 1
        return removed

    def covered_window(self, cohort_id: int, since: datetime, until: datetime) -> tuple[datetime, datetime]:
        """The window a read of ``[since, until)`` covers for one cohort: an edge that falls in the
        cohort's hour or day tier (as last folded) moves up to the start of the next hour or day,
        since a bucket counts in a window when its start does; an edge in the minute tier stays."""
        bounds = self.tier_bounds().get(cohort_id)
        if bounds is None:
            return since, until

        def edge(t: datetime) -> datetime:
            minute_from, hour_from = bounds
            if t >= minute_from:
                return t
            width = HOUR if t >= hour_from else DAY
            return datetime.fromtimestamp(-(-t.timestamp() // width) * width, UTC)

        return edge(since), edge(until)

    def tier_bounds(self) -> dict[int, tuple[datetime, datetime]]:
        """Cohort id -> (minute_from, hour_from) as last folded: buckets before the first are hours,
        before the second days."""
        return {
            int(i): (m.astimezone(UTC), h.astimezone(UTC))
            for i, m, h in self.query("SELECT cohort_id, minute_from, hour_from FROM tier_marks")
        }
