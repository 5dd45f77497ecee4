"""HTTP routes of the analysis side: alerts, silences, cohorts, baselines, contracts, the review, analyzer runs.

Each route is a thin shell over ``admin.py`` (the code the CLI runs with
``--db``), so ``--url`` and ``--db`` give the same answers. The router is built once, at
import (``router``); the store, the analyzer configuration and the analyzer it serves are
reached through ``Depends(analysis_of)``, the ``AnalysisApi`` the service puts in
``app.state.analysis``. Errors answer in the shared JSON shape, each with the status its
class names (``status``): unknown ids 404, refused freezes and a contract version
registered with other content 409, requests that are well formed but cannot be done (an
empty window, a tampered document, an invalid schema) 422, malformed ones 400. A parameter
out of its range (a duration, a time, a window longer than its route reads, too many ids)
is refused with 422 naming it in ``fields`` before anything is read, and so are FastAPI's
own validation errors: ``{"path": "since", "reason": ...}``, the parameter's name without
its location.

Every 2xx body is documented by a model below (``response_model=``) and answered through
``json_response`` (orjson), so the bodies keep the shape the SDK, the dashboard and the CLI
read; the models allow the keys they do not name (``extra``), where a body carries
open-ended maps.

Baselines have no PUT, PATCH or DELETE: a frozen baseline never changes.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, Path, Query, Request, Security
from fastapi.responses import PlainTextResponse, Response
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from shapewatch.baselines import BaselineError, Cohort
from shapewatch.collector import ShapewatchError, Store
from shapewatch.collector.api import (
    AUTH_ERRORS,
    COMMON_ERRORS,
    ApiError,
    bearer,
    error_responses,
    guarded_route,
    json_response,
    operation_id,
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
from .errors import ConfigInvalid, ParameterInvalid
from .oncall import runbook

__all__ = ["AnalysisApi", "analysis_of", "router"]


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


# --- request bodies ----------------------------------------------------------------------------


#: A cohort's source as a request names it.
SourceName = Literal["production", "probe", "shadow"]
_SOURCE = "^(production|probe|shadow)$"
_SOURCE_HELP = "only cohorts of this source: production, probe or shadow"


class FreezeRequest(BaseModel):
    model: str = Field(min_length=1)
    prompt_version: str = Field(min_length=1)
    contract: str = Field("default", min_length=1)
    source: SourceName = "production"
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
    source: SourceName = "production"
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


# --- the documented 2xx bodies --------------------------------------------------------------------


class _Open(BaseModel):
    """A body that may carry keys beyond those named (open-ended maps, keys added later)."""

    model_config = ConfigDict(extra="allow")


class CohortTags(_Open):
    model: str
    prompt_version: str
    contract: str
    source: str = "production"


class Window(_Open):
    since: str
    until: str


class Onset(_Open):
    """When the field's series left the baseline (a change point in its rollup buckets), between
    ``low`` and ``high``."""

    at: str
    low: str
    high: str
    method: str


class ServedShare(_Open):
    model: str
    share: float


class ServedModels(_Open):
    """The served models of the window and of the baseline by share, and those new since it."""

    window: list[ServedShare]
    baseline: list[ServedShare]
    new: list[str]


class AlertLinks(_Open):
    """Where to look (the field page on a period showing the onset) and what to do (the runbook)."""

    dashboard: str | None
    runbook: str | None


class Alert(_Open):
    """An alert as the API, the CLI and the pager carry it (README, *Analyzer and alerts*)."""

    cohort: CohortTags
    field: str
    kind: str
    value: str | None
    severity: str
    state: str
    fingerprint: str
    episode: int
    baseline: dict[str, Any]
    current: dict[str, Any]
    p_value: float | None
    q_value: float | None
    effect: float | None
    threshold: float | None
    detail: str
    baseline_id: str | None
    compared_with: str | None
    contracts: dict[str, Any]
    window: str | None = None
    first_seen: str | None
    last_seen: str | None
    fired_at: str | None
    resolved_at: str | None
    acknowledged_at: str | None
    acknowledged_by: str | None
    silenced_until: str | None
    samples: list[str]
    cohort_id: int | None
    onset: Onset | None = None
    served_models: ServedModels | None = None
    links: AlertLinks | None = None
    incident_id: str | None = None


class Incident(_Open):
    """Page alerts of one cohort (or field) that fired while it was open: one page, one resolve."""

    incident_id: str
    group: list[str]
    opened_at: str | None
    resolved_at: str | None
    summary: str
    fingerprints: list[str]


class AlertTransition(_Open):
    fingerprint: str
    at: str | None
    from_: str | None = Field(alias="from")
    to: str | None
    severity: str | None
    episode: int | None
    detail: str | None
    actor: str | None


class AlertWithHistory(Alert):
    history: list[AlertTransition]


class Silence(_Open):
    silence_id: int
    starts_at: str | None
    ends_at: str | None
    author: str
    reason: str
    match: dict[str, str]


class CohortBaseline(_Open):
    baseline_id: str
    how: str
    cohort: CohortTags
    created_at: str | None
    author: str | None
    note: str | None
    age_days: float
    window: Window
    samples: int


class ComparedCohort(CohortTags):
    events: int


class CompareBreach(_Open):
    field: str
    kind: str
    value: str | None
    severity: str
    effect: float
    threshold: float
    detail: str


class CompareField(_Open):
    field: str
    a: dict[str, Any] | None
    b: dict[str, Any] | None


class Comparison(_Open):
    """Cohort A's window judged against cohort B's (``analysis/compare.py``)."""

    a: ComparedCohort
    b: ComparedCohort
    window: Window
    breaches: list[CompareBreach]
    checks: int
    insufficient: list[dict[str, Any]]
    fields: list[CompareField]


class CohortSummary(_Open):
    cohort_id: int
    cohort: CohortTags
    first_seen: str | None
    events: int
    unpinned: bool
    served_models: dict[str, int]
    baseline: CohortBaseline | None
    answered_for: list[str]
    contract_versions: dict[str, int]
    provider_outcomes: dict[str, int]
    outcome_rates: dict[str, float] = {}
    alerts_firing: dict[str, int]
    last_event_at: str | None = None
    events_total: int | None = None


class FieldWindow(_Open):
    """One field's window profile (the collector's profile of the path, and figures read from it)."""

    path: str
    units: int
    present: int
    types: dict[str, int]
    values: dict[str, int]
    presence_rate: float
    filled: int
    array_p50: float | None
    array_p90: float | None
    array_p99: float | None
    number_p50: float | None
    number_p90: float | None
    number_p99: float | None
    values_withheld: bool = False  # free text or a redact_paths path: its values are never given


class CohortFields(_Open):
    cohort_id: int
    cohort: CohortTags
    since: str | None
    until: str | None
    events: int
    served_models: dict[str, int]
    fields: list[FieldWindow]


class SeriesPoint(_Open):
    since: str | None
    until: str | None
    units: int
    presence_rate: float | None
    types: dict[str, float]
    values: dict[str, int]
    unknown_share: float | None
    violation_rate: float | None
    array: dict[str, float | None] | None
    numbers: dict[str, float | None] | None = None
    true_share: float | None = None


class SeriesBaseline(_Open):
    baseline_id: str
    how: str
    present: bool


class ContractChange(_Open):
    version: str
    at: str | None


class FieldSeries(_Open):
    cohort_id: int
    cohort: CohortTags
    field: str
    since: str | None
    until: str | None
    values_kind: str = "enum"  # enum | free_text | numeric | none: values are given for enum only
    baseline: SeriesBaseline | None
    series: list[SeriesPoint]
    contract_changes: list[ContractChange]


class StoredEvent(_Open):
    event_id: str
    ts: str | None
    cohort: CohortTags
    served_model: str | None
    contract_version: str | None
    source: str | None
    output: Any


class ServedModelChange(_Open):
    cohort: CohortTags
    previous: str | None
    current: str | None
    detected_at: str | None


class BaselineSummary(_Open):
    """A baseline's listing form: everything but the field profiles (``fields`` counts them)."""

    baseline_id: str
    hash: str
    format: int
    cohort: CohortTags
    window: Window
    samples: int
    served_models: dict[str, int]
    contract_versions: dict[str, int]
    author: str | None
    note: str | None
    forced: str | None
    created_at: str
    fields: int
    unpinned: bool


class BaselineEntry(BaselineSummary):
    """A baseline's listing form, and whether it is its cohort's active one."""

    active: bool


class BaselineDocument(_Open):
    """A baseline's canonical document (what is stored, exported and hashed), profiles included."""

    baseline_id: str
    hash: str
    format: int
    cohort: CohortTags
    window: Window
    samples: int
    created_at: str
    fields: dict[str, dict[str, Any]]


class BaselineImported(_Open):
    baseline_id: str
    hash: str
    imported: bool


class BaselineRetired(_Open):
    cohort: CohortTags
    retired: bool


class BaselineInherited(_Open):
    cohort: CohortTags
    parent: BaselineSummary


class Review(_Open):
    """The weekly review: every fact of the report, per cohort (the README's *Review* section)."""

    generated_at: str | None
    since: str | None
    until: str | None
    max_baseline_age_days: float
    cohorts: list[dict[str, Any]]
    without_baseline: list[Any]
    stale_baselines: list[Any]
    errors: list[Any]


class ContractSummary(_Open):
    contract: str
    version: str
    catalog: bool
    tools: list[str | None]  # a bare JSON Schema is one tool without a name
    formats: list[str]
    invocation_hash: str
    discovery_hash: str
    content_hash: str
    registered_at: str
    author: str | None
    note: str | None


class ContractItem(ContractSummary):
    document: Any


class ContractRegistered(ContractSummary):
    created: bool


class ContractDiffChange(_Open):
    tool: str | None
    path: str | None
    kind: str
    classification: str  # breaking | behavioral | compatible
    detail: str


class ContractDiff(_Open):
    contract: str
    from_: str = Field(alias="from")
    to: str
    verdict: str  # the most serious change: breaking | behavioral | compatible | unchanged
    changes: list[ContractDiffChange]


class ContractUsageStep(_Open):
    since: str | None
    until: str | None
    outputs: int
    checked: int
    invalid: int
    violation_rate: float | None


class ContractUsageCohort(_Open):
    cohort_id: int
    cohort: CohortTags
    outputs: int


class ContractVersionUsage(_Open):
    version: str
    registered: bool
    outputs: int
    series: list[ContractUsageStep]
    cohorts: list[ContractUsageCohort]


class ContractUsage(_Open):
    contract: str
    since: str | None
    until: str | None
    versions: list[ContractVersionUsage]


class AnalyzerRun(_Open):
    run_id: int
    started_at: str | None
    evaluated_at: str | None
    ok: bool | None
    error: str | None
    duration_seconds: float | None
    cohorts: int | None
    checks: int | None
    breaches: int | None


class RunNow(_Open):
    ok: bool
    at: str
    duration_seconds: float
    transitions: int


class AnalysisApi:
    """What the analysis routes serve (``app.state.analysis``): one store, the analyzer config and
    (in the service) the analyzer."""

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


async def analysis_of(request: Request) -> AnalysisApi:
    """The analysis state the app serves (``app.state.analysis``), for ``Depends``."""
    api: AnalysisApi = request.app.state.analysis
    return api


Analysis = Annotated[AnalysisApi, Depends(analysis_of)]

#: Every analysis route: GETs need the read scope, every other method admin.
router = APIRouter(
    route_class=guarded_route("read", writes="admin"),
    dependencies=[Security(bearer)],
    responses=error_responses(*AUTH_ERRORS, *COMMON_ERRORS, 400, 404, 409),
    generate_unique_id_function=operation_id,
)


# --- alerts and silences ----------------------------------------------------------------------------


@router.get("/v1/alerts", summary="Alerts, page first", tags=["alerts"], response_model=list[Alert])
def list_alerts(
    api: Analysis,
    state: str | None = Query(None, pattern="^(open|pending|firing|resolved)$"),
    severity: str | None = Query(None, pattern="^(page|warn)$"),
    model: str | None = None,
    prompt_version: str | None = None,
    contract: str | None = None,
    kind: str | None = None,
    source: str | None = Query(None, pattern=_SOURCE, description=_SOURCE_HELP),
) -> Response:
    return json_response(
        admin.alerts(
            api.store,
            state=state,
            severity=severity,
            model=model,
            prompt_version=prompt_version,
            contract=contract,
            kind=kind,
            source=source,
        )
    )


@router.get(
    "/v1/alerts/{fingerprint}", summary="One alert and its history", tags=["alerts"], response_model=AlertWithHistory
)
def get_alert(api: Analysis, fingerprint: str) -> Response:
    return json_response(admin.alert(api.store, fingerprint))


@router.post("/v1/alerts/{fingerprint}/ack", summary="Acknowledge an alert", tags=["alerts"], response_model=Alert)
def acknowledge_alert(api: Analysis, fingerprint: str, body: ActorRequest) -> Response:
    return json_response(admin.acknowledge(api.store, fingerprint, by=body.author))


@router.post(
    "/v1/silences",
    summary="Silence matching alerts for a while (they still resolve)",
    status_code=201,
    tags=["alerts"],
    response_model=Silence,
)
def create_silence(api: Analysis, body: SilenceRequest) -> Response:
    duration = _duration(body.duration, "duration", MAX_SILENCE)
    if body.kind is not None and body.kind not in {k.value for k in AlertKind}:
        raise ParameterInvalid(
            "kind", f"{body.kind!r} is not an alert kind; one of " + ", ".join(k.value for k in AlertKind)
        )
    return json_response(
        admin.silence(
            api.store,
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


@router.get(
    "/v1/silences",
    summary="Silences (by default only those still active)",
    tags=["alerts"],
    response_model=list[Silence],
)
def list_silences(api: Analysis, active: bool = True) -> Response:
    return json_response(admin.silences(api.store, active=active))


@router.get("/v1/incidents", summary="Incidents, newest first", tags=["alerts"], response_model=list[Incident])
def list_incidents(
    api: Analysis,
    state: str | None = Query(None, pattern="^(open|all)$"),
    limit: int = Query(100, ge=1, le=1000),
) -> Response:
    return json_response(admin.incidents(api.store, open_only=state == "open", limit=limit))


@router.post(
    "/v1/silences/{silence_id}/expire",
    summary="End a silence now",
    tags=["alerts"],
    response_model=Silence,
)
def expire_silence(api: Analysis, silence_id: int) -> Response:
    return json_response(admin.expire_silence(api.store, silence_id))


# --- cohorts ----------------------------------------------------------------------------------------


@router.get(
    "/v1/cohorts",
    summary="Cohorts with traffic, baselines, alerts and served models",
    tags=["cohorts"],
    response_model=list[CohortSummary],
)
def list_cohorts(
    api: Analysis,
    since: When = None,
    until: When = None,
    source: str | None = Query(None, pattern=_SOURCE, description=_SOURCE_HELP),
) -> Response:
    start, end = _window(since, until, now=api.clock(), length=admin.COHORTS_WINDOW)
    return json_response(admin.cohorts(api.store, since=start, until=end, source=source))


@router.get(
    "/v1/compare",
    summary="Two cohorts over one window: A judged against B with the analyzer's rules",
    tags=["cohorts"],
    response_model=Comparison,
)
def compare_cohorts(
    api: Analysis,
    a: Annotated[str, Query(description="source/model/prompt_version/contract (source optional)")],
    b: Annotated[str, Query(description="the cohort A is judged against, written the same way")],
    since: When = None,
    until: When = None,
) -> Response:
    from .compare import compare_cohorts as compare
    from .compare import parse_cohort

    start, end = _window(since, until, now=api.clock(), length=api.config.window)
    return json_response(compare(api.store, api.config, parse_cohort(a, "a"), parse_cohort(b, "b"), start, end))


@router.get(
    "/v1/cohorts/{cohort_id}/fields",
    summary="A cohort's window profile, field by field",
    tags=["cohorts"],
    response_model=CohortFields,
)
def get_cohort_fields(api: Analysis, cohort_id: int, since: When = None, until: When = None) -> Response:
    start, end = _window(since, until, now=api.clock(), length=api.config.window)
    try:
        return json_response(admin.cohort_fields(api.store, cohort_id, since=start, until=end))
    except LookupError as exc:
        raise ApiError(404, str(exc)) from None


@router.get(
    "/v1/cohorts/{cohort_id}/series",
    summary="One field over time against the baseline (charts)",
    tags=["cohorts"],
    response_model=FieldSeries,
)
def get_field_series(
    api: Analysis,
    cohort_id: int,
    field: str,
    since: When = None,
    until: When = None,
    points: int = Query(
        24, ge=1, le=admin.MAX_SERIES_POINTS, description="steps of the window, each read as a window profile"
    ),
) -> Response:
    start, end = _window(since, until, now=api.clock(), length=api.config.window)
    try:
        return json_response(
            admin.field_series(api.store, api.config, cohort_id, field, since=start, until=end, points=points)
        )
    except LookupError as exc:
        raise ApiError(404, str(exc)) from None


@router.get(
    "/v1/events",
    summary="Stored outputs by event id (an alert's samples)",
    tags=["cohorts"],
    response_model=list[StoredEvent],
)
def get_events(
    api: Analysis, ids: Annotated[list[str], Query(description=f"event ids, 1 to {MAX_EVENT_IDS}")]
) -> Response:
    return json_response(admin.events(api.store, _event_ids(ids)))


@router.get(
    "/v1/served-model-changes",
    summary="Served models that changed behind a requested model id",
    tags=["cohorts"],
    response_model=list[ServedModelChange],
)
def list_served_model_changes(api: Analysis) -> Response:
    return json_response(admin.served_model_changes(api.store))


# --- baselines --------------------------------------------------------------------------------------


@router.get("/v1/baselines", summary="Baselines, newest first", tags=["baselines"], response_model=list[BaselineEntry])
def list_baselines(
    api: Analysis,
    model: str | None = None,
    prompt_version: str | None = None,
    contract: str | None = None,
    source: str = Query("production", pattern=_SOURCE, description="the cohort's source, with model"),
) -> Response:
    if bool(model) != bool(prompt_version):
        raise BaselineError("model and prompt_version filter together: give both or neither")
    cohort = Cohort(model, prompt_version, contract or "default", source) if model and prompt_version else None
    return json_response(admin.list_all(api.store, cohort))


@router.post(
    "/v1/baselines",
    summary="Freeze a window as a baseline (and activate it)",
    status_code=201,
    tags=["baselines"],
    response_model=BaselineEntry,
)
def freeze_baseline(api: Analysis, body: FreezeRequest) -> Response:
    return json_response(
        admin.freeze(
            api.store,
            api.config,
            model=body.model,
            prompt_version=body.prompt_version,
            contract=body.contract,
            since=body.since,
            until=body.until,
            author=body.author,
            note=body.note,
            force=body.force,
            activate=body.activate,
            source=body.source,
        ),
        201,
    )


@router.post(
    "/v1/baselines/import",
    summary="Import an exported baseline document (no-op if stored)",
    tags=["baselines"],
    response_model=BaselineImported,
)
def import_baseline(api: Analysis, doc: Annotated[dict[str, Any], Body()]) -> Response:
    return json_response(admin.import_document(api.store, doc))


@router.post(
    "/v1/baselines/retire",
    summary="Stop comparing a cohort against its baseline",
    tags=["baselines"],
    response_model=BaselineRetired,
)
def retire_baseline(api: Analysis, body: CohortRequest) -> Response:
    return json_response(
        admin.retire(
            api.store,
            Cohort(body.model, body.prompt_version, body.contract, body.source),
            author=body.author,
            note=body.note,
        )
    )


@router.post(
    "/v1/baselines/inherit",
    summary="Compare a cohort against another cohort's baseline",
    tags=["baselines"],
    response_model=BaselineInherited,
)
def inherit_baseline(api: Analysis, body: InheritRequest) -> Response:
    return json_response(
        admin.inherit(
            api.store,
            Cohort(body.model, body.prompt_version, body.contract, body.source),
            body.parent,
            author=body.author,
            note=body.note,
        )
    )


@router.get(
    "/v1/baselines/{baseline_id}",
    summary="One baseline's full document",
    tags=["baselines"],
    response_model=BaselineDocument,
)
def get_baseline(api: Analysis, baseline_id: str) -> Response:
    return json_response(admin.show(api.store, baseline_id))


@router.post(
    "/v1/baselines/{baseline_id}/activate",
    summary="Make a baseline its cohort's active one",
    tags=["baselines"],
    response_model=BaselineEntry,
)
def activate_baseline(api: Analysis, baseline_id: str, body: ActorRequest) -> Response:
    return json_response(admin.activate(api.store, baseline_id, author=body.author, note=body.note))


# --- the review -------------------------------------------------------------------------------------


@router.get(
    "/v1/review",
    summary="The weekly review report (json, markdown or html)",
    tags=["review"],
    response_model=Review,
    responses={
        200: {
            "description": "The review as JSON (format=json), Markdown or HTML",
            "content": {"text/markdown": {"schema": {"type": "string"}}, "text/html": {"schema": {"type": "string"}}},
        }
    },
)
def get_review(
    api: Analysis,
    since: str = Query("7d", description=f"the review period, e.g. 7d, at most {MAX_REVIEW_PERIOD.days}d"),
    format: str = Query("json", pattern="^(json|markdown|html)$"),
) -> Response:
    from .review import build_review, render_html, render_markdown

    # Refused before the review reads anything: its cost grows with the period.
    period = _duration(since, "since", MAX_REVIEW_PERIOD)
    review = build_review(
        api.store, api.config, now=api.clock(), period=period, max_baseline_age=api.config.max_baseline_age
    )
    if format == "markdown":
        return Response(render_markdown(review), media_type="text/markdown; charset=utf-8")
    if format == "html":
        return Response(render_html(review), media_type="text/html; charset=utf-8")
    return json_response(review)


# --- contracts --------------------------------------------------------------------------------------


@router.get(
    "/v1/contracts",
    summary="Registered contract versions (of one contract), oldest first",
    tags=["contracts"],
    response_model=list[ContractSummary],
)
def list_contracts(api: Analysis, contract: str | None = None) -> Response:
    return json_response(admin.list_contracts(api.store, contract))


@router.get(
    "/v1/contracts/item",
    summary="One registered contract version, with its document",
    tags=["contracts"],
    response_model=ContractItem,
)
def get_contract(api: Analysis, contract: str, version: str) -> Response:
    return json_response(admin.show_contract(api.store, contract, version))


ContractName = Annotated[str, Query(min_length=1, max_length=256, description="the contract's name")]
ContractVersion = Annotated[str, Query(min_length=1, max_length=256, description="a registered version")]
#: The traffic window of ``/v1/contracts/usage`` when none is given.
USAGE_WINDOW = timedelta(days=7)


@router.get(
    "/v1/contracts/diff",
    summary="The classified changes between two registered versions of a contract",
    tags=["contracts"],
    response_model=ContractDiff,
)
def diff_contract_versions(
    api: Analysis,
    contract: ContractName,
    from_version: Annotated[str, Query(alias="from", min_length=1, max_length=256, description="the older version")],
    to: ContractVersion,
) -> Response:
    return json_response(admin.contract_diff(api.store, contract, from_version, to))


@router.get(
    "/v1/contracts/usage",
    summary="Outputs and violation rates per contract version over time, and the cohorts sending each",
    tags=["contracts"],
    response_model=ContractUsage,
)
def get_contract_usage(
    api: Analysis,
    contract: ContractName,
    since: When = None,
    until: When = None,
    points: int = Query(28, ge=1, le=admin.MAX_USAGE_POINTS, description="steps of the window"),
) -> Response:
    start, end = _window(since, until, now=api.clock(), length=USAGE_WINDOW)
    return json_response(admin.contract_usage(api.store, contract, since=start, until=end, points=points))


@router.post(
    "/v1/contracts",
    summary="Register a contract version (JSON Schema, tool or catalog)",
    description="Registered versions never change: a new version answers 201, the same content "
    "again 200 with created false; other content under a registered version answers 409.",
    status_code=201,
    tags=["contracts"],
    response_model=ContractRegistered,
    responses={200: {"description": "Registered before with the same content", "model": ContractRegistered}},
)
def register_contract(api: Analysis, body: ContractRequest) -> Response:
    result = admin.register_contract(
        api.store, body.contract, body.version, body.document, author=body.author, note=body.note
    )
    return json_response(result, 201 if result["created"] else 200)


# --- the analyzer -----------------------------------------------------------------------------------


@router.get("/v1/analyzer/runs", summary="The latest analyzer runs", tags=["admin"], response_model=list[AnalyzerRun])
def list_analyzer_runs(api: Analysis, limit: int = Query(20, ge=1, le=1000)) -> Response:
    rows = api.store.analyzer_runs(limit)
    return json_response(
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


@router.post("/v1/analyzer/run", summary="Run one evaluation now", tags=["admin"], response_model=RunNow)
def run_analyzer(api: Analysis) -> Response:
    if api.analyzer is None:
        raise ShapewatchError("no analyzer in this process")
    res = api.analyzer.run()
    if not res.ok:  # recorded in analyzer_runs and counted; the caller gets the shared error shape
        raise ApiError(500, f"evaluation failed: {res.error}")
    return json_response(
        {
            "ok": res.ok,
            "at": res.at.isoformat(),
            "duration_seconds": round(res.duration_seconds, 4),
            "transitions": len(res.transitions),
        }
    )


#: ``GET /v1/runbooks/{kind}``: open without a token, as a page link in a pager opens it in a
#: browser that carries none; a runbook holds no data of the deployment.
runbooks_router = APIRouter(tags=["alerts"], generate_unique_id_function=operation_id)


@runbooks_router.get(
    "/v1/runbooks/{kind}",
    summary="The runbook of an alert kind (Markdown)",
    description="Open without a token: pages link here. What the alert means, what to check, what to do.",
    response_class=PlainTextResponse,
    responses={
        200: {"description": "The runbook, Markdown", "content": {"text/markdown": {"schema": {"type": "string"}}}},
        **error_responses(404, 422, 500, by_reference=True),
    },
)
def get_runbook(kind: str = Path(max_length=64)) -> Response:
    text = runbook(kind)
    if text is None:
        raise ApiError(404, f"no runbook for {kind!r}: not an alert kind")
    return PlainTextResponse(text, media_type="text/markdown; charset=utf-8")
