"""The root CLI, ``shapewatch``: one click group, commands are verbs.

Errors become a clear message on stderr and an exit code (2 for usage or
input errors, 1 when the command worked and found something, such as
rejected lines), never a traceback.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

import click
import orjson

from collector import (
    Settings,
    SettingsInvalid,
    ShapewatchError,
    import_files,
    limits_from_settings,
    load_settings,
)

__all__ = ["main", "cli"]


def _settings(ctx: click.Context, **overrides: Any) -> Settings:
    config = ctx.obj.get("config") if ctx.obj else None
    try:
        return load_settings(overrides, env=os.environ, toml_path=Path(config) if config else None)
    except SettingsInvalid as exc:
        raise click.UsageError(str(exc)) from exc


@click.group()
@click.option("--config", type=click.Path(dir_okay=False), help="TOML settings file (also SHAPEWATCH_CONFIG).")
@click.option("-v", "--verbose", is_flag=True, help="Log more.")
@click.pass_context
def cli(ctx: click.Context, config: str | None, verbose: bool) -> None:
    """shapewatch: watch the shape of language-model structured outputs drift."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ctx.obj = {"config": config}


@cli.command()
@click.option("--db", "db_path", type=click.Path(dir_okay=False), help="DuckDB file the service owns.")
@click.option("--host", help="Address to bind (default 127.0.0.1).")
@click.option("--port", type=int, help="Port (default 8000).")
@click.pass_context
def serve(ctx: click.Context, db_path: str | None, host: str | None, port: int | None) -> None:
    """Run the collector API and /metrics on one DuckDB file (the only writer)."""
    _serve(_settings(ctx, db_path=db_path, host=host, port=port))


def _serve(settings: Settings) -> None:
    from .service import run

    try:
        run(settings)
    except ShapewatchError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)


@cli.command()
@click.option("--db", "db_path", type=click.Path(dir_okay=False), help="DuckDB file (default ./var/shapewatch.duckdb).")
@click.option("--port", type=int, help="Port of the service (default 8000).")
@click.pass_context
def up(ctx: click.Context, db_path: str | None, port: int | None) -> None:
    """Run the product locally: the service on ./var/shapewatch.duckdb."""
    settings = _settings(ctx, db_path=db_path, port=port)
    click.echo(f"shapewatch service: http://{settings.host}:{settings.port}  "
               f"(API docs at /docs, metrics at /metrics; database {settings.db_path})")
    _serve(settings)


@cli.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--db", "db_path", type=click.Path(dir_okay=False), help="DuckDB file (must not be held by a service).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="Summary format.")
@click.pass_context
def ingest(ctx: click.Context, files: tuple[Path, ...], db_path: str | None, fmt: str) -> None:
    """Import JSONL or .jsonl.gz envelopes; rejected lines go to a quarantine file.

    Exit 0 when every line was stored or was a duplicate, 1 when any line was rejected.
    """
    from .store_access import open_store

    settings = _settings(ctx, db_path=db_path)
    try:
        store = open_store(settings, bulk=True)
    except ShapewatchError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    total = sum(f.stat().st_size for f in files)
    show = sys.stderr.isatty()
    try:
        with store, click.progressbar(length=total, label="importing", file=sys.stderr,
                                      hidden=not show) as bar:
            summary = import_files(list(files), store, limits_from_settings(settings), progress=bar.update)
    except ShapewatchError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    out = summary.as_dict()
    if fmt == "json":
        click.echo(orjson.dumps(out).decode())
    else:
        click.echo(f"accepted {out['accepted']}, duplicate {out['duplicate']}, rejected {out['rejected']}")
        for reason, n in out["rejected_by_reason"].items():
            click.echo(f"  rejected ({reason}): {n}")
        for q in out["quarantine"]:
            click.echo(f"  rejected lines with their reasons: {q}")
    sys.exit(1 if summary.rejected else 0)


def main() -> None:
    cli(prog_name="shapewatch")


if __name__ == "__main__":
    main()
