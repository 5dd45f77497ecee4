"""Incidents (the second step of ``ALERTS_SCHEMA``) and the per-bucket series the onset search
reads; ``analysis/incidents.py`` and ``analysis/onset.py`` decide what they mean, the SQL is here.

An incident groups the page alerts of one cohort (or one field of it) that fire while it is
open: the pager hears one trigger and one resolve per incident, not per alert. Its members are
kept with when each joined and resolved, so an incident resolves when its last member does.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from .core import StoreCore

__all__ = ["INCIDENTS_DDL", "IncidentRecords", "add_incident", "add_incident_member", "open_incident", "resolve_member"]

INCIDENTS_DDL = """
-- Incidents: page alerts of one group (a cohort, or a field of it) that fire while one is open
-- join it; the pager's dedup key is the incident id, so it hears one trigger and one resolve.
CREATE TABLE incidents (
    incident_id VARCHAR PRIMARY KEY,
    group_key VARCHAR NOT NULL,         -- JSON: [model, prompt_version, contract] or [..., field]
    opened_at TIMESTAMPTZ NOT NULL,
    resolved_at TIMESTAMPTZ,            -- NULL while open
    summary VARCHAR NOT NULL);
CREATE TABLE incident_alerts (
    incident_id VARCHAR NOT NULL,
    fingerprint VARCHAR NOT NULL,       -- a member alert
    joined_at TIMESTAMPTZ NOT NULL,
    resolved_at TIMESTAMPTZ,            -- NULL while the member fires
    PRIMARY KEY (incident_id, fingerprint));
"""

# Written in the evaluation's transaction (``con``): alerts, incidents and notifications commit together.


def open_incident(con: Any, group_key: str) -> str | None:
    """The open incident of a group, if any (read in the transaction ``con``)."""
    row = con.execute(
        "SELECT incident_id FROM incidents WHERE group_key = ? AND resolved_at IS NULL ORDER BY opened_at DESC LIMIT 1",
        [group_key],
    ).fetchone()
    return None if row is None else str(row[0])


def add_incident(con: Any, incident_id: str, group_key: str, opened_at: datetime, summary: str) -> None:
    """Open an incident (in the transaction ``con``)."""
    con.execute(
        "INSERT INTO incidents (incident_id, group_key, opened_at, resolved_at, summary) VALUES (?, ?, ?, NULL, ?)",
        [incident_id, group_key, opened_at, summary],
    )


def add_incident_member(con: Any, incident_id: str, fingerprint: str, at: datetime) -> bool:
    """An alert joins an incident (or fires again inside it); True when it was not a firing member."""
    row = con.execute(
        "SELECT resolved_at FROM incident_alerts WHERE incident_id = ? AND fingerprint = ?", [incident_id, fingerprint]
    ).fetchone()
    if row is not None and row[0] is None:
        return False
    con.execute(
        """INSERT INTO incident_alerts (incident_id, fingerprint, joined_at, resolved_at) VALUES (?, ?, ?, NULL)
           ON CONFLICT DO UPDATE SET resolved_at = NULL""",
        [incident_id, fingerprint, at],
    )
    return True


def resolve_member(con: Any, fingerprint: str, at: datetime) -> list[tuple[str, bool]]:
    """A member alert resolved: (incident id, whether the incident has no firing member left)
    for each open incident it belonged to; such incidents are closed at ``at``."""
    ids = [
        str(r[0])
        for r in con.execute(
            """SELECT m.incident_id FROM incident_alerts m JOIN incidents i USING (incident_id)
               WHERE m.fingerprint = ? AND m.resolved_at IS NULL AND i.resolved_at IS NULL""",
            [fingerprint],
        ).fetchall()
    ]
    out = []
    for incident_id in ids:
        con.execute(
            "UPDATE incident_alerts SET resolved_at = ? WHERE incident_id = ? AND fingerprint = ?",
            [at, incident_id, fingerprint],
        )
        (firing,) = con.execute(
            "SELECT count(*) FROM incident_alerts WHERE incident_id = ? AND resolved_at IS NULL", [incident_id]
        ).fetchone()
        if not firing:
            con.execute("UPDATE incidents SET resolved_at = ? WHERE incident_id = ?", [at, incident_id])
        out.append((incident_id, not firing))
    return out


def incident_members(con: Any, incident_id: str) -> list[tuple[str, datetime, datetime | None]]:
    """(fingerprint, joined_at, resolved_at) of an incident's members, in the order they joined."""
    return [
        (str(fp), joined, resolved)
        for fp, joined, resolved in con.execute(
            "SELECT fingerprint, joined_at, resolved_at FROM incident_alerts WHERE incident_id = ? "
            "ORDER BY joined_at, fingerprint",
            [incident_id],
        ).fetchall()
    ]


class IncidentRecords(StoreCore):
    """Incidents and the bucket series of one field, read outside a transaction."""

    def incident_of(self, fingerprints: Sequence[str]) -> dict[str, str]:
        """The latest incident each alert belongs to (alerts that never paged left out)."""
        if not fingerprints:
            return {}
        return {
            str(fp): str(i)
            for fp, i in self.query(
                """SELECT fingerprint, arg_max(m.incident_id, m.joined_at) FROM incident_alerts m
                   WHERE list_contains(?::VARCHAR[], fingerprint) GROUP BY fingerprint""",
                [list(fingerprints)],
            )
        }

    def incident_rows(self, *, open_only: bool = False, limit: int = 200) -> list[tuple[Any, ...]]:
        """(incident_id, group_key, opened_at, resolved_at, summary, [fingerprints]) newest first."""
        where = "WHERE i.resolved_at IS NULL" if open_only else ""
        return self.query(
            f"""SELECT i.incident_id, i.group_key, i.opened_at, i.resolved_at, i.summary,
                       list(m.fingerprint ORDER BY m.joined_at, m.fingerprint)
                FROM incidents i LEFT JOIN incident_alerts m USING (incident_id) {where}
                GROUP BY ALL ORDER BY i.opened_at DESC, i.incident_id LIMIT ?""",
            [limit],
        )

    def field_buckets(
        self, cohort_id: int, path: str, since: datetime, until: datetime, step_seconds: int
    ) -> list[tuple[Any, ...]]:
        """One field of one cohort per step of ``[since, until)``, for the onset search:
        (step start, events, present, n_null, n_boolean, n_integer, n_number, n_string, n_array,
        n_object), oldest first; steps without events left out. Reads the rollups as merged:
        flush them first for the newest events."""
        step = int(step_seconds)
        return self.query(
            f"""WITH e AS (
                    SELECT to_timestamp(epoch(bucket)::BIGINT // {step} * {step}) AS t, sum(events)::BIGINT AS events
                    FROM cohort_buckets WHERE cohort_id = ? AND bucket >= ? AND bucket < ? GROUP BY ALL),
                f AS (
                    SELECT to_timestamp(epoch(bucket)::BIGINT // {step} * {step}) AS t,
                           sum(present)::BIGINT AS present, sum(n_null)::BIGINT AS n_null,
                           sum(n_boolean)::BIGINT AS n_boolean, sum(n_integer)::BIGINT AS n_integer,
                           sum(n_number)::BIGINT AS n_number, sum(n_string)::BIGINT AS n_string,
                           sum(n_array)::BIGINT AS n_array, sum(n_object)::BIGINT AS n_object
                    FROM field_rollups WHERE cohort_id = ? AND path = ? AND bucket >= ? AND bucket < ? GROUP BY ALL)
                SELECT e.t, e.events, coalesce(f.present, 0), coalesce(f.n_null, 0), coalesce(f.n_boolean, 0),
                       coalesce(f.n_integer, 0), coalesce(f.n_number, 0), coalesce(f.n_string, 0),
                       coalesce(f.n_array, 0), coalesce(f.n_object, 0)
                FROM e LEFT JOIN f USING (t) WHERE e.events > 0 ORDER BY e.t""",
            [cohort_id, since, until, cohort_id, path, since, until],
        )

    def value_buckets(
        self, cohort_id: int, path: str, since: datetime, until: datetime, step_seconds: int
    ) -> list[tuple[datetime, str, int]]:
        """(step start, value, n) of one field's short strings per step of ``[since, until)``."""
        step = int(step_seconds)
        return [
            (t, str(v), int(n))
            for t, v, n in self.query(
                f"""SELECT to_timestamp(epoch(bucket)::BIGINT // {step} * {step}) AS t, value, sum(n)::BIGINT
                    FROM value_rollups WHERE cohort_id = ? AND path = ? AND bucket >= ? AND bucket < ?
                    GROUP BY ALL ORDER BY t""",
                [cohort_id, path, since, until],
            )
        ]

    def last_events(self) -> dict[int, datetime]:
        """The start of the newest rollup bucket holding an event, per cohort id (merged rollups)."""
        return {int(c): t for c, t in self.query("SELECT cohort_id, max(bucket) FROM cohort_buckets GROUP BY ALL")}

    def events_total(self) -> dict[int, int]:
        """Events counted per cohort id since the first (the rollups: raw events may be purged)."""
        return {
            int(c): int(n)
            for c, n in self.query("SELECT cohort_id, sum(events)::BIGINT FROM cohort_buckets GROUP BY ALL")
        }
