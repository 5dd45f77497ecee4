"""Incidents: what the pager hears. Page alerts of one cohort (``[oncall] grouping = "cohort"``, the
default) or of one field of it (``"field"``) that fire while an incident of theirs is open join
it; the pager gets one trigger when the incident opens (its dedup key is the incident id), whose
details list every alert of that evaluation and whose summary names the worst, and one resolve
when the last of its alerts resolves.

Related facts about one field are one alert before they are one incident: ``fold_related`` folds
the ``new_enum_value`` checks of a field into its breaching ``unknown_enum_growth`` check (the new
values are the growth), so the on-call engineer reads one alert carrying both.

Warn alerts are not grouped: a target that takes warn notices hears each as before.

>>> with store.transaction("recording an evaluation") as con:                        # doctest: +SKIP
...     notices = incident_notices(con, moves, now, grouping=Grouping.cohort, silenced=lambda a: False)
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

import orjson

from shapewatch.collector.store.incidents import add_incident, add_incident_member, open_incident, resolve_member

from .alerts import Alert, AlertState, Transition
from .config import AlertKind, Grouping, Severity
from .notify import Notice, NoticeAction, notice_for, summarize_alert

if TYPE_CHECKING:
    from .rules import Check

__all__ = ["fold_related", "group_key", "incident_id", "incident_notices", "worst_alert"]

_MEMBERS_SENT = 50  # alerts listed in one page's details; the rest are counted


def fold_related(checks: Sequence[Check]) -> list[Check]:
    """One cohort's checks with each field's ``new_enum_value`` checks folded into its breaching
    ``unknown_enum_growth`` check: the growth's ``current["new_values"]`` lists them (value ->
    count) and its detail names them, and a new value declared ``page`` makes it a page. A field
    without a breaching growth keeps its new-value checks."""
    growth = {c.field: c for c in checks if c.kind is AlertKind.unknown_enum_growth and c.breach}
    if not growth:
        return list(checks)
    folded: dict[str, list[Check]] = {}
    out: list[Check] = []
    for c in checks:
        if c.kind is AlertKind.new_enum_value and c.field in growth:
            folded.setdefault(c.field, []).append(c)
        else:
            out.append(c)
    for i, c in enumerate(out):
        news = folded.get(c.field) if c.kind is AlertKind.unknown_enum_growth else None
        if news:
            values = {str(n.value): n.current.get("count") for n in sorted(news, key=lambda n: str(n.value))}
            # a page declared for a new value stays a page in the folded alert
            page = any(n.effective_severity is Severity.page for n in news)
            out[i] = replace(
                c,
                current={**c.current, "new_values": values},
                detail=f"{c.detail}; new values: {', '.join(values)}",
                severity=Severity.page if page else c.severity,
            )
    return out


def group_key(alert: Alert, grouping: Grouping) -> str:
    """What an incident gathers, as a stable string."""
    key: list[str] = [*alert.cohort]
    if grouping is Grouping.field:
        key.append(alert.field)
    return orjson.dumps(key).decode()


def incident_id(key: str, opened_at: datetime) -> str:
    """An incident's id (the pager's dedup key): its group and when it opened."""
    return hashlib.sha256(orjson.dumps([key, opened_at.isoformat()])).hexdigest()[:24]


def _badness(a: dict[str, Any]) -> tuple[int, float]:
    effect, threshold = a.get("effect"), a.get("threshold")
    ratio = float(effect) / float(threshold) if effect is not None and threshold else 0.0
    return (a.get("kind") == AlertKind.field_missing.value, ratio)


def worst_alert(alerts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The alert an incident's summary names: a missing field first, then the largest effect for
    its threshold."""
    return max(alerts, key=_badness)


def _incident_json(iid: str, members: list[dict[str, Any]]) -> dict[str, Any]:
    worst = worst_alert(members)
    onsets = [m["onset"] for m in members if m.get("onset")]
    fields = sorted({str(m["field"]) for m in members})
    return {
        **{k: worst.get(k) for k in ("cohort", "field", "kind", "severity", "served_models", "links")},
        "fingerprint": iid,
        "incident_id": iid,
        "detail": worst.get("detail"),
        "fields": fields,
        # the earliest onset of its alerts: when the incident began
        "onset": min(onsets, key=lambda o: o["at"]) if onsets else None,
        "alerts": [
            {k: v for k, v in m.items() if k != "samples"}
            for m in sorted(members, key=_badness, reverse=True)[:_MEMBERS_SENT]
        ],
        "alerts_total": len(members),
    }


def _summary(incident: dict[str, Any]) -> str:
    members = incident["alerts"]
    worst = summarize_alert(members[0])
    if incident["alerts_total"] == 1:
        return worst
    others = [f for f in incident["fields"] if f != members[0]["field"]]
    more = f"; also {', '.join(others)}" if others else ""
    return f"{incident['alerts_total']} page alerts; worst: {worst}{more}"


def incident_notices(
    con: Any,
    moves: Sequence[Transition],
    now: datetime,
    *,
    grouping: Grouping,
    silenced: Callable[[Alert], bool],
    to_json: Callable[[Alert], dict[str, Any]] = Alert.to_json,
) -> list[Notice]:
    """The notices of one evaluation's transitions, with incidents kept in the transaction ``con``:
    a trigger per incident opened now, a resolve per incident whose last alert resolved now, and
    the warn alerts' own triggers and resolves. Page alerts joining an incident opened earlier
    are recorded as its members; the pager already has that incident open."""
    notices: list[Notice] = []
    opened: dict[str, list[dict[str, Any]]] = {}
    for m in moves:
        a = m.alert
        if not m.notify or a.episode < 1:
            continue
        if a.state is AlertState.firing:
            if silenced(a):
                continue
            if a.severity is not Severity.page:
                notices.append(notice_for(to_json(a), episode=a.episode, action=NoticeAction.trigger))
                continue
            key = group_key(a, grouping)
            iid = open_incident(con, key)
            if iid is None:
                iid = incident_id(key, now)
                add_incident(con, iid, key, now, summarize_alert(to_json(a)))
                opened[iid] = []
            if add_incident_member(con, iid, a.fingerprint, now) and iid in opened:
                opened[iid].append({**to_json(a), "incident_id": iid})
        elif a.state is AlertState.resolved and m.previous is AlertState.firing:
            closed = resolve_member(con, a.fingerprint, now)
            if not closed:  # never part of an incident (a warn alert): resolved on its own
                notices.append(notice_for(to_json(a), episode=a.episode, action=NoticeAction.resolve))
            for iid, last in closed:
                if last:
                    notices.append(
                        Notice(iid, 1, NoticeAction.resolve, "page", f"resolved: {a.field}", {"incident_id": iid})
                    )
    for iid, members in opened.items():
        if not members:
            continue
        incident = _incident_json(iid, members)
        notices.append(
            Notice(
                iid,
                1,
                NoticeAction.trigger,
                "page",
                _summary(incident),
                incident,
                (incident.get("links") or {}).get("dashboard"),
            )
        )
    return notices
