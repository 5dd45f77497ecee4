"""Cases to review: runs a mining rule found (a retry loop, a repeated call, a call to an
undeclared tool, a handoff), each accepted as a probe-suite case or dismissed.

``GET /v1/cases``, ``POST /v1/cases/{id}/accept`` and ``/dismiss`` (the admin scope). Accepted
cases download as JSONL, one probe case per line.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
import streamlit as st

from shapewatch.dashboard import ui

STATES = ("open", "accepted", "dismissed")


def _expected(tool: str, arguments: str) -> dict[str, Any] | str | None:
    """The decision a reviewer typed: None (keep the observed one), a dict, or a message saying what is wrong."""
    if not tool.strip():
        return None
    if tool.strip() == "no tool":
        return {"no_tool": True}
    try:
        args = json.loads(arguments or "{}")
    except ValueError as exc:
        return f"The arguments are not JSON: {exc}"
    if not isinstance(args, dict):
        return "The arguments must be a JSON object."
    return {"tool": tool.strip(), "arguments": args}


def _case_card(s: ui.Session, c: dict[str, Any]) -> None:
    with st.container(border=True):
        st.markdown(
            f"**{ui.literal(c['rule'])}** · {ui.literal(c['detail'])} · release "
            f"{ui.literal(c['agent_release'] or '-', code=True)} · {ui.literal(ui.cohort_label(c))} · "
            f"{ui.literal(ui.ago(c['created_at']))}"
        )
        st.page_link(
            "views/runs.py",
            label=f"Run {ui.literal(c['run_id'])}",
            icon=":material/timeline:",
            query_params={"run": c["run_id"]},
        )
        if c["state"] != "open":
            st.caption(
                f"{ui.literal(c['state'])} by {ui.literal(c['decided_by'] or '-')}: {ui.literal(c['note'] or '')}"
            )
            return
        with st.form(f"decide-{c['case_id']}", border=False):
            tool = st.text_input(
                "Expected tool (empty: the one the run called; 'no tool': none)", key=f"tool-{c['case_id']}"
            )
            arguments = st.text_input("Expected arguments (JSON)", value="{}", key=f"args-{c['case_id']}")
            note = st.text_input("Note", key=f"note-{c['case_id']}")
            left, right = st.columns(2)
            accept = left.form_submit_button("Accept as a probe case")
            dismiss = right.form_submit_button("Dismiss")
        if accept or dismiss:
            if not s.author:
                st.warning("Write your name in the sidebar first: decisions are signed.")
                return
            body: dict[str, Any] = {"author": s.author, "note": note.strip() or None}
            if accept:
                expect = _expected(tool, arguments)
                if isinstance(expect, str):
                    st.warning(expect)
                    return
                body["expect"] = expect
            s.api.post(f"/v1/cases/{c['case_id']}/{'accept' if accept else 'dismiss'}", body)
            ui.after_write(f"Case {c['case_id']} {'accepted' if accept else 'dismissed'} as {ui.literal(s.author)}.")


def render(s: ui.Session) -> None:
    st.title("Cases to review")
    ui.show_flash()
    state = st.segmented_control("State", STATES, default="open", key="cases-state") or "open"
    found = s.read("/v1/cases", state=state)
    cases, over = found["cases"], found["over_limit"]
    if over:
        st.caption(
            "Found beyond the daily bound (counted, not queued): "
            + ", ".join(f"{ui.literal(rule)} {n}" for rule, n in over.items())
        )
    if not cases:
        st.info(f"No {state} case.")
        return
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "case": c["case_id"],
                    "rule": c["rule"],
                    "run": c["run_id"],
                    "release": c["agent_release"],
                    "found": c["created_at"],
                }
                for c in cases
            ]
        ),
        hide_index=True,
    )
    if state == "accepted":
        lines = "".join(json.dumps(c["probe_case"]) + "\n" for c in cases if c["probe_case"])
        st.download_button("Download probe cases (JSONL)", lines, file_name="cases.jsonl", mime="application/x-ndjson")
        # the same cases as [[cases]] tables of a probe suite file (README, "Probes and shadows")
        tables = "\n".join(_suite_case_toml(c["probe_case"]["suite_case"]) for c in cases if _has_suite_case(c))
        st.download_button(
            "Download as probe suite cases (TOML)", tables, file_name="cases.toml", mime="application/toml"
        )
    for c in cases:
        _case_card(s, c)


def _has_suite_case(c: dict[str, Any]) -> bool:
    return bool(c.get("probe_case") and c["probe_case"].get("suite_case"))


def _suite_case_toml(case: dict[str, Any]) -> str:
    """A ``[[cases]]`` table; the dashboard imports no backend package, so the few lines are here."""
    return (
        "[[cases]]\n"
        f"id = {json.dumps(case['id'])}\n"
        f"messages = [{', '.join(_inline(m) for m in case['messages'])}]\n"
        f"expect = {_inline(case['expect'])}\n"
    )


def _inline(v: Any) -> str:
    if isinstance(v, dict):
        items = ", ".join(f"{json.dumps(k)} = {_inline(x)}" for k, x in v.items() if x is not None)
        return "{ " + items + " }" if items else "{}"
    if isinstance(v, list):
        return "[" + ", ".join(_inline(x) for x in v if x is not None) + "]"
    if isinstance(v, bool):
        return "true" if v else "false"
    return json.dumps(v)


ui.run_page(render)
