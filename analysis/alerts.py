"""Alerts and their lifecycle: one alert per fingerprint, pending -> firing -> resolved.

The fingerprint is (cohort, field, kind, value): an alert is created once and
then moved by each evaluation, never duplicated. ``step`` is the whole
lifecycle as a pure function of the previous states and one evaluation's
checks, so the service (states in DuckDB, ``AlertBook``) and an offline
``analyze --once`` (states in memory) judge alike:

- a breach opens an alert as ``pending``; a page-severity breach must hold
  ``confirm_evaluations`` evaluations in a row before it fires (a warn fires at
  once); a pending alert whose breach does not hold goes back to resolved;
- a firing alert resolves after ``resolve_evaluations`` evaluations in a row
  in which it is *clear*: effect under ``threshold * hysteresis`` or no longer
  significant. Between the two thresholds it keeps firing: a value hovering at
  the threshold does not flap;
- a field that could not be judged (too few samples, no traffic) keeps its state;
- firing again after a resolve is a new episode (a new incident for the pager).

Acknowledgement and silences change who is told, never the state: a
silenced alert still resolves. Every transition is kept in ``alert_history``.

>>> book = AlertBook(store, config)                       # doctest: +SKIP
>>> changes = book.apply(evaluation)                      # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from dataclasses import field as dc_field
from datetime import datetime
from enum import Enum
from typing import TYPE_CHECKING, Any

import orjson

from shapewatch.baselines import Cohort
from shapewatch.collector import PRODUCTION, Store
from shapewatch.collector.store import ALERTS_SCHEMA

from .config import AlertKind, AnalyzerConfig, Severity
from .errors import AlertError, AlertNotFound

if TYPE_CHECKING:  # rules pulls in scipy, which bulk import (opening the store) must not pay for
    from .rules import Check

__all__ = [
    "ALERTS_SCHEMA",
    "Alert",
    "AlertBook",
    "AlertState",
    "Judged",
    "Silence",
    "Transition",
    "fingerprint",
    "step",
]


class AlertState(str, Enum):
    pending = "pending"
    firing = "firing"
    resolved = "resolved"


def fingerprint(cohort: Cohort, path: str, kind: AlertKind, value: str | None) -> str:
    """The identity of an alert: the same change on the same field of the same cohort.

    A production cohort's is what it was before the source was part of the cohort (its three
    names), so alerts open at an upgrade keep their identity."""
    names = cohort[:3] if cohort.source == PRODUCTION else cohort
    raw = orjson.dumps([*names, path, kind.value, value])
    return hashlib.sha256(raw).hexdigest()[:24]


@dataclass(frozen=True)
class Alert:
    """One alert and everything that answers *what changed*."""

    fingerprint: str
    cohort: Cohort
    field: str
    kind: AlertKind
    value: str | None
    state: AlertState
    severity: Severity
    episode: int  # firing episodes so far (a fire after a resolve is a new one)
    streak: int  # consecutive breaches while pending, consecutive clears while firing
    first_seen: datetime
    last_seen: datetime  # the last evaluation that found the breach
    fired_at: datetime | None
    resolved_at: datetime | None
    acknowledged_at: datetime | None = None
    acknowledged_by: str | None = None
    diff: dict[str, Any] = dc_field(default_factory=dict)  # baseline, current, p_value, effect, detail, ...
    samples: tuple[str, ...] = ()  # event ids that show the change
    silenced_until: datetime | None = None  # filled in when read, from the silences table
    incident_id: str | None = None  # filled in when read: the incident it paged in (analysis/incidents.py)

    @property
    def detail(self) -> str:
        return str(self.diff.get("detail", ""))

    def to_json(self) -> dict[str, Any]:
        """The alert as the API, the CLI and the pager carry it (README, *Analyzer and alerts*)."""
        d = self.diff
        return {
            "cohort": self.cohort._asdict(),
            "field": self.field,
            "kind": self.kind.value,
            "value": self.value,
            "severity": self.severity.value,
            "state": self.state.value,
            "fingerprint": self.fingerprint,
            "episode": self.episode,
            "baseline": d.get("baseline", {}),
            "current": d.get("current", {}),
            "p_value": d.get("p_value"),
            "q_value": d.get("q_value"),
            "effect": d.get("effect"),
            "threshold": d.get("threshold"),
            "detail": self.detail,
            "baseline_id": d.get("baseline_id"),
            "compared_with": d.get("compared_with"),
            # contract versions live in the window and the baseline, and those first seen in the window
            "contracts": d.get("contracts", {}),
            # the window the change was judged on ("15m", "24h"): short windows page large changes fast
            "window": d.get("window"),
            "first_seen": _iso(self.first_seen),
            "last_seen": _iso(self.last_seen),
            "fired_at": _iso(self.fired_at),
            "resolved_at": _iso(self.resolved_at),
            "acknowledged_at": _iso(self.acknowledged_at),
            "acknowledged_by": self.acknowledged_by,
            "silenced_until": _iso(self.silenced_until),
            "samples": list(self.samples),
            # on-call context (analysis/oncall.py): since when, which model, where to look, what to do
            "onset": d.get("onset"),
            "served_models": d.get("served_models"),
            "links": d.get("links") or {"dashboard": None, "runbook": None},
            "incident_id": self.incident_id,
        }


def _iso(t: datetime | None) -> str | None:
    return None if t is None else t.isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class Transition:
    """One change of state, as recorded in the history and told to notifiers."""

    alert: Alert
    previous: AlertState | None
    notify: bool  # a state or severity change a pager must hear about


@dataclass(frozen=True)
class Judged:
    """One evaluated cohort as the lifecycle needs it: its checks and what could not be judged."""

    cohort: Cohort
    checks: Sequence[Check]
    insufficient: frozenset[str]  # field paths with too few samples
    baseline_id: str | None  # None: judged by declared assertions only
    compared_with: str  # words for the alert: which baseline, own or inherited
    contracts: dict[str, Any] = dc_field(default_factory=dict)  # the contract versions live (analyzer.CohortReport)
    served_models: dict[str, Any] | None = None  # window and baseline shares, new ones (oncall.served_models)
    # only the checks given were judged: the cohort's other alerts keep their state (a silent cohort)
    partial: bool = False


def _pvalue_text(q: float) -> str:
    return "p < 1e-6" if q < 1e-6 else f"p = {q:.2g}"


def _diff(check: Check, judged: Judged) -> dict[str, Any]:
    return {
        "baseline": check.baseline,
        "current": check.current,
        "p_value": check.p_value,
        "q_value": check.q_value,
        "effect": round(check.effect, 6),
        "threshold": check.threshold,
        "detail": f"{check.detail} ({_pvalue_text(check.q_value)})",
        "baseline_id": judged.baseline_id,
        "compared_with": judged.compared_with,
        "contracts": judged.contracts,
        "window": check.window,
        **({"served_models": judged.served_models} if judged.served_models is not None else {}),
    }


#: Keys of an alert's diff found once, when it opens, and kept while it is open.
_KEPT = ("onset", "links")


def _kept(old: Alert, diff: dict[str, Any]) -> dict[str, Any]:
    return {**diff, **{k: old.diff[k] for k in _KEPT if old.diff.get(k) is not None}}


def step(
    alerts: dict[str, Alert], evaluated: Iterable[Judged], config: AnalyzerConfig, now: datetime
) -> tuple[dict[str, Alert], list[Transition]]:
    """The lifecycle for one evaluation: the new states of every alert it touched, and the transitions.

    ``alerts`` holds the open (pending or firing) and resolved alerts by fingerprint;
    alerts of cohorts not in ``evaluated`` are left as they are.
    """
    changed: dict[str, Alert] = {}
    moves: list[Transition] = []
    for judged in evaluated:
        seen: set[str] = set()
        for check in judged.checks:
            fp = fingerprint(judged.cohort, check.field, check.kind, check.value)
            seen.add(fp)
            old = alerts.get(fp)
            new = _judge(old, check, judged, config, now, fp)
            if new is not None and new != old:
                changed[fp] = new
                if (
                    old is None
                    or new.state is not old.state
                    or (new.state is AlertState.firing and new.severity is not old.severity)
                ):
                    # Told: firing (or its severity changing), and a resolve of what fired.
                    # A pending alert that never fired is nobody's news.
                    moves.append(
                        Transition(
                            new,
                            old.state if old else None,
                            notify=new.state is AlertState.firing
                            or (old is not None and old.state is AlertState.firing),
                        )
                    )
        for fp, old in alerts.items():
            if fp in seen or old.cohort != judged.cohort or old.state is AlertState.resolved:
                continue
            if old.field in judged.insufficient:
                continue  # not judged: keep the state
            if judged.partial and old.kind is not AlertKind.traffic_stopped:
                continue  # only the traffic was judged
            new = _clear(old, config, now)  # no check: the condition is gone
            if new != old:
                changed[fp] = new
                if new.state is not old.state:
                    moves.append(Transition(new, old.state, notify=old.state is AlertState.firing))
    return changed, moves


def _judge(
    old: Alert | None, check: Check, judged: Judged, config: AnalyzerConfig, now: datetime, fp: str
) -> Alert | None:
    severity = check.effective_severity
    if check.breach:
        diff = _diff(check, judged)
        needed = config.confirm_evaluations if severity is Severity.page else 1
        if old is None or old.state is AlertState.resolved:
            base = old or Alert(
                fp,
                judged.cohort,
                check.field,
                check.kind,
                check.value,
                AlertState.pending,
                severity,
                0,
                0,
                now,
                now,
                None,
                None,
            )
            new = replace(
                base,
                state=AlertState.pending,
                severity=severity,
                streak=1,
                last_seen=now,
                diff=diff,
                first_seen=now if old is None else old.first_seen,
                resolved_at=None,
                acknowledged_at=None,
                acknowledged_by=None,
                samples=(),
            )
        elif old.state is AlertState.pending:
            new = replace(old, severity=severity, streak=old.streak + 1, last_seen=now, diff=_kept(old, diff))
        else:  # firing: stays, the clear streak starts over; a severity can rise (unknown growth)
            return replace(old, severity=severity, streak=0, last_seen=now, diff=_kept(old, diff))
        if new.streak >= needed:
            new = replace(new, state=AlertState.firing, episode=new.episode + 1, fired_at=now, streak=0)
        return new
    if old is None or old.state is AlertState.resolved:
        return None
    clear = check.effect < check.threshold * config.hysteresis or check.q_value >= check.alpha
    if old.state is AlertState.pending or clear:
        return _clear(replace(old, diff=_kept(old, _diff(check, judged))), config, now)
    return replace(old, streak=0, diff=_kept(old, _diff(check, judged)))  # in the hysteresis band: keeps firing


def _clear(old: Alert, config: AnalyzerConfig, now: datetime) -> Alert:
    if old.state is AlertState.pending:
        return replace(old, state=AlertState.resolved, resolved_at=now, streak=0)
    streak = old.streak + 1
    if streak >= config.resolve_evaluations:
        return replace(old, state=AlertState.resolved, resolved_at=now, streak=0)
    return replace(old, streak=streak)


# --- persistence ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Silence:
    silence_id: int
    fingerprint: str | None
    model: str | None
    prompt_version: str | None
    contract: str | None
    field: str | None
    kind: str | None
    starts_at: datetime
    ends_at: datetime
    author: str
    reason: str

    def matches(self, a: Alert, now: datetime) -> bool:
        if not self.starts_at <= now < self.ends_at:
            return False
        wanted = [
            (self.fingerprint, a.fingerprint),
            (self.model, a.cohort.model),
            (self.prompt_version, a.cohort.prompt_version),
            (self.contract, a.cohort.contract),
            (self.field, a.field),
            (self.kind, a.kind.value),
        ]
        return all(w is None or w == v for w, v in wanted)


def _alert_of(r: Sequence[Any]) -> Alert:
    return Alert(
        r[0],
        Cohort(r[1], r[2], r[3], r[19]),
        r[4],
        AlertKind(r[5]),
        r[6],
        AlertState(r[7]),
        Severity(r[8]),
        int(r[9]),
        int(r[10]),
        r[11],
        r[12],
        r[13],
        r[14],
        r[15],
        r[16],
        orjson.loads(r[17]),
        tuple(orjson.loads(r[18])),
    )


def _row_of(a: Alert) -> list[Any]:
    return [
        a.fingerprint,
        *a.cohort[:3],
        a.field,
        a.kind.value,
        a.value,
        a.state.value,
        a.severity.value,
        a.episode,
        a.streak,
        a.first_seen,
        a.last_seen,
        a.fired_at,
        a.resolved_at,
        a.acknowledged_at,
        a.acknowledged_by,
        orjson.dumps(a.diff).decode(),
        orjson.dumps(list(a.samples)).decode(),
        a.cohort.source,
    ]


class AlertBook:
    """Alerts kept in the store: read them, apply an evaluation, acknowledge, silence.

    >>> AlertBook(store).alerts(state=AlertState.firing)      # doctest: +SKIP
    """

    def __init__(self, store: Store) -> None:
        self.store = store

    def alerts(
        self,
        *,
        state: AlertState | None = None,
        severity: Severity | None = None,
        cohort: Cohort | None = None,
        now: datetime | None = None,
    ) -> list[Alert]:
        """Alerts, page first, then most recently seen; with silences filled in."""
        rows = self.store.alert_rows(
            state=None if state is None else state.value,
            severity=None if severity is None else severity.value,
            cohort=cohort,
        )
        alerts = self._with_incidents([_alert_of(r) for r in rows])
        if now is None:
            return alerts
        silences = self.silences(now=now)
        return [
            replace(a, silenced_until=max((s.ends_at for s in silences if s.matches(a, now)), default=None))
            for a in alerts
        ]

    def open_alerts(self) -> dict[str, Alert]:
        """Every alert by fingerprint (the state ``step`` starts from)."""
        return {r[0]: _alert_of(r) for r in self.store.alert_rows()}

    def get(self, fp: str) -> Alert | None:
        row = self.store.alert_row(fp)
        return None if row is None else self._with_incidents([_alert_of(row)])[0]

    def _with_incidents(self, alerts: list[Alert]) -> list[Alert]:
        found = self.store.incident_of([a.fingerprint for a in alerts if a.episode > 0])
        return [replace(a, incident_id=found.get(a.fingerprint)) for a in alerts] if found else alerts

    def history(self, fp: str | None = None) -> list[dict[str, Any]]:
        return [
            {
                "fingerprint": r[0],
                "at": _iso(r[1]),
                "from": r[2],
                "to": r[3],
                "severity": r[4],
                "episode": r[5],
                "detail": r[6],
                "actor": r[7],
            }
            for r in self.store.alert_history(fp)
        ]

    def save(self, con: Any, changed: dict[str, Alert], moves: Sequence[Transition], now: datetime) -> None:
        """Write changed alerts and their transitions (inside the caller's transaction)."""
        self.store.put_alerts(con, [_row_of(a) for a in changed.values()])
        self.store.add_alert_history(
            con,
            [
                [
                    m.alert.fingerprint,
                    now,
                    m.previous.value if m.previous else None,
                    m.alert.state.value,
                    m.alert.severity.value,
                    m.alert.episode,
                    m.alert.detail,
                    None,
                ]
                for m in moves
            ],
        )

    def acknowledge(self, fp: str, *, by: str, now: datetime) -> Alert:
        with self.store.transaction("acknowledging an alert") as con:
            row = self.store.alert_row(fp, con)
            if row is None:
                raise AlertNotFound(fp)
            a = replace(_alert_of(row), acknowledged_at=now, acknowledged_by=by)
            self.save(con, {fp: a}, [], now)
            self.store.add_alert_history(
                con, [[fp, now, a.state.value, a.state.value, a.severity.value, a.episode, "acknowledged", by]]
            )
        return a

    def silence(
        self,
        *,
        starts_at: datetime,
        ends_at: datetime,
        author: str,
        reason: str,
        fingerprint: str | None = None,
        model: str | None = None,
        prompt_version: str | None = None,
        contract: str | None = None,
        field: str | None = None,
        kind: str | None = None,
    ) -> Silence:
        if ends_at <= starts_at:
            raise AlertError("a silence must end after it starts")
        if not reason.strip():
            raise AlertError("a silence needs a reason")
        if not any((fingerprint, model, prompt_version, contract, field, kind)):
            raise AlertError(
                "a silence must match something: a fingerprint, or a model, prompt version, contract, field or kind"
            )
        match = (fingerprint, model, prompt_version, contract, field, kind)
        silence_id = self.store.add_silence((*match, starts_at, ends_at, author, reason), starts_at)
        return Silence(silence_id, *match, starts_at, ends_at, author, reason)

    def silences(self, *, now: datetime | None = None) -> list[Silence]:
        return [Silence(*r) for r in self.store.silence_rows(ending_after=now)]
