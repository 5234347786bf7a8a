"""Error records the model sees, and the exception that carries them inside coordex.

Every failure that reaches a caller is a plain dict with ``error``, ``error_type`` and
``suggestion`` (SPEC section 4). Inside the package a failure travels as
:class:`CoordexError` so deep code can stop early; the front ends turn it into the dict
with :meth:`CoordexError.to_dict`. Messages quote the offending value with ``!r`` and
the suggestion names the change, so a model can correct its next call from it alone.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any, Literal

ErrorType = Literal[
    "validation", "not_found", "capacity", "execution", "timeout", "crashed", "environment"
]
ERROR_TYPES: tuple[ErrorType, ...] = (
    "validation", "not_found", "capacity", "execution", "timeout", "crashed", "environment",
)


class CoordexError(Exception):
    """A failure that becomes a result dict (never a crash of the caller)."""

    def __init__(self, error_type: ErrorType, error: str, suggestion: str, **extra: Any) -> None:
        super().__init__(error)
        self.error_type: ErrorType = error_type
        self.error = error
        self.suggestion = suggestion
        self.extra: dict[str, Any] = extra

    def to_dict(self) -> dict[str, Any]:
        return make_error(self.error_type, self.error, self.suggestion, **self.extra)


def make_error(error_type: ErrorType, error: str, suggestion: str, **extra: Any) -> dict[str, Any]:
    """Build the SPEC error dict; ``extra`` keys follow the three fixed ones."""
    record: dict[str, Any] = {"error": error, "error_type": error_type, "suggestion": suggestion}
    record.update(extra)
    return record


def is_error(record: dict[str, Any]) -> bool:
    return "error_type" in record and "error" in record


def validation(error: str, suggestion: str) -> CoordexError:
    return CoordexError("validation", error, suggestion)


def nearest(word: str, candidates: Iterable[str]) -> str | None:
    """The closest candidate to ``word`` (typo repair for suggestions), or None."""
    matches = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return matches[0] if matches else None


def quoted_list(items: Iterable[str], empty: str = "none") -> str:
    values = [repr(i) for i in items]
    return ", ".join(values) if values else empty
