"""No e-mail address anywhere: the sample workspace's ``customer.email`` (free text, one address per
output) never reaches a dashboard page, the review, a baseline document or its export, nor an
alert's sample outputs. A real service on loopback holds the sample; the pages run in AppTest and
every element they produce is searched, charts' data and tables included."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from dashboard_live import live_service
from harness import ROOT
from streamlit.testing.v1 import AppTest

from shapewatch.analysis.sample import seed_sample

APP = ROOT / "dashboard" / "app.py"
ADDRESS = b"@example.com"
INTAKE = {
    "model": "claude-sonnet-4-5-20250929",
    "prompt_version": "intake-v3",
    "contract": "sample-intake",
    "source": "production",
}


@pytest.fixture(scope="module")
def sample_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with live_service(tmp_path_factory.mktemp("privacy") / "sample.duckdb") as url:
        assert seed_sample(url).seeded
        yield url


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHAPEWATCH_AUTHOR", "ana")
    monkeypatch.delenv("SHAPEWATCH_TOKEN", raising=False)


def _protos(node: Any) -> Iterator[Any]:
    proto = getattr(node, "proto", None)
    if proto is not None:
        yield proto
    for child in (getattr(node, "children", None) or {}).values():
        yield from _protos(child)


def open_samples(at: AppTest) -> int:
    """Open every sample output of the field page (drawn only when its expander is opened, whose
    key is ``field-sample-`` and the event id); how many there are."""
    labels = [re.sub(r"\\(.)", r"\1", e.label) for e in at.expander]
    for label in labels:
        at.session_state["field-sample-" + label.split(" · ")[0]] = True
    at.run()
    assert len(at.json) == len(labels), (len(at.json), labels)
    return len(labels)


def page_bytes(at: AppTest) -> bytes:
    """Everything the page sent to the browser: every element's message, serialized (chart specs
    and their data, table Arrow buffers, Markdown, JSON, captions)."""
    return b"".join(p.SerializeToString() for p in _protos(at._tree))


def intake_id(url: str) -> int:
    return next(c["cohort_id"] for c in httpx.get(url + "/v1/cohorts").json() if c["cohort"] == INTAKE)


def test_the_sample_really_holds_addresses(sample_url: str) -> None:
    # what the test guards: the raw outputs carry an address in every intake output
    alerts = httpx.get(sample_url + "/v1/alerts").json()
    assert any(a["field"] == "customer.tier" for a in alerts)
    fields = httpx.get(f"{sample_url}/v1/cohorts/{intake_id(sample_url)}/fields").json()["fields"]
    email = next(f for f in fields if f["path"] == "customer.email")
    assert email["types"]["string"] == email["present"] > 500
    assert email["values"] == {} and email["values_withheld"] is True


@pytest.mark.parametrize(
    ("page", "query"),
    [
        ("views/alerts.py", {}),
        ("views/cohorts.py", {}),
        ("views/field.py", {"field": "customer.email"}),
        ("views/field.py", {"field": "customer.tier"}),
        ("views/baselines.py", {}),
        ("views/ingestion.py", {}),
    ],
)
def test_no_page_shows_an_address(
    sample_url: str, page: str, query: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHAPEWATCH_URL", sample_url)
    at = AppTest.from_file(APP, default_timeout=60).run()
    if page != "views/alerts.py":
        at.query_params.update({"cohort": str(intake_id(sample_url)), **query} if query else {})
        at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    if page == "views/field.py":  # the sample outputs, which show outputs holding addresses, opened
        assert open_samples(at) == (3 if query["field"] == "customer.tier" else 0)
        assert not at.exception, [e.value for e in at.exception]
    sent = page_bytes(at)
    if page == "views/baselines.py":  # only the open tab is drawn: every tab in turn
        for label in ("Compare and freeze", "Weekly review"):
            at.session_state["baselines-tab"] = label
            at.run()
            assert not at.exception, [e.value for e in at.exception]
            sent += page_bytes(at)
    assert len(sent) > 1000  # the page rendered something to search
    assert ADDRESS not in sent
    if query.get("field") == "customer.email":
        assert "withheld" in " ".join(c.value for c in at.caption)
        assert not [s.value for s in at.subheader if s.value == "Values"]


def test_alert_samples_mask_addresses(sample_url: str) -> None:
    alerts = httpx.get(sample_url + "/v1/alerts").json()
    ids = sorted({i for a in alerts for i in a.get("samples") or []})[:100]
    events = httpx.get(sample_url + "/v1/events", params={"ids": ids}).json()
    intake = [e for e in events if e["cohort"]["contract"] == "sample-intake"]
    assert intake
    for e in intake:
        assert e["output"]["customer"]["email"] == "[withheld]"
        assert e["output"]["intent"] in ("refund", "billing", "shipping", "cancel")  # the rest is as stored
    assert ADDRESS not in json.dumps(events).encode()


def test_the_field_series_sends_no_value_of_free_text_and_none_for_numbers(sample_url: str) -> None:
    cid = intake_id(sample_url)
    doc = httpx.get(f"{sample_url}/v1/cohorts/{cid}/series", params={"field": "customer.email"}).json()
    assert doc["values_kind"] == "free_text"
    assert all(p["values"] == {} and p["unknown_share"] is None for p in doc["series"])
    assert doc["baseline"]["values"] == {}
    assert ADDRESS not in json.dumps(doc).encode()
    tier = httpx.get(f"{sample_url}/v1/cohorts/{cid}/series", params={"field": "customer.tier"}).json()
    assert tier["values_kind"] == "enum"
    assert set(tier["baseline"]["values"]) == {"gold", "silver", "bronze"}


def test_review_and_baseline_documents_hold_no_address(sample_url: str, tmp_path: Path) -> None:
    for fmt in ("json", "markdown", "html"):
        text = httpx.get(sample_url + "/v1/review", params={"format": fmt}, timeout=60).content
        assert len(text) > 1000
        assert ADDRESS not in text, fmt
    baselines = httpx.get(sample_url + "/v1/baselines").json()
    assert len(baselines) == 3
    for b in baselines:
        doc = httpx.get(f"{sample_url}/v1/baselines/{b['baseline_id']}").json()
        assert ADDRESS not in json.dumps(doc).encode()
        if b["cohort"] == INTAKE:
            email = doc["fields"]["customer.email"]
            assert email["values"] == {}
            # every address still counts: as overflow, beside present and the string type
            assert email["values_overflow"] == email["types"]["string"] == email["present"] == 480
    out = tmp_path / "export"
    done = subprocess.run(
        [sys.executable, "-m", "shapewatch.analysis.cli", "baseline", "export", "--url", sample_url, "--out", str(out)],
        capture_output=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    files = sorted(out.rglob("*.json"))
    assert len(files) == 3
    for f in files:
        assert ADDRESS not in f.read_bytes()
