"""Two cohorts side by side (issue 25, item 5): ``shapewatch compare`` and shadows judged against
their production twin.

A shadow cohort (a candidate model answering a copy of live traffic) is judged in every evaluation
against the production cohort of the same prompt version and contract over the same window, with
the analyzer's rules; ``compare`` does the same for any two cohorts on demand. Real DuckDB files,
the real ingest path, the real analyzer and the CLI in-process (click's runner), and ``--url``
against a real uvicorn.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from harness import free_port
from prometheus_client import CollectorRegistry
from synth import NO_DRIFT, Drift, synth_outputs, write_outputs

from shapewatch.analysis.alerts import ALERTS_SCHEMA
from shapewatch.analysis.analyzer import analyze_once
from shapewatch.analysis.cli import cli
from shapewatch.analysis.compare import parse_cohort, production_twin
from shapewatch.analysis.config import AnalyzerConfig, parse_config
from shapewatch.analysis.errors import ConfigInvalid, ParameterInvalid
from shapewatch.baselines import BASELINES_SCHEMA, Cohort
from shapewatch.collector import Settings, Store

PROD_MODEL, CANDIDATE, OTHER = "gpt-4o-2024-08-06", "gpt-5-2026-01-15", "claude-sonnet-4-5-20250929"
PV, CONTRACT = "triage-v1", "triage"
PROD = Cohort(PROD_MODEL, PV, CONTRACT)
SHADOW = Cohort(CANDIDATE, PV, CONTRACT, "shadow")
T0 = datetime(2026, 11, 1, 6, tzinfo=UTC)
SINCE, UNTIL = T0, T0 + timedelta(hours=2)
DROPPED = Drift(email_presence=0.10)  # customer.email filled 70% of the time in production
ENV = {"SHAPEWATCH_CONFIG": None, "SHAPEWATCH_DB": None, "SHAPEWATCH_URL": None, "SHAPEWATCH_TOKEN": None}


def write(store: Store, seed: int, n: int, model: str, source: str, drift: Drift = NO_DRIFT) -> None:
    write_outputs(
        store,
        synth_outputs(seed, n, drift),
        T0,
        timedelta(hours=1),
        model=model,
        prompt_version=PV,
        contract=CONTRACT,
        source=source,
        id_prefix=f"{model}/{source}/{seed}",
    )


def open_store(path: Path) -> Store:
    return Store.open(path, schemas=[BASELINES_SCHEMA, ALERTS_SCHEMA])


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """Production and a drifted shadow candidate, and a steady second shadow of another model."""
    path = tmp_path / "compare.duckdb"
    with open_store(path) as s:
        write(s, 1, 1_500, PROD_MODEL, "production")
        write(s, 2, 800, CANDIDATE, "shadow", DROPPED)
        write(s, 3, 800, OTHER, "shadow")
    return path


def run(*args: str) -> Result:
    result = CliRunner(env=ENV).invoke(cli, list(args), prog_name="shapewatch")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"shapewatch {' '.join(args)} raised {result.exception!r}") from result.exception
    return result


def compare_args(a: str, b: str, *rest: str) -> list[str]:
    return ["compare", "--a", a, "--b", b, "--since", SINCE.isoformat(), "--until", UNTIL.isoformat(), *rest]


def test_compare_exits_1_with_the_drifting_fields_and_0_on_two_steady_cohorts(db: Path) -> None:
    drifted = run(
        *compare_args(f"shadow/{CANDIDATE}/{PV}/{CONTRACT}", f"{PROD_MODEL}/{PV}/{CONTRACT}", "--db", str(db))
    )
    assert drifted.exit_code == 1, drifted.output
    doc = json.loads(
        run(*compare_args(f"shadow/{CANDIDATE}/{PV}/{CONTRACT}", f"{PROD_MODEL}/{PV}/{CONTRACT}", "--db", str(db),
                          "--format", "json")).stdout
    )  # fmt: skip
    assert [(c["field"], c["kind"], c["severity"]) for c in doc["breaches"]] == [
        ("customer.email", "presence_drop", "page")
    ]
    assert doc["a"] == {
        "model": CANDIDATE,
        "prompt_version": PV,
        "contract": CONTRACT,
        "source": "shadow",
        "events": 800,
    }
    assert doc["b"] == {
        "model": PROD_MODEL,
        "prompt_version": PV,
        "contract": CONTRACT,
        "source": "production",
        "events": 1_500,
    }
    email = next(f for f in doc["fields"] if f["field"] == "customer.email")
    assert email["a"]["presence_rate"] < 0.2 < 0.6 < email["b"]["presence_rate"]
    assert "customer.email" in drifted.stdout and "presence_drop" in drifted.stdout
    # two steady cohorts: the other shadow against production, and production against itself
    steady = run(
        *compare_args(f"shadow/{OTHER}/{PV}/{CONTRACT}", f"production/{PROD_MODEL}/{PV}/{CONTRACT}", "--db", str(db))
    )
    assert steady.exit_code == 0, steady.output
    assert "no rule breached" in steady.stdout
    same = run(
        *compare_args(
            f"{PROD_MODEL}/{PV}/{CONTRACT}", f"{PROD_MODEL}/{PV}/{CONTRACT}", "--db", str(db), "--format", "json"
        )
    )
    assert same.exit_code == 0 and json.loads(same.stdout)["breaches"] == []


@pytest.mark.parametrize(
    ("a", "message"),
    [
        ("just-a-model", "a: 'just-a-model' is not source/model/prompt_version/contract"),
        ("probe/m", "a: 'probe/m' is not source/model/prompt_version/contract"),
        ("m//c", "a: 'm//c' has an empty or padded prompt version"),
        ("x" * 900 + "/p/c", "is 904 characters long; at most 803"),
        (f"probe/{PROD_MODEL}/{PV}/{CONTRACT}", f"a: no output of cohort probe: {PROD_MODEL} / {PV} / {CONTRACT}"),
    ],
)
def test_compare_refuses_unreadable_or_unknown_cohorts_naming_the_option(db: Path, a: str, message: str) -> None:
    result = run(*compare_args(a, f"{PROD_MODEL}/{PV}/{CONTRACT}", "--db", str(db)))
    assert result.exit_code == 2
    assert message in result.stderr
    assert "Traceback" not in result.output


def test_compare_refuses_a_window_that_ends_before_it_starts(db: Path) -> None:
    result = run("compare", "--a", f"{PROD_MODEL}/{PV}/{CONTRACT}", "--b", f"{PROD_MODEL}/{PV}/{CONTRACT}",
                 "--since", UNTIL.isoformat(), "--until", SINCE.isoformat(), "--db", str(db))  # fmt: skip
    assert result.exit_code == 2 and "until" in result.stderr


def test_a_cohort_text_reads_source_model_with_slashes_prompt_version_and_contract() -> None:
    assert parse_cohort("meta-llama/Llama-3.1-8B/p/c") == Cohort("meta-llama/Llama-3.1-8B", "p", "c", "production")
    assert parse_cohort("shadow/meta-llama/Llama-3.1-8B/p/c") == Cohort("meta-llama/Llama-3.1-8B", "p", "c", "shadow")
    assert parse_cohort("probe/p/c") == Cohort("probe", "p", "c")  # three parts: "probe" is the model
    with pytest.raises(ParameterInvalid, match="padded contract"):
        parse_cohort("m/p/ c")


def test_a_shadow_is_judged_against_its_production_twin_and_says_so(db: Path) -> None:
    with open_store(db) as store:
        evaluation, alerts = analyze_once(store, AnalyzerConfig(), UNTIL)
    reports = {r.cohort: r for r in evaluation.cohorts}
    # production has no baseline: judged against nothing; each shadow against production's window
    assert {c: (r.events, r.how, r.baseline_cohort) for c, r in reports.items()} == {
        PROD: (1_500, None, None),
        SHADOW: (800, "production_twin", PROD),
        Cohort(OTHER, PV, CONTRACT, "shadow"): (800, "production_twin", PROD),
    }
    assert [(a.cohort, a.field, a.kind.value, a.severity.value) for a in alerts] == [
        (SHADOW, "customer.email", "presence_drop", "page")
    ]
    doc = alerts[0].to_json()
    assert doc["cohort"]["source"] == "shadow"
    assert doc["compared_with"] == f"shadow vs production: {PROD_MODEL} / {PV} / {CONTRACT} over the same window"


def test_the_twin_is_the_configured_production_model_else_the_busiest() -> None:
    a, b = Cohort("a", PV, CONTRACT), Cohort("b", PV, CONTRACT)
    elsewhere = Cohort("z", "other-pv", CONTRACT)
    in_window = {a: _Events(100), b: _Events(300), elsewhere: _Events(900), SHADOW: _Events(50)}
    assert production_twin(SHADOW, in_window) == b  # type: ignore[arg-type]
    assert production_twin(SHADOW, in_window, {CANDIDATE: "a"}) == a  # type: ignore[arg-type]
    assert production_twin(SHADOW, in_window, {CANDIDATE: "gone"}) is None  # type: ignore[arg-type]
    assert production_twin(Cohort(CANDIDATE, "nowhere", CONTRACT, "shadow"), in_window) is None  # type: ignore[arg-type]


@dataclasses.dataclass
class _Events:
    events: int


def test_the_shadows_table_is_read_and_hostile_entries_are_refused_by_key() -> None:
    assert parse_config({"shadows": {CANDIDATE: PROD_MODEL}}).shadows == {CANDIDATE: PROD_MODEL}
    for table, message in [
        ({"shadows": "x"}, 'shadows: must be a table of "shadow model" = "production model"'),
        ({"shadows": {CANDIDATE: 3}}, f'shadows."{CANDIDATE}": must be the production model id'),
        ({"shadows": {CANDIDATE: ""}}, f'shadows."{CANDIDATE}": must be the production model id'),
        ({"shadows": {"m" * 300: "p"}}, "a model id has 1 to 200 characters"),
        ({"shadows": {f"m{i}": "p" for i in range(1001)}}, "shadows: 1001 entries; at most 1000"),
    ]:
        with pytest.raises(ConfigInvalid) as err:
            parse_config(table)
        assert message in str(err.value), table


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """``shapewatch serve``'s app under a real uvicorn on loopback, holding a database with both cohorts."""
    import uvicorn

    from shapewatch.analysis.service import create_app

    path = tmp_path / "live.duckdb"
    with open_store(path) as s:
        write(s, 1, 1_500, PROD_MODEL, "production")
        write(s, 2, 800, CANDIDATE, "shadow", DROPPED)
    app = create_app(dataclasses.replace(Settings(), db_path=path), registry=CollectorRegistry(), analyze=False)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)  # polling a start-up with a deadline
    yield f"http://127.0.0.1:{port}", path
    server.should_exit = True
    thread.join(30)


def test_compare_over_url_answers_as_the_file_does_and_names_bad_parameters(live: tuple[str, Path]) -> None:
    import httpx

    url, _ = live
    over_url = run(*compare_args(f"shadow/{CANDIDATE}/{PV}/{CONTRACT}", f"{PROD_MODEL}/{PV}/{CONTRACT}", "--url", url,
                                 "--format", "json"))  # fmt: skip
    assert over_url.exit_code == 1
    assert [c["field"] for c in json.loads(over_url.stdout)["breaches"]] == ["customer.email"]
    bad = httpx.get(f"{url}/v1/compare", params={"a": "nope", "b": f"{PROD_MODEL}/{PV}/{CONTRACT}"})
    assert bad.status_code == 422
    assert bad.json()["error"]["fields"] == [
        {"path": "a", "reason": "'nope' is not source/model/prompt_version/contract (the source is optional)"}
    ]
    unknown = httpx.get(
        f"{url}/v1/compare",
        params={"a": f"probe/{PROD_MODEL}/{PV}/{CONTRACT}", "b": f"{PROD_MODEL}/{PV}/{CONTRACT}",
                "since": SINCE.isoformat(), "until": UNTIL.isoformat()},
    )  # fmt: skip
    assert unknown.status_code == 404 and "no output of cohort probe" in unknown.json()["error"]["message"]
