"""``shapewatch compare --a COHORT --b COHORT --since T --until T``: cohort A's window judged against
cohort B's with the analyzer's rules (``analysis/compare.py``), from the database file (``--db``)
or a running service (``--url``: ``GET /v1/compare``).

Exit 0 when no rule breaches, 1 when any does (the breaching fields are listed), 2 on a usage
or input error (an unreadable cohort or time, a cohort that never received an output).
"""

from __future__ import annotations

from typing import Any

import click
import orjson

from ._cli import _backend, _backend_options

__all__ = ["compare"]


def _time(text: str, option: str) -> Any:
    from .config import parse_time
    from .errors import ConfigInvalid

    try:
        return parse_time(text, key=option)
    except ConfigInvalid as exc:
        raise click.BadParameter(exc.problem, param_hint=option) from None


def _label(c: dict[str, Any]) -> str:
    names = f"{c['model']} / {c['prompt_version']} / {c['contract']}"
    return names if c["source"] == "production" else f"{c['source']}: {names}"


def comparison_table(result: dict[str, Any]) -> str:
    """The comparison as text: both cohorts, then one line per breach, then the thin fields."""
    a, b = result["a"], result["b"]
    lines = [
        f"A  {_label(a)}  ({a['events']} outputs)",
        f"B  {_label(b)}  ({b['events']} outputs)",
        f"   {result['window']['since']} .. {result['window']['until']}, {result['checks']} checks",
        "",
    ]
    if not result["breaches"]:
        lines.append("no rule breached: A is like B")
    for c in result["breaches"]:
        value = f" {c['value']!r}" if c.get("value") else ""
        lines.append(f"{c['severity']:<4} {c['field']}  {c['kind']}{value}")
        lines.append(f"     {c['detail']}")
    if result["insufficient"]:
        thin = ", ".join(i["field"] for i in result["insufficient"][:10])
        more = len(result["insufficient"]) - 10
        lines.append(f"too few samples to judge: {thin}{f' and {more} more' if more > 0 else ''}")
    return "\n".join(lines)


@click.command()
@click.option("--a", "a", required=True, help="The cohort judged: source/model/prompt_version/contract.")
@click.option("--b", "b", required=True, help="The cohort it is judged against (source optional: production).")
@click.option("--since", "since_text", required=True, help="Window start (ISO 8601 with a zone).")
@click.option("--until", "until_text", required=True, help="Window end, exclusive (ISO 8601 with a zone).")
@_backend_options
@click.option(
    "--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True, help="Output format."
)
@click.pass_context
def compare(
    ctx: click.Context,
    a: str,
    b: str,
    since_text: str,
    until_text: str,
    db_path: str | None,
    url: str | None,
    token: str | None,
    fmt: str,
) -> None:
    """Judge cohort A against cohort B over one window, field by field, with the analyzer's rules.

    Exit 0 when no rule breaches, 1 when any does, 2 on a usage or input error.
    """
    since, until = _time(since_text, "--since"), _time(until_text, "--until")
    with _backend(ctx, db_path, url, token) as backend:
        result = backend.compare(a, b, since, until)
    if fmt == "json":
        click.echo(orjson.dumps(result).decode())
    else:
        click.echo(comparison_table(result))
    ctx.exit(1 if result["breaches"] else 0)
