"""Schema version 10: the source is part of the cohort (issue 25). A file of version 9, whose
cohorts pooled every source, migrates with each cohort as production's, keeping its id; probe and
shadow events written after get cohorts of their own, and the served-cohort view matches sources.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import orjson
from harness import make_envelope

from shapewatch.collector import Store
from shapewatch.collector.envelope import LIMITS, parse_envelope
from shapewatch.collector.store import MIGRATIONS, SCHEMA_VERSION


def _v9_file(path: Path) -> None:
    """A database as schema version 9 left it: a cohort holding production and probe events."""
    con = duckdb.connect(str(path))
    for step in MIGRATIONS[:9]:
        if callable(step):
            step(con)
        else:
            con.execute(step.replace("{bucket}", "60"))
    con.execute("INSERT INTO meta VALUES ('schema_version', '9'), ('bucket_seconds', '60')")
    con.execute("INSERT INTO cohorts VALUES (7, 'gpt-4o', 'p1', 'intake', TIMESTAMPTZ '2026-11-29 12:00:00+00')")
    for i, source in enumerate(["production", "probe", None]):
        con.execute(
            """INSERT INTO events VALUES (md5_number($id), $id, 'h', false, 7, TIMESTAMPTZ '2026-11-29 12:00:05+00',
                   TIMESTAMPTZ '2026-11-29 12:05:00+00', 'gpt-4o-2024-08-06', NULL, $source, NULL, NULL, NULL,
                   NULL, '{"intent":"refund"}')""",
            {"id": f"old-{i}", "source": source},
        )
    con.close()


def parse(**kw: object) -> object:
    return parse_envelope(orjson.dumps(make_envelope(**kw)), LIMITS)


def test_a_version_9_file_migrates_with_its_cohorts_as_production(tmp_path: Path) -> None:
    path = tmp_path / "v9.duckdb"
    _v9_file(path)
    with Store.open(path) as store:
        assert store.query("SELECT value FROM meta WHERE key = 'schema_version'") == [(str(SCHEMA_VERSION),)]
        assert [(r.cohort_id, r.model, r.source) for r in store.cohorts()] == [(7, "gpt-4o", "production")]
        assert store.cohort_id("gpt-4o", "p1", "intake") == 7
        assert store.cohort_id("gpt-4o", "p1", "intake", "probe") is None
        # events keep the source they were sent with
        assert store.query("SELECT event_id, source FROM events ORDER BY 1") == [
            ("old-0", "production"),
            ("old-1", "probe"),
            ("old-2", None),
        ]
        common = {"model": "gpt-4o", "served_model": "gpt-4o-2024-11-20", "prompt_version": "p1", "contract": "intake"}
        store.write_batch(
            [
                parse(event_id="new-prod", source=None, **common),
                parse(event_id="new-probe", source="probe", **common),
                parse(event_id="new-shadow", source="shadow", **common),
            ]
        )
        store.flush_rollups()
        cohorts = {(r.model, r.source): r.cohort_id for r in store.cohorts()}
        assert set(cohorts) == {
            ("gpt-4o", "production"),
            ("gpt-4o", "probe"),
            ("gpt-4o", "shadow"),
            # the served cohorts of the model that answered, one per source
            ("gpt-4o-2024-11-20", "production"),
            ("gpt-4o-2024-11-20", "probe"),
            ("gpt-4o-2024-11-20", "shadow"),
        }
        assert cohorts[("gpt-4o", "production")] == 7
        # each new event is counted in its own source's cohorts, and the view agrees
        buckets = dict(store.query("SELECT cohort_id, sum(events)::BIGINT FROM cohort_buckets GROUP BY ALL"))
        for source in ("probe", "shadow"):
            assert buckets[cohorts[("gpt-4o", source)]] == 1
            assert buckets[cohorts[("gpt-4o-2024-11-20", source)]] == 1
        view = dict(
            store.query("SELECT cohort_id, count(*) FROM cohort_events WHERE event_id LIKE 'new-%' GROUP BY ALL")
        )
        assert view == dict.fromkeys(cohorts.values(), 1)
