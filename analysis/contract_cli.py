"""``shapewatch contract``: register JSON Schemas and tool definitions, and gate changes to them.

``diff OLD NEW`` classifies every change (collector/contract_diff.py) and exits
2 when any is breaking, 1 when any is behavioral (and none breaking), 0
otherwise, so that it can gate a pull request. OLD and NEW are files, or, with
``--db``, ``NAME@VERSION`` of a registered version. ``register`` stores an
immutable version with its fingerprints; ``list`` and ``show`` read them back.

Usage and input errors (unreadable files, invalid schemas, a version already
registered with other content) print one line on stderr and exit 2, never a
traceback.
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

# The collector is imported inside the commands: `shapewatch --help` and the other
# commands do not pay for DuckDB and jsonschema.
if TYPE_CHECKING:
    from collector import Contract, ContractChange, RegisteredContract, Store

__all__ = ["contract"]


def _fail(exc: BaseException | str) -> NoReturn:
    click.echo(f"error: {exc}", err=True)
    sys.exit(2)


@contextmanager
def _store(ctx: click.Context, db_path: str | None, *, must_exist: bool) -> Iterator[Store]:
    """The store at --db (or the configured one), with the contracts tables, closed at the end."""
    from collector import RollupConfig, SettingsInvalid, ShapewatchError, Store, load_settings

    from .store_access import SCHEMAS

    root = ctx.find_root().obj or {}
    config = root.get("config")
    try:
        settings = load_settings({"db_path": db_path}, env=os.environ, toml_path=Path(config) if config else None)
    except SettingsInvalid as exc:
        raise click.UsageError(str(exc)) from exc
    if must_exist and not settings.db_path.exists():
        _fail(f"database {settings.db_path} does not exist (check --db)")
    try:
        store = Store.open(settings.db_path, memory_limit=settings.memory_limit, threads=settings.duckdb_threads,
                           bucket_seconds=settings.bucket_seconds, schemas=SCHEMAS,
                           rollup=RollupConfig(enum_value_max_length=settings.enum_value_max_length,
                                               enum_values_per_path=settings.enum_values_per_path,
                                               max_depth=settings.max_depth))
    except ShapewatchError as exc:
        _fail(exc)
    with store:
        try:
            yield store
        except ShapewatchError as exc:
            _fail(exc)


_db_option = click.option("--db", "db_path", type=click.Path(dir_okay=False),
                          help="DuckDB file, used directly (it must not be held by a running service).")


@click.group()
def contract() -> None:
    """Register JSON Schemas and tool definitions, and classify changes between versions."""


# --- diff ----------------------------------------------------------------------------------

def _load(ctx: click.Context, spec: str, db_path: str | None) -> Contract:
    """A file, or with --db a registered ``NAME@VERSION`` (a path that exists always wins)."""
    from collector import ShapewatchError, get_contract, read_contract

    if Path(spec).exists() or db_path is None or "@" not in spec:
        try:
            return read_contract(spec)
        except ShapewatchError as exc:
            _fail(exc)
    name, _, version = spec.rpartition("@")
    with _store(ctx, db_path, must_exist=True) as store:
        return get_contract(store, name, version).definition


def _change_line(c: ContractChange, width: int) -> str:
    return f"  {c.location:<{width}}  {c.kind.value:<28}  {c.detail}"


@contract.command()
@click.argument("old")
@click.argument("new")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="Output format.")
@click.option("--db", "db_path", type=click.Path(dir_okay=False),
              help="Read OLD or NEW given as NAME@VERSION from the registry in this DuckDB file.")
@click.pass_context
def diff(ctx: click.Context, old: str, new: str, fmt: str, db_path: str | None) -> None:
    """Classify the changes from OLD to NEW (schemas, tools or catalogs) as breaking, compatible or behavioral.

    Exit 2 when any change is breaking, 1 when any is behavioral and none breaking, 0 otherwise.
    """
    from collector import Classification, diff_contracts, diff_verdict

    groups = (Classification.breaking, Classification.behavioral, Classification.compatible)
    changes = diff_contracts(_load(ctx, old, db_path), _load(ctx, new, db_path))
    verdict = diff_verdict(changes)
    counts = {cls.value: sum(1 for c in changes if c.classification is cls) for cls in groups}
    if fmt == "json":
        click.echo(orjson.dumps({"old": old, "new": new, "verdict": verdict.value, "exit_code": verdict.exit_code,
                                 "counts": counts, "changes": [c.to_json() for c in changes]}).decode())
    else:
        if not changes:
            click.echo("no changes (key order and the order of required, enum, type and anyOf/oneOf do not count)")
        width = max((len(c.location) for c in changes), default=0)
        for cls in groups:
            group = [c for c in changes if c.classification is cls]
            if group:
                click.echo(f"{cls.value} ({len(group)}):")
                for c in group:
                    click.echo(_change_line(c, width))
        click.echo(f"verdict: {verdict.value} (exit {verdict.exit_code})")
    sys.exit(verdict.exit_code)


# --- the registry --------------------------------------------------------------------------

def _author() -> str:
    return os.environ.get("SHAPEWATCH_AUTHOR") or os.environ.get("USER") or "unknown"


def _describe(r: RegisteredContract) -> str:
    tools = r.definition.tools
    what = (f"catalog of {len(tools)} tools" if r.definition.catalog
            else f"{tools[0].format.value}{' ' + repr(tools[0].name) if tools[0].name else ''}")
    return f"{r.contract} version {r.version}: {what}"


@contract.command()
@click.option("--contract", "name", required=True, help="Contract name (the envelope's `contract`).")
@click.option("--version", required=True, help="Contract version (the envelope's `contract_version`).")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@_db_option
@click.option("--note", help="Why this version (kept with it).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="Output format.")
@click.pass_context
def register(ctx: click.Context, name: str, version: str, file: Path, db_path: str | None, note: str | None,
             fmt: str) -> None:
    """Register FILE (a JSON Schema, a tool, or a catalog of tools) as an immutable contract version.

    Registering identical content again is a no-op; other content under a registered version is refused.
    """
    from collector import ShapewatchError, read_contract, register_contract

    try:
        definition = read_contract(file)
    except ShapewatchError as exc:
        _fail(exc)
    with _store(ctx, db_path, must_exist=False) as store:
        registered, created = register_contract(store, name, version, definition, author=_author(), note=note)
    if fmt == "json":
        click.echo(orjson.dumps({**registered.summary(), "created": created}).decode())
        return
    click.echo(f"{'registered' if created else 'already registered (identical content)'}: {_describe(registered)}")
    click.echo(f"  invocation hash {registered.invocation_hash}")
    click.echo(f"  discovery hash  {registered.discovery_hash}")


@contract.command("list")
@click.option("--contract", "name", help="Only this contract.")
@_db_option
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="Output format.")
@click.pass_context
def list_(ctx: click.Context, name: str | None, db_path: str | None, fmt: str) -> None:
    """Every registered contract version, by contract, oldest first."""
    from collector import list_contracts

    with _store(ctx, db_path, must_exist=True) as store:
        found = [r.summary() for r in list_contracts(store, name)]
    if fmt == "json":
        click.echo(orjson.dumps(found).decode())
        return
    if not found:
        click.echo("no contracts registered")
    for item in found:
        tools = ", ".join(str(t) for t in item["tools"] if t is not None) or "(schema)"
        click.echo(f"{item['contract']}  {item['version']}  {tools}  invocation {item['invocation_hash'][:12]}  "
                   f"discovery {item['discovery_hash'][:12]}  {item['registered_at']}  by {item['author']}")
        if item["note"]:
            click.echo(f"    {item['note']}")


@contract.command()
@click.argument("name")
@click.argument("version")
@_db_option
@click.pass_context
def show(ctx: click.Context, name: str, version: str, db_path: str | None) -> None:
    """Print one registered version: its fingerprints and the document (JSON)."""
    from collector import get_contract

    with _store(ctx, db_path, must_exist=True) as store:
        found: dict[str, Any] = get_contract(store, name, version).to_json()
    click.echo(orjson.dumps(found, option=orjson.OPT_INDENT_2).decode())
