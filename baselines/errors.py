"""Errors of the baselines package (subclasses of collector's ShapewatchError)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from shapewatch.collector import FieldError, ShapewatchError

__all__ = [
    "BaselineError",
    "BaselineExportIncomplete",
    "BaselineInvalid",
    "BaselineNotFound",
    "BaselineRefused",
    "BaselineTampered",
    "BaselineUnreadable",
]


class BaselineError(ShapewatchError):
    """A baseline operation could not be done as asked (the service answers 422)."""

    status = 422


class BaselineNotFound(BaselineError, LookupError):
    status = 404

    def __init__(self, what: str) -> None:
        super().__init__(f"no baseline {what}")


class BaselineRefused(BaselineError):
    """Freezing was refused: too few samples, open page alerts, ...; ``--force`` with a reason overrides."""

    status = 409

    def __init__(self, objections: Sequence[str]) -> None:
        self.objections = list(objections)
        super().__init__(
            "baseline not frozen: "
            + "; ".join(self.objections)
            + " (freeze another window, or pass --force with a reason)"
        )


class BaselineTampered(BaselineError, ValueError):
    """A baseline document whose content does not match its hash."""

    def __init__(self, where: str, stated: str, actual: str) -> None:
        super().__init__(
            f"{where}: the baseline's hash says {stated[:16]}... but its content hashes to "
            f"{actual[:16]}...; the file was edited after export and is refused"
        )


class BaselineInvalid(BaselineError, ValueError):
    """A baseline document that does not follow the baseline schema; ``fields`` names each failing field.

    Paths point inside the document (``/fields/priority/present``, JSON Pointer escaping).
    """

    #: at most this many fields are named in the message (``fields`` keeps them all)
    SHOWN = 10

    def __init__(self, where: str, fields: Sequence[FieldError]) -> None:
        self.where = where
        self.fields = list(fields)
        shown = "; ".join(f"{f.path}: {f.reason}" for f in self.fields[: self.SHOWN])
        more = len(self.fields) - self.SHOWN
        super().__init__(
            f"{where}: not a valid baseline document: {shown}" + (f" (and {more} more)" if more > 0 else "")
        )


class BaselineUnreadable(BaselineError):
    """A file given to import that is not read: not a regular file, too large, or unreadable."""

    def __init__(self, path: Path | str, reason: str) -> None:
        self.path, self.reason = str(path), reason
        super().__init__(f"{path}: {reason}")


class BaselineExportIncomplete(BaselineError):
    """Some baselines of an export could not be written; the others were."""

    def __init__(self, written: Sequence[Path], failed: Sequence[tuple[Path, str]]) -> None:
        self.written, self.failed = list(written), list(failed)
        super().__init__(
            f"{len(self.failed)} of {len(self.written) + len(self.failed)} baselines not written: "
            + "; ".join(f"{p}: {why}" for p, why in self.failed)
        )
