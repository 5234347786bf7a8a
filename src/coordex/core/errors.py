"""Error records the model sees, and the exception that carries them inside coordex.

Every failure that reaches a caller is a plain dict with ``error``, ``error_type`` and
``suggestion`` (SPEC section 4). Inside the package a failure travels as
:class:`CoordexError` so deep code can stop early; the front ends turn it into the dict
with :meth:`CoordexError.to_dict`. Messages quote the offending value with ``!r`` and
the suggestion names the change, so a model can correct its next call from it alone.
"""

from __future__ import annotations

import difflib
import errno
from collections.abc import Iterable
from typing import Any, Literal

ErrorType = Literal[
    "validation", "not_found", "capacity", "execution", "timeout", "crashed", "environment",
    "busy",
]
ERROR_TYPES: tuple[ErrorType, ...] = (
    "validation", "not_found", "capacity", "execution", "timeout", "crashed", "environment",
    "busy",
)
# When each error_type is given (SPEC section 4); the docs' error reference is built from
# this table, and a test holds it to ERROR_TYPES. Keyed by str: a type another part of
# coordex answers with (a call still running, "busy") is described here too.
ERROR_MEANINGS: dict[str, str] = {
    "validation": "an impossible coordinate: stateless naming a session; read_only without "
                  "one; both session_id and session_name; an unknown language or state_mode; "
                  "an argument of the wrong type",
    "not_found": "a named or numbered session, environment or stored function that does not "
                 "exist; the suggestion lists the ones that do, or the nearest name",
    "capacity": "opening one more session than max_sessions allow; the error lists the open "
                "sessions (`sessions`)",
    "execution": "the code raised (Python); with `traceback`, `exception` (the type's name), "
                 "`stdout` and `stderr`",
    "timeout": "the call ran past its timeout, or was cancelled; the words and `state_lost` "
               "say whether the session kept its state (interrupted) or lost it (restarted)",
    "crashed": "the process, shell, copy or node running the call died, or the session was "
               "closed under it, and the call could not complete (after the one retry "
               "allowed); `state_lost` says whether the session's state went with it",
    "environment": "an environment could not be built or used (a bad spec, an unresolvable "
                   "requirement, an index that cannot be reached, a full disk); the message "
                   "quotes the resolver's reason",
    "busy": "the session is running a call that returned `running`; the suggestion names "
            "`wait_call`",
}


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


# Below this many free bytes a failing write is taken for a full disk, whatever SQLite
# says ("disk I/O error", "unable to open database file" when it cannot make its -shm).
DISK_FULL_BYTES = 1 << 20


def storage_error(exc: BaseException, path: object, what: str,
                  free_bytes: int | None = None) -> CoordexError:
    """A failure of coordex's own storage (SPEC 6) worded so a model can act on it:
    what to free or fix, from the OS error number, the free space on the disk (when the
    caller could measure it) or the SQLite message."""
    text = str(exc)
    lowered = text.lower()
    number = getattr(exc, "errno", None)
    if number in (errno.ENOSPC, errno.EDQUOT) or "disk is full" in lowered \
            or "no space" in lowered or (free_bytes is not None
                                         and free_bytes < DISK_FULL_BYTES):
        problem = "the disk that holds it is full"
        fix = (f"Free space on the disk that holds {path} (environments.remove_unused() "
               "deletes built environments nothing refers to), then run the call again.")
    elif number in (errno.EACCES, errno.EPERM, errno.EROFS) or "readonly" in lowered \
            or "read-only" in lowered or "unable to open" in lowered \
            or "permission" in lowered:
        problem = "it cannot be written"
        fix = (f"Make {path} and its folder writable (or give the Executor another root=), "
               "then run the call again.")
    elif "not a database" in lowered or "malformed" in lowered or "corrupt" in lowered:
        problem = "the file is damaged"
        fix = (f"Move {path} aside (coordex then starts a new, empty one) or restore it "
               "from a backup, then run the call again.")
    else:
        problem = "it failed"
        fix = f"Check the disk and the permissions of {path}, then run the call again."
    return CoordexError(
        "environment", f"coordex could not use its {what} at {path}: {problem} "
        f"({type(exc).__name__}: {text}).", fix + " Nothing was changed by this call.",
        log=text)

