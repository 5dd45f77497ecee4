"""Alerts: what is paging, for which cohort and field, what changed and since when; acknowledge and silence.

Open alerts come grouped by severity, page first (``GET /v1/alerts``), each
with its diff against the baseline, its sample outputs (``GET /v1/events``)
and a link to its field's charts; the list refreshes itself every few
seconds. Resolved alerts follow as history.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd
import streamlit as st

from shapewatch.dashboard import onset, ui
from shapewatch.dashboard.compare import alert_diff_rows

ALERT_KINDS = (
    "presence_drop",
    "field_missing",
    "presence_rise",
    "new_type",
    "type_shift",
    "new_enum_value",
    "unknown_enum_growth",
    "cardinality_jump",
    "array_size_shift",
    "new_field",
    "schema_violation",
    "value_shift",
    "truncation_rate",
    "refusal_rate",
    "invalid_output_rate",
    "served_model_change",
    "unknown_contract_version",
    "assertion",
    "retry_loop_rate",
    "repeated_call_rate",
    "undeclared_call_rate",
    "traffic_stopped",
    "run_length_shift",
    "probe_tool_accuracy",
    "probe_argument_accuracy",
    "probe_spurious_calls",
)
STATES = {
    "open (pending and firing)": "open",
    "firing": "firing",
    "pending": "pending",
    "resolved": "resolved",
    "all": None,
}
ALL = "(all)"
SILENCE_KEY = "silence-open-"  # the key of an alert's silence expander: this, then its fingerprint
SOURCES = ["production", "probe", "shadow"]


def _choice(label: str, options: list[str], key: str) -> str | None:
    picked = st.selectbox(label, [ALL, *options], key=key)
    return None if picked == ALL else picked


def filter_label(state: Mapping[Any, Any]) -> str:
    """The filter button's label: the filters in force (``state``: the session state), as Markdown."""
    shown = [str(state.get("alerts-state", next(iter(STATES)))), str(state.get("alerts-source", SOURCES[0]))]
    shown += [
        str(state[k])
        for k in ("alerts-model", "alerts-prompt", "alerts-contract", "alerts-kind")
        if state.get(k) not in (None, ALL)
    ]
    return "Filters: " + ", ".join(ui.literal(v) for v in shown)


def _filters(cohorts: list[dict[str, Any]]) -> dict[str, str | None]:
    def values(k: str) -> list[str]:
        return sorted({c["cohort"][k] for c in cohorts})

    # In a popover: the select boxes keep their state on every run, and the browser draws them only
    # when it is opened (six of them cost a tenth of the page's load on every visit).
    with st.popover(filter_label(st.session_state), icon=":material/filter_list:"):
        # production first: what every view shows unless asked for another source
        source = st.selectbox("Source", SOURCES, key="alerts-source")
        state = STATES[st.selectbox("State", list(STATES), key="alerts-state")]
        model = _choice("Model", values("model"), "alerts-model")
        prompt_version = _choice("Prompt version", values("prompt_version"), "alerts-prompt")
        contract = _choice("Contract", values("contract"), "alerts-contract")
        kind = _choice("Kind", list(ALERT_KINDS), "alerts-kind")
    return {
        "state": state,
        "model": model,
        "prompt_version": prompt_version,
        "contract": contract,
        "kind": kind,
        "source": source,
    }


def _cohort_key(c: dict[str, Any]) -> tuple[str, str, str, str]:
    return c["model"], c["prompt_version"], c["contract"], c.get("source", "production")


def _actions(s: ui.Session, a: dict[str, Any]) -> None:
    fp = a["fingerprint"]
    left, right = st.columns([1, 3])
    with left:
        if st.button(
            "Acknowledge",
            key=f"ack-{fp}",
            disabled=bool(a.get("acknowledged_by")),
            help="Say that someone is on it; it changes who is told, not the alert's state.",
        ):
            if not s.author:
                st.warning("Write your name in the sidebar first: acknowledgements are signed.")
            else:
                s.api.acknowledge(fp, author=s.author)
                ui.after_write(
                    f"Acknowledged {ui.literal(a['kind'])} on {ui.literal(a['field'])} as {ui.literal(s.author)}."
                )
    with right:
        # The form is drawn when the expander is opened (a switch reruns the page): six forms cost
        # the browser a tenth of the page's load on every visit, opened or not.
        box = st.expander("Silence this alert", key=f"{SILENCE_KEY}{fp}", on_change="rerun")
    if not box.open:
        return
    with box:
        with st.form(f"silence-{fp}", border=False):
            duration = st.text_input("For how long", value="2h", help="e.g. 30m, 2h, 3d", key=f"silence-for-{fp}")
            reason = st.text_input("Reason", key=f"silence-reason-{fp}")
            submitted = st.form_submit_button("Silence")
        if submitted:
            if not reason.strip() or not s.author:
                st.warning("A silence needs a reason, and your name in the sidebar.")
            else:
                done = s.api.silence(duration=duration.strip(), author=s.author, reason=reason.strip(), fingerprint=fp)
                ui.after_write(
                    f"Silenced {ui.literal(a['kind'])} on {ui.literal(a['field'])} until {ui.literal(done['ends_at'])}."
                )


def _alert_card(
    s: ui.Session,
    a: dict[str, Any],
    cohort_ids: dict[tuple[str, str, str, str], int],
    events: dict[str, dict[str, Any]],
) -> None:
    c = a["cohort"]
    value = f" = {ui.literal(a['value'], code=True)}" if a.get("value") else ""
    with st.container(border=True):
        st.markdown(
            f"**:{'red' if a['severity'] == 'page' else 'orange'}[{ui.literal(str(a['severity']).upper())}]** "
            f"{ui.literal(a['field'], code=True)} · **{ui.literal(a['kind'])}**{value} · {ui.literal(a['state'])} · "
            f"{ui.literal(ui.cohort_label(c))}"
        )
        st.markdown(ui.literal(a["detail"]))
        if onset.caption(a):  # since when: the change point, before anything else about time
            st.markdown(f"**{ui.literal(onset.caption(a) or '')}**")
        when = (
            f"first seen {ui.literal(ui.ago(a['first_seen']))} · last seen {ui.literal(ui.ago(a['last_seen']))}"
            + (f" · fired {ui.literal(ui.ago(a['fired_at']))}" if a.get("fired_at") else "")
            + (f" · resolved {ui.literal(ui.ago(a['resolved_at']))}" if a.get("resolved_at") else "")
        )
        st.caption(when)
        notes = []
        if a.get("acknowledged_by"):
            notes.append(
                f"acknowledged by **{ui.literal(a['acknowledged_by'])}** {ui.literal(ui.ago(a.get('acknowledged_at')))}"
            )
        if a.get("silenced_until"):
            notes.append(f"silenced until {ui.literal(ui.ago(a['silenced_until']))}")
        if notes:
            st.markdown(" · ".join(notes))
        left, right = st.columns([3, 2])
        with left:
            # a static table: a few rows need no interactive grid, which costs the browser most of a card
            st.table(pd.DataFrame(alert_diff_rows(a)).set_index("measure"))
        with right:
            p, q = a.get("p_value"), a.get("q_value")
            st.markdown(
                f"p-value {'-' if p is None else f'{p:.2g}'} (adjusted {'-' if q is None else f'{q:.2g}'})  \n"
                f"effect {ui.literal(a.get('effect'))} over threshold {ui.literal(a.get('threshold'))}  \n"
                f"compared with {ui.literal(a.get('compared_with') or '-')}  \n"
                + contract_line(a.get("contracts") or {})
                + f"fingerprint {ui.literal(a['fingerprint'], code=True)}, episode {ui.literal(a.get('episode'))}"
            )
            cid = cohort_ids.get(_cohort_key(c))
            if cid is not None:
                st.page_link(
                    "views/field.py",
                    label=f"Charts of {ui.literal(a['field'])}",
                    icon=":material/show_chart:",
                    query_params={"cohort": str(cid), "field": a["field"]},
                )
        samples = [events[i] for i in a.get("samples") or [] if i in events]
        # Drawn only when asked for: every JSON viewer on the page costs the browser, on every load.
        if samples and st.toggle(f"Sample outputs ({len(samples)})", key=f"samples-{a['fingerprint']}"):
            for e in samples:
                st.caption(
                    f"{ui.literal(e['event_id'])} · {ui.literal(e['ts'])} · served by {ui.literal(e.get('served_model') or '-')}"
                )
                st.json(e["output"], expanded=True)
        if a["state"] != "resolved":
            _actions(s, a)


@ui.guard
def _alert_list(s: ui.Session, filters: dict[str, str | None]) -> None:
    ui.show_flash()
    alerts = s.read("/v1/alerts", **filters)
    cohort_ids = {_cohort_key(c["cohort"]): int(c["cohort_id"]) for c in s.read("/v1/cohorts")}
    ids = sorted({i for a in alerts for i in (a.get("samples") or [])})[:100]
    events = {e["event_id"]: e for e in s.read("/v1/events", ids=ids)} if ids else {}
    st.caption(
        f"{len(alerts)} alert(s) · refreshed {ui.literal(ui.ago(pd.Timestamp.now(tz='UTC').isoformat()))} "
        f"every {s.settings.refresh_seconds:g} s"
    )
    if not alerts:
        st.info(
            "No alert matches. Nothing is drifting away from its baseline, or nothing is judged yet "
            "(a cohort needs a frozen baseline: see Baselines and review)."
        )
    for severity in ("page", "warn"):
        group = [a for a in alerts if a["severity"] == severity]
        if not group:
            continue
        st.subheader(f"{'Page' if severity == 'page' else 'Warn'} ({len(group)})")
        for a in group:
            _alert_card(s, a, cohort_ids, events)


def _history(s: ui.Session, filters: dict[str, str | None]) -> None:
    resolved = s.read("/v1/alerts", **{**filters, "state": "resolved"})
    st.subheader(f"Resolved ({len(resolved)})")
    if not resolved:
        st.caption("No resolved alert yet.")
        return
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "severity": a["severity"],
                    "field": a["field"],
                    "kind": a["kind"],
                    "value": a.get("value") or "",
                    "cohort": ui.cohort_label(a["cohort"]),
                    "first seen": a["first_seen"],
                    "fired": a.get("fired_at"),
                    "resolved": a.get("resolved_at"),
                    "acknowledged by": a.get("acknowledged_by") or "",
                    "detail": a["detail"],
                }
                for a in resolved
            ]
        ),
        hide_index=True,
    )


def contract_line(k: dict[str, Any]) -> str:
    """The contract versions behind an alert, in words (empty without any)."""
    if not k.get("window"):
        return ""
    text = "contract " + ", ".join(f"{ui.literal(v)} ({ui.literal(n)} outputs)" for v, n in k["window"].items())
    if k.get("baseline"):
        text += "; baseline on " + ", ".join(ui.literal(v) for v in k["baseline"])
    for c in k.get("changes") or []:
        text += f"; **{ui.literal(c['version'])} went out {ui.literal(ui.ago(c['first_seen']))}**"
    return text + "  \n"


def render(s: ui.Session) -> None:
    st.title("Alerts")
    filters = _filters(s.read("/v1/cohorts"))
    st.fragment(_alert_list, run_every=s.settings.refresh_seconds)(s, filters)
    if filters["state"] == "open":
        _history(s, filters)


ui.run_page(render)
