"""Keeping the values of free-text and redacted paths out of everything shapewatch stores or shows.

Two kinds of path have values nobody should read off a chart, a baseline or a report:

- **free text**: ids, names, e-mail addresses, sentences. A path holds free text over a window
  (``holds_free_text``) when its short strings are many and rarely repeated (more than
  ``FREE_TEXT_DISTINCT`` distinct values, fewer than ten outputs per value on average), or when
  any of them looks like an e-mail address. Its values serve no enum rule; they are left out of
  baseline documents (``withhold_free_text``), of the dashboard's routes and of the review, and
  masked in sample outputs (``mask_output``).
- **redacted**: the paths an operator names in the ``redact_paths`` setting
  (``RedactPatterns``). Their values are never stored at all in rollups: a merge drops them
  before anything is written (store/merge.py) and counts them as overflow, so presence and
  type shares still count.

>>> RedactPatterns.parse(["customer.email", "*.phone"]).matches("billing.contact.phone")
True
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from .errors import SettingsInvalid
from .flatten import items_path, join_key

if TYPE_CHECKING:  # profile.py reads the store, whose merge imports this module
    from .profile import FieldProfile

__all__ = [
    "FREE_TEXT_DISTINCT",
    "MASK",
    "MAX_REDACT_PATTERNS",
    "RedactPatterns",
    "holds_free_text",
    "looks_personal",
    "mask_output",
    "withhold_free_text",
]

# More distinct values than this over a window is free text unless they repeat (the analyzer's
# enum rule calls more than 50 distinct values free text as well: analysis/config.py).
FREE_TEXT_DISTINCT = 50
MAX_REDACT_PATTERNS = 100
MAX_PATTERN_LENGTH = 1000
MASK = "[withheld]"  # what a sample output shows in place of a free-text or redacted string

# An e-mail address anywhere in a value: personal data whatever the path's other values look like.
_EMAIL = re.compile(r"[^\s@<>()\[\]\\,;:\"]+@[^\s@<>()\[\]\\,;:\"]+\.[A-Za-z]{2,}")


def looks_personal(value: str) -> bool:
    """Whether a string holds something shaped like an e-mail address."""
    return "@" in value and _EMAIL.search(value) is not None


def holds_free_text(f: FieldProfile) -> bool:
    """Whether the short strings of ``f`` are free text rather than enum values (see the module)."""
    if not f.values:
        return False
    if any(looks_personal(v) for v in f.values):
        return True
    distinct = len(f.values)
    return distinct > FREE_TEXT_DISTINCT and sum(f.values.values()) < 10 * distinct


def withhold_free_text(
    fields: Mapping[str, FieldProfile], keep: Callable[[str], bool] | None = None
) -> dict[str, FieldProfile]:
    """``fields`` with the values of every free-text path counted as overflow instead (the counts
    of the path stay whole: present, types, long strings and values together).

    ``keep`` names paths whose values stay although they look like free text: fields an operator
    declared an enum, whose rule needs the baseline's set. Values shaped like an e-mail address
    are withheld all the same."""

    def kept(path: str, f: FieldProfile) -> bool:
        return keep is not None and keep(path) and not any(looks_personal(v) for v in f.values)

    return {
        path: replace(f, values={}, values_overflow=f.values_overflow + sum(f.values.values()))
        if holds_free_text(f) and not kept(path, f)
        else f
        for path, f in fields.items()
    }


@dataclass(frozen=True)
class RedactPatterns:
    """The ``redact_paths`` setting, compiled: a path matches a pattern written in field-path
    syntax (``customer.email``, ``messages[].text``) where ``*`` stands for any run of
    characters, dots and brackets included (``*.email``, ``notes*``); nothing else is special.

    >>> RedactPatterns.parse(["notes*"]).matches("notes[].text")
    True
    """

    patterns: tuple[str, ...] = ()

    @classmethod
    def parse(cls, patterns: Iterable[str], *, setting: str = "redact_paths") -> RedactPatterns:
        """Check every pattern; ``SettingsInvalid`` names the setting and the pattern at fault."""
        out = tuple(patterns)
        if len(out) > MAX_REDACT_PATTERNS:
            raise SettingsInvalid(setting, f"{len(out)} patterns, more than the limit of {MAX_REDACT_PATTERNS}")
        for p in out:
            if not isinstance(p, str) or not p:
                raise SettingsInvalid(
                    setting, f"{p!r} is not a path pattern; write a field path such as customer.email"
                )
            if len(p) > MAX_PATTERN_LENGTH:
                raise SettingsInvalid(
                    setting, f"a pattern of {len(p)} characters is longer than the limit of {MAX_PATTERN_LENGTH}"
                )
            if any(ord(c) < 0x20 or ord(c) == 0x7F for c in p):
                raise SettingsInvalid(setting, f"{p!r} holds a control character")
            if not p.strip("*"):
                raise SettingsInvalid(setting, f"{p!r} would match every path; name the paths to redact")
        return cls(out)

    @property
    def _regex(self) -> re.Pattern[str] | None:
        if not self.patterns:
            return None
        return _compiled(self.patterns)

    def matches(self, path: str) -> bool:
        rx = self._regex
        return rx is not None and rx.fullmatch(path) is not None

    def __bool__(self) -> bool:
        return bool(self.patterns)


_COMPILED: dict[tuple[str, ...], re.Pattern[str]] = {}


def _compiled(patterns: tuple[str, ...]) -> re.Pattern[str]:
    rx = _COMPILED.get(patterns)
    if rx is None:
        rx = re.compile("|".join("(?:" + ".*".join(map(re.escape, p.split("*"))) + ")" for p in patterns), re.DOTALL)
        if len(_COMPILED) < 64:
            _COMPILED[patterns] = rx
    return rx


def mask_output(output: Any, hide: Callable[[str], bool]) -> Any:
    """A copy of ``output`` where every string at a path ``hide`` names, and every string that
    looks like an e-mail address, reads ``MASK``; other values and the shape stay as they are."""

    def walk(v: Any, path: str | None) -> Any:
        if isinstance(v, dict):
            return {k: walk(x, join_key(path, k)) for k, x in v.items()}
        if isinstance(v, list):
            inner = items_path(path or "")
            return [walk(x, inner) for x in v]
        if isinstance(v, str) and ((path is not None and hide(path)) or looks_personal(v)):
            return MASK
        return v

    return walk(output, None)
