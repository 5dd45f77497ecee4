"""Errors of the baselines package (subclasses of collector's ShapewatchError)."""

from __future__ import annotations

from collections.abc import Sequence

from collector import ShapewatchError

__all__ = ["BaselineError", "BaselineNotFound", "BaselineRefused", "BaselineTampered"]


class BaselineError(ShapewatchError):
    """A baseline operation could not be done as asked."""


class BaselineNotFound(BaselineError, LookupError):
    def __init__(self, what: str) -> None:
        super().__init__(f"no baseline {what}")


class BaselineRefused(BaselineError):
    """Freezing was refused: too few samples, open page alerts, ...; ``--force`` with a reason overrides."""

    def __init__(self, objections: Sequence[str]) -> None:
        self.objections = list(objections)
        super().__init__("baseline not frozen: " + "; ".join(self.objections)
                         + " (freeze another window, or pass --force with a reason)")


class BaselineTampered(BaselineError, ValueError):
    """A baseline document whose content does not match its hash."""

    def __init__(self, where: str, stated: str, actual: str) -> None:
        super().__init__(f"{where}: the baseline's hash says {stated[:16]}... but its content hashes to "
                         f"{actual[:16]}...; the file was edited after export and is refused")
