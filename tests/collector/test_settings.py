"""Tests for collector.settings: precedence, validation naming the key, documentation.

Precedence: explicit overrides (CLI options) > SHAPEWATCH_* environment > TOML
file > defaults. Every refusal is a SettingsInvalid whose ``key`` and message
name the setting and the fix.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import sys
from pathlib import Path

import pytest

from shapewatch.collector.errors import SettingsInvalid
from shapewatch.collector.settings import Settings, load_settings, settings_help

ROOT = Path(__file__).resolve().parents[2]
KNOWN = ", ".join(f.name for f in dataclasses.fields(Settings))


def toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "shapewatch.toml"
    path.write_text(text)
    return path


def invalid(overrides: dict[str, object] | None = None, **kw: object) -> SettingsInvalid:
    with pytest.raises(SettingsInvalid) as info:
        load_settings(overrides, **kw)  # type: ignore[arg-type]
    return info.value


def test_no_sources_give_the_defaults() -> None:
    assert load_settings(env={}) == Settings()
    assert load_settings(None, env={"HOME": "/root", "PATH": "/bin"}) == Settings()


def test_each_layer_overrides_the_one_below(tmp_path: Path) -> None:
    path = toml(tmp_path, '[shapewatch]\nport = 8001\nbucket_seconds = 120\nhost = "localhost"\n')
    env = {"SHAPEWATCH_PORT": "8002", "SHAPEWATCH_BUCKET_SECONDS": "300"}
    over = {"port": 8003}
    assert load_settings(env={}) == Settings()
    assert load_settings(env={}, toml_path=path) == Settings(port=8001, bucket_seconds=120, host="localhost")
    assert load_settings(env=env, toml_path=path) == Settings(port=8002, bucket_seconds=300, host="localhost")
    assert load_settings(over, env=env, toml_path=path) == Settings(port=8003, bucket_seconds=300, host="localhost")
    assert load_settings(over, env={}) == Settings(port=8003)


def test_an_override_of_none_means_not_given(tmp_path: Path) -> None:
    # A CLI option left unset arrives as None and must not hide the layers below.
    assert load_settings({"port": None, "db_path": None}, env={"SHAPEWATCH_PORT": "8002"}) == Settings(port=8002)


def test_the_toml_file_may_use_the_top_level(tmp_path: Path) -> None:
    path = toml(tmp_path, 'db_path = "data/x.duckdb"\nmax_depth = 8\n')
    assert load_settings(env={}, toml_path=path) == Settings(db_path=Path("data/x.duckdb"), max_depth=8)


def test_other_tables_in_the_toml_file_belong_to_other_packages(tmp_path: Path) -> None:
    path = toml(tmp_path, "[shapewatch]\nport = 9000\n[shapewatch.rules]\nmin_samples = 5\n[analysis]\nwhatever = 1\n")
    assert load_settings(env={}, toml_path=path) == Settings(port=9000)


def test_shapewatch_config_in_the_environment_names_the_toml_file(tmp_path: Path) -> None:
    path = toml(tmp_path, "port = 8100\n")
    assert load_settings(env={"SHAPEWATCH_CONFIG": str(path)}) == Settings(port=8100)
    other = tmp_path / "other.toml"
    other.write_text("port = 8200\n")
    # an explicit path wins over the environment's
    assert load_settings(env={"SHAPEWATCH_CONFIG": str(path)}, toml_path=other) == Settings(port=8200)


def test_environment_values_are_coerced_to_each_type() -> None:
    env = {
        "SHAPEWATCH_DB_PATH": "/srv/sw.duckdb",
        "SHAPEWATCH_PORT": "9001",
        "SHAPEWATCH_HOST": "::1",
        "SHAPEWATCH_DEDUP_TTL_DAYS": "1.5",
        "SHAPEWATCH_RAW_RETENTION_DAYS": "2",
        "SHAPEWATCH_MEMORY_LIMIT": "512MB",
        "SHAPEWATCH_BATCH_MAX_WAIT_MS": "0",
    }
    assert load_settings(env=env) == Settings(
        db_path=Path("/srv/sw.duckdb"),
        port=9001,
        host="::1",
        dedup_ttl_days=1.5,
        raw_retention_days=2.0,
        memory_limit="512MB",
        batch_max_wait_ms=0.0,
    )


def test_unknown_shapewatch_environment_variables_are_ignored() -> None:
    # The environment is shared with other tools; only names of settings are read.
    assert load_settings(env={"SHAPEWATCH_NOT_A_SETTING": "x", "SHAPEWATCH_URL": "http://h"}) == Settings()


@pytest.mark.parametrize(
    ("value", "tokens"), [("a", ("a",)), ("a,b", ("a", "b")), (" a , b ,, c ,", ("a", "b", "c")), ("", ()), (" , ", ())]
)
def test_tokens_from_a_comma_separated_environment_variable(value: str, tokens: tuple[str, ...]) -> None:
    assert load_settings(env={"SHAPEWATCH_TOKENS": value}).tokens == tokens


def test_tokens_from_the_toml_file_and_overrides(tmp_path: Path) -> None:
    assert load_settings(env={}, toml_path=toml(tmp_path, 'tokens = ["t1", "t2"]\n')).tokens == ("t1", "t2")
    assert load_settings(env={}, toml_path=toml(tmp_path, 'tokens = "t1,t2"\n')).tokens == ("t1", "t2")
    assert load_settings({"tokens": ["x"]}, env={"SHAPEWATCH_TOKENS": "a,b"}).tokens == ("x",)


# --- refusals name the key ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("port", "abc", "setting 'port': 'abc' is not a valid whole number"),
        ("port", "80.5", "setting 'port': '80.5' is not a valid whole number"),
        ("duckdb_threads", "", "setting 'duckdb_threads': '' is not a valid whole number"),
        ("dedup_ttl_days", "a week", "setting 'dedup_ttl_days': 'a week' is not a valid finite number"),
        ("port", "0", "setting 'port': 0 is below the minimum 1; set it to 1 or more"),
        ("port", "65536", "setting 'port': 65536 is above the maximum 65535; set it to 65535 or less"),
        ("max_depth", "513", "setting 'max_depth': 513 is above the maximum 512; set it to 512 or less"),
        ("max_event_bytes", "255", "setting 'max_event_bytes': 255 is below the minimum 256; set it to 256 or more"),
        ("max_body_bytes", "1000", "setting 'max_body_bytes': 1000 is below the minimum 1024; set it to 1024 or more"),
        (
            "bucket_seconds",
            "86401",
            "setting 'bucket_seconds': 86401 is above the maximum 86400; set it to 86400 or less",
        ),
        (
            "batch_max_wait_ms",
            "-1",
            "setting 'batch_max_wait_ms': -1.0 is below the minimum 0.0; set it to 0.0 or more",
        ),
        ("max_attributes", "-1", "setting 'max_attributes': -1 is below the minimum 0; set it to 0 or more"),
        (
            "checkpoint_threshold",
            "lots",
            "setting 'checkpoint_threshold': 'lots' is not a size; write a number and a unit such as 512MB or 1GB",
        ),
        (
            "memory_limit",
            "1 GBs",
            "setting 'memory_limit': '1 GBs' is not a size; write a number and a unit such as 512MB or 1GB",
        ),
        (
            "import_memory_limit",
            "MB",
            "setting 'import_memory_limit': 'MB' is not a size; write a number and a unit such as 512MB or 1GB",
        ),
    ],
)
def test_a_bad_environment_value_names_the_key(name: str, value: str, message: str) -> None:
    exc = invalid(env={f"SHAPEWATCH_{name.upper()}": value})
    assert (exc.key, str(exc)) == (name, message)


def test_a_bad_value_from_the_toml_file_names_the_key(tmp_path: Path) -> None:
    exc = invalid(env={}, toml_path=toml(tmp_path, '[shapewatch]\nmax_leaves = "many"\n'))
    assert (exc.key, str(exc)) == ("max_leaves", "setting 'max_leaves': 'many' is not a valid whole number")
    exc = invalid(env={}, toml_path=toml(tmp_path, "db_path = 5\n"))
    assert (exc.key, str(exc)) == ("db_path", "setting 'db_path': 5 is not a valid PosixPath")


def test_a_bad_override_names_the_key() -> None:
    exc = invalid({"max_leaves": 0}, env={})
    assert (exc.key, str(exc)) == ("max_leaves", "setting 'max_leaves': 0 is below the minimum 1; set it to 1 or more")


def test_an_unknown_key_in_the_toml_file_is_refused(tmp_path: Path) -> None:
    for text in ("[shapewatch]\nprot = 8001\n", "prot = 8001\n"):
        exc = invalid(env={}, toml_path=toml(tmp_path, text))
        assert (exc.key, str(exc)) == ("prot", f"setting 'prot': unknown setting; known settings: {KNOWN}")


def test_an_unknown_override_is_refused() -> None:
    exc = invalid({"db": "x.duckdb"}, env={})
    assert (exc.key, str(exc)) == ("db", f"setting 'db': unknown setting; known settings: {KNOWN}")


def test_an_unreadable_or_malformed_toml_file_is_refused(tmp_path: Path) -> None:
    missing = tmp_path / "missing.toml"
    exc = invalid(env={}, toml_path=missing)
    assert exc.key == "config"
    assert str(exc) == (f"setting 'config': cannot read {missing}: [Errno 2] No such file or directory: '{missing}'")
    broken = toml(tmp_path, "port = \n")
    exc = invalid(env={"SHAPEWATCH_CONFIG": str(broken)})
    assert exc.key == "config"
    assert str(exc).startswith(f"setting 'config': cannot read {broken}: ")


def test_raw_retention_and_dedup_ttl_are_independent() -> None:
    # the keys have a table of their own: raw outputs may go before their keys, or outlive them
    assert load_settings(env={"SHAPEWATCH_DEDUP_TTL_DAYS": "10", "SHAPEWATCH_RAW_RETENTION_DAYS": "1.5"}) == Settings(
        dedup_ttl_days=10.0, raw_retention_days=1.5
    )
    assert load_settings(env={"SHAPEWATCH_DEDUP_TTL_DAYS": "31"}) == Settings(dedup_ttl_days=31.0)


def test_settings_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Settings().port = 1  # type: ignore[misc]


def test_binding_beyond_loopback_without_tokens_is_never_silent(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="shapewatch.collector.settings"):
        load_settings(env={"SHAPEWATCH_HOST": "0.0.0.0"})
        load_settings(env={"SHAPEWATCH_HOST": "0.0.0.0", "SHAPEWATCH_TOKENS": "t"})
        load_settings(env={})
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        ("shapewatch.collector.settings", "WARNING", "binding 0.0.0.0 without tokens: anyone who reaches it can write")
    ]


@pytest.mark.parametrize("name", ["dedup_ttl_days", "raw_retention_days", "batch_max_wait_ms"])
def test_nan_is_refused(name: str) -> None:
    try:
        load_settings(env={f"SHAPEWATCH_{name.upper()}": "nan"})
    except SettingsInvalid as exc:
        assert exc.key == name
    else:
        raise AssertionError(f"{name}=nan was accepted")


@pytest.mark.parametrize("text", ["port = true\n", "duckdb_threads = 3.9\n"])
def test_a_toml_value_of_the_wrong_type_is_refused(tmp_path: Path, text: str) -> None:
    try:
        got = load_settings(env={}, toml_path=toml(tmp_path, text))
    except SettingsInvalid as exc:
        assert exc.key == text.split(" ")[0]
    else:
        raise AssertionError(f"{text.strip()} was accepted as {got}")


# --- documentation -------------------------------------------------------------------------------------


def test_every_setting_has_help() -> None:
    helps = settings_help()
    assert list(helps) == [f.name for f in dataclasses.fields(Settings)]
    assert all(text.strip().endswith(".") for text in helps.values()), helps


def test_every_setting_is_documented_in_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    assert [name for name in settings_help() if name not in readme] == []


def test_the_readme_settings_table_names_each_variable_and_default() -> None:
    readme = (ROOT / "README.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \| `(SHAPEWATCH_\w+)` \| ([^|]+?) \|", readme, flags=re.MULTILINE)
    expected = {
        f.name: (f"SHAPEWATCH_{f.name.upper()}", "none" if f.default == () else f"`{f.default}`")
        for f in dataclasses.fields(Settings)
    }
    assert {name: (env, default) for name, env, default in rows} == expected


def test_token_entries_are_bare_secrets_or_scoped() -> None:
    from shapewatch.collector.settings import Scope, parse_token

    assert parse_token("s3cret") == ("s3cret", frozenset(Scope))
    assert parse_token("read:s3") == ("s3", frozenset({Scope.read}))
    assert parse_token("ingest+read+admin:a:b") == ("a:b", frozenset(Scope))
    assert load_settings(env={"SHAPEWATCH_TOKENS": "ingest:a, read+admin:b ,c"}).tokens == (
        "ingest:a",
        "read+admin:b",
        "c",
    )


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ("reed:s3", "scope 'reed' of an entry is unknown"),
        ("read+:s3", "scope '' of an entry is unknown"),
        ("read:", "an entry has an empty secret"),
        ("read: s3", "an entry has an empty secret or one with white space"),
    ],
)
def test_a_bad_token_entry_names_the_setting_and_the_syntax(entry: str, says: str) -> None:
    err = invalid({"tokens": [entry]}, env={})
    assert err.key == "tokens" and says in str(err)


def test_a_secret_given_twice_is_refused() -> None:
    err = invalid({"tokens": ["read:s3", "admin:s3"]}, env={})
    assert err.key == "tokens" and "two entries share a secret" in str(err)


@pytest.mark.parametrize("size", ["256MB", "1GB", "512mb", "1.5GB", "64MiB", "100 KB", "4096B", "1TB", "10 bytes"])
def test_sizes_duckdb_reads_are_accepted(size: str) -> None:
    assert load_settings({"checkpoint_threshold": size, "memory_limit": size}, env={}).checkpoint_threshold == size


def test_the_checkpoint_threshold_and_memory_limit_reach_the_store(tmp_path: Path) -> None:
    from shapewatch.analysis.store_access import open_store  # the one place settings become a store

    settings = load_settings(
        {"checkpoint_threshold": "64MiB", "memory_limit": "768MB", "db_path": str(tmp_path / "s.duckdb")}, env={}
    )
    with open_store(settings) as store:
        # memory_limit, plus room for the key index of the next 100,000 events (64 bytes each)
        assert store.query("SELECT current_setting('checkpoint_threshold'), current_setting('memory_limit')") == [
            ("64.0 MiB", "738.5 MiB")
        ]
        assert store.memory_limit_bytes == 768_000_000 + 100_000 * 64


def test_duckdb_runs_on_one_thread_for_the_service_and_for_imports(tmp_path: Path) -> None:
    from shapewatch.analysis.service import create_app
    from shapewatch.analysis.store_access import open_store

    path = str(tmp_path / "t.duckdb")
    assert load_settings({"db_path": path}, env={}).duckdb_threads == 1
    for bulk in (False, True):
        with open_store(load_settings({"db_path": path}, env={}), bulk=bulk) as store:
            assert store.query("SELECT current_setting('threads')") == [(1,)]
    with open_store(load_settings({"db_path": path}, env={"SHAPEWATCH_DUCKDB_THREADS": "3"})) as store:
        assert store.query("SELECT current_setting('threads')") == [(3,)]
    app = create_app(load_settings({"db_path": path}, env={}), analyze=False)
    try:
        assert app.state.store.query("SELECT current_setting('threads')") == [(1,)]
    finally:
        app.state.store.close()


def test_a_session_sees_the_rows_it_inserts_after_a_large_import(tmp_path: Path) -> None:
    """DuckDB 1.5.6 on two threads: after an import whose merge inserted more than a row group
    (122,880 rows) of value rollups, the session no longer saw rows it inserted there (a reopen
    did; bench/repro_invisible_rows.py). The default store runs on one thread, where it does not."""
    import orjson

    from shapewatch.analysis.store_access import open_store
    from shapewatch.collector import Limits, import_files

    sys.path.insert(0, str(ROOT / "bench"))
    from gen import make_envelopes  # bench/ is not a package

    src = tmp_path / "in.jsonl"
    src.write_bytes(
        b"".join(orjson.dumps(e, option=orjson.OPT_APPEND_NEWLINE) for e in make_envelopes(10_000, seed=1001))
    )
    # every value kept (free text too), so that the merge inserts more than a row group of them
    settings = load_settings({"db_path": str(tmp_path / "r.duckdb"), "free_text_min_distinct": 0}, env={})
    count = "SELECT count(*), sum(n) FROM value_rollups"
    with open_store(settings, bulk=True) as store:
        import_files([src], store, Limits())
        rows, _n = store.query(count)[0]
        assert rows > 122_880  # past one row group: where two threads lost sight of later rows
        with store.transaction("adding ten rows") as con:
            con.execute("INSERT INTO value_rollups SELECT * FROM value_rollups LIMIT 10")
        seen = store.query(count)[0]
    assert seen[0] == rows + 10
    with open_store(settings) as store:
        assert store.query(count)[0] == seen


@pytest.mark.parametrize(
    ("overrides", "key", "message"),
    [
        ({"minute_buckets_hours": -1}, "minute_buckets_hours", "-1 is below the minimum 0"),
        ({"minute_buckets_hours": 10**9}, "minute_buckets_hours", "above the maximum 8784"),
        ({"hour_buckets_days": 0}, "hour_buckets_days", "0 is below the minimum 1"),
        ({"minute_buckets_hours": 48, "hour_buckets_days": 2}, "hour_buckets_days", "set it to 3 or more"),
        ({"minute_buckets_hours": 25, "hour_buckets_days": 2}, "hour_buckets_days", "set it to 3 or more"),
        ({"bucket_seconds": 7}, "bucket_seconds", "does not divide an hour"),
        ({"free_text_min_distinct": -5}, "free_text_min_distinct", "below the minimum 0"),
    ],
)
def test_rollup_tier_settings_out_of_range_are_refused_by_name(
    overrides: dict[str, object], key: str, message: str
) -> None:
    exc = invalid(overrides, env={})
    assert exc.key == key and message in str(exc)


def test_rollup_tiers_follow_the_settings_and_zero_turns_them_off() -> None:
    from shapewatch.collector.tiers import DAY, HOUR, TierPolicy

    assert load_settings(env={}).tiers == TierPolicy(24 * HOUR, 3 * DAY)
    assert load_settings({"minute_buckets_hours": 48, "hour_buckets_days": 10}, env={}).tiers == TierPolicy(
        48 * HOUR, 10 * DAY
    )
    off = load_settings({"minute_buckets_hours": 0, "bucket_seconds": 7}, env={})
    assert off.tiers is None  # without tiers, any bucket width is allowed
    assert load_settings(env={"SHAPEWATCH_HOUR_BUCKETS_DAYS": "5"}).tiers == TierPolicy(24 * HOUR, 5 * DAY)
