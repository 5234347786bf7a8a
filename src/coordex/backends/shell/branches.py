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
from collections.abc import Callable
from typing import TYPE_CHECKING

from ...core.errors import CoordexError
from .. import _kept
from ..base import Forked, Written

if TYPE_CHECKING:
    from .session import ShellSession


def start_checkpoint(session: ShellSession, folder: str, max_bytes: int
                     ) -> Callable[[float], Written]:
    return _kept.start_checkpoint(session, folder, max_bytes)


def restore_checkpoint(session: ShellSession, folder: str, timeout: float) -> Written:
    """A fresh shell, then the dump sourced in it: nothing set after the checkpoint stays."""
    return _kept.restore_checkpoint(session, folder, timeout, session.start_over)


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
