"""Metric cardinality: 10,000 distinct tag values keep /metrics under 500 series.

10,000 events, each with its own model, prompt version, contract, served model, run id,
agent release, finish reason, attribute key and value, and its own top-level output key;
plus a "wide" cohort with a frozen baseline whose outputs carry 2,000 distinct top-level
keys, so that after ``POST /v1/analyzer/run`` the per-field gauges exist. Pass criterion:
the exposition of ``/metrics`` holds fewer than 500 sample lines (every line that is not a
comment: each is one series, ``_created``, ``_bucket`` and ``_sum`` lines included).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hostile_support import start_service

JSON = {"content-type": "application/json"}
N = 10_000
WIDE_EVENTS = 2_000
MAX_SERIES = 500


def _event(i: int) -> dict[str, object]:
    return {
        "event_id": f"card-{i}",
        "model": f"model-{i}",
        "prompt_version": f"pv-{i}",
        "contract": f"c-{i}",
        "served_model": f"served-{i}",
        "run_id": f"run-{i}",
        "agent_release": f"rel-{i}",
        "finish_reason": f"fin-{i}",
        "source": ("production", "probe", "shadow")[i % 3],
        "attributes": {f"attr-{i % 32}": f"value-{i}"},
        "output": {f"field_{i}": i, "common": "x"},
    }


def _wide(i: int) -> dict[str, object]:
    return {
        "event_id": f"wide-{i}",
        "model": "wide-model-2026-01-01",
        "prompt_version": "wide-v1",
        "contract": "wide",
        "output": {f"k_{i}": True, "common": "y"},
    }


@pytest.mark.reliability
def test_metrics_stay_under_500_series_with_10000_tag_values(tmp_path: Path, report: dict[str, object]) -> None:
    """Metric cardinality: 10,000 distinct tag values keep /metrics under 500 series"""
    svc = start_service(tmp_path / "card.duckdb")
    try:
        with svc.client() as c:
            since = datetime.now(UTC) - timedelta(minutes=5)
            accepted = 0
            events = [_event(i) for i in range(N)] + [_wide(i) for i in range(WIDE_EVENTS)]
            for start in range(0, len(events), 1000):
                r = c.post("/v1/outputs", content=json.dumps(events[start : start + 1000]).encode(), headers=JSON)
                assert r.status_code == 200, r.text
                accepted += r.json()["accepted"]
            # a rejected event with a distinct model too: reasons are a closed set
            c.post(
                "/v1/outputs", content=json.dumps({"model": "bad-model", "prompt_version": "x"}).encode(), headers=JSON
            )
            until = datetime.now(UTC) + timedelta(seconds=1)
            r = c.post(
                "/v1/baselines",
                json={
                    "model": "wide-model-2026-01-01",
                    "prompt_version": "wide-v1",
                    "contract": "wide",
                    "since": since.isoformat(),
                    "until": until.isoformat(),
                    "note": "cardinality",
                    "author": "rel",
                    "force": "cardinality scenario",
                },
            )
            assert r.status_code == 201, r.text
            t0 = time.perf_counter()
            r = c.post("/v1/analyzer/run", timeout=600)  # 10,001 cohorts: one evaluation takes a while
            run_seconds = time.perf_counter() - t0
            assert r.status_code == 200 and r.json()["ok"], r.text
            text = c.get("/metrics").text
    finally:
        # The service's own scheduled evaluation (30 s after start) may be judging the 10,001
        # cohorts now; SIGTERM waits for it, so allow it the time one evaluation takes.
        t0 = time.perf_counter()
        svc.proc.terminate()
        svc.proc.wait(600)
        report["seconds from SIGTERM to exit"] = round(time.perf_counter() - t0, 1)
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    families = Counter(line.split("{")[0].split(" ")[0] for line in samples)
    presence = families.get("shapewatch_field_presence_ratio", 0)
    report["events accepted"] = accepted
    report["distinct tag values per tag"] = N
    report["distinct top-level fields in the baselined cohort"] = WIDE_EVENTS + 1
    report["analyzer run over 10,001 cohorts, s"] = round(run_seconds, 1)
    report["series on /metrics"] = len(samples)
    report["per-field presence series"] = presence
    report["largest families"] = "; ".join(f"{k}: {n}" for k, n in families.most_common(5))
    assert accepted == N + WIDE_EVENTS
    assert presence > 0  # the analyzer ran and the per-field gauges exist
    assert len(samples) < MAX_SERIES, families.most_common(10)
