"""Stored values never become Markdown or HTML on a dashboard page.

A real service on loopback holds a cohort whose model id, prompt version,
contract, served model, field paths, enum values, baseline note and author,
and acknowledging author are image and link Markdown, HTML and table syntax,
written through its HTTP API as a client would. Every page runs in Streamlit's
AppTest, and every string Streamlit reads as Markdown (bodies, captions,
alerts, labels, help, metric values) is parsed with a CommonMark parser: it
must hold no image, link or HTML, while the values still show as their text.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from dashboard_live import live_service
from markdown_it import MarkdownIt
from streamlit.testing.v1 import AppTest

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

IMAGE = "![x](http://127.0.0.1:9/x.png)"
LINK = "[link](http://evil)"
HTML = "<img src=x onerror=alert(1)>"
SCRIPT = "<script>alert(1)</script>"
COHORT = {"model": f"m {IMAGE}", "prompt_version": f"p {LINK}", "contract": f"c {HTML} | x"}
SERVED = f"s {SCRIPT}"
FIELD = f"k {IMAGE}"  # a JSON key; its field path escapes the dots and brackets: k !\[x\](http://127\.0...
NOTE = f"{IMAGE} {LINK} {SCRIPT} | a\nb"
ENUM_VALUES = (IMAGE, LINK, f"{SCRIPT} |\n# h")
# Raw pieces no Markdown body may hold: each would be an image, a link, HTML or an autolink.
RAW = ("![", "](", "<img", "<script", "http://")

_PARSER = MarkdownIt("commonmark").enable(["table", "strikethrough"])
_UNRENDERED = {
    "text",
    "code",
    "json",
    "exception",
    "dataframe",
    "arrow_data_frame",
    "arrow_vega_lite_chart",
    "vega_lite_chart",
}


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _envelope(ts: datetime, output: dict[str, Any]) -> dict[str, Any]:
    return {
        "event_id": uuid.uuid4().hex,
        "ts": _iso(ts),
        **COHORT,
        "served_model": SERVED,
        "source": "production",
        "output": output,
    }


def _seed(url: str) -> str:
    """The hostile workspace; returns the hostile field's path."""
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    base = now - timedelta(days=3)
    step = timedelta(seconds=30)
    calm = [_envelope(base + i * step, {"status": ("ok", "fine")[i % 2], FIELD: "v"}) for i in range(480)]
    recent_start = now - timedelta(hours=5)
    drifted = []
    for i in range(600):
        out: dict[str, Any] = {"status": ENUM_VALUES[i % 3] if i % 2 else ("ok", "fine")[i % 4 // 2]}
        if i % 2:
            out[FIELD] = "v"  # present in half the outputs: a presence drop on the hostile path
        drifted.append(_envelope(recent_start + i * step, out))
    with httpx.Client(base_url=url, timeout=60) as c:
        for batch in (calm, drifted):
            r = c.post("/v1/outputs", json=batch)
            assert r.status_code == 200 and r.json()["rejected"] == 0, r.text[:500]
        r = c.post(
            "/v1/baselines",
            json={**COHORT, "since": _iso(base), "until": _iso(base + 480 * step), "author": HTML, "note": NOTE},
        )
        assert r.status_code == 201, r.text
        for _ in range(2):  # a page breach fires on its second evaluation in a row
            assert c.post("/v1/analyzer/run").status_code == 200
        alerts = c.get("/v1/alerts", params={"state": "open"}).json()
        # the hostile values are new values of the unknown growth they are folded into (and in its detail)
        (growth,) = [a for a in alerts if a["kind"] == "unknown_enum_growth"]
        assert set(growth["current"]["new_values"]) >= set(ENUM_VALUES)
        assert all(v in growth["detail"] for v in ENUM_VALUES)
        (drop,) = [a for a in alerts if a["kind"] == "presence_drop"]
        assert drop["field"].startswith("k !") and "](http://127" in drop["field"]
        assert c.post(f"/v1/alerts/{drop['fingerprint']}/ack", json={"author": f"ana {LINK}"}).status_code == 200
    return str(drop["field"])


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """The service's URL and the hostile field's path."""
    with live_service(tmp_path_factory.mktemp("hostile") / "hostile.duckdb") as url:
        yield url, _seed(url)


@pytest.fixture(scope="module")
def hostile_url(hostile: tuple[str, str]) -> str:
    return hostile[0]


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHAPEWATCH_AUTHOR", "ana")
    monkeypatch.delenv("SHAPEWATCH_TOKEN", raising=False)


def _open(url: str, page: str, monkeypatch: pytest.MonkeyPatch, query: dict[str, str] | None = None) -> AppTest:
    monkeypatch.setenv("SHAPEWATCH_URL", url)
    at = AppTest.from_file(APP, default_timeout=60).run()
    if page != "views/alerts.py" or query:
        at.query_params.update(query or {})
        at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _nodes(node: Any) -> Iterator[Any]:
    yield node
    children = getattr(node, "children", None)
    for child in children.values() if isinstance(children, dict) else children or []:
        yield from _nodes(child)


def markdown_strings(at: AppTest) -> list[str]:
    """Every string of the page that Streamlit renders as Markdown: element bodies (markdown,
    captions, headings, alerts), labels and help of widgets, links, expanders, tabs and popovers,
    metric values."""
    found: list[str] = []
    for node in _nodes(at._tree):
        if getattr(node, "type", None) in _UNRENDERED:
            continue
        proto = getattr(node, "proto", None)
        if proto is None:
            continue
        for desc, value in proto.ListFields():
            if desc.name in ("body", "label", "help") and isinstance(value, str):
                found.append(value)
            elif desc.name in ("expandable", "tab", "popover"):  # an expander, tab or popover: its label
                found.append(value.label)
    return found


def visible(body: str) -> str:
    """The text a reader sees of an escaped Markdown body (control pictures back to characters)."""
    text = re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", body)
    return text.translate({0x2400 + c: c for c in range(0x20)})


def _rendered_constructs(body: str) -> list[str]:
    """Images, links and HTML a CommonMark parser finds in ``body``."""
    bad = []
    for token in _PARSER.parse(body):
        if token.type in ("html_block", "html_inline"):
            bad.append(token.content)
        for child in token.children or []:
            if child.type in ("image", "link_open", "html_inline"):
                bad.append(f"{child.type}: {child.attrs or child.content}")
    return bad


def _unescaped(body: str) -> str:
    """``body`` with every backslash-escaped character blanked out: what Markdown may still read."""
    return re.sub(r"\\[!-/:-@\[-`{-~]", "\x00", body)


def _assert_inert(strings: list[str]) -> None:
    assert strings
    for body in strings:
        assert not [piece for piece in RAW if piece in _unescaped(body)], body
        assert _rendered_constructs(body) == [], body


@pytest.mark.parametrize("page", PAGES)
def test_no_page_renders_a_stored_value_as_markdown(
    hostile_url: str, page: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    query = None
    if page == "views/field.py":
        cohort_id = next(c["cohort_id"] for c in httpx.get(f"{hostile_url}/v1/cohorts", timeout=30).json())
        query = {"cohort": str(cohort_id), "field": "status"}
    at = _open(hostile_url, page, monkeypatch, query)
    _assert_inert(markdown_strings(at))
    if page == "views/baselines.py":  # only the open tab is drawn: every tab in turn
        for label in ("Compare and freeze", "Weekly review"):
            at.session_state["baselines-tab"] = label
            at.run()
            assert not at.exception, [e.value for e in at.exception]
            _assert_inert(markdown_strings(at))


def test_the_values_still_show_as_their_text(hostile: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The escaping hides nothing: the alerts page shows the hostile values, field and cohort as text."""
    hostile_url, field = hostile
    seen = " ".join(visible(s) for s in markdown_strings(_open(hostile_url, "views/alerts.py", monkeypatch)))
    for value in (*ENUM_VALUES, field, COHORT["model"], COHORT["prompt_version"], COHORT["contract"], f"ana {LINK}"):
        assert value in seen, value
    # and the baseline's note and author on the compare tab
    at = _open(hostile_url, "views/baselines.py", monkeypatch)
    at.session_state["baselines-tab"] = "Compare and freeze"  # only the open tab is drawn
    at.run()
    seen = " ".join(visible(s) for s in markdown_strings(at))
    assert NOTE in seen and HTML in seen


def test_the_alert_filters_label_names_stored_values_as_text(hostile_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The filter button's label names the filters in force, stored names among them: as text."""
    at = _open(hostile_url, "views/alerts.py", monkeypatch)
    at.selectbox(key="alerts-model").select(COHORT["model"])
    at.selectbox(key="alerts-prompt").select(COHORT["prompt_version"])
    at.selectbox(key="alerts-contract").select(COHORT["contract"]).run()
    assert not at.exception, [e.value for e in at.exception]
    (label,) = [n.proto.popover.label for n in _nodes(at._tree) if getattr(n, "type", None) == "popover"]
    _assert_inert([label])
    assert visible(label) == (
        f"Filters: open (pending and firing), production, {COHORT['model']}, {COHORT['prompt_version']}, "
        f"{COHORT['contract']}"
    )


def test_the_review_shown_on_the_dashboard_holds_no_live_markdown(
    hostile_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = _open(hostile_url, "views/baselines.py", monkeypatch)
    at.session_state["baselines-tab"] = "Weekly review"  # only the open tab is drawn
    at.run()
    at.toggle(key="review-on").set_value(True).run()  # the review is built on demand
    (review,) = [m.value for m in at.markdown if m.value.startswith("# shapewatch weekly review")]
    _assert_inert([review])
    rows = [line for line in review.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) >= 3  # the header and the hostile cohort's fields
    assert all(len(re.split(r"(?<!\\)\|", row)) == 8 for row in rows), rows  # six cells each
