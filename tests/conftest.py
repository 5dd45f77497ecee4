"""Shared fixtures: real DuckDB files under tmp_path, valid envelopes with overrides, and a real
service (``shapewatch serve`` in a subprocess on a free loopback port). The helpers behind them
are in harness.py, which tests import directly."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import Service, make_envelope, start_service

from shapewatch.collector import Store
from shapewatch.collector.accel import IMPLEMENTATION
from shapewatch.collector.rollup import RollupConfig


def _accelerator() -> str:
    mode = os.environ.get("SHAPEWATCH_ACCEL", "auto")
    return f"shapewatch accelerator: {IMPLEMENTATION} (SHAPEWATCH_ACCEL={mode})"


def pytest_report_header() -> str:
    """Which implementation of the accelerator the run tests: ``make test`` runs the suites that
    use it once with the C extension and once with its pure-Python twin."""
    return _accelerator()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The same at the end, where ``pytest -q`` (which prints no header) shows it too."""
    terminalreporter.write_line(_accelerator())


@pytest.fixture
def envelope() -> Callable[..., dict[str, Any]]:
    return make_envelope


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "shapewatch.duckdb"


@pytest.fixture
def store(db_path: Path) -> Iterator[Store]:
    s = Store.open(db_path, rollup=RollupConfig(enum_values_per_path=50))
    yield s
    s.close()


@pytest.fixture
def service(db_path: Path) -> Iterator[Service]:
    svc = start_service(db_path)
    yield svc
    svc.stop()


@pytest.fixture
def service_factory(tmp_path: Path) -> Iterator[Callable[..., Service]]:
    started: list[Service] = []

    def factory(db_path: Path | None = None, **kw: Any) -> Service:
        svc = start_service(db_path or tmp_path / "svc.duckdb", **kw)
        started.append(svc)
        return svc

    yield factory
    for svc in started:
        svc.stop()
