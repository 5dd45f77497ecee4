"""One run of a probe suite: every case sent to the provider, its first decision read, the three
scores counted, and the outputs turned into ``source=probe`` envelopes with the run as ``run_id``.

The first decision of a case is its first tool call (the tool and its arguments), or no tool.
Scores, each with its counts:

- ``tool_accuracy``: of the cases that expect a tool, the share whose first call is that tool;
- ``argument_accuracy``: of those that called the right tool and name critical arguments, the
  share whose critical arguments all match their rules;
- ``spurious_calls``: of the negative cases (``no_tool = true``), the share that called a tool.

A case the provider never answered (``ProbeCallFailed``, an unreadable response) is listed with
its error and counted in no score; a run with such a case is not *accepted* (see
``collector/store/probes.py``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson

from shapewatch.collector import AdapterError, adapt_response
from shapewatch.collector.store import Store

from .providers import Pacer, ProbeCallFailed, call_case
from .suite import Case, Suite

__all__ = ["SCORES", "CaseResult", "ProbeRun", "Score", "record_run", "run_suite"]

SCORES = ("tool_accuracy", "argument_accuracy", "spurious_calls")


@dataclass(frozen=True)
class CaseResult:
    position: int
    case: Case
    actual: dict[str, Any] | None  # {"tool": name or None, "arguments": {...}}; None: no answer
    error: str | None
    failed: tuple[str, ...]  # the scores this case counted against
    served_model: str | None
    envelopes: tuple[dict[str, Any], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "case": self.case.id,
            "negative": self.case.negative,
            "expected": self.case.expect.to_json() if self.case.expect else None,
            "actual": self.actual,
            "error": self.error,
            "failed": list(self.failed),
        }


@dataclass(frozen=True)
class Score:
    hits: int
    n: int

    @property
    def value(self) -> float | None:
        return self.hits / self.n if self.n else None

    def to_json(self) -> dict[str, Any]:
        return {"value": self.value, "hits": self.hits, "n": self.n}


@dataclass(frozen=True)
class ProbeRun:
    run_id: str
    suite: Suite
    trigger: str
    started_at: datetime
    finished_at: datetime
    results: tuple[CaseResult, ...]
    scores: dict[str, Score] = field(default_factory=dict)

    @property
    def errors(self) -> int:
        return sum(1 for r in self.results if r.error is not None)

    @property
    def accepted(self) -> bool:
        return self.errors == 0

    @property
    def served_model(self) -> str | None:
        served = [r.served_model for r in self.results if r.served_model]
        return max(set(served), key=served.count) if served else None

    @property
    def envelopes(self) -> list[dict[str, Any]]:
        return [e for r in self.results for e in r.envelopes]

    def breaches(self) -> list[str]:
        """The scores on the wrong side of their threshold."""
        out = []
        for name, score in self.scores.items():
            v, limit = score.value, self.suite.thresholds[name]
            if v is not None and (v > limit if name == "spurious_calls" else v < limit):
                out.append(name)
        return out

    def to_json(self) -> dict[str, Any]:
        s = self.suite
        return {
            "run_id": self.run_id,
            "suite": s.name,
            "model": s.model,
            "served_model": self.served_model,
            "prompt_version": s.prompt_version,
            "contract": s.contract,
            "trigger": self.trigger,
            "started_at": _iso(self.started_at),
            "finished_at": _iso(self.finished_at),
            "cases": len(self.results),
            "errors": self.errors,
            "accepted": self.accepted,
            "scores": {k: v.to_json() for k, v in self.scores.items()},
            "thresholds": dict(s.thresholds),
            "breaches": self.breaches(),
            "failed_cases": [r.to_json() for r in self.results if r.failed or r.error],
        }


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _argument(arguments: Any, name: str) -> tuple[bool, Any]:
    """The argument ``name`` (``a.b``: key b of object a), and whether it is there."""
    value = arguments
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            return False, None
        value = value[part]
    return True, value


def _judge(case: Case, actual: dict[str, Any]) -> tuple[str, ...]:
    expect = case.expect
    if expect is None:
        return ()
    if expect.tool is None:
        return ("spurious_calls",) if actual["tool"] is not None else ()
    if actual["tool"] != expect.tool:
        return ("tool_accuracy",)
    for name, rule in expect.arguments.items():
        there, value = _argument(actual["arguments"], name)
        if not there or not rule.matches(value):
            return ("argument_accuracy",)
    return ()


def _one(
    suite: Suite, run_id: str, position: int, case: Case, call: Callable[[Case], Any], now: datetime
) -> CaseResult:
    try:
        raw = call(case)
        adapted = adapt_response(
            suite.response_shape if suite.provider == "command" else suite.provider,
            raw,
            prompt_version=suite.prompt_version,
            model=suite.model,
            contract=suite.contract,
            source="probe",
        )
    except (ProbeCallFailed, AdapterError) as exc:
        return CaseResult(position, case, None, str(exc)[:500], (), None)
    served = next(
        (e.get("served_model") for e in adapted.envelopes if e.get("served_model")),
        next((o.served_model for o in adapted.outcomes if o.served_model), None),
    )
    first = next((e for e in adapted.envelopes if e["contract"] in suite.tool_names), None)
    actual = (
        {"tool": None, "arguments": {}} if first is None else {"tool": first["contract"], "arguments": first["output"]}
    )
    envelopes = tuple(
        {
            **e,
            "event_id": f"{run_id}:{position}:{i}",
            "ts": _iso(now),
            "run_id": run_id,
            "source": "probe",
            "attributes": {"probe_suite": suite.name, "probe_case": case.id},
        }
        for i, e in enumerate(adapted.envelopes)
    )
    return CaseResult(position, case, actual, None, _judge(case, actual), served, envelopes)


def _scores(results: tuple[CaseResult, ...]) -> dict[str, Score]:
    answered = [r for r in results if r.error is None and r.case.expect is not None]
    positive = [r for r in answered if not r.case.negative]
    right_tool = [r for r in positive if "tool_accuracy" not in r.failed]
    with_args = [r for r in right_tool if r.case.expect is not None and r.case.expect.arguments]
    negative = [r for r in answered if r.case.negative]
    return {
        "tool_accuracy": Score(len(right_tool), len(positive)),
        "argument_accuracy": Score(sum("argument_accuracy" not in r.failed for r in with_args), len(with_args)),
        "spurious_calls": Score(sum("spurious_calls" in r.failed for r in negative), len(negative)),
    }


def run_suite(
    suite: Suite,
    *,
    trigger: str = "manual",
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    transport: httpx.BaseTransport | None = None,
    sleep: Callable[[float], None] | None = None,
    backoff_seconds: float = 1.0,
) -> ProbeRun:
    """Run every case of ``suite`` (``concurrency`` at a time, paced to ``rate_per_second``) and score it."""
    run_id = f"probe-{uuid.uuid4().hex[:16]}"
    started = clock()
    pacer = Pacer(suite.rate_per_second)
    extra: dict[str, Any] = {} if sleep is None else {"sleep": sleep}
    with httpx.Client(timeout=suite.timeout_seconds, transport=transport) as client:

        def call(case: Case) -> Any:
            return call_case(suite, case, client, pacer, backoff_seconds=backoff_seconds, **extra)

        with ThreadPoolExecutor(max_workers=suite.concurrency, thread_name_prefix="probe") as pool:
            futures = [
                pool.submit(lambda i, c: _one(suite, run_id, i, c, call, clock()), i, c)
                for i, c in enumerate(suite.cases)
            ]
            results = tuple(f.result() for f in futures)
    return ProbeRun(run_id, suite, trigger, started, clock(), results, _scores(results))


def record_run(store: Store, run: ProbeRun, *, limits: Any = None) -> dict[str, int]:
    """Store a run into a store held by this process: its outputs as envelopes (through the
    envelope rules, like every ingest), then the run and its cases. Returns the write counts."""
    from shapewatch.collector import EnvelopeInvalid, Limits, validate_envelope

    lim = limits or Limits()
    envs, rejected = [], 0
    for e in run.envelopes:
        try:
            envs.append(validate_envelope(e, lim))
        except EnvelopeInvalid:
            rejected += 1
    written = store.write_batch(envs) if envs else []
    store.add_probe_run(run_row(run), case_rows(run))
    return {"envelopes": len(written), "rejected": rejected}


def run_row(run: ProbeRun) -> list[Any]:
    s = run.suite
    return [
        run.run_id,
        s.name,
        s.model,
        s.prompt_version,
        s.contract,
        run.served_model,
        run.started_at,
        run.finished_at,
        run.trigger,
        len(run.results),
        run.errors,
        run.accepted,
        orjson.dumps({k: v.to_json() for k, v in run.scores.items()}).decode(),
        orjson.dumps(s.thresholds).decode(),
    ]


def case_rows(run: ProbeRun) -> list[list[Any]]:
    return [
        [
            run.run_id,
            r.position,
            r.case.id,
            r.case.negative,
            orjson.dumps(r.case.expect.to_json() if r.case.expect else None).decode(),
            None if r.actual is None else orjson.dumps(r.actual).decode(),
            r.error,
            ",".join(r.failed),
        ]
        for r in run.results
    ]
