"""Imports run one way: collector <- baselines <- analysis <- dashboard (README, *Layout*).

Every module is imported as ``shapewatch.<layer>``: parses every module's imports (including ones
inside functions) and fails on an upward import, on a bare top-level name (``import collector``),
which an installed shapewatch does not provide; the dashboard is an HTTP client and imports none
of the others.
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
SOURCES = [*ORDER, "tests", "reliability", "bench"]


def _modules(path: Path) -> set[str]:
    """Every absolute module name ``path`` imports."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def _imports(path: Path) -> set[str]:
    """The layers ``path`` imports, as ``shapewatch.<layer>``."""
    layers = set()
    for name in _modules(path):
        parts = name.split(".")
        if parts[0] == "shapewatch" and len(parts) > 1 and parts[1] in ORDER:
            layers.add(parts[1])
    return layers


def _bare(path: Path) -> set[str]:
    """Layers imported under their bare folder name, which only a source checkout resolves."""
    return {name.split(".")[0] for name in _modules(path)} & set(ORDER)


def _files(folder: str) -> list[Path]:
    return sorted(p for p in (ROOT / folder).rglob("*.py") if not p.is_symlink())


@pytest.mark.parametrize("package", ORDER)
def test_package_imports_only_lower_layers(package: str) -> None:
    files = _files(package)
    assert files, f"no modules found in {package}"
    bad = {str(f.relative_to(ROOT)): sorted(_imports(f) - ALLOWED[package] - {package}) for f in files}
    assert {f: b for f, b in bad.items() if b} == {}


def test_nothing_imports_a_bare_layer_name() -> None:
    files = [f for folder in SOURCES for f in _files(folder)] + sorted((ROOT / "shapewatch").glob("*.py"))
    assert len(files) > 100
    bad = {str(f.relative_to(ROOT)): sorted(_bare(f)) for f in files}
    assert {f: b for f, b in bad.items() if b} == {}


def test_the_namespace_links_every_layer() -> None:
    links = {p.name: p.readlink() for p in (ROOT / "shapewatch").iterdir() if p.is_symlink()}
    assert links == {layer: Path("..") / layer for layer in ORDER}


def test_layer_checker_catches_an_upward_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from shapewatch.analysis import service\n    import shapewatch.baselines.x\n")
    assert _imports(module) == {"analysis", "baselines"}
    module.write_text("import collector.store\nfrom analysis import cli\nimport shapewatch.collector\n")
    assert _bare(module) == {"collector", "analysis"}
