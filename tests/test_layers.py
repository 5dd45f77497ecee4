"""Imports run one way: collector <- baselines <- analysis <- dashboard (README, *Layout*).

Every module is imported as ``shapewatch.<layer>``: parses every module's imports (including ones
inside functions) and fails on an upward import, on a bare top-level name (``import collector``),
which an installed shapewatch does not provide; the dashboard is an HTTP client and imports none
of the others.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
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


# --- SQL over the store's tables stays in the store package ---------------------------------------

STORE_PACKAGE = ROOT / "collector" / "store"
# Uppercase keywords only: prose in docstrings says "from events", SQL here is written in capitals.
_SQL_TABLE = re.compile(r"\b(?:FROM|JOIN|INTO|UPDATE|TABLE)\s+(\w+)")
# Modules that still run SQL over the store's tables, each naming which and why.
SQL_ALLOWED: dict[str, set[str]] = {}


def store_tables() -> set[str]:
    """Every table and view the store's file holds: the collector's and those of the packages'
    schemas, read from their migrations, so a new table is covered without editing this test."""
    from shapewatch.analysis.store_access import SCHEMAS
    from shapewatch.collector.store import MIGRATIONS, tables_of

    return tables_of(MIGRATIONS).union(*(tables_of(s.migrations) for s in SCHEMAS))


def _sql_tables(path: Path, tables: set[str]) -> set[str]:
    """The store tables named by SQL in the string constants of ``path`` (f-string parts too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.update(m.group(1).lower() for m in _SQL_TABLE.finditer(node.value))
    return found & tables


def test_store_tables_are_read_from_the_schemas() -> None:
    tables = store_tables()
    assert {"events", "event_keys", "cohorts", "cohort_events", "field_rollups", "contract_versions"} <= tables
    assert {"baselines", "alerts", "analyzer_runs", "notifications"} <= tables
    assert "events_unkeyed" not in tables  # renamed to events by a migration


def test_no_sql_over_store_tables_outside_the_store() -> None:
    tables = store_tables()
    files = [f for layer in ORDER for f in _files(layer) if STORE_PACKAGE not in f.parents]
    found = {str(f.relative_to(ROOT)): _sql_tables(f, tables) for f in files}
    bad = {f: sorted(t - SQL_ALLOWED.get(f, set())) for f, t in found.items()}
    assert {f: t for f, t in bad.items() if t} == {}
    # an allowance nobody needs any more goes
    stale = {f: sorted(allowed - found.get(f, set())) for f, allowed in SQL_ALLOWED.items()}
    assert {f: t for f, t in stale.items() if t} == {}


def test_sql_checker_catches_a_planted_query(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        'Q = """SELECT count(*) FROM cohort_buckets b JOIN cohorts USING (cohort_id)"""\n'
        'def f(t):\n    return f"DELETE FROM events WHERE ts < {t}"\n'
        '"""Counts read from events, joined to cohorts."""\n'  # prose: not SQL
        'X = "INSERT INTO scratch VALUES (1)"\n'  # not a store table
    )
    assert _sql_tables(module, store_tables()) == {"cohort_buckets", "cohorts", "events"}


# --- no import cycle among shapewatch's modules -----------------------------------------------------


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["shapewatch", *parts])


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(tree: ast.AST, *, in_functions: bool = True) -> list[ast.Import | ast.ImportFrom]:
    """Imports that can run (module level or, with ``in_functions``, inside functions);
    ``if TYPE_CHECKING:`` blocks never do."""
    out: list[ast.Import | ast.ImportFrom] = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if not in_functions and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            out.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return out


def import_graph(files: dict[str, Path], lazy_allowed: Iterable[str] = ()) -> dict[str, set[str]]:
    """Module -> the shapewatch modules it imports, for ``files`` ({module name: path}); imports
    inside functions count too (a cycle all the same), except in the modules of ``lazy_allowed``."""
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in _runtime_imports(tree, in_functions=name not in lazy_allowed):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = package
                for _ in range(node.level - 1 if node.level else 0):
                    base = base.rpartition(".")[0]
                module = node.module if node.level == 0 else ".".join(p for p in (base, node.module) if p)
                assert module is not None
                # ``from pkg import name``: the submodule pkg.name when there is one, else pkg
                targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in files else module for a in node.names]
            edges.update(t for t in targets if t in files and t != name)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (its modules in order, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


# Modules whose imports inside functions the cycle check leaves out, each with why.
LAZY_IMPORTS_ALLOWED: dict[str, str] = {}


def test_no_import_cycle() -> None:
    files = {_module_name(f): f for layer in ORDER for f in _files(layer)}
    graph = import_graph(files, LAZY_IMPORTS_ALLOWED)
    assert "shapewatch.collector.contracts" in graph["shapewatch.collector.store.core"]  # edges are found
    assert find_cycle(graph) is None


def test_cycle_checker_catches_a_planted_cycle(tmp_path: Path) -> None:
    pkg = tmp_path / "collector"
    (pkg / "store").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import x\n")
    (pkg / "a.py").write_text("from .store import core\n")
    (pkg / "store" / "__init__.py").write_text("")
    (pkg / "store" / "core.py").write_text("def f():\n    from ..a import y\n")  # inside a function: still a cycle
    names = {
        "shapewatch.collector": pkg / "__init__.py",
        "shapewatch.collector.a": pkg / "a.py",
        "shapewatch.collector.store": pkg / "store" / "__init__.py",
        "shapewatch.collector.store.core": pkg / "store" / "core.py",
    }
    graph = import_graph(names)
    assert graph == {
        "shapewatch.collector": set(),  # TYPE_CHECKING imports never run
        "shapewatch.collector.a": {"shapewatch.collector.store.core"},
        "shapewatch.collector.store": set(),
        "shapewatch.collector.store.core": {"shapewatch.collector.a"},
    }
    assert find_cycle(graph) == ["shapewatch.collector.a", "shapewatch.collector.store.core", "shapewatch.collector.a"]
    assert find_cycle(import_graph(names, ["shapewatch.collector.store.core"])) is None  # its lazy import allowed
    (pkg / "store" / "core.py").write_text("")
    assert find_cycle(import_graph(names)) is None
