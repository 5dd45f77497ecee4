"""What a batch of new events says beyond its rollups, written in the batch's own transaction:
the outcomes their ``finish_reason`` tells (a response cut at the token limit, filtered,
refused) and the run steps of events that name a ``run_id``.

Both come from the events as stored, whichever route brought them (``/v1/outputs``, bulk
import, the provider route, OTLP), so a team that sends envelopes gets the same truncation rate
and the same runs as one that sends traces. Only the rows a batch inserted are read: a retried
event adds nothing, and a crash loses nothing the batch's commit acknowledged.

Most batches name neither: each check costs one pass over a column (Arrow compute, in C).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from ..adapters import FINISH_OUTCOMES, WITH_OUTPUT
from ..otlp import StepKind, arguments_hash
from ..rules import SOURCES

__all__ = ["RUN_CONTRACT", "STEP_OF_EVENT", "TOOL_CALL_FINISHES", "outcome_counts", "run_steps_of"]

PROBE = "probe"
assert PROBE in SOURCES
_FINISHES: list[pa.Array] = []  # made at first use: pa.array() of a list imports pandas (bulk import never needs it)
#: Finish reasons that say the model decided on a tool call: an envelope with a ``run_id`` and one
#: of these is a ``tool_call`` step of its run (its contract the tool); any other is an ``output``.
#: An envelope's ``attributes.step`` (``tool_call`` or ``output``) says it outright.
TOOL_CALL_FINISHES = frozenset({"tool_calls", "tool_use", "function_call"})
#: The attribute naming an envelope's step kind.
STEP_OF_EVENT = "step"
#: An envelope's attribute naming the contract of the run's step (the one that declares the run's
#: tools); by default the envelope's own contract.
RUN_CONTRACT = "run_contract"


def outcome_counts(
    table: pa.Table,
    step: int,
    cohorts: Sequence[tuple[str, str, str, str]],
    ids: Mapping[tuple[str, str, str, str], int],
) -> list[tuple[int, int, str, int]]:
    """(cohort id, bucket epoch, kind, n) of the events of ``table`` whose ``finish_reason`` tells
    an outcome, each counted in its cohort and, when another model answered, in that model's
    cohort too (as its rollups are). ``cohorts`` are the batch's cohorts by ``cohort_key``."""
    reasons = table["finish_reason"]
    if reasons.null_count == len(reasons):
        return []
    if not _FINISHES:
        _FINISHES.append(pa.array(sorted(FINISH_OUTCOMES), pa.string()))
    hit = pc.is_in(pc.utf8_lower(reasons), value_set=_FINISHES[0])
    if not pc.any(hit).as_py():
        return []
    rows = table.filter(hit).select(["cohort_key", "ts", "served_model", "finish_reason"]).to_pylist()
    counts: dict[tuple[int, int, str], int] = {}
    for r in rows:
        kind = WITH_OUTPUT + FINISH_OUTCOMES[r["finish_reason"].lower()].value
        epoch = int(r["ts"].timestamp())
        bucket = epoch - epoch % step
        model, prompt_version, contract, source = cohorts[r["cohort_key"]]
        served = r["served_model"]
        for m in (model,) if served is None or served == model else (model, served):
            key = (ids[(m, prompt_version, contract, source)], bucket, kind)
            counts[key] = counts.get(key, 0) + 1
    return [(c, b, k, n) for (c, b, k), n in counts.items()]


def _step_kind(finish_reason: str | None, attributes: dict[str, Any]) -> StepKind:
    said = attributes.get(STEP_OF_EVENT)
    if said in (StepKind.tool_call.value, StepKind.output.value):
        return StepKind(said)
    return StepKind.tool_call if (finish_reason or "").lower() in TOOL_CALL_FINISHES else StepKind.output


def run_steps_of(
    table: pa.Table, cohorts: Sequence[tuple[str, str, str, str]], received_at: datetime
) -> tuple[pa.Table, pa.Table] | None:
    """The run steps of the events of ``table`` that name a ``run_id`` (key: the event id, the key
    the OTLP route gives the step of the same event) and each run's first and last step time;
    None when no event names a run. Columns in ``collector/store/runs.py``'s order."""
    run_ids = table["run_id"]
    if run_ids.null_count == len(run_ids):
        return None
    # A probe suite's envelopes name its run (one run of the suite, not an agent's run: its cases
    # are independent first decisions, and as steps of one run they would read as a retry loop).
    named = table.filter(
        pc.and_(pc.is_valid(run_ids), pc.fill_null(pc.not_equal(table["source"], PROBE), True))
    ).to_pylist()
    if not named:
        return None
    steps: list[tuple[Any, ...]] = []
    per_run: dict[str, tuple[datetime, datetime]] = {}
    for r in named:
        model, prompt_version, contract, _source = cohorts[r["cohort_key"]]
        attrs = orjson.loads(r["attributes"]) if r["attributes"] is not None else {}
        kind = _step_kind(r["finish_reason"], attrs)
        run_contract = attrs.get(RUN_CONTRACT) or contract  # attribute values are strings
        tool = contract if kind is StepKind.tool_call else None
        args_hash = arguments_hash(orjson.loads(r["output"])) if kind is StepKind.tool_call else None
        ts, run_id, event_id = r["ts"], r["run_id"], r["event_id"]
        steps.append(
            (
                event_id,
                run_id,
                ts,
                0,
                kind.value,
                "",
                event_id,
                model,
                r["served_model"],
                prompt_version,
                contract,
                r["contract_version"],
                tool,
                args_hash,
                r["finish_reason"],
                r["agent_release"],
                r["source"],
                event_id,
                run_contract,
                None,
                received_at,
            )
        )
        first, last = per_run.get(run_id, (ts, ts))
        per_run[run_id] = (min(first, ts), max(last, ts))
    names = [
        "step_key", "run_id", "ts", "position", "kind", "trace_id", "span_id", "model", "served_model",
        "prompt_version", "contract", "contract_version", "tool", "args_hash", "finish_reason", "agent_release",
        "source", "event_id", "run_contract", "input_messages", "received_at",
    ]  # fmt: skip
    types = {"ts": pa.timestamp("us", tz="UTC"), "received_at": pa.timestamp("us", tz="UTC"), "position": pa.int32()}
    step_table = pa.table({n: pa.array([s[i] for s in steps], types.get(n, pa.string())) for i, n in enumerate(names)})
    ids = list(per_run)
    run_table = pa.table(
        {
            "run_id": pa.array(ids, pa.string()),
            "first_ts": pa.array([per_run[i][0] for i in ids], pa.timestamp("us", tz="UTC")),
            "last_ts": pa.array([per_run[i][1] for i in ids], pa.timestamp("us", tz="UTC")),
        }
    )
    return step_table, run_table
