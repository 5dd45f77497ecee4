"""Comparison rules as units: the statistics against scipy, paths, enum detection, self-comparison.

The statistics are held to scipy computed a different way (the z-test against
the 2x2 chi-square, the U test on the expanded samples, BH against
``false_discovery_control``), so a mistake in either shows.
"""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from scipy import stats
from synth import Drift, synth_outputs, write_outputs

from shapewatch.analysis.config import AlertKind, EnumMode, FieldRules, Severity
from shapewatch.analysis.rules import (
    Check,
    Insufficient,
    adjust_p_values,
    chi_square_p,
    compare_profiles,
    enum_like,
    mann_whitney_p,
    parent_path,
    two_proportion_p,
)
from shapewatch.collector import FieldProfile, Store, read_profiles
from shapewatch.collector.flatten import join_key

T0 = datetime(2026, 11, 1, 6, tzinfo=UTC)


# --- two_proportion_p -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("k1", "n1", "k2", "n2"),
    [
        (700, 1000, 400, 1000),
        (700, 1000, 690, 1000),
        (61, 100, 30, 100),
        (5000, 10000, 5100, 10000),
        (120, 400, 40, 300),
        (3, 50, 30, 60),
    ],
)
def test_two_proportion_p_equals_the_2x2_chi_square(k1: int, n1: int, k2: int, n2: int) -> None:
    # The two-sided pooled z-test is the uncorrected chi-square test of the 2x2 table (z^2 = chi2).
    expected = stats.chi2_contingency([[k1, n1 - k1], [k2, n2 - k2]], correction=False).pvalue
    assert two_proportion_p(k1, n1, k2, n2) == pytest.approx(expected, rel=1e-9, abs=1e-300)


@pytest.mark.parametrize(("k1", "n1", "k2", "n2"), [(0, 1000, 4, 300), (1, 40, 3, 40), (0, 10000, 12, 3000)])
def test_two_proportion_p_uses_fisher_when_an_expected_count_is_under_5(k1: int, n1: int, k2: int, n2: int) -> None:
    pooled = (k1 + k2) / (n1 + n2)
    assert min(n1 * pooled, n2 * pooled) < 5
    expected = stats.fisher_exact([[k1, n1 - k1], [k2, n2 - k2]]).pvalue
    assert two_proportion_p(k1, n1, k2, n2) == pytest.approx(expected, rel=1e-12)


def test_two_proportion_p_without_information_is_1() -> None:
    assert [
        two_proportion_p(0, 0, 5, 10),
        two_proportion_p(5, 10, 0, 0),
        two_proportion_p(0, 100, 0, 100),
        two_proportion_p(100, 100, 50, 50),
    ] == [1.0, 1.0, 1.0, 1.0]


# --- chi_square_p -----------------------------------------------------------------------------


def _chi_square_by_hand(a: dict[str, int], b: dict[str, int]) -> float:
    cats = sorted(c for c in set(a) | set(b) if a.get(c, 0) + b.get(c, 0))
    rows = [sum(a.values()), sum(b.values())]
    total = sum(rows)
    stat = 0.0
    for c in cats:
        col = a.get(c, 0) + b.get(c, 0)
        for row, counts in zip(rows, (a, b), strict=True):
            e = row * col / total
            stat += (counts.get(c, 0) - e) ** 2 / e
    return float(stats.chi2.sf(stat, len(cats) - 1))


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ({"number": 750, "string": 250}, {"number": 550, "string": 450}),
        ({"number": 750, "string": 250}, {"number": 740, "string": 260}),
        ({"number": 60, "string": 30, "boolean": 10}, {"number": 20, "string": 60, "boolean": 20, "array": 0}),
    ],
)
def test_chi_square_p_equals_a_hand_computed_test(a: dict[str, int], b: dict[str, int]) -> None:
    assert chi_square_p(a, b) == pytest.approx(_chi_square_by_hand(a, b), rel=1e-9)


def test_chi_square_p_without_two_categories_or_counts_is_1() -> None:
    assert [
        chi_square_p({"number": 10}, {"number": 50}),
        chi_square_p({}, {"number": 5, "string": 5}),
        chi_square_p({"number": 5, "string": 0}, {"number": 9, "string": 0}),
    ] == [1.0, 1.0, 1.0]


# --- mann_whitney_p ---------------------------------------------------------------------------


def _expand(h: dict[int, int]) -> list[int]:
    return [v for v, n in sorted(h.items()) for _ in range(n)]


@pytest.mark.parametrize("seed", range(6))
def test_mann_whitney_p_equals_scipy_on_the_expanded_samples(seed: int) -> None:
    rnd = random.Random(seed)
    h1 = {k: rnd.randint(0, 200) for k in range(rnd.randint(1, 8))}
    shift = rnd.choice([0, 0, 1, 2])
    h2 = {k + shift: rnd.randint(0, 200) for k in range(rnd.randint(1, 8))}
    h1[0] = h1.get(0, 0) + 1  # never empty
    h2[3] = h2.get(3, 0) + 1
    expected = stats.mannwhitneyu(
        _expand(h1), _expand(h2), alternative="two-sided", method="asymptotic", use_continuity=False
    ).pvalue
    assert mann_whitney_p(h1, h2) == pytest.approx(expected, rel=1e-9, abs=1e-300)


def test_mann_whitney_p_on_identical_or_empty_histograms() -> None:
    h = {0: 80, 1: 270, 2: 350, 3: 180, 4: 120}
    assert mann_whitney_p(h, h) == pytest.approx(1.0)
    assert mann_whitney_p({}, h) == 1.0
    assert mann_whitney_p({2: 100}, {2: 300}) == 1.0  # all tied: no information


# --- adjust_p_values --------------------------------------------------------------------------


def _check(p: float, path: str = "f") -> Check:
    return Check(path, AlertKind.presence_drop, None, Severity.page, 0.5, 0.1, p, 0.01, {}, {}, "")


def test_adjust_p_values_is_benjamini_hochberg() -> None:
    rnd = random.Random(7)
    ps = [rnd.random() ** 4 for _ in range(60)] + [1e-12, 0.0009, 0.0009, 1.0]
    adjusted = adjust_p_values([_check(p, f"f{i}") for i, p in enumerate(ps)])
    assert [c.field for c in adjusted] == [f"f{i}" for i in range(len(ps))]  # order kept
    assert [c.p_value for c in adjusted] == ps  # raw p kept
    expected = stats.false_discovery_control(np.array(ps), method="bh")
    assert [c.q_value for c in adjusted] == pytest.approx(list(expected), rel=1e-12)
    assert adjust_p_values([]) == []


def test_breach_needs_both_the_effect_and_the_adjusted_significance() -> None:
    (lone,) = adjust_p_values([_check(0.004)])
    assert lone.breach
    many = adjust_p_values([_check(0.004)] + [_check(0.9) for _ in range(9)])
    assert many[0].q_value == pytest.approx(0.04) and not many[0].breach
    small = Check("f", AlertKind.presence_drop, None, Severity.page, 0.099, 0.1, 1e-9, 0.01, {}, {}, "", q_value=1e-9)
    assert not small.breach


# --- parent_path ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "parent"),
    [
        ("priority", None),
        ("customer.tier", "customer"),
        ("a.b.c", "a.b"),
        ("entities[]", "entities"),
        ("entities[].type", "entities[]"),
        ("a[][]", "a[]"),
        (join_key(None, "a.b"), None),  # one key containing a dot
        (join_key("x", "a.b"), "x"),
        (join_key(None, "a[]"), None),  # one key ending with []
        (join_key(join_key(None, "a[]"), "b"), join_key(None, "a[]")),
        (join_key(None, "a\\"), None),  # a key ending with a backslash: the escape is itself escaped
        (join_key(join_key(None, "a\\"), "b"), join_key(None, "a\\")),
        (join_key(None, "a\\") + "[]", join_key(None, "a\\")),
        (join_key(None, ""), None),
        (join_key(join_key(None, ""), ""), ""),
    ],
)
def test_parent_path_respects_escaped_keys(path: str, parent: str | None) -> None:
    assert parent_path(path) == parent


# --- enum detection ---------------------------------------------------------------------------


def _fp(
    values: dict[str, int], *, strings: int | None = None, numbers: int = 0, long_strings: int = 0, overflow: int = 0
) -> FieldProfile:
    s = sum(values.values()) + long_strings + overflow if strings is None else strings
    types = {"string": s, **({"integer": numbers} if numbers else {})}
    return FieldProfile("f", None, s + numbers, s + numbers, types, long_strings, values, overflow)


def test_enum_like_decides_from_the_baseline_and_obeys_the_mode() -> None:
    rules = FieldRules()
    enum = _fp({"low": 500, "medium": 300, "high": 200})
    free = _fp({f"text {i}": 1 for i in range(400)})
    assert enum_like(enum, rules) and not enum_like(free, rules)
    assert not enum_like(_fp({f"v{i}": 20 for i in range(51)}), rules)  # over enum_max_distinct
    assert not enum_like(_fp({"a": 50, "b": 40}, long_strings=20), rules)  # long strings: text
    assert not enum_like(_fp({"a": 5, "b": 4, "c": 3}), rules)  # values do not repeat 10 times
    assert not enum_like(_fp({"unknown": 250}, numbers=750), rules)  # mostly numbers
    assert enum_like(free, FieldRules(mode=EnumMode.enum))
    assert not enum_like(enum, FieldRules(mode=EnumMode.free_text))
    assert enum_like(free, FieldRules(allowed=("a", "b")))


# --- a profile against itself -----------------------------------------------------------------


@pytest.fixture(scope="module")
def profile_fields(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, FieldProfile], int]:
    path: Path = tmp_path_factory.mktemp("rules") / "self.duckdb"
    with Store.open(path) as store:
        write_outputs(store, synth_outputs(3, 3000, Drift(new_key_share=0.3)), T0, timedelta(hours=1))
        (profile,) = read_profiles(store, T0, T0 + timedelta(hours=1))
    return profile.fields, profile.events


def test_comparing_a_profile_with_itself_yields_no_breach(profile_fields: tuple[dict[str, FieldProfile], int]) -> None:
    fields, events = profile_fields
    checks, short = compare_profiles(fields, events, fields, events, lambda _: FieldRules())
    judged = adjust_p_values(checks)
    assert short == []
    assert [c for c in judged if c.breach] == []
    assert {c.effect for c in judged} == {0.0}
    assert {c.p_value for c in judged} == {1.0}
    # Only the rules that measure a move ran; nothing is new or missing.
    assert {c.kind for c in judged} == {
        AlertKind.presence_drop,
        AlertKind.unknown_enum_growth,
        AlertKind.array_size_shift,
        AlertKind.type_shift,
    }
    # Every field got its presence check, enum fields their unknown bucket, arrays their sizes.
    assert {c.field for c in judged if c.kind is AlertKind.presence_drop} == set(fields)
    assert {c.field for c in judged if c.kind is AlertKind.unknown_enum_growth} == {
        "intent",
        "priority",
        "sentiment",
        "language",
        "customer.tier",
        "entities[].type",
        "tags[]",
        "follow_up.channel",
        "escalation_reason",
    }
    assert {c.field for c in judged if c.kind is AlertKind.array_size_shift} == {"entities", "tags"}
    assert {c.field for c in judged if c.kind is AlertKind.type_shift} == {"eta_days"}


def test_fields_under_the_minimum_are_listed_not_judged(profile_fields: tuple[dict[str, FieldProfile], int]) -> None:
    fields, events = profile_fields
    rules = FieldRules(min_samples=3001)
    checks, short = compare_profiles(fields, events, fields, events, lambda _: rules)
    # entities[] paths have ~6000 units (the items), above the minimum; the rest have 3000.
    judged = {c.field for c in checks}
    assert judged == {p for p, f in fields.items() if f.units >= 3001}
    assert judged >= {"entities[]", "entities[].type"}
    assert short == [Insufficient(p, f.units, f.units, 3001) for p, f in sorted(fields.items()) if f.units < 3001]


def test_a_missing_field_under_an_array_counts_the_items_as_units() -> None:
    # "items[].note" filled in every item of the baseline, gone from the window: the units of the
    # window are the window's items (sum of lengths), not its outputs.
    base = {
        "items": FieldProfile("items", None, 300, 300, {"array": 300}, 0, {}, 0, {2: 300}),
        "items[]": FieldProfile("items[]", "items", 600, 600, {"object": 600}, 0, {}, 0),
        "items[].note": FieldProfile("items[].note", "items", 600, 600, {"integer": 600}, 0, {}, 0),
    }
    cur = {
        "items": FieldProfile("items", None, 250, 250, {"array": 250}, 0, {}, 0, {3: 250}),
        "items[]": FieldProfile("items[]", "items", 750, 750, {"object": 750}, 0, {}, 0),
    }
    checks, short = compare_profiles(base, 300, cur, 250, lambda _: FieldRules())
    missing = [c for c in checks if c.kind is AlertKind.field_missing]
    assert short == []
    assert [(c.field, c.baseline, c.current, c.effect) for c in missing] == [
        ("items[].note", {"presence_rate": 1.0, "samples": 600}, {"presence_rate": 0.0, "samples": 750}, 1.0)
    ]
    # A lone new key under existing items is a new field; its new children are not reported apart.
    checks, _ = compare_profiles(cur, 250, base, 300, lambda _: FieldRules())
    assert [(c.field, c.kind) for c in checks if c.kind is AlertKind.new_field] == [
        ("items[].note", AlertKind.new_field)
    ]


def test_types_and_values_are_judged_only_with_enough_filled_values() -> None:
    # 1,000 outputs on both sides; the window fills priority in 150 of them, all with a new value of a
    # new type. Presence is judged (its units suffice); types and values have too few filled samples.
    base = {"priority": FieldProfile("priority", None, 1000, 1000, {"string": 1000}, 0, {"low": 600, "high": 400}, 0)}
    cur = {"priority": FieldProfile("priority", None, 1000, 150, {"integer": 150}, 0, {}, 0)}
    checks, short = compare_profiles(base, 1000, cur, 1000, lambda _: FieldRules())
    assert (short, [(c.kind, round(c.effect, 6)) for c in checks]) == ([], [(AlertKind.presence_drop, 0.85)])
    checks, _ = compare_profiles(base, 1000, cur, 1000, lambda _: FieldRules(min_samples=150))
    assert [(c.kind, c.value) for c in checks] == [(AlertKind.presence_drop, None), (AlertKind.new_type, "integer")]


def test_a_new_subtree_is_one_new_field() -> None:
    base = {"priority": FieldProfile("priority", None, 400, 400, {"string": 400}, 0, {"low": 400}, 0)}
    cur = {
        "priority": FieldProfile("priority", None, 400, 400, {"string": 400}, 0, {"low": 400}, 0),
        "meta": FieldProfile("meta", None, 400, 300, {"object": 300}, 0, {}, 0),
        "meta.source": FieldProfile("meta.source", None, 400, 300, {"string": 300}, 0, {"web": 300}, 0),
        "meta.hops": FieldProfile("meta.hops", None, 400, 300, {"array": 300}, 0, {}, 0, {1: 300}),
        "meta.hops[]": FieldProfile("meta.hops[]", "meta.hops", 300, 300, {"integer": 300}, 0, {}, 0),
    }
    checks, short = compare_profiles(base, 400, cur, 400, lambda _: FieldRules())
    assert short == []  # meta.hops[] lies inside the new subtree: nothing to say about it
    (new,) = [c for c in adjust_p_values(checks) if c.kind is AlertKind.new_field]
    assert (new.field, new.breach, new.baseline, new.current) == (
        "meta",
        True,
        {"presence_rate": 0.0, "samples": 400},
        {"presence_rate": 0.75, "samples": 400, "types": {"object": 1.0}},
    )
    assert {c.field for c in checks} == {"priority", "meta"}


def test_probabilities_are_probabilities() -> None:
    rnd = random.Random(11)
    for _ in range(200):
        n1, n2 = rnd.randint(1, 5000), rnd.randint(1, 5000)
        p = two_proportion_p(rnd.randint(0, n1), n1, rnd.randint(0, n2), n2)
        assert 0.0 <= p <= 1.0 and not math.isnan(p)


def _obj(path: str, units: int, present: int, scope: str | None = None) -> FieldProfile:
    return FieldProfile(path, scope, units, present, {"object": present}, 0, {}, 0)


def _str(path: str, units: int, present: int, value: str = "x") -> FieldProfile:
    return FieldProfile(path, None, units, present, {"string": present}, 0, {value: present}, 0)


def test_a_vanished_subtree_is_one_field_missing() -> None:
    base = {
        "follow_up": _obj("follow_up", 1000, 600),
        "follow_up.channel": _str("follow_up.channel", 1000, 600),
        "follow_up.within_hours": _str("follow_up.within_hours", 1000, 600),
        "intent": _str("intent", 1000, 1000),
    }
    cur = {"intent": _str("intent", 1000, 1000)}
    checks = adjust_p_values(compare_profiles(base, 1000, cur, 1000, lambda _: FieldRules())[0])
    assert [(c.field, c.kind, c.breach, c.severity) for c in checks if c.breach] == [
        ("follow_up", AlertKind.field_missing, True, Severity.page)
    ]


def test_a_rare_field_that_vanishes_is_field_missing() -> None:
    # Filled in 5% of 10,000 outputs: under the 10-point tolerance, yet 0 of 10,000 is no accident.
    base = {"escalation": _str("escalation", 10_000, 500), "intent": _str("intent", 10_000, 10_000)}
    cur = {"intent": _str("intent", 10_000, 10_000)}
    checks = adjust_p_values(compare_profiles(base, 10_000, cur, 10_000, lambda _: FieldRules())[0])
    (missing,) = [c for c in checks if c.breach]
    assert (missing.field, missing.kind, missing.effect, missing.threshold) == (
        "escalation",
        AlertKind.field_missing,
        0.05,
        0.01,
    )


@pytest.mark.parametrize(("before", "after"), [(700, 600), (800, 700), (300, 200)])
def test_a_move_of_exactly_the_tolerance_breaches_whatever_the_float_error(before: int, after: int) -> None:
    base = {"tier": _str("tier", 1000, before)}
    cur = {"tier": _str("tier", 1000, after)}
    (drop,) = adjust_p_values(compare_profiles(base, 1000, cur, 1000, lambda _: FieldRules())[0])[:1]
    assert (drop.kind, drop.effect, drop.breach) == (AlertKind.presence_drop, 0.1, True)


def test_a_configured_severity_for_unknown_growth_is_not_escalated() -> None:
    base = {"priority": FieldProfile("priority", None, 1000, 1000, {"string": 1000}, 0, {"low": 500, "high": 500}, 0)}
    cur = {
        "priority": FieldProfile(
            "priority", None, 1000, 1000, {"string": 1000}, 0, {"low": 300, "high": 300, "URGENT": 400}, 0
        )
    }

    def growth(rules: FieldRules) -> Check:
        checks = adjust_p_values(compare_profiles(base, 1000, cur, 1000, lambda _: rules)[0])
        (found,) = [c for c in checks if c.kind is AlertKind.unknown_enum_growth]
        return found

    assert growth(FieldRules()).effective_severity is Severity.page  # 40 points > unknown_page
    pinned = growth(FieldRules(severity={AlertKind.unknown_enum_growth: Severity.warn}))
    assert (pinned.breach, pinned.effective_severity) == (True, Severity.warn)


def test_rare_new_values_get_no_check_and_at_most_50_do() -> None:
    base = {"code": FieldProfile("code", None, 5000, 5000, {"string": 5000}, 0, {"a": 2500, "b": 2500}, 0)}
    values = {"a": 2000, "b": 2000} | {f"n{i:03d}": 10 for i in range(80)} | {"rare": 2}
    cur = {"code": FieldProfile("code", None, 5000, 5000, {"string": 5000}, 0, values, 0)}
    checks = compare_profiles(base, 5000, cur, 5000, lambda _: FieldRules())[0]
    new = [c.value for c in checks if c.kind is AlertKind.new_enum_value]
    assert new == [f"n{i:03d}" for i in range(50)]
