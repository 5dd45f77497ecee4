"""A registered contract can never stall ingestion or reach outside the machine.

Linear-time patterns (RE2), references resolved inside the document only, checks run after the
acknowledgement (where rollups are merged), a time limit per output and per contract version.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from harness import ROOT, SHAPEWATCH, SchemaServer, make_envelope, start_service

from shapewatch.collector import RollupConfig, Store
from shapewatch.collector.contracts import ContractInvalid, ContractValidator, contract_from_document, register_contract
from shapewatch.collector.envelope import LIMITS, parse_envelope
from shapewatch.collector.rollup import ContractStatus, RollupBatch

T0 = datetime(2026, 11, 29, 12, tzinfo=UTC)
BACKTRACKING = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^(a+)+$"}}}


@pytest.fixture
def schema_server() -> Iterator[SchemaServer]:
    with SchemaServer() as server:
        yield server


@pytest.mark.parametrize(
    "ref",
    [
        "{url}/tier.json",
        "{url}/tier.json#/x",
        "file:///etc/passwd",
        "tier.json",
        "#/$defs/missing",
        "#/properties/nope",
    ],
)
def test_registration_refuses_a_reference_outside_the_document(
    store: Store, schema_server: SchemaServer, ref: str
) -> None:
    ref = ref.format(url=schema_server.url)
    doc = {"type": "object", "$defs": {"tier": {"enum": ["gold"]}}, "properties": {"tier": {"$ref": ref}}}
    with pytest.raises(ContractInvalid) as caught:
        register_contract(store, "intake", "1", doc)
    assert str(caught.value) == (
        f"contract 'intake' version '1': the reference {ref!r} at /properties/tier/$ref does not resolve inside "
        "the document; references to other documents (http, file, ...) are never fetched: inline the schema "
        "under $defs and refer to it as #/$defs/..."
    )
    assert schema_server.hits == []
    assert store.query("SELECT count(*) FROM contract_versions") == [(0,)]


def test_references_inside_the_document_register_and_check(store: Store) -> None:
    doc = {
        "$id": "https://example.test/intake",
        "type": "object",
        "$defs": {
            "tier": {"enum": ["gold", "free"]},
            "named": {"$id": "https://example.test/named", "type": "string", "minLength": 2},
            "anchored": {"$anchor": "prio", "enum": ["low", "high"]},
        },
        "properties": {
            "tier": {"$ref": "#/$defs/tier"},
            "name": {"$ref": "https://example.test/named"},
            "priority": {"$ref": "#prio"},
            "alias": {"$ref": "named"},
        },
    }
    registered, created = register_contract(store, "intake", "1", doc)
    assert created
    v = registered.validator()
    assert v.violations({"tier": "gold", "name": "ab", "priority": "low", "alias": "cd"}) == []
    assert [tuple(x) for x in v.violations({"tier": "x", "name": "a", "priority": "urgent", "alias": 3})] == [
        ("alias", "type"),
        ("name", "minLength"),
        ("priority", "enum"),
        ("tier", "enum"),
    ]


@pytest.mark.parametrize(
    ("where", "schema", "pattern", "reason"),
    [
        (
            "/properties/a/pattern",
            {"properties": {"a": {"pattern": "(a)\\1"}}},
            "(a)\\1",
            "invalid escape sequence: \\1",
        ),
        ("/properties/a/pattern", {"properties": {"a": {"pattern": "^(?=x)"}}}, "^(?=x)", "invalid perl operator: (?="),
        ("/patternProperties/(?!x)", {"patternProperties": {"(?!x)": {}}}, "(?!x)", "invalid perl operator: (?!"),
    ],
)
def test_registration_refuses_a_pattern_without_a_linear_time_engine(
    store: Store, where: str, schema: Any, pattern: str, reason: str
) -> None:
    with pytest.raises(ContractInvalid) as caught:
        register_contract(store, "intake", "1", {"type": "object", **schema})
    assert str(caught.value) == (
        f"contract 'intake' version '1': the pattern {pattern!r} at {where} cannot be checked in linear time "
        f"({reason}); patterns run on RE2, which has no backreferences or lookaround"
    )


def test_a_backtracking_pattern_is_checked_in_linear_time() -> None:
    # Python's re takes about 2**n steps for `^(a+)+$` against n a's and a "!": at 5,000 this
    # would never end. Run in a child so that a regression fails on the deadline, not hangs CI.
    script = textwrap.dedent("""
        from shapewatch.collector.contracts import ContractValidator, contract_from_document
        v = ContractValidator(contract_from_document({
            "type": "object", "properties": {"code": {"type": "string", "pattern": "^(a+)+$"}},
            "patternProperties": {"^(b+)+$": {"type": "integer"}}, "additionalProperties": False}))
        bad = "a" * 5000 + "!"
        print(sorted(tuple(x) for x in v.violations({"code": bad, "b" * 5000 + "!": 1, "bb": "x"})))
        print(v.violations({"code": "aaaa", "bbb": 2}))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    key = "b" * 5000 + "!"
    assert done.stdout.splitlines() == [
        str(sorted([("bb", "type"), ("code", "pattern"), (key, "additionalProperties")])),
        "[]",
    ]


def test_unique_items_of_objects_is_one_pass_and_keeps_json_equality() -> None:
    v = ContractValidator(
        contract_from_document({"type": "object", "properties": {"xs": {"type": "array", "uniqueItems": True}}})
    )
    assert v.violations({"xs": [{"i": i, "j": [i, {"k": i}]} for i in range(20_000)]}) == []
    assert [tuple(x) for x in v.violations({"xs": [{"a": 1, "b": [1.0]}, {"b": [1], "a": 1.0}]})] == [
        ("xs", "uniqueItems")
    ]
    assert v.violations({"xs": [1, True, "1", [1], {"1": 1}, 0, False, None]}) == []


def test_a_stored_contract_with_a_remote_reference_is_never_fetched(store: Store, schema_server: SchemaServer) -> None:
    # A version registered before references were checked: its outputs count as unchecked
    # (the reference does not resolve), and nothing is fetched.
    doc = {"type": "object", "properties": {"tier": {"$ref": f"{schema_server.url}/tier.json"}}}
    register_contract(store, "intake", "1", {"type": "object"})
    with store.transaction("planting an old registration") as con:
        con.execute(
            "UPDATE contract_versions SET document = ?, tools = ? WHERE contract = 'intake'",
            [
                orjson.dumps(doc).decode(),
                orjson.dumps(
                    [{"name": None, "description": None, "format": "json_schema", "strict": None, "schema": doc}]
                ).decode(),
            ],
        )
    store.contract_validators._found.clear()
    envs = [
        make_envelope(event_id=f"e{i}", contract="intake", contract_version="1", output={"tier": i}) for i in range(5)
    ]
    store.write_batch([parse_envelope(orjson.dumps(e), LIMITS) for e in envs])
    store.flush_rollups()
    assert schema_server.hits == []
    assert store.query("SELECT status, sum(n)::INT FROM contract_rollups GROUP BY ALL") == [("unchecked", 5)]


def _batch(cfg: RollupConfig, check: Any, clock: Any = None) -> RollupBatch:
    kw = {} if clock is None else {"clock": clock}
    return RollupBatch(cfg, bucket_seconds=60, check=check, registered=lambda c, v: v == "1", **kw)


def test_checks_wait_for_run_checks_not_for_the_batch() -> None:
    calls: list[Any] = []

    def check(cohort: Any, version: str, bucket: int, output: Any) -> Any:
        calls.append((cohort, version, output))
        return (ContractStatus.invalid, [("a", "type")]) if output == {"a": "x"} else (ContractStatus.valid, [])

    batch = _batch(RollupConfig(), check)
    cohort = ("m", "p", "c", "production")
    batch.add_many(
        [{"a": 1}, {"a": "x"}, {"a": 2}, {"a": 3}], [cohort] * 4, [T0] * 4, [None] * 4, ["1", "1", "2", None]
    )
    batch.tables()  # what preparing a batch does: still no check
    assert (calls, batch.checks_pending) == ([], 2)
    checks, violations = batch.contract_tables()
    assert calls == [(cohort, "1", {"a": 1}), (cohort, "1", {"a": "x"})]
    assert sorted(
        zip(checks["contract_version"].to_pylist(), checks["status"].to_pylist(), checks["n"].to_pylist(), strict=True)
    ) == [("", "untagged", 1), ("1", "invalid", 1), ("1", "valid", 1), ("2", "unregistered", 1)]
    assert violations.select(["contract_version", "path", "keyword", "n"]).to_pylist() == [
        {"contract_version": "1", "path": "a", "keyword": "type", "n": 1}
    ]


def test_slow_checks_count_as_unchecked_with_their_reason() -> None:
    # A clock the check itself moves: output i takes costs[i] ms.
    now = [0.0]
    costs = [0.5, 3.0, 0.5, 2.0, 0.5, 0.5, 0.5]

    def check(cohort: Any, version: str, bucket: int, output: Any) -> Any:
        now[0] += costs[output["i"]] / 1000
        return ContractStatus.valid, []

    batch = _batch(RollupConfig(contract_check_ms=1.0, contract_check_budget_ms=6.0), check, clock=lambda: now[0])
    n = len(costs)
    batch.add_many([{"i": i} for i in range(n)], [("m", "p", "c", "production")] * n, [T0] * n, [None] * n, ["1"] * n)
    checks, _ = batch.contract_tables()
    # 0.5 (valid), 3.0 (slow), 0.5 (valid), 2.0 (slow): 6.0 ms spent, the rest not checked
    assert sorted(zip(checks["status"].to_pylist(), checks["n"].to_pylist(), strict=True)) == [
        ("unchecked", 5),
        ("valid", 2),
    ]
    assert dict(batch.unchecked) == {"slow": 2, "budget": 3}


@pytest.mark.slow
def test_a_hostile_pattern_contract_through_the_service_stalls_nobody(tmp_path: Path) -> None:
    # Register a backtracking pattern and a remote reference through the real service, then send
    # outputs that would trigger them beside an unrelated client's: every request is answered,
    # the pattern's outputs are counted invalid, and nothing was fetched.
    svc = start_service(tmp_path / "svc.duckdb", env={"SHAPEWATCH_ROLLUP_MERGE_SECONDS": "0.2"})
    try:
        with svc.client() as c:
            r = c.post(
                "/v1/contracts", json={"contract": "codes", "version": "1", "author": "ana", "document": BACKTRACKING}
            )
            assert r.status_code == 201, r.text
            remote = c.post(
                "/v1/contracts",
                json={
                    "contract": "codes",
                    "version": "2",
                    "author": "ana",
                    "document": {"type": "object", "properties": {"code": {"$ref": "http://127.0.0.1:9/code.json"}}},
                },
            )
            message = (
                "contract 'codes' version '2': the reference 'http://127.0.0.1:9/code.json' at "
                "/properties/code/$ref does not resolve inside the document; references to other documents "
                "(http, file, ...) are never fetched: inline the schema under $defs and refer to it as "
                "#/$defs/..."
            )
            assert (remote.status_code, remote.json()) == (
                422,
                {"error": {"status": 422, "message": message, "fields": [{"path": "document", "reason": message}]}},
            )
            hostile = [
                make_envelope(contract="codes", contract_version="1", output={"code": "a" * 3000 + "!"})
                for _ in range(300)
            ]
            assert c.post("/v1/outputs", json=hostile).json()["accepted"] == 300
            other = c.post("/v1/outputs", json=make_envelope(contract="other"))
            assert other.status_code == 200 and other.json()["accepted"] == 1
            assert httpx.get(svc.url + "/healthz", timeout=5).status_code == 200
    finally:
        svc.stop()
    with Store.open(svc.db_path) as s:
        assert s.query(
            "SELECT status, sum(n)::INT FROM contract_rollups WHERE contract_version = '1' GROUP BY ALL"
        ) == [("invalid", 300)]
        assert s.query("SELECT path, keyword, sum(n)::INT FROM violation_rollups GROUP BY ALL") == [
            ("code", "pattern", 300)
        ]


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        (
            {"type": "object", "properties": {"tier": {"$ref": "http://127.0.0.1:9/tier.json"}}},
            "the reference 'http://127.0.0.1:9/tier.json' at /properties/tier/$ref does not resolve inside the document; "
            "references to other documents (http, file, ...) are never fetched: inline the schema under $defs and refer "
            "to it as #/$defs/...",
        ),
        (
            {"type": "object", "properties": {"code": {"pattern": "^(?=x)"}}},
            "the pattern '^(?=x)' at /properties/code/pattern cannot be checked in linear time (invalid perl operator: "
            "(?=); patterns run on RE2, which has no backreferences or lookaround",
        ),
    ],
)
def test_the_cli_refuses_what_the_bounded_engine_cannot_check(tmp_path: Path, schema: Any, problem: str) -> None:
    path = tmp_path / "contract.json"
    path.write_text(json.dumps(schema))
    db = tmp_path / "cli.duckdb"
    done = subprocess.run(
        [*SHAPEWATCH, "contract", "register", "--contract", "codes", "--version", "1", str(path), "--db", str(db)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "SHAPEWATCH_AUTHOR": "ana"},
    )
    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"error: contract 'codes' version '1': {problem}\n")
