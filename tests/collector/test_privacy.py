"""Privacy: ``redact_paths`` values are never stored in rollups, free text is told apart from enums,
sample outputs are masked. Real DuckDB files; the accelerator in use (C, or the Python twin under
``SHAPEWATCH_ACCEL=python``) counts the values, the merge drops them before writing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from shapewatch.collector import (
    FieldProfile,
    RedactPatterns,
    SettingsInvalid,
    holds_free_text,
    load_settings,
    looks_personal,
    mask_output,
    read_profile,
    withhold_free_text,
)
from shapewatch.collector.envelope import LIMITS, parse_envelope
from shapewatch.collector.rollup import RollupConfig
from shapewatch.collector.store import Store

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def envelope(i: int, **output: Any) -> Any:
    raw = {
        "event_id": f"e{i}",
        "ts": (T0 + timedelta(seconds=7 * i)).isoformat(),
        "model": "m-2025-01-01",
        "prompt_version": "p1",
        "contract": "c",
        "output": output,
    }
    return parse_envelope(orjson.dumps(raw), LIMITS)


def outputs(n: int) -> list[Any]:
    return [
        envelope(
            i,
            customer={"email": f"user{i}@example.com", "age": 20 + i % 50, "tier": ("gold", "silver")[i % 2]},
            notes=[{"text": f"called at {i}"}],
        )
        for i in range(n)
    ]


def field(values: dict[str, int], strings: int | None = None, overflow: int = 0) -> FieldProfile:
    n = sum(values.values()) + overflow if strings is None else strings
    return FieldProfile("p", None, n, n, {"string": n}, 0, values, overflow)


def test_a_redacted_path_stores_no_value_and_keeps_its_counts(tmp_path: Path) -> None:
    plain = Store.open(tmp_path / "plain.duckdb", rollup=RollupConfig())
    redacted = Store.open(
        tmp_path / "redacted.duckdb",
        rollup=RollupConfig(redact_paths=("customer.email", "customer.age", "notes*")),
    )
    with plain, redacted:
        for store in (plain, redacted):
            store.write_batch(outputs(300))
        rows = redacted.query(
            "SELECT path, count(*) FROM value_rollups WHERE path IN ('customer.email', 'notes[].text') GROUP BY path"
        )
        assert rows == []
        assert redacted.query("SELECT count(*) FROM number_rollups WHERE path = 'customer.age'") == [(0,)]
        # nothing else is touched: the tier enum and its counts are the same in both files
        a = read_profile(plain, 1, T0, T0 + timedelta(hours=2))
        b = read_profile(redacted, 1, T0, T0 + timedelta(hours=2))
        assert b.fields["customer.tier"] == a.fields["customer.tier"]
        for path in ("customer.email", "notes[].text"):
            pf, rf = a.fields[path], b.fields[path]
            assert rf.values == {}
            # the values count as overflow: present, types and the sum of values stay whole
            assert (rf.units, rf.present, rf.types) == (pf.units, pf.present, pf.types)
            assert rf.values_overflow == pf.values_overflow + sum(pf.values.values())
        assert b.fields["customer.age"].numbers == {}
        assert b.fields["customer.age"].types == a.fields["customer.age"].types
        # and no e-mail address is anywhere in the rollup tables of the redacted file
        for table in ("value_rollups", "field_rollups"):
            text = str(redacted.query(f"SELECT * FROM {table}"))
            assert "@example.com" not in text


def test_redact_patterns_match_whole_paths_with_star_for_any_run() -> None:
    p = RedactPatterns.parse(["customer.email", "*.phone", "notes[]*"])
    assert [
        p.matches(x)
        for x in ("customer.email", "customer.email2", "a.customer.email", "billing.phone", "phone", "notes[].text")
    ] == [True, False, False, True, False, True]
    assert not RedactPatterns.parse([]).matches("anything")
    # brackets and dots are literal, never a character class or "any character"
    assert not RedactPatterns.parse(["a[b]"]).matches("ab")
    assert not RedactPatterns.parse(["a.b"]).matches("axb")


@pytest.mark.parametrize(
    ("patterns", "reason"),
    [
        (["*"], "would match every path"),
        (["**"], "would match every path"),
        ([""], "is not a path pattern"),
        (["a\nb"], "control character"),
        (["x" * 1001], "longer than the limit of 1000"),
        ([f"p{i}" for i in range(101)], "more than the limit of 100"),
    ],
)
def test_hostile_redact_paths_are_refused_naming_the_setting(patterns: list[str], reason: str) -> None:
    with pytest.raises(SettingsInvalid) as exc:
        load_settings({"redact_paths": patterns}, env={})
    assert "redact_paths" in str(exc.value)
    assert reason in str(exc.value)


def test_redact_paths_come_from_the_environment_comma_separated() -> None:
    s = load_settings(env={"SHAPEWATCH_REDACT_PATHS": "customer.email, notes[].text"})
    assert s.redact_paths == ("customer.email", "notes[].text")


def test_free_text_is_many_rare_values_or_any_address() -> None:
    enum = field({"gold": 500, "silver": 300})
    ids = field({f"c-{i}": 1 for i in range(60)})
    repeated = field({f"v{i}": 20 for i in range(60)})  # a large enum: every value repeats
    addresses = field({"low": 100, "ana@example.org": 3})
    assert [holds_free_text(f) for f in (enum, ids, repeated, addresses)] == [False, True, False, True]
    assert looks_personal("write to ana.b+x@mail.example.co.uk today")
    assert not looks_personal("@here") and not looks_personal("a@b")


def test_withholding_keeps_every_count_of_a_free_text_path() -> None:
    ids = field({f"c-{i}": 1 for i in range(60)}, overflow=5)
    enum = field({"gold": 500})
    out = withhold_free_text({"ids": ids, "tier": enum})
    assert out["tier"] is enum
    assert out["ids"].values == {}
    assert out["ids"].values_overflow == 65
    assert (out["ids"].present, out["ids"].types) == (ids.present, ids.types)


def test_mask_output_hides_named_paths_and_addresses_and_keeps_the_shape() -> None:
    output = {
        "customer": {"email": "ana@example.com", "name": "Ana", "age": 31},
        "notes": [{"text": "hi"}, {"text": "call bob@example.net"}],
        "tier": "gold",
        "cc": ["x@example.com"],
    }
    masked = mask_output(output, lambda p: p in {"customer.name", "notes[].text"})
    assert masked == {
        "customer": {"email": "[withheld]", "name": "[withheld]", "age": 31},
        "notes": [{"text": "[withheld]"}, {"text": "[withheld]"}],
        "tier": "gold",
        "cc": ["[withheld]"],
    }
    assert output["customer"]["email"] == "ana@example.com"  # a copy: the original is untouched


def test_a_declared_enum_keeps_its_values_unless_they_look_personal() -> None:
    ids = field({f"c-{i}": 1 for i in range(60)})
    mails = field({f"u{i}@example.com": 1 for i in range(60)})
    out = withhold_free_text({"ids": ids, "mails": mails}, keep=lambda p: True)
    assert out["ids"] is ids  # the operator's enum: its rule needs the set
    assert out["mails"].values == {} and out["mails"].values_overflow == 60
