"""Errors of the analysis package, each a ``ShapewatchError`` (see CONVENTIONS "Errors").

Messages are built in ``__init__`` so that every raise site says the same thing
the same way; the CLI and the service turn them into a clear message.
"""

from __future__ import annotations

from collector import ShapewatchError

__all__ = ["AlertError", "AlertNotFound", "ConfigInvalid", "NotifyConfigInvalid"]


class NotifyConfigInvalid(ShapewatchError, ValueError):
    """The ``notify`` table of the configuration is wrong; the message names the key and the fix.

    >>> str(NotifyConfigInvalid("notify.targets[0].routing_key", 'required for kind "pagerduty"',
    ...                         "set it to an Events API v2 integration key"))
    'notify.targets[0].routing_key: required for kind "pagerduty"; set it to an Events API v2 integration key'
    """

    def __init__(self, key: str, problem: str, fix: str | None = None) -> None:
        self.key = key
        self.problem = problem
        super().__init__(f"{key}: {problem}" + (f"; {fix}" if fix else ""))


class ConfigInvalid(ShapewatchError, ValueError):
    """A key of the analyzer configuration is wrong; the message names the key and the fix."""

    def __init__(self, key: str, problem: str) -> None:
        self.key = key
        super().__init__(f"{key}: {problem}")


class AlertError(ShapewatchError, ValueError):
    """An alert operation asked for something that cannot be done."""


class AlertNotFound(AlertError, LookupError):
    def __init__(self, fp: str) -> None:
        super().__init__(f"no alert with fingerprint {fp!r}")
