"""Classifying contract changes: one pair of schemas per classification, with whole lists of changes."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from shapewatch.collector import (
    ChangeKind,
    Classification,
    ContractChange,
    Verdict,
    contract_from_document,
    diff_contracts,
    diff_exit_code,
    diff_verdict,
    read_contract,
)

FIXTURES = Path(__file__).parent / "fixtures" / "contracts"

B, C, H = "breaking", "compatible", "behavioral"


def obj(properties: dict[str, Any], required: list[str] | None = None, **more: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, **({"required": required} if required else {}), **more}


def changes(old: Any, new: Any) -> list[tuple[str | None, str, str, str]]:
    """(path, kind, classification, detail) of every change, in the diff's order."""
    found = diff_contracts(contract_from_document(old), contract_from_document(new))
    assert all(c.tool is None for c in found)
    return [(c.path, c.kind.value, c.classification.value, c.detail) for c in found]


def edited(doc: dict[str, Any], edit: Any) -> dict[str, Any]:
    new = copy.deepcopy(doc)
    edit(new)
    return new


INTAKE = json.loads((FIXTURES / "intake_v1.json").read_text())


# --- nothing changed -----------------------------------------------------------------------


def test_key_reordering_and_set_order_are_no_change() -> None:
    old = read_contract(FIXTURES / "intake_v1.json")
    new = read_contract(FIXTURES / "intake_v1_reordered.json")
    # the reordered file moves every key, every required list, every enum and the anyOf options
    assert json.dumps(old.document) != json.dumps(new.document)
    assert diff_contracts(old, new) == []
    assert diff_contracts(new, old) == []


def test_a_schema_diffed_with_itself_has_no_change() -> None:
    for path in sorted(FIXTURES.glob("*.json")):
        c = read_contract(path)
        assert diff_contracts(c, c) == [], path.name


# --- behavioral: descriptions --------------------------------------------------------------


def test_description_only_edits_are_behavioral() -> None:
    def edit(d: dict[str, Any]) -> None:
        d["description"] = "What the triage model reads out of one customer message."
        d["properties"]["intent"]["description"] = "The one thing the customer asks for."
        d["properties"]["priority"]["description"] = "How urgent."  # added
        del d["properties"]["refund_amount"]["description"]  # removed
        d["$defs"]["entity"]["properties"]["description"]["description"] = "Free text about the entity."
        d["title"] = "Intake"

    assert changes(INTAKE, edited(INTAKE, edit)) == [
        (None, "annotation_changed", H, 'title changed: "Support ticket intake" -> "Intake"'),
        (None, "description_changed", H, "description changed"),
        # the keyword inside the property *named* description, through the $ref
        ("entities[].description", "description_changed", H, "description changed"),
        ("intent", "description_changed", H, "description changed"),
        ("priority", "description_changed", H, "description added"),
        ("refund_amount", "description_changed", H, "description removed"),
    ]


def test_a_property_named_description_is_a_field_not_an_annotation() -> None:
    old = obj({"description": {"type": "string"}, "title": {"type": "string"}}, ["description"])
    new = obj({"description": {"type": "integer"}}, ["description"])
    assert changes(old, new) == [
        ("description", "type_changed", B, "type string -> integer"),
        ("title", "field_removed", B, "field removed"),
    ]


def test_examples_default_and_unknown_keywords_are_behavioral() -> None:
    old = obj({"n": {"type": "integer", "default": 5, "examples": [1, 2], "x-order": 1}})
    new = obj({"n": {"type": "integer", "default": 10, "examples": [1, 2], "x-order": 2}})
    assert changes(old, new) == [
        ("n", "annotation_changed", H, "default changed: 5 -> 10"),
        ("n", "annotation_changed", H, "keyword 'x-order' changed: 1 -> 2"),
    ]


# --- fields, required, nesting -------------------------------------------------------------


def test_fields_added_removed_and_required_in_nested_objects() -> None:
    old = obj(
        {
            "customer": obj(
                {
                    "tier": {"type": "string"},
                    "id": {"type": "string"},
                    "region": {"type": "string"},
                    "note": {"type": "string"},
                },
                ["tier", "id"],
            )
        },
        ["customer"],
    )
    new = obj(
        {
            "customer": obj(
                {
                    "tier": {"type": "string"},
                    "id": {"type": "string"},
                    "region": {"type": "string"},
                    "name": {"type": "string"},
                    "address": obj({"zip": {"type": "string"}}, ["zip"]),
                },
                ["tier", "region", "address"],
            )
        },
        ["customer"],
    )
    assert changes(old, new) == [
        ("customer.address", "required_field_added", B, "required field added"),
        ("customer.id", "required_removed", C, "field became optional"),
        ("customer.name", "field_added", C, "optional field added"),
        ("customer.note", "field_removed", B, "field removed"),
        ("customer.region", "required_added", B, "field became required"),
    ]


def test_a_renamed_field_is_a_removal_and_an_addition() -> None:
    old = obj({"prio": {"enum": ["low", "high"]}}, ["prio"])
    new = obj({"priority": {"enum": ["low", "high"]}}, ["priority"])
    assert changes(old, new) == [
        ("prio", "field_removed", B, "field removed (it was required)"),
        ("priority", "required_field_added", B, "required field added"),
    ]


def test_keys_with_dots_are_escaped_in_paths() -> None:
    old = obj({"a.b": obj({"c[0]": {"type": "string"}})})
    new = obj({"a.b": obj({"c[0]": {"type": "integer"}})})
    assert changes(old, new) == [("a\\.b.c\\[0\\]", "type_changed", B, "type string -> integer")]


# --- arrays of objects ---------------------------------------------------------------------


def test_arrays_of_objects_use_item_paths() -> None:
    old = obj(
        {
            "line_items": {
                "type": "array",
                "minItems": 1,
                "items": obj(
                    {
                        "sku": {"type": "string"},
                        "qty": {"type": "integer", "minimum": 1},
                        "tags": {"type": "array", "items": {"enum": ["gift", "fragile"]}},
                    },
                    ["sku"],
                ),
            }
        }
    )
    new = obj(
        {
            "line_items": {
                "type": "array",
                "items": obj(
                    {
                        "sku": {"type": "string"},
                        "qty": {"type": "integer", "minimum": 1, "maximum": 99},
                        "tags": {"type": "array", "items": {"enum": ["gift", "fragile", "bulky"]}},
                    },
                    ["sku", "qty"],
                ),
            }
        }
    )
    assert changes(old, new) == [
        ("line_items", "bound_loosened", C, "minItems 1 removed"),
        ("line_items[].qty", "bound_tightened", B, "maximum 99 added"),
        ("line_items[].qty", "required_added", B, "field became required"),
        ("line_items[].tags[]", "enum_value_added", C, 'enum value "bulky" added'),
    ]


# --- $ref ----------------------------------------------------------------------------------


def test_a_change_inside_a_definition_shows_at_every_path_using_it() -> None:
    def schema(zip_pattern: str) -> dict[str, Any]:
        return obj(
            {
                "billing": {"$ref": "#/$defs/address"},
                "shipping": {"$ref": "#/$defs/address"},
                "stops": {"type": "array", "items": {"$ref": "#/definitions/stop"}},
            },
            **{
                "$defs": {"address": obj({"zip": {"type": "string", "pattern": zip_pattern}})},
                "definitions": {"stop": obj({"at": {"$ref": "#/$defs/address"}})},
            },
        )

    assert changes(schema("^[0-9]{5}$"), schema("^[0-9]{5}(-[0-9]{4})?$")) == [
        ("billing.zip", "pattern_changed", B, 'pattern "^[0-9]{5}$" -> "^[0-9]{5}(-[0-9]{4})?$"'),
        ("shipping.zip", "pattern_changed", B, 'pattern "^[0-9]{5}$" -> "^[0-9]{5}(-[0-9]{4})?$"'),
        ("stops[].at.zip", "pattern_changed", B, 'pattern "^[0-9]{5}$" -> "^[0-9]{5}(-[0-9]{4})?$"'),
    ]


def test_inlining_a_definition_is_no_change_and_recursive_definitions_terminate() -> None:
    node = obj({"name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}})
    old = {"$ref": "#/$defs/node", "$defs": {"node": node}}
    new_node = obj(
        {"name": {"type": "string", "maxLength": 80}, "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}
    )
    new = {**new_node, "$defs": {"node": new_node}}  # the root inlined
    assert changes(old, new) == [
        ("children[].name", "bound_tightened", B, "maxLength 80 added"),
        ("name", "bound_tightened", B, "maxLength 80 added"),
    ]


# --- anyOf / oneOf / allOf -----------------------------------------------------------------


def test_anyof_options_removed_are_breaking_and_added_are_compatible() -> None:
    old = obj(
        {
            "amount": {"anyOf": [{"type": "number"}, {"type": "null"}]},
            "ref": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
        }
    )
    new = obj(
        {
            "amount": {"anyOf": [{"type": "number"}]},
            "ref": {"anyOf": [{"type": "integer"}, {"type": "string"}, {"$ref": "#/$defs/ref"}]},
        },
        **{"$defs": {"ref": obj({"id": {"type": "string"}})}},
    )
    assert changes(old, new) == [
        ("amount", "option_removed", B, 'anyOf option {"type":"null"} removed'),
        ("ref", "option_added", C, "anyOf option #/$defs/ref added"),
    ]


def test_a_changed_anyof_option_is_compared_inside() -> None:
    old = obj({"assignee": {"anyOf": [obj({"team": {"enum": ["billing", "shipping"]}}, ["team"]), {"type": "null"}]}})
    new = obj(
        {
            "assignee": {
                "anyOf": [{"type": "null"}, obj({"team": {"enum": ["billing"]}, "name": {"type": "string"}}, ["team"])]
            }
        }
    )
    assert changes(old, new) == [
        ("assignee.name", "field_added", C, "optional field added"),
        ("assignee.team", "enum_value_removed", B, 'enum value "shipping" removed'),
    ]


def test_oneof_options_are_matched_by_their_discriminator() -> None:
    def card(extra: dict[str, Any]) -> dict[str, Any]:
        return obj({"kind": {"const": "card"}, "last4": {"type": "string", **extra}}, ["kind", "last4"])

    def bank(extra: dict[str, Any]) -> dict[str, Any]:
        return obj({"kind": {"const": "bank"}, "iban": {"type": "string", **extra}}, ["kind", "iban"])

    wallet = obj({"kind": {"const": "wallet"}, "provider": {"type": "string"}}, ["kind"])
    old = obj({"payment": {"oneOf": [card({}), bank({})]}})
    new = obj({"payment": {"oneOf": [bank({"minLength": 15}), wallet, card({"pattern": "^[0-9]{4}$"})]}})
    assert changes(old, new) == [
        (
            "payment",
            "option_added",
            C,
            "oneOf option "
            + json.dumps(
                {
                    "properties": {"kind": {"const": "wallet"}, "provider": {"type": "string"}},
                    "required": ["kind"],
                    "type": "object",
                },
                separators=(",", ":"),
            )[:57]
            + "... added",
        ),
        ("payment.iban", "bound_tightened", B, "minLength 15 added"),
        ("payment.last4", "pattern_added", B, 'pattern "^[0-9]{4}$" added'),
    ]


def test_allof_subschemas_are_constraints() -> None:
    base = obj({"a": {"type": "string"}})
    old = {"allOf": [base]}
    new = {"allOf": [base, {"required": ["a"]}]}
    assert changes(old, new) == [(None, "keyword_added", B, 'allOf option {"required":["a"]} added')]
    assert changes(new, old) == [(None, "keyword_removed", C, 'allOf option {"required":["a"]} removed')]


# --- types, enums, const, format -----------------------------------------------------------


def test_type_widening_narrowing_and_changes() -> None:
    old = obj(
        {
            "count": {"type": "integer"},
            "score": {"type": "number"},
            "note": {"type": ["string", "null"]},
            "id": {"type": "string"},
            "any": {},
            "num": {"type": "number"},
        }
    )
    new = obj(
        {
            "count": {"type": "number"},
            "score": {"type": "integer"},
            "note": {"type": "string"},
            "id": {"type": "integer"},
            "any": {"type": "string"},
            "num": {"type": ["integer", "number"]},
        }
    )
    assert changes(old, new) == [
        ("any", "type_narrowed", B, "type any -> string"),
        ("count", "type_widened", C, "type integer -> number"),
        ("id", "type_changed", B, "type string -> integer"),
        ("note", "type_narrowed", B, "type null|string -> string"),
        ("score", "type_narrowed", B, "type number -> integer"),
    ]
    assert changes(new, old)[2:4] == [
        ("id", "type_changed", B, "type integer -> string"),
        ("note", "type_widened", C, "type string -> null|string"),
    ]


def test_enum_and_const_changes() -> None:
    old = obj(
        {
            "tier": {"enum": ["free", "pro", "enterprise"]},
            "v": {"const": 1},
            "w": {"const": "x"},
            "open": {"enum": ["a"]},
            "free_text": {"type": "string"},
            "fixed": {"type": "string"},
        }
    )
    new = obj(
        {
            "tier": {"enum": ["pro", "free", "team"]},
            "v": {"const": 2},
            "open": {"type": "string"},
            "free_text": {"type": "string", "enum": ["a", "b"]},
            "w": {},
            "fixed": {"const": "y", "type": "string"},
        }
    )
    assert changes(old, new) == [
        ("fixed", "const_added", B, 'const "y" added'),
        ("free_text", "enum_added", B, 'enum ["a","b"] added'),
        ("open", "enum_removed", C, "enum removed"),
        ("open", "type_narrowed", B, "type any -> string"),
        ("tier", "enum_value_added", C, 'enum value "team" added'),
        ("tier", "enum_value_removed", B, 'enum value "enterprise" removed'),
        ("v", "const_changed", B, "const 1 -> 2"),
        ("w", "const_removed", C, 'const "x" removed'),
    ]


def test_format_changes() -> None:
    old = obj(
        {"a": {"type": "string"}, "b": {"type": "string", "format": "date"}, "c": {"type": "string", "format": "email"}}
    )
    new = obj(
        {
            "a": {"type": "string", "format": "uuid"},
            "b": {"type": "string", "format": "date-time"},
            "c": {"type": "string"},
        }
    )
    assert changes(old, new) == [
        ("a", "format_added", B, 'format "uuid" added'),
        ("b", "format_changed", B, 'format "date" -> "date-time"'),
        ("c", "format_removed", C, 'format "email" removed'),
    ]


# --- bounds and patterns -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("keyword", "old", "new", "kind"),
    [
        ("minimum", 0, 1, "bound_tightened"),
        ("minimum", 1, 0, "bound_loosened"),
        ("maximum", 10, 5, "bound_tightened"),
        ("maximum", 5, 10, "bound_loosened"),
        ("exclusiveMinimum", 0, 1, "bound_tightened"),
        ("exclusiveMaximum", 10, 11, "bound_loosened"),
        ("minLength", 1, 2, "bound_tightened"),
        ("maxLength", 500, 100, "bound_tightened"),
        ("maxLength", 100, 500, "bound_loosened"),
        ("minItems", 2, 1, "bound_loosened"),
        ("maxItems", 20, 10, "bound_tightened"),
        ("maxItems", 10, 20, "bound_loosened"),
        ("multipleOf", 5, 10, "bound_tightened"),
        ("multipleOf", 10, 5, "bound_loosened"),
    ],
)
def test_bounds_tightened_are_breaking_and_loosened_compatible(keyword: str, old: int, new: int, kind: str) -> None:
    cls = B if kind == "bound_tightened" else C
    assert changes(obj({"x": {keyword: old}}), obj({"x": {keyword: new}})) == [
        ("x", kind, cls, f"{keyword} {old} -> {new}")
    ]


def test_bounds_and_patterns_added_or_removed() -> None:
    old = obj({"s": {"type": "string", "pattern": "^a", "maxLength": 10}, "t": {"type": "array"}})
    new = obj({"s": {"type": "string", "minLength": 1}, "t": {"type": "array", "uniqueItems": True}})
    assert changes(old, new) == [
        ("s", "bound_loosened", C, "maxLength 10 removed"),
        ("s", "bound_tightened", B, "minLength 1 added"),
        ("s", "pattern_removed", C, 'pattern "^a" removed'),
        ("t", "bound_tightened", B, "uniqueItems added"),
    ]


# --- additionalProperties and other keywords -----------------------------------------------


def test_additional_properties_closed_and_opened() -> None:
    old = obj(
        {
            "meta": obj({}),
            "extra": obj({}, additionalProperties=False),
            "labels": obj({}, additionalProperties={"type": "string"}),
        }
    )
    new = obj(
        {
            "meta": obj({}, additionalProperties=False),
            "extra": obj({}, additionalProperties=True),
            "labels": obj({}, additionalProperties={"type": "string", "maxLength": 20}),
        },
        additionalProperties={"type": "object"},
    )
    assert changes(old, new) == [
        (None, "additional_properties_closed", B, "additionalProperties open -> restricted to a schema"),
        ("extra", "additional_properties_opened", C, "additionalProperties closed (false) -> open"),
        ("labels.*", "bound_tightened", B, "maxLength 20 added"),
        ("meta", "additional_properties_closed", B, "additionalProperties open -> closed (false)"),
    ]


def test_other_validation_keywords_added_are_breaking_and_removed_compatible() -> None:
    old = obj({"a": {"type": "string", "not": {"const": ""}}, "b": {"type": "object"}})
    new = obj({"a": {"type": "string"}, "b": {"type": "object", "dependentRequired": {"x": ["y"]}}})
    assert changes(old, new) == [
        ("a", "keyword_removed", C, "not removed"),
        ("b", "keyword_added", B, "dependentRequired added"),
    ]


# --- tools and catalogs --------------------------------------------------------------------


def test_catalog_diff_with_a_tool_added_and_one_removed() -> None:
    old = read_contract(FIXTURES / "openai_tools_v1.json")
    new = read_contract(FIXTURES / "openai_tools_v2.json")
    found = diff_contracts(old, new)
    assert found == [
        ContractChange(None, ChangeKind.tool_removed, "tool removed", "cancel_order"),
        ContractChange(None, ChangeKind.tool_added, "tool added", "refund_order"),
    ]
    assert [c.classification for c in found] == [Classification.breaking, Classification.behavioral]
    assert diff_verdict(found) is Verdict.breaking and diff_exit_code(found) == 2


def test_changes_inside_catalog_tools_are_keyed_by_tool() -> None:
    old = json.loads((FIXTURES / "openai_tools_v1.json").read_text())
    new = copy.deepcopy(old)
    search = new[0]["function"]
    search["description"] = "Search orders."
    search["strict"] = False
    search["parameters"]["properties"]["limit"]["maximum"] = 100
    search["parameters"]["properties"]["status"]["enum"].remove("returned")
    found = diff_contracts(contract_from_document(old), contract_from_document(new))
    assert [(c.tool, c.path, c.kind.value, c.classification.value, c.detail) for c in found] == [
        ("search_orders", None, "description_changed", H, "tool description changed"),
        ("search_orders", None, "strict_changed", H, "strict true -> false"),
        ("search_orders", "limit", "bound_loosened", C, "maximum 50 -> 100"),
        ("search_orders", "status", "enum_value_removed", B, 'enum value "returned" removed'),
    ]
    assert [c.location for c in found] == [
        "search_orders",
        "search_orders",
        "search_orders: limit",
        "search_orders: status",
    ]


def test_the_same_tool_in_another_provider_format_is_no_change() -> None:
    openai = read_contract(FIXTURES / "openai_get_weather.json")
    for name in ("anthropic_get_weather.json", "mcp_get_weather.json"):
        assert diff_contracts(openai, read_contract(FIXTURES / name)) == []


def test_a_single_tool_renamed_is_breaking() -> None:
    old = read_contract(FIXTURES / "anthropic_get_weather.json")
    doc = json.loads((FIXTURES / "anthropic_get_weather.json").read_text())
    new = contract_from_document({**doc, "name": "current_weather"})
    assert [(c.tool, c.path, c.kind.value, c.classification.value, c.detail) for c in diff_contracts(old, new)] == [
        ("current_weather", None, "tool_renamed", B, "tool 'get_weather' renamed to 'current_weather'")
    ]


# --- verdicts ------------------------------------------------------------------------------


def test_verdict_and_exit_code_follow_the_most_serious_change() -> None:
    brk = ContractChange("a", ChangeKind.field_removed, "field removed")
    beh = ContractChange("a", ChangeKind.description_changed, "description changed")
    com = ContractChange("b", ChangeKind.field_added, "optional field added")
    cases = [
        ([], Verdict.unchanged, 0),
        ([com], Verdict.compatible, 0),
        ([beh], Verdict.behavioral, 1),
        ([com, beh], Verdict.behavioral, 1),
        ([com, beh, brk], Verdict.breaking, 2),
        ([brk], Verdict.breaking, 2),
    ]
    assert [(diff_verdict(cs), diff_exit_code(cs)) for cs, _, _ in cases] == [(v, e) for _, v, e in cases]


def test_every_kind_has_a_classification() -> None:
    assert {k.classification for k in ChangeKind} == set(Classification)
