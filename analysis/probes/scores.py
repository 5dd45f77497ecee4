"""Judging probe suite scores: one check per score of each suite's newest run in the analyzer's
view, on the cohort (model, prompt version, contract, ``probe``) the suite names.

A score breaches when it is on the wrong side of the suite's threshold (``tool_accuracy`` and
``argument_accuracy`` under it, ``spurious_calls`` over it), or when it dropped significantly
from the suite's previous accepted run: by at least ``MIN_DROP`` and with a two-proportion test
under the field rules' alpha. The alert carries both runs' counts and every failed case with the
expected and the actual first decision, so the page says which cases broke.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import orjson

from shapewatch.baselines import Cohort
from shapewatch.collector.store import ProbeRunRow, Store

from ..config import AlertKind, AnalyzerConfig
from ..rules import Check, two_proportion_p

__all__ = ["LOOKBACK", "MIN_DROP", "probe_checks"]

#: A suite's newest run is judged while it is at most this old (suites run daily by default).
LOOKBACK = timedelta(hours=48)
#: The least drop from the previous accepted run that can breach.
MIN_DROP = 0.05
_KINDS = {
    "tool_accuracy": AlertKind.probe_tool_accuracy,
    "argument_accuracy": AlertKind.probe_argument_accuracy,
    "spurious_calls": AlertKind.probe_spurious_calls,
}
_FAILED_SHOWN = 50  # failed cases listed in one alert


def _scores(row: ProbeRunRow) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = orjson.loads(row.scores)
    return out


def _failed(store: Store, run_id: str, score: str) -> list[dict[str, Any]]:
    return [
        {
            "case": c.case_id,
            "expected": orjson.loads(c.expected),
            "actual": orjson.loads(c.actual) if c.actual else None,
        }
        for c in store.probe_results(run_id)
        if score in c.failed.split(",")
    ][:_FAILED_SHOWN]


def _describe(case: dict[str, Any]) -> str:
    def decision(d: dict[str, Any] | None) -> str:
        if d is None:
            return "?"
        if d.get("tool") is None:
            return "no tool"
        args = d.get("arguments") or {}
        return f"{d['tool']}({orjson.dumps(args).decode()[:120]})"

    return f"{case['case']}: expected {decision(case['expected'])}, got {decision(case['actual'])}"


def probe_checks(store: Store, config: AnalyzerConfig, at: datetime) -> dict[Cohort, list[Check]]:
    """The score checks of every suite whose newest run finished in ``[at - LOOKBACK, at)``, by cohort."""
    out: dict[Cohort, list[Check]] = {}
    for latest, previous in store.probe_suites_latest(at - LOOKBACK, at):
        cohort = Cohort(latest.model, latest.prompt_version, latest.contract, "probe")
        out.setdefault(cohort, []).extend(_checks(store, config, latest, previous))
    return out


def _checks(store: Store, config: AnalyzerConfig, latest: ProbeRunRow, previous: ProbeRunRow | None) -> Sequence[Check]:
    scores, thresholds = _scores(latest), orjson.loads(latest.thresholds)
    before = _scores(previous) if previous is not None else {}
    checks = []
    alpha = config.defaults.alpha
    for name, kind in _KINDS.items():
        s = scores.get(name)
        if not s or not s["n"]:
            continue
        value, limit = float(s["value"]), float(thresholds[name])
        worse_is_up = name == "spurious_calls"
        under = value > limit if worse_is_up else value < limit
        drop, p = 0.0, 1.0
        b = before.get(name)
        if b and b["n"]:
            drop = (value - float(b["value"])) if worse_is_up else (float(b["value"]) - value)
            p = two_proportion_p(int(s["hits"]), int(s["n"]), int(b["hits"]), int(b["n"]))
        dropped = drop >= MIN_DROP and p < alpha
        failed = _failed(store, latest.run_id, name)
        word = "over" if worse_is_up else "under"
        detail = f"{latest.suite}: {name.replace('_', ' ')} {value:.1%} ({s['hits']}/{s['n']})"
        if under:
            detail += f", {word} the threshold {limit:.0%}"
        if dropped and b is not None:
            detail += f", {'up' if worse_is_up else 'down'} from {float(b['value']):.1%} in the previous accepted run"
        if failed:
            detail += "; failed: " + "; ".join(_describe(c) for c in failed[:5])
            if len(failed) > 5:
                detail += f"; and {len(failed) - 5} more"
        checks.append(
            Check(
                field=f"probe:{latest.suite}",
                kind=kind,
                value=None,
                severity=config.defaults.severity_of(kind),
                # a fact, not an estimate: breached (1) or not (0); a drop carries its test's p-value
                effect=1.0 if under or dropped else 0.0,
                threshold=1.0,
                p_value=0.0 if under else p,
                alpha=alpha,
                baseline={
                    "threshold": limit,
                    "previous_run": previous.run_id if previous is not None else None,
                    "previous": b,
                },
                current={
                    "run_id": latest.run_id,
                    "served_model": latest.served_model,
                    "value": value,
                    "hits": s["hits"],
                    "samples": s["n"],
                    "failed_cases": failed,
                },
                detail=detail,
            )
        )
    return checks
