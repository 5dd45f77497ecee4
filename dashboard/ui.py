"""What every page shares: the session (settings and API client), cached reads, errors shown as messages.

Reads go through ``st.cache_data`` with a short ttl, keyed by the service URL
and token as well as the route, so switching services never shows stale
answers from another one; every write clears the cache. A failed read never
reaches the page as a traceback: ``run_page`` and ``guard`` turn a
``DashboardError`` into ``st.error`` with what to do about it.

Streamlit reads Markdown in ``st.markdown``, captions, titles, alerts, metric,
expander, tab, button and link labels and ``help`` tooltips, so a value that
came from the service (a model id, a field path, an enum value, a note, an
author, an error message) is put there only through ``literal``: escaped text,
or a code span, that renders as exactly its characters and never as a link, an
image or HTML. Tables (``st.dataframe``), ``st.json``, ``st.text``, select box
options and chart tooltips show text as it is.

>>> def render(s: Session) -> None:                  # doctest: +SKIP
...     st.dataframe(s.read("/v1/cohorts"))
>>> run_page(render)                                 # doctest: +SKIP
"""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn, ParamSpec

import streamlit as st

from .client import ApiClient, AuthRejected, DashboardError, ServiceUnreachable
from .settings import DashboardSettings, SettingsInvalid, load_settings

__all__ = [
    "APP_PATH",
    "READ_TTL",
    "Session",
    "after_write",
    "ago",
    "cohort_label",
    "guard",
    "literal",
    "relative",
    "run_page",
    "session",
    "show_error",
    "show_flash",
]

APP_PATH = Path(__file__).resolve().parent / "app.py"
READ_TTL = 10  # seconds: fresh enough at 3 a.m., cheap enough for a room of reviewers

P = ParamSpec("P")

# Control characters shown as their Unicode control pictures (U+2400 + code, U+2421 for DEL): a
# newline in a value can then start no line or block of the Markdown around it.
_CONTROL_PICTURES = {**{c: 0x2400 + c for c in range(0x20)}, 0x7F: 0x2421}
# Every ASCII punctuation character: CommonMark lets each be backslash-escaped, and between them
# they open every construct there is (links, images, HTML, emphasis, code, tables, headings,
# lists, entities) and Streamlit's own (``:red[...]`` directives, ``:icon:`` shortcodes, ``$`` LaTeX).
_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")
_IDENTIFIER = re.compile(r"[\w.-]+(?: [\w.-]+)*")  # shown as a code span: nothing in it is Markdown there


def literal(value: Any, *, code: bool = False) -> str:
    r"""``value`` as Markdown that Streamlit renders as exactly its characters.

    Every ASCII punctuation character is backslash-escaped and control characters show as their
    pictures (a newline as ␊). With ``code``, a plain identifier (letters, digits, ``_.-`` and
    single spaces) becomes a code span instead; anything else stays escaped text, so no stored
    value reaches the page as raw Markdown, even inside a code span.

    >>> print(literal("![x](http://h/x.png)"))
    \!\[x\]\(http\:\/\/h\/x\.png\)
    >>> print(literal("customer.tier", code=True), literal("a`b", code=True))
    `customer.tier` a\`b
    """
    text = str(value)
    if code and _IDENTIFIER.fullmatch(text):
        return f"`{text}`"
    return _PUNCTUATION.sub(r"\\\1", text.translate(_CONTROL_PICTURES))


@st.cache_data(ttl=READ_TTL, show_spinner=False, max_entries=1000)
def _cached_json(url: str, token: str | None, path: str, params: tuple[tuple[str, Any], ...]) -> Any:
    return ApiClient(url, token).get(path, **dict(params))


@st.cache_data(ttl=READ_TTL, show_spinner=False, max_entries=100)
def _cached_text(url: str, token: str | None, path: str, params: tuple[tuple[str, Any], ...]) -> str:
    return ApiClient(url, token).get_text(path, **dict(params))


def _params(params: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in params.items() if v is not None))


@dataclass(frozen=True)
class Session:
    """One script run's view of the service."""

    settings: DashboardSettings
    api: ApiClient

    def read(self, path: str, **params: Any) -> Any:
        """A JSON GET, cached for ``READ_TTL`` seconds."""
        return _cached_json(self.settings.url, self.settings.token, path, _params(params))

    def text(self, path: str, **params: Any) -> str:
        """A text GET (metrics, reports), cached for ``READ_TTL`` seconds."""
        return _cached_text(self.settings.url, self.settings.token, path, _params(params))

    @property
    def author(self) -> str:
        return str(st.session_state.get("author") or self.settings.author or "").strip()


def _script_args() -> list[str]:
    # Options after ``--`` of ``streamlit run dashboard/app.py``; under a test runner argv is not ours.
    if sys.argv and Path(sys.argv[0]).resolve() == APP_PATH:
        return sys.argv[1:]
    return []


def session() -> Session:
    settings = load_settings(_script_args(), os.environ)
    return Session(settings, ApiClient(settings.url, settings.token))


def show_error(exc: Exception) -> None:
    # The message may quote the service's answer, which may quote a stored value.
    if isinstance(exc, ServiceUnreachable):
        st.error(f"**The service is not reachable.** {literal(exc)}", icon=":material/cloud_off:")
    elif isinstance(exc, AuthRejected):
        st.error(f"**Not authorised.** {literal(exc)}", icon=":material/lock:")
    else:
        st.error(literal(exc), icon=":material/error:")


def run_page(render: Callable[[Session], None]) -> None:
    """Render a page; a service or settings problem becomes a message, never a traceback."""
    try:
        s = session()
    except SettingsInvalid as exc:
        st.error(f"**The dashboard is misconfigured.** {literal(exc)}")
        return
    try:
        render(s)
    except DashboardError as exc:
        show_error(exc)


def guard(fn: Callable[P, None]) -> Callable[P, None]:
    """The same as ``run_page`` for a fragment (which reruns on its own, outside the page's try)."""

    @functools.wraps(fn)
    def wrapped(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            fn(*args, **kwargs)
        except DashboardError as exc:
            show_error(exc)

    return wrapped


def after_write(message: str) -> NoReturn:
    """A write succeeded: forget cached reads, say so on the next run, and rerun now.

    ``message`` is Markdown: values in it go through ``literal``."""
    st.cache_data.clear()
    st.session_state["_flash"] = message
    st.rerun()


def show_flash() -> None:
    message = st.session_state.pop("_flash", None)
    if message:
        st.success(message, icon=":material/check_circle:")


def cohort_label(c: dict[str, Any]) -> str:
    names = f"{c['model']} / {c['prompt_version']} / {c['contract']}"
    source = c.get("source", "production")
    return names if source == "production" else f"[{source}] {names}"


def ago(iso: str | None, now: datetime | None = None) -> str:
    """``2026-11-29 12:00 UTC (3 h ago)``; ``-`` for none."""
    t = _parse(iso)
    if t is None:
        return iso or "-"
    return f"{t.astimezone(UTC):%Y-%m-%d %H:%M} UTC ({relative(iso, now)})"


def _parse(iso: str | None) -> datetime | None:
    try:
        t = datetime.fromisoformat(iso.replace("Z", "+00:00")) if iso else None
    except ValueError:
        return None
    return t.replace(tzinfo=UTC) if t is not None and t.tzinfo is None else t


def relative(iso: str | None, now: datetime | None = None) -> str:
    """``3 h ago``, ``in 2 days``, ``now``; ``-`` for none."""
    t = _parse(iso)
    if t is None:
        return iso or "-"
    seconds = ((now or datetime.now(UTC)) - t).total_seconds()
    span = abs(seconds)
    if span < 90:
        amount = f"{span:.0f} s"
    elif span < 5400:
        amount = f"{span / 60:.0f} min"
    elif span < 172800:
        amount = f"{span / 3600:.0f} h"
    else:
        amount = f"{span / 86400:.0f} days"
    return "now" if span < 5 else f"{amount} ago" if seconds > 0 else f"in {amount}"
