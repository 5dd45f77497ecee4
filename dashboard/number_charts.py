"""Charts of a number field and of a boolean field over time, against the baseline's levels.

A number field's p10, median and p90 per step (what the ``value_shift`` rule compares), with
the baseline's as dashed rules; a boolean field's share of true values (what the
``max_true_share`` / ``min_true_share`` assertions bound). Both read the series route's
``numbers`` and ``true_share`` (``GET /v1/cohorts/{id}/series``).
"""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd
import streamlit as st

from . import charts

__all__ = ["has_numbers", "has_true_share", "number_chart", "render", "true_share_chart"]

_LEVELS = ("p10", "p50", "p90")


def has_numbers(doc: dict[str, Any]) -> bool:
    """Whether the series (or its baseline) holds numbers to draw."""
    return any(item.get("numbers") for item in doc["series"]) or bool((doc.get("baseline") or {}).get("numbers"))


def has_true_share(doc: dict[str, Any]) -> bool:
    return any(item.get("true_share") is not None for item in doc["series"])


def _frame(doc: dict[str, Any], key: str, names: tuple[str, ...]) -> pd.DataFrame:
    rows = []
    for item in doc["series"]:
        got = item.get(key) or {}
        x = charts._time(item)
        rows += [{"time": x, "level": n, "value": got[n]} for n in names if got.get(n) is not None]
    return pd.DataFrame(rows, columns=["time", "level", "value"])


def number_chart(doc: dict[str, Any]) -> charts.Chart:
    """p10 / median / p90 per step; the baseline's as dashed rules."""
    lines = (
        alt.Chart(_frame(doc, "numbers", _LEVELS))
        .mark_line(point=True)
        .encode(
            x=charts._x(doc),
            y=alt.Y("value:Q", title="value"),
            color=alt.Color("level:N", title="percentile", sort=list(_LEVELS)),
            tooltip=[alt.Tooltip("time:T"), alt.Tooltip("level:N"), alt.Tooltip("value:Q")],
        )
    )
    layers: list[Any] = [lines]
    base = (doc.get("baseline") or {}).get("numbers")
    if base:
        levels = pd.DataFrame([{"level": n, "value": base[n]} for n in _LEVELS if base.get(n) is not None])
        layers.append(
            alt.Chart(levels)
            .mark_rule(strokeDash=[6, 3])
            .encode(y=alt.Y("value:Q"), color=alt.Color("level:N", sort=list(_LEVELS)))
        )
    return charts.with_contract_changes(doc, alt.layer(*layers))


def true_share_chart(doc: dict[str, Any]) -> charts.Chart:
    """The share of true values per step; the baseline's as a dashed rule."""
    frame = pd.DataFrame(
        [
            {"time": charts._time(item), "true share": item["true_share"]}
            for item in doc["series"]
            if item.get("true_share") is not None
        ],
        columns=["time", "true share"],
    )
    line = (
        alt.Chart(frame)
        .mark_line(point=True)
        .encode(
            x=charts._x(doc),
            y=alt.Y("true share:Q", axis=alt.Axis(format="%"), scale=alt.Scale(domain=[0, 1])),
            tooltip=[alt.Tooltip("time:T"), alt.Tooltip("true share:Q", format=".1%")],
        )
    )
    layers: list[Any] = [line]
    base = (doc.get("baseline") or {}).get("true_share")
    if base is not None:
        layers.append(
            alt.Chart(pd.DataFrame([{"true share": base}])).mark_rule(strokeDash=[6, 3]).encode(y=alt.Y("true share:Q"))
        )
    return charts.with_contract_changes(doc, alt.layer(*layers))


def render(doc: dict[str, Any], base: dict[str, Any] | None) -> None:
    """The field page's number and true-share sections, when the field holds either."""
    if has_numbers(doc):
        st.subheader("Number values")
        st.altair_chart(number_chart(doc))
        b = (base or {}).get("numbers")
        if b:
            st.caption(
                f"Baseline p10/median/p90: {b['p10']:g} / {b['p50']:g} / {b['p90']:g} (dashed). "
                "value_shift compares these levels with the window's."
            )
    if has_true_share(doc):
        st.subheader("Share of true values")
        st.altair_chart(true_share_chart(doc))
        if base and base.get("true_share") is not None:
            st.caption(f"Baseline: {100 * base['true_share']:.1f}% true (dashed).")
