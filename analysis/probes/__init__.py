"""Probe suites: a small fixed set of cases run against a pinned model, scored on the first
decision, their outputs recorded as ``source=probe`` (README, "Probes and shadows").

- ``suite.py``: the suite file (TOML), parsed and checked;
- ``providers.py``: the requests of each provider, retries and pacing;
- ``runner.py``: one run, its first decisions and scores, and how it is recorded;
- ``scores.py``: the checks the analyzer judges each suite's newest run by.
"""

from __future__ import annotations

from .runner import SCORES, CaseResult, ProbeRun, Score, record_run, run_suite
from .suite import Case, Expected, Match, Suite, SuiteInvalid, load_suite, parse_suite

__all__ = [
    "SCORES",
    "Case",
    "CaseResult",
    "Expected",
    "Match",
    "ProbeRun",
    "Score",
    "Suite",
    "SuiteInvalid",
    "load_suite",
    "parse_suite",
    "record_run",
    "run_suite",
]
