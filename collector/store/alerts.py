"""The analysis package's records: alerts, their history, silences, analyzer runs and served-model
changes (``ALERTS_SCHEMA``), stored and read here as plain rows; ``analysis/alerts.py`` turns them
into alerts and decides every change.

Writes that must commit with others (an evaluation's alerts, its history, its notifications and
its run record) take ``con``, the connection of the caller's ``Store.transaction``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from .core import StoreCore
from .incidents import INCIDENTS_DDL
from .schema import Schema

__all__ = ["ALERTS_SCHEMA", "ALERT_COLUMNS", "AlertRecords", "AnalyzerRun"]

ALERTS_SCHEMA = Schema(
    "alerts",
    (
        """
CREATE TABLE alerts (
    fingerprint VARCHAR PRIMARY KEY,
    model VARCHAR NOT NULL, prompt_version VARCHAR NOT NULL, contract VARCHAR NOT NULL,
    field VARCHAR NOT NULL, kind VARCHAR NOT NULL, value VARCHAR,
    state VARCHAR NOT NULL, severity VARCHAR NOT NULL, episode INTEGER NOT NULL, streak INTEGER NOT NULL,
    first_seen TIMESTAMPTZ NOT NULL, last_seen TIMESTAMPTZ NOT NULL, fired_at TIMESTAMPTZ,
    resolved_at TIMESTAMPTZ, acknowledged_at TIMESTAMPTZ, acknowledged_by VARCHAR,
    diff VARCHAR NOT NULL, samples VARCHAR NOT NULL);
CREATE SEQUENCE alert_history_seq START 1;
CREATE TABLE alert_history (
    seq BIGINT PRIMARY KEY DEFAULT nextval('alert_history_seq'), fingerprint VARCHAR NOT NULL,
    happened_at TIMESTAMPTZ NOT NULL, from_state VARCHAR, to_state VARCHAR NOT NULL,
    severity VARCHAR NOT NULL, episode INTEGER NOT NULL, detail VARCHAR NOT NULL, actor VARCHAR);
CREATE SEQUENCE silence_seq START 1;
CREATE TABLE silences (
    silence_id BIGINT PRIMARY KEY DEFAULT nextval('silence_seq'),
    fingerprint VARCHAR, model VARCHAR, prompt_version VARCHAR, contract VARCHAR, field VARCHAR, kind VARCHAR,
    starts_at TIMESTAMPTZ NOT NULL, ends_at TIMESTAMPTZ NOT NULL,
    author VARCHAR NOT NULL, reason VARCHAR NOT NULL, created_at TIMESTAMPTZ NOT NULL);
CREATE SEQUENCE analyzer_run_seq START 1;
CREATE TABLE analyzer_runs (
    run_id BIGINT PRIMARY KEY DEFAULT nextval('analyzer_run_seq'),
    started_at TIMESTAMPTZ NOT NULL, finished_at TIMESTAMPTZ NOT NULL, evaluated_at TIMESTAMPTZ NOT NULL,
    ok BOOLEAN NOT NULL, error VARCHAR, duration_seconds DOUBLE NOT NULL,
    cohorts INTEGER NOT NULL, checks INTEGER NOT NULL, breaches INTEGER NOT NULL, report VARCHAR);
CREATE TABLE served_model_changes (
    model VARCHAR NOT NULL, prompt_version VARCHAR NOT NULL, contract VARCHAR NOT NULL,
    previous VARCHAR NOT NULL, current VARCHAR NOT NULL, detected_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (model, prompt_version, contract, previous, current));
""",
        # The source is part of the cohort (schema.py, version 10): alerts stored before are
        # production's.
        """
ALTER TABLE alerts ADD COLUMN source VARCHAR DEFAULT 'production';
""",
        INCIDENTS_DDL,
    ),
)

#: The columns of an alert row, in the order every alert row here has them.
ALERT_COLUMNS = (
    "fingerprint",
    "model",
    "prompt_version",
    "contract",
    "field",
    "kind",
    "value",
    "state",
    "severity",
    "episode",
    "streak",
    "first_seen",
    "last_seen",
    "fired_at",
    "resolved_at",
    "acknowledged_at",
    "acknowledged_by",
    "diff",
    "samples",
    "source",
)
_COLS = ", ".join(ALERT_COLUMNS)
_HISTORY = "fingerprint, happened_at, from_state, to_state, severity, episode, detail, actor"
_SILENCE = "fingerprint, model, prompt_version, contract, field, kind, starts_at, ends_at, author, reason"
_RUN = "started_at, finished_at, evaluated_at, ok, error, duration_seconds, cohorts, checks, breaches, report"
_COHORT = "model = ? AND prompt_version = ? AND contract = ? AND source = ?"


def _cohort(cohort: Sequence[str]) -> list[str]:
    """(model, prompt version, contract[, source]) as query parameters; no source: production."""
    return [*cohort[:3], cohort[3] if len(cohort) > 3 else "production"]


class AnalyzerRun(NamedTuple):
    """A row of ``analyzer_runs`` (the analysis package's table), newest first when listed."""

    run_id: int
    started_at: datetime
    evaluated_at: datetime
    ok: bool
    error: str | None
    duration_seconds: float
    cohorts: int
    checks: int
    breaches: int


class AlertRecords(StoreCore):
    """Rows of the alert tables; a cohort is (model, prompt version, contract, source)."""

    def alert_rows(
        self, *, state: str | None = None, severity: str | None = None, cohort: Sequence[str] | None = None
    ) -> list[tuple[Any, ...]]:
        """Alert rows (``ALERT_COLUMNS``), filtered; page first, then the most recently seen."""
        where, params = [], []
        if state is not None:
            where.append("state = ?")
            params.append(state)
        if severity is not None:
            where.append("severity = ?")
            params.append(severity)
        if cohort is not None:
            where.append(_COHORT)
            params.extend(_cohort(cohort))
        cond = ("WHERE " + " AND ".join(where)) if where else ""
        return self.query(
            f"SELECT {_COLS} FROM alerts {cond} ORDER BY severity = 'page' DESC, last_seen DESC, fingerprint", params
        )

    def alert_row(self, fingerprint: str, con: Any = None) -> tuple[Any, ...] | None:
        """One alert row, or None; read in the transaction ``con`` when given."""
        sql, params = f"SELECT {_COLS} FROM alerts WHERE fingerprint = ?", [fingerprint]
        rows = self.query(sql, params) if con is None else con.execute(sql, params).fetchall()
        return rows[0] if rows else None

    def put_alerts(self, con: Any, rows: Sequence[Sequence[Any]]) -> None:
        """Insert or replace alert rows (``ALERT_COLUMNS``), in the transaction ``con``."""
        if rows:
            con.executemany(
                f"INSERT OR REPLACE INTO alerts ({_COLS}) VALUES ({', '.join('?' * len(ALERT_COLUMNS))})",
                [list(r) for r in rows],
            )

    def add_alert_history(self, con: Any, rows: Sequence[Sequence[Any]]) -> None:
        """Append transitions, (fingerprint, happened_at, from_state, to_state, severity, episode,
        detail, actor) each, in the transaction ``con``."""
        if rows:
            con.executemany(
                f"INSERT INTO alert_history ({_HISTORY}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", [list(r) for r in rows]
            )

    def alert_history(self, fingerprint: str | None = None) -> list[tuple[Any, ...]]:
        """Transitions (as ``add_alert_history`` takes them), of one alert or all, oldest first."""
        cond, params = ("WHERE fingerprint = ?", [fingerprint]) if fingerprint else ("", [])
        return self.query(f"SELECT {_HISTORY} FROM alert_history {cond} ORDER BY seq", params)

    def add_silence(self, row: Sequence[Any], created_at: datetime) -> int:
        """Store a silence, (fingerprint, model, prompt_version, contract, field, kind, starts_at,
        ends_at, author, reason); returns its id."""
        with self.transaction("adding a silence") as con:
            found = con.execute(
                f"INSERT INTO silences ({_SILENCE}, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "RETURNING silence_id",
                [*row, created_at],
            ).fetchone()
        assert found is not None
        return int(found[0])

    def silence_rows(self, *, ending_after: datetime | None = None) -> list[tuple[Any, ...]]:
        """Silences, (silence_id, then as ``add_silence`` takes them), oldest first; with
        ``ending_after`` only those that end later."""
        cond, params = ("WHERE ends_at > ?", [ending_after]) if ending_after else ("", [])
        return self.query(f"SELECT silence_id, {_SILENCE} FROM silences {cond} ORDER BY silence_id", params)

    def end_silence(self, silence_id: int, at: datetime) -> bool:
        """End a silence at ``at`` (one that ended before stays as it was); False when there is
        no silence ``silence_id``."""
        with self.transaction("ending a silence") as con:
            found = con.execute(
                "UPDATE silences SET ends_at = least(ends_at, ?) WHERE silence_id = ? RETURNING silence_id",
                [at, silence_id],
            ).fetchone()
        return found is not None

    def open_page_alerts(
        self, cohort: Sequence[str], window: timedelta, until: datetime
    ) -> list[tuple[str, str, str, datetime]]:
        """(field, kind, value or '', first_seen) of a cohort's unresolved page alerts whose judged
        window, ``[first_seen - window, first_seen)``, starts before ``until``; oldest first."""
        return self.query(
            f"""SELECT field, kind, coalesce(value, ''), first_seen FROM alerts
                WHERE {_COHORT} AND severity = 'page' AND state <> 'resolved' AND first_seen - ? < ?
                ORDER BY first_seen""",
            [*_cohort(cohort), window, until],
        )

    def page_alert_spans(self, cohort: Sequence[str], until: datetime) -> list[tuple[datetime, datetime]]:
        """(first_seen, resolved_at or ``until``) of each of a cohort's page alerts."""
        return self.query(
            f"SELECT first_seen, coalesce(resolved_at, ?) FROM alerts WHERE {_COHORT} AND severity = 'page'",
            [until, *_cohort(cohort)],
        )

    def cohort_alert_events(self, cohort: Sequence[str]) -> list[tuple[Any, ...]]:
        """(field, kind, value, severity, state, fired_at, acknowledged_at, acknowledged_by,
        resolved_at) of a cohort's alerts, page first, then by field and kind."""
        return self.query(
            f"""SELECT field, kind, value, severity, state, fired_at, acknowledged_at, acknowledged_by, resolved_at
                FROM alerts WHERE {_COHORT} ORDER BY severity = 'page' DESC, field, kind""",
            _cohort(cohort),
        )

    def firing_alert_counts(self) -> dict[tuple[str, str, str, str], dict[str, int]]:
        """Firing alerts per cohort (model, prompt version, contract, source) and severity."""
        out: dict[tuple[str, str, str, str], dict[str, int]] = {}
        for m, p, c, s, severity, n in self.query(
            "SELECT model, prompt_version, contract, source, severity, count(*) FROM alerts "
            "WHERE state = 'firing' GROUP BY ALL"
        ):
            out.setdefault((str(m), str(p), str(c), str(s)), {})[str(severity)] = int(n)
        return out

    def unresolved_alert_counts(self) -> dict[tuple[str, str], int]:
        """Alerts not resolved, per (state, severity)."""
        return {
            (str(state), str(severity)): int(n)
            for state, severity, n in self.query(
                "SELECT state, severity, count(*) FROM alerts WHERE state <> 'resolved' GROUP BY ALL"
            )
        }

    def add_served_model_changes(self, con: Any, changes: Sequence[Sequence[str]], detected_at: datetime) -> None:
        """Record alias moves, (model, prompt_version, contract, previous, current) each (as
        ``served_model_moves`` reads them), once per move, in the transaction ``con``."""
        if changes:
            con.executemany(
                "INSERT INTO served_model_changes VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                [[*change, detected_at] for change in changes],
            )

    def served_model_changes(self) -> list[tuple[str, str, str, str, str, datetime]]:
        """(model, prompt_version, contract, previous, current, detected_at) of every recorded move,
        the newest first."""
        return self.query(
            """SELECT model, prompt_version, contract, previous, current, detected_at
               FROM served_model_changes ORDER BY detected_at DESC"""
        )

    def add_analyzer_run(self, con: Any, row: Sequence[Any]) -> None:
        """Record an analyzer run, (started_at, finished_at, evaluated_at, ok, error,
        duration_seconds, cohorts, checks, breaches, report), in the transaction ``con``."""
        con.execute(f"INSERT INTO analyzer_runs ({_RUN}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", list(row))

    def analyzer_runs(self, limit: int) -> list[AnalyzerRun]:
        """The latest ``limit`` analyzer runs, newest first."""
        return [
            AnalyzerRun(*r)
            for r in self.query(
                """SELECT run_id, started_at, evaluated_at, ok, error, duration_seconds, cohorts, checks, breaches
                   FROM analyzer_runs ORDER BY run_id DESC LIMIT ?""",
                [limit],
            )
        ]
