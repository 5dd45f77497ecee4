"""Ingestion health: what the store holds per cohort, events by outcome, rejects by reason,
duplicates, provider outcomes, the analyzer's runs.

What is stored comes from the store, so a restart of the service does not zero it: the raw
events held (``GET /healthz``), and per cohort the events counted and the last event
(``GET /v1/cohorts``, from the rollups). The counters come from
``GET /metrics`` (they count since the service started); events per second are measured between
two refreshes of this page. The analyzer's runs, with their errors, come from
``GET /v1/analyzer/runs``.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pandas as pd
import streamlit as st

from shapewatch.dashboard import ui
from shapewatch.dashboard.health import parse_metrics


def _stored(s: ui.Session) -> None:
    cohorts = s.read("/v1/cohorts")
    if not cohorts:
        st.info("Nothing is stored yet: no event was ever sent to the collector.")
        return
    lasts = [c["last_event_at"] for c in cohorts if c.get("last_event_at")]
    newest = max(lasts, default=None)
    cols = st.columns(3)
    cols[0].metric(
        "Events stored",
        f"{s.read('/healthz')['events']:,}",
        help="Raw events the store holds now (older ones go after the retention period).",
    )
    cols[1].metric("Cohorts", f"{len(cohorts):,}")
    cols[2].metric("Last event", ui.literal(ui.relative(newest)), help=ui.literal(ui.ago(newest)))
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "source": c["cohort"]["source"],
                    "model": c["cohort"]["model"],
                    "prompt version": c["cohort"]["prompt_version"],
                    "contract": c["cohort"]["contract"],
                    "events counted": c.get("events_total") or 0,
                    "last event": ui.ago(c.get("last_event_at")),
                }
                for c in sorted(cohorts, key=lambda c: c.get("last_event_at") or "", reverse=True)
            ]
        ),
        hide_index=True,
    )
    st.caption(
        "Read from the store: a restart of the service keeps these. Events counted per cohort since its "
        "first (raw events purged by retention included); a model that answered for an alias counts "
        "those outputs in its own cohort too."
    )


@ui.guard
def _counters(s: ui.Session) -> None:
    h = parse_metrics(s.text("/metrics"))
    now = time.monotonic()
    before = st.session_state.get("_ingest_rate")
    st.session_state["_ingest_rate"] = (now, h.events_total)
    rate = None
    if before and now - before[0] >= 1:
        rate = max(0.0, (h.events_total - before[1]) / (now - before[0]))
    cols = st.columns(5)
    cols[0].metric("Accepted", f"{h.events_by_outcome.get('accepted', 0):,.0f}")
    cols[1].metric("Duplicates", f"{h.duplicates:,.0f}", help="Retried events stored once (same event_id).")
    cols[2].metric("Rejected", f"{h.events_by_outcome.get('rejected', 0):,.0f}")
    cols[3].metric("Provider responses without output", f"{sum(h.provider_outcomes.values()):,.0f}")
    cols[4].metric(
        "Events/s", "-" if rate is None else f"{rate:,.1f}", help="Between the last two refreshes of this page."
    )
    st.caption("Counted by this service process since it started (a restart zeroes them).")

    left, right = st.columns(2)
    with left:
        st.subheader("Rejects by reason")
        if h.rejected_by_reason:
            st.dataframe(
                pd.DataFrame(sorted(h.rejected_by_reason.items(), key=lambda kv: -kv[1]), columns=["reason", "events"]),
                hide_index=True,
            )
        else:
            st.caption("No event rejected.")
        st.subheader("Truncated or refused outputs")
        if h.provider_outcomes:
            st.dataframe(
                pd.DataFrame(
                    [{"provider": p, "kind": k, "responses": n} for (p, k), n in sorted(h.provider_outcomes.items())]
                ),
                hide_index=True,
            )
        else:
            st.caption("None: every provider response yielded an output.")
    with right:
        st.subheader("Events by model and prompt version")
        if h.events_by_cohort:
            st.dataframe(
                pd.DataFrame(
                    [
                        {"model": m, "prompt version": p, **counts}
                        for (m, p), counts in sorted(h.events_by_cohort.items())
                    ]
                ).fillna(0),
                hide_index=True,
            )
        else:
            st.caption("No event received since the service started.")
        if h.notifications_pending:
            st.subheader("Pager notifications waiting")
            st.dataframe(
                pd.DataFrame(sorted(h.notifications_pending.items()), columns=["target", "pending"]), hide_index=True
            )


def _analyzer(s: ui.Session) -> None:
    st.subheader("Analyzer")
    runs = s.read("/v1/analyzer/runs", limit=50)
    if not runs:
        st.info("The analyzer has not run yet (the service runs it every few minutes).")
        return
    last = runs[0]
    failures = [r for r in runs if not r["ok"]]
    cols = st.columns(4)
    cols[0].metric("Last run", ui.literal(ui.relative(last["started_at"])), help=ui.literal(ui.ago(last["started_at"])))
    cols[1].metric("Result", "ok" if last["ok"] else "FAILED")
    cols[2].metric(
        "Cohorts / checks / breaches", " / ".join(ui.literal(last[k]) for k in ("cohorts", "checks", "breaches"))
    )
    cols[3].metric("Failures in the last runs", len(failures))
    if not last["ok"]:
        st.error(f"The last evaluation failed: {ui.literal(last['error'])}")
    elif failures:
        st.warning(
            f"{len(failures)} of the last {len(runs)} evaluations failed; the latest: "
            f"{ui.literal(failures[0]['error'])}"
        )
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "run": r["run_id"],
                    "started": r["started_at"],
                    "ok": r["ok"],
                    "seconds": r["duration_seconds"],
                    "cohorts": r["cohorts"],
                    "checks": r["checks"],
                    "breaches": r["breaches"],
                    "error": r["error"] or "",
                }
                for r in runs
            ]
        ),
        hide_index=True,
    )


def render(s: ui.Session) -> None:
    st.title("Ingestion health")
    s.text("/metrics")  # unreachable or refused: one message for the page, not one per section
    st.subheader("Stored")
    _stored(s)
    st.subheader("Since the service started")
    st.fragment(_counters, run_every=s.settings.refresh_seconds)(s)
    _analyzer(s)
    st.caption(f"Page built {datetime.now(UTC):%Y-%m-%d %H:%M:%S} UTC.")


ui.run_page(render)
