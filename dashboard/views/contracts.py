"""Contracts: the registered contract versions, what changed between two of them, how often the
outputs tagged with each break it over time, and which cohorts send which version.

``GET /v1/contracts`` (the registered versions), ``GET /v1/contracts/diff`` (the classified
changes between two versions: breaking, behavioral, compatible, as ``shapewatch contract diff``
prints them) and ``GET /v1/contracts/usage`` (outputs and violation rates per version and step,
and the cohorts per version). Contracts that outputs name but nobody registered are listed too:
their outputs cannot be checked.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from shapewatch.dashboard import charts, ui

VERDICT_COLOUR = {"breaking": "red", "behavioral": "orange", "compatible": "green", "unchanged": "gray"}


def registered_rows(registered: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "contract": r["contract"],
            "version": r["version"],
            "tools": ", ".join(t or "(schema)" for t in r.get("tools") or []),
            "formats": ", ".join(r.get("formats") or []),
            "registered": r.get("registered_at"),
            "author": r.get("author") or "",
            "note": r.get("note") or "",
            "invocation hash": str(r.get("invocation_hash") or "")[:12],
        }
        for r in registered
    ]


def _diff(s: ui.Session, contract: str, versions: list[str]) -> None:
    st.subheader("What changed between two versions")
    if len(versions) < 2:
        st.caption("One registered version: nothing to compare yet.")
        return
    left, right = st.columns(2)
    old = left.selectbox("From version", versions, index=len(versions) - 2, key="contracts-from")
    new = right.selectbox("To version", versions, index=len(versions) - 1, key="contracts-to")
    if old == new:
        st.caption("Pick two different versions.")
        return
    diff = s.read("/v1/contracts/diff", contract=contract, to=new, **{"from": old})
    verdict = str(diff["verdict"])
    st.markdown(
        f"**:{VERDICT_COLOUR.get(verdict, 'gray')}[{ui.literal(verdict.upper())}]** "
        f"{ui.literal(old, code=True)} → {ui.literal(new, code=True)}: {len(diff['changes'])} change(s)"
    )
    if diff["changes"]:
        st.dataframe(
            pd.DataFrame(
                [
                    {
                        "classification": c["classification"],
                        "tool": c.get("tool") or "",
                        "path": c.get("path") or "(the schema)",
                        "kind": c["kind"],
                        "detail": c["detail"],
                    }
                    for c in diff["changes"]
                ]
            ),
            hide_index=True,
        )


def _usage(s: ui.Session, contract: str) -> None:
    usage = s.read("/v1/contracts/usage", contract=contract)
    versions = [v for v in usage["versions"] if v["outputs"]]
    st.subheader("Outputs breaking each version, last 7 days")
    if not versions:
        st.caption("No output of this contract in the last 7 days.")
        return
    frame = charts.version_usage_frame(usage)
    if frame["violations"].notna().any():
        st.altair_chart(charts.version_violation_chart(usage))
        st.caption("Share of the outputs checked against the version they were tagged with that break it.")
    else:
        st.caption("No output tagged with a registered version was checked in this period.")
    st.altair_chart(charts.version_outputs_chart(usage))
    st.subheader("Which cohorts send which version")
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "version": v["version"] or "untagged",
                    "registered": "yes" if v["registered"] else "no: not checked",
                    "cohort": ui.cohort_label(c["cohort"]),
                    "outputs (7 days)": c["outputs"],
                }
                for v in usage["versions"]
                for c in v["cohorts"]
            ]
        ),
        hide_index=True,
    )


def render(s: ui.Session) -> None:
    st.title("Contracts")
    registered = s.read("/v1/contracts")
    cohorts = s.read("/v1/cohorts")
    names = sorted({r["contract"] for r in registered} | {c["cohort"]["contract"] for c in cohorts})
    if not names:
        st.info(
            "No contract yet: register one with `shapewatch contract register` (or POST /v1/contracts), "
            "and tag outputs with its contract_version."
        )
        return
    if registered:
        st.dataframe(pd.DataFrame(registered_rows(registered)), hide_index=True)
    else:
        st.caption("No contract version is registered: outputs are counted by their tags, never checked.")
    wanted = st.query_params.get("contract", "")
    contract = st.selectbox("Contract", names, index=names.index(wanted) if wanted in names else 0)
    st.query_params["contract"] = contract
    versions = [r["version"] for r in registered if r["contract"] == contract]
    if not versions:
        st.warning(f"{ui.literal(contract, code=True)} has outputs but no registered version: nothing checks them.")
    _diff(s, contract, versions)
    _usage(s, contract)


ui.run_page(render)
