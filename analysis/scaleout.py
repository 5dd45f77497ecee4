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

import click
from prometheus_client import CollectorRegistry

from shapewatch.collector.errors import ShapewatchError, StoreError
from shapewatch.collector.scaleout import LOCK_ANALYZER, ScaleOutConfig, collector_app, run_worker
from shapewatch.collector.store.lake import LakeBoundStore

from .store_access import SCHEMAS

if TYPE_CHECKING:  # the rules (scipy) load only in the analyzer's process: the CLI stays light
    from .config import AnalyzerConfig

__all__ = ["open_lake_store", "run_analyzer", "scaleout"]

log = logging.getLogger(__name__)


def open_lake_store(cfg: ScaleOutConfig, state: Path) -> LakeBoundStore:
    """The analyzer's store: its records in ``state``, the observations in the lake."""
    store = LakeBoundStore.open(state, bucket_seconds=cfg.bucket_seconds, schemas=SCHEMAS, external_access=True)
    assert isinstance(store, LakeBoundStore)
    try:
        store.bind_lake(cfg.lake)
    except BaseException:
        store.close()
        raise
    return store


def run_analyzer(
    cfg: ScaleOutConfig,
    *,
    state: Path,
    name: str,
    config: AnalyzerConfig | None = None,
    compact_every: timedelta = timedelta(minutes=10),
    stop: threading.Event | None = None,
    serve: tuple[str, int] | None = None,
) -> None:
    """Wait to be elected, then evaluate every ``config.interval`` and compact the lake every
    ``compact_every``, until ``stop`` is set. A failed evaluation or compaction is logged and
    tried again at its next time; it never ends the loop.

    ``serve`` (host, port): once elected, run the embedded service's app on the lake instead
    (its scheduler evaluates and keeps the lake; the read API and the dashboard's reads are
    served; ingest there answers 503, events go to the collectors) until the process is stopped.
    """
    import psycopg

    from .analyzer import Analyzer
    from .config import AnalyzerConfig

    stop = stop or threading.Event()
    config = config or AnalyzerConfig()
    try:
        pg = psycopg.connect(
            cfg.pg_dsn, autocommit=True, application_name=f"shapewatch-analyzer-{name}"[:63], connect_timeout=10
        )
    except psycopg.Error as exc:
        raise StoreError("connecting to the lake's PostgreSQL catalog", exc) from exc
    try:
        while not stop.is_set():
            row = pg.execute("SELECT pg_try_advisory_lock(%s)", [LOCK_ANALYZER]).fetchone()
            if row and row[0]:
                break
            stop.wait(1.0)
        if stop.is_set():
            return
        log.warning("analyzer %s elected: it evaluates the lake from now on", name)
        print(f"analyzer {name} elected", flush=True)  # noqa: T201 (the cluster test reads it)
        store = open_lake_store(cfg, state)
        if serve is not None:
            import dataclasses

            import uvicorn

            from shapewatch.collector import Settings

            from .service import create_app

            settings = dataclasses.replace(Settings(), db_path=state, host=serve[0], port=serve[1])
            uvicorn.run(
                create_app(settings, store=store, config=config), host=serve[0], port=serve[1], log_level="warning"
            )
            return
        try:
            analyzer = Analyzer(store, config, registry=CollectorRegistry())
            next_compact = time.monotonic() + compact_every.total_seconds()
            while not stop.is_set():
                analyzer.run()
                if time.monotonic() >= next_compact:
                    try:
                        log.info(
                            "lake maintenance: %s", store.compact_lake(dedup_ttl=timedelta(days=cfg.dedup_ttl_days))
                        )
                    except ShapewatchError:
                        log.exception("lake maintenance failed; tried again at its next time")
                    next_compact = time.monotonic() + compact_every.total_seconds()
                stop.wait(config.interval.total_seconds())
        finally:
            store.close()
    finally:
        pg.close()


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
    import uvicorn

    cfg = _config(config_path)
    uvicorn.run(collector_app(cfg), host=host, port=port, log_level="warning")


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


@scaleout.command()
@_config_option
@click.option(
    "--state",
    type=click.Path(path_type=Path, dir_okay=False),
    required=True,
    help="Local DuckDB file for the analyzer's alerts, baselines and outbox.",
)
@click.option("--name", default="analyzer", show_default=True, help="Name shown in PostgreSQL and the logs.")
@click.option(
    "--compact-minutes",
    default=10.0,
    show_default=True,
    type=click.FloatRange(0.1, 10_080),
    help="Minutes between lake maintenance runs (compaction, file merging, snapshot expiry).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address of the read API (with --port).")
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    help="Once elected, serve the service's read API (alerts, cohorts, baselines; the dashboard's reads) here.",
)
def analyzer(config_path: Path, state: Path, name: str, compact_minutes: float, host: str, port: int | None) -> None:
    """Wait for election (a PostgreSQL advisory lock), then evaluate the lake on a schedule."""
    cfg = _config(config_path)
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
            compact_every=timedelta(minutes=compact_minutes),
            stop=stop,
            serve=None if port is None else (host, port),
        )
    except ShapewatchError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
