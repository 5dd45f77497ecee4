"""Outputs checked against their registered contract version as they are stored (issue 6, item 3).

On real DuckDB files through ``Store.write_batch``: every output tagged with a registered version
is counted valid or invalid, its violations per path and JSON Schema keyword; a version nobody
registered and an output without a version are counted as such and never refused; a version
registered later is checked from then on; an alias's outputs count in their served cohort too;
compaction keeps every count.
"""

from __future__ import annotations

from typing import Any

import orjson
from harness import make_envelope

from shapewatch.collector import Store, WriteStatus, register_contract
from shapewatch.collector.envelope import LIMITS, parse_envelope
from shapewatch.collector.rollup import ContractStatus
from shapewatch.collector.store.merge import compact_rollups

SCHEMA = {
    "type": "object",
    "required": ["intent", "priority"],
    "properties": {
        "intent": {"type": "string", "enum": ["refund", "billing", "other"]},
        "priority": {"type": "string", "enum": ["low", "high"]},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        "entities": {
            "type": "array",
            "items": {"type": "object", "required": ["type"], "properties": {"type": {"type": "string"}}},
        },
    },
}
VALID = {"intent": "refund", "priority": "low", "confidence": 0.5, "entities": [{"type": "order"}]}


def env(i: int, output: dict[str, Any], version: str | None = "3", **kw: Any) -> Any:
    raw = make_envelope(
        event_id=f"e{i}",
        ts=f"2026-11-29T12:0{i % 2}:{i % 60:02d}Z",
        contract="intake",
        contract_version=version,
        output=output,
        **kw,
    )
    return parse_envelope(orjson.dumps(raw), LIMITS)


def checks(store: Store) -> dict[tuple[str, str, str], int]:
    """(model, contract version, status) -> outputs."""
    return {
        (m, v, s): int(n)
        for m, v, s, n in store.query(
            """SELECT c.model, contract_version, status, sum(n) FROM contract_rollups JOIN cohorts c USING (cohort_id)
           GROUP BY ALL"""
        )
    }


def violations(store: Store) -> dict[tuple[str, str | None, str], int]:
    """(model, path, keyword) -> outputs."""
    return {
        (m, p, k): int(n)
        for m, p, k, n in store.query(
            """SELECT c.model, path, keyword, sum(n) FROM violation_rollups JOIN cohorts c USING (cohort_id)
           GROUP BY ALL"""
        )
    }


def traffic() -> list[Any]:
    bad = [
        {"priority": "low"},  # intent missing
        {"intent": "refund", "priority": "URGENT"},  # not in the enum
        {"intent": "refund", "priority": "high", "confidence": "0.9"},  # a string
        {"intent": "other", "priority": "high", "confidence": 1.5, "entities": [{"value": 1}, {"type": 3}]},
    ]
    outputs = [VALID] * 6 + bad
    evs = [env(i, o) for i, o in enumerate(outputs)]
    evs += [env(100 + i, VALID, version="9") for i in range(3)]  # a version nobody registered
    evs += [env(200 + i, {"anything": True}, version=None) for i in range(2)]  # no version at all
    return evs


def test_registered_versions_are_checked_per_path_and_the_rest_is_counted(tmp_path: Any) -> None:
    with Store.open(tmp_path / "c.duckdb") as store:
        register_contract(store, "intake", "3", SCHEMA)
        results = store.write_batch(traffic())
        assert {r.status for r in results} == {WriteStatus.accepted} and len(results) == 15
        model = "claude-sonnet-4-5-20250929"
        assert checks(store) == {
            (model, "3", "valid"): 6,
            (model, "3", "invalid"): 4,
            (model, "9", "unregistered"): 3,
            (model, "", "untagged"): 2,
        }
        assert violations(store) == {
            (model, "intent", "required"): 1,
            (model, "priority", "enum"): 1,
            (model, "confidence", "type"): 1,
            (model, "confidence", "maximum"): 1,
            (model, "entities[].type", "required"): 1,
            (model, "entities[].type", "type"): 1,
        }
        # compaction changes no count
        before = (checks(store), violations(store))
        with store.transaction("compacting") as con:
            compact_rollups(con)
        assert (checks(store), violations(store)) == before


def test_a_version_registered_later_is_checked_from_then_on(tmp_path: Any) -> None:
    with Store.open(tmp_path / "c.duckdb") as store:
        store.write_batch([env(i, VALID) for i in range(4)])  # "3" is unknown yet: looked up, missed
        register_contract(store, "intake", "3", SCHEMA)
        store.write_batch([env(10 + i, {"priority": "low"}) for i in range(5)])
        model = "claude-sonnet-4-5-20250929"
        assert checks(store) == {(model, "3", "unregistered"): 4, (model, "3", "invalid"): 5}
        assert violations(store) == {(model, "intent", "required"): 5}


def test_an_alias_counts_its_checks_in_the_served_cohort_too(tmp_path: Any) -> None:
    with Store.open(tmp_path / "c.duckdb") as store:
        register_contract(store, "intake", "3", SCHEMA)
        store.write_batch(
            [
                env(i, o, model="gpt-4o", served_model="gpt-4o-2024-11-20")
                for i, o in enumerate([VALID, VALID, {"priority": "low"}])
            ]
        )
        assert checks(store) == {
            ("gpt-4o", "3", "valid"): 2,
            ("gpt-4o", "3", "invalid"): 1,
            ("gpt-4o-2024-11-20", "3", "valid"): 2,
            ("gpt-4o-2024-11-20", "3", "invalid"): 1,
        }
        assert violations(store) == {
            ("gpt-4o", "intent", "required"): 1,
            ("gpt-4o-2024-11-20", "intent", "required"): 1,
        }


def test_a_crash_before_the_merge_recounts_the_checks_once(tmp_path: Any) -> None:
    db = tmp_path / "c.duckdb"
    with Store.open(db) as store:
        register_contract(store, "intake", "3", SCHEMA)
        store.write_batch(traffic())
        expected = (checks(store), violations(store))
    crashed = tmp_path / "crashed.duckdb"
    store = Store.open(crashed)
    register_contract(store, "intake", "3", SCHEMA)
    store.defer_rollups(max_events=10_000, max_seconds=3600)
    store.write_batch(traffic())
    store._con.close()  # private on purpose: the process dies with the counts in memory
    with Store.open(crashed) as reopened:
        assert (checks(reopened), violations(reopened)) == expected


def test_busy_buckets_are_checked_on_a_sample_and_the_rest_is_counted_unchecked(tmp_path: Any) -> None:
    from shapewatch.collector import RollupConfig

    with Store.open(tmp_path / "c.duckdb", rollup=RollupConfig(contract_checks_per_bucket=3)) as store:
        register_contract(store, "intake", "3", SCHEMA)
        # 10 outputs in 12:00 (every other one breaks the contract), 2 in 12:01, 4 unregistered
        minute0 = [env(2 * i, VALID if i % 2 else {"priority": "low"}) for i in range(10)]
        minute1 = [env(2 * i + 1, VALID) for i in range(2)]
        store.write_batch(minute0[:4])
        store.write_batch(minute0[4:] + minute1 + [env(300 + 2 * i, VALID, version="9") for i in range(4)])
        model = "claude-sonnet-4-5-20250929"
        # the first three of 12:00 are checked (across batches), both of 12:01; the quota never hides
        # an unregistered version
        assert checks(store) == {
            (model, "3", "invalid"): 2,
            (model, "3", "valid"): 3,
            (model, "3", "unchecked"): 7,
            (model, "9", "unregistered"): 4,
        }
        assert violations(store) == {(model, "intent", "required"): 2}


def test_the_compiled_fast_path_agrees_with_jsonschema_and_steps_aside_for_2020_12_keywords() -> None:
    import copy
    from pathlib import Path

    from shapewatch.collector.contracts import ContractValidator, contract_from_document, read_contract

    bench = read_contract(Path(__file__).resolve().parents[2] / "bench" / "contracts" / "support_ticket.json")
    fast = ContractValidator(bench)
    slow = ContractValidator(bench)
    slow._fast = dict.fromkeys(slow._fast)  # private on purpose: jsonschema alone
    assert all(v is not None for v in fast._fast.values())
    good = {
        "intent": "refund",
        "priority": "low",
        "confidence": 0.9,
        "language": "en",
        "summary": "s",
        "customer": {"id": "c", "region": "na", "account_age_days": 3, "tier": None},
        "entities": [{"type": "order_id", "value": "A1", "start": 0, "end": 2}],
        "tags": ["x"],
        "flags": {"needs_human": False, "pii_detected": False, "sentiment": 0.1},
        "reply_draft": None,
        "followup_at": "2026-11-29T12:00:00Z",
        "scores": {"urgency": 2, "churn_risk": 0.2},
        "routing": {"queue": "billing", "escalation_level": 0, "sla_minutes": 60},
    }
    variants: list[dict[str, Any]] = [good]
    for path, value in [
        (("priority",), "URGENT"),
        (("confidence",), "0.9"),
        (("confidence",), 1.5),
        (("customer", "tier"), "gold"),
        (("entities", 0, "start"), -1),
        (("extra",), 1),
        (("followup_at",), "tomorrow"),
        (("scores", "urgency"), 9),
        (("tags", 0), 3),
    ]:
        v = copy.deepcopy(good)
        node: Any = v
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
        variants.append(v)
    for missing in ("intent", "routing"):
        variants.append({k: x for k, x in good.items() if k != missing})
    assert [fast.violations(v) for v in variants] == [slow.violations(v) for v in variants]
    assert fast.violations(good) == [] and sum(bool(fast.violations(v)) for v in variants) >= 10

    tuple_schema = contract_from_document(
        {
            "type": "object",
            "properties": {"pair": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}]}},
        }
    )
    v2020 = ContractValidator(tuple_schema)
    assert list(v2020._fast.values()) == [None]  # draft 7 would ignore prefixItems
    assert v2020.violations({"pair": ["a", "b"]}) == [("pair[]", "type")]


def test_a_catalog_checks_outputs_against_the_tool_named_like_their_contract(tmp_path: Any) -> None:
    tools = [
        {
            "name": "get_weather",
            "input_schema": {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}},
        },
        {
            "name": "get_time",
            "input_schema": {"type": "object", "required": ["zone"], "properties": {"zone": {"type": "string"}}},
        },
    ]
    with Store.open(tmp_path / "c.duckdb") as store:
        register_contract(store, "get_weather", "1", tools)  # a tool call's contract is its tool's name
        register_contract(store, "assistant", "1", tools)  # no tool of that name: nothing to check against
        validators = store.contract_validators
        assert validators.check("get_weather", "1", {"city": "Lyon"}) == (ContractStatus.valid, [])
        assert validators.check("get_weather", "1", {"zone": "CET"}) == (ContractStatus.invalid, [("city", "required")])
        assert validators.check("assistant", "1", {"city": "Lyon"}) == (ContractStatus.unregistered, [])
        facts = validators.facts("get_weather", "1")
        assert facts is not None and facts.required == frozenset({"city"})
        assert validators.facts("assistant", "1") is None and validators.facts("get_weather", "9") is None


def test_an_unregistered_version_of_one_contract_leaves_the_same_version_of_another_checked(tmp_path: Any) -> None:
    """A batch remembers which (contract, version) it found unregistered; the contract is part of that."""

    def of(i: int, contract: str, output: dict[str, Any]) -> Any:
        raw = make_envelope(
            event_id=f"m{i}", ts="2026-11-29T12:00:00Z", contract=contract, contract_version="3", output=output
        )
        return parse_envelope(orjson.dumps(raw), LIMITS)

    with Store.open(tmp_path / "c.duckdb") as store:
        register_contract(store, "triage", "3", SCHEMA)
        batch = [of(i, "intake", VALID) for i in range(3)]
        batch += [of(10 + i, "triage", VALID) for i in range(2)] + [of(20, "triage", {"priority": "low"})]
        batch += [of(30, "intake", VALID)]
        store.write_batch(batch)
        got = {
            (c, v, s): int(n)
            for c, v, s, n in store.query(
                """SELECT c.contract, contract_version, status, sum(n) FROM contract_rollups JOIN cohorts c
               USING (cohort_id) GROUP BY ALL"""
            )
        }
        assert got == {("intake", "3", "unregistered"): 4, ("triage", "3", "valid"): 2, ("triage", "3", "invalid"): 1}


def test_a_check_that_raises_leaves_the_output_unchecked_and_fails_nothing(tmp_path: Any) -> None:
    # jsonschema raised OverflowError on an infinite number under multipleOf (no parser lets one
    # in any more): whatever it raises, the output is counted unchecked and its batch commits.
    schema = {"type": "object", "properties": {"amount": {"type": "number", "multipleOf": 0.01}}}
    with Store.open(tmp_path / "c.duckdb") as store:
        register_contract(store, "intake", "3", schema)
        cache = store.contract_validators
        assert cache.check("intake", "3", {"amount": 12.5}) == (ContractStatus.valid, [])
        assert cache.check("intake", "3", {"amount": float("inf")}) == (ContractStatus.unchecked, [])
        assert cache.check("intake", "3", {"amount": float("-inf")}) == (ContractStatus.unchecked, [])
        assert cache.check("intake", "3", {"amount": 0.005})[0] is ContractStatus.invalid
