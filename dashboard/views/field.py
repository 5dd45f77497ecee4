"""Field detail: one field of one cohort over time, against its baseline.

Presence with the baseline level and tolerance band, type shares stacked,
values with the ones the baseline never had highlighted and the unknown
share, array-size percentiles (``GET /v1/cohorts/{id}/series``); the sample
outputs of the field's alerts; and the cohort's whole field table
(``GET /v1/cohorts/{id}/fields``). The cohort and field come from the query
string (``?cohort=1&field=customer.tier``), which the alerts page links to.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pandas as pd
import streamlit as st

from shapewatch.dashboard import charts, number_charts, onset, ui

SAMPLE_KEY = "field-sample-"  # the key of a sample output's expander: this, then the event id

PERIODS = {
    "last 24 hours": (timedelta(hours=24), 24),
    "last 3 days": (timedelta(days=3), 36),
    "last 7 days": (timedelta(days=7), 42),
}


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _index(options: list[Any], wanted: Any, fallback: int = 0) -> int:
    return options.index(wanted) if wanted in options else fallback


def _field_table(fields: dict[str, Any]) -> pd.DataFrame:
    table = pd.DataFrame(
        [
            {
                "field": f["path"],
                "units": f["units"],
                "filled": f["filled"],
                "presence": f["presence_rate"],
                "types": ", ".join(f"{t} {n}" for t, n in sorted(f["types"].items()) if n),
                "distinct values": "withheld" if f.get("values_withheld") else len(f.get("values") or {}),
                "array p50": f.get("array_p50"),
                "array p90": f.get("array_p90"),
                "array p99": f.get("array_p99"),
            }
            for f in fields["fields"]
        ]
    )
    if any(f.get("values_withheld") for f in fields["fields"]):
        # counts beside "withheld" are text, as the table shows them: a column of mixed types
        # fails Arrow's conversion first, on every run, before Streamlit turns it into text itself
        table["distinct values"] = table["distinct values"].astype("string")
    return table


def render(s: ui.Session) -> None:
    st.title("Field detail")
    cohorts = s.read("/v1/cohorts")
    if not cohorts:
        st.info("No cohort yet: nothing was ever sent to the collector.")
        return
    by_id = {int(c["cohort_id"]): c for c in cohorts}
    ids = list(by_id)
    wanted = st.query_params.get("cohort", "")
    left, mid, right = st.columns([3, 3, 2])
    with left:
        cid = st.selectbox(
            "Cohort",
            ids,
            index=_index(ids, int(wanted) if wanted.isdigit() else None),
            format_func=lambda i: ui.cohort_label(by_id[i]["cohort"]),
        )
    with right:
        period = st.selectbox("Period", list(PERIODS))
    span, points = PERIODS[period]
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    since = _iso(now - span)
    cohort = by_id[cid]
    fields = s.read(f"/v1/cohorts/{cid}/fields", since=since)
    paths = sorted({f["path"] for f in fields["fields"]})
    baseline = cohort.get("baseline")
    if baseline:
        paths = sorted(set(paths) | set(s.read(f"/v1/baselines/{baseline['baseline_id']}")["fields"]))
    if not paths:
        st.info("No field seen in this period.")
        return
    c = cohort["cohort"]
    open_alerts = s.read(
        "/v1/alerts", state="open", model=c["model"], prompt_version=c["prompt_version"], contract=c["contract"]
    )
    default_field = st.query_params.get("field") or next((a["field"] for a in open_alerts), paths[0])
    with mid:
        field = st.selectbox("Field", paths, index=_index(paths, default_field))
    st.query_params["cohort"] = str(cid)
    st.query_params["field"] = field

    field_alerts = [a for a in open_alerts if a["field"] == field]
    since, until, points = onset.period(st.query_params, field_alerts, now) or (since, _iso(now), points)
    doc = s.read(f"/v1/cohorts/{cid}/series", field=field, since=since, until=until, points=points)
    base = doc.get("baseline")
    if base is None:
        st.warning("This cohort has no baseline: the charts show the period alone. Freeze one on Baselines and review.")
    elif not base.get("present"):
        st.warning(
            f"{ui.literal(field, code=True)} is not in the baseline ({ui.literal(base['baseline_id'])}): "
            "every value of it is new."
        )
    else:
        st.caption(
            f"Compared with baseline {ui.literal(base['baseline_id'])} "
            f"({ui.literal(str(base['how']).replace('_', ' '))})."
        )
    for a in field_alerts:
        st.markdown(
            f"**:{'red' if a['severity'] == 'page' else 'orange'}[{ui.literal(str(a['severity']).upper())}]** "
            f"{ui.literal(a['kind'])}: {ui.literal(a['detail'])}"
        )
        if onset.caption(a):
            st.caption(ui.literal(onset.caption(a) or ""))

    st.subheader("Presence")
    # The field's configured tolerance (the series route carries it); the default before it did.
    tolerance = float((base or {}).get("tolerance", charts.TOLERANCE))
    st.altair_chart(onset.marked(charts.presence_chart(doc, tolerance), field_alerts))
    if base and base.get("present"):
        st.caption(
            f"Baseline presence {100 * base['presence_rate']:.1f}%; the band is +/- "
            f"{100 * tolerance:.0f} points (the field's tolerance)."
        )

    st.subheader("Type shares")
    st.altair_chart(charts.type_chart(doc))
    if base and base.get("types"):
        st.caption("Baseline: " + ", ".join(f"{ui.literal(t)} {100 * v:.1f}%" for t, v in base["types"].items()))

    kind = doc.get("values_kind", "enum")
    values = charts.values_table(doc) if charts.shows_values(doc) else None
    if values is not None and len(values):
        st.subheader("Values")
        new = values[values["new"]]
        if len(new):
            st.markdown(
                f"**{len(new)} value(s) the baseline never had:** "
                + ", ".join(ui.literal(v, code=True) for v in new["value"].head(10))
            )
        st.altair_chart(charts.values_chart(values))
        st.dataframe(values, hide_index=True)
        if any(item.get("unknown_share") is not None for item in doc["series"]):
            st.markdown("Share of the field's values outside the baseline's set")
            st.altair_chart(charts.unknown_chart(doc))
    elif kind == "free_text":
        st.caption(
            "Values: withheld. This field holds free text (ids, names, addresses) or is named in "
            "redact_paths: its values are personal data, never shown; presence and types above say how it moves."
        )
    elif kind == "numeric":
        st.caption(
            "Values: this is a number field, so its values are no set to compare; the type shares show "
            "numbers arriving as strings, and value_shift judges the numbers."
        )

    if any(item.get("violation_rate") for item in doc["series"]):
        st.subheader("Outputs breaking the contract")
        st.altair_chart(charts.violation_chart(doc))
        st.caption("Share of the outputs checked against their registered contract version that break it here.")
    for change in doc.get("contract_changes") or []:
        st.caption(
            f"Contract version {ui.literal(change['version'])} went out at {ui.literal(ui.ago(change['at']))} "
            "(marked on the charts)."
        )

    if any(item.get("array") for item in doc["series"]) or (base and base.get("array")):
        st.subheader("Array size")
        st.altair_chart(charts.array_chart(doc))
        if base and base.get("array"):
            b = base["array"]
            st.caption(
                f"Baseline p50/p90/p99: {ui.literal(b['p50'])}/{ui.literal(b['p90'])}/{ui.literal(b['p99'])} "
                "items (dashed)."
            )

    number_charts.render(doc, base)

    ids_ = sorted({i for a in field_alerts for i in (a.get("samples") or [])})[:100]
    if ids_:
        st.subheader("Sample outputs that show the change")
        for e in s.read("/v1/events", ids=ids_)[:6]:
            # Drawn when opened: a JSON viewer costs the browser on every load, open or not.
            box = st.expander(
                f"{ui.literal(e['event_id'])} · {ui.literal(e['ts'])}",
                key=f"{SAMPLE_KEY}{e['event_id']}",
                on_change="rerun",
            )
            if box.open:
                with box:
                    st.json(e["output"], expanded=True)

    st.subheader("Every field of the cohort")
    st.caption(
        f"{ui.literal(fields['events'])} events from {ui.literal(fields['since'])} to {ui.literal(fields['until'])}."
    )
    st.dataframe(_field_table(fields), hide_index=True)


ui.run_page(render)
