"""Builds the optional C accelerator (collector/_speedups_src/); everything else is in pyproject.toml.

The accelerator is optional: when it cannot be built (no C compiler, no Python headers), the
install goes on without it and says so, and shapewatch runs its pure-Python twin
(``shapewatch.collector.accel``), which gives the same results more slowly. Set
``SHAPEWATCH_REQUIRE_SPEEDUPS=1`` to make a failed build fail the install instead (CI does).
"""

from __future__ import annotations

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

WARNING = """
*** shapewatch: the C accelerator (collector/_speedups_src/) could not be built: {error}
*** shapewatch is installed with its pure-Python twin: the same results, bulk import and
*** ingest several times slower. Install a C compiler and the Python headers
*** (Debian: apt-get install gcc python3-dev) and reinstall to get the accelerator.
"""


class OptionalBuildExt(build_ext):
    """build_ext that warns instead of failing, unless SHAPEWATCH_REQUIRE_SPEEDUPS is set."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:
            self._fallback(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            self._fallback(exc)

    def _fallback(self, exc: Exception) -> None:
        if os.environ.get("SHAPEWATCH_REQUIRE_SPEEDUPS") == "1":
            raise exc
        sys.stderr.write(WARNING.format(error=exc))


setup(
    ext_modules=[
        Extension(
            "shapewatch.collector._speedups",
            # one extension from the files of collector/_speedups_src/ (not a folder named
            # _speedups: without the built module, Python would import it as an empty namespace
            # package instead of failing over to the pure-Python twin)
            [f"collector/_speedups_src/{name}.c" for name in ("module", "json", "envelope", "time", "rollup", "arrow")],
            depends=["collector/_speedups_src/speedups.h", "collector/_speedups_src/rules.h"],
            # SHAPEWATCH_SPEEDUPS_CFLAGS replaces the optimisation flags: .ci/sanitize builds with the
            # address and undefined-behaviour sanitizers at -O1 (a later -O2 would override it)
            extra_compile_args=["-fvisibility=hidden", *os.environ.get("SHAPEWATCH_SPEEDUPS_CFLAGS", "-O2").split()],
            extra_link_args=os.environ.get("SHAPEWATCH_SPEEDUPS_LDFLAGS", "").split(),
            optional=True,
        )
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
