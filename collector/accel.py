"""The accelerator seam: one interface (``_speedups.pyi``), two implementations.

``speedups`` is the C extension ``_speedups`` when it was built, else its pure-Python twin
``_pyspeedups``, which gives the same results about ten times more slowly (an envelope scanned, an
output counted: tens of microseconds instead of a few). Every module that needs the hot loops
(envelope scanning, the SDK's walk, rollup accumulation, Arrow columns) imports them from here and
never from either implementation, so the choice is made once per process.

``SHAPEWATCH_ACCEL`` picks: ``auto`` (the default: C, falling back to Python with a warning),
``c`` (C or fail) or ``python`` (the twin; the test suite runs the accelerator-dependent suites
both ways).
"""

from __future__ import annotations

import logging
import os
from types import ModuleType
from typing import TYPE_CHECKING

log = logging.getLogger(__name__)

MODES = ("auto", "c", "python")


def _load(mode: str) -> tuple[ModuleType, str]:
    if mode not in MODES:
        raise ImportError(f"SHAPEWATCH_ACCEL: {mode!r} is not one of {', '.join(MODES)}")
    if mode == "python":
        from . import _pyspeedups

        return _pyspeedups, "python"
    try:
        from . import _speedups
    except ImportError as exc:
        if mode == "c":
            raise ImportError(f"SHAPEWATCH_ACCEL=c but the C accelerator is not built: {exc}") from exc
        log.warning(
            "shapewatch: the C accelerator is not built (%s); running the pure-Python twin, "
            "which gives the same results about ten times slower (reinstall with a C compiler to fix)",
            exc,
        )
        from . import _pyspeedups

        return _pyspeedups, "python"
    return _speedups, "c"


if TYPE_CHECKING:
    from . import _speedups as speedups

    IMPLEMENTATION: str
else:
    speedups, IMPLEMENTATION = _load(os.environ.get("SHAPEWATCH_ACCEL", "auto").strip().lower() or "auto")

__all__ = ["IMPLEMENTATION", "MODES", "speedups"]
