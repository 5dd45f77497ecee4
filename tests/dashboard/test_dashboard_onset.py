"""The onset helpers of the field page and the alert card (dashboard/onset.py)."""

from __future__ import annotations

from datetime import UTC, datetime

import altair as alt
import pandas as pd

from shapewatch.dashboard import onset

NOW = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)
ALERT = {
    "onset": {
        "at": "2026-11-29T03:10:00Z",
        "low": "2026-11-29T03:05:00Z",
        "high": "2026-11-29T03:15:00Z",
        "method": "m",
    },
    "fired_at": "2026-11-29T08:10:00Z",
}


def test_a_link_period_wins_and_a_bad_one_falls_back_to_the_onset() -> None:
    link = {"since": "2026-11-29T02:00:00Z", "until": "2026-11-29T09:00:00Z"}
    assert onset.period(link, [ALERT], NOW) == ("2026-11-29T02:00:00Z", "2026-11-29T09:00:00Z", 84)
    # From before the onset (a quarter of the time since it, at least an hour) to now.
    expected = ("2026-11-29T01:36:15Z", "2026-11-29T09:00:00Z", 88)
    for bad in (
        {},
        {"since": "yesterday"},
        {"since": "2026-11-29T10:00:00Z", "until": "2026-11-29T09:00:00Z"},  # ends before it starts
        {"since": "2020-01-01T00:00:00Z"},  # longer than 31 days
        {"since": "2026-11-29T02:00:00"},  # no zone
        {"since": "2" * 10_000},
    ):
        assert onset.period(bad, [ALERT], NOW) == expected, bad
    assert onset.period({}, [{"onset": None}], NOW) is None  # the page's own period


def test_the_caption_says_since_when_and_how_long_before_the_page() -> None:
    assert onset.caption(ALERT) == "since 03:10 UTC on 2026-11-29 (between 03:05 and 03:15), 5 h before the page"
    assert onset.caption({"onset": None}) is None
    assert onset.caption({"onset": {"at": "not a time"}}) is None


def test_onset_and_fired_are_marked_on_the_chart() -> None:
    chart = alt.Chart(pd.DataFrame({"time": [NOW], "y": [1]})).mark_line().encode(x="time:T", y="y:Q")
    spec = onset.marked(chart, [ALERT]).to_dict()
    marks = [layer for layer in spec["layer"] if layer["mark"]["type"] in ("rule", "text")]
    assert len(marks) == 2
    assert onset.marked(chart, [{"onset": None}]) is chart
