"""The test helpers of ``tests/conftest.py`` (real service in a subprocess, envelopes, Debian
tools), loaded under their own module name so the two conftest modules never shadow each other."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_spec = importlib.util.spec_from_file_location("_shapewatch_test_conftest", ROOT / "tests" / "conftest.py")
assert _spec is not None and _spec.loader is not None
_tc = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _tc  # dataclasses look their module up while the class is built
_spec.loader.exec_module(_tc)

SHAPEWATCH = _tc.SHAPEWATCH
Service = _tc.Service
start_service = _tc.start_service
free_port = _tc.free_port
make_envelope = _tc.make_envelope
ensure_tool = _tc.ensure_tool

__all__ = ["ROOT", "SHAPEWATCH", "Service", "ensure_tool", "free_port", "make_envelope", "start_service"]
