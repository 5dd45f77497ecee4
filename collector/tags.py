"""The rule every cohort tag obeys (model, prompt version, contract, served model, ...), for other packages.

The envelope validator holds the one implementation; this names it as public API
so that a value reaching the store by another door (an imported baseline
document) is held to exactly the rule ingest enforces, not to a copy of it.

>>> tag_problem("claude-sonnet-4-5", path="/cohort/model")
>>> tag_problem("a\\x00b", path="/cohort/model")
FieldError(path='/cohort/model', reason='must not contain NUL characters', code='invalid_value')
"""

from __future__ import annotations

from .envelope import LIMITS, Limits, _tag
from .errors import FieldError

__all__ = ["tag_problem"]


def tag_problem(value: object, *, path: str, max_length: int = LIMITS.max_tag_length) -> FieldError | None:
    """Why ``value`` is not a valid tag (a ``FieldError`` at ``path``), or None when it is one.

    A tag is a non-empty string of at most ``max_length`` characters (the ``max_tag_length``
    setting, 256 by default) that is not only whitespace and holds no NUL.
    """
    errors: list[FieldError] = []
    _tag({"tag": value}, "tag", errors, Limits(max_tag_length=max_length), True)
    if not errors:
        return None
    return FieldError(path, errors[0].reason, errors[0].code)
