"""Number percentiles and true shares from a real database, through the series read the
dashboard uses (``admin.field_series``), into the field page's charts; and the cohorts read's
outcome rates."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
from synth import CONTRACT, MODEL, PROMPT, synth_outputs, write_outputs

from shapewatch.analysis import admin
from shapewatch.analysis.config import AnalyzerConfig
from shapewatch.analysis.store_access import SCHEMAS
from shapewatch.baselines import Cohort, freeze_baseline
from shapewatch.collector import Store
from shapewatch.dashboard import number_charts

T0 = datetime(2026, 11, 1, tzinfo=UTC)
HOUR = timedelta(hours=1)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(tmp_path / "charts.duckdb", schemas=SCHEMAS) as s:
        yield s


def outputs(n: int, score: int, review_every: int, seed: int) -> list[dict[str, Any]]:
    out = synth_outputs(seed, n)
    for i, o in enumerate(out):
        o["score"] = score + i % 11  # score .. score + 10
        o["needs_review"] = i % review_every == 0
    return out


def series(store: Store) -> dict[str, Any]:
    write_outputs(store, outputs(1_100, 10, 10, 1), T0, HOUR, id_prefix="b")
    freeze_baseline(store, Cohort(MODEL, PROMPT, CONTRACT), T0, T0 + HOUR, author="ana", note="ref", now=T0 + HOUR)
    write_outputs(store, outputs(1_100, 40, 4, 2), T0 + 2 * HOUR, HOUR, id_prefix="w")
    cid = store.cohort_id(MODEL, PROMPT, CONTRACT)
    assert cid is not None
    return {
        "score": admin.field_series(store, AnalyzerConfig(), cid, "score", since=T0, until=T0 + 3 * HOUR, points=3),
        "review": admin.field_series(
            store, AnalyzerConfig(), cid, "needs_review", since=T0, until=T0 + 3 * HOUR, points=3
        ),
        "cid": cid,
    }


def test_the_series_carries_number_levels_and_true_shares_against_the_baseline(store: Store) -> None:
    got = series(store)
    score, review = got["score"], got["review"]
    assert [p["numbers"] for p in score["series"]] == [
        {"p10": 11.0, "p50": 15.0, "p90": 19.0},
        None,  # the empty hour
        {"p10": 41.0, "p50": 45.0, "p90": 49.0},
    ]
    assert score["baseline"]["numbers"] == {"p10": 11.0, "p50": 15.0, "p90": 19.0}
    assert [p["true_share"] for p in review["series"]] == [0.1, None, 0.25]
    assert review["baseline"]["true_share"] == 0.1
    assert [p["numbers"] for p in review["series"]] == [None, None, None]  # booleans are not numbers


def test_the_field_page_draws_them_with_the_baseline_dashed(store: Store) -> None:
    got = series(store)
    score, review = got["score"], got["review"]
    assert (number_charts.has_numbers(score), number_charts.has_true_share(score)) == (True, False)
    assert (number_charts.has_numbers(review), number_charts.has_true_share(review)) == (False, True)
    spec = number_charts.number_chart(score).to_dict()
    lines, rules = spec["layer"][0], spec["layer"][1]
    data = spec["datasets"]
    assert [(r["level"], r["value"]) for r in data[lines["data"]["name"]]] == [
        ("p10", 11.0),
        ("p50", 15.0),
        ("p90", 19.0),
        ("p10", 41.0),
        ("p50", 45.0),
        ("p90", 49.0),
    ]
    assert [(r["level"], r["value"]) for r in data[rules["data"]["name"]]] == [
        ("p10", 11.0),
        ("p50", 15.0),
        ("p90", 19.0),
    ]
    assert rules["mark"] == {"type": "rule", "strokeDash": [6, 3]}
    share = number_charts.true_share_chart(review).to_dict()
    assert [r["true share"] for r in share["datasets"][share["layer"][0]["data"]["name"]]] == [0.1, 0.25]
    assert share["datasets"][share["layer"][1]["data"]["name"]] == [{"true share": 0.1}]


def test_the_cohorts_read_gives_outcome_rates_of_responses(store: Store) -> None:
    write_outputs(
        store, outputs(200, 1, 5, 3), T0, HOUR, finish_reasons=dict.fromkeys(range(10), "length") | {10: "SAFETY"}
    )
    assert store.record_outcomes([(MODEL, PROMPT, CONTRACT, T0, "invalid_json")] * 50) == [True] * 50
    (row,) = admin.cohorts(store, since=T0, until=T0 + HOUR)
    # 200 outputs and 50 responses without one: 250 responses
    assert row["outcome_rates"] == {"truncation_rate": 0.04, "refusal_rate": 0.004, "invalid_output_rate": 0.2}


def test_the_cohorts_page_shows_the_non_zero_rates() -> None:
    from shapewatch.dashboard.views.cohorts import outcome_rates_text

    assert outcome_rates_text({"truncation_rate": 0.04, "refusal_rate": 0.0, "invalid_output_rate": 0.2}) == (
        "truncated 4.0%, invalid 20.0%"
    )
    assert outcome_rates_text({"truncation_rate": 0.0}) == "-"
    assert outcome_rates_text({}) == "-"
