"""HTTP routes of the review queue of mined cases (analysis/cases.py): list, accept, dismiss.

Reading needs the read scope, deciding the admin scope. A decision is final: deciding a case
twice answers 409.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request, Security
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from shapewatch.collector import Store
from shapewatch.collector.api import (
    AUTH_ERRORS,
    COMMON_ERRORS,
    bearer,
    error_responses,
    guarded_route,
    json_response,
    operation_id,
)
from shapewatch.collector.settings import Scope

from . import cases

__all__ = ["cases_router"]


class CaseEntry(BaseModel):
    """A mined case: the run, the rule that found it, and its decision."""

    model_config = ConfigDict(extra="allow")

    case_id: int
    rule: str
    run_id: str
    detail: str
    model: str
    prompt_version: str
    contract: str
    agent_release: str
    created_at: datetime
    state: str
    decided_at: datetime | None
    decided_by: str | None
    note: str | None
    probe_case: dict[str, Any] | None


class CasesReply(BaseModel):
    """The queue, newest first, and the cases each rule found beyond its daily bound (counted only)."""

    cases: list[CaseEntry]
    over_limit: dict[str, int]


class DecideRequest(BaseModel):
    """Who decides, why, and (accepting) the decision a probe should expect."""

    model_config = ConfigDict(extra="forbid")

    author: str = Field(min_length=1, max_length=256)
    note: str | None = Field(None, max_length=4096)
    expect: dict[str, Any] | None = Field(
        None, description='{"tool": NAME, "arguments": {...}} or {"no_tool": true}; default: the observed decision'
    )


#: Cases: read with the read scope, decided with the admin scope.
cases_router = APIRouter(
    tags=["runs"],
    route_class=guarded_route(Scope.read, writes=Scope.admin),
    dependencies=[Security(bearer)],
    responses=error_responses(*AUTH_ERRORS, *COMMON_ERRORS),
    generate_unique_id_function=operation_id,
)


def _store(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


CaseId = Annotated[int, Path(ge=1, le=2**62, description="The case's id")]


@cases_router.get("/v1/cases", summary="Mined cases of agent runs, newest first", response_model=CasesReply)
async def list_cases(
    request: Request,
    state: Annotated[str | None, Query(description="open, accepted or dismissed")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> Response:
    return json_response(await asyncio.to_thread(cases.list_cases, _store(request), state, limit))


@cases_router.post(
    "/v1/cases/{case_id}/accept",
    summary="Accept a case as a probe-suite case",
    response_model=CaseEntry,
    responses=error_responses(400, 404, 409),
)
async def accept_case(request: Request, case_id: CaseId, body: DecideRequest) -> Response:
    return json_response(
        await asyncio.to_thread(
            lambda: cases.decide_case(
                _store(request), case_id, accept=True, author=body.author, note=body.note, expect=body.expect
            )
        )
    )


@cases_router.post(
    "/v1/cases/{case_id}/dismiss",
    summary="Dismiss a case",
    response_model=CaseEntry,
    responses=error_responses(400, 404, 409),
)
async def dismiss_case(request: Request, case_id: CaseId, body: DecideRequest) -> Response:
    return json_response(
        await asyncio.to_thread(
            lambda: cases.decide_case(_store(request), case_id, accept=False, author=body.author, note=body.note)
        )
    )
