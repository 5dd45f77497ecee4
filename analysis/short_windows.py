"""Several windows at once: a large change pages within minutes, a small one once it has held a day.

A 24-hour window dilutes a change that started an hour ago to a twenty-fourth of its size: a
field that stops being filled pages only once enough of the day has gone by. Site reliability
practice answers the same dilution with several windows judged together, a short window with
a large threshold for fast, large changes and a long one with a small threshold for slow ones.

Each ``ShortWindow`` of the configuration (by default 15 minutes at 3x every effect threshold,
1 hour at 2x and 6 hours at 1.5x) is compared with the same baseline by the same rules
(``rules.compare_profiles``, ``rules.compare_violations``) and the same sample minimum, and its
checks get their thresholds scaled (``scaled``); a field absent from a short window is judged
as a presence drop to 0% there (``as_presence_drop``), not as ``field_missing``. All the checks of every window go through the
one Benjamini-Hochberg adjustment of the evaluation, then ``merge_windows`` keeps one check per
alert fingerprint (field, kind, value): the window that breaches with the largest effect over
its threshold, so an alert names the window it breached on, and a firing alert stays firing
while any window keeps it above ``threshold x hysteresis``.

>>> merged = merge_windows(adjust_p_values(main + short), hysteresis=0.8)   # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from .config import AlertKind, FieldRules, ShortWindow
from .rules import Check

__all__ = ["as_presence_drop", "merge_windows", "scaled"]


def as_presence_drop(check: Check, rules: FieldRules) -> Check:
    """A short window's ``field_missing`` judged as the presence drop it is (to 0%).

    A field absent from the last 15 minutes is not gone the way one absent from the whole day
    is; judged as ``field_missing`` it would open a second alert minutes after the presence drop
    that paged for the same change. The day's window still says ``field_missing``.
    """
    if check.kind is not AlertKind.field_missing:
        return check
    return replace(
        check,
        kind=AlertKind.presence_drop,
        severity=rules.severity_of(AlertKind.presence_drop),
        threshold=rules.tolerance,
        detail=f"presence {100 * check.effect:.1f}% -> 0.0% (absent from the window)",
    )


def scaled(check: Check, window: ShortWindow) -> Check:
    """``check`` judged on ``window``: its thresholds (and its escalation to page) scaled up."""

    def up(t: float) -> float:
        # cardinality_jump's threshold is a ratio (2: distinct values doubled); its excess scales.
        return 1 + (t - 1) * window.scale if check.kind is AlertKind.cardinality_jump else t * window.scale

    return replace(
        check,
        threshold=round(up(check.threshold), 9),
        escalate_at=None if check.escalate_at is None else round(up(check.escalate_at), 9),
        window=window.label,
        detail=f"{check.detail} over the last {window.label}",
    )


def _ratio(c: Check) -> float:
    if c.threshold > 0:
        return c.effect / c.threshold
    return math.inf if c.effect > 0 else 0.0


def _rank(c: Check, hysteresis: float) -> tuple[int, int, float]:
    # A breach first; then a check that would keep a firing alert firing (above the hysteresis
    # band and significant); among equals the largest effect relative to its threshold.
    held = c.effect >= c.threshold * hysteresis and c.q_value < c.alpha
    return (int(c.breach), int(held), _ratio(c))


def merge_windows(checks: Sequence[Check], *, hysteresis: float) -> list[Check]:
    """One check per (field, kind, value) out of every window's, in the order first seen.

    Checks must already carry their q-values (adjusted over every window together).
    """
    best: dict[tuple[str, AlertKind, str | None], Check] = {}
    for c in checks:
        key = (c.field, c.kind, c.value)
        kept = best.get(key)
        if kept is None or _rank(c, hysteresis) > _rank(kept, hysteresis):
            best[key] = c
    return list(best.values())
