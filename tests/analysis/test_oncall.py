"""On-call context: traffic_stopped, the onset search, incidents in the outbox, served models,
links, and the ``[oncall]`` configuration (refused with the key and the reason)."""

from __future__ import annotations

import tomllib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from synth import write_outputs

from shapewatch.analysis.alerts import AlertBook, AlertState
from shapewatch.analysis.analyzer import Analyzer
from shapewatch.analysis.config import AnalyzerConfig, ConfigInvalid, Grouping, OnCallConfig, parse_config
from shapewatch.analysis.notify import Target, TargetKind
from shapewatch.analysis.oncall import dashboard_link, served_models
from shapewatch.analysis.onset import onset_split
from shapewatch.analysis.service import pager_enqueue
from shapewatch.analysis.store_access import SCHEMAS
from shapewatch.baselines import Cohort, freeze_baseline
from shapewatch.collector import Store

MODEL, PROMPT, CONTRACT = "claude-sonnet-4-5-20250929", "intake-v3", "intake"
COHORT = Cohort(MODEL, PROMPT, CONTRACT)
DAY1 = datetime(2026, 11, 2, tzinfo=UTC)
HOUR = timedelta(hours=1)


def outputs(n: int, *, drift: bool = False) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        o: dict[str, Any] = {"priority": ("low", "medium", "high")[i % 3], "customer": {"tier": "gold"}}
        if drift and i % 2 == 0:
            del o["customer"]["tier"]
        if drift and i % 5 < 3:
            o["language"] = "xx"
        else:
            o["language"] = ("en", "de")[i % 2]
        out.append(o)
    return out


@pytest.fixture
def store(tmp_path: Path) -> Any:
    s = Store.open(tmp_path / "oncall.duckdb", schemas=SCHEMAS)
    write_outputs(s, outputs(1200), DAY1 - 12 * HOUR, 12 * HOUR)  # 100 an hour
    freeze_baseline(s, COHORT, DAY1 - 12 * HOUR, DAY1, author="ana", note="reference", now=DAY1)
    yield s
    s.close()


# --- traffic_stopped ------------------------------------------------------------------------------


def test_traffic_stopped_fires_when_a_cohort_goes_silent_and_clears_when_it_resumes(store: Store) -> None:
    config = parse_config(tomllib.loads('[analyzer]\nwindow = "1h"\n[oncall]\ntraffic_period = "1h"\n'))
    registry = CollectorRegistry()
    analyzer = Analyzer(store, config, registry=registry)
    write_outputs(store, outputs(100), DAY1, HOUR, id_prefix="d1")  # the first hour as usual

    def traffic() -> list[tuple[str, str]]:
        return [(a.state.value, a.detail) for a in AlertBook(store).alerts() if a.kind.value == "traffic_stopped"]

    assert analyzer.run(DAY1 + HOUR).ok and traffic() == []
    # Silent from DAY1 + 1 h: an hour later the cohort has no output in the window at all.
    assert analyzer.run(DAY1 + 2 * HOUR).ok
    assert traffic() == [("firing", "0 outputs in the last 1h, 0.0% of the 100 the baseline's rate expects (p < 1e-6)")]
    (alert,) = [a for a in AlertBook(store).alerts() if a.kind.value == "traffic_stopped"]
    assert (alert.field, alert.severity.value, alert.to_json()["links"]["runbook"]) == ("$", "warn", None)
    # A trickle (5 an hour, 5% of the rate) is still stopped; the alert stays one alert.
    write_outputs(store, outputs(5), DAY1 + 2 * HOUR, HOUR, id_prefix="d2")
    assert analyzer.run(DAY1 + 3 * HOUR).ok
    assert [s for s, _ in traffic()] == ["firing"]
    # Traffic resumes at its rate: two clear evaluations resolve it.
    write_outputs(store, outputs(200), DAY1 + 3 * HOUR, 2 * HOUR, id_prefix="d3")
    assert analyzer.run(DAY1 + 4 * HOUR).ok and analyzer.run(DAY1 + 5 * HOUR).ok
    assert [s for s, _ in traffic()] == ["resolved"]
    # The last event is exported for the Prometheus rule (ShapewatchTrafficStopped).
    text = generate_latest(registry).decode()
    line = next(ln for ln in text.splitlines() if ln.startswith("shapewatch_cohort_last_event_timestamp_seconds{"))
    assert (
        f'model="{MODEL}"' in line and float(line.split()[-1]) == (DAY1 + 5 * HOUR - timedelta(minutes=1)).timestamp()
    )


def test_a_silent_cohort_keeps_its_other_alerts(store: Store) -> None:
    config = parse_config(tomllib.loads('[analyzer]\nwindow = "1h"\n[oncall]\ntraffic_period = "1h"\n'))
    analyzer = Analyzer(store, replace_confirm(config), registry=CollectorRegistry())
    write_outputs(store, outputs(300, drift=True), DAY1, HOUR, id_prefix="drift")
    assert analyzer.run(DAY1 + HOUR).ok
    firing = {(a.field, a.kind.value) for a in AlertBook(store).alerts(state=AlertState.firing)}
    assert ("customer.tier", "presence_drop") in firing
    assert analyzer.run(DAY1 + 3 * HOUR).ok  # nothing since: judged on traffic alone
    after = {(a.field, a.kind.value) for a in AlertBook(store).alerts(state=AlertState.firing)}
    assert after == firing | {("$", "traffic_stopped")}


def replace_confirm(config: AnalyzerConfig) -> AnalyzerConfig:
    from dataclasses import replace

    return replace(config, confirm_evaluations=1, short_windows=())


# --- onset -------------------------------------------------------------------------------------


def test_onset_split_finds_the_step_and_widens_with_noise() -> None:
    first, low, high, llr = onset_split([0] * 10 + [50] * 10, [100] * 20) or (0, 0, 0, 0.0)
    assert (first, low, high) == (10, 10, 10) and llr > 100
    # A smaller change in fewer outputs: found, with an interval around it.
    found = onset_split([1, 2, 1, 2, 1, 2, 1, 2, 4, 6, 5, 6, 5, 6, 5], [10] * 15)
    assert found is not None and found[1] <= found[0] <= found[2] and found[2] - found[1] >= 1, found
    assert onset_split([30] * 20, [100] * 20) is None  # no change
    assert onset_split([], []) is None and onset_split([1], [2]) is None and onset_split([0, 0], [0, 0]) is None


def test_the_onset_of_an_alert_is_read_from_the_buckets(store: Store) -> None:
    config = replace_confirm(AnalyzerConfig(window=HOUR))
    drift_from = DAY1 + timedelta(minutes=20)
    write_outputs(store, outputs(20), DAY1, timedelta(minutes=20), id_prefix="before")
    write_outputs(store, outputs(600, drift=True), drift_from, 2 * HOUR, id_prefix="after")
    analyzer = Analyzer(store, config, registry=CollectorRegistry())
    assert analyzer.run(DAY1 + 2 * HOUR).ok
    drop = next(a for a in AlertBook(store).alerts() if a.kind.value == "presence_drop")
    onset = drop.to_json()["onset"]
    at = datetime.fromisoformat(onset["at"].replace("Z", "+00:00"))
    assert abs(at - drift_from) <= timedelta(minutes=5), onset
    assert onset["low"] <= onset["at"] <= onset["high"] and onset["method"].startswith("binomial change point")
    # The onset found when the alert opened is kept while it fires.
    write_outputs(store, outputs(300, drift=True), DAY1 + 2 * HOUR, HOUR, id_prefix="later")
    assert analyzer.run(DAY1 + 3 * HOUR).ok
    assert next(a for a in AlertBook(store).alerts() if a.kind.value == "presence_drop").to_json()["onset"] == onset


# --- incidents ----------------------------------------------------------------------------------


def test_page_alerts_of_a_cohort_open_one_incident_and_resolve_it_once(store: Store) -> None:
    target = Target("pd", TargetKind.webhook, "http://pager.test/")
    for grouping, incidents in ((Grouping.cohort, 1), (Grouping.field, 2)):
        with Store.open(store.path.with_name(f"{grouping.value}.duckdb"), schemas=SCHEMAS) as s:
            write_outputs(s, outputs(1200), DAY1 - 12 * HOUR, 12 * HOUR)
            freeze_baseline(s, COHORT, DAY1 - 12 * HOUR, DAY1, author="ana", note="reference", now=DAY1)
            config = replace_confirm(AnalyzerConfig(window=HOUR, oncall=OnCallConfig(grouping=grouping)))
            analyzer = Analyzer(s, config, registry=CollectorRegistry(), enqueue=pager_enqueue(s, [target], grouping))
            write_outputs(s, outputs(200, drift=True), DAY1, HOUR, id_prefix="drift")
            assert analyzer.run(DAY1 + HOUR).ok
            pages = [a for a in AlertBook(s).alerts() if a.severity.value == "page" and a.state is AlertState.firing]
            assert sorted(a.field for a in pages) == ["customer.tier", "language"]
            rows = s.pending_notifications(["pd"])
            assert len(rows) == incidents and {r[3] for r in rows} == {"trigger"}
            assert {a.incident_id for a in pages} == {r[1] for r in rows}
            open_ = s.incident_rows(open_only=True)
            assert len(open_) == incidents
            write_outputs(s, outputs(4000), DAY1 + HOUR, HOUR, id_prefix="fixed")
            assert analyzer.run(DAY1 + 2 * HOUR).ok and analyzer.run(DAY1 + 2 * HOUR + timedelta(minutes=5)).ok
            rows = s.pending_notifications(["pd"])
            assert sorted(r[3] for r in rows) == ["resolve"] * incidents + ["trigger"] * incidents
            assert s.incident_rows(open_only=True) == []


# --- served models and links ------------------------------------------------------------------------


def test_served_models_name_the_new_snapshot() -> None:
    assert served_models({"b": 30, "a": 70}, {"a": 100}) == {
        "window": [{"model": "a", "share": 0.7}, {"model": "b", "share": 0.3}],
        "baseline": [{"model": "a", "share": 1.0}],
        "new": ["b"],
    }
    assert served_models({}, {}) == {"window": [], "baseline": [], "new": []}


def test_the_dashboard_link_starts_before_the_onset() -> None:
    at = datetime(2026, 11, 29, 8, 12, 30, tzinfo=UTC)
    onset = {"at": "2026-11-29T03:10:00Z", "low": "2026-11-29T03:05:00Z", "high": "2026-11-29T03:15:00Z"}
    assert dashboard_link("https://sw.example", 7, "customer.tier", onset, at) == (
        "https://sw.example/field?cohort=7&field=customer.tier&since=2026-11-29T01%3A00%3A00Z"
        "&until=2026-11-29T08%3A13%3A00Z"
    )
    assert dashboard_link(None, 7, "x", onset, at) is None
    # A path with characters of a query is escaped, not injected.
    assert "field=a%26since%3Dx" in (dashboard_link("https://sw.example", 7, "a&since=x", None, at) or "")


# --- configuration --------------------------------------------------------------------------------


def test_oncall_config_is_read() -> None:
    config = parse_config(
        tomllib.loads(
            '[oncall]\ngrouping = "field"\nonset_lookback = "3d"\ndashboard_url = "https://sw.example/"\n'
            'service_url = "https://api.example"\ntraffic_period = "2h"\ntraffic_min_share = 0.2\n'
            '[contracts.intake]\nrunbook_url = "https://wiki.example/intake#drift"\n'
        )
    )
    assert config.oncall == OnCallConfig(
        Grouping.field, timedelta(days=3), "https://sw.example", "https://api.example", timedelta(hours=2), 0.2
    )
    assert config.runbook_urls == {"intake": "https://wiki.example/intake#drift"}
    assert AnalyzerConfig().oncall.traffic_period is None  # traffic_stopped is off until a period is set


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('[oncall]\ngrouping = "team"', "oncall.grouping: 'team' is not one of cohort, field"),
        ("[oncall]\ngroupings = 1", "oncall.groupings: unknown key; known keys are dashboard_url, grouping, "),
        ('[oncall]\nonset_lookback = "90d"', "oncall.onset_lookback: '90d' is longer than the limit of 31d"),
        ('[oncall]\nonset_lookback = "1m"', "oncall.onset_lookback: '1m' is shorter than 5m"),
        ("[oncall]\nonset_lookback = 7", 'oncall.onset_lookback: must be a duration string such as "7d"'),
        ('[oncall]\ntraffic_period = "30d"', "oncall.traffic_period: '30d' is longer than the limit of 7d"),
        ("[oncall]\ntraffic_min_share = 1.5", "oncall.traffic_min_share: 1.5 is out of range: a share from 0 to 1"),
        ("[oncall]\ntraffic_min_share = nan", "oncall.traffic_min_share: must be a number from 0 to 1, not 'nan'"),
        ('[oncall]\ndashboard_url = "javascript:alert(1)"', "oncall.dashboard_url: 'javascript:alert(1)' is not an"),
        ('[oncall]\ndashboard_url = "https://x.example/?a=1"', "oncall.dashboard_url: 'https://x.example/?a=1' is not"),
        ('[oncall]\nservice_url = "http://"', "oncall.service_url: 'http://' is not an http(s) URL"),
        ("[oncall]\ndashboard_url = 5", "oncall.dashboard_url: '5' is not an http(s) URL"),
        ('[oncall]\ndashboard_url = "https://' + "a" * 3000 + '"', "oncall.dashboard_url: 'https://aaaa"),
        ("oncall = 3", "oncall: must be a table"),
        (
            '[contracts.intake]\nrunbook_url = "file:///etc/passwd"',
            "contracts.intake.runbook_url: 'file:///etc/passwd'",
        ),
    ],
)
def test_oncall_config_errors_name_the_key(toml: str, message: str | None) -> None:
    if message is None:
        parse_config(tomllib.loads(toml))
        return
    with pytest.raises(ConfigInvalid) as err:
        parse_config(tomllib.loads(toml))
    assert str(err.value).startswith(message), str(err.value)
