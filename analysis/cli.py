"""The root CLI, ``shapewatch``: one click group, commands are verbs.

Errors become a clear message on stderr and an exit code (2 for usage or
input errors, 1 when the command worked and found something, such as
rejected lines), never a traceback.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import click
import orjson

from shapewatch import __version__
from shapewatch.collector import (
    ImportSummary,
    Settings,
    ShapewatchError,
    StoreInvalidated,
    import_files,
    limits_from_settings,
    parse_token,
)
from shapewatch.collector.accel import IMPLEMENTATION

from ._cli import (
    _analyzer_config,
    _author,
    _backend,
    _backend_options,
    _db_option,
    _echo_json,
    _fail,
    _settings,
    _token_option,
    _url_option,
)
from .compare_cli import compare
from .contract_cli import contract
from .probe_cli import probe
from .run_cli import run as run_group

if TYPE_CHECKING:
    pass

__all__ = ["cli", "main"]


class _Commands(click.Group):
    """The commands; those whose modules load what the others never need are imported when
    asked for: ``scaleout`` brings FastAPI, NATS and the lake (about 0.2 s of every import's
    start, where the parse floor of a 1M-line file is about 3 s)."""

    _lazy: ClassVar[dict[str, str]] = {"scaleout": ".scaleout"}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self._lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self._lazy and cmd_name not in self.commands:
            module = importlib.import_module(self._lazy[cmd_name], __package__)
            self.add_command(getattr(module, cmd_name), cmd_name)
        return super().get_command(ctx, cmd_name)


@click.group(cls=_Commands)
@click.version_option(
    __version__,
    "-V",
    "--version",
    prog_name="shapewatch",
    message=f"%(prog)s %(version)s (accelerator: {IMPLEMENTATION})",
)
@click.option("--config", type=click.Path(dir_okay=False), help="TOML settings file (also SHAPEWATCH_CONFIG).")
@click.option("-v", "--verbose", is_flag=True, help="Log more.")
@click.pass_context
def cli(ctx: click.Context, config: str | None, verbose: bool) -> None:
    """shapewatch: watch the shape of language-model structured outputs drift."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    ctx.obj = {"config": config}


@cli.command()
@click.option("--db", "db_path", type=click.Path(dir_okay=False), help="DuckDB file the service owns.")
@click.option("--host", help="Address to bind (default 127.0.0.1).")
@click.option("--port", type=int, help="Port (default 8000).")
@click.pass_context
def serve(ctx: click.Context, db_path: str | None, host: str | None, port: int | None) -> None:
    """Run the collector API and /metrics on one DuckDB file (the only writer)."""
    _serve(_settings(ctx, db_path=db_path, host=host, port=port), ctx)


def _serve(settings: Settings, ctx: click.Context) -> None:
    from .service import run

    config = _analyzer_config(ctx)
    try:
        run(settings, config)
    except StoreInvalidated as exc:  # not a usage error: a supervisor restarts on a failure exit
        click.echo(f"error: {exc}", err=True)
        sys.exit(3)
    except ShapewatchError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)


@cli.command()
@click.option("--db", "db_path", type=click.Path(dir_okay=False), help="DuckDB file (default ./var/shapewatch.duckdb).")
@click.option("--port", type=int, help="Port of the service (default 8000).")
@click.option("--dashboard-port", type=int, default=8501, show_default=True, help="Port of the dashboard.")
@click.option("--no-sample", is_flag=True, help="Do not load the sample workspace into an empty database.")
@click.pass_context
def up(ctx: click.Context, db_path: str | None, port: int | None, dashboard_port: int, no_sample: bool) -> None:
    """Run the product locally: the service on ./var/shapewatch.duckdb and the dashboard.

    A database that holds no event yet gets the sample workspace (contracts named
    ``sample-...``: a baseline period, then drift, so alerts show within a minute),
    written through the service's API; ``--no-sample`` skips it. A database with
    events is never touched. Ctrl-C stops both.
    """
    import signal
    import threading

    settings = _settings(ctx, db_path=db_path, port=port)
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    url = f"http://{host}:{settings.port}"
    # The dashboard reads and writes (acknowledgements, baselines) and the sample is ingested:
    # the configured secret with the most scopes (a bare one has them all).
    entries = sorted((parse_token(t) for t in settings.tokens), key=lambda e: -len(e.scopes))
    token = os.environ.get("SHAPEWATCH_TOKEN") or (entries[0].secret if entries else None)
    click.echo(f"shapewatch service:   {url}  (API docs at /docs, metrics at /metrics; database {settings.db_path})")
    click.echo(f"shapewatch dashboard: http://127.0.0.1:{dashboard_port}")
    dash = _start_dashboard(url, dashboard_port, token, host="127.0.0.1", quiet=True)
    threading.Thread(
        target=_after_start, args=(url, token, not no_sample, dash, dashboard_port), daemon=True, name="shapewatch-up"
    ).start()
    # SIGTERM like Ctrl-C: the service stops cleanly (uvicorn re-raises the signal after its
    # shutdown), then the dashboard is stopped here, never left running on its own.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        _serve(settings, ctx)
    except KeyboardInterrupt:  # the service already stopped cleanly; this is the re-raised signal
        pass
    finally:
        _stop_process(dash)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _start_dashboard(url: str, port: int, token: str | None, *, host: str, quiet: bool = False) -> Any:
    """``streamlit run dashboard/app.py`` as a child process, told where the service is by environment."""
    import subprocess

    app = Path(__file__).resolve().parent.parent / "dashboard" / "app.py"
    if not app.is_file():
        raise click.UsageError(f"the dashboard is not installed here ({app} is missing)")
    env = {**os.environ, "SHAPEWATCH_URL": url}
    if token:
        env["SHAPEWATCH_TOKEN"] = token
    cmd = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(app),
        "--server.headless",
        "true",
        "--server.port",
        str(port),
        "--server.address",
        host,
        "--browser.gatherUsageStats",
        "false",
        "--server.fileWatcherType",
        "none",
        "--client.toolbarMode",
        "viewer",
    ]
    # Quiet: Streamlit's own banner would repeat the URL printed above; its errors still show.
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL if quiet else None)


def _stop_process(proc: Any, timeout: float = 15.0) -> int:
    """Stop a child cleanly (SIGTERM, then SIGKILL after ``timeout``); its exit code."""
    import subprocess

    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
    return int(proc.wait())


def _after_start(url: str, token: str | None, sample: bool, dash: Any, dashboard_port: int) -> None:
    """Once the service answers: load the sample workspace into an empty database, then say what is ready."""
    import time

    import httpx

    from .sample import SampleError, seed_sample

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.2)  # polling the service's start-up, with a deadline
    else:
        return  # the service did not start; it says why itself
    if sample:
        try:
            summary = seed_sample(url, token=token)
        except SampleError as exc:
            click.echo(f"warning: {exc}", err=True)
        else:
            if summary.seeded:
                click.echo(
                    f"loaded the sample workspace: {summary.events} events of contracts named sample-..., "
                    f"{len(summary.baselines)} baselines, {summary.alerts} alerts "
                    "(start an empty database with --no-sample to skip it)"
                )
            else:
                click.echo("the database already holds events: no sample workspace loaded")
    dash_url = f"http://127.0.0.1:{dashboard_port}"
    while dash.poll() is None and time.monotonic() < deadline:
        try:
            if httpx.get(dash_url + "/_stcore/health", timeout=2).status_code == 200:
                click.echo(f"ready: open {dash_url} (Ctrl-C stops the service and the dashboard)")
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)  # polling the dashboard's start-up, with a deadline
    if dash.poll() is not None:
        click.echo(f"error: the dashboard exited with code {dash.returncode}", err=True)


@cli.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--db", "db_path", type=click.Path(dir_okay=False), help="DuckDB file (must not be held by a service).")
@_url_option
@_token_option
@click.option(
    "--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True, help="Summary format."
)
@click.pass_context
def ingest(
    ctx: click.Context, files: tuple[Path, ...], db_path: str | None, url: str | None, token: str | None, fmt: str
) -> None:
    """Import JSONL or .jsonl.gz envelopes; rejected lines go to a quarantine file.

    With --url the lines go through a running service (POST /v1/outputs, in batches) instead of
    into the file it holds: the same ids, summary and exit codes; rejected lines are listed with
    their line numbers and reasons (the first 100) instead of quarantined.

    Exit 0 when every line was stored or was a duplicate, 1 when any line was rejected, 2 on a
    usage or input error: a file that could not be read to its end (the lines before the fault
    are stored, and the other files imported; the summary lists it under "unreadable"), a
    quarantine that cannot be written or a store that fails (the import stops; the summary
    says what the files before it added), or a database held by a running service.
    """
    if db_path and url:
        raise click.UsageError("give --db or --url, not both")
    total = sum(f.stat().st_size for f in {f.resolve(): f for f in files}.values())  # a file given twice reads once
    show = sys.stderr.isatty()
    summary = ImportSummary()
    failed: ShapewatchError | None = None
    listed: list[dict[str, Any]] = []
    if url:
        from shapewatch.collector import RemoteImportFailed, send_files

        if not url.startswith(("http://", "https://")) or len(url) > 2000:
            raise click.BadParameter(f"{url[:80]!r} is not an http(s) URL", param_hint="--url")
        try:
            with click.progressbar(length=total, label="sending", file=sys.stderr, hidden=not show) as bar:
                sent = send_files(list(files), url, token=token, progress=bar.update)
            summary, listed = sent.summary, sent.rejected_lines
        except RemoteImportFailed as exc:
            failed = exc
            if exc.partial is not None:
                summary, listed = exc.partial.summary, exc.partial.rejected_lines
    else:
        from .store_access import open_store

        settings = _settings(ctx, db_path=db_path)
        try:
            store = open_store(settings, bulk=True)
        except ShapewatchError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
        try:
            with store, click.progressbar(length=total, label="importing", file=sys.stderr, hidden=not show) as bar:
                import_files(list(files), store, limits_from_settings(settings), progress=bar.update, summary=summary)
        except ShapewatchError as exc:
            failed = exc  # what the files before it added is still reported
    out = summary.as_dict()
    if url:
        out["rejected_lines"] = listed
    if fmt == "json":
        click.echo(orjson.dumps(out).decode())
    else:
        click.echo(f"accepted {out['accepted']}, duplicate {out['duplicate']}, rejected {out['rejected']}")
        for reason, n in out["rejected_by_reason"].items():
            click.echo(f"  rejected ({reason}): {n}")
        for q in out["quarantine"]:
            click.echo(f"  rejected lines with their reasons: {q}")
        for r in listed:
            reasons = "; ".join(f"{e.get('path')}: {e.get('reason')}" for e in r["errors"])
            click.echo(f"  rejected {r['file']}:{r['line']}: {reasons}")
    for unreadable in summary.unreadable:
        click.echo(
            f"error: {unreadable} (the lines read before the fault were imported; once the file is whole, "
            "an import of it adds the rest)",
            err=True,
        )
    if failed is not None:
        click.echo(f"error: {failed} (the import stopped there; the summary counts what was stored before)", err=True)
    sys.exit(2 if summary.unreadable or failed is not None else 1 if summary.rejected else 0)


# --- shared options ------------------------------------------------------------------------


#: How far back a relative time (``2d``) may reach: the longest window anything reads.
MAX_RELATIVE = timedelta(days=3650)
_DATE_ONLY = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_RELATIVE = re.compile(r"[0-9]+(?:\.[0-9]+)?[smhdw]")


def _absolute(text: str, option: str, now: datetime | None = None) -> str:
    """``text`` as an ISO 8601 time with a zone: ``now``; a duration back from now (``2d``,
    ``90m``, ``1.5h``: ``2d`` means two days ago); a UTC date (``2026-11-30``: its midnight);
    anything else as it is, for the ISO parser to judge."""
    from .config import parse_duration
    from .errors import ConfigInvalid

    t = text.strip()
    now = now or datetime.now(UTC)
    if t.lower() == "now":
        return now.isoformat()
    if _RELATIVE.fullmatch(t):
        try:
            back = parse_duration(t, key=option, maximum=MAX_RELATIVE)
        except ConfigInvalid as exc:
            raise click.BadParameter(exc.problem, param_hint=option) from None
        return (now - back).isoformat()
    if _DATE_ONLY.fullmatch(t):
        try:
            day = datetime.strptime(t, "%Y-%m-%d").replace(tzinfo=UTC)
        except ValueError:
            raise click.BadParameter(f"{t!r} is not a date; write e.g. 2026-11-30", param_hint=option) from None
        return day.isoformat()
    return text


def _when(text: str | None, option: str, *, ranged: bool = True, now: datetime | None = None) -> datetime | None:
    """A time, or None: ISO 8601 with a zone (``2026-11-29T12:00:00Z``), a UTC date
    (``2026-11-30``), a duration back from now (``2d``, ``90m``) or ``now``; with ``ranged`` in the
    times taken (``EARLIEST_TIME`` .. ``LATEST_TIME``). Without it only parsed, for the freeze,
    whose window the baselines package judges."""
    from .config import parse_time
    from .errors import ConfigInvalid

    if text is None:
        return None
    if len(text) > 100:
        raise click.BadParameter(
            f"{len(text)} characters is no time; write e.g. 2026-11-29T12:00:00Z", param_hint=option
        )
    text = _absolute(text, option, now)
    if ranged:
        try:
            return parse_time(text, key=option)
        except ConfigInvalid as exc:
            raise click.BadParameter(exc.problem, param_hint=option) from None
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is not an ISO 8601 time, a date or a duration back from now; write e.g. "
            "2026-11-29T12:00:00Z, 2026-11-29 or 2d",
            param_hint=option,
        ) from None
    if t.tzinfo is None:
        raise click.BadParameter(f"{text!r} has no time zone; add Z or an offset such as +02:00", param_hint=option)
    try:
        return t.astimezone(UTC)
    except OverflowError:  # year 1 at +05:00 is before the first datetime
        raise click.BadParameter(f"{text!r} is outside the times a datetime holds", param_hint=option) from None


def _duration(text: str, option: str, maximum: timedelta) -> timedelta:
    """A duration (``24h``) between 1s and ``maximum``, refused as a usage error naming ``option``."""
    from .config import parse_duration
    from .errors import ConfigInvalid

    try:
        return parse_duration(text, key=option, maximum=maximum)
    except ConfigInvalid as exc:
        raise click.BadParameter(exc.problem, param_hint=option) from None


class _FiniteFloatRange(click.FloatRange):
    """``click.FloatRange`` that also refuses nan and inf (nan passes every comparison of its bounds)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        import math

        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return rv


_format_option = click.option(
    "--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True, help="Output format."
)


@cli.command()
@click.option(
    "--url",
    envvar="SHAPEWATCH_URL",
    default="http://127.0.0.1:8000",
    show_default=True,
    help="URL of the running service (SHAPEWATCH_URL).",
)
@click.option("--port", type=int, default=8501, show_default=True, help="Port of the dashboard.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address the dashboard binds.")
@_token_option
def dashboard(url: str, port: int, host: str, token: str | None) -> None:
    """Run the Streamlit dashboard against a running service (it reads everything over HTTP)."""
    import signal

    proc = _start_dashboard(url.rstrip("/"), port, token, host=host)
    signal.signal(signal.SIGTERM, _interrupt)  # stopping this process stops Streamlit, never orphans it
    try:
        code = proc.wait()
    except KeyboardInterrupt:  # Ctrl-C (which reached Streamlit too) or SIGTERM
        code = _stop_process(proc)
    sys.exit(code if code > 0 else 0)


# --- analyze and alerts --------------------------------------------------------------------


def _alert_table(alerts: list[dict[str, Any]]) -> None:
    if not alerts:
        click.echo("no alerts")
        return
    for a in alerts:
        c = a["cohort"]
        source = "" if c.get("source", "production") == "production" else f"{c['source']}: "
        click.echo(
            f"{a['severity']:<4} {a['state']:<8} {source}{c['model']} / {c['prompt_version']} / {c['contract']}  "
            f"{a['field']}  {a['kind']}{' ' + repr(a['value']) if a.get('value') else ''}"
        )
        click.echo(f"     {a['detail']}")
        if a.get("compared_with"):
            click.echo(f"     compared with {a['compared_with']}")


@cli.command()
@_db_option
@click.option(
    "--once", is_flag=True, required=True, help="Run one evaluation and exit (the service runs them on a schedule)."
)
@click.option(
    "--at",
    "at_text",
    help="Evaluate the window ending at this time (ISO 8601 with a zone, a UTC date or a duration back such as 2h; "
    "default now).",
)
@click.option(
    "--window", "window_text", help="Window length, e.g. 24h, at most 400d (default from the configuration: 24h)."
)
@_format_option
@click.pass_context
def analyze(
    ctx: click.Context, db_path: str | None, once: bool, at_text: str | None, window_text: str | None, fmt: str
) -> None:
    """Judge every cohort's window against its baseline and print the alerts (nothing is written).

    Exit 0 with no alert firing, 1 with any firing, 2 on a usage or input error.
    """
    from .analyzer import analyze_once
    from .config import MAX_WINDOW
    from .store_access import open_store

    at = _when(at_text, "--at") or datetime.now(UTC)
    config = _analyzer_config(ctx)
    window = _duration(window_text, "--window", MAX_WINDOW) if window_text is not None else config.window
    settings = _settings(ctx, db_path=db_path)
    if not settings.db_path.exists():
        _fail(ShapewatchError(f"database {settings.db_path} does not exist (check --db)"))
    try:
        with open_store(settings) as store:
            evaluation, alerts = analyze_once(store, config, at, window=window)
    except ShapewatchError as exc:
        _fail(exc)
    out = [a.to_json() for a in alerts]
    firing = [a for a in out if a["state"] == "firing"]
    if fmt == "json":
        click.echo(
            orjson.dumps(
                {
                    "at": at.isoformat().replace("+00:00", "Z"),
                    "window_seconds": int(window.total_seconds()),
                    "alerts": out,
                    "cohorts": [c.to_json() for c in evaluation.cohorts],
                }
            ).decode()
        )
    else:
        _alert_table(out)
        for c in evaluation.cohorts:
            if c.baseline_id is None:
                click.echo(f"note: {c.cohort} has no baseline ({c.events} events); freeze one to judge it")
            elif c.insufficient:
                click.echo(
                    f"note: {c.cohort}: {len(c.insufficient)} field(s) under the sample minimum "
                    f"(insufficient): {', '.join(i.field for i in c.insufficient[:8])}"
                )
    sys.exit(1 if firing else 0)


@cli.group(invoke_without_command=True)
@_backend_options
@click.option("--severity", type=click.Choice(["page", "warn"]), help="Only this severity.")
@click.option("--state", type=click.Choice(["open", "pending", "firing", "resolved"]), help="Only this state.")
@click.option("--model", help="Only this model.")
@click.option("--prompt-version", help="Only this prompt version.")
@click.option("--contract", help="Only this contract.")
@click.option("--kind", help="Only this kind (e.g. presence_drop).")
@click.option("--source", type=click.Choice(["production", "probe", "shadow"]), help="Only cohorts of this source.")
@_format_option
@click.pass_context
def alerts(
    ctx: click.Context,
    db_path: str | None,
    url: str | None,
    token: str | None,
    severity: str | None,
    state: str | None,
    model: str | None,
    prompt_version: str | None,
    contract: str | None,
    kind: str | None,
    source: str | None,
    fmt: str,
) -> None:
    """List the alerts the service recorded, page first. Exit 1 when any listed alert is firing.

    ``shapewatch alerts ack FINGERPRINT`` acknowledges one."""
    if ctx.invoked_subcommand is not None:
        return
    with _backend(ctx, db_path, url, token) as b:
        found = b.alerts(
            severity=severity,
            state=state,
            model=model,
            prompt_version=prompt_version,
            contract=contract,
            kind=kind,
            source=source,
        )
    if fmt == "json":
        click.echo(orjson.dumps(found).decode())
    else:
        _alert_table(found)
    sys.exit(1 if any(a["state"] == "firing" for a in found) else 0)


def _fingerprint(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not re.fullmatch(r"[0-9A-Za-z_-]{1,128}", value):
        raise click.BadParameter(
            f"{value[:40]!r}{'...' if len(value) > 40 else ''} is not an alert fingerprint (letters, digits, - and _, "
            "at most 128); `shapewatch alerts --format json` lists them"
        )
    return value


@alerts.command("ack")
@click.argument("fingerprint", callback=_fingerprint)
@click.option("--author", help="Who is on it (default SHAPEWATCH_AUTHOR, else $USER).")
@_backend_options
@_format_option
@click.pass_context
def ack(
    ctx: click.Context,
    fingerprint: str,
    author: str | None,
    db_path: str | None,
    url: str | None,
    token: str | None,
    fmt: str,
) -> None:
    """Acknowledge an alert: someone is on it (its state does not change)."""
    by = (author or _author()).strip()
    if not by or len(by) > 256:
        raise click.BadParameter("give a name of 1 to 256 characters", param_hint="--author")
    with _backend(ctx, db_path, url, token) as b:
        done = b.acknowledge(fingerprint, by=by)
    if fmt == "json":
        _echo_json(done)
    else:
        click.echo(f"acknowledged {done['kind']} on {done['field']} ({fingerprint}) as {by}")


# --- silences ------------------------------------------------------------------------------


@cli.group()
def silence() -> None:
    """Silence matching alerts for a while (create), list silences, end one early (expire)."""


@silence.command("create")
@click.option("--duration", required=True, help="How long, e.g. 30m, 2h, 3d (at most 90d).")
@click.option("--reason", required=True, help="Why (kept with the silence).")
@click.option("--fingerprint", callback=_fingerprint, help="Silence this one alert ...")
@click.option("--model", help="... or every alert matching these (model, prompt version, contract, field, kind).")
@click.option("--prompt-version", help="Only this prompt version.")
@click.option("--contract", help="Only this contract.")
@click.option("--field", help="Only this field path.")
@click.option("--kind", help="Only this alert kind (e.g. presence_drop).")
@click.option("--author", help="Who silences (default SHAPEWATCH_AUTHOR, else $USER).")
@_backend_options
@_format_option
@click.pass_context
def silence_create(
    ctx: click.Context,
    duration: str,
    reason: str,
    fingerprint: str | None,
    model: str | None,
    prompt_version: str | None,
    contract: str | None,
    field: str | None,
    kind: str | None,
    author: str | None,
    db_path: str | None,
    url: str | None,
    token: str | None,
    fmt: str,
) -> None:
    """Silence the alerts that match for DURATION: they still open and resolve, nobody is paged."""
    from .config import MAX_SILENCE, AlertKind

    _duration(duration, "--duration", MAX_SILENCE)
    if not reason.strip():
        raise click.BadParameter("say why", param_hint="--reason")
    if kind is not None and kind not in {k.value for k in AlertKind}:
        raise click.BadParameter(
            f"{kind[:60]!r} is not an alert kind; one of " + ", ".join(k.value for k in AlertKind), param_hint="--kind"
        )
    match = {
        "fingerprint": fingerprint,
        "model": model,
        "prompt_version": prompt_version,
        "contract": contract,
        "field": field,
        "kind": kind,
    }
    if not any(match.values()):
        raise click.UsageError(
            "say what to silence: --fingerprint, or --model/--prompt-version/--contract/--field/--kind"
        )
    for name, value in match.items():
        if value is not None and not 1 <= len(value) <= 1000:
            raise click.BadParameter("give 1 to 1,000 characters", param_hint=f"--{name.replace('_', '-')}")
    with _backend(ctx, db_path, url, token) as b:
        done = b.silence(duration=duration, author=(author or _author()).strip(), reason=reason.strip(), **match)
    if fmt == "json":
        _echo_json(done)
    else:
        click.echo(f"silence {done['silence_id']} until {done['ends_at']}")


@silence.command("list")
@click.option("--all", "everything", is_flag=True, help="Ended silences too.")
@_backend_options
@_format_option
@click.pass_context
def silence_list(
    ctx: click.Context, everything: bool, db_path: str | None, url: str | None, token: str | None, fmt: str
) -> None:
    """Silences still active (with --all, ended ones too), oldest first."""
    with _backend(ctx, db_path, url, token) as b:
        found = b.silences(active=not everything)
    if fmt == "json":
        click.echo(orjson.dumps(found).decode())
        return
    if not found:
        click.echo("no silence" + ("" if everything else " active"))
    for x in found:
        what = ", ".join(f"{k}={v}" for k, v in x["match"].items())
        click.echo(f"{x['silence_id']:>5}  until {x['ends_at']}  {what}  by {x['author']}: {x['reason']}")


@silence.command("expire")
@click.argument("silence_id", type=click.IntRange(1, 2**63 - 1))
@_backend_options
@_format_option
@click.pass_context
def silence_expire(
    ctx: click.Context, silence_id: int, db_path: str | None, url: str | None, token: str | None, fmt: str
) -> None:
    """End a silence now: its alerts are notified again from the next evaluation."""
    with _backend(ctx, db_path, url, token) as b:
        done = b.expire_silence(silence_id)
    if fmt == "json":
        _echo_json(done)
    else:
        click.echo(f"silence {silence_id} ended at {done['ends_at']}")


# --- baselines -----------------------------------------------------------------------------


@cli.group()
def baseline() -> None:
    """Freeze, list, show, activate, retire, inherit, export and import baselines."""


_SOURCE_OPTION = click.option(
    "--source",
    type=click.Choice(["production", "probe", "shadow"]),
    default="production",
    show_default=True,
    help="The cohort's source.",
)


def _cohort_options(f: Any) -> Any:
    f = _SOURCE_OPTION(f)
    f = click.option("--contract", default="default", show_default=True, help="Contract name.")(f)
    f = click.option("--prompt-version", required=True, help="Prompt version.")(f)
    return click.option("--model", required=True, help="Model id as the applications send it.")(f)


@baseline.command()
@_cohort_options
@click.option(
    "--since",
    "since_text",
    required=True,
    help="Window start: ISO 8601 with a zone, a UTC date (2026-11-30) or 2d ago.",
)
@click.option(
    "--until",
    "until_text",
    required=True,
    help="Window end, exclusive: ISO 8601 with a zone, a UTC date, a duration back (90m) or now.",
)
@click.option("--note", required=True, help="Why this window is the reference (kept with the baseline).")
@click.option("--force", help="Freeze despite objections (too few samples, open page alerts); give the reason.")
@click.option("--no-activate", is_flag=True, help="Freeze without making it the cohort's active baseline.")
@_backend_options
@_format_option
@click.pass_context
def freeze(
    ctx: click.Context,
    model: str,
    prompt_version: str,
    contract: str,
    source: str,
    since_text: str,
    until_text: str,
    note: str,
    force: str | None,
    no_activate: bool,
    db_path: str | None,
    url: str | None,
    token: str | None,
    fmt: str,
) -> None:
    """Freeze a cohort's window as a baseline and make it active; prints its id."""
    since, until = _when(since_text, "--since", ranged=False), _when(until_text, "--until", ranged=False)
    assert since is not None and until is not None
    with _backend(ctx, db_path, url, token) as b:
        result = b.freeze(
            model=model,
            prompt_version=prompt_version,
            contract=contract,
            since=since,
            until=until,
            author=_author(),
            note=note,
            force=force,
            activate=not no_activate,
            source=source,
        )
    if fmt == "json":
        _echo_json(result)
    else:
        click.echo(result["baseline_id"])


@baseline.command("list")
@click.option("--model", help="Only this model (with --prompt-version).")
@click.option("--prompt-version", help="Only this prompt version (with --model).")
@click.option("--contract", default="default", show_default=True, help="Contract (with --model).")
@_SOURCE_OPTION
@_backend_options
@_format_option
@click.pass_context
def list_(
    ctx: click.Context,
    model: str | None,
    prompt_version: str | None,
    contract: str,
    source: str,
    db_path: str | None,
    url: str | None,
    token: str | None,
    fmt: str,
) -> None:
    """Every baseline, newest first, with whether it is active and whether its model is unpinned."""
    from shapewatch.baselines import Cohort

    if bool(model) != bool(prompt_version):
        raise click.UsageError("--model and --prompt-version go together")
    cohort = Cohort(model, prompt_version, contract, source) if model and prompt_version else None
    with _backend(ctx, db_path, url, token) as b:
        found = b.list_baselines(cohort)
    if fmt == "json":
        click.echo(orjson.dumps(found).decode())
        return
    if not found:
        click.echo("no baselines")
    for item in found:
        c = item["cohort"]
        marks = [m for m, on in (("active", item["active"]), ("unpinned model", item["unpinned"])) if on]
        click.echo(
            f"{item['baseline_id']}  {c['model']} / {c['prompt_version']} / {c['contract']}  "
            f"{item['window']['since']} .. {item['window']['until']}  {item['samples']} samples  "
            f"by {item['author']}{'  [' + ', '.join(marks) + ']' if marks else ''}"
        )
        click.echo(f"    {item['note']}")


@baseline.command()
@click.argument("baseline_id")
@_backend_options
@click.pass_context
def show(ctx: click.Context, baseline_id: str, db_path: str | None, url: str | None, token: str | None) -> None:
    """Print one baseline's full document (JSON)."""
    with _backend(ctx, db_path, url, token) as b:
        _echo_json(b.show(baseline_id))


@baseline.command()
@click.argument("baseline_id")
@click.option("--note", default="", help="Why (kept in the activation history).")
@_backend_options
@click.pass_context
def activate(
    ctx: click.Context, baseline_id: str, note: str, db_path: str | None, url: str | None, token: str | None
) -> None:
    """Make a baseline the active one of its cohort."""
    with _backend(ctx, db_path, url, token) as b:
        result = b.activate(baseline_id, author=_author(), note=note)
    click.echo(f"{result['baseline_id']} is now active")


@baseline.command()
@_cohort_options
@click.option("--note", default="", help="Why (kept in the activation history).")
@_backend_options
@click.pass_context
def retire(
    ctx: click.Context,
    model: str,
    prompt_version: str,
    contract: str,
    source: str,
    note: str,
    db_path: str | None,
    url: str | None,
    token: str | None,
) -> None:
    """Stop comparing a cohort against its baseline (history keeps it)."""
    from shapewatch.baselines import Cohort

    with _backend(ctx, db_path, url, token) as b:
        b.retire(Cohort(model, prompt_version, contract, source), author=_author(), note=note)
    click.echo("retired")


@baseline.command()
@_cohort_options
@click.option("--parent", required=True, help="Id of the baseline to compare this cohort against.")
@click.option("--note", default="", help="Why (kept in the activation history).")
@_backend_options
@click.pass_context
def inherit(
    ctx: click.Context,
    model: str,
    prompt_version: str,
    contract: str,
    source: str,
    parent: str,
    note: str,
    db_path: str | None,
    url: str | None,
    token: str | None,
) -> None:
    """Compare a rollout cohort (no history of its own) against a baseline it names."""
    from shapewatch.baselines import Cohort

    with _backend(ctx, db_path, url, token) as b:
        result = b.inherit(Cohort(model, prompt_version, contract, source), parent, author=_author(), note=note)
    click.echo(f"compared against {result['parent']['baseline_id']}")


@baseline.command()
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory to write DIR/<model>/<prompt_version>/<contract>/<date>-<id>.json into.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="table: each written path, failures on standard error; json: {written, failed}.",
)
@_backend_options
@click.pass_context
def export(
    ctx: click.Context, out_dir: Path, fmt: str, db_path: str | None, url: str | None, token: str | None
) -> None:
    """Write every baseline as a canonical JSON file, for review in a pull request.

    A path part longer than 255 bytes (a very long model id) is shortened to a readable prefix
    and a hash suffix, the same on every export. A file that cannot be written is reported with
    its reason and the others are still written: exit 1 when any failed.
    """
    from shapewatch.baselines import baseline_from_document, export_documents

    with _backend(ctx, db_path, url, token) as b:
        ids = [item["baseline_id"] for item in b.list_baselines()]
        docs = [b.show(i) for i in ids]
    # Stored documents, verified again: a --url answer is not trusted blindly. Their tags passed
    # the ingest limit configured on the service, which may be above the default.
    report = export_documents(
        out_dir,
        [
            baseline_from_document(doc, where=f"baseline {i}", max_tag_length=None)
            for i, doc in zip(ids, docs, strict=True)
        ],
    )
    if fmt == "json":
        click.echo(orjson.dumps(report.to_json()).decode())
    else:
        for path in report.written:
            click.echo(str(path))
        for path, why in report.failed:
            click.echo(f"error: {path}: {why}", err=True)
        if report.failed:
            click.echo(f"wrote {len(report.written)} of {len(ids)} baselines; {len(report.failed)} failed", err=True)
    sys.exit(0 if report.ok else 1)


#: The most files one ``baseline import`` reads from the folders it is given.
MAX_IMPORT_FILES = 10_000


def _documents(paths: tuple[Path, ...]) -> tuple[list[Path], list[str]]:
    """The files to import: each path given, and for a folder (what ``baseline export --out DIR``
    wrote) every ``*.json`` file under it, sorted, without following links to other folders;
    and the folders refused (none inside, or too many), each with its reason."""
    out: list[Path] = []
    refused: list[str] = []
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            found: list[Path] = []
            for root, dirs, files in os.walk(path, followlinks=False):
                dirs.sort()
                found += [Path(root) / f for f in sorted(files) if f.endswith(".json")]
                if len(found) > MAX_IMPORT_FILES:
                    break
            if len(found) > MAX_IMPORT_FILES:
                refused.append(f"{path}: holds more than {MAX_IMPORT_FILES} .json files; import it in parts")
            elif not found:
                refused.append(f"{path}: is a folder without any .json file")
            else:
                out += found
        else:
            out.append(path)
    return list(dict.fromkeys(out)), refused


@baseline.command("import")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--activate",
    "make_active",
    is_flag=True,
    help="Make each imported baseline its cohort's active one (a team that reviews baselines in pull requests).",
)
@_backend_options
@click.pass_context
def import_(
    ctx: click.Context,
    paths: tuple[Path, ...],
    make_active: bool,
    db_path: str | None,
    url: str | None,
    token: str | None,
) -> None:
    """Import exported baseline files, or the folders ``baseline export --out DIR`` wrote; a file
    already imported is a no-op, a tampered one is refused.

    Only regular files of at most 16 MiB are read (a FIFO, a device or a link to one is refused
    unread; links to folders are not followed). Each refused file is named with its reason on
    standard error and the others are still imported: exit 2 when any was refused. With
    ``--activate`` each baseline imported (or already present) becomes its cohort's active one,
    recorded in the activation history with the file it came from.
    """
    from shapewatch.baselines import read_document

    files, bad_folders = _documents(paths)
    for problem in bad_folders:
        click.echo(f"error: {problem}", err=True)
    refused = len(bad_folders)
    with _backend(ctx, db_path, url, token, create=True) as b:
        for path in files:
            try:
                result = b.import_document(read_document(path), str(path))
                if make_active:
                    b.activate(result["baseline_id"], author=_author(), note=f"imported from {path.name}")
            except ShapewatchError as exc:
                refused += 1
                click.echo(f"error: {exc}", err=True)
                continue
            click.echo(
                f"{path}: {'imported' if result['imported'] else 'already present'} ({result['baseline_id']})"
                + (", active" if make_active else "")
            )
    if refused and len(files) + len(bad_folders) > 1:
        click.echo(f"refused {refused} of {len(files) + len(bad_folders)} files", err=True)
    sys.exit(2 if refused else 0)


@cli.command()
@click.option("--since", default="7d", show_default=True, help="The review period, e.g. 7d, at most 90d.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["markdown", "html", "json"]),
    default="markdown",
    show_default=True,
    help="Report format.",
)
@click.option(
    "--out",
    "out_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the report to this file instead of standard output.",
)
@_backend_options
@click.pass_context
def review(
    ctx: click.Context,
    since: str,
    fmt: str,
    out_path: Path | None,
    db_path: str | None,
    url: str | None,
    token: str | None,
) -> None:
    """The weekly baseline review report: baselines, alerts, field tables, candidate windows."""
    from .config import MAX_REVIEW_PERIOD
    from .errors import ConfigInvalid
    from .review import render_html, render_markdown

    _duration(since, "--since", MAX_REVIEW_PERIOD)  # before the review reads anything: its cost grows with it
    try:
        with _backend(ctx, db_path, url, token) as b:
            report = b.review(since)
    except ConfigInvalid as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from None
    text = (
        render_markdown(report)
        if fmt == "markdown"
        else render_html(report)
        if fmt == "html"
        else orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n"
    )
    if out_path is None:
        click.echo(text, nl=False)
    else:
        out_path.write_text(text, encoding="utf-8")
        click.echo(str(out_path))


@cli.command("demo-traffic")
@click.option(
    "--url",
    envvar="SHAPEWATCH_URL",
    default="http://127.0.0.1:8000",
    show_default=True,
    help="The service to send to (SHAPEWATCH_URL).",
)
@_token_option
@click.option(
    "--rate", type=_FiniteFloatRange(min=0.1, max=100_000), default=20.0, show_default=True, help="Events per second."
)
@click.option(
    "--drift/--no-drift",
    default=False,
    show_default=True,
    help="Make the sample cohorts that drift in the sample workspace drift now.",
)
@click.option(
    "--duration",
    type=_FiniteFloatRange(min=0.1, max=30 * 86400),
    help="Seconds to run, at most 30 days (default: until Ctrl-C).",
)
def demo_traffic(url: str, token: str | None, rate: float, drift: bool, duration: float | None) -> None:
    """Stream realistic synthetic traffic of the sample cohorts to a running service, for trying it live."""
    from .sample import SampleError, stream_demo_traffic

    click.echo(f"sending {rate:g} events/s to {url}{' with drift' if drift else ''}; Ctrl-C stops", err=True)
    try:
        sent = stream_demo_traffic(url, token=token, rate=rate, drift=drift, duration=duration)
    except KeyboardInterrupt:
        click.echo("stopped", err=True)
        return
    except SampleError as exc:
        _fail(exc)
    click.echo(f"sent {sent} events")


cli.add_command(contract)
cli.add_command(run_group)
cli.add_command(compare)
cli.add_command(probe)


def main() -> None:
    cli(prog_name="shapewatch")


if __name__ == "__main__":
    main()
