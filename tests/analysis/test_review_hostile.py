"""The review report over hostile stored values, a broken baseline and an over-long period.

A real DuckDB file holds a cohort whose tags, field path, enum values, baseline
note and author are image and link Markdown, HTML, pipes and newlines, and a
second cohort whose stored baseline document was edited after it was frozen.
The report is built by the real CLI (``review --format markdown``) and the real
service (``/v1/review``): every value is escaped, every table row keeps its five
cells, the broken cohort is reported as that cohort's failure and the rest is
still reviewed, and a period past ``MAX_REVIEW_PERIOD`` is refused.
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from markdown_it import MarkdownIt
from prometheus_client import CollectorRegistry

from shapewatch.analysis.alerts import ALERTS_SCHEMA
from shapewatch.analysis.analyzer import Analyzer
from shapewatch.analysis.cli import cli
from shapewatch.analysis.config import MAX_REVIEW_PERIOD, AnalyzerConfig
from shapewatch.analysis.errors import ConfigInvalid, ReviewPeriodTooLong
from shapewatch.analysis.review import build_review, render_html, render_markdown
from shapewatch.analysis.service import create_app
from shapewatch.baselines import BASELINES_SCHEMA, Cohort, freeze_baseline
from shapewatch.collector import Store, load_settings, parse_envelope
from shapewatch.collector.envelope import LIMITS

IMAGE = "![x](http://127.0.0.1:9/x.png)"
LINK = "[link](http://evil)"
HTML = "<img src=x onerror=alert(1)>"
SCRIPT = "<script>alert(1)</script>"
HOSTILE = Cohort(f"m {IMAGE}", f"p {LINK} `x`", f"c {HTML} | y")
BROKEN = Cohort("claude-sonnet-4-5-20250929", "intake-v3", "intake")
FIELD = f"k {SCRIPT} | z"  # a JSON key, so a field path
NOTE = f"{IMAGE} {LINK} {SCRIPT} | a\nb # c"
ENUM_VALUES = (IMAGE, f"{SCRIPT} |\n# h", f"x\\|{LINK}")
RAW = ("![", "](", "<img", "<script", "http://")
_PARSER = MarkdownIt("commonmark").enable(["table"])
NOW = datetime.now(UTC).replace(second=0, microsecond=0)


def _envelopes(cohort: Cohort, start: datetime, n: int, output: Any) -> list[Any]:
    step = timedelta(seconds=30)
    return [
        parse_envelope(
            orjson.dumps(
                {
                    "event_id": uuid.uuid4().hex,
                    "ts": (start + i * step).isoformat(),
                    "model": cohort.model,
                    "served_model": f"s {SCRIPT}",
                    "prompt_version": cohort.prompt_version,
                    "contract": cohort.contract,
                    "source": "production",
                    "output": output(i),
                }
            ),
            LIMITS,
        )
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("hostile-review") / "review.duckdb"
    base = NOW - timedelta(days=3)
    recent = NOW - timedelta(hours=5)
    with Store.open(path, schemas=[BASELINES_SCHEMA, ALERTS_SCHEMA]) as store:
        calm = {"status": "ok", FIELD: 1}
        store.write_batch(
            _envelopes(HOSTILE, base, 480, lambda i: {**calm, "status": ("ok", "fine")[i % 2]})
            + _envelopes(
                HOSTILE,
                recent,
                600,
                lambda i: {"status": ENUM_VALUES[i % 3] if i % 2 else "ok", **({FIELD: 1} if i % 2 else {})},
            )
            + _envelopes(BROKEN, base, 480, lambda i: calm)
            + _envelopes(BROKEN, recent, 600, lambda i: calm)
        )
        until = base + timedelta(hours=4)
        freeze_baseline(store, HOSTILE, base, until, author=HTML, note=NOTE, now=until)
        broken = freeze_baseline(store, BROKEN, base, until, author="ana", note="calm", now=until)
        analyzer = Analyzer(store, AnalyzerConfig(), registry=CollectorRegistry())
        for minutes in (5, 0):  # a page breach fires on its second evaluation in a row
            assert analyzer.run(NOW - timedelta(minutes=minutes)).ok
        # The broken cohort's stored document is edited afterwards: a count of the wrong type.
        with store.transaction("editing a stored baseline") as con:
            (text,) = con.execute(
                "SELECT document FROM baselines WHERE baseline_id = ?", [broken.baseline_id]
            ).fetchone()
            doc = orjson.loads(text)
            doc["fields"]["status"]["present"] = "lots"
            con.execute(
                "UPDATE baselines SET document = ? WHERE baseline_id = ?",
                [orjson.dumps(doc).decode(), broken.baseline_id],
            )
    return path


def _unescaped(text: str) -> str:
    """``text`` with every backslash-escaped character and code span blanked out."""
    return re.sub(r"\\[!-/:-@\[-`{-~]", "\x00", text)


def _cells(row: str) -> list[str]:
    return re.split(r"(?<!\\)\|", row)[1:-1]


def _assert_markdown_is_inert(text: str) -> None:
    assert not [piece for piece in RAW if piece in _unescaped(text)]
    tokens = _PARSER.parse(text)
    assert not [t for t in tokens if t.type in ("html_block", "html_inline")]
    assert not [c.type for t in tokens for c in t.children or [] if c.type in ("image", "link_open", "html_inline")]
    # Every table row, header included, has the six cells of the header.
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert rows and all(len(_cells(r)) == 6 for r in rows), rows
    types = [t.type for t in tokens]
    assert types.count("th_open") + types.count("td_open") == 6 * types.count("tr_open") > 0


def test_the_cli_markdown_review_escapes_every_value_and_keeps_every_table_row(seeded: Path) -> None:
    result = CliRunner(env={"SHAPEWATCH_URL": None, "SHAPEWATCH_TOKEN": None, "SHAPEWATCH_CONFIG": None}).invoke(
        cli, ["review", "--format", "markdown", "--db", str(seeded)], prog_name="shapewatch"
    )
    assert result.exit_code == 0, result.output
    text = result.output
    _assert_markdown_is_inert(text)
    # The hostile cohort is reviewed, its values there as escaped text: a reader sees them as written.
    visible = re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", text).translate({0x2400 + c: c for c in range(0x20)})
    for value in (*HOSTILE[:3], NOTE, HTML, *ENUM_VALUES, f"s {SCRIPT}"):
        assert value in visible, value
    assert re.search(r"^\| k \\<script\\>alert\\\(1\\\)\\<\\/script\\> \\\| z ", text, re.M)
    # The broken cohort is that cohort's failure, named, and nothing else's.
    section = text.split("## Cohorts that could not be reviewed\n\n")[1]
    assert section.startswith("- `claude-sonnet-4-5-20250929` / `intake-v3` / `intake`: Baseline")


def test_the_service_reviews_every_other_cohort_when_one_baseline_is_broken(seeded: Path, tmp_path: Path) -> None:
    db = tmp_path / "copy.duckdb"
    db.write_bytes(seeded.read_bytes())
    app = create_app(load_settings({"db_path": str(db)}, env={}), registry=CollectorRegistry(), analyze=False)
    with TestClient(app) as client:
        review = client.get("/v1/review")
        md = client.get("/v1/review", params={"format": "markdown"})
        page = client.get("/v1/review", params={"format": "html"})
    assert review.status_code == md.status_code == page.status_code == 200, review.text
    body = review.json()
    assert [Cohort(**c["cohort"]) for c in body["cohorts"] if c["baseline"]] == [HOSTILE]
    (error,) = body["errors"]
    assert Cohort(**error["cohort"]) == BROKEN and error["events"] == 1080
    assert error["error"].startswith("Baseline")  # BaselineInvalid or BaselineTampered: it does not load
    _assert_markdown_is_inert(md.text)
    # The HTML escapes every value too: no tag but its own.
    assert "<script" not in page.text and "<img" not in page.text and "&lt;script&gt;" in page.text
    assert set(re.findall(r"<([a-z0-9]+)", page.text)) <= {
        "html",
        "head",
        "meta",
        "title",
        "style",
        "body",
        "h1",
        "h2",
        "p",
        "section",
        "span",
        "code",
        "svg",
        "rect",
        "line",  # the daily chart's baseline level
        "polyline",  # ... its line
        "circle",  # ... and its days
        "ul",
        "li",
        "strong",
        "table",
        "tr",
        "th",
        "td",
    }


def test_a_review_period_longer_than_the_limit_is_refused_before_anything_is_read(seeded: Path) -> None:
    with Store.open(seeded, schemas=[BASELINES_SCHEMA, ALERTS_SCHEMA]) as store:
        assert build_review(store, AnalyzerConfig(), period=MAX_REVIEW_PERIOD)["cohorts"]
        for period in (MAX_REVIEW_PERIOD + timedelta(seconds=1), timedelta(days=100000), timedelta(0)):
            with pytest.raises(ReviewPeriodTooLong) as refused:
                build_review(store, AnalyzerConfig(), period=period)
            assert isinstance(refused.value, ConfigInvalid) and refused.value.key == "since"
    assert str(ReviewPeriodTooLong(timedelta(days=10000), MAX_REVIEW_PERIOD)).startswith(
        "since: a review period of 10000 days is longer than the limit of 90 days"
    )


def test_render_markdown_escapes_a_crafted_review_document() -> None:
    """The renderers format a review read back from JSON (``review --url``) as safely as a built one."""
    c = HOSTILE._asdict()
    review: dict[str, Any] = {
        "generated_at": IMAGE,
        "since": LINK,
        "until": SCRIPT,
        "max_baseline_age_days": HTML,
        "cohorts": [
            {
                "cohort": c,
                "events": SCRIPT,
                "unpinned": True,
                "served_models": {IMAGE: LINK},
                "daily_events": [],
                "alerts": {
                    "fired": [{"severity": HTML, "kind": IMAGE, "field": FIELD, "value": SCRIPT}],
                    "acknowledged": [],
                    "resolved": [],
                },
                "candidate": {"since": IMAGE, "until": LINK, "samples": HTML, "differs": [SCRIPT]},
                "baseline": {
                    "baseline_id": IMAGE,
                    "how": LINK,
                    "cohort": c,
                    "created_at": HTML,
                    "age_days": SCRIPT,
                    "author": HTML,
                    "note": NOTE,
                    "stale": True,
                },
                "contracts": {
                    "window": {LINK: 1},
                    "live": IMAGE,
                    "checked": 1,
                    "changes": [{"version": SCRIPT, "first_seen": HTML}],
                    "violations": {FIELD: 1},
                },
                "fields": [
                    {
                        "field": FIELD,
                        "presence": [1.0, 0.5],
                        "types": [{"string": 1.0}, {}],
                        "new_values": list(ENUM_VALUES),
                        "arrays": [None, None],
                        "status": "",
                        "declared": None,
                    }
                ],
            }
        ],
        "without_baseline": [{"cohort": c, "events": IMAGE}],
        "stale_baselines": [{"cohort": c, "baseline_id": SCRIPT, "age_days": LINK}],
        "errors": [{"cohort": c, "events": 1, "error": NOTE}],
    }
    _assert_markdown_is_inert(render_markdown(review))
    page = render_html(review)
    assert "<script" not in page and "<img" not in page
