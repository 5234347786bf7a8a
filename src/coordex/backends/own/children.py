"""Processes that own-interpreter code starts, found again so they can be ended (SPEC 6).

How it works:

- The own interpreter is the agent's process, so what its code starts are the agent's
  children, and nothing in the kernel tells them from the agent's own. Two marks do:
  while a call runs, ``os.environ`` holds ``COORDEX_OWNED=<session's mark>``, so every
  program the code starts (``subprocess``, ``os.system``, and what those start, which
  inherit the environment) carries it in ``/proc/PID/environ`` for life; a fork child
  that does not exec (``os.fork``, multiprocessing's ``fork``) shows only the agent's
  first environment there, so at the fork it writes its pid and mark to a pipe read
  here (``os.register_at_fork``).
- :meth:`Owned.end` walks ``/proc`` once: every process of this user with the mark (or
  registered by fork), and every descendant of one, gets SIGTERM, then SIGKILL after
  :data:`TERM_SECONDS`; those that are this process's children are reaped. Closing a
  session ends its own processes; closing the interpreter ends all of them.
- The cost: two environment writes per call (~2 us) and, at close only, one pass over
  ``/proc`` reading each process's stat and environment (about 10 ms for 500
  processes). No thread, no subreaper: the agent's process keeps its usual reaping.
- If this process dies without closing (SIGKILL), the keeper (``_reap``) ends every
  process that carries a mark of this interpreter, and every fork child of the code,
  which told it its pid and start time at the fork (never a pid given away since).
- What escapes: a process started with an explicit ``env`` that drops the mark and then
  leaves its parent (``setsid`` and a double fork) - it carries no mark and has no
  marked ancestor left. Processes other threads of the agent start while an
  own-interpreter call runs carry the call's mark.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from ...worker import _coordex_copy as copier
from .. import _reap
from .._reap import OWNED_ENV

# How long SIGTERM is given before SIGKILL.
TERM_SECONDS = 1.0

_ENV_KEY = OWNED_ENV.encode()


class _ForkLog:
    """The pipe fork children write ``MARK PID\\n`` to (one per process, made lazily)."""

    def __init__(self) -> None:
        self.read_fd = -1
        self.write_fd = -1
        self.lock = threading.Lock()
        self.pending = b""
        self.forked: dict[int, tuple[str, bytes]] = {}  # pid -> (mark, its start time)

    def open(self) -> None:
        with self.lock:
            if self.read_fd >= 0:
                return
            self.read_fd, self.write_fd = os.pipe()
            # Never block a fork child (a full pipe drops the entry), never block a drain.
            os.set_blocking(self.write_fd, False)
            os.set_blocking(self.read_fd, False)
            copier.hold(self.read_fd, self.write_fd)

    def drain(self) -> None:
        with self.lock:
            if self.read_fd < 0:
                return
            while True:
                try:
                    data = os.read(self.read_fd, 65536)
                except (BlockingIOError, InterruptedError):
                    break
                if not data:
                    break
                self.pending += data
            *lines, self.pending = self.pending.split(b"\n")
            for line in lines:
                mark, _, pid = line.decode("ascii", "replace").partition(" ")
                if pid.isdigit():
                    self.forked[int(pid)] = (mark, _start_time(int(pid)))
            if len(self.forked) > 4096:  # drop the dead
                self.forked = {p: v for p, v in self.forked.items()
                               if _start_time(p) == v[1]}


_LOG = _ForkLog()
# Which call a forking thread runs for: set by the interpreter (no import cycle).
current_mark: Callable[[], str | None] = lambda: None  # noqa: E731
class _Local(threading.local):
    copying = False  # a default: an attribute never set costs an AttributeError


_local = _Local()


def _after_fork_in_child() -> None:
    if getattr(_local, "copying", False) or _LOG.write_fd < 0:
        return
    try:
        mark = current_mark()
    except Exception:
        return
    if mark:
        with contextlib.suppress(OSError):
            os.write(_LOG.write_fd, f"{mark} {os.getpid()}\n".encode())


def _owns_fork() -> bool:
    """In a fork child: whether own-interpreter code made it (not a read-only copy)."""
    return not getattr(_local, "copying", False) and bool(current_mark())


os.register_at_fork(after_in_child=_after_fork_in_child)
_reap.keeper().owns_fork = _owns_fork


@contextlib.contextmanager
def copying() -> Iterator[None]:
    """Around the fork of a read-only copy: it is the copy's, not the code's."""
    _local.copying = True
    try:
        yield
    finally:
        _local.copying = False


class Owned:
    """The marks of one interpreter's sessions, and ending what carries them."""

    def __init__(self) -> None:
        self.prefix = f"{os.getpid()}.{secrets.token_hex(6)}:"
        self._serial = 0
        self._lock = threading.Lock()
        self._armed = False
        _LOG.open()

    def arm(self) -> None:
        """Before the first call: the keeper ends the marked processes if this process
        dies without closing (one keeper process per host, started on first need)."""
        if not self._armed:
            self._armed = True
            _reap.keeper().mark(self.prefix)

    def disarm(self) -> None:
        if self._armed:
            self._armed = False
            _reap.keeper().unmark(self.prefix)

    def new_mark(self) -> str:
        with self._lock:
            self._serial += 1
            return f"{self.prefix}{self._serial}"

    def end(self, mark: str | None = None) -> list[int]:
        """End every process carrying ``mark`` (None: any mark of this interpreter) and
        its descendants; returns their pids. Never raises."""
        try:
            return self._end(mark)
        except Exception:  # a close never fails on /proc
            return []

    def _end(self, mark: str | None) -> list[int]:
        _LOG.drain()
        wanted = (mark,) if mark is not None else None

        def matches(value: str) -> bool:
            return value == wanted[0] if wanted is not None else value.startswith(self.prefix)

        parents = _parents()
        me = os.getpid()
        found = {pid for pid in parents if pid != me and _carries(pid, matches)}
        with _LOG.lock:
            for pid, (value, start) in list(_LOG.forked.items()):
                if matches(value) and pid in parents and _start_time(pid) == start:
                    found.add(pid)
                    del _LOG.forked[pid]
        if not found:
            return []
        frontier = set(found)
        while frontier:  # and each descendant, marked or not
            frontier = {p for p, parent in parents.items()
                        if parent in frontier and p not in found and p != me}
            found |= frontier
        ended = sorted(found)
        _signal_all(ended, signal.SIGTERM)
        left = _wait_gone(ended, TERM_SECONDS)
        if left:
            _signal_all(left, signal.SIGKILL)
            _wait_gone(left, TERM_SECONDS)
        for pid in ended:  # ours to reap (a Popen object that asks later gets ECHILD)
            if parents.get(pid) == me:
                with contextlib.suppress(OSError):
                    os.waitpid(pid, os.WNOHANG)
        return ended


# -- /proc ---------------------------------------------------------------------------


def _parents() -> dict[int, int]:
    """pid -> parent pid of every live (non-zombie) process."""
    found: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields and fields[0] not in (b"Z", b"X"):
            found[int(entry)] = int(fields[1])
    return found


def _carries(pid: int, matches: Callable[[str], bool]) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read()
    except OSError:  # another user's, or gone
        return False
    at = data.find(_ENV_KEY + b"=")
    while at >= 0:
        if at == 0 or data[at - 1] == 0:
            end = data.find(b"\0", at)
            value = data[at + len(_ENV_KEY) + 1:end if end >= 0 else None]
            return matches(value.decode("ascii", "replace"))
        at = data.find(_ENV_KEY + b"=", at + 1)
    return False


def _start_time(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19]
    except (OSError, IndexError):
        return b""


def _signal_all(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def _wait_gone(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    left = [p for p in pids if _alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.01)
        left = [p for p in left if _alive(p)]
    return left


__all__ = ["OWNED_ENV", "Owned", "copying"]
