"""The service process: the HTTP app (collector routes, analysis routes, /metrics), assembled here.

``analysis`` is the highest backend layer, so this is where the routers that
each package builds at import are put together with what they serve (the store, the
writer, the metrics registry, the analyzer: ``app.state``, reached by the routes through
``Depends``), where the one error map is installed, and where the scheduler runs the
store's upkeep (``maintenance.py``; the analyzer's evaluations join it).

The API description (``/openapi.json``) is browsable at ``/docs`` (Swagger UI), served from
files of the ``fastapi-offline`` package: the page loads nothing from another host, so it
works without network access.

>>> app = create_app(settings)          # doctest: +SKIP
>>> run(settings)                       # doctest: +SKIP  (uvicorn, blocks)
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Request, Security
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse, PlainTextResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from shapewatch.collector import (
    BodyLimits,
    BodyPolicy,
    CollectorApi,
    CollectorMetrics,
    Settings,
    Store,
    StoreInvalidated,
    UncheckedOutputs,
    Writer,
    install_error_handlers,
    limits_from_settings,
    require_token,
)
from shapewatch.collector.api import (
    AUTH_ERRORS,
    bearer,
    error_responses,
    guarded_route,
    health_router,
    ingest_router,
    operation_id,
    publish_limits,
)
from shapewatch.collector.http_policy import server_for
from shapewatch.collector.otlp import OtlpMapping
from shapewatch.collector.traces import runs_router, traces_router

from .alerts import AlertBook, AlertState, Transition
from .analyzer import Analyzer
from .api import AnalysisApi, runbooks_router
from .api import router as analysis_router
from .cases_api import cases_router
from .config import AnalyzerConfig, Grouping
from .errors import ConfigInvalid
from .incidents import incident_notices
from .maintenance import start_maintenance
from .notify import (
    Notifier,
    Target,
    digest_url_from_config,
    enqueue,
    send_digest,
    targets_from_config,
)
from .probes.schedule import ProbeScheduler
from .probes.suite import Suite
from .probes_api import probes_router
from .runs import judge_complete_runs
from .store_access import open_store

__all__ = ["create_app", "open_store", "run"]

log = logging.getLogger(__name__)

#: ``GET /metrics``: the Prometheus text, behind a token with the read scope.
metrics_router = APIRouter(
    tags=["health"],
    route_class=guarded_route("read"),
    dependencies=[Security(bearer)],
    responses=error_responses(*AUTH_ERRORS, 500, 503, by_reference=True),
    generate_unique_id_function=operation_id,
)


@metrics_router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=PlainTextResponse,
    responses={
        200: {"description": "The Prometheus text format", "content": {"text/plain": {"schema": {"type": "string"}}}}
    },
)
async def get_metrics(request: Request) -> Response:
    registry: CollectorRegistry = request.app.state.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


def _docs_assets() -> Path:
    """Swagger UI's files, shipped by the ``fastapi-offline`` package."""
    import fastapi_offline

    return Path(fastapi_offline.__file__).parent / "static"


_ASSETS = "/docs/assets"


#: ``/docs`` (Swagger UI) from local files (``install_docs`` mounts them): FastAPI's own page loads
#: its scripts from a CDN, and is blank without network access. The page names no other host: no
#: favicon or validator badge from outside (``validatorUrl`` off). There is no ``/redoc``: Redoc's
#: bundle draws its logo from its vendor's CDN whatever it is told.
docs_router = APIRouter(include_in_schema=False)


@docs_router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    root = request.scope.get("root_path", "")
    return get_swagger_ui_html(
        openapi_url=root + (request.app.openapi_url or "/openapi.json"),
        title=f"{request.app.title} - API",
        oauth2_redirect_url=root + "/docs/oauth2-redirect",
        swagger_js_url=f"{root}{_ASSETS}/swagger-ui-bundle.js",
        swagger_css_url=f"{root}{_ASSETS}/swagger-ui.css",
        swagger_favicon_url=f"{root}{_ASSETS}/favicon.png",
        swagger_ui_parameters={"validatorUrl": None, "persistAuthorization": False},
    )


@docs_router.get("/docs/oauth2-redirect")
async def swagger_ui_redirect() -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()


def install_docs(app: FastAPI) -> None:
    """The API description's browser and the files it loads (``docs_router``)."""
    app.mount(_ASSETS, StaticFiles(directory=_docs_assets()), name="docs-assets")
    app.include_router(docs_router)


def pager_enqueue(
    store: Store, targets: list[Target], grouping: Grouping = Grouping.cohort
) -> Callable[[Any, Sequence[Transition], datetime], None]:
    """The analyzer's hook: firing and resolved transitions become notices in the outbox, in the
    evaluation's own transaction; page alerts through incidents (``incidents.py``: one trigger
    and one resolve per incident). A silenced alert is not announced (its resolve still is, to a
    pager that heard its trigger)."""
    book = AlertBook(store)

    def hook(con: Any, moves: Sequence[Transition], now: datetime) -> None:
        if not moves:
            return
        # Incidents are kept without a pager too: the API and the dashboard show them.
        silences = book.silences(now=now)
        notices = incident_notices(
            con, moves, now, grouping=grouping, silenced=lambda a: any(s.matches(a, now) for s in silences)
        )
        if targets:
            enqueue(con, targets, notices, now)

    return hook


def create_app(
    settings: Settings,
    *,
    store: Store | None = None,
    config: AnalyzerConfig | None = None,
    registry: CollectorRegistry | None = None,
    analyze: bool = True,
    leader: Callable[[], bool] | None = None,
) -> FastAPI:
    """The service's ASGI app; opens the store now (so a locked file fails at start-up).

    ``analyze=False`` leaves the analyzer and notifier jobs out of the scheduler
    (tests that drive evaluations themselves through ``POST /v1/analyzer/run``).
    ``leader``: the analyzer's jobs (evaluations, runs, notifications, probes, digest) run only
    while it answers True (scale-out mode: every node serves the API, the elected one analyzes).
    """
    registry = registry or CollectorRegistry()
    config = config or AnalyzerConfig()
    targets = targets_from_config(config.notify)
    digest_url = digest_url_from_config(config.notify)
    suites = _load_suites(config)  # before the file is opened: a bad suite leaves nothing held
    store = store or open_store(settings)
    # Events commit alone (a 2xx waits only for them); rollups follow (rollup_merge_seconds).
    store.defer_rollups(max_events=settings.rollup_merge_events, max_seconds=settings.rollup_merge_seconds)
    metrics = CollectorMetrics(registry)
    registry.register(UncheckedOutputs(store.unchecked_counts))
    writer = Writer(
        store,
        max_events=settings.batch_max_events,
        max_wait=settings.batch_max_wait_ms / 1000,
        max_queued=settings.writer_queue_events,
        on_batch=metrics.observe_batch,
    )
    api = CollectorApi(store, writer, metrics, limits_from_settings(settings), max_body_bytes=settings.max_body_bytes)
    analyzer = Analyzer(store, config, registry=registry, enqueue=pager_enqueue(store, targets, config.oncall.grouping))
    notifier = Notifier(store, targets, registry=registry)
    probes = ProbeScheduler(store, suites, interval=config.probe_interval) if suites else None

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        writer.start()
        scheduler = start_maintenance(store, settings, registry)
        if analyze:
            seconds = config.interval.total_seconds()
            # One evaluation at a time; a missed one is run once (coalesced) if it is at most
            # one interval late, else skipped: the next one judges the same window anyway.
            scheduler.add_job(
                _when(leader, analyzer.run),
                "interval",
                seconds=seconds,
                id="analyze",
                max_instances=1,
                coalesce=True,
                misfire_grace_time=max(1, int(seconds)),
                next_run_time=datetime.now(UTC) + timedelta(seconds=min(30.0, seconds)),
            )
            scheduler.add_job(
                _when(leader, _runs_job(store, settings)),
                "interval",
                seconds=max(5.0, min(60.0, settings.run_idle_seconds / 2)),
                id="judge-runs",
                max_instances=1,
                coalesce=True,
                misfire_grace_time=60,
            )
            scheduler.add_job(
                _when(leader, _guarded_deliver(notifier)),
                "interval",
                seconds=10,
                id="notify",
                max_instances=1,
                coalesce=True,
                misfire_grace_time=10,
            )
            if probes is not None:
                # Suites run daily, and at the first tick after a served-model change behind their
                # alias or a behavioral/breaking contract version (probes/schedule.py).
                scheduler.add_job(
                    _when(leader, probes.tick),
                    "interval",
                    seconds=config.probe_tick.total_seconds(),
                    id="probes",
                    max_instances=1,
                    coalesce=True,
                    misfire_grace_time=max(1, int(config.probe_tick.total_seconds())),
                )
            if digest_url:
                scheduler.add_job(
                    _when(leader, _digest_job(store, digest_url)),
                    "cron",
                    hour=8,
                    minute=0,
                    id="digest",
                    max_instances=1,
                    coalesce=True,
                    misfire_grace_time=3600,
                )
        # Parsed request bodies hold no reference cycles, but each one allocates tens of
        # thousands of objects, which keeps triggering full collections over every
        # long-lived object of the process. Freeze those, and collect young objects less
        # often (measured: orjson parsing of 500-envelope bodies took 5x its standalone time).
        gc.freeze()
        gc.set_threshold(50_000, 20, 100)
        try:
            yield
        finally:
            store.stop_maintenance()  # a purge under way stops at its next chunk: shutdown waits for no more
            scheduler.shutdown(wait=True)
            notifier.close()
            writer.stop()
            if writer.alive:  # never close the file under a running transaction
                log.error("the writer is still busy; leaving the database to be closed by the exit")
            else:
                store.close()

    app = FastAPI(
        title="shapewatch",
        version="0.1.0",
        lifespan=lifespan,
        description="Schema-drift monitor for language-model structured outputs.",
        openapi_tags=_TAGS,
        generate_unique_id_function=operation_id,
        docs_url=None,  # install_docs: served from local files
        redoc_url=None,  # Redoc's bundle loads its logo from a CDN
    )
    app.add_middleware(BodyPolicy, limits=BodyLimits.from_settings(settings))  # every route's body
    install_error_handlers(app)  # the one error map, for every router
    app.include_router(ingest_router)
    app.include_router(traces_router)
    app.include_router(runs_router)
    app.include_router(cases_router)
    app.include_router(probes_router)
    app.include_router(health_router)
    app.include_router(analysis_router)
    app.include_router(runbooks_router)
    app.include_router(metrics_router)
    install_docs(app)
    limits = limits_from_settings(settings)
    describe = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = publish_limits(describe(), limits)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    # What the routers serve, reached through their dependencies.
    app.state.token_guard = require_token(settings.tokens, "read")
    app.state.collector = api
    app.state.otlp_mapping = OtlpMapping(
        prompt_version_attribute=settings.otlp_prompt_version_attribute,
        default_prompt_version=settings.otlp_default_prompt_version,
        contract_attribute=settings.otlp_contract_attribute,
        agent_release_attribute=settings.otlp_agent_release_attribute,
    )
    app.state.analysis = AnalysisApi(store, config, analyzer)
    app.state.registry = registry
    app.state.store = store
    app.state.writer = writer
    app.state.analyzer = analyzer
    app.state.notifier = notifier
    return app


_TAGS = [
    {"name": "ingest", "description": "Structured outputs and raw provider responses in (token scope ingest)"},
    {"name": "runs", "description": "Agent runs: their steps in order, and the mined cases to review"},
    {"name": "probes", "description": "Probe suite runs: their first-decision scores and cases"},
    {"name": "alerts", "description": "Alerts and silences"},
    {"name": "cohorts", "description": "Cohorts, their window profiles, series and stored outputs"},
    {"name": "baselines", "description": "Frozen baselines: list, freeze, import, activate, inherit, retire"},
    {"name": "contracts", "description": "Registered contract versions"},
    {"name": "review", "description": "The weekly review report"},
    {"name": "admin", "description": "Analyzer runs"},
    {"name": "health", "description": "Liveness (open) and Prometheus metrics"},
]


def _when(leader: Callable[[], bool] | None, job: Callable[[], Any]) -> Callable[[], None]:
    """``job``, run only while ``leader()`` says so (always without ``leader``)."""
    if leader is None:
        return job

    def gated() -> None:
        if leader():
            job()

    return gated


def _digest_job(store: Store, url: str) -> Callable[[], None]:
    """Once a day: the warn alerts firing, to the digest webhook (page alerts went to the pager)."""
    import httpx

    def digest() -> None:
        try:
            warn = [a.to_json() for a in AlertBook(store).alerts(state=AlertState.firing) if a.severity.value == "warn"]
            with httpx.Client() as client:
                ok = send_digest(client, url, warn, datetime.now(UTC))
            log.info("daily digest of %d warn alerts %s", len(warn), "sent" if ok else "NOT delivered")
        except Exception:  # a scheduled job never raises into the scheduler
            log.exception("daily digest failed")

    return digest


def _runs_job(store: Store, settings: Settings) -> Callable[[], None]:
    """Judge the agent runs that are complete (no step for run_idle_seconds) and mine their cases."""

    def judge() -> None:
        try:
            judged, queued = judge_complete_runs(
                store,
                idle=timedelta(seconds=settings.run_idle_seconds),
                cases_per_rule_day=settings.cases_per_rule_day,
                handoff_tools=settings.handoff_tools,
            )
            if judged:
                log.info("judged %d complete agent runs, queued %d cases", judged, queued)
        except Exception:  # a scheduled job never raises into the scheduler
            log.exception("judging complete agent runs failed")

    return judge


def _guarded_deliver(notifier: Notifier) -> Callable[[], None]:
    def deliver() -> None:
        try:
            report = notifier.deliver()
        except Exception:  # a scheduled job never raises into the scheduler (counted by the notifier)
            log.exception("notification delivery failed")
            return
        if report.sent or report.retried or report.failed:
            log.info("notifications: %s", report)

    return deliver


class RepeatedLogLimit(logging.Filter):
    """Let a log message that begins with ``prefix`` through once per ``every`` seconds, saying
    how many were held back. Out of file descriptors, asyncio logs a failed accept, with its
    traceback, on every try: 400,000 lines a minute under a connection flood (measured)."""

    def __init__(self, prefix: str, every: float = 60.0, clock: Callable[[], float] | None = None) -> None:
        super().__init__()
        self.prefix, self.every = prefix, every
        self._clock = clock or time.monotonic
        self._next = float("-inf")
        self._held = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(self.prefix):
            return True
        now = self._clock()
        if now < self._next:
            self._held += 1
            return False
        if self._held:
            record.msg = f"{record.msg} (and {self._held} more like it in the last {self.every:.0f} s)"
        self._held, self._next = 0, now + self.every
        return True


class QuietAfterInvalidation(logging.Filter):
    """Log a failure caused by an invalidated database in one line, without its traceback.

    The invalidation itself is logged once, at CRITICAL, with its cause (a full disk, say).
    Until the service has stopped, every job or request still running fails on it too; their
    tracebacks would bury that cause under stacks that say nothing new.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and _invalidation_in(exc):
            record.msg, record.args = f"{record.getMessage()}: {exc}", ()
            record.exc_info = record.exc_text = None
        return True


def _invalidation_in(exc: BaseException) -> bool:
    """Whether ``exc`` is, or was raised from or while handling, a StoreInvalidated."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, StoreInvalidated):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False


def run(settings: Settings, config: AnalyzerConfig | None = None) -> None:
    """Serve until interrupted (SIGINT/SIGTERM commit what is queued, then exit).

    Raises StoreInvalidated after stopping when DuckDB invalidated the database (a checkpoint
    that could not write the file): every later write would fail, so the service stops
    rather than answer 503 forever; a restart recovers the file.
    """
    app = create_app(settings, config=config)
    server = server_for(app, settings)
    store: Store = app.state.store
    store.on_invalidated = lambda _: setattr(server, "should_exit", True)  # a graceful stop, as on SIGTERM
    logging.getLogger("asyncio").addFilter(RepeatedLogLimit("socket.accept() out of system resource"))
    quiet = QuietAfterInvalidation()
    for name in ("", "uvicorn", "uvicorn.access"):  # uvicorn's loggers have handlers of their own
        for handler in logging.getLogger(name).handlers:
            handler.addFilter(quiet)
    log.info("shapewatch serving %s on http://%s:%d", settings.db_path, settings.host, settings.port)
    server.run()
    if store.invalidated is not None:
        raise store.invalidated


def _load_suites(config: AnalyzerConfig) -> list[Suite]:
    """The configured probe suites; one that cannot be read fails start-up, naming the file and the key."""
    from .probes import load_suite

    suites: list[Suite] = []
    for path in config.probe_suites:
        try:
            suites.append(load_suite(Path(path)))
        except ConfigInvalid as exc:
            raise ConfigInvalid(f"probes.suites ({path})", str(exc)) from None
    return suites
