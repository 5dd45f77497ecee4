"""Imports run one way: collector <- baselines <- analysis <- dashboard (README, *Layout*).

Parses every module's imports (including ones inside functions) and fails on an
upward import; the dashboard is an HTTP client and imports none of the others.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ORDER = ["collector", "baselines", "analysis", "dashboard"]
ALLOWED = {
    "collector": set(),
    "baselines": {"collector"},
    "analysis": {"collector", "baselines"},
    "dashboard": set(),  # talks to the service over HTTP only
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found & set(ORDER)


@pytest.mark.parametrize("package", ORDER)
def test_package_imports_only_lower_layers(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"no modules found in {package}"
    bad = {str(f.relative_to(ROOT)): sorted(_imports(f) - ALLOWED[package] - {package}) for f in files}
    assert {f: b for f, b in bad.items() if b} == {}


def test_layer_checker_catches_an_upward_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from analysis import service\n    import baselines.x\n")
    assert _imports(module) == {"analysis", "baselines"}
