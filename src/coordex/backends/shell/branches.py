"""Forks and checkpoints of bash sessions (SPEC section 15).

A shell's state is small text: its working folder, variables (exported or not),
functions, aliases, ``shopt``/``set`` options and ``umask``, dumped by a subshell (the
session's own state is untouched) as SPEC 12's snapshot is. A checkpoint keeps that
dump; a restore starts a fresh shell and sources it, so nothing set after the checkpoint
stays. A fork is a process fork of the session's shell (``Shell.fork``: a subshell of it
serving the same record wire on pipes of its own), which carries everything the shell
holds, open fds and non-exported variables included; where that fails, the dump is
sourced in a new shell of the same environment.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...core.errors import CoordexError
from ...worker import _coordex_snapshot as snap
from ..base import Forked, Written

if TYPE_CHECKING:
    from .session import ShellSession


def start_checkpoint(session: ShellSession, folder: str, max_bytes: int
                     ) -> Callable[[float], Written]:
    from ...persist.kinds import snapshot_bash

    started = time.monotonic()
    meta = snapshot_bash(session, Path(folder), attempt=1, through=0, max_bytes=max_bytes,
                         identity={})
    done: Written = ({"error": meta.get("problem_why") or "the shell's state was not written"}
                     if not meta.get("file") else
                     {"bytes": int(meta.get("bytes") or 0), "left_out": [],
                      "ms": round((time.monotonic() - started) * 1000.0, 1)})
    return lambda timeout: done


def restore_checkpoint(session: ShellSession, folder: str, timeout: float) -> Written:
    from ...persist.kinds import restore_bash

    started = time.monotonic()
    if not (snap.read_meta(folder) or {}).get("file"):
        return {"error": "the checkpoint holds no state"}
    fresh = session.start_over()
    if fresh is not None:
        return {"error": fresh}
    report: dict[str, Any] = restore_bash(session, Path(folder))
    if "error" in report:
        return report
    return {"names": [], "left_out": [], "ms": round((time.monotonic() - started) * 1000.0, 1)}


def fork(session: ShellSession, timeout: float) -> Forked:
    """A process fork of the session's shell (copy-on-write: everything it holds, open
    fds included); by value when it cannot fork (its shell busy, FIFOs refused)."""
    try:
        return Forked(session.fork_shell(timeout), "process", ())
    except (OSError, RuntimeError):
        return fork_by_value(session, timeout)


def fork_by_value(session: ShellSession, timeout: float) -> Forked:
    folder = tempfile.mkdtemp(prefix="coordex-fork-")
    try:
        done = start_checkpoint(session, folder, 1 << 40)(timeout)
        if "error" in done:
            raise CoordexError("execution", f"The shell could not be copied: {done['error']}.",
                               "Fork again once the session answers (inspect_session).")
        new = session.sibling()
        report = restore_checkpoint(new, folder, timeout)
        if "error" in report:
            new.close()
            raise CoordexError("execution", f"The copy could not be loaded: {report['error']}.",
                               "Fork again.")
        return Forked(new, "values", ())
    finally:
        shutil.rmtree(folder, ignore_errors=True)
