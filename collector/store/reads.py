"""The read API: everything the rest of shapewatch reads from the collector's tables, as plain
values (named tuples, dicts), so no module outside this package writes SQL against them.

Rollups are read as they are merged: readers that need the counts of the newest events call
``flush_rollups`` first (``collector/profile.py`` does). Windows are ``[since, until)`` over
bucket starts, as everywhere.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from ..rules import PRODUCTION
from .deferred import DeferredRollups

__all__ = ["CohortRow", "Reads", "StoredEvent", "WindowRollups"]


class CohortRow(NamedTuple):
    """A cohort as stored: (model, prompt version, contract, source) under its id."""

    cohort_id: int
    model: str
    prompt_version: str
    contract: str
    first_seen: datetime
    source: str = PRODUCTION


class StoredEvent(NamedTuple):
    """A raw event as stored, with its cohort's names; ``output`` is its JSON text as sent."""

    event_id: str
    ts: datetime
    model: str
    prompt_version: str
    contract: str
    served_model: str | None
    contract_version: str | None
    source: str | None
    output: str


@dataclass
class WindowRollups:
    """The rollups of a window summed per key, as ``collector/profile.py`` builds profiles from.

    Keys are (cohort id, path) unless said otherwise. ``fields`` rows are (cohort id, path, scope,
    present, n_null, n_boolean, n_integer, n_number, n_string, n_array, n_object, long_strings,
    values_overflow, n_true, booleans whose n_true is known), ordered by cohort id and path.
    """

    events: dict[int, int] = field(default_factory=dict)  # cohort id -> events
    fields: list[tuple[Any, ...]] = field(default_factory=list)
    lengths: dict[tuple[int, str], dict[int, int]] = field(default_factory=dict)  # array length -> n
    values: dict[tuple[int, str], dict[str, int]] = field(default_factory=dict)  # short string -> n
    numbers: dict[tuple[int, str], dict[float, int]] = field(default_factory=dict)  # bin -> n
    served: dict[int, dict[str, int]] = field(default_factory=dict)  # cohort id -> served model -> n
    checks: dict[int, dict[str, dict[str, int]]] = field(default_factory=dict)  # id -> version -> status -> n
    violations: dict[int, dict[str, dict[str, int]]] = field(default_factory=dict)  # id -> path -> keyword -> n


_WHERE = "bucket >= ? AND bucket < ?"
_PATH_LIST = 512  # window_values filters by a list of paths up to this many (measured there)


class Reads(DeferredRollups):
    """Reads of cohorts, window rollups, raw events and run records."""

    # --- cohorts ------------------------------------------------------------------------------

    def cohorts(self) -> list[CohortRow]:
        """Every cohort, ordered by model, prompt version, contract and source (production first)."""
        return [
            CohortRow(int(i), str(m), str(p), str(c), t, str(s))
            for i, m, p, c, t, s in self.query(
                "SELECT cohort_id, model, prompt_version, contract, first_seen, source FROM cohorts "
                "ORDER BY model, prompt_version, contract, source <> 'production', source"
            )
        ]

    def cohort(self, cohort_id: int) -> CohortRow | None:
        """The cohort of ``cohort_id``, or None."""
        rows = self.query(
            "SELECT cohort_id, model, prompt_version, contract, first_seen, source FROM cohorts WHERE cohort_id = ?",
            [cohort_id],
        )
        if not rows:
            return None
        i, m, p, c, t, s = rows[0]
        return CohortRow(int(i), str(m), str(p), str(c), t, str(s))

    def cohort_id(self, model: str, prompt_version: str, contract: str, source: str = PRODUCTION) -> int | None:
        """The id of a cohort, or None if no output of it was stored."""
        rows = self.query(
            "SELECT cohort_id FROM cohorts WHERE model = ? AND prompt_version = ? AND contract = ? AND source = ?",
            [model, prompt_version, contract, source],
        )
        return int(rows[0][0]) if rows else None

    def requested_cohort_ids(self) -> set[int]:
        """Cohorts with raw events of their own: requested by that model id, not only served an alias."""
        return {int(r[0]) for r in self.query("SELECT DISTINCT cohort_id FROM events")}

    # --- rollups of a window --------------------------------------------------------------------

    def window_rollups(
        self,
        since: datetime,
        until: datetime,
        cohort_id: int | None = None,
        *,
        numbers: bool = True,
        values: bool = True,
    ) -> WindowRollups:
        """Every rollup of ``[since, until)`` summed per key, of all cohorts or one.

        One query per rollup table for every cohort at once: each scan of a table costs about the
        same for one cohort as for all of them (measured: 3-6x less than a query per cohort).
        ``numbers=False`` skips the number histograms, the largest table; ``values=False`` the
        short-string values, for a reader that takes those of some paths only (``window_values``).
        """
        params: list[Any] = [since, until]
        where = _WHERE
        if cohort_id is not None:
            where += " AND cohort_id = ?"
            params.append(cohort_id)
        out = WindowRollups()
        for c, n in self.query(
            f"SELECT cohort_id, sum(events)::BIGINT FROM cohort_buckets WHERE {where} GROUP BY ALL", params
        ):
            out.events[int(c)] = int(n)
        for c, path, length, n in self.query(
            f"SELECT cohort_id, path, length, sum(n)::BIGINT FROM array_rollups WHERE {where} GROUP BY ALL", params
        ):
            out.lengths.setdefault((int(c), path), {})[int(length)] = int(n)
        if values:
            out.values = self._counts_by_path("value_rollups", where, params)
        if numbers:
            out.numbers = self._counts_by_path("number_rollups", where, params)
        out.fields = self.query(
            f"""SELECT cohort_id, path, scope, sum(present), sum(n_null), sum(n_boolean), sum(n_integer),
                       sum(n_number), sum(n_string), sum(n_array), sum(n_object), sum(long_strings),
                       sum(values_overflow), coalesce(sum(n_true), 0),
                       coalesce(sum(n_boolean) FILTER (WHERE n_true IS NOT NULL), 0)
                FROM field_rollups WHERE {where} GROUP BY cohort_id, path, scope ORDER BY cohort_id, path""",
            params,
        )
        for c, m, n in self.query(
            f"SELECT cohort_id, served_model, sum(n)::BIGINT FROM served_models WHERE {where} GROUP BY ALL", params
        ):
            out.served.setdefault(int(c), {})[str(m)] = int(n)
        for c, version, status, n in self.query(
            f"SELECT cohort_id, contract_version, status, sum(n)::BIGINT FROM contract_rollups WHERE {where} "
            "GROUP BY ALL",
            params,
        ):
            out.checks.setdefault(int(c), {}).setdefault(str(version), {})[str(status)] = int(n)
        for c, path, keyword, n in self.query(
            f"SELECT cohort_id, coalesce(path, '$'), keyword, sum(n)::BIGINT FROM violation_rollups WHERE {where} "
            "GROUP BY ALL",
            params,
        ):
            out.violations.setdefault(int(c), {}).setdefault(str(path), {})[str(keyword)] = int(n)
        return out

    def window_values(
        self, since: datetime, until: datetime, keys: Collection[tuple[int, str]]
    ) -> dict[tuple[int, str], dict[str, int]]:
        """The short-string values of ``[since, until)`` summed per value, of the (cohort id, path)
        ``keys`` only: ``window_rollups(...).values`` restricted to them.

        A day of busy traffic holds hundreds of thousands of values, most of them of paths no rule
        reads the values of (ids, names, sentences): the analyzer names the paths it judges.
        """
        if not keys:
            return {}
        cohorts, paths = zip(*sorted(set(keys)), strict=True)
        distinct = sorted(set(paths))
        # A short list of paths drops most rows as DuckDB scans them, before the join keeps the
        # keys asked (a day's values of 8 paths: 0.22 s, the join alone 0.31-0.34 s); a long one
        # costs more than it saves, as list_contains walks it for every row (3,000 paths: 0.74 s
        # against 0.51 s, 20,000: 3.7 s against 1.35 s), so past _PATH_LIST the join works alone.
        listed = len(distinct) <= _PATH_LIST
        where = (
            f"{_WHERE}{' AND list_contains(?::VARCHAR[], path)' if listed else ''} "
            "AND (cohort_id, path) IN (SELECT unnest(?::BIGINT[]), unnest(?::VARCHAR[]))"
        )
        params: list[Any] = [since, until, *([distinct] if listed else []), list(cohorts), list(paths)]
        return self._counts_by_path("value_rollups", where, params)

    def _counts_by_path(self, table: str, where: str, params: list[Any]) -> dict[tuple[int, str], dict[Any, int]]:
        """{(cohort id, path): {value: summed n}} of a value or number table over ``where``.

        Each (cohort, path) comes back as one row holding its values and counts as two lists, in
        Arrow, made into a dict in C (``dict(zip(...))``): a row per value, each put into its dict
        by Python, took 0.84-0.87 s for the 380,000 values of a busy 24-hour window, this 0.56 s
        (the SQL alone 0.44 s).
        """
        t = self.query_arrow(
            f"""SELECT cohort_id, path, list(value) AS vs, list(n) AS ns FROM (
                    SELECT cohort_id, path, value, sum(n)::BIGINT AS n FROM {table} WHERE {where} GROUP BY ALL)
                GROUP BY ALL""",
            params,
        )
        return {
            (c, path): dict(zip(values, counts, strict=True))
            for c, path, values, counts in zip(
                t["cohort_id"].to_pylist(), t["path"].to_pylist(), t["vs"].to_pylist(), t["ns"].to_pylist(), strict=True
            )
        }

    def step_rollups(
        self, cohort_id: int, edges: Sequence[datetime], paths: Sequence[str] | None = None
    ) -> list[WindowRollups]:
        """The rollups of one cohort over consecutive windows ``[edges[i], edges[i + 1])``, summed per
        key and window: what ``window_rollups(edges[i], edges[i + 1], cohort_id)`` reads for each i,
        in one query per rollup table for all the windows (a chart's 24 to 200 steps cost about as
        much as one window, not one window each). ``edges`` must not decrease (a step of no length is
        empty); fewer than two, no window.

        With ``paths``, the per-path rows (fields, values, numbers, violations) are those of these
        paths only, and array lengths those of these paths and of the arrays they sit in (the units
        of a path under an array); events, served models and contract checks are the cohort's.
        """
        if len(edges) < 2:
            return []
        if any(a > b for a, b in itertools.pairwise(edges)):
            raise ValueError("step edges must not decrease")
        out = [WindowRollups() for _ in range(len(edges) - 1)]
        lo, hi = list(edges[:-1]), list(edges[1:])
        whole: dict[str, Any] = {"cohort": cohort_id, "since": edges[0], "until": edges[-1], "lo": lo, "hi": hi}
        # Each bucket joins the one step holding its start: the same [lo, hi) test as a window's.
        steps = f"""WITH steps AS (SELECT unnest($lo::TIMESTAMPTZ[]) AS lo, unnest($hi::TIMESTAMPTZ[]) AS hi,
                                          unnest(range({len(lo)})) AS step)"""
        joined = (
            "JOIN steps s ON r.bucket >= s.lo AND r.bucket < s.hi "
            "WHERE r.cohort_id = $cohort AND r.bucket >= $since AND r.bucket < $until"
        )

        def only(column: str, wanted: Sequence[str] | None = paths) -> tuple[str, dict[str, Any]]:
            """The condition keeping the rows of the paths asked for, and the parameters with it."""
            if wanted is None:
                return "", whole
            return f" AND list_contains($paths::VARCHAR[], {column})", {**whole, "paths": sorted(set(wanted))}

        for step, n in self.query(
            f"{steps} SELECT s.step, sum(r.events)::BIGINT FROM cohort_buckets r {joined} GROUP BY ALL", whole
        ):
            out[step].events[cohort_id] = int(n)
        cond, params = only("r.path")
        fields = self.query(
            f"""{steps} SELECT s.step, r.cohort_id, r.path, r.scope, sum(r.present), sum(r.n_null), sum(r.n_boolean),
                       sum(r.n_integer), sum(r.n_number), sum(r.n_string), sum(r.n_array), sum(r.n_object),
                       sum(r.long_strings), sum(r.values_overflow), coalesce(sum(r.n_true), 0),
                       coalesce(sum(r.n_boolean) FILTER (WHERE r.n_true IS NOT NULL), 0)
                FROM field_rollups r {joined}{cond}
                GROUP BY s.step, r.cohort_id, r.path, r.scope ORDER BY s.step, r.cohort_id, r.path""",
            params,
        )
        for row in fields:
            out[row[0]].fields.append(tuple(row[1:]))
        # the arrays the paths sit in count their units
        scopes = None if paths is None else [*paths, *(str(row[3]) for row in fields if row[3] is not None)]
        cond, params = only("r.path", scopes)
        for step, path, length, n in self.query(
            f"{steps} SELECT s.step, r.path, r.length, sum(r.n)::BIGINT FROM array_rollups r {joined}{cond} GROUP BY ALL",
            params,
        ):
            out[step].lengths.setdefault((cohort_id, path), {})[int(length)] = int(n)
        cond, params = only("r.path")
        for step, path, value, n in self.query(
            f"{steps} SELECT s.step, r.path, r.value, sum(r.n)::BIGINT FROM value_rollups r {joined}{cond} GROUP BY ALL",
            params,
        ):
            out[step].values.setdefault((cohort_id, path), {})[value] = int(n)
        for step, path, value, n in self.query(
            f"{steps} SELECT s.step, r.path, r.value, sum(r.n)::BIGINT FROM number_rollups r {joined}{cond} GROUP BY ALL",
            params,
        ):
            out[step].numbers.setdefault((cohort_id, path), {})[float(value)] = int(n)
        for step, m, n in self.query(
            f"{steps} SELECT s.step, r.served_model, sum(r.n)::BIGINT FROM served_models r {joined} GROUP BY ALL",
            whole,
        ):
            out[step].served.setdefault(cohort_id, {})[str(m)] = int(n)
        for step, version, status, n in self.query(
            f"{steps} SELECT s.step, r.contract_version, r.status, sum(r.n)::BIGINT FROM contract_rollups r {joined} "
            "GROUP BY ALL",
            whole,
        ):
            out[step].checks.setdefault(cohort_id, {}).setdefault(str(version), {})[str(status)] = int(n)
        cond, params = only("coalesce(r.path, '$')")
        for step, path, keyword, n in self.query(
            f"""{steps} SELECT s.step, coalesce(r.path, '$'), r.keyword, sum(r.n)::BIGINT
                FROM violation_rollups r {joined}{cond} GROUP BY ALL""",
            params,
        ):
            out[step].violations.setdefault(cohort_id, {}).setdefault(str(path), {})[str(keyword)] = int(n)
        return out

    def events_by_cohort(self, since: datetime, until: datetime) -> dict[int, int]:
        """Events per cohort id in the window (cohorts without any left out)."""
        return {
            int(c): int(n)
            for c, n in self.query(
                f"SELECT cohort_id, sum(events)::BIGINT FROM cohort_buckets WHERE {_WHERE} GROUP BY ALL", [since, until]
            )
        }

    def events_by_day(self, cohort_id: int, since: datetime, until: datetime) -> dict[str, int]:
        """A cohort's events per UTC day (``YYYY-MM-DD``) of the window, oldest first."""
        return {
            str(day): int(n)
            for day, n in self.query(
                f"""SELECT strftime(date_trunc('day', bucket AT TIME ZONE 'UTC'), '%Y-%m-%d') AS day,
                           sum(events)::BIGINT
                    FROM cohort_buckets WHERE cohort_id = ? AND {_WHERE} GROUP BY 1 ORDER BY 1""",
                [cohort_id, since, until],
            )
        }

    def served_by_cohort(self, since: datetime, until: datetime) -> dict[int, dict[str, int]]:
        """Outputs per served model of each cohort in the window, the most served first."""
        out: dict[int, dict[str, int]] = {}
        for c, m, n in self.query(
            f"""SELECT cohort_id, served_model, sum(n)::BIGINT FROM served_models WHERE {_WHERE}
                GROUP BY ALL ORDER BY 3 DESC, 2""",
            [since, until],
        ):
            out.setdefault(int(c), {})[str(m)] = int(n)
        return out

    def contract_versions_by_cohort(self, since: datetime, until: datetime) -> dict[int, dict[str, int]]:
        """Outputs per contract version tagged ('' for none) of each cohort in the window, the most first."""
        out: dict[int, dict[str, int]] = {}
        for c, version, n in self.query(
            f"""SELECT cohort_id, contract_version, sum(n)::BIGINT FROM contract_rollups WHERE {_WHERE}
                GROUP BY ALL ORDER BY 3 DESC, 2""",
            [since, until],
        ):
            out.setdefault(int(c), {})[str(version)] = int(n)
        return out

    def outcomes_by_cohort(self, since: datetime, until: datetime) -> dict[int, dict[str, int]]:
        """Provider outcomes per kind of each cohort in the window, kinds in order."""
        out: dict[int, dict[str, int]] = {}
        for c, kind, n in self.query(
            f"SELECT cohort_id, kind, sum(n)::BIGINT FROM outcomes WHERE {_WHERE} GROUP BY ALL ORDER BY 2",
            [since, until],
        ):
            out.setdefault(int(c), {})[str(kind)] = int(n)
        return out

    def contract_version_starts(
        self, since: datetime, until: datetime, cohort_id: int | None = None
    ) -> list[tuple[int, str, datetime]]:
        """(cohort id, contract version, first bucket) of each version a cohort's outputs were first
        tagged with inside the window, a cohort's very first version left out (its start, not a
        change); by cohort, oldest first."""
        params: list[Any] = [since, until]
        where = ""
        if cohort_id is not None:
            where, params = "AND cohort_id = ?", [cohort_id, since, until]
        return [
            (int(c), str(v), t)
            for c, v, t in self.query(
                f"""WITH firsts AS (SELECT cohort_id, contract_version, min(bucket) AS first FROM contract_rollups
                                    WHERE status <> 'untagged' {where} GROUP BY ALL),
                         starts AS (SELECT cohort_id, min(first) AS start FROM firsts GROUP BY ALL)
                    SELECT cohort_id, contract_version, first FROM firsts JOIN starts USING (cohort_id)
                    WHERE first >= ? AND first < ? AND first > start
                    ORDER BY cohort_id, first, contract_version""",
                params,
            )
        ]

    def served_aliases(self) -> list[tuple[str, str, str, str, str]]:
        """(served model, prompt version, contract, requested model, source) of every alias answered
        by another model, over all time; per served cohort the most answered first."""
        return [
            (str(s), str(p), str(c), str(m), str(src))
            for s, p, c, m, src, _ in self.query(
                """SELECT s.served_model, c.prompt_version, c.contract, c.model, c.source, sum(s.n) AS n
                   FROM served_models s JOIN cohorts c USING (cohort_id)
                   WHERE s.served_model <> c.model GROUP BY ALL ORDER BY n DESC, c.model"""
            )
        ]

    def served_model_moves(
        self, since: datetime, until: datetime, source: str = PRODUCTION
    ) -> list[tuple[str, str, str, str, str]]:
        """(model, prompt version, contract, previous, current) for each served model first seen in
        ``[since, until)`` under a cohort of ``source`` answered by another one before: the alias moved."""
        return [
            (str(m), str(p), str(c), str(prev), str(cur))
            for m, p, c, prev, cur in self.query(
                """WITH f AS (SELECT cohort_id, served_model, min(bucket) AS first FROM served_models GROUP BY ALL),
                   moved AS (SELECT n.cohort_id, arg_max(o.served_model, o.first) AS previous,
                                    n.served_model AS current, n.first
                             FROM f n JOIN f o ON o.cohort_id = n.cohort_id AND o.first < n.first
                             WHERE n.first >= ? AND n.first < ? GROUP BY n.cohort_id, n.served_model, n.first)
                   SELECT c.model, c.prompt_version, c.contract, previous, current
                   FROM moved JOIN cohorts c USING (cohort_id) WHERE c.source = ? ORDER BY ALL""",
                [since, until, source],
            )
        ]

    # --- raw events -----------------------------------------------------------------------------

    def events_by_id(self, event_ids: Sequence[str]) -> list[StoredEvent]:
        """The stored events of ``event_ids`` (raw events kept), oldest first; unknown ids left out."""
        ids = list(event_ids)
        return [
            StoredEvent(*r)
            for r in self.query(
                """SELECT e.event_id, e.ts, c.model, c.prompt_version, c.contract, e.served_model, e.contract_version,
                          e.source, e.output FROM events e JOIN cohorts c USING (cohort_id)
                   WHERE e.id_key IN (SELECT md5_number(unnest(?::VARCHAR[])))
                     AND list_contains(?::VARCHAR[], e.event_id)
                   ORDER BY e.ts""",
                [ids, ids],
            )
        ]

    def recent_outputs(
        self, cohort_id: int, since: datetime, until: datetime, limit: int
    ) -> list[tuple[str, str, str | None]]:
        """(event id, output JSON, contract version) of a cohort's newest ``limit`` raw events with
        ``ts`` in the window, newest first; a served cohort's include the alias's it answered."""
        return [
            (str(i), str(o), None if v is None else str(v))
            for i, o, v in self.query(
                """SELECT event_id, output, contract_version FROM cohort_events
                   WHERE cohort_id = ? AND ts >= ? AND ts < ? ORDER BY ts DESC LIMIT ?""",
                [cohort_id, since, until, limit],
            )
        ]

    def contract_versions_of_events(self, cohort_id: int, since: datetime, until: datetime) -> dict[str, int]:
        """A cohort's raw events with ``ts`` in the window per contract version tagged ('' for none)."""
        return {
            str(v): int(n)
            for v, n in self.query(
                """SELECT coalesce(contract_version, ''), count(*) FROM cohort_events
                   WHERE cohort_id = ? AND ts >= ? AND ts < ? GROUP BY ALL""",
                [cohort_id, since, until],
            )
        }
