"""When the service runs probe suites (issue 25, item 2): daily, and within one scheduler tick
after a served-model change behind the suite's alias is recorded or a behavioral or breaking
contract version is registered.

A real local OpenAI-shaped server replays recorded responses; the scheduler is the real
APScheduler in one test, and its tick is called directly in the others to show which tick runs what.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from apscheduler.schedulers.background import BackgroundScheduler
from probe_servers import Recorder, provider_server

from shapewatch.analysis.alerts import ALERTS_SCHEMA
from shapewatch.analysis.config import parse_config
from shapewatch.analysis.errors import ConfigInvalid
from shapewatch.analysis.probes import parse_suite
from shapewatch.analysis.probes.schedule import ProbeScheduler
from shapewatch.baselines import BASELINES_SCHEMA
from shapewatch.collector import Store, register_contract
from shapewatch.collector.store import PROBES_SCHEMA

ALIAS, PINNED, NEXT = "gpt-4o", "gpt-4o-2024-08-06", "gpt-4o-2024-11-20"
PV, CONTRACT = "support-v2", "support"


def suite_doc(url: str) -> dict[str, object]:
    return {
        "name": "support-tools",
        "provider": "openai",
        "model": PINNED,
        "alias": ALIAS,
        "prompt_version": PV,
        "contract": CONTRACT,
        "base_url": url,
        "rate_per_second": 100,
        "tools": [{"name": "lookup_order", "parameters": {"type": "object"}}],
        "cases": [
            {
                "id": "o",
                "messages": [{"role": "user", "content": "Where is A-1?"}],
                "expect": {"tool": "lookup_order", "arguments": {"order_id": "A-1"}},
            },
            {"id": "h", "messages": [{"role": "user", "content": "hi"}], "expect": {"no_tool": True}},
        ],
    }


RECORDING = {"Where is A-1?": ("o", ("lookup_order", {"order_id": "A-1"})), "hi": ("h", None)}
SCHEMA_V1 = {"type": "object", "properties": {"intent": {"type": "string"}}, "required": ["intent"]}
SCHEMA_V2 = {  # adds an optional field: compatible
    "type": "object",
    "properties": {"intent": {"type": "string"}, "note": {"type": "string"}},
    "required": ["intent"],
}
SCHEMA_V3 = {  # intent becomes an integer: breaking
    "type": "object",
    "properties": {"intent": {"type": "integer"}, "note": {"type": "string"}},
    "required": ["intent"],
}


@pytest.fixture
def server() -> Iterator[tuple[str, Recorder]]:
    recorder = Recorder("openai", RECORDING)
    with provider_server(recorder) as url:
        yield url, recorder


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(tmp_path / "s.duckdb", schemas=[BASELINES_SCHEMA, ALERTS_SCHEMA, PROBES_SCHEMA]) as s:
        yield s


def record_alias_move(store: Store, current: str) -> None:
    with store.transaction("an alias moved") as con:
        store.add_served_model_changes(con, [(ALIAS, PV, CONTRACT, PINNED, current)], datetime.now(UTC))


def test_each_trigger_runs_the_suite_at_the_next_tick_and_only_then(store: Store, server: tuple[str, Recorder]) -> None:
    url, recorder = server
    register_contract(store, CONTRACT, "1", SCHEMA_V1)  # there before the scheduler: not a trigger
    scheduler = ProbeScheduler(store, [parse_suite(suite_doc(url))], interval=timedelta(days=1))
    triggers = lambda: [r.trigger for r in reversed(store.probe_runs())]  # noqa: E731
    assert [r.trigger for r in scheduler.tick()] == ["schedule"]  # never ran: due
    assert scheduler.tick() == []  # ran a moment ago: not due for a day

    record_alias_move(store, NEXT)
    assert [r.trigger for r in scheduler.tick()] == ["served_model_change"]
    assert scheduler.tick() == []

    register_contract(store, CONTRACT, "2", SCHEMA_V2)  # compatible: no run
    assert scheduler.tick() == []
    register_contract(store, CONTRACT, "3", SCHEMA_V3)  # breaking
    assert [r.trigger for r in scheduler.tick()] == ["contract_change"]
    assert scheduler.tick() == []

    record_alias_move(store, "gpt-4o-2025-01-01")  # behind another alias of no suite: still this one's
    assert triggers() == ["schedule", "served_model_change", "contract_change"]
    assert len(recorder.requests) == 6  # three runs of two cases
    runs = store.probe_runs()
    assert all(r.accepted and r.cases == 2 for r in runs)

    # a restart reads the last run: nothing is due
    again = ProbeScheduler(store, [parse_suite(suite_doc(url))], interval=timedelta(days=1))
    assert again.tick() == []


def test_a_change_behind_an_unrelated_model_triggers_nothing(store: Store, server: tuple[str, Recorder]) -> None:
    url, _ = server
    scheduler = ProbeScheduler(store, [parse_suite(suite_doc(url))], interval=timedelta(days=1))
    scheduler.tick()
    with store.transaction("another alias moved") as con:
        store.add_served_model_changes(con, [("claude-sonnet-4-5", PV, CONTRACT, "a", "b")], datetime.now(UTC))
    register_contract(store, "other-contract", "1", SCHEMA_V1)
    register_contract(store, "other-contract", "2", SCHEMA_V3)
    assert scheduler.tick() == []


def test_the_real_scheduler_runs_the_suite_within_one_tick_of_an_alias_move(
    store: Store, server: tuple[str, Recorder]
) -> None:
    url, _ = server
    probes = ProbeScheduler(store, [parse_suite(suite_doc(url))], interval=timedelta(days=1))
    probes.tick()  # the daily run, done
    scheduler = BackgroundScheduler(timezone=UTC)
    scheduler.add_job(probes.tick, "interval", seconds=0.2, id="probes", max_instances=1, coalesce=True)
    scheduler.start()
    try:
        record_alias_move(store, NEXT)
        moved_at = time.monotonic()
        deadline = moved_at + 30
        while not any(r.trigger == "served_model_change" for r in probes.runs):
            assert time.monotonic() < deadline, "the suite did not run after the alias moved"
            time.sleep(0.05)  # polling the scheduler's thread with a deadline
    finally:
        scheduler.shutdown(wait=True)
    assert [r.trigger for r in probes.runs] == ["schedule", "served_model_change"]
    assert probes.failures == 0


def test_the_probes_table_is_read_and_hostile_values_are_refused_by_key() -> None:
    config = parse_config({"probes": {"suites": ["probes/a.toml"], "interval": "12h", "tick": "30s"}})
    assert (config.probe_suites, config.probe_interval, config.probe_tick) == (
        ("probes/a.toml",),
        timedelta(hours=12),
        timedelta(seconds=30),
    )
    for table, message in [
        ({"probes": {"suites": "a.toml"}}, "probes.suites: must be an array of suite file paths"),
        ({"probes": {"suites": [1]}}, "probes.suites: must be an array of suite file paths"),
        ({"probes": {"suites": ["x"] * 101}}, "probes.suites: 101 suites; at most 100"),
        ({"probes": {"interval": "1m"}}, "probes.interval"),
        ({"probes": {"interval": 3}}, 'probes.interval: must be a duration string such as "24h"'),
        ({"probes": {"every": "1h"}}, "probes.every: unknown key"),
    ]:
        with pytest.raises(ConfigInvalid) as err:
            parse_config(table)
        assert message in str(err.value), table


def test_the_service_refuses_to_start_with_a_suite_it_cannot_read(tmp_path: Path) -> None:
    import dataclasses

    from prometheus_client import CollectorRegistry

    from shapewatch.analysis.service import create_app
    from shapewatch.collector import Settings

    bad = tmp_path / "bad.toml"
    bad.write_text('name = "s"\nprovider = "openai"\nmodel = "gpt-4o"\nprompt_version = "p"\ncontract = "c"\n'
                   'cases = [{ id = "a", messages = [{ role = "user", content = "x" }] }]\n')  # fmt: skip
    config = parse_config({"probes": {"suites": [str(bad)]}})
    with pytest.raises(ConfigInvalid) as err:
        create_app(
            dataclasses.replace(Settings(), db_path=tmp_path / "svc.duckdb"),
            config=config,
            registry=CollectorRegistry(),
        )
    assert f"probes.suites ({bad})" in str(err.value) and "is an alias" in str(err.value)
    assert not (tmp_path / "svc.duckdb").exists()  # refused before the file was opened
