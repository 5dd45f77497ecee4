"""Errors of the analysis package, each a ``ShapewatchError`` (collector/errors.py has the base).

Messages are built in ``__init__`` so that every raise site says the same thing
the same way; the CLI and the service turn them into a clear message.
"""

from __future__ import annotations

from datetime import timedelta

from shapewatch.collector import ShapewatchError

__all__ = [
    "AlertError",
    "AlertNotFound",
    "CaseDecided",
    "CaseNotFound",
    "CohortNotFound",
    "ConfigInvalid",
    "NotifyConfigInvalid",
    "ParameterInvalid",
    "ReviewPeriodTooLong",
    "SilenceNotFound",
]


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

    status = 422  # the service reaches one through a request's parameter (the review's period)

    def __init__(self, key: str, problem: str) -> None:
        self.key = key
        self.problem = problem
        super().__init__(f"{key}: {problem}")


class ParameterInvalid(ShapewatchError, ValueError):
    """A parameter of a request or a command is malformed or out of its range; the HTTP API
    answers 422 naming it (``fields``: ``[{"path": name, "reason": reason}]``).

    >>> str(ParameterInvalid("since", "'10000d' is longer than the limit of 90d"))
    "since: '10000d' is longer than the limit of 90d"
    """

    status = 422

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason
        super().__init__(f"{name}: {reason}")

    @classmethod
    def of(cls, exc: ConfigInvalid) -> ParameterInvalid:
        """The same refusal of a value read by the configuration's parsers (``parse_duration``)."""
        return cls(exc.key, exc.problem)


class ReviewPeriodTooLong(ConfigInvalid):
    """The review period (``since`` of ``/v1/review``, ``review --since``) is not positive or longer
    than the review's limit; the HTTP API answers 422 naming ``since``, the CLI names ``--since``.

    >>> str(ReviewPeriodTooLong(timedelta(days=10000), timedelta(days=90)))
    'since: a review period of 10000 days is longer than the limit of 90 days; review a shorter period'
    """

    def __init__(self, period: timedelta, limit: timedelta) -> None:
        self.period = period
        self.limit = limit
        days = period.total_seconds() / 86400
        problem = (
            f"a review period of {days:g} days is longer than the limit of {limit.days} days; review a shorter period"
            if days > 0
            else f"a review period must be positive, not {period}"
        )
        super().__init__("since", problem)


class AlertError(ShapewatchError, ValueError):
    """An alert operation asked for something that cannot be done."""

    status = 422


class AlertNotFound(AlertError, LookupError):
    status = 404

    def __init__(self, fp: str) -> None:
        super().__init__(f"no alert with fingerprint {fp!r}")


class SilenceNotFound(AlertError, LookupError):
    """No silence has that id (404)."""

    status = 404

    def __init__(self, silence_id: int) -> None:
        super().__init__(f"no silence with id {silence_id}")


class CaseNotFound(ShapewatchError, LookupError):
    """No case has that id (404)."""

    status = 404

    def __init__(self, case_id: int) -> None:
        super().__init__(f"no case {case_id}")


class CaseDecided(ShapewatchError):
    """The case was accepted or dismissed before (409)."""

    status = 409

    def __init__(self, case_id: int, state: str) -> None:
        super().__init__(f"case {case_id} is {state} already; a decision is not changed")


class CohortNotFound(ShapewatchError, LookupError):
    """A cohort named for a comparison never received an output (404)."""

    status = 404

    def __init__(self, name: str, cohort: object) -> None:
        self.name = name
        super().__init__(f"{name}: no output of cohort {cohort} was ever stored")
