"""The pure-Python twin (``_pyspeedups``) against the C extension (``_speedups``), answer for answer.

The suites run against either implementation hold each to the Python reference; that cannot see
what a fast path declines (None only sends the input the reference way). Here the two meet on the
same inputs, declined ones and errors included: the same envelopes recognised and declined, the
same counts, the same buffers. Skipped where the C extension is not built.
"""

from __future__ import annotations

import json
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import orjson
import pytest
from harness import counted_beside
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_scanner import _LIMITS, _NOISE, _TEXT, _VALUES, _dumps, _envelopes, _lines

from shapewatch.collector import _pyspeedups as py
from shapewatch.collector import envelope
from shapewatch.collector.envelope import LIMITS, Envelope, Limits

c = pytest.importorskip("shapewatch.collector._speedups", reason="the C accelerator is not built here")

PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NOW = datetime(2026, 11, 29, 12, 30, tzinfo=UTC)


@pytest.fixture(autouse=True, scope="module")
def _one_ts_range() -> None:
    """envelope.py sets the range of the implementation in use only: both get it here."""
    for impl in (c, py):
        impl.set_ts_range(envelope._epoch_us(envelope.TS_MIN), envelope._epoch_us(envelope.TS_END))


def _both(call: Callable[[Any], Any]) -> Any:
    """What ``call`` answers with each implementation, asserted equal (an exception counts as an
    answer: its type and message)."""
    answers = []
    for impl in (c, py):
        try:
            answers.append(("ok", call(impl)))
        except Exception as exc:
            answers.append((type(exc).__name__, str(exc)))
    assert answers[1] == answers[0]
    return answers[0]


@PROPERTY
@given(
    env=_envelopes(),
    how=st.integers(0, 3),
    lim=st.none() | _LIMITS,
    damage=st.none() | st.tuples(st.floats(0, 1), st.integers(0, 2), _NOISE),
)
def test_the_same_envelopes_are_scanned_and_checked(
    env: dict[str, Any], how: int, lim: Limits | None, damage: tuple[float, int, bytes] | None
) -> None:
    raw = _dumps(env, how)
    if damage is not None:
        at, cut, noise = damage
        i = int(at * len(raw))
        raw = raw[:i] + noise + raw[i + cut :]
    args = (lim or LIMITS).scanner
    _both(lambda impl: impl.scan_envelope(raw, *args))
    _both(lambda impl: impl.scan_envelope(memoryview(b"[" + raw + b"]")[1:-1], *args))
    _both(lambda impl: impl.check_envelope(env, *args))
    _both(lambda impl: impl.count_keys(raw))
    _both(lambda impl: impl.item_spans(b" [" + raw + b" , " + raw + b"]"))
    _both(lambda impl: impl.item_spans(raw))
    for body in (b" [" + raw + b" , " + raw + b"]", b"[" + raw + b"]", raw):
        _both(lambda impl, body=body: _scan_items(impl, body, lim or LIMITS))


def _scan_items(impl: Any, body: bytes, lim: Limits = LIMITS, max_items: int = 10) -> Any:
    """``scan_items`` of ``impl``, its made-up ids numbered from 0 in each call."""
    made = iter(range(100))
    return impl.scan_items(
        body, max_items, Envelope, NOW, lambda: f"new{next(made)}", lim.max_event_bytes, *lim.scanner
    )


def test_plain_envelopes_are_recognised_by_both() -> None:
    """Not only declined alike: the generated ones are taken, by both."""
    for i in range(20):
        env = {"model": "m", "prompt_version": "p", "ts": "2026-11-29T12:00:00.5+01:00", "output": {"i": i, "x": [i]}}
        assert _both(lambda impl, env=env: impl.scan_envelope(orjson.dumps(env), *LIMITS.scanner))[1] is not None
        assert _both(lambda impl, env=env: impl.check_envelope(env, *LIMITS.scanner))[1] is not None


def test_objects_of_up_to_64_keys_are_taken_by_both_and_larger_ones_declined() -> None:
    """The C holds 64 keys of an object to find a repeated one, and declines a larger object."""
    for sizes, taken in (((64,), True), ((40, 40), True), ((65,), False), ((3, 65), False)):
        output = {f"o{j}": {f"k{i}": i for i in range(n)} for j, n in enumerate(sizes)}
        raw = orjson.dumps({"model": "m", "prompt_version": "p", "output": output})
        for text in (raw, raw.replace(b'"k1"', b'"k\\t1"')):  # an escape: read token by token
            kind, fast = _both(lambda impl, text=text: impl.scan_envelope(text, *LIMITS.scanner))
            assert (kind, fast is not None) == ("ok", taken), (sizes, text)


_JSONISH = st.binary(max_size=40) | st.lists(
    st.sampled_from([b'"', b"\\", b":", b" ", b"\n", b"[", b"]", b"{", b"}", b",", b"a", b"1"]), max_size=30
).map(b"".join)


@PROPERTY
@given(raw=_JSONISH)
def test_keys_and_items_are_found_alike_in_any_bytes(raw: bytes) -> None:
    _both(lambda impl: impl.count_keys(raw))
    _both(lambda impl: impl.item_spans(raw))
    _both(lambda impl: impl.item_spans(b"[" + raw))
    _both(lambda impl: _scan_items(impl, raw))
    _both(lambda impl: _scan_items(impl, b"[" + raw))
    _both(lambda impl: _scan_items(impl, b'[{"model":"m","prompt_version":"p","output":{}},' + raw))


_ODD = st.sampled_from([float("nan"), float("inf"), -float("inf"), (1, 2), b"x", 1.5 + 0j])
_WALK = st.recursive(
    _VALUES | _ODD,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT | st.integers(0, 3), inner, max_size=4),
    max_leaves=20,
)


@PROPERTY
@given(output=st.dictionaries(_TEXT, _WALK, max_size=5) | _WALK, lim=st.just(LIMITS) | _LIMITS)
def test_the_walks_agree_on_anything(output: Any, lim: Limits) -> None:
    _both(lambda impl: impl.walk(output, lim.max_depth, lim.max_array_length, lim.max_key_length, lim.max_leaves))


@pytest.mark.parametrize(
    "output",
    [
        {"a": float("nan")},
        {"a": [float("inf")]},
        {"a": {"b": -float("inf")}},
        {"a": (1,)},
        {1: 2},
        {"a": 9.2e18, "b": [-9.2e18]},
        {"a": 9.19e18},
        {"a": True, "b": None, "c": "x", "d": 2**70},
        [1],
        "x",
    ],
)
def test_the_walks_answer_alike_for_each_odd_value(output: Any) -> None:
    _both(lambda impl: impl.walk(output, 32, 10, 10, 10))


def _acc_state(impl: Any, adds: list[tuple[Any, int, bool]]) -> tuple[Any, ...]:
    names: list[tuple[int, Any]] = []

    def namer(parent: int, key: Any) -> int:
        names.append((parent, key))
        return len(names) - 1

    acc = impl.Acc(namer, 5)
    for i, (output, group, as_text) in enumerate(adds):
        if as_text:  # as a str and as bytes, turn about: bytes are checked as UTF-8, a str's need not be
            text = orjson.dumps(output)
            acc.add_json(text if i % 2 else text.decode(), group)
        else:
            acc.add(output, group)
    counts = acc.counts()
    packed = array("q", acc.count_rows())
    assert [tuple(packed[i : i + 12]) for i in range(0, len(packed), 12)] == counts
    return names, counts, acc.value_rows(), acc.rows(0), _packed(acc.rows(1), "q"), _packed(acc.rows(2), "d")


def _packed(rows: tuple[bytes, bytes, bytes], value_format: str) -> list[tuple[int, Any, int]]:
    """Array lengths or number bins as (slot, value, count) rows, sorted: the C lists a slot's
    rows in its hash table's order, the twin in order of first appearance."""
    slots, values, counts = rows
    return sorted(
        zip(
            memoryview(slots).cast("q").tolist(),
            memoryview(values).cast(value_format).tolist(),
            memoryview(counts).cast("q").tolist(),
            strict=True,
        )
    )


@PROPERTY
@given(
    adds=st.lists(
        st.tuples(st.dictionaries(_TEXT, _VALUES, max_size=5), st.integers(0, 2), st.booleans()), min_size=1, max_size=5
    )
)
def test_the_accumulators_count_alike(adds: list[tuple[dict[str, Any], int, bool]]) -> None:
    assert _acc_state(py, adds) == _acc_state(c, adds)


@PROPERTY
@given(lines=st.lists(_lines(), max_size=10), room=st.integers(1, 5))
def test_scan_lines_reads_the_same_lines_alike(lines: list[bytes], room: int) -> None:
    text = b"\n".join(lines)
    lim = Limits(max_event_bytes=250)
    at = n = 0
    while at < len(text):
        outs = []
        for impl in (c, py):
            out: list[Envelope] = []
            origin: list[int] = []
            answer = impl.scan_lines(memoryview(text), at, n, "f", Envelope, NOW, room, out, origin, 250, *lim.scanner)
            outs.append((answer, out, origin, [type(e) for e in out]))
        assert outs[1] == outs[0]
        at, n = outs[0][0][0], outs[0][0][1]


_ZONES = st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-8)), None])


@PROPERTY
@given(
    tss=st.lists(
        st.datetimes(min_value=datetime(1000, 1, 2), max_value=datetime(9998, 12, 30), timezones=_ZONES), max_size=12
    ),
    width=st.sampled_from([1, 7, 60, 86400]),
    strings=st.lists(st.none() | st.text(max_size=5), max_size=20),
    served=st.lists(st.sampled_from([None, "m", "n"]), min_size=12, max_size=12),
)
def test_columns_and_groups_are_built_alike(
    tss: list[datetime], width: int, strings: list[str | None], served: list[str | None]
) -> None:
    _both(lambda impl: impl.epoch_micros([(ts,) for ts in tss], 0))
    _both(lambda impl: impl.bucket_starts(tss, width))
    _both(lambda impl: impl.string_column([("x", s) for s in strings], 1))
    cohorts = [("m", "p", "c", ("production", "probe")[i % 2]) for i in range(len(tss))]
    starts = [i % 3 * 60 for i in range(len(tss))]

    def grouped(impl: Any) -> tuple[list[int], dict[Any, int]]:
        groups: dict[Any, int] = {"earlier": 0}
        return impl.group_ids(groups, cohorts, served[: len(tss)], starts), groups

    _both(grouped)


_ID_LESS = b'[{"model":"m","prompt_version":"p","output":{}}]'


def _acc(impl: Any) -> Any:
    return impl.Acc(lambda parent, key: 0, 5)


@pytest.mark.parametrize(
    "call",
    [
        lambda m: m.epoch_micros((1,), 0),
        lambda m: m.epoch_micros([(1,), 2], 0),
        lambda m: m.epoch_micros([("x",)], 1),
        lambda m: m.string_column([("a",), ("b", 3)], 1),
        lambda m: m.string_column([("\ud800",)], 0),
        lambda m: m.bucket_starts([], 0),
        lambda m: m.bucket_starts(3, 60),
        lambda m: m.bucket_starts([datetime(2026, 1, 1, tzinfo=UTC), "x"], 60),
        lambda m: m.group_ids({}, [("a", "b", "c", "production")], [], []),
        lambda m: m.group_ids({}, [("a", "b", "c")], [None], [0]),
        lambda m: m.group_ids([], [], [], []),
        lambda m: m.set_ts_range(-1, 5),
        lambda m: m.set_ts_range(1.5, 5),
        lambda m: m.count_keys("{}"),
        lambda m: m.item_spans(bytearray(b"[]")),
        lambda m: m.scan_envelope("{}", *LIMITS.scanner),
        lambda m: m.scan_lines(b"", 1, 0, "f", Envelope, NOW, 1, [], [], 1, *LIMITS.scanner),
        lambda m: m.scan_lines(b"", 0, 0, "f", list, NOW, 1, [], [], 1, *LIMITS.scanner),
        lambda m: m.scan_lines(b"", 0, 0, 5, Envelope, NOW, 1, [], [], 1, *LIMITS.scanner),
        lambda m: m.scan_lines(b"", 0, 0, "f", Envelope, NOW, 1, [], (), 1, *LIMITS.scanner),
        lambda m: m.scan_items("[]", 1, Envelope, NOW, str, 1, *LIMITS.scanner),
        lambda m: m.scan_items(b"[]", 1, list, NOW, str, 1, *LIMITS.scanner),
        lambda m: m.scan_items(b"[]", 1, Envelope, NOW, "id", 1, *LIMITS.scanner),
        lambda m: m.scan_items(_ID_LESS, 1, Envelope, NOW, lambda: 5, 100, *LIMITS.scanner),
        lambda m: m.scan_items(_ID_LESS, 1, Envelope, NOW, lambda: 1 / 0, 100, *LIMITS.scanner),
        lambda m: _acc(m).add(OrderedDict(a=1), 0),
        lambda m: _acc(m).add([1], 0),
        lambda m: _acc(m).add({"a": (1,)}, 0),
        lambda m: _acc(m).add({"a": "\udc00"}, 0),
        lambda m: _acc(m).add({}, -1),
        lambda m: _acc(m).add_many([3], [0]),
        lambda m: _acc(m).add_many([{}], []),
        lambda m: _acc(m).add_json("[1]", 0),
        lambda m: _acc(m).rows(3),
        lambda m: m.Acc(lambda parent, key: -1, 5).add({"a": 1}, 0),
        lambda m: (lambda acc: acc.__init__(lambda parent, key: 0, 5))(_acc(m)),
    ],
)
def test_wrong_input_is_refused_alike(call: Callable[[Any], Any]) -> None:
    kind, _ = _both(call)
    assert kind != "ok"


def test_a_refused_output_leaves_the_same_partial_counts_in_both() -> None:
    """Counting stops at the faulty value in each, with the same counts made on the way."""
    counts = []
    for impl in (c, py):
        names: list[tuple[int, Any]] = []
        acc = impl.Acc(lambda parent, key, names=names: names.append((parent, key)) or len(names) - 1, 5)
        with pytest.raises(TypeError, match=r"^unexpected tuple in an output$"):
            acc.add({"a": 1, "b": {"c": (1,)}, "d": 2}, 0)
        counts.append((names, acc.counts()))
    assert counts[1] == counts[0]
    assert counts[0] == (
        [(-1, "a"), (-1, "b"), (1, "c")],
        [
            (0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0),
            (0, 1, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0),
            (0, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0),
        ],
    )


@pytest.mark.parametrize("text", [False, True])
def test_true_booleans_are_counted_apart_alike_from_objects_and_from_text(text: bool) -> None:
    """(present, null, boolean, ..., long, true) of a boolean path: the last column counts the trues."""
    outputs = [{"ok": True, "tags": [True, False, True]}, {"ok": False, "tags": []}, {"ok": None}, {"ok": True}]
    counts = []
    for impl in (c, py):
        acc = impl.Acc(lambda parent, key, names=[]: names.append((parent, key)) or len(names) - 1, 5)
        for o in outputs:
            acc.add_json(json.dumps(o), 0) if text else acc.add(o, 0)
        counts.append(sorted(acc.counts()))
    assert counts[1] == counts[0]
    ok, tags, items = counts[0]
    assert ok == (0, 0, 4, 1, 3, 0, 0, 0, 0, 0, 0, 2)
    assert tags == (0, 1, 2, 0, 0, 0, 0, 0, 2, 0, 0, 0)
    assert items == (0, 2, 3, 0, 3, 0, 0, 0, 0, 0, 0, 2)


def test_json_text_that_is_not_an_object_is_refused_by_both() -> None:
    for text in ("[1]", "1", '"x"'):
        kind, message = _both(lambda impl, text=text: _acc(impl).add_json(text, 0))
        assert (kind, message) == ("ValueError", "add_json: an output is a JSON object")
    for impl in (c, py):
        with pytest.raises(ValueError, match=r"^add_json: "):
            _acc(impl).add_json('{"a": ', 0)


def test_an_accumulator_counting_texts_is_refused_to_any_other_call_alike() -> None:
    """add_many walks a sequence of texts without the GIL (the C): meanwhile the accumulator refuses
    every other call, here one from its own namer. A sequence with a parsed output holds the GIL,
    and its namer may read the accumulator."""

    def run(impl: Any, outputs: list[Any]) -> Any:
        acc: list[Any] = []
        named: list[str | None] = []

        def namer(parent: int, key: str | None) -> int:
            acc[0].counts()
            named.append(key)
            return len(named) - 1

        acc.append(impl.Acc(namer, 5))
        try:
            acc[0].add_many(outputs, [0] * len(outputs))
        except RuntimeError as exc:
            return "refused", str(exc)
        return acc[0].counts()

    assert _both(lambda impl: run(impl, ['{"a": 1}']))[1] == ("refused", "the accumulator is in use by another call")
    # (group, path, present, null, boolean, integer, ...): "a" is path 0, "b" path 1
    assert _both(lambda impl: run(impl, ['{"a": 1}', {"b": 2}]))[1] == [
        (0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0),
        (0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0),
    ]


def _names() -> Callable[[int, str | None], int]:
    """A namer: a new id for each (parent, key) first seen."""
    ids: dict[tuple[int, str | None], int] = {}
    return lambda parent, key: ids.setdefault((parent, key), len(ids))


_OUTPUT_TEXT = orjson.dumps({"a": [1, 2, {"b": "c" * 40}], "d": {"e": True, "f": 1.5}}).decode()
_REFUSED = ("RuntimeError", "the accumulator is in use by another call")


def _attempts(acc: Any) -> list[Any]:
    """Each kind of call into ``acc``, answered: None, or (error type, message)."""
    answers: list[Any] = []
    for call in (
        lambda: acc.add({"x": 1}, 0),
        lambda: acc.add_json('{"x": 1}', 0),
        lambda: acc.add_many([_OUTPUT_TEXT] * 100, [0] * 100),
        lambda: acc.add_many([{"x": 1}], [0]),
        acc.counts,
        acc.count_rows,
        acc.value_rows,
        lambda: acc.rows(0),
        lambda: acc.rows(2),
    ):
        try:
            call()
            answers.append(None)
        except RuntimeError as exc:
            answers.append(("RuntimeError", str(exc)))
    return answers


def test_an_accumulator_refuses_every_other_thread_while_one_counts_alike() -> None:
    """A counting call owns the accumulator until it returns. Its namer is Python code and may let
    go of the GIL (here it waits), so another thread could get in: every call it makes is refused,
    reads included (the arrays may be half grown), and a walk without the GIL never starts beside
    the call. Before the guard covered the whole call, this left two threads in one accumulator:
    a deadlock in the C. Afterwards the accumulator is whole and takes calls again."""

    def run(impl: Any) -> Any:
        names = _names()
        inside, release = threading.Event(), threading.Event()

        def namer(parent: int, key: str | None) -> int:
            if key == "slow":
                inside.set()
                assert release.wait(30)
            return names(parent, key)

        acc = impl.Acc(namer, 5)
        owner = threading.Thread(target=lambda: acc.add_many([{"slow": [1]}, _OUTPUT_TEXT], [0, 0]))
        owner.start()
        assert inside.wait(30)
        during = _attempts(acc)
        release.set()
        owner.join(30)
        assert not owner.is_alive()
        after = _attempts(acc)
        return during, after, acc.counts()

    during, after, counts = _both(run)[1]
    assert during == [_REFUSED] * 9
    assert after == [None] * 9
    # "slow" (path 0) once; "a" (path 2) from the owner's text and the 100 texts counted after it
    assert [row[:3] for row in counts][:3] == [(0, 0, 1), (0, 1, 1), (0, 2, 101)]


def test_a_call_from_another_thread_while_texts_are_walked_is_refused_alike() -> None:
    """While add_many walks texts (the C without the GIL), another thread's calls are refused:
    here it calls while the walk's namer (run with the GIL taken back) waits for it."""

    def run(impl: Any) -> Any:
        names = _names()
        answers: list[Any] = []

        def namer(parent: int, key: str | None) -> int:
            if key == "late":
                other = threading.Thread(target=lambda: answers.extend(_attempts(acc)))
                other.start()
                other.join(30)
            return names(parent, key)

        acc = impl.Acc(namer, 5)
        acc.add_many([_OUTPUT_TEXT] * 1000 + ['{"late": 1}'], [0] * 1001)
        return answers, [row[:3] for row in acc.counts()]

    answers, counts = _both(run)[1]
    assert answers == [_REFUSED] * 9
    assert counts[0] == (0, 0, 1000) and counts[-1] == (0, len(counts) - 1, 1)


def test_a_namer_raising_during_a_walk_alike() -> None:
    """A namer that raises while add_many walks texts (the C has taken the GIL back for it): its
    error comes through, the outputs before are counted, and the accumulator takes calls again."""

    def run(impl: Any) -> Any:
        names = _names()

        def namer(parent: int, key: str | None) -> int:
            if key == "boom":
                raise ValueError("no name for boom")
            return names(parent, key)

        acc = impl.Acc(namer, 5)
        raised = None
        try:
            acc.add_many([_OUTPUT_TEXT] * 3 + ['{"boom": 1}', _OUTPUT_TEXT], [0] * 5)
        except ValueError as exc:
            raised = str(exc)
        before = acc.counts()[0][:3]
        acc.add_many([_OUTPUT_TEXT], [0])
        return raised, before, acc.counts()[0][:3]

    assert _both(run)[1] == ("no name for boom", (0, 0, 3), (0, 0, 4))


def test_add_many_counts_its_sequences_as_they_were_at_the_call_alike() -> None:
    """The namer may change the caller's lists while their items are counted (here it empties
    them at the first path): every output given is counted, in the C as in the twin (the C read a
    parsed output's list through freed memory before)."""

    def run(impl: Any, outputs: list[Any]) -> Any:
        groups = [0] * len(outputs)
        names = _names()

        def namer(parent: int, key: str | None) -> int:
            outputs.clear()
            groups.clear()
            return names(parent, key)

        acc = impl.Acc(namer, 5)
        acc.add_many(outputs, groups)
        return acc.counts()

    for outputs in ([{"a": 1}, {"b": 2}, '{"c": 3}'], ['{"a": 1}', '{"b": 2}'], [{"a": 1}] * 3):
        counts = _both(lambda impl, o=outputs: run(impl, list(o)))[1]
        assert sum(row[2] for row in counts) == len(outputs), outputs


def test_an_array_shortened_by_the_namer_is_read_as_it_is_now_alike() -> None:
    """An output's array whose items' new paths are named while the namer shortens it: the C reads
    its length at each step, as Python's own loop does, and never past it."""

    def run(impl: Any) -> Any:
        items: list[Any] = [{"k": i} for i in range(50)]
        names = _names()

        def namer(parent: int, key: str | None) -> int:
            if key == "k":
                del items[1:]
            return names(parent, key)

        acc = impl.Acc(namer, 5)
        acc.add({"xs": items}, 0)
        return acc.counts(), acc.rows(1)

    counts, lengths = _both(run)[1]
    assert [row[:3] for row in counts] == [(0, 0, 1), (0, 1, 1), (0, 2, 1)]  # xs, its items, k: once
    assert array("q", lengths[1]).tolist() == [50]  # the length as the array was met


def test_scan_items_makes_no_id_for_a_body_it_declines_alike() -> None:
    """Made-up event ids are made once every item is taken: a body declined by a later item's tags
    (here an unknown source) made none, however new_id behaves."""
    declined = b'[{"model":"m","prompt_version":"p","output":{}},{"model":"m","prompt_version":"p","source":"nope","output":{}}]'
    made: list[int] = []

    def new_id() -> str:
        made.append(1)
        raise ZeroDivisionError

    assert _both(lambda impl: impl.scan_items(declined, 10, Envelope, NOW, new_id, 1000, *LIMITS.scanner)) == (
        "ok",
        None,
    )
    assert made == []
    kind, answer = _both(lambda impl: impl.scan_items(_ID_LESS, 10, Envelope, NOW, lambda: "x1", 1000, *LIMITS.scanner))
    assert kind == "ok" and [(e.event_id, e.generated_id) for e in answer] == [("x1", True)]


def test_a_failed_sequence_of_texts_counts_the_outputs_before_the_fault_alike() -> None:
    """As one at a time would: the outputs before the first that cannot be taken are counted, then
    its error is raised (a bad group, a text that is not an output)."""

    def run(impl: Any, outputs: list[Any], groups: list[Any]) -> Any:
        acc = _acc(impl)
        try:
            acc.add_many(outputs, groups)
            error = None
        except (ValueError, TypeError) as exc:
            error = type(exc).__name__
        return error, acc.counts(), acc.rows(0)

    for outputs, groups in (
        (['{"a": "x"}', '{"b": 2}', '{"c": 3}'], [0, -1, 0]),
        (['{"a": "x"}', '{"b": 2}'], [0, "1"]),
        (['{"a": "x"}', "[1]", '{"c": 3}'], [0, 1, -1]),
    ):
        error, counts, _ = _both(lambda impl, o=outputs, g=groups: run(impl, o, g))[1]
        assert error is not None and len(counts) == 1  # the first output alone


def test_an_accumulator_counts_texts_while_other_threads_run() -> None:
    """The C walks a sequence of texts without the GIL: another thread counts meanwhile."""
    text = orjson.dumps({"a": [1, 2, {"b": "c" * 40}], "d": {"e": True, "f": 1.5}}).decode()
    texts = [text] * 50_000
    ids: dict[tuple[int, str | None], int] = {}
    acc = c.Acc(lambda parent, key: ids.setdefault((parent, key), len(ids)), 16)
    _, during = counted_beside(lambda: acc.add_many(texts, [0] * len(texts)))
    assert acc.counts()[0][2] == 50_000  # the first path ("a"), once per output
    assert during > 0


def test_an_accumulator_holds_the_texts_it_walks() -> None:
    """The walk without the GIL reads the texts' bytes: another thread (here the namer, which runs
    with the GIL taken back) may empty the caller's list meanwhile, and each text must outlive it
    (under the sanitizers, a freed text would be a report)."""
    outputs = [orjson.dumps({f"k{i}": "v" * 60}).decode() for i in range(40)]  # each held by the list alone
    ids: dict[tuple[int, str | None], int] = {}

    def namer(parent: int, key: str | None) -> int:
        outputs.clear()
        return ids.setdefault((parent, key), len(ids))

    acc = c.Acc(namer, 100)
    acc.add_many(outputs, [0] * len(outputs))
    assert outputs == []
    assert [row[1:3] for row in acc.counts()] == [(i, 1) for i in range(40)]  # every text counted whole
    assert acc.rows(0)[1] == ["v" * 60] * 40
