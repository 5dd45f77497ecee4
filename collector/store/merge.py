"""Rollup merge and compaction: the SQL that adds a batch's counts into the rollup tables
(``rollup.RollupBatch`` counts them in memory) and folds their rows into one per key.

Rollups are append-only: each merge adds its own rows and readers sum them, so a merge
never rewrites what an earlier one stored (``compact_rollups`` does that, range by range).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute

from ..privacy import RedactPatterns
from ..rollup import _FIELD_COLS, ROLLUP_TABLES, RollupBatch, RollupConfig, summed

__all__ = ["compact_rollups", "merge_rollups"]

_NO_BUCKET = datetime(1970, 1, 1, tzinfo=UTC)  # before any bucket a store holds


def _combined(batches: list[RollupBatch]) -> tuple[pa.Table, ...]:
    """The tables of several batches as one, group and slot ids made unique by offsets."""
    parts: list[list[pa.Table]] = [[], [], [], [], [], [], [], []]
    g_off = s_off = 0
    for batch in batches:
        g, f, v, a, served = batch.tables()
        nums = batch.number_table()
        checks, violations = batch.contract_tables()
        parts[6].append(checks.set_column(0, "g", pa.compute.add(checks["g"], g_off)))
        parts[7].append(violations.set_column(0, "g", pa.compute.add(violations["g"], g_off)))
        parts[0].append(g.set_column(0, "g", pa.compute.add(g["g"], g_off)))
        f = f.set_column(f.schema.get_field_index("g"), "g", pa.compute.add(f["g"], g_off))
        parts[1].append(f.set_column(0, "slot", pa.compute.add(f["slot"], s_off)))
        parts[2].append(v.set_column(0, "slot", pa.compute.add(v["slot"], s_off)))
        parts[3].append(a.set_column(0, "slot", pa.compute.add(a["slot"], s_off)))
        parts[4].append(served.set_column(0, "g", pa.compute.add(served["g"], g_off)))
        parts[5].append(nums.set_column(0, "slot", pa.compute.add(nums["slot"], s_off)))
        g_off += g.num_rows
        s_off += f.num_rows
    return tuple(pa.concat_tables(p) for p in parts)


def _drop_free_text(g: pa.Table, f: pa.Table, v: pa.Table, cfg: RollupConfig) -> tuple[pa.Table, pa.Table]:
    """Leave out the values of the paths that hold free text in the coarse buckets (hours and days,
    tiers.py) of this merge; count them as overflow.

    A path holds free text for a cohort when, over the coarse buckets this merge adds for that
    cohort, it has more than ``cfg.free_text_min_distinct`` distinct short strings that repeat
    fewer than ten times each on average (ids, names, addresses, sentences): in an hour or a day
    they would otherwise add a row per value, for values no enum rule can use (the analyzer calls
    more than 50 distinct values free text). Their outputs still count in ``field_rollups``
    (present, strings), and the values in ``values_overflow``, as values beyond the per-bucket cap
    do. Minute buckets keep every value the cap admits. The choice is made anew by every merge
    (and every fold: store/tiers.py), so a field that turns from an enum into free text and back
    keeps its values again once it is an enum. Returns ``f`` with a ``dropped`` column (values
    left out per slot) and the values kept.
    """
    zeros = pa.array(np.zeros(f.num_rows, dtype=np.int64))
    coarse_groups = g["coarse"].combine_chunks()
    if (
        cfg.free_text_min_distinct <= 0
        or v.num_rows <= cfg.free_text_min_distinct
        or not pa.compute.any(coarse_groups).as_py()
    ):
        return f.append_column("dropped", zeros), v
    # Groups are numbered by row (_combined): a value's group is f.g[slot], its cohort that group's names.
    group_of = f["g"].take(v["slot"])
    coarse = coarse_groups.take(group_of)
    names = pa.compute.binary_join_element_wise(g["model"], g["prompt_version"], g["contract"], g["source"], "\x1f")
    cohort = pa.compute.dictionary_encode(names.combine_chunks()).indices.cast(pa.int64())
    path = pa.compute.dictionary_encode(f["path"].take(v["slot"]).combine_chunks())
    width = max(len(path.dictionary), 1)
    key = pa.compute.add(pa.compute.multiply(cohort.take(group_of), width), path.indices.cast(pa.int64()))
    kv = pa.table({"key": key, "value": v["value"], "n": v["n"]}).filter(coarse)
    per = kv.group_by("key").aggregate([("value", "count_distinct"), ("n", "sum")])
    distinct = per["value_count_distinct"]
    free = per.filter(
        pa.compute.and_(
            pa.compute.greater(distinct, cfg.free_text_min_distinct),
            pa.compute.less(per["n_sum"], pa.compute.multiply(distinct, 10)),
        )
    )["key"]
    if not len(free):
        return f.append_column("dropped", zeros), v
    out = pa.compute.and_(coarse, pa.compute.is_in(key, value_set=free))
    gone = v.filter(out)
    dropped = np.bincount(
        gone["slot"].to_numpy(), weights=gone["n"].to_numpy().astype(np.float64), minlength=f.num_rows
    ).astype(np.int64)
    return f.append_column("dropped", pa.array(dropped)), v.filter(pa.compute.invert(out))


def _drop_redacted(f: pa.Table, v: pa.Table, nums: pa.Table, cfg: RollupConfig) -> tuple[pa.Table, ...]:
    """Leave out every value and number bin of the paths ``cfg.redact_paths`` names, before any
    is written; their values count as overflow in ``dropped`` (``f`` carries it already, from
    ``_drop_free_text``), so the path's presence and type counts stay whole.

    The accelerator (C or its Python twin) counts values without knowing the setting: the drop
    happens here, the one place every batch's counts pass through on their way to the tables.
    """
    patterns = RedactPatterns(cfg.redact_paths)
    if not patterns or not f.num_rows:
        return f, v, nums
    paths = pa.compute.unique(f["path"]).to_pylist()
    hidden = [p for p in paths if patterns.matches(p)]
    if not hidden:
        return f, v, nums
    redacted_slot = pa.compute.is_in(f["path"], value_set=pa.array(hidden, pa.string()))
    slots = pa.array(np.flatnonzero(redacted_slot.to_numpy(zero_copy_only=False)), pa.int64())
    out = pa.compute.is_in(v["slot"], value_set=slots)
    gone = v.filter(out)
    extra = np.bincount(
        gone["slot"].to_numpy(), weights=gone["n"].to_numpy().astype(np.float64), minlength=f.num_rows
    ).astype(np.int64)
    col = f.schema.get_field_index("dropped")
    f = f.set_column(col, "dropped", pa.compute.add(f["dropped"], pa.array(extra)))
    keep_nums = pa.compute.invert(pa.compute.is_in(nums["slot"], value_set=slots))
    return f, v.filter(pa.compute.invert(out)), nums.filter(keep_nums)


def merge_rollups(
    con: duckdb.DuckDBPyConnection, batches: list[RollupBatch], cfg: RollupConfig, *, keyed: bool = True
) -> None:
    """Add the counts of several batches into the rollup tables in one set of statements.

    The caller holds the transaction; the cohorts must exist. Rows of different
    batches for the same key are summed first, so merging many small batches at
    once costs about what merging one does.

    ``keyed=False``: tables without keys or sequences (a DuckLake, lake.py): the served cohorts
    must exist too (the lake's writer registers them first), and served-model counts are
    appended rather than added into their row (every read sums them).
    """
    batches = [b for b in batches if b._groups]
    if not batches:
        return
    g, f, v, a, served, nums, checks, violations = _combined(batches)
    f, v = _drop_free_text(g, f, v, cfg)
    f, v, nums = _drop_redacted(f, v, nums, cfg)
    con.register("_rg", g)
    con.register("_rf", f)
    con.register("_ra", a)
    con.register("_rs", served)
    con.register("_rc", checks)
    con.register("_rx", violations)
    try:
        _merge(con, cfg, f, v, nums, keyed=keyed, distinct_paths=_distinct_paths(batches))
    finally:
        for name in ("_rg", "_rf", "_rv", "_ra", "_rs", "_rn", "_rc", "_rx", "_slots"):
            con.unregister(name)


def _distinct_paths(batches: list[RollupBatch]) -> bool:
    """Whether no batch names two of its path ids with the same path. An id names one path in its
    batch, so a slot's row is then alone in its group without looking; two ids naming the same
    path would take a key that escaping failed to keep apart."""
    return all(len({path for path, _ in b._paths}) == len(b._paths) for b in batches)


def _merge(
    con: duckdb.DuckDBPyConnection,
    cfg: RollupConfig,
    f: pa.Table,
    v: pa.Table,
    nums: pa.Table,
    *,
    keyed: bool,
    distinct_paths: bool,
) -> None:
    # A group counts in its cohort and, when an alias was answered by another model, in the
    # served cohort (that model, same prompt version and contract) too, created here when it
    # is new: every path that merges counts (ingest, deferred merges, recovery at open) meets it.
    if keyed:
        con.execute(
            """INSERT INTO cohorts
               SELECT nextval('cohort_seq'), * FROM (
                   SELECT served, prompt_version, contract, to_timestamp(min(epoch)), source FROM _rg
                   WHERE served IS NOT NULL AND NOT EXISTS (
                       SELECT 1 FROM cohorts c WHERE c.model = _rg.served AND c.prompt_version = _rg.prompt_version
                                                 AND c.contract = _rg.contract AND c.source = _rg.source)
                   GROUP BY served, prompt_version, contract, source ORDER BY ALL)"""
        )
    # shared: several groups of this merge hold the (cohort, bucket); only their rows can
    # repeat a key, so only they need summing (_merge_numbers relies on it). served: the row
    # adds a group to its served cohort (a group has at most one such row).
    con.execute(
        """CREATE OR REPLACE TEMP TABLE _groups AS
           WITH m AS (SELECT g, model, prompt_version, contract, source, epoch, events, false AS served FROM _rg
                      UNION ALL
                      SELECT g, served, prompt_version, contract, source, epoch, events, true FROM _rg
                      WHERE served IS NOT NULL)
           SELECT g, c.cohort_id, to_timestamp(epoch) AS bucket, events, served,
                  count(*) OVER (PARTITION BY c.cohort_id, epoch) > 1 AS shared
           FROM m JOIN cohorts c USING (model, prompt_version, contract, source)"""
    )
    con.execute(
        """CREATE OR REPLACE TEMP TABLE _buckets AS
           SELECT cohort_id, bucket, sum(events) AS events,
                  EXISTS (SELECT 1 FROM cohort_buckets cb
                          WHERE cb.cohort_id = g.cohort_id AND cb.bucket = g.bucket) AS existed
           FROM _groups g GROUP BY cohort_id, bucket"""
    )
    con.execute("INSERT INTO cohort_buckets SELECT cohort_id, bucket, events FROM _buckets")
    # Short strings: keep at most `cap` distinct values per (cohort, bucket, path).
    # Values already kept always add up; new ones are admitted by frequency while
    # room is left; the rest go to the overflow count. Only buckets that earlier
    # merges touched can hold kept values, so only those are looked up.
    # Most slots (a group's path) need none of that: when no earlier merge and no other
    # group of this one holds their (cohort, bucket), and they hold at most `cap` values,
    # every value is kept as it is, and their field row is the only one of its key ("easy").
    # Those rows are placed in Arrow and appended as they are (_register_hard_slots); SQL
    # ranks and sums only the rest.
    _register_hard_slots(con, f, v, cfg.enum_values_per_path, distinct_paths)
    # The buckets earlier merges stored, as constants: DuckDB then skips the row groups of
    # value_rollups outside them (with the bounds as subqueries it scanned the whole table at
    # every merge). None stored: bounds no row has; the IN below keeps the result exact either way.
    lo, hi = con.execute(
        "SELECT coalesce(min(bucket), $none), coalesce(max(bucket), $none) FROM _buckets WHERE existed",
        {"none": _NO_BUCKET},
    ).fetchone()  # type: ignore[misc]  # an aggregate: always one row
    con.execute(
        """CREATE OR REPLACE TEMP TABLE _vr AS
           WITH b AS (SELECT cohort_id, bucket, path, value, sum(v.n) AS n
                      FROM _rv v JOIN _slots s USING (slot) GROUP BY ALL),
           seen AS (SELECT cohort_id, bucket FROM _buckets WHERE existed),
           old AS (SELECT DISTINCT cohort_id, bucket, path, value FROM value_rollups
                   WHERE bucket BETWEEN $lo AND $hi
                     AND (cohort_id, bucket) IN (SELECT cohort_id, bucket FROM seen)),
           known AS (SELECT b.*, old.value IS NOT NULL AS kept FROM b LEFT JOIN old
                     USING (cohort_id, bucket, path, value)),
           room AS (SELECT cohort_id, bucket, path, count(*) AS used FROM old GROUP BY ALL),
           ranked AS (SELECT known.*, coalesce(room.used, 0) AS used,
                             row_number() OVER (PARTITION BY cohort_id, bucket, path, kept
                                                ORDER BY n DESC, value) AS rn
                      FROM known LEFT JOIN room USING (cohort_id, bucket, path))
           SELECT cohort_id, bucket, path, value, n, kept OR used + rn <= $cap AS admitted FROM ranked""",
        {"cap": cfg.enum_values_per_path, "lo": lo, "hi": hi},
    )
    sums = ", ".join(f"sum({c}) AS {c}" for c in _FIELD_COLS)
    con.execute(
        f"""INSERT INTO field_rollups (cohort_id, bucket, path, scope, {", ".join(_FIELD_COLS)}, values_overflow)
            SELECT f.* EXCLUDE (dropped), coalesce(o.n, 0) + f.dropped FROM (
                SELECT s.cohort_id, s.bucket, s.path, _rf.scope, {sums}, sum(dropped) AS dropped
                FROM _rf JOIN _slots s USING (slot) GROUP BY s.cohort_id, s.bucket, s.path, _rf.scope) f
            LEFT JOIN (SELECT cohort_id, bucket, path, sum(n) AS n FROM _vr WHERE NOT admitted
                       GROUP BY ALL) o USING (cohort_id, bucket, path)"""
    )
    con.execute("INSERT INTO value_rollups SELECT cohort_id, bucket, path, value, n FROM _vr WHERE admitted")
    con.execute(
        """INSERT INTO array_rollups
           SELECT cohort_id, bucket, path, length, sum(_ra.n)
           FROM _ra JOIN _rf USING (slot) JOIN _groups USING (g) GROUP BY ALL"""
    )
    _merge_numbers(con, f, nums)
    con.execute(
        """INSERT INTO served_models
           SELECT cohort_id, bucket, served_model, sum(_rs.n) FROM _rs JOIN _groups USING (g) GROUP BY ALL"""
        + (" ON CONFLICT DO UPDATE SET n = n + excluded.n" if keyed else "")
    )
    con.execute(
        """INSERT INTO contract_rollups
           SELECT cohort_id, bucket, contract_version, status, sum(_rc.n) FROM _rc JOIN _groups USING (g) GROUP BY ALL"""
    )
    con.execute(
        """INSERT INTO violation_rollups
           SELECT cohort_id, bucket, contract_version, path, keyword, sum(_rx.n)
           FROM _rx JOIN _groups USING (g) GROUP BY ALL"""
    )
    for t in ("_vr", "_buckets", "_groups"):
        con.execute(f"DROP TABLE {t}")


def _register_hard_slots(
    con: duckdb.DuckDBPyConnection, f: pa.Table, v: pa.Table, cap: int, distinct_paths: bool
) -> None:
    """Append the field rows and values of this merge's easy slots; register the rest as ``_slots``.

    A slot (a group's path) counts in its group's cohort and, for an alias answered by another
    model, in the served cohort too: one (slot, cohort) pair each. A pair is easy when its row
    is the only one of its key in this merge (its path appears once in its group, and no other
    group holds its (cohort, bucket)), no earlier merge stored that (cohort, bucket), and it
    holds at most ``cap`` values: its field row and every value go in as they are. Placing them
    here, not by joins and a GROUP BY in SQL, is what keeps a merge of fine buckets cheap (a
    sparse import's last merge: 610,000 field rows, 1.7 s in SQL). ``_slots`` (slot, cohort_id,
    bucket, path) holds the other pairs, for the ranking and summing that follow.
    """
    groups = con.sql(
        "SELECT g, cohort_id, bucket, served, shared OR b.existed AS busy FROM _groups JOIN _buckets b "
        "USING (cohort_id, bucket)"
    ).to_arrow_table()
    rows = f.num_rows
    fg = f["g"].to_numpy()
    # paths as a dictionary: a row taken copies its index, not its text (memory at a sparse merge)
    paths = pa.compute.dictionary_encode(f["path"].combine_chunks())
    vslot = v["slot"].to_numpy()
    slot_ok = np.bincount(vslot, minlength=rows) <= cap
    if not distinct_paths:  # a slot's row is alone when no other slot of its group has its path
        codes = paths.indices.to_numpy().astype(np.int64)
        _, where, repeats = np.unique(fg * (len(paths.dictionary) + 1) + codes, return_inverse=True, return_counts=True)
        slot_ok &= repeats[where] == 1
    size = int(max(groups["g"].to_numpy().max(initial=-1), fg.max(initial=-1))) + 1
    hard = []
    for served in (False, True):
        part = groups.filter(pa.compute.equal(groups["served"], served))
        if not part.num_rows:
            continue
        row_of_g = np.full(size, -1, dtype=np.int64)
        row_of_g[part["g"].to_numpy()] = np.arange(part.num_rows)
        r = row_of_g[fg]  # each slot's row of this kind, -1: none
        has = r >= 0
        easy = has & slot_ok
        easy[has] &= ~part["busy"].to_numpy(zero_copy_only=False)[r[has]]
        at = np.flatnonzero(easy)
        if len(at):
            _append(con, "field_rollups", [
                ("cohort_id", part["cohort_id"].take(r[at])),
                ("bucket", part["bucket"].take(r[at])),
                ("path", paths.take(at)),
                *((c, _rows_of(f[c], at)) for c in ["scope", *_FIELD_COLS]),
                ("values_overflow", _rows_of(f["dropped"], at)),
            ])  # fmt: skip
            keep = np.flatnonzero(easy[vslot])
            if len(keep):
                vr = r[vslot[keep]]
                _append(con, "value_rollups", [
                    ("cohort_id", part["cohort_id"].take(vr)),
                    ("bucket", part["bucket"].take(vr)),
                    ("path", paths.take(vslot[keep])),
                    ("value", _rows_of(v["value"], keep)),
                    ("n", _rows_of(v["n"], keep)),
                ])  # fmt: skip
        at = np.flatnonzero(has & ~easy)
        hard.append(
            pa.table(
                {
                    "slot": pa.array(at, pa.int64()),
                    "cohort_id": part["cohort_id"].take(r[at]),
                    "bucket": part["bucket"].take(r[at]),
                    "path": paths.dictionary.take(paths.indices.take(at)),
                }
            )
        )
    if not hard:
        empty = {
            "slot": pa.int64(),
            "cohort_id": groups.schema.field("cohort_id").type,
            "bucket": groups.schema.field("bucket").type,
            "path": pa.string(),
        }
        hard.append(pa.table({name: pa.array([], t) for name, t in empty.items()}))
    slots = pa.concat_tables(hard)
    con.register("_slots", slots)
    # Only the values of those slots are ranked and summed (most are appended above): joining
    # every value of the merge to ``_slots`` in SQL cost about as much as the ranking itself.
    con.register("_rv", v.filter(pa.compute.is_in(v["slot"], value_set=slots["slot"])))


def _rows_of(column: pa.ChunkedArray, at: np.ndarray) -> pa.ChunkedArray | pa.Array:
    """The rows ``at`` (ascending) of ``column``: the column itself when they are all of them."""
    return column if len(at) == len(column) else column.take(at)


def _append(con: duckdb.DuckDBPyConnection, table: str, columns: list[tuple[str, Any]]) -> None:
    """Append Arrow columns, named as the table's, to a rollup table."""
    con.register("_append", pa.table(dict(columns)))
    try:
        con.execute(f"INSERT INTO {table} ({', '.join(name for name, _ in columns)}) SELECT * FROM _append")
    finally:
        con.unregister("_append")


def _merge_numbers(con: duckdb.DuckDBPyConnection, f: pa.Table, nums: pa.Table) -> None:
    """Append the number bins of a merge (``nums``: slot, value, n; a slot is a row of ``f``)."""
    # Numbers are most of the rows (several per event), so each row's cohort, bucket and
    # path are taken in Arrow, through its slot and group, and DuckDB only appends: joining
    # them in SQL cost about three times the append itself (measured).
    # A bin belongs to its group's cohort and, for an alias answered by another model, to the
    # served cohort too: one pass per kind of row, each with one row per group.
    parts = []
    for served in (False, True):
        # con.sql, not con.execute: DuckDB 2.0 warns on execute(...).to_arrow_table()
        groups = con.sql(
            "SELECT g, cohort_id, bucket, shared FROM _groups WHERE served = ?", params=[served]
        ).to_arrow_table()
        if not groups.num_rows:
            continue
        g_of_bin = f["g"].take(nums["slot"])
        part = nums
        if served:  # only the bins of groups that have a served cohort
            keep = pa.compute.is_in(g_of_bin, value_set=groups["g"])
            part, g_of_bin = nums.filter(keep), g_of_bin.filter(keep)
        row = pa.compute.index_in(g_of_bin, value_set=groups["g"])  # each bin's group
        parts.append(
            pa.table(
                {
                    "cohort_id": groups["cohort_id"].take(row),
                    "bucket": groups["bucket"].take(row),
                    "path": f["path"].take(part["slot"]),
                    "value": part["value"],
                    "n": part["n"],
                    "shared": groups["shared"].take(row),
                }
            )
        )
    if not parts:
        return
    con.register("_rn", pa.concat_tables(parts))
    # Within one batch a (group, path, bin) is one row, and no two bins share a value (a log
    # bin's representative is never a whole number up to 100: a test checks every bin). So
    # only groups that several batches of this merge hold can repeat a key and need summing.
    con.execute("INSERT INTO number_rollups SELECT cohort_id, bucket, path, value, n FROM _rn WHERE NOT shared")
    con.execute("""INSERT INTO number_rollups SELECT cohort_id, bucket, path, value, sum(n) FROM _rn
                   WHERE shared GROUP BY ALL""")


def compact_rollups(
    con: duckdb.DuckDBPyConnection, since: datetime | None = None, until: datetime | None = None
) -> int:
    """Fold the rows of each rollup key with bucket in ``[since, until)`` into one; returns rows removed.

    Sums are unchanged (tests check it); only the number of rows shrinks, so
    reading a window costs the same however many batches filled it.
    """
    removed = 0
    parts, params = [], {}
    if since is not None:
        parts.append("bucket >= $since")
        params["since"] = since
    if until is not None:
        parts.append("bucket < $until")
        params["until"] = until
    cond = "WHERE " + " AND ".join(parts) if parts else ""
    for table, (keys, sums) in ROLLUP_TABLES.items():
        k = ", ".join(keys)
        agg = ", ".join(f"{summed(c)}::BIGINT AS {c}" for c in sums)
        before = con.execute(f"SELECT count(*) FROM {table} {cond}", params).fetchone()
        con.execute(
            f"CREATE OR REPLACE TEMP TABLE _compact AS SELECT {k}, {agg} FROM {table} {cond} GROUP BY {k}", params
        )
        after = con.execute("SELECT count(*) FROM _compact").fetchone()
        assert before is not None and after is not None
        if after[0] < before[0]:
            con.execute(f"DELETE FROM {table} {cond}", params)
            con.execute(f"INSERT INTO {table} ({k}, {', '.join(sums)}) SELECT * FROM _compact")
            removed += before[0] - after[0]
        con.execute("DROP TABLE _compact")
    return removed
