"""Run-level signals and mined cases: what an agent run did, judged once the run is complete.

Two steps, as for fields:

1. **Counting** (``judge_complete_runs``, a scheduled job): a run none of whose steps arrived for
   ``run_idle_seconds`` is complete. Its tool calls (the model's ``tool_call`` decisions; a run
   traced without content falls back to its ``execute_tool`` spans) give its signals: a tool called
   three or more times (a *retry loop*), the same tool with the same arguments twice in a row (a
   *repeated call*), a tool the run's contract version does not declare (a *spurious call*), and a
   configured handoff tool. They are counted into the store's run rollups per cohort (model,
   prompt version, the run's contract), agent release and bucket, with the run's number of tool
   calls; runs that match a mining rule (the signals above, a structured output that breaks the
   contract version it was tagged with, a handoff) are queued as cases, at most
   ``cases_per_rule_day`` per rule and day (the rest counted).
2. **Judging** (``run_checks``, called by each evaluation for a cohort with a baseline): the
   share of runs with each signal under each agent release in the window, against the share over
   the baseline's window, with the guards of every rule: a minimum of runs on both sides
   (``RunRules.min_runs``), a tolerance (``tolerance``: only a rise counts) and significance
   (Fisher's exact test, adjusted with every test of the evaluation). Tool calls per run are
   judged by their p90 (``run_length_shift``). A share is never an alarm by itself: in public
   traces of an airline agent, 37% of runs call one tool three times as normal work.

>>> signals = run_signals([])           # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import pairwise

import orjson
from scipy.stats import fisher_exact, mannwhitneyu

from shapewatch.baselines import Baseline, Cohort
from shapewatch.collector import Store
from shapewatch.collector.rollup import ContractStatus
from shapewatch.collector.store import RunRollupRow, RunStepRow

from .config import AlertKind, Severity
from .rules import Check

__all__ = [
    "RUN_FIELD",
    "CaseRule",
    "RunRules",
    "RunSignals",
    "judge_complete_runs",
    "run_checks",
    "run_contract",
    "run_signals",
]

log = logging.getLogger(__name__)

#: The field name run-level alerts carry (their value is the agent release).
RUN_FIELD = "(run)"
_NO_RELEASE = ""


class CaseRule:
    """The mining rules, by name (a case's ``rule``)."""

    retry_loop = "retry_loop"
    repeated_call = "repeated_call"
    spurious_call = "spurious_call"
    invalid_output = "invalid_output"
    handoff = "handoff"
    ALL = (retry_loop, repeated_call, spurious_call, invalid_output, handoff)


@dataclass(frozen=True)
class RunRules:
    """The guards of run-level judgement.

    >>> RunRules().min_runs, RunRules().tolerance
    (50, 0.1)
    """

    min_runs: int = 50  # runs on both sides, per release
    tolerance: float = 0.10  # rise of a share of runs, absolute (0.10 = 10 points)
    length_tolerance: float = 0.5  # relative rise of the p90 of tool calls per run
    length_min_change: int = 1  # ... and at least this many calls
    alpha: float = 0.01


@dataclass(frozen=True)
class RunSignals:
    """What one complete run did, and where it is counted."""

    model: str
    prompt_version: str
    contract: str
    agent_release: str
    source: str
    last_ts: datetime
    tool_calls: int
    retry_loop: str | None  # the tool called >= 3 times (the most called)
    repeated_call: str | None  # the tool called twice in a row with the same arguments
    undeclared: tuple[str, ...]
    handoff: tuple[str, ...]


def run_contract(steps: Sequence[RunStepRow]) -> str:
    """The contract a run answers: its structured outputs' (an application that sends envelopes
    names the tool as each call's contract, and the run's contract on its outputs), else the one
    its first step names (a traced span names it on every step)."""
    return next((s.contract for s in steps if s.kind == "output"), steps[0].run_contract)


def run_signals(
    steps: Sequence[RunStepRow], declared: frozenset[str] | None = None, handoff_tools: Iterable[str] = ()
) -> RunSignals | None:
    """The signals of one run's steps, in order; None for a run with no model step (nothing to
    count it under). ``declared``: the tools the run's contract version declares (None: unknown,
    and no call counts as spurious)."""
    first = next((s for s in steps if s.model is not None), None)
    if first is None or first.model is None:
        return None
    calls = [(s.tool, s.args_hash) for s in steps if s.kind == "tool_call" and s.tool is not None]
    if not calls:  # traced without content: the tools that ran are the calls
        calls = [(s.tool, s.args_hash) for s in steps if s.kind == "tool_execution" and s.tool is not None]
    counts = Counter(t for t, _ in calls)
    top = counts.most_common(1)
    repeated = next((a[0] for a, b in pairwise(calls) if a == b and a[1] is not None), None)
    tools = {t for t, _ in calls if t is not None}
    handoffs = frozenset(handoff_tools)
    return RunSignals(
        model=first.model,
        prompt_version=first.prompt_version,
        contract=run_contract(steps),
        agent_release=next((s.agent_release for s in steps if s.agent_release), _NO_RELEASE),
        source=next((s.source for s in steps if s.source), "production"),
        last_ts=max(s.ts for s in steps),
        tool_calls=len(calls),
        retry_loop=top[0][0] if top and top[0][1] >= 3 else None,
        repeated_call=repeated,
        undeclared=tuple(sorted(tools - declared)) if declared is not None else (),
        handoff=tuple(sorted(tools & handoffs)),
    )


def _declared_tools(store: Store, contract: str, version: str | None) -> frozenset[str] | None:
    """The tool names a registered contract version declares; None when it is not registered or
    declares none (then no call can be judged spurious)."""
    if version is None:
        return None
    row = store.contract_version(contract, version)
    if row is None:
        return None
    try:
        names = frozenset(t["name"] for t in orjson.loads(row.tools) if isinstance(t, dict) and t.get("name"))
    except (orjson.JSONDecodeError, TypeError):
        return None
    return names or None


def _broken_outputs(store: Store, steps: Sequence[RunStepRow]) -> list[str]:
    """The structured outputs of a run that break the contract version they were tagged with
    (``contract@version`` each), checked with the store's compiled validators."""
    tagged = {s.event_id: s for s in steps if s.kind == "output" and s.event_id and s.contract_version}
    if not tagged:
        return []
    broken = []
    for event in store.events_by_id(list(tagged)):
        step = tagged[event.event_id]
        assert step.contract_version is not None
        try:
            output = orjson.loads(event.output)
        except orjson.JSONDecodeError:
            continue
        status, _ = store.contract_validators.check(step.contract, step.contract_version, output)
        if status is ContractStatus.invalid:
            broken.append(f"{step.contract}@{step.contract_version}")
    return broken


def _cases(
    run_id: str, s: RunSignals, broken: Sequence[str] = ()
) -> list[tuple[str, str, str, str, str, str, str, str]]:
    found: list[tuple[str, str]] = []
    if broken:
        found.append((CaseRule.invalid_output, "an output breaks its contract: " + ", ".join(sorted(set(broken)))))
    if s.retry_loop:
        found.append((CaseRule.retry_loop, f"tool {s.retry_loop!r} called 3 or more times"))
    if s.repeated_call:
        found.append(
            (CaseRule.repeated_call, f"tool {s.repeated_call!r} called twice in a row with the same arguments")
        )
    if s.undeclared:
        found.append((CaseRule.spurious_call, "calls tools its contract does not declare: " + ", ".join(s.undeclared)))
    if s.handoff:
        found.append((CaseRule.handoff, "handed off to a human: " + ", ".join(s.handoff)))
    return [
        (rule, run_id, detail, s.source, s.model, s.prompt_version, s.contract, s.agent_release)
        for rule, detail in found
    ]


def judge_complete_runs(
    store: Store,
    *,
    idle: timedelta,
    cases_per_rule_day: int = 50,
    handoff_tools: Sequence[str] = (),
    now: datetime | None = None,
    limit: int = 10_000,
) -> tuple[int, int]:
    """Count the runs complete at ``now`` (no step for ``idle``) into run rollups and queue their
    cases; returns (runs judged, cases queued). Each run is judged once."""
    now = now or datetime.now(UTC)
    runs = store.complete_runs(now - idle, limit)
    if not runs:
        return 0, 0
    declared: dict[tuple[str, str | None], frozenset[str] | None] = {}
    counted: Counter[tuple[str, str, str, str, str, datetime, int]] = Counter()
    flags: dict[tuple[str, str, str, str, str, datetime, int], list[int]] = {}
    cases: list[tuple[str, str, str, str, str, str, str, str]] = []
    width = store.bucket_seconds
    for run_id, steps in runs.items():
        if not steps:
            continue
        contract = run_contract(steps)
        version = next((s.contract_version for s in steps if s.contract_version and s.contract == contract), None)
        key = (contract, version or next((s.contract_version for s in steps if s.contract_version), None))
        if key not in declared:
            declared[key] = _declared_tools(store, *key)
        signals = run_signals(steps, declared[key], handoff_tools)
        if signals is None:
            continue
        epoch = int(signals.last_ts.timestamp())
        bucket = datetime.fromtimestamp(epoch - epoch % width, UTC)
        k = (
            signals.source,
            signals.model,
            signals.prompt_version,
            signals.contract,
            signals.agent_release,
            bucket,
            signals.tool_calls,
        )
        counted[k] += 1
        f = flags.setdefault(k, [0, 0, 0])
        f[0] += signals.retry_loop is not None
        f[1] += signals.repeated_call is not None
        f[2] += bool(signals.undeclared)
        cases += _cases(run_id, signals, _broken_outputs(store, steps))
    rollups = [(*k, n, flags[k][0], flags[k][1], flags[k][2]) for k, n in counted.items()]
    queued = store.judge_runs(list(runs), rollups, cases, max_cases_per_rule_day=cases_per_rule_day, now=now)
    return len(runs), queued


# --- judging ------------------------------------------------------------------------------------


@dataclass
class _Tally:
    runs: int = 0
    retry_loops: int = 0
    repeated_calls: int = 0
    undeclared_calls: int = 0

    def __post_init__(self) -> None:
        self.lengths: Counter[int] = Counter()

    def add(self, r: RunRollupRow) -> None:
        self.runs += r.runs
        self.retry_loops += r.retry_loops
        self.repeated_calls += r.repeated_calls
        self.undeclared_calls += r.undeclared_calls
        self.lengths[r.tool_calls] += r.runs


def _tallies(rows: Iterable[RunRollupRow], cohort: Cohort, by_release: bool) -> dict[str, _Tally]:
    out: dict[str, _Tally] = {}
    for r in rows:
        if (r.model, r.prompt_version, r.contract) != (cohort.model, cohort.prompt_version, cohort.contract):
            continue
        out.setdefault(r.agent_release if by_release else "", _Tally()).add(r)
    return out


def _quantile(lengths: Counter[int], q: float) -> int:
    total = sum(lengths.values())
    seen = 0
    for length in sorted(lengths):
        seen += lengths[length]
        if seen >= q * total:
            return length
    return 0


_SHARES = (
    (AlertKind.retry_loop_rate, "retry_loops", Severity.page, "runs calling one tool 3 or more times"),
    (AlertKind.repeated_call_rate, "repeated_calls", Severity.warn, "runs repeating an identical call"),
    (AlertKind.undeclared_call_rate, "undeclared_calls", Severity.warn, "runs calling an undeclared tool"),
)


def run_checks(
    store: Store,
    cohort: Cohort,
    baseline: Baseline,
    since: datetime,
    until: datetime,
    rules: RunRules | None = None,
    *,
    rows: Sequence[RunRollupRow] | None = None,
) -> list[Check]:
    """The run-level checks of ``cohort`` in ``[since, until)`` per agent release, against the
    runs of the baseline's window (module docstring). ``rows``: the window's run rollups, when
    the caller read them once for every cohort."""
    rules = rules or RunRules()
    base = _tallies(store.run_rollups(baseline.since, baseline.until), cohort, by_release=False).get("")
    if base is None or base.runs < rules.min_runs:
        return []
    window = rows if rows is not None else store.run_rollups(since, until)
    checks: list[Check] = []
    for release, cur in sorted(_tallies(window, cohort, by_release=True).items()):
        if cur.runs < rules.min_runs:
            continue
        named = release or "(none)"
        for kind, attr, severity, words in _SHARES:
            b, c = getattr(base, attr), getattr(cur, attr)
            pb, pc = b / base.runs, c / cur.runs
            p = float(fisher_exact([[c, cur.runs - c], [b, base.runs - b]], alternative="greater")[1])
            checks.append(
                Check(
                    field=RUN_FIELD,
                    kind=kind,
                    value=release,
                    severity=severity,
                    effect=pc - pb,
                    threshold=rules.tolerance,
                    p_value=p,
                    alpha=rules.alpha,
                    baseline={"rate": round(pb, 6), "runs": base.runs},
                    current={"rate": round(pc, 6), "runs": cur.runs, "agent_release": named},
                    detail=f"{words} under release {named}: {pb:.1%} -> {pc:.1%}",
                )
            )
        b90, c90 = _quantile(base.lengths, 0.9), _quantile(cur.lengths, 0.9)
        rise = (c90 - b90) / max(b90, 1)
        effect = rise if c90 - b90 >= rules.length_min_change else 0.0
        p = _length_p(base.lengths, cur.lengths)
        checks.append(
            Check(
                field=RUN_FIELD,
                kind=AlertKind.run_length_shift,
                value=release,
                severity=Severity.warn,
                effect=effect,
                threshold=rules.length_tolerance,
                p_value=p,
                alpha=rules.alpha,
                baseline={
                    "p50": _quantile(base.lengths, 0.5),
                    "p90": b90,
                    "p99": _quantile(base.lengths, 0.99),
                    "runs": base.runs,
                },
                current={
                    "p50": _quantile(cur.lengths, 0.5),
                    "p90": c90,
                    "p99": _quantile(cur.lengths, 0.99),
                    "runs": cur.runs,
                    "agent_release": named,
                },
                detail=f"tool calls per run under release {named}: p90 {b90} -> {c90}",
            )
        )
    return checks


def _length_p(base: Counter[int], cur: Counter[int]) -> float:
    """One-sided Mann-Whitney U p-value that runs are longer now (histograms expanded, bounded)."""
    a = _expand(cur)
    b = _expand(base)
    if not a or not b or len(set(a) | set(b)) < 2:
        return 1.0
    return float(mannwhitneyu(a, b, alternative="greater").pvalue)


def _expand(hist: Counter[int], cap: int = 20_000) -> list[int]:
    total = sum(hist.values())
    scale = min(1.0, cap / total) if total else 1.0
    return [length for length, n in sorted(hist.items()) for _ in range(max(1, round(n * scale)))]
