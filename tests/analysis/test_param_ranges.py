"""Every duration, time and size parameter of the analysis routes and the CLI is range-checked.

A hostile value (nan, inf, 1e308, eleven digits, zero, negative, empty, no unit, an unknown
unit, a period of 10,000 days, year 1 or 9999, an until before its since) is refused with 422
in the shared error shape naming the parameter, or by the CLI as a usage error naming the
option, never a 500 or a traceback. The routes whose cost grows with a parameter refuse it
before reading: the function that would read is replaced by one that fails the test, and the
request must still be answered 422 (and the same request in range reaches it).

HTTP goes through the service's ASGI app on a real DuckDB file under tmp_path; the CLI is
``analysis.cli:cli`` through click's ``CliRunner``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from fastapi.testclient import TestClient
from harness import free_port
from prometheus_client import CollectorRegistry

import shapewatch.analysis.admin
import shapewatch.analysis.review
from shapewatch.analysis.cli import cli
from shapewatch.analysis.config import ConfigInvalid, parse_config
from shapewatch.analysis.service import create_app
from shapewatch.analysis.store_access import open_store
from shapewatch.collector import Settings

ENV = {"SHAPEWATCH_AUTHOR": "ana", "SHAPEWATCH_URL": None, "SHAPEWATCH_TOKEN": None, "SHAPEWATCH_CONFIG": None}
NOW = datetime.now(UTC).replace(microsecond=0)


def iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def not_a_duration(text: str) -> str:
    return f"{text!r} is not a duration; write e.g. 90s, 15m, 24h or 7d"


OUTSIDE = "is outside the times taken, 1971-01-01T00:00:00Z to 2200-01-01T00:00:00Z"

# (value, reason) for a duration whose limit is 90 days: the review period and a silence.
HOSTILE_DURATIONS = [
    ("nand", not_a_duration("nand")),
    ("infd", not_a_duration("infd")),
    ("-infd", not_a_duration("-infd")),
    ("nanh", not_a_duration("nanh")),
    ("1e308d", not_a_duration("1e308d")),
    ("1e3d", not_a_duration("1e3d")),
    ("0x10d", not_a_duration("0x10d")),
    ("1_000d", not_a_duration("1_000d")),
    ("+7d", not_a_duration("+7d")),
    ("-1d", not_a_duration("-1d")),
    ("", not_a_duration("")),
    (" ", not_a_duration(" ")),
    ("7", not_a_duration("7")),  # no unit
    ("7y", not_a_duration("7y")),  # an unknown unit
    ("7 d", not_a_duration("7 d")),
    ("0d", "'0d' is shorter than 1s"),
    ("0.5s", "'0.5s' is shorter than 1s"),
    ("99999999999d", "'99999999999d' is longer than the limit of 90d"),
    ("10000d", "'10000d' is longer than the limit of 90d"),
    ("100000d", "'100000d' is longer than the limit of 90d"),
    ("91d", "'91d' is longer than the limit of 90d"),
    ("13w", "'13w' is longer than the limit of 90d"),
    ("9" * 400 + "s", f"{'9' * 40 + '...'!r} is longer than the limit of 90d"),  # float() of it is inf
]

# (query, path, reason) for the time parameters of a windowed read route.
HOSTILE_TIMES = [
    ({"since": "0001-01-01T00:00:00Z"}, "since", f"'0001-01-01T00:00:00Z' {OUTSIDE}"),
    ({"since": "0001-01-01T00:00:00+05:00"}, "since", f"'0001-01-01T00:00:00+05:00' {OUTSIDE}"),
    ({"until": "9999-12-31T23:59:59Z"}, "until", f"'9999-12-31T23:59:59Z' {OUTSIDE}"),
    ({"until": "9999-12-31T23:59:59-01:00"}, "until", f"'9999-12-31T23:59:59-01:00' {OUTSIDE}"),
    ({"since": "1970-12-31T23:59:59Z"}, "since", f"'1970-12-31T23:59:59Z' {OUTSIDE}"),
    ({"until": "2200-01-01T00:00:00Z"}, "until", f"'2200-01-01T00:00:00Z' {OUTSIDE}"),
    ({"since": "nan"}, "since", "'nan' is not an ISO 8601 time; write e.g. 2026-11-29T12:00:00Z"),
    ({"since": "1700000000"}, "since", "'1700000000' is not an ISO 8601 time; write e.g. 2026-11-29T12:00:00Z"),
    ({"until": ""}, "until", "'' is not an ISO 8601 time; write e.g. 2026-11-29T12:00:00Z"),
    ({"until": " "}, "until", "' ' is not an ISO 8601 time; write e.g. 2026-11-29T12:00:00Z"),
    (
        {"since": "2026-11-20T00:00:00"},
        "since",
        "'2026-11-20T00:00:00' has no time zone; add Z or an offset such as +02:00",
    ),
    ({"since": "x" * 5000}, "since", f"{'x' * 40 + '...'!r} is not an ISO 8601 time; write e.g. 2026-11-29T12:00:00Z"),
    (
        {"since": "2026-11-02T00:00:00Z", "until": "2026-11-01T00:00:00Z"},
        "until",
        "2026-11-01T00:00:00Z is not after since 2026-11-02T00:00:00Z",
    ),
    (
        {"since": "2026-11-01T00:00:00Z", "until": "2026-11-01T00:00:00Z"},
        "until",
        "2026-11-01T00:00:00Z is not after since 2026-11-01T00:00:00Z",
    ),
    (
        {"since": "2020-01-01T00:00:00Z", "until": "2026-01-01T00:00:00Z"},
        "since",
        "the window 2020-01-01T00:00:00Z .. 2026-01-01T00:00:00Z is longer than the limit of 400d",
    ),
    (
        {"since": "1971-01-01T00:00:00Z", "until": "2199-12-31T00:00:00Z"},
        "since",
        "the window 1971-01-01T00:00:00Z .. 2199-12-31T00:00:00Z is longer than the limit of 400d",
    ),
]


def ids(cases: list[Any]) -> list[str]:
    """Short test ids: the hostile value, cut."""
    return [repr(c[0])[:24] for c in cases]


def error(path: str, reason: str, message: str | None = None) -> dict[str, Any]:
    """The whole body of a 422 naming ``path``."""
    return {
        "error": {
            "status": 422,
            "message": message or f"{path}: {reason}",
            "fields": [{"path": path, "reason": reason}],
        }
    }


def assert_refused(r: Any, path: str, reason: str, message: str | None = None) -> None:
    assert (r.status_code, r.headers["content-type"]) == (422, "application/json"), r.text
    assert r.json() == error(path, reason, message)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    db = tmp_path_factory.mktemp("ranges") / "ranges.duckdb"
    app = create_app(dataclasses.replace(Settings(), db_path=db), registry=CollectorRegistry(), analyze=False)
    with TestClient(app, raise_server_exceptions=False) as c:
        r = c.post(
            "/v1/outputs",
            json=[
                {
                    "event_id": f"e{i}",
                    "ts": iso(NOW - timedelta(hours=1, minutes=i)),
                    "model": "m",
                    "prompt_version": "p",
                    "contract": "c",
                    "output": {"a": i},
                }
                for i in range(3)
            ],
        )
        assert r.status_code == 200 and r.json()["accepted"] == 3, r.text
        yield c


@pytest.fixture(scope="module")
def cohort_id(client: TestClient) -> int:
    (cohort,) = client.get("/v1/cohorts").json()
    return int(cohort["cohort_id"])


@pytest.fixture
def no_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The functions behind the cost-bounded routes, replaced by ones that record the call and
    fail: a request refused before reading never reaches them."""
    reached: list[str] = []

    def refuse(name: str) -> Any:
        def read(*args: Any, **kw: Any) -> Any:
            reached.append(name)
            raise AssertionError(f"{name} was called")

        return read

    monkeypatch.setattr(shapewatch.analysis.review, "build_review", refuse("build_review"))
    for name in ("cohorts", "cohort_fields", "field_series", "events"):
        monkeypatch.setattr(shapewatch.analysis.admin, name, refuse(name))
    return reached


# --- durations --------------------------------------------------------------------------------


@pytest.mark.parametrize(("since", "reason"), HOSTILE_DURATIONS, ids=ids(HOSTILE_DURATIONS))
def test_review_refuses_a_period_out_of_range_before_reading(
    client: TestClient, no_reads: list[str], since: str, reason: str
) -> None:
    assert_refused(client.get("/v1/review", params={"since": since}), "since", reason)
    assert no_reads == []


def test_review_in_range_reaches_the_review(client: TestClient, no_reads: list[str]) -> None:
    # The control of the test above: the same route with a period in range does read.
    assert client.get("/v1/review", params={"since": "90d"}).status_code == 500
    assert no_reads == ["build_review"]


@pytest.mark.parametrize("since", ["90d", "1.5h", "2160h", "12w", " 7d ", "1s"])
def test_review_takes_a_period_up_to_90_days(client: TestClient, since: str) -> None:
    r = client.get("/v1/review", params={"since": since})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(("duration", "reason"), HOSTILE_DURATIONS, ids=ids(HOSTILE_DURATIONS))
def test_a_silence_out_of_range_is_refused(client: TestClient, duration: str, reason: str) -> None:
    r = client.post("/v1/silences", json={"duration": duration, "author": "ana", "reason": "deploy", "model": "m"})
    assert_refused(r, "duration", reason)


def test_a_silence_of_90_days_is_taken(client: TestClient) -> None:
    r = client.post("/v1/silences", json={"duration": "90d", "author": "ana", "reason": "deploy", "model": "zz"})
    assert r.status_code == 201, r.text
    s = r.json()
    assert datetime.fromisoformat(s["ends_at"]) - datetime.fromisoformat(s["starts_at"]) == timedelta(days=90)


def test_a_silence_of_an_unknown_kind_names_kind(client: TestClient) -> None:
    r = client.post("/v1/silences", json={"duration": "2h", "author": "ana", "reason": "deploy", "kind": "boom"})
    assert r.status_code == 422 and r.json()["error"]["fields"][0]["path"] == "kind", r.text


# --- times and windows -------------------------------------------------------------------------


@pytest.mark.parametrize(("query", "path", "reason"), HOSTILE_TIMES, ids=[repr(q)[:48] for q, _, _ in HOSTILE_TIMES])
@pytest.mark.parametrize("route", ["cohorts", "fields", "series"])
def test_windowed_routes_refuse_times_out_of_range_before_reading(
    client: TestClient, cohort_id: int, no_reads: list[str], route: str, query: dict[str, str], path: str, reason: str
) -> None:
    url = "/v1/cohorts" if route == "cohorts" else f"/v1/cohorts/{cohort_id}/{route}"
    params = {**query, "field": "a"} if route == "series" else query
    assert_refused(client.get(url, params=params), path, reason)
    assert no_reads == []


def test_a_since_after_now_without_until_names_since(client: TestClient, cohort_id: int) -> None:
    since = iso(NOW + timedelta(days=1))
    r = client.get(f"/v1/cohorts/{cohort_id}/fields", params={"since": since})
    assert r.status_code == 422, r.text
    (field,) = r.json()["error"]["fields"]
    assert field["path"] == "since" and field["reason"].startswith(f"{since!r} is not before now (")


@pytest.mark.parametrize("route", ["cohorts", "fields", "series"])
def test_windowed_routes_take_a_window_of_400_days(client: TestClient, cohort_id: int, route: str) -> None:
    url = "/v1/cohorts" if route == "cohorts" else f"/v1/cohorts/{cohort_id}/{route}"
    window = {"since": iso(NOW - timedelta(days=400)), "until": iso(NOW)}
    r = client.get(url, params={**window, "field": "a"} if route == "series" else window)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("points", "reason"),
    [
        ("0", "Input should be greater than or equal to 1"),
        ("501", "Input should be less than or equal to 500"),
        ("-1", "Input should be greater than or equal to 1"),
        ("99999999999", "Input should be less than or equal to 500"),
        ("nan", "Input should be a valid integer, unable to parse string as an integer"),
        ("", "Input should be a valid integer, unable to parse string as an integer"),
    ],
)
def test_series_points_are_bounded(
    client: TestClient, cohort_id: int, no_reads: list[str], points: str, reason: str
) -> None:
    r = client.get(f"/v1/cohorts/{cohort_id}/series", params={"field": "a", "points": points})
    assert_refused(r, "points", reason, "request is invalid")
    assert no_reads == []


# --- sizes -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ids", "reason"),
    [
        (["e1"] * 101, "101 ids given; give between 1 and 100"),
        (["e1", "x" * 129], "id 1 is 129 characters long; an event id has 1 to 128"),
        (["e1", ""], "id 1 is 0 characters long; an event id has 1 to 128"),
    ],
)
def test_events_refuse_too_many_or_too_long_ids_before_reading(
    client: TestClient, no_reads: list[str], ids: list[str], reason: str
) -> None:
    assert_refused(client.get("/v1/events", params={"ids": ids}), "ids", reason)
    assert no_reads == []


def test_events_without_ids_name_ids(client: TestClient) -> None:
    assert_refused(client.get("/v1/events"), "ids", "Field required", "request is invalid")


def test_events_take_100_ids(client: TestClient) -> None:
    r = client.get("/v1/events", params={"ids": ["e0", "e1", *(f"x{i}" for i in range(98))]})
    assert r.status_code == 200, r.text
    assert sorted(e["event_id"] for e in r.json()) == ["e0", "e1"]


@pytest.mark.parametrize(
    ("limit", "reason"),
    [
        ("0", "Input should be greater than or equal to 1"),
        ("1001", "Input should be less than or equal to 1000"),
        ("99999999999", "Input should be less than or equal to 1000"),
        ("nan", "Input should be a valid integer, unable to parse string as an integer"),
        ("1e3", "Input should be a valid integer, unable to parse string as an integer"),
    ],
)
def test_runs_limit_is_bounded(client: TestClient, limit: str, reason: str) -> None:
    assert_refused(client.get("/v1/analyzer/runs", params={"limit": limit}), "limit", reason, "request is invalid")


# --- FastAPI's own validation errors name the parameter -----------------------------------------


def test_a_body_missing_its_fields_names_each_field(client: TestClient) -> None:
    r = client.post("/v1/silences", json={"author": "ana"})
    assert r.status_code == 422
    assert r.json() == {
        "error": {
            "status": 422,
            "message": "request is invalid",
            "fields": [
                {"path": "duration", "reason": "Field required"},
                {"path": "reason", "reason": "Field required"},
            ],
        }
    }


def test_a_body_that_is_not_json_names_the_body(client: TestClient) -> None:
    r = client.post("/v1/silences", content=b"{", headers={"content-type": "application/json"})
    assert r.status_code == 422
    (field,) = r.json()["error"]["fields"]
    assert field["path"].split(".")[0] == "body" and field["reason"], r.text


def test_a_validation_error_still_needs_the_token_first(tmp_path: Path) -> None:
    app = create_app(
        dataclasses.replace(Settings(), db_path=tmp_path / "t.duckdb", tokens=("read:s3cret",)),
        registry=CollectorRegistry(),
        analyze=False,
    )
    with TestClient(app) as c:
        assert c.get("/v1/analyzer/runs", params={"limit": "0"}).status_code == 401
        r = c.get("/v1/analyzer/runs", params={"limit": "0"}, headers={"Authorization": "Bearer s3cret"})
        assert r.json()["error"]["fields"] == [
            {"path": "limit", "reason": "Input should be greater than or equal to 1"}
        ]


# --- the TOML configuration ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"analyzer": {"window": "nand"}}, f"analyzer.window: {not_a_duration('nand')}"),
        ({"analyzer": {"window": "1e308d"}}, f"analyzer.window: {not_a_duration('1e308d')}"),
        ({"analyzer": {"window": "401d"}}, "analyzer.window: '401d' is longer than the limit of 400d"),
        ({"analyzer": {"interval": "0s"}}, "analyzer.interval: '0s' is shorter than 0.001s"),
        (
            {"analyzer": {"max_baseline_age": "99999999999d"}},
            "analyzer.max_baseline_age: '99999999999d' is longer than the limit of 3650d",
        ),
        ({"defaults": {"tolerance": float("nan")}}, "defaults.tolerance: nan is out of range"),
        ({"defaults": {"cardinality_factor": float("inf")}}, "defaults.cardinality_factor: inf is out of range"),
        ({"contracts": {"c": {"alpha": float("-inf")}}}, "contracts.c.alpha: -inf is out of range"),
    ],
)
def test_the_configuration_refuses_durations_and_numbers_out_of_range(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigInvalid) as caught:
        parse_config(data)
    assert str(caught.value) == message


def test_the_configuration_takes_a_window_of_400_days() -> None:
    assert parse_config({"analyzer": {"window": "400d", "interval": "1.5h"}}).window == timedelta(days=400)


# --- the CLI -------------------------------------------------------------------------------------


def run(*args: str) -> Result:
    """``shapewatch ARGS`` in-process; an uncaught exception (a traceback for a user) fails the test."""
    result = CliRunner(env=ENV).invoke(cli, list(args), prog_name="shapewatch")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"shapewatch {' '.join(args)} raised {result.exception!r}") from result.exception
    return result


def assert_usage_error(result: Result, option: str, reason: str) -> None:
    assert result.exit_code == 2 and result.stdout == "", (result.stdout, result.stderr)
    assert f"Error: Invalid value for {option}: {reason}\n" in result.stderr, result.stderr


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "cli.duckdb"
    open_store(dataclasses.replace(Settings(), db_path=path)).close()
    return path


@pytest.mark.parametrize(("since", "reason"), HOSTILE_DURATIONS, ids=ids(HOSTILE_DURATIONS))
def test_cli_review_refuses_a_period_out_of_range(db: Path, since: str, reason: str) -> None:
    assert_usage_error(run("review", "--db", str(db), "--since", since), "--since", reason)


def test_cli_review_refuses_before_asking_the_service() -> None:
    # Nothing listens on the port: the refusal comes before any request.
    url = f"http://127.0.0.1:{free_port()}"
    assert_usage_error(
        run("review", "--url", url, "--since", "10000d"), "--since", "'10000d' is longer than the limit of 90d"
    )


def test_cli_review_takes_90_days(db: Path) -> None:
    result = run("review", "--db", str(db), "--since", "90d", "--format", "json")
    assert result.exit_code == 0, result.stderr


@pytest.mark.parametrize(
    ("window", "reason"),
    [
        ("nand", not_a_duration("nand")),
        ("infd", not_a_duration("infd")),
        ("1e308d", not_a_duration("1e308d")),
        ("0d", "'0d' is shorter than 1s"),
        ("-1d", not_a_duration("-1d")),
        ("", not_a_duration("")),
        ("24", not_a_duration("24")),
        ("24x", not_a_duration("24x")),
        ("99999999999d", "'99999999999d' is longer than the limit of 400d"),
        ("10000d", "'10000d' is longer than the limit of 400d"),
    ],
)
def test_cli_analyze_refuses_a_window_out_of_range(db: Path, window: str, reason: str) -> None:
    assert_usage_error(run("analyze", "--once", "--db", str(db), "--window", window), "--window", reason)


@pytest.mark.parametrize(
    ("at", "reason"),
    [
        ("0001-01-01T00:00:00Z", f"'0001-01-01T00:00:00Z' {OUTSIDE}"),
        ("0001-01-01T00:00:00+05:00", f"'0001-01-01T00:00:00+05:00' {OUTSIDE}"),
        ("9999-12-31T23:59:59Z", f"'9999-12-31T23:59:59Z' {OUTSIDE}"),
        ("nan", "'nan' is not an ISO 8601 time; write e.g. 2026-11-29T12:00:00Z"),
        ("", "'' is not an ISO 8601 time; write e.g. 2026-11-29T12:00:00Z"),
    ],
)
def test_cli_analyze_refuses_a_time_out_of_range(db: Path, at: str, reason: str) -> None:
    assert_usage_error(run("analyze", "--once", "--db", str(db), "--at", at), "--at", reason)


def test_cli_analyze_takes_a_window_of_400_days(db: Path) -> None:
    result = run("analyze", "--once", "--db", str(db), "--window", "400d", "--at", iso(NOW), "--format", "json")
    assert result.exit_code == 0, result.stderr


@pytest.mark.parametrize(
    ("option", "value"), [("--since", "0001-01-01T00:00:00+05:00"), ("--until", "9999-12-31T23:59:59-01:00")]
)
def test_cli_freeze_refuses_a_time_no_datetime_holds(db: Path, option: str, value: str) -> None:
    args = {"--since": iso(NOW - timedelta(days=1)), "--until": iso(NOW), option: value}
    result = run(
        "baseline",
        "freeze",
        "--db",
        str(db),
        "--model",
        "m",
        "--prompt-version",
        "p",
        "--note",
        "n",
        *(x for kv in args.items() for x in kv),
    )
    assert_usage_error(result, option, f"{value!r} is outside the times a datetime holds")


@pytest.mark.parametrize(
    ("args", "option", "reason"),
    [
        (["--rate", "nan"], "'--rate'", "'nan' is not a finite number"),
        (["--rate", "inf"], "'--rate'", "inf is not in the range 0.1<=x<=100000."),
        (["--duration", "nan"], "'--duration'", "'nan' is not a finite number"),
        (["--duration", "inf"], "'--duration'", "inf is not in the range 0.1<=x<=2592000."),
        (["--duration", "1e308"], "'--duration'", "1e+308 is not in the range 0.1<=x<=2592000."),
    ],
)
def test_cli_demo_traffic_refuses_nan_and_inf(args: list[str], option: str, reason: str) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert_usage_error(run("demo-traffic", "--url", url, *args), option, reason)


def test_cli_refuses_a_configuration_with_a_nan_window(db: Path, tmp_path: Path) -> None:
    config = tmp_path / "shapewatch.toml"
    config.write_text('[analyzer]\nwindow = "nanh"\n')
    result = run("--config", str(config), "analyze", "--once", "--db", str(db))
    assert result.exit_code == 2 and f"analyzer.window: {not_a_duration('nanh')}" in result.stderr, result.stderr
