"""Hostile baselines: documents with a recomputed hash but wrong types, a reversed window, negative
counts, NUL or over-long tags are refused field by field before the hash is looked at; a freeze
ending past what the window arithmetic can hold is refused by name; ``baseline export`` shortens
over-long path parts and reports a file it cannot write without stopping; ``baseline import``
reads regular files only, up to a size cap (a FIFO, /dev/zero, a directory are refused unread)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner, Result
from harness import make_envelope

from shapewatch.analysis.cli import cli
from shapewatch.baselines import (
    BASELINES_SCHEMA,
    MAX_DOCUMENT_BYTES,
    Baseline,
    BaselineError,
    BaselineInvalid,
    Cohort,
    freeze_baseline,
    import_document,
    list_baselines,
)
from shapewatch.collector import FieldError, Store
from shapewatch.collector.envelope import LIMITS, parse_envelope

MODEL = "claude-sonnet-4-5-20250929"
COHORT = Cohort(MODEL, "intake-v3", "intake")
T0 = datetime(2026, 11, 1, tzinfo=UTC)
DAY = timedelta(days=1)
ENV = {"SHAPEWATCH_AUTHOR": "ana", "SHAPEWATCH_URL": None, "SHAPEWATCH_TOKEN": None, "SHAPEWATCH_CONFIG": None}
LIMIT = 9223372036854775807


def write(store: Store, cohort: Cohort, n: int = 50) -> None:
    envs = [
        parse_envelope(
            orjson.dumps(
                make_envelope(
                    event_id=f"{i}/{hashlib.sha256(repr(cohort).encode()).hexdigest()}",
                    ts=(T0 + timedelta(hours=6, seconds=i)).isoformat(),
                    model=cohort.model,
                    served_model=cohort.model,
                    prompt_version=cohort.prompt_version,
                    contract=cohort.contract,
                    output={"priority": ("low", "high")[i % 2]},
                )
            ),
            LIMITS,
        )
        for i in range(n)
    ]
    store.write_batch(envs)


def freeze(store: Store, cohort: Cohort = COHORT) -> Baseline:
    write(store, cohort)
    return freeze_baseline(store, cohort, T0, T0 + DAY, author="ana", note="reference week", min_samples=1)


def rehashed(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with its hash and id recomputed over its content, as anyone can."""
    content = {k: v for k, v in doc.items() if k not in ("baseline_id", "hash", "created_at")}
    digest = hashlib.sha256(orjson.dumps(content, option=orjson.OPT_SORT_KEYS)).hexdigest()
    return {**doc, "hash": digest, "baseline_id": digest[:16]}


def run(*args: str) -> Result:
    result = CliRunner(env=ENV).invoke(cli, list(args), prog_name="shapewatch")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"shapewatch {' '.join(args)} raised {result.exception!r}") from result.exception
    return result


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "hostile.duckdb"


@pytest.fixture
def store(db: Path) -> Iterator[Store]:
    s = Store.open(db, schemas=[BASELINES_SCHEMA])
    yield s
    s.close()


def stored(store: Store) -> list[str]:
    return [x.baseline.baseline_id for x in list_baselines(store)]


# --- documents ---------------------------------------------------------------------------------


def _edit(path: list[str], value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        obj = doc
        for k in path[:-1]:
            obj = obj[k]
        obj[path[-1]] = value

    return edit


def _reverse(doc: dict[str, Any]) -> None:
    doc["window"] = {"since": doc["window"]["until"], "until": doc["window"]["since"]}


def _extra(doc: dict[str, Any]) -> None:
    doc["approved"] = True


def _nul_served(doc: dict[str, Any]) -> None:
    doc["served_models"] = {"gpt\x00-4o": 50}


@pytest.mark.parametrize(
    ("edit", "problems"),
    [
        (
            _edit(["fields", "priority", "present"], "lots"),
            [("/fields/priority/present", "must be an integer, got string", "wrong_type")],
        ),
        (
            _reverse,
            [
                (
                    "/window/until",
                    "must be after /window/since (2026-11-02T00:00:00Z), got 2026-11-01T00:00:00Z",
                    "invalid_value",
                )
            ],
        ),
        (_edit(["samples"], -50), [("/samples", f"must be between 0 and {LIMIT}, got -50", "invalid_value")]),
        (
            _edit(["fields", "priority", "values", "low"], -1),
            [("/fields/priority/values/low", f"must be between 0 and {LIMIT}, got -1", "invalid_value")],
        ),
        (
            _edit(["cohort", "model"], "claude\x00"),
            [("/cohort/model", "must not contain NUL characters", "invalid_value")],
        ),
        (
            _edit(["cohort", "prompt_version"], "v" * 5000),
            [("/cohort/prompt_version", "is 5000 characters long; the limit is 256", "too_large")],
        ),
        (_nul_served, [("/served_models/gpt\x00-4o", "must not contain NUL characters", "invalid_value")]),
        (
            _edit(["window", "until"], "9999-12-31T23:59:59Z"),
            [
                (
                    "/window/until",
                    "'9999-12-31T23:59:59Z' is out of range: baseline times lie in 1971-01-01T00:00:00Z .. "
                    "9999-01-01T00:00:00Z",
                    "invalid_timestamp",
                )
            ],
        ),
        (
            _edit(["fields", "priority", "types"], {"string": 25, "text": 25}),
            [
                (
                    "/fields/priority/types/text",
                    "is not a JSON type (one of array, boolean, integer, null, number, object, string)",
                    "invalid_value",
                )
            ],
        ),
        (_extra, [("/approved", "is not a field of a baseline document", "unknown_field")]),
        (
            _edit(["fields", "priority", "trues"], 26),
            [("/fields/priority/trues", "must be at most the field's booleans (0), got 26", "invalid_value")],
        ),
        (
            _edit(["outcomes"], {"truncated": 1, "exploded": 2}),
            [
                (
                    "/outcomes/exploded",
                    "'exploded' is not an outcome kind (content_filter, invalid_json, no_structured_output, "
                    "not_an_object, output:content_filter, output:invalid_json, output:no_structured_output, "
                    "output:not_an_object, output:refusal, output:truncated, refusal, truncated)",
                    "invalid_value",
                )
            ],
        ),
    ],
    ids=[
        "wrong-type-count",
        "reversed-window",
        "negative-samples",
        "negative-value-count",
        "nul-tag",
        "5000-character-tag",
        "nul-served-model",
        "window-past-9999",
        "unknown-json-type",
        "unknown-key",
        "more-trues-than-booleans",
        "unknown-outcome-kind",
    ],
)
def test_a_document_with_a_recomputed_hash_is_refused_field_by_field(
    store: Store, tmp_path: Path, edit: Callable[[dict[str, Any]], None], problems: list[tuple[str, str, str]]
) -> None:
    doc = freeze(store).document()
    edit(doc)
    doc = rehashed(doc)
    with Store.open(tmp_path / "fresh.duckdb", schemas=[BASELINES_SCHEMA]) as fresh:
        with pytest.raises(BaselineInvalid) as info:
            import_document(fresh, doc, where="crafted.json")
        assert stored(fresh) == []
    assert info.value.fields == [FieldError(*p) for p in problems]
    assert str(info.value) == "crafted.json: not a valid baseline document: " + "; ".join(
        f"{p}: {r}" for p, r, _ in problems
    )


def test_the_schema_is_checked_before_the_hash(store: Store) -> None:
    doc = freeze(store).document()
    doc["samples"] = "many"  # and the hash left as it was: the schema speaks first
    with pytest.raises(
        BaselineInvalid, match=r"^doc: not a valid baseline document: /samples: must be an integer, got string$"
    ):
        import_document(store, doc, where="doc")


def test_a_document_with_thousands_of_problems_is_refused_with_a_bounded_list(store: Store) -> None:
    doc = freeze(store).document()
    field = doc["fields"]["priority"]
    doc["fields"] = {f"f{i}": {**field, "path": f"f{i}", "units": "x"} for i in range(3000)}
    with pytest.raises(BaselineInvalid) as info:
        import_document(store, doc, where="doc")
    assert info.value.fields == [
        FieldError(f"/fields/f{i}/units", "must be an integer, got string", "wrong_type") for i in range(50)
    ] + [FieldError("/", "and 2950 more problems, not listed")]
    assert str(info.value).endswith("/fields/f9/units: must be an integer, got string (and 41 more)")


@pytest.mark.parametrize(
    ("since", "until", "message"),
    [
        (
            T0,
            datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC),
            "until 9999-12-31T23:59:59+00:00 is out of range: a baseline window lies in 1971-01-01T00:00:00Z .. "
            "9999-01-01T00:00:00Z",
        ),
        (
            datetime(1, 1, 1, tzinfo=UTC),
            T0,
            "since 0001-01-01T00:00:00+00:00 is out of range: a baseline window lies in 1971-01-01T00:00:00Z .. "
            "9999-01-01T00:00:00Z",
        ),
    ],
)
def test_a_freeze_outside_the_representable_window_is_refused_naming_the_bound(
    store: Store, since: datetime, until: datetime, message: str
) -> None:
    write(store, COHORT)
    with pytest.raises(BaselineError) as info:
        freeze_baseline(store, COHORT, since, until, author="ana", note="far future", min_samples=1)
    assert str(info.value) == message
    assert stored(store) == []


def test_the_cli_freeze_ending_at_9999_12_31_is_refused_with_a_clear_error(store: Store, db: Path) -> None:
    write(store, COHORT)
    store.close()
    result = run(
        "baseline",
        "freeze",
        "--db",
        str(db),
        "--model",
        MODEL,
        "--prompt-version",
        "intake-v3",
        "--contract",
        "intake",
        "--since",
        "2026-11-01T00:00:00Z",
        "--until",
        "9999-12-31T23:59:59Z",
        "--note",
        "forever",
        "--force",
        "test",
    )
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == (
        "error: until 9999-12-31T23:59:59+00:00 is out of range: a baseline window lies in "
        "1971-01-01T00:00:00Z .. 9999-01-01T00:00:00Z\n"
    )


# --- export --------------------------------------------------------------------------------------


def _short(escaped: str, original: str) -> str:
    """The shortened form, computed here independently: a prefix, '~', 24 hex digits of SHA-256."""
    return f"{escaped}~{hashlib.sha256(original.encode()).hexdigest()[:24]}"


LONG_A = "m" * 256  # the longest model id the envelope takes
LONG_B = "m" * 250 + "suffix"  # the same first 250 characters
ACCENTED = "é" * 200  # 200 characters, 1,200 once escaped


def test_export_shortens_long_path_parts_and_reports_a_failed_file_without_stopping(
    store: Store, db: Path, tmp_path: Path
) -> None:
    cohorts = [
        COHORT,
        Cohort(LONG_A, "v1", "c"),
        Cohort(LONG_B, "v1", "c"),
        Cohort(ACCENTED, "v1", "c"),
        Cohort(MODEL, "p" * 256, "c"),
        Cohort(MODEL, "v1", "c" * 256),
    ]
    frozen = {c: freeze(store, c) for c in cohorts}
    store.close()
    parts = {
        COHORT: (MODEL, "intake-v3", "intake"),
        cohorts[1]: (_short("m" * 230, LONG_A), "v1", "c"),
        cohorts[2]: (_short("m" * 230, LONG_B), "v1", "c"),
        cohorts[3]: (_short("%C3%A9" * 38, ACCENTED), "v1", "c"),  # never half an escape
        cohorts[4]: (MODEL, _short("p" * 230, "p" * 256), "c"),
        cohorts[5]: (MODEL, "v1", _short("c" * 230, "c" * 256)),
    }
    expected = {c: Path(*parts[c], f"2026-11-02-{b.baseline_id}.json") for c, b in frozen.items()}

    out = tmp_path / "export"
    result = run("baseline", "export", "--out", str(out), "--db", str(db))
    assert result.exit_code == 0, result.stderr
    assert {p.relative_to(out) for p in out.rglob("*.json")} == set(expected.values())
    assert sorted(Path(line).relative_to(out) for line in result.stdout.splitlines()) == sorted(expected.values())
    assert max(len(part.encode()) for p in expected.values() for part in p.parts) == 255
    for c, b in frozen.items():
        assert json.loads((out / expected[c]).read_bytes()) == b.document()

    # One file cannot be written (a directory stands where it goes): the other five still are.
    again = tmp_path / "again"
    blocked = again / expected[COHORT]
    blocked.mkdir(parents=True)
    result = run("baseline", "export", "--out", str(again), "--db", str(db), "--format", "json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert sorted(report["written"]) == sorted(str(again / p) for c, p in expected.items() if c != COHORT)
    assert report["failed"] == [{"path": str(blocked), "reason": "Is a directory"}]
    assert {p.relative_to(again) for p in again.rglob("*.json") if p.is_file()} == {
        p for c, p in expected.items() if c != COHORT
    }

    result = run("baseline", "export", "--out", str(again), "--db", str(db))
    assert result.exit_code == 1
    assert result.stderr == f"error: {blocked}: Is a directory\nwrote 5 of 6 baselines; 1 failed\n"


# --- import --------------------------------------------------------------------------------------


def test_import_reads_regular_files_only_and_imports_the_others(store: Store, tmp_path: Path) -> None:
    b = freeze(store)
    good = tmp_path / "good.json"
    good.write_bytes(orjson.dumps(b.document()))
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # no writer: reading it would block for ever
    zero = tmp_path / "zero.json"
    zero.symlink_to("/dev/zero")  # reading it would never end
    to_fifo = tmp_path / "to-fifo.json"
    to_fifo.symlink_to(fifo)
    directory = tmp_path / "dir.json"
    directory.mkdir()
    big = tmp_path / "big.json"
    with big.open("wb") as f:
        f.truncate(MAX_DOCUMENT_BYTES + 1)  # sparse: nothing to read, the size alone refuses it
    missing = tmp_path / "missing.json"

    fresh = tmp_path / "fresh.duckdb"
    result = run(
        "baseline",
        "import",
        str(fifo),
        str(zero),
        str(to_fifo),
        str(directory),
        str(big),
        str(missing),
        str(good),
        "--db",
        str(fresh),
    )
    why = "not a regular file; only exported baseline files are imported"
    assert result.exit_code == 2
    assert result.stdout == f"{good}: imported ({b.baseline_id})\n"
    assert result.stderr.splitlines() == [
        # a folder is read for the files export wrote in it (none here), before the files given
        f"error: {directory}: is a folder without any .json file",
        f"error: {fifo}: is a FIFO, {why}",
        f"error: {zero}: is a character device, {why}",
        f"error: {to_fifo}: is a FIFO, {why}",
        f"error: {big}: is {MAX_DOCUMENT_BYTES + 1} bytes; the limit is {MAX_DOCUMENT_BYTES}",
        f"error: {missing}: cannot open (No such file or directory)",
        "refused 6 of 7 files",
    ]
    with Store.open(fresh, schemas=[BASELINES_SCHEMA]) as s:
        assert stored(s) == [b.baseline_id]


def test_import_of_a_crafted_file_names_the_field_and_imports_the_others(store: Store, tmp_path: Path) -> None:
    b = freeze(store)
    doc = b.document()
    doc["fields"]["priority"]["present"] = "lots"
    crafted, good = tmp_path / "crafted.json", tmp_path / "good.json"
    crafted.write_bytes(orjson.dumps(rehashed(doc)))
    good.write_bytes(orjson.dumps(b.document()))
    result = run("baseline", "import", str(crafted), str(good), "--db", str(tmp_path / "fresh.duckdb"))
    assert (result.exit_code, result.stdout) == (2, f"{good}: imported ({b.baseline_id})\n")
    assert result.stderr == (
        f"error: {crafted}: not a valid baseline document: /fields/priority/present: "
        "must be an integer, got string\nrefused 1 of 2 files\n"
    )
