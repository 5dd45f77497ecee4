"""Tables that set a baseline beside what is seen now: an alert's diff, and a baseline against a window.

Pure functions of the API's JSON (no Streamlit), so they are tested directly.
A baseline document carries raw field profiles (counts); a window profile from
``GET /v1/cohorts/{id}/fields`` carries the same counts plus derived rates, so
both are read through ``field_stats`` into one shape.

>>> alert_diff_rows({"baseline": {"presence_rate": 1.0, "samples": 400},
...                  "current": {"presence_rate": 0.5, "samples": 400}})
[{'measure': 'presence_rate', 'baseline': '100.0%', 'current': '50.0%'}, {'measure': 'samples', 'baseline': '400', 'current': '400'}]
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "FieldStats",
    "alert_diff_rows",
    "baseline_window_rows",
    "field_stats",
    "format_value",
    "new_values",
    "percentile",
]


def format_value(key: str, value: Any) -> str:
    """Rates and shares as percentages, numbers plainly, anything else as compact JSON."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and (key.endswith(("_rate", "share")) or key in ("presence", "effect")):
        return f"{100 * value:.1f}%"
    if isinstance(value, int | float):
        return f"{value:g}" if isinstance(value, float) else str(value)
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and value and all(isinstance(v, int | float) for v in value.values()):
        if key == "types":  # type -> share
            return ", ".join(f"{t} {100 * v:.1f}%" for t, v in sorted(value.items()))
        return ", ".join(f"{k} {v:g}" for k, v in sorted(value.items(), key=lambda kv: (-kv[1], kv[0])))
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return ", ".join(value)
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def alert_diff_rows(alert: Mapping[str, Any]) -> list[dict[str, str]]:
    """One row per measure of the alert's baseline and current values (baseline's order first)."""
    base, cur = alert.get("baseline") or {}, alert.get("current") or {}
    keys = list(base) + [k for k in cur if k not in base]
    return [
        {"measure": k, "baseline": format_value(k, base.get(k)), "current": format_value(k, cur.get(k))} for k in keys
    ]


def percentile(histogram: Mapping[str, int] | Mapping[int, int], q: float) -> int | None:
    """Nearest-rank q-quantile of a length histogram (keys may be strings, as in JSON)."""
    counts = sorted((int(k), int(n)) for k, n in histogram.items())
    total = sum(n for _, n in counts)
    if not total:
        return None
    rank = max(1, math.ceil(round(q * total, 9)))
    seen = 0
    for value, n in counts:
        seen += n
        if seen >= rank:
            return value
    return counts[-1][0]


@dataclass(frozen=True)
class FieldStats:
    """One field's profile, as both tables show it."""

    path: str
    units: int
    presence: float | None  # filled (present, not null) share of units
    types: dict[str, float]  # share of each JSON type among the present values
    values: dict[str, int]
    arrays: tuple[int | None, int | None, int | None] | None  # p50, p90, p99


def field_stats(f: Mapping[str, Any]) -> FieldStats:
    """A field profile (baseline document or window profile) in one shape."""
    types = {str(t): int(n) for t, n in (f.get("types") or {}).items()}
    units, present = int(f.get("units") or 0), int(f.get("present") or 0)
    filled = present - types.get("null", 0)
    lengths = f.get("array_lengths") or {}
    return FieldStats(
        path=str(f["path"]),
        units=units,
        presence=filled / units if units else None,
        types={t: n / present for t, n in sorted(types.items()) if n} if present else {},
        values={str(v): int(n) for v, n in (f.get("values") or {}).items()},
        arrays=(percentile(lengths, 0.5), percentile(lengths, 0.9), percentile(lengths, 0.99)) if lengths else None,
    )


def new_values(base: FieldStats | None, cur: FieldStats | None) -> list[str]:
    """Values seen now that the baseline never had, most frequent first (only where the baseline had values)."""
    if base is None or cur is None or not base.values:
        return []
    return sorted((v for v in cur.values if v not in base.values), key=lambda v: (-cur.values[v], v))


def _types_text(t: dict[str, float]) -> str:
    return ", ".join(f"{k} {100 * v:.0f}%" for k, v in t.items()) or "-"


def _arrays_text(a: tuple[int | None, int | None, int | None] | None) -> str:
    return "-" if a is None else "/".join("-" if x is None else str(x) for x in a)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def baseline_window_rows(
    baseline_fields: Mapping[str, Mapping[str, Any]], window_fields: list[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Side by side, per field path: presence, types, new values, array sizes; largest presence moves first."""
    base = {p: field_stats({**f, "path": p}) for p, f in baseline_fields.items()}
    cur = {str(f["path"]): field_stats(f) for f in window_fields}
    rows = []
    for path in sorted(set(base) | set(cur)):
        b, c = base.get(path), cur.get(path)
        move = (
            None
            if b is None or c is None or b.presence is None or c.presence is None
            else round(100 * (c.presence - b.presence), 1)
        )
        rows.append(
            {
                "field": path,
                "status": "new" if b is None else "missing" if c is None else "",
                "presence (baseline)": _pct(b.presence if b else None),
                "presence (window)": _pct(c.presence if c else None),
                "move (points)": move,
                "types (baseline)": _types_text(b.types) if b else "-",
                "types (window)": _types_text(c.types) if c else "-",
                "new values": ", ".join(new_values(b, c)[:10]),
                "arrays p50/p90/p99 (baseline)": _arrays_text(b.arrays) if b else "-",
                "arrays p50/p90/p99 (window)": _arrays_text(c.arrays) if c else "-",
                "samples (baseline / window)": f"{b.units if b else 0} / {c.units if c else 0}",
            }
        )
    return sorted(
        rows,
        key=lambda r: (-(abs(r["move (points)"] or 0) + (100 if r["status"] or r["new values"] else 0)), r["field"]),
    )
