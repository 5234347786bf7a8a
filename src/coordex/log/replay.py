"""Rebuilding a session from the call log: ``Executor.rebuild_session``.

The rows of the named session are read (this run's rows first; a session this run never
opened is taken from the newest run that logged it, so a session survives a restart of
the program), :func:`~coordex.log.rebuild.lost_calls` picks the calls that built the
lost state, the session is started over (closed if it is open) and a ``rebuild`` row
marks the new life, then each call runs again through ``replay`` (the executor's
``execute_code`` with the original's number passed along, so it is logged too, as a
replay of its original), stopping at the first that fails. Otherwise only the
executor's public methods are used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..contract import ExecutorLike
from ..core import coordinates as coords
from ..core.coordinates import Coordinate
from ..core.errors import CoordexError, make_error
from ..core.messages import session_arguments
from .calls import read
from .rebuild import (
    failed_in,
    lives,
    lost_life,
    ran_in_session,
    replay_failed,
    replayable,
    unfinished_rebuild,
)
from .store import CallLog, decode_row, rows_where

# ``replay(seq, code, language=, venv_id=, timeout=, session_id= | session_name=)``:
# run logged call ``seq``'s code again in the stateful session named, its row marked
# ``replay_of`` ``seq``.
Replay = Callable[..., dict[str, Any]]

_ROW_COLUMNS = ("seq, owner, kind, language, venv_id, session_id, session_name, state_mode, "
                "code, code_truncated, duration_ms, outcome, exit_code, state_lost, changed, "
                "replay_of")


def rebuild_session(executor: ExecutorLike, log: CallLog, language: Any, session_id: Any,
                    session_name: Any, venv_id: Any, *, replay: Replay) -> dict[str, Any]:
    """Replay the calls that built a lost or closed session. Raises CoordexError."""
    coordinate = coords.check_coordinate(language, "stateful", session_id, session_name, venv_id)
    rows = _session_rows(log, coordinate)
    if not any(ran_in_session(row) for row in rows):
        raise _nothing_logged(log, coordinate)
    mine = rows[-1]["owner"] == log.owner
    open_record = _open_session(executor, coordinate) if mine else None
    live = open_record is not None and bool(open_record.get("alive"))
    plan = coordinate.language == "python" and coordinate.venv_id is None and \
        not coordinate.session_name and not coordinate.session_id
    retry = unfinished_rebuild(rows)
    life = None if retry is not None else lost_life(rows, live=live or (plan and mine))
    calls = _rows_by_seq(log, retry) if retry is not None else \
        None if life is None else [row for row in life if replayable(row)]
    identity = _identity(coordinate, rows)
    where = session_arguments(identity)
    if calls is None:
        raise CoordexError(
            "validation", f"The session ({where}) has lost nothing since it was "
            "created or last rebuilt; there is nothing to rebuild.",
            "Keep using it as it is; inspect_session shows what it holds.")
    if open_record is not None and not plan:
        closed = executor.close_session(language=coordinate.language,
                                        session_id=open_record["session_id"],
                                        venv_id=coordinate.venv_id)
        if "error_type" in closed:
            return closed
    log.event("rebuild", identity, {"replays": [row["seq"] for row in calls]})
    report = _replay(executor, replay, coordinate, identity, calls)
    report["calls"] = [row["seq"] for row in calls]
    report["skipped_failed"] = failed_in(life) if life is not None else []
    return report


def _replay(executor: ExecutorLike, replay: Replay, coordinate: Coordinate,
            identity: dict[str, Any], calls: list[dict[str, Any]]) -> dict[str, Any]:
    """Run ``calls`` again in order into the session ``identity`` names; stop at the
    first that cannot run or fails."""
    target = ({"session_name": identity["session_name"]} if identity.get("session_name")
              else {"session_id": identity.get("session_id") or 0})
    report: dict[str, Any] = {"replayed": 0, "failed_at": None, "session": identity}
    for row in calls:
        failure = _cannot_replay(row)
        if failure is None:
            result = replay(row["seq"], row["code"], language=coordinate.language,
                            venv_id=coordinate.venv_id,
                            timeout=_replay_timeout(executor, row), **target)
            report["session"] = result.get("session") or report["session"]
            if replay_failed(row, result):
                failure = {k: result[k] for k in ("error", "error_type", "suggestion",
                                                  "exit_code", "stderr") if k in result}
        if failure is not None:
            report.update(failed_at=row["seq"], failure=failure)
            break
        report["replayed"] += 1
    return report


def _cannot_replay(row: dict[str, Any]) -> dict[str, Any] | None:
    """Why a logged call cannot run again as it first ran, or None."""
    code = row.get("code")
    if row.get("code_truncated") or not isinstance(code, str):
        return make_error(
            "validation", f"Call {row['seq']} was longer than the log keeps (64 KiB), so it "
            "cannot be replayed.", "Run that step again yourself, then continue.")
    if _IN_PROCESS_ARGUMENTS in code:
        return make_error(
            "validation", f"Call {row['seq']} was a stored-function call in the agent's own "
            "interpreter; its arguments were live objects, which the log does not keep, so it "
            "cannot be replayed.",
            "Call that function again yourself with the same arguments, then continue.")
    return None


# How a stored-function call in the agent's own interpreter reaches its arguments: a
# slot in the host's memory (coordex.library.functions.call_code), gone after the call.
_IN_PROCESS_ARGUMENTS = "fromlist=['_SLOTS'])._SLOTS["


def _replay_timeout(executor: ExecutorLike, row: dict[str, Any]) -> float:
    """The executor's timeout, or more for a step that took long the first time (its
    own timeout is not logged): a replay should not fail only for being slow."""
    took = (row.get("duration_ms") or 0.0) / 1000.0
    return float(max(executor.timeout, 2 * took + 5.0))


def _session_rows(log: CallLog, coordinate: Coordinate) -> list[dict[str, Any]]:
    """The session's rows of one run (this run's if any, else the newest run's), after
    the rows of the run before when the session came into this run lost."""
    filters: list[tuple[str, Any]] = [("language", coordinate.language),
                                      ("venv_id", coordinate.venv_id)]
    if coordinate.session_name is not None:
        filters.append(("session_name", coordinate.session_name))
    else:
        filters.append(("session_id", coordinate.session_id or 0))
    where, params = rows_where(filters)
    ran = f"{where} AND {_RAN_IN_SESSION}"
    owners = read(log, f"SELECT owner FROM calls WHERE {ran} AND owner = ? LIMIT 1",
                  [*params, log.owner]) or \
        read(log, f"SELECT owner FROM calls WHERE {ran} ORDER BY seq DESC LIMIT 1", params)
    if not owners:
        return []
    rows = [decode_row(row) for row in read(
        log, f"SELECT {_ROW_COLUMNS} FROM calls WHERE {where} AND owner = ? ORDER BY seq",
        [*params, owners[0]["owner"]])]
    first = next((row for row in rows if ran_in_session(row)), None)
    if owners[0]["owner"] == log.owner and first is not None and \
            first.get("kind") == "call" and first.get("state_lost"):
        # The session came into this run lost (what kept it on disk was lost): the
        # state it lost was built by the run before that logged it.
        before = read(log, f"SELECT owner FROM calls WHERE {ran} AND owner != ? AND seq < ? "
                      "ORDER BY seq DESC LIMIT 1", [*params, log.owner, first["seq"]])
        if before:
            rows = [decode_row(row) for row in read(
                log, f"SELECT {_ROW_COLUMNS} FROM calls WHERE {where} AND owner = ? AND "
                "seq < ? ORDER BY seq", [*params, before[0]["owner"], first["seq"]])] + rows
    return rows


# rebuild.ran_in_session as SQL: which run's rows a rebuild reads is decided by rows of
# things that happened to the session, never by a not_found answer about it.
_RAN_IN_SESSION = ("(kind IN ('close', 'rebuild') OR (kind = 'call' AND (outcome IS NULL OR "
                   "outcome NOT IN ('validation', 'not_found', 'capacity')) AND "
                   "(state_mode = 'stateful' OR (state_mode = 'read_only' AND state_lost = 1))))")


def _rows_by_seq(log: CallLog, seqs: list[int]) -> list[dict[str, Any]]:
    marks = ", ".join("?" * len(seqs))
    rows = read(log, f"SELECT {_ROW_COLUMNS} FROM calls WHERE seq IN ({marks}) ORDER BY seq",
                list(seqs))
    return [decode_row(row) for row in rows]


def _open_session(executor: ExecutorLike, coordinate: Coordinate) -> dict[str, Any] | None:
    """The session's list_sessions record if it is open in this executor."""
    for record in executor.list_sessions().get("sessions", []):
        if record.get("language") != coordinate.language or \
                record.get("venv_id") != coordinate.venv_id:
            continue
        if coordinate.session_name is not None:
            if record.get("session_name") == coordinate.session_name:
                return record
        elif record.get("session_id") == (coordinate.session_id or 0):
            return record
    return None


def _identity(coordinate: Coordinate, rows: list[dict[str, Any]]) -> dict[str, Any]:
    last = [row for row in rows if ran_in_session(row)][-1]
    return {"language": coordinate.language, "venv_id": coordinate.venv_id,
            "session_id": last.get("session_id") if coordinate.session_id is None
            else coordinate.session_id,
            "session_name": coordinate.session_name or last.get("session_name")}


def _nothing_logged(log: CallLog, coordinate: Coordinate) -> CoordexError:
    rows = read(log, "SELECT language, venv_id, session_id, session_name, MAX(seq) AS last "
                f"FROM calls WHERE kind = 'call' AND {_RAN_IN_SESSION} GROUP BY language, "
                "venv_id, session_id, session_name ORDER BY last DESC LIMIT 20", [])
    known = ", ".join(f"({session_arguments(r)})" for r in rows) or "none"
    wanted = session_arguments({"language": coordinate.language, "venv_id": coordinate.venv_id,
                                "session_id": coordinate.session_id or 0,
                                "session_name": coordinate.session_name})
    return CoordexError(
        "not_found", f"The call log holds no calls of the session ({wanted}).",
        f"Sessions with stateful calls in the log: {known}. Name one of them.")


def closed_sessions(log: CallLog, limit: int = 20, scan: int = 5_000) -> list[dict[str, Any]]:
    """Sessions whose last life ended with ``close_session`` and holds calls a rebuild
    would replay (newest first, at most ``limit``; the newest ``scan`` rows of things
    that happened to sessions are read): each a session record with ``closed: true``,
    ``closed_at``, ``calls`` (the calls of that life) and ``last_used_at``. A session
    opened again since (or still kept on disk) ends with something else and is not one."""
    rows = read(log, "SELECT seq, owner, kind, language, venv_id, session_id, session_name, "
                f"state_mode, outcome, state_lost, at FROM calls WHERE {_RAN_IN_SESSION} "
                "ORDER BY seq DESC LIMIT ?", [scan])
    by_session: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in reversed([decode_row(r) for r in rows]):
        named = row.get("session_name") is not None
        key = (row.get("language"), row.get("venv_id"),
               row.get("session_name") if named else (row.get("session_id"), row.get("owner")))
        by_session.setdefault(key, []).append(row)
    found = []
    for session_rows in by_session.values():
        history = lives(session_rows)
        if not history or history[-1][-1].get("kind") != "close":
            continue
        life = history[-1]
        calls = [row for row in life if row.get("kind") == "call"]
        if not any(replayable(row) for row in life):
            continue
        last = life[-1]
        found.append({"language": last.get("language"), "venv_id": last.get("venv_id"),
                      "session_id": last.get("session_id"),
                      "session_name": last.get("session_name"), "closed": True,
                      "closed_at": last.get("at"), "calls": len(calls),
                      "last_used_at": calls[-1].get("at") if calls else last.get("at"),
                      "created_at": life[0].get("at"), "alive": False, "held": False})
    found.sort(key=lambda record: -(record["closed_at"] or 0))
    return found[:limit]
