"""Classifying the changes between two contracts: breaking, compatible or behavioral.

The question a change answers is whether what conformed before still
conforms: a change that can turn a valid output (or tool call) invalid is
**breaking** (a field or tool removed, a new required field, an enum value
removed, a type changed or narrowed, a format, pattern or bound added or
tightened, ``additionalProperties`` closed, an ``anyOf``/``oneOf`` option
removed); one that only accepts more is **compatible** (an optional field
added, an enum value added, a bound loosened, a type widened such as integer
to number); one that changes no validation but what a model reads is
**behavioral** (descriptions, titles, examples, defaults, unknown keywords, a
tool added, OpenAI's ``strict`` flag). Any other change to a validation
keyword is breaking when the keyword is added or changed and compatible when
it is removed (a conservative gate: the diff cannot always prove a rewrite
equivalent, e.g. ``type: [string, null]`` rewritten as an ``anyOf``).

Comparisons ignore key order and the order of ``required``, ``enum``, ``type``
lists and ``anyOf``/``oneOf``/``allOf`` options. Local ``$ref`` (``#/$defs/x``,
``#/definitions/x``) are followed on both sides, a change inside a definition
being reported at every path that uses it; recursive definitions are
followed once per path.

**Where a change is.** ``tool`` names the tool (None for a plain JSON Schema);
``path`` is the field inside that tool's arguments (or the structured output)
in shapewatch's syntax (``customer.tier``, ``items[].sku``), None for the tool
or schema itself; ``anyOf`` options share the path of the value they
describe, and ``*`` stands for the values of ``additionalProperties``. Two
single tools are compared whatever their names (a rename is breaking);
catalogs are matched by tool name.

**Verdict and exit code** (``shapewatch contract diff``): 2 when any change is
breaking, else 1 when any is behavioral, else 0.

>>> from collector.contracts import contract_from_document as read
>>> old = read({"type": "object", "properties": {"tier": {"enum": ["gold", "free"]}}})
>>> new = read({"type": "object", "properties": {"tier": {"enum": ["free"]}}})
>>> [(c.path, c.kind.value, c.classification.value) for c in diff_contracts(old, new)]
[('tier', 'enum_value_removed', 'breaking')]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import orjson

from .contracts import ANNOTATION_KEYWORDS, VALIDATION_KEYWORDS, Contract, Tool, canonical_json, deref, normalize_schema
from .flatten import items_path, join_key

__all__ = [
    "ChangeKind",
    "Classification",
    "ContractChange",
    "Verdict",
    "diff_contracts",
    "diff_exit_code",
    "diff_verdict",
]


class Classification(str, Enum):
    """What a change means for what conformed before."""

    breaking = "breaking"
    behavioral = "behavioral"
    compatible = "compatible"


class ChangeKind(str, Enum):
    """What changed; each kind has one classification (``ChangeKind.classification``)."""

    tool_added = "tool_added"
    tool_removed = "tool_removed"
    tool_renamed = "tool_renamed"
    strict_changed = "strict_changed"
    description_changed = "description_changed"
    annotation_changed = "annotation_changed"  # title, examples, default, ..., unknown keywords
    field_added = "field_added"  # optional
    required_field_added = "required_field_added"
    field_removed = "field_removed"
    required_added = "required_added"  # an existing field became required
    required_removed = "required_removed"
    type_narrowed = "type_narrowed"
    type_widened = "type_widened"
    type_changed = "type_changed"
    enum_value_added = "enum_value_added"
    enum_value_removed = "enum_value_removed"
    enum_added = "enum_added"  # an enum where there was none
    enum_removed = "enum_removed"
    const_added = "const_added"
    const_changed = "const_changed"
    const_removed = "const_removed"
    format_added = "format_added"
    format_changed = "format_changed"
    format_removed = "format_removed"
    bound_tightened = "bound_tightened"
    bound_loosened = "bound_loosened"
    pattern_added = "pattern_added"
    pattern_changed = "pattern_changed"
    pattern_removed = "pattern_removed"
    additional_properties_closed = "additional_properties_closed"
    additional_properties_opened = "additional_properties_opened"
    option_added = "option_added"  # anyOf / oneOf
    option_removed = "option_removed"
    keyword_added = "keyword_added"
    keyword_changed = "keyword_changed"
    keyword_removed = "keyword_removed"

    @property
    def classification(self) -> Classification:
        return _CLASSES[self]


_B, _C, _H = Classification.breaking, Classification.compatible, Classification.behavioral
_CLASSES: dict[ChangeKind, Classification] = {
    ChangeKind.tool_added: _H,
    ChangeKind.tool_removed: _B,
    ChangeKind.tool_renamed: _B,
    ChangeKind.strict_changed: _H,
    ChangeKind.description_changed: _H,
    ChangeKind.annotation_changed: _H,
    ChangeKind.field_added: _C,
    ChangeKind.required_field_added: _B,
    ChangeKind.field_removed: _B,
    ChangeKind.required_added: _B,
    ChangeKind.required_removed: _C,
    ChangeKind.type_narrowed: _B,
    ChangeKind.type_widened: _C,
    ChangeKind.type_changed: _B,
    ChangeKind.enum_value_added: _C,
    ChangeKind.enum_value_removed: _B,
    ChangeKind.enum_added: _B,
    ChangeKind.enum_removed: _C,
    ChangeKind.const_added: _B,
    ChangeKind.const_changed: _B,
    ChangeKind.const_removed: _C,
    ChangeKind.format_added: _B,
    ChangeKind.format_changed: _B,
    ChangeKind.format_removed: _C,
    ChangeKind.bound_tightened: _B,
    ChangeKind.bound_loosened: _C,
    ChangeKind.pattern_added: _B,
    ChangeKind.pattern_changed: _B,
    ChangeKind.pattern_removed: _C,
    ChangeKind.additional_properties_closed: _B,
    ChangeKind.additional_properties_opened: _C,
    ChangeKind.option_added: _C,
    ChangeKind.option_removed: _B,
    ChangeKind.keyword_added: _B,
    ChangeKind.keyword_changed: _B,
    ChangeKind.keyword_removed: _C,
}


class Verdict(str, Enum):
    """The verdict of a whole diff: its most serious change."""

    breaking = "breaking"
    behavioral = "behavioral"
    compatible = "compatible"
    unchanged = "unchanged"

    @property
    def exit_code(self) -> int:
        return {Verdict.breaking: 2, Verdict.behavioral: 1}.get(self, 0)


@dataclass(frozen=True)
class ContractChange:
    """One change between two contracts, where it is, and what it means.

    >>> ContractChange("customer.tier", ChangeKind.enum_value_removed, 'enum value "gold" removed').classification
    <Classification.breaking: 'breaking'>
    """

    path: str | None  # in the tool's arguments (or the output); None: the tool or schema itself
    kind: ChangeKind
    detail: str
    tool: str | None = None  # None: a plain JSON Schema

    @property
    def classification(self) -> Classification:
        return self.kind.classification

    @property
    def location(self) -> str:
        """``tool: path`` for display (``(root)`` for the schema itself)."""
        where = self.path if self.path is not None else "(root)"
        if self.tool is None:
            return where
        return self.tool if self.path is None else f"{self.tool}: {where}"

    def to_json(self) -> dict[str, Any]:
        return {
            "tool": self.tool,
            "path": self.path,
            "kind": self.kind.value,
            "classification": self.classification.value,
            "detail": self.detail,
        }


def diff_verdict(changes: Sequence[ContractChange]) -> Verdict:
    found = {c.classification for c in changes}
    for cls, verdict in ((_B, Verdict.breaking), (_H, Verdict.behavioral), (_C, Verdict.compatible)):
        if cls in found:
            return verdict
    return Verdict.unchanged


def diff_exit_code(changes: Sequence[ContractChange]) -> int:
    """2 when any change is breaking, 1 when any is behavioral (and none breaking), else 0."""
    return diff_verdict(changes).exit_code


def diff_contracts(old: Contract, new: Contract) -> list[ContractChange]:
    """Every change from ``old`` to ``new``, sorted by tool, path, kind and detail."""
    changes: list[ContractChange] = []
    if not old.catalog and not new.catalog:
        ot, nt = old.tools[0], new.tools[0]
        if ot.name is not None and nt.name is not None and ot.name != nt.name:
            changes.append(
                ContractChange(None, ChangeKind.tool_renamed, f"tool {ot.name!r} renamed to {nt.name!r}", nt.name)
            )
        _diff_tool(ot, nt, nt.name, changes)
    else:
        olds = {t.name: t for t in old.tools}
        news = {t.name: t for t in new.tools}
        for name in sorted(olds.keys() | news.keys(), key=lambda n: n or ""):
            if name not in news:
                changes.append(ContractChange(None, ChangeKind.tool_removed, "tool removed", name))
            elif name not in olds:
                changes.append(ContractChange(None, ChangeKind.tool_added, "tool added", name))
            else:
                _diff_tool(olds[name], news[name], name, changes)
    unique = dict.fromkeys(changes)
    return sorted(unique, key=lambda c: (c.tool or "", c.path is not None, c.path or "", c.kind.value, c.detail))


def _diff_tool(old: Tool, new: Tool, name: str | None, out: list[ContractChange]) -> None:
    if old.description != new.description:
        out.append(
            ContractChange(
                None, ChangeKind.description_changed, "tool " + _edit(old.description, new.description), name
            )
        )
    if old.strict != new.strict:
        out.append(
            ContractChange(None, ChangeKind.strict_changed, f"strict {_show(old.strict)} -> {_show(new.strict)}", name)
        )
    _Differ(old.schema, new.schema, name, out).compare(old.schema, new.schema, None, frozenset(), 0)


def _show(v: Any) -> str:
    text = orjson.dumps(v, option=orjson.OPT_SORT_KEYS).decode()
    return text if len(text) <= 60 else text[:57] + "..."


def _edit(old: Any, new: Any, what: str = "description") -> str:
    if old is None:
        return f"{what} added"
    if new is None:
        return f"{what} removed"
    return f"{what} changed"


_LOWER = ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties", "minContains")
_UPPER = ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties", "maxContains")
# Keywords compared by their own rules below; every other validation keyword is compared whole.
_HANDLED = frozenset(
    {
        "type",
        "enum",
        "const",
        "format",
        "pattern",
        "multipleOf",
        "uniqueItems",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "prefixItems",
        "anyOf",
        "oneOf",
        "allOf",
        "$defs",
        "definitions",
        "$ref",
        *_LOWER,
        *_UPPER,
    }
)
_MAX_DEPTH = 64


def _types(node: dict[str, Any]) -> set[str] | None:
    t = node.get("type")
    if t is None:
        return None
    types = {t} if isinstance(t, str) else set(t)
    return types | {"integer"} if "number" in types else types


def _type_text(node: dict[str, Any]) -> str:
    t = node.get("type")
    return "any" if t is None else t if isinstance(t, str) else "|".join(sorted(t))


def _openness(node: dict[str, Any]) -> str:
    ap = node.get("additionalProperties", True)
    if ap is True or ap == {}:
        return "open"
    if ap is False or ap == {"not": {}}:
        return "closed"
    return "schema"


class _Differ:
    """One schema pair: the roots (for ``$ref``), the tool, and where changes go."""

    def __init__(self, old_root: Any, new_root: Any, tool: str | None, out: list[ContractChange]) -> None:
        self.old_root, self.new_root, self.tool, self.out = old_root, new_root, tool, out

    def add(self, path: str | None, kind: ChangeKind, detail: str) -> None:
        self.out.append(ContractChange(path, kind, detail, self.tool))

    def compare(self, old: Any, new: Any, path: str | None, active: frozenset[tuple[str, ...]], depth: int) -> None:
        old, old_refs = deref(old, self.old_root)
        new, new_refs = deref(new, self.new_root)
        if not isinstance(old, dict) or not isinstance(new, dict) or depth > _MAX_DEPTH:
            return
        if old_refs or new_refs:
            # A recursive definition is followed once along one path.
            key = (*old_refs, "->", *new_refs)
            if key in active:
                return
            active = active | {key}
        self._annotations(old, new, path)
        self._type(old, new, path)
        self._enum(old, new, path)
        self._scalar(
            old, new, path, "const", ChangeKind.const_added, ChangeKind.const_changed, ChangeKind.const_removed
        )
        self._scalar(
            old, new, path, "format", ChangeKind.format_added, ChangeKind.format_changed, ChangeKind.format_removed
        )
        self._scalar(
            old, new, path, "pattern", ChangeKind.pattern_added, ChangeKind.pattern_changed, ChangeKind.pattern_removed
        )
        self._bounds(old, new, path)
        self._properties(old, new, path, active, depth)
        self._additional(old, new, path, active, depth)
        self._items(old, new, path, active, depth)
        for kw in ("anyOf", "oneOf", "allOf"):
            self._options(old, new, path, kw, active, depth)
        for kw in sorted((old.keys() | new.keys()) & (VALIDATION_KEYWORDS - _HANDLED)):
            self._whole(old, new, path, kw)
        if "$ref" in old or "$ref" in new:  # left in place: not a local reference
            self._whole(old, new, path, "$ref")

    def _annotations(self, old: dict[str, Any], new: dict[str, Any], path: str | None) -> None:
        for kw in sorted(old.keys() | new.keys()):
            if kw in VALIDATION_KEYWORDS or kw == "$schema":
                continue
            o, n = old.get(kw), new.get(kw)
            if canonical_json(o) == canonical_json(n):
                continue
            if kw == "description":
                self.add(path, ChangeKind.description_changed, _edit(o, n))
            else:
                label = kw if kw in ANNOTATION_KEYWORDS else f"keyword {kw!r}"
                self.add(
                    path,
                    ChangeKind.annotation_changed,
                    _edit(o, n, label) + (f": {_show(o)} -> {_show(n)}" if o is not None and n is not None else ""),
                )

    def _type(self, old: dict[str, Any], new: dict[str, Any], path: str | None) -> None:
        o, n = _types(old), _types(new)
        if o == n:
            return
        detail = f"type {_type_text(old)} -> {_type_text(new)}"
        if n is None or (o is not None and o <= n):
            self.add(path, ChangeKind.type_widened, detail)
        elif o is None or n <= o:
            self.add(path, ChangeKind.type_narrowed, detail)
        else:
            self.add(path, ChangeKind.type_changed, detail)

    def _enum(self, old: dict[str, Any], new: dict[str, Any], path: str | None) -> None:
        o, n = old.get("enum"), new.get("enum")
        if not isinstance(o, list) and not isinstance(n, list):
            return
        if not isinstance(o, list):
            self.add(path, ChangeKind.enum_added, f"enum {_show(normalize_schema({'enum': n})['enum'])} added")
            return
        if not isinstance(n, list):
            self.add(path, ChangeKind.enum_removed, "enum removed")
            return
        ov = {canonical_json(v): v for v in o}
        nv = {canonical_json(v): v for v in n}
        for k in sorted(ov.keys() - nv.keys()):
            self.add(path, ChangeKind.enum_value_removed, f"enum value {k.decode()} removed")
        for k in sorted(nv.keys() - ov.keys()):
            self.add(path, ChangeKind.enum_value_added, f"enum value {k.decode()} added")

    def _scalar(
        self,
        old: dict[str, Any],
        new: dict[str, Any],
        path: str | None,
        kw: str,
        added: ChangeKind,
        changed: ChangeKind,
        removed: ChangeKind,
    ) -> None:
        if kw not in old and kw not in new:
            return
        o, n = old.get(kw), new.get(kw)
        if kw not in old:
            self.add(path, added, f"{kw} {_show(n)} added")
        elif kw not in new:
            self.add(path, removed, f"{kw} {_show(o)} removed")
        elif canonical_json(o) != canonical_json(n):
            self.add(path, changed, f"{kw} {_show(o)} -> {_show(n)}")

    def _bounds(self, old: dict[str, Any], new: dict[str, Any], path: str | None) -> None:
        for kw in (*_LOWER, *_UPPER):
            o, n = old.get(kw), new.get(kw)
            if o == n:
                continue
            if o is None:
                self.add(path, ChangeKind.bound_tightened, f"{kw} {_show(n)} added")
            elif n is None:
                self.add(path, ChangeKind.bound_loosened, f"{kw} {_show(o)} removed")
            else:
                tighter = n > o if kw in _LOWER else n < o
                self.add(
                    path,
                    ChangeKind.bound_tightened if tighter else ChangeKind.bound_loosened,
                    f"{kw} {_show(o)} -> {_show(n)}",
                )
        o, n = old.get("multipleOf"), new.get("multipleOf")
        if o != n:
            if o is None:
                self.add(path, ChangeKind.bound_tightened, f"multipleOf {_show(n)} added")
            elif n is None:
                self.add(path, ChangeKind.bound_loosened, f"multipleOf {_show(o)} removed")
            else:  # every multiple of n is one of o when n is a multiple of o: fewer values
                looser = (o / n).is_integer() and not (n / o).is_integer()
                self.add(
                    path,
                    ChangeKind.bound_loosened if looser else ChangeKind.bound_tightened,
                    f"multipleOf {_show(o)} -> {_show(n)}",
                )
        o, n = bool(old.get("uniqueItems")), bool(new.get("uniqueItems"))
        if o != n:
            self.add(
                path,
                ChangeKind.bound_tightened if n else ChangeKind.bound_loosened,
                f"uniqueItems {'added' if n else 'removed'}",
            )

    def _properties(
        self, old: dict[str, Any], new: dict[str, Any], path: str | None, active: frozenset[tuple[str, ...]], depth: int
    ) -> None:
        op = old.get("properties") if isinstance(old.get("properties"), dict) else {}
        np = new.get("properties") if isinstance(new.get("properties"), dict) else {}
        assert isinstance(op, dict) and isinstance(np, dict)
        oreq = set(old.get("required") or ())
        nreq = set(new.get("required") or ())
        for name in sorted(op.keys() | np.keys()):
            p = join_key(path, name)
            if name not in np:
                self.add(p, ChangeKind.field_removed, "field removed" + (" (it was required)" if name in oreq else ""))
            elif name not in op:
                if name in nreq:
                    self.add(p, ChangeKind.required_field_added, "required field added")
                else:
                    self.add(p, ChangeKind.field_added, "optional field added")
            else:
                if name in nreq and name not in oreq:
                    self.add(p, ChangeKind.required_added, "field became required")
                elif name in oreq and name not in nreq:
                    self.add(p, ChangeKind.required_removed, "field became optional")
                self.compare(op[name], np[name], p, active, depth + 1)
        declared = op.keys() | np.keys()
        for name in sorted((nreq - oreq) - declared):
            self.add(join_key(path, name), ChangeKind.required_added, "field became required")
        for name in sorted((oreq - nreq) - declared):
            self.add(join_key(path, name), ChangeKind.required_removed, "field became optional")

    def _additional(
        self, old: dict[str, Any], new: dict[str, Any], path: str | None, active: frozenset[tuple[str, ...]], depth: int
    ) -> None:
        o, n = _openness(old), _openness(new)
        if o == n == "schema":
            self.compare(
                old["additionalProperties"], new["additionalProperties"], join_key(path, "*"), active, depth + 1
            )
        elif o != n:
            closing = n == "closed" or o == "open"
            text = {"open": "open", "closed": "closed (false)", "schema": "restricted to a schema"}
            self.add(
                path,
                ChangeKind.additional_properties_closed if closing else ChangeKind.additional_properties_opened,
                f"additionalProperties {text[o]} -> {text[n]}",
            )

    def _items(
        self, old: dict[str, Any], new: dict[str, Any], path: str | None, active: frozenset[tuple[str, ...]], depth: int
    ) -> None:
        p = items_path(path or "")
        o, n = old.get("items"), new.get("items")
        if isinstance(o, list) or isinstance(n, list):  # the pre-2020 tuple form: compared whole
            self._whole(old, new, path, "items")
        elif o is not None and n is not None:
            self.compare(o, n, p, active, depth + 1)
        elif o is not None or n is not None:
            self.add(
                path,
                ChangeKind.keyword_added if n is not None else ChangeKind.keyword_removed,
                f"items {'constrained' if n is not None else 'constraint removed'}",
            )
        ol, nl = old.get("prefixItems") or [], new.get("prefixItems") or []
        for i in range(min(len(ol), len(nl))):
            self.compare(ol[i], nl[i], p, active, depth + 1)
        if len(nl) > len(ol):
            self.add(path, ChangeKind.keyword_added, f"prefixItems {len(ol)} -> {len(nl)} positions")
        elif len(ol) > len(nl):
            self.add(path, ChangeKind.keyword_removed, f"prefixItems {len(ol)} -> {len(nl)} positions")

    def _options(
        self,
        old: dict[str, Any],
        new: dict[str, Any],
        path: str | None,
        kw: str,
        active: frozenset[tuple[str, ...]],
        depth: int,
    ) -> None:
        ol, nl = old.get(kw), new.get(kw)
        if not isinstance(ol, list) and not isinstance(nl, list):
            return
        conjunction = kw == "allOf"  # a subschema more is a constraint more
        if not isinstance(ol, list) or not isinstance(nl, list):
            self.add(
                path,
                ChangeKind.keyword_added if isinstance(nl, list) else ChangeKind.keyword_removed,
                f"{kw} {'added' if isinstance(nl, list) else 'removed'}",
            )
            return
        pairs, left, right = _match_options(ol, nl, self.old_root, self.new_root)
        for o, n in pairs:
            self.compare(o, n, path, active, depth + 1)
        for o in left:
            self.add(
                path,
                ChangeKind.keyword_removed if conjunction else ChangeKind.option_removed,
                f"{kw} option {_describe(o)} removed",
            )
        for n in right:
            self.add(
                path,
                ChangeKind.keyword_added if conjunction else ChangeKind.option_added,
                f"{kw} option {_describe(n)} added",
            )

    def _whole(self, old: dict[str, Any], new: dict[str, Any], path: str | None, kw: str) -> None:
        if kw not in old and kw not in new:
            return
        o, n = normalize_schema({kw: old.get(kw)}), normalize_schema({kw: new.get(kw)})
        if kw not in old:
            self.add(path, ChangeKind.keyword_added, f"{kw} added")
        elif kw not in new:
            self.add(path, ChangeKind.keyword_removed, f"{kw} removed")
        elif canonical_json(o) != canonical_json(n):
            self.add(path, ChangeKind.keyword_changed, f"{kw} changed")


def _describe(option: Any) -> str:
    if isinstance(option, dict) and isinstance(option.get("$ref"), str):
        return str(option["$ref"])
    return _show(normalize_schema(option))


def _signature(option: Any, root: Any) -> bytes:
    """What tells one option from the others when its details changed: its type and constants."""
    node, _ = deref(option, root)
    if not isinstance(node, dict):
        return canonical_json(node)
    consts = {
        k: canonical_json(sub.get("const"))
        for k, sub in (node.get("properties") or {}).items()
        if isinstance(sub, dict) and "const" in sub
    }
    return canonical_json(
        {
            "type": normalize_schema({"type": node.get("type")})["type"],
            "const": node.get("const"),
            "discriminators": {k: v.decode() for k, v in consts.items()},
        }
    )


def _match_options(
    old: list[Any], new: list[Any], old_root: Any, new_root: Any
) -> tuple[list[tuple[Any, Any]], list[Any], list[Any]]:
    """Pair options that are the same (exactly), then alike (same signature, or the only ones left)."""
    left = list(old)
    right = list(new)
    pairs: list[tuple[Any, Any]] = []
    for o in list(left):
        key = canonical_json(normalize_schema(o))
        for n in right:
            if canonical_json(normalize_schema(n)) == key:
                pairs.append((o, n))
                left.remove(o)
                right.remove(n)
                break
    if len(left) == 1 and len(right) == 1:
        return [*pairs, (left[0], right[0])], [], []
    sig_old = [_signature(o, old_root) for o in left]
    sig_new = [_signature(n, new_root) for n in right]
    unmatched: list[Any] = []
    taken: set[int] = set()
    for o, so in zip(left, sig_old, strict=True):
        if sig_old.count(so) == 1 and sig_new.count(so) == 1:
            j = sig_new.index(so)
            pairs.append((o, right[j]))
            taken.add(j)
        else:
            unmatched.append(o)
    return pairs, unmatched, [n for j, n in enumerate(right) if j not in taken]
