"""Where an own-interpreter call's code runs, and how it is stopped at its deadline.

:class:`Runner` is a thread that runs one job at a time while the caller waits with a
deadline; at the deadline the caller raises :class:`engine.Interrupt` in it
(``PyThreadState_SetAsyncExc``). Where the code runs on the caller's main thread
instead (``OwnInterpreter(inline=True)``), :class:`Watchdog` signals that thread at
the deadline. Which one a call uses, and why, is in :mod:`.interpreter`.
"""

from __future__ import annotations

import _signal as _csignal
import _thread
import contextlib
import ctypes
import os
import signal
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from ...worker import _coordex_engine as engine
from ..base import INTERRUPT_GRACE
from .output import THREAD_START

# --------------------------------------------------------------------------- runner thread


def _raise_in(ident: int, exc: type[BaseException] | None) -> None:
    """Raise ``exc`` in thread ``ident`` at its next bytecode; None withdraws a pending one."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(ident), None if exc is None else ctypes.py_object(exc))


def _cpu_reader() -> Callable[[], int] | None:
    """The C library's ``sched_getcpu`` (the CPU this thread runs on now), where there
    is one and threads' CPUs can be set."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    try:
        getcpu = ctypes.CDLL(None, use_errno=True).sched_getcpu
    except (OSError, AttributeError):
        return None
    getcpu.restype, getcpu.argtypes = ctypes.c_int, []
    return getcpu


_getcpu = _cpu_reader()
# Where nothing is held, one hand-off in this many is watched for a crossing. Two
# watched in a row that crossed (so crossings are the rule, as where the other CPU
# idles, not a moment's load) hold the next HOLD_CALLS calls, twice as many each time
# the crossings go on after a hold (up to HOLD_MAX), HOLD_CALLS again once one did not.
PROBE_EVERY = 8
HOLD_CALLS = 64
HOLD_MAX = 4096
# [calls still to hold, hand-offs not held, crossings watched in a row, the next hold]
_hold_left = [0, 0, 0, HOLD_CALLS]


class _EventGo:
    """The runner's go signal over an ``eventfd``: ``release`` writes it with the GIL
    let go first (``os.eventfd_write`` is a system call made without the GIL), so the
    runner it wakes takes the GIL at once; a lock's ``release`` wakes the runner while
    the caller still holds the GIL, and the runner, woken on the caller's CPU, runs only
    to find the GIL held, sleeps again and is woken a second time (about three switches
    more a call). ``acquire`` waits without the GIL, as a lock's does.

    A fork child gets an eventfd of its own (:func:`_renew_in_child`): a child of the
    code that returns into its copy of the runner must never take the parent's go
    signals (the parent's call would wait out its timeout)."""

    __slots__ = ("__weakref__", "_fd", "_lock")

    def __init__(self) -> None:
        self._fd = os.eventfd(0, os.EFD_CLOEXEC)
        self._lock: Any = None  # a fork child that could not make an eventfd: a lock
        _GOS.add(self)

    def acquire(self) -> bool:
        if self._lock is not None:
            return bool(self._lock.acquire())
        os.eventfd_read(self._fd)  # every release so far: the runner looks at its job
        return True

    def release(self) -> None:
        if self._lock is not None:
            with contextlib.suppress(RuntimeError):
                self._lock.release()
            return
        os.eventfd_write(self._fd, 1)

    def renew(self) -> None:
        """In a fork child: a signal of its own, never the parent's."""
        inherited, self._fd = self._fd, -1
        try:
            self._fd = os.eventfd(0, os.EFD_CLOEXEC)
        except OSError:
            lock = _thread.allocate_lock()
            lock.acquire()
            self._lock = lock
        with contextlib.suppress(OSError):
            os.close(inherited)

    def __del__(self) -> None:
        if getattr(self, "_fd", -1) >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)


_GOS: weakref.WeakSet[_EventGo] = weakref.WeakSet()


def _renew_in_child() -> None:
    for go in list(_GOS):
        with contextlib.suppress(Exception):
            go.renew()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_in_child)


def _go_signal() -> _EventGo | Any:
    """The runner's go signal: an ``eventfd`` where there is one, else a held lock."""
    if hasattr(os, "eventfd"):
        with contextlib.suppress(OSError):
            return _EventGo()
    go = _thread.allocate_lock()
    go.acquire()
    return go


class Runner:
    """A daemon thread that runs one job at a time; the caller waits with a deadline.

    Runners belong to the :class:`OwnInterpreter`, not to sessions: one runner serves
    every call, and a session only points at the runner while that runner holds its
    code. A runner whose code did not stop when interrupted is *retired*: the next call
    gets a new runner, and the retired thread ends as soon as its code returns. So no
    thread is kept per session, and nothing keeps a job (and the namespace its closure
    holds) once it returned.

    Hand-off uses bare locks (``_thread.allocate_lock``): two context switches per call.
    Where the other CPU is idle the scheduler wakes the waiting thread there, and a
    wake-up across CPUs costs ~45 us on a small VM (4-8 us on one CPU), twice a call; so
    once a hand-off crossed CPUs, both threads are held on the caller's CPU for the
    hand-offs of the next calls (:meth:`hold_together`), and the runner lets go of it
    before the job starts: the code, the threads and the processes it starts see the
    CPUs they would have seen anyway.

    The interrupt is sent under ``_lock`` only while the runner holds the job, and a
    pending one is withdrawn once the job ended (one that lands first makes that step
    run again); a job the runner has not taken yet is taken back instead, so code whose
    call already answered never runs later.
    """

    def __init__(self) -> None:
        self._go = _go_signal()
        self.done = _thread.allocate_lock()  # released once per job, after it ended
        self.done.acquire()
        self._lock = _thread.allocate_lock()
        self._job: Callable[[], None] | None = None
        self._in_job = False  # a job runs (an interrupt may be sent), under ``_lock``
        self._taken = False  # a job was taken and its bookkeeping (``_finish``) is due
        self._sent = False
        self.busy = False
        self.retired = False
        self._held = False  # held on the caller's CPU: let go before the job runs
        self._cpus: set[int] = set()  # the runner's own CPUs
        self._caller_cpus: set[int] | None = None  # the caller's, while it is held
        self._caller_cpu = -1  # where the caller handed off (not held), to compare
        self._ran_on = -1  # the CPU the runner took the last job on
        self._thread = threading.Thread(target=self._loop, name="coordex-runner", daemon=True)
        # Not a thread of any call: start it with the original start().
        THREAD_START(self._thread)

    @property
    def ident(self) -> int:
        return self._thread.ident or 0

    def submit(self, job: Callable[[], None]) -> None:
        self.busy = True
        self._job = job
        self._go.release()

    def hold_together(self) -> None:
        """Before a hand-off: where hand-offs cross CPUs, hold this (the caller's)
        thread and the runner on the CPU the caller runs on, so it is a switch on one
        CPU; else, now and then, note the CPU to see whether this one crosses.
        :meth:`let_go` after the wait. Holding costs ~6 us (system calls, and a busy
        CPU is not left), so it is done only while crossings are the rule."""
        self._caller_cpus = None
        self._caller_cpu = -1
        if _getcpu is None or not self._cpus:
            return
        try:
            if _hold_left[0] <= 0:
                _hold_left[1] += 1
                if _hold_left[1] % PROBE_EVERY == 0:  # a few calls tell; cheaper still
                    self._ran_on = -1
                    self._caller_cpu = _getcpu()
                return
            _hold_left[0] -= 1
            cpu = _getcpu()
            mine = os.sched_getaffinity(0)
            if len(mine) < 2 or cpu not in mine or cpu not in self._cpus:
                return
            self._held = True
            os.sched_setaffinity(self._thread.native_id or 0, (cpu,))
            os.sched_setaffinity(0, (cpu,))
            self._caller_cpus = mine
        except OSError:  # a CPU went offline, a cpuset changed: not held, no harm
            pass

    def let_go(self) -> None:
        """After the wait: give the caller's thread its CPUs back, or, where nothing
        was held and this hand-off was watched, count whether it crossed CPUs."""
        if self._caller_cpus is not None:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, self._caller_cpus)
            self._caller_cpus = None
        elif self._caller_cpu >= 0 and _getcpu is not None:
            watch = _hold_left
            if self._ran_on != self._caller_cpu or _getcpu() != self._ran_on:
                watch[2] += 1
                if watch[2] >= 2:
                    watch[0], watch[2] = watch[3], 0
                    watch[3] = min(2 * watch[3], HOLD_MAX)
            else:
                watch[2], watch[3] = 0, HOLD_CALLS

    def _loop(self) -> None:
        if _getcpu is not None:
            with contextlib.suppress(OSError):
                self._cpus = os.sched_getaffinity(0)
        # An interrupt is sent only while a job runs (``_in_job``, set as the job is
        # taken, under ``_lock``): it lands in the job, or, if the job ended just before,
        # in the bookkeeping after it, which then runs again (``_taken``).
        while True:
            try:
                if self._taken:
                    self._finish()
                    if self.retired:
                        return
                self._go.acquire()
                if self._held:  # the code runs on the CPUs it would have had
                    self._held = False
                    os.sched_setaffinity(0, self._cpus)
                elif self._caller_cpu >= 0 and _getcpu is not None:  # watched
                    self._ran_on = _getcpu()
                with self._lock:
                    job, self._job = self._job, None
                    self._in_job = self._taken = job is not None
                if job is None:  # retired, or its job was taken back (``interrupt``)
                    if self.retired:
                        return
                    continue
                try:
                    job()
                finally:
                    job = None
                # Here, not at the loop's top: an interrupt still pending as the job
                # returns lands at the next check, and the loop's backward jump is one,
                # outside this try (it ended the thread; the session stayed busy).
                self._finish()
                if self.retired:
                    return
            except BaseException:  # an interrupt that landed outside the code: ignore
                pass

    def _finish(self) -> None:
        """After a job: no interrupt can be sent or land any more, then the caller is
        told. Runs again from the top if an interrupt lands in it before that."""
        with self._lock:
            self._in_job = False
        if self._sent:  # withdraw an interrupt that has not landed yet
            _raise_in(self.ident, None)
            self._sent = False
        self._taken = False
        self._tell_caller()

    def _tell_caller(self) -> None:
        """The job ended, or will never run: the waiting caller goes on (once a job)."""
        if self.busy:
            self.busy = False
            self.done.release()

    def interrupt(self) -> None:
        """Raise :class:`engine.Interrupt` in the job, if it is still running; a job the
        runner has not taken yet is taken back (it never runs) and the caller told."""
        with self._lock:
            if self._in_job:
                # One a job: once it landed (in the code, or in the bookkeeping after
                # it) none can be left pending where no ``try`` catches it.
                if not self._sent:
                    self._sent = True
                    _raise_in(self.ident, engine.Interrupt)
                return
            if self._job is None:
                return
            self._job = None
        self._tell_caller()

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


class Watchdog:
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
        THREAD_START(self._thread)

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


_WATCHDOG: Watchdog | None = None


class OnCaller:
    """``NamespaceSession.runner`` while the session's code runs on the caller's thread."""

    busy = True


ON_CALLER = OnCaller()


def _on_interrupt_signal(signum: int, frame: Any) -> None:
    if _WATCHDOG is not None and _WATCHDOG.take_pending():
        raise engine.Interrupt


def inline_ready() -> Watchdog | None:
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
        _WATCHDOG = Watchdog()
    return _WATCHDOG
