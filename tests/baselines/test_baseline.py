"""Frozen baselines: the same window gives the same hash, nothing changes a frozen one, tampered exports
are refused, imports are idempotent and round-trip, freezing refuses too few samples or objections
unless forced, activation history is append-only, and export paths stay inside their directory."""

from __future__ import annotations

import dataclasses
import hashlib
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from harness import make_envelope

from shapewatch.baselines import (
    BASELINES_SCHEMA,
    Activation,
    ActivationAction,
    Baseline,
    BaselineError,
    BaselineRefused,
    BaselineTampered,
    Cohort,
    activate_baseline,
    activation_history,
    active_baseline,
    export_baselines,
    freeze_baseline,
    get_baseline,
    import_baseline,
    inherit_baseline,
    is_unpinned,
    list_baselines,
    resolve_baseline,
    retire_baseline,
)
from shapewatch.collector import Store
from shapewatch.collector.envelope import LIMITS, parse_envelope

MODEL = "claude-sonnet-4-5-20250929"
COHORT = Cohort(MODEL, "intake-v3", "intake")
OTHER = Cohort(MODEL, "intake-v4", "intake")
T0 = datetime(2026, 11, 1, tzinfo=UTC)
DAY = timedelta(days=1)
WINDOW = "2026-11-01T00:00:00Z .. 2026-11-02T00:00:00Z"


def write(store: Store, n: int, since: datetime, *, cohort: Cohort = COHORT, seed: int = 0) -> None:
    """n outputs of one cohort spread over the hour after ``since`` (the same seed gives the same events)."""
    rnd = random.Random(seed)
    envs = []
    for i in range(n):
        out: dict[str, Any] = {
            "priority": rnd.choice(["low", "medium", "high"]),
            "confidence": round(rnd.uniform(0.5, 0.99), 2),
            "tags": rnd.sample(["billing", "refund", "bug"], rnd.randint(0, 2)),
        }
        if rnd.random() < 0.7:
            out["customer"] = {"tier": rnd.choice(["gold", "silver"])}
        env = make_envelope(
            event_id=f"{'/'.join(cohort)}/{since.isoformat()}/{seed}/{i}",
            ts=(since + timedelta(seconds=i * 3600 // n)).isoformat(),
            model=cohort.model,
            served_model=cohort.model,
            prompt_version=cohort.prompt_version,
            contract=cohort.contract,
            output=out,
        )
        envs.append(parse_envelope(orjson.dumps(env), LIMITS))
    store.write_batch(envs)


def open_store(path: Path) -> Store:
    return Store.open(path, schemas=[BASELINES_SCHEMA])


@pytest.fixture
def store(tmp_path: Path) -> Any:
    s = open_store(tmp_path / "baselines.duckdb")
    yield s
    s.close()


def freeze(
    store: Store,
    *,
    since: datetime = T0,
    cohort: Cohort = COHORT,
    note: str = "reference week",
    at: datetime | None = None,
    **kw: Any,
) -> Baseline:
    return freeze_baseline(store, cohort, since, since + DAY, author="ana", note=note, now=at or since + DAY, **kw)


def rows(store: Store) -> list[tuple[Any, ...]]:
    return store.query("SELECT * FROM baselines ORDER BY baseline_id")


# --- freezing ---------------------------------------------------------------------------------


def test_freezing_the_same_window_twice_gives_the_same_baseline(store: Store, tmp_path: Path) -> None:
    write(store, 300, T0 + timedelta(hours=6))
    b1 = freeze(store, at=T0 + DAY)
    b2 = freeze(store, at=T0 + 3 * DAY)  # later, same content
    assert b2 == b1  # the stored one, first creation time included
    assert (b1.hash, b1.baseline_id, b1.created_at, b1.samples) == (b2.hash, b1.hash[:16], T0 + DAY, 300)
    assert len(rows(store)) == 1
    # The hash is the SHA-256 of the canonical document without id, hash and creation time.
    content = {k: v for k, v in b1.document().items() if k not in ("baseline_id", "hash", "created_at")}
    assert hashlib.sha256(orjson.dumps(content, option=orjson.OPT_SORT_KEYS)).hexdigest() == b1.hash
    # Another note is another baseline.
    assert freeze(store, note="another reason").hash != b1.hash
    # The same events in another database give the same hash: it depends on the content only.
    with open_store(tmp_path / "again.duckdb") as other:
        write(other, 300, T0 + timedelta(hours=6))
        assert freeze(other, at=T0 + 9 * DAY).hash == b1.hash


def test_freezing_under_the_minimum_is_refused_with_the_count_and_the_minimum(store: Store) -> None:
    write(store, 150, T0 + timedelta(hours=6))
    with pytest.raises(BaselineRefused) as info:
        freeze(store)
    objection = f"cohort {COHORT} has 150 samples in {WINDOW}, fewer than the minimum of 200"
    assert info.value.objections == [objection]
    assert str(info.value) == (
        f"baseline not frozen: {objection} (freeze another window, or pass --force with a reason)"
    )
    with pytest.raises(BaselineRefused):
        freeze(store, force="   ")  # a reason must say something
    assert (rows(store), activation_history(store)) == ([], [])
    forced = freeze(store, force="canary cohort, low traffic: reviewed by ana")
    assert (forced.forced, forced.samples, active_baseline(store, COHORT)) == (
        "canary cohort, low traffic: reviewed by ana",
        150,
        forced,
    )
    assert freeze(store, min_samples=100, note="enough for a canary").forced is None


def test_freezing_with_objections_is_refused_unless_forced(store: Store) -> None:
    write(store, 300, T0 + timedelta(hours=6))
    alerts = "2 page alerts were firing in the window"
    with pytest.raises(BaselineRefused) as info:
        freeze(store, objections=[alerts])
    assert info.value.objections == [alerts]
    assert alerts in str(info.value)
    forced = freeze(store, objections=[alerts], force="the alerts were the planned v3 rollout")
    assert forced.forced == "the alerts were the planned v3 rollout"
    assert forced.document()["forced"] == forced.forced  # recorded in the hashed content
    # Force without anything to override records nothing.
    assert freeze(store, force="just in case", note="plain").forced is None


def test_contract_versions_count_the_same_events_as_the_profile(store: Store) -> None:
    # Off the minute grid: the profile holds the buckets that start in the window (06:01 .. 06:30), and
    # the contract versions must count those same events, not since <= ts < until (148 of them).
    write(store, 300, T0 + timedelta(hours=6))  # one output every 12 seconds
    b = freeze_baseline(
        store,
        COHORT,
        T0 + timedelta(hours=6, seconds=30),
        T0 + timedelta(hours=6, minutes=30, seconds=10),
        author="ana",
        note="half an hour",
        min_samples=100,
    )
    assert b.samples == 150  # the buckets 06:01 .. 06:30, five outputs each
    assert b.contract_versions == {"3": 150}


def test_freezing_needs_a_window_a_note_and_a_known_cohort(store: Store) -> None:
    write(store, 300, T0 + timedelta(hours=6))
    with pytest.raises(BaselineError, match="the window is empty"):
        freeze_baseline(store, COHORT, T0, T0, author="ana", note="x")
    with pytest.raises(BaselineError, match="needs a note"):
        freeze(store, note="  ")
    with pytest.raises(BaselineError, match="no events were ever stored for cohort"):
        freeze(store, cohort=OTHER)


# --- immutability, export and import ----------------------------------------------------------


def test_no_operation_changes_a_frozen_baseline(store: Store, tmp_path: Path) -> None:
    write(store, 300, T0 + timedelta(hours=6))
    write(store, 300, T0 + DAY + timedelta(hours=6), seed=1)
    write(store, 300, T0 + timedelta(hours=8), cohort=OTHER, seed=2)
    b = freeze(store)
    before = rows(store)
    with pytest.raises(dataclasses.FrozenInstanceError):
        b.note = "edited"  # type: ignore[misc]
    activate_baseline(store, b.baseline_id, author="bo", note="again")
    retire_baseline(store, COHORT, author="bo", note="pause")
    activate_baseline(store, b.baseline_id[:8], author="bo")
    inherit_baseline(store, OTHER, b.baseline_id, author="bo", note="rollout")
    assert freeze(store, at=T0 + 5 * DAY) == b
    (path,) = export_baselines(store, tmp_path / "export")
    assert import_baseline(store, path) == (b, False)
    b2 = freeze(store, since=T0 + DAY, note="next week")  # another baseline of the same cohort
    assert [r for r in rows(store) if r[0] == b.baseline_id] == before
    assert get_baseline(store, b.baseline_id) == b
    assert b2.baseline_id != b.baseline_id


@pytest.mark.parametrize("edit", ["count", "note", "samples", "window", "forced", "served_models"])
def test_import_refuses_a_tampered_export(store: Store, tmp_path: Path, edit: str) -> None:
    write(store, 300, T0 + timedelta(hours=6))
    b = freeze(store)
    (path,) = export_baselines(store, tmp_path / "export")
    doc = orjson.loads(path.read_bytes())
    if edit == "count":
        doc["fields"]["priority"]["values"]["low"] += 1
    elif edit == "note":
        doc["note"] = "reference week (approved)"
    elif edit == "samples":
        doc["samples"] = 3000
    elif edit == "window":
        doc["window"]["since"] = "2026-10-31T00:00:00Z"
    elif edit == "forced":
        doc["forced"] = "nobody objected"
    else:
        doc["served_models"] = {"gpt-4o": 300}
    path.write_bytes(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2) + b"\n")
    with open_store(tmp_path / "fresh.duckdb") as fresh:
        with pytest.raises(BaselineTampered) as info:
            import_baseline(fresh, path)
        assert rows(fresh) == []
    assert str(info.value).startswith(f"{path}: the baseline's hash says {b.hash[:16]}... but its content hashes to ")
    assert str(info.value).endswith("; the file was edited after export and is refused")


def test_import_of_the_same_file_twice_is_a_no_op(store: Store, tmp_path: Path) -> None:
    write(store, 300, T0 + timedelta(hours=6))
    b = freeze(store)
    (path,) = export_baselines(store, tmp_path / "export")
    with open_store(tmp_path / "fresh.duckdb") as fresh:
        assert import_baseline(fresh, path) == (b, True)
        assert import_baseline(fresh, path) == (b, False)
        assert len(rows(fresh)) == 1


def test_export_then_import_round_trips_to_an_identical_baseline(store: Store, tmp_path: Path) -> None:
    write(store, 300, T0 + timedelta(hours=6))
    write(store, 400, T0 + DAY + timedelta(hours=6), seed=1)
    first = freeze(store)
    second = freeze(store, since=T0 + DAY, note="next week")
    out = tmp_path / "export"
    paths = export_baselines(store, out)
    assert sorted(paths) == sorted(
        out / MODEL / "intake-v3" / "intake" / f"{b.until:%Y-%m-%d}-{b.baseline_id}.json" for b in (first, second)
    )
    for b in (first, second):
        path = out / MODEL / "intake-v3" / "intake" / f"{b.until:%Y-%m-%d}-{b.baseline_id}.json"
        assert (
            path.read_bytes() == orjson.dumps(b.document(), option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2) + b"\n"
        )
    with open_store(tmp_path / "fresh.duckdb") as fresh:
        imported = [import_baseline(fresh, p) for p in sorted(paths)]
        assert sorted(imported, key=lambda x: x[0].baseline_id) == sorted(
            [(first, True), (second, True)], key=lambda x: x[0].baseline_id
        )
        assert (get_baseline(fresh, first.baseline_id), get_baseline(fresh, second.baseline_id)) == (first, second)
        assert rows(fresh) == rows(store)  # byte for byte, created_at included
        # Imported, not activated: activation is a decision of the importing side.
        assert [(x.baseline, x.active) for x in list_baselines(fresh)] == [(second, False), (first, False)]


def test_a_document_of_another_format_is_refused(store: Store, tmp_path: Path) -> None:
    write(store, 300, T0 + timedelta(hours=6))
    freeze(store)
    (path,) = export_baselines(store, tmp_path / "export")
    doc = orjson.loads(path.read_bytes())
    path.write_bytes(orjson.dumps({**doc, "format": 2}))
    with pytest.raises(BaselineError, match="unknown baseline format 2"):
        import_baseline(store, path)
    path.write_bytes(b"[1, 2]")
    with pytest.raises(BaselineError, match="a JSON object is expected"):
        import_baseline(store, path)


# --- activation -------------------------------------------------------------------------------


def test_activation_history_keeps_every_entry_and_listing_marks_the_active_one(store: Store) -> None:
    write(store, 300, T0 + timedelta(hours=6))
    write(store, 300, T0 + DAY + timedelta(hours=6), seed=1)
    write(store, 300, T0 + DAY + timedelta(hours=9), cohort=OTHER, seed=2)
    t = [T0 + 10 * DAY + k * timedelta(hours=1) for k in range(6)]
    b1 = freeze(store, at=t[0])
    b2 = freeze(store, since=T0 + DAY, note="after the v3 fix", at=t[1])
    assert [(x.baseline.baseline_id, x.active) for x in list_baselines(store)] == [
        (b2.baseline_id, True),
        (b1.baseline_id, False),
    ]
    activate_baseline(store, b1.baseline_id, author="bo", note="rollback: v3 fix reverted", now=t[2])
    assert [(x.baseline.baseline_id, x.active) for x in list_baselines(store)] == [
        (b2.baseline_id, False),
        (b1.baseline_id, True),
    ]
    assert active_baseline(store, COHORT) == b1
    inherit_baseline(store, OTHER, b2.baseline_id, author="bo", note="v4 canary", now=t[3])
    retire_baseline(store, COHORT, author="bo", note="prompt retired", now=t[4])
    assert [(x.baseline.baseline_id, x.active) for x in list_baselines(store)] == [
        (b2.baseline_id, False),
        (b1.baseline_id, False),
    ]
    assert active_baseline(store, COHORT) is None
    assert activation_history(store, COHORT) == [
        Activation(COHORT, ActivationAction.activate, b1.baseline_id, t[0], "ana", "reference week"),
        Activation(COHORT, ActivationAction.activate, b2.baseline_id, t[1], "ana", "after the v3 fix"),
        Activation(COHORT, ActivationAction.activate, b1.baseline_id, t[2], "bo", "rollback: v3 fix reverted"),
        Activation(COHORT, ActivationAction.retire, None, t[4], "bo", "prompt retired"),
    ]
    assert activation_history(store, OTHER) == [
        Activation(OTHER, ActivationAction.inherit, b2.baseline_id, t[3], "bo", "v4 canary")
    ]
    assert len(activation_history(store)) == 5
    # A named parent is not an active baseline of the cohort's own; it is what the cohort is compared with.
    assert active_baseline(store, OTHER) is None
    resolved = resolve_baseline(store, OTHER)
    assert resolved is not None and (resolved.baseline, resolved.how, resolved.inherited_from) == (b2, "parent", COHORT)
    assert list_baselines(store, OTHER) == []


def test_a_new_prompt_version_resolves_to_the_previous_ones_active_baseline(store: Store) -> None:
    write(store, 300, T0 + timedelta(hours=6))
    write(store, 300, T0 + DAY + timedelta(hours=6), cohort=OTHER, seed=1)  # intake-v4 first seen a day later
    b = freeze(store)
    resolved = resolve_baseline(store, OTHER)
    assert resolved is not None and (resolved.baseline, resolved.how, resolved.inherited_from) == (
        b,
        "previous_prompt_version",
        COHORT,
    )
    own = resolve_baseline(store, COHORT)
    assert own is not None and (own.how, own.inherited_from) == ("own", None)
    retire_baseline(store, COHORT, author="bo")
    assert resolve_baseline(store, OTHER) is None  # the previous version has no active baseline any more
    assert resolve_baseline(store, COHORT) is None  # retired means compared against nothing


# --- model ids and paths ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "unpinned"),
    [
        ("gpt-4o", True),
        ("gpt-4o-mini", True),
        ("claude-sonnet-4-5", True),
        ("gemini-2.0-flash", True),
        ("gpt-4o-2024-08-06", False),
        ("claude-sonnet-4-5-20250929", False),
        ("gpt-4-0613", False),
        ("gemini-1.5-pro-002", False),
        ("mistral-large-2407", False),
        ("llama3:70b", False),
        ("gpt-4-1106-preview", False),
    ],
)
def test_is_unpinned(model: str, unpinned: bool) -> None:
    assert is_unpinned(model) is unpinned


@pytest.mark.parametrize(
    "cohort",
    [
        Cohort("../x", "a/b", ".."),
        Cohort("..", ".", "../../etc"),
        Cohort("a/b", "../x", "/abs/path"),
        Cohort("..\\..\\x", "v1", "c"),
    ],
)
def test_the_export_path_never_escapes_the_output_directory(tmp_path: Path, cohort: Cohort) -> None:
    with open_store(tmp_path / "odd.duckdb") as store:
        write(store, 300, T0 + timedelta(hours=6), cohort=cohort)
        b = freeze(store, cohort=cohort)
        out = tmp_path / "export"
        before = sorted(p for p in tmp_path.rglob("*") if not p.is_relative_to(out))
        (path,) = export_baselines(store, out)
        after = sorted(p for p in tmp_path.rglob("*") if not p.is_relative_to(out))
    rel = path.relative_to(out)
    assert path.resolve().is_relative_to(out.resolve())
    assert len(rel.parts) == 4 and not {".", ".."} & set(rel.parts)
    assert all("/" not in part and "\\" not in part for part in rel.parts)
    assert rel.parts[3] == f"2026-11-02-{b.baseline_id}.json"
    assert sorted(out.rglob("*.json")) == [path]
    assert after == before  # nothing written beside the export directory
    with open_store(tmp_path / "fresh.duckdb") as fresh:
        assert import_baseline(fresh, path) == (b, True)


def test_distinct_cohorts_get_distinct_export_directories(store: Store, tmp_path: Path) -> None:
    # "a/b" is escaped; a model literally named like the escape must not land in the same place.
    cohorts = [Cohort("a/b", "v1", "c"), Cohort("a%2Fb", "v1", "c"), Cohort("a", "b/v1", "c")]
    for i, c in enumerate(cohorts):
        write(store, 300, T0 + timedelta(hours=6), cohort=c, seed=i)
        freeze(store, cohort=c)
    paths = export_baselines(store, tmp_path / "export")
    assert len({p.parent for p in paths}) == 3
