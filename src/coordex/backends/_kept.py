"""What the places' :class:`~.base.Kept` and :class:`~.base.Checkpointable` share.

A snapshot is written by a copy of the session (a fork of its process) with
:mod:`~coordex.worker._coordex_snapshot`; the copy is watched through a
:class:`~.base.Writer`. A checkpoint (SPEC 15) is a snapshot written into the
checkpoint's folder, so every place writes its state one way, whatever asks for it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..worker import _coordex_snapshot as snap
from .base import Kept, Written


def pickler_path() -> str:
    """The file ``cloudpickle/cloudpickle.py`` of coordex's own install (a worker names
    the pickler by path, never by its own ``sys.path``)."""
    import importlib.util

    spec = importlib.util.find_spec("cloudpickle")
    if spec is None or spec.origin is None:
        raise RuntimeError("cloudpickle is not installed; it is a dependency of coordex")
    return str(Path(spec.origin).parent / "cloudpickle.py")


@dataclass(frozen=True)
class ChildWriter:
    """A copy that is this process's own child (reaped here)."""

    pid: int

    def running(self) -> bool:
        try:
            return os.waitpid(self.pid, os.WNOHANG)[0] == 0
        except ChildProcessError:
            return False

    def wait(self) -> None:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(self.pid, 0)

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)
        self.wait()


@dataclass(frozen=True)
class ForeignWriter:
    """A copy that is another process's child (a worker's fork: the worker reaps it,
    and one that outlives its time ends with it)."""

    pid: int

    def running(self) -> bool:
        return snap.running(self.pid)

    def wait(self) -> None:
        pass

    def kill(self) -> None:
        pass


def written(folder: str, started: float) -> Written:
    """What a snapshot's copy left in ``folder``: its size and what it left out."""
    meta = snap.read_meta(folder) or {}
    if not meta.get("file"):
        return {"error": meta.get("problem_why") or "the writer ended without writing",
                "problem": meta.get("problem")}
    return {"bytes": int(meta.get("bytes") or 0), "left_out": list(meta.get("left_out") or []),
            "ms": round((time.monotonic() - started) * 1000.0, 1)}


def start_checkpoint(session: Kept, folder: str, max_bytes: int,
                     silent: str = "the session did not answer") -> Callable[[float], Written]:
    """A checkpoint: the session's snapshot written into ``folder``; ``finish(timeout)``
    waits for its copy (``silent``: what is said when the session did not answer)."""
    started = time.monotonic()
    writer = session.start_snapshot(folder, attempt=1, through=0, max_bytes=max_bytes,
                                    identity={})

    def finish(timeout: float) -> Written:
        if writer is None:
            return {"error": silent, "problem": "no_answer"}
        deadline = time.monotonic() + timeout
        while writer.running():
            if (snap.read_meta(folder) or {}).get("attempt"):
                writer.wait()  # it has written; reaped as it exits
                break
            if time.monotonic() > deadline:
                writer.kill()
                return {"error": f"the checkpoint was not written within {timeout:g} s",
                        "problem": "timeout"}
            time.sleep(0.005)
        return written(folder, started)

    return finish


def restore_checkpoint(session: Kept, folder: str, timeout: float,
                       start_over: Callable[[], str | None]) -> Written:
    """Put a checkpoint back: ``start_over`` empties the session (returns why it could
    not), then its snapshot is loaded. Files on disk are not touched."""
    started = time.monotonic()
    if not (snap.read_meta(folder) or {}).get("file"):
        return {"error": "the checkpoint holds no state"}
    problem = start_over()
    if problem is not None:
        return {"error": problem}
    report = session.restore_snapshot(folder, [], timeout)
    if "error" in report:
        return report
    return {"names": report.get("names") or [], "left_out": report.get("left_out") or [],
            "ms": round((time.monotonic() - started) * 1000.0, 1)}
