"""The one stop policy for every process coordex starts, and the keeper behind it.

How it works
------------
Every process coordex starts (workers and templates, shells, the read-only launcher,
uv builds) leads a process session of its own (``start_new_session``), so everything
it starts - fork children, ``cmd &``, ``nohup cmd &``, ``subprocess.Popen`` - shares
its session id unless it deliberately left with ``setsid``. :func:`spawn` starts such a
process and tells the *keeper* its session; :func:`stop` ends it, always the same way:

1. ``asked`` - the process is asked to leave in its own terms (a worker's ``shutdown``
   message, SIGHUP for an interactive bash, a closed socket for the launcher);
2. ``interrupt`` - SIGINT to its process group;
3. ``terminate`` - SIGTERM to its process group;
4. ``kill`` - SIGKILL to its process group.

Each step waits up to its own time for the leader to end (a pidfd, so no polling
sleeps); the step that ended it is returned and logged (debug; warning from
``terminate`` on, since a process that needs TERM ignored the gentler steps). Then the
rest of its process group (background jobs) gets SIGKILL - and, when a kept session
closes, every other process of its session too (jobs that moved to a group of their
own) - and the leader is reaped.

The keeper (``_keeper.py``, run by path with this interpreter, standard library only)
is one small process per host that holds the read end of a pipe and a list of the
sessions coordex started. It never acts while the host lives. When the host dies
without closing (SIGKILL, SIGTERM without a handler, a crash), the pipe reaches end of
file and the keeper kills every process of every session still listed, then exits.
``PR_SET_PDEATHSIG`` would not do: it fires when the *thread* that started the child
ends, and calls arrive on short-lived threads (anyio's pool, a caller's own threads).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..worker import _coordex_copy as copier
from ._keeper import live_processes

logger = logging.getLogger("coordex.processes")

StopStep = Literal["exited", "asked", "interrupt", "terminate", "kill"]
# How long each step waits for the leader before the next one.
STEP_SECONDS = 1.0
KEEPER_SCRIPT = Path(__file__).resolve().parent / "_keeper.py"


@dataclass(frozen=True)
class Steps:
    """Which steps a kind of process gets, and how long each waits."""

    interrupt: bool = True  # an interactive bash ignores SIGINT as a way to leave
    terminate: bool = True  # ...and SIGTERM
    ask: bool = True  # ask it to leave in its own terms first (where the caller can)
    seconds: float | None = None  # None: STEP_SECONDS
    # Also look for members that left the group but not the session (``set -m`` jobs,
    # ``setpgid``): a scan of /proc, 1-7 ms on a busy machine, so only where a kept
    # session closes, not for every short-lived process.
    whole_session: bool = False


DEFAULT_STEPS = Steps()
# For a process that already ignored an interrupt (or never took the call: stopped,
# stuck): straight to SIGKILL, within SPEC 6's grace.
KILL_NOW = Steps(interrupt=False, terminate=False, ask=False)
# A kept session (a worker, a shell) closing: everything it left in its session ends.
SESSION_STEPS = Steps(whole_session=True)


# Set in the environment while own-interpreter code runs (``own/children.py``): what
# that code starts carries it. What coordex starts is coordex's, so it never does.
OWNED_ENV = "COORDEX_OWNED"


def without_owned_mark(env: Any) -> Any:
    """``env`` (None: this process's) without :data:`OWNED_ENV`; ``env`` itself when
    it has none."""
    source = os.environ if env is None else env
    if OWNED_ENV not in source:
        return env
    return {k: v for k, v in source.items() if k != OWNED_ENV}


def spawn(argv: Sequence[str], **popen: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen`` in a new session, registered with the keeper.

    A host that ignores SIGINT (started in the background of a script, or under
    ``nohup``) would hand that on, and a shell cannot take back a signal it was started
    ignoring: no timeout could interrupt it. Then (only then: it costs the fast spawn)
    the process gets SIGINT back to its default before it starts.
    """
    popen["start_new_session"] = True
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN and "preexec_fn" not in popen:
        popen["preexec_fn"] = _default_sigint
    popen["env"] = without_owned_mark(popen.get("env"))
    proc: subprocess.Popen[Any] = subprocess.Popen(list(argv), **popen)
    keeper().watch(proc.pid)
    return proc


def _default_sigint() -> None:  # in the child, between fork and exec
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run(argv: Sequence[str], what: str, *, timeout: float, check: bool = False,
        **popen: Any) -> subprocess.CompletedProcess[str]:
    """``subprocess.run`` (text, output captured) through :func:`spawn` and :func:`stop`.

    Past ``timeout`` the process is stopped by the policy and ``TimeoutExpired`` raised,
    as ``subprocess.run`` does; ``check`` raises ``CalledProcessError`` on failure.
    """
    proc = spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        stop(proc, what)  # past the timeout: stopped; else reaped already, forgotten
    if check and proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, list(argv), out, err)
    return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)


def stop(proc: subprocess.Popen[Any], what: str, *,
         ask: Callable[[], bool] | None = None, steps: Steps | None = None) -> StopStep:
    """End ``proc`` (a :func:`spawn`-ed session leader) and its session; reap it.

    ``ask`` asks it to leave in its own terms and returns whether that is worth waiting
    for (a busy worker will not read its ``shutdown``). Returns the step that ended it:
    ``"exited"`` if it had ended already. Idempotent: a reaped process is not signalled.
    """
    done: StopStep | None = getattr(proc, "_coordex_stop_step", None)
    if done is not None:
        return done  # stopped before: its pid (and group id) may belong to another now
    steps = steps or DEFAULT_STEPS
    seconds = STEP_SECONDS if steps.seconds is None else steps.seconds
    started = time.monotonic()
    step: StopStep = "exited"
    plan: list[tuple[StopStep, Callable[[], bool]]] = []
    if ask is not None and steps.ask:
        plan.append(("asked", ask))
    if steps.interrupt:
        plan.append(("interrupt", lambda: _group(proc, signal.SIGINT)))
    if steps.terminate:
        plan.append(("terminate", lambda: _group(proc, signal.SIGTERM)))
    plan.append(("kill", lambda: _group(proc, signal.SIGKILL)))
    timings: list[str] = []
    if proc.poll() is None:
        with _PidWait(proc) as waiter:
            for name, act in plan:
                step = name
                t0 = time.monotonic()
                worth_waiting = act()
                if waiter.wait(seconds if worth_waiting or name == "kill" else 0.0):
                    timings.append(f"{name} {time.monotonic() - t0:.3f}s")
                    break
                timings.append(f"{name} {time.monotonic() - t0:.3f}s")
    sweep(proc.pid)
    with contextlib.suppress(OSError):
        proc.wait()
    if steps.whole_session:
        sweep_session(proc.pid)
    keeper().forget(proc.pid)
    proc._coordex_stop_step = step  # type: ignore[attr-defined]
    level = logging.WARNING if step in ("terminate", "kill") else logging.DEBUG
    if logger.isEnabledFor(level):
        logger.log(level, "stopped %s (pid %d) at step %r in %.3f s [%s]", what, proc.pid,
                   step, time.monotonic() - started, ", ".join(timings) or "already gone")
    return step


def sweep(sid: int, settle: float = 0.5) -> None:
    """SIGKILL what is left of process group ``sid`` (its background jobs), and wait up
    to ``settle`` seconds until none of them runs any more.

    SIGKILL is delivered asynchronously: without the wait, a caller that looks right
    after ``stop()`` returned can still see a background job alive. The wait costs
    nothing when the group is already empty (one ``killpg(..., 0)``).
    """
    try:
        os.killpg(sid, signal.SIGKILL)
    except OSError:
        return  # no process left in the group
    try:
        os.killpg(sid, 0)
    except OSError:
        return  # already gone
    _wait_gone([pid for pid, group, _ in live_processes() if group == sid], settle)


def _wait_gone(pids: list[int], settle: float) -> None:
    """Wait up to ``settle`` seconds until none of ``pids`` runs (zombies count as gone)."""
    deadline = time.monotonic() + settle
    while pids and time.monotonic() < deadline:
        pids = [pid for pid in pids if _runs(pid)]
        if pids:
            time.sleep(0.001)


def _runs(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


class Adopted:
    """What :func:`stop` and a place ask of a ``Popen``, for a process that is not our
    child (a fork of a session's worker or shell): its end is read from ``/proc``.

    ``reaps``: it may be our child after all (its parent gone, this process a
    subreaper), so each poll tries to reap it first (its exit status then). Otherwise
    its status is :meth:`ended`'s: SIGKILL unless a subclass knows better.
    ``pause``: seconds between two polls while :meth:`wait` waits."""

    stdin = stdout = None

    def __init__(self, pid: int, what: str, *, reaps: bool = False,
                 pause: float = 0.005) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.args = [what]
        self.reaps, self.pause = reaps, pause

    def ended(self) -> int:
        """The status of a process seen gone that this process could not reap."""
        return -signal.SIGKILL

    def poll(self) -> int | None:
        if self.returncode is None:
            if self.reaps:
                with contextlib.suppress(ChildProcessError, OSError):
                    pid, status = os.waitpid(self.pid, os.WNOHANG)
                    if pid:
                        self.returncode = os.waitstatus_to_exitcode(status)
                        return self.returncode
            if not _runs(self.pid):
                self.returncode = self.ended()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(self.pause)
        assert self.returncode is not None
        return self.returncode


# Forks of a kept bash (``fork_session``): bash cannot leave its process session
# without exec, so a fork leads a process group of its own in its source's session.
# session id -> the groups of its live forks: spared when the source closes; the keeper
# watches the session until the last of the family is stopped, and then it is swept.
_FAMILIES: dict[int, set[int]] = {}
_FAMILY_LOCK = threading.Lock()


def join_family(sid: int, pgid: int) -> None:
    """``pgid`` (a fork's group) lives in session ``sid`` until :func:`leave_family`."""
    with _FAMILY_LOCK:
        _FAMILIES.setdefault(sid, set()).add(pgid)
    keeper().watch(sid)


def leave_family(sid: int, pgid: int) -> None:
    """The fork leading ``pgid`` was stopped; the last one out sweeps the session."""
    with _FAMILY_LOCK:
        groups = _FAMILIES.get(sid, set())
        groups.discard(pgid)
        last = not keeper().watching(sid, more_than=1)
        if not groups:
            _FAMILIES.pop(sid, None)
    if last:
        sweep_session(sid)
    keeper().forget(sid)


def sweep_session(sid: int) -> int:
    """SIGKILL every process of session ``sid`` that is not in group ``sid`` (it left
    the group, not the session: ``set -m`` jobs, ``setpgid``). Returns how many. The
    groups of live forks of a shell (:func:`join_family`) are spared."""
    killed: list[int] = []
    with _FAMILY_LOCK:
        spared = set(_FAMILIES.get(sid, ()))
    for pid in session_members(sid, spared):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    _wait_gone(killed, 0.5)  # as in sweep(): SIGKILL lands asynchronously
    return len(killed)


def session_members(sid: int, spared: set[int] | frozenset[int] = frozenset()) -> list[int]:
    """Live (non-zombie) processes whose session id is ``sid``, from /proc (those of the
    groups ``spared`` left out)."""
    return [pid for pid, group, session in live_processes()
            if session == sid and group not in spared]


def _group(proc: subprocess.Popen[Any], sig: int) -> bool:
    """Signal ``proc``'s process group (it leads one); True (wait for it to act)."""
    if proc.returncode is None:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, sig)
    return True


class _PidWait:
    """Wait for a child to end without polling sleeps (a pidfd where there is one)."""

    def __init__(self, proc: subprocess.Popen[Any]) -> None:
        self.proc = proc
        self.fd: int | None = None
        with contextlib.suppress(AttributeError, OSError):
            self.fd = os.pidfd_open(proc.pid)

    def __enter__(self) -> _PidWait:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            os.close(self.fd)

    def wait(self, seconds: float) -> bool:
        if self.fd is not None:
            poller = select.poll()
            poller.register(self.fd, select.POLLIN)
            poller.poll(max(0.0, seconds) * 1000)
        else:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(seconds)
        return self.proc.poll() is not None


# -- the keeper ---------------------------------------------------------------------------


class Keeper:
    """The host side of the keeper process: a pipe of ``+SID`` / ``-SID`` lines.

    Started on the first :meth:`watch`; :meth:`release` ends it once nothing is watched
    (the Executor calls it from ``close()``). Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._owner = 0
        self._watched: set[int] = set()
        self._watchers: dict[int, int] = {}  # how many hold each watched session
        self._marks: set[str] = set()
        self._orphaned: subprocess.Popen[bytes] | None = None
        # Set by own/children.py: whether this fork child is own-interpreter code's.
        self.owns_fork: Callable[[], bool] | None = None
        # A fork child of the host (own-interpreter code's os.fork, multiprocessing)
        # must not hold the pipe: the keeper would see no end of file when the host
        # dies while that child lives.
        os.register_at_fork(after_in_child=self._let_go_in_child)

    def _let_go_in_child(self) -> None:
        proc = self._proc
        if proc is None or proc.stdin is None:
            return
        if self._marks and self.owns_fork is not None:
            # A fork child of own-interpreter code tells the keeper itself (by pid and
            # start time), before it lets go: so it ends if the host dies.
            with contextlib.suppress(Exception):
                if self.owns_fork():
                    with open("/proc/self/stat", "rb") as f:
                        start = f.read().rsplit(b")", 1)[1].split()[19]
                    os.write(proc.stdin.fileno(), b"*%d %s\n" % (os.getpid(), start))
        self._orphaned = proc  # kept: its file object must never close the number again
        self._proc = None
        with contextlib.suppress(OSError):
            null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
            os.dup2(null, proc.stdin.fileno(), inheritable=False)
            os.close(null)

    def mark(self, prefix: str) -> None:
        """Processes carrying ``COORDEX_OWNED=prefix...`` end if the host dies."""
        with self._lock:
            self._marks.add(prefix)
            self._send(b"=%s\n" % prefix.encode())

    def unmark(self, prefix: str) -> None:
        with self._lock:
            if prefix in self._marks:
                self._marks.discard(prefix)
                self._send(b"~%s\n" % prefix.encode(), start=False)

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.returncode is None else None

    def watch(self, sid: int) -> None:
        """Watch session ``sid``; a session watched by several (a shell and its forks)
        is forgotten when the last of them forgets it."""
        with self._lock:
            self._watchers[sid] = self._watchers.get(sid, 0) + 1
            if self._watchers[sid] > 1:
                return
            self._watched.add(sid)
            self._send(b"+%d\n" % sid)

    def watching(self, sid: int, more_than: int = 0) -> bool:
        with self._lock:
            return self._watchers.get(sid, 0) > more_than

    def forget(self, sid: int) -> None:
        with self._lock:
            if sid in self._watched:
                self._watchers[sid] -= 1
                if self._watchers[sid] > 0:
                    return
                del self._watchers[sid]
                self._watched.discard(sid)
                self._send(b"-%d\n" % sid, start=False)

    def release(self) -> None:
        """End the keeper if no session is watched (it starts again when needed)."""
        with self._lock:
            proc = self._proc
            if proc is None or self._watched or self._marks or self._owner != os.getpid():
                return
            self._proc = None
        # Closing its stdin with nothing listed: it exits at once, killing nothing.
        with contextlib.suppress(OSError):
            assert proc.stdin is not None
            copier.release(proc.stdin.fileno())
            proc.stdin.close()
        try:
            proc.wait(STEP_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def _send(self, line: bytes, start: bool = True) -> None:
        if self._owner != os.getpid():  # a fork child of the host: not its keeper
            self._proc = None
        if self._proc is None or self._proc.poll() is not None:
            if not start:
                return
            self._start()
        proc = self._proc
        if proc is None or proc.stdin is None:
            return
        try:
            os.write(proc.stdin.fileno(), line)
        except OSError:
            logger.warning("the process keeper (pid %d) is gone; processes started now "
                           "will not be ended if this host dies without closing", proc.pid)
            self._proc = None

    def _start(self) -> None:
        self._owner = os.getpid()
        try:
            # Its own session: a signal to the host's process group (^C in a terminal)
            # never reaches it. It must outlive the host, so it is not in a group we kill.
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(KEEPER_SCRIPT)], stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True, bufsize=0, env=without_owned_mark(None))
        except OSError as exc:
            logger.warning("could not start the process keeper (%s); processes will not "
                           "be ended if this host dies without closing", exc)
            self._proc = None
            return
        # Everything watched so far (a keeper that died is replaced with the full list).
        assert self._proc.stdin is not None
        # Held: a read-only copy forked later must not inherit it (with it a copy could
        # make the keeper kill any process of this user, or forget a session's).
        copier.hold(self._proc.stdin.fileno())
        with contextlib.suppress(OSError):
            os.write(self._proc.stdin.fileno(),
                     b"".join(b"+%d\n" % sid for sid in sorted(self._watched))
                     + b"".join(b"=%s\n" % m.encode() for m in sorted(self._marks)))


_KEEPER = Keeper()


def keeper() -> Keeper:
    """This host's keeper."""
    return _KEEPER


__all__ = [
    "DEFAULT_STEPS",
    "OWNED_ENV",
    "Keeper",
    "Steps",
    "StopStep",
    "keeper",
    "session_members",
    "spawn",
    "stop",
    "sweep",
    "sweep_session",
    "without_owned_mark",
]
