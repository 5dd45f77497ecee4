"""Baselines and review: the weekly meeting's page.

Every baseline, active and past (``GET /v1/baselines``); a side-by-side diff
of a baseline against a candidate window (``GET /v1/baselines/{id}`` beside
``GET /v1/cohorts/{id}/fields?since=&until=``); freezing that window
(``POST /v1/baselines``) or activating another baseline
(``POST /v1/baselines/{id}/activate``), each with a note and only after an
explicit confirmation, since a frozen baseline never changes; and the weekly
review report (``GET /v1/review``), rendered and as an HTML download.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pandas as pd
import streamlit as st

from shapewatch.dashboard import ui
from shapewatch.dashboard.client import RequestRefused
from shapewatch.dashboard.compare import baseline_window_rows

PENDING = "_baselines_pending"
TABS = ["Baselines", "Compare and freeze", "Weekly review"]
TAB_KEY = "baselines-tab"  # the open tab's label in the session state


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _parse(text: str) -> datetime | None:
    try:
        t = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo is not None else None


def _short(iso: str | None) -> str:
    """``2026-11-29 12:00`` (UTC) from an ISO time; the text as it is when it is none."""
    t = _parse(iso or "")
    return f"{t.astimezone(UTC):%Y-%m-%d %H:%M}" if t else str(iso or "")


def baseline_rows(baselines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The listing's rows, the columns a reviewer decides on first (who froze what, when): at
    1,400 px the author and the note must not fall off the right edge."""
    return [
        {
            "baseline": b["baseline_id"],
            "active": "active" if b["active"] else "",
            "cohort": ui.cohort_label(b["cohort"]),
            "author": b["author"],
            "frozen (UTC)": _short(b["created_at"]),
            "window (UTC)": f"{_short(b['window']['since'])} .. {_short(b['window']['until'])}",
            "samples": b["samples"],
            "note": b["note"],
            "unpinned model": "⚠ unpinned" if b.get("unpinned") else "",
            "forced": b.get("forced") or "",
        }
        for b in baselines
    ]


def _listing(baselines: list[dict[str, Any]]) -> None:
    if not baselines:
        st.info("No baseline yet. Pick a cohort and a calm window below, compare it, and freeze it.")
        return
    st.dataframe(
        pd.DataFrame(baseline_rows(baselines)),
        hide_index=True,
        column_config={
            "baseline": st.column_config.TextColumn(width="small"),
            "active": st.column_config.TextColumn(width="small"),
            "author": st.column_config.TextColumn(width="small"),
            "samples": st.column_config.NumberColumn(width="small"),
            "note": st.column_config.TextColumn(width="medium"),
        },
    )


def _confirm(s: ui.Session) -> None:
    """The second step of a freeze or an activation: nothing is written before it."""
    pending = st.session_state.get(PENDING)
    if not pending:
        return
    with st.container(border=True):
        if pending["action"] == "freeze":
            st.warning(
                f"Freeze **{ui.literal(pending['label'])}** over {ui.literal(pending['since'])} .. "
                f"{ui.literal(pending['until'])} as a new "
                f"baseline{' and make it active' if pending['activate'] else ''}? A frozen baseline never "
                f"changes. Note: \u201c{ui.literal(pending['note'])}\u201d"
            )
        else:
            st.warning(
                f"Make baseline **{ui.literal(pending['baseline_id'])}** the active one of "
                f"**{ui.literal(pending['label'])}**? Note: \u201c{ui.literal(pending['note'])}\u201d"
            )
        yes, no = st.columns(2)
        confirmed = yes.button("Confirm", type="primary", key="baselines-confirm")
        cancelled = no.button("Cancel", key="baselines-cancel")
    if cancelled:
        st.session_state.pop(PENDING, None)
        st.rerun()
    if not confirmed:
        return
    st.session_state.pop(PENDING, None)
    try:
        if pending["action"] == "freeze":
            c = pending["cohort"]
            done = s.api.freeze(
                model=c["model"],
                prompt_version=c["prompt_version"],
                contract=c["contract"],
                since=pending["since"],
                until=pending["until"],
                note=pending["note"],
                author=s.author,
                activate=pending["activate"],
                force=pending["force"] or None,
                source=c.get("source", "production"),
            )
            message = f"Froze baseline {ui.literal(done['baseline_id'])} ({ui.literal(done['samples'])} samples)" + (
                ", now active." if done.get("active") else ", not active."
            )
        else:
            done = s.api.activate(pending["baseline_id"], author=s.author, note=pending["note"])
            message = f"Baseline {ui.literal(done['baseline_id'])} is now active."
    except RequestRefused as exc:
        st.error(f"Not done. {ui.literal(exc.message)}")
        return
    ui.after_write(message)


def _compare_and_freeze(s: ui.Session, cohorts: list[dict[str, Any]], baselines: list[dict[str, Any]]) -> None:
    by_id = {int(c["cohort_id"]): c for c in cohorts}
    cid = st.selectbox(
        "Cohort", list(by_id), format_func=lambda i: ui.cohort_label(by_id[i]["cohort"]), key="baselines-cohort"
    )
    cohort = by_id[cid]
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    left, right = st.columns(2)
    since_text = left.text_input(
        "Candidate window from",
        _iso(today - timedelta(days=1)),
        key="baselines-since",
        help="ISO 8601 with a zone, e.g. 2026-11-29T00:00:00Z",
    )
    until_text = right.text_input("until (exclusive)", _iso(today), key="baselines-until")
    since, until = _parse(since_text), _parse(until_text)
    if since is None or until is None or since >= until:
        st.error(
            "Give the window as two ISO 8601 times with a zone (e.g. 2026-11-29T00:00:00Z), the first one earlier."
        )
        return

    own = [b for b in baselines if b["cohort"] == cohort["cohort"]]
    current = cohort.get("baseline")
    choices = {
        b["baseline_id"]: f"{b['baseline_id']} ({'active, ' if b['active'] else ''}{b['window']['since']} "
        f".. {b['window']['until']})"
        for b in own
    }
    if current and current["baseline_id"] not in choices:
        choices = {
            current["baseline_id"]: f"{current['baseline_id']} (inherited: {current['how'].replace('_', ' ')})",
            **choices,
        }
    window = s.read(f"/v1/cohorts/{cid}/fields", since=_iso(since), until=_iso(until))
    if choices:
        ids = list(choices)
        default = ids.index(current["baseline_id"]) if current and current["baseline_id"] in ids else 0
        bid = st.selectbox(
            "Compare with baseline", ids, index=default, format_func=lambda i: choices[i], key="baselines-compare"
        )
        doc = s.read(f"/v1/baselines/{bid}")
        st.caption(
            f"Baseline {ui.literal(bid)}: {ui.literal(doc['samples'])} samples over "
            f"{ui.literal(doc['window']['since'])} .. {ui.literal(doc['window']['until'])}, by "
            f"{ui.literal(doc['author'])}: {ui.literal(doc['note'])}  \n"
            f"Candidate window: {ui.literal(window['events'])} events."
        )
        rows = baseline_window_rows(doc["fields"], window["fields"])
    else:
        st.caption(
            f"This cohort has no baseline to compare with. Candidate window: {ui.literal(window['events'])} events."
        )
        rows = baseline_window_rows({}, window["fields"])
    if rows:
        st.dataframe(pd.DataFrame(rows), hide_index=True)
    else:
        st.info("No event in this window.")

    st.markdown("**Freeze this window as a baseline**")
    with st.form("freeze-form"):
        note = st.text_input("Note: why this window is the reference", key="freeze-note")
        activate = st.checkbox("Make it the cohort's active baseline", value=True, key="freeze-activate")
        force = st.text_input("Force reason (only to override the service's objections)", key="freeze-force")
        asked = st.form_submit_button("Freeze…")
    if asked:
        if not note.strip() or not s.author:
            st.warning("A baseline needs a note, and your name in the sidebar.")
        else:
            st.session_state[PENDING] = {
                "action": "freeze",
                "cohort": cohort["cohort"],
                "label": ui.cohort_label(cohort["cohort"]),
                "since": _iso(since),
                "until": _iso(until),
                "note": note.strip(),
                "activate": activate,
                "force": force.strip(),
            }

    inactive = [b for b in own if not b["active"]]
    if inactive:
        st.markdown("**Activate another baseline of this cohort**")
        with st.form("activate-form"):
            pick = st.selectbox(
                "Baseline",
                [b["baseline_id"] for b in inactive],
                key="activate-pick",
                format_func=lambda i: choices.get(i, i),
            )
            note2 = st.text_input("Note: why", key="activate-note")
            asked2 = st.form_submit_button("Activate…")
        if asked2:
            if not note2.strip() or not s.author:
                st.warning("An activation needs a note, and your name in the sidebar.")
            else:
                st.session_state[PENDING] = {
                    "action": "activate",
                    "baseline_id": pick,
                    "note": note2.strip(),
                    "label": ui.cohort_label(cohort["cohort"]),
                }
    _confirm(s)


def _review(s: ui.Session) -> None:
    period = st.selectbox("Review period", ["7d", "14d", "30d"], key="review-period")
    # Built on demand: the service walks the period day by day for every cohort (about a second
    # for the sample workspace), which no visit to the baselines list should wait for.
    if not st.toggle("Build the weekly review", key="review-on"):
        st.caption("The report compares every cohort's week with its baseline; build it when you need it.")
        return
    html = s.text("/v1/review", format="html", since=period)
    # The service's Markdown report escapes every stored value itself (analysis.review), so it is
    # rendered as Markdown here: its headings, lists and tables are the report's own.
    st.download_button(
        "Download the report (HTML)",
        html,
        file_name=f"shapewatch-review-{period}.html",
        mime="text/html",
        icon=":material/download:",
    )
    st.markdown(s.text("/v1/review", format="markdown", since=period))


def render(s: ui.Session) -> None:
    st.title("Baselines and review")
    ui.show_flash()
    baselines = s.read("/v1/baselines")
    # Only the open tab is drawn (a switch reruns the page): the other two cost the browser a fifth
    # of the page's load, forms, grid and reads included, on every visit to the listing.
    listing, compare, review = st.tabs(TABS, key=TAB_KEY, on_change="rerun")
    if listing.open:
        with listing:
            _listing(baselines)
    if compare.open:
        with compare:
            cohorts = s.read("/v1/cohorts")
            if cohorts:
                _compare_and_freeze(s, cohorts, baselines)
            else:
                st.info("No cohort yet: nothing was ever sent to the collector.")
    if review.open:
        with review:
            _review(s)


ui.run_page(render)
