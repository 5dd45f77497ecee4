"""The dashboard's parts that need no Streamlit run: settings, the API client's errors, tables, metrics."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest
from dashboard_live import free_port

from shapewatch.dashboard.charts import values_table
from shapewatch.dashboard.client import ApiClient, AuthRejected, RequestRefused, ServiceFailed, ServiceUnreachable
from shapewatch.dashboard.compare import alert_diff_rows, baseline_window_rows, field_stats, percentile
from shapewatch.dashboard.health import parse_metrics
from shapewatch.dashboard.settings import DEFAULT_URL, SettingsInvalid, load_settings
from shapewatch.dashboard.ui import ago, relative

# --- settings ----------------------------------------------------------------------------------


def test_settings_precedence_option_then_environment_then_default() -> None:
    assert load_settings([], {}) == load_settings(["--unrelated", "x"], {})
    assert load_settings([], {}).url == DEFAULT_URL
    env = {
        "SHAPEWATCH_URL": "http://svc:9000/",
        "SHAPEWATCH_TOKEN": "t-env",
        "SHAPEWATCH_DASHBOARD_REFRESH": "30",
        "USER": "bo",
    }
    s = load_settings([], env)
    assert (s.url, s.token, s.refresh_seconds, s.author) == ("http://svc:9000", "t-env", 30.0, "bo")
    s = load_settings(["--url", "http://other:1", "--token", "t-cli"], {**env, "SHAPEWATCH_AUTHOR": "ana"})
    assert (s.url, s.token, s.author) == ("http://other:1", "t-cli", "ana")


@pytest.mark.parametrize(
    ("env", "key"),
    [
        ({"SHAPEWATCH_URL": "svc:8000"}, "SHAPEWATCH_URL"),
        ({"SHAPEWATCH_DASHBOARD_REFRESH": "0"}, "SHAPEWATCH_DASHBOARD_REFRESH"),
        ({"SHAPEWATCH_DASHBOARD_REFRESH": "soon"}, "SHAPEWATCH_DASHBOARD_REFRESH"),
    ],
)
def test_bad_settings_name_the_variable(env: dict[str, str], key: str) -> None:
    with pytest.raises(SettingsInvalid, match=f"^{key}: "):
        load_settings([], env)


# --- the client's errors -----------------------------------------------------------------------


class _Canned(BaseHTTPRequestHandler):
    """Answers each path with a canned status and body (a stand-in for a failing service)."""

    answers: ClassVar[dict[str, tuple[int, dict[str, object]]]] = {
        "/v1/alerts": (500, {"error": {"status": 500, "message": "store is closed", "fields": []}}),
        "/v1/cohorts": (403, {"error": {"status": 403, "message": "forbidden", "fields": []}}),
        "/v1/baselines": (409, {"error": {"status": 409, "message": "baseline not frozen: too few", "fields": []}}),
        "/v1/review": (
            422,
            {
                "error": {
                    "status": 422,
                    "message": "request is invalid",
                    "fields": [{"path": "query.since", "reason": "bad"}],
                }
            },
        ),
        "/metrics": (502, "Bad Gateway"),
    }

    def do_GET(self) -> None:
        status, body = self.answers[self.path.split("?")[0]]
        raw = json.dumps(body).encode() if isinstance(body, dict) else body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json" if isinstance(body, dict) else "text/plain")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def canned_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Canned)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join(10)


def test_client_errors_are_typed_and_say_what_to_do(canned_url: str) -> None:
    api = ApiClient(canned_url + "/", token="t")
    with pytest.raises(ServiceFailed) as failed:
        api.alerts()
    assert (failed.value.status, str(failed.value)) == (
        500,
        f"The service at {canned_url} failed to answer (500: store is closed). Its log says more; "
        "try again in a moment.",
    )
    with pytest.raises(AuthRejected) as refused:
        api.cohorts()
    assert refused.value.status == 403 and "SHAPEWATCH_TOKEN" in str(refused.value)
    with pytest.raises(RequestRefused) as conflict:
        api.get("/v1/baselines")
    assert (conflict.value.status, conflict.value.message) == (409, "baseline not frozen: too few")
    with pytest.raises(RequestRefused, match=r"request is invalid \(query.since: bad\)$"):
        api.get("/v1/review")
    with pytest.raises(ServiceFailed, match=r"\(502: Bad Gateway\)"):
        api.metrics_text()


def test_an_unreachable_service_is_one_typed_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ServiceUnreachable) as down:
        ApiClient(url).cohorts()
    assert str(down.value).startswith(f"Cannot reach the shapewatch service at {url} (ConnectError")


# --- tables ------------------------------------------------------------------------------------


def test_an_alert_diff_puts_baseline_beside_current() -> None:
    alert = {
        "baseline": {"unknown_share": 0.0, "samples": 400, "known": ["high", "low"]},
        "current": {"unknown_share": 0.1, "samples": 300},
    }
    assert alert_diff_rows(alert) == [
        {"measure": "unknown_share", "baseline": "0.0%", "current": "10.0%"},
        {"measure": "samples", "baseline": "400", "current": "300"},
        {"measure": "known", "baseline": "high, low", "current": "-"},
    ]
    assert alert_diff_rows(
        {
            "baseline": {"types": {"number": 1.0}, "values": {"low": 3, "high": 5}},
            "current": {"types": {"number": 0.666667, "string": 0.333333}},
        }
    ) == [
        {"measure": "types", "baseline": "number 100.0%", "current": "number 66.7%, string 33.3%"},
        {"measure": "values", "baseline": "high 5, low 3", "current": "-"},
    ]
    assert alert_diff_rows({}) == []


def test_percentiles_are_nearest_rank_like_the_service() -> None:
    lengths = {"0": 134, "1": 133, "2": 133}
    assert [percentile(lengths, q) for q in (0.5, 0.9, 0.99)] == [1, 2, 2]
    assert percentile({}, 0.5) is None
    assert percentile({"3": 1}, 0.01) == 3


def _profile(
    path: str,
    units: int,
    present: int,
    types: dict[str, int],
    values: dict[str, int] | None = None,
    lengths: dict[str, int] | None = None,
) -> dict[str, object]:
    return {
        "path": path,
        "scope": None,
        "units": units,
        "present": present,
        "types": types,
        "long_strings": 0,
        "values": values or {},
        "values_overflow": 0,
        "array_lengths": lengths or {},
        "numbers": {},
    }


def test_baseline_against_window_rows() -> None:
    baseline = {
        "tier": _profile("tier", 400, 400, {"string": 400}, {"gold": 200, "silver": 200}),
        "gone": _profile("gone", 400, 100, {"integer": 100}),
        "tags": _profile("tags", 400, 400, {"array": 400}, lengths={"1": 300, "2": 100}),
    }
    window = [
        _profile("tier", 200, 120, {"string": 100, "null": 20}, {"gold": 90, "platinum": 10}),
        _profile("tags", 200, 200, {"array": 200}, lengths={"4": 200}),
        _profile("fresh", 200, 50, {"string": 50}),
    ]
    rows = baseline_window_rows(baseline, window)
    assert [r["field"] for r in rows] == ["tier", "fresh", "gone", "tags"]  # biggest moves first
    tier = rows[0]
    assert (
        tier["presence (baseline)"],
        tier["presence (window)"],
        tier["move (points)"],
        tier["new values"],
        tier["types (window)"],
    ) == ("100.0%", "50.0%", -50.0, "platinum", "null 17%, string 83%")
    assert (rows[1]["status"], rows[2]["status"]) == ("new", "missing")
    assert (rows[3]["arrays p50/p90/p99 (baseline)"], rows[3]["arrays p50/p90/p99 (window)"]) == ("1/2/2", "4/4/4")
    assert field_stats(window[0]).presence == 0.5


def test_values_table_marks_values_the_baseline_never_had() -> None:
    doc = {
        "baseline": {"present": True, "values": {"low": 10, "high": 5}},
        "series": [
            {"since": "2026-11-29T00:00:00Z", "values": {"low": 3, "URGENT": 2}},
            {"since": "2026-11-29T01:00:00Z", "values": {"URGENT": 1, "high": 4}},
        ],
    }
    assert values_table(doc).to_dict("records") == [
        {"value": "URGENT", "count (period)": 3, "count (baseline)": 0, "new": True},
        {"value": "high", "count (period)": 4, "count (baseline)": 5, "new": False},
        {"value": "low", "count (period)": 3, "count (baseline)": 10, "new": False},
    ]
    # Without a baseline nothing can be called new.
    assert not values_table({**doc, "baseline": None})["new"].any()


def test_times_are_shown_with_how_long_ago() -> None:
    now = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    assert [
        relative(t, now)
        for t in (
            "2026-11-29T11:59:58Z",
            "2026-11-29T11:59:00Z",
            "2026-11-29T09:00:00Z",
            "2026-11-26T12:00:00+00:00",
            "2026-12-09T12:00:00Z",
            None,
            "soon",
        )
    ] == ["now", "60 s ago", "3 h ago", "3 days ago", "in 10 days", "-", "soon"]
    assert ago("2026-11-29T09:00:00", now) == "2026-11-29 09:00 UTC (3 h ago)"  # no zone: UTC


# --- metrics -----------------------------------------------------------------------------------


def test_metrics_are_read_into_ingestion_health() -> None:
    text = "\n".join(
        [
            "# TYPE shapewatch_events_total counter",
            'shapewatch_events_total{outcome="accepted",model="m",prompt_version="p"} 7.0',
            'shapewatch_events_total{outcome="duplicate",model="m",prompt_version="p"} 2.0',
            'shapewatch_events_total{outcome="rejected",model="other",prompt_version="other"} 3.0',
            "# TYPE shapewatch_events_rejected_total counter",
            'shapewatch_events_rejected_total{reason="invalid_ts"} 2.0',
            'shapewatch_events_rejected_total{reason="too_deep"} 1.0',
            "# TYPE shapewatch_dedup_hits_total counter",
            "shapewatch_dedup_hits_total 2.0",
            "# TYPE shapewatch_provider_outcomes_total counter",
            'shapewatch_provider_outcomes_total{provider="openai",kind="truncated"} 4.0',
            "# TYPE shapewatch_analyzer_runs_total counter",
            'shapewatch_analyzer_runs_total{result="ok"} 5.0',
            'shapewatch_analyzer_runs_total{result="failed"} 1.0',
            "# TYPE shapewatch_analyzer_last_success_timestamp_seconds gauge",
            "shapewatch_analyzer_last_success_timestamp_seconds 1.7e9",
            "",
        ]
    )
    h = parse_metrics(text)
    assert h.events_by_outcome == {"accepted": 7.0, "duplicate": 2.0, "rejected": 3.0} and h.events_total == 12.0
    assert h.events_by_cohort == {
        ("m", "p"): {"accepted": 7.0, "duplicate": 2.0},
        ("other", "other"): {"rejected": 3.0},
    }
    assert h.rejected_by_reason == {"invalid_ts": 2.0, "too_deep": 1.0}
    assert (h.duplicates, h.provider_outcomes, h.analyzer_runs, h.analyzer_last_success) == (
        2.0,
        {("openai", "truncated"): 4.0},
        {"ok": 5.0, "failed": 1.0},
        1.7e9,
    )


def test_a_contract_version_going_out_is_marked_on_every_time_chart() -> None:
    from shapewatch.dashboard import charts
    from shapewatch.dashboard.views.alerts import contract_line

    doc = {
        "since": "2026-11-29T00:00:00Z",
        "until": "2026-11-29T02:00:00Z",
        "baseline": {"presence_rate": 0.7},
        "series": [
            {
                "since": f"2026-11-29T0{h}:00:00Z",
                "until": f"2026-11-29T0{h + 1}:00:00Z",
                "units": 10,
                "presence_rate": 0.7,
                "types": {"string": 1.0},
                "unknown_share": 0.0,
                "violation_rate": 0.1 * h,
                "array": None,
            }
            for h in (0, 1)
        ],
        "contract_changes": [{"version": "4", "at": "2026-11-29T01:10:00Z"}],
    }
    frame = charts.contract_changes_frame(doc)
    assert frame.to_dict("records") == [
        {
            "time": charts.pd.Timestamp("2026-11-29T01:10:00Z"),
            "when_utc": "2026-11-29 01:10 UTC",
            "contract": "contract 4",
        }
    ]
    for chart in (
        charts.presence_chart(doc),
        charts.type_chart(doc),
        charts.unknown_chart(doc),
        charts.violation_chart(doc),
    ):
        spec = chart.to_dict()
        marks = [
            (layer["mark"]["type"] if isinstance(layer["mark"], dict) else layer["mark"])
            if "mark" in layer
            else "chart"
            for layer in spec["layer"]
        ]
        assert marks[-2:] == ["rule", "text"], marks  # the marker and its label, over the chart
    # without a change the charts are left as they were
    plain = charts.type_chart({**doc, "contract_changes": []}).to_dict()
    assert "layer" not in plain
    assert contract_line(
        {"window": {"3": 10, "4": 5}, "baseline": {"3": 100}, "changes": [{"version": "4", "first_seen": None}]}
    ) == ("contract 3 (10 outputs), 4 (5 outputs); baseline on 3; **4 went out \\-**  \n")  # values escaped
    assert contract_line({}) == ""


def _series_doc(**extra: Any) -> dict[str, Any]:
    return {
        "since": "2026-11-29T00:00:00Z",
        "until": "2026-11-29T02:00:00Z",
        "baseline": {"presence_rate": 0.7, "present": True, "values": {"low": 1}},
        "series": [
            {
                "since": f"2026-11-29T0{h}:00:00Z",
                "until": f"2026-11-29T0{h + 1}:00:00Z",
                "units": 10,
                "presence_rate": 0.5 + 0.1 * h,
                "types": {"string": 1.0},
                "values": {"low": 3},
                "unknown_share": 0.0,
                "violation_rate": None,
                "array": {"p50": 1, "p90": 2, "p99": 3, "empty_share": 0.0},
            }
            for h in (0, 1)
        ],
        "contract_changes": [],
        **extra,
    }


def test_points_stand_at_the_end_of_their_step_and_time_reads_in_utc() -> None:
    from shapewatch.dashboard import charts

    doc = _series_doc()
    frame = charts.series_frame(doc)
    # the step 00:00-01:00 is drawn at 01:00: the newest step's point is at the right edge, now
    assert list(frame["time"]) == [
        charts.pd.Timestamp("2026-11-29T01:00:00Z"),
        charts.pd.Timestamp("2026-11-29T02:00:00Z"),
    ]
    assert list(frame["when_utc"]) == ["2026-11-29 01:00 UTC", "2026-11-29 02:00 UTC"]
    for chart in (
        charts.presence_chart(doc),
        charts.type_chart(doc),
        charts.array_chart(doc),
        charts.unknown_chart(doc),
    ):
        spec = chart.to_dict()
        layers = spec.get("layer", [spec])
        xs = [
            layer["encoding"]["x"]
            for layer in layers
            if "x" in layer.get("encoding", {}) and "scale" in layer["encoding"]["x"]
        ]
        assert xs, spec
        for x in xs:
            assert x["title"] == "time (UTC)"
            assert x["scale"]["type"] == "utc"
            assert x["scale"]["domain"] == ["2026-11-29T00:00:00Z", "2026-11-29T02:00:00Z"]
        tips = [t for layer in layers for t in layer.get("encoding", {}).get("tooltip", [])]
        assert all(t.get("type") != "temporal" for t in tips), tips  # a browser-zone time in no tooltip


def test_values_are_charted_for_enum_fields_only() -> None:
    from shapewatch.dashboard import charts

    assert charts.shows_values(_series_doc(values_kind="enum"))
    assert not charts.shows_values(_series_doc(values_kind="free_text"))
    assert not charts.shows_values(_series_doc(values_kind="numeric"))
    assert charts.shows_values(_series_doc())  # an older service sends no values_kind


def test_contract_usage_frame_has_a_row_per_version_and_step() -> None:
    from shapewatch.dashboard import charts

    usage = {
        "since": "2026-11-29T00:00:00Z",
        "until": "2026-11-29T02:00:00Z",
        "versions": [
            {
                "version": v,
                "series": [
                    {
                        "since": f"2026-11-29T0{h}:00:00Z",
                        "until": f"2026-11-29T0{h + 1}:00:00Z",
                        "outputs": 10,
                        "checked": c,
                        "violation_rate": r,
                    }
                    for h, c, r in ((0, 10, 0.1), (1, 0, None))
                ],
            }
            for v in ("1", "")
        ],
    }
    frame = charts.version_usage_frame(usage)
    rows = frame[["version", "checked", "violations"]].astype(object).where(frame.notna(), None)
    assert rows.to_dict("records") == [
        {"version": "1", "checked": 10, "violations": 0.1},
        {"version": "1", "checked": 0, "violations": None},
        {"version": "untagged", "checked": 10, "violations": 0.1},
        {"version": "untagged", "checked": 0, "violations": None},
    ]
    spec = charts.version_violation_chart(usage).to_dict()
    assert spec["encoding"]["x"]["scale"]["type"] == "utc"
