"""HTTP routes of the analysis side: alerts, silences, cohorts, baselines, analyzer runs.

Each route is a thin shell over ``admin.py`` (the code the CLI runs with
``--db``), so ``--url`` and ``--db`` give the same answers. Errors answer in
the shared JSON shape: unknown ids 404, refused freezes and a contract
version registered with other content 409, requests that are well formed but
cannot be done (an empty window, a tampered document, an invalid schema) 422,
malformed ones 400. A parameter out of its range (a duration, a time, a window
longer than its route reads, too many ids) is refused with 422 naming it in
``fields`` before anything is read, and so are FastAPI's own validation errors:
``{"path": "since", "reason": ...}``, the parameter's name without its location.

Baselines have no PUT, PATCH or DELETE: a frozen baseline never changes.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Body, FastAPI, Query, Request
from fastapi.responses import Response
from pydantic import AwareDatetime, BaseModel, Field

from shapewatch.baselines import (
    BaselineError,
    BaselineInvalid,
    BaselineNotFound,
    BaselineRefused,
    BaselineTampered,
    Cohort,
)
from shapewatch.collector import (
    ContractConflict,
    ContractError,
    ContractInvalid,
    ContractNotFound,
    FieldError,
    ShapewatchError,
    Store,
    error_body,
    error_responses,
    require_token,
)

from . import admin
from .analyzer import Analyzer
from .config import (
    MAX_REVIEW_PERIOD,
    MAX_SILENCE,
    MAX_WINDOW,
    AlertKind,
    AnalyzerConfig,
    check_window,
    parse_duration,
    parse_time,
)
from .errors import AlertError, AlertNotFound, ConfigInvalid, ParameterInvalid

__all__ = ["AnalysisApi", "install_analysis_error_handlers"]


When = Annotated[
    str | None,
    Query(description="ISO 8601 time with a zone, e.g. 2026-11-29T12:00:00Z, from 1971-01-01 up to 2200-01-01"),
]
#: The most event ids one ``/v1/events`` request looks up, and the longest one (the envelope's limit).
MAX_EVENT_IDS = 100
MAX_EVENT_ID_LENGTH = 128


def _when(text: str | None, name: str) -> datetime | None:
    """A query time, or None; one that is not a time with a zone in the range taken is refused (422)."""
    if text is None:
        return None
    try:
        return parse_time(text, key=name)
    except ConfigInvalid as exc:
        raise ParameterInvalid.of(exc) from None


def _window(
    since_text: str | None, until_text: str | None, *, now: datetime, length: timedelta
) -> tuple[datetime, datetime]:
    """The window a read route scans: ``until`` (default now) back to ``since`` (default ``length``
    before it), refused (422) when it ends before it begins or is longer than ``MAX_WINDOW``."""
    until = _when(until_text, "until") or now
    since = _when(since_text, "since") or until - length
    if until_text is None and since >= until:
        raise ParameterInvalid("since", f"{since_text!r} is not before now ({until.isoformat()}); give an until")
    try:
        check_window(since, until, maximum=MAX_WINDOW)
    except ConfigInvalid as exc:
        raise ParameterInvalid.of(exc) from None
    return since, until


def _duration(text: str, name: str, maximum: timedelta) -> timedelta:
    try:
        return parse_duration(text, key=name, maximum=maximum)
    except ConfigInvalid as exc:
        raise ParameterInvalid.of(exc) from None


def _event_ids(ids: list[str]) -> list[str]:
    if not 1 <= len(ids) <= MAX_EVENT_IDS:
        raise ParameterInvalid("ids", f"{len(ids)} ids given; give between 1 and {MAX_EVENT_IDS}")
    for i, event_id in enumerate(ids):
        if not 1 <= len(event_id) <= MAX_EVENT_ID_LENGTH:
            raise ParameterInvalid(
                "ids", f"id {i} is {len(event_id)} characters long; an event id has 1 to {MAX_EVENT_ID_LENGTH}"
            )
    return ids


def _json(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


_STATUS: list[tuple[type[Exception], int]] = [
    (BaselineNotFound, 404),
    (AlertNotFound, 404),
    (ContractNotFound, 404),
    (BaselineRefused, 409),
    (ContractConflict, 409),
    (BaselineTampered, 422),
    (BaselineError, 422),
    (AlertError, 422),
    (ContractError, 422),
]


def install_analysis_error_handlers(app: FastAPI) -> None:
    """Baseline and alert errors answer in the shared error shape."""
    for cls, status in _STATUS:

        def handler(_: Request, exc: Exception, status: int = status) -> Response:
            fields = exc.fields if isinstance(exc, BaselineInvalid) else _contract_fields(exc)  # each one named
            return _json(error_body(status, str(exc), fields), status)

        app.add_exception_handler(cls, handler)

    # A parameter out of range, and a value a configuration parser refused (the review's period
    # when it reaches build_review): 422 naming it.
    def parameter(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, ParameterInvalid | ConfigInvalid)
        name, reason = (exc.name, exc.reason) if isinstance(exc, ParameterInvalid) else (exc.key, exc.problem)
        return _json(error_body(422, str(exc), [FieldError(name, reason)]), 422)

    app.add_exception_handler(ParameterInvalid, parameter)
    app.add_exception_handler(ConfigInvalid, parameter)


def _contract_fields(exc: Exception) -> list[FieldError] | None:
    """A refused contract names what was wrong: its name, its version, or its document."""
    if not isinstance(exc, ContractInvalid):
        return None
    path = {"the contract name": "contract", "the contract version": "version"}.get(exc.where, "document")
    return [FieldError(path, exc.problem if path != "document" else str(exc))]


class FreezeRequest(BaseModel):
    model: str = Field(min_length=1)
    prompt_version: str = Field(min_length=1)
    contract: str = Field("default", min_length=1)
    since: AwareDatetime
    until: AwareDatetime
    note: str
    author: str = Field(min_length=1)
    force: str | None = None
    activate: bool = True


class CohortRequest(BaseModel):
    model: str = Field(min_length=1)
    prompt_version: str = Field(min_length=1)
    contract: str = Field("default", min_length=1)
    author: str = Field(min_length=1)
    note: str = ""


class InheritRequest(CohortRequest):
    parent: str = Field(min_length=6)


class ActorRequest(BaseModel):
    author: str = Field(min_length=1)
    note: str = ""


class ContractRequest(BaseModel):
    contract: str = Field(min_length=1, max_length=200)
    version: str = Field(min_length=1, max_length=200)
    document: dict[str, Any] | list[Any] = Field(description="a JSON Schema, a tool definition or a catalog")
    author: str = Field(min_length=1)
    note: str | None = None


class SilenceRequest(BaseModel):
    duration: str = Field(description="how long, e.g. 2h or 3d")
    author: str = Field(min_length=1)
    reason: str = Field(min_length=1)
    fingerprint: str | None = None
    model: str | None = None
    prompt_version: str | None = None
    contract: str | None = None
    field: str | None = None
    kind: str | None = None


class AnalysisApi:
    """The analysis routes around one store, the analyzer config and (in the service) the analyzer."""

    def __init__(
        self,
        store: Store,
        config: AnalyzerConfig,
        analyzer: Analyzer | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.store = store
        self.config = config
        self.analyzer = analyzer
        self.clock = clock

    def router(self, tokens: tuple[str, ...]) -> APIRouter:
        store, config = self.store, self.config
        guard = require_token(tokens, "read", writes="admin")  # GETs read, every other method is admin
        r = APIRouter(
            route_class=guard.route_class, responses={**guard.responses, **error_responses(400, 404, 409, 422)}
        )

        @r.get("/v1/alerts", summary="Alerts, page first")
        def get_alerts(
            state: str | None = Query(None, pattern="^(open|pending|firing|resolved)$"),
            severity: str | None = Query(None, pattern="^(page|warn)$"),
            model: str | None = None,
            prompt_version: str | None = None,
            contract: str | None = None,
            kind: str | None = None,
        ) -> Response:
            return _json(
                admin.alerts(
                    store,
                    state=state,
                    severity=severity,
                    model=model,
                    prompt_version=prompt_version,
                    contract=contract,
                    kind=kind,
                )
            )

        @r.get("/v1/alerts/{fingerprint}", summary="One alert and its history")
        def get_alert(fingerprint: str) -> Response:
            return _json(admin.alert(store, fingerprint))

        @r.post("/v1/alerts/{fingerprint}/ack", summary="Acknowledge an alert")
        def ack(fingerprint: str, body: ActorRequest) -> Response:
            return _json(admin.acknowledge(store, fingerprint, by=body.author))

        @r.post("/v1/silences", summary="Silence matching alerts for a while (they still resolve)", status_code=201)
        def post_silence(body: SilenceRequest) -> Response:
            duration = _duration(body.duration, "duration", MAX_SILENCE)
            if body.kind is not None and body.kind not in {k.value for k in AlertKind}:
                raise ParameterInvalid(
                    "kind", f"{body.kind!r} is not an alert kind; one of " + ", ".join(k.value for k in AlertKind)
                )
            return _json(
                admin.silence(
                    store,
                    duration=duration,
                    author=body.author,
                    reason=body.reason,
                    fingerprint=body.fingerprint,
                    model=body.model,
                    prompt_version=body.prompt_version,
                    contract=body.contract,
                    field=body.field,
                    kind=body.kind,
                ),
                201,
            )

        @r.get("/v1/silences", summary="Silences (by default only those still active)")
        def get_silences(active: bool = True) -> Response:
            return _json(admin.silences(store, active=active))

        @r.get("/v1/cohorts", summary="Cohorts with traffic, baselines, alerts and served models")
        def get_cohorts(since: When = None, until: When = None) -> Response:
            start, end = _window(since, until, now=self.clock(), length=admin.COHORTS_WINDOW)
            return _json(admin.cohorts(store, since=start, until=end))

        @r.get("/v1/cohorts/{cohort_id}/fields", summary="A cohort's window profile, field by field")
        def get_fields(cohort_id: int, since: When = None, until: When = None) -> Response:
            start, end = _window(since, until, now=self.clock(), length=config.window)
            try:
                return _json(admin.cohort_fields(store, cohort_id, since=start, until=end))
            except LookupError as exc:
                return _json(error_body(404, str(exc)), 404)

        @r.get("/v1/cohorts/{cohort_id}/series", summary="One field over time against the baseline (charts)")
        def get_series(
            cohort_id: int,
            field: str,
            since: When = None,
            until: When = None,
            points: int = Query(
                24, ge=1, le=admin.MAX_SERIES_POINTS, description="steps of the window, each read as a window profile"
            ),
        ) -> Response:
            start, end = _window(since, until, now=self.clock(), length=config.window)
            try:
                return _json(admin.field_series(store, config, cohort_id, field, since=start, until=end, points=points))
            except LookupError as exc:
                return _json(error_body(404, str(exc)), 404)

        @r.get("/v1/events", summary="Stored outputs by event id (an alert's samples)")
        def get_events(ids: Annotated[list[str], Query(description=f"event ids, 1 to {MAX_EVENT_IDS}")]) -> Response:
            return _json(admin.events(store, _event_ids(ids)))

        @r.get("/v1/served-model-changes", summary="Served models that changed behind a requested model id")
        def get_served() -> Response:
            return _json(admin.served_model_changes(store))

        @r.get("/v1/baselines", summary="Baselines, newest first")
        def get_baselines(
            model: str | None = None, prompt_version: str | None = None, contract: str | None = None
        ) -> Response:
            if bool(model) != bool(prompt_version):
                raise BaselineError("model and prompt_version filter together: give both or neither")
            cohort = Cohort(model, prompt_version, contract or "default") if model and prompt_version else None
            return _json(admin.list_all(store, cohort))

        @r.post("/v1/baselines", summary="Freeze a window as a baseline (and activate it)", status_code=201)
        def post_baseline(body: FreezeRequest) -> Response:
            return _json(
                admin.freeze(
                    store,
                    config,
                    model=body.model,
                    prompt_version=body.prompt_version,
                    contract=body.contract,
                    since=body.since,
                    until=body.until,
                    author=body.author,
                    note=body.note,
                    force=body.force,
                    activate=body.activate,
                ),
                201,
            )

        @r.post("/v1/baselines/import", summary="Import an exported baseline document (no-op if stored)")
        def post_import(doc: Annotated[dict[str, Any], Body()]) -> Response:
            return _json(admin.import_document(store, doc))

        @r.post("/v1/baselines/retire", summary="Stop comparing a cohort against its baseline")
        def post_retire(body: CohortRequest) -> Response:
            return _json(
                admin.retire(
                    store, Cohort(body.model, body.prompt_version, body.contract), author=body.author, note=body.note
                )
            )

        @r.post("/v1/baselines/inherit", summary="Compare a cohort against another cohort's baseline")
        def post_inherit(body: InheritRequest) -> Response:
            return _json(
                admin.inherit(
                    store,
                    Cohort(body.model, body.prompt_version, body.contract),
                    body.parent,
                    author=body.author,
                    note=body.note,
                )
            )

        @r.get("/v1/baselines/{baseline_id}", summary="One baseline's full document")
        def get_baseline(baseline_id: str) -> Response:
            return _json(admin.show(store, baseline_id))

        @r.post("/v1/baselines/{baseline_id}/activate", summary="Make a baseline its cohort's active one")
        def post_activate(baseline_id: str, body: ActorRequest) -> Response:
            return _json(admin.activate(store, baseline_id, author=body.author, note=body.note))

        @r.get(
            "/v1/review",
            summary="The weekly review report (json, markdown or html)",
            responses={200: {"content": {"application/json": {}, "text/markdown": {}, "text/html": {}}}},
        )
        def get_review(
            since: str = Query("7d", description=f"the review period, e.g. 7d, at most {MAX_REVIEW_PERIOD.days}d"),
            format: str = Query("json", pattern="^(json|markdown|html)$"),
        ) -> Response:
            from .review import build_review, render_html, render_markdown

            # Refused before the review reads anything: its cost grows with the period.
            period = _duration(since, "since", MAX_REVIEW_PERIOD)
            review = build_review(
                store, config, now=self.clock(), period=period, max_baseline_age=config.max_baseline_age
            )
            if format == "markdown":
                return Response(render_markdown(review), media_type="text/markdown; charset=utf-8")
            if format == "html":
                return Response(render_html(review), media_type="text/html; charset=utf-8")
            return _json(review)

        @r.get("/v1/contracts", summary="Registered contract versions (of one contract), oldest first")
        def get_contracts(contract: str | None = None) -> Response:
            return _json(admin.list_contracts(store, contract))

        @r.get("/v1/contracts/item", summary="One registered contract version, with its document")
        def get_contract(contract: str, version: str) -> Response:
            return _json(admin.show_contract(store, contract, version))

        @r.post(
            "/v1/contracts",
            summary="Register a contract version (JSON Schema, tool or catalog)",
            description="Registered versions never change: a new version answers 201, the same content "
            "again 200 with created false; other content under a registered version answers 409.",
            status_code=201,
            responses={200: {"description": "Registered before with the same content"}},
        )
        def post_contract(body: ContractRequest) -> Response:
            result = admin.register_contract(
                store, body.contract, body.version, body.document, author=body.author, note=body.note
            )
            return _json(result, 201 if result["created"] else 200)

        @r.get("/v1/analyzer/runs", summary="The latest analyzer runs")
        def get_runs(limit: int = Query(20, ge=1, le=1000)) -> Response:
            rows = store.query(
                """SELECT run_id, started_at, evaluated_at, ok, error, duration_seconds, cohorts, checks, breaches
                   FROM analyzer_runs ORDER BY run_id DESC LIMIT ?""",
                [limit],
            )
            return _json(
                [
                    {
                        "run_id": r[0],
                        "started_at": r[1].isoformat(),
                        "evaluated_at": r[2].isoformat(),
                        "ok": r[3],
                        "error": r[4],
                        "duration_seconds": r[5],
                        "cohorts": r[6],
                        "checks": r[7],
                        "breaches": r[8],
                    }
                    for r in rows
                ]
            )

        @r.post("/v1/analyzer/run", summary="Run one evaluation now")
        def post_run() -> Response:
            if self.analyzer is None:
                raise ShapewatchError("no analyzer in this process")
            res = self.analyzer.run()
            if not res.ok:  # recorded in analyzer_runs and counted; the caller gets the shared error shape
                return _json(error_body(500, f"evaluation failed: {res.error}"), 500)
            return _json(
                {
                    "ok": res.ok,
                    "at": res.at.isoformat(),
                    "duration_seconds": round(res.duration_seconds, 4),
                    "transitions": len(res.transitions),
                }
            )

        return r
