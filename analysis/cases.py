"""The review queue of mined cases: runs a mining rule found (analysis/runs.py), which a person
accepts as a probe-suite case or dismisses.

A case accepted becomes a **probe case**, fixed when it was accepted and exported as one JSON
object per line (``GET /v1/cases?state=accepted``, the Cases page's download):

```json
{"id": "case-12", "contract": "booking", "prompt_version": "booking-v2", "model": "gpt-4o",
 "messages": [{"role": "user", "parts": [{"type": "text", "content": "..."}]}],
 "expect": {"tool": "get_reservation", "arguments": {"id": "A1"}},
 "observed": {"tool": "get_reservation", "arguments": {"id": "A1"}},
 "source": {"run_id": "...", "rule": "retry_loop", "detail": "...", "agent_release": "2.0"},
 "note": "loops on a cancelled booking",
 "suite_case": {"id": "case-12", "messages": [{"role": "user", "content": "..."}],
                "expect": {"tool": "get_reservation", "arguments": {"id": {"exact": "A1"}}}}}
```

``suite_case`` is the case in the probe suite format (README, *Probes and shadows*): the Cases
page downloads the accepted ones as ``[[cases]]`` tables to paste into a suite file, which
``shapewatch probe run`` runs.

``messages`` are the input of the run's first model call, as the instrumentation captured them
(``gen_ai.input.messages``; null when content capture was off); ``observed`` is that call's first
decision (a tool and its arguments, or ``{"no_tool": true}``); ``expect`` is what the reviewer
says the decision should be (by default the observed one). The probe suites of the probes work
score exactly this first decision.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson

from shapewatch.collector import Store
from shapewatch.collector.store import CaseRow

from .errors import CaseDecided, CaseNotFound, ParameterInvalid
from .probes.suite import suite_case

__all__ = ["STATES", "case_json", "decide_case", "list_cases", "probe_case"]

STATES = ("open", "accepted", "dismissed")


def case_json(row: CaseRow) -> dict[str, Any]:
    d = row._asdict()
    d["probe_case"] = orjson.loads(row.probe_case) if row.probe_case else None
    return d


def list_cases(store: Store, state: str | None = None, limit: int = 200) -> dict[str, Any]:
    """The queue (newest first) and what each rule found beyond its daily bound."""
    if state is not None and state not in STATES:
        raise ParameterInvalid("state", f"{state!r} is not one of {', '.join(STATES)}")
    return {
        "cases": [case_json(r) for r in store.case_rows(state=state, limit=limit)],
        "over_limit": store.cases_over(),
    }


def _expect(value: Any) -> dict[str, Any] | None:
    """A reviewer's expected decision: ``{"tool": NAME, "arguments": {...}}`` or ``{"no_tool": true}``."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ParameterInvalid("expect", 'must be {"tool": NAME, "arguments": {...}} or {"no_tool": true}')
    if value == {"no_tool": True}:
        return value
    tool, arguments = value.get("tool"), value.get("arguments", {})
    if set(value) - {"tool", "arguments"} or not isinstance(tool, str) or not tool or not isinstance(arguments, dict):
        raise ParameterInvalid("expect", 'must be {"tool": NAME, "arguments": {...}} or {"no_tool": true}')
    return {"tool": tool, "arguments": arguments}


def probe_case(store: Store, row: CaseRow, expect: dict[str, Any] | None, note: str | None) -> dict[str, Any]:
    """The run of ``row`` as a probe case (module docstring): its first model call's input and decision."""
    steps = [s for s in store.run_steps(row.run_id) if s.kind in ("tool_call", "output")]
    observed: dict[str, Any] = {"no_tool": True}
    messages: Any = None
    if steps:
        first = steps[0]
        same_span = [s for s in steps if s.span_id == first.span_id and s.trace_id == first.trace_id]
        messages = next((orjson.loads(s.input_messages) for s in same_span if s.input_messages), None)
        call = next((s for s in same_span if s.kind == "tool_call"), None)
        if call is not None:
            stored = store.events_by_id([call.event_id]) if call.event_id else []
            observed = {"tool": call.tool, "arguments": orjson.loads(stored[0].output) if stored else None}
    case: dict[str, Any] = {
        "id": f"case-{row.case_id}",
        "contract": row.contract,
        "prompt_version": row.prompt_version,
        "model": row.model,
        "messages": messages,
        "expect": expect or observed,
        "observed": observed,
        "source": {"run_id": row.run_id, "rule": row.rule, "detail": row.detail, "agent_release": row.agent_release},
        "note": note,
    }
    # the same case in the probe suite format (probes/suite.py), ready for a suite file
    case["suite_case"] = suite_case(case)
    return case


def decide_case(
    store: Store,
    case_id: int,
    *,
    accept: bool,
    author: str,
    note: str | None = None,
    expect: Any = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Accept (making its probe case) or dismiss an open case; the case as it is now."""
    wanted = _expect(expect)
    row = store.case_row(case_id)
    if row is None:
        raise CaseNotFound(case_id)
    if row.state != "open":
        raise CaseDecided(case_id, row.state)
    made = orjson.dumps(probe_case(store, row, wanted, note)).decode() if accept else None
    if not store.decide_case(
        case_id, "accepted" if accept else "dismissed", author, note, made, now or datetime.now(UTC)
    ):
        decided = store.case_row(case_id)
        raise CaseDecided(case_id, decided.state if decided else "gone")
    after = store.case_row(case_id)
    assert after is not None
    return case_json(after)
