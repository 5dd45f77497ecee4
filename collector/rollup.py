"""Mergeable rollups, computed set-based inside DuckDB for each ingested batch.

For each batch of newly stored events this module discovers the field paths
level by level (``json_keys`` over a list of JSON Pointers: one parse of each
document per level, never a generic ``json_tree`` unnest), then computes every
statistic of every path in one pass per *scope* (the outputs, or the items of
one array) and adds it into the rollup tables, keyed by cohort, time bucket
and path. Everything stored is a count, so a window's profile is a sum of
buckets and the merge of two windows is the sum of their rows.

Tables (created by ``store.py``'s migrations):

- ``cohort_buckets(cohort_id, bucket, events)``: units of the top scope
- ``field_rollups(cohort_id, bucket, path, scope, present, n_null, n_boolean,
  n_integer, n_number, n_string, n_array, n_object, long_strings, values_overflow)``
- ``value_rollups(cohort_id, bucket, path, value, n)``: short strings, bounded per key
- ``array_rollups(cohort_id, bucket, path, length, n)``: exact length histogram

The caller (the store) runs this inside the transaction that stored the
events, so rollups and raw events commit together or not at all.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from .flatten import items_path, join_key, pointer_for_key

__all__ = ["RollupConfig", "apply_rollups"]


@dataclass(frozen=True)
class RollupConfig:
    enum_value_max_length: int = 64
    enum_values_per_path: int = 200
    max_depth: int = 32


@dataclass(frozen=True)
class _Path:
    pointer: str  # JSON Pointer from the scope's unit ("$" for the unit itself)
    path: str  # display path


def apply_rollups(con: duckdb.DuckDBPyConnection, source: str, cfg: RollupConfig) -> None:
    """Add the rollups of the outputs in relation ``source(cohort_id, bucket, output)``."""
    con.execute(
        f"""INSERT INTO cohort_buckets BY NAME
            SELECT cohort_id, bucket, count(*) AS events FROM {source} GROUP BY ALL
            ON CONFLICT DO UPDATE SET events = events + excluded.events""")
    # One row per (unit, path present): the JSON type already normalised (a whole
    # double is an integer), the string only when short enough to be a value.
    con.execute("CREATE OR REPLACE TEMP TABLE _obs (cohort_id INTEGER, bucket TIMESTAMPTZ, path VARCHAR,"
                " scope VARCHAR, t VARCHAR, s VARCHAR, l BIGINT, long BOOLEAN)")
    scopes: list[tuple[str, str, bool]] = [(source, "", False)]
    n_scopes = 0
    while scopes:
        table, scope, is_items = scopes.pop()
        arrays = _observe_scope(con, table, scope, is_items, cfg)
        for a in arrays:
            n_scopes += 1
            child = f"_rs{n_scopes}"
            con.execute(
                f"""CREATE OR REPLACE TEMP TABLE {child} AS
                    SELECT cohort_id, bucket, unnest(CAST(json_extract(output, ?) AS JSON[])) AS output
                    FROM {table} WHERE json_type(output, ?) = 'ARRAY'""", [a.pointer, a.pointer])
            scopes.append((child, a.path, True))
        if table != source:
            con.execute(f"DROP TABLE {table}")
    _merge(con, cfg)
    con.execute("DROP TABLE _obs")


def _discover(con: duckdb.DuckDBPyConnection, table: str, scope: str, is_items: bool,
              cfg: RollupConfig) -> list[_Path]:
    """Every path reachable from the scope's units without crossing an array."""
    found: list[_Path] = [_Path("$", items_path(scope))] if is_items else []
    level = [_Path("$", "")]  # object paths whose keys are looked up next
    depth = 0
    while level and depth <= cfg.max_depth:
        rows = con.execute(
            f"""SELECT DISTINCT i, unnest(ks) AS k FROM (
                    SELECT unnest(range(len($ptrs))) AS i, unnest(json_keys(output, $ptrs)) AS ks FROM {table})
                ORDER BY i, k""",
            {"ptrs": [p.pointer for p in level]}).fetchall()
        parent_of = {i: p for i, p in enumerate(level)}
        base = items_path(scope) if is_items else ""
        nxt: list[_Path] = []
        for i, key in rows:
            parent = parent_of[i]
            ptr = ("" if parent.pointer == "$" else parent.pointer) + pointer_for_key(key)
            path = join_key(parent.path if parent.path else base, key)
            nxt.append(_Path(ptr, path))
        found.extend(nxt)
        level = nxt
        depth += 1
    return found


def _observe_scope(con: duckdb.DuckDBPyConnection, table: str, scope: str, is_items: bool,
                   cfg: RollupConfig) -> list[_Path]:
    """Append one row per (unit, path present) to ``_obs``; return the array paths seen."""
    paths = _discover(con, table, scope, is_items, cfg)
    if not paths:
        return []
    ptrs = [p.pointer for p in paths]
    names = [p.path for p in paths]
    con.execute(
        f"""INSERT INTO _obs
            SELECT cohort_id, bucket, $names[i + 1], $scope,
                   CASE t WHEN 'NULL' THEN 'null' WHEN 'BOOLEAN' THEN 'boolean'
                          WHEN 'BIGINT' THEN 'integer' WHEN 'UBIGINT' THEN 'integer'
                          WHEN 'DOUBLE' THEN CASE WHEN CAST(s AS DOUBLE) = floor(CAST(s AS DOUBLE))
                                                  THEN 'integer' ELSE 'number' END
                          WHEN 'VARCHAR' THEN 'string' WHEN 'ARRAY' THEN 'array' ELSE 'object' END,
                   CASE WHEN t = 'VARCHAR' AND length(s) <= $maxlen THEN s END,
                   CASE WHEN t = 'ARRAY' THEN l END,
                   t = 'VARCHAR' AND length(s) > $maxlen
            FROM (SELECT cohort_id, bucket, unnest(range(len($ptrs))) AS i,
                         unnest(json_type(output, $ptrs)) AS t,
                         unnest(json_extract_string(output, $ptrs)) AS s,
                         unnest(json_array_length(output, $ptrs)) AS l
                  FROM {table})
            WHERE t IS NOT NULL""",
        {"ptrs": ptrs, "names": names, "scope": scope, "maxlen": cfg.enum_value_max_length})
    arrays = con.execute(
        "SELECT DISTINCT path FROM _obs WHERE scope = $scope AND t = 'array'", {"scope": scope}).fetchall()
    by_name = {p.path: p for p in paths}
    return [by_name[r[0]] for r in arrays if r[0] in by_name]


def _merge(con: duckdb.DuckDBPyConnection, cfg: RollupConfig) -> None:
    cap = cfg.enum_values_per_path
    # Whole floats count as integers: integer is a kind of number (DESIGN.md).
    con.execute(
        """CREATE OR REPLACE TEMP TABLE _fr AS
           SELECT cohort_id, bucket, path, any_value(scope) AS scope, count(*) AS present,
                  count_if(t = 'null') AS n_null, count_if(t = 'boolean') AS n_boolean,
                  count_if(t = 'integer') AS n_integer, count_if(t = 'number') AS n_number,
                  count_if(t = 'string') AS n_string, count_if(t = 'array') AS n_array,
                  count_if(t = 'object') AS n_object, count_if(long) AS long_strings,
                  0::BIGINT AS values_overflow
           FROM _obs GROUP BY cohort_id, bucket, path""")
    # Short strings: keep at most `cap` distinct values per (cohort, bucket, path).
    # Values already kept always add up; new ones are admitted by frequency while
    # room is left; the rest go to the overflow count.
    con.execute(
        """CREATE OR REPLACE TEMP TABLE _vr AS
           WITH b AS (SELECT cohort_id, bucket, path, s AS value, count(*) AS n FROM _obs
                      WHERE s IS NOT NULL GROUP BY ALL),
           known AS (SELECT b.*, v.value IS NOT NULL AS kept FROM b LEFT JOIN value_rollups v
                     USING (cohort_id, bucket, path, value)),
           room AS (SELECT cohort_id, bucket, path, count(*) AS used FROM value_rollups
                    WHERE (cohort_id, bucket) IN (SELECT DISTINCT cohort_id, bucket FROM b)
                    GROUP BY ALL),
           ranked AS (SELECT known.*, coalesce(room.used, 0) AS used,
                             row_number() OVER (PARTITION BY cohort_id, bucket, path, kept
                                                ORDER BY n DESC, value) AS rn
                      FROM known LEFT JOIN room USING (cohort_id, bucket, path))
           SELECT cohort_id, bucket, path, value, n, kept OR used + rn <= $cap AS admitted FROM ranked""",
        {"cap": cap})
    con.execute(
        """UPDATE _fr SET values_overflow = o.n FROM
               (SELECT cohort_id, bucket, path, sum(n) AS n FROM _vr WHERE NOT admitted GROUP BY ALL) o
           WHERE _fr.cohort_id = o.cohort_id AND _fr.bucket = o.bucket AND _fr.path = o.path""")
    con.execute(
        """INSERT INTO field_rollups BY NAME SELECT * FROM _fr
           ON CONFLICT DO UPDATE SET present = present + excluded.present,
               n_null = n_null + excluded.n_null, n_boolean = n_boolean + excluded.n_boolean,
               n_integer = n_integer + excluded.n_integer, n_number = n_number + excluded.n_number,
               n_string = n_string + excluded.n_string, n_array = n_array + excluded.n_array,
               n_object = n_object + excluded.n_object, long_strings = long_strings + excluded.long_strings,
               values_overflow = values_overflow + excluded.values_overflow""")
    con.execute(
        """INSERT INTO value_rollups BY NAME SELECT cohort_id, bucket, path, value, n FROM _vr WHERE admitted
           ON CONFLICT DO UPDATE SET n = n + excluded.n""")
    con.execute(
        """INSERT INTO array_rollups BY NAME
           SELECT cohort_id, bucket, path, l AS length, count(*) AS n FROM _obs WHERE t = 'array' GROUP BY ALL
           ON CONFLICT DO UPDATE SET n = n + excluded.n""")
    con.execute("DROP TABLE _fr")
    con.execute("DROP TABLE _vr")
