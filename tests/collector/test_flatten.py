"""Tests for collector.flatten (the reference definition of paths and observations),
and for the C accumulator that rollups use at ingest, held to that reference.

The accumulator test reads ``RollupBatch.tables()`` (formerly the private
``_tables()``): it is the only place where the accumulator's counts appear with
their path names before they go into DuckDB, and holding those counts to
``flatten_output`` is the point.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shapewatch.collector.flatten import (
    JsonType,
    Observation,
    flatten_output,
    items_path,
    join_key,
    json_type_of,
    pointer_for_key,
)
from shapewatch.collector.rollup import RollupBatch, RollupConfig

PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
O = Observation  # noqa: E741  short names keep the expected tables readable
T = JsonType


def flat(output: dict[str, Any]) -> list[Observation]:
    return list(flatten_output(output))


# --- the reference definition ------------------------------------------------------------------------


def test_nested_objects() -> None:
    assert flat({"customer": {"tier": "gold", "address": {"city": "Oslo"}}, "n": 1}) == [
        O("customer", None, T.object),
        O("customer.tier", None, T.string, string="gold"),
        O("customer.address", None, T.object),
        O("customer.address.city", None, T.string, string="Oslo"),
        O("n", None, T.integer),
    ]


def test_arrays_of_objects_are_scoped_to_their_array() -> None:
    assert flat({"entities": [{"type": "order", "id": 7}, {"type": "user"}]}) == [
        O("entities", None, T.array, length=2),
        O("entities[]", "entities", T.object),
        O("entities[].type", "entities", T.string, string="order"),
        O("entities[].id", "entities", T.integer),
        O("entities[]", "entities", T.object),
        O("entities[].type", "entities", T.string, string="user"),
    ]


def test_the_scope_of_a_key_inside_array_items_is_the_array() -> None:
    (_, _, b) = flat({"a": [{"b": True}]})
    assert (b.path, b.scope) == ("a[].b", "a")
    deeper = flat({"x": {"a": [{"b": {"c": [None]}}]}})
    assert [(o.path, o.scope) for o in deeper] == [
        ("x", None),
        ("x.a", None),
        ("x.a[]", "x.a"),
        ("x.a[].b", "x.a"),
        ("x.a[].b.c", "x.a"),
        ("x.a[].b.c[]", "x.a[].b.c"),
    ]


def test_arrays_of_arrays() -> None:
    assert flat({"a": [[1, "x"], [], [[2.5]]]}) == [
        O("a", None, T.array, length=3),
        O("a[]", "a", T.array, length=2),
        O("a[][]", "a[]", T.integer),
        O("a[][]", "a[]", T.string, string="x"),
        O("a[]", "a", T.array, length=0),
        O("a[]", "a", T.array, length=1),
        O("a[][]", "a[]", T.array, length=1),
        O("a[][][]", "a[][]", T.number),
    ]


def test_empty_array_absent_array_and_null_are_three_different_facts() -> None:
    assert flat({"tags": []}) == [O("tags", None, T.array, length=0)]
    assert flat({}) == []
    assert flat({"tags": None}) == [O("tags", None, T.null)]


def test_null_is_observed_and_absent_is_not() -> None:
    assert flat({"a": None, "b": {"c": None}}) == [O("a", None, T.null), O("b", None, T.object), O("b.c", None, T.null)]
    assert flat({"b": {}}) == [O("b", None, T.object)]


def test_json_types_of_scalars() -> None:
    assert flat({"i": 3, "w": 3.0, "f": 2.5, "t": True, "n": False, "z": 0, "neg": -1e20, "s": ""}) == [
        O("i", None, T.integer),
        O("w", None, T.integer),
        O("f", None, T.number),
        O("t", None, T.boolean),
        O("n", None, T.boolean),
        O("z", None, T.integer),
        O("neg", None, T.integer),
        O("s", None, T.string, string=""),
    ]


@pytest.mark.parametrize(
    ("value", "jtype"),
    [
        (None, T.null),
        (True, T.boolean),
        (False, T.boolean),
        (0, T.integer),
        (2**63, T.integer),
        (3.0, T.integer),
        (-0.0, T.integer),
        (2.5, T.number),
        (1e-9, T.number),
        ("3", T.string),
        ([], T.array),
        ({}, T.object),
    ],
)
def test_json_type_of(value: Any, jtype: JsonType) -> None:
    assert json_type_of(value) is jtype


def test_the_docstring_example() -> None:
    assert [(o.path, o.type) for o in flat({"a": {"b": [1, 2.5]}})] == [
        ("a", T.object),
        ("a.b", T.array),
        ("a.b[]", T.integer),
        ("a.b[]", T.number),
    ]


@pytest.mark.parametrize(
    ("key", "path"),
    [
        ("a.b", "a\\.b"),
        ("a[]", "a\\[\\]"),
        ("]", "\\]"),
        ("[0]", "\\[0\\]"),
        ("back\\slash", "back\\\\slash"),
        ("\\.", "\\\\\\."),
        ("plain key: ok", "plain key: ok"),
        ("", ""),
        ("~/", "~/"),
    ],
)
def test_keys_with_path_characters_are_escaped(key: str, path: str) -> None:
    assert join_key(None, key) == path  # None: the output itself
    assert join_key("p", key) == "p." + path
    assert flat({key: 1}) == [O(path, None, T.integer)]


def test_an_escaped_key_never_meets_the_nested_path() -> None:
    assert [o.path for o in flat({"a.b": 1, "a": {"b": 1}})] == ["a\\.b", "a", "a.b"]
    assert [o.path for o in flat({"a[]": 1, "a": [1]})] == ["a\\[\\]", "a", "a[]"]


def test_items_path_and_pointer_for_key() -> None:
    assert items_path("a.b") == "a.b[]"
    assert pointer_for_key("a/b~c") == "/a~1b~0c"


def test_an_empty_key_is_a_step_of_its_own() -> None:
    assert flat({"": {"x": 1}, "x": 2}) == [O("", None, T.object), O(".x", None, T.integer), O("x", None, T.integer)]
    assert flat({"a": {"": {"": None}}}) == [O("a", None, T.object), O("a.", None, T.object), O("a..", None, T.null)]
    assert join_key("", "x") == ".x"  # '' is the path of a key named ''


def test_items_of_an_array_named_empty_are_not_scoped_to_the_output() -> None:
    scopes = {o.path: o.scope for o in flat({"": [{"x": 1}], "y": 1})}
    assert scopes["[]"] != scopes["y"]  # units: items of the array vs outputs


# Parsing a path back into its steps (a key, or None for "the items of an array")
# proves that paths are injective: if every path parses back to the steps that
# built it, two different documents can never share a path.


def parse_path(path: str) -> list[str | None]:
    steps: list[str | None] = []
    i = 0

    def key() -> str:
        nonlocal i
        out = []
        while i < len(path) and path[i] not in ".[":
            if path[i] == "\\":
                i += 1
            assert path[i] != "]" or path[i - 1] == "\\", path
            out.append(path[i])
            i += 1
        return "".join(out)

    steps.append(key())
    while i < len(path):
        if path[i] == ".":
            i += 1
            steps.append(key())
        else:
            assert path[i : i + 2] == "[]", path
            i += 2
            steps.append(None)
    return steps


def document_for(steps: list[str | None]) -> dict[str, Any]:
    value: Any = "leaf"
    for step in reversed(steps):
        value = [value] if step is None else {step: value}
    assert isinstance(value, dict)
    return value


_PATH_CHARS = st.sampled_from(list("ab.[]\\ ~/"))
_STEPS = st.tuples(st.text(_PATH_CHARS, max_size=5), st.lists(st.none() | st.text(_PATH_CHARS, max_size=5), max_size=6))


@PROPERTY
@given(steps=_STEPS)
def test_every_path_parses_back_to_the_keys_that_made_it(steps: tuple[str, list[str | None]]) -> None:
    all_steps = [steps[0], *steps[1]]
    observations = flat(document_for(all_steps))
    leaf = observations[-1]
    assert leaf.string == "leaf"
    assert parse_path(leaf.path) == all_steps
    # Every path on the way parses back to a prefix of the steps, and its scope is
    # the path of the innermost array above it ('' when there is none).
    path_of = {tuple(parse_path(o.path)): o.path for o in observations}
    assert sorted(path_of, key=len) == [tuple(all_steps[:n]) for n in range(1, len(all_steps) + 1)]
    for o in observations:
        prefix = parse_path(o.path)
        cut = max((i for i, step in enumerate(prefix) if step is None), default=None)
        assert o.scope == (None if cut is None else path_of[tuple(prefix[:cut])])


@PROPERTY
@given(a=_STEPS, b=_STEPS)
def test_two_different_documents_never_share_a_path(
    a: tuple[str, list[str | None]], b: tuple[str, list[str | None]]
) -> None:
    sa, sb = [a[0], *a[1]], [b[0], *b[1]]
    pa, pb = flat(document_for(sa))[-1].path, flat(document_for(sb))[-1].path
    assert (pa == pb) == (sa == sb)


def test_an_empty_top_level_key_keeps_its_own_path() -> None:
    assert [o.path for o in flat({"": {"x": 1}})] == ["", ".x"]
    assert [o.path for o in flat({"x": 1})] == ["x"]


# --- the C accumulator agrees with the reference --------------------------------------------------------

COUNT_COLUMNS = [
    "present",
    "n_null",
    "n_boolean",
    "n_integer",
    "n_number",
    "n_string",
    "n_array",
    "n_object",
    "long_strings",
]
TS = datetime(2026, 11, 29, 12, 0, 30, tzinfo=UTC)
COHORT = ("m", "p", "c", "production")


def reference_counts(
    outputs: list[dict[str, Any]], max_len: int
) -> tuple[dict[str, dict[str, Any]], dict[tuple[str, str], int], dict[tuple[str, int], int]]:
    fields: dict[str, dict[str, Any]] = {}
    values: Counter[tuple[str, str]] = Counter()
    lengths: Counter[tuple[str, int]] = Counter()
    for output in outputs:
        for o in flatten_output(output):
            row = fields.setdefault(o.path, {"scope": o.scope, **dict.fromkeys(COUNT_COLUMNS, 0)})
            assert row["scope"] == o.scope
            row["present"] += 1
            row["n_" + o.type.value] += 1
            if o.string is not None:
                if len(o.string) <= max_len:
                    values[(o.path, o.string)] += 1
                else:
                    row["long_strings"] += 1
            if o.length is not None:
                lengths[(o.path, o.length)] += 1
    return fields, dict(values), dict(lengths)


def accumulated_counts(
    outputs: list[dict[str, Any]], max_len: int
) -> tuple[dict[str, dict[str, Any]], dict[tuple[str, str], int], dict[tuple[str, int], int]]:
    batch = RollupBatch(RollupConfig(enum_value_max_length=max_len), bucket_seconds=60)
    for output in outputs:
        batch.add(output, COHORT, TS)
    g, f, v, a, _served = batch.tables()  # see the module docstring
    epoch = int(TS.timestamp()) // 60 * 60
    assert g.to_pylist() == (
        [
            {
                "g": 0,
                "model": "m",
                "prompt_version": "p",
                "contract": "c",
                "source": "production",
                "served": None,
                "epoch": epoch,
                "events": len(outputs),
                "coarse": False,  # a minute bucket (no tiers: every bucket is)
            }
        ]
        if outputs
        else []
    )
    fields: dict[str, dict[str, Any]] = {}
    path_of_slot: dict[int, str] = {}
    for slot, row in enumerate(f.to_pylist()):
        assert row["g"] == 0
        assert row["path"] not in fields, f"two rows for path {row['path']!r}"
        fields[row["path"]] = {"scope": row["scope"], **{c: row[c] for c in COUNT_COLUMNS}}
        path_of_slot[row.get("slot", slot)] = row["path"]

    def key_path(row: dict[str, Any]) -> str:
        # value and length rows name their field by slot (a row of f) or by path
        return path_of_slot[row["slot"]] if "slot" in row else str(row["path"])

    values: dict[tuple[str, str], int] = {}
    for row in v.to_pylist():
        assert row.get("g", 0) == 0 and (key_path(row), row["value"]) not in values
        values[(key_path(row), row["value"])] = row["n"]
    lengths: dict[tuple[str, int], int] = {}
    for row in a.to_pylist():
        assert row.get("g", 0) == 0 and (key_path(row), row["length"]) not in lengths
        lengths[(key_path(row), row["length"])] = row["n"]
    return fields, values, lengths


def test_the_accumulator_on_a_hand_written_batch() -> None:
    outputs: list[dict[str, Any]] = [
        {"a": [{"b": "x"}, {"b": None}], "s": "y" * 5, "w": 2.0},
        {"a": [], "s": "short", "f": 0.5, "t": False},
        {"a": None, "n": {"a": [[1], []]}},
    ]
    zero = dict.fromkeys(COUNT_COLUMNS, 0)
    fields, values, lengths = accumulated_counts(outputs, 4)
    assert fields == {
        "a": {"scope": None, **zero, "present": 3, "n_array": 2, "n_null": 1},
        "a[]": {"scope": "a", **zero, "present": 2, "n_object": 2},
        "a[].b": {"scope": "a", **zero, "present": 2, "n_string": 1, "n_null": 1},
        "s": {"scope": None, **zero, "present": 2, "n_string": 2, "long_strings": 2},
        "w": {"scope": None, **zero, "present": 1, "n_integer": 1},
        "f": {"scope": None, **zero, "present": 1, "n_number": 1},
        "t": {"scope": None, **zero, "present": 1, "n_boolean": 1},
        "n": {"scope": None, **zero, "present": 1, "n_object": 1},
        "n.a": {"scope": None, **zero, "present": 1, "n_array": 1},
        "n.a[]": {"scope": "n.a", **zero, "present": 2, "n_array": 2},
        "n.a[][]": {"scope": "n.a[]", **zero, "present": 1, "n_integer": 1},
    }
    assert values == {("a[].b", "x"): 1}
    assert lengths == {("a", 2): 1, ("a", 0): 1, ("n.a", 2): 1, ("n.a[]", 1): 1, ("n.a[]", 0): 1}
    assert (fields, values, lengths) == reference_counts(outputs, 4)


def test_the_accumulator_of_an_empty_batch_is_empty() -> None:
    assert accumulated_counts([], 64) == ({}, {}, {})


_KEY_CHARS = st.sampled_from(list("ab.[]\\ é"))
_KEYS = st.text(_KEY_CHARS, max_size=4)
_STRINGS = (
    st.sampled_from(["", "a", "b", "ab", "a.b", "é"])
    | st.text(_KEY_CHARS, max_size=10)
    | st.text(_KEY_CHARS, min_size=60, max_size=90)
)
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | _STRINGS
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([0.0, -0.0, 3.0, 2.5, 1e20])
)
_VALUES = st.recursive(
    _SCALARS, lambda c: st.lists(c, max_size=4) | st.dictionaries(_KEYS, c, max_size=4), max_leaves=20
)
_OUTPUTS = st.dictionaries(_KEYS, _VALUES, max_size=5)


@PROPERTY
@given(outputs=st.lists(_OUTPUTS, max_size=5), max_len=st.integers(0, 80) | st.just(64))
def test_the_accumulator_agrees_with_flatten_output(outputs: list[dict[str, Any]], max_len: int) -> None:
    assert accumulated_counts(outputs, max_len) == reference_counts(outputs, max_len)
