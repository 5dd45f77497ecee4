"""``make test-cluster`` sets SHAPEWATCH_CLUSTER_REQUIRED: there a missing tool fails the run
(naming it) instead of skipping every test, so the target never passes having tested nothing."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from cluster_harness import Postgres, missing_tools


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("SHAPEWATCH_CLUSTER_REQUIRED") and any(i.get_closest_marker("cluster") for i in items):
        missing = missing_tools()
        if missing:
            raise pytest.UsageError(f"the scale-out cluster tests need: {', '.join(missing)}")


@pytest.fixture(scope="module")
def pg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Postgres]:
    """A PostgreSQL server of the module's own."""
    p = Postgres(tmp_path_factory.mktemp("pg"))
    p.start()
    yield p
    p.stop()
