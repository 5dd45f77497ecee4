"""Contracts: reading every form, normalization, fingerprints, the registry in a real DuckDB file, validation."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from shapewatch.collector import (
    ContractConflict,
    ContractInvalid,
    ContractNotFound,
    ContractToolAmbiguous,
    ContractValidator,
    SchemaFacts,
    ShapewatchError,
    Store,
    ToolFormat,
    ValidatorCache,
    Violation,
    contract_from_document,
    declared_facts,
    get_contract,
    list_contracts,
    normalize_schema,
    parse_contract,
    read_contract,
    register_contract,
)

FIXTURES = Path(__file__).parent / "fixtures" / "contracts"
T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def reorder_keys(doc: Any) -> Any:
    """The same document with every object's keys in reverse order (arrays untouched)."""
    if isinstance(doc, dict):
        return {k: reorder_keys(doc[k]) for k in reversed(list(doc))}
    if isinstance(doc, list):
        return [reorder_keys(v) for v in doc]
    return doc


# --- reading -------------------------------------------------------------------------------

PARAMS = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}


@pytest.mark.parametrize(
    ("doc", "name", "fmt", "strict"),
    [
        (PARAMS, None, ToolFormat.json_schema, None),
        (
            {
                "type": "function",
                "function": {"name": "search", "description": "d", "strict": True, "parameters": PARAMS},
            },
            "search",
            ToolFormat.openai_function,
            True,
        ),
        (
            {"type": "function", "name": "search", "description": "d", "parameters": PARAMS},
            "search",
            ToolFormat.openai_function,
            None,
        ),
        ({"name": "search", "description": "d", "parameters": PARAMS}, "search", ToolFormat.openai_function, None),
        (
            {"type": "json_schema", "json_schema": {"name": "search", "strict": False, "schema": PARAMS}},
            "search",
            ToolFormat.openai_response_format,
            False,
        ),
        (
            {"type": "json_schema", "name": "search", "schema": PARAMS},
            "search",
            ToolFormat.openai_response_format,
            None,
        ),
        ({"name": "search", "description": "d", "input_schema": PARAMS}, "search", ToolFormat.anthropic_tool, None),
        ({"name": "search", "title": "Search", "inputSchema": PARAMS}, "search", ToolFormat.mcp_tool, None),
    ],
)
def test_every_single_form_is_read(doc: dict[str, Any], name: str | None, fmt: ToolFormat, strict: bool | None) -> None:
    c = contract_from_document(doc)
    assert not c.catalog
    assert [(t.name, t.format, t.strict, t.schema) for t in c.tools] == [(name, fmt, strict, PARAMS)]
    assert c.document == doc


def test_catalog_forms() -> None:
    openai = read_contract(FIXTURES / "openai_tools_v1.json")
    assert openai.catalog
    assert [(t.name, t.format) for t in openai.tools] == [
        ("search_orders", ToolFormat.openai_function),
        ("get_order", ToolFormat.openai_function),
        ("cancel_order", ToolFormat.openai_function),
    ]
    mcp = read_contract(FIXTURES / "mcp_tools_list.json")  # a whole JSON-RPC tools/list response
    assert [(t.name, t.format, t.description) for t in mcp.tools] == [
        ("read_file", ToolFormat.mcp_tool, "Read the complete contents of a file from the file system."),
        (
            "list_directory",
            ToolFormat.mcp_tool,
            "Get a detailed listing of all files and directories in a specified path.",
        ),
    ]
    result = fixture("mcp_tools_list.json")["result"]  # the tools/list result alone
    assert contract_from_document(result).invocation_hash == mcp.invocation_hash
    request = {"model": "gpt-4.1", "tools": fixture("openai_tools_v1.json")}  # tools of a request
    assert [t.name for t in contract_from_document(request).tools] == ["search_orders", "get_order", "cancel_order"]
    one = contract_from_document([fixture("anthropic_get_weather.json")])
    assert one.catalog and [t.name for t in one.tools] == ["get_weather"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('"a string"', "x.json: not a JSON object or array of tools (found a string)"),
        ("42", "x.json: not a JSON object or array of tools (found a number)"),
        (
            '{"name": "lookup", "description": "Look a customer up."}',
            "x.json: tool 'lookup' has no schema (expected parameters, input_schema or inputSchema holding its JSON Schema)",
        ),
        (
            '{"type": "function", "function": {"name": "ping", "description": "Ping."}}',
            "x.json: tool 'ping': no 'parameters': a tool without a schema (a tool without arguments declares "
            '{"type": "object", "properties": {}})',
        ),
        (
            '{"name": "lookup", "input_schema": []}',
            "x.json: tool 'lookup': 'input_schema' is not a JSON object (found an array)",
        ),
        (
            '{"type": "object", "properties": {"a": {"type": "strng"}}}',
            "x.json: not a valid Draft 2020-12 JSON Schema at /properties/a/type: 'strng' is not valid under any of "
            "the given schemas",
        ),
        (
            '{"name": "t", "inputSchema": {"type": "object", "required": "a"}}',
            "x.json: tool 't': not a valid Draft 2020-12 JSON Schema at /required: 'a' is not of type 'array'",
        ),
        ("[]", "x.json: the catalog holds no tools"),
        (
            '[{"type": "object"}]',
            "x.json: tool #1: not a tool definition (no name with parameters, input_schema or "
            "inputSchema); a catalog holds tools, not bare schemas",
        ),
        ('[{"name": "a", "inputSchema": {}}, {"name": "a", "input_schema": {}}]', "x.json: two tools are named 'a'"),
        (
            '{"type": "function", "parameters": {}}',
            'x.json: an OpenAI tool ("type": "function") without "function" or "name"',
        ),
    ],
)
def test_unusable_documents_are_refused_with_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ContractInvalid) as info:
        parse_contract(text, where="x.json")
    assert str(info.value) == message
    assert isinstance(info.value, ShapewatchError) and isinstance(info.value, ValueError)


def test_text_that_is_not_json_is_refused() -> None:
    with pytest.raises(ContractInvalid, match=r"^x\.json: not JSON \(.*line 1 column 2"):
        parse_contract("{not json", where="x.json")


def test_an_unreadable_file_is_a_contract_error(tmp_path: Path) -> None:
    with pytest.raises(ContractInvalid, match=r"missing\.json: cannot read the file \(No such file or directory\)"):
        read_contract(tmp_path / "missing.json")


# --- normalization and fingerprints --------------------------------------------------------


def test_normalization_strips_annotation_keywords_only_where_they_are_keywords() -> None:
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "T",
        "description": "D",
        "type": "object",
        "x-vendor": {"description": "kept: not a schema"},
        "properties": {
            "description": {"type": "string", "description": "the keyword goes, the field stays"},
            "title": {"type": ["null", "string", "null"], "default": None, "examples": ["a"]},
            "tier": {"enum": ["pro", "free", "pro"], "$comment": "c", "deprecated": True},
            "v": {"anyOf": [{"type": "string", "readOnly": True}, {"type": "integer"}], "writeOnly": False},
            "one": {"type": ["string"]},
        },
        "required": ["tier", "description"],
        "$defs": {"x": {"description": "gone", "type": "string"}},
    }
    assert normalize_schema(schema) == {
        "type": "object",
        "x-vendor": {"description": "kept: not a schema"},
        "properties": {
            "description": {"type": "string"},
            "title": {"type": ["null", "string"]},
            "tier": {"enum": ["free", "pro"]},
            "v": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
            "one": {"type": "string"},
        },
        "required": ["description", "tier"],
        "$defs": {"x": {"type": "string"}},
    }


def test_fingerprints_ignore_key_order_and_separate_descriptions() -> None:
    v1 = read_contract(FIXTURES / "intake_v1.json")
    doc = fixture("intake_v1.json")
    keys_only = contract_from_document(reorder_keys(doc))
    assert list(keys_only.document) != list(doc)
    assert (keys_only.invocation_hash, keys_only.discovery_hash, keys_only.content_hash) == (
        v1.invocation_hash,
        v1.discovery_hash,
        v1.content_hash,
    )
    # keys, required lists, enums and anyOf options reordered: the same schema, another document
    reordered = read_contract(FIXTURES / "intake_v1_reordered.json")
    assert (reordered.invocation_hash, reordered.discovery_hash) == (v1.invocation_hash, v1.discovery_hash)
    assert reordered.content_hash != v1.content_hash

    described = copy.deepcopy(doc)
    described["properties"]["intent"]["description"] = "The customer's one request."
    d2 = contract_from_document(described)
    assert d2.invocation_hash == v1.invocation_hash
    assert d2.discovery_hash != v1.discovery_hash

    narrowed = copy.deepcopy(doc)
    narrowed["properties"]["priority"]["enum"] = ["low", "high"]
    n2 = contract_from_document(narrowed)
    assert n2.invocation_hash != v1.invocation_hash
    assert n2.discovery_hash == v1.discovery_hash

    for h in (v1.invocation_hash, v1.discovery_hash, v1.content_hash):
        assert len(h) == 64 and int(h, 16) >= 0


def test_the_same_tool_in_three_provider_formats_has_the_same_fingerprints() -> None:
    forms = [
        read_contract(FIXTURES / n)
        for n in ("openai_get_weather.json", "anthropic_get_weather.json", "mcp_get_weather.json")
    ]
    assert len({(c.invocation_hash, c.discovery_hash) for c in forms}) == 1
    assert len({c.content_hash for c in forms}) == 3
    tool_description = fixture("anthropic_get_weather.json")
    tool_description["description"] = "Current conditions for a city."
    edited = contract_from_document(tool_description)
    assert (edited.invocation_hash == forms[0].invocation_hash, edited.discovery_hash == forms[0].discovery_hash) == (
        True,
        False,
    )
    renamed = contract_from_document({**fixture("anthropic_get_weather.json"), "name": "weather"})
    assert renamed.invocation_hash != forms[0].invocation_hash


def test_catalog_fingerprints_ignore_tool_order() -> None:
    tools = fixture("openai_tools_v1.json")
    a = contract_from_document(tools)
    b = contract_from_document(list(reversed(tools)))
    assert (a.invocation_hash, a.discovery_hash) == (b.invocation_hash, b.discovery_hash)


# --- declared facts ------------------------------------------------------------------------


def test_declared_enums_and_optional_fields_by_path() -> None:
    facts = declared_facts(fixture("intake_v1.json"))
    assert facts == SchemaFacts(
        enums={
            "customer.tier": ("free", "pro", "enterprise"),
            "entities[].type": ("order_id", "product", "date"),
            "intent": ("refund", "cancel", "question", "complaint"),
            "priority": ("low", "normal", "high"),
        },
        optional=frozenset({"customer.email", "entities", "entities[].description", "refund_amount", "summary"}),
        required=frozenset({"intent", "priority", "customer", "customer.tier", "entities[].type", "entities[].value"}),
    )


def test_declared_facts_merge_options_and_follow_recursive_refs() -> None:
    schema = {
        "type": "object",
        "properties": {
            "assignee": {"anyOf": [{"$ref": "#/$defs/agent"}, {"type": "null"}]},
            "tree": {"$ref": "#/$defs/node"},
            "kind": {"anyOf": [{"enum": ["a", "b"]}, {"const": "c"}, {"enum": ["b"]}]},
        },
        "$defs": {
            "agent": {
                "type": "object",
                "properties": {"team": {"enum": ["billing", "shipping"]}},
                "required": ["team"],
            },
            "node": {
                "type": "object",
                "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            },
        },
    }
    assert declared_facts(schema) == SchemaFacts(
        enums={"assignee.team": ("billing", "shipping"), "kind": ("a", "b", "c")},
        optional=frozenset({"assignee", "tree", "kind", "tree.children"}),
        required=frozenset({"assignee.team"}),
    )


# --- validation ----------------------------------------------------------------------------

VALID = {
    "intent": "refund",
    "priority": "high",
    "customer": {"tier": "pro", "email": "a@example.com"},
    "entities": [{"type": "order_id", "value": "A-1"}],
    "refund_amount": None,
    "summary": "s",
}


def intake_validator() -> ContractValidator:
    return ContractValidator(read_contract(FIXTURES / "intake_v1.json"))


def test_a_valid_output_has_no_violation() -> None:
    assert intake_validator().violations(VALID) == []


def test_violation_paths_for_nested_array_and_required_cases() -> None:
    output = {
        "intent": "upgrade",  # enum
        # priority missing: required at the root
        "customer": {"email": "not an email", "vip": True},  # tier missing, format, extra key (closed object)
        "entities": [{"type": "order_id", "value": "A-1"}, {"type": "sku", "value": ""}, {"type": "date"}],
        "refund_amount": -5,  # anyOf: no option fits
        "summary": 42,
        "extra": 1,
    }
    assert intake_validator().violations(output) == [
        Violation("customer.email", "format"),
        Violation("customer.tier", "required"),
        Violation("customer.vip", "additionalProperties"),
        Violation("entities[].type", "enum"),
        Violation("entities[].value", "minLength"),
        Violation("entities[].value", "required"),
        Violation("extra", "additionalProperties"),
        Violation("intent", "enum"),
        Violation("priority", "required"),
        Violation("refund_amount", "anyOf"),
        Violation("summary", "type"),
    ]


def test_violations_at_the_output_itself_have_no_path() -> None:
    v = ContractValidator(contract_from_document({"type": "object", "minProperties": 2}))
    assert v.violations({"a": 1}) == [Violation(None, "minProperties")]


def test_pattern_properties_false_subschemas_and_nested_arrays() -> None:
    v = ContractValidator(
        contract_from_document(
            {
                "type": "object",
                "additionalProperties": False,
                "patternProperties": {"^x-": {"type": "string"}},
                "properties": {
                    "legacy": False,
                    "matrix": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
                },
            }
        )
    )
    assert v.violations({"x-trace": "t", "x-n": 1, "legacy": 1, "other": 2, "matrix": [[1, 2], [3, "4"]]}) == [
        Violation("legacy", "not"),
        Violation("matrix[][]", "type"),
        Violation("other", "additionalProperties"),
        Violation("x-n", "type"),
    ]


def test_a_catalog_picks_the_schema_by_tool_name() -> None:
    catalog = read_contract(FIXTURES / "openai_tools_v1.json")
    v = ContractValidator(catalog, where="contract 'shop' version '1'")
    with pytest.raises(ContractToolAmbiguous) as info:
        v.violations({"order_id": "ORD-12345678"})
    assert str(info.value) == (
        "contract 'shop' version '1' holds 3 tools (search_orders, get_order, "
        "cancel_order); name the tool whose arguments the output is"
    )
    assert v.violations({"order_id": "ORD-12345678"}, tool="get_order") == []
    assert v.violations({"order_id": "12"}, tool="cancel_order") == [
        Violation("order_id", "pattern"),
        Violation("reason", "required"),
    ]
    with pytest.raises(ContractInvalid, match="no tool named 'refund_order'"):
        v.violations({}, tool="refund_order")
    single = ContractValidator(read_contract(FIXTURES / "anthropic_get_weather.json"))
    assert single.violations({"unit": "kelvin"}) == [Violation("location", "required"), Violation("unit", "enum")]
    plain = ContractValidator(read_contract(FIXTURES / "intake_v1.json"))
    assert plain.violations(VALID, tool="anything") == []  # an unnamed schema takes any tool name
    assert v.facts("get_order") == SchemaFacts({}, frozenset(), frozenset({"order_id"}))


# --- the registry --------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Any:
    with Store.open(tmp_path / "contracts.duckdb") as s:
        yield s


def test_register_is_idempotent_and_refuses_other_content_under_a_version(store: Store) -> None:
    doc = fixture("intake_v1.json")
    first, created = register_contract(store, "intake", "3", doc, author="ana", note="v3 rollout", now=T0)
    assert created
    assert (first.contract, first.version, first.author, first.note, first.registered_at) == (
        "intake",
        "3",
        "ana",
        "v3 rollout",
        T0,
    )
    c = contract_from_document(doc)
    assert (first.invocation_hash, first.discovery_hash, first.content_hash) == (
        c.invocation_hash,
        c.discovery_hash,
        c.content_hash,
    )
    assert first.definition.document == doc

    again, created = register_contract(
        store, "intake", "3", reorder_keys(doc), author="bo", note="other note", now=datetime(2027, 1, 1, tzinfo=UTC)
    )
    assert not created
    assert again == first  # the stored row: its time, author and note
    # an enum listed in another order is another document (the model reads the order): refused
    with pytest.raises(ContractConflict):
        register_contract(store, "intake", "3", fixture("intake_v1_reordered.json"))

    changed = copy.deepcopy(doc)
    changed["properties"]["intent"]["description"] = "edited"
    with pytest.raises(ContractConflict) as info:
        register_contract(store, "intake", "3", changed)
    new_hash = contract_from_document(changed).content_hash
    assert str(info.value) == (
        f"contract 'intake' version '3' is already registered with different content (stored "
        f"{first.content_hash[:12]}..., given {new_hash[:12]}...); registered versions never change: register "
        f"the new content under a new version"
    )
    assert get_contract(store, "intake", "3") == first
    assert store.query("SELECT count(*) FROM contract_versions") == [(1,)]


def test_registered_versions_are_listed_and_survive_reopening(tmp_path: Path) -> None:
    path = tmp_path / "reg.duckdb"
    with Store.open(path) as s:
        register_contract(s, "shop", "1", fixture("openai_tools_v1.json"), now=T0)
        register_contract(s, "intake", "3", fixture("intake_v1.json"), now=T0)
        register_contract(s, "shop", "2", fixture("openai_tools_v2.json"), now=datetime(2026, 12, 1, tzinfo=UTC))
    with Store.open(path) as s:
        assert [(r.contract, r.version) for r in list_contracts(s)] == [("intake", "3"), ("shop", "1"), ("shop", "2")]
        assert [r.version for r in list_contracts(s, "shop")] == ["1", "2"]
        assert list_contracts(s, "nothing") == []
        shop2 = get_contract(s, "shop", "2")
        assert shop2.definition.catalog
        assert [t.name for t in shop2.definition.tools] == ["get_order", "search_orders", "refund_order"]
        tools = json.loads(s.query("SELECT tools FROM contract_versions WHERE version = '2'")[0][0])
        assert [t["name"] for t in tools] == ["get_order", "search_orders", "refund_order"]
        assert shop2.summary()["registered_at"] == "2026-12-01T00:00:00Z"


def test_unknown_versions_and_bad_names(store: Store) -> None:
    with pytest.raises(ContractNotFound, match=r"^no contract 'intake' version '9' is registered$"):
        get_contract(store, "intake", "9")
    with pytest.raises(ContractInvalid, match=r"^the contract version: must be a non-empty string$"):
        register_contract(store, "intake", " ", fixture("intake_v1.json"))
    with pytest.raises(ContractInvalid, match="not a valid Draft 2020-12"):
        register_contract(store, "intake", "4", {"type": "objekt"})
    assert list_contracts(store) == []


def test_validator_cache_compiles_once_and_counts_unknown_versions(store: Store) -> None:
    cache = ValidatorCache(store, miss_seconds=0)
    assert cache.get("intake", "3") is None  # unknown: the caller counts it, ingestion goes on
    register_contract(store, "intake", "3", fixture("intake_v1.json"))
    v = cache.get("intake", "3")
    assert v is not None and cache.get("intake", "3") is v
    assert v.violations({**VALID, "priority": "urgent"}) == [Violation("priority", "enum")]
    assert v.facts().enums["priority"] == ("low", "normal", "high")

    slow = ValidatorCache(store, miss_seconds=3600)
    assert slow.get("intake", "4") is None
    register_contract(store, "intake", "4", fixture("intake_v1.json"))
    assert slow.get("intake", "4") is None  # a miss is remembered for miss_seconds


def test_a_document_that_cannot_be_stored_as_json_is_refused_naming_why() -> None:
    # Found by schemathesis through POST /v1/contracts: these reached the registry and failed there.
    from shapewatch.collector import ContractInvalid, contract_from_document

    for doc, why in [
        ({"type": "object", "default": 22167602381020831744}, "Integer exceeds 64-bit range"),
        ({"type": "object", "properties": {"\udbdd": {}}}, "surrogates not allowed"),
    ]:
        with pytest.raises(ContractInvalid) as err:
            contract_from_document(doc, where="request body")
        assert str(err.value).startswith("request body: is not storable as JSON (") and why in str(err.value)
