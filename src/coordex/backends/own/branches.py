"""Forks and checkpoints of own-interpreter sessions (SPEC section 15).

A namespace of this process cannot be forked as a process of its own, so a fork copies
it by value: every user name that can be pickled (functions and classes it defined
included) is carried into a new namespace, modules are imported again, and what cannot be
carried is named in ``left_out``. A checkpoint is written by a fork of this process (the
snapshot writer of SPEC 12), so the session keeps answering while it is written.
"""

from __future__ import annotations

import contextlib
import os
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
    from .place import OwnSession

# A fork by value carries at most this much (it is held in memory twice meanwhile).
FORK_MAX_BYTES = 1 << 40


def fork(session: OwnSession, timeout: float) -> Forked:
    from ...persist.kinds import pickler_path, restore_own

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
        report = restore_own(new, Path(folder), [])
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
    from ...persist.kinds import fork_own_snapshot

    started = time.monotonic()
    pid = fork_own_snapshot(session, Path(folder), attempt=1, through=0, max_bytes=max_bytes,
                            identity={})

    def finish(timeout: float) -> Written:
        deadline = time.monotonic() + timeout
        while True:
            done, _status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                with contextlib.suppress(OSError):
                    os.kill(pid, 9)
                os.waitpid(pid, 0)
                return {"error": f"the checkpoint was not written within {timeout:g} s"}
            time.sleep(0.005)
        return written(folder, started)

    return finish


def restore_checkpoint(session: OwnSession, folder: str, timeout: float) -> Written:
    from ...persist.kinds import restore_own

    state = session._require()
    started = time.monotonic()
    if not (snap.read_meta(folder) or {}).get("file"):
        return {"error": "the checkpoint holds no state"}
    for name in snap.user_names(state.namespace, skip=state.injected):
        state.namespace.pop(name, None)
    report: dict[str, Any] = restore_own(session, Path(folder), [])
    if "error" in report:
        return report
    return {"names": report.get("names") or [], "left_out": report.get("left_out") or [],
            "ms": round((time.monotonic() - started) * 1000.0, 1)}


def written(folder: str, started: float) -> Written:
    """What a snapshot writer left in ``folder``: its size and what it left out."""
    meta = snap.read_meta(folder) or {}
    if not meta.get("file"):
        return {"error": meta.get("problem_why") or "the writer ended without writing"}
    return {"bytes": int(meta.get("bytes") or 0), "left_out": list(meta.get("left_out") or []),
            "ms": round((time.monotonic() - started) * 1000.0, 1)}
