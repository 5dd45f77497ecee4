"""The Contracts page and the two routes behind it (``/v1/contracts/diff``, ``/v1/contracts/usage``),
against a real service holding the sample workspace (its contracts are registered before its
outputs, so the outputs are checked); the page through AppTest."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from dashboard_live import live_service
from harness import ROOT
from streamlit.testing.v1 import AppTest

from shapewatch.analysis.sample import SAMPLE_CONTRACTS, seed_sample

APP = ROOT / "dashboard" / "app.py"


@pytest.fixture(scope="module")
def sample_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with live_service(tmp_path_factory.mktemp("contracts") / "sample.duckdb") as url:
        assert seed_sample(url).seeded
        yield url


def get(url: str, path: str, **params: object) -> httpx.Response:
    return httpx.get(url + path, params=params, timeout=60)


def test_the_diff_route_classifies_every_change(sample_url: str) -> None:
    r = get(sample_url, "/v1/contracts/diff", contract="sample-intake", to="2", **{"from": "1"})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert (doc["contract"], doc["from"], doc["to"], doc["verdict"]) == ("sample-intake", "1", "2", "breaking")
    assert sorted((c["path"], c["classification"]) for c in doc["changes"]) == [
        ("channel", "compatible"),
        ("customer", "breaking"),
        ("customer.email", "breaking"),
        ("priority", "behavioral"),
    ]
    same = get(sample_url, "/v1/contracts/diff", contract="sample-intake", to="1", **{"from": "1"}).json()
    assert (same["verdict"], same["changes"]) == ("unchanged", [])


def test_the_usage_route_counts_each_version_and_its_cohorts(sample_url: str) -> None:
    doc = get(sample_url, "/v1/contracts/usage", contract="sample-intake", points=7).json()
    by_version = {v["version"]: v for v in doc["versions"]}
    assert list(by_version) == ["1", "2"]  # registered versions, oldest first
    v1, v2 = by_version["1"], by_version["2"]
    assert (v1["registered"], v2["registered"], v2["outputs"], v2["cohorts"]) == (True, True, 0, [])
    assert len(v1["series"]) == 7
    assert sum(s["outputs"] for s in v1["series"]) == v1["outputs"] == sum(c["outputs"] for c in v1["cohorts"])
    # intake-v3 (three periods: 480 + 480 + 600) and the intake-v4 rollout (50) send version 1
    assert {c["cohort"]["prompt_version"]: c["outputs"] for c in v1["cohorts"]} == {"intake-v3": 1560, "intake-v4": 50}
    assert all(s["violation_rate"] == 0.0 for s in v1["series"] if s["checked"])
    assert sum(s["checked"] for s in v1["series"]) == v1["outputs"]  # under the check quota: all checked
    # a contract nobody registered nor sent: no version, no error
    assert get(sample_url, "/v1/contracts/usage", contract="nobody").json()["versions"] == []


@pytest.mark.parametrize(
    ("path", "params", "status", "field"),
    [
        ("/v1/contracts/diff", {"contract": "sample-intake", "to": "2"}, 422, "from"),
        ("/v1/contracts/diff", {"contract": "sample-intake", "from": "1", "to": "9"}, 404, None),
        ("/v1/contracts/diff", {"contract": "x" * 10_000, "from": "1", "to": "2"}, 422, "contract"),
        ("/v1/contracts/diff", {"contract": "", "from": "1", "to": "2"}, 422, "contract"),
        ("/v1/contracts/usage", {"contract": "sample-intake", "points": 0}, 422, "points"),
        ("/v1/contracts/usage", {"contract": "sample-intake", "points": 501}, 422, "points"),
        ("/v1/contracts/usage", {"contract": "sample-intake", "points": "1e9"}, 422, "points"),
        ("/v1/contracts/usage", {"contract": "sample-intake", "since": "yesterday"}, 422, "since"),
        (
            "/v1/contracts/usage",
            {"contract": "sample-intake", "since": "1971-01-02T00:00:00Z", "until": "2026-01-01T00:00:00Z"},
            422,
            "since",
        ),
        ("/v1/contracts/usage", {}, 422, "contract"),
    ],
)
def test_hostile_parameters_are_refused_naming_them(
    sample_url: str, path: str, params: dict[str, object], status: int, field: str | None
) -> None:
    r = get(sample_url, path, **params)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["status"] == status
    if field is not None:
        assert field in [f["path"] for f in err["fields"]] or field in err["message"], err


def test_the_contracts_page_lists_diffs_and_charts(sample_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHAPEWATCH_URL", sample_url)
    at = AppTest.from_file(APP, default_timeout=60).run()
    at.query_params["contract"] = "sample-intake"
    at.switch_page("views/contracts.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == "Contracts"
    registered = at.dataframe[0].value
    assert sorted(zip(registered["contract"], registered["version"], strict=True)) == sorted(
        (c, v) for c, v, _ in SAMPLE_CONTRACTS
    )
    assert at.selectbox[0].value == "sample-intake"
    assert (at.selectbox[1].value, at.selectbox[2].value) == ("1", "2")
    assert any(m.value.startswith("**:red[BREAKING]**") for m in at.markdown)
    changes = at.dataframe[1].value
    assert set(changes["classification"]) == {"breaking", "compatible", "behavioral"}
    specs = [c.proto.spec for c in at.get("vega_lite_chart")]
    assert len(specs) == 2 and all('"utc"' in s for s in specs)  # violations and outputs per version
    cohorts = at.dataframe[2].value
    assert set(cohorts["cohort"]) == {
        "claude-sonnet-4-5-20250929 / intake-v3 / sample-intake",
        "claude-sonnet-4-5-20250929 / intake-v4 / sample-intake",
    }
    # another pair of versions: the diff follows the pick
    at.selectbox[1].set_value("2").run()
    assert any("Pick two different versions" in c.value for c in at.caption)
