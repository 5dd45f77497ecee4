"""Onset: when a field's series left its baseline, found in the rollup buckets, with its uncertainty.

``first_seen`` is when the analyzer first saw a breach; a drift that began a day before the first
evaluation would read "3 minutes ago". The onset is the change point of the series the alert is
about (presence, a type's share, a value's share, the unknown share), read per step (5 minutes)
over a lookback (``[oncall] onset_lookback``, 7 days by default) through the store's read API.

The search is one binomial change point: for every split of the steps into before and after,
the log-likelihood ratio of "two rates" against "one rate" (``k`` hits of ``n`` per step); the
best split is the onset. Its uncertainty is the likelihood interval: every split whose ratio is
within 1.92 of the best (a 95% interval for one parameter) lies in ``[low, high]``. A series
with no split worth 10.8 (p < 0.001 for a single split) gives no onset: the change began
before the lookback, or is too gradual for one point.

It costs two grouped queries and a cumulative sum per new alert (an alert keeps the onset
found when it opened), so an evaluation pays for it only when something changes.

>>> onset = find_onset(store, alert, cohort_id, at, timedelta(days=7))   # doctest: +SKIP
>>> onset                                                                  # doctest: +SKIP
{'at': '2026-11-29T03:10:00Z', 'low': '2026-11-29T03:05:00Z', 'high': '2026-11-29T03:15:00Z',
 'method': 'binomial change point, 5m steps'}
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from shapewatch.collector import Store

from .config import AlertKind

__all__ = ["ONSET_KINDS", "find_onset", "onset_split"]

STEP = timedelta(minutes=5)
_MAX_STEPS = 4000  # a longer lookback takes wider steps
_MIN_LLR = 10.8  # chi-square(1) at p = 0.001: below it, no change point is claimed
_INTERVAL_LLR = 1.92  # half of chi-square(1) at 0.95: the likelihood interval

_PRESENCE = {AlertKind.presence_drop, AlertKind.presence_rise, AlertKind.field_missing, AlertKind.new_field}
_TYPES = {AlertKind.new_type, AlertKind.type_shift}
_UNKNOWN = {AlertKind.unknown_enum_growth, AlertKind.cardinality_jump}
#: The kinds whose series the search knows; other alerts carry ``onset: null``.
ONSET_KINDS = frozenset(_PRESENCE | _TYPES | _UNKNOWN | {AlertKind.new_enum_value})

_TYPE_COLUMNS = ("null", "boolean", "integer", "number", "string", "array", "object")


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _ll(k: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Binomial log-likelihood at the maximum (0 log 0 = 0), element-wise."""
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(n > 0, k / np.maximum(n, 1), 0.0)
        a = np.where(k > 0, k * np.log(np.where(p > 0, p, 1.0)), 0.0)
        b = np.where(n - k > 0, (n - k) * np.log(np.where(p < 1, 1 - p, 1.0)), 0.0)
    return np.asarray(a + b)


def onset_split(k: Sequence[float], n: Sequence[float]) -> tuple[int, int, int, float] | None:
    """The best single change point of a series of ``k`` hits out of ``n`` per step.

    Returns (index of the first step after the change, lowest and highest such index within the
    likelihood interval, log-likelihood ratio), or None when no split is worth ``_MIN_LLR``.

    >>> onset_split([0, 0, 0, 9, 9, 9], [10] * 6)[:3]
    (3, 3, 3)
    >>> onset_split([5, 5, 5, 5], [10] * 4) is None
    True
    """
    ka, na = np.asarray(k, dtype=float), np.asarray(n, dtype=float)
    if len(ka) < 2 or na.sum() <= 0:
        return None
    ck, cn = np.cumsum(ka), np.cumsum(na)
    left_k, left_n = ck[:-1], cn[:-1]
    right_k, right_n = ck[-1] - left_k, cn[-1] - left_n
    llr = _ll(left_k, left_n) + _ll(right_k, right_n) - float(_ll(ck[-1:], cn[-1:])[0])
    best = int(np.argmax(llr))
    top = float(llr[best])
    if not math.isfinite(top) or top < _MIN_LLR:
        return None
    near = np.nonzero(llr >= top - _INTERVAL_LLR)[0]
    return best + 1, int(near.min()) + 1, int(near.max()) + 1, top


def _series(
    store: Store, alert: dict[str, Any], cohort_id: int, since: datetime, until: datetime, step: int
) -> tuple[list[datetime], list[float], list[float]] | None:
    kind = AlertKind(alert["kind"])
    path = str(alert["field"])
    rows = store.field_buckets(cohort_id, path, since, until, step)
    if not rows:
        return None
    times = [r[0] for r in rows]
    if kind in _PRESENCE:
        # filled (present and not null) out of the outputs; a nested path's units are not the
        # outputs, so it is judged by the share of outputs that carry it at all
        return times, [min(float(r[2] - r[3]), float(r[1])) for r in rows], [float(r[1]) for r in rows]
    if kind in _TYPES:
        value = alert.get("value")
        if kind is AlertKind.type_shift or value is None:
            base = (alert.get("baseline") or {}).get("types") or {}
            cur = (alert.get("current") or {}).get("types") or {}
            value = max(cur, key=lambda t: cur[t] - base.get(t, 0.0), default=None)
        if value is None:
            return None
        wanted = {"integer", "number"} if value in ("number", "integer") else {str(value)}
        cols = [i for i, t in enumerate(_TYPE_COLUMNS) if t in wanted]
        return (
            times,
            [float(sum(r[3 + i] for i in cols)) for r in rows],
            [float(sum(r[3:10])) for r in rows],
        )
    strings = {r[0]: float(r[7]) for r in rows}
    counts: dict[datetime, float] = {}
    if kind is AlertKind.new_enum_value:
        wanted_value = str(alert.get("value"))
        for t, v, n in store.value_buckets(cohort_id, path, since, until, step):
            if v == wanted_value:
                counts[t] = counts.get(t, 0.0) + n
        return times, [min(counts.get(t, 0.0), strings[t]) for t in times], [strings[t] for t in times]
    known = set((alert.get("baseline") or {}).get("known") or ())
    for t, v, n in store.value_buckets(cohort_id, path, since, until, step):
        if v in known:
            counts[t] = counts.get(t, 0.0) + n
    return times, [max(strings[t] - counts.get(t, 0.0), 0.0) for t in times], [strings[t] for t in times]


def find_onset(
    store: Store, alert: dict[str, Any], cohort_id: int, at: datetime, lookback: timedelta
) -> dict[str, Any] | None:
    """The onset of an alert's change (alert JSON: kind, field, value, baseline, current), or None
    when its kind has no series here or the buckets show no single change point."""
    try:
        kind = AlertKind(alert.get("kind"))
    except ValueError:
        return None
    if kind not in ONSET_KINDS:
        return None
    step = max(int(STEP.total_seconds()), math.ceil(lookback.total_seconds() / _MAX_STEPS / 60) * 60)
    since = at - lookback
    series = _series(store, alert, cohort_id, since, at, step)
    if series is None:
        return None
    times, k, n = series
    found = onset_split(k, n)
    if found is None:
        return None
    first, low, high, _llr = found
    width = timedelta(seconds=step)
    # The change began after the last step before the split started and by the end of the first
    # step after it: the interval spans those edges of the lowest and highest splits.
    return {
        "at": _iso(times[first]),
        "low": _iso(times[low - 1] + width),
        "high": _iso(times[high] + width),
        "method": f"binomial change point over {len(times)} steps of {step // 60}m",
    }
