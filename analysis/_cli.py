"""What the root CLI's commands share: settings, the analyzer's rules, where a command works
(the database file with ``--db`` or a running service with ``--url``), and clean failures.

Private to the package: command groups kept in modules of their own (contract_cli.py) use the same options
and the same backend as the root CLI's commands, without importing the root CLI.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click
import orjson

from shapewatch.collector import Settings, SettingsInvalid, ShapewatchError, load_settings

from .config import AnalyzerConfig

if TYPE_CHECKING:
    from .client import Backend


def _settings(ctx: click.Context, **overrides: Any) -> Settings:
    config = ctx.obj.get("config") if ctx.obj else None
    try:
        return load_settings(overrides, env=os.environ, toml_path=Path(config) if config else None)
    except SettingsInvalid as exc:
        raise click.UsageError(str(exc)) from exc


def _analyzer_config(ctx: click.Context) -> AnalyzerConfig:
    """The analyzer's rules from the same TOML file as the settings ([defaults], [contracts], ...)."""
    from .config import load_config
    from .errors import ConfigInvalid

    config = (ctx.obj or {}).get("config") or os.environ.get("SHAPEWATCH_CONFIG")
    try:
        return load_config(Path(config) if config else None)
    except ConfigInvalid as exc:
        raise click.UsageError(str(exc)) from exc


def _fail(exc: Exception) -> NoReturn:
    click.echo(f"error: {exc}", err=True)
    sys.exit(2)


def _echo_json(value: Any) -> None:
    click.echo(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode())


_db_option = click.option(
    "--db",
    "db_path",
    type=click.Path(dir_okay=False),
    help="DuckDB file, used directly (it must not be held by a running service).",
)
_url_option = click.option(
    "--url",
    envvar="SHAPEWATCH_URL",
    help="URL of a running service to ask instead of opening the file (SHAPEWATCH_URL).",
)
_token_option = click.option("--token", envvar="SHAPEWATCH_TOKEN", help="Bearer token for --url (SHAPEWATCH_TOKEN).")


def _backend_options(f: Any) -> Any:
    """--db, --url and --token: where a command reading or changing baselines and alerts works."""
    return _db_option(_url_option(_token_option(f)))


def _author() -> str:
    return os.environ.get("SHAPEWATCH_AUTHOR") or os.environ.get("USER") or "unknown"


@contextmanager
def _backend(
    ctx: click.Context, db_path: str | None, url: str | None, token: str | None, *, create: bool = False
) -> Iterator[Backend]:
    from .client import backend

    if db_path and url:
        raise click.UsageError("give --db or --url, not both")
    settings = _settings(ctx, db_path=db_path)
    try:
        with backend(url=url, token=token, settings=settings, config=_analyzer_config(ctx), create=create) as b:
            yield b
    except ShapewatchError as exc:
        _fail(exc)
