"""The shared test helpers (tests/harness.py: a real service in a subprocess, envelopes, Debian
tools) for the reliability suite, with tests/ and tests/analysis/ (drift_outputs, pager_receiver)
put on the import path."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for _helpers in (ROOT / "tests" / "analysis", ROOT / "tests"):  # harness; drift_outputs, pager_receiver
    if str(_helpers) not in sys.path:
        sys.path.insert(0, str(_helpers))

from harness import SHAPEWATCH, Service, ensure_tool, free_port, make_envelope, start_service  # noqa: E402

__all__ = ["ROOT", "SHAPEWATCH", "Service", "ensure_tool", "free_port", "make_envelope", "start_service"]
