"""deploy/prometheus/rules.yml is valid (promtool) and names only metrics the service exports."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from harness import ensure_tool
from prometheus_client import CollectorRegistry, generate_latest

from shapewatch.analysis.service import create_app
from shapewatch.collector import load_settings

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "rules.yml"


@pytest.mark.skipif(
    ensure_tool("promtool") is None, reason="promtool missing and not installable here (Debian package prometheus)"
)
def test_promtool_accepts_the_rules() -> None:
    out = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 7 rules found" in out.stdout


def test_the_rules_name_only_metrics_the_service_exports(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    settings = load_settings({"db_path": str(tmp_path / "x.duckdb")}, env={})
    app = create_app(settings, registry=registry, analyze=False)
    try:
        exported = {
            line.split(" ")[2] for line in generate_latest(registry).decode().splitlines() if line.startswith("# TYPE")
        }
        exported |= {f"{name}_total" for name in exported}
        used = set(re.findall(r"shapewatch_[a-z_]+", RULES.read_text()))
        assert used, "the rules name no shapewatch metric"
        assert used <= exported, f"rules use metrics nobody exports: {sorted(used - exported)}"
    finally:
        app.state.notifier.close()
        app.state.store.close()
