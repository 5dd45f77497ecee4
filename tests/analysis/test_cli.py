"""The admin CLI as a user runs it: ``ingest``, ``baseline ...``, ``analyze --once``, ``alerts``.

Most commands run in-process through click's ``CliRunner`` on ``analysis.cli.cli``
(a subprocess costs seconds of imports per call); one runs as a real
subprocess, and ``--url`` talks to a real ``shapewatch serve`` on loopback.
The data is a JSONL file written here: a baseline day, a normal day and a
drifted day of one cohort, plus a day of an unpinned model (``gpt-4o``). Days
are placed relative to now so that a service's retention keeps them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from click.testing import CliRunner, Result
from drift_outputs import iso, output
from harness import ROOT, SHAPEWATCH, Service, free_port
from prometheus_client import CollectorRegistry

from shapewatch.analysis.analyzer import Analyzer
from shapewatch.analysis.cli import cli
from shapewatch.analysis.config import AnalyzerConfig
from shapewatch.analysis.store_access import open_store
from shapewatch.collector import Settings

MODEL = "claude-sonnet-4-5-20250929"
ALIAS = "gpt-4o"
PROMPT = "intake-v3"
CONTRACT = "intake"
NAMES = {"model": MODEL, "prompt_version": PROMPT, "contract": CONTRACT}  # as a baseline document holds them
COHORT = {**NAMES, "source": "production"}  # as alerts and reports carry a cohort
DESIGN_ALERT_KEYS = {"cohort", "field", "kind", "severity", "state", "fingerprint", "baseline", "current", "detail"}
ENV = {"SHAPEWATCH_AUTHOR": "ana", "SHAPEWATCH_URL": None, "SHAPEWATCH_TOKEN": None, "SHAPEWATCH_CONFIG": None}

DAY0 = (datetime.now(UTC) - timedelta(days=4)).replace(hour=0, minute=0, second=0, microsecond=0)
BASE_DAY, NORMAL_DAY, DRIFT_DAY = DAY0, DAY0 + timedelta(days=1), DAY0 + timedelta(days=2)


def day_of(start: datetime, n: int, *, drift: bool = False, model: str = MODEL) -> list[str]:
    """n envelopes one minute apart from ``start``."""
    return [
        json.dumps(
            {
                "event_id": uuid.uuid4().hex,
                "ts": iso(start + timedelta(minutes=i)),
                "model": model,
                "served_model": model,
                "prompt_version": PROMPT,
                "contract": CONTRACT,
                "contract_version": "3",
                "output": output(i, drift),
            }
        )
        for i in range(n)
    ]


def run(*args: str, env: dict[str, str | None] | None = None) -> Result:
    """``shapewatch ARGS`` in-process; an uncaught exception (a traceback for a user) fails the test."""
    result = CliRunner(env={**ENV, **(env or {})}).invoke(cli, list(args), prog_name="shapewatch")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"shapewatch {' '.join(args)} raised {result.exception!r}") from result.exception
    return result


def ok(*args: str) -> str:
    result = run(*args)
    assert result.exit_code == 0, (args, result.stdout, result.stderr)
    return result.stdout


def day_window(day: datetime) -> list[str]:
    return ["--since", iso(day), "--until", iso(day + timedelta(days=1))]


def freeze_args(db: Path, *extra: str, model: str = MODEL, day: datetime = BASE_DAY) -> list[str]:
    return [
        "baseline",
        "freeze",
        "--db",
        str(db),
        "--model",
        model,
        "--prompt-version",
        PROMPT,
        "--contract",
        CONTRACT,
        *day_window(day),
        "--note",
        "reviewed: week 48",
        *extra,
    ]


def copy_db(src: Path, dst: Path) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    for f in src.parent.glob(src.name + "*"):  # the file and a write-ahead log, if any
        shutil.copy(f, dst.parent / (dst.name + f.name[len(src.name) :]))
    return dst


@pytest.fixture(scope="module")
def jsonl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("jsonl") / "outputs.jsonl"
    lines = [
        *day_of(BASE_DAY, 400),
        *day_of(BASE_DAY, 250, model=ALIAS),
        *day_of(NORMAL_DAY, 400),
        *day_of(DRIFT_DAY, 400, drift=True),
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def ingested(jsonl: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("template") / "shapewatch.duckdb"
    result = run("ingest", str(jsonl), "--db", str(db), "--format", "json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == {
        "accepted": 1450,
        "duplicate": 0,
        "rejected": 0,
        "rejected_by_reason": {},
        "quarantine": [],
        "unreadable": [],
    }
    return db


@pytest.fixture
def db(ingested: Path, tmp_path: Path) -> Path:
    """A private copy of the ingested database."""
    return copy_db(ingested, tmp_path / "var" / "shapewatch.duckdb")


# --- baseline freeze / list / show ---------------------------------------------------------------


def test_freeze_prints_the_id_and_list_describes_every_baseline(db: Path) -> None:
    result = run(*freeze_args(db))
    assert result.exit_code == 0, result.stderr
    bid = result.stdout.strip()
    assert result.stdout == bid + "\n" and len(bid) == 16 and result.stderr == ""
    alias_id = ok(*freeze_args(db, model=ALIAS)).strip()

    listing = json.loads(ok("baseline", "list", "--db", str(db), "--format", "json"))
    doc = json.loads(ok("baseline", "show", bid, "--db", str(db)))
    alias_doc = json.loads(ok("baseline", "show", alias_id[:8], "--db", str(db)))

    def summary(d: dict[str, Any]) -> dict[str, Any]:
        return {**{k: v for k, v in d.items() if k != "fields"}, "fields": len(d["fields"])}

    window = {"since": iso(BASE_DAY), "until": iso(BASE_DAY + timedelta(days=1))}
    assert [item["baseline_id"] for item in listing] in ([alias_id, bid], [bid, alias_id])  # newest first
    by_id = {item["baseline_id"]: item for item in listing}
    assert by_id[bid] == {**summary(doc), "active": True, "unpinned": False}
    assert by_id[alias_id] == {**summary(alias_doc), "active": True, "unpinned": True}
    assert {
        k: by_id[bid][k]
        for k in (
            "baseline_id",
            "cohort",
            "window",
            "samples",
            "author",
            "note",
            "active",
            "unpinned",
            "forced",
            "served_models",
        )
    } == {
        "baseline_id": bid,
        "cohort": NAMES,
        "window": window,
        "samples": 400,
        "author": "ana",
        "note": "reviewed: week 48",
        "active": True,
        "unpinned": False,
        "forced": None,
        "served_models": {MODEL: 400},
    }
    assert by_id[bid]["hash"].startswith(bid) and len(by_id[bid]["hash"]) == 64
    assert (by_id[alias_id]["cohort"], by_id[alias_id]["samples"]) == ({**NAMES, "model": ALIAS}, 250)

    # Freezing the same window again is the same baseline; --no-activate leaves the active one alone.
    assert ok(*freeze_args(db)).strip() == bid
    candidate = ok(*freeze_args(db, "--no-activate", "--format", "json", day=NORMAL_DAY))
    assert json.loads(candidate)["active"] is False
    only_main = json.loads(
        ok(
            "baseline",
            "list",
            "--db",
            str(db),
            "--format",
            "json",
            "--model",
            MODEL,
            "--prompt-version",
            PROMPT,
            "--contract",
            CONTRACT,
        )
    )
    assert [(i["window"]["since"], i["active"]) for i in only_main] == [(iso(NORMAL_DAY), False), (iso(BASE_DAY), True)]

    table = ok("baseline", "list", "--db", str(db)).splitlines()
    assert (
        f"{alias_id}  {ALIAS} / {PROMPT} / {CONTRACT}  {window['since']} .. {window['until']}  250 samples  "
        "by ana  [active, unpinned model]" in table
    )
    assert (
        f"{bid}  {MODEL} / {PROMPT} / {CONTRACT}  {window['since']} .. {window['until']}  400 samples  "
        "by ana  [active]" in table
    )
    assert table.count("    reviewed: week 48") == 3


def test_freeze_with_too_few_samples_exits_2_with_a_message_and_no_traceback(db: Path) -> None:
    # A real process: what a user or a script sees.
    short = ["--since", iso(BASE_DAY), "--until", iso(BASE_DAY + timedelta(minutes=150))]
    proc = subprocess.run(
        [
            *SHAPEWATCH,
            "baseline",
            "freeze",
            "--db",
            str(db),
            "--model",
            MODEL,
            "--prompt-version",
            PROMPT,
            "--contract",
            CONTRACT,
            *short,
            "--note",
            "too early",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={
            **{k: v for k, v in os.environ.items() if k not in ENV},
            "PYTHONPATH": str(ROOT),
            "SHAPEWATCH_AUTHOR": "ana",
        },
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    # Two days before the newest data, rollups are hour buckets: the window 00:00 .. 02:30 holds
    # the buckets that start in it, so it is aligned to 00:00 .. 03:00, and the message says so.
    assert proc.stderr == (
        f"error: baseline not frozen: cohort {MODEL} / {PROMPT} / {CONTRACT} has 180 samples "
        f"in {short[1]} .. {iso(BASE_DAY + timedelta(hours=3))}, fewer than the minimum of 200 (freeze "
        "another window, or pass --force with a reason)\n"
    )
    assert json.loads(ok("baseline", "list", "--db", str(db), "--format", "json")) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--since", "2026-11-20T00:00:00"], "has no time zone; add Z or an offset such as +02:00"),
        (["--until", "yesterday"], "'yesterday' is not an ISO 8601 time"),
    ],
)
def test_freeze_refuses_times_that_are_not_iso_with_a_zone(db: Path, args: list[str], message: str) -> None:
    base = freeze_args(db)
    for i in range(0, len(args), 2):
        base[base.index(args[i]) + 1] = args[i + 1]
    result = run(*base)
    assert result.exit_code == 2 and message in result.stderr, result.stderr


# --- analyze --------------------------------------------------------------------------------------


def test_analyze_once_prints_the_alerts_and_exits_1_while_any_fires(db: Path) -> None:
    bid = ok(*freeze_args(db)).strip()
    at = DRIFT_DAY + timedelta(hours=12)
    result = run("analyze", "--once", "--db", str(db), "--at", iso(at), "--format", "json")
    assert result.exit_code == 1, result.stderr
    report = json.loads(result.stdout)
    assert set(report) == {"at", "window_seconds", "alerts", "cohorts"}
    assert (report["at"], report["window_seconds"]) == (iso(at), 86400)
    alerts = report["alerts"]
    assert [(a["field"], a["kind"], a["value"], a["severity"], a["state"]) for a in alerts] == [
        ("customer.tier", "presence_drop", None, "page", "firing"),  # page first, then by field and kind
        ("priority", "unknown_enum_growth", None, "warn", "firing"),  # the new value URGENT folded in
    ]
    for a in alerts:
        assert set(a) >= DESIGN_ALERT_KEYS and a["cohort"] == COHORT and a["baseline_id"] == bid
    assert (alerts[0]["baseline"], alerts[0]["current"], alerts[0]["detail"]) == (
        {"presence_rate": 1.0, "samples": 400},
        {"presence_rate": 0.5, "samples": 400},
        "presence 100.0% -> 50.0% (p < 1e-6)",
    )
    assert len({a["fingerprint"] for a in alerts}) == 2
    assert [(c["cohort"], c["events"], c["baseline_id"]) for c in report["cohorts"]] == [(COHORT, 400, bid)]

    # The same evaluation as a table: a line per alert, then its detail and what it was compared with.
    table = run("analyze", "--once", "--db", str(db), "--at", iso(at))
    assert table.exit_code == 1
    assert table.stdout.splitlines() == [
        f"page firing   {MODEL} / {PROMPT} / {CONTRACT}  customer.tier  presence_drop",
        "     presence 100.0% -> 50.0% (p < 1e-6)",
        f"     compared with baseline {bid}",
        f"warn firing   {MODEL} / {PROMPT} / {CONTRACT}  priority  unknown_enum_growth",
        "     unknown values 0.0% -> 10.0%; new values: URGENT (p < 1e-6)",
        f"     compared with baseline {bid}",
    ]
    # analyze writes nothing: the service's alert list stays empty.
    assert json.loads(run("alerts", "--db", str(db), "--format", "json").stdout) == []


def test_analyze_once_on_a_window_without_drift_exits_0(db: Path) -> None:
    ok(*freeze_args(db))
    at = NORMAL_DAY + timedelta(hours=12)  # the window holds the normal day only
    report = json.loads(ok("analyze", "--once", "--db", str(db), "--at", iso(at), "--format", "json"))
    assert report["alerts"] == []
    assert [(c["cohort"], c["events"], c["insufficient"]) for c in report["cohorts"]] == [(COHORT, 400, [])]
    assert ok("analyze", "--once", "--db", str(db), "--at", iso(at)) == "no alerts\n"


def test_analyze_tells_about_cohorts_without_a_baseline(db: Path) -> None:
    at = BASE_DAY + timedelta(hours=12)
    out = ok("analyze", "--once", "--db", str(db), "--at", iso(at))
    assert out.splitlines() == [
        "no alerts",
        f"note: {MODEL} / {PROMPT} / {CONTRACT} has no baseline (400 events); freeze one to judge it",
        f"note: {ALIAS} / {PROMPT} / {CONTRACT} has no baseline (250 events); freeze one to judge it",
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--at", "2026-11-22T12:00:00"], "has no time zone"),
        (["--at", "noon"], "is not an ISO 8601 time"),
        (["--window", "a day"], "is not a duration"),
        ([], "Missing option '--once'"),
    ],
)
def test_analyze_usage_errors_exit_2(db: Path, args: list[str], message: str) -> None:
    once = [] if not args else ["--once"]
    result = run("analyze", *once, "--db", str(db), *args)
    assert result.exit_code == 2, result.stdout
    assert message in result.stderr and result.stdout == ""


# --- export / import ----------------------------------------------------------------------------


def _keys_sorted(value: Any) -> bool:
    if isinstance(value, dict):
        return list(value) == sorted(value) and all(_keys_sorted(v) for v in value.values())
    if isinstance(value, list):
        return all(_keys_sorted(v) for v in value)
    return True


def test_export_then_import_into_a_fresh_database_round_trips(db: Path, tmp_path: Path) -> None:
    bid = ok(*freeze_args(db)).strip()
    alias_id = ok(*freeze_args(db, model=ALIAS)).strip()
    out = tmp_path / "exported"
    printed = ok("baseline", "export", "--out", str(out), "--db", str(db)).splitlines()
    date = f"{BASE_DAY + timedelta(days=1):%Y-%m-%d}"  # the day the window ends
    expected = {
        out / MODEL / PROMPT / CONTRACT / f"{date}-{bid}.json",
        out / ALIAS / PROMPT / CONTRACT / f"{date}-{alias_id}.json",
    }
    assert set(map(Path, printed)) == expected
    assert {p for p in out.rglob("*") if p.is_file()} == expected

    fresh = tmp_path / "fresh.duckdb"
    for path in sorted(expected):
        raw = path.read_bytes()
        assert raw.endswith(b"}\n") and raw.startswith(b'{\n  "author": ')  # indented, sorted keys
        assert _keys_sorted(json.loads(raw, object_pairs_hook=dict))
        doc = json.loads(raw)
        assert raw == orjson.dumps(doc, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2) + b"\n"
        assert json.loads(ok("baseline", "show", doc["baseline_id"], "--db", str(db))) == doc

        assert ok("baseline", "import", str(path), "--db", str(fresh)) == f"{path}: imported ({doc['baseline_id']})\n"
        assert (
            ok("baseline", "import", str(path), "--db", str(fresh))
            == f"{path}: already present ({doc['baseline_id']})\n"
        )
    for bid_ in (bid, alias_id):
        assert ok("baseline", "show", bid_, "--db", str(fresh)) == ok("baseline", "show", bid_, "--db", str(db))
    # Imported is not activated: the fresh database lists both as inactive.
    assert {
        (i["baseline_id"], i["active"])
        for i in json.loads(ok("baseline", "list", "--db", str(fresh), "--format", "json"))
    } == {(bid, False), (alias_id, False)}

    # A file edited after export is refused and nothing is stored.
    original = out / MODEL / PROMPT / CONTRACT / f"{date}-{bid}.json"
    tampered = tmp_path / "tampered.json"
    doc = json.loads(original.read_bytes())
    doc["note"] = "reviewed: week 49"
    tampered.write_bytes(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2))
    other = tmp_path / "other.duckdb"
    result = run("baseline", "import", str(tampered), "--db", str(other))
    assert result.exit_code == 2
    assert result.stderr.startswith(
        f"error: {tampered}: the baseline's hash says {doc['hash'][:16]}... but its content hashes to "
    )
    assert result.stderr.endswith("the file was edited after export and is refused\n")
    assert json.loads(ok("baseline", "list", "--db", str(other), "--format", "json")) == []

    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    result = run("baseline", "import", str(garbage), "--db", str(other))
    assert result.exit_code == 2 and result.stderr.startswith(f"error: {garbage}: cannot read a JSON document")


# --- alerts ---------------------------------------------------------------------------------------


def _evaluate(db: Path, at: datetime, evaluations: int = 2) -> None:
    """What the service's scheduler does: evaluations five minutes apart, recorded in the file."""
    config = AnalyzerConfig()
    store = open_store(dataclasses.replace(Settings(), db_path=db))
    try:
        analyzer = Analyzer(store, config, registry=CollectorRegistry())
        for i in range(evaluations - 1, -1, -1):
            assert analyzer.run(at - config.interval * i).ok
    finally:
        store.close()


def test_alerts_lists_what_the_evaluations_recorded(db: Path) -> None:
    ok(*freeze_args(db))
    _evaluate(db, DRIFT_DAY + timedelta(hours=12))
    result = run("alerts", "--db", str(db), "--format", "json")
    assert result.exit_code == 1  # something is firing
    alerts = json.loads(result.stdout)
    assert sorted((a["field"], a["kind"], a["severity"], a["state"]) for a in alerts) == [
        ("customer.tier", "presence_drop", "page", "firing"),
        ("priority", "unknown_enum_growth", "warn", "firing"),
    ]
    assert alerts[0]["kind"] == "presence_drop" and all(set(a) >= DESIGN_ALERT_KEYS for a in alerts)

    page = run("alerts", "--db", str(db), "--severity", "page", "--format", "json")
    assert page.exit_code == 1 and json.loads(page.stdout) == alerts[:1]
    assert run("alerts", "--db", str(db), "--state", "pending", "--format", "json").stdout == "[]\n"
    none = run("alerts", "--db", str(db), "--model", ALIAS)
    assert (none.exit_code, none.stdout) == (0, "no alerts\n")
    table = run("alerts", "--db", str(db), "--kind", "presence_drop")
    assert table.stdout.splitlines() == [
        f"page firing   {MODEL} / {PROMPT} / {CONTRACT}  customer.tier  presence_drop",
        "     presence 100.0% -> 50.0% (p < 1e-6)",
        f"     compared with baseline {alerts[0]['baseline_id']}",
    ]


# --- --url against a running service, --db on the same file ---------------------------------------


@pytest.mark.slow
def test_url_and_db_give_the_same_answers(db: Path, service_factory: Callable[..., Service]) -> None:
    svc = service_factory(db)
    result = run(
        "baseline",
        "freeze",
        "--url",
        svc.url,
        "--model",
        MODEL,
        "--prompt-version",
        PROMPT,
        "--contract",
        CONTRACT,
        *day_window(BASE_DAY),
        "--note",
        "reviewed: week 48",
    )
    assert result.exit_code == 0, result.stderr
    bid = result.stdout.strip()
    assert len(bid) == 16
    refused = run(
        "baseline",
        "freeze",
        "--url",
        svc.url,
        "--model",
        ALIAS,
        "--prompt-version",
        PROMPT,
        "--contract",
        CONTRACT,
        "--since",
        iso(BASE_DAY),
        "--until",
        iso(BASE_DAY + timedelta(hours=1)),
        "--note",
        "too short",
    )
    assert refused.exit_code == 2
    assert refused.stderr.startswith("error: the service answered 409: baseline not frozen: cohort ")
    # The file is the service's while it runs.
    held = run("baseline", "list", "--db", str(db), "--format", "json")
    assert held.exit_code == 2 and "in use by another process" in held.stderr, held.stderr

    over_http = ok("baseline", "list", "--url", svc.url, "--format", "json")
    shown_over_http = ok("baseline", "show", bid, "--url", svc.url)
    alerts_over_http = run("alerts", "--url", svc.url, "--format", "json")
    svc.stop()

    assert json.loads(over_http)[0]["baseline_id"] == bid
    assert ok("baseline", "list", "--db", str(db), "--format", "json") == over_http
    assert ok("baseline", "show", bid, "--db", str(db)) == shown_over_http
    assert (alerts_over_http.exit_code, alerts_over_http.stdout) == (0, "[]\n")
    assert run("alerts", "--db", str(db), "--format", "json").stdout == alerts_over_http.stdout


def test_url_to_nothing_is_a_clear_error(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    result = run("baseline", "list", "--url", url)
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr.startswith(f"error: cannot reach the service at {url}: ")


@pytest.mark.parametrize("command", [["baseline", "list"], ["alerts"], ["baseline", "show", "0123456789"]])
def test_db_and_url_together_is_a_usage_error(tmp_path: Path, command: list[str]) -> None:
    db = tmp_path / "x.duckdb"
    result = run(*command, "--db", str(db), "--url", "http://127.0.0.1:9")
    assert result.exit_code == 2
    assert "give --db or --url, not both" in result.stderr
    assert not db.exists()  # nothing was opened


def test_unknown_baseline_id_exits_2(db: Path) -> None:
    result = run("baseline", "show", "0123456789abcdef", "--db", str(db))
    assert (result.exit_code, result.stdout, result.stderr) == (2, "", "error: no baseline '0123456789abcdef'\n")
    result = run("baseline", "activate", "0123456789abcdef", "--db", str(db))
    assert (result.exit_code, result.stderr) == (2, "error: no baseline '0123456789abcdef'\n")


@pytest.mark.parametrize("command", [["alerts"], ["baseline", "list"], ["analyze", "--once"]])
def test_a_missing_database_file_is_an_input_error(tmp_path: Path, command: list[str]) -> None:
    missing = tmp_path / "typo.duckdb"
    result = run(*command, "--db", str(missing))
    assert not missing.exists()  # a command that only reads creates nothing
    assert result.exit_code == 2 and str(missing) in result.stderr


@pytest.fixture
def live_url(tmp_path: Path) -> Iterator[str]:
    """The service app under a real uvicorn on loopback, in a thread (cheaper than a subprocess)."""
    import threading

    import uvicorn

    from shapewatch.analysis.service import create_app

    app = create_app(
        dataclasses.replace(Settings(), db_path=tmp_path / "live.duckdb"), registry=CollectorRegistry(), analyze=False
    )
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)  # polling a start-up with a deadline
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(30)


def test_import_over_url_names_the_refused_file(db: Path, tmp_path: Path, live_url: str) -> None:
    bid = ok(*freeze_args(db)).strip()
    doc = json.loads(ok("baseline", "show", bid, "--db", str(db)))
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(doc))
    bad.write_text(json.dumps({**doc, "note": "edited"}))
    assert ok("baseline", "import", str(good), "--url", live_url) == f"{good}: imported ({bid})\n"
    over_db = run("baseline", "import", str(bad), "--db", str(tmp_path / "other.duckdb"))
    over_url = run("baseline", "import", str(bad), "--url", live_url)
    assert over_db.exit_code == over_url.exit_code == 2
    assert str(bad) in over_db.stderr
    assert str(bad) in over_url.stderr


def test_demo_traffic_streams_labelled_sample_cohorts(live_url: str) -> None:
    out = ok("demo-traffic", "--url", live_url, "--rate", "40", "--duration", "1.5", "--drift")
    sent = int(out.split()[1])
    assert 40 <= sent <= 120  # one batch per second of 40 events, for 1.5 s
    cohorts = httpx.get(f"{live_url}/v1/cohorts").json()
    # each output counted once in the cohort it was requested under (served cohorts answer for aliases)
    assert sum(c["events"] for c in cohorts if not c["answered_for"]) == sent
    assert {c["cohort"]["contract"] for c in cohorts} == {"sample-intake", "sample-triage", "sample-invoice"}
    assert run("demo-traffic", "--url", "http://127.0.0.1:9", "--duration", "1").exit_code == 2


def test_bulk_import_does_not_load_the_statistics_stack() -> None:
    # `shapewatch ingest` opens the store with every package's tables; scipy (the rules) costs
    # ~70 MiB of resident memory that the bulk-import memory target has no room for.
    code = (
        "import sys, shapewatch.analysis.cli, shapewatch.analysis.store_access, shapewatch.collector.ingest; "
        "print(sorted(m for m in ('scipy', 'streamlit', 'pandas') if m in sys.modules))"
    )
    out = subprocess.run([*SHAPEWATCH[:1], "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
