"""``shapewatch contract``: diff exit codes through the real CLI, and the registry over a real DuckDB file.

The exit codes are what gate a pull request, so they are checked on a real
subprocess; the rest runs in-process through click's ``CliRunner``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from harness import ROOT, SHAPEWATCH, start_service

from shapewatch.analysis.cli import cli

FIXTURES = ROOT / "tests" / "collector" / "fixtures" / "contracts"
INTAKE = FIXTURES / "intake_v1.json"


def shapewatch(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHAPEWATCH_")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([*SHAPEWATCH, "contract", *args], capture_output=True, text=True, env=env, timeout=120)


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, ["contract", *args], env={"SHAPEWATCH_AUTHOR": "ana", "SHAPEWATCH_CONFIG": None})


def write(tmp_path: Path, name: str, doc: Any) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def intake() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(INTAKE.read_text())
    return doc


# --- diff: the three exit codes on the real command ----------------------------------------


def test_exit_0_when_only_keys_and_set_orders_moved() -> None:
    done = shapewatch("diff", str(INTAKE), str(FIXTURES / "intake_v1_reordered.json"))
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == (
        "no changes (key order and the order of required, enum, type and anyOf/oneOf do not "
        "count)\nverdict: unchanged (exit 0)\n"
    )


def test_exit_1_on_description_only_edits(tmp_path: Path) -> None:
    new = intake()
    new["properties"]["intent"]["description"] = "The customer's one request."
    done = shapewatch("diff", str(INTAKE), write(tmp_path, "new.json", new), "--format", "json")
    assert (done.returncode, done.stderr) == (1, "")
    assert json.loads(done.stdout) == {
        "old": str(INTAKE),
        "new": str(tmp_path / "new.json"),
        "verdict": "behavioral",
        "exit_code": 1,
        "counts": {"breaking": 0, "behavioral": 1, "compatible": 0},
        "changes": [
            {
                "tool": None,
                "path": "intent",
                "kind": "description_changed",
                "classification": "behavioral",
                "detail": "description changed",
            }
        ],
    }


def test_exit_2_on_a_catalog_with_a_tool_removed() -> None:
    done = shapewatch("diff", str(FIXTURES / "openai_tools_v1.json"), str(FIXTURES / "openai_tools_v2.json"))
    assert (done.returncode, done.stderr) == (2, "")
    assert done.stdout == (
        "breaking (1):\n"
        "  cancel_order  tool_removed                  tool removed\n"
        "behavioral (1):\n"
        "  refund_order  tool_added                    tool added\n"
        "verdict: breaking (exit 2)\n"
    )


# --- diff in-process -----------------------------------------------------------------------


def test_compatible_changes_exit_0_and_text_groups_by_classification(tmp_path: Path) -> None:
    new = intake()
    new["properties"]["priority"]["enum"].append("urgent")
    new["properties"]["channel"] = {"type": "string"}
    result = run("diff", str(INTAKE), write(tmp_path, "new.json", new))
    assert result.exit_code == 0
    assert result.output == (
        "compatible (2):\n"
        "  channel   field_added                   optional field added\n"
        '  priority  enum_value_added              enum value "urgent" added\n'
        "verdict: compatible (exit 0)\n"
    )


def test_breaking_nested_changes_with_behavioral_ones(tmp_path: Path) -> None:
    new = intake()
    new["$defs"]["entity"]["properties"]["type"]["enum"].remove("date")
    new["properties"]["customer"]["required"].append("email")
    new["description"] = "Another description."
    result = run("diff", str(INTAKE), write(tmp_path, "new.json", new), "--format", "json")
    assert result.exit_code == 2
    out = json.loads(result.output)
    assert (out["verdict"], out["counts"]) == ("breaking", {"breaking": 2, "behavioral": 1, "compatible": 0})
    assert [(c["path"], c["kind"], c["classification"]) for c in out["changes"]] == [
        (None, "description_changed", "behavioral"),
        ("customer.email", "required_added", "breaking"),
        ("entities[].type", "enum_value_removed", "breaking"),
    ]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "error: {path}: cannot read the file (No such file or directory)\n"),
        (
            '{"type": "object", "properties": {"a": {"type": "strng"}}}',
            "error: {path}: not a valid Draft 2020-12 JSON Schema at /properties/a/type: 'strng' is not valid under any "
            "of the given schemas\n",
        ),
        (
            '{"name": "lookup", "description": "Look a customer up."}',
            "error: {path}: tool 'lookup' has no schema (expected parameters, input_schema or inputSchema holding its JSON "
            "Schema)\n",
        ),
    ],
)
def test_unusable_inputs_exit_2_with_one_line(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_text(content)
    result = run("diff", str(INTAKE), str(path))
    assert result.exit_code == 2
    assert result.output == message.format(path=path)


# --- the registry --------------------------------------------------------------------------


def test_register_list_show_and_diff_against_a_registered_version(tmp_path: Path) -> None:
    db = str(tmp_path / "sw.duckdb")
    first = run("register", "--contract", "intake", "--version", "3", str(INTAKE), "--db", db, "--note", "v3")
    assert first.exit_code == 0, first.output
    lines = first.output.splitlines()
    assert lines[0] == "registered: intake version 3: json_schema"
    invocation = lines[1].split()[-1]

    again = run("register", "--contract", "intake", "--version", "3", str(INTAKE), "--db", db, "--format", "json")
    assert again.exit_code == 0
    summary = json.loads(again.output)
    assert (summary["created"], summary["invocation_hash"], summary["note"], summary["author"]) == (
        False,
        invocation,
        "v3",
        "ana",
    )

    changed = intake()
    changed["properties"]["summary"]["maxLength"] = 200
    refused = run("register", "--contract", "intake", "--version", "3", write(tmp_path, "v4.json", changed), "--db", db)
    assert refused.exit_code == 2
    assert refused.output.startswith(
        "error: contract 'intake' version '3' is already registered with different content"
    )

    assert (
        run("register", "--contract", "intake", "--version", "4", str(tmp_path / "v4.json"), "--db", db).exit_code == 0
    )
    weather = run(
        "register", "--contract", "weather", "--version", "1", str(FIXTURES / "mcp_get_weather.json"), "--db", db
    )
    assert weather.output.splitlines()[0] == "registered: weather version 1: mcp_tool 'get_weather'"

    listed = run("list", "--db", db, "--format", "json")
    assert listed.exit_code == 0
    assert [(r["contract"], r["version"], r["tools"]) for r in json.loads(listed.output)] == [
        ("intake", "3", [None]),
        ("intake", "4", [None]),
        ("weather", "1", ["get_weather"]),
    ]
    assert [
        r["version"] for r in json.loads(run("list", "--db", db, "--contract", "intake", "--format", "json").output)
    ] == ["3", "4"]

    shown = run("show", "intake", "3", "--db", db)
    assert shown.exit_code == 0
    doc = json.loads(shown.output)
    assert (doc["invocation_hash"], doc["document"]) == (invocation, intake())
    missing = run("show", "intake", "9", "--db", db)
    assert (missing.exit_code, missing.output) == (2, "error: no contract 'intake' version '9' is registered\n")

    gate = run("diff", "--db", db, "intake@3", "intake@4", "--format", "json")
    assert gate.exit_code == 2
    assert json.loads(gate.output)["changes"] == [
        {
            "tool": None,
            "path": "summary",
            "kind": "bound_tightened",
            "classification": "breaking",
            "detail": "maxLength 500 -> 200",
        }
    ]


def test_listing_a_database_that_does_not_exist_is_an_input_error(tmp_path: Path) -> None:
    result = run("list", "--db", str(tmp_path / "none.duckdb"))
    assert (result.exit_code, result.output) == (
        2,
        f"error: database {tmp_path / 'none.duckdb'} does not exist "
        "(check --db; `shapewatch serve` or `shapewatch ingest` create "
        "it)\n",
    )
    assert not (tmp_path / "none.duckdb").exists()


@pytest.mark.slow
def test_register_list_show_and_diff_through_a_running_service_with_scoped_tokens(tmp_path: Path) -> None:
    # The service holds the database: the CLI goes through POST/GET /v1/contracts (--url), and a
    # token without the admin scope may read the registry but not write it.
    svc = start_service(tmp_path / "svc.duckdb", env={"SHAPEWATCH_TOKENS": "read:r3ad,read+admin:adm1n"})
    try:

        def cli_(*args: str, token: str) -> subprocess.CompletedProcess[str]:
            return shapewatch(*args, "--url", svc.url, "--token", token)

        refused = cli_("register", "--contract", "intake", "--version", "1", str(INTAKE), token="r3ad")
        assert refused.returncode == 2 and "403" in refused.stderr and "admin" in refused.stderr
        done = cli_(
            "register", "--contract", "intake", "--version", "1", str(INTAKE), "--format", "json", token="adm1n"
        )
        assert done.returncode == 0, done.stderr
        first = json.loads(done.stdout)
        assert (first["contract"], first["version"], first["created"]) == ("intake", "1", True)
        again = json.loads(
            cli_(
                "register", "--contract", "intake", "--version", "1", str(INTAKE), "--format", "json", token="adm1n"
            ).stdout
        )
        assert {**again, "created": True} == first  # the same content again: a no-op
        changed = write(tmp_path, "v2.json", {**intake(), "required": [*intake().get("required", []), "extra"]})
        conflict = cli_("register", "--contract", "intake", "--version", "1", changed, token="adm1n")
        assert conflict.returncode == 2 and "409" in conflict.stderr and "already registered" in conflict.stderr
        listed = json.loads(cli_("list", "--format", "json", token="r3ad").stdout)
        assert [(c["contract"], c["version"], c["invocation_hash"]) for c in listed] == [
            ("intake", "1", first["invocation_hash"])
        ]
        shown = json.loads(cli_("show", "intake", "1", token="r3ad").stdout)
        assert shown["document"] == json.loads(INTAKE.read_text())
        # a registered version is a diff side by NAME@VERSION
        gate = cli_("diff", "intake@1", changed, token="r3ad")
        assert gate.returncode == 2, gate.stdout + gate.stderr
        assert "breaking" in gate.stdout
    finally:
        svc.stop()
