"""The page's JSON API (SPEC section 11), over any executor-like object.

Each route is a function ``(executor, arguments) -> Response`` that the app runs on a
thread of the tenant's own. Every answer is the executor's own result or error dict.
What the executor offers is all that is used: ``list_sessions``, ``inspect_session``,
``close_session``, ``rebuild_session``, ``list_checkpoints``, ``restore_session`` and
``history`` (whose filters ``outcome``,
``state_mode``, ``text`` and ``after_seq`` the page's list of calls uses); the calls in
flight come from :func:`coordex.log.running.calls_of`, which a confined host's client
gets from the front end that hands it its calls.

A session with a call in flight is *busy*: the page shows it so and never inspects it
(an inspection would wait for the call to end).
"""

from __future__ import annotations

import json
import time
import weakref
from collections.abc import Callable
from typing import Any

from ..contract import ExecutorLike
from ..core.errors import CoordexError
from ..core.lineage import forked_from
from ..log.running import calls_of
from .http import MAX_BODY, Request, Response, json_response

Handler = Callable[[Any, dict[str, Any]], Response]

_SESSION_KEYS = ("language", "venv_id", "session_id", "session_name")
_INT_ARGUMENTS = ("venv_id", "session_id", "after_seq", "limit", "seq")


def _ok(value: Any) -> Response:
    # The body is the executor's own dict either way; the status only helps a program.
    kind = value.get("error_type") if isinstance(value, dict) else None
    return json_response(_STATUS.get(str(kind), 200), value)


_STATUS = {"not_found": 404, "validation": 400}


def _error(exc: CoordexError) -> Response:
    return _ok(exc.to_dict())


# -- reading -------------------------------------------------------------------------------


def _is_busy(session: dict[str, Any], running: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The call in flight that holds ``session``, if any."""
    for call in running:
        if call.get("state_mode") not in ("stateful", "read_only"):
            continue
        if (call.get("language"), call.get("venv_id")) != (session.get("language"),
                                                           session.get("venv_id")):
            continue
        if call.get("session_name") is not None:
            if call["session_name"] == session.get("session_name"):
                return call
        elif (call.get("session_id") or 0) == (session.get("session_id") or 0):
            return call
    return None


def sessions(executor: ExecutorLike, arguments: dict[str, Any]) -> Response:
    listed = executor.list_sessions()
    if "error_type" in listed:
        return _ok(listed)
    running = calls_of(executor).running()
    for session in listed.get("sessions", []):
        holder = _is_busy(session, running)
        session["busy"] = holder is not None
        session["busy_with"] = None if holder is None else holder.get("seq") or holder.get("id")
    for session in listed.get("sessions", []):
        source = forked_from(executor, session)
        if source is not None:  # SPEC 15: the page shows each session's branch
            session["forked_from"] = {k: source.get(k) for k in _SESSION_KEYS}
    listed["closed"] = _closed(executor, listed.get("sessions", []))
    return _ok(listed)


def _closed(executor: ExecutorLike, listed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Sessions closed with close_session that the log can rebuild (the page offers
    Rebuild for them); none where this process does not hold the log."""
    from ..log.replay import closed_sessions
    from ..log.store import CallLog

    log = getattr(executor, "_call_log", None)
    if not isinstance(log, CallLog):
        return []
    found = _CLOSED.get(log)
    if found is None or time.monotonic() - found[0] > _CLOSED_FOR:
        try:
            found = (time.monotonic(), closed_sessions(log))
        except CoordexError:
            found = (time.monotonic(), [])
        _CLOSED[log] = found
    closed = [dict(record) for record in found[1]]
    shown = {_where(s) for s in listed}
    return [s for s in closed if _where(s) not in shown]


# The log's closed sessions, read again at most every _CLOSED_FOR seconds (the page
# asks every second; a read scans the newest rows).
_CLOSED: weakref.WeakKeyDictionary[Any, tuple[float, list[dict[str, Any]]]] = \
    weakref.WeakKeyDictionary()
_CLOSED_FOR = 2.0


def _where(session: dict[str, Any]) -> tuple[Any, ...]:
    name = session.get("session_name")
    return (session.get("language"), session.get("venv_id"),
            name if name is not None else session.get("session_id") or 0)


def calls(executor: ExecutorLike, arguments: dict[str, Any]) -> Response:
    options = {k: arguments[k] for k in (*_SESSION_KEYS, "outcome", "state_mode", "text",
                                         "after_seq") if arguments.get(k) is not None}
    options["limit"] = arguments.get("limit") or 200
    return _ok(executor.history(**options))


def one_call(executor: ExecutorLike, arguments: dict[str, Any]) -> Response:
    return _ok(executor.history(seq=arguments.get("seq")))


def running(executor: ExecutorLike, arguments: dict[str, Any]) -> Response:
    return _ok({"running": calls_of(executor).running()})


def inspect(executor: ExecutorLike, arguments: dict[str, Any]) -> Response:
    session: dict[str, Any] = {k: arguments.get(k) for k in _SESSION_KEYS}
    session["language"] = session["language"] or "python"
    listed = executor.list_sessions().get("sessions", [])
    record = next((s for s in listed if all(
        session[k] is None or s.get(k) == session[k] for k in _SESSION_KEYS)), session)
    holder = _is_busy(record, calls_of(executor).running())
    if holder is not None:
        return _ok({"busy": True, "running": holder, "session": session})
    return _ok(executor.inspect_session(**session))


# -- acting --------------------------------------------------------------------------------


def interrupt(executor: ExecutorLike, arguments: dict[str, Any]) -> Response:
    try:
        return _ok(calls_of(executor).interrupt(arguments.get("seq"), arguments.get("id")))
    except CoordexError as exc:
        return _error(exc)


def close(executor: ExecutorLike, arguments: dict[str, Any]) -> Response:
    return _ok(executor.close_session(**_session(arguments)))


def rebuild(executor: ExecutorLike, arguments: dict[str, Any]) -> Response:
    return _ok(executor.rebuild_session(**_session(arguments)))


def checkpoints(executor: ExecutorLike, arguments: dict[str, Any]) -> Response:
    return _ok(executor.list_checkpoints(**_session(arguments)))


def restore(executor: ExecutorLike, arguments: dict[str, Any]) -> Response:
    return _ok(executor.restore_session(**_session(arguments),
                                        checkpoint=arguments.get("checkpoint")))


def _session(arguments: dict[str, Any]) -> dict[str, Any]:
    found = {k: arguments.get(k) for k in _SESSION_KEYS}
    found["language"] = found["language"] or "python"
    if found["session_name"] is not None:
        found["session_id"] = None  # the name is what the person picked
    return found


# -- routing -------------------------------------------------------------------------------

# (method, path) -> (handler, is_action)
_ROUTES: dict[tuple[str, str], tuple[Handler, bool]] = {
    ("GET", "api/sessions"): (sessions, False),
    ("GET", "api/calls"): (calls, False),
    ("GET", "api/history"): (calls, False),
    ("GET", "api/running"): (running, False),
    ("GET", "api/inspect"): (inspect, False),
    ("GET", "api/checkpoints"): (checkpoints, False),
    ("POST", "api/interrupt"): (interrupt, True),
    ("POST", "api/close"): (close, True),
    ("POST", "api/rebuild"): (rebuild, True),
    ("POST", "api/restore"): (restore, True),
}


def route(method: str, rest: str) -> tuple[Handler, bool] | int | None:
    """The handler for a request, 405 for a known path asked the wrong way, or None."""
    method = "GET" if method == "HEAD" else method
    if rest.startswith("api/calls/"):
        return (one_call, False) if method == "GET" else 405
    found = _ROUTES.get((method, rest))
    if found is not None:
        return found
    if any(path == rest for _, path in _ROUTES):
        return 405
    return None


def arguments(request: Request, rest: str) -> dict[str, Any] | Response:
    """The request's arguments: the query's, a POST's JSON body, ``calls/SEQ``'s seq.
    Numbers that do not parse are passed on as text, for the executor's own message."""
    found: dict[str, Any] = {k: v[0] for k, v in request.query.items() if k != "token" and v}
    if request.method == "POST":
        if len(request.body) > MAX_BODY:
            return json_response(413, {"error": "The request body is too large.",
                                       "error_type": "validation",
                                       "suggestion": "Send the session's coordinates only."})
        try:
            body = json.loads(request.body or b"{}")
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return json_response(400, {"error": "A POST body must be a JSON object.",
                                       "error_type": "validation",
                                       "suggestion": 'Send {"seq": N} or the session\'s '
                                       "language, venv_id and session_id or session_name."})
        found.update(body)
    if rest.startswith("api/calls/"):
        found["seq"] = rest[len("api/calls/"):]
    for key in _INT_ARGUMENTS:
        value = found.get(key)
        if isinstance(value, str):
            found[key] = None if value == "" else int(value) if _is_int(value) else value
    for key in ("language", "session_name", "outcome", "state_mode", "text"):
        if found.get(key) == "":
            found[key] = None
    return found


def _is_int(text: str) -> bool:
    return text.isdigit() or (text.startswith("-") and text[1:].isdigit())


def answer_now(handler: Handler, executor: ExecutorLike, arguments: dict[str, Any]) -> Response | None:
    """Answers that need no thread: the calls in flight and interrupting one only touch
    the registry in memory (never a session, never the log's file for a confined
    host's calls)."""
    if handler is interrupt:
        return interrupt(executor, arguments)
    return None
