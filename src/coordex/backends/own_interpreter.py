"""Python in the agent's own interpreter: sessions are namespaces in this process.

How it works:

- Each session is a namespace dict with its own working directory and ``os.environ``
  snapshot; session 0 is the plan namespace. Code runs through the shared cell engine
  (``worker/_coordex_engine.py``) so results, errors and figures look the same as in an
  environment worker.
- Code runs on a runner thread, never on the caller's thread, so a timeout can always
  return: the caller waits with a deadline, then raises ``KeyboardInterrupt`` in the
  runner (``PyThreadState_SetAsyncExc``). Code stuck in C that ignores it keeps the
  session busy; later calls to that session return ``timeout`` at once until it ends.
  The price is one thread hand-off per call: ~50 us on a small VM, ~75 us for a
  trivial cell once the runner works on a CPU whose caches do not hold the session.
  Pinning the runner to the caller's CPU while it wakes saved ~30 us on an empty cell
  but cost more on real ones (the runner, unpinned before user code runs so that
  its threads and children never inherit a one-CPU mask, then migrates).
- Output: ``sys.stdout``/``sys.stderr`` are wrapped for the duration of each call by
  proxies that route writes to the capture of the call running on the current thread
  (streamed to ``on_output``); file descriptors 1/2 (child processes, C code) point at
  pipes whose reader thread streams them to the same capture, and fd 0 is
  ``/dev/null`` so nothing waits on input. Because descriptors are process-wide,
  own-interpreter calls run one at a time (``OWN_LOCK``); worker and shell sessions
  still run in parallel with them.
- ``read_only`` runs against a copy (``own_copy``): a fork of this process made on the
  session's runner thread, or, when a loaded library does not survive ``fork()``
  (polars, duckdb, grpc, torch) or ``fork`` is missing or unsafe (macOS), the session's
  values pickled into a fresh interpreter. Only the forking thread exists in a fork
  child; a lock another thread held at fork time stays held there, so code touching
  such an object can deadlock — the child is then killed at the timeout and the session
  is untouched either way.

What still leaks between own-interpreter sessions (they share one process):
``sys.modules`` and anything a module holds, monkeypatches, ``sys.path``, threads
started by user code, signal handlers, and ``os._exit`` ends the agent itself.
"""

from __future__ import annotations

import _thread
import array
import builtins
import contextlib
import ctypes
import fcntl
import io
import os
import selectors
import sys
import termios
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import ERROR_TYPES, make_error
from ..core.results import OutputBuffer
from ..worker import _coordex_copy as copier
from ..worker import _coordex_engine as engine
from .base import INTERRUPT_GRACE, PAGER_ENV, Outcome, RunRequest, emit, wait_for

# fork() copies only the calling thread. On Linux and the BSDs the C library and CPython
# cope with that; on macOS system frameworks may abort in a child of a threaded process,
# so there read-only falls back to a shallow copy (and says ``objects: false``).
FORK_IS_SAFE = hasattr(os, "fork") and sys.platform != "darwin"

# One own-interpreter call at a time: file descriptors 0-2, the cwd and os.environ are
# process-wide. Re-entrant so a capability or stored function called from user code
# may run another own-interpreter call (it runs inline on the same thread).
OWN_LOCK = threading.RLock()
_local = threading.local()


# --------------------------------------------------------------------------- streams


class _RoutedStream(io.TextIOBase):
    """Installed as sys.stdout/sys.stderr: writes go to the current thread's capture."""

    def __init__(self, name: str, original: Any) -> None:
        super().__init__()
        self._name = name
        self.original = original

    def write(self, text: str) -> int:
        sink = getattr(_local, self._name, None)
        if sink is None:
            return int(self.original.write(text) or 0)
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        sink(text)
        return len(text)

    def flush(self) -> None:
        if getattr(_local, self._name, None) is None:
            with contextlib.suppress(Exception):
                self.original.flush()

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return int(self.original.fileno())

    def writable(self) -> bool:
        return True

    def __getattr__(self, item: str) -> Any:
        return getattr(self.original, item)


class _EmptyStdin(io.TextIOBase):
    """sys.stdin during a call: always at end of file, so input() raises EOFError."""

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> str:
        return ""

    def readline(self, size: int | None = -1) -> str:  # type: ignore[override]
        return ""

    def isatty(self) -> bool:
        return False


class _RoutedStdin(io.TextIOBase):
    def __init__(self, original: Any) -> None:
        super().__init__()
        self.original = original
        self._empty = _EmptyStdin()

    def _target(self) -> Any:
        return self._empty if getattr(_local, "in_call", False) else self.original

    def read(self, size: int | None = -1) -> str:
        return str(self._target().read(size))

    def readline(self, size: int | None = -1) -> str:  # type: ignore[override]
        return str(self._target().readline(size))

    def readable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return bool(self._target().isatty())

    def __getattr__(self, item: str) -> Any:
        return getattr(self._target(), item)


@contextlib.contextmanager
def _routed_streams() -> Iterator[None]:
    """Route sys.stdout/stderr/stdin through per-thread captures for one call.

    Installed per call, not once, because hosts (test runners, notebooks, servers)
    replace ``sys.stdout`` whenever they like; whatever is there is wrapped and put back.
    The three proxies are made once and re-pointed: creating (and finalising, which
    flushes) stream objects on every call cost tens of microseconds.
    """
    saved = (sys.stdout, sys.stderr, sys.stdin)
    proxies: tuple[Any, Any, Any] = (_STDOUT, _STDERR, _STDIN)
    for proxy, original in zip(proxies, saved, strict=True):
        if original is not proxy:
            proxy.original = original
    sys.stdout, sys.stderr, sys.stdin = proxies
    try:
        yield
    finally:
        sys.stdout, sys.stderr, sys.stdin = saved


_STDOUT = _RoutedStream("stdout", sys.stdout)
_STDERR = _RoutedStream("stderr", sys.stderr)
_STDIN = _RoutedStdin(sys.stdin)


class _FdPump:
    """Streams what is written to file descriptors 1 and 2 during a call, as it comes.

    During a call fds 1 and 2 point at two pipes (and fd 0 at /dev/null); one reader
    thread per executor forwards what arrives to the running call's sinks, so output of
    child processes and C code reaches ``on_output`` live. After the call the fds are
    restored and the pipes drained before the call returns: the reader routes each chunk
    under ``_lock``, so once both pipes are empty with the lock held, everything written
    during the call has been delivered. Writes that arrive between calls (a background
    process still running) are dropped.
    """

    def __init__(self) -> None:
        self._pipes = {1: os.pipe(), 2: os.pipe()}
        for r, w in self._pipes.values():
            os.set_blocking(r, False)
            os.set_inheritable(w, False)
        self._devnull = os.open(os.devnull, os.O_RDONLY)
        self._saved: dict[int, int] = {}
        self._sinks: dict[int, Callable[[str], None]] = {}
        self._decoders = {1: _decoder(), 2: _decoder()}
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        self._closed = False
        self._thread = threading.Thread(target=self._pump, name="coordex-fd-pump", daemon=True)
        self._thread.start()
        copier.hold(*self._held())

    def _held(self) -> list[int]:
        return [*(fd for pair in self._pipes.values() for fd in pair), self._devnull,
                self._wake_r, self._wake_w]

    def start(self, out: Callable[[str], None], err: Callable[[str], None]) -> None:
        _flush_real_streams()
        with self._lock:
            self._sinks = {1: out, 2: err}
        for fd, (_, w) in self._pipes.items():
            self._saved[fd] = os.dup(fd)
            os.dup2(w, fd)
        self._saved[0] = os.dup(0)
        os.dup2(self._devnull, 0)

    def stop(self) -> None:
        _flush_real_streams()
        for fd, saved in self._saved.items():
            os.dup2(saved, fd)
            os.close(saved)
        self._saved.clear()
        deadline = time.monotonic() + 1.0
        while True:
            with self._lock:
                if not any(_pending(r) for r, _ in self._pipes.values()) \
                        or time.monotonic() > deadline:
                    for fd, decoder in self._decoders.items():
                        tail = decoder.decode(b"", final=True)
                        if tail and fd in self._sinks:
                            self._sinks[fd](tail)
                    self._sinks = {}
                    return
            time.sleep(0.0002)

    def _pump(self) -> None:
        sel = selectors.DefaultSelector()
        for fd, (r, _) in self._pipes.items():
            sel.register(r, selectors.EVENT_READ, fd)
        sel.register(self._wake_r, selectors.EVENT_READ, None)
        try:
            while not self._closed:
                for key, _ in sel.select():
                    if key.data is None:
                        return
                    with self._lock:
                        try:
                            data = os.read(key.fd, 65536)
                        except BlockingIOError:
                            continue
                        sink = self._sinks.get(key.data)
                        if sink is not None and data:
                            text = self._decoders[key.data].decode(data)
                            if text:
                                sink(text)
        finally:
            sel.close()

    def close(self) -> None:
        self._closed = True
        copier.release(*self._held())
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=2)
        for r, w in self._pipes.values():
            os.close(r)
            os.close(w)
        for fd in (self._devnull, self._wake_r, self._wake_w):
            os.close(fd)


def _pending(fd: int) -> int:
    """Bytes waiting in a pipe (FIONREAD)."""
    buf = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, buf)
    return int(buf[0])


def _flush_real_streams() -> None:
    for stream in (sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(Exception):
            if stream is not None:
                stream.flush()


# --------------------------------------------------------------------------- runner thread


class _Runner:
    """A daemon thread that runs one job at a time; the caller waits with a deadline.

    Hand-off uses bare locks (``_thread.allocate_lock``): two context switches per call,
    about 50 us on a small VM, which is the whole cost of timeouts that always return.
    """

    def __init__(self, name: str) -> None:
        self._go = _thread.allocate_lock()
        self._go.acquire()
        self._job: Callable[[], None] | None = None
        self.busy = False
        self.closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    @property
    def ident(self) -> int:
        return self._thread.ident or 0

    def submit(self, job: Callable[[], None]) -> None:
        self.busy = True
        self._job = job
        self._go.release()

    def _loop(self) -> None:
        while True:
            self._go.acquire()
            job, self._job = self._job, None
            if job is None:
                return
            try:
                job()
            except BaseException:  # a stray async KeyboardInterrupt after the job ended
                pass
            finally:
                self.busy = False

    def interrupt(self) -> None:
        """Raise KeyboardInterrupt in the runner at its next bytecode."""
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(self.ident), ctypes.py_object(KeyboardInterrupt))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if not self.busy:
                self._job = None
                with contextlib.suppress(RuntimeError):
                    self._go.release()


# --------------------------------------------------------------------------- sessions


@dataclass
class NamespaceSession:
    """One own-interpreter session: a namespace plus its own cwd and environment."""

    namespace: dict[str, Any]
    cwd: str
    environ: dict[Any, Any]
    runner: _Runner | None = None
    injected: set[str] = field(default_factory=set)

    @property
    def stuck(self) -> bool:
        return self.runner is not None and self.runner.busy


def fresh_namespace() -> dict[str, Any]:
    return {"__name__": "__main__", "__builtins__": builtins}


@contextlib.contextmanager
def _session_process_state(session: NamespaceSession | None) -> Iterator[None]:
    """Enter a session's cwd and environment; on exit record them and restore the host's."""
    host_cwd = _getcwd()
    host_env = environ_snapshot()
    if session is not None:
        if session.cwd != host_cwd:
            _chdir(session.cwd)
        if session.environ != host_env:
            _apply_environ(session.environ)
    try:
        yield
    finally:
        if session is not None:
            session.cwd = _getcwd()
            session.environ = environ_snapshot()
        if _getcwd() != host_cwd:
            _chdir(host_cwd)
        if environ_snapshot() != host_env:
            _apply_environ(host_env)


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


def _apply_environ(target: dict[Any, Any]) -> None:
    current = environ_snapshot()
    decode_key = getattr(os.environ, "decodekey", lambda k: k)
    decode_value = getattr(os.environ, "decodevalue", lambda v: v)
    for key in current:
        if key not in target:
            del os.environ[decode_key(key)]
    for key, value in target.items():
        if current.get(key) != value:
            os.environ[decode_key(key)] = decode_value(value)


def _getcwd() -> str:
    try:
        return os.getcwd()
    except OSError:  # the folder was removed under us
        return os.path.expanduser("~")


def _chdir(path: str) -> None:
    with contextlib.suppress(OSError):
        os.chdir(path)


# --------------------------------------------------------------------------- backend


class OwnInterpreter:
    """Runs Python cells in this process. One instance per Executor."""

    def __init__(self) -> None:
        # Sessions run with PAGER_ENV. Where the host leaves these unset they are set in
        # the host too, so entering a session costs no environment change per call.
        for key, value in PAGER_ENV.items():
            os.environ.setdefault(key, value)
        self._fds = _FdPump()
        self._closed = False
        self._stateless_runners: list[_Runner] = []
        self._runner_lock = threading.Lock()

    def new_session(self, namespace: dict[str, Any] | None = None) -> NamespaceSession:
        environ = environ_snapshot()
        encode_key = getattr(os.environ, "encodekey", lambda k: k)
        encode_value = getattr(os.environ, "encodevalue", lambda v: v)
        for key, value in PAGER_ENV.items():
            environ[encode_key(key)] = encode_value(value)
        return NamespaceSession(namespace if namespace is not None else fresh_namespace(),
                                _getcwd(), environ)

    # -- running -----------------------------------------------------------------------

    def run(self, session: NamespaceSession, request: RunRequest) -> Outcome:
        """Stateful: run in the session's namespace; report rebound and deleted names."""
        if session.stuck:
            return _still_busy()
        if session.runner is None:
            session.runner = _Runner("coordex-session")
        before = dict(session.namespace)
        outcome = self._run_on(session.runner, session, session.namespace, request)
        after = session.namespace
        rebound = [k for k, v in after.items() if k not in before or before[k] is not v]
        deleted = [k for k in before if k not in after]
        before.clear()
        outcome["rebound"] = rebound
        outcome["deleted"] = deleted
        return outcome

    def run_stateless(self, request: RunRequest, extra_globals: dict[str, Any]) -> Outcome:
        namespace = fresh_namespace()
        namespace.update(extra_globals)
        runner = self._free_stateless_runner()
        return self._run_on(runner, self.new_session(namespace), namespace, request,
                            mode="stateless")

    def _free_stateless_runner(self) -> _Runner:
        with self._runner_lock:
            self._stateless_runners = [r for r in self._stateless_runners if not r.closed]
            for runner in self._stateless_runners:
                if not runner.busy:
                    return runner
            runner = _Runner("coordex-stateless")
            self._stateless_runners.append(runner)
            return runner

    def _run_on(self, runner: _Runner, session: NamespaceSession | None,
                namespace: dict[str, Any], request: RunRequest,
                mode: str = "stateful") -> Outcome:
        out, err = OutputBuffer(request.output_limit), OutputBuffer(request.output_limit)
        box: dict[str, Any] = {}
        done = _thread.allocate_lock()
        done.acquire()

        # The runner thread (print) and the fd pump (child processes) both write here.
        sink_lock = threading.Lock()

        def sink_out(text: str) -> None:
            with sink_lock:
                out.write(text)
            emit(request, "stdout", text)

        def sink_err(text: str) -> None:
            with sink_lock:
                err.write(text)
            emit(request, "stderr", text)

        def job() -> None:
            _local.stdout, _local.stderr, _local.in_call = sink_out, sink_err, True
            try:
                box["cell"] = engine.run_cell(request.code, namespace, request.output_limit)
            finally:
                _local.stdout = _local.stderr = None
                _local.in_call = False
                done.release()

        if getattr(_local, "in_call", False):
            return self._run_inline(session, namespace, request, sink_out, sink_err, out, err,
                                    mode)
        deadline = time.monotonic() + request.timeout
        if not OWN_LOCK.acquire(timeout=request.timeout):
            return _own_busy(out, err)
        try:
            with _session_process_state(session), _routed_streams():
                self._fds.start(sink_out, sink_err)
                try:
                    runner.submit(job)
                    finished = wait_for(done, deadline - time.monotonic(), request.cancel)
                    if not finished:
                        runner.interrupt()
                        finished = done.acquire(True, INTERRUPT_GRACE)
                finally:
                    self._fds.stop()
        finally:
            OWN_LOCK.release()
        if not finished:
            return _timed_out(out, err, stuck=True, mode=mode)
        return _outcome_from_cell(box["cell"], out, err, timed_out=box["cell"]["interrupted"],
                                  mode=mode)

    @staticmethod
    def _run_inline(session: NamespaceSession | None, namespace: dict[str, Any],
                    request: RunRequest, sink_out: Callable[[str], None],
                    sink_err: Callable[[str], None], out: OutputBuffer,
                    err: OutputBuffer, mode: str) -> Outcome:
        """A call made from code already running here (a stored function, a capability).

        The outer call holds the process-wide state already, so this one runs on the
        same thread, under the outer call's timeout.
        """
        saved = (_local.stdout, _local.stderr)
        _local.stdout, _local.stderr = sink_out, sink_err
        try:
            with _session_process_state(session):
                cell = engine.run_cell(request.code, namespace, request.output_limit)
        finally:
            _local.stdout, _local.stderr = saved
        return _outcome_from_cell(cell, out, err, timed_out=cell["interrupted"], mode=mode)

    # -- read-only ---------------------------------------------------------------------

    def run_read_only(self, session: NamespaceSession, request: RunRequest,
                      protect: Callable[[], str] | None = None,
                      capabilities: Any = None) -> Outcome:
        """Run against a copy of the session: a fork, or its values in a new process.

        See ``own_copy``. Where ``fork`` is missing or unsafe, the copy always goes by
        value. ``capabilities`` (``names()``, ``call(name, args, kwargs)``): what the
        copy may call; they run here, in the agent's process, never in the copy.
        """
        if session.stuck:
            return _still_busy()
        from .own_copy import run_copy

        return run_copy(session, request, protect, capabilities, fork=FORK_IS_SAFE)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for runner in self._stateless_runners:
            runner.close()
        self._fds.close()


def _cancelled(request: RunRequest) -> bool:
    return request.cancel is not None and request.cancel.is_set()


def _reap_soon(pid: int) -> int | None:
    """The child's exit status if it has exited, else reap it on a short-lived thread."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    if done:
        return status
    time.sleep(0.0005)
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        return status
    threading.Thread(target=_wait_quietly, args=(pid,), daemon=True).start()
    return None


def _wait_quietly(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _decoder() -> Any:
    import codecs

    return codecs.getincrementaldecoder("utf-8")("replace")


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


# --------------------------------------------------------------------------- outcomes


_INTERRUPTED = {
    "stateful": "The session survived with its state (interrupted: state kept). Make the "
                "code faster or do less per call, or pass a larger timeout=.",
    "stateless": "Nothing is kept from a stateless call. Make the code faster or do less per "
                 "call, or pass a larger timeout=.",
    "read_only": "The read-only copy was stopped; the session itself is unchanged. Make the "
                 "code faster or pass a larger timeout=.",
}


def _outcome_from_cell(cell: dict[str, Any], out: OutputBuffer, err: OutputBuffer,
                       timed_out: bool, mode: str = "stateful") -> Outcome:
    stdout, stderr = out.getvalue(), err.getvalue()
    outcome: Outcome = {
        "stdout": stdout, "stderr": stderr,
        "truncated": out.truncated or err.truncated or bool(cell.get("result_truncated")),
        "result": cell.get("result"), "exit_code": None, "images": cell.get("images") or [],
    }
    if timed_out:
        outcome["error"] = make_error(
            "timeout", "The code ran past its timeout and was interrupted.",
            _INTERRUPTED.get(mode, _INTERRUPTED["stateful"]),
            stdout=stdout, stderr=stderr, state_lost=False)
    elif (cell.get("error") or {}).get("coordex_error_type") in ERROR_TYPES:
        # A coordex error raised inside the code (a stored-function CallError): the
        # model sees its own error_type and suggestion, not a generic execution error.
        error = cell["error"]
        outcome["error"] = make_error(
            error["coordex_error_type"], error.get("coordex_error") or error["message"],
            error.get("coordex_suggestion") or _execution_suggestion(error["exception"], mode),
            traceback=error["traceback"], stdout=stdout, stderr=stderr,
            exception=error["exception"])
    elif cell.get("error"):
        error = cell["error"]
        outcome["error"] = make_error(
            "execution", f"{error['exception']}: {error['message']}".rstrip(": "),
            _execution_suggestion(error["exception"], mode),
            traceback=error["traceback"], stdout=stdout, stderr=stderr,
            exception=error["exception"])
    return outcome


def _execution_suggestion(exception: str, mode: str = "stateful") -> str:
    if exception == "SyntaxError" or exception == "IndentationError":
        return "Fix the syntax at the line the traceback points to and run the call again."
    if exception == "SystemExit":
        return ("The code called sys.exit()/exit(); nothing was ended. Remove the exit call "
                "and run it again.")
    if exception == "NameError":
        where = ("this session" if mode != "stateless" else
                 "a stateless call, which starts from an empty namespace")
        return (f"A name is not defined in {where}. Define it in the same code, or run it in "
                "a session that has it (state_mode='stateful' with session_name=...); "
                "inspect_session shows which names a session holds.")
    if exception in ("ModuleNotFoundError", "ImportError"):
        return ("The module is not installed in this interpreter. Create an environment with it "
                "(environments.create / create_environment) and pass its venv_id.")
    if mode == "stateful":
        return "Read the traceback, fix the code and run it again; the session's state is kept."
    if mode == "read_only":
        return "Read the traceback, fix the code and run it again; the session is unchanged."
    return "Read the traceback, fix the code and run it again."


def _timed_out(out: OutputBuffer, err: OutputBuffer, stuck: bool, mode: str) -> Outcome:
    stdout, stderr = out.getvalue(), err.getvalue()
    if stuck and mode == "stateful":
        suggestion = ("The code did not stop when interrupted (it is blocked outside Python "
                      "bytecode); the agent's own interpreter cannot be killed, so the session "
                      "is still busy and its state is kept. Further calls to this session "
                      "return timeout at once until the code stops: wait, or use another "
                      "session.")
    elif stuck:
        suggestion = ("The code did not stop when interrupted (it is blocked outside Python "
                      "bytecode) and finishes in the background of the agent's process; no "
                      "session is affected. Make it faster or pass a larger timeout=.")
    else:
        suggestion = _INTERRUPTED.get(mode, _INTERRUPTED["stateful"])
    return {"stdout": stdout, "stderr": stderr, "truncated": out.truncated or err.truncated,
            "result": None, "exit_code": None, "images": [],
            "error": make_error("timeout", "The code ran past its timeout.", suggestion,
                                stdout=stdout, stderr=stderr, state_lost=False)}


def _still_busy() -> Outcome:
    return {"stdout": "", "stderr": "", "truncated": False, "result": None, "exit_code": None,
            "images": [],
            "error": make_error(
                "timeout", "This session is still busy with code from an earlier call that "
                "timed out and did not stop.",
                "Wait for that code to finish, or run in another session (a different "
                "session_name) or with state_mode='stateless'. The session's state is kept.",
                stdout="", stderr="", state_lost=False)}


def _own_busy(out: OutputBuffer, err: OutputBuffer) -> Outcome:
    return {"stdout": "", "stderr": "", "truncated": False, "result": None, "exit_code": None,
            "images": [],
            "error": make_error(
                "timeout", "The agent's own interpreter stayed busy with another call for the "
                "whole timeout.",
                "Retry, or run this in an environment (venv_id) or bash, whose sessions run "
                "in parallel. Nothing ran and no state changed.",
                stdout="", stderr="", state_lost=False)}


def _crashed_copy(out: OutputBuffer, err: OutputBuffer, status: int | None) -> Outcome:
    stdout, stderr = out.getvalue(), err.getvalue()
    how = ""
    if status is not None and os.WIFSIGNALED(status):
        how = f" (killed by signal {os.WTERMSIG(status)})"
    elif status is not None and os.WIFEXITED(status):
        how = f" (exit status {os.WEXITSTATUS(status)}; os._exit() or a crash)"
    return {"stdout": stdout, "stderr": stderr, "truncated": out.truncated or err.truncated,
            "result": None, "exit_code": None, "images": [],
            "error": make_error(
                "crashed", f"The read-only copy of the session died before finishing{how}.",
                "The session itself is unchanged. Avoid os._exit() and code that crashes "
                "the interpreter; run the call again after fixing it.",
                state_lost=False, stdout=stdout, stderr=stderr)}
