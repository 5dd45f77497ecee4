"""Field paths, and flattening an output into per-field observations.

Path syntax (README, *Field paths and types*): ``a.b`` for nesting, ``a[]`` for the items of array
``a``, ``a[].b`` for a key inside array items. A key that itself contains
``.``, ``[``, ``]`` or ``\\`` has those characters escaped with a backslash,
so two different documents never share a path.

Presence is counted per *unit*: for a path outside any array the unit is the
output, for a path under ``a[]`` it is an item of ``a``. The *scope* of a path
is the array path whose items are its units, or None for the output itself
(not '', which is the path of a key named '').

At ingest the same counting runs in C over the parsed outputs
(``rollup.py``, ``_speedups.Acc``); ``flatten_output`` here is the reference
definition, one output at a time, which tests hold the accumulator to.

>>> [(o.path, o.type) for o in flatten_output({"a": {"b": [1, 2.5]}})]
[('a', 'object'), ('a.b', 'array'), ('a.b[]', 'integer'), ('a.b[]', 'number')]
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Any

__all__ = ["JsonType", "Observation", "flatten_output", "items_path", "join_key", "json_type_of", "pointer_for_key"]


class JsonType(str, Enum):
    """The JSON types shapewatch counts. ``integer`` is a kind of ``number``."""

    null = "null"
    boolean = "boolean"
    integer = "integer"
    number = "number"
    string = "string"
    array = "array"
    object = "object"


_ESCAPES = str.maketrans({"\\": "\\\\", ".": "\\.", "[": "\\[", "]": "\\]"})


def join_key(parent: str | None, key: str) -> str:
    """The path of ``key`` inside the object at path ``parent`` (None for the output itself).

    The output is None rather than '' because '' is the path of a key named ''.
    """
    k = key.translate(_ESCAPES)
    return k if parent is None else f"{parent}.{k}"


def items_path(array_path: str) -> str:
    """The path of the items of the array at ``array_path``."""
    return array_path + "[]"


def pointer_for_key(key: str) -> str:
    """A JSON Pointer (RFC 6901) step for ``key``: the form DuckDB's JSON functions take safely."""
    return "/" + key.replace("~", "~0").replace("/", "~1")


def json_type_of(v: Any) -> JsonType:
    """The JSON type of a parsed value; a whole float (``3.0``) is an integer."""
    if v is None:
        return JsonType.null
    if v is True or v is False:
        return JsonType.boolean
    if isinstance(v, int):
        return JsonType.integer
    if isinstance(v, float):
        return JsonType.integer if v.is_integer() else JsonType.number
    if isinstance(v, str):
        return JsonType.string
    if isinstance(v, list):
        return JsonType.array
    return JsonType.object


@dataclass(frozen=True)
class Observation:
    """One value found at one path: its type, its string value, its array length."""

    path: str
    scope: str | None  # the array path whose items are the units; None: the outputs are
    type: JsonType
    string: str | None = None
    length: int | None = None


def flatten_output(output: dict[str, Any]) -> Iterator[Observation]:
    """Every (path, type, value) found in one output, in document order."""
    yield from _flatten_object(output, None, None)


def _flatten_object(obj: dict[str, Any], parent: str | None, scope: str | None) -> Iterator[Observation]:
    for k, v in obj.items():
        yield from _flatten_value(v, join_key(parent, k), scope)


def _flatten_value(v: Any, path: str, scope: str | None) -> Iterator[Observation]:
    t = json_type_of(v)
    if t is JsonType.array:
        yield Observation(path, scope, t, length=len(v))
        for item in v:
            yield from _flatten_value(item, items_path(path), path)
    elif t is JsonType.object:
        yield Observation(path, scope, t)
        yield from _flatten_object(v, path, scope)
    else:
        yield Observation(path, scope, t, string=v if t is JsonType.string else None)
