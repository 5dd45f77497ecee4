"""Scale-out mode's parts that need no NATS and no PostgreSQL: its configuration file (hostile
values refused naming the key), the shard of an event id, and an envelope's trip through the
stream. The running cluster is tested in tests/cluster/ (make test-cluster)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from harness import make_envelope

from shapewatch.collector.envelope import Limits, parse_envelope
from shapewatch.collector.scaleout import (
    ScaleOutConfig,
    ScaleOutConfigError,
    decode_envelope,
    encode_envelope,
    shard_of,
)

VALID: dict[str, Any] = {
    "nats_servers": ["nats://127.0.0.1:4222", "nats://127.0.0.1:4223"],
    "pg_dsn": "host=127.0.0.1 dbname=lake",
    "data_path": "/var/lib/shapewatch/lake/",
}


def test_a_minimal_file_gets_the_documented_defaults(tmp_path: Path) -> None:
    f = tmp_path / "s.toml"
    f.write_text('[scaleout]\nnats_servers = ["nats://a:4222"]\npg_dsn = "host=pg"\ndata_path = "s3://bucket/lake/"\n')
    cfg = ScaleOutConfig.from_toml(f)
    assert cfg == ScaleOutConfig(nats_servers=("nats://a:4222",), pg_dsn="host=pg", data_path="s3://bucket/lake/")
    assert (cfg.shards, cfg.replicas, cfg.stream, cfg.subject_of(3)) == (8, 3, "SHAPEWATCH", "shapewatch.events.3")


@pytest.mark.parametrize(
    ("change", "key", "reason"),
    [
        ({"nats_servers": []}, "nats_servers", "non-empty list"),
        ({"nats_servers": "nats://a:4222"}, "nats_servers", "non-empty list"),
        ({"nats_servers": ["http://a:4222"]}, "nats_servers", "nats:// or tls://"),
        ({"pg_dsn": ""}, "pg_dsn", "non-empty string"),
        ({"pg_dsn": 5}, "pg_dsn", "non-empty string"),
        ({"data_path": "x" * 5000}, "data_path", "non-empty string"),
        ({"stream": "a.b>"}, "stream", "letters, digits"),
        ({"shards": 0}, "shards", "between 1 and 1024"),
        ({"shards": 10**12}, "shards", "between 1 and 1024"),
        ({"shards": 2.5}, "shards", "an integer"),
        ({"shards": True}, "shards", "an integer"),
        ({"shards": "8"}, "shards", "an integer"),
        ({"replicas": 7}, "replicas", "between 1 and 5"),
        ({"ack_wait_seconds": float("nan")}, "ack_wait_seconds", "between 1 and 3600"),
        ({"ack_wait_seconds": float("inf")}, "ack_wait_seconds", "between 1 and 3600"),
        ({"batch_events": -1}, "batch_events", "between 1 and 100000"),
        ({"shard": 3}, "shard", "unknown key"),
        ({"tokens": "s3cret"}, "tokens", "must be a list of at most 1000 strings"),
        ({"tokens": [5]}, "tokens", "must be a list of at most 1000 strings"),
        ({"tokens": [""]}, "tokens", "must be a list of at most 1000 strings"),
        ({"tokens": ["x" * 5000]}, "tokens", "of 1 to 4096 characters"),
        ({"tokens": [f"t{i}" for i in range(1001)]}, "tokens", "at most 1000 strings"),
        ({"tokens": ["ingest:a", "read:a"]}, "tokens", "two entries share a secret"),
        ({"tokens": ["write:abc"]}, "tokens", "scope 'write' of an entry is unknown"),
        ({"tokens": ["read:"]}, "tokens", "an empty secret or one with white space"),
        ({"tokens": ["has space"]}, "tokens", "an empty secret or one with white space"),
    ],
)
def test_hostile_values_are_refused_naming_the_key(change: dict[str, Any], key: str, reason: str) -> None:
    with pytest.raises(ScaleOutConfigError) as exc:
        ScaleOutConfig.from_mapping({**VALID, **change})
    assert exc.value.key == key
    assert reason in str(exc.value)


@pytest.mark.parametrize("missing", ["nats_servers", "pg_dsn", "data_path"])
def test_a_missing_required_key_is_named(missing: str) -> None:
    with pytest.raises(ScaleOutConfigError, match=f"{missing}: is required"):
        ScaleOutConfig.from_mapping({k: v for k, v in VALID.items() if k != missing})


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("[scaleout\n", "not valid TOML"),
        ("[other]\na = 1\n", "needs a [scaleout] table"),
        ("scaleout = 3\n", "needs a [scaleout] table"),
    ],
)
def test_a_broken_file_is_refused_with_the_reason(tmp_path: Path, text: str, reason: str) -> None:
    f = tmp_path / "s.toml"
    f.write_text(text)
    with pytest.raises(ScaleOutConfigError, match=re.escape(reason)):
        ScaleOutConfig.from_toml(f)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ScaleOutConfigError, match="cannot be read"):
        ScaleOutConfig.from_toml(tmp_path / "nope.toml")


def test_an_event_id_has_one_shard_in_every_process_and_ids_spread_over_all_shards() -> None:
    # fixed values: Python's own hash() is salted per process, so a shard computed with it would
    # send a retry to another shard (and past the worker holding the first one's keys)
    assert [shard_of(f"evt-{i}", 8) for i in range(8)] == [shard_of(f"evt-{i}", 8) for i in range(8)]
    assert (
        shard_of("8c6f0a", 8)
        == int.from_bytes(__import__("hashlib").blake2b(b"8c6f0a", digest_size=8).digest(), "big") % 8
    )
    counts = [0] * 8
    for i in range(8000):
        counts[shard_of(f"evt-{i}", 8)] += 1
    assert min(counts) > 800 and max(counts) < 1200, counts


def test_an_envelope_crosses_the_stream_unchanged_but_for_its_parsed_output() -> None:
    env = parse_envelope(
        orjson.dumps(make_envelope(run_id="run-1", attributes={"team": "a"}, finish_reason="stop")), Limits()
    )
    back = decode_envelope(encode_envelope(env))
    assert back == env._replace(output=None)
    assert back.ts == env.ts and back.ts.tzinfo is not None
    untimed = parse_envelope(orjson.dumps(make_envelope(ts=None)), Limits(), now=datetime(2026, 1, 2, 3, tzinfo=UTC))
    assert decode_envelope(encode_envelope(untimed)).ts == datetime(2026, 1, 2, 3, tzinfo=UTC)


@pytest.mark.parametrize("data", [b"{}", b"[1, 2]", b"not json", b"[" + b"1," * 20 + b"1]"])
def test_a_message_that_is_not_an_envelope_of_the_stream_is_refused(data: bytes) -> None:
    with pytest.raises((ValueError, TypeError)):
        decode_envelope(data)


def test_tokens_are_read_as_the_embedded_service_reads_them() -> None:
    cfg = ScaleOutConfig.from_mapping({**VALID, "tokens": ["ingest:i-secret", "read+admin:r-secret", "all-secret"]})
    assert cfg.tokens == ("ingest:i-secret", "read+admin:r-secret", "all-secret")
    # the same entries refused by the embedded settings, with the same reason
    from shapewatch.collector.errors import SettingsInvalid
    from shapewatch.collector.settings import check_tokens

    with pytest.raises(SettingsInvalid) as embedded:
        check_tokens(["ingest:a", "read:a"])
    with pytest.raises(ScaleOutConfigError) as scaled:
        ScaleOutConfig.from_mapping({**VALID, "tokens": ["ingest:a", "read:a"]})
    assert str(scaled.value) == "scale-out configuration: tokens: " + str(embedded.value).removeprefix(
        "setting 'tokens': "
    )
