"""The service process: the HTTP app (collector routes, /metrics), assembled here.

``analysis`` is the highest backend layer, so this is where the routers that
each package exposes are put together with the store, the writer and the
metrics registry, and where the scheduler runs the store's upkeep
(``maintenance.py``; the analyzer's evaluations join it).

>>> app = create_app(settings)          # doctest: +SKIP
>>> run(settings)                       # doctest: +SKIP  (uvicorn, blocks)
"""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvicorn
from fastapi import Depends, FastAPI
from fastapi.responses import Response
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from collector import (
    CollectorApi,
    CollectorMetrics,
    Settings,
    Store,
    Writer,
    install_error_handlers,
    limits_from_settings,
    require_token,
)

from .maintenance import start_maintenance
from .store_access import open_store

__all__ = ["create_app", "open_store", "run"]

log = logging.getLogger(__name__)


def create_app(settings: Settings, *, store: Store | None = None,
               registry: CollectorRegistry | None = None) -> FastAPI:
    """The service's ASGI app; opens the store now (so a locked file fails at start-up)."""
    registry = registry or CollectorRegistry()
    store = store or open_store(settings)
    # Events commit alone (a 2xx waits only for them); rollups follow within a second.
    store.defer_rollups(max_events=settings.rollup_merge_events, max_seconds=settings.rollup_merge_seconds)
    metrics = CollectorMetrics(registry)
    writer = Writer(store, max_events=settings.batch_max_events, max_wait=settings.batch_max_wait_ms / 1000,
                    max_queued=settings.writer_queue_events, on_batch=metrics.observe_batch)
    api = CollectorApi(store, writer, metrics, limits_from_settings(settings),
                       max_body_bytes=settings.max_body_bytes)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        writer.start()
        scheduler = start_maintenance(store, settings, registry)
        # Parsed request bodies hold no reference cycles, but each one allocates tens of
        # thousands of objects, which keeps triggering full collections over every
        # long-lived object of the process. Freeze those, and collect young objects less
        # often (measured: orjson parsing of 500-envelope bodies took 5x its standalone time).
        gc.freeze()
        gc.set_threshold(50_000, 20, 100)
        try:
            yield
        finally:
            scheduler.shutdown(wait=True)
            writer.stop()
            if writer.alive:  # never close the file under a running transaction
                log.error("the writer is still busy; leaving the database to be closed by the exit")
            else:
                store.close()

    app = FastAPI(title="shapewatch", version="0.1.0", lifespan=lifespan,
                  description="Schema-drift monitor for language-model structured outputs.")
    install_error_handlers(app)
    app.include_router(api.router(settings.tokens))
    app.include_router(api.health_router())

    @app.get("/metrics", summary="Prometheus metrics", dependencies=[Depends(require_token(settings.tokens))])
    async def metrics_endpoint() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    app.state.store = store
    app.state.writer = writer
    return app


def run(settings: Settings) -> None:
    """Serve until interrupted (SIGINT/SIGTERM commit what is queued, then exit)."""
    app = create_app(settings)
    log.info("shapewatch serving %s on http://%s:%d", settings.db_path, settings.host, settings.port)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="warning", access_log=False)
