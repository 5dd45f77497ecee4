"""The notification outbox (``NOTIFY_SCHEMA``): rows written in the transaction that changes an
alert's state, delivered afterwards by ``analysis/notify.py``, which decides what to send and when;
the SQL over the table is here.

A row's key is (target, fingerprint, episode, action); only a pending row ever changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from .core import StoreCore
from .schema import Schema

__all__ = ["NOTIFY_SCHEMA", "OutboxRecords", "add_notification", "trigger_started"]

_V1 = """
-- The notification outbox: rows are written in the transaction that changes an alert's
-- state and delivered afterwards, so neither a crash nor a retry loses or doubles a page.
CREATE TABLE notifications (
    target VARCHAR NOT NULL,            -- Target.name in the configuration
    fingerprint VARCHAR NOT NULL,       -- the alert's fingerprint, the pager's dedup key
    episode INTEGER NOT NULL,           -- 1, 2, ...: each firing of an alert is its own incident
    action VARCHAR NOT NULL,            -- trigger | resolve
    payload VARCHAR NOT NULL,           -- JSON: severity, summary, alert, dashboard_url, started_at, ended_at
    created_at TIMESTAMPTZ NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at TIMESTAMPTZ NOT NULL,
    state VARCHAR NOT NULL DEFAULT 'pending',  -- pending | sent | failed
    last_error VARCHAR,
    sent_at TIMESTAMPTZ,
    PRIMARY KEY (target, fingerprint, episode, action));
"""

#: The outbox table; open the store with ``Store.open(path, schemas=[NOTIFY_SCHEMA, ...])``.
NOTIFY_SCHEMA = Schema("notify", (_V1,))

_KEY = "target = ? AND fingerprint = ? AND episode = ? AND action = ?"


# Written in the transaction that changes the alerts (its connection, ``con``), so an alert's
# state and its notifications commit together: functions of the connection, not of the store.


def trigger_started(con: Any, target: str, fingerprint: str, episode: int) -> datetime | None:
    """When the trigger of an episode was queued for ``target``, if it is pending or sent (read in
    the transaction ``con``); None when it never was or failed."""
    row = con.execute(
        """SELECT created_at FROM notifications
           WHERE target = ? AND fingerprint = ? AND episode = ? AND action = 'trigger'
             AND state IN ('pending', 'sent')""",
        [target, fingerprint, episode],
    ).fetchone()
    return None if row is None else row[0]


def add_notification(con: Any, key: Sequence[Any], payload: str, created_at: datetime) -> bool:
    """Queue a notification (pending, due now), in the transaction ``con``, unless its key is
    queued already; True when it was new."""
    return bool(
        con.execute(
            """INSERT INTO notifications (target, fingerprint, episode, action, payload, created_at,
                                          attempts, next_attempt_at, state)
               VALUES (?, ?, ?, ?, ?, ?, 0, ?, 'pending') ON CONFLICT DO NOTHING RETURNING 1""",
            [*key, payload, created_at, created_at],
        ).fetchall()
    )


class OutboxRecords(StoreCore):
    """Rows of the notification outbox."""

    def pending_notifications(self, targets: Sequence[str]) -> list[tuple[Any, ...]]:
        """(target, fingerprint, episode, action, payload, created_at, attempts, next_attempt_at) of
        the pending rows of ``targets``, by key, a resolve after its trigger."""
        return self.query(
            """SELECT target, fingerprint, episode, action, payload, created_at, attempts, next_attempt_at
               FROM notifications WHERE state = 'pending' AND list_contains(?::VARCHAR[], target)
               ORDER BY target, fingerprint, episode, action = 'resolve'""",
            [list(targets)],
        )

    def pending_by_target(self) -> dict[str, tuple[int, datetime]]:
        """Pending rows per target: how many, and when the oldest was queued."""
        return {
            str(t): (int(n), first)
            for t, n, first in self.query(
                "SELECT target, count(*), min(created_at) FROM notifications WHERE state = 'pending' GROUP BY target"
            )
        }

    def pending_elsewhere(self, targets: Sequence[str]) -> list[tuple[str, int]]:
        """(target, pending rows) of the targets not in ``targets``, by target."""
        return [
            (str(t), int(n))
            for t, n in self.query(
                """SELECT target, count(*) FROM notifications
                   WHERE state = 'pending' AND NOT list_contains(?::VARCHAR[], target) GROUP BY target ORDER BY target""",
                [list(targets)],
            )
        ]

    def open_triggers(self, targets: Sequence[str]) -> list[tuple[Any, ...]]:
        """(target, fingerprint, episode, payload) of the triggers of ``targets`` sent and not
        followed by a resolve (pending or sent): what a receiver that forgets alerts it does not
        hear again (Alertmanager) must be told again."""
        return self.query(
            """SELECT t.target, t.fingerprint, t.episode, t.payload FROM notifications t
               WHERE t.action = 'trigger' AND t.state = 'sent' AND list_contains(?::VARCHAR[], t.target)
                 AND NOT EXISTS (SELECT 1 FROM notifications r
                                 WHERE r.target = t.target AND r.fingerprint = t.fingerprint
                                   AND r.episode = t.episode AND r.action = 'resolve' AND r.state <> 'failed')
               ORDER BY t.target, t.fingerprint, t.episode""",
            [list(targets)],
        )

    def notification_sent(self, key: Sequence[Any], at: datetime) -> None:
        """A pending row was delivered: one more attempt, sent at ``at``."""
        self._update_pending(key, "marking a notification sent", "state = 'sent', sent_at = ?", [at])

    def notification_retry(self, key: Sequence[Any], due: datetime, error: str | None) -> None:
        """A pending row's attempt failed and is tried again at ``due``."""
        self._update_pending(
            key, "scheduling a notification retry", "next_attempt_at = ?, last_error = ?", [due, error]
        )

    def notification_failed(self, key: Sequence[Any], error: str) -> None:
        """A pending row's attempt failed for good."""
        self._update_pending(key, "marking a notification failed", "state = 'failed', last_error = ?", [error])

    def _update_pending(self, key: Sequence[Any], doing: str, assignments: str, params: list[Any]) -> None:
        # Only a pending row changes: a pass never overwrites what another recorded.
        with self.transaction(doing) as con:
            con.execute(
                f"UPDATE notifications SET attempts = attempts + 1, {assignments} WHERE {_KEY} AND state = 'pending'",
                [*params, *key],
            )
