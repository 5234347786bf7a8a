"""Python in the agent's own interpreter: sessions are namespaces in this process.

How it works:

- Each session is a namespace dict with its own working directory and ``os.environ``
  snapshot; session 0 is the plan namespace. Code runs through the shared cell engine
  (``worker/_coordex_engine.py``) so results, errors and figures look the same as in an
  environment worker.
- Code runs on a runner thread, never on the caller's thread, so a timeout can always
  return: the caller waits with a deadline, then raises :class:`engine.Interrupt` (a
  ``KeyboardInterrupt``; the code's own ``raise KeyboardInterrupt`` is an ordinary
  error) in the runner (``PyThreadState_SetAsyncExc``). Code stuck in C that ignores
  it keeps the session busy; later calls to that session return ``timeout`` at once
  until it ends. Runners belong to the interpreter, not to sessions: one serves every
  call, a stuck one is retired and ends with its code, so no thread is kept per
  session and nothing keeps a namespace alive once its call returned (a closed
  session's namespace, and a stateless call's, are emptied unless threads they
  started still run). The price is one thread hand-off per call: two wake-ups, ~5 us
  on one CPU, ~45 us each across CPUs on a small VM; once a hand-off crossed, the next
  ones hold both threads on the caller's CPU (:meth:`Runner.hold_together`).
- ``OwnInterpreter(inline=True)`` (``Executor(own_on_caller_thread=True)``) runs code
  called from the main thread on that thread instead: a watchdog thread that wakes
  only at the deadline signals it (the handler raises the interrupt; blocking calls
  return with EINTR first). That saves the hand-off (~8 us), but a timeout then
  returns only when code blocked in C that retries on signals (``os.system``) or code
  that catches every interrupt lets go, so it is not the default.
- Output: ``sys.stdout``/``sys.stderr`` are wrapped for the duration of each call by
  proxies that route each write to the call it belongs to: the call running on the
  writing thread, or for a thread the code started (``threading.Thread.start``
  records the call) that call while it runs; a thread of an ended call writes
  nowhere (SPEC 6: never into a later call, of its session or another); a host
  thread's prints wait and reach the host's stream
  once the call ended. Lone surrogates are escaped (``\\udce9``) as in every place.
  File descriptors 1/2 (child processes, C code) point at pipes whose reader thread
  streams them to the running call, and fd 0 is ``/dev/null`` so nothing waits on
  input. Because descriptors are process-wide, own-interpreter calls run one at a
  time (``OWN_LOCK``); worker and shell sessions still run in parallel with them.
- ``read_only`` runs against a copy (``copies``): a fork of this process made on the
  interpreter's runner thread, or, when a loaded library does not survive ``fork()``
  (polars, duckdb, grpc, torch) or ``fork`` is missing or unsafe (macOS), the session's
  values pickled into a fresh interpreter. Only the forking thread exists in a fork
  child; a lock another thread held at fork time stays held there, so code touching
  such an object can deadlock — the child is then killed at the timeout and the session
  is untouched either way.

What still leaks between own-interpreter sessions (they share one process):
``sys.modules`` and anything a module holds, monkeypatches, ``sys.path``, what
threads started by user code do besides printing (and what processes they start write
to fds 1/2 lands in whichever call runs then), signal handlers, and ``os._exit`` ends
the agent itself.

This module holds the sessions, the process-wide state a call switches to (cwd,
``os.environ``) and :class:`OwnInterpreter`; the runner thread and the watchdog are in
:mod:`.runner`, output routing and the fd pump in :mod:`.output`, read-only copies in
:mod:`.copies`.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from ...core import facts
from ...core.errors import ERROR_TYPES
from ...core.facts import Ran
from ...core.results import OutputBuffer
from ...worker import _coordex_engine as engine
from ...worker._coordex_env import enter as call_env_enter
from ...worker._coordex_env import leave as call_env_leave
from .._reap import OWNED_ENV
from ..base import INTERRUPT_GRACE, PAGER_ENV, RunRequest, emit, wait_for
from . import children, output
from .output import (
    Call,
    FdPump,
    any_alive,
    current_mark,
    install_streams,
    install_thread_origin,
    local,
    routed_streams,
    uninstall_streams,
)
from .runner import ON_CALLER, OnCaller, Runner, Watchdog, inline_ready

# fork() copies only the calling thread. On Linux and the BSDs the C library and CPython
# cope with that; on macOS system frameworks may abort in a child of a threaded process,
# so there read-only falls back to a shallow copy (and says ``objects: false``).
FORK_IS_SAFE = hasattr(os, "fork") and sys.platform != "darwin"

# One own-interpreter call at a time: file descriptors 0-2, the cwd and os.environ are
# process-wide. Re-entrant so a capability or stored function called from user code
# may run another own-interpreter call (it runs inline on the same thread).
OWN_LOCK = threading.RLock()
# What protects a read-only fork child's disk, called in the child: ``protect(map_identity)``
# (``isolation.protect``'s identity mapper for root, or None) returns the files mode.
Protect = Callable[[Callable[[str, str], bool] | None], str]


# --------------------------------------------------------------------------- sessions


@dataclass(eq=False)
class NamespaceSession:
    """One own-interpreter session: a namespace plus its own cwd and environment.

    ``runner`` is the runner holding the session's code (during a call, or after one
    whose code did not stop); ``current`` the call running now; ``threads`` the threads
    its code started. ``owns_namespace`` is False for a namespace the caller lent (the
    plan namespace, a view): closing never clears those.
    """

    namespace: dict[str, Any]
    cwd: str
    environ: dict[Any, Any]
    runner: Runner | OnCaller | None = None
    injected: set[str] = field(default_factory=set)
    current: Call | None = None
    threads: list[weakref.ref[threading.Thread]] = field(default_factory=list)
    owns_namespace: bool = True
    mark: str = ""  # what the processes its code starts carry (``children``)

    @property
    def stuck(self) -> bool:
        return self.runner is not None and self.runner.busy

    def threads_alive(self) -> bool:
        return any_alive(self.threads)

    def close(self) -> None:
        """Let go of what the session holds: its namespace is emptied at once (functions
        in it make cycles a collection would find only later), unless code or threads
        the session started still run in it; they keep it until they end."""
        if self.owns_namespace and not self.stuck and not self.threads_alive():
            self.namespace.clear()


def fresh_namespace() -> dict[str, Any]:
    return {"__name__": "__main__", "__builtins__": builtins}


class _session_process_state:
    """Enter a session's cwd and environment; on exit record them and restore the host's.

    ``call_env``: variables for this call alone (the trace context); the session keeps
    what it had under those names. (A class, not a generator: it runs twice a call.)
    ``os.environ`` is copied and compared only when it changed (the audit hook counts
    ``putenv``/``unsetenv`` in every thread); a call whose code leaves it alone pays
    for neither."""

    __slots__ = ("applied", "call_env", "changes", "host_cwd", "host_env", "marked",
                 "saved", "session")

    def __init__(self, session: NamespaceSession | None,
                 call_env: Mapping[str, str] | None = None) -> None:
        self.session = session
        self.call_env = call_env

    def __enter__(self) -> None:
        session = self.session
        self.host_cwd = host_cwd = _getcwd()
        self.host_env = host_env = _host_environ()
        self.marked = session is not None and bool(session.mark)
        self.applied = False
        if session is not None:
            if session.cwd != host_cwd:
                chdir(session.cwd)
            if session.environ != host_env:
                apply_environ(session.environ)
                self.applied = True
            if self.marked:  # what the code starts is the session's (``children``)
                _set_mark(session.mark)
        # The call's own variables (its trace context): set so as to leave nothing
        # behind in the C library (see _coordex_env), and taken out before the session's
        # environment is recorded below.
        self.saved = call_env_enter(self.call_env) if self.call_env else None
        # -1: not counted (no audit hook), so always compared
        self.changes = output.environ_changes[0] if output.counting_chdirs() else -1

    def __exit__(self, *exc: object) -> None:
        changed = self.changes < 0 or output.environ_changes[0] != self.changes
        if self.saved:
            call_env_leave(self.saved)
        if self.marked:
            _set_mark(None)
        cwd = _getcwd()
        session = self.session
        if changed:
            env = environ_snapshot()
            if session is not None:
                session.environ = env
            if env != self.host_env:
                apply_environ(self.host_env)
        elif self.applied:  # the code left the session's environment as it was
            apply_environ(self.host_env)
        if session is not None:
            session.cwd = cwd
        if cwd != self.host_cwd:
            chdir(self.host_cwd)
        # The process has the host's environment again: the next call need not copy it.
        _host_env[0], _host_env[1] = output.environ_changes[0], self.host_env


# [output.environ_changes when copied, os.environ then] (see ``_host_environ``)
_host_env: list[Any] = [-1, None]


def _host_environ() -> dict[Any, Any]:
    """The process environment as :func:`environ_snapshot` copies it; copied again only
    after a change (never to be changed: the same copy serves several calls)."""
    if _host_env[0] == output.environ_changes[0] and output.counting_chdirs():
        return cast(dict[Any, Any], _host_env[1])
    return environ_snapshot()


_ENCODE_KEY = getattr(os.environ, "encodekey", None)
_ENCODE_VALUE = getattr(os.environ, "encodevalue", None)
_OWNED_KEY = _ENCODE_KEY(OWNED_ENV) if _ENCODE_KEY is not None else OWNED_ENV


def _set_mark(mark: str | None) -> None:
    """Set (None: unset) ``OWNED_ENV`` as ``os.environ`` would, without its
    ``MutableMapping`` layers (two of them a call)."""
    data = getattr(os.environ, "_data", None)
    if not isinstance(data, dict) or _ENCODE_VALUE is None:
        if mark is None:
            os.environ.pop(OWNED_ENV, None)
        else:
            os.environ[OWNED_ENV] = mark
        return
    if mark is None:
        if data.pop(_OWNED_KEY, None) is not None:
            os.unsetenv(_OWNED_KEY)
    else:
        value = _ENCODE_VALUE(mark)
        os.putenv(_OWNED_KEY, value)
        data[_OWNED_KEY] = value


def environ_snapshot() -> dict[Any, Any]:
    """A cheap copy of the process environment in os.environ's own encoding.

    ``dict(os.environ)`` decodes every entry (~30 us for 35 variables); copying the
    encoded mapping costs about a microsecond, and the snapshot is only compared and
    re-applied, never shown.
    """
    data = getattr(os.environ, "_data", None)
    if isinstance(data, dict):
        return data.copy()
    return dict(os.environ)


def apply_environ(target: dict[Any, Any]) -> None:
    current = environ_snapshot()
    decode_key = getattr(os.environ, "decodekey", lambda k: k)
    decode_value = getattr(os.environ, "decodevalue", lambda v: v)
    for key in current:
        if key not in target:
            del os.environ[decode_key(key)]
    for key, value in target.items():
        if current.get(key) != value:
            os.environ[decode_key(key)] = decode_value(value)


_known_cwd: list[Any] = [-1, ""]  # [output.chdirs when read, the cwd then]


def _getcwd() -> str:
    """The process's cwd; read again only after an ``os.chdir`` (the audit hook counts
    them, in every thread), so a call costs no ``getcwd`` where the code moves nowhere."""
    count = output.chdirs[0]
    if _known_cwd[0] == count and output.counting_chdirs():
        return str(_known_cwd[1])
    try:
        cwd = os.getcwd()
    except OSError:  # the folder was removed under us
        return os.path.expanduser("~")
    _known_cwd[0], _known_cwd[1] = count, cwd
    return cwd


def chdir(path: str) -> None:
    with contextlib.suppress(OSError):
        os.chdir(path)


# --------------------------------------------------------------------------- backend


class OwnInterpreter:
    """Runs Python cells in this process. One instance per Executor."""

    def __init__(self, inline: bool = False) -> None:
        # Sessions run with PAGER_ENV. Where the host leaves these unset they are set in
        # the host too, so entering a session costs no environment change per call.
        for key, value in PAGER_ENV.items():
            os.environ.setdefault(key, value)
        install_thread_origin()
        install_streams()
        self._streams_released = False
        self.owned = children.Owned()
        children.current_mark = current_mark
        self._fds = FdPump()
        self._closed = False
        self._closing = threading.Event()
        self._runner: Runner | None = None
        # What runs the call now running (close() interrupts it).
        self._active_runner: Runner | Watchdog | None = None
        self.inline = inline
        encode_key = getattr(os.environ, "encodekey", lambda k: k)
        encode_value = getattr(os.environ, "encodevalue", lambda v: v)
        self._pager_environ = {encode_key(k): encode_value(v) for k, v in PAGER_ENV.items()}

    def new_session(self, namespace: dict[str, Any] | None = None) -> NamespaceSession:
        environ = environ_snapshot()
        environ.update(self._pager_environ)
        return NamespaceSession(namespace if namespace is not None else fresh_namespace(),
                                _getcwd(), environ, owns_namespace=namespace is None,
                                mark=self.owned.new_mark())

    # -- running -----------------------------------------------------------------------

    def run(self, session: NamespaceSession, request: RunRequest) -> Ran:
        """Stateful: run in the session's namespace; report rebound and deleted names."""
        if session.stuck:
            return Ran(facts.Busy(stuck=True))
        before = dict(session.namespace)
        ran = self._run_on(None, session, session.namespace, request)
        rebound, deleted = engine.changed_names(before, session.namespace)
        before.clear()
        return ran.naming(rebound, deleted)

    def run_stateless(self, request: RunRequest, extra_globals: dict[str, Any]) -> Ran:
        namespace = fresh_namespace()
        namespace.update(extra_globals)
        session = self.new_session(namespace)
        outcome = self._run_on(None, session, namespace, request)
        # Nothing is kept from a stateless call: its namespace goes now, not when a
        # collection finds the cycles its functions make, unless code or threads it
        # started still run in it.
        if not session.stuck and not session.threads_alive():
            namespace.clear()
        return outcome

    def _take_runner(self) -> Runner:
        """The idle runner (called under OWN_LOCK); a new one if the last got stuck."""
        runner = self._runner
        if runner is None or runner.busy or runner.retired:
            runner = self._runner = Runner()
        return runner

    def _run_on(self, runner: Any, session: NamespaceSession | None,
                namespace: dict[str, Any], request: RunRequest) -> Ran:
        """Run ``request`` in ``namespace``; ``runner`` is unused (the interpreter picks
        its own), kept so nested calls from the executor read the same."""
        out, err = OutputBuffer(request.output_limit), OutputBuffer(request.output_limit)
        # The runner thread (print), threads the code started and the fd pump (child
        # processes) all write here.
        sink_lock = threading.Lock()

        def sink_out(text: str) -> None:
            with sink_lock:
                out.write(text)
            emit(request, "stdout", text)

        def sink_err(text: str) -> None:
            with sink_lock:
                err.write(text)
            emit(request, "stderr", text)

        call = Call(sink_out, sink_err, session)
        self.owned.arm()
        if getattr(local, "in_call", False):
            return self._run_inline(call, namespace, request, out, err)
        watchdog = inline_ready() if self.inline else None
        if watchdog is not None:
            return self._run_here(watchdog, call, namespace, request, out, err)
        box: dict[str, Any] = {}

        def job() -> None:
            local.call, local.in_call = call, True
            try:
                box["cell"] = engine.run_cell(request.code, namespace, request.result_limit)
            finally:
                local.call = None
                local.in_call = False

        deadline = time.monotonic() + request.timeout
        if not OWN_LOCK.acquire(timeout=request.timeout):
            return Ran(facts.Busy())
        try:
            if self._closed:
                return _closed_own(out, err)
            runner = self._take_runner()
            self._active_runner = runner
            if session is not None:
                session.runner, session.current = runner, call
            with _session_process_state(session, request.env), routed_streams():
                self._fds.start(sink_out, sink_err)
                runner.hold_together()
                try:
                    runner.submit(job)
                    # close() stops the wait too: the call answers now, not at its deadline.
                    finished = wait_for(runner.done, deadline - time.monotonic(),
                                        _AnyOf(request.cancel, self._closing))
                    if not finished:
                        runner.interrupt()
                        # At close() the answer is not held for code blocked in C: it
                        # says the code may still run (the server must leave promptly).
                        finished = runner.done.acquire(
                            True, CLOSE_GRACE if self._closing.is_set() else INTERRUPT_GRACE)
                finally:
                    runner.let_go()
                    self._fds.stop()
                    call.open = False
            if not finished:  # the code runs on; the session stays stuck on this runner
                runner.close()
                self._runner = None
            elif session is not None:
                session.runner = None
        finally:
            self._active_runner = None
            if session is not None and session.current is call:
                session.current = None
            if self._closed:  # close() left these to the call that was using them
                self._release_parts()
            OWN_LOCK.release()
        if self._closed:
            return _closed_own(out, err, still_running=not finished)
        if not finished:
            return ran_with_output(out, err, facts.TimedOut(survived=False, stuck=True))
        # No cell: the interrupt reached the runner before the job began (nothing ran).
        return ran_from_cell(box.get("cell") or _NOT_RUN, out, err)

    def _run_here(self, watchdog: Watchdog, call: Call, namespace: dict[str, Any],
                  request: RunRequest, out: OutputBuffer, err: OutputBuffer) -> Ran:
        """Run on the caller's (main) thread; the watchdog stops it at the deadline."""
        session = call.session
        deadline = time.monotonic() + request.timeout
        if not OWN_LOCK.acquire(timeout=request.timeout):
            return Ran(facts.Busy())
        cell: dict[str, Any] | None = None
        try:
            if self._closed:
                return _closed_own(out, err)
            self._active_runner = watchdog
            if session is not None:
                session.runner, session.current = ON_CALLER, call
            with _session_process_state(session, request.env), routed_streams():
                self._fds.start(call.out, call.err)
                local.call, local.in_call = call, True
                try:
                    try:
                        watchdog.arm(deadline, request.cancel)
                        cell = engine.run_cell(request.code, namespace, request.result_limit)
                    except engine.Interrupt:  # landed after the cell's own handler
                        pass
                finally:
                    while True:  # an interrupt may land until the watchdog is disarmed
                        try:
                            watchdog.disarm()
                            break
                        except engine.Interrupt:
                            continue
                    local.call = None
                    local.in_call = False
                    self._fds.stop()
                    call.open = False
        finally:
            self._active_runner = None
            if session is not None:
                session.runner = None
                if session.current is call:
                    session.current = None
            if self._closed:  # close() left these to the call that was using them
                self._release_parts()
            OWN_LOCK.release()
        if self._closed:
            return _closed_own(out, err)
        return ran_from_cell(cell or _NOT_RUN, out, err)

    @staticmethod
    def _run_inline(call: Call, namespace: dict[str, Any], request: RunRequest,
                    out: OutputBuffer, err: OutputBuffer) -> Ran:
        """A call made from code already running here (a stored function, a capability).

        The outer call holds the process-wide state already, so this one runs on the
        same thread, under the outer call's timeout.
        """
        saved = getattr(local, "call", None)
        local.call = call
        try:
            with _session_process_state(call.session, request.env):
                cell = engine.run_cell(request.code, namespace, request.result_limit)
        finally:
            local.call = saved
            call.open = False
        return ran_from_cell(cell, out, err)

    # -- read-only (run in a copy: copies.run_read_only, which builds on this module) --

    def _fork_on_runner(self, fork: Callable[[], int]) -> int:
        """Call ``fork`` on the thread this caller's calls run on: the runner, or this
        thread where it runs them itself (``inline``, or a nested call).

        A fork child is a copy of the forking thread alone; forking where session code
        runs makes the copy's thread the one that built the session's objects, which
        sqlite3 (and any other check of the creating thread, ``threading.local``)
        insists on. Forking here also saves the two thread hand-offs.
        """
        if getattr(local, "in_call", False):
            return fork()
        box: dict[str, Any] = {}

        def job() -> None:
            try:
                box["pid"] = fork()
            except BaseException as exc:
                box["error"] = exc

        with OWN_LOCK:
            if self.inline and inline_ready() is not None:
                return fork()
            runner = self._take_runner()
            runner.submit(job)
            runner.done.acquire()
        if "error" in box:
            raise box["error"]
        if "pid" not in box:  # taken back before the runner took it: the executor closed
            raise OSError(errno.ECANCELED, "the executor closed before the copy was made")
        return int(box["pid"])

    def close(self) -> None:
        """Interrupt a call still running, end the runners and every process the code
        started (``children``); never raises.

        The fd pump is closed here only if no call uses it, else by that call as it
        ends (closing its pipes under it raised ``OSError: [Errno 9]`` in the call).
        """
        if self._closed:
            return
        self._closed = True
        self._closing.set()
        active = self._active_runner
        if active is not None:
            active.interrupt()  # the call returns an error dict saying the executor closed
        if OWN_LOCK.acquire(blocking=False):
            try:
                self._release_parts()
            finally:
                OWN_LOCK.release()
        else:  # a call (of any Executor's own interpreter) holds it: once it is free
            threading.Thread(target=self._release_when_free, name="coordex-own-close",
                             daemon=True).start()
        # What the code started (Popen, os.fork, and what those started) ends too.
        self.owned.end()
        self.owned.disarm()


    def _release_parts(self) -> None:
        """After close(), under OWN_LOCK: the runner, the fd pump and this
        interpreter's hold on the routing streams go, unless a call of it still uses
        them (that call does this as it ends). Idempotent."""
        if self._active_runner is not None:
            return
        if self._runner is not None:
            self._runner.close()
            self._runner = None
        self._fds.close()
        if not self._streams_released:
            self._streams_released = True
            uninstall_streams()

    def _release_when_free(self) -> None:
        with OWN_LOCK:
            self._release_parts()


# At close(), how long a call's interrupted code gets to stop before the call answers.
CLOSE_GRACE = 0.25


class _AnyOf:
    """Set when any of its events is (what ``wait_for`` asks of a cancel event)."""

    def __init__(self, *events: threading.Event | None) -> None:
        self.events = [e for e in events if e is not None]

    def is_set(self) -> bool:
        return any(e.is_set() for e in self.events)


# --------------------------------------------------------------------------- outcomes


# The cell of a call interrupted before its code began.
_NOT_RUN: dict[str, Any] = {"result": None, "error": None, "interrupted": True, "images": []}


def ran_from_cell(cell: dict[str, Any], out: OutputBuffer, err: OutputBuffer) -> Ran:
    """What one cell did, as a fact (``cell`` from :func:`engine.run_cell`)."""
    error = cell.get("error")
    event: facts.Event = facts.OK
    if cell.get("interrupted"):
        event = facts.TimedOut(survived=True)
    elif error:
        coordex_type = error.get("coordex_error_type")
        event = facts.Raised(
            error["exception"], error.get("message") or "", error.get("traceback") or "",
            error_type=coordex_type if coordex_type in ERROR_TYPES else None,
            error=error.get("coordex_error"), suggestion=error.get("coordex_suggestion"))
    return ran_with_output(out, err, event, result=cell.get("result"), images=cell.get("images") or (),
                truncated=bool(cell.get("result_truncated")))


def ran_with_output(out: OutputBuffer, err: OutputBuffer, event: facts.Event, **fields: Any) -> Ran:
    """A run's fact with the output it wrote so far."""
    truncated = bool(fields.pop("truncated", False)) or out.truncated or err.truncated
    return Ran(event, out.getvalue(), err.getvalue(), truncated, **fields)


def _closed_own(out: OutputBuffer, err: OutputBuffer, *, still_running: bool = False) -> Ran:
    # Honest about the agent's process: an interrupt reaches Python code only between
    # bytecodes, so code blocked in C (a sleep, a read) may still run on after this.
    what = (" (interrupted: it is blocked outside Python and may still run in the "
            "agent's process until that call returns)" if still_running
            else " (interrupted)")
    return ran_with_output(out, err, facts.Closed("executor", detail=what))
