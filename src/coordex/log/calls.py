"""From a finished call to a log row, and the executor-facing reads of the log.

:func:`record_call` runs at the end of every call the Executor makes (``execute_code``
and stored-function calls alike): it turns the result dict into a row for
:class:`~coordex.log.store.CallLog` and, where the result says state was lost, ends its
suggestion with how to get it back (:func:`coordex.core.messages.rebuild_hint`). It
never raises: a log that fails costs the row, not the call.

Two facts do not travel in the result dict and are handed over through a thread-local
note instead: what a read-only copy would have changed (the backends report it, the
result does not show it) and which logged call a rebuild is replaying.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ..core import coordinates as coords
from ..core import messages
from ..core.coordinates import Coordinate
from ..core.errors import CoordexError, validation
from .store import CallLog, LogReader, decode_row, rows_where

_notes = threading.local()

# The keys of one history record (SPEC section 11), in order.
HISTORY_KEYS = ("seq", "at", "language", "venv_id", "session_id", "session_name",
                "state_mode", "code", "duration_ms", "outcome", "state_lost")
MAX_LIMIT = 10_000


# At most this many names per list, as files written (``isolation.WRITTEN_LIMIT``): a
# last entry "..." says there were more.
NAMES_LIMIT = 200


def note_changes(rebound: Any, deleted: Any, written: Any = None) -> None:
    """What the read-only copy about to be recorded on this thread changed: names it
    rebound or deleted, and files it wrote in protected folders (all discarded).

    ``rebound`` may instead be a callable returning ``(rebound, deleted)``: a place
    whose names cost a parse (a bash copy's) hands that over, and the log's writer
    thread calls it when it writes the row, off the call's path.
    """
    if callable(rebound):
        names = rebound

        def later() -> dict[str, Any] | None:
            now_rebound, now_deleted = names()
            return _changes(now_rebound, now_deleted, written)

        _notes.changed = later
    else:
        _notes.changed = _changes(rebound, deleted, written)


def _changes(rebound: Any, deleted: Any, written: Any) -> dict[str, Any] | None:
    """The row's ``changed`` column: None when the copy changed nothing."""
    if not (rebound or deleted or written):
        return None
    changed = {"rebound": _capped(rebound), "deleted": _capped(deleted)}
    if written:
        changed["written"] = list(written)
    return changed


def _capped(names: Any) -> list[str]:
    names = sorted(names or ())
    return names if len(names) <= NAMES_LIMIT else [*names[:NAMES_LIMIT], "..."]


def note_replay(seq: int, code: str) -> None:
    """The next call of exactly ``code`` on this thread replays logged call ``seq``."""
    _notes.replay = (seq, code)


def record_call(log: CallLog | None, result: dict[str, Any], code: Any,
                coordinate: Coordinate | None) -> dict[str, Any]:
    """Queue the row for one finished call; returns ``result`` (its suggestion may now
    name ``rebuild_session``)."""
    if log is None:
        return result
    try:
        session = result.get("session")
        if session is None and coordinate is not None and coordinate.state_mode != "stateless":
            session = {"language": coordinate.language, "venv_id": coordinate.venv_id,
                       "session_id": coordinate.session_id,
                       "session_name": coordinate.session_name}
        error_type = result.get("error_type")
        state_lost = result.get("state_lost")
        if state_lost or error_type == "crashed":
            messages.add_rebuild_hint(result, session)
        changed = getattr(_notes, "changed", None)
        if changed is not None:
            _notes.changed = None
        replay = getattr(_notes, "replay", None)
        replay_of = None
        if replay is not None and replay[1] is code:
            replay_of = replay[0]
            _notes.replay = None
        duration = result.get("duration_ms") or 0.0
        if session is None:
            language = coordinate.language if coordinate is not None else None
            venv_id = coordinate.venv_id if coordinate is not None else None
            session_id = session_name = None
        else:
            language, venv_id = session.get("language"), session.get("venv_id")
            session_id, session_name = session.get("session_id"), session.get("session_name")
        state_mode = result.get("state_mode") or (
            coordinate.state_mode if coordinate is not None else None)
        log.record((time.time() - duration / 1000.0, "call", language, venv_id, session_id,
                    session_name, state_mode, code if isinstance(code, str) else None,
                    duration, error_type or "ok", result.get("exit_code"), state_lost,
                    result.get("retried"), result.get("isolation"), changed, replay_of))
    except Exception:  # the log never costs the call
        pass
    return result


def log_off_error(what: str) -> CoordexError:
    return validation(f"{what} needs the call log, and this Executor runs with log=False.",
                      "Create the Executor with log=True (the default) so calls are recorded.")


def check_filters(language: Any, session_id: Any, session_name: Any, venv_id: Any,
                  limit: Any) -> list[tuple[str, Any]]:
    """The equality filters of a history query, or a ``validation`` error (the same
    checks, bounds and wording as a call's coordinates)."""
    if language is not None:
        coords.check_language(language)
    coords.check_session(session_id, session_name)
    coords.check_venv_id(venv_id)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise validation(f"limit must be an integer from 1 to {MAX_LIMIT}, got {limit!r}.",
                         "Pass limit=50 (the default) or another positive number.")
    filters: list[tuple[str, Any]] = [("kind", "call")]
    for column, value in (("language", language), ("session_id", session_id),
                          ("session_name", session_name), ("venv_id", venv_id)):
        if value is not None:
            filters.append((column, value))
    return filters


def history(log: CallLog | LogReader, language: Any = None, session_id: Any = None,
            session_name: Any = None, venv_id: Any = None, limit: Any = 50) -> dict[str, Any]:
    """``{"calls": [...]}``, newest last (SPEC section 11). Raises CoordexError."""
    where, params = rows_where(check_filters(language, session_id, session_name, venv_id, limit))
    rows = read(log, f"SELECT {', '.join(HISTORY_KEYS)} FROM calls WHERE {where} "
                f"ORDER BY seq DESC LIMIT ?", [*params, limit])
    rows.reverse()
    return {"calls": [decode_row(row) for row in rows]}


def read(log: CallLog | LogReader, sql: str, params: list[Any]) -> list[dict[str, Any]]:
    """``log.query`` with storage failures turned into an error a model can act on."""
    try:
        return log.query(sql, params)
    except Exception as exc:  # sqlite3.Error, OSError: the file is broken or unreadable
        raise CoordexError(
            "environment", f"The call log at {str(log.path)!r} cannot be read: {exc}.",
            "Free disk space or fix the file's permissions; if the file is corrupt, move it "
            "away and a new log starts with the next call.")
