"""Agent runs: the runs that last received a step, and one run's steps in order.

``GET /v1/runs`` and ``GET /v1/runs/{run_id}``. A run is opened by its id (``?run=ID``, the
link the Cases page gives) or picked from the recent ones.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import pandas as pd
import streamlit as st

from shapewatch.dashboard import ui
from shapewatch.dashboard.client import RequestRefused


def step_rows(run: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "#": e["position"],
            "time": e["ts"],
            "kind": e["kind"],
            "tool / contract": e["tool"] or e["contract"],
            "contract version": e["contract_version"] or "-",
            "finish": e["finish_reason"] or "-",
            "arguments": (e["args_hash"] or "")[:12] or "-",
            "model": e["model"] if e["served_model"] in (None, e["model"]) else f"{e['model']} -> {e['served_model']}",
            "release": e["agent_release"] or "-",
        }
        for e in run["events"]
    ]


def _show_run(s: ui.Session, run_id: str) -> None:
    try:
        run = s.read(f"/v1/runs/{quote(run_id, safe='')}")
    except RequestRefused as exc:
        if exc.status in (404, 422):
            st.warning(f"No run {ui.literal(run_id, code=True)} is stored.")
            return
        raise
    st.subheader(f"Run {ui.literal(run['run_id'], code=True)}")
    cols = st.columns(4)
    cols[0].metric("Steps", run["steps"])
    cols[1].metric("Tool calls", run["tool_calls"])
    cols[2].metric("Agent releases", ", ".join(run["agent_releases"]) or "-")
    cols[3].metric("Judged", "yes" if run["judged_at"] else "not yet", help="Judged once no step arrived for a while.")
    versions = ", ".join(f"{c}@{'/'.join(v)}" for c, v in run["contract_versions"].items())
    st.markdown(
        f"{ui.literal(ui.ago(run['first_ts']))} to {ui.literal(ui.ago(run['last_ts']))} · "
        f"contract versions: {ui.literal(versions or '-')}"
    )
    st.dataframe(pd.DataFrame(step_rows(run)), hide_index=True)
    if run["events_omitted"]:
        st.caption(f"{run['events_omitted']} more steps not shown.")


def render(s: ui.Session) -> None:
    st.title("Agent runs")
    runs = s.read("/v1/runs", limit=100)
    wanted = st.query_params.get("run") or ""
    typed = st.text_input("Run id", value=wanted, help="A trace id, or the gen_ai.conversation.id of the run.")
    if not runs and not typed:
        st.info("No run yet: runs come from OpenTelemetry traces sent to POST /v1/traces.")
        return
    if runs:
        st.dataframe(
            pd.DataFrame(
                [
                    {
                        "run": r["run_id"],
                        "steps": r["steps"],
                        "first step": r["first_ts"],
                        "last step": r["last_ts"],
                        "judged": "yes" if r["judged_at"] else "not yet",
                    }
                    for r in runs
                ]
            ),
            hide_index=True,
        )
    picked = typed.strip() or (st.selectbox("Open a run", [r["run_id"] for r in runs], key="runs-pick") if runs else "")
    if picked:
        _show_run(s, picked)


ui.run_page(render)
