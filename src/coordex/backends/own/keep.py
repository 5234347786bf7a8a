"""Snapshots of own-interpreter sessions (SPEC 12; :class:`~..base.Kept`).

A namespace of this process is written by a fork of this process with
:mod:`~coordex.worker._coordex_snapshot`, so the namespace keeps answering while its copy
pickles; restoring loads the snapshot into the fresh namespace. Checkpoints (SPEC 15)
are the same snapshot written into the checkpoint's folder.
"""

from __future__ import annotations

import ctypes
import os
import signal
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ...worker import _coordex_snapshot as snap
from .._kept import ChildWriter, pickler_path
from ..base import Written

if TYPE_CHECKING:
    from .place import OwnSession

_PR_SET_PDEATHSIG = 1


def start_snapshot(session: OwnSession, folder: str, *, attempt: int, through: int,
                   max_bytes: int, identity: Mapping[str, Any], close: tuple[int, ...] = ()
                   ) -> ChildWriter:
    """Fork this process; the child writes the snapshot and exits. ``close``:
    descriptors the child lets go of first (the folders' locks: a lock is this
    process's, never a child's that may outlive it by a moment)."""
    state = session._require()
    namespace = state.namespace
    names = snap.user_names(namespace, skip=state.injected)
    meta_identity = dict(identity, cwd=state.cwd)  # its own working folder
    path = pickler_path()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads: see below
        pid = os.fork()
    if pid == 0:
        # Only this thread exists in the child; it touches nothing but the namespace's
        # objects and its own files, and it ends with os._exit (no atexit, no flushing
        # of the parent's buffers). It is not a process of the call path (no reaper of
        # backends/_reap knows it): it dies with the thread that forked it (PDEATHSIG),
        # and the writer returned here reaps it or kills it past its time.
        status = 1
        try:
            for fd in close:
                os.close(fd)
            _die_with_parent()
            snap.idle()
            snap.write(namespace, folder, names=names, pickler_path=path, attempt=attempt,
                       through=through, max_bytes=max_bytes, identity=meta_identity)
            status = 0
        finally:
            os._exit(status)
    return ChildWriter(pid)


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def restore_snapshot(session: OwnSession, folder: str, replay: list[str]) -> Written:
    """Load the snapshot into the session's namespace, then run ``replay``."""
    state = session._require()
    cwd = (snap.read_meta(folder) or {}).get("cwd")
    if isinstance(cwd, str) and os.path.isdir(cwd):
        state.cwd = cwd  # entered when its calls run
    namespace = state.namespace
    report: Written = snap.read(namespace, folder, pickler_path=pickler_path(), replay=replay,
                                run=snap.run_quietly(namespace))
    return report


def empty(session: OwnSession) -> None:
    """Drop every name the session's calls bound (a checkpoint is restored over it)."""
    state = session._require()
    for name in snap.user_names(state.namespace, skip=state.injected):
        state.namespace.pop(name, None)
