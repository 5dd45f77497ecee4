"""The shared test helpers (tests/harness.py: a real service in a subprocess, envelopes, Debian
tools) for the reliability suite, with tests/ put on the import path."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "tests") not in sys.path:
    sys.path.insert(0, str(ROOT / "tests"))

from harness import SHAPEWATCH, Service, ensure_tool, free_port, make_envelope, start_service  # noqa: E402

__all__ = ["ROOT", "SHAPEWATCH", "Service", "ensure_tool", "free_port", "make_envelope", "start_service"]
