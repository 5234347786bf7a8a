"""Snapshots of environment sessions (SPEC 12; :class:`~..base.Kept`).

The worker's ``snapshot`` message forks the worker and the fork writes (the worker
answers on meanwhile and reaps its fork); ``restore`` loads a snapshot in the worker
before any code runs. Both name the pickler by path, never by the worker's ``sys.path``.
Checkpoints (SPEC 15) are the same snapshot written into the checkpoint's folder.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._kept import ForeignWriter, pickler_path
from ..base import Written

if TYPE_CHECKING:
    from .workers import WorkerSession

SILENT = "the environment's worker did not answer"


def start_snapshot(session: WorkerSession, folder: str, *, attempt: int, through: int,
                   max_bytes: int, identity: Mapping[str, Any]) -> ForeignWriter | None:
    """Ask the worker to fork a writer; None when it did not answer."""
    reply = session.exchange("snapshot", "snapshot_done", 30.0, folder=folder,
                             pickler=pickler_path(), attempt=attempt, through=through,
                             max_bytes=max_bytes, identity=dict(identity))
    if reply is None:
        return None
    pid = (reply.get("report") or {}).get("pid")
    return ForeignWriter(pid) if isinstance(pid, int) else None


def restore_snapshot(session: WorkerSession, folder: str, replay: list[str],
                     timeout: float) -> Written:
    reply = session.exchange("restore", "restore_done", timeout, folder=folder,
                             pickler=pickler_path(), replay=replay)
    if reply is None:
        return {"error": SILENT}
    report: Written = reply.get("report") or {}
    return report
