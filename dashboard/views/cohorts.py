"""Cohorts: every (model, prompt version, contract) of one source (production first) with traffic,
its baseline and its alerts.

``GET /v1/cohorts`` (last seven days of traffic) and ``GET /v1/served-model-changes``:
a model id with no dated snapshot is marked unpinned, since the provider can
change what answers behind it; the changes of served model seen behind an id
are listed below.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from shapewatch.dashboard import ui

UNPINNED = "⚠ unpinned alias"
SOURCES = ["production", "probe", "shadow"]


_RATE_NAMES = {"truncation_rate": "truncated", "refusal_rate": "refused", "invalid_output_rate": "invalid"}


def outcome_rates_text(rates: dict[str, float]) -> str:
    """``truncated 4.0%, invalid 0.2%``: the non-zero outcome rates of a cohort's responses; "-" without."""
    shown = [f"{_RATE_NAMES.get(k, k)} {100 * v:.1f}%" for k, v in rates.items() if v]
    return ", ".join(shown) or "-"


def cohort_rows(cohorts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per cohort, what on-call reads first on the left (which cohort, what is firing, is
    traffic arriving): at 1,400 px the firing columns must never be off the right edge."""
    rows = []
    for c in cohorts:
        b = c.get("baseline")
        firing = c.get("alerts_firing") or {}
        row: dict[str, Any] = {
            "id": c["cohort_id"],
            "model": c["cohort"]["model"],
            "prompt version": c["cohort"]["prompt_version"],
            "contract": c["cohort"]["contract"],
            "page firing": firing.get("page", 0),
            "warn firing": firing.get("warn", 0),
            "events (7 days)": c["events"],
        }
        if "last_event_at" in c:  # services that know each cohort's newest event say so
            row["last event"] = ui.relative(c.get("last_event_at")) if c.get("last_event_at") else "-"
        row |= {
            "pinned": UNPINNED if c.get("unpinned") else "pinned",
            "baseline": b["baseline_id"] if b else "none: not judged",
            "baseline how": ""
            if not b
            else "own"
            if b["how"] == "own"
            else f"inherited ({b['how'].replace('_', ' ')}: {ui.cohort_label(b['cohort'])})",
            "baseline age (days)": b["age_days"] if b else None,
            "baseline samples": b["samples"] if b else None,
            "served models": ", ".join(f"{m} ({n})" for m, n in (c.get("served_models") or {}).items()) or "-",
            # a served cohort also holds the outputs this model gave under these aliases
            "answers for alias": ", ".join(c.get("answered_for") or []) or "-",
            "contract versions": ", ".join(
                f"{v or 'untagged'} ({n})" for v, n in (c.get("contract_versions") or {}).items()
            )
            or "-",
            # the shares the outcome-rate rules judge (truncated, refused or filtered, invalid)
            "outcome rates": outcome_rates_text(c.get("outcome_rates") or {}),
            "truncated / refused outputs": ", ".join(f"{k} {n}" for k, n in (c.get("provider_outcomes") or {}).items())
            or "-",
            "first seen": c.get("first_seen"),
        }
        rows.append(row)
    return rows


COLUMNS = {
    "id": st.column_config.NumberColumn(width="small"),
    "page firing": st.column_config.NumberColumn(width="small"),
    "warn firing": st.column_config.NumberColumn(width="small"),
    "events (7 days)": st.column_config.NumberColumn(width="small"),
    "last event": st.column_config.TextColumn(width="small"),
}


def render(s: ui.Session) -> None:
    st.title("Cohorts")
    source = st.radio("Source", SOURCES, horizontal=True, key="cohorts-source")
    cohorts = s.read("/v1/cohorts", source=source)
    if not cohorts:
        st.info(f"No {source} cohort yet: nothing was sent to the collector (POST /v1/outputs) as {source}.")
        return
    unpinned = [c for c in cohorts if c.get("unpinned")]
    without = [c for c in cohorts if not c.get("baseline")]
    cols = st.columns(4)
    cols[0].metric("Cohorts", len(cohorts))
    cols[1].metric("Without a baseline", len(without))
    cols[2].metric("On an unpinned alias", len(unpinned))
    cols[3].metric("Page alerts firing", sum((c.get("alerts_firing") or {}).get("page", 0) for c in cohorts))
    st.dataframe(pd.DataFrame(cohort_rows(cohorts)), hide_index=True, column_config=COLUMNS)
    if unpinned:
        st.caption(
            f"{UNPINNED}: "
            + ", ".join(ui.literal(m) for m in sorted({c["cohort"]["model"] for c in unpinned}))
            + " has no dated snapshot; the provider can change the model behind it. "
            "Pin a dated version, or watch the served models below."
        )
    labels = {ui.cohort_label(c["cohort"]): c["cohort_id"] for c in cohorts}
    # In a popover: the browser draws its select box only when it is opened (the page's one select
    # box cost a tenth of its load on every visit)
    with st.popover("Open a cohort's fields", icon=":material/show_chart:"):
        picked = st.selectbox("Cohort", list(labels), key="cohorts-open")
        st.page_link(
            "views/field.py",
            label="Field detail of this cohort",
            icon=":material/show_chart:",
            query_params={"cohort": str(labels[picked])},
        )

    st.subheader("Served-model changes")
    changes = s.read("/v1/served-model-changes")
    if not changes:
        st.caption("No change of served model recorded behind any requested model id.")
    else:
        st.dataframe(
            pd.DataFrame(
                [
                    {
                        "cohort": ui.cohort_label(ch["cohort"]),
                        "previous": ch["previous"],
                        "current": ch["current"],
                        "detected": ch["detected_at"],
                    }
                    for ch in changes
                ]
            ),
            hide_index=True,
        )


ui.run_page(render)
