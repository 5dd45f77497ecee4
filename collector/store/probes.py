"""Probe suite runs (``PROBES_SCHEMA``): one row per run with its three first-decision scores and
their counts, and one row per case with the expected and the actual first decision, stored and
read here as plain rows; ``analysis/probes/`` runs suites, scores them and judges the scores.

A run is *accepted* when every case got an answer from the provider (a run cut short by a
provider outage says nothing about the model): only accepted runs are compared with each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

from .core import StoreCore
from .schema import Schema

__all__ = ["PROBES_SCHEMA", "ProbeCaseRow", "ProbeRecords", "ProbeRunRow"]

PROBES_SCHEMA = Schema(
    "probes",
    (
        """
-- scores: a JSON object, score name -> {"value": float or null, "hits": int, "n": int};
-- thresholds: score name -> the suite's threshold, as the run was judged.
CREATE TABLE probe_runs (
    run_id VARCHAR PRIMARY KEY, suite VARCHAR NOT NULL, model VARCHAR NOT NULL,
    prompt_version VARCHAR NOT NULL, contract VARCHAR NOT NULL, served_model VARCHAR,
    started_at TIMESTAMPTZ NOT NULL, finished_at TIMESTAMPTZ NOT NULL, trigger VARCHAR NOT NULL,
    cases INTEGER NOT NULL, errors INTEGER NOT NULL, accepted BOOLEAN NOT NULL,
    scores VARCHAR NOT NULL, thresholds VARCHAR NOT NULL);
-- expected and actual: JSON, the first decision ({"tool": name or null, "arguments": {...}});
-- failed: the scores this case counted against, comma-separated ('' : none).
CREATE TABLE probe_results (
    run_id VARCHAR NOT NULL, position INTEGER NOT NULL, case_id VARCHAR NOT NULL,
    negative BOOLEAN NOT NULL, expected VARCHAR NOT NULL, actual VARCHAR, error VARCHAR,
    failed VARCHAR NOT NULL, PRIMARY KEY (run_id, position));
""",
    ),
)

_RUN = (
    "run_id, suite, model, prompt_version, contract, served_model, started_at, finished_at, trigger, "
    "cases, errors, accepted, scores, thresholds"
)
_CASE = "run_id, position, case_id, negative, expected, actual, error, failed"


class ProbeRunRow(NamedTuple):
    """A row of ``probe_runs``; ``scores`` and ``thresholds`` are JSON text."""

    run_id: str
    suite: str
    model: str
    prompt_version: str
    contract: str
    served_model: str | None
    started_at: datetime
    finished_at: datetime
    trigger: str
    cases: int
    errors: int
    accepted: bool
    scores: str
    thresholds: str


class ProbeCaseRow(NamedTuple):
    """A row of ``probe_results``; ``expected`` and ``actual`` are JSON text."""

    run_id: str
    position: int
    case_id: str
    negative: bool
    expected: str
    actual: str | None
    error: str | None
    failed: str


class ProbeRecords(StoreCore):
    """Rows of the probe tables."""

    def add_probe_run(self, run: Sequence[Any], cases: Sequence[Sequence[Any]]) -> None:
        """Store one run (``ProbeRunRow`` order) and its cases (``ProbeCaseRow`` order) in one transaction."""
        with self.transaction("recording a probe run") as con:
            con.execute(f"INSERT INTO probe_runs ({_RUN}) VALUES ({', '.join('?' * 14)})", list(run))
            if cases:
                con.executemany(f"INSERT INTO probe_results ({_CASE}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", list(cases))

    def probe_runs(
        self, *, suite: str | None = None, until: datetime | None = None, limit: int = 100
    ) -> list[ProbeRunRow]:
        """Runs, newest first (of one suite; finished before ``until``), at most ``limit``."""
        where: list[str] = []
        params: list[Any] = []
        if suite is not None:
            where.append("suite = ?")
            params.append(suite)
        if until is not None:
            where.append("finished_at < ?")
            params.append(until)
        cond = ("WHERE " + " AND ".join(where)) if where else ""
        return [
            ProbeRunRow(*r)
            for r in self.query(
                f"SELECT {_RUN} FROM probe_runs {cond} ORDER BY finished_at DESC, run_id LIMIT ?", [*params, limit]
            )
        ]

    def probe_suites_latest(self, since: datetime, until: datetime) -> list[tuple[ProbeRunRow, ProbeRunRow | None]]:
        """Per suite, its newest run finished in ``[since, until)`` and the newest accepted run before
        that one (None: none), by suite name."""
        out = []
        for row in self.query(
            f"""SELECT {_RUN} FROM probe_runs WHERE finished_at >= ? AND finished_at < ?
                QUALIFY row_number() OVER (PARTITION BY suite ORDER BY finished_at DESC, run_id) = 1
                ORDER BY suite""",
            [since, until],
        ):
            latest = ProbeRunRow(*row)
            prev = self.query(
                f"""SELECT {_RUN} FROM probe_runs WHERE suite = ? AND accepted AND finished_at < ?
                    ORDER BY finished_at DESC, run_id LIMIT 1""",
                [latest.suite, latest.finished_at],
            )
            out.append((latest, ProbeRunRow(*prev[0]) if prev else None))
        return out

    def probe_run(self, run_id: str) -> ProbeRunRow | None:
        """One run, or None."""
        rows = self.query(f"SELECT {_RUN} FROM probe_runs WHERE run_id = ?", [run_id])
        return ProbeRunRow(*rows[0]) if rows else None

    def probe_results(self, run_id: str) -> list[ProbeCaseRow]:
        """The cases of one run, in the suite's order."""
        return [
            ProbeCaseRow(*r)
            for r in self.query(f"SELECT {_CASE} FROM probe_results WHERE run_id = ? ORDER BY position", [run_id])
        ]
