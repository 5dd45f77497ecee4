"""The accelerator seam (``collector/accel.py``): one interface, ``_speedups.pyi``, and two
implementations of it, the C extension and its pure-Python twin.

Both must expose exactly what the interface declares (so the two cannot drift apart unnoticed),
and a process without the C extension must still run, on the twin, saying so once. The answers
of the two are held together in test_accel_twin.py, and the suites that use the accelerator run
against each (``make test`` runs them a second time with SHAPEWATCH_ACCEL=python).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from harness import ROOT

from shapewatch.collector import _pyspeedups, accel

STUB = ROOT / "collector" / "_speedups.pyi"


def _declared(path: Path) -> tuple[dict[str, int], dict[str, int]]:
    """The interface: module functions and Acc's methods, each with its number of positional-only
    parameters (self left out)."""
    functions: dict[str, int] = {}
    methods: dict[str, int] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef):
            functions[node.name] = len(node.args.posonlyargs)
        elif isinstance(node, ast.ClassDef):
            functions[node.name] = -1
            for item in node.body:
                if isinstance(item, ast.FunctionDef):  # the overloads of rows() name it twice
                    methods[item.name] = len(item.args.posonlyargs + item.args.args) - 1
    return functions, methods


FUNCTIONS, METHODS = _declared(STUB)


def test_the_interface_is_what_the_callers_use() -> None:
    """The stub parsed as the tests below read it (a stub that no longer parsed into these names
    would make them vacuous)."""
    assert FUNCTIONS == {
        "walk": 5,
        "count_keys": 1,
        "item_spans": 1,
        "string_column": 2,
        "epoch_micros": 2,
        "bucket_starts": 2,
        "group_ids": 4,
        "set_ts_range": 2,
        "check_envelope": 6,
        "scan_envelope": 6,
        "scan_lines": 15,
        "scan_items": 11,
        "Acc": -1,
    }
    assert METHODS == {
        "__init__": 2,
        "add": 2,
        "add_many": 2,
        "add_json": 2,
        "counts": 0,
        "count_rows": 0,
        "value_rows": 0,
        "rows": 1,
    }


def _implementations() -> list[ModuleType]:
    found = [_pyspeedups]
    try:
        found.append(importlib.import_module("shapewatch.collector._speedups"))
    except ImportError:  # not built here: the twin alone is checked (and the suites run on it)
        pass
    return found


@pytest.mark.parametrize("impl", _implementations(), ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_each_implementation_exposes_exactly_the_declared_names(impl: ModuleType) -> None:
    exported = set(getattr(impl, "__all__", None) or {n for n in dir(impl) if not n.startswith("_")})
    assert exported == set(FUNCTIONS)
    assert all(callable(getattr(impl, name)) for name in FUNCTIONS)
    acc = impl.Acc
    assert {n for n in dir(acc) if not n.startswith("_")} == set(METHODS) - {"__init__"}
    assert all(callable(getattr(acc, name)) for name in METHODS)


def test_the_twin_takes_the_declared_parameters_by_position_only() -> None:
    """The C functions take their arguments by position only (the stub's ``/``): the twin too,
    so a caller that passed one by name would fail on both, not on one."""
    for name, count in FUNCTIONS.items():
        target = _pyspeedups.Acc.__init__ if name == "Acc" else getattr(_pyspeedups, name)
        params = list(inspect.signature(target).parameters.values())[1 if name == "Acc" else 0 :]
        want = METHODS["__init__"] if name == "Acc" else count
        assert [p.kind for p in params] == [inspect.Parameter.POSITIONAL_ONLY] * want, name
    for name, count in METHODS.items():
        params = list(inspect.signature(getattr(_pyspeedups.Acc, name)).parameters.values())[1:]
        assert [p.kind for p in params] == [inspect.Parameter.POSITIONAL_ONLY] * count, name


def test_the_implementation_in_use_is_the_one_asked_for() -> None:
    mode = os.environ.get("SHAPEWATCH_ACCEL", "auto").strip().lower() or "auto"
    if mode == "python":
        assert (accel.IMPLEMENTATION, accel.speedups) == ("python", _pyspeedups)
    elif accel.IMPLEMENTATION == "c":
        assert accel.speedups is sys.modules["shapewatch.collector._speedups"]
    else:  # auto without a built extension
        assert (mode, accel.speedups) == ("auto", _pyspeedups)


# --- a process without the C extension -------------------------------------------------------------------

# A child process in which the C module cannot be imported (None in sys.modules makes every import
# of it raise ImportError, as a missing or broken build does), then parses an envelope and counts it.
_CHILD = """
import sys
sys.modules["shapewatch.collector._speedups"] = None
from shapewatch.collector import accel
from shapewatch.collector.envelope import LIMITS, parse_envelope
from shapewatch.collector.rollup import RollupBatch, RollupConfig
env = parse_envelope(b'{"model": "m", "prompt_version": "p", "output": {"a": [1, "x"]}}', LIMITS)
batch = RollupBatch(RollupConfig(), bucket_seconds=60)
batch.add(env.output_json, (env.model, env.prompt_version, env.contract, "production"), env.ts)
print(accel.IMPLEMENTATION, accel.speedups.__name__, env.output_json, batch.tables()[1].num_rows)
"""
_BLOCKED = "import of shapewatch.collector._speedups halted; None in sys.modules"


def _child(mode: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SHAPEWATCH_ACCEL"}
    if mode is not None:
        env["SHAPEWATCH_ACCEL"] = mode
    return subprocess.run(
        [sys.executable, "-c", _CHILD], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize("mode", [None, "auto", " AUTO "])
def test_auto_falls_back_to_the_twin_with_one_warning_when_the_c_module_cannot_be_imported(mode: str | None) -> None:
    done = _child(mode)
    assert done.returncode == 0, done.stderr
    # the twin parsed and counted: the output text, and rows for a, a[] (integer and string)
    assert done.stdout.split() == ["python", "shapewatch.collector._pyspeedups", '{"a":[1,"x"]}', "2"]
    assert done.stderr.splitlines() == [
        f"shapewatch: the C accelerator is not built ({_BLOCKED}); running the pure-Python twin, "
        "which gives the same results about ten times slower (reinstall with a C compiler to fix)"
    ]


def test_asking_for_the_c_accelerator_when_it_cannot_be_imported_fails_naming_why() -> None:
    done = _child("c")
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        f"ImportError: SHAPEWATCH_ACCEL=c but the C accelerator is not built: {_BLOCKED}"
    )
    assert done.stdout == ""


def test_an_unknown_mode_is_refused_naming_the_known_ones() -> None:
    done = _child("fast")
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == "ImportError: SHAPEWATCH_ACCEL: 'fast' is not one of auto, c, python"


def test_python_mode_runs_the_twin_without_a_warning() -> None:
    done = _child("python")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["python", "shapewatch.collector._pyspeedups", '{"a":[1,"x"]}', "2"]
    assert done.stderr == ""
