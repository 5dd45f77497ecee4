"""Schemathesis against the published OpenAPI document of a running service, every check on.

The schemathesis CLI (4.x) runs in a subprocess against ``/openapi.json`` of a real
``shapewatch serve`` with a token: coverage, fuzzing and stateful phases, ``--checks all``,
a fixed seed, a bounded number of examples per operation and a time budget. Its JSON
report is read back; the pass criterion is zero failures and zero errors.

One expectation is configured, not left at the tool's default: a request that matches the
schema may still be refused 422 (``positive_data_acceptance``). A schema cannot say "this
event_id was already stored with another payload" or "since must come before until"; 422 is
the documented answer for such semantic refusals (README, "Status codes"). Every other
finding is a defect of the product.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hostile_support import start_service

TOKEN = "schemathesis-token"
CONFIG = """\
[checks.positive_data_acceptance]
expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "422", "429", "5xx"]
"""


def run_schemathesis(
    tmp_path: Path, *, examples: int, max_time: int, paths: str | None, phases: str | None = None
) -> dict[str, Any]:
    svc = start_service(tmp_path / "st.duckdb", env={"SHAPEWATCH_TOKENS": TOKEN})
    try:
        config = tmp_path / "schemathesis.toml"
        config.write_text(CONFIG)
        cmd = [
            str(Path(sys.executable).with_name("st")),
            "--config-file",
            str(config),
            "run",
            svc.url + "/openapi.json",
            "--checks",
            "all",
            "-H",
            f"Authorization: Bearer {TOKEN}",
            "-n",
            str(examples),
            "--workers",
            "1",
            "--seed",
            "7",
            "--max-time",
            str(max_time),
            "--report",
            "json",
            "--report-json-path",
            str(tmp_path / "st.json"),
            "--request-timeout",
            "30",
        ]
        if paths:
            cmd += ["--include-path-regex", paths]
        if phases:
            cmd += ["--phases", phases]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max_time + 240, cwd=tmp_path)
    finally:
        svc.stop()
    report_path = tmp_path / "st.json"
    assert report_path.exists(), proc.stdout[-4000:] + proc.stderr[-2000:]
    report: dict[str, Any] = json.loads(report_path.read_text())
    report["_output"] = proc.stdout
    return report


def record(report: dict[str, object], st: dict[str, Any]) -> dict[str, int]:
    failures = {f"{f['code']} {f['title']}": int(f["count"]) for f in st["failures"]}
    report["operations tested"] = st["operations"]["tested"]
    report["test cases generated"] = st["test_cases"]["generated"]
    report["phases"] = ", ".join(f"{k}: {v['status']}" for k, v in st["phases"].items())
    report["failures"] = sum(failures.values())
    report["failures by check"] = "; ".join(f"{k}: {n}" for k, n in sorted(failures.items())) or "none"
    report["errors"] = len(st["errors"])
    report["seconds"] = round(st["running_time"], 1)
    return failures


def _failure_text(st: dict[str, Any]) -> str:
    out = st["_output"]
    return out[out.find("FAILURES") :][-6000:] if "FAILURES" in out else out[-3000:]


@pytest.mark.slow
def test_schemathesis_finds_nothing_on_the_ingest_routes(tmp_path: Path, report: dict[str, object]) -> None:
    """Schemathesis, smoke: the ingest routes (OTLP's too) and /healthz, every check, few examples"""
    st = run_schemathesis(
        tmp_path,
        examples=5,
        max_time=12,
        paths="^/(v1/outputs|v1/provider|v1/traces|healthz)",
        phases="coverage,fuzzing",
    )
    failures = record(report, st)
    assert st["operations"]["tested"] == 4
    assert (failures, st["errors"]) == ({}, []), _failure_text(st)


@pytest.mark.reliability
def test_schemathesis_finds_nothing_on_the_whole_api(tmp_path: Path, report: dict[str, object]) -> None:
    """Schemathesis: every documented operation, all checks, stateful included"""
    st = run_schemathesis(tmp_path, examples=25, max_time=240, paths=None)
    failures = record(report, st)
    spec_ops = st["operations"]["total"]
    assert spec_ops >= 20 and st["operations"]["tested"] == spec_ops
    assert st["phases"]["stateful"]["status"] != "skip"
    assert (failures, st["errors"]) == ({}, []), _failure_text(st)
