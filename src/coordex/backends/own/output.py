"""Where an own-interpreter call's output goes.

A write belongs to the call running on the writing thread, or, for a thread the code
started, to the call that started it (:class:`Call`; ``threading.Thread.start`` is
replaced to record it). ``sys.stdout``/``sys.stderr``/``sys.stdin`` are routed by
that for the duration of each call (:func:`routed_streams`), and :class:`FdPump`
streams what reaches file descriptors 1 and 2 (child processes, C code) to the running
call. How a call's output reads, and what still leaks, is in :mod:`.interpreter`.
"""

from __future__ import annotations

import contextlib
import io
import os
import select
import selectors
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...worker import _coordex_copy as copier
from ...worker import _coordex_engine as engine

if TYPE_CHECKING:
    from .interpreter import NamespaceSession

class _Local(threading.local):
    """The call this thread runs (``call``, for its output) and whether one runs on it
    now (``in_call``: a nested call runs inline). Class defaults: a ``threading.local``
    attribute a thread never set costs an ``AttributeError`` (~0.7 us) to read."""

    call: Call | None = None
    in_call = False


local = _Local()


# --------------------------------------------------------------------------- calls and threads


class Call:
    """One running own-interpreter call: where its output goes, and what it started.

    The call's own thread finds it in ``local.call``; a thread its code starts carries
    it as ``_coordex_call`` (set by :func:`_start_with_origin`), so the thread's prints
    reach this call while it runs and no call once it returned (SPEC 6), of this
    session or another.
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
        return any_alive(self.threads)


def any_alive(refs: list[weakref.ref[threading.Thread]]) -> bool:
    alive = [ref for ref in refs if (t := ref()) is not None and t.is_alive()]
    refs[:] = alive  # ended threads are forgotten, so the list stays short
    return bool(alive)


def _current_call() -> Call | None:
    """The call whose output this thread's writes belong to, or None (a host thread)."""
    call: Call | None = getattr(local, "call", None)
    if call is None:
        call = getattr(threading.current_thread(), "_coordex_call", None)
    return call


def _target_call() -> Call | None:
    """Where a write from this thread goes: a call, None (the host's stream) or
    ``_NOWHERE`` (a thread whose call is over: SPEC 6, what it writes after its call
    returned is no call's output, not even its own session's next one)."""
    call = _current_call()
    if call is None or call.open:
        return call
    return _NOWHERE


def current_mark() -> str | None:
    """The mark of the session whose code runs on this thread (or started it, while
    that session runs a call), if any."""
    call = _current_call()
    if call is not None and not call.open:
        session = call.session
        call = session.current if session is not None else None
    session = call.session if call is not None else None
    return session.mark if session is not None else None


def _drop(text: str) -> None:
    pass


_NOWHERE = Call(_drop, _drop, None)
THREAD_START = threading.Thread.start


def _start_with_origin(self: threading.Thread) -> None:
    """``threading.Thread.start`` that remembers which call started the thread."""
    call = _current_call()
    if call is not None:
        self._coordex_call = call  # type: ignore[attr-defined]
        ref = weakref.ref(self)
        call.threads.append(ref)
        if call.session is not None:
            any_alive(call.session.threads)
            call.session.threads.append(ref)
    THREAD_START(self)


def install_thread_origin() -> None:
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
            # A call swapping its pipes onto fds 1/2 first waits for host writes under
            # way to end on the host's fds (see _HostHeld.writing).
            if not _HOST_HELD.begin_write():  # fds 1/2 are the call's: later, not into it
                return _HOST_HELD.hold(self, text)
            try:
                return int(self.original.write(text) or 0)
            finally:
                _HOST_HELD.end_write()
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        (call.out if self._name == "stdout" else call.err)(engine.escape_text(text))
        return len(text)

    def flush(self) -> None:
        if _target_call() is None and _HOST_HELD.begin_write():
            try:
                with contextlib.suppress(Exception):
                    self.original.flush()
            finally:
                _HOST_HELD.end_write()

    def isatty(self) -> bool:
        if _target_call() is None and not _HOST_HELD.routing:  # the host's, between calls
            with contextlib.suppress(Exception):
                return bool(self.original.isatty())
        return False

    def fileno(self) -> int:
        return int(self.original.fileno())

    def writable(self) -> bool:
        return True

    # io.TextIOBase defines these as None: the host's stream answers them.
    @property
    def encoding(self) -> Any:  # type: ignore[override]
        return getattr(self.original, "encoding", None)

    @property
    def errors(self) -> Any:  # type: ignore[override]
        return getattr(self.original, "errors", None)

    @property
    def newlines(self) -> Any:  # type: ignore[override]
        return getattr(self.original, "newlines", None)

    def __getattr__(self, item: str) -> Any:
        return getattr(self.original, item)


class EmptyStdin(io.TextIOBase):
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
        self._empty = EmptyStdin()

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


class routed_streams:
    """Route sys.stdout/stderr/stdin through per-thread captures for one call.

    Installed per call, not once, because hosts (test runners, notebooks, servers)
    replace ``sys.stdout`` whenever they like; whatever is there is wrapped and put back.
    The three proxies are made once and re-pointed: creating (and finalising, which
    flushes) stream objects on every call cost tens of microseconds. (A class, not a
    generator: it runs on every call.)
    """

    __slots__ = ("saved",)

    def __enter__(self) -> None:
        self.saved = saved = (sys.stdout, sys.stderr, sys.stdin)
        if saved[0] is not _STDOUT:
            _STDOUT.original = saved[0]
        if saved[1] is not _STDERR:
            _STDERR.original = saved[1]
        if saved[2] is not _STDIN:
            _STDIN.original = saved[2]
        sys.stdout, sys.stderr, sys.stdin = _STDOUT, _STDERR, _STDIN
        _HOST_HELD.route()  # no host write is under way when the call's pipes go in

    def __exit__(self, *exc: object) -> None:
        _HOST_HELD.routing = False  # (a plain store: a host write reads it under the lock)
        # The proxies stay where no one replaced them during the call: a host thread in
        # the middle of a print when the next call starts then writes its rest through
        # them (held, written after that call), never through a stream it took before the
        # call whose fd is that call's pipe. They pass every write to ``original`` between
        # calls; a host that puts its own stream in is wrapped again at the next call.
        saved = self.saved
        if sys.stdout is not _STDOUT:
            sys.stdout = saved[0]
        if sys.stderr is not _STDERR:
            sys.stderr = saved[1]
        if sys.stdin is not _STDIN:
            sys.stdin = saved[2]
        if _HOST_HELD.held:
            _HOST_HELD.release()  # the host's fds are its own again


def install_streams() -> None:
    """Put the routing proxies in as ``sys.stdout``/``stderr``/``stdin`` now, not at the
    first call: a host thread in the middle of a print when a call starts then writes the
    rest through them (held until the call ends), never through the host's own stream,
    whose fd is the call's pipe by then. Between calls they pass everything through."""
    _installed[0] += 1
    for name, proxy in (("stdout", _STDOUT), ("stderr", _STDERR), ("stdin", _STDIN)):
        current = getattr(sys, name)
        if current is not None and current is not proxy:
            proxy.original = current
            setattr(sys, name, proxy)


def uninstall_streams() -> None:
    """The last own interpreter closed, with no call running: the host's own streams
    go back where the proxies stand (a stream the host put in since stays)."""
    _installed[0] -= 1
    if _installed[0] > 0:
        return
    for name, proxy in (("stdout", _STDOUT), ("stderr", _STDERR), ("stdin", _STDIN)):
        if getattr(sys, name) is proxy:
            setattr(sys, name, proxy.original)


_installed = [0]  # own interpreters that installed the proxies and did not uninstall them


class _HostHeld:
    """What host threads (no call's) print while a call runs, written out after it.

    During a call fds 1/2 are the call's pipes, so a host stream that writes to them
    would put a host thread's lines into the call's output; they wait here instead
    (at most ``limit`` characters; the rest is dropped) and go to the host's own
    stream once the call ended.
    """

    # Seconds a call waits for a host write under way to end before its pipes go on
    # fds 1/2: a host whose own stream is blocked (a full pipe no one reads) must not
    # stop every call; what such a write still writes after the wait may land in the call.
    WRITE_WAIT = 0.5

    def __init__(self, limit: int = 1 << 20) -> None:
        self.routing = False
        # Host writes under way to the host's stream (a call waits for none to be left
        # before its pipes go on fds 1/2), under ``_writes``.
        self.writing = 0
        # Of those, the ones a call already waited ``WRITE_WAIT`` for (blocked): the
        # next calls do not wait for them again.
        self.stuck = 0
        self._writes = threading.Condition(threading.Lock())
        self._lock = threading.Lock()
        self.held: list[tuple[_RoutedStream, str]] = []
        self._size = 0
        self._limit = limit

    def begin_write(self) -> bool:
        """A host thread is about to write to the host's stream: False while a call
        routes (the text is held instead)."""
        with self._writes:
            if self.routing:
                return False
            self.writing += 1
            return True

    def end_write(self) -> None:
        with self._writes:
            self.writing -= 1
            self.stuck = min(self.stuck, self.writing)
            if self.writing <= self.stuck:
                self._writes.notify_all()

    def route(self) -> None:
        """A call starts: host writes from now on are held; those under way end first
        (for at most ``WRITE_WAIT`` seconds)."""
        with self._writes:
            self.routing = True
            if self.writing > self.stuck and not self._writes.wait_for(
                    lambda: self.writing <= self.stuck, self.WRITE_WAIT):
                self.stuck = self.writing

    def hold(self, stream: _RoutedStream, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        with self._lock:
            if self._size + len(text) <= self._limit:
                self.held.append((stream, text))
                self._size += len(text)
        return len(text)

    def release(self) -> None:
        with self._lock:
            held, self.held, self._size = self.held, [], 0
        for stream, text in held:
            with contextlib.suppress(Exception):
                stream.original.write(text)


_HOST_HELD = _HostHeld()
_STDOUT = _RoutedStream("stdout", sys.stdout)
_STDERR = _RoutedStream("stderr", sys.stderr)
_STDIN = _RoutedStdin(sys.stdin)


# Audit events that start a process: one that starts while a call's pipes are on
# fds 1 and 2 may hold them after the call (see FdPump). Counted in any thread.
_SPAWN_EVENTS = frozenset({"os.fork", "os.forkpty", "os.posix_spawn", "os.spawn",
                           "os.system", "subprocess.Popen", "pty.fork"})
_spawns = [0]
# ``os.chdir`` and ``os.fchdir`` calls, in any thread: while it stays put, the cwd read
# last is still the cwd (see ``interpreter.getcwd``).
chdirs = [0]
# ``os.putenv``/``os.unsetenv`` calls (what every change to ``os.environ`` makes), in any
# thread: while it stays put, so does ``os.environ`` (see ``interpreter``).
environ_changes = [0]
_ENVIRON_EVENTS = frozenset({"os.putenv", "os.unsetenv"})
_spawn_hook_installed = False


def _count_spawn(event: str, args: tuple[Any, ...]) -> None:
    if event in _SPAWN_EVENTS:
        _spawns[0] += 1
    elif event == "os.chdir":
        chdirs[0] += 1
    elif event in _ENVIRON_EVENTS:
        environ_changes[0] += 1


def _install_spawn_counter() -> None:
    global _spawn_hook_installed
    if not _spawn_hook_installed:
        _spawn_hook_installed = True
        sys.addaudithook(_count_spawn)  # ~0.2 us per audited event; cannot be removed


class FdPump:
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
        self._fed: set[int] = set()  # read ends whose decoder was fed since the last start
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
        flush_real_streams()
        with self._lock:
            if not self._pipes:
                for fd in (1, 2):
                    r, w = os.pipe()
                    os.set_blocking(r, False)
                    copier.hold(r, w)
                    self._owned.add(r)
                    self._sel.register(r, selectors.EVENT_READ, fd)
                    self._pipes[fd] = (r, w)
                    self._decoders[r] = utf8_decoder()
                self._ready = select.poll()  # which of the two has data left, in one call
                for r, _ in self._pipes.values():
                    self._ready.register(r, select.POLLIN)
            (r_out, w_out), (r_err, w_err) = self._pipes[1], self._pipes[2]
            self._sinks[r_out], self._sinks[r_err] = out, err
            for r in self._fed:  # only a decoder that was fed can hold part of a character
                self._decoders[r].reset()
            self._fed.clear()
            self._spawns_at_start = _spawns[0]
        saved = self._saved
        saved[1] = os.dup(1)
        os.dup2(w_out, 1)
        saved[2] = os.dup(2)
        os.dup2(w_err, 2)
        saved[0] = os.dup(0)
        os.dup2(self._devnull, 0)

    def stop(self) -> None:
        flush_real_streams()
        for fd, saved in self._saved.items():
            os.dup2(saved, fd)
            os.close(saved)
        self._saved.clear()
        retire = _spawns[0] != self._spawns_at_start
        with self._lock:  # what is left in the pipes was written during the call
            pipes = self._pipes
            if retire:
                self._pipes = {}
                ready = [r for r, _ in pipes.values()]
            else:  # most calls leave nothing: one poll says so, no read at all
                ready = [fd for fd, _ in self._ready.poll(0)]
                if not ready and not self._fed:
                    self._sinks.clear()
                    return
            deadline = time.monotonic() + 1.0
            for r, w in pipes.values():
                sink, decoder = self._sinks.pop(r, None), self._decoders[r]
                if r not in ready:
                    if r in self._fed:
                        tail = decoder.decode(b"", final=True)  # a character cut short
                        if tail and sink is not None:
                            sink(tail)
                    continue
                if retire:  # our write end goes: only what the code started holds one
                    copier.release(w)
                    os.close(w)
                ended = False
                self._fed.add(r)
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
        self._fed.discard(r)
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
                            self._fed.add(key.fd)
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


def flush_real_streams() -> None:
    for stream in (sys.__stdout__, sys.__stderr__):
        if stream is not None:
            try:
                stream.flush()
            except Exception:  # a closed or broken host stream: nothing to flush
                pass


def utf8_decoder() -> Any:
    import codecs

    return codecs.getincrementaldecoder("utf-8")("replace")


def counting_chdirs() -> bool:
    """Whether ``chdirs`` counts (the audit hook is in place)."""
    return _spawn_hook_installed
