"""``shapewatch run show RUN_ID``: one agent run, its steps in order with the contract versions
and agent releases it used; from the database file (``--db``) or a running service (``--url``:
``GET /v1/runs/{run_id}``), one code path (``collector/traces.py``'s ``run_view``).

An unknown run prints one line on stderr and exits 2, never a traceback.
"""

from __future__ import annotations

from typing import Any

import click
import orjson

from ._cli import _backend, _backend_options

__all__ = ["run"]


@click.group()
def run() -> None:
    """Agent runs: the steps one run took, in order."""


def _cell(value: Any, width: int) -> str:
    text = "-" if value is None else str(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def run_table(view: dict[str, Any]) -> str:
    """The run as text: a header (time span, steps, releases, contract versions), then one line per step."""
    versions = ", ".join(f"{c}@{'/'.join(v)}" for c, v in view["contract_versions"].items()) or "-"
    lines = [
        f"run {view['run_id']}",
        f"  {view['first_ts']} .. {view['last_ts']}   {view['steps']} steps, {view['tool_calls']} tool calls"
        f"   judged: {view['judged_at'] or 'not yet'}",
        f"  agent releases: {', '.join(view['agent_releases']) or '-'}",
        f"  contract versions: {versions}",
        "",
        f"{'#':>4}  {'time':<32}  {'kind':<14}  {'tool / contract':<24}  {'version':<8}  {'finish':<10}  "
        f"{'args':<12}  model",
    ]
    for e in view["events"]:
        model = e["model"] if e["served_model"] in (None, e["model"]) else f"{e['model']} -> {e['served_model']}"
        lines.append(
            f"{e['position']:>4}  {_cell(e['ts'], 32):<32}  {e['kind']:<14}  {_cell(e['tool'] or e['contract'], 24):<24}  "
            f"{_cell(e['contract_version'], 8):<8}  {_cell(e['finish_reason'], 10):<10}  "
            f"{_cell((e['args_hash'] or '')[:12] or None, 12):<12}  {model or '-'}"
        )
    if view["events_omitted"]:
        lines.append(f"... and {view['events_omitted']} more steps")
    return "\n".join(lines)


@run.command("show")
@click.argument("run_id")
@_backend_options
@click.option(
    "--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True, help="Output format."
)
@click.pass_context
def show(ctx: click.Context, run_id: str, db_path: str | None, url: str | None, token: str | None, fmt: str) -> None:
    """Print one run's steps in order, with the contract versions and agent releases it used."""
    with _backend(ctx, db_path, url, token) as b:
        view = b.run(run_id)
    if fmt == "json":
        click.echo(orjson.dumps(view).decode())
    else:
        click.echo(run_table(view))
