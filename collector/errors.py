"""Errors of the collector, and the base error every shapewatch package subclasses.

Messages are built in ``__init__`` so that every raise site says the same thing
the same way; the HTTP layer and the CLI translate these into their own shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "BatchTooLarge",
    "EnvelopeInvalid",
    "FieldError",
    "ImportInputError",
    "QuarantineUnwritable",
    "SettingsInvalid",
    "ShapewatchError",
    "StoreError",
    "StoreLocked",
    "StoreUnavailable",
    "StoreVersionTooNew",
]


class ShapewatchError(Exception):
    """Base of every error shapewatch raises on purpose.

    ``status`` is the HTTP status the service answers it with: the one error map is these class
    attributes, read by the service's single error handler (collector/api.py). An error that
    names no status of its own is the service's fault (500)."""

    status: int = 500


@dataclass(frozen=True)
class FieldError:
    """One reason an input was refused: where (a field path) and why."""

    path: str
    reason: str
    #: a short stable name for the kind of reason, from a closed set (metrics and
    #: summaries group by it): missing, wrong_type, invalid_value, invalid_json,
    #: invalid_timestamp, too_large, too_deep, duplicate_key, number_too_large,
    #: unknown_field, conflict, body_too_large, forbidden
    code: str = "invalid_value"

    def as_dict(self) -> dict[str, str]:
        return {"path": self.path, "reason": self.reason}


class EnvelopeInvalid(ShapewatchError, ValueError):
    """An envelope (or a whole body) was refused; ``fields`` names each failing field."""

    status = 422

    def __init__(self, fields: list[FieldError], *, status: int = 422) -> None:
        self.fields = fields
        self.status = status
        #: the envelope's own event_id, when it had a usable one
        self.event_id: str | None = None
        super().__init__("; ".join(f"{f.path}: {f.reason}" for f in fields))


class StoreError(ShapewatchError):
    """The DuckDB store failed; the message says what was being done."""

    status = 503  # a client may retry: the service answers with Retry-After

    def __init__(self, doing: str, cause: BaseException | str) -> None:
        self.doing = doing
        super().__init__(f"store error while {doing}: {cause}")


class StoreLocked(StoreError):
    """Another process holds the database file (DuckDB allows one writer per file)."""

    def __init__(self, path: str, cause: BaseException | str) -> None:
        self.path = path
        ShapewatchError.__init__(
            self,
            f"database {path} is in use by another process (is `shapewatch serve` running on it?). "
            f"Stop that process, or send to the running service over HTTP. ({cause})",
        )
        self.doing = "opening"


class StoreVersionTooNew(StoreError):
    """The file was written by a newer shapewatch whose schema this one does not know."""

    def __init__(self, path: str, found: int, supported: int) -> None:
        self.path, self.found, self.supported = path, found, supported
        ShapewatchError.__init__(
            self,
            f"database {path} has schema version {found}, but this shapewatch supports up to "
            f"version {supported}; upgrade shapewatch to a release that knows schema version {found}",
        )
        self.doing = "opening"


class StoreUnavailable(StoreError):
    """The store cannot take writes right now (disk full, I/O error); clients should retry."""

    def __init__(self, cause: BaseException | str, retry_after: int = 5) -> None:
        self.retry_after = retry_after
        ShapewatchError.__init__(self, f"store cannot write right now: {cause}")
        self.doing = "writing"


class StoreInvalidated(StoreError):
    """DuckDB invalidated the database after a fatal error (a checkpoint that could not write
    the file): this process can never use it again. What was committed is on disk."""

    def __init__(self, doing: str, cause: BaseException | str) -> None:
        ShapewatchError.__init__(
            self,
            f"DuckDB invalidated the database after a fatal error while {doing} ({' '.join(str(cause).split())[:300]}); "
            "nothing acknowledged is lost, but this process cannot use the file again: the service stops, "
            "and a restart (once the cause, such as a full disk, is fixed) recovers it",
        )
        self.doing = doing


class BatchTooLarge(ShapewatchError, ValueError):
    """A request holds more events than the writer's whole queue: it can never be taken."""

    status = 413

    def __init__(self, events: int, limit: int) -> None:
        self.events, self.limit = events, limit
        super().__init__(f"the request holds {events} events; send at most {limit} per request")


class ImportInputError(ShapewatchError, ValueError):
    """An input file of a bulk import cannot be read (missing, not gzip, truncated)."""

    def __init__(self, path: object, cause: BaseException) -> None:
        self.path = path
        super().__init__(f"cannot read {path}: {cause or type(cause).__name__}")


class QuarantineUnwritable(ShapewatchError):
    """Rejected lines of a bulk import cannot be written beside the database: nothing of that
    file is imported (a rejected line must never be dropped)."""

    def __init__(self, path: object, source: object, cause: BaseException) -> None:
        self.path = path
        super().__init__(f"cannot write rejected lines to {path} ({cause}); nothing of {source} was imported")


class SettingsInvalid(ShapewatchError, ValueError):
    """A setting has a bad value; the message names the key and the fix."""

    def __init__(self, key: str, problem: str) -> None:
        self.key = key
        super().__init__(f"setting {key!r}: {problem}")


# --- contracts (collector/contracts.py); exported from there -------------------------------


class ContractError(ShapewatchError, ValueError):
    """A contract (JSON Schema or tool definition) could not be read, registered or used as asked."""

    status = 422


class ContractInvalid(ContractError):
    """A contract document is not usable: not JSON, not a schema or tool, or not valid Draft 2020-12."""

    def __init__(self, where: str, problem: str) -> None:
        self.where, self.problem = where, problem
        super().__init__(f"{where}: {problem}")


class ContractNotFound(ContractError, LookupError):
    """No registered version of that contract (or no such tool in it)."""

    status = 404

    def __init__(self, contract: str, version: str | None = None, *, tool: str | None = None) -> None:
        self.contract, self.version, self.tool = contract, version, tool
        what = f"contract {contract!r}" + (f" version {version!r}" if version is not None else "")
        if tool is not None:
            super().__init__(f"{what} has no tool named {tool!r}")
        else:
            super().__init__(f"no {what} is registered")


class ContractConflict(ContractError):
    """A (contract, version) already registered with different content: registered versions never change."""

    status = 409

    def __init__(self, contract: str, version: str, stored: str, given: str) -> None:
        self.contract, self.version = contract, version
        super().__init__(
            f"contract {contract!r} version {version!r} is already registered with different content "
            f"(stored {stored[:12]}..., given {given[:12]}...); registered versions never change: "
            f"register the new content under a new version"
        )


class ContractToolAmbiguous(ContractError, LookupError):
    """A catalog holds several tools and nobody said which one an output belongs to."""

    def __init__(self, where: str, tools: list[str]) -> None:
        self.where, self.tools = where, tools
        super().__init__(
            f"{where} holds {len(tools)} tools ({', '.join(tools)}); name the tool whose arguments the output is"
        )
