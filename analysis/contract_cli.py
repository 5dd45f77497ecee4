"""``shapewatch contract``: register JSON Schemas and tool definitions, and gate changes to them.

``diff OLD NEW`` classifies every change (collector/contract_diff.py) and exits
2 when any is breaking, 1 when any is behavioral (and none breaking), 0
otherwise, so that it can gate a pull request. OLD and NEW are files, or, with
``--db`` or ``--url``, ``NAME@VERSION`` of a registered version. ``register``
stores an immutable version with its fingerprints; ``list`` and ``show`` read
them back. Like the baseline commands, they work on the database file (``--db``)
or through a running service (``--url``: ``POST /v1/contracts``), one code path
(analysis/admin.py).

Usage and input errors (unreadable files, invalid schemas, a version already
registered with other content) print one line on stderr and exit 2, never a
traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import orjson

# The collector is imported inside the commands: `shapewatch --help` does not pay for jsonschema.
from ._cli import _author, _backend, _backend_options, _fail

if TYPE_CHECKING:
    from shapewatch.collector import Contract, ContractChange

__all__ = ["contract"]


@click.group()
def contract() -> None:
    """Register JSON Schemas and tool definitions, and classify changes between versions."""


# --- diff ----------------------------------------------------------------------------------


def _load(ctx: click.Context, spec: str, db_path: str | None, url: str | None, token: str | None) -> Contract:
    """A file, or with --db or --url a registered ``NAME@VERSION`` (a path that exists always wins)."""
    from shapewatch.collector import ShapewatchError, contract_from_document, read_contract

    try:
        if Path(spec).exists() or (db_path is None and url is None) or "@" not in spec:
            return read_contract(spec)
        name, _, version = spec.rpartition("@")
        with _backend(ctx, db_path, url, token) as b:
            doc = b.show_contract(name, version)["document"]
        return contract_from_document(doc, where=f"contract {name!r} version {version!r}")
    except ShapewatchError as exc:
        _fail(exc)


def _change_line(c: ContractChange, width: int) -> str:
    return f"  {c.location:<{width}}  {c.kind.value:<28}  {c.detail}"


@contract.command()
@click.argument("old")
@click.argument("new")
@click.option(
    "--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True, help="Output format."
)
@_backend_options
@click.pass_context
def diff(
    ctx: click.Context, old: str, new: str, fmt: str, db_path: str | None, url: str | None, token: str | None
) -> None:
    """Classify the changes from OLD to NEW (schemas, tools or catalogs) as breaking, compatible or behavioral.

    Exit 2 when any change is breaking, 1 when any is behavioral and none breaking, 0 otherwise.
    OLD or NEW may name a registered version as NAME@VERSION, read with --db or --url.
    """
    from shapewatch.collector import Classification, diff_contracts, diff_verdict

    groups = (Classification.breaking, Classification.behavioral, Classification.compatible)
    changes = diff_contracts(_load(ctx, old, db_path, url, token), _load(ctx, new, db_path, url, token))
    verdict = diff_verdict(changes)
    counts = {cls.value: sum(1 for c in changes if c.classification is cls) for cls in groups}
    if fmt == "json":
        click.echo(
            orjson.dumps(
                {
                    "old": old,
                    "new": new,
                    "verdict": verdict.value,
                    "exit_code": verdict.exit_code,
                    "counts": counts,
                    "changes": [c.to_json() for c in changes],
                }
            ).decode()
        )
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


def _describe(r: dict[str, Any]) -> str:
    tools = r["tools"]
    what = (
        f"catalog of {len(tools)} tools"
        if r["catalog"]
        else f"{r['formats'][0]}{' ' + repr(tools[0]) if tools[0] else ''}"
    )
    return f"{r['contract']} version {r['version']}: {what}"


@contract.command()
@click.option("--contract", "name", required=True, help="Contract name (the envelope's `contract`).")
@click.option("--version", required=True, help="Contract version (the envelope's `contract_version`).")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@_backend_options
@click.option("--note", help="Why this version (kept with it).")
@click.option(
    "--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True, help="Output format."
)
@click.pass_context
def register(
    ctx: click.Context,
    name: str,
    version: str,
    file: Path,
    db_path: str | None,
    url: str | None,
    token: str | None,
    note: str | None,
    fmt: str,
) -> None:
    """Register FILE (a JSON Schema, a tool, or a catalog of tools) as an immutable contract version.

    Registering identical content again is a no-op; other content under a registered version is refused.
    """
    from shapewatch.collector import ShapewatchError, read_contract

    try:
        definition = read_contract(file)  # refused here, before anything is sent or opened
    except ShapewatchError as exc:
        _fail(exc)
    with _backend(ctx, db_path, url, token, create=True) as b:
        registered = b.register_contract(name, version, definition.document, author=_author(), note=note)
    if fmt == "json":
        click.echo(orjson.dumps(registered).decode())
        return
    click.echo(
        f"{'registered' if registered['created'] else 'already registered (identical content)'}: "
        f"{_describe(registered)}"
    )
    click.echo(f"  invocation hash {registered['invocation_hash']}")
    click.echo(f"  discovery hash  {registered['discovery_hash']}")


@contract.command("list")
@click.option("--contract", "name", help="Only this contract.")
@_backend_options
@click.option(
    "--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True, help="Output format."
)
@click.pass_context
def list_(
    ctx: click.Context, name: str | None, db_path: str | None, url: str | None, token: str | None, fmt: str
) -> None:
    """Every registered contract version, by contract, oldest first."""
    with _backend(ctx, db_path, url, token) as b:
        found = b.list_contracts(name)
    if fmt == "json":
        click.echo(orjson.dumps(found).decode())
        return
    if not found:
        click.echo("no contracts registered")
    for item in found:
        tools = ", ".join(str(t) for t in item["tools"] if t is not None) or "(schema)"
        click.echo(
            f"{item['contract']}  {item['version']}  {tools}  invocation {item['invocation_hash'][:12]}  "
            f"discovery {item['discovery_hash'][:12]}  {item['registered_at']}  by {item['author']}"
        )
        if item["note"]:
            click.echo(f"    {item['note']}")


@contract.command()
@click.argument("name")
@click.argument("version")
@_backend_options
@click.pass_context
def show(ctx: click.Context, name: str, version: str, db_path: str | None, url: str | None, token: str | None) -> None:
    """Print one registered version: its fingerprints and the document (JSON)."""
    with _backend(ctx, db_path, url, token) as b:
        found = b.show_contract(name, version)
    click.echo(orjson.dumps(found, option=orjson.OPT_INDENT_2).decode())
