"""Probe suites (issue 25, items 2 to 4): a 30-case suite (6 negative cases) run against real local
provider servers that replay recorded responses, in the OpenAI, Anthropic and Gemini shapes.

The scores are checked against a hand count; a degraded recording (the wrong tool on 3 cases, a
tool called on a negative case, a wrong argument on one) pages ``probe_tool_accuracy`` and
``probe_spurious_calls`` through the real analyzer, and the page lists the failed cases with the
expected and the actual decision. Real DuckDB files, real HTTP servers, the CLI in-process.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from probe_servers import SERVED, Decision, Recorder, provider_server

from shapewatch.analysis.alerts import ALERTS_SCHEMA
from shapewatch.analysis.analyzer import analyze_once
from shapewatch.analysis.cli import cli
from shapewatch.analysis.config import AnalyzerConfig
from shapewatch.analysis.probes import SuiteInvalid, load_suite, parse_suite, record_run, run_suite
from shapewatch.baselines import BASELINES_SCHEMA
from shapewatch.collector import Store
from shapewatch.collector.store import PROBES_SCHEMA

PV, CONTRACT = "support-v2", "support"
LOOKUPS, TICKETS, HELLOS = 12, 12, 6
ENV = {"SHAPEWATCH_CONFIG": None, "SHAPEWATCH_DB": None, "SHAPEWATCH_URL": None, "PROBE_KEY": "sk-test-123"}


def _q(s: str) -> str:
    return json.dumps(s)  # a JSON string literal is a TOML basic string here (ASCII, simple escapes)


def suite_toml(provider: str, base_url: str, **extra: Any) -> str:
    """The 30-case suite: 12 order lookups, 12 tickets (one_of, numeric tolerance, case-insensitive
    arguments), 6 greetings that must call no tool."""
    head = [
        'name = "support-tools"',
        f"provider = {_q(provider)}",
        f"model = {_q(SERVED[provider])}",
        f"prompt_version = {_q(PV)}",
        f"contract = {_q(CONTRACT)}",
        f"base_url = {_q(base_url)}",
        'api_key_env = "PROBE_KEY"',
        *(f"{k} = {json.dumps(v)}" for k, v in {"concurrency": 4, "rate_per_second": 200, **extra}.items()),
        "",
        "[[tools]]",
        'name = "lookup_order"',
        'description = "Find an order by its id"',
        'parameters = { type = "object", properties = { order_id = { type = "string" } }, required = ["order_id"] }',
        "",
        "[[tools]]",
        'name = "create_ticket"',
        'description = "Open a support ticket"',
        'parameters = { type = "object", properties = { priority = { type = "string" }, '
        'refund_amount = { type = "number" }, channel = { type = "string" } } }',
    ]
    cases = []
    for i in range(LOOKUPS):
        cases += [
            "",
            "[[cases]]",
            f'id = "lookup-{i:02d}"',
            f'messages = [{{ role = "system", content = "You are a support agent." }}, '
            f'{{ role = "user", content = "Where is my order A-{i}?" }}]',
            f'expect = {{ tool = "lookup_order", arguments = {{ order_id = "A-{i}" }} }}',
        ]
    for i in range(TICKETS):
        cases += [
            "",
            "[[cases]]",
            f'id = "ticket-{i:02d}"',
            f'messages = [{{ role = "user", content = "Refund {10 * i} dollars for broken item {i}, reply by email" }}]',
            'expect.tool = "create_ticket"',
            'expect.arguments.priority = { one_of = ["high", "urgent"] }',
            f"expect.arguments.refund_amount = {{ number = {10 * i}, tolerance = 0.01 }}",
            'expect.arguments.channel = { case_insensitive = "email" }',
        ]
    for i in range(HELLOS):
        cases += [
            "",
            "[[cases]]",
            f'id = "hello-{i:02d}"',
            f'messages = [{{ role = "user", content = "Hello there, just saying thanks {i}" }}]',
            "expect = { no_tool = true }",
        ]
    return "\n".join(head + cases) + "\n"


def recording(degraded: bool = False) -> dict[str, tuple[str, Decision]]:
    rec: dict[str, tuple[str, Decision]] = {}
    for i in range(LOOKUPS):
        wrong = degraded and i < 3  # the wrong tool on 3 cases
        decision: Decision = (
            ("create_ticket", {"priority": "high", "channel": "email"})
            if wrong
            else ("lookup_order", {"order_id": f"A-{i}"})
        )
        rec[f"Where is my order A-{i}?"] = (f"lookup-{i:02d}", decision)
    for i in range(TICKETS):
        priority = "low" if degraded and i == 5 else ("urgent" if i % 2 else "high")  # one wrong argument
        args = {"priority": priority, "refund_amount": 10 * i + 0.004, "channel": "EMAIL", "summary": f"item {i}"}
        rec[f"Refund {10 * i} dollars for broken item {i}, reply by email"] = (
            f"ticket-{i:02d}",
            ("create_ticket", args),
        )
    for i in range(HELLOS):
        spurious = degraded and i == 0  # a tool called on a negative case
        rec[f"Hello there, just saying thanks {i}"] = (
            f"hello-{i:02d}",
            ("lookup_order", {"order_id": "A-0"}) if spurious else None,
        )
    return rec


# The hand count: good recording, then the degraded one.
GOOD = {"tool_accuracy": (24, 24), "argument_accuracy": (24, 24), "spurious_calls": (0, 6)}
DEGRADED = {"tool_accuracy": (21, 24), "argument_accuracy": (20, 21), "spurious_calls": (1, 6)}


def scores_of(doc: dict[str, Any]) -> dict[str, tuple[int, int]]:
    return {k: (v["hits"], v["n"]) for k, v in doc["scores"].items()}


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROBE_KEY", "sk-test-123")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(tmp_path / "probes.duckdb", schemas=[BASELINES_SCHEMA, ALERTS_SCHEMA, PROBES_SCHEMA]) as s:
        yield s


def run_against(provider: str, rec: dict[str, tuple[str, Decision]], tmp_path: Path, **extra: Any) -> Any:
    recorder = Recorder(provider, rec)
    with provider_server(recorder) as url:
        path = tmp_path / f"{provider}.toml"
        path.write_text(suite_toml(provider, url, **extra))
        result = run_suite(load_suite(path), sleep=lambda s: None)
    return result, recorder


def test_the_degraded_recording_pages_tool_accuracy_and_spurious_calls_listing_the_failed_cases(
    store: Store, tmp_path: Path
) -> None:
    good, server = run_against("openai", recording(), tmp_path)
    assert scores_of(good.to_json()) == GOOD
    assert good.accepted and good.served_model == SERVED["openai"] and good.breaches() == []
    assert len(server.requests) == 30
    assert server.paths == ["/chat/completions"] * 30
    assert {h["authorization"] for h in server.headers} == {"Bearer sk-test-123"}
    assert {t["function"]["name"] for t in server.requests[0]["tools"]} == {"lookup_order", "create_ticket"}
    record_run(store, good)

    bad, _ = run_against("openai", recording(degraded=True), tmp_path)
    doc = bad.to_json()
    assert scores_of(doc) == DEGRADED
    assert doc["breaches"] == ["tool_accuracy", "spurious_calls"]
    assert {c["case"]: c["failed"] for c in doc["failed_cases"]} == {
        "lookup-00": ["tool_accuracy"],
        "lookup-01": ["tool_accuracy"],
        "lookup-02": ["tool_accuracy"],
        "ticket-05": ["argument_accuracy"],
        "hello-00": ["spurious_calls"],
    }
    written = record_run(store, bad)
    # every tool call became a source=probe envelope of the run, in the cohort of its tool
    assert written == {"envelopes": 25, "rejected": 0}
    assert dict(store.query("SELECT run_id, count(*) FROM events WHERE source = 'probe' GROUP BY ALL")) == {
        good.run_id: 24,
        bad.run_id: 25,
    }
    assert {(r.model, r.contract, r.source) for r in store.cohorts()} == {
        (SERVED["openai"], "lookup_order", "probe"),
        (SERVED["openai"], "create_ticket", "probe"),
    }

    at = bad.finished_at + timedelta(minutes=10)  # two evaluations after the run: a page is confirmed
    _, alerts = analyze_once(store, AnalyzerConfig(), at)
    found = {(a.kind.value, a.severity.value, a.state.value): a for a in alerts}
    assert set(found) == {("probe_tool_accuracy", "page", "firing"), ("probe_spurious_calls", "page", "firing")}
    tool = found[("probe_tool_accuracy", "page", "firing")].to_json()
    assert tool["cohort"] == {"model": SERVED["openai"], "prompt_version": PV, "contract": CONTRACT, "source": "probe"}
    assert tool["field"] == "probe:support-tools"
    assert tool["current"]["failed_cases"] == [
        {
            "case": f"lookup-0{i}",
            "expected": {"tool": "lookup_order", "arguments": {"order_id": {"exact": f"A-{i}"}}},
            "actual": {"tool": "create_ticket", "arguments": {"priority": "high", "channel": "email"}},
        }
        for i in range(3)
    ]
    assert tool["baseline"]["previous_run"] == good.run_id
    assert "support-tools: tool accuracy 87.5% (21/24), under the threshold 95%" in tool["detail"]
    assert "lookup-00: expected lookup_order" in tool["detail"] and "got create_ticket" in tool["detail"]
    spurious = found[("probe_spurious_calls", "page", "firing")].to_json()
    assert [c["case"] for c in spurious["current"]["failed_cases"]] == ["hello-00"]
    assert spurious["current"]["failed_cases"][0]["expected"] == {"tool": None, "arguments": {}}


@pytest.mark.parametrize("provider", ["anthropic", "gemini"])
def test_anthropic_and_gemini_shaped_servers_score_the_same(provider: str, tmp_path: Path) -> None:
    good, server = run_against(provider, recording(), tmp_path)
    assert scores_of(good.to_json()) == GOOD and good.served_model == SERVED[provider]
    bad, _ = run_against(provider, recording(degraded=True), tmp_path)
    assert scores_of(bad.to_json()) == DEGRADED
    assert bad.breaches() == ["tool_accuracy", "spurious_calls"]
    if provider == "anthropic":
        assert set(server.paths) == {"/v1/messages"}
        assert {h["x-api-key"] for h in server.headers} == {"sk-test-123"}
        first = server.requests[0]
        assert first["system"] == "You are a support agent." or "system" not in first
        assert {t["name"] for t in first["tools"]} == {"lookup_order", "create_ticket"}
    else:
        assert set(server.paths) == {f"/v1beta/models/{SERVED['gemini']}:generateContent"}
        assert {h["x-goog-api-key"] for h in server.headers} == {"sk-test-123"}
        names = {d["name"] for d in server.requests[0]["tools"][0]["functionDeclarations"]}
        assert names == {"lookup_order", "create_ticket"}


def test_429_and_503_are_retried_honouring_retry_after(tmp_path: Path) -> None:
    recorder = Recorder("openai", recording(), fail_first={"lookup-04": (429, "7"), "hello-01": (503, None)})
    slept: list[float] = []
    with provider_server(recorder) as url:
        path = tmp_path / "s.toml"
        path.write_text(suite_toml("openai", url, concurrency=1))
        result = run_suite(load_suite(path), sleep=slept.append, backoff_seconds=0.5)
    assert scores_of(result.to_json()) == GOOD and result.accepted
    assert len(recorder.requests) == 32
    assert 7.0 in slept  # Retry-After: 7
    assert 0.5 in slept  # the first exponential backoff step of the 503


def test_a_case_without_an_answer_is_listed_and_counted_in_no_score(tmp_path: Path) -> None:
    recorder = Recorder("openai", recording(), fail_first={"lookup-04": (500, None)})
    with provider_server(recorder) as url:
        path = tmp_path / "s.toml"
        path.write_text(suite_toml("openai", url, max_attempts=1))
        result = run_suite(load_suite(path), sleep=lambda s: None)
    doc = result.to_json()
    assert not doc["accepted"] and doc["errors"] == 1
    assert scores_of(doc)["tool_accuracy"] == (23, 23)
    assert [(c["case"], c["error"]) for c in doc["failed_cases"]] == [("lookup-04", "the provider answered 500")]


def test_probe_run_cli_records_the_run_and_exits_1_on_a_breach(tmp_path: Path) -> None:
    db = tmp_path / "cli.duckdb"
    recorder = Recorder("openai", recording(degraded=True))
    with provider_server(recorder) as url:
        path = tmp_path / "suite.toml"
        path.write_text(suite_toml("openai", url))
        runner = CliRunner(env=ENV)
        table = runner.invoke(cli, ["probe", "run", str(path), "--db", str(db)], prog_name="shapewatch")
        as_json = runner.invoke(cli, ["probe", "run", str(path), "--db", str(db), "--format", "json"])
    assert table.exit_code == 1, table.output
    assert "tool_accuracy        87.5%  (21/24; wanted >= 95%)  BREACH" in table.stdout
    assert "lookup-00: tool_accuracy" in table.stdout
    assert "expected lookup_order" in table.stdout and "actual   create_ticket" in table.stdout
    assert as_json.exit_code == 1
    assert scores_of(json.loads(as_json.stdout)) == DEGRADED
    with Store.open(db, schemas=[PROBES_SCHEMA]) as s:
        runs = s.probe_runs()
        assert [(r.suite, r.cases, r.accepted) for r in runs] == [("support-tools", 30, True)] * 2
        assert len(s.probe_results(runs[0].run_id)) == 30


_BASE = {
    "name": "s",
    "provider": "openai",
    "model": "gpt-4o-2024-08-06",
    "prompt_version": "p",
    "contract": "c",
    "tools": [{"name": "t", "parameters": {"type": "object"}}],
    "cases": [{"id": "a", "messages": [{"role": "user", "content": "hi"}], "expect": {"tool": "t"}}],
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model": "gpt-4o"}, "model: 'gpt-4o' is an alias (no dated snapshot)"),
        ({"provider": "cohere"}, "provider: 'cohere' is not one of openai, anthropic, gemini, command"),
        ({"temperature": 0}, "temperature: unknown key"),
        ({"cases": []}, "cases: has 0 entries; 1 to 500 are allowed"),
        ({"cases": [_BASE["cases"][0]] * 501}, "cases: has 501 entries; 1 to 500 are allowed"),
        ({"cases": [_BASE["cases"][0]] * 2}, "cases: two cases share the id 'a'"),
        ({"cases": [{"id": "a", "messages": [{"role": "user", "content": "x"}], "expect": {"tool": "nope"}}]},
         "cases[0].expect.tool: 'nope' is not a tool of the suite (t)"),
        ({"cases": [{"id": "a", "messages": [{"role": "robot", "content": "x"}]}]},
         "cases[0].messages[0].role: 'robot' is not one of system, user, assistant"),
        ({"cases": [{"id": "a", "messages": [{"role": "user", "content": "x"}],
                     "expect": {"tool": "t", "arguments": {"k": {"number": "ten"}}}}]},
         "cases[0].expect.arguments.k.number: must be a number"),
        ({"cases": [{"id": "a", "messages": [{"role": "user", "content": "x"}],
                     "expect": {"tool": "t", "arguments": {"k": {"exact": 1, "one_of": [1]}}}}]},
         "cases[0].expect.arguments.k: must hold one rule"),
        ({"cases": [{"id": "a", "messages": [{"role": "user", "content": "x"}], "expect": {"no_tool": True, "tool": "t"}}]},
         "cases[0].expect: no_tool = true takes no tool"),
        ({"concurrency": 0}, "concurrency: 0 is out of range; 1 to 32"),
        ({"rate_per_second": float("inf")}, "rate_per_second: inf is out of range"),
        ({"api_key_env": "sk-live-123"}, "api_key_env: must name an environment variable"),
        ({"base_url": "file:///etc/passwd"}, "base_url: must be an http:// or https:// URL"),
        ({"thresholds": {"tool_accuracy": 1.5}}, "thresholds.tool_accuracy: 1.5 is out of range; 0 to 1"),
        ({"contract": "t"}, "contract: 't' is also a tool's name"),
        ({"provider": "command"}, "command: must be the program and its arguments"),
    ],
)  # fmt: skip
def test_hostile_suites_are_refused_naming_the_key(change: dict[str, Any], message: str) -> None:
    with pytest.raises(SuiteInvalid) as err:
        parse_suite({**_BASE, **change})
    assert message in str(err.value)


def test_an_alias_is_run_when_marked_and_files_are_bounded(tmp_path: Path) -> None:
    assert parse_suite({**_BASE, "model": "gpt-4o", "allow_alias": True}).model == "gpt-4o"
    huge = tmp_path / "huge.toml"
    huge.write_text("# " + "x" * (1 << 20) + "\n")
    with pytest.raises(SuiteInvalid, match="bytes; a suite is at most 1048576"):
        load_suite(huge)
    broken = tmp_path / "broken.toml"
    broken.write_text('name = "s\n')
    with pytest.raises(SuiteInvalid, match="is not valid TOML"):
        load_suite(broken)


def test_the_command_provider_reads_the_raw_response_from_the_program(tmp_path: Path) -> None:
    script = tmp_path / "answer.py"
    script.write_text(
        "import json, sys\n"
        "case = json.load(sys.stdin)\n"
        "tool = 'lookup_order' if 'order' in case['messages'][-1]['content'] else None\n"
        "msg = {'role': 'assistant', 'content': 'hi'} if tool is None else {'role': 'assistant', 'content': None,\n"
        "  'tool_calls': [{'id': 'c1', 'type': 'function', 'function': {'name': tool, 'arguments': '{\"order_id\": \"A-1\"}'}}]}\n"
        "print(json.dumps({'id': 'x-' + case['case'], 'object': 'chat.completion', 'model': case['model'],\n"
        "  'choices': [{'index': 0, 'message': msg, 'finish_reason': 'stop'}]}))\n"
    )
    import sys

    suite = parse_suite(
        {
            **_BASE,
            "provider": "command",
            "command": [sys.executable, str(script)],
            "tools": [{"name": "lookup_order", "parameters": {"type": "object"}}],
            "cases": [
                {"id": "o", "messages": [{"role": "user", "content": "my order?"}],
                 "expect": {"tool": "lookup_order", "arguments": {"order_id": "A-1"}}},
                {"id": "h", "messages": [{"role": "user", "content": "hello"}], "expect": {"no_tool": True}},
            ],
        }
    )  # fmt: skip
    result = run_suite(suite, sleep=lambda s: None)
    assert scores_of(result.to_json()) == {
        "tool_accuracy": (1, 1),
        "argument_accuracy": (1, 1),
        "spurious_calls": (0, 1),
    }
    assert result.served_model == "gpt-4o-2024-08-06"


def test_an_accepted_mined_case_exports_a_suite_case_that_probe_run_runs(tmp_path: Path) -> None:
    from shapewatch.analysis.probes.suite import suite_case, suite_case_toml

    mined = {  # a probe case as the review queue makes it (analysis/cases.py)
        "id": "case-12",
        "contract": "booking",
        "prompt_version": "booking-v2",
        "model": "gpt-4o",
        "messages": [
            {"role": "system", "parts": [{"type": "text", "content": "You book trips."}]},
            {"role": "user", "parts": [{"type": "text", "content": "Is my booking A1 confirmed?"}]},
            {"role": "tool", "parts": [{"type": "tool_call_response", "response": "{}"}]},
        ],
        "expect": {"tool": "get_reservation", "arguments": {"id": "A1", "note": None}},
        "observed": {"tool": "get_reservation", "arguments": {"id": "A1"}},
    }
    case = suite_case(mined)
    assert case == {
        "id": "case-12",
        "messages": [
            {"role": "system", "content": "You book trips."},
            {"role": "user", "content": "Is my booking A1 confirmed?"},
        ],
        "expect": {"tool": "get_reservation", "arguments": {"id": {"exact": "A1"}}},
    }
    assert suite_case({**mined, "messages": None}) is None  # content capture was off: nothing to replay
    recorder = Recorder("openai", {"Is my booking A1 confirmed?": ("case-12", ("get_reservation", {"id": "A1"}))})
    with provider_server(recorder) as url:
        path = tmp_path / "mined.toml"
        path.write_text(
            "\n".join(
                [
                    'name = "mined"',
                    'provider = "openai"',
                    'model = "gpt-4o-2024-08-06"',
                    'prompt_version = "booking-v2"',
                    'contract = "booking-out"',
                    f"base_url = {_q(url)}",
                    "",
                    "[[tools]]",
                    'name = "get_reservation"',
                    "",
                    suite_case_toml(case),
                ]
            )
        )
        result = CliRunner(env=ENV).invoke(
            cli, ["probe", "run", str(path), "--db", str(tmp_path / "m.duckdb"), "--format", "json"]
        )
    assert result.exit_code == 0, result.output
    assert scores_of(json.loads(result.stdout)) == {
        "tool_accuracy": (1, 1),
        "argument_accuracy": (1, 1),
        "spurious_calls": (0, 0),
    }


def test_the_readme_suite_example_is_a_valid_complete_suite() -> None:
    import re
    import tomllib

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## Probes and shadows", 1)[1]
    block = next(b for b in re.findall(r"```toml\n(.*?)```", section, re.S) if "[[cases]]" in b)
    suite = parse_suite(tomllib.loads(block))
    assert (suite.name, suite.model, suite.alias, len(suite.cases)) == (
        "support-tools",
        "gpt-4o-2024-08-06",
        "gpt-4o",
        3,
    )
    assert [c.negative for c in suite.cases] == [False, False, True]
    refund = suite.cases[1].expect
    assert refund is not None and {k: m.rule for k, m in refund.arguments.items()} == {
        "priority": "one_of",
        "refund_amount": "number",
        "channel": "case_insensitive",
    }
