"""One call of code, from its arguments to its result: validate → table → place → render.

:func:`execute` is the body of every ``execute_code`` and stored-function call an
:class:`~coordex.executor.Executor` makes:

1. **validate** the code and the coordinate (pure core), refusing with a
   :class:`~coordex.core.errors.CoordexError`;
2. **table**: ask the session table (:mod:`coordex.sessions`) for the session the
   coordinate names (a stateless call takes none);
3. **place**: run the attempts there by mode; the table settles them into one
   :class:`~coordex.core.record.Settled` and decides the session's lifecycle from it;
4. **render**: add what only this call knows (the session, a restore, who stopped it,
   whether the log is on) into one :class:`~coordex.core.record.CallRecord` and turn
   it into the result with :func:`~coordex.core.record.render`, once.

After the result is made it is fitted to the result budget (whole outputs spilled to
files, SPEC 14), its row is written to the call log, and a kept session is marked for
its next snapshot: each gets the facts it needs as arguments, never through the result
or a thread-local.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from . import sessions, spill
from .backends.base import SESSION_CWD, OutputCallback, RunRequest, RunsNested, new_scratch, remove_scratch
from .core import coordinates as coords
from .core.bindings import bound_names
from .core.coordinates import Coordinate, Language, SessionKey, StateMode
from .core.errors import CoordexError, validation
from .core.record import CallRecord, Settled, StoppedBy, render, stopped_by
from .core.results import session_record
from .log.calls import Changed, changes, record_call
from .log.running import where
from .observe.hook import call_env, watch_call

if TYPE_CHECKING:
    from .executor import Executor
    from .log.detached import CallRecord as Recorded


class Done:
    """What the table and the place gave back for one call, before it is rendered.

    ``settled`` None: the session stayed busy for the whole timeout (nothing ran).
    ``changed``: the call log's ``changed`` column (None: the log is off or nothing
    changed). ``call``: the stateful call's number in its session, ``names_changed``
    whether it changed what a snapshot keeps (a kept session's next snapshot).
    """

    __slots__ = ("call", "changed", "names_changed", "restore_lost", "restored", "session",
                 "settled")

    def __init__(self, settled: Settled | None, session: dict[str, Any],
                 restored: dict[str, Any] | None = None, restore_lost: bool = False,
                 call: int | None = None) -> None:
        self.settled, self.session = settled, session
        self.restored, self.restore_lost, self.call = restored, restore_lost, call
        self.changed: Changed = None
        self.names_changed = False


def watched_start(ex: Executor, code: str, language: Language, state_mode: StateMode,
                  session_id: int | None, session_name: str | None, venv_id: int | None,
                  timeout: float | None, on_output: OutputCallback | None,
                  on_progress: Callable[[str], None] | None, cancel: threading.Event | None,
                  wait: float | None, *,
                  replay_of: int | None = None, recorded: Recorded | None = None
                  ) -> dict[str, Any]:
    """``execute_code`` as observed (SPEC 16): :func:`start` inside its span, if any.
    ``replay_of``: the logged call a rebuild replays (its row says so); ``recorded``:
    the call record (SPEC 14) of the call making this one (a rebuild given ``wait``)."""
    watch = watch_call("execute_code")  # None unless someone observes (SPEC 16)
    if watch is None:
        return start(ex, code, language, state_mode, session_id, session_name, venv_id,
                     timeout, on_output, on_progress, cancel, wait, replay_of=replay_of,
                     recorded=recorded)
    result: dict[str, Any] | None = None
    try:
        result = start(ex, code, language, state_mode, session_id, session_name, venv_id,
                       timeout, on_output, on_progress, cancel, wait, replay_of=replay_of,
                       recorded=recorded)
    finally:
        watch.done({"code": code, "language": language, "state_mode": state_mode,
                    "session_id": session_id, "session_name": session_name,
                    "venv_id": venv_id}, result)
        watch.close()
    return result


def replay(ex: Executor, seq: int, code: str, *, language: Any, venv_id: Any,
           timeout: Any, session_id: Any = None, session_name: Any = None,
           recorded: Recorded | None = None) -> dict[str, Any]:
    """A rebuild's replay of logged call ``seq``: ``execute_code(code)`` in the stateful
    session named, whose row is marked ``replay_of`` ``seq``; ``recorded``: the
    rebuild's call record, when it was given ``wait``."""
    return watched_start(ex, code, language, "stateful", session_id, session_name, venv_id,
                         timeout, None, None, None, None, replay_of=seq, recorded=recorded)


def start(ex: Executor, code: str, language: Language, state_mode: StateMode,
          session_id: int | None, session_name: str | None, venv_id: int | None,
          timeout: float | None, on_output: OutputCallback | None,
          on_progress: Callable[[str], None] | None, cancel: threading.Event | None,
          wait: float | None, *,
          replay_of: int | None = None, recorded: Recorded | None = None) -> dict[str, Any]:
    """``execute_code``: run now (:func:`execute`), or through the call records of SPEC
    14 when given ``wait`` or when a detached call or a held result exists. A call made
    by a recorded call (``recorded``: a rebuild's replays) runs as it is, under that
    record: its cancel reaches it, and the book does not see it again."""
    if recorded is not None or (wait is None and not ex._calls.active):
        if cancel is None and recorded is not None:
            cancel = recorded.cancel
        return execute(ex, code, language, state_mode, session_id, session_name, venv_id,
                       timeout, on_output, on_progress, cancel, ex.output_limit, nested=False,
                       replay_of=replay_of, recorded=recorded)
    asked = {"code": code, "language": language, "state_mode": state_mode,
             "session_id": session_id, "session_name": session_name, "venv_id": venv_id,
             "timeout": timeout}

    def run(output: OutputCallback | None, event: threading.Event | None,
            record: Recorded | None) -> dict[str, Any]:
        return execute(ex, code, language, state_mode, session_id, session_name, venv_id,
                       timeout, output, on_progress, event, ex.output_limit, nested=False,
                       replay_of=replay_of, recorded=record)

    return ex._calls.run("execute_code", asked, state_mode, run, wait, on_output, cancel)


def execute(ex: Executor, code: str, language: Language, state_mode: StateMode,
            session_id: int | None, session_name: str | None, venv_id: int | None,
            timeout: float | None, on_output: OutputCallback | None,
            on_progress: Callable[[str], None] | None, cancel: threading.Event | None,
            output_limit: int, *, nested: bool, replay_of: int | None = None,
            recorded: Recorded | None = None) -> dict[str, Any]:
    """The body of every call: validate, run where the coordinate says, render.

    ``nested`` marks a stored-function call, which may come from code running in the
    very session it names (see :func:`_active_session`). ``recorded``: the call record
    (SPEC 14) this call runs under, passed down from the book: its ``call_id`` goes on
    this call's log row if no earlier call under it took it, and the page shows it.
    """
    started = time.perf_counter()
    coordinate: Coordinate | None = None
    seq: int | None = None  # the call's log row, where one was reserved while it ran
    tee: spill.Tee | None = None  # a stored function's inner call is fitted by its caller
    done: Done | None = None
    log_on = ex._call_log is not None
    # Taken as the call begins: a stored function this call's code calls finds it said.
    # A rebuild's replay leaves it to the rebuild's own reply (its row would otherwise
    # start a new life in the log, and the loss reach no one).
    lost_before = (replay_of is None and ex._table.unsaid_loss
                   and ex._table.take_unsaid_loss())
    call_id = recorded.take_row_id() if recorded is not None else None
    try:
        code = coords.check_code(code)
        coordinate = coords.check_coordinate(language, state_mode, session_id,
                                             session_name, venv_id)
        limit = coords.check_timeout(timeout) or ex.timeout
        if on_output is not None and not callable(on_output):
            raise validation("on_output must be a callable taking (stream, text).",
                             "Pass a function like lambda stream, text: ..., or None.")
        ex._check_open()
        if cancel is None and ex._ui is not None:  # the page may interrupt it
            cancel = threading.Event()
        running = ex.running_calls.start(
            where(coordinate.language, coordinate.venv_id, coordinate.session_id,
                  coordinate.session_name, coordinate.state_mode), code, cancel, on_output)
        running.recorded = recorded
        if not nested:
            tee = spill.Tee(ex.spill_folder, output_limit, running.output)
        try:
            request = RunRequest(code, limit, tee or running.output, output_limit,
                                 cancel=cancel, env=call_env(),
                                 on_progress=running.progress(on_progress),  # the page sees builds
                                 value_limit=None if nested else spill.VALUE_KEEP_CHARS)
            active = _active_session(ex, coordinate) if nested else None
            if active is None:
                done = dispatch(ex, coordinate, request)
            else:
                done = _run_in_active(ex, active, coordinate, request)
        finally:
            seq = ex.running_calls.finish(running)
    except CoordexError as exc:
        record = CallRecord(
            coordinate.state_mode if coordinate is not None else None,
            _asked_session(coordinate), ms(started), refused=exc, log_on=log_on,
            lost_before=lost_before)
    else:
        # A person stopped it from the page (this one's, or the owner's of a forwarded
        # call), or its caller cancelled it.
        stopped: StoppedBy | None = "person" if running.interrupted else stopped_by(cancel)
        record = CallRecord(coordinate.state_mode, done.session, ms(started), done.settled,
                            None, done.restored, done.restore_lost, stopped, log_on,
                            lost_before)
    result = render(record)
    if tee is not None:
        result = tee.finish(result, output_limit)
    asked = None if coordinate is not None else (language, state_mode, session_id,
                                                  session_name, venv_id)
    row = record_call(ex._call_log, result, code, coordinate, seq, asked,
                      changed=done.changed if done is not None else None, call_id=call_id,
                      replay_of=replay_of)
    if done is not None and done.call is not None:
        ex._keeping.logged(result, row, done.call, done.names_changed)
    return result


def ms(started: float) -> float:
    """Milliseconds since ``started`` (a ``time.perf_counter()``)."""
    return round((time.perf_counter() - started) * 1000.0, 3)


def _asked_session(coordinate: Coordinate | None) -> dict[str, Any] | None:
    """The session a refused call named (its suggestion may name the rebuild call)."""
    if coordinate is None or coordinate.state_mode == "stateless":
        return None
    return {"language": coordinate.language, "venv_id": coordinate.venv_id,
            "session_id": coordinate.session_id, "session_name": coordinate.session_name}


def dispatch(ex: Executor, coordinate: Coordinate, request: RunRequest) -> Done:
    """Run the call where its coordinate says; the one switch on its state mode."""
    if coordinate.venv_id is not None:
        ex._require_environment(coordinate.venv_id)
    if coordinate.state_mode == "stateless":
        record = session_record(coordinate.language, coordinate.venv_id, None, None)
        place = ex._place(coordinate.language, coordinate.venv_id, request.on_progress)
        return Done(sessions.attempts(place, "stateless", request), record)
    if coordinate.state_mode == "stateful":
        return run_stateful(ex, coordinate, request)
    return _run_read_only(ex, coordinate, request)


def run_stateful(ex: Executor, coordinate: Coordinate, request: RunRequest) -> Done:
    """A stateful call: the session (opened, and restored if kept, on its first call),
    run through the table, its names recorded."""
    ex._keeping.claim(coordinate)
    table = ex._table
    with table.stateful(coordinate, request.timeout, request.cancel, functools.partial(
            ex._open_session, on_progress=request.on_progress)) as (key, session, call):
        record = table.record(key)
        if session is None:
            return Done(None, record)
        place = ex._place(key.language, key.venv_id)
        restored = ex._keeping.opening(key, record, session, call, ex.timeout * 5)
        restore_lost = bool(restored is not None and restored.get("state_lost"))
        settled: Settled | None = None
        rebound: Sequence[str] = ()
        deleted: Sequence[str] = ()
        try:
            settled = table.run(key, place, "stateful", request)
            if not callable(settled.rebound):  # (only a read-only copy's can be)
                rebound = settled.rebound
            deleted = settled.deleted
            if key.language == "python" and not settled.errored:
                # ``x = 41`` again is a rebinding though the object is the same one.
                rebound = list(dict.fromkeys([*(rebound or ()), *bound_names(request.code)]))
        finally:
            table.finish(key, call, settled, rebound, deleted,
                         lost=settled is not None and (restore_lost or settled.lost))
        done = Done(settled, record, restored=None if restore_lost else restored,
                    restore_lost=restore_lost, call=call)
        if ex._call_log is not None:
            done.changed = changes(rebound, deleted)
        done.names_changed = ex._keeping.names_changed(key, rebound, deleted)
        return done


def bring_back(ex: Executor, coordinate: Coordinate, timeout: float) -> dict[str, Any] | None:
    """A kept session not yet restored, named by a read-only call, an inspection, a fork
    or a rebuild: opened and restored first, as its first stateful call would (SPEC 12).
    Returns what the restore says."""
    if ex._keeping.waiting(coordinate) is None:
        return None
    opening = replace(coordinate, state_mode="stateful")
    return run_stateful(ex, opening, RunRequest(code="", timeout=timeout)).restored


def _run_read_only(ex: Executor, coordinate: Coordinate, request: RunRequest) -> Done:
    restored = ex._bring_back(coordinate, request.timeout)
    with ex._table.reading(coordinate, request.timeout, request.cancel) as (key, slot):
        record = ex._table.record(key)
        if slot is None or slot.session is None:
            return Done(None, record)
        ex._table.count_call(key)
        with protected(ex, request) as copy_request:
            place = ex._place(key.language, key.venv_id)
            settled = ex._table.run(key, place, "read_only", copy_request)
        done = Done(settled, record, restored=restored)
        if ex._call_log is not None:  # what the copy would have changed (all discarded)
            done.changed = changes(settled.rebound, settled.deleted, settled.ran.written)
        return done


@contextlib.contextmanager
def protected(ex: Executor, request: RunRequest) -> Iterator[RunRequest]:
    """``request`` with a fresh scratch folder and the folders to protect (SPEC
    guarantee 3); the scratch folder, if the place made it, is removed when the call is
    over."""
    scratch = new_scratch()  # made by the place, if it uses one (make_scratch)
    try:
        yield replace(request, protect_paths=_protect_paths(ex), scratch=scratch,
                      report_changes=ex._call_log is not None)
    finally:
        remove_scratch(scratch)


def _protect_paths(ex: Executor) -> tuple[str, ...]:
    # Places resolve SESSION_CWD against the session's own cwd where the copy runs.
    if ex.read_only_paths is not None:
        return tuple(ex.read_only_paths)
    return (SESSION_CWD, os.path.expanduser("~"))


# -- a stored function called from code running in the session it names --------------


def _run_in_active(ex: Executor, active: tuple[SessionKey, RunsNested],
                   coordinate: Coordinate, request: RunRequest) -> Done:
    key, session = active
    place = ex._place(key.language, key.venv_id)
    if coordinate.state_mode == "read_only":
        with protected(ex, request) as copy_request:
            settled = sessions.settle(place, "read_only", functools.partial(
                session.run_nested, read_only=True), copy_request)
    else:  # nested: runs inline on this thread, inside the outer call
        settled = sessions.settle(place, "stateful", functools.partial(
            session.run_nested, read_only=False), request)
    return Done(settled, ex._table.record(key))  # the outer call records what changed


def _active_session(ex: Executor, coordinate: Coordinate) -> tuple[SessionKey, RunsNested] | None:
    """The own-interpreter session ``coordinate`` names if this thread is running code
    in it right now (its namespace is the globals of a frame on the stack)."""
    import sys

    from .backends.own.output import local as own_call

    if coordinate.venv_id is not None or coordinate.state_mode == "stateless":
        return None
    if not getattr(own_call, "in_call", False):
        return None
    found = ex._table.find(coordinate)
    if found is None:
        return None
    key, slot = found
    session = slot.session
    if isinstance(session, RunsNested) and session.running_here(sys._getframe(1)):
        return key, session
    return None
