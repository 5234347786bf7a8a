"""From a finished call to a log row, and the executor-facing reads of the log.

:func:`record_call` runs at the end of every call the Executor makes (``execute_code``
and stored-function calls alike): it turns the rendered result dict into a row for
:class:`~coordex.log.store.CallLog`, with what the result does not show passed beside it
(the names and files the call changed: :func:`changes`). It reads the result and never
changes it, and never raises: a log that fails costs the row, not the call.

Which logged call a rebuild is replaying reaches the row as an argument
(``replay_of``), passed down the replay's call path.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..core import coordinates as coords
from ..core.coordinates import Coordinate
from ..core.errors import CoordexError, validation
from ..core.facts import Rebound
from .store import _JOURNALED, COLUMNS, CallLog, LogReader, decode_row, rows_where

# The keys of one history record (SPEC section 11), in order.
HISTORY_KEYS = ("seq", "at", "language", "venv_id", "session_id", "session_name",
                "state_mode", "code", "duration_ms", "outcome", "state_lost")
MAX_LIMIT = 10_000
# The columns of a call's row, in the order ``record_call`` lists its values.
_ROW_KEYS = ("at", "kind", "language", "venv_id", "session_id", "session_name", "state_mode",
             "code", "code_truncated", "duration_ms", "outcome", "exit_code", "state_lost",
             "retried", "isolation", "changed", "replay_of", "stdout", "stderr", "result",
             "error", "suggestion", "traceback", "call_id")
assert _ROW_KEYS == _JOURNALED, "record_call lists a row's values in the journal's order"


# At most this many names per list, as files written (``isolation.WRITTEN_LIMIT``): a
# last entry "..." says there were more.
NAMES_LIMIT = 200


# Names coordex or the interpreter sets, never the code's own doing: the last value of
# an expression (IPython's ``_``) and the module's own dunders.
_NOT_THE_CODES = frozenset({"_", "__", "___", "__builtins__", "__name__", "__doc__",
                            "__package__", "__loader__", "__spec__", "functions"})
# coordex's own files in ``root`` (the log, the library, the environments' registry):
# a copy sees them change because coordex writes them, never because the code did.
_OWN_FILES = ("log.sqlite3", "library.sqlite3", "environments.sqlite3")


def open_call_log(root: Any, records: Any, enabled: bool, max_rows: int) -> CallLog | None:
    """An Executor's call log: under ``root``, or written by ``records`` (a confined
    host's owner); None when ``enabled`` is false. ValueError for a bad ``max_rows``."""
    if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
        raise ValueError(f"log_max_rows must be an integer >= 1, got {max_rows!r}")
    if not enabled:
        return None
    if records is not None:
        log: CallLog = records.call_log(max_rows)
        return log
    from . import LOG_FILE

    return CallLog(root / LOG_FILE, max_rows)


# The row's ``changed`` column: what a call changed, None for nothing, or a callable
# that works it out after the row is written (a bash copy's names).
Changed = dict[str, Any] | None | Callable[[], dict[str, Any] | None]


def changes(rebound: Rebound, deleted: Sequence[str],
            written: Sequence[str] | None = None) -> Changed:
    """The row's ``changed`` column for a call: names it rebound or deleted, and files
    a read-only copy wrote in protected folders (all discarded); None when the code
    changed nothing.

    ``rebound`` may instead be a callable returning ``(rebound, deleted)``: a place
    whose names cost a parse (a bash copy's) hands that over, and the log works it out
    after the row is written, off the call's path (the column is then a callable).
    """
    if callable(rebound):
        names = rebound

        def later() -> dict[str, Any] | None:
            now_rebound, now_deleted = names()
            return _changes(now_rebound, now_deleted, written)

        return later
    return _changes(rebound, deleted, written)


def _changes(rebound: Any, deleted: Any, written: Any) -> dict[str, Any] | None:
    """The row's ``changed`` column: None when the code changed nothing."""
    rebound, deleted = _names(rebound), _names(deleted)
    written = [p for p in written if not _own_file(p)] if written else []
    if not (rebound or deleted or written):
        return None
    changed: dict[str, Any] = {"rebound": rebound, "deleted": deleted}
    if written:
        changed["written"] = written
    return changed


def _names(names: Any) -> list[str]:
    """The code's own of ``names``, sorted, at most :data:`NAMES_LIMIT` (a stateful
    call's end: most often one name, none of coordex's)."""
    if not names:
        return []
    if not isinstance(names, (list, tuple)):
        names = list(names)
    kept = sorted(names if _NOT_THE_CODES.isdisjoint(names) else
                  [n for n in names if n not in _NOT_THE_CODES])
    return kept if len(kept) <= NAMES_LIMIT else [*kept[:NAMES_LIMIT], "..."]


def _own_file(path: Any) -> bool:
    name = os.path.basename(str(path))
    return any(name == own or name.startswith(own + "-") for own in _OWN_FILES)


def result_of_row(row: dict[str, Any]) -> dict[str, Any]:
    """A finished call's result dict as its log row keeps it (outputs capped as the log
    caps them), marked ``"from_log": true``."""
    from ..core.errors import make_error
    from ..core.results import session_record, success

    row = decode_row(row)
    stateless = row.get("state_mode") == "stateless"
    session = session_record(str(row.get("language") or "python"), row.get("venv_id"),
                             None if stateless else row.get("session_id"),
                             None if stateless else row.get("session_name"))
    common: dict[str, Any] = {"from_log": True, "seq": row.get("seq")}
    if row.get("state_lost"):
        common["state_lost"] = True
    if row.get("outcome") in (None, "ok"):
        return success(stdout=row.get("stdout") or "", stderr=row.get("stderr") or "",
                       truncated=False, result=row.get("result"),
                       exit_code=row.get("exit_code"), images=[], session=session,
                       state_mode=str(row.get("state_mode")),
                       duration_ms=float(row.get("duration_ms") or 0.0), **common)
    extra = {k: row[k] for k in ("traceback",) if row.get(k)}
    return make_error(row["outcome"], row.get("error") or "", row.get("suggestion") or "",
                      stdout=row.get("stdout") or "", stderr=row.get("stderr") or "",
                      state_lost=bool(row.get("state_lost")), **extra, session=session,
                      state_mode=row.get("state_mode"), duration_ms=row.get("duration_ms"),
                      from_log=True, seq=row.get("seq"))


def record_call(log: CallLog | None, result: dict[str, Any], code: Any,
                coordinate: Coordinate | None, seq: int | None = None,
                asked: tuple[Any, ...] | None = None, *, changed: Changed = None,
                call_id: str | None = None, replay_of: int | None = None) -> LoggedRow:
    """Write the row of one finished call (completing row ``seq`` if the call's row was
    reserved while it ran) before the call returns, and return it. ``asked``: the
    coordinate's arguments as given, for a call refused before they made a coordinate
    (its row shows what was asked). ``changed``: :func:`changes` of the call.
    ``call_id``: the call record (SPEC 14) whose own row this is. ``replay_of``: the
    logged call this one replays (a rebuild's)."""
    if log is None:
        return LoggedRow()
    try:
        session = result.get("session")
        if session is None and coordinate is not None and coordinate.state_mode != "stateless":
            session = {"language": coordinate.language, "venv_id": coordinate.venv_id,
                       "session_id": coordinate.session_id,
                       "session_name": coordinate.session_name}
        error_type = result.get("error_type")
        state_lost = result.get("state_lost")
        duration = result.get("duration_ms") or 0.0
        if coordinate is None and asked is not None:
            language, state_mode, session_id, session_name, venv_id = _as_asked(asked)
        elif session is None:
            language = coordinate.language if coordinate is not None else None
            venv_id = coordinate.venv_id if coordinate is not None else None
            session_id = session_name = None
        else:
            language, venv_id = session.get("language"), session.get("venv_id")
            session_id, session_name = session.get("session_id"), session.get("session_name")
        if coordinate is not None or asked is None:
            state_mode = result.get("state_mode") or (
                coordinate.state_mode if coordinate is not None else None)
        # The row's values in the journal's order (``store._JOURNALED``): a list, no
        # dict, on the path of every call.
        values = [
            time.time() - duration / 1000.0, "call", language, venv_id, session_id,
            session_name, state_mode, code if isinstance(code, str) else None, None,
            duration, error_type or "ok", result.get("exit_code"), state_lost,
            result.get("retried"), result.get("isolation"), changed, replay_of,
            # SPEC 11: what the call returned, an empty stream as "" (None: it had none).
            _text_or_none(result.get("stdout")), _text_or_none(result.get("stderr")),
            result.get("result"), result.get("error"), result.get("suggestion"),
            result.get("traceback"), call_id]
        # A row reserved while the call ran is completed in the file; any other goes
        # through the journal (durable at once, in the file a moment later).
        if seq is not None:
            logged = LoggedRow(log.append(dict(zip(_ROW_KEYS, values, strict=True)), seq))
        else:
            logged = LoggedRow((log, log.record_values(values)))
        if not logged.written:  # never silent: the caller is told
            result["warning"] = (
                "This call ran, but its row could not be written to the call log "
                f"({log.problem or 'the log refused it'}); history() will not show it, "
                "and a session rebuilt from the log would miss it. Free disk space "
                "under the data folder.")
        return logged
    except Exception:  # the log never costs the call
        return LoggedRow()


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


class LoggedRow:
    """The row :func:`record_call` wrote for a call: whether it was written, and its
    ``seq``, found only when asked (a row still in the journal is moved into the file
    first: a commit, which is why most calls never ask)."""

    def __init__(self, noted: Any = None) -> None:
        self._noted = noted  # a seq, (log, the journal's entry), or None: not written

    @property
    def written(self) -> bool:
        if isinstance(self._noted, tuple):
            entry = self._noted[1]
            return entry is not None and not (entry.done and entry.seq is None)
        return self._noted is not None

    def seq(self) -> int | None:
        if isinstance(self._noted, tuple):
            log, entry = self._noted
            self._noted = log.seq_of(entry) if entry is not None else None
        return self._noted


def _as_asked(asked: tuple[Any, ...]) -> tuple[Any, ...]:
    """A refused call's arguments as its row keeps them: short text and integers only
    (anything else, a wrong type, reads as not given)."""
    def text(value: Any) -> str | None:
        return value[:80] if isinstance(value, str) else None

    def number(value: Any) -> int | None:
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    language, state_mode, session_id, session_name, venv_id = asked
    return text(language), text(state_mode), number(session_id), text(session_name), \
        number(venv_id)


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
            session_name: Any = None, venv_id: Any = None, limit: Any = 50,
            seq: Any = None, **narrower: Any) -> dict[str, Any]:
    """``{"calls": [...]}``, newest last, or with ``seq`` ``{"call": {...}}`` (SPEC
    section 11); ``narrower`` filters are :func:`calls_page`'s. Raises CoordexError."""
    if seq is not None:
        return {"call": one_call(log, seq)}
    if any(v is not None for v in narrower.values()):
        return calls_page(log, language=language, session_id=session_id,
                          session_name=session_name, venv_id=venv_id, limit=limit, **narrower)
    where, params = rows_where(check_filters(language, session_id, session_name, venv_id, limit))
    rows = read(log, f"SELECT {', '.join(HISTORY_KEYS)}, said_by FROM calls WHERE {where} "
                f"ORDER BY seq DESC LIMIT ?", [*params, limit])
    rows.reverse()
    return {"calls": [marked(decode_row(row)) for row in rows]}


def marked(call: dict[str, Any]) -> dict[str, Any]:
    """A call as readers show it: ``said_by: "host"`` on a row that is a confined host's
    own word (``hosting/records.py``), no such key on a row coordex vouches for."""
    if call.get("said_by") is None:
        call.pop("said_by", None)
    return call


# What ``history(seq=N)`` and the page's ``calls/SEQ`` show of one call: every column
# but the writer's name.
DETAIL_KEYS = tuple(c for c in COLUMNS if c != "owner")


def one_call(log: CallLog | LogReader, seq: Any) -> dict[str, Any]:
    """Everything the log keeps of call ``seq``. Raises CoordexError."""
    if isinstance(seq, bool) or not isinstance(seq, int) or not 1 <= seq < 1 << 63:
        raise validation(f"seq must be a positive integer below 2**63, got {seq!r:.40}.",
                         "Pass the seq of a call that history() lists.")
    rows = read(log, f"SELECT {', '.join(DETAIL_KEYS)} FROM calls WHERE seq = ? AND "
                "kind = 'call'", [seq])
    if not rows:
        newest = read(log, "SELECT MIN(seq) AS low, MAX(seq) AS high FROM calls", [])
        low, high = (newest[0]["low"], newest[0]["high"]) if newest else (None, None)
        held = f"it holds calls {low} to {high}" if high is not None else "it is empty"
        raise CoordexError("not_found", f"The call log holds no call {seq}; {held}.",
                           "Call history() to see the seqs it holds (the oldest rows go "
                           "first once the log is full).")
    return marked(decode_row(rows[0]))


# The page's filters (SPEC 11's GET calls): equality on these columns, plus ``text``.
OUTCOMES = ("ok", "validation", "not_found", "capacity", "execution", "timeout", "crashed",
            "environment")


def calls_page(log: CallLog | LogReader, *, language: Any = None, session_id: Any = None,
               session_name: Any = None, venv_id: Any = None, outcome: Any = None,
               state_mode: Any = None, text: Any = None, after_seq: Any = None,
               limit: Any = 200) -> dict[str, Any]:
    """The page's list of calls: history's records with filters on outcome, state mode,
    text (in the code, output or error) and ``after_seq`` (only newer calls, to follow
    the log as it grows). Newest last. Raises CoordexError."""
    filters = check_filters(language, session_id, session_name, venv_id, limit)
    if state_mode is not None:
        coords.check_state_mode(state_mode)
        filters.append(("state_mode", state_mode))
    where, params = rows_where(filters)
    if outcome is not None:
        if outcome == "running":
            where += " AND outcome IS NULL"
        elif outcome == "error":
            where += " AND outcome IS NOT NULL AND outcome != 'ok'"
        elif outcome in OUTCOMES:
            where += " AND outcome = ?"
            params.append(outcome)
        else:
            raise validation(f"outcome must be one of {', '.join(OUTCOMES)}, 'error' or "
                             f"'running', got {outcome!r}.", "Pass one of those, or none.")
    if after_seq is not None:
        if isinstance(after_seq, bool) or not isinstance(after_seq, int):
            raise validation(f"after_seq must be an integer, got {after_seq!r}.",
                             "Pass the highest seq the page already shows.")
        where += " AND seq > ?"
        params.append(after_seq)
    if text:
        where += (" AND (instr(code, ?) OR instr(stdout, ?) OR instr(stderr, ?) OR "
                  "instr(error, ?) OR instr(result, ?))")
        params += [str(text)] * 5
    rows = read(log, f"SELECT {', '.join(HISTORY_KEYS)}, exit_code, said_by FROM calls "
                f"WHERE {where} ORDER BY seq DESC LIMIT ?", [*params, limit])
    rows.reverse()
    return {"calls": [marked(decode_row(row)) for row in rows]}


def read(log: CallLog | LogReader, sql: str, params: list[Any]) -> list[dict[str, Any]]:
    """``log.query`` with storage failures turned into an error a model can act on."""
    try:
        return log.query(sql, params)
    except Exception as exc:  # sqlite3.Error, OSError: the file is broken or unreadable
        raise CoordexError(
            "environment", f"The call log at {str(log.path)!r} cannot be read: {exc}.",
            "Free disk space or fix the file's permissions; if the file is corrupt, move it "
            "away and a new log starts with the next call.")
