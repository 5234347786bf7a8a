"""Forks and checkpoints of environment sessions (SPEC section 15).

A checkpoint is written by a fork of the session's worker (the snapshot writer of SPEC
12: the worker answers on while its copy pickles), and restored into a fresh worker
process of the same environment, so nothing bound after the checkpoint stays. A fork is
a checkpoint into a private folder restored into a new worker: the values are carried
(``copy: "values"``) and what cannot be pickled is named in ``left_out``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING

from ...core.errors import CoordexError
from .. import _kept
from ..base import Forked, Written
from . import keep

if TYPE_CHECKING:
    from .workers import WorkerSession

FORK_MAX_BYTES = 1 << 40


def start_checkpoint(session: WorkerSession, folder: str, max_bytes: int
                     ) -> Callable[[float], Written]:
    return _kept.start_checkpoint(session, folder, max_bytes, keep.SILENT)


def restore_checkpoint(session: WorkerSession, folder: str, timeout: float) -> Written:
    def start_over() -> None:
        session.start_over()

    return _kept.restore_checkpoint(session, folder, timeout, start_over)


def fork(session: WorkerSession, timeout: float) -> Forked:
    """A fork of the session's worker process (copy-on-write); by value where a loaded
    runtime breaks under ``fork()`` (polars, OpenMP pools)."""
    forked = fork_process(session, timeout)
    if forked is not None:
        return forked
    return fork_by_value(session, timeout)


def fork_process(session: WorkerSession, timeout: float) -> Forked | None:
    folder = tempfile.mkdtemp(prefix="coordex-fork-")
    fds: list[int] = []
    try:
        for name in ("in", "out", "stdout", "stderr"):
            os.mkfifo(os.path.join(folder, name), 0o600)
        # Opened without blocking before the worker forks, so its child's opens return:
        # ours are the read ends (and a read-write end of ``in`` until the child reads).
        fds = [os.open(os.path.join(folder, "in"), os.O_RDWR | os.O_CLOEXEC)]
        fds += [os.open(os.path.join(folder, name), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
                for name in ("out", "stdout", "stderr")]
        for fd in fds[1:2]:
            os.set_blocking(fd, True)
        to_worker, from_worker, out_r, err_r = fds
        proc = session.fork_process(folder, (to_worker, from_worker, out_r, err_r), timeout)
        if proc is None:
            raise CoordexError("execution", "The session's worker did not answer the fork.",
                               "Run a call in the session (it may be busy or gone), then "
                               "fork again.")
        if isinstance(proc, list):  # a runtime that breaks under fork(): by value
            _close(fds)
            return None
        fds = []  # the new worker's now
        # It reads ``in`` since its hello: our end becomes write-only, so a worker that
        # dies is a broken pipe to us, not a buffer that fills.
        writer = os.open(os.path.join(folder, "in"), os.O_WRONLY | os.O_CLOEXEC)
        os.dup2(writer, to_worker, inheritable=False)
        os.close(writer)
        return Forked(session.sibling(proc), "process", ())
    finally:
        _close(fds)
        shutil.rmtree(folder, ignore_errors=True)


def _close(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    fds.clear()


def fork_by_value(session: WorkerSession, timeout: float) -> Forked:
    folder = tempfile.mkdtemp(prefix="coordex-fork-")
    try:
        done = start_checkpoint(session, folder, FORK_MAX_BYTES)(timeout)
        if "error" in done:
            raise CoordexError("execution", f"The session could not be copied: {done['error']}.",
                               "Delete the names that cannot be copied (open files, "
                               "connections, threads) or rebuild them after the fork.")
        new = session.sibling()
        report = restore_checkpoint(new, folder, timeout)
        if "error" in report:
            new.close()
            raise CoordexError("execution", f"The copy could not be loaded: {report['error']}.",
                               "Fork again; if it fails again, rebuild the state in a new "
                               "session from its calls.")
        return Forked(new, "values", tuple(report.get("left_out") or ()))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
