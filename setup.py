"""Builds the one C extension (collector/_speedups.c); everything else is in pyproject.toml."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("collector._speedups", ["collector/_speedups.c"], extra_compile_args=["-O2"])])
