"""``/docs`` in a real browser with the network off: headless Chromium renders Swagger UI from the
service's own files, and shows every operation of ``/openapi.json``.

Chromium resolves no host name but 127.0.0.1 (``--host-resolver-rules``), and its network log
shows every request the page made: each one goes to the service. A page that fetched its
scripts from a CDN would render nothing here, and name the CDN in the log.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from harness import ensure_tool, start_service

CHROMIUM = ensure_tool("chromium")  # installed from Debian by the test when missing

# No background requests of the browser's own (updates, sync, sign-in): the log then holds the page's.
QUIET = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-domain-reliability",
    "--disable-client-side-phishing-detection",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",  # one argument: no shell strips quotes
    "--virtual-time-budget=20000",
]


def page_requests(net_log: Path, origin: str) -> set[str]:
    """The URLs of the requests the page at ``origin`` started (its network isolation key is the
    page's site; the browser's own requests carry none of it)."""
    raw = net_log.read_text()
    log, _ = json.JSONDecoder().raw_decode(raw)  # a log cut at exit may lack its closing brackets
    urls = set()
    for event in log["events"]:
        params: dict[str, Any] = event.get("params") or {}
        if "url" in params and params.get("initiator") == origin:
            urls.add(str(params["url"]))
    return urls


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium) on PATH")
def test_docs_render_every_operation_without_the_network(tmp_path: Path) -> None:
    assert CHROMIUM is not None
    svc = start_service(tmp_path / "docs.duckdb", env={"SHAPEWATCH_TOKENS": "docs-token"})
    try:
        html = httpx.get(svc.url + "/docs").text
        # No Redoc: its bundle draws its logo from its vendor's CDN whatever it is told.
        assert httpx.get(svc.url + "/redoc").status_code == 404
        spec = httpx.get(svc.url + "/openapi.json").json()
        net_log = tmp_path / "net.json"
        dom = subprocess.run(
            [CHROMIUM, *QUIET, f"--log-net-log={net_log}", "--dump-dom", svc.url + "/docs"],
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout
    finally:
        svc.stop()
    # The page itself names local paths only.
    assert re.findall(r"""(?:src|href|url)\s*[:=]\s*['"]([^'"]*)""", html) == [
        "/docs/assets/swagger-ui.css",
        "/docs/assets/favicon.png",
        "/docs/assets/swagger-ui-bundle.js",
        "/openapi.json",
    ]
    assert page_requests(net_log, svc.url) == {
        svc.url + path
        for path in (
            "/docs/assets/swagger-ui.css",
            "/docs/assets/swagger-ui-bundle.js",
            "/docs/assets/favicon.png",
            "/openapi.json",
        )
    }
    # Swagger UI gives each operation the element id operations-<tag>-<operationId>.
    rendered = set(re.findall(r'id="operations-([a-z]+)-([a-z_]+)"', dom)) - {("tag", t["name"]) for t in spec["tags"]}
    documented = {(op["tags"][0], op["operationId"]) for ops in spec["paths"].values() for op in ops.values()}
    assert (
        len(documented) == 42
    )  # with incidents, runbooks, probes, compare, the contracts diff and usage, and a silence ending early
    assert rendered == documented
    assert "Unable to render this definition" not in dom
