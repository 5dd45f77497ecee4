"""Every dashboard page through Streamlit's AppTest, against a real service on loopback.

The service holds the sample workspace ``shapewatch up`` loads, written through
its HTTP API (``analysis.sample``): a baseline period three days ago, drift in
the last five hours, two evaluations. The dashboard reaches it over HTTP only
(``SHAPEWATCH_URL``). Read-only tests share one service; tests that write share
another (each changes a different alert), and the freeze gets one of its own.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from dashboard_live import free_port, live_service
from harness import make_envelope
from streamlit.testing.v1 import AppTest

from shapewatch.analysis.sample import SAMPLE_AUTHOR, seed_sample
from shapewatch.collector.envelope import LIMITS, parse_envelope
from shapewatch.collector.store import Store

APP = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"
PAGES = [
    "views/alerts.py",
    "views/cohorts.py",
    "views/field.py",
    "views/baselines.py",
    "views/ingestion.py",
    "views/runs.py",
    "views/cases.py",
]
# as a baseline holds a production cohort (its document leaves the source out)
INTAKE_NAMES = {"model": "claude-sonnet-4-5-20250929", "prompt_version": "intake-v3", "contract": "sample-intake"}
INTAKE = {**INTAKE_NAMES, "source": "production"}  # as cohorts and alerts carry it


@pytest.fixture(scope="module")
def sample_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with live_service(tmp_path_factory.mktemp("sample") / "sample.duckdb") as url:
        assert seed_sample(url).seeded
        yield url


@pytest.fixture
def fresh_url(tmp_path: Path) -> Iterator[str]:
    """A service of its own with the sample workspace, unsilenced: for a test that changes baselines."""
    with live_service(tmp_path / "fresh.duckdb") as url:
        assert seed_sample(url, silence=False).seeded
        yield url


@pytest.fixture(scope="module")
def writable_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The sample workspace, unsilenced, for tests that each change a different alert (or nothing)."""
    with live_service(tmp_path_factory.mktemp("writable") / "writable.duckdb") as url:
        assert seed_sample(url, silence=False).seeded
        yield url


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHAPEWATCH_AUTHOR", "ana")
    monkeypatch.delenv("SHAPEWATCH_TOKEN", raising=False)
    monkeypatch.delenv("SHAPEWATCH_URL", raising=False)


def open_page(
    url: str,
    page: str = "views/alerts.py",
    token: str | None = None,
    query: dict[str, str] | None = None,
    monkeypatch: pytest.MonkeyPatch | None = None,
) -> AppTest:
    """The app at ``page``, talking to the service at ``url``."""
    assert monkeypatch is not None
    monkeypatch.setenv("SHAPEWATCH_URL", url)
    if token is not None:
        monkeypatch.setenv("SHAPEWATCH_TOKEN", token)
    at = AppTest.from_file(APP, default_timeout=30).run()
    assert not at.exception, [e.value for e in at.exception]
    if page != "views/alerts.py" or query:
        at.query_params.update(query or {})
        at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def api(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=30)


def visible(body: str) -> str:
    """A Markdown body's text as the reader sees it: values come backslash-escaped (``ui.literal``)."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", body)


def markdown(at: AppTest) -> list[str]:
    return [visible(m.value) for m in at.markdown]


def by_field_kind(url: str) -> dict[tuple[str, str], dict[str, Any]]:
    with api(url) as c:
        return {(a["field"], a["kind"]): a for a in c.get("/v1/alerts").json()}


# --- alerts ----------------------------------------------------------------------------------


def test_alerts_page_shows_page_alerts_first_with_their_diff(sample_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(sample_url, monkeypatch=monkeypatch)
    # URGENT is folded into the unknown growth of priority: one warn alert, not two
    assert [h.value for h in at.subheader] == ["Page (2)", "Warn (4)", "Resolved (0)"]
    heads = [m for m in markdown(at) if m.startswith("**:")]
    assert [h.split("]**")[0] for h in heads] == ["**:red[PAGE"] * 2 + ["**:orange[WARN"] * 4
    page_fields = {h.split("`")[1] for h in heads[:2]}
    assert page_fields == {"customer.tier", "score"}
    assert "presence 100.0% -> 50.0% (p < 1e-6)" in markdown(at)
    # The presence drop's diff: baseline against current, as a table.
    drop = by_field_kind(sample_url)[("customer.tier", "presence_drop")]
    tables = [t.value.reset_index().to_dict("records") for t in at.table]
    assert [
        {"measure": "presence_rate", "baseline": "100.0%", "current": "50.0%"},
        {"measure": "samples", "baseline": "480", "current": "600"},
    ] in tables
    assert any(
        f"compared with baseline {drop['baseline_id']}" in m and f"`{drop['fingerprint']}`" in m for m in markdown(at)
    )
    # Links to the field's charts, and the alert's sample outputs.
    links = {visible(ln.proto.label): ln.proto.query_string for ln in at.get("page_link")}
    cohort_id = next(c["cohort_id"] for c in api(sample_url).get("/v1/cohorts").json() if c["cohort"] == INTAKE)
    assert links["Charts of customer.tier"] == f"cohort={cohort_id}&field=customer.tier"
    # Sample outputs are drawn when asked for (every JSON viewer costs the browser on each load).
    toggles = [t for t in at.toggle if t.key and t.key.startswith("samples-")]
    assert len(at.json) == 0 and len(toggles) == 5  # served_model_change has none: it is no field
    for t in toggles:
        t.set_value(True)
    at.run()
    assert len(at.json) == 5 * 3  # three sample outputs per alert
    outputs = [json.loads(j.proto.body) for j in at.json]
    assert sum(1 for o in outputs if "customer" in o and "tier" not in o["customer"]) >= 3
    # The sample workspace is silenced (never paged), and says so.
    assert any(m.startswith("silenced until") for m in markdown(at))


def _popover_labels(at: AppTest) -> list[str]:
    def nodes(node: Any) -> Iterator[Any]:
        yield node
        for child in (getattr(node, "children", None) or {}).values():
            yield from nodes(child)

    return [visible(n.proto.popover.label) for n in nodes(at._tree) if getattr(n, "type", None) == "popover"]


def test_alert_filters_narrow_the_list(sample_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(sample_url, monkeypatch=monkeypatch)
    # the filters sit in a popover (drawn when opened) whose label names those in force
    assert _popover_labels(at) == ["Filters: open (pending and firing), production"]
    at.selectbox(key="alerts-kind").select("new_type").run()
    assert _popover_labels(at) == ["Filters: open (pending and firing), production, new_type"]
    assert [h.value for h in at.subheader] == ["Page (1)", "Resolved (0)"]
    assert any(m.startswith("**:red[PAGE]** `score` · **new_type** = `string`") for m in markdown(at))
    at.selectbox(key="alerts-kind").select("(all)")
    at.selectbox(key="alerts-contract").select("sample-intake").run()
    assert [h.value for h in at.subheader] == ["Page (1)", "Warn (1)", "Resolved (0)"]
    at.selectbox(key="alerts-state").select("resolved").run()
    assert [h.value for h in at.subheader] == []
    assert next(i.value for i in at.info).startswith("No alert matches.")


def test_acknowledge_from_the_page(writable_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    drop = by_field_kind(writable_url)[("customer.tier", "presence_drop")]
    assert drop["acknowledged_by"] is None
    at = open_page(writable_url, monkeypatch=monkeypatch)
    at.button(key=f"ack-{drop['fingerprint']}").click().run()
    assert not at.exception, [e.value for e in at.exception]
    acked = api(writable_url).get(f"/v1/alerts/{drop['fingerprint']}").json()
    assert acked["acknowledged_by"] == "ana"
    assert acked["state"] == "firing"  # acknowledging changes who is told, never the state
    assert [visible(s.value) for s in at.success] == ["Acknowledged presence_drop on customer.tier as ana."]
    assert any(m.startswith("acknowledged by **ana**") for m in markdown(at))
    assert at.button(key=f"ack-{drop['fingerprint']}").disabled


def test_silence_from_the_page(writable_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    alert = by_field_kind(writable_url)[("priority", "unknown_enum_growth")]
    assert alert["silenced_until"] is None
    fp = alert["fingerprint"]
    at = open_page(writable_url, monkeypatch=monkeypatch)
    # The form is drawn when its expander is opened (six forms cost the browser on every load).
    assert [f.key for f in at.text_input] == ["author"]
    assert len(at.expander) == 6
    at.session_state[f"silence-open-{fp}"] = True
    at.run()
    assert sorted(f.key for f in at.text_input) == ["author", f"silence-for-{fp}", f"silence-reason-{fp}"]
    # Without a reason nothing is written.
    at.text_input(key=f"silence-for-{fp}").input("3h")
    at.button(key=f"FormSubmitter:silence-{fp}-Silence").click().run()
    assert any("needs a reason" in w.value for w in at.warning)
    assert api(writable_url).get(f"/v1/alerts/{fp}").json()["silenced_until"] is None
    before = datetime.now(UTC)
    at.text_input(key=f"silence-reason-{fp}").input("URGENT is being added to the contract")
    at.button(key=f"FormSubmitter:silence-{fp}-Silence").click().run()
    assert not at.exception, [e.value for e in at.exception]
    until = datetime.fromisoformat(api(writable_url).get(f"/v1/alerts/{fp}").json()["silenced_until"])
    assert before + timedelta(hours=3) <= until <= datetime.now(UTC) + timedelta(hours=3)
    assert next(visible(s.value) for s in at.success).startswith("Silenced unknown_enum_growth on priority until ")
    # Only that alert: the other alerts of the cohort are not silenced.
    assert {k for k, a in by_field_kind(writable_url).items() if a["silenced_until"]} == {
        ("priority", "unknown_enum_growth")
    }


# --- cohorts, field detail --------------------------------------------------------------------


def test_cohorts_page_lists_cohorts_with_the_unpinned_marker(sample_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(sample_url, "views/cohorts.py", monkeypatch=monkeypatch)
    cohorts, changes = (d.value for d in at.dataframe)
    rows = {(r["model"], r["prompt version"]): r for r in cohorts.to_dict("records")}
    # the two snapshots behind gpt-4o are served cohorts of their own, judged against its baseline
    assert {k: (r["pinned"], r["answers for alias"]) for k, r in rows.items()} == {
        ("claude-sonnet-4-5-20250929", "intake-v3"): ("pinned", "-"),
        ("claude-sonnet-4-5-20250929", "intake-v4"): ("pinned", "-"),
        ("gemini-2.0-flash-001", "extract-v1"): ("pinned", "-"),
        ("gpt-4o", "triage-v2"): ("⚠ unpinned alias", "-"),
        ("gpt-4o-2024-08-06", "triage-v2"): ("pinned", "gpt-4o"),
        ("gpt-4o-2024-11-20", "triage-v2"): ("pinned", "gpt-4o"),
    }
    assert rows[("gpt-4o-2024-11-20", "triage-v2")]["baseline how"] == (
        "inherited (served alias: gpt-4o / triage-v2 / sample-triage)"
    )
    assert rows[("gpt-4o-2024-11-20", "triage-v2")]["served models"] == "gpt-4o-2024-11-20 (600)"
    intake = rows[("claude-sonnet-4-5-20250929", "intake-v3")]
    assert (intake["events (7 days)"], intake["page firing"], intake["warn firing"], intake["baseline how"]) == (
        1560,
        1,
        1,  # the unknown growth of priority, carrying its new value
        "own",
    )
    assert rows[("claude-sonnet-4-5-20250929", "intake-v4")]["baseline how"] == (
        "inherited (previous prompt version: claude-sonnet-4-5-20250929 / intake-v3 / sample-intake)"
    )
    assert rows[("gpt-4o", "triage-v2")]["served models"] == "gpt-4o-2024-08-06 (960), gpt-4o-2024-11-20 (600)"
    assert changes.to_dict("records")[0] | {"detected": None} == {
        "cohort": "gpt-4o / triage-v2 / sample-triage",
        "previous": "gpt-4o-2024-08-06",
        "current": "gpt-4o-2024-11-20",
        "detected": None,
    }
    assert [m.value for m in at.metric] == ["6", "0", "1", "2"]
    # a cohort's fields open from a popover: its select box picks the cohort the link opens
    assert _popover_labels(at) == ["Open a cohort's fields"]
    triage = next(
        c["cohort_id"]
        for c in api(sample_url).get("/v1/cohorts").json()
        if (c["cohort"]["model"], c["cohort"]["contract"]) == ("gpt-4o", "sample-triage")
    )
    at.selectbox(key="cohorts-open").select("gpt-4o / triage-v2 / sample-triage").run()
    assert [(visible(ln.proto.label), ln.proto.query_string) for ln in at.get("page_link")] == [
        ("Field detail of this cohort", f"cohort={triage}")
    ]


def _cohort_id(url: str, contract: str, prompt_version: str | None = None) -> int:
    return next(
        c["cohort_id"]
        for c in api(url).get("/v1/cohorts").json()
        if c["cohort"]["contract"] == contract
        and (prompt_version is None or c["cohort"]["prompt_version"] == prompt_version)
    )


def _specs(at: AppTest) -> list[dict[str, Any]]:
    return [json.loads(c.proto.spec) for c in at.get("vega_lite_chart")]


def test_field_page_draws_presence_against_the_baseline(sample_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    cid = _cohort_id(sample_url, "sample-intake", "intake-v3")
    at = open_page(
        sample_url, "views/field.py", query={"cohort": str(cid), "field": "customer.tier"}, monkeypatch=monkeypatch
    )
    assert [h.value for h in at.subheader] == [
        "Presence",
        "Type shares",
        "Values",
        "Sample outputs that show the change",
        "Every field of the cohort",
    ]
    presence, types, values, unknown = _specs(at)
    # the alert's onset and fired time marked over the chart
    inner, onset_rule, onset_text = presence["layer"]
    assert (onset_rule["mark"]["type"], onset_text["mark"]["type"]) == ("rule", "text")
    marks = [layer["mark"]["type"] for layer in inner["layer"]]
    assert marks == ["area", "rule", "line"]  # tolerance band, baseline level, the series
    assert inner["layer"][2]["encoding"]["y"]["field"] == "presence"
    assert any(c.value.startswith("since ") and "before the page" in c.value for c in at.caption)
    assert types["encoding"]["y"]["stack"] == "zero"
    assert unknown["encoding"]["y"]["field"] == "unknown share"
    assert (values["mark"]["type"], values["encoding"]["color"]["field"]) == ("bar", "seen")
    assert any("Baseline presence 100.0%" in c.value for c in at.caption)
    assert "**:red[PAGE]** presence_drop: presence 100.0% -> 50.0% (p < 1e-6)" in markdown(at)
    fields = at.dataframe[-1].value
    assert set(fields["field"]) >= {"customer.tier", "priority", "intent", "tags"}
    # a free-text field's count of values is withheld: the counts beside it are text, as shown
    distinct = dict(zip(fields["field"], fields["distinct values"], strict=True))
    assert (distinct["customer.email"], distinct["customer.tier"], distinct["priority"]) == ("withheld", "3", "4")
    assert at.query_params == {"cohort": str(cid), "field": "customer.tier"}
    # The alert's sample outputs are drawn when opened: a JSON viewer costs the browser on every load.
    assert len(at.json) == 0 and len(at.expander) == 3
    first = visible(at.expander[0].label).split(" · ")[0]
    at.session_state["field-sample-" + first] = True
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    (shown,) = at.json
    (stored,) = api(sample_url).get("/v1/events", params={"ids": [first]}).json()
    assert json.loads(shown.proto.body) == stored["output"]


def test_field_page_highlights_new_values_and_draws_array_sizes(
    sample_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cid = _cohort_id(sample_url, "sample-intake", "intake-v3")
    at = open_page(
        sample_url, "views/field.py", query={"cohort": str(cid), "field": "priority"}, monkeypatch=monkeypatch
    )
    values = at.dataframe[0].value
    assert values.to_dict("records")[0] == {"value": "URGENT", "count (period)": 60, "count (baseline)": 0, "new": True}
    assert not values["new"][1:].any()
    assert "**1 value(s) the baseline never had:** `URGENT`" in markdown(at)

    triage = _cohort_id(sample_url, "sample-triage")
    at = open_page(
        sample_url, "views/field.py", query={"cohort": str(triage), "field": "labels"}, monkeypatch=monkeypatch
    )
    assert "Array size" in [h.value for h in at.subheader]
    arrays = _specs(at)[-1]
    assert [layer["mark"]["type"] for layer in arrays["layer"]] == ["line", "rule"]
    assert any(c.value == "Baseline p50/p90/p99: 1/2/2 items (dashed)." for c in at.caption)


def test_a_number_field_that_gets_strings_has_no_values_chart(sample_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # score: numbers in the baseline, a third sent as strings by the new snapshot. Its quoted
    # numbers are no "new values", and the share of strings is no 100% "unknown".
    triage = _cohort_id(sample_url, "sample-triage")
    at = open_page(
        sample_url, "views/field.py", query={"cohort": str(triage), "field": "score"}, monkeypatch=monkeypatch
    )
    heads = [h.value for h in at.subheader]
    assert "Values" not in heads and "Type shares" in heads
    assert any("is a number field" in c.value for c in at.caption)
    with api(sample_url) as c:
        doc = c.get(f"/v1/cohorts/{triage}/series", params={"field": "score"}).json()
        tier = c.get(
            f"/v1/cohorts/{_cohort_id(sample_url, 'sample-intake', 'intake-v3')}/series",
            params={"field": "priority", "points": 1, "since": _iso(datetime.now(UTC) - timedelta(hours=5))},
        ).json()
    assert doc["values_kind"] == "numeric"
    assert all(p["values"] == {} and p["unknown_share"] is None for p in doc["series"])
    # the unknown share counts over every value of the field: URGENT is 60 of the last 5 hours' 600
    assert tier["values_kind"] == "enum"
    assert tier["series"][0]["unknown_share"] == pytest.approx(0.1, abs=0.005)


def test_field_page_without_query_params_picks_a_cohort_and_field(
    sample_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = open_page(sample_url, "views/field.py", monkeypatch=monkeypatch)
    assert len(at.get("vega_lite_chart")) >= 2
    assert set(at.query_params) == {"cohort", "field"}


# --- baselines and review ---------------------------------------------------------------------


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _normal_window(url: str) -> tuple[str, str]:
    """The sample's second calm period: a day after its baseline period, four hours long."""
    b = next(b for b in api(url).get("/v1/baselines").json() if b["cohort"] == INTAKE_NAMES)
    since = datetime.fromisoformat(b["window"]["since"]) + timedelta(days=1)
    return _iso(since), _iso(since + timedelta(hours=4))


def _open_tab(at: AppTest, label: str) -> None:
    """Open a tab of the baselines page: only the open one is drawn, as in the browser."""
    at.session_state["baselines-tab"] = label
    at.run()
    assert not at.exception, [e.value for e in at.exception]


def _pick_cohort(at: AppTest, url: str) -> None:
    _open_tab(at, "Compare and freeze")
    at.selectbox(key="baselines-cohort").set_value(_cohort_id(url, "sample-intake", "intake-v3"))


def test_the_baselines_page_draws_the_open_tab_only(sample_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(sample_url, "views/baselines.py", monkeypatch=monkeypatch)
    assert [t.label for t in at.tabs] == ["Baselines", "Compare and freeze", "Weekly review"]
    drawn = [
        (len(at.dataframe), [x.key for x in at.selectbox], [t.key for t in at.toggle], [f.key for f in at.text_input])
    ]
    _open_tab(at, "Compare and freeze")
    drawn.append(
        (len(at.dataframe), [x.key for x in at.selectbox], [t.key for t in at.toggle], [f.key for f in at.text_input])
    )
    _open_tab(at, "Weekly review")
    drawn.append(
        (len(at.dataframe), [x.key for x in at.selectbox], [t.key for t in at.toggle], [f.key for f in at.text_input])
    )
    assert drawn == [
        (1, [], [], ["author"]),  # the listing (and the sidebar's name)
        (
            1,
            ["baselines-cohort", "baselines-compare"],
            [],
            ["baselines-since", "baselines-until", "freeze-note", "freeze-force", "author"],
        ),
        (0, ["review-period"], ["review-on"], ["author"]),
    ]


def test_freezing_asks_for_confirmation_first(fresh_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    before = api(fresh_url).get("/v1/baselines").json()
    at = open_page(fresh_url, "views/baselines.py", monkeypatch=monkeypatch)
    _pick_cohort(at, fresh_url)
    since, until = _normal_window(fresh_url)
    at.text_input(key="baselines-since").input(since)
    at.text_input(key="baselines-until").input(until).run()
    at.text_input(key="freeze-note").input("week 48: calm period after the v3 rollout")
    at.button(key="FormSubmitter:freeze-form-Freeze…").click().run()
    assert not at.exception, [e.value for e in at.exception]
    # Asked, not done.
    assert api(fresh_url).get("/v1/baselines").json() == before
    assert any(
        visible(w.value).startswith(f"Freeze **{' / '.join(INTAKE_NAMES.values())}** over {since} .. {until}")
        for w in at.warning
    )
    at.button(key="baselines-cancel").click().run()
    assert api(fresh_url).get("/v1/baselines").json() == before
    assert not [b for b in at.button if b.key == "baselines-confirm"]

    at.button(key="FormSubmitter:freeze-form-Freeze…").click().run()
    at.button(key="baselines-confirm").click().run()
    assert not at.exception, [e.value for e in at.exception]
    after = api(fresh_url).get("/v1/baselines").json()
    (new,) = [b for b in after if b["baseline_id"] not in {x["baseline_id"] for x in before}]
    assert (new["cohort"], new["window"], new["author"], new["note"], new["samples"], new["active"]) == (
        INTAKE_NAMES,
        {"since": since, "until": until},
        "ana",
        "week 48: calm period after the v3 rollout",
        480,
        True,
    )
    assert [visible(s.value) for s in at.success] == [f"Froze baseline {new['baseline_id']} (480 samples), now active."]


def test_a_refused_freeze_shows_the_services_objection(writable_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    at = open_page(writable_url, "views/baselines.py", monkeypatch=monkeypatch)
    _pick_cohort(at, writable_url)
    at.text_input(key="baselines-since").input(_iso(now - timedelta(hours=5)))
    at.text_input(key="baselines-until").input(_iso(now + timedelta(minutes=1))).run()
    at.text_input(key="freeze-note").input("the drifted hours")
    at.button(key="FormSubmitter:freeze-form-Freeze…").click().run()
    at.button(key="baselines-confirm").click().run()
    assert not at.exception, [e.value for e in at.exception]
    (err,) = [visible(e.value) for e in at.error]
    assert err.startswith(
        "Not done. baseline not frozen: the window holds 1 unresolved page alert(s): presence_drop on customer.tier"
    )
    assert len(api(writable_url).get("/v1/baselines").json()) == 3


def test_baselines_page_lists_compares_and_renders_the_review(sample_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(sample_url, "views/baselines.py", monkeypatch=monkeypatch)
    listing = at.dataframe[0].value
    assert len(listing) == 3 and set(listing["active"]) == {"active"} and set(listing["author"]) == {SAMPLE_AUTHOR}
    _pick_cohort(at, sample_url)
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    at.text_input(key="baselines-since").input(_iso(now - timedelta(hours=5)))
    at.text_input(key="baselines-until").input(_iso(now + timedelta(minutes=1))).run()
    rows = {r["field"]: r for r in at.dataframe[0].value.to_dict("records")}  # the compare tab's
    assert (
        rows["customer.tier"]["presence (baseline)"],
        rows["customer.tier"]["presence (window)"],
        rows["customer.tier"]["move (points)"],
    ) == ("100.0%", "50.0%", -50.0)
    assert rows["priority"]["new values"] == "URGENT"
    _open_tab(at, "Weekly review")
    assert not any(m.startswith("# shapewatch weekly review") for m in markdown(at))  # built on demand
    at.toggle(key="review-on").set_value(True).run()
    assert any(m.startswith("# shapewatch weekly review") for m in markdown(at))
    (download,) = at.get("download_button")
    assert download.proto.label == "Download the report (HTML)"


# --- ingestion health -------------------------------------------------------------------------


def test_ingestion_page_shows_counts_and_the_analyzers_runs(sample_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(sample_url, "views/ingestion.py", monkeypatch=monkeypatch)
    metrics = {m.label: visible(m.value) for m in at.metric}
    assert (metrics["Accepted"], metrics["Duplicates"], metrics["Rejected"]) == ("4,730", "0", "0")
    assert metrics["Result"] == "ok"
    assert metrics["Cohorts / checks / breaches"].startswith("5 / ")  # the cohorts with traffic in the 24-hour window
    runs = at.dataframe[-1].value
    assert list(runs["run"]) == [2, 1] and runs["ok"].all()
    per_cohort = {(r["model"], r["prompt version"]): r["accepted"] for r in at.dataframe[-2].value.to_dict("records")}
    assert per_cohort[("gpt-4o", "triage-v2")] == 1560
    # what the store holds, beside what this process counted (the same 4,730 here); per cohort, a
    # dated model counts what it answered for its alias too
    assert httpx.get(f"{sample_url}/healthz").json()["events"] == 4730
    assert metrics["Events stored"] == "4,730"
    rows = at.dataframe[0].value.to_dict("records")
    stored = {(r["model"], r["prompt version"]): r["events counted"] for r in rows}
    assert stored[("gpt-4o", "triage-v2")] == 1560
    assert stored[("gpt-4o-2024-11-20", "triage-v2")] + stored[("gpt-4o-2024-08-06", "triage-v2")] >= 1560
    assert all(r["last event"].endswith("ago)") for r in rows)


def test_ingestion_figures_read_from_the_store_survive_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Events stored before this service started: its counters say 0, the store's figures do not."""
    db = tmp_path / "restarted.duckdb"
    with Store.open(db) as store:
        store.write_batch([parse_envelope(orjson.dumps(make_envelope(event_id=f"r{i}")), LIMITS) for i in range(37)])
    with live_service(db) as url:
        at = open_page(url, "views/ingestion.py", monkeypatch=monkeypatch)
    assert not at.exception
    metrics = {m.label: visible(m.value) for m in at.metric}
    assert (metrics["Events stored"], metrics["Cohorts"], metrics["Accepted"]) == ("37", "1", "0")
    (row,) = at.dataframe[0].value.to_dict("records")
    assert row["events counted"] == 37


# --- the service down, a wrong token ----------------------------------------------------------


@pytest.mark.parametrize("page", PAGES)
def test_every_page_says_clearly_when_the_service_is_down(page: str, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    at = open_page(
        url, page, query={"cohort": "1", "field": "x"} if page == "views/field.py" else None, monkeypatch=monkeypatch
    )
    assert not at.exception
    (err,) = [visible(e.value) for e in at.error]
    assert err.startswith(f"**The service is not reachable.** Cannot reach the shapewatch service at {url}")
    assert "SHAPEWATCH_URL" in err


@pytest.fixture(scope="module")
def guarded_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with live_service(tmp_path_factory.mktemp("guarded") / "guarded.duckdb", tokens=("s3cret",)) as url:
        yield url


@pytest.mark.parametrize("page", PAGES)
def test_a_wrong_token_shows_the_auth_message(guarded_url: str, page: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(guarded_url, page, token="wrong", monkeypatch=monkeypatch)
    assert not at.exception
    (err,) = [visible(e.value) for e in at.error]
    assert err.startswith(f"**Not authorised.** The service at {guarded_url} refused the dashboard's token (401")
    assert "SHAPEWATCH_TOKEN" in err


def test_the_right_token_is_sent(guarded_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(guarded_url, token="s3cret", monkeypatch=monkeypatch)
    assert not at.error
    assert next(i.value for i in at.info).startswith("No alert matches.")


# --- optional login ---------------------------------------------------------------------------


def test_with_oidc_configured_nothing_shows_before_a_login(sample_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHAPEWATCH_URL", sample_url)
    at = AppTest.from_file(APP, default_timeout=30)
    at.secrets["auth"] = {
        "redirect_uri": "http://localhost:8501/oauth2callback",
        "cookie_secret": "x" * 32,
        "client_id": "shapewatch",
        "client_secret": "s",
        "server_metadata_url": "https://login.example/.well-known/openid-configuration",
    }
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert [t.value for t in at.title] == ["shapewatch"]
    assert [b.label for b in at.button] == ["Log in"]
    assert not at.subheader and not at.dataframe  # no page ran

    # Signed in: the pages show, and writes are signed with the login's e-mail.
    at = AppTest.from_file(APP, default_timeout=30)
    at.secrets["auth"] = {"cookie_secret": "x" * 32}
    at.user = {"is_logged_in": True, "email": "ana@example.com"}
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert [t.value for t in at.title] == ["Alerts"]
    assert at.text_input(key="author").value == "ana@example.com"
    assert "Log out" in [b.label for b in at.button]
