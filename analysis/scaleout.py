"""Scale-out mode's processes as ``shapewatch scaleout ...`` commands, and the one active
analyzer: the collector and the worker are the collector package's (``collector/scaleout.py``);
the analyzer is judgement, so it lives here.

The analyzer elects itself with a PostgreSQL advisory lock held on its own session: any number
may run, one evaluates; when it dies its session ends, the lock is released, and the next one
to ask (every second) takes over. It evaluates the lake through ``LakeBoundStore``: the rules
and SQL of the embedded service, with its own records (alerts, baselines, runs, outbox) in a
local DuckDB file. It also runs the lake's maintenance (``compact_lake``) on a schedule.

>>> shapewatch scaleout collector --config scaleout.toml --port 8000     # doctest: +SKIP
>>> shapewatch scaleout worker --config scaleout.toml --name w1          # doctest: +SKIP
>>> shapewatch scaleout analyzer --config scaleout.toml --state var/analyzer.duckdb   # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import click
from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CollectorRegistry
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware

from shapewatch.collector.api import ApiError, error_body, json_response
from shapewatch.collector.errors import ShapewatchError, StoreError
from shapewatch.collector.http_policy import BodyRefused, server_for
from shapewatch.collector.scaleout import LOCK_ANALYZER, ScaleOutConfig, collector_app, run_worker
from shapewatch.collector.settings import Scope
from shapewatch.collector.store.lake import LakeBoundStore

from .store_access import SCHEMAS

if TYPE_CHECKING:  # the rules (scipy) load only in the analyzer's process: the CLI stays light
    from .config import AnalyzerConfig

__all__ = ["SharedStateRouting", "open_lake_store", "run_analyzer", "scaleout", "scaleout_api_app"]

log = logging.getLogger(__name__)


def open_lake_store(cfg: ScaleOutConfig, state: Path, *, shared: bool = True) -> LakeBoundStore:
    """The analyzer's store: its records in ``state``, the observations in the lake; with
    ``shared``, those records are the ones every node shares through PostgreSQL (read-only here
    until ``take_over``)."""
    store = LakeBoundStore.open(state, bucket_seconds=cfg.bucket_seconds, schemas=SCHEMAS, external_access=True)
    assert isinstance(store, LakeBoundStore)
    try:
        store.bind_lake(cfg.lake)
        if shared:
            store.bind_shared_state(SCHEMAS)
    except BaseException:
        store.close()
        raise
    return store


def _connect(cfg: ScaleOutConfig, name: str) -> Any:
    import psycopg

    try:
        return psycopg.connect(
            cfg.pg_dsn, autocommit=True, application_name=f"shapewatch-analyzer-{name}"[:63], connect_timeout=10
        )
    except psycopg.Error as exc:
        raise StoreError("connecting to the lake's PostgreSQL catalog", exc) from exc


def _wait_for_the_lock(pg: Any, stop: threading.Event) -> bool:
    """Ask for the analyzer lock on this session every second until it is held (True) or
    ``stop`` is set (False)."""
    while not stop.is_set():
        row = pg.execute("SELECT pg_try_advisory_lock(%s)", [LOCK_ANALYZER]).fetchone()
        if row and row[0]:
            return True
        stop.wait(1.0)
    return False


def _campaign(
    cfg: ScaleOutConfig, store: LakeBoundStore, name: str, api_url: str | None, stop: threading.Event
) -> None:
    """Ask for the analyzer lock every second; once held, take the shared records over and keep
    the lock's session alive. A session that breaks (PostgreSQL restarted, the network cut), or a
    push that finds another analyzer elected, makes this node a standby again, campaigning."""
    import psycopg

    while not stop.is_set():
        pg = None
        try:
            pg = _connect(cfg, name)
            if not _wait_for_the_lock(pg, stop):
                return
            t0 = time.monotonic()
            epoch = store.take_over(name, api_url)
            log.warning("analyzer %s elected (epoch %d): it evaluates the lake from now on", name, epoch)
            print(f"analyzer {name} elected in {time.monotonic() - t0:.2f} s", flush=True)  # noqa: T201 (the cluster test reads it)
            while not stop.is_set() and store.is_leader:
                pg.execute("SELECT 1")
                stop.wait(1.0)
            if not stop.is_set():
                log.error("analyzer %s is no longer the elected one: standing by again", name)
        except (psycopg.Error, ShapewatchError) as exc:
            log.error("analyzer %s: election or takeover failed (%s); trying again", name, exc)
            stop.wait(1.0)
        finally:
            if store.shared is not None:
                store.shared.epoch = None  # without the lock's session, never write the shared state
            if pg is not None:
                pg.close()


def run_analyzer(
    cfg: ScaleOutConfig,
    *,
    state: Path,
    name: str,
    config: AnalyzerConfig | None = None,
    compact_every: timedelta = timedelta(minutes=10),
    stop: threading.Event | None = None,
    serve: tuple[str, int] | None = None,
    elect: bool = True,
    advertise_url: str | None = None,
) -> None:
    """Without ``serve``: wait to be elected, then evaluate every ``config.interval`` and
    compact the lake every ``compact_every``, until ``stop`` is set. A failed evaluation or
    compaction is logged and tried again at its next time; it never ends the loop.

    ``serve`` (host, port): serve the embedded service's app on the lake from the start, elected
    or not (``api.py``'s routes, the dashboard's reads): a standby answers reads from the shared
    records and forwards writes to the elected analyzer (``advertise_url``, by default
    ``http://host:port``, is where the others reach this one once elected); the elected one's
    scheduler evaluates, pages and keeps the lake. ``elect=False``: an API node that never runs
    for election (``shapewatch scaleout api``).
    """
    from .config import AnalyzerConfig

    stop = stop or threading.Event()
    config = config or AnalyzerConfig()
    store = open_lake_store(cfg, state)
    try:
        if serve is None:
            _analyze_when_elected(cfg, store, name=name, config=config, compact_every=compact_every, stop=stop)
            return
        url = advertise_url or f"http://{serve[0]}:{serve[1]}"
        app = scaleout_api_app(cfg, store, config=config, host=serve[0], port=serve[1], advertise_url=url)
        campaign = None
        if elect:
            campaign = threading.Thread(
                target=_campaign, args=(cfg, store, name, url, stop), name="analyzer-election", daemon=True
            )
            campaign.start()
        try:
            # the embedded service's server: header timeout, keep-alive and connection limits
            server_for(app, app.state.settings).run()
        finally:
            stop.set()
            if campaign is not None:
                campaign.join(10)
    finally:
        store.close()


def _analyze_when_elected(
    cfg: ScaleOutConfig,
    store: LakeBoundStore,
    *,
    name: str,
    config: AnalyzerConfig,
    compact_every: timedelta,
    stop: threading.Event,
) -> None:
    from .analyzer import Analyzer

    pg = _connect(cfg, name)
    try:
        if not _wait_for_the_lock(pg, stop):
            return
        store.take_over(name, None)
        log.warning("analyzer %s elected: it evaluates the lake from now on", name)
        print(f"analyzer {name} elected", flush=True)  # noqa: T201 (the cluster test reads it)
        analyzer = Analyzer(store, config, registry=CollectorRegistry())
        next_compact = time.monotonic() + compact_every.total_seconds()
        while not stop.is_set():
            analyzer.run()
            if not store.is_leader:  # a push found another analyzer elected
                log.error("analyzer %s is no longer the elected one: stopping", name)
                return
            if time.monotonic() >= next_compact:
                try:
                    log.info("lake maintenance: %s", store.compact_lake(dedup_ttl=timedelta(days=cfg.dedup_ttl_days)))
                except ShapewatchError:
                    log.exception("lake maintenance failed; tried again at its next time")
                next_compact = time.monotonic() + compact_every.total_seconds()
            stop.wait(config.interval.total_seconds())
    finally:
        if store.shared is not None:
            store.shared.epoch = None
        pg.close()


def scaleout_api_app(
    cfg: ScaleOutConfig,
    store: LakeBoundStore,
    *,
    config: AnalyzerConfig,
    host: str,
    port: int,
    advertise_url: str | None = None,
) -> FastAPI:
    """The embedded service's app on the lake and the shared records, any node: its analyzer
    jobs run only while this node is the elected analyzer, and ``SharedStateRouting`` brings a
    standby's records up to date before each read and sends its writes to the elected one."""
    import dataclasses

    from shapewatch.collector import Settings

    from .service import create_app

    settings = dataclasses.replace(
        Settings(), db_path=store.path, host=host, port=port, tokens=cfg.tokens, max_body_bytes=cfg.max_body_bytes
    )
    app = create_app(settings, store=store, config=config, leader=lambda: store.is_leader)
    own = advertise_url or f"http://{host}:{port}"
    # Inside the service's body policy (the last middleware is the innermost): a forwarded body
    # is read under the same limits, timeouts and refusals as one a route reads.
    app.user_middleware.append(Middleware(SharedStateRouting, store=store, own_url=own))
    app.state.settings = settings
    return app


#: Answered by each node itself, whatever its role.
_LOCAL_PATHS = ("/healthz", "/metrics", "/openapi.json", "/docs")
_SAFE = frozenset({"GET", "HEAD", "OPTIONS"})
_HOP_HEADERS = frozenset(
    {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "te", "upgrade", "trailer"}
)


class SharedStateRouting(BaseHTTPMiddleware):
    """On a node that is not the elected analyzer: a read is answered from the shared records,
    brought up to PostgreSQL's version first (one query when nothing changed); a write (any
    other method) is forwarded to the elected analyzer, which registered its URL at election,
    and answered with its reply, after which this node's copy is brought up to date (so the
    client reads its own write from here). A token unknown here is refused here (401, as the
    elected one would); its scopes are the elected one's to judge. The elected node itself
    serves everything directly."""

    def __init__(self, app: Any, *, store: LakeBoundStore, own_url: str | None = None) -> None:
        super().__init__(app)
        self.store, self.own_url = store, own_url

    async def dispatch(self, request: Request, call_next: Any) -> Response:
        path = request.url.path
        if self.store.is_leader or path.startswith(_LOCAL_PATHS):
            return await call_next(request)  # type: ignore[no-any-return]
        if request.method in _SAFE:
            try:
                await asyncio.to_thread(self.store.refresh)
            except StoreError as exc:
                return json_response(error_body(503, str(exc)), 503, {"Retry-After": "1"})
            return await call_next(request)  # type: ignore[no-any-return]
        return await self._forward(request)

    async def _forward(self, request: Request) -> Response:
        import httpx

        guard = request.app.state.token_guard
        try:
            guard.check(request, Scope.read, Scope.ingest)
        except ApiError as exc:
            if exc.status == 401:
                return json_response(error_body(401, exc.message, exc.fields), 401, exc.headers)
        try:
            body = await request.body()
        except BodyRefused as exc:  # the service's body policy: 408, 413 or 503, as a route answers
            return json_response(
                error_body(exc.status_code, str(exc.detail), exc.fields), exc.status_code, dict(exc.headers or {})
            )
        try:
            leader, url = await asyncio.to_thread(self.store.leader_url)
        except StoreError as exc:
            return json_response(error_body(503, str(exc)), 503, {"Retry-After": "1"})
        if url is None:
            why = (
                "no analyzer is elected yet"
                if leader is None
                else f"the elected analyzer {leader!r} serves no API (it runs without --port)"
            )
            return json_response(
                error_body(503, f"{why}: writes (acknowledgements, silences, baselines) go to the elected analyzer"),
                503,
                {"Retry-After": "1"},
            )
        if url == self.own_url:  # elected a moment ago: the records are being taken over
            return json_response(
                error_body(503, "this node is taking over as the elected analyzer; retry"), 503, {"Retry-After": "1"}
            )
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS]
        target = url.rstrip("/") + request.url.path + (f"?{request.url.query}" if request.url.query else "")
        try:
            async with httpx.AsyncClient(timeout=120) as client:
                reply = await client.request(request.method, target, content=body, headers=headers)
        except httpx.HTTPError as exc:
            return json_response(
                error_body(
                    503, f"the elected analyzer {leader!r} at {url} did not answer ({type(exc).__name__}); retry"
                ),
                503,
                {"Retry-After": "1"},
            )
        try:
            await asyncio.to_thread(self.store.refresh)
        except StoreError as exc:  # the write is done there; this node catches up at its next read
            log.warning("shared records not refreshed after a forwarded write: %s", exc)
        out = {
            k: v
            for k, v in reply.headers.items()
            if k.lower() not in _HOP_HEADERS and k.lower() not in ("content-encoding", "date", "server")
        }
        return Response(reply.content, status_code=reply.status_code, headers=out)


def _config(path: Path) -> ScaleOutConfig:
    try:
        return ScaleOutConfig.from_toml(path)
    except ShapewatchError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)


_config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    required=True,
    help="TOML file with a [scaleout] table (docs/scale-out.md).",
)


@click.group()
def scaleout() -> None:
    """Scale-out mode: collectors on NATS JetStream, workers into DuckLake, one elected analyzer."""


@scaleout.command()
@_config_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535), help="Port to listen on.")
def collector(config_path: Path, host: str, port: int) -> None:
    """Validate envelopes and publish them to JetStream; 200 only after JetStream acknowledged."""
    import dataclasses

    from shapewatch.collector import Settings

    cfg = _config(config_path)
    # the embedded service's server: header timeout, keep-alive and connection limits
    server_for(collector_app(cfg), dataclasses.replace(Settings(), host=host, port=port)).run()


@scaleout.command()
@_config_option
@click.option("--name", default="worker", show_default=True, help="Name shown in PostgreSQL and the logs.")
def worker(config_path: Path, name: str) -> None:
    """Pull events per shard, store them in the lake with their rollups, ack after the commit."""
    cfg = _config(config_path)
    try:
        asyncio.run(run_worker(cfg, name=name))
    except ShapewatchError as exc:  # the lake or its catalog unreachable at start
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)


def _rules(path: Path | None) -> AnalyzerConfig:
    from .config import load_config
    from .errors import ConfigInvalid

    try:
        return load_config(path)
    except ConfigInvalid as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)


_state_option = click.option(
    "--state",
    type=click.Path(path_type=Path, dir_okay=False),
    required=True,
    help="Local DuckDB file: this node's copy of the shared records (alerts, baselines, outbox...).",
)
_rules_option = click.option(
    "--rules",
    "rules_path",
    type=click.Path(path_type=Path, dir_okay=False),
    help="TOML file of the analyzer's rules and notification targets ([defaults], [analyzer], [notify], ...: "
    "the embedded service's tables). Every analyzer should be given the same file.",
)
_host_option = click.option("--host", default="127.0.0.1", show_default=True, help="Address of the API (with --port).")


def _check_url(_: click.Context, __: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    parts = urlsplit(value)
    if (
        len(value) > 2048
        or parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.query
        or parts.fragment
    ):
        raise click.BadParameter(
            "must be an http:// or https:// URL with a host, at most 2048 characters, without query or "
            "fragment (e.g. http://analyzer-1:8000)"
        )
    return value


_advertise_option = click.option(
    "--advertise-url",
    callback=_check_url,
    help="The URL other nodes reach this one's API at once it is elected (default http://HOST:PORT).",
)


def _serve_analyzer(
    cfg: ScaleOutConfig, *, state: Path, name: str, rules: Path | None, compact_minutes: float = 10.0, **kw: Any
) -> None:
    config = _rules(rules)
    stop = threading.Event()

    def _stop(*_: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        run_analyzer(
            cfg,
            state=state,
            name=name,
            config=config,
            compact_every=timedelta(minutes=compact_minutes),
            stop=stop,
            **kw,
        )
    except ShapewatchError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)


@scaleout.command()
@_config_option
@_state_option
@click.option("--name", default="analyzer", show_default=True, help="Name shown in PostgreSQL and the logs.")
@click.option(
    "--compact-minutes",
    default=10.0,
    show_default=True,
    type=click.FloatRange(0.1, 10_080),
    help="Minutes between lake maintenance runs without --port (with it, the service's schedule).",
)
@_rules_option
@_host_option
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    help="Serve the service's API here from the start (reads from the shared records, writes forwarded "
    "to the elected analyzer while a standby).",
)
@_advertise_option
def analyzer(
    config_path: Path,
    state: Path,
    name: str,
    compact_minutes: float,
    rules_path: Path | None,
    host: str,
    port: int | None,
    advertise_url: str | None,
) -> None:
    """Stand for election (a PostgreSQL advisory lock); the elected one evaluates the lake on a schedule."""
    cfg = _config(config_path)
    _serve_analyzer(
        cfg,
        state=state,
        name=name,
        rules=rules_path,
        compact_minutes=compact_minutes,
        serve=None if port is None else (host, port),
        advertise_url=advertise_url,
    )


@scaleout.command()
@_config_option
@_state_option
@click.option("--name", default="api", show_default=True, help="Name shown in PostgreSQL and the logs.")
@_rules_option
@_host_option
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535), help="Port of the API.")
def api(config_path: Path, state: Path, name: str, rules_path: Path | None, host: str, port: int) -> None:
    """Serve the read API (and the dashboard's reads) on the lake and the shared records; never elected."""
    cfg = _config(config_path)
    _serve_analyzer(cfg, state=state, name=name, rules=rules_path, serve=(host, port), elect=False)
