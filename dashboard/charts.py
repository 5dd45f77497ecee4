"""Charts of one field over time against its baseline, from ``GET /v1/cohorts/{id}/series``.

Each function takes the route's JSON and returns a data frame or an Altair
chart, so the page only places them. The baseline is drawn as a level (a
rule) and, for presence, a tolerance band around it: a point outside the band
is what the analyzer judges (with significance and persistence on top).

A point stands at the END of its step (the newest step ends now, so its point is at the right
edge, not a step early), and time reads in UTC on every axis and tooltip, whatever the
browser's zone: the alerts and the API speak UTC too. Values are charted only for a field whose
values are a set (``values_kind`` ``enum``): a number field's strings or free text have none
worth a bar, and free text is personal data the service never sends.

>>> frame = series_frame(doc)                 # doctest: +SKIP
>>> st.altair_chart(presence_chart(doc))      # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd

__all__ = [
    "TOLERANCE",
    "Chart",
    "array_chart",
    "presence_chart",
    "series_frame",
    "shows_values",
    "type_chart",
    "unknown_chart",
    "utc_text",
    "values_chart",
    "values_table",
    "version_outputs_chart",
    "version_usage_frame",
    "version_violation_chart",
]

Chart = alt.Chart | alt.LayerChart | alt.FacetChart

TOLERANCE = 0.10  # the analyzer's default tolerance (10 points), used when the series carries none


TIME_TITLE = "time (UTC)"
WHEN = "when_utc"  # the tooltip's time, as text: Vega would show the browser's zone


_WHEN_TIP = alt.Tooltip(f"{WHEN}:N", title="time (UTC)")


def _time(item: dict[str, Any]) -> pd.Timestamp:
    """Where a step's point stands: the end of the step (what it counted is all before it)."""
    return pd.Timestamp(item.get("until") or item["since"])


def utc_text(t: Any) -> str:
    """``2026-11-30 12:00 UTC``."""
    return f"{pd.Timestamp(t).tz_convert('UTC'):%Y-%m-%d %H:%M} UTC"


def _x(doc: dict[str, Any]) -> alt.X:
    """Time over the whole requested period in UTC, the same on every chart of the page."""
    return alt.X(
        "time:T",
        title=TIME_TITLE,
        scale=alt.Scale(type="utc", domain=[doc["since"], doc["until"]]),
        axis=alt.Axis(format="%d %b %H:%M"),
    )


def shows_values(doc: dict[str, Any]) -> bool:
    """Whether the field's values are a set worth charting (``values_kind`` of the series route;
    a service from before it sent values of enum-like fields only when it had any)."""
    return bool(doc.get("values_kind", "enum") == "enum")


def series_frame(doc: dict[str, Any]) -> pd.DataFrame:
    """One row per step: time, units, presence, unknown share, array percentiles."""
    rows = []
    for item in doc["series"]:
        arr = item.get("array") or {}
        rows.append(
            {
                "time": _time(item),
                WHEN: utc_text(_time(item)),
                "units": item["units"],
                "presence": item.get("presence_rate"),
                "unknown share": item.get("unknown_share"),
                "p50": arr.get("p50"),
                "p90": arr.get("p90"),
                "p99": arr.get("p99"),
                "empty share": arr.get("empty_share"),
            }
        )
    return pd.DataFrame(
        rows, columns=["time", WHEN, "units", "presence", "unknown share", "p50", "p90", "p99", "empty share"]
    )


def contract_changes_frame(doc: dict[str, Any]) -> pd.DataFrame:
    """Contract versions first seen inside the range (``contract_changes`` of the series route)."""
    rows = [
        {"time": pd.Timestamp(c["at"]), WHEN: utc_text(c["at"]), "contract": f"contract {c['version']}"}
        for c in doc.get("contract_changes") or []
    ]
    return pd.DataFrame(rows, columns=["time", WHEN, "contract"])


def with_contract_changes(doc: dict[str, Any], chart: Chart) -> Chart:
    """``chart`` with a vertical rule, labelled, where each new contract version went out."""
    frame = contract_changes_frame(doc)
    if not len(frame):
        return chart
    rules = (
        alt.Chart(frame)
        .mark_rule(color="#7a3db8", strokeDash=[2, 2])
        .encode(x=alt.X("time:T"), tooltip=[_WHEN_TIP, alt.Tooltip("contract:N")])
    )
    labels = (
        alt.Chart(frame)
        .mark_text(align="left", dx=3, dy=-4, color="#7a3db8")
        .encode(x=alt.X("time:T"), y=alt.YValue(8), text=alt.Text("contract:N"))  # type: ignore[no-untyped-call]
    )
    return alt.layer(chart, rules, labels)


def violation_chart(doc: dict[str, Any]) -> Chart:
    """Share of checked outputs breaking the registered contract at this field, per step."""
    rows = [
        {"time": _time(item), WHEN: utc_text(_time(item)), "violations": item.get("violation_rate")}
        for item in doc["series"]
        if item.get("violation_rate") is not None
    ]
    frame = pd.DataFrame(rows, columns=["time", WHEN, "violations"])
    chart: alt.Chart = (
        alt.Chart(frame)
        .mark_line(point=True, color="#7a3db8")
        .encode(
            x=_x(doc),
            y=alt.Y(
                "violations:Q", axis=alt.Axis(format=".0%"), title="breaking the contract", scale=alt.Scale(domainMin=0)
            ),
            tooltip=[_WHEN_TIP, alt.Tooltip("violations:Q", format=".1%")],
        )
    )
    return with_contract_changes(doc, chart)


def presence_chart(doc: dict[str, Any], tolerance: float = TOLERANCE) -> Chart:
    """Presence per step; the baseline level and a +/- tolerance band when there is a baseline."""
    frame = series_frame(doc)[["time", WHEN, "presence", "units"]]
    line = (
        alt.Chart(frame)
        .mark_line(point=True)
        .encode(
            x=_x(doc),
            y=alt.Y("presence:Q", title="presence", axis=alt.Axis(format="%"), scale=alt.Scale(domain=[0, 1])),
            tooltip=[_WHEN_TIP, alt.Tooltip("presence:Q", format=".1%"), alt.Tooltip("units:Q")],
        )
    )
    layers: list[Any] = []
    base = (doc.get("baseline") or {}).get("presence_rate")
    if base is not None:
        band = pd.DataFrame(
            {
                "time": [pd.Timestamp(doc["since"]), pd.Timestamp(doc["until"])],
                "lo": [max(0.0, base - tolerance)] * 2,
                "hi": [min(1.0, base + tolerance)] * 2,
            }
        )
        layers.append(
            alt.Chart(band)
            .mark_area(opacity=0.15, color="#2f6fdf")
            .encode(x=alt.X("time:T"), y=alt.Y("lo:Q"), y2=alt.Y2("hi:Q"))
        )
        layers.append(
            alt.Chart(pd.DataFrame({"baseline": [base]}))
            .mark_rule(strokeDash=[6, 3], color="#555")
            .encode(y=alt.Y("baseline:Q"))
        )
    return with_contract_changes(doc, alt.layer(*layers, line))


def type_chart(doc: dict[str, Any]) -> Chart:
    """Type shares per step, stacked (shares of the present values)."""
    rows = [
        {"time": _time(item), WHEN: utc_text(_time(item)), "type": t, "share": share}
        for item in doc["series"]
        for t, share in (item.get("types") or {}).items()
    ]
    frame = pd.DataFrame(rows, columns=["time", WHEN, "type", "share"])
    chart: alt.Chart = (
        alt.Chart(frame)
        .mark_area()
        .encode(
            x=_x(doc),
            y=alt.Y("share:Q", stack="zero", axis=alt.Axis(format="%"), title="share"),
            color=alt.Color("type:N"),
            tooltip=[_WHEN_TIP, alt.Tooltip("type:N"), alt.Tooltip("share:Q", format=".1%")],
        )
    )
    return with_contract_changes(doc, chart)


def unknown_chart(doc: dict[str, Any]) -> Chart:
    """Share of the field's filled values outside the baseline's set, per step (0 in the baseline by
    definition)."""
    frame = series_frame(doc)[["time", WHEN, "unknown share"]]
    chart: alt.Chart = (
        alt.Chart(frame)
        .mark_line(point=True, color="#b00020")
        .encode(
            x=_x(doc),
            y=alt.Y(
                "unknown share:Q", axis=alt.Axis(format=".0%"), title="unknown share", scale=alt.Scale(domainMin=0)
            ),
            tooltip=[_WHEN_TIP, alt.Tooltip("unknown share:Q", format=".1%")],
        )
    )
    return with_contract_changes(doc, chart)


def array_chart(doc: dict[str, Any]) -> Chart:
    """Array-size p50/p90/p99 per step, with the baseline's levels as dashed rules."""
    frame = series_frame(doc)
    long = frame.melt(
        id_vars=["time", WHEN], value_vars=["p50", "p90", "p99"], var_name="percentile", value_name="length"
    ).dropna()
    lines = (
        alt.Chart(long)
        .mark_line(point=True)
        .encode(
            x=_x(doc),
            y=alt.Y("length:Q", title="items"),
            color=alt.Color("percentile:N"),
            tooltip=[_WHEN_TIP, alt.Tooltip("percentile:N"), alt.Tooltip("length:Q")],
        )
    )
    layers: list[Any] = [lines]
    base = (doc.get("baseline") or {}).get("array")
    if base:
        levels = pd.DataFrame(
            [{"percentile": k, "length": base[k]} for k in ("p50", "p90", "p99") if base.get(k) is not None]
        )
        layers.append(
            alt.Chart(levels).mark_rule(strokeDash=[6, 3]).encode(y=alt.Y("length:Q"), color=alt.Color("percentile:N"))
        )
    return with_contract_changes(doc, alt.layer(*layers))


def values_chart(values: pd.DataFrame, top: int = 20) -> Chart:
    """The most frequent values of the period as bars; the ones the baseline never had stand out."""
    frame = (
        values.sort_values("count (period)", ascending=False)
        .head(top)
        .assign(seen=lambda f: f["new"].map({True: "new (not in the baseline)", False: "in the baseline"}))
    )
    chart: alt.Chart = (
        alt.Chart(frame)
        .mark_bar()
        .encode(
            x=alt.X("count (period):Q", title="outputs in the period"),
            y=alt.Y("value:N", sort="-x", title=None),
            color=alt.Color(
                "seen:N",
                title=None,
                scale=alt.Scale(domain=["new (not in the baseline)", "in the baseline"], range=["#e8590c", "#9aa5b1"]),
            ),
            tooltip=[
                alt.Tooltip("value:N"),
                alt.Tooltip("count (period):Q"),
                alt.Tooltip("count (baseline):Q"),
                alt.Tooltip("seen:N"),
            ],
        )
    )
    return chart


def values_table(doc: dict[str, Any]) -> pd.DataFrame:
    """Every value seen in the period (counts summed over the steps) beside the baseline's counts;
    ``new`` marks a value the baseline never had."""
    seen: dict[str, int] = {}
    for item in doc["series"]:
        for v, n in (item.get("values") or {}).items():
            seen[v] = seen.get(v, 0) + int(n)
    base = (doc.get("baseline") or {}).get("values") or {}
    has_baseline = bool(doc.get("baseline") and doc["baseline"].get("present"))
    rows = [
        {
            "value": v,
            "count (period)": seen.get(v, 0),
            "count (baseline)": base.get(v, 0),
            "new": has_baseline and v not in base,
        }
        for v in set(seen) | set(base)
    ]
    frame = pd.DataFrame(rows, columns=["value", "count (period)", "count (baseline)", "new"])
    return frame.sort_values(["new", "count (period)", "value"], ascending=[False, False, True]).reset_index(drop=True)


def version_usage_frame(usage: dict[str, Any]) -> pd.DataFrame:
    """One row per (version, step) of ``GET /v1/contracts/usage``: time at the step's end, outputs,
    checked, and the share of checked outputs breaking the version (None when none was checked)."""
    rows = [
        {
            "time": _time(step),
            WHEN: utc_text(_time(step)),
            "version": v["version"] or "untagged",
            "outputs": step["outputs"],
            "checked": step["checked"],
            "violations": step["violation_rate"],
        }
        for v in usage["versions"]
        for step in v["series"]
    ]
    return pd.DataFrame(rows, columns=["time", WHEN, "version", "outputs", "checked", "violations"])


def version_violation_chart(usage: dict[str, Any]) -> Chart:
    """Share of checked outputs breaking their contract version, one line per version over time."""
    frame = version_usage_frame(usage).dropna(subset=["violations"])
    chart: alt.Chart = (
        alt.Chart(frame)
        .mark_line(point=True)
        .encode(
            x=_x(usage),
            y=alt.Y("violations:Q", axis=alt.Axis(format=".0%"), title="breaking it", scale=alt.Scale(domainMin=0)),
            color=alt.Color("version:N", title="version"),
            tooltip=[
                _WHEN_TIP,
                alt.Tooltip("version:N"),
                alt.Tooltip("violations:Q", format=".1%"),
                alt.Tooltip("checked:Q"),
            ],
        )
    )
    return chart


def version_outputs_chart(usage: dict[str, Any]) -> Chart:
    """Outputs tagged with each version per step, stacked: a rollout shows as one colour taking over."""
    frame = version_usage_frame(usage)
    chart: alt.Chart = (
        alt.Chart(frame)
        .mark_area()
        .encode(
            x=_x(usage),
            y=alt.Y("outputs:Q", stack="zero", title="outputs"),
            color=alt.Color("version:N", title="version"),
            tooltip=[_WHEN_TIP, alt.Tooltip("version:N"), alt.Tooltip("outputs:Q"), alt.Tooltip("checked:Q")],
        )
    )
    return chart
