"""``CallError``: a stored-function call that failed, raised to the caller.

A stored function is called like a Python function, so its failures are exceptions —
but they carry the same record a failed ``execute_code`` returns (``error``,
``error_type``, ``suggestion`` and extra keys such as the remote ``traceback``), so a
program can branch on ``error_type`` and a model can act on ``suggestion``.

When a ``CallError`` escapes code that itself runs through ``execute_code`` (plan code
calling ``functions.f.read_only(...)(...)``), the cell engine copies its
``coordex_error`` / ``coordex_error_type`` / ``coordex_suggestion`` attributes into that call's error
record, so the model sees ``not_found`` or ``validation`` rather than a bare
``execution`` error.
"""

from __future__ import annotations

from typing import Any

from ..core.errors import CoordexError, ErrorType, make_error


class CallError(CoordexError):
    """A stored-function call failed (or could not start).

    Attributes:
        error: the message (for an exception in the function: ``"ValueError: ..."``).
        error_type: one of the SPEC ``error_type`` values (``validation``,
            ``not_found``, ``capacity``, ``execution``, ``timeout``, ``crashed``,
            ``environment``).
        suggestion: what to change, concretely.
        traceback: the traceback where the function ran (another process for an
            environment or a read-only call), or ``None``.
        record: the full error dict, extra keys (``stdout``, ``stderr``, ``session``,
            ``state_lost``, ...) included.
    """

    def __init__(self, error_type: ErrorType, error: str, suggestion: str,
                 **extra: Any) -> None:
        super().__init__(error_type, error, suggestion, **extra)
        self.record: dict[str, Any] = make_error(error_type, error, suggestion, **extra)
        self.traceback: str | None = extra.get("traceback")
        # Read by the cell engine's format_error (which cannot import coordex).
        self.coordex_error: str = error
        self.coordex_error_type: str = error_type
        self.coordex_suggestion: str = suggestion

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> CallError:
        """Wrap an error dict returned by the executor."""
        extra = {k: v for k, v in record.items()
                 if k not in ("error", "error_type", "suggestion")}
        return cls(record["error_type"], str(record["error"]), str(record["suggestion"]),
                   **extra)

    def __str__(self) -> str:
        return f"{self.error} [{self.error_type}] Suggestion: {self.suggestion}"

    def __reduce__(self) -> Any:
        # Exceptions pickle through their args; ours are keyword extras, so say how.
        return (_rebuild, (self.record,))


def _rebuild(record: dict[str, Any]) -> CallError:
    return CallError.from_record(record)
