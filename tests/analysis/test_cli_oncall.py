"""What on-call types at 3 a.m.: ``alerts ack``, ``silence create|list|expire``, ``ingest --url``,
relative and date-only times, a freeze miss that says which cohorts exist, ``baseline import DIR``
with ``--activate``; each with hostile arguments (usage errors exit 2 naming the option, never a
traceback). The data and helpers are test_cli.py's: a real DuckDB file ingested from JSONL, and a
real service on loopback for ``--url``."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import test_cli
from test_cli import BASE_DAY, CONTRACT, DRIFT_DAY, MODEL, PROMPT, _evaluate, day_of, freeze_args, ok, run

# test_cli.py's fixtures: the JSONL days, the ingested file, a private copy of it, a live service
jsonl, ingested, db, live_url = test_cli.jsonl, test_cli.ingested, test_cli.db, test_cli.live_url


def _firing(db: Path) -> list[dict[str, object]]:
    ok(*freeze_args(db))
    _evaluate(db, DRIFT_DAY + timedelta(hours=12))
    return json.loads(run("alerts", "--db", str(db), "--format", "json").stdout)


# --- times --------------------------------------------------------------------------------------


def test_a_date_or_a_duration_back_names_the_same_window_as_iso(db: Path) -> None:
    iso_id = ok(*freeze_args(db)).strip()
    args = freeze_args(db)
    args[args.index("--since") + 1] = f"{BASE_DAY:%Y-%m-%d}"
    args[args.index("--until") + 1] = f"{BASE_DAY + timedelta(days=1):%Y-%m-%d}"
    assert ok(*args).strip() == iso_id  # the same window and note: the same baseline
    # a duration back from now, and now: the window of the last 4.5 days holds the base day
    args[args.index("--since") + 1] = "5d"
    args[args.index("--until") + 1] = "now"
    other = ok(*args).strip()
    assert other != iso_id
    doc = json.loads(ok("baseline", "show", other, "--db", str(db)))
    since = datetime.fromisoformat(doc["window"]["since"].replace("Z", "+00:00"))
    # aligned to the hour buckets five days back hold (rollup tiers)
    assert abs(since - (datetime.now(UTC) - timedelta(days=5))) < timedelta(hours=1, minutes=5)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("2026-02-30", "'2026-02-30' is not a date"),
        ("99999d", "longer than the limit of 3650d"),
        ("-2d", "is not an ISO 8601 time"),
        ("1e3d", "is not an ISO 8601 time"),
        ("nan", "is not an ISO 8601 time"),
        ("x" * 5000, "5000 characters is no time"),
        ("2d ago", "is not an ISO 8601 time"),
    ],
)
def test_hostile_times_exit_2_naming_the_option(db: Path, value: str, message: str) -> None:
    args = freeze_args(db)
    args[args.index("--since") + 1] = value
    result = run(*args)
    assert result.exit_code == 2 and "--since" in result.stderr and message in result.stderr, result.stderr
    at = run("analyze", "--once", "--db", str(db), "--at", value)
    assert at.exit_code == 2 and "--at" in at.stderr, at.stderr


def test_analyze_at_a_relative_time(db: Path) -> None:
    ok(*freeze_args(db))
    back = (datetime.now(UTC) - DRIFT_DAY - timedelta(hours=12)).total_seconds() / 3600
    result = run("analyze", "--once", "--db", str(db), "--at", f"{back:.2f}h", "--format", "json")
    assert result.exit_code == 1, result.stderr  # the drift day is in the window: alerts fire
    assert {a["field"] for a in json.loads(result.stdout)["alerts"]} >= {"customer.tier"}


# --- alerts ack ----------------------------------------------------------------------------------


def test_alerts_ack_signs_an_alert_and_keeps_listing_working(db: Path) -> None:
    alerts = _firing(db)
    fp = next(a["fingerprint"] for a in alerts if a["kind"] == "presence_drop")
    out = ok("alerts", "ack", str(fp), "--db", str(db), "--author", "ana")
    assert out == f"acknowledged presence_drop on customer.tier ({fp}) as ana\n"
    listed = {a["fingerprint"]: a for a in json.loads(run("alerts", "--db", str(db), "--format", "json").stdout)}
    assert listed[fp]["acknowledged_by"] == "ana" and listed[fp]["state"] == "firing"
    assert sum(1 for a in listed.values() if a.get("acknowledged_by")) == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["../../etc"], "is not an alert fingerprint"),
        (["a" * 129], "is not an alert fingerprint"),
        (["deadbeef"], "no alert with fingerprint 'deadbeef'"),
        (["deadbeef", "--author", " "], "give a name of 1 to 256 characters"),
        (["deadbeef", "--author", "x" * 300], "give a name of 1 to 256 characters"),
    ],
)
def test_hostile_acks_exit_2(db: Path, args: list[str], message: str) -> None:
    result = run("alerts", "ack", *args, "--db", str(db))
    assert result.exit_code == 2 and message in result.stderr, result.stderr


# --- silence ---------------------------------------------------------------------------------------


def test_silence_create_list_expire(db: Path) -> None:
    alerts = _firing(db)
    fp = str(next(a["fingerprint"] for a in alerts if a["kind"] == "presence_drop"))
    made = json.loads(
        ok(
            "silence",
            "create",
            "--fingerprint",
            fp,
            "--duration",
            "2h",
            "--reason",
            "deploying",
            "--db",
            str(db),
            "--format",
            "json",
        )
    )
    ends = datetime.fromisoformat(made["ends_at"].replace("Z", "+00:00"))
    assert abs(ends - datetime.now(UTC) - timedelta(hours=2)) < timedelta(minutes=1)
    assert made["match"] == {"fingerprint": fp} and made["author"] == "ana" and made["reason"] == "deploying"
    listed = json.loads(ok("silence", "list", "--db", str(db), "--format", "json"))
    assert [s["silence_id"] for s in listed] == [made["silence_id"]]
    assert json.loads(run("alerts", "--db", str(db), "--format", "json").stdout)[0]["silenced_until"] is not None
    text = ok("silence", "expire", str(made["silence_id"]), "--db", str(db))
    assert text.startswith(f"silence {made['silence_id']} ended at ")
    assert ok("silence", "list", "--db", str(db)) == "no silence active\n"
    everything = json.loads(ok("silence", "list", "--all", "--db", str(db), "--format", "json"))
    assert [s["silence_id"] for s in everything] == [made["silence_id"]]
    assert everything[0]["ends_at"] < made["ends_at"]
    # expiring again changes nothing: it ended already
    again = json.loads(ok("silence", "expire", str(made["silence_id"]), "--db", str(db), "--format", "json"))
    assert again["ends_at"] == everything[0]["ends_at"]
    by_cohort = ok(
        "silence",
        "create",
        "--model",
        MODEL,
        "--kind",
        "presence_drop",
        "--duration",
        "30m",
        "--reason",
        "r",
        "--db",
        str(db),
    )
    assert by_cohort.startswith("silence ")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["create", "--duration", "91d", "--reason", "r", "--model", "m"], "longer than the limit of 90d"),
        (["create", "--duration", "-1h", "--reason", "r", "--model", "m"], "--duration"),
        (["create", "--duration", "inf", "--reason", "r", "--model", "m"], "--duration"),
        (["create", "--duration", "1h", "--reason", "r"], "say what to silence"),
        (["create", "--duration", "1h", "--reason", " ", "--model", "m"], "say why"),
        (["create", "--duration", "1h", "--reason", "r", "--kind", "bogus"], "'bogus' is not an alert kind"),
        (["create", "--duration", "1h", "--reason", "r", "--model", "x" * 1001], "give 1 to 1,000 characters"),
        (["create", "--duration", "1h", "--reason", "r", "--fingerprint", "a b"], "is not an alert fingerprint"),
        (["expire", "0"], "0 is not in the range"),
        (["expire", str(2**64)], "is not in the range"),
        (["expire", "abc"], "'abc' is not a valid integer"),
        (["expire", "999"], "no silence with id 999"),
    ],
)
def test_hostile_silences_exit_2(db: Path, args: list[str], message: str) -> None:
    result = run("silence", *args, "--db", str(db))
    assert result.exit_code == 2 and message in result.stderr, result.stderr


def test_silence_over_url_ends_through_the_service(live_url: str) -> None:
    made = json.loads(
        ok(
            "silence",
            "create",
            "--model",
            "m",
            "--duration",
            "1h",
            "--reason",
            "r",
            "--url",
            live_url,
            "--format",
            "json",
        )
    )
    done = json.loads(ok("silence", "expire", str(made["silence_id"]), "--url", live_url, "--format", "json"))
    assert done["silence_id"] == made["silence_id"] and done["ends_at"] < made["ends_at"]
    assert json.loads(ok("silence", "list", "--url", live_url, "--format", "json")) == []
    for bad, status in (("999", 404), ("abc", 422), (str(2**70), 404)):
        r = httpx.post(f"{live_url}/v1/silences/{bad}/expire", timeout=30)
        assert r.status_code == status, r.text
        assert r.json()["error"]["status"] == status
    missing = run("silence", "expire", "999", "--url", live_url)
    assert missing.exit_code == 2 and "no silence with id 999" in missing.stderr


# --- freeze miss -------------------------------------------------------------------------------------


def test_a_freeze_without_the_contract_names_the_cohorts_of_the_model(db: Path) -> None:
    args = freeze_args(db)
    i = args.index("--contract")
    del args[i : i + 2]  # the contract left out: "default", which has no events
    result = run(*args)
    assert result.exit_code == 2
    assert f"no events were ever stored for cohort {MODEL} / {PROMPT} / default" in result.stderr
    assert "give --contract (it is 'default' when left out)" in result.stderr
    assert f"--prompt-version {PROMPT} --contract {CONTRACT}" in result.stderr
    other = run(*[a if a != MODEL else "no-such-model" for a in args])
    assert other.exit_code == 2 and "no cohort has model 'no-such-model'" in other.stderr


# --- baseline import DIR --activate ------------------------------------------------------------------


def test_import_takes_the_folder_export_wrote_and_activates(db: Path, tmp_path: Path) -> None:
    bid = ok(*freeze_args(db)).strip()
    out = tmp_path / "exported"
    ok("baseline", "export", "--out", str(out), "--db", str(db))
    (out / "README.txt").write_text("not a baseline")  # other files in the folder are left alone
    fresh = tmp_path / "fresh.duckdb"
    printed = ok("baseline", "import", str(out), "--db", str(fresh), "--activate")
    assert printed.endswith(f"imported ({bid}), active\n") and printed.count("\n") == 1
    listed = json.loads(ok("baseline", "list", "--db", str(fresh), "--format", "json"))
    assert [(b["baseline_id"], b["active"]) for b in listed] == [(bid, True)]
    again = ok("baseline", "import", str(out), "--db", str(fresh))
    assert again.endswith(f"already present ({bid})\n")


def test_import_of_a_hostile_folder(db: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run("baseline", "import", str(empty), "--db", str(tmp_path / "x.duckdb"))
    assert result.exit_code == 2 and "is a folder without any .json file" in result.stderr
    # a link to another folder is not followed; a link to a file is refused unread
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "secret.json").write_text("{}")
    tree = tmp_path / "tree"
    tree.mkdir()
    os.symlink(elsewhere, tree / "linked")
    (tree / "broken.json").write_text("{not json")
    result = run("baseline", "import", str(tree), "--db", str(tmp_path / "x.duckdb"))
    assert result.exit_code == 2
    assert "broken.json" in result.stderr and "secret.json" not in result.stderr + result.stdout


# --- ingest --url -----------------------------------------------------------------------------------------


def test_ingest_over_url_gives_the_local_summary_ids_and_exit_codes(tmp_path: Path, live_url: str) -> None:
    good = day_of(BASE_DAY, 30)
    no_id = [json.dumps({k: v for k, v in json.loads(line).items() if k != "event_id"}) for line in day_of(BASE_DAY, 5)]
    bad = [
        '{"model": "m"}',
        "not json",
        '{"event_id": "d", "model": "m", "model": "n", "prompt_version": "p", "output": {}}',
    ]
    src = tmp_path / "mixed.jsonl"
    src.write_text("\ufeff" + "\n".join([*good, "", *no_id, *bad]) + "\n")
    local = run("ingest", str(src), "--db", str(tmp_path / "local.duckdb"), "--format", "json")
    remote = run("ingest", str(src), "--url", live_url, "--format", "json")
    assert local.exit_code == remote.exit_code == 1, remote.stderr
    lsum, rsum = json.loads(local.stdout), json.loads(remote.stdout)
    for key in ("accepted", "duplicate", "rejected", "rejected_by_reason"):
        assert lsum[key] == rsum[key], key
    assert (rsum["accepted"], rsum["rejected"]) == (35, 3)
    # 30 lines, a blank one, 5 without an id: the three bad ones are lines 37 to 39, as in the quarantine
    assert sorted(r["line"] for r in rsum["rejected_lines"]) == [37, 38, 39]
    quarantined = [json.loads(x)["line"] for q in lsum["quarantine"] for x in Path(q).read_text().splitlines()]
    assert sorted(quarantined) == [37, 38, 39]
    # the ids are the local import's: sending again stores nothing twice
    again = json.loads(run("ingest", str(src), "--url", live_url, "--format", "json").stdout)
    assert (again["accepted"], again["duplicate"], again["rejected"]) == (0, 35, 3)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--url", "ftp://host/"], "is not an http(s) URL"),
        (["--url", "http://127.0.0.1:1"], "cannot reach the service"),
        (["--url", "http://127.0.0.1:1", "--db", "x.duckdb"], "give --db or --url, not both"),
    ],
)
def test_hostile_ingest_urls_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    src = tmp_path / "one.jsonl"
    src.write_text("\n".join(day_of(BASE_DAY, 2)) + "\n")
    result = run("ingest", str(src), *args)
    assert result.exit_code == 2 and message in result.stderr, result.stderr


def test_ingest_over_url_of_a_cut_gz_sends_what_it_read_and_exits_2(tmp_path: Path, live_url: str) -> None:
    # an unreadable .gz: the lines before the fault are sent, the file is listed, exit 2
    import gzip

    src = tmp_path / "cut.jsonl.gz"

    whole = gzip.compress(("\n".join(day_of(BASE_DAY, 50)) + "\n").encode())
    src.write_bytes(whole[: len(whole) // 2])
    result = run("ingest", str(src), "--url", live_url, "--format", "json")
    assert result.exit_code == 2
    summary = json.loads(result.stdout)
    assert summary["unreadable"] and summary["unreadable"][0]["file"] == str(src)
    assert 0 <= summary["accepted"] < 50
