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
  started still run). The price is one thread hand-off per call, two wake-ups across
  CPUs: ~45-75 us on a small VM.
- ``OwnInterpreter(inline=True)`` (``Executor(own_on_caller_thread=True)``) runs code
  called from the main thread on that thread instead: a watchdog thread that wakes
  only at the deadline signals it (the handler raises the interrupt; blocking calls
  return with EINTR first). That saves the hand-off (~30 us), but a timeout then
  returns only when code blocked in C that retries on signals (``os.system``) or code
  that catches every interrupt lets go, so it is not the default.
- Output: ``sys.stdout``/``sys.stderr`` are wrapped for the duration of each call by
  proxies that route each write to the call it belongs to: the call running on the
  writing thread, or for a thread the code started (``threading.Thread.start``
  records the call) that call while it runs, then the session's next call; a thread
  of an ended call whose session runs nothing now writes nowhere, and never into
  another session's call; a host thread's prints wait and reach the host's stream
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
"""

from __future__ import annotations

import _signal as _csignal
import _thread
import array
import builtins
import contextlib
import ctypes
import dataclasses
import fcntl
import io
import os
import selectors
import signal
import sys
import termios
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ...core import facts, messages
from ...core.errors import ERROR_TYPES
from ...core.facts import Ran
from ...core.results import OutputBuffer
from ...worker import _coordex_copy as copier
from ...worker import _coordex_engine as engine
from .._reap import OWNED_ENV
from ..base import INTERRUPT_GRACE, PAGER_ENV, RunRequest, emit, wait_for
from . import children

# fork() copies only the calling thread. On Linux and the BSDs the C library and CPython
# cope with that; on macOS system frameworks may abort in a child of a threaded process,
# so there read-only falls back to a shallow copy (and says ``objects: false``).
FORK_IS_SAFE = hasattr(os, "fork") and sys.platform != "darwin"

# One own-interpreter call at a time: file descriptors 0-2, the cwd and os.environ are
# process-wide. Re-entrant so a capability or stored function called from user code
# may run another own-interpreter call (it runs inline on the same thread).
OWN_LOCK = threading.RLock()
_local = threading.local()
# What protects a read-only fork child's disk, called in the child: ``protect(map_identity)``
# (``isolation.protect``'s identity mapper for root, or None) returns the files mode.
Protect = Callable[[Callable[[str, str], bool] | None], str]


# --------------------------------------------------------------------------- calls and threads


class _Call:
    """One running own-interpreter call: where its output goes, and what it started.

    The call's own thread finds it in ``_local.call``; a thread its code starts carries
    it as ``_coordex_call`` (set by :func:`_start_with_origin`), so the thread's prints
    reach this call while it runs, then the next call of the same session, and never a
    call of another session.
    """

    __slots__ = ("err", "open", "out", "session", "threads")

    def __init__(self, out: Callable[[str], None], err: Callable[[str], None],
                 session: NamespaceSession | None) -> None:
        self.out = out
        self.err = err
        self.session = session
        self.open = True
        self.threads: list[weakref.ref[threading.Thread]] = []

    def threads_alive(self) -> bool:
        return _any_alive(self.threads)


def _any_alive(refs: list[weakref.ref[threading.Thread]]) -> bool:
    alive = [ref for ref in refs if (t := ref()) is not None and t.is_alive()]
    refs[:] = alive  # ended threads are forgotten, so the list stays short
    return bool(alive)


def _current_call() -> _Call | None:
    """The call whose output this thread's writes belong to, or None (a host thread)."""
    call: _Call | None = getattr(_local, "call", None)
    if call is None:
        call = getattr(threading.current_thread(), "_coordex_call", None)
    return call


def _target_call() -> _Call | None:
    """Where a write from this thread goes: a call, None (the host's stream) or
    ``_NOWHERE`` (a thread whose call is over and whose session runs nothing now)."""
    call = _current_call()
    if call is None or call.open:
        return call
    session = call.session
    current = session.current if session is not None else None
    return current if current is not None else _NOWHERE


def _current_mark() -> str | None:
    """The mark of the session whose code runs on this thread (or started it), if any."""
    call = _target_call()
    session = call.session if call is not None else None
    return session.mark if session is not None else None


def _drop(text: str) -> None:
    pass


_NOWHERE = _Call(_drop, _drop, None)
_THREAD_START = threading.Thread.start


def _start_with_origin(self: threading.Thread) -> None:
    """``threading.Thread.start`` that remembers which call started the thread."""
    call = _current_call()
    if call is not None:
        self._coordex_call = call  # type: ignore[attr-defined]
        ref = weakref.ref(self)
        call.threads.append(ref)
        if call.session is not None:
            _any_alive(call.session.threads)
            call.session.threads.append(ref)
    _THREAD_START(self)


def _install_thread_origin() -> None:
    if threading.Thread.start is not _start_with_origin:
        threading.Thread.start = _start_with_origin  # type: ignore[method-assign]


# --------------------------------------------------------------------------- streams


class _RoutedStream(io.TextIOBase):
    """Installed as sys.stdout/sys.stderr: writes go to the capture of the call they
    belong to (see :func:`_target_call`), escaped as every place escapes them."""

    def __init__(self, name: str, original: Any) -> None:
        super().__init__()
        self._name = name
        self.original = original

    def write(self, text: str) -> int:
        call = _target_call()
        if call is None:
            if _HOST_HELD.routing:  # fds 1/2 are the call's pipes now: later, not into it
                return _HOST_HELD.hold(self, text)
            return int(self.original.write(text) or 0)
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        (call.out if self._name == "stdout" else call.err)(engine.escape_text(text))
        return len(text)

    def flush(self) -> None:
        if _target_call() is None and not _HOST_HELD.routing:
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
        return self._empty if _current_call() is not None else self.original

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
    _HOST_HELD.routing = True
    try:
        yield
    finally:
        _HOST_HELD.routing = False
        sys.stdout, sys.stderr, sys.stdin = saved
        _HOST_HELD.release()  # the host's fds are its own again


class _HostHeld:
    """What host threads (no call's) print while a call runs, written out after it.

    During a call fds 1/2 are the call's pipes, so a host stream that writes to them
    would put a host thread's lines into the call's output; they wait here instead
    (at most ``limit`` characters; the rest is dropped) and go to the host's own
    stream once the call ended.
    """

    def __init__(self, limit: int = 1 << 20) -> None:
        self.routing = False
        self._lock = threading.Lock()
        self._held: list[tuple[_RoutedStream, str]] = []
        self._size = 0
        self._limit = limit

    def hold(self, stream: _RoutedStream, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        with self._lock:
            if self._size + len(text) <= self._limit:
                self._held.append((stream, text))
                self._size += len(text)
        return len(text)

    def release(self) -> None:
        with self._lock:
            held, self._held, self._size = self._held, [], 0
        for stream, text in held:
            with contextlib.suppress(Exception):
                stream.original.write(text)


_HOST_HELD = _HostHeld()
_STDOUT = _RoutedStream("stdout", sys.stdout)
_STDERR = _RoutedStream("stderr", sys.stderr)
_STDIN = _RoutedStdin(sys.stdin)


# Audit events that start a process: one that starts while a call's pipes are on
# fds 1 and 2 may hold them after the call (see _FdPump). Counted in any thread.
_SPAWN_EVENTS = frozenset({"os.fork", "os.forkpty", "os.posix_spawn", "os.spawn",
                           "os.system", "subprocess.Popen", "pty.fork"})
_spawns = [0]
_spawn_hook_installed = False


def _count_spawn(event: str, args: tuple[Any, ...]) -> None:
    if event in _SPAWN_EVENTS:
        _spawns[0] += 1


def _install_spawn_counter() -> None:
    global _spawn_hook_installed
    if not _spawn_hook_installed:
        _spawn_hook_installed = True
        sys.addaudithook(_count_spawn)  # ~0.2 us per audited event; cannot be removed


class _FdPump:
    """Streams what is written to file descriptors 1 and 2 during a call, as it comes.

    During a call fds 1 and 2 point at the call's two pipes (and fd 0 at /dev/null);
    one reader thread per executor forwards what arrives to that call's sinks, so output
    of child processes and C code reaches ``on_output`` live. After the call the fds are
    restored and what is left in the pipes is read before the call returns.

    A pipe is the call's alone: if any process started while it was on fd 1 or 2 (an
    audit hook counts ``subprocess``, ``os.fork``, ``os.system``...), that process may
    still hold it, so the pipe is retired: from then on what arrives there is read and
    dropped - it never reaches another call, of this session or another - and it is
    closed once its last writer has gone; the next call gets new pipes. Otherwise the
    pipes serve the next call too (new pipes each call cost ~50 us).
    """

    def __init__(self) -> None:
        _install_spawn_counter()
        self._devnull = os.open(os.devnull, os.O_RDONLY)
        self._saved: dict[int, int] = {}
        # Read ends of the pipes this pump owns: the current call's and retired ones.
        self._owned: set[int] = set()
        self._sinks: dict[int, Callable[[str], None]] = {}  # read end -> the call's sink
        self._decoders: dict[int, Any] = {}
        # The pipes calls use: {1: (read, write), 2: (read, write)}, until retired.
        self._pipes: dict[int, tuple[int, int]] = {}
        self._spawns_at_start = 0
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        self._closed = False
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        poller = self._sel.fileno() if hasattr(self._sel, "fileno") else -1
        # Held: a read-only copy that kept this epoll instance could add its own
        # descriptors to it under our fds' numbers (and stall every fd 1 write here).
        self._poller = [poller] if poller >= 0 else []
        self._thread = threading.Thread(target=self._pump, name="coordex-fd-pump", daemon=True)
        self._thread.start()
        copier.hold(*self._held())

    def _held(self) -> list[int]:
        return [self._devnull, self._wake_r, self._wake_w, *self._poller]

    def start(self, out: Callable[[str], None], err: Callable[[str], None]) -> None:
        _flush_real_streams()
        with self._lock:
            if not self._pipes:
                for fd in (1, 2):
                    r, w = os.pipe()
                    os.set_blocking(r, False)
                    copier.hold(r, w)
                    self._owned.add(r)
                    self._sel.register(r, selectors.EVENT_READ, fd)
                    self._pipes[fd] = (r, w)
            for fd, (r, _) in self._pipes.items():
                self._sinks[r] = out if fd == 1 else err
                self._decoders[r] = _decoder()
            self._spawns_at_start = _spawns[0]
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
        retire = _spawns[0] != self._spawns_at_start
        deadline = time.monotonic() + 1.0
        with self._lock:  # what is left in the pipes was written during the call
            pipes = dict(self._pipes)
            if retire:
                self._pipes = {}
            for r, w in pipes.values():
                sink, decoder = self._sinks.pop(r, None), self._decoders.pop(r)
                if retire:  # our write end goes: only what the code started holds one
                    copier.release(w)
                    os.close(w)
                ended = False
                while time.monotonic() < deadline:
                    try:
                        data = os.read(r, 65536)
                    except BlockingIOError:
                        break
                    if not data:
                        ended = True
                        break
                    text = decoder.decode(data)
                    if text and sink is not None:
                        sink(text)
                tail = decoder.decode(b"", final=True)
                if tail and sink is not None:
                    sink(tail)
                if ended:  # nothing else writes here
                    self._forget(r)

    def _forget(self, r: int) -> None:
        """Stop reading pipe ``r`` and close it (under ``_lock``)."""
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(r)
        self._owned.discard(r)
        self._sinks.pop(r, None)
        self._decoders.pop(r, None)
        copier.release(r)
        os.close(r)

    def _pump(self) -> None:
        try:
            while not self._closed:
                for key, _ in self._sel.select():
                    if key.data is None:
                        return
                    with self._lock:
                        if key.fd not in self._owned:
                            continue  # closed by stop() after this event came
                        try:
                            data = os.read(key.fd, 65536)
                        except BlockingIOError:
                            continue
                        if not data:  # a retired pipe's last writer has gone
                            self._forget(key.fd)
                            continue
                        sink = self._sinks.get(key.fd)
                        if sink is not None:  # else a retired pipe: dropped
                            text = self._decoders[key.fd].decode(data)
                            if text:
                                sink(text)
        finally:
            self._sel.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=2)
        copier.release(*self._held())
        with self._lock:
            for r in list(self._owned):
                copier.release(r)
                os.close(r)
            self._owned.clear()
            for _, w in self._pipes.values():
                copier.release(w)
                os.close(w)
            self._pipes = {}
        for fd in (self._devnull, self._wake_r, self._wake_w):
            os.close(fd)


def _pending(fd: int) -> int:
    """Bytes waiting in a pipe (FIONREAD)."""
    buf = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, buf)
    return int(buf[0])


def _flush_real_streams() -> None:
    for stream in (sys.__stdout__, sys.__stderr__):
        if stream is not None:
            try:
                stream.flush()
            except Exception:  # a closed or broken host stream: nothing to flush
                pass


# --------------------------------------------------------------------------- runner thread


def _raise_in(ident: int, exc: type[BaseException] | None) -> None:
    """Raise ``exc`` in thread ``ident`` at its next bytecode; None withdraws a pending one."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(ident), None if exc is None else ctypes.py_object(exc))


class _Runner:
    """A daemon thread that runs one job at a time; the caller waits with a deadline.

    Runners belong to the :class:`OwnInterpreter`, not to sessions: one runner serves
    every call, and a session only points at the runner while that runner holds its
    code. A runner whose code did not stop when interrupted is *retired*: the next call
    gets a new runner, and the retired thread ends as soon as its code returns. So no
    thread is kept per session, and nothing keeps a job (and the namespace its closure
    holds) once it returned.

    Hand-off uses bare locks (``_thread.allocate_lock``): two context switches per call.
    The interrupt is sent under ``_lock`` only while the job runs user code, and a
    pending one is withdrawn once it ended, so a late interrupt never lands in the
    runner's own bookkeeping.
    """

    def __init__(self) -> None:
        self._go = _thread.allocate_lock()
        self._go.acquire()
        self.done = _thread.allocate_lock()  # released once per job, after it ended
        self.done.acquire()
        self._lock = _thread.allocate_lock()
        self._job: Callable[[], None] | None = None
        self._in_job = False
        self._sent = False
        self.busy = False
        self.retired = False
        self._thread = threading.Thread(target=self._loop, name="coordex-runner", daemon=True)
        # Not a thread of any call: start it with the original start().
        _THREAD_START(self._thread)

    @property
    def ident(self) -> int:
        return self._thread.ident or 0

    def submit(self, job: Callable[[], None]) -> None:
        self.busy = True
        self._in_job = True
        self._job = job
        self._go.release()

    def _loop(self) -> None:
        while True:
            try:
                self._go.acquire()
                job, self._job = self._job, None
                if job is None:
                    return
                try:
                    job()
                finally:
                    job = None
            except BaseException:  # an interrupt that landed outside the code: ignore
                pass
            self._finish()
            if self.retired:
                return

    def _finish(self) -> None:
        while True:
            try:
                with self._lock:
                    self._in_job = False
                if self._sent:  # withdraw an interrupt that has not landed yet
                    _raise_in(self.ident, None)
                    self._sent = False
                if self.busy:
                    self.busy = False
                    self.done.release()
                return
            except BaseException:  # landed before it was withdrawn: run the step again
                continue

    def interrupt(self) -> None:
        """Raise :class:`engine.Interrupt` in the job, if it is still running."""
        with self._lock:
            if self._in_job:
                self._sent = True
                _raise_in(self.ident, engine.Interrupt)

    def close(self) -> None:
        """End the thread once it is idle (now, if it is)."""
        self.retired = True
        if not self.busy:
            with contextlib.suppress(RuntimeError):
                self._go.release()


# --------------------------------------------------------------------------- on the caller's thread

# The signal that stops code running on the main thread (a real-time one: hosts rarely
# use them). Its handler raises only while an interrupt is pending for the inline call.
_INTERRUPT_SIGNAL = getattr(signal, "SIGRTMIN", signal.SIGUSR2) + 3
_MAIN_IDENT = threading.main_thread().ident


class _Watchdog:
    """Stops a call that runs on the main thread (the caller's) at its deadline.

    A daemon thread that sleeps until the deadline it was last given; arming a call
    only writes the deadline (it wakes the thread only when the new deadline is earlier
    than the one it sleeps towards), so a call costs no thread wake-up at all. At the
    deadline (or when ``cancel`` is set) it marks an interrupt pending and sends
    ``_INTERRUPT_SIGNAL`` to the main thread: the handler raises :class:`engine.Interrupt`
    at the next bytecode, and a blocking system call (sleep, read, wait, a lock) returns
    with EINTR first. It sends it again every ``INTERRUPT_GRACE`` while the code runs.
    Code blocked in C that retries on signals (``os.system``, a long BLAS call) ends its
    call only when that C call returns: the price of running on the caller's thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = _thread.allocate_lock()
        self._wake.acquire()
        self._deadline = float("inf")  # of the armed call; inf: none
        self._scheduled = float("inf")  # when the thread looks next
        self._cancel: threading.Event | None = None
        self.pending = False
        self.fired = False
        self.closed = False
        self._thread = threading.Thread(target=self._loop, name="coordex-watchdog",
                                        daemon=True)
        _THREAD_START(self._thread)

    def arm(self, deadline: float, cancel: threading.Event | None) -> None:
        with self._lock:
            self._deadline, self._cancel = deadline, cancel
            self.pending = self.fired = False
            wake = deadline < self._scheduled or cancel is not None
        if wake:
            self._poke()

    def disarm(self) -> bool:
        """End the armed call; True if it was interrupted."""
        with self._lock:
            self._deadline, self._cancel = float("inf"), None
            self.pending = False
            return self.fired

    def interrupt(self) -> None:
        """Interrupt the armed call now (the executor is closing)."""
        with self._lock:
            if self._deadline < float("inf"):
                self._deadline = time.monotonic()
        self._poke()

    def take_pending(self) -> bool:
        """Called by the signal handler: whether to raise now. Lock-free: the handler
        may run on the main thread while that thread holds ``_lock`` (in arm/disarm)."""
        pending, self.pending = self.pending, False
        return pending

    def _poke(self) -> None:
        with contextlib.suppress(RuntimeError):
            self._wake.release()

    def _loop(self) -> None:
        idle = 60.0
        while not self.closed:
            with self._lock:
                now = time.monotonic()
                cancelled = self._cancel is not None and self._cancel.is_set()
                if self._deadline <= now or (cancelled and self._deadline < float("inf")):
                    self.pending = self.fired = True
                    with contextlib.suppress(OSError, ValueError):
                        signal.pthread_kill(_MAIN_IDENT or 0, _INTERRUPT_SIGNAL)
                    self._deadline = now + INTERRUPT_GRACE
                if self._deadline < float("inf"):
                    idle = max(1.0, self._deadline - now)
                    self._scheduled = self._deadline
                    if self._cancel is not None:
                        self._scheduled = min(self._scheduled, now + 0.05)
                else:
                    # Between calls: look again about one timeout on, so a call armed
                    # with a similar deadline needs no wake-up.
                    self._scheduled = now + idle
                wait = self._scheduled - now
            self._wake.acquire(True, max(0.0, wait))

    def close(self) -> None:
        self.closed = True
        self._poke()


_WATCHDOG: _Watchdog | None = None


class _OnCaller:
    """``NamespaceSession.runner`` while the session's code runs on the caller's thread."""

    busy = True


_ON_CALLER = _OnCaller()


def _on_interrupt_signal(signum: int, frame: Any) -> None:
    if _WATCHDOG is not None and _WATCHDOG.take_pending():
        raise engine.Interrupt


def _inline_ready() -> _Watchdog | None:
    """The watchdog, if code may run on this thread now: the main thread, with our
    handler in place (installed on first use; never over a handler the host set)."""
    global _WATCHDOG
    if threading.get_ident() != _MAIN_IDENT:
        return None
    # The C module's getsignal: signal.getsignal converts to an enum (~4 us a call).
    handler = _csignal.getsignal(_INTERRUPT_SIGNAL)
    if handler is not _on_interrupt_signal:
        if handler not in (_csignal.SIG_DFL, None):
            return None
        _csignal.signal(_INTERRUPT_SIGNAL, _on_interrupt_signal)
    if _WATCHDOG is None or _WATCHDOG.closed:
        _WATCHDOG = _Watchdog()
    return _WATCHDOG


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
    runner: _Runner | _OnCaller | None = None
    injected: set[str] = field(default_factory=set)
    current: _Call | None = None
    threads: list[weakref.ref[threading.Thread]] = field(default_factory=list)
    owns_namespace: bool = True
    mark: str = ""  # what the processes its code starts carry (``children``)

    @property
    def stuck(self) -> bool:
        return self.runner is not None and self.runner.busy

    def threads_alive(self) -> bool:
        return _any_alive(self.threads)

    def close(self) -> None:
        """Let go of what the session holds: its namespace is emptied at once (functions
        in it make cycles a collection would find only later), unless code or threads
        the session started still run in it; they keep it until they end."""
        if self.owns_namespace and not self.stuck and not self.threads_alive():
            self.namespace.clear()


def fresh_namespace() -> dict[str, Any]:
    return {"__name__": "__main__", "__builtins__": builtins}


@contextlib.contextmanager
def _session_process_state(session: NamespaceSession | None) -> Iterator[None]:
    """Enter a session's cwd and environment; on exit record them and restore the host's."""
    host_cwd = _getcwd()
    host_env = environ_snapshot()
    marked = session is not None and bool(session.mark)
    if session is not None:
        if session.cwd != host_cwd:
            _chdir(session.cwd)
        if session.environ != host_env:
            _apply_environ(session.environ)
        if marked:  # what the code starts is the session's (``children``)
            os.environ[OWNED_ENV] = session.mark
    try:
        yield
    finally:
        if marked:
            os.environ.pop(OWNED_ENV, None)
        cwd, env = _getcwd(), environ_snapshot()
        if session is not None:
            session.cwd, session.environ = cwd, env
        if cwd != host_cwd:
            _chdir(host_cwd)
        if env != host_env:
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

    def __init__(self, inline: bool = False) -> None:
        # Sessions run with PAGER_ENV. Where the host leaves these unset they are set in
        # the host too, so entering a session costs no environment change per call.
        for key, value in PAGER_ENV.items():
            os.environ.setdefault(key, value)
        _install_thread_origin()
        self.owned = children.Owned()
        children.current_mark = _current_mark
        self._fds = _FdPump()
        self._closed = False
        self._closing = threading.Event()
        self._runner: _Runner | None = None
        # What runs the call now running (close() interrupts it).
        self._active_runner: _Runner | _Watchdog | None = None
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
        after = session.namespace
        rebound = [k for k, v in after.items() if k not in before or before[k] is not v]
        deleted = [k for k in before if k not in after]
        before.clear()
        return dataclasses.replace(ran, rebound=rebound, deleted=deleted)

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

    def _take_runner(self) -> _Runner:
        """The idle runner (called under OWN_LOCK); a new one if the last got stuck."""
        runner = self._runner
        if runner is None or runner.busy or runner.retired:
            runner = self._runner = _Runner()
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

        call = _Call(sink_out, sink_err, session)
        self.owned.arm()
        if getattr(_local, "in_call", False):
            return self._run_inline(call, namespace, request, out, err)
        watchdog = _inline_ready() if self.inline else None
        if watchdog is not None:
            return self._run_here(watchdog, call, namespace, request, out, err)
        box: dict[str, Any] = {}

        def job() -> None:
            _local.call, _local.in_call = call, True
            try:
                box["cell"] = engine.run_cell(request.code, namespace, request.output_limit)
            finally:
                _local.call = None
                _local.in_call = False

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
            with _session_process_state(session), _routed_streams():
                self._fds.start(sink_out, sink_err)
                try:
                    runner.submit(job)
                    # close() stops the wait too: the call answers now, not at its deadline.
                    finished = wait_for(runner.done, deadline - time.monotonic(),
                                        _AnyOf(request.cancel, self._closing))
                    if not finished:
                        runner.interrupt()
                        finished = runner.done.acquire(True, INTERRUPT_GRACE)
                finally:
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
                if self._runner is not None:
                    self._runner.close()
                    self._runner = None
                self._fds.close()
            OWN_LOCK.release()
        if self._closed:
            return _closed_own(out, err, still_running=not finished)
        if not finished:
            return _ran(out, err, facts.TimedOut(survived=False, stuck=True))
        return _ran_from_cell(box["cell"], out, err)

    def _run_here(self, watchdog: _Watchdog, call: _Call, namespace: dict[str, Any],
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
                session.runner, session.current = _ON_CALLER, call
            with _session_process_state(session), _routed_streams():
                self._fds.start(call.out, call.err)
                _local.call, _local.in_call = call, True
                try:
                    try:
                        watchdog.arm(deadline, request.cancel)
                        cell = engine.run_cell(request.code, namespace, request.output_limit)
                    except engine.Interrupt:  # landed after the cell's own handler
                        pass
                finally:
                    while True:  # an interrupt may land until the watchdog is disarmed
                        try:
                            watchdog.disarm()
                            break
                        except engine.Interrupt:
                            continue
                    _local.call = None
                    _local.in_call = False
                    self._fds.stop()
                    call.open = False
        finally:
            self._active_runner = None
            if session is not None:
                session.runner = None
                if session.current is call:
                    session.current = None
            if self._closed:  # close() left the fd pump to the call that was using it
                self._fds.close()
            OWN_LOCK.release()
        if self._closed:
            return _closed_own(out, err)
        if cell is None:
            cell = {"result": None, "error": None, "interrupted": True, "images": []}
        return _ran_from_cell(cell, out, err)

    @staticmethod
    def _run_inline(call: _Call, namespace: dict[str, Any], request: RunRequest,
                    out: OutputBuffer, err: OutputBuffer) -> Ran:
        """A call made from code already running here (a stored function, a capability).

        The outer call holds the process-wide state already, so this one runs on the
        same thread, under the outer call's timeout.
        """
        saved = getattr(_local, "call", None)
        _local.call = call
        try:
            with _session_process_state(call.session):
                cell = engine.run_cell(request.code, namespace, request.output_limit)
        finally:
            _local.call = saved
            call.open = False
        return _ran_from_cell(cell, out, err)

    # -- read-only ---------------------------------------------------------------------

    def run_read_only(self, session: NamespaceSession, request: RunRequest,
                      protect: Protect | None = None,
                      capabilities: Any = None) -> Ran:
        """Run against a copy of the session: a fork, or its values in a new process.

        See ``copies``. Where ``fork`` is missing or unsafe, the copy always goes by
        value. ``capabilities`` (``names()``, ``call(name, args, kwargs)``): what the
        copy may call; they run here, in the agent's process, never in the copy.
        """
        if session.stuck:
            return Ran(facts.Busy(stuck=True))
        from .copies import run_copy

        return run_copy(session, request, protect, capabilities, fork=FORK_IS_SAFE,
                        fork_on=self._fork_on_runner)

    def _fork_on_runner(self, fork: Callable[[], int]) -> int:
        """Call ``fork`` on the thread this caller's calls run on: the runner, or this
        thread where it runs them itself (``inline``, or a nested call).

        A fork child is a copy of the forking thread alone; forking where session code
        runs makes the copy's thread the one that built the session's objects, which
        sqlite3 (and any other check of the creating thread, ``threading.local``)
        insists on. Forking here also saves the two thread hand-offs.
        """
        if getattr(_local, "in_call", False):
            return fork()
        box: dict[str, Any] = {}

        def job() -> None:
            try:
                box["pid"] = fork()
            except BaseException as exc:
                box["error"] = exc

        with OWN_LOCK:
            if self.inline and _inline_ready() is not None:
                return fork()
            runner = self._take_runner()
            runner.submit(job)
            runner.done.acquire()
        if "error" in box:
            raise box["error"]
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
                if self._runner is not None:
                    self._runner.close()
                    self._runner = None
                if self._active_runner is None:
                    self._fds.close()
            finally:
                OWN_LOCK.release()
        # What the code started (Popen, os.fork, and what those started) ends too.
        self.owned.end()
        self.owned.disarm()


class _AnyOf:
    """Set when any of its events is (what ``wait_for`` asks of a cancel event)."""

    def __init__(self, *events: threading.Event | None) -> None:
        self.events = [e for e in events if e is not None]

    def is_set(self) -> bool:
        return any(e.is_set() for e in self.events)


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


def _ran_from_cell(cell: dict[str, Any], out: OutputBuffer, err: OutputBuffer) -> Ran:
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
    return _ran(out, err, event, result=cell.get("result"), images=cell.get("images") or (),
                truncated=bool(cell.get("result_truncated")))


def _ran(out: OutputBuffer, err: OutputBuffer, event: facts.Event, **fields: Any) -> Ran:
    """A run's fact with the output it wrote so far."""
    truncated = out.truncated or err.truncated or bool(fields.pop("truncated", False))
    return Ran(event, out.getvalue(), err.getvalue(), truncated, **fields)


def _closed_own(out: OutputBuffer, err: OutputBuffer, *, still_running: bool = False) -> Ran:
    # Honest about the agent's process: an interrupt reaches Python code only between
    # bytecodes, so code blocked in C (a sleep, a read) may still run on after this.
    what = (" (interrupted: it is blocked outside Python and may still run in the "
            "agent's process until that call returns)" if still_running
            else " (interrupted)")
    return _ran(out, err, facts.Closed("executor", detail=what))


def copy_status(status: int | None) -> str:
    """How a read-only copy (a fork child) ended, from its wait status."""
    if status is not None and os.WIFSIGNALED(status):
        return messages.killed_by(os.WTERMSIG(status))
    if status is not None and os.WIFEXITED(status):
        return f"exit status {os.WEXITSTATUS(status)}; os._exit() or a crash"
    return "no reason given"
