"""The JSON Schema engine outputs are checked with: Draft 2020-12, bounded in time, closed to the world.

A registered contract is written by one team and checked against whatever every
application sends, inside the service that takes everyone's traffic. Three things of
stock jsonschema do not fit that:

- **Regular expressions backtrack.** Python's ``re`` runs ``pattern`` and
  ``patternProperties`` with a backtracking engine that holds the GIL: ``^(a+)+$``
  against ``"aaaa...!"`` doubles its time with every character (measured: 34 s for one
  output, during which no other request of the service was answered). Here every
  pattern runs on RE2, whose time is linear in the text; a pattern RE2 cannot run
  (backreferences, lookaround) is refused when the contract is registered.
- **References reach out.** An unresolved ``$ref`` to ``http://`` or ``file://`` was
  fetched, twice per checked output. Here a reference resolves inside the document only
  (its own ``$defs``, anchors and embedded ``$id`` resources); any other is refused at
  registration, and a stored one that slips through fails its output's check (counted
  ``unchecked``), never a fetch.
- **``uniqueItems`` is quadratic** for arrays of objects: it compares every pair. Here
  items are compared by their canonical JSON, in one pass.

``prepare_schema`` is the registration check; ``bounded_validator`` builds the validator
``ContractValidator`` uses.

>>> prepare_schema({"type": "string", "pattern": "^(a+)+$"}, where="contract")
>>> bounded_validator({"type": "string", "pattern": "^(a+)+$"}).is_valid("a" * 100_000 + "!")
False
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any, cast

import orjson
import re2
from jsonschema import Draft202012Validator, FormatChecker, ValidationError
from jsonschema.validators import extend
from referencing import Registry, Resource
from referencing.exceptions import NoSuchResource, Unresolvable
from referencing.jsonschema import DRAFT202012

from .errors import ContractInvalid

__all__ = ["bounded_validator", "compile_pattern", "prepare_schema", "search"]

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a refused pattern is reported by us, not on stderr
_OPTIONS.max_mem = 8 << 20  # RE2's default; a pattern that needs more is refused at registration
# Only whether a pattern matches is asked, never its groups: without captures RE2 runs its DFA
# (measured: ^(a+)+$ against 4,000 a's and a "!" in 16 us, against 167 us with captures).
_OPTIONS.never_capture = True


@functools.lru_cache(maxsize=4096)
def compile_pattern(pattern: str) -> Any:
    """``pattern`` compiled for RE2 (cached); raises ``re2.error`` when RE2 cannot run it."""
    return re2.compile(pattern, _OPTIONS)


def search(pattern: str, text: str) -> bool:
    """Whether ``pattern`` matches somewhere in ``text`` (JSON Schema's unanchored match), in linear time.

    A pattern RE2 cannot run never matches (registration refuses such patterns; one in a
    contract stored before that rule is reported by the ``pattern`` keyword instead).
    """
    try:
        return compile_pattern(pattern).search(text) is not None
    except re2.error:
        return False


# --- registration ---------------------------------------------------------------------------


def _refuse_retrieval(uri: str) -> Resource[Any]:
    # Every reference that is not inside the document ends here: nothing is fetched.
    # (an attrs class: mypy does not see its fields as arguments)
    raise NoSuchResource(ref=uri)  # type: ignore[call-arg]


def _registry(schema: Any) -> Registry[Any]:
    """A registry holding ``schema`` and its embedded resources only."""
    resource = Resource.from_contents(schema, default_specification=DRAFT202012)
    empty: Registry[Any] = Registry(retrieve=_refuse_retrieval)  # type: ignore[call-arg]
    return cast(Registry[Any], empty.with_resource(resource.id() or "", resource).crawl())


def _pointer(parts: tuple[str | int, ...]) -> str:
    return "/" + "/".join(str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def _walk(node: Any, at: tuple[str | int, ...], resolver: Any) -> Iterator[tuple[tuple[str | int, ...], Any, Any]]:
    """Each schema object of ``node`` with its location and the resolver that applies there."""
    if isinstance(node, list):
        for i, item in enumerate(node):
            yield from _walk(item, (*at, i), resolver)
        return
    if not isinstance(node, dict):
        return
    if isinstance(node.get("$id"), str):
        resolver = resolver.in_subresource(Resource.from_contents(node, default_specification=DRAFT202012))
    yield at, node, resolver
    for key, value in node.items():
        if key in ("enum", "const", "examples", "default"):
            continue  # values, not schemas
        if isinstance(value, (dict, list)):
            yield from _walk(value, (*at, key), resolver)


def prepare_schema(schema: Any, *, where: str) -> None:
    """Refuse what the bounded engine cannot check: a pattern RE2 cannot run, a reference
    outside the document, ``unevaluatedProperties`` beside ``patternProperties``."""
    registry = _registry(schema)
    root = registry.resolver(base_uri=Resource.from_contents(schema, default_specification=DRAFT202012).id() or "")
    unevaluated = patterned = False
    for at, node, resolver in _walk(schema, (), root):
        patterns: list[tuple[tuple[str | int, ...], Any]] = []
        if "pattern" in node and isinstance(node["pattern"], str):
            patterns.append(((*at, "pattern"), node["pattern"]))
        if isinstance(node.get("patternProperties"), dict):
            patterned = True
            patterns += [((*at, "patternProperties", p), p) for p in node["patternProperties"]]
        unevaluated = unevaluated or "unevaluatedProperties" in node
        for loc, pattern in patterns:
            try:
                compile_pattern(pattern)
            except re2.error as exc:
                reason = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else str(exc)
                raise ContractInvalid(
                    where,
                    f"the pattern {pattern!r} at {_pointer(loc)} cannot be checked in "
                    f"linear time ({reason}); patterns run on RE2, which has no "
                    "backreferences or lookaround",
                ) from None
        for keyword in ("$ref", "$dynamicRef"):
            ref = node.get(keyword)
            if not isinstance(ref, str):
                continue
            try:
                resolver.lookup(ref)
            except Unresolvable:
                raise ContractInvalid(
                    where,
                    f"the reference {ref!r} at {_pointer((*at, keyword))} does not "
                    "resolve inside the document; references to other documents "
                    "(http, file, ...) are never fetched: inline the schema under "
                    "$defs and refer to it as #/$defs/...",
                ) from None
    if unevaluated and patterned:
        raise ContractInvalid(
            where, "unevaluatedProperties beside patternProperties is not supported; use additionalProperties"
        )


# --- checking ---------------------------------------------------------------------------------


def _pattern(validator: Any, patrn: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not search(patrn, instance):
        yield ValidationError(f"{instance!r} does not match {patrn!r}")


def _pattern_properties(
    validator: Any, pattern_properties: dict[str, Any], instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in pattern_properties.items():
        for k, v in instance.items():
            if search(pattern, k):
                yield from validator.descend(v, subschema, path=k, schema_path=pattern)


def additional_properties(instance: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    """The keys of ``instance`` that neither ``properties`` nor ``patternProperties`` cover."""
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    return [k for k in instance if k not in properties and not any(search(p, k) for p in patterns)]


def _additional_properties(validator: Any, ap: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    extras = additional_properties(instance, schema)
    if validator.is_type(ap, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], ap, path=extra)
    elif not ap and extras:
        yield ValidationError(
            f"Additional properties are not allowed ({', '.join(map(repr, sorted(extras)))} "
            f"{'was' if len(extras) == 1 else 'were'} unexpected)"
        )


def _canonical_item(value: Any) -> Any:
    # JSON Schema equality: 1 equals 1.0, true does not equal 1, key order never matters.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_canonical_item(v) for v in value]
    if isinstance(value, dict):
        return {k: _canonical_item(v) for k, v in value.items()}
    return value


def _unique_items(validator: Any, ui: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not ui or not validator.is_type(instance, "array"):
        return
    seen: set[bytes] = set()
    for item in instance:
        key = orjson.dumps(_canonical_item(item), option=orjson.OPT_SORT_KEYS)
        if key in seen:
            yield ValidationError(f"{instance!r} has non-unique elements")
            return
        seen.add(key)


def _format_checker() -> FormatChecker:
    checker = FormatChecker()
    checker.checkers = dict(Draft202012Validator.FORMAT_CHECKER.checkers)

    def is_regex(instance: object) -> bool:
        if isinstance(instance, str):
            compile_pattern(instance)
        return True

    checker.checks("regex", raises=re2.error)(is_regex)
    return checker


_FORMATS = _format_checker()

_Bounded = extend(
    Draft202012Validator,
    validators={
        "pattern": _pattern,
        "patternProperties": _pattern_properties,
        "additionalProperties": _additional_properties,
        "uniqueItems": _unique_items,
    },
)


def bounded_validator(schema: Any) -> Any:
    """A Draft 2020-12 validator of ``schema`` with the bounds of this module (formats asserted)."""
    return _Bounded(schema, format_checker=_FORMATS, registry=_registry(schema))
