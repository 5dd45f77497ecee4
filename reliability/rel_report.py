"""The written report of the reliability suite: one section per scenario, its figures and outcome."""

from __future__ import annotations

import platform
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import duckdb


@dataclass
class _Entry:
    nodeid: str
    title: str
    figures: dict[str, object]
    outcome: Callable[[], str]  # read at render time: the call report arrives after teardown starts


@dataclass
class Report:
    entries: list[_Entry] = field(default_factory=list)

    def record(self, nodeid: str, title: str, figures: dict[str, object], outcome: Callable[[], str]) -> None:
        self.entries.append(_Entry(nodeid, title, figures, outcome))

    def render(self, exitstatus: int) -> str:
        try:
            commit = subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
            ).stdout.strip()
        except OSError:
            commit = "?"
        outcomes = [e.outcome() for e in self.entries]
        lines = [
            "# Reliability report",
            "",
            "Written by `make reliability` (reliability/conftest.py); do not edit by hand.",
            "",
            f"- run: {datetime.now(UTC).isoformat(timespec='seconds')}, commit {commit or '?'}",
            f"- machine: {platform.machine()}, {_cpus()} CPUs, Python {platform.python_version()}, "
            f"DuckDB {duckdb.__version__}",
            f"- scenarios: {len(self.entries)}; passed {outcomes.count('passed')}, "
            f"failed {outcomes.count('failed')}, skipped {outcomes.count('skipped')} "
            f"(pytest exit status {exitstatus})",
            "",
        ]
        for entry, outcome in zip(self.entries, outcomes, strict=True):
            lines += [f"## {entry.title}", "", f"`{entry.nodeid}`: **{outcome}**", ""]
            if entry.figures:
                lines += ["| figure | value |", "|---|---|"]
                lines += [f"| {k} | {_fmt(v)} |" for k, v in entry.figures.items()]
                lines.append("")
        return "\n".join(lines)


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 0)


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:,.3f}" if abs(v) < 1000 else f"{v:,.0f}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v).replace("|", "\\|").replace("\n", " ")
