"""``shapewatch probe run SUITE``: one run of a probe suite, scored, recorded in the database file
(``--db``) or a running service (``--url``: its outputs through ``POST /v1/outputs``, the run
through ``POST /v1/probes/runs``), and printed.

Exit 0 when every score is on the right side of its threshold, 1 when one is not (or a case got
no answer), 2 on a usage or input error (an unreadable suite names the key).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import orjson

from ._cli import _backend, _backend_options, _fail

__all__ = ["probe", "run_table"]


@click.group()
def probe() -> None:
    """Probe suites: a fixed set of cases against a pinned model, scored on the first decision."""


def _decision(d: dict[str, Any] | None) -> str:
    if d is None:
        return "no answer"
    if d.get("tool") is None:
        return "no tool"
    return f"{d['tool']} {orjson.dumps(d.get('arguments') or {}).decode()[:100]}"


def run_table(run: dict[str, Any]) -> str:
    """A run as text: the suite and models, the three scores against their thresholds, the failed cases."""
    lines = [
        f"suite {run['suite']}  run {run['run_id']}  ({run['trigger']})",
        f"  model {run['model']}, served by {run['served_model'] or '-'}; {run['prompt_version']} / {run['contract']}",
        f"  {run['cases']} cases, {run['errors']} without an answer{'' if run['accepted'] else ' (not accepted)'}",
        "",
    ]
    for name, s in run["scores"].items():
        limit = run["thresholds"][name]
        value = "-" if s["value"] is None else f"{s['value']:.1%}"
        mark = "  BREACH" if name in run["breaches"] else ""
        op = "<=" if name == "spurious_calls" else ">="
        lines.append(f"  {name:<18} {value:>7}  ({s['hits']}/{s['n']}; wanted {op} {limit:.0%}){mark}")
    failed = run["failed_cases"]
    if failed:
        lines += ["", "failed cases:"]
        for c in failed:
            why = c["error"] or ", ".join(c["failed"])
            lines.append(f"  {c['case']}: {why}")
            lines.append(f"      expected {_decision(c['expected'])}")
            lines.append(f"      actual   {_decision(c['actual'])}")
    return "\n".join(lines)


@probe.command("run")
@click.argument("suite_path", metavar="SUITE", type=click.Path(dir_okay=False, path_type=Path))
@_backend_options
@click.option(
    "--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True, help="Output format."
)
@click.pass_context
def run(
    ctx: click.Context, suite_path: Path, db_path: str | None, url: str | None, token: str | None, fmt: str
) -> None:
    """Run a probe suite once against its provider, record it, and print its scores.

    Exit 0 with every score within its threshold, 1 otherwise, 2 on a usage or input error.
    """
    from shapewatch.collector import ShapewatchError

    from .probes import load_suite, run_suite

    try:
        suite = load_suite(suite_path)
    except ShapewatchError as exc:
        _fail(exc)
    result = run_suite(suite, trigger="manual")
    with _backend(ctx, db_path, url, token, create=True) as backend:  # a run is written, like an import
        backend.record_probe_run(result)
    doc = result.to_json()
    if fmt == "json":
        click.echo(orjson.dumps(doc).decode())
    else:
        click.echo(run_table(doc))
    ctx.exit(1 if doc["breaches"] or not doc["accepted"] else 0)
