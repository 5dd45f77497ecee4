"""One cohort that cannot be judged fails alone: a baseline that reached the table without
validation, or a rule raising, is recorded as that cohort's failure (the run's error names it, a
counter counts it, its alerts keep their state) and every other cohort is still judged. A crafted
document is refused at the HTTP import with 422 naming the field, in the shared error shape."""

from __future__ import annotations

import dataclasses
import hashlib
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from synth import write_outputs

from shapewatch.analysis.alerts import ALERTS_SCHEMA, AlertBook, AlertState
from shapewatch.analysis.analyzer import Analyzer
from shapewatch.analysis.config import AlertKind, AnalyzerConfig, FieldRules
from shapewatch.analysis.service import create_app
from shapewatch.baselines import BASELINES_SCHEMA, Baseline, Cohort, freeze_baseline
from shapewatch.collector import Settings, Store

A = Cohort("claude-sonnet-4-5-20250929", "intake-v3", "intake")
B = Cohort("gpt-4o-2024-08-06", "intake-v3", "intake")
DAY1 = datetime(2026, 11, 2, tzinfo=UTC)
HOUR = timedelta(hours=1)
EMAIL = "customer.email"


def outputs(n: int, with_email: int) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        o: dict[str, Any] = {"priority": ("low", "medium", "high")[i % 3], "customer": {"tier": "gold"}}
        if i < with_email:
            o["customer"]["email"] = f"user{i}@example.com"
        out.append(o)
    return out


def hour(k: int) -> datetime:
    return DAY1 + k * HOUR


def crafted(doc: dict[str, Any], edit: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with field ``priority`` edited and its hash recomputed, as anyone can."""
    doc = orjson.loads(orjson.dumps(doc))
    doc["fields"]["priority"].update(edit)
    content = {k: v for k, v in doc.items() if k not in ("baseline_id", "hash", "created_at")}
    digest = hashlib.sha256(orjson.dumps(content, option=orjson.OPT_SORT_KEYS)).hexdigest()
    return {**doc, "hash": digest, "baseline_id": digest[:16]}


def plant(store: Store, cohort: Cohort, doc: dict[str, Any]) -> None:
    """Store ``doc`` and make it the cohort's active baseline, bypassing every check (a backup restored
    by hand, a row written by an older release)."""
    with store.transaction("planting a baseline") as con:
        con.execute(
            "INSERT INTO baselines VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                doc["baseline_id"],
                doc["hash"],
                *cohort[:3],
                hour(-24),
                hour(0),
                1,
                "mallory",
                "x",
                hour(0),
                orjson.dumps(doc).decode(),
                cohort.source,
            ],
        )
        con.execute(
            """INSERT INTO baseline_activations (model, prompt_version, contract, action, baseline_id,
                                                          activated_at, author, note)
                       VALUES (?, ?, ?, 'activate', ?, ?, 'mallory', '')""",
            [*cohort[:3], doc["baseline_id"], hour(0)],
        )


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store.open(tmp_path / "isolation.duckdb", schemas=[BASELINES_SCHEMA, ALERTS_SCHEMA])
    for c in (A, B):
        write_outputs(s, outputs(1000, 700), hour(-12), HOUR, model=c.model)  # presence 70%
        freeze_baseline(s, c, hour(-24), hour(0), author="ana", note="reference", now=hour(0))
        for k in range(4):  # then 40%: a presence drop that pages
            write_outputs(s, outputs(500, 200), hour(k), HOUR, model=c.model, id_prefix=f"{c.model}/h{k}")
    yield s
    s.close()


def email_alert(store: Store, cohort: Cohort) -> tuple[str, datetime]:
    (a,) = [a for a in AlertBook(store).alerts() if a.cohort == cohort]
    assert (a.field, a.kind) == (EMAIL, AlertKind.presence_drop)
    return a.state.value, a.last_seen


def test_a_planted_baseline_fails_its_own_cohort_and_every_other_is_judged(store: Store) -> None:
    registry = CollectorRegistry()
    az = Analyzer(store, AnalyzerConfig(window=HOUR), registry=registry, clock=lambda: hour(4))
    for k in (1, 2):
        assert az.run(hour(k)).ok
    assert (email_alert(store, A), email_alert(store, B)) == (("firing", hour(2)), ("firing", hour(2)))

    good = store.query("SELECT document FROM baselines WHERE model = ?", [A.model])[0][0]
    bad = crafted(orjson.loads(good), {"present": "lots"})
    plant(store, A, bad)
    result = az.run(hour(3))

    cause = (
        f"BaselineInvalid: stored baseline {bad['baseline_id']}: not a valid baseline document: "
        "/fields/priority/present: must be an integer, got string"
    )
    error = f"1 of 2 cohorts not judged: cohort {A}: {cause}"
    assert (result.ok, result.error) == (True, error)
    assert result.evaluation is not None
    assert {r.cohort: (r.error, r.baseline_id is None) for r in result.evaluation.cohorts} == {
        A: (cause, True),
        B: (None, False),
    }
    # B was judged at hour 3; A's alert keeps the state it had (not resolved for want of a check).
    assert (email_alert(store, A), email_alert(store, B)) == (("firing", hour(2)), ("firing", hour(3)))
    assert store.query("SELECT evaluated_at, ok, error, cohorts FROM analyzer_runs ORDER BY run_id") == [
        (hour(1), True, None, 2),
        (hour(2), True, None, 2),
        (hour(3), True, error, 2),
    ]
    assert registry.get_sample_value("shapewatch_analyzer_cohort_failures_total") == 1
    assert registry.get_sample_value("shapewatch_analyzer_runs_total", {"result": "ok"}) == 3
    assert registry.get_sample_value("shapewatch_analyzer_runs_total", {"result": "failed"}) == 0
    # The run's report says which cohort was not judged and why.
    (report,) = store.query("SELECT report FROM analyzer_runs WHERE evaluated_at = ?", [hour(3)])[0]
    b_id = next(r.baseline_id for r in result.evaluation.cohorts if r.cohort == B)
    assert {(c["cohort"]["model"], c["error"], c["compared_with"]) for c in orjson.loads(report)["cohorts"]} == {
        (A.model, cause, f"not judged: {cause}"),
        (B.model, None, f"baseline {b_id}"),
    }


@dataclasses.dataclass(frozen=True)
class RaisingFor(AnalyzerConfig):
    """A configuration whose rules raise for one model's cohorts (a rule with a bug)."""

    broken_model: str = ""

    def rules_for(self, contract: str, path: str) -> FieldRules:
        if contract == "intake" and path == EMAIL and self.broken_model:
            raise RuntimeError(f"rule for {path} exploded")
        return super().rules_for(contract, path)


def test_a_rule_raising_fails_the_cohorts_it_raises_for_only(store: Store) -> None:
    registry = CollectorRegistry()
    # Raises for every cohort: no cohort judged is a failed run, and both are named.
    everyone = RaisingFor(window=HOUR, broken_model="any")
    az = Analyzer(store, everyone, registry=registry, clock=lambda: hour(4))
    result = az.run(hour(1))
    cause = f"RuntimeError: rule for {EMAIL} exploded"
    assert (result.ok, result.error) == (False, f"2 of 2 cohorts not judged: cohort {A}: {cause}; cohort {B}: {cause}")
    assert AlertBook(store).alerts() == []
    assert registry.get_sample_value("shapewatch_analyzer_cohort_failures_total") == 2
    assert registry.get_sample_value("shapewatch_analyzer_runs_total", {"result": "failed"}) == 1


def test_a_rule_raising_for_one_contract_leaves_the_other_judged(tmp_path: Path) -> None:
    s = Store.open(tmp_path / "contracts.duckdb", schemas=[BASELINES_SCHEMA, ALERTS_SCHEMA])
    good, broken = Cohort(A.model, "intake-v3", "intake"), Cohort(A.model, "intake-v3", "triage")
    try:
        for c in (good, broken):
            write_outputs(s, outputs(1000, 700), hour(-12), HOUR, contract=c.contract)
            freeze_baseline(s, c, hour(-24), hour(0), author="ana", note="reference", now=hour(0))
            write_outputs(s, outputs(500, 200), hour(0), HOUR, contract=c.contract, id_prefix=f"{c.contract}/h0")

        @dataclasses.dataclass(frozen=True)
        class TriageRaises(AnalyzerConfig):
            def rules_for(self, contract: str, path: str) -> FieldRules:
                if contract == "triage":
                    raise KeyError("triage rules")
                return super().rules_for(contract, path)

        registry = CollectorRegistry()
        result = Analyzer(s, TriageRaises(window=HOUR), registry=registry, clock=lambda: hour(1)).run(hour(1))
        assert (result.ok, result.error) == (
            True,
            f"1 of 2 cohorts not judged: cohort {broken}: KeyError: 'triage rules'",
        )
        assert {(a.cohort, a.field, a.kind, a.state) for a in AlertBook(s).alerts()} == {
            (good, EMAIL, AlertKind.presence_drop, AlertState.pending)
        }
        assert registry.get_sample_value("shapewatch_analyzer_cohort_failures_total") == 1
    finally:
        s.close()


# --- through HTTP ------------------------------------------------------------------------------


def test_a_crafted_document_is_refused_at_the_http_import_with_422_naming_the_field(tmp_path: Path) -> None:
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    base = now - timedelta(days=2)
    settings = dataclasses.replace(Settings(), db_path=tmp_path / "api.duckdb")
    app = create_app(settings, registry=CollectorRegistry(), analyze=False)
    with TestClient(app) as c:
        events = [
            {
                "event_id": uuid.uuid4().hex,
                "ts": (base + i * timedelta(seconds=30)).isoformat(),
                "model": A.model,
                "prompt_version": A.prompt_version,
                "contract": A.contract,
                "output": {"priority": ("low", "high")[i % 2]},
            }
            for i in range(300)
        ]
        assert c.post("/v1/outputs", json=events).json()["accepted"] == 300
        r = c.post(
            "/v1/baselines",
            json={
                **A._asdict(),
                "since": base.isoformat(),
                "until": (base + 4 * HOUR).isoformat(),
                "note": "week 48",
                "author": "ana",
            },
        )
        assert r.status_code == 201, r.text
        doc = c.get(f"/v1/baselines/{r.json()['baseline_id']}").json()

        r = c.post("/v1/baselines/import", json=crafted(doc, {"present": "lots"}))
        assert (r.status_code, r.json()) == (
            422,
            {
                "error": {
                    "status": 422,
                    "message": "request body: not a valid baseline document: /fields/priority/present: "
                    "must be an integer, got string",
                    "fields": [{"path": "/fields/priority/present", "reason": "must be an integer, got string"}],
                }
            },
        )

        reversed_window = {
            **crafted(doc, {}),
            "window": {"since": doc["window"]["until"], "until": doc["window"]["since"]},
            "samples": -1,
        }
        r = c.post("/v1/baselines/import", json=reversed_window)
        reason = f"must be after /window/since ({doc['window']['until']}), got {doc['window']['since']}"
        assert (r.status_code, r.json()) == (
            422,
            {
                "error": {
                    "status": 422,
                    "message": f"request body: not a valid baseline document: /window/until: {reason}; "
                    "/samples: must be between 0 and 9223372036854775807, got -1",
                    "fields": [
                        {"path": "/window/until", "reason": reason},
                        {"path": "/samples", "reason": "must be between 0 and 9223372036854775807, got -1"},
                    ],
                }
            },
        )
        assert [b["baseline_id"] for b in c.get("/v1/baselines").json()] == [doc["baseline_id"]]
        # The analyzer still judges the cohort: nothing crafted was stored.
        run = c.post("/v1/analyzer/run")
        assert run.status_code == 200 and run.json()["ok"], run.text


def test_a_frozen_baseline_is_valid_under_the_document_schema(store: Store) -> None:
    # The schema check never refuses what freezing writes (a check that refused real exports
    # would be worse than none).
    from shapewatch.baselines import document_problems, list_baselines

    listed: list[Baseline] = [item.baseline for item in list_baselines(store)]
    assert len(listed) == 2
    assert [document_problems(b.document()) for b in listed] == [[], []]
