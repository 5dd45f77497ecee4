"""Provider outcomes (a response's finish, refusal, tool call...): counted per cohort and bucket,
a keyed outcome once however often its response is posted."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import duckdb

from ..rules import PRODUCTION
from . import writes
from .writes import Writes

__all__ = ["Outcomes"]


def _look_up(con: duckdb.DuckDBPyConnection, select: str, mark: str, keys: list[str]) -> list[tuple[Any, ...]]:
    """The rows of ``select`` (ending in ``... IN``) for ``keys``, given as ``mark`` each.

    The keys go in as parameters of an IN list, which DuckDB pushes into its scan of the
    key column: the same cost in 200,000 rows as in 4,000,000 (measured, 500 to 40,000
    keys). A join against a subquery of keys, or ``INSERT ... ON CONFLICT``, reads the
    whole key column instead, and grows with the table (see ``Store._stored_hashes``).
    """
    rows: list[tuple[Any, ...]] = []
    step = writes._PROBE_KEYS
    for i in range(0, len(keys), step):
        chunk = keys[i : i + step]
        rows += con.execute(f"{select} ({', '.join([mark] * len(chunk))})", chunk).fetchall()
    return rows


class Outcomes(Writes):
    """Provider outcomes, counted."""

    def record_outcomes(
        self,
        outcomes: Sequence[tuple[str, str, str, datetime, str]],
        *,
        keys: Sequence[str | None] | None = None,
        served: Sequence[str | None] | None = None,
        source: str = PRODUCTION,
    ) -> list[bool]:
        """Count provider outcomes, (model, prompt_version, contract, ts, kind) each; returns,
        in order, whether each was counted.

        An outcome with a key (``keys``, parallel to ``outcomes``) already recorded is
        not counted again: a re-posted response counts once, and a response posted again
        with more outcomes counts only the new ones (the caller's metrics need to know which).
        They count in cohorts of ``source`` (the response's, as its outputs do: a probe's
        truncations must not count against production).
        An outcome whose response was answered by another model than the one requested
        (``served``, parallel too) also counts in that model's cohort, as its outputs do.
        """
        if not outcomes:
            return []
        keys = list(keys) if keys is not None else [None] * len(outcomes)
        answered = list(served) if served is not None else [None] * len(outcomes)
        if len(keys) != len(outcomes) or len(answered) != len(outcomes):
            raise ValueError("keys and served must be parallel to outcomes")
        step = self.bucket_seconds
        with self._write_lock:
            self._pending_cohorts = {}
            with self._transaction("recording provider outcomes") as con:
                wanted = list(dict.fromkeys(k for k in keys if k is not None))
                new: set[str] = set()
                if wanted:  # looked up, then inserted: see _look_up for why not ON CONFLICT
                    seen = {r[0] for r in _look_up(con, "SELECT key FROM outcome_keys WHERE key IN", "?", wanted)}
                    fresh_keys = [k for k in wanted if k not in seen]
                    if fresh_keys:
                        con.execute("INSERT INTO outcome_keys SELECT unnest($keys), now()", {"keys": fresh_keys})
                    new = set(fresh_keys)
                counts: dict[tuple[tuple[str, str, str, str], int, str], int] = {}
                first_ts: dict[tuple[str, str, str, str], datetime] = {}
                counted = [False] * len(outcomes)
                for i, ((model, prompt_version, contract, ts, kind), okey, other) in enumerate(
                    zip(outcomes, keys, answered, strict=True)
                ):
                    if okey is not None:
                        if okey not in new:
                            continue
                        new.discard(okey)  # a key repeated within one call counts once too
                    counted[i] = True
                    epoch = int(ts.timestamp())
                    for m in (model,) if other is None or other == model else (model, other):
                        cohort = (m, prompt_version, contract, source)
                        first_ts.setdefault(cohort, ts)
                        bucket_key = (cohort, epoch - epoch % step, kind)
                        counts[bucket_key] = counts.get(bucket_key, 0) + 1
                if not counts:
                    return counted
                ids = self._cohort_ids(con, first_ts)
                con.executemany(
                    """INSERT INTO outcomes VALUES (?, to_timestamp(?), ?, ?)
                       ON CONFLICT DO UPDATE SET n = n + excluded.n""",
                    [[ids[c], epoch, kind, n] for (c, epoch, kind), n in counts.items()],
                )
            self._cohorts.update(self._pending_cohorts)
        return counted
