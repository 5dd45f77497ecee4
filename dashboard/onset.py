"""Onset on the field page: the period a page link asks for, or one that starts before the onset
of the field's alert, and the onset and fired times marked on its charts.

A page link carries ``?cohort=ID&field=PATH&since=T&until=T`` (the analyzer builds it from the
alert's onset). Without ``since``, a field with an open alert that knows its onset opens on a
period from before the onset to now, so the change is on screen; otherwise the page's period
selector decides.

>>> period({"since": "2026-11-29T02:00:00Z", "until": "2026-11-29T09:00:00Z"}, [], now)  # doctest: +SKIP
('2026-11-29T02:00:00Z', '2026-11-29T09:00:00Z', 84)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import altair as alt
import pandas as pd

__all__ = ["caption", "marked", "period"]

_MAX_SPAN = timedelta(days=31)
_STEP = timedelta(minutes=5)  # the finest step a linked period is drawn in
_MIN_POINTS, _MAX_POINTS = 24, 200


def _parse(text: object) -> datetime | None:
    if not isinstance(text, str) or not text or len(text) > 40:
        return None
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t.astimezone(UTC) if t.tzinfo is not None else None


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _points(since: datetime, until: datetime) -> int:
    return max(_MIN_POINTS, min(_MAX_POINTS, int((until - since) / _STEP)))


def period(query: Mapping[str, Any], alerts: Sequence[Mapping[str, Any]], now: datetime) -> tuple[str, str, int] | None:
    """(since, until, points) for the field's charts: the link's period when it is valid (at most
    31 days, ending after it starts), else from before the earliest onset of ``alerts`` to now;
    None leaves the page's own period."""
    since, until = _parse(query.get("since")), _parse(query.get("until"))
    if since is not None:
        until = until or now
        if since < until and until - since <= _MAX_SPAN:
            return _iso(since), _iso(until), _points(since, until)
    lows = [t for a in alerts if (t := _parse((a.get("onset") or {}).get("low"))) is not None]
    if not lows:
        return None
    start = min(lows)
    start = max(now - _MAX_SPAN, start - max(timedelta(hours=1), (now - start) / 4))
    return _iso(start), _iso(now), _points(start, now)


def _ago(t: datetime, later: datetime) -> str:
    hours = (later - t).total_seconds() / 3600
    return f"{hours:.0f} h" if hours >= 1.5 else f"{max(0.0, hours * 60):.0f} min"


def caption(alert: Mapping[str, Any]) -> str | None:
    """``since 03:10 UTC on 2026-11-29 (between 03:05 and 03:15), 5 h before the page``; None
    without an onset."""
    onset = alert.get("onset") or {}
    at, low, high = (_parse(onset.get(k)) for k in ("at", "low", "high"))
    if at is None:
        return None
    text = f"since {at:%H:%M} UTC on {at:%Y-%m-%d}"
    if low is not None and high is not None:
        text += f" (between {low:%H:%M} and {high:%H:%M})"
    fired = _parse(alert.get("fired_at"))
    if fired is not None:
        text += f", {_ago(at, fired)} before the page"
    return text


def marked(chart: Any, alerts: Sequence[Mapping[str, Any]]) -> Any:
    """``chart`` with a rule at each alert's onset and fired time, labelled."""
    rows = [
        {"time": t, "mark": label}
        for a in alerts
        for label, key in (("onset", (a.get("onset") or {}).get("at")), ("fired", a.get("fired_at")))
        if (t := _parse(key)) is not None
    ]
    if not rows:
        return chart
    frame = pd.DataFrame(rows).drop_duplicates()
    frame["time"] = pd.to_datetime(frame["time"], utc=True)
    rules = (
        alt.Chart(frame)
        .mark_rule(color="#c0392b", strokeDash=[4, 2])
        .encode(x=alt.X("time:T"), tooltip=[alt.Tooltip("mark:N"), alt.Tooltip("time:T")])
    )
    labels = (
        alt.Chart(frame)
        .mark_text(align="left", dx=3, dy=-4, color="#c0392b")
        .encode(x=alt.X("time:T"), y=alt.YValue(20), text=alt.Text("mark:N"))  # type: ignore[no-untyped-call]
    )
    return alt.layer(chart, rules, labels)
