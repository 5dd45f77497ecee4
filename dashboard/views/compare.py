"""Compare: two cohorts over one window, side by side, field by field (``GET /v1/compare``).

Cohort A is judged against cohort B with the analyzer's rules: what breached, then both sides of
every field. A shadow against its production twin is the usual pair; any two cohorts work.
"""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta
from typing import Any

import pandas as pd
import streamlit as st

from shapewatch.dashboard import ui
from shapewatch.dashboard.client import RequestRefused


def cohort_text(c: dict[str, Any]) -> str:
    """A cohort as ``GET /v1/compare`` reads it: source/model/prompt_version/contract."""
    return f"{c.get('source', 'production')}/{c['model']}/{c['prompt_version']}/{c['contract']}"


def field_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    def side(f: dict[str, Any] | None) -> tuple[str, str]:
        if f is None:
            return "absent", "-"
        types = ", ".join(f"{t} {n}" for t, n in sorted(f["types"].items()))
        return f"{100 * f['presence_rate']:.1f}% of {f['units']}", types or "-"

    breached = {b["field"] for b in result["breaches"]}
    rows = []
    for f in result["fields"]:
        a_presence, a_types = side(f["a"])
        b_presence, b_types = side(f["b"])
        rows.append(
            {
                "field": f["field"],
                "breach": "yes" if f["field"] in breached else "",
                "A presence": a_presence,
                "B presence": b_presence,
                "A types": a_types,
                "B types": b_types,
            }
        )
    return rows


def render(s: ui.Session) -> None:
    st.title("Compare two cohorts")
    cohorts = s.read("/v1/cohorts")
    if len(cohorts) < 1:
        st.info("No cohort yet: nothing was ever sent to the collector.")
        return
    labels = {ui.cohort_label(c["cohort"]): cohort_text(c["cohort"]) for c in cohorts}
    names = list(labels)
    shadow = next((i for i, c in enumerate(cohorts) if c["cohort"].get("source") == "shadow"), 0)
    left, right = st.columns(2)
    a = left.selectbox("A (judged)", names, index=shadow, key="compare-a")
    b = right.selectbox("B (reference)", names, index=0 if shadow else min(1, len(names) - 1), key="compare-b")
    today = datetime.now(UTC).date()
    since_day = left.date_input("From (UTC)", today - timedelta(days=1), key="compare-since")
    until_day = right.date_input("To, exclusive (UTC)", today + timedelta(days=1), key="compare-until")
    since = datetime.combine(since_day, time(), UTC)
    until = datetime.combine(until_day, time(), UTC)
    try:
        result = s.read("/v1/compare", a=labels[a], b=labels[b], since=since.isoformat(), until=until.isoformat())
    except RequestRefused as exc:
        st.warning(f"Cannot compare: {ui.literal(exc.message)}")
        return
    cols = st.columns(3)
    cols[0].metric("A outputs", result["a"]["events"])
    cols[1].metric("B outputs", result["b"]["events"])
    cols[2].metric("Breaches", len(result["breaches"]), help=f"of {result['checks']} checks")
    if result["breaches"]:
        st.dataframe(
            pd.DataFrame(
                [
                    {"field": c["field"], "kind": c["kind"], "severity": c["severity"], "detail": c["detail"]}
                    for c in result["breaches"]
                ]
            ),
            hide_index=True,
        )
    else:
        st.success("No rule breached: A is like B over this window.")
    st.subheader("Field by field")
    st.dataframe(pd.DataFrame(field_rows(result)), hide_index=True)
    if result["insufficient"]:
        st.caption(f"{len(result['insufficient'])} field(s) had too few samples to judge.")


ui.run_page(render)
