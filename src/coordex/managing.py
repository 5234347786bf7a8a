"""The session tools over the session table: list, inspect, close and rebuild.

Each is the body of one public method of :class:`~coordex.executor.Executor` (which
keeps the signature and the docstring); each returns its SPEC dict and never raises
for bad arguments.
"""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING, Any

from . import branches, calling, spill
from .core import coordinates as coords
from .core import messages
from .core.errors import CoordexError, validation
from .log.calls import log_off_error

if TYPE_CHECKING:
    from .executor import Executor
    from .log.detached import CallRecord as Recorded


def list_sessions(ex: Executor) -> dict[str, Any]:
    """All open sessions with their provenance, and the cap (none once closed)."""
    records: list[dict[str, Any]] = []
    max_sessions = ex._table.registry.max_sessions
    if ex._table.closed:
        return {"sessions": records, "max_sessions": max_sessions}
    for entry, session in ex._table.entries():
        record = entry.record()
        if session is not None:
            with contextlib.suppress(Exception):
                record["alive"] = bool(session.alive())
            node = getattr(session, "node", None)
            if node:  # placed on a cluster node
                record["node"] = node
        record["held"] = True  # held by this process (SPEC 12: kept ones are not)
        records.append(record)
    ex._calls.mark_busy(records)  # SPEC 14: the sessions detached calls hold
    records.extend(ex._keeping.listed())
    return {"sessions": records, "max_sessions": max_sessions}


def inspect_session(ex: Executor, language: Any, session_id: Any, session_name: Any,
                    venv_id: Any) -> dict[str, Any]:
    """What a session holds. Without a session: session 0 of that place.

    Python: ``{"names": [{"name","type","repr","bound_at_call","calls_ago"}], ...}``
    with capabilities and ``functions`` listed apart. Bash: ``{"cwd", "variables",
    "functions", "aliases"}`` — only what the session added. Changes nothing.
    """
    try:
        coordinate = coords.check_coordinate(language, "stateful", session_id,
                                             session_name, venv_id)
        restored = ex._bring_back(coordinate, ex.timeout)
        with ex._table.reading(coordinate, ex.timeout, None) as (key, slot):
            if slot is None or slot.session is None:
                return messages.session_busy()
            report = ex._table.inspect(key, slot, ex._place(key.language,
                                                                key.venv_id))
        if "error_type" in report:  # one failure shape in every place: the error dict
            report["session"] = ex._table.record(key)
            return report
        if key.language == "python":
            for item in report.get("names", []):
                bound, ago = ex._table.provenance(key, item["name"])
                item["bound_at_call"], item["calls_ago"] = bound, ago
            report.setdefault("capabilities", sorted(ex._capabilities))
        report["session"] = ex._table.record(key)
        ex._keeping.describe(report)  # SPEC 12: how it is kept on disk
        if restored is not None:
            report["restored"] = restored
        return report
    except CoordexError as exc:
        return exc.to_dict()


def close_session(ex: Executor, language: Any, session_id: Any, session_name: Any,
                  venv_id: Any) -> dict[str, Any]:
    """Close one session and end its process. Needs a session; never session 0 of
    the own interpreter's Python (the plan namespace)."""
    try:
        coordinate = coords.check_coordinate(language, "stateful", session_id,
                                             session_name, venv_id)
        ex._check_open()
        if not coordinate.names_session:
            raise validation(
                "close_session needs a session: pass session_id or session_name.",
                "Call list_sessions() to see open sessions, then close_session("
                "language=..., session_name='...') or session_id=<int>.")
        kept = ex._keeping.close_waiting(coordinate)  # kept on disk only: its snapshot goes
        if kept is not None:
            branches.forget(ex, kept.record())
            if ex._call_log is not None:  # a rebuild brings it back from the log
                ex._call_log.event("close", kept.record())
            return {"closed": True, "session": kept.record()}
        record, session = ex._table.remove(coordinate)
        if session is not None:
            session.close()
        ex._keeping.forget(record)
        branches.forget(ex, record)  # its checkpoints go with it (SPEC 15)
        if ex._call_log is not None:
            ex._call_log.event("close", record)
        spill.forget_session(ex.spill_folder, record)
        return {"closed": True, "session": record}
    except CoordexError as exc:
        return exc.to_dict()


def history(ex: Executor, language: Any, session_id: Any, session_name: Any, venv_id: Any,
            limit: Any, seq: Any, **narrow: Any) -> dict[str, Any]:
    """The call log's newest calls, or one call (``history`` of SPEC 11)."""
    from .log.calls import history as read

    try:
        if ex._call_log is None:
            raise log_off_error("history")
        return read(ex._call_log, language, session_id, session_name, venv_id, limit, seq,
                    **narrow)
    except CoordexError as exc:
        return exc.to_dict()


def rebuild_session(ex: Executor, language: Any, session_id: Any, session_name: Any,
                    venv_id: Any, recorded: Recorded | None = None) -> dict[str, Any]:
    """``rebuild_session`` (see :meth:`coordex.executor.Executor.rebuild_session`): from a
    kept session's snapshot where there is one, else by replaying the call log.
    ``recorded``: the rebuild's call record (given ``wait``); its replays run under it."""
    from .log.replay import rebuild_session as replay

    try:
        ex._check_open()
        rebuilt = ex._keeping.rebuild(
            coords.check_coordinate(language, "stateful", session_id, session_name, venv_id),
            ex.timeout, ex._bring_back)
        if rebuilt is not None:
            return rebuilt
        if ex._call_log is None:
            raise log_off_error("rebuild_session")
        return replay(ex, ex._call_log, language, session_id, session_name, venv_id,
                      replay=functools.partial(calling.replay, ex, recorded=recorded))
    except CoordexError as exc:
        return exc.to_dict()
