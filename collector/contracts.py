"""Contracts: JSON Schemas and tool definitions, their fingerprints, the registry, and validation.

A *contract* is what an application declares its structured outputs (or tool
arguments) must look like. This module reads one from any of the forms it
ships in, fingerprints it, keeps registered versions in the store, and checks
outputs against a registered version. Classifying the changes between two
contracts is ``contract_diff.py``.

**Forms read** (``contract_from_document``): a plain JSON Schema object; an
OpenAI tool (``{"type": "function", "function": {...}}``, the flat Responses
form ``{"type": "function", "name": ..., "parameters": ...}`` and the legacy
``{"name", "description", "parameters"}`` function); an OpenAI structured-output
``response_format`` (``{"type": "json_schema", "json_schema": {"name", "schema"}}``
and the flat Responses ``text.format`` form); an Anthropic tool (``input_schema``);
an MCP tool (``inputSchema``). A *catalog* is a JSON array of tools,
``{"tools": [...]}`` (a request body or MCP ``tools/list`` result) or a whole
JSON-RPC ``tools/list`` response. Every schema must pass Draft 2020-12's
``check_schema``; a tool without its schema is refused (an OpenAI function
without arguments must say ``{"type": "object", "properties": {}}``).

**Normalization** (``normalize_schema``) is schema-aware: it walks only the
keywords that hold subschemas (``properties``, ``items``, ``anyOf``, ``$defs``,
...), so a property *named* ``description`` is kept while the keyword is not.
It strips the annotation keywords (``title``, ``description``, ``default``,
``examples``, ``deprecated``, ``readOnly``, ``writeOnly``, ``$comment``) and
``$schema`` (every schema is read as Draft 2020-12); sorts and deduplicates the
sets of ``required``, ``enum``, a ``type`` list (a one-element list becomes its
type) and ``dependentRequired``; and orders ``anyOf``/``oneOf``/``allOf``
options canonically (their order never changes what validates). Key order
never matters anywhere: hashes are over canonical JSON (sorted keys).
Unknown keywords are kept as they are (a provider may act on them). ``$ref``
is kept, not inlined.

**Fingerprints** (SHA-256, hex): the *invocation hash* covers, per tool, its
name, its ``strict`` flag (OpenAI) and its normalized schema; the *discovery
hash* covers, per tool, its name and description and every annotation
(description, title, examples, default, ...) at its place in the schema. A
description edit moves the discovery hash only; a reordering moves neither.
A single plain schema is a tool with no name. The *content hash* covers the
canonical JSON of the document as given, array order included: it is what
registration compares.

**Paths** are shapewatch's (``customer.tier``, ``entities[].type``, keys
escaped with ``flatten.join_key``); the output itself has path None.

>>> c = contract_from_document({"name": "get_weather", "input_schema": {"type": "object"}})
>>> c.tools[0].name, c.tools[0].format.value
('get_weather', 'anthropic_tool')
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import Enum
from functools import cached_property
from pathlib import Path
from typing import Any, NamedTuple, Protocol, cast
from urllib.parse import unquote

import orjson
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from .errors import (
    ContractConflict,
    ContractError,
    ContractInvalid,
    ContractNotFound,
    ContractToolAmbiguous,
)
from .flatten import items_path, join_key
from .rollup import ContractStatus
from .schema_check import bounded_validator, prepare_schema, search

log = logging.getLogger(__name__)

__all__ = [
    "ANNOTATION_KEYWORDS",
    "Contract",
    "ContractConflict",
    "ContractError",
    "ContractInvalid",
    "ContractNotFound",
    "ContractRow",
    "ContractStore",
    "ContractToolAmbiguous",
    "ContractValidator",
    "RegisteredContract",
    "SchemaFacts",
    "Tool",
    "ToolFormat",
    "ValidatorCache",
    "Violation",
    "canonical_json",
    "contract_from_document",
    "declared_facts",
    "get_contract",
    "list_contracts",
    "normalize_schema",
    "parse_contract",
    "read_contract",
    "register_contract",
    "resolve_ref",
]

#: Keywords that describe rather than constrain: out of the invocation hash, in the discovery hash.
ANNOTATION_KEYWORDS = frozenset(
    {"title", "description", "default", "examples", "deprecated", "readOnly", "writeOnly", "$comment"}
)
_STRIPPED = ANNOTATION_KEYWORDS | {"$schema"}
#: Keywords whose value maps names to subschemas.
SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
#: Keywords whose value is one subschema (``items`` may also be an array, in older drafts).
SCHEMA_SINGLES = frozenset(
    {
        "additionalProperties",
        "items",
        "additionalItems",
        "contains",
        "propertyNames",
        "not",
        "if",
        "then",
        "else",
        "unevaluatedItems",
        "unevaluatedProperties",
        "contentSchema",
    }
)
#: Keywords whose value is an array of subschemas; the first three are sets (order never matters).
SCHEMA_LISTS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_UNORDERED_LISTS = frozenset({"allOf", "anyOf", "oneOf"})
#: Every keyword of Draft 2020-12 (and ``definitions``/``additionalItems``) that is not an annotation.
VALIDATION_KEYWORDS = (
    SCHEMA_MAPS
    | SCHEMA_SINGLES
    | SCHEMA_LISTS
    | frozenset(
        {
            "$ref",
            "$id",
            "$anchor",
            "$dynamicRef",
            "$dynamicAnchor",
            "$vocabulary",
            "type",
            "enum",
            "const",
            "multipleOf",
            "maximum",
            "exclusiveMaximum",
            "minimum",
            "exclusiveMinimum",
            "maxLength",
            "minLength",
            "pattern",
            "maxItems",
            "minItems",
            "uniqueItems",
            "maxContains",
            "minContains",
            "maxProperties",
            "minProperties",
            "required",
            "dependentRequired",
            "format",
            "contentEncoding",
            "contentMediaType",
        }
    )
)

_SCHEMA_HINTS = VALIDATION_KEYWORDS | {"$schema"}


def canonical_json(value: Any) -> bytes:
    """The canonical JSON of a value: sorted keys, no whitespace (what every hash here covers)."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def _sha256(value: Any) -> str:
    return hashlib.sha256(canonical_json(value)).hexdigest()


# --- reading --------------------------------------------------------------------------------


class ToolFormat(str, Enum):
    """The form a schema came in."""

    json_schema = "json_schema"
    openai_function = "openai_function"
    openai_response_format = "openai_response_format"
    anthropic_tool = "anthropic_tool"
    mcp_tool = "mcp_tool"


@dataclass(frozen=True)
class Tool:
    """One schema of a contract, with the tool (or response format) it belongs to.

    >>> Tool(None, None, {"type": "object"}, ToolFormat.json_schema).label
    '(schema)'
    """

    name: str | None  # None for a plain JSON Schema
    description: str | None
    schema: dict[str, Any]
    format: ToolFormat
    strict: bool | None = None  # OpenAI's strict flag, where given

    @property
    def label(self) -> str:
        return self.name if self.name is not None else "(schema)"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "format": self.format.value,
            "strict": self.strict,
            "schema": self.schema,
        }


@dataclass(frozen=True)
class Contract:
    """A document read as a contract: one schema or tool, or a catalog of tools.

    >>> a = parse_contract('{"type": "object", "properties": {"a": {"type": "string", "title": "A"}}}')
    >>> b = parse_contract('{"properties": {"a": {"type": "string"}}, "type": "object"}')
    >>> (a.invocation_hash == b.invocation_hash, a.discovery_hash == b.discovery_hash)
    (True, False)
    """

    tools: tuple[Tool, ...]
    catalog: bool  # a list of tools (matched by name when diffed), even when it holds one
    document: Any = field(compare=False)  # as given

    @cached_property
    def content_hash(self) -> str:
        return _sha256(self.document)

    @cached_property
    def invocation_hash(self) -> str:
        return _sha256(
            {
                "catalog": self.catalog,
                "tools": sorted(
                    ({"name": t.name, "strict": t.strict, "schema": normalize_schema(t.schema)} for t in self.tools),
                    key=lambda t: canonical_json(t["name"]),
                ),
            }
        )

    @cached_property
    def discovery_hash(self) -> str:
        return _sha256(
            {
                "catalog": self.catalog,
                "tools": sorted(
                    (
                        {"name": t.name, "description": t.description, "parameters": _annotations(t.schema)}
                        for t in self.tools
                    ),
                    key=lambda t: canonical_json(t["name"]),
                ),
            }
        )

    def tool(self, name: str | None = None, *, where: str = "the contract") -> Tool:
        """The tool an output belongs to: see ``ContractValidator`` for the rule."""
        if name is None:
            if len(self.tools) == 1:
                return self.tools[0]
            raise ContractToolAmbiguous(where, [t.label for t in self.tools])
        for t in self.tools:
            if t.name == name:
                return t
        if len(self.tools) == 1 and self.tools[0].name is None:
            return self.tools[0]  # a plain schema has no name to disagree with
        raise ContractInvalid(where, f"no tool named {name!r} (it has {', '.join(t.label for t in self.tools)})")


def parse_contract(text: str | bytes, *, where: str = "contract") -> Contract:
    """Read a contract from JSON text."""
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ContractInvalid(where, f"not JSON ({exc})") from exc
    return contract_from_document(doc, where=where)


def read_contract(path: Path | str) -> Contract:
    """Read a contract from a JSON file."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ContractInvalid(str(path), f"cannot read the file ({exc.strerror or exc})") from exc
    return parse_contract(data, where=str(path))


def contract_from_document(doc: Any, *, where: str = "contract") -> Contract:
    """Recognize a parsed JSON document as a schema, a tool or a catalog (module docstring)."""
    try:  # what cannot be stored as JSON text cannot be registered (lone surrogates, 65-bit integers)
        orjson.dumps(doc)
    except orjson.JSONEncodeError as exc:
        raise ContractInvalid(where, f"is not storable as JSON ({exc})") from None
    if isinstance(doc, list):
        return _catalog(doc, where)
    if not isinstance(doc, dict):
        raise ContractInvalid(where, f"not a JSON object or array of tools (found {_json_kind(doc)})")
    tools = _catalog_tools(doc)
    if tools is not None:
        return _catalog(tools, where)
    tool = _tool(doc, where)
    if tool is None:
        tool = Tool(None, None, doc, ToolFormat.json_schema)
        _check_schema(doc, where)
    return Contract((tool,), False, doc)


def _json_kind(v: Any) -> str:
    return {
        type(None): "null",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "an array",
        dict: "an object",
    }.get(type(v), type(v).__name__)


def _catalog_tools(doc: dict[str, Any]) -> list[Any] | None:
    result = doc.get("result")
    if "jsonrpc" in doc and isinstance(result, dict) and isinstance(result.get("tools"), list):
        return list(result["tools"])
    if isinstance(doc.get("tools"), list) and "properties" not in doc and "type" not in doc:
        return list(doc["tools"])
    return None


def _catalog(items: list[Any], where: str) -> Contract:
    if not items:
        raise ContractInvalid(where, "the catalog holds no tools")
    tools: list[Tool] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        at = f"{where}: tool #{i + 1}"
        if not isinstance(item, dict):
            raise ContractInvalid(at, f"not a tool definition (found {_json_kind(item)})")
        tool = _tool(item, at)
        if tool is None:
            raise ContractInvalid(
                at,
                "not a tool definition (no name with parameters, input_schema or "
                "inputSchema); a catalog holds tools, not bare schemas",
            )
        assert tool.name is not None
        if tool.name in seen:
            raise ContractInvalid(where, f"two tools are named {tool.name!r}")
        seen.add(tool.name)
        tools.append(tool)
    return Contract(tuple(tools), True, items)


def _tool(doc: dict[str, Any], where: str) -> Tool | None:
    """The tool ``doc`` defines, or None when it is a plain schema."""
    kind = doc.get("type")
    if kind == "function":
        fn = doc.get("function")
        if isinstance(fn, dict):  # Chat Completions
            return _make_tool(fn, where, ToolFormat.openai_function, "parameters", strict=fn.get("strict"))
        if "name" in doc:  # Responses API: flat
            return _make_tool(doc, where, ToolFormat.openai_function, "parameters", strict=doc.get("strict"))
        raise ContractInvalid(where, 'an OpenAI tool ("type": "function") without "function" or "name"')
    if kind == "json_schema":
        rf = doc.get("json_schema")
        if isinstance(rf, dict):
            return _make_tool(rf, where, ToolFormat.openai_response_format, "schema", strict=rf.get("strict"))
        if "schema" in doc:  # Responses API text.format: flat
            return _make_tool(doc, where, ToolFormat.openai_response_format, "schema", strict=doc.get("strict"))
        raise ContractInvalid(where, 'an OpenAI response_format ("type": "json_schema") without "json_schema"')
    if "input_schema" in doc:
        return _make_tool(doc, where, ToolFormat.anthropic_tool, "input_schema")
    if "inputSchema" in doc:
        return _make_tool(doc, where, ToolFormat.mcp_tool, "inputSchema")
    if "name" in doc and "parameters" in doc and "type" not in doc:  # legacy OpenAI `functions` entry
        return _make_tool(doc, where, ToolFormat.openai_function, "parameters")
    if "name" in doc and not any(k in doc for k in _SCHEMA_HINTS):
        raise ContractInvalid(
            where,
            f"tool {doc['name']!r} has no schema (expected parameters, input_schema "
            "or inputSchema holding its JSON Schema)",
        )
    return None


def _make_tool(doc: dict[str, Any], where: str, fmt: ToolFormat, key: str, *, strict: Any = None) -> Tool:
    name = doc.get("name")
    if not isinstance(name, str) or not name:
        raise ContractInvalid(where, f"a {fmt.value} without a name")
    at = f"{where}: tool {name!r}"
    if key not in doc:
        raise ContractInvalid(
            at,
            f"no {key!r}: a tool without a schema (a tool without arguments declares "
            '{"type": "object", "properties": {}})',
        )
    schema = doc[key]
    if not isinstance(schema, dict):
        raise ContractInvalid(at, f"{key!r} is not a JSON object (found {_json_kind(schema)})")
    description = doc.get("description")
    if description is not None and not isinstance(description, str):
        raise ContractInvalid(at, "its description is not a string")
    if strict is not None and not isinstance(strict, bool):
        raise ContractInvalid(at, "its strict flag is not a boolean")
    _check_schema(schema, at)
    return Tool(name, description, schema, fmt, strict)


def _check_schema(schema: dict[str, Any], where: str) -> None:
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        location = "/".join(str(p) for p in exc.path)
        raise ContractInvalid(
            where, f"not a valid Draft 2020-12 JSON Schema{' at /' + location if location else ''}: {exc.message}"
        ) from None


# --- normalization and annotations -----------------------------------------------------------


def normalize_schema(schema: Any) -> Any:
    """The schema as it validates: annotations stripped, sets sorted (module docstring)."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for k, v in schema.items():
        if k in _STRIPPED:
            continue
        if k in SCHEMA_MAPS and isinstance(v, dict):
            out[k] = {name: normalize_schema(sub) for name, sub in v.items()}
        elif (k in SCHEMA_SINGLES or k in SCHEMA_LISTS) and isinstance(v, list):
            subs = [normalize_schema(sub) for sub in v]
            out[k] = _canonical_set(subs) if k in _UNORDERED_LISTS else subs
        elif k in SCHEMA_SINGLES:
            out[k] = normalize_schema(v)
        elif k in ("required", "enum") and isinstance(v, list):
            out[k] = _canonical_set(v)
        elif k == "type" and isinstance(v, list):
            types = sorted(set(v))
            out[k] = types[0] if len(types) == 1 else types
        elif k == "dependentRequired" and isinstance(v, dict):
            out[k] = {p: _canonical_set(names) if isinstance(names, list) else names for p, names in v.items()}
        else:
            out[k] = v
    return out


def _canonical_set(values: list[Any]) -> list[Any]:
    unique = {canonical_json(v): v for v in values}
    return [unique[k] for k in sorted(unique)]


def _annotations(schema: Any) -> Any:
    """The annotations of a schema, at their places: what a model reads to choose and fill a tool."""
    if not isinstance(schema, dict):
        return {}
    out: dict[str, Any] = {k: schema[k] for k in ANNOTATION_KEYWORDS if k in schema}
    for k, v in schema.items():
        if k in SCHEMA_MAPS and isinstance(v, dict):
            found = {name: a for name, sub in v.items() if (a := _annotations(sub))}
            if found:
                out[k] = found
        elif (k in SCHEMA_SINGLES or k in SCHEMA_LISTS) and isinstance(v, list):
            pairs = [(normalize_schema(sub), _annotations(sub)) for sub in v]
            if k in _UNORDERED_LISTS:
                pairs.sort(key=canonical_json)
            if any(a for _, a in pairs):
                out[k] = [a for _, a in pairs]
        elif k in SCHEMA_SINGLES and (a := _annotations(v)):
            out[k] = a
    return out


def resolve_ref(root: Any, ref: str) -> Any:
    """The subschema a local ``$ref`` (``#``, ``#/$defs/x``, ``#/definitions/x``) points at, or None."""
    if not ref.startswith("#"):
        return None  # remote references are not fetched
    pointer = unquote(ref[1:])
    if pointer == "":
        return root
    if not pointer.startswith("/"):
        return None  # plain-name anchors are not resolved
    node = root
    for part in pointer[1:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def deref(node: Any, root: Any) -> tuple[Any, tuple[str, ...]]:
    """``node`` with its local ``$ref`` chain followed (siblings of ``$ref`` win), and the refs followed.

    A boolean schema becomes its object form (``true``: ``{}``, ``false``: ``{"not": {}}``).
    An unresolvable or looping ``$ref`` is left in place.
    """
    followed: list[str] = []
    while True:
        if node is True:
            return {}, tuple(followed)
        if node is False:
            return {"not": {}}, tuple(followed)
        if not isinstance(node, dict) or not isinstance(node.get("$ref"), str):
            return node, tuple(followed)
        ref = node["$ref"]
        target = resolve_ref(root, ref)
        if ref in followed or not isinstance(target, (dict, bool)):
            return node, tuple(followed)
        followed.append(ref)
        target = {} if target is True else {"not": {}} if target is False else target
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}


# --- declared facts (enums, optional fields) ------------------------------------------------


@dataclass(frozen=True)
class SchemaFacts:
    """What a schema declares per path: enum values, and which fields are optional or required.

    A path is *optional* when some object declares it under ``properties`` without
    listing it in ``required``, and no object declaring it requires it. Enums
    (and ``const``) met at one path in several places (``anyOf`` options) are merged.

    >>> declared_facts({"properties": {"tier": {"enum": ["gold", "free"]}}}).optional
    frozenset({'tier'})
    """

    enums: dict[str, tuple[Any, ...]]
    optional: frozenset[str]
    required: frozenset[str]


def declared_facts(schema: dict[str, Any]) -> SchemaFacts:
    """The declared enums and optional/required fields of one schema, by shapewatch path."""
    enums: dict[str, dict[bytes, Any]] = {}
    optional: set[str] = set()
    required: set[str] = set()

    def walk(node: Any, path: str | None, active: frozenset[str], depth: int) -> None:
        node, refs = deref(node, schema)
        if not isinstance(node, dict) or depth > 64 or active & set(refs):
            return
        active = active | set(refs)
        if path is not None:
            values = list(node["enum"]) if isinstance(node.get("enum"), list) else []
            if "const" in node:
                values.append(node["const"])
            for v in values:
                enums.setdefault(path, {}).setdefault(canonical_json(v), v)
        props = node.get("properties")
        if isinstance(props, dict):
            req = set(node.get("required") or ())
            for name, sub in props.items():
                p = join_key(path, name)
                (required if name in req else optional).add(p)
                walk(sub, p, active, depth + 1)
        items = node.get("items")
        for sub in ([items] if isinstance(items, (dict, bool)) else []) + list(node.get("prefixItems") or ()):
            walk(sub, items_path(path or ""), active, depth + 1)
        for kw in ("anyOf", "oneOf", "allOf"):
            for sub in node.get(kw) or ():
                walk(sub, path, active, depth + 1)
        for kw in ("then", "else"):
            if kw in node:
                walk(node[kw], path, active, depth + 1)

    walk(schema, None, frozenset(), 0)
    return SchemaFacts(
        {p: tuple(v.values()) for p, v in sorted(enums.items())}, frozenset(optional - required), frozenset(required)
    )


# --- validation ------------------------------------------------------------------------------


class Violation(NamedTuple):
    """Where an output breaks its contract (shapewatch path; None: the output itself) and which keyword."""

    path: str | None
    keyword: str


class ContractValidator:
    """Checks outputs against one contract; compiled once, reused for every output.

    Which schema an output is checked against: with ``tool=None``, the contract's
    only schema (a catalog of several tools raises ``ContractToolAmbiguous``);
    with a tool name, that tool's schema (``ContractInvalid`` when there is none),
    except that a single plain JSON Schema, having no name, takes any.

    Formats are asserted (``format_checker``): a provider that enforces the
    schema enforces them too, and a violated format is worth counting. A value
    where the schema says ``false`` (a forbidden property) is reported as ``not``.

    >>> v = ContractValidator(contract_from_document(
    ...     {"type": "object", "required": ["a"], "properties": {"b": {"type": "array", "items": {"type": "string"}}}}))
    >>> v.violations({"b": ["x", 3]})
    [Violation(path='a', keyword='required'), Violation(path='b[]', keyword='type')]
    """

    def __init__(self, contract: Contract, *, where: str = "the contract") -> None:
        self.contract = contract
        self.where = where
        self._validators = {t.name: bounded_validator(_without_false(t.schema)) for t in contract.tools}
        self._fast = {t.name: _fast_validator(t.schema) for t in contract.tools}
        self._facts: dict[str | None, SchemaFacts] = {}

    def violations(self, output: dict[str, Any], *, tool: str | None = None) -> list[Violation]:
        """Every violation of the chosen schema by ``output``, sorted, each (path, keyword) once."""
        name = self.contract.tool(tool, where=self.where).name
        fast = self._fast[name]
        if fast is not None:
            try:
                fast(output)
                return []  # valid: the common case, about 50x cheaper than jsonschema's walk
            except Exception:
                pass
        validator = self._validators[name]
        found: dict[Violation, None] = {}
        for error in validator.iter_errors(output):
            for v in _violations_of(error):
                found[v] = None
        return sorted(found, key=lambda v: (v.path is not None, v.path or "", v.keyword))

    def tool_for(self, contract: str) -> str | None:
        """The tool whose schema applies to the outputs of envelope contract ``contract``: the only
        one, else the one named like it (a tool call's contract is its tool's name)."""
        return None if len(self.contract.tools) == 1 else contract

    def facts(self, tool: str | None = None) -> SchemaFacts:
        """The chosen schema's declared enums and optional fields (the same rule picks the schema)."""
        t = self.contract.tool(tool, where=self.where)
        if t.name not in self._facts:
            self._facts[t.name] = declared_facts(t.schema)
        return self._facts[t.name]


# Keywords whose meaning differs between draft 7 (fastjsonschema's) and 2020-12, or that only
# 2020-12 has: a schema using any of them is always checked by jsonschema alone.
_NOT_DRAFT7 = frozenset(
    {
        "prefixItems",
        "unevaluatedItems",
        "unevaluatedProperties",
        "dependentSchemas",
        "dependentRequired",
        "$dynamicRef",
        "$dynamicAnchor",
        "$recursiveRef",
        "$recursiveAnchor",
        "minContains",
        "maxContains",
        "$vocabulary",
        "$anchor",
        "$id",
    }
)


# Keywords fastjsonschema runs with Python's backtracking ``re`` (schema_check.py runs them on RE2).
_PYTHON_RE = frozenset({"pattern", "patternProperties"})


def _draft7_compatible(node: Any) -> bool:
    if isinstance(node, list):
        return all(_draft7_compatible(x) for x in node)
    if not isinstance(node, dict):
        return True
    if (
        _NOT_DRAFT7 & node.keys()
        or isinstance(node.get("items"), list)
        or ("$ref" in node and node.keys() - ANNOTATION_KEYWORDS - {"$ref"})
    ):
        return False  # (a $ref's siblings apply in 2020-12, not in draft 7; annotations never do)
    if (
        _PYTHON_RE & node.keys()
        or node.get("format") == "regex"
        or (isinstance(node.get("$ref"), str) and not node["$ref"].startswith("#"))
    ):
        return False  # fastjsonschema would run the pattern on Python's re, or fetch the reference
    return all(_draft7_compatible(v) for v in node.values())


def _fast_validator(schema: Any) -> Callable[[Any], Any] | None:
    """A compiled draft-7 validator (fastjsonschema) that agrees with 2020-12 on ``schema``, if any.

    Only a pass is trusted: an output it refuses is checked again by jsonschema, which reports
    the violations (and is the authority when the two disagree on a format).
    """
    if not _draft7_compatible(schema):
        return None
    try:
        import fastjsonschema

        draft7 = {k: v for k, v in schema.items() if k != "$schema"} if isinstance(schema, dict) else schema
        return cast(Callable[[Any], Any], fastjsonschema.compile(draft7, use_default=False))
    except Exception:
        return None


# Keywords whose `false` is reported well by jsonschema (at the object or array, by its own name).
_FALSE_KEPT = frozenset({"additionalProperties", "unevaluatedProperties", "unevaluatedItems", "items"})


def _without_false(schema: Any) -> Any:
    """``schema`` with each ``false`` subschema written ``{"not": {}}`` (the same validation).

    jsonschema reports a ``false`` subschema's error without its instance path
    (``{"properties": {"legacy": false}}`` blames the object, not ``legacy``);
    ``not`` is reported where the value is.
    """
    if not isinstance(schema, dict):
        return {"not": {}} if schema is False else schema
    out: dict[str, Any] = {}
    for k, v in schema.items():
        if k in SCHEMA_MAPS and isinstance(v, dict):
            out[k] = {name: _without_false(sub) for name, sub in v.items()}
        elif (k in SCHEMA_LISTS or k in SCHEMA_SINGLES) and isinstance(v, list):
            out[k] = [_without_false(sub) for sub in v]
        elif (k in SCHEMA_SINGLES and k not in _FALSE_KEPT) or (k in _FALSE_KEPT and isinstance(v, dict)):
            out[k] = _without_false(v)
        else:
            out[k] = v
    return out


def _instance_path(parts: Sequence[Any]) -> str | None:
    path: str | None = None
    for part in parts:
        path = items_path(path or "") if isinstance(part, int) else join_key(path, str(part))
    return path


def _violations_of(error: Any) -> Iterator[Violation]:
    path = _instance_path(list(error.absolute_path))
    keyword = "false" if error.validator is None else str(error.validator)  # None: a `false` schema
    instance, value = error.instance, error.validator_value
    if keyword == "required" and isinstance(instance, dict) and isinstance(value, list):
        missing = [k for k in value if isinstance(k, str) and k not in instance]
        if missing:
            for k in missing:
                yield Violation(join_key(path, k), keyword)
            return
    if keyword == "additionalProperties" and value is False and isinstance(instance, dict):
        schema = error.schema if isinstance(error.schema, dict) else {}
        props = schema.get("properties") or {}
        patterns = list((schema.get("patternProperties") or {}).keys())
        extra = [k for k in instance if k not in props and not any(_matches(p, k) for p in patterns)]
        if extra:
            for k in extra:
                yield Violation(join_key(path, k), keyword)
            return
    yield Violation(path, keyword)


def _matches(pattern: str, key: str) -> bool:
    return search(pattern, key)


class ContractRow(NamedTuple):
    """A registered contract version as the store keeps it (``contract_versions``): ``document``
    is its canonical JSON text and ``tools`` a JSON array of its tools (name, description,
    format, strict, schema)."""

    contract: str
    version: str
    document: str
    content_hash: str
    catalog: bool
    tools: str
    invocation_hash: str
    discovery_hash: str
    registered_at: datetime
    author: str | None
    note: str | None


class ContractStore(Protocol):
    """What this module needs of the store (``store.Store`` provides it): the store builds on
    this module, so it is named here by what it does, not imported."""

    @property
    def contract_validators(self) -> ValidatorCache: ...
    def add_contract_version(self, row: ContractRow) -> str | None: ...
    def contract_version(self, contract: str, version: str) -> ContractRow | None: ...
    def contract_versions(self, contract: str | None = None) -> list[ContractRow]: ...


class ValidatorCache:
    """Compiled validators per registered (contract, version), for checking outputs as they arrive.

    Registered versions never change, so a compiled validator stays valid; an
    unknown version gives None (count it, never fail ingestion on it) and is
    looked up again after ``miss_seconds``. Safe to share between threads.

    >>> cache = ValidatorCache(store)                                  # doctest: +SKIP
    >>> v = cache.get("intake", "3")                                   # doctest: +SKIP
    >>> v.violations(output) if v else "unknown contract version"      # doctest: +SKIP
    """

    def __init__(self, store: ContractStore, *, size: int = 128, miss_seconds: float = 30.0) -> None:
        self.store = store
        self.size = size
        self.miss_seconds = miss_seconds
        self._lock = threading.Lock()
        self._found: OrderedDict[tuple[str, str], ContractValidator] = OrderedDict()
        self._missed: dict[tuple[str, str], float] = {}
        self._failed: set[tuple[str, str]] = set()  # versions whose check raised (logged once)

    def get(self, contract: str, version: str) -> ContractValidator | None:
        key = (contract, version)
        with self._lock:
            v = self._found.get(key)
            if v is not None:
                self._found.move_to_end(key)
                return v
            missed = self._missed.get(key)
            if missed is not None and time.monotonic() - missed < self.miss_seconds:
                return None
        try:
            registered = get_contract(self.store, contract, version)
        except ContractNotFound:
            with self._lock:
                self._missed[key] = time.monotonic()
                if len(self._missed) > 10 * self.size:
                    self._missed.clear()
            return None
        validator = registered.validator()
        with self._lock:
            self._missed.pop(key, None)
            self._found[key] = validator
            while len(self._found) > self.size:
                self._found.popitem(last=False)
        return validator

    def forget_miss(self, contract: str, version: str) -> None:
        """Look the version up again on next use (it has just been registered)."""
        with self._lock:
            self._missed.pop((contract, version), None)

    def check(self, contract: str, version: str, output: dict[str, Any]) -> tuple[ContractStatus, list[Violation]]:
        """What checking ``output`` against ``contract`` ``version`` finds (the rollups' check).

        An unregistered version, or a catalog where neither the only tool nor a tool named
        like the contract (a tool call's contract is its tool's name) applies, is
        ``unregistered``: counted, never an ingest failure.
        """
        validator = self.get(contract, version)
        if validator is None:
            return ContractStatus.unregistered, []
        try:
            found = validator.violations(output, tool=validator.tool_for(contract))
        except ContractError:
            return ContractStatus.unregistered, []
        except Exception:
            # jsonschema runs on whatever an application sent, inside the preparation of a batch
            # other requests share: its failure (it raised OverflowError on an infinite number
            # under multipleOf) leaves this output unchecked and fails nothing.
            if (contract, version) not in self._failed:
                self._failed.add((contract, version))
                log.warning(
                    "checking an output against contract %r version %r raised; such outputs are "
                    "counted unchecked (logged once per version)",
                    contract,
                    version,
                    exc_info=True,
                )
            return ContractStatus.unchecked, []
        return (ContractStatus.invalid if found else ContractStatus.valid), found

    def facts(self, contract: str, version: str) -> SchemaFacts | None:
        """What ``contract`` ``version`` declares for its outputs (the schema ``check`` uses), if registered."""
        validator = self.get(contract, version)
        if validator is None:
            return None
        try:
            return validator.facts(validator.tool_for(contract))
        except ContractError:
            return None


# --- the registry ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RegisteredContract:
    """One registered, immutable version of a contract.

    >>> r, created = register_contract(store, "intake", "3", contract, author="ana")   # doctest: +SKIP
    >>> r.validator().violations({"priority": "urgent"})                              # doctest: +SKIP
    [Violation(path='priority', keyword='enum')]
    """

    contract: str
    version: str
    definition: Contract
    invocation_hash: str
    discovery_hash: str
    content_hash: str
    registered_at: datetime
    author: str | None
    note: str | None

    def validator(self) -> ContractValidator:
        return ContractValidator(self.definition, where=f"contract {self.contract!r} version {self.version!r}")

    def summary(self) -> dict[str, Any]:
        """The listing form: everything but the document."""
        return {
            "contract": self.contract,
            "version": self.version,
            "catalog": self.definition.catalog,
            "tools": [t.name for t in self.definition.tools],
            "formats": sorted({t.format.value for t in self.definition.tools}),
            "invocation_hash": self.invocation_hash,
            "discovery_hash": self.discovery_hash,
            "content_hash": self.content_hash,
            "registered_at": self.registered_at.astimezone(UTC).isoformat().replace("+00:00", "Z"),
            "author": self.author,
            "note": self.note,
        }

    def to_json(self) -> dict[str, Any]:
        return {**self.summary(), "document": self.definition.document}


def _check_name(what: str, value: str) -> None:
    if not isinstance(value, str) or not value.strip():
        raise ContractInvalid(what, "must be a non-empty string")
    if len(value) > 200:
        raise ContractInvalid(what, "must be at most 200 characters")


def register_contract(
    store: ContractStore,
    contract: str,
    version: str,
    document: Contract | Any,
    *,
    author: str | None = None,
    note: str | None = None,
    now: datetime | None = None,
) -> tuple[RegisteredContract, bool]:
    """Register ``document`` (a Contract, or a parsed JSON document) as ``contract`` ``version``.

    Returns the registered version and whether it is new. Registering the same
    content again (the same canonical JSON: key order aside) is a no-op returning
    the existing row, whatever author and note say; different content under a
    registered version raises ``ContractConflict``. Array order is content here,
    even where it validates the same (an enum's order is what a model reads).
    """
    _check_name("the contract name", contract)
    _check_name("the contract version", version)
    definition = document if isinstance(document, Contract) else contract_from_document(document)
    for t in definition.tools:  # what the bounded engine cannot check is refused now, not met at ingest
        prepare_schema(
            t.schema, where=f"contract {contract!r} version {version!r}{'' if t.name is None else f': tool {t.name!r}'}"
        )
    content = definition.content_hash
    stored = store.add_contract_version(
        ContractRow(
            contract,
            version,
            canonical_json(definition.document).decode(),
            content,
            definition.catalog,
            orjson.dumps([t.to_json() for t in definition.tools], option=orjson.OPT_SORT_KEYS).decode(),
            definition.invocation_hash,
            definition.discovery_hash,
            now or datetime.now(UTC),
            author,
            note,
        )
    )
    if stored is not None and stored != content:
        raise ContractConflict(contract, version, stored, content)
    store.contract_validators.forget_miss(contract, version)
    return get_contract(store, contract, version), stored is None


def _registered(row: ContractRow) -> RegisteredContract:
    document = orjson.loads(row.document)
    definition = contract_from_document(document, where=f"stored contract {row.contract!r} version {row.version!r}")
    return RegisteredContract(
        row.contract,
        row.version,
        definition,
        row.invocation_hash,
        row.discovery_hash,
        row.content_hash,
        row.registered_at,
        row.author,
        row.note,
    )


def get_contract(store: ContractStore, contract: str, version: str) -> RegisteredContract:
    """The registered version, or ``ContractNotFound``."""
    row = store.contract_version(contract, version)
    if row is None:
        raise ContractNotFound(contract, version)
    return _registered(row)


def list_contracts(store: ContractStore, contract: str | None = None) -> list[RegisteredContract]:
    """Every registered version (of one contract), by contract, oldest registration first."""
    return [_registered(r) for r in store.contract_versions(contract)]
