"""HTTP routes of probe suite runs (analysis/probes/): record a run made elsewhere (``shapewatch
probe run --url``), list runs, read one run's cases.

Reading needs the read scope, recording the admin scope. A run id is recorded once: a second
record of it answers 409.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Path, Query, Request, Security
from fastapi.responses import Response
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, model_validator

from shapewatch.collector import ShapewatchError, Store
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
from shapewatch.collector.store import ProbeRunRow

from .probes.suite import MAX_CASES

__all__ = ["probes_router"]

ScoreName = Literal["tool_accuracy", "argument_accuracy", "spurious_calls"]
Trigger = Literal["manual", "schedule", "served_model_change", "contract_change"]
_TAG = Field(min_length=1, max_length=200)


class RunRecorded(ShapewatchError):
    """The run id is recorded already (409)."""

    status = 409

    def __init__(self, run_id: str) -> None:
        super().__init__(f"probe run {run_id!r} is recorded already")


class RunNotFound(ShapewatchError, LookupError):
    status = 404

    def __init__(self, run_id: str) -> None:
        super().__init__(f"no probe run {run_id!r}")


class ProbeScore(BaseModel):
    model_config = ConfigDict(extra="forbid")

    value: float | None = Field(ge=0, le=1)
    hits: int = Field(ge=0, le=MAX_CASES)
    n: int = Field(ge=0, le=MAX_CASES)

    @model_validator(mode="after")
    def _consistent(self) -> ProbeScore:
        if self.hits > self.n:
            raise ValueError(f"hits ({self.hits}) exceed n ({self.n})")
        if (self.value is None) != (self.n == 0) or (self.n and abs(self.value - self.hits / self.n) > 1e-9):  # type: ignore[operator]
            raise ValueError("value must be hits / n (null when n is 0)")
        return self


class ProbeCaseBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    case: str = _TAG
    negative: bool
    expected: dict[str, Any] | None
    actual: dict[str, Any] | None
    error: str | None = Field(None, max_length=500)
    failed: list[ScoreName] = Field(max_length=3)


class ProbeRunRequest(BaseModel):
    """A run as ``shapewatch probe run`` made it (``ProbeRun.to_json`` with every case)."""

    model_config = ConfigDict(extra="ignore")

    run_id: str = Field(pattern=r"^probe-[0-9a-f]{16}$")
    suite: str = _TAG
    model: str = _TAG
    served_model: str | None = Field(None, min_length=1, max_length=200)
    prompt_version: str = _TAG
    contract: str = _TAG
    trigger: Trigger
    started_at: AwareDatetime
    finished_at: AwareDatetime
    scores: dict[ScoreName, ProbeScore]
    thresholds: dict[ScoreName, Annotated[float, Field(ge=0, le=1)]]
    cases: list[ProbeCaseBody] = Field(min_length=1, max_length=MAX_CASES)

    @model_validator(mode="after")
    def _ordered(self) -> ProbeRunRequest:
        if self.finished_at < self.started_at:
            raise ValueError("finished_at is before started_at")
        return self


class ProbeRunSummary(BaseModel):
    model_config = ConfigDict(extra="allow")

    run_id: str
    suite: str
    model: str
    served_model: str | None
    prompt_version: str
    contract: str
    trigger: str
    started_at: datetime
    finished_at: datetime
    cases: int
    errors: int
    accepted: bool
    scores: dict[str, Any]
    thresholds: dict[str, float]


class ProbeRunDetail(ProbeRunSummary):
    results: list[dict[str, Any]]


class RunStored(BaseModel):
    run_id: str
    accepted: bool


probes_router = APIRouter(
    tags=["probes"],
    route_class=guarded_route(Scope.read, writes=Scope.admin),
    dependencies=[Security(bearer)],
    responses=error_responses(*AUTH_ERRORS, *COMMON_ERRORS),
    generate_unique_id_function=operation_id,
)


def _store(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


def _summary(r: ProbeRunRow) -> dict[str, Any]:
    return {**r._asdict(), "scores": orjson.loads(r.scores), "thresholds": orjson.loads(r.thresholds)}


def _record(store: Store, body: ProbeRunRequest) -> dict[str, Any]:
    if store.probe_run(body.run_id) is not None:
        raise RunRecorded(body.run_id)
    errors = sum(1 for c in body.cases if c.error is not None)
    run = [
        body.run_id,
        body.suite,
        body.model,
        body.prompt_version,
        body.contract,
        body.served_model,
        body.started_at,
        body.finished_at,
        body.trigger,
        len(body.cases),
        errors,
        errors == 0,
        orjson.dumps({k: v.model_dump() for k, v in body.scores.items()}).decode(),
        orjson.dumps(body.thresholds).decode(),
    ]
    cases = [
        [
            body.run_id,
            i,
            c.case,
            c.negative,
            orjson.dumps(c.expected).decode(),
            None if c.actual is None else orjson.dumps(c.actual).decode(),
            c.error,
            ",".join(c.failed),
        ]
        for i, c in enumerate(body.cases)
    ]
    store.add_probe_run(run, cases)
    return {"run_id": body.run_id, "accepted": errors == 0}


@probes_router.post(
    "/v1/probes/runs",
    summary="Record a probe suite run made by shapewatch probe run --url",
    status_code=201,
    response_model=RunStored,
    responses=error_responses(409),
)
async def record_probe_run(request: Request, body: ProbeRunRequest) -> Response:
    return json_response(await asyncio.to_thread(_record, _store(request), body), 201)


@probes_router.get("/v1/probes/runs", summary="Probe suite runs, newest first", response_model=list[ProbeRunSummary])
async def list_probe_runs(
    request: Request,
    suite: Annotated[str | None, Query(max_length=200, description="only this suite's runs")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> Response:
    rows = await asyncio.to_thread(lambda: _store(request).probe_runs(suite=suite, limit=limit))
    return json_response([_summary(r) for r in rows])


@probes_router.get(
    "/v1/probes/runs/{run_id}",
    summary="One probe run with every case, expected vs actual",
    response_model=ProbeRunDetail,
    responses=error_responses(404),
)
async def get_probe_run(
    request: Request, run_id: Annotated[str, Path(max_length=100, description="The run's id")]
) -> Response:
    def read() -> dict[str, Any]:
        store = _store(request)
        found = store.probe_run(run_id)
        if found is None:
            raise RunNotFound(run_id)
        results = [
            {
                **c._asdict(),
                "expected": orjson.loads(c.expected),
                "actual": None if c.actual is None else orjson.loads(c.actual),
                "failed": [f for f in c.failed.split(",") if f],
            }
            for c in store.probe_results(run_id)
        ]
        return {**_summary(found), "results": results}

    return json_response(await asyncio.to_thread(read))
