"""The reliability suite: tests that try to break shapewatch's promises (issue 7).

Each test is a scenario with a pass criterion that can fail, and records the figures it
measured through the ``report`` fixture (events sent, acknowledged, lost; inputs tried and
rejected; latencies). ``make reliability`` runs every test here and writes
``reliability/REPORT.md`` from those records (``SHAPEWATCH_RELIABILITY_REPORT`` names the
file); the short ones, unmarked, also run in ``make test`` as a smoke subset, and the long
ones carry the ``reliability`` marker.

The service helpers of ``tests/conftest.py`` (``start_service``, ``free_port``,
``make_envelope``, ``ensure_tool``) are loaded from that file under another module name, so
the two conftest modules never shadow each other: import them from ``rel_support``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import rel_support  # noqa: F401  (puts tests/ and tests/analysis/ on the path for every module here)
from rel_report import Report

_REPORT = Report()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    rep = yield
    if rep.when == "call" or rep.failed:  # a failed setup counts as a failed scenario
        item.stash[_OUTCOME] = "passed" if rep.passed else ("skipped" if rep.skipped else "failed")
    return rep


_OUTCOME = pytest.StashKey[str]()


@pytest.fixture
def report(request: pytest.FixtureRequest) -> Iterator[dict[str, object]]:
    """A dict of figures for this scenario; recorded with the test's outcome when it ends.

    >>> def test_x(report): report["events sent"] = 1000
    """
    figures: dict[str, object] = {}
    yield figures
    doc = (request.node.function.__doc__ or "").strip().splitlines()
    _REPORT.record(
        request.node.nodeid,
        doc[0] if doc else request.node.name,
        figures,
        lambda: request.node.stash.get(_OUTCOME, "failed"),
    )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    target = os.environ.get("SHAPEWATCH_RELIABILITY_REPORT")
    if target and _REPORT.entries:
        Path(target).write_text(_REPORT.render(exitstatus))
