"""What an application gets from ``pip install shapewatch`` with no extras: the SDK and nothing else.

A fresh virtual environment installs a copy of the checkout (its tracked files, the namespace
links included) without extras; there ``from shapewatch import Client`` works, none of the
service's or the dashboard's heavy dependencies is installed, the bare layer names do not
import, the ``shapewatch`` command says which extra it needs, and the SDK records outputs into a
real service (started from the project's own environment) that stores each of them as sent.

The install tests are slow (a virtual environment and a package install): ``make test-slow``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from harness import ROOT, start_service

HEAVY = ["duckdb", "streamlit", "pandas", "scipy", "fastapi", "uvicorn", "pyarrow", "apscheduler"]


def _copy_checkout(dest: Path) -> Path:
    """The tracked files of the working tree (links kept as links), as a fresh clone would have them."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        src = ROOT / name
        if not src.exists() and not src.is_symlink():
            continue  # deleted in the working tree, not yet committed
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            target.symlink_to(src.readlink())
        else:
            shutil.copy2(src, target)
    return dest


def _install(base: Path, env: dict[str, str] | None = None) -> tuple[Path, str]:
    """A fresh venv with a copy of the checkout installed, no extras; its python and pip's output."""
    checkout = _copy_checkout(base / "checkout")
    env_dir = base / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    out = subprocess.run(
        [str(python), "-m", "pip", "install", "-v", "--disable-pip-version-check", str(checkout)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return python, out.stdout + out.stderr


@pytest.fixture(scope="module")
def sdk_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _install(tmp_path_factory.mktemp("sdk-install"))[0]


@pytest.fixture(scope="module")
def sdk_without_compiler(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The same install where no C compiler works: the accelerator cannot be built."""
    return _install(tmp_path_factory.mktemp("sdk-no-cc"), {"CC": "false", "CXX": "false", "LDSHARED": "false"})


def _run(python: Path, code: str, **kw: object) -> subprocess.CompletedProcess[str]:
    # Run outside the checkout, so that nothing resolves from the source tree.
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd="/", timeout=120, **kw)  # type: ignore[call-overload]


@pytest.mark.slow
def test_the_sdk_installs_alone(sdk_python: Path) -> None:
    out = _run(sdk_python, "from shapewatch import Client, __version__; print(Client.__module__, __version__)")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["shapewatch.collector.sdk", "0.1.0"]
    listed = subprocess.run(
        [str(sdk_python), "-m", "pip", "list", "--format=json"], capture_output=True, text=True, check=True
    )
    installed = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert {"shapewatch", "httpx", "orjson"} <= installed
    assert sorted(installed & set(HEAVY)) == []


@pytest.mark.slow
@pytest.mark.parametrize("name", ["analysis", "collector", "baselines", "dashboard"])
def test_no_generic_import_names(sdk_python: Path, name: str) -> None:
    out = _run(sdk_python, f"import {name}")
    assert out.returncode == 1
    assert f"ModuleNotFoundError: No module named '{name}'" in out.stderr


@pytest.mark.slow
def test_the_command_names_the_extra_it_needs(sdk_python: Path) -> None:
    out = subprocess.run([str(sdk_python.parent / "shapewatch"), "--version"], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr == (
        "shapewatch: the command line needs the service extra (click is not installed): "
        "pip install 'shapewatch[service]' (or 'shapewatch[all]' for the dashboard too)\n"
    )


SDK_SCRIPT = """
import json, sys
from shapewatch import Client
client = Client(sys.argv[1], spill_dir=sys.argv[2])
ids = [client.record({"intent": "refund", "n": i, "tags": ["a"] * (i % 3)}, model="sdk-install-model",
                     prompt_version="p1", contract="intake") for i in range(40)]
delivered = client.flush(timeout=60)
client.close()
print(json.dumps({"ids": ids, "delivered": delivered, "stats": client.stats}))
"""


@pytest.mark.slow
def test_without_a_compiler_the_install_warns_and_the_twin_runs(sdk_without_compiler: tuple[Path, str]) -> None:
    python, log = sdk_without_compiler
    assert "*** shapewatch: the C accelerator (" in log
    assert ") could not be built: " in log
    assert "installed with its pure-Python twin" in log
    out = _run(python, "from shapewatch.collector.accel import IMPLEMENTATION; print(IMPLEMENTATION)")
    assert out.returncode == 0, out.stderr
    assert out.stdout == "python\n"
    assert "the C accelerator is not built" in out.stderr
    built = _run(python, "import shapewatch.collector._speedups")
    assert "No module named 'shapewatch.collector._speedups'" in built.stderr


@pytest.mark.slow
@pytest.mark.parametrize("with_c", [True, False], ids=["accelerated", "pure-python"])
def test_the_sdk_records_into_a_running_service(with_c: bool, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    sdk_python: Path = (
        request.getfixturevalue("sdk_python") if with_c else request.getfixturevalue("sdk_without_compiler")[0]
    )
    svc = start_service(tmp_path / "sdk.duckdb")
    try:
        out = subprocess.run(
            [str(sdk_python), "-c", SDK_SCRIPT, svc.url, str(tmp_path / "spill")],
            capture_output=True,
            text=True,
            cwd="/",
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        sent = json.loads(out.stdout)
        assert sent["delivered"] is True
        assert {k: sent["stats"][k] for k in ("recorded", "sent", "rejected", "dropped", "spilled")} == {
            "recorded": 40,
            "sent": 40,
            "rejected": 0,
            "dropped": 0,
            "spilled": 0,
        }
        with svc.client() as http:
            stored = http.get("/v1/events", params={"ids": sent["ids"]}).json()
        by_id = {e["event_id"]: e for e in stored}
        assert sorted(by_id) == sorted(sent["ids"])
        for n, event_id in enumerate(sent["ids"]):
            event = by_id[event_id]
            assert event["output"] == {"intent": "refund", "n": n, "tags": ["a"] * (n % 3)}
            assert event["cohort"] == {"model": "sdk-install-model", "prompt_version": "p1", "contract": "intake"}
    finally:
        svc.stop()


def test_version_from_the_command_line() -> None:
    from shapewatch.collector.accel import IMPLEMENTATION

    out = subprocess.run([sys.executable, "-m", "shapewatch", "--version"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"shapewatch 0.1.0 (accelerator: {IMPLEMENTATION})\n"


def test_every_package_folder_is_installed() -> None:
    """Setuptools installs the packages pyproject.toml lists, no others: a package folder left off
    the list is missing from every install but an editable one (collector/store and
    analysis/probes were, so ``shapewatch serve`` failed to import in an installed copy)."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {"shapewatch"} | {
        "shapewatch." + ".".join(init.parent.relative_to(ROOT).parts)
        for top in ("collector", "baselines", "analysis", "dashboard")
        for init in (ROOT / top).rglob("__init__.py")
    }
    assert listed == found
