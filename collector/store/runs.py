"""Agent runs (``RUNS_SCHEMA``): the ordered steps of each run, the runs themselves, the run-level
rollups counted once a run is complete, and the review queue of mined cases.

Steps arrive from ``POST /v1/traces`` (collector/otlp.py maps spans to ``RunStep``): each is kept
once under its key, so an exporter's retry adds nothing. A run is one row that its steps keep up
to date (first and last step time, when a step last arrived); ``analysis/runs.py``
judges a run once no step arrived for the configured idle time, and counts it here into
``run_rollups`` (a histogram by tool calls per run, with the runs that looped, repeated a call or
called a tool their contract does not declare), summed by readers like every rollup.

A run judged stays judged: a step arriving after that is kept and shown, and not counted again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple

import pyarrow as pa

from ..otlp import RunStep
from .core import StoreCore
from .schema import Schema

__all__ = ["RUNS_SCHEMA", "CaseRow", "RunRecords", "RunRollupRow", "RunRow", "RunStepRow"]

RUNS_SCHEMA = Schema(
    "runs",
    (
        """
CREATE TABLE run_steps (
    step_key VARCHAR PRIMARY KEY, run_id VARCHAR NOT NULL, ts TIMESTAMPTZ NOT NULL, position INTEGER NOT NULL,
    kind VARCHAR NOT NULL, trace_id VARCHAR NOT NULL, span_id VARCHAR NOT NULL, model VARCHAR, served_model VARCHAR,
    prompt_version VARCHAR NOT NULL, contract VARCHAR NOT NULL, contract_version VARCHAR, tool VARCHAR,
    args_hash VARCHAR, finish_reason VARCHAR, agent_release VARCHAR, source VARCHAR, event_id VARCHAR,
    run_contract VARCHAR NOT NULL, input_messages VARCHAR, received_at TIMESTAMPTZ NOT NULL);
CREATE TABLE runs (
    run_id VARCHAR PRIMARY KEY, first_ts TIMESTAMPTZ NOT NULL, last_ts TIMESTAMPTZ NOT NULL,
    last_received TIMESTAMPTZ NOT NULL, judged_at TIMESTAMPTZ);
-- One row per judged batch and key: runs with this many tool calls, and how many of them
-- looped (a tool called >= 3 times), repeated an identical call back to back, or called a
-- tool their contract does not declare. Appended; readers sum.
CREATE TABLE run_rollups (
    source VARCHAR NOT NULL, model VARCHAR NOT NULL, prompt_version VARCHAR NOT NULL, contract VARCHAR NOT NULL,
    agent_release VARCHAR NOT NULL, bucket TIMESTAMPTZ NOT NULL, tool_calls BIGINT NOT NULL, runs BIGINT NOT NULL,
    retry_loops BIGINT NOT NULL, repeated_calls BIGINT NOT NULL, undeclared_calls BIGINT NOT NULL);
CREATE SEQUENCE case_seq START 1;
CREATE TABLE cases (
    case_id BIGINT PRIMARY KEY DEFAULT nextval('case_seq'), rule VARCHAR NOT NULL, run_id VARCHAR NOT NULL,
    detail VARCHAR NOT NULL, source VARCHAR NOT NULL, model VARCHAR NOT NULL, prompt_version VARCHAR NOT NULL,
    contract VARCHAR NOT NULL, agent_release VARCHAR NOT NULL, created_at TIMESTAMPTZ NOT NULL,
    state VARCHAR NOT NULL, decided_at TIMESTAMPTZ, decided_by VARCHAR, note VARCHAR,
    -- an accepted case as a probe-suite case (JSON), fixed when it was accepted
    probe_case VARCHAR,
    UNIQUE (rule, run_id));
-- Cases a rule found beyond its daily bound: counted, not queued.
CREATE TABLE cases_over (day DATE NOT NULL, rule VARCHAR NOT NULL, n BIGINT NOT NULL, PRIMARY KEY (day, rule));
""",
    ),
)

_STEP_COLUMNS = (
    "step_key, run_id, ts, position, kind, trace_id, span_id, model, served_model, prompt_version, contract, "
    "contract_version, tool, args_hash, finish_reason, agent_release, source, event_id, run_contract, input_messages"
)
_STEP_NAMES = [*(c.strip() for c in _STEP_COLUMNS.split(",")), "received_at"]
_PROBE = 2000  # run ids looked up per IN list


class RunStepRow(NamedTuple):
    """A stored step of a run, in the columns' order."""

    step_key: str
    run_id: str
    ts: datetime
    position: int
    kind: str
    trace_id: str
    span_id: str
    model: str | None
    served_model: str | None
    prompt_version: str
    contract: str
    contract_version: str | None
    tool: str | None
    args_hash: str | None
    finish_reason: str | None
    agent_release: str | None
    source: str | None
    event_id: str | None
    run_contract: str
    input_messages: str | None


class RunRow(NamedTuple):
    """A run as stored: its span of time, steps, and when it was judged (None: not yet)."""

    run_id: str
    first_ts: datetime
    last_ts: datetime
    last_received: datetime
    steps: int
    judged_at: datetime | None


class RunRollupRow(NamedTuple):
    """Summed run rollups of one key and run length."""

    source: str
    model: str
    prompt_version: str
    contract: str
    agent_release: str
    tool_calls: int
    runs: int
    retry_loops: int
    repeated_calls: int
    undeclared_calls: int


class CaseRow(NamedTuple):
    """A mined case: a run a rule found, waiting for a person (``open``) or decided."""

    case_id: int
    rule: str
    run_id: str
    detail: str
    source: str
    model: str
    prompt_version: str
    contract: str
    agent_release: str
    created_at: datetime
    state: str
    decided_at: datetime | None
    decided_by: str | None
    note: str | None
    probe_case: str | None


def _step_row(s: RunStep) -> tuple[Any, ...]:
    return (
        s.key,
        s.run_id,
        s.ts,
        s.position,
        s.kind.value,
        s.trace_id,
        s.span_id,
        s.model,
        s.served_model,
        s.prompt_version,
        s.contract,
        s.contract_version,
        s.tool,
        s.args_hash,
        s.finish_reason,
        s.agent_release,
        s.source,
        s.event_id,
        s.run_contract,
        s.input_messages,
    )


class RunRecords(StoreCore):
    """Runs, their steps, run rollups and cases, as plain rows (module docstring)."""

    def record_run_steps(self, steps: Sequence[RunStep], *, now: datetime | None = None) -> None:
        """Keep the steps not kept before (by key) and bring their runs' times up to date, in one
        transaction. Idempotent: steps sent again (an exporter's retry, a request retried after
        a crash between the events' commit and this one) change nothing."""
        if not steps:
            return
        now = now or datetime.now(UTC)
        unique = list({s.key: s for s in steps}.values())
        per_run: dict[str, tuple[datetime, datetime]] = {}
        for s in unique:
            first, last = per_run.get(s.run_id, (s.ts, s.ts))
            per_run[s.run_id] = (min(first, s.ts), max(last, s.ts))
        rows = [(*_step_row(s), now) for s in unique]
        ids = list(per_run)
        steps_table = pa.table({n: [r[i] for r in rows] for i, n in enumerate(_STEP_NAMES)})
        runs_table = pa.table(
            {
                "run_id": ids,
                "first_ts": pa.array([per_run[i][0] for i in ids], pa.timestamp("us", tz="UTC")),
                "last_ts": pa.array([per_run[i][1] for i in ids], pa.timestamp("us", tz="UTC")),
            }
        )
        # Arrow tables in, one statement each (executemany runs one statement per row: 0.6 s
        # for a request of 512 spans); the key decides what is new, so nothing is looked up first.
        with self.transaction("recording run steps") as con:
            con.register("_new_steps", steps_table)
            con.register("_run_updates", runs_table)
            try:
                # OR REPLACE: the events' own write kept a plainer step under the same key (the
                # event id: collector/store/event_facts.py); this one knows the span.
                con.execute(f"INSERT OR REPLACE INTO run_steps ({_STEP_COLUMNS}, received_at) SELECT * FROM _new_steps")
                con.execute(
                    """INSERT INTO runs (run_id, first_ts, last_ts, last_received, judged_at)
                       SELECT run_id, first_ts, last_ts, ?, NULL FROM _run_updates
                       ON CONFLICT (run_id) DO UPDATE SET first_ts = least(runs.first_ts, excluded.first_ts),
                           last_ts = greatest(runs.last_ts, excluded.last_ts), last_received = excluded.last_received""",
                    [now],
                )
            finally:
                con.unregister("_new_steps")
                con.unregister("_run_updates")

    def purge_runs(self, before: datetime) -> int:
        """Delete the runs whose last step arrived before ``before``, with their steps (the raw side
        of runs, kept as long as raw events); their rollups and cases stay. Returns the runs deleted."""
        with self.transaction("purging old runs") as con:
            row = con.execute("SELECT count(*) FROM runs WHERE last_received < ?", [before]).fetchone()
            n = int(row[0]) if row else 0
            if n:
                con.execute(
                    "DELETE FROM run_steps WHERE run_id IN (SELECT run_id FROM runs WHERE last_received < ?)", [before]
                )
                con.execute("DELETE FROM runs WHERE last_received < ?", [before])
        return n

    def run(self, run_id: str) -> RunRow | None:
        rows = self.query(
            "SELECT run_id, first_ts, last_ts, last_received, "
            "(SELECT count(*) FROM run_steps s WHERE s.run_id = r.run_id), judged_at FROM runs r WHERE run_id = ?",
            [run_id],
        )
        return RunRow(*rows[0]) if rows else None

    def run_steps(self, run_id: str, limit: int = 10_000) -> list[RunStepRow]:
        """A run's steps in the order it took them (time, then position in the span)."""
        return [
            RunStepRow(*r)
            for r in self.query(
                f"SELECT {_STEP_COLUMNS} FROM run_steps WHERE run_id = ? ORDER BY ts, span_id, position LIMIT ?",
                [run_id, limit],
            )
        ]

    def recent_runs(self, limit: int = 100) -> list[RunRow]:
        """The runs that last received a step, newest first."""
        return [
            RunRow(*r)
            for r in self.query(
                "WITH recent AS (SELECT * FROM runs ORDER BY last_received DESC, run_id LIMIT ?) "
                "SELECT r.run_id, r.first_ts, r.last_ts, r.last_received, count(s.run_id), r.judged_at "
                "FROM recent r LEFT JOIN run_steps s USING (run_id) GROUP BY ALL "
                "ORDER BY r.last_received DESC, r.run_id",
                [limit],
            )
        ]

    def complete_runs(self, idle_since: datetime, limit: int = 10_000) -> dict[str, list[RunStepRow]]:
        """Runs not judged yet whose last step arrived before ``idle_since``, with their steps in order."""
        ids = [
            r[0]
            for r in self.query(
                "SELECT run_id FROM runs WHERE judged_at IS NULL AND last_received < ? ORDER BY last_received LIMIT ?",
                [idle_since, limit],
            )
        ]
        out: dict[str, list[RunStepRow]] = {i: [] for i in ids}
        for i in range(0, len(ids), _PROBE):
            chunk = ids[i : i + _PROBE]
            for r in self.query(
                f"SELECT {_STEP_COLUMNS} FROM run_steps WHERE run_id IN ({', '.join('?' * len(chunk))}) "
                "ORDER BY run_id, ts, span_id, position",
                chunk,
            ):
                out[r[1]].append(RunStepRow(*r))
        return out

    def judge_runs(
        self,
        run_ids: Sequence[str],
        rollups: Sequence[tuple[str, str, str, str, str, datetime, int, int, int, int, int]],
        cases: Sequence[tuple[str, str, str, str, str, str, str, str]],
        *,
        max_cases_per_rule_day: int,
        now: datetime | None = None,
    ) -> int:
        """Mark runs judged, append their rollup rows (source, model, prompt_version, contract,
        agent_release, bucket, tool_calls, runs, retry_loops, repeated_calls, undeclared_calls)
        and queue their cases (rule, run_id, detail, source, model, prompt_version, contract,
        agent_release), all in one transaction; a rule's cases beyond its daily bound are counted in
        ``cases_over``. Returns the cases queued."""
        now = now or datetime.now(UTC)
        queued = 0
        with self.transaction("judging runs") as con:
            if run_ids:
                con.executemany("UPDATE runs SET judged_at = ? WHERE run_id = ?", [(now, r) for r in run_ids])
            if rollups:
                con.executemany(
                    "INSERT INTO run_rollups (source, model, prompt_version, contract, agent_release, bucket, "
                    "tool_calls, runs, retry_loops, repeated_calls, undeclared_calls) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    list(rollups),
                )
            day = now.date()
            today: Counter[str] = Counter(
                {
                    str(rule): int(n)
                    for rule, n in con.execute(
                        "SELECT rule, count(*) FROM cases WHERE created_at::DATE = ? GROUP BY rule", [day]
                    ).fetchall()
                }
            )
            over: Counter[str] = Counter()
            for case in cases:
                rule = case[0]
                if today[rule] >= max_cases_per_rule_day:
                    over[rule] += 1
                    continue
                found = con.execute("SELECT 1 FROM cases WHERE rule = ? AND run_id = ?", [rule, case[1]]).fetchall()
                if found:
                    continue
                con.execute(
                    "INSERT INTO cases (rule, run_id, detail, source, model, prompt_version, contract, agent_release, "
                    "created_at, state) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'open')",
                    [*case, now],
                )
                today[rule] += 1
                queued += 1
            for rule, n in over.items():
                con.execute(
                    "INSERT INTO cases_over (day, rule, n) VALUES (?, ?, ?) "
                    "ON CONFLICT (day, rule) DO UPDATE SET n = cases_over.n + excluded.n",
                    [day, rule, n],
                )
        return queued

    def run_rollups(self, since: datetime, until: datetime) -> list[RunRollupRow]:
        """Run rollups of runs whose last step falls in ``[since, until)``, summed per key and run length."""
        return [
            RunRollupRow(*r[:5], *(int(x) for x in r[5:]))
            for r in self.query(
                "SELECT source, model, prompt_version, contract, agent_release, tool_calls, sum(runs), "
                "sum(retry_loops), sum(repeated_calls), sum(undeclared_calls) FROM run_rollups "
                "WHERE bucket >= ? AND bucket < ? GROUP BY ALL ORDER BY ALL",
                [since, until],
            )
        ]

    def case_rows(self, *, state: str | None = None, limit: int = 200) -> list[CaseRow]:
        """Cases, newest first; ``state`` open, accepted or dismissed."""
        where, params = ("WHERE state = ?", [state]) if state else ("", [])
        return [
            CaseRow(*r)
            for r in self.query(
                "SELECT case_id, rule, run_id, detail, source, model, prompt_version, contract, agent_release, "
                f"created_at, state, decided_at, decided_by, note, probe_case FROM cases {where} "
                "ORDER BY created_at DESC, case_id DESC LIMIT ?",
                [*params, limit],
            )
        ]

    def cases_over(self) -> dict[str, int]:
        """Cases each rule found beyond its daily bound, over all days."""
        return {
            str(r): int(n) for r, n in self.query("SELECT rule, sum(n) FROM cases_over GROUP BY rule ORDER BY rule")
        }

    def case_row(self, case_id: int) -> CaseRow | None:
        rows = self.query(
            "SELECT case_id, rule, run_id, detail, source, model, prompt_version, contract, agent_release, "
            "created_at, state, decided_at, decided_by, note, probe_case FROM cases WHERE case_id = ?",
            [case_id],
        )
        return CaseRow(*rows[0]) if rows else None

    def decide_case(
        self,
        case_id: int,
        state: str,
        by: str,
        note: str | None,
        probe_case: str | None = None,
        now: datetime | None = None,
    ) -> bool:
        """Accept (with its probe case) or dismiss an open case; False when no open case has that id."""
        with self.transaction(f"deciding case {case_id}") as con:
            found = con.execute("SELECT state FROM cases WHERE case_id = ?", [case_id]).fetchall()
            if not found or found[0][0] != "open":
                return False
            con.execute(
                "UPDATE cases SET state = ?, decided_at = ?, decided_by = ?, note = ?, probe_case = ? WHERE case_id = ?",
                [state, now or datetime.now(UTC), by, note, probe_case, case_id],
            )
        return True
