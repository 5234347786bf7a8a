"""Where a kept session (SPEC 12, ``persist=True``) meets the Executor's calls.

The policy (when to snapshot, where, what to replay) is :mod:`coordex.persist`'s; this
module holds the few points where a call touches it: a named session that is kept
takes its old id (:func:`claim`), a read-only call or an inspection of a kept session
not yet restored opens and restores it first (:func:`bring_back`), and
``rebuild_session`` starts from a snapshot (:func:`rebuild`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from .backends.base import RunRequest
from .core import coordinates as coords
from .core.coordinates import Coordinate
from .core.registry import PLAN_KEY

if TYPE_CHECKING:
    from .executor import Executor
    from .persist import Persistence


def open_persistence(executor: Executor, persist: bool, interval: float,
                     max_bytes: int) -> Persistence | None:
    """The Executor's persistence (None without ``persist``); ValueError for a bad
    setting, as for any constructor argument."""
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or interval < 0:
        raise ValueError(f"snapshot_interval must be a number of seconds >= 0, got {interval!r}")
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise ValueError(f"persist_max_bytes must be an integer >= 1, got {max_bytes!r}")
    if not persist:
        return None
    from .persist import Persistence

    return Persistence(executor.root, executor._table, executor._call_log,
                       interval=float(interval), max_bytes=max_bytes)


def claim(executor: Executor, coordinate: Coordinate) -> None:
    """A kept session named in ``coordinate`` and not yet restored gets its old id;
    a new named session never takes the id of one still kept."""
    persist = executor._persist
    assert persist is not None
    if coordinate.session_name is None:
        return
    kept = persist.find_waiting(coordinate.language, coordinate.venv_id, None,
                                coordinate.session_name)
    taken = persist.kept_ids(coordinate.language, coordinate.venv_id)
    if kept is None and not taken:
        return
    executor._table.reserve_kept(coordinate, kept.session_id if kept is not None else None,
                                 taken)


def bring_back(executor: Executor, coordinate: Coordinate,
               timeout: float) -> dict[str, Any] | None:
    """A kept session not yet restored, named by a read-only call or an inspection:
    opened and restored first, as its first stateful call would (SPEC 12). Returns
    what the restore says."""
    from .calling import run_stateful

    persist = executor._persist
    if persist is None or persist.find_waiting(
            coordinate.language, coordinate.venv_id, coordinate.session_id,
            coordinate.session_name) is None:
        return None
    opening = dataclasses.replace(coordinate, state_mode="stateful")
    return run_stateful(executor, opening, RunRequest(code="", timeout=timeout)).restored


def rebuild(executor: Executor, language: Any, session_id: Any, session_name: Any,
            venv_id: Any) -> dict[str, Any] | None:
    """``rebuild_session`` from a kept session's snapshot (SPEC 12): a kept session
    not yet restored is restored; an open one whose state was lost after its last
    snapshot gets that snapshot back plus the calls logged before the loss. None:
    the log alone rebuilds it."""
    persist, table, log = executor._persist, executor._table, executor._call_log
    assert persist is not None
    coordinate = coords.check_coordinate(language, "stateful", session_id,
                                         session_name, venv_id)
    waiting = persist.find_waiting(coordinate.language, coordinate.venv_id,
                                   coordinate.session_id, coordinate.session_name)
    plan = None
    record = waiting.record() if waiting is not None else None
    if waiting is not None and persist.held_elsewhere(waiting):
        from .persist.manager import held_elsewhere

        raise held_elsewhere(waiting.record(), "rebuild")
    if waiting is None:
        found = table.find(coordinate)
        if found is None or found[0] == PLAN_KEY or log is None:
            return None
        record = table.record(found[0])
        plan = persist.plan_rebuild(record)
        if plan is None:
            return None
        _, session = table.remove(coordinate)
        if session is not None:
            session.close()
        at = log.event("rebuild", record, {"snapshot": True, "until": plan["until"]})
        persist.rebuilding(record, at, plan["until"])
    restored = bring_back(executor, coordinate, executor.timeout) or {}
    found = table.find(coordinate)
    return {"replayed": int(restored.get("replayed") or 0),
            "failed_at": restored.get("failed_at"),
            "session": table.record(found[0]) if found else record,
            "calls": plan["calls"] if plan else [],
            "skipped_failed": plan["failed"] if plan else [], "restored": restored}
