"""A retry is a retry whatever its key order: the payload identity is computed over canonical
JSON (the keys of every object in order), through the real service, the real bulk import, and a
database written by an earlier release, whose stored identities migrate (schema version 8)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import httpx
import orjson
import pytest
from harness import ROOT, SHAPEWATCH, make_envelope, start_service

from shapewatch.collector.envelope import LIMITS, parse_envelope
from shapewatch.collector.store import MIGRATIONS, SCHEMA_VERSION, Store, WriteStatus
from shapewatch.collector.store import schema as schema_module

JSON = {"content-type": "application/json"}
CONFLICT = [
    {
        "path": "event_id",
        "reason": "already stored with a different payload; an event_id names one event and must not be reused",
    }
]
OUTPUT = {
    "intent": "refund",
    "priority": "high",
    "customer": {"tier": "gold", "id": "c-1", "flags": {"vip": True, "angry": False}},
    "entities": [{"type": "order", "value": "A-1"}, {"value": "B-2", "type": "sku"}],
}


def reordered(v: Any) -> Any:
    """The same JSON value with the keys of every object in reverse order."""
    if isinstance(v, dict):
        return {k: reordered(v[k]) for k in reversed(list(v))}
    if isinstance(v, list):
        return [reordered(x) for x in v]
    return v


def post(c: httpx.Client, body: Any) -> httpx.Response:
    return c.post("/v1/outputs", content=json.dumps(body).encode(), headers=JSON)


def answer(r: httpx.Response) -> tuple[str, str]:
    """(event_id, status) of the one envelope a body held."""
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["accepted"], body["duplicate"], body["rejected"], len(body["results"])) == (
        body["results"][0]["status"] == "accepted",
        body["results"][0]["status"] == "duplicate",
        0,
        1,
    )
    return body["results"][0]["event_id"], body["results"][0]["status"]


def stored(db: Path, sql: str) -> list[tuple[Any, ...]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


# --- the service ----------------------------------------------------------------------------------


def test_a_retry_in_another_key_order_is_a_duplicate_over_http(tmp_path: Path) -> None:
    svc = start_service(tmp_path / "svc.duckdb")
    try:
        with svc.client() as c:
            first = make_envelope(event_id="e-1", output=OUTPUT)
            assert answer(post(c, first)) == ("e-1", "accepted")
            # the whole envelope re-serialized: its own fields and every object of the output
            again = reordered(first)
            assert list(again) != list(first) and list(again["output"]["customer"]["flags"]) == ["angry", "vip"]
            assert answer(post(c, again)) == ("e-1", "duplicate")
            assert answer(post(c, {**first, "output": reordered(OUTPUT)})) == ("e-1", "duplicate")
            # in a batch too (the C scanner reads every item of an array body)
            r = post(c, [{**first, "output": reordered(OUTPUT)}, make_envelope(event_id="e-2", output=OUTPUT)])
            assert [(x["event_id"], x["status"]) for x in r.json()["results"]] == [
                ("e-1", "duplicate"),
                ("e-2", "accepted"),
            ]
            # another value under the same id is still refused, in any order
            changed = {**OUTPUT, "customer": {**OUTPUT["customer"], "tier": "silver"}}
            r = post(c, {**first, "output": reordered(changed)})
            assert r.status_code == 422, r.text
            assert r.json()["error"]["fields"] == CONFLICT
            assert c.get("/healthz").json()["events"] == 2
    finally:
        svc.stop()
    # stored once, as first sent (the key order of what is stored is the client's)
    assert stored(svc.db_path, "SELECT event_id, output FROM events ORDER BY event_id") == [
        ("e-1", orjson.dumps(OUTPUT).decode()),
        ("e-2", orjson.dumps(OUTPUT).decode()),
    ]


# --- bulk import -----------------------------------------------------------------------------------


def ingest(src: Path, db: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [*SHAPEWATCH, "ingest", str(src), "--db", str(db), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode in (0, 1), proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def test_bulk_import_counts_a_line_in_another_key_order_once(tmp_path: Path) -> None:
    first = make_envelope(event_id="b-1", output=OUTPUT)
    changed = make_envelope(event_id="b-1", output=reordered({**OUTPUT, "priority": "low"}))
    src = tmp_path / "in.jsonl"
    src.write_text(
        "\n".join(json.dumps(e) for e in [first, reordered(first), {**first, "output": reordered(OUTPUT)}, changed])
        + "\n"
    )
    db = tmp_path / "bulk.duckdb"
    summary = ingest(src, db)
    assert (summary["accepted"], summary["duplicate"], summary["rejected"]) == (1, 2, 1)
    assert summary["rejected_by_reason"] == {"conflict": 1}
    # and a later import of the file in another key order only finds duplicates
    again = tmp_path / "again.jsonl"
    again.write_text(json.dumps(reordered(first)) + "\n")
    summary = ingest(again, db)
    assert (summary["accepted"], summary["duplicate"], summary["rejected"]) == (0, 1, 0)
    assert stored(db, "SELECT event_id, output FROM events") == [("b-1", orjson.dumps(OUTPUT).decode())]


# --- a database written by an earlier release ---------------------------------------------------------

# An envelope, and the payload hash releases before schema version 8 stored for it (pinned by
# their test of the C fast path: tests/collector/test_envelope_fast_path.py at b7c23f5).
PINNED = {
    "event_id": "e-1",
    "ts": "2026-11-28T10:00:00.5+02:00",
    "model": "m",
    "prompt_version": "p",
    "contract": "c",
    "output": {"a": [1, "x", None], "b": 0.25},
}
PINNED_HASH = "8cc4c804ea715f3bf2087b8a48076c17"


def old_payload_hash(env: dict[str, Any]) -> str:
    """The payload hash as releases before schema version 8 computed it: the output's text in the
    key order sent, then the tags with ``ts`` as written."""
    attributes = env.get("attributes")
    tags = [
        env["model"],
        env["prompt_version"],
        env.get("contract") or "default",
        env.get("ts"),
        env.get("source"),
        None if attributes is None else orjson.dumps(attributes, option=orjson.OPT_SORT_KEYS).decode(),
        env.get("served_model"),
        env.get("contract_version"),
        env.get("run_id"),
        env.get("agent_release"),
        env.get("finish_reason"),
    ]
    return hashlib.blake2b(orjson.dumps(env["output"]) + orjson.dumps(tags), digest_size=16).hexdigest()


RECEIVED = datetime(2026, 11, 29, 12, 5, tzinfo=UTC)
OLD = [  # what an earlier release stored, and a time the service defaulted for the one without ts
    (PINNED, None),
    (make_envelope(event_id="old-offset", ts="2026-11-29T14:00:00+02:00", output=OUTPUT), None),
    (
        make_envelope(event_id="old-no-ts", ts=None, output=OUTPUT),
        datetime(2026, 11, 29, 12, 4, 59, 250_000, tzinfo=UTC),
    ),
    (
        make_envelope(
            event_id="old-attributes",
            output=OUTPUT,
            attributes={"team": "a", "region": "eu"},
            run_id="r-1",
            agent_release="1.2",
            finish_reason="stop",
        ),
        None,
    ),
]


def old_file(path: Path, envelopes: list[tuple[dict[str, Any], datetime | None]]) -> None:
    """A database at schema version 7 holding ``envelopes`` as that release stored them, built
    without the Store: output text in the key order sent, payload hash over it and ts as written."""
    con = duckdb.connect(str(path))
    for step in MIGRATIONS[:7]:
        assert isinstance(step, str)
        con.execute(step.replace("{bucket}", "60"))
    con.execute("INSERT INTO meta VALUES ('schema_version', '7'), ('bucket_seconds', '60')")
    cohorts: dict[tuple[str, str, str], int] = {}
    for env, defaulted in envelopes:
        cohort = (env["model"], env["prompt_version"], env.get("contract") or "default")
        if cohort not in cohorts:
            cohorts[cohort] = len(cohorts) + 1
            con.execute("INSERT INTO cohorts VALUES (nextval('cohort_seq'), ?, ?, ?, ?)", [*cohort, RECEIVED])
        ts = defaulted or datetime.fromisoformat(env["ts"]).astimezone(UTC)
        attributes = env.get("attributes")
        row = {
            "id": env["event_id"],
            "hash": old_payload_hash(env),
            "cohort": cohorts[cohort],
            "ts": ts,
            "received": RECEIVED,
            "served": env.get("served_model"),
            "version": env.get("contract_version"),
            "source": env.get("source"),
            "run": env.get("run_id"),
            "release": env.get("agent_release"),
            "finish": env.get("finish_reason"),
            "attributes": None
            if attributes is None
            else orjson.dumps(attributes, option=orjson.OPT_SORT_KEYS).decode(),
            "output": orjson.dumps(env["output"]).decode(),
        }
        con.execute(
            """INSERT INTO events VALUES (md5_number($id), $id, $hash, false, $cohort, $ts, $received, $served,
                       $version, $source, $run, $release, $finish, $attributes, $output)""",
            row,
        )
        con.execute(
            "INSERT INTO event_keys VALUES (md5_number($id), $hash, $received)",
            {"id": row["id"], "hash": row["hash"], "received": RECEIVED},
        )
    con.close()


def test_the_old_definition_is_the_one_an_earlier_release_stored() -> None:
    assert old_payload_hash(PINNED) == PINNED_HASH


def new_hash(env: dict[str, Any]) -> str:
    return parse_envelope(orjson.dumps(env), LIMITS).payload_hash


def test_stored_identities_migrate_to_the_hash_of_the_canonical_payload(db_path: Path) -> None:
    old_file(db_path, OLD)
    with Store.open(db_path) as store:
        assert store.query("SELECT value FROM meta WHERE key = 'schema_version'") == [(str(SCHEMA_VERSION),)]
        assert SCHEMA_VERSION >= 8  # migrated through version 8 (and any later step)
        want = sorted((env["event_id"], new_hash(env)) for env, _ in OLD)
        assert sorted(store.query("SELECT event_id, payload_hash FROM events")) == want
        assert (
            sorted(store.query("SELECT e.event_id, k.payload_hash FROM event_keys k JOIN events e USING (id_key)"))
            == want
        )
        # outputs stay as they were sent
        assert sorted(store.query("SELECT event_id, output FROM events")) == sorted(
            (env["event_id"], orjson.dumps(env["output"]).decode()) for env, _ in OLD
        )
        # retries, as sent then and in another key order, are duplicates; another value conflicts
        retries = [parse_envelope(orjson.dumps(e), LIMITS) for env, _ in OLD for e in (env, reordered(env))]
        assert [r.status for r in store.write_batch(retries)] == [WriteStatus.duplicate] * len(retries)
        changed = parse_envelope(orjson.dumps({**PINNED, "output": {"b": 0.5, "a": [1, "x", None]}}), LIMITS)
        assert [r.status for r in store.write_batch([changed])] == [WriteStatus.conflict]
        assert store.healthcheck()["events"] == len(OLD)


@pytest.mark.slow
def test_a_migrated_file_dedups_through_the_service_and_the_bulk_import(tmp_path: Path) -> None:
    db = tmp_path / "old.duckdb"
    old_file(db, OLD)
    svc = start_service(db)  # the service migrates the file as it opens it
    try:
        with svc.client() as c:
            for env, _ in OLD:
                assert answer(post(c, env)) == (env["event_id"], "duplicate")
                assert answer(post(c, reordered(env))) == (env["event_id"], "duplicate")
            # the same instant written another way is the same payload now: ts is the instant it names
            same_instant = {**OLD[1][0], "ts": "2026-11-29T12:00:00Z"}
            assert answer(post(c, same_instant)) == ("old-offset", "duplicate")
            r = post(c, {**OLD[1][0], "ts": "2026-11-29T12:00:01Z"})
            assert (r.status_code, r.json()["error"]["fields"]) == (422, CONFLICT)
            assert c.get("/healthz").json()["events"] == len(OLD)
    finally:
        svc.stop()
    src = tmp_path / "retries.jsonl"
    src.write_text("".join(json.dumps(reordered(env)) + "\n" for env, _ in OLD))
    summary = ingest(src, db)
    assert (summary["accepted"], summary["duplicate"], summary["rejected"]) == (0, len(OLD), 0)


def test_the_migration_is_one_transaction_read_in_chunks(db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure part way leaves the file as the earlier release left it; the next open migrates it."""
    old_file(db_path, OLD)
    before = stored(db_path, "SELECT event_id, payload_hash FROM events ORDER BY 1")
    monkeypatch.setattr(schema_module, "_REHASH_ROWS", 1)  # one event a chunk: every chunk's update is used
    calls: list[str] = []
    real = schema_module._payload_hash

    def failing(*args: Any) -> str:
        calls.append(args[1])
        if len(calls) == len(OLD):  # after the earlier chunks were updated
            raise RuntimeError("killed")
        return real(*args)

    monkeypatch.setattr(schema_module, "_payload_hash", failing)
    with pytest.raises(RuntimeError, match="killed"):
        Store.open(db_path)
    assert stored(db_path, "SELECT value FROM meta WHERE key = 'schema_version'") == [("7",)]
    assert stored(db_path, "SELECT event_id, payload_hash FROM events ORDER BY 1") == before
    monkeypatch.setattr(schema_module, "_payload_hash", real)
    with Store.open(db_path) as store:
        assert store.query("SELECT event_id, payload_hash FROM events ORDER BY 1") == sorted(
            (env["event_id"], new_hash(env)) for env, _ in OLD
        )


def test_a_key_whose_event_was_purged_keeps_its_hash_and_a_reused_id_keeps_the_newest(db_path: Path) -> None:
    """Keys outlive raw events when dedup_ttl_days exceeds raw_retention_days; and an id whose key
    expired can have an older event beside the newer one its key belongs to."""
    env = make_envelope(event_id="twice", output=OUTPUT)
    old_file(db_path, [(env, None)])
    con = duckdb.connect(str(db_path))
    # an older event under the same id, its key long expired; and a key without its event
    con.execute("""INSERT INTO events SELECT * REPLACE ('stale' AS payload_hash, received_at - INTERVAL 30 DAY AS
                   received_at, '{"intent":"old"}' AS output) FROM events""")
    con.execute("INSERT INTO event_keys VALUES (md5_number('purged'), 'kept-hash', ?)", [RECEIVED])
    con.close()
    with Store.open(db_path) as store:
        assert sorted(store.query("SELECT payload_hash FROM event_keys")) == sorted([("kept-hash",), (new_hash(env),)])
        old_output = parse_envelope(orjson.dumps({**env, "output": {"intent": "old"}}), LIMITS).payload_hash
        assert store.query("SELECT output, payload_hash FROM events ORDER BY received_at") == [
            ('{"intent":"old"}', old_output),
            (orjson.dumps(OUTPUT).decode(), new_hash(env)),
        ]
