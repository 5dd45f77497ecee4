"""An evaluation reads a window's short-string values only for the paths its rules judge them on.

A busy day holds hundreds of thousands of distinct values, nearly all of them of paths that are
not enums (ids, names, sentences); reading every one of them was most of an evaluation's time.
``evaluate`` now names the (cohort, path) keys whose values a rule reads and leaves the rest
unread (``ValuesNotRead``, which refuses every look). These tests hold it to judging exactly what
reading every value judges, on windows where every value-reading rule has something to say.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from synth import CONTRACT, MODEL, PROMPT, Drift, synth_outputs, write_outputs

from shapewatch.analysis.alerts import ALERTS_SCHEMA
from shapewatch.analysis.analyzer import _Resolver, _value_keys, evaluate
from shapewatch.analysis.config import AlertKind, AnalyzerConfig, parse_config
from shapewatch.baselines import BASELINES_SCHEMA, Cohort, activation_history, freeze_baseline
from shapewatch.collector import Store, ValuesNotRead, read_profiles, served_aliases, with_values

T0 = datetime(2026, 11, 1, tzinfo=UTC)
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
AT = T0 + 2 * DAY
COHORT = Cohort(MODEL, PROMPT, CONTRACT)
SHADOW_MODEL = "claude-shadow-candidate"
NEW_PROMPT = "intake-v4"  # a prompt version with no baseline of its own: judged on the previous one's

# Every rule that reads a window's values has something to judge: new values, an unknown share,
# a jump in distinct values (sentiment), on top of changes to presence and types.
DRIFT = Drift(
    email_presence=0.4,
    extra_values={"priority": {"urgent": 0.1}, "sentiment": {f"mood_{i}": 0.012 for i in range(6)}},
    confidence_string_share=0.2,
)

DECLARED = """
[contracts.intake.fields.summary]
mode = "enum"

[[contracts.intake.assertions]]
path = "customer.id"
max_unknown_share = 0.5

[[contracts.intake.assertions]]
path = "intent"
max_unknown_share = 0.05
allowed = ["refund", "billing", "shipping"]
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    path: Path = tmp_path_factory.mktemp("values") / "values.duckdb"
    s = Store.open(path, schemas=[BASELINES_SCHEMA, ALERTS_SCHEMA])
    write_outputs(s, synth_outputs(0, 4_000), T0 + 6 * HOUR, timedelta(minutes=20))
    freeze_baseline(s, COHORT, T0, T0 + DAY, author="ana", note="reference", now=T0 + DAY + HOUR)
    window = T0 + DAY + 20 * HOUR
    write_outputs(s, synth_outputs(1, 2_000, DRIFT), window, 3 * HOUR)
    write_outputs(s, synth_outputs(2, 1_500, DRIFT), window, 3 * HOUR, prompt_version=NEW_PROMPT)
    # A shadow of the production cohort, judged against its window (both read every value).
    write_outputs(s, synth_outputs(3, 1_500, DRIFT), window, 3 * HOUR, model=SHADOW_MODEL, source="shadow")
    yield s
    s.close()


def _configs() -> dict[str, AnalyzerConfig]:
    return {"default": AnalyzerConfig(), "declared": parse_config(tomllib.loads(DECLARED))}


@pytest.mark.parametrize("name", ["default", "declared"])
def test_the_evaluation_judges_exactly_what_reading_every_value_judges(store: Store, name: str) -> None:
    config = _configs()[name]
    chosen = evaluate(store, config, AT)
    every = evaluate(store, config, AT, all_values=True)
    # Whole values: every check (effect, p-value, baseline and current evidence), every report.
    assert repr(chosen) == repr(every)
    breaches = [c for r in chosen.cohorts for c in r.checks if c.breach]
    kinds = {(c.field, c.kind) for c in breaches}
    # The value rules fired, so the comparison above covers them (a new value is folded into the
    # unknown share's growth of its field, and named there).
    assert {
        ("priority", AlertKind.unknown_enum_growth),
        ("sentiment", AlertKind.unknown_enum_growth),
        ("sentiment", AlertKind.cardinality_jump),
    } <= kinds
    assert all(
        "urgent" in c.current["new_values"]
        for c in breaches
        if (c.field, c.kind) == ("priority", AlertKind.unknown_enum_growth)
    )
    if name == "declared":
        assert ("summary", AlertKind.unknown_enum_growth) in kinds  # declared an enum: its values are read
    assert len(chosen.cohorts) == 3 and not chosen.failed


def _keys(store: Store, config: AnalyzerConfig) -> dict[tuple[str, str], set[str]]:
    profiles = read_profiles(store, AT - DAY, AT, values=False)
    first_seen = {Cohort(r.model, r.prompt_version, r.contract, r.source): r.first_seen for r in store.cohorts()}
    current = {a.cohort: a for a in activation_history(store)}
    keys = _value_keys(store, config, profiles, _Resolver(store, current, first_seen, served_aliases(store)))
    ids = {p.cohort_id: (p.model, p.prompt_version) for p in profiles}
    out: dict[tuple[str, str], set[str]] = {}
    for c, path in keys:
        out.setdefault(ids[c], set()).add(path)
    return out


def test_the_paths_read_are_the_baselines_enums_declared_enums_assertions_and_shadows(store: Store) -> None:
    enums = {"intent", "priority", "sentiment", "language", "customer.tier", "entities[].type", "tags[]"}
    enums |= {"follow_up.channel"}
    fields = {p.cohort_id: set(p.fields) for p in read_profiles(store, AT - DAY, AT, values=False)}
    every_path = set.union(*fields.values())
    assert {"summary", "customer.id", "customer.email", "entities[].value"} <= every_path  # free text, unread
    assert _keys(store, AnalyzerConfig()) == {
        (MODEL, PROMPT): every_path,  # the shadow's production twin: its window is a baseline
        (MODEL, NEW_PROMPT): enums,  # judged on the previous prompt version's baseline
        (SHADOW_MODEL, PROMPT): every_path,
    }
    declared = _keys(store, parse_config(tomllib.loads(DECLARED)))
    assert declared[(MODEL, NEW_PROMPT)] == enums | {"summary", "customer.id"}


def test_unread_values_refuse_every_look_and_with_values_reads_the_keys_named(store: Store) -> None:
    whole = {p.cohort_id: p for p in read_profiles(store, AT - DAY, AT)}
    unread = read_profiles(store, AT - DAY, AT, values=False)
    c = next(p.cohort_id for p in unread if p.prompt_version == NEW_PROMPT)
    f = next(p for p in unread if p.cohort_id == c).fields["priority"]
    assert isinstance(f.values, ValuesNotRead)
    for look in (len, set, dict, lambda v: v.get("low"), lambda v: "low" in v, lambda v: sum(v.values())):
        with pytest.raises(LookupError, match="not read"):
            look(f.values)
    read = {p.cohort_id: p for p in with_values(store, unread, {(c, "priority"), (c, "summary"), (c, "no.such")})}
    for pid, p in read.items():
        for path, field in p.fields.items():
            if pid == c and path in ("priority", "summary"):
                assert field == whole[pid].fields[path]  # values included
                assert field.values and sum(field.values.values()) > 0
            else:
                assert isinstance(field.values, ValuesNotRead)
                assert field.values_overflow == whole[pid].fields[path].values_overflow
    assert with_values(store, [], {(c, "priority")}) == []
    shorter = read_profiles(store, AT - 3 * HOUR, AT, values=False)
    assert shorter
    with pytest.raises(ValueError, match="one window"):
        with_values(store, [*unread, *shorter], {(c, "priority")})


@pytest.mark.parametrize("padding", [0, 600], ids=["listed-paths", "join-only"])
def test_window_values_equal_the_window_rollups_values_of_the_keys_asked(store: Store, padding: int) -> None:
    since = AT - DAY
    every = store.window_rollups(since, AT).values
    real = sorted(every)
    assert len(real) > 40
    asked = set(real[::3])
    # Keys that match nothing, crafted to look like paths, or not: none may match or fail the read
    # (past 512 distinct paths the read leaves the list out and keeps the keys by the join alone).
    odd = {(real[0][0], "x' OR '1'='1"), (real[0][0], ""), (real[0][0], "é" * 5_000), (-1, real[0][1])}
    odd |= {(2**62, real[0][1])} | {(real[0][0], f"pad.{i}") for i in range(padding)}
    got = store.window_values(since, AT, asked | odd)
    assert got == {k: every[k] for k in asked}
    assert store.window_values(since, AT, set()) == {}
