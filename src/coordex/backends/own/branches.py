"""Forks and checkpoints of own-interpreter sessions (SPEC section 15).

A namespace of this process cannot be forked as a process of its own, so a fork copies
it by value: every user name that can be pickled (functions and classes it defined
included) is carried into a new namespace, modules are imported again, and what cannot be
carried is named in ``left_out``. A checkpoint is written by a fork of this process (the
snapshot writer of SPEC 12), so the session keeps answering while it is written.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING

from ...core.errors import CoordexError
from ...worker import _coordex_snapshot as snap
from .. import _kept
from .._kept import pickler_path
from ..base import Forked, Written
from . import keep

if TYPE_CHECKING:
    from .place import OwnSession

# A fork by value carries at most this much (it is held in memory twice meanwhile).
FORK_MAX_BYTES = 1 << 40


def fork(session: OwnSession, timeout: float) -> Forked:
    source = session._require()
    folder = tempfile.mkdtemp(prefix="coordex-fork-")
    try:
        names = snap.user_names(source.namespace, skip=source.injected)
        meta = snap.write(source.namespace, folder, names=names, pickler_path=pickler_path(),
                          attempt=1, through=0, max_bytes=FORK_MAX_BYTES,
                          identity={"cwd": source.cwd})
        if not meta.get("file"):
            raise CoordexError("execution", "The session could not be copied: "
                               f"{meta.get('problem_why') or 'its values could not be written'}.",
                               "Delete the names that cannot be copied (open files, "
                               "connections, threads) or rebuild them after the fork.")
        new = session._place.open_session()
        state = new._require()
        state.environ = dict(source.environ)
        report = keep.restore_snapshot(new, folder, [])
        if "error" in report:
            new.close()
            raise CoordexError("execution", f"The copy could not be loaded: {report['error']}.",
                               "Fork again; if it fails again, rebuild the state in a new "
                               "session from its calls.")
        return Forked(new, "values", tuple(report.get("left_out") or ()))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def start_checkpoint(session: OwnSession, folder: str, max_bytes: int
                     ) -> Callable[[float], Written]:
    return _kept.start_checkpoint(session, folder, max_bytes)


def restore_checkpoint(session: OwnSession, folder: str, timeout: float) -> Written:
    def start_over() -> None:
        keep.empty(session)

    return _kept.restore_checkpoint(session, folder, timeout, start_over)
