"""Test modules are imported by basename (pytest's prepend mode, which lets tests import their
helpers, such as ``from synth import ...``): two test files with one name, in tests/ or
reliability/, break collection."""

from __future__ import annotations

from collections import Counter
from pathlib import Path


def test_no_two_test_modules_share_a_name() -> None:
    root = Path(__file__).parent.parent
    names = Counter(p.name for d in ("tests", "reliability") for p in (root / d).rglob("test_*.py"))
    assert [n for n, count in names.items() if count > 1] == []
