"""Each call's own output pipes, and where output that comes after its call goes.

How it works
------------
A shell or a worker is not handed its output pipes once for its life: the host keeps the
read end of each pipe, holds no write end, and every call's code opens a writer of its
own on it by path, ``/proc/HOST/fd/N`` (:func:`writer_path`; opening a pipe's ``/proc``
link gives a new writer on that same pipe). When the call ends, its code's writers are
closed again: bash undoes the ``eval``'s redirections, a worker points fds 1 and 2 at
``/dev/null`` before it sends ``done``. So when the call's end arrives, a pipe that
still has a writer is held by something the code started that outlived the call (a
background job, a ``nohup``, a daemon, a fork child): ``poll`` does not report
``POLLHUP`` for it. That pipe is *retired* (:func:`renew`): a fresh pipe takes its
descriptor number, so the next call writes somewhere no earlier process can, and the
old one goes to one daemon thread that reads and drops whatever arrives there (SPEC 6:
it is no call's output; :func:`dropped` counts the bytes) - so the writer never blocks
on a full pipe - and closes it once its last writer has gone. The thread starts with
the first retired pipe and ends when none is left. A pipe nothing outlived (most
calls) serves the next call too: the check is the ``poll`` the call's end makes anyway.

The host's read ends see ``POLLHUP`` whenever no call runs, so a caller waits on them
edge-triggered (``EPOLLET``): a hang-up is reported once, never in a loop.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
from collections.abc import Hashable

from ..worker import _coordex_copy as copier

READ_CHUNK = 65536


def writer_path(fd: int) -> str:
    """The path a process of ours opens to write to this process's pipe ``fd``."""
    return f"/proc/{os.getpid()}/fd/{fd}"


def per_call_pipes_work(fd: int) -> bool:
    """Whether a writer can be opened on pipe ``fd`` by :func:`writer_path` (``/proc``
    mounted, this process's descriptors readable by its own user)."""
    try:
        os.close(os.open(writer_path(fd), os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC))
    except OSError:
        return False
    return True


def renew(fd: int, owner: Hashable) -> None:
    """Retire the pipe read at ``fd`` (its reading goes to the drain thread, under
    ``owner``) and put a fresh, empty, non-blocking pipe's read end at ``fd``.

    The caller unregisters ``fd`` from any epoll object first (epoll follows the open
    file, not the number) and registers it again after."""
    old = os.dup(fd)  # close-on-exec
    r, w = os.pipe()
    try:
        os.dup2(r, fd, inheritable=False)
    finally:
        os.close(r)
        os.close(w)  # no writer: each call opens its own
    os.set_blocking(fd, False)
    copier.hold(fd)
    _DRAIN.retire(old, owner)


def forget(owner: Hashable) -> None:
    """Close every retired pipe of ``owner`` (its process is gone or going)."""
    _DRAIN.forget(owner)


def dropped() -> int:
    """Bytes written to retired pipes and dropped, in this process so far."""
    return _DRAIN.dropped


class _Drain:
    """The daemon thread that empties retired pipes; one per process, started on use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owners: dict[int, Hashable] = {}  # retired read end -> owner
        self._epoll: select.epoll | None = None
        self._wake: tuple[int, int] | None = None  # forget() wakes the thread to end it
        self._thread: threading.Thread | None = None
        self.dropped = 0

    def retire(self, fd: int, owner: Hashable) -> None:
        os.set_blocking(fd, False)
        copier.hold(fd)
        with self._lock:
            if self._epoll is None:
                self._epoll = select.epoll()
                self._wake = os.pipe()
                self._epoll.register(self._wake[0], select.EPOLLIN)
                copier.hold(self._epoll.fileno(), *self._wake)
            self._owners[fd] = owner
            self._epoll.register(fd, select.EPOLLIN)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run,
                                                args=(self._epoll, self._wake),
                                                name="coordex-late-output", daemon=True)
                self._thread.start()

    def forget(self, owner: Hashable) -> None:
        with self._lock:
            gone = [fd for fd, who in self._owners.items() if who == owner]
            for fd in gone:
                self._close(fd)
            if gone and not self._owners and self._wake is not None:
                os.write(self._wake[1], b"x")

    def _close(self, fd: int) -> None:  # under _lock
        del self._owners[fd]
        if self._epoll is not None:
            with contextlib.suppress(OSError, ValueError):
                self._epoll.unregister(fd)
        copier.release(fd)
        os.close(fd)

    def _run(self, epoll: select.epoll, wake: tuple[int, int]) -> None:
        while True:
            events = epoll.poll()
            with self._lock:
                for fd, _mask in events:
                    if fd == wake[0]:  # read, or the pipe stays readable and wakes forever
                        with contextlib.suppress(OSError):
                            os.read(fd, READ_CHUNK)
                        continue
                    if fd not in self._owners:
                        continue  # closed by forget() after the event
                    while True:
                        try:
                            data = os.read(fd, READ_CHUNK)
                        except BlockingIOError:
                            break
                        except OSError:
                            data = b""
                        if not data:  # its last writer has gone
                            self._close(fd)
                            break
                        self.dropped += len(data)
                        if len(data) < READ_CHUNK:
                            break
                if not self._owners:
                    self._thread = self._epoll = self._wake = None
                    copier.release(epoll.fileno(), *wake)
                    epoll.close()
                    for end in wake:
                        os.close(end)
                    return


_DRAIN = _Drain()


__all__ = ["dropped", "forget", "per_call_pipes_work", "renew", "writer_path"]
