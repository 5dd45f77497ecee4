"""Where the dashboard finds the service, and how it behaves: read once per script run.

Precedence: command-line option after ``--`` (``streamlit run dashboard/app.py
-- --url URL --token T``) > environment variable > default.

| setting | option | environment | default |
|---|---|---|---|
| service URL | ``--url`` | ``SHAPEWATCH_URL`` | ``http://127.0.0.1:8000`` |
| bearer token | ``--token`` | ``SHAPEWATCH_TOKEN`` | none |
| alerts auto-refresh, seconds | ``--refresh`` | ``SHAPEWATCH_DASHBOARD_REFRESH`` | 15 |
| author of acks, silences, baselines | | ``SHAPEWATCH_AUTHOR``, else ``USER`` | the login's e-mail when signed in |

>>> load_settings(["--url", "http://svc:8000"], {})
DashboardSettings(url='http://svc:8000', token=None, refresh_seconds=15.0, author='')
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["DEFAULT_URL", "DashboardSettings", "SettingsInvalid", "load_settings"]

DEFAULT_URL = "http://127.0.0.1:8000"


class SettingsInvalid(ValueError):
    def __init__(self, key: str, value: str, fix: str) -> None:
        super().__init__(f"{key}: {value!r} is invalid; {fix}")


@dataclass(frozen=True)
class DashboardSettings:
    url: str = DEFAULT_URL
    token: str | None = None
    refresh_seconds: float = 15.0
    author: str = ""


def load_settings(argv: Sequence[str], env: Mapping[str, str]) -> DashboardSettings:
    """Settings from script arguments (those after ``--`` of ``streamlit run``) and the environment."""
    parser = argparse.ArgumentParser(prog="dashboard/app.py", add_help=False, allow_abbrev=False)
    parser.add_argument("--url")
    parser.add_argument("--token")
    parser.add_argument("--refresh")
    args, _ = parser.parse_known_args(list(argv))
    url = (args.url or env.get("SHAPEWATCH_URL") or DEFAULT_URL).strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise SettingsInvalid("SHAPEWATCH_URL", url, "give the service's URL, e.g. http://127.0.0.1:8000")
    refresh_text = args.refresh or env.get("SHAPEWATCH_DASHBOARD_REFRESH") or "15"
    try:
        refresh = float(refresh_text)
    except ValueError:
        refresh = -1.0
    if not 1 <= refresh <= 3600:
        raise SettingsInvalid("SHAPEWATCH_DASHBOARD_REFRESH", refresh_text, "give seconds between 1 and 3600")
    token = args.token or env.get("SHAPEWATCH_TOKEN") or None
    return DashboardSettings(
        url=url, token=token, refresh_seconds=refresh, author=env.get("SHAPEWATCH_AUTHOR") or env.get("USER") or ""
    )
