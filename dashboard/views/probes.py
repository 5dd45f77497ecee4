"""Probes: the probe suites that ran, their last runs, the three first-decision scores over time
against their thresholds, and the failed cases of a run with the expected and the actual decision.

``GET /v1/probes/runs`` and ``GET /v1/probes/runs/{run_id}`` (README, "Probes and shadows").
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import pandas as pd
import streamlit as st

from shapewatch.dashboard import ui

SCORES = ("tool_accuracy", "argument_accuracy", "spurious_calls")


def _pct(score: dict[str, Any] | None) -> str:
    if not score or score.get("value") is None:
        return "-"
    return f"{100 * score['value']:.1f}% ({score['hits']}/{score['n']})"


def run_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "run": r["run_id"],
            "finished": r["finished_at"],
            "trigger": r["trigger"],
            "served model": r["served_model"] or "-",
            **{name.replace("_", " "): _pct(r["scores"].get(name)) for name in SCORES},
            "cases": r["cases"],
            "without answer": r["errors"],
            "accepted": "yes" if r["accepted"] else "no",
        }
        for r in runs
    ]


def score_series(runs: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per run, oldest first: each score and its threshold."""
    rows = []
    for r in sorted(runs, key=lambda r: r["finished_at"]):
        row: dict[str, Any] = {"finished": r["finished_at"]}
        for name in SCORES:
            s = r["scores"].get(name) or {}
            row[name] = s.get("value")
            row[f"{name} threshold"] = r["thresholds"].get(name)
        rows.append(row)
    return pd.DataFrame(rows).set_index("finished") if rows else pd.DataFrame()


def _decision(d: dict[str, Any] | None) -> str:
    if d is None:
        return "no answer"
    if d.get("tool") is None:
        return "no tool"
    args = d.get("arguments") or {}
    return f"{d['tool']} {args}"


def case_rows(run: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "case": c["case_id"],
            "failed": ", ".join(c["failed"]) or ("no answer" if c["error"] else "-"),
            "expected": _decision(c["expected"]),
            "actual": c["error"] or _decision(c["actual"]),
        }
        for c in run["results"]
        if c["failed"] or c["error"]
    ]


def render(s: ui.Session) -> None:
    st.title("Probes")
    runs = s.read("/v1/probes/runs", limit=500)
    if not runs:
        st.info(
            "No probe suite has run yet: `shapewatch probe run SUITE`, or list suites under [probes] in the "
            "service's configuration to run them daily."
        )
        return
    suites = sorted({r["suite"] for r in runs})
    suite = st.selectbox("Suite", suites, key="probes-suite")
    mine = [r for r in runs if r["suite"] == suite]
    last = mine[0]
    cols = st.columns(3)
    for col, name in zip(cols, SCORES, strict=True):
        limit = last["thresholds"].get(name)
        col.metric(name.replace("_", " "), _pct(last["scores"].get(name)), help=f"threshold {limit}")
    st.caption(
        f"{ui.literal(last['model'])} (served by {ui.literal(last['served_model'] or '-')}) · "
        f"{ui.literal(last['prompt_version'])} / {ui.literal(last['contract'])}"
    )
    st.subheader("Scores over time")
    series = score_series(mine)
    if len(series) > 1:
        st.line_chart(series)
    else:
        st.caption("One run so far: the chart starts with the second.")
    st.subheader("Last runs")
    st.dataframe(pd.DataFrame(run_rows(mine[:50])), hide_index=True)
    picked = st.selectbox("Failed cases of run", [r["run_id"] for r in mine[:50]], key="probes-run")
    run = s.read(f"/v1/probes/runs/{quote(picked, safe='')}")
    failed = case_rows(run)
    if failed:
        st.dataframe(pd.DataFrame(failed), hide_index=True)
    else:
        st.caption("Every case of this run made the expected first decision.")


ui.run_page(render)
