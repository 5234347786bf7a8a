"""Where a call meets persistence (SPEC 12): the few named points the Executor calls.

The Executor holds one :class:`Keeping` whether sessions are kept or not (``persist``
off: every point does nothing); its call path (:mod:`coordex.calling`) calls it at these
points, in a call's order, each with the facts it needs as arguments:

- :meth:`Keeping.claim` before a stateful call finds its session: a kept session named
  by the call gets its old id back, and a new one never takes the id of one still kept;
- :meth:`Keeping.opening` on a session's first call, before its code runs: the restore
  (what it says goes into the call's record);
- :meth:`Keeping.names_changed` once the call ran in it: whether it changed what a
  snapshot keeps;
- :meth:`Keeping.logged` once its result is in the call log: the session is kept (a
  snapshot started when one is due).

Apart from calls (the session tools, :mod:`coordex.managing`; forks and checkpoints,
:mod:`coordex.branches`): :meth:`Keeping.listed` and :meth:`Keeping.describe` (``list_sessions``,
``inspect_session``), :meth:`Keeping.waiting` (a kept session not yet brought back),
:meth:`Keeping.close_waiting` and :meth:`Keeping.forget` (``close_session``),
:meth:`Keeping.rebuild` (``rebuild_session`` from a snapshot), :meth:`Keeping.adopt` (a
fork or a restored checkpoint kept from then on), :meth:`Keeping.close`.

How a session is written and read is its place's (:class:`~coordex.backends.base.Kept`);
when, where, how many and what is replayed is :class:`~.manager.Persistence`'s.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..backends.base import Session
from ..core.coordinates import Coordinate, SessionKey
from ..core.registry import PLAN_KEY
from .manager import Persistence, held_elsewhere
from .store import Identity

if TYPE_CHECKING:
    from ..log import CallLog
    from ..log.calls import LoggedRow
    from ..sessions import SessionTable


class Keeping:
    """The Executor's persistence hooks; ``persistence`` None: nothing is kept."""

    def __init__(self, persistence: Persistence | None, table: SessionTable,
                 log: CallLog | None, max_bytes: int) -> None:
        self.persistence = persistence
        self.max_bytes = max_bytes  # a checkpoint is bounded as a snapshot is
        self._table = table
        self._log = log

    @classmethod
    def open(cls, root: Path, table: SessionTable, log: CallLog | None, *, persist: bool,
             interval: float, max_bytes: int) -> Keeping:
        """Check the Executor's persistence options (``ValueError``) and start keeping."""
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or interval < 0:
            raise ValueError(f"snapshot_interval must be a number of seconds >= 0, got {interval!r}")
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise ValueError(f"persist_max_bytes must be an integer >= 1, got {max_bytes!r}")
        persistence = Persistence(root, table, log, interval=float(interval),
                                  max_bytes=max_bytes) if persist else None
        return cls(persistence, table, log, int(max_bytes))

    @property
    def on(self) -> bool:
        return self.persistence is not None

    def close(self) -> None:
        """The Executor is closing, its sessions still open: snapshot what changed."""
        if self.persistence is not None and not self._table.closed:
            with contextlib.suppress(Exception):
                self.persistence.close()

    # -- a stateful call, in order ------------------------------------------------------

    def claim(self, coordinate: Coordinate) -> None:
        """Before a stateful call: a kept session named in ``coordinate`` and not yet
        restored gets its old id; a new named session never takes the id of one kept."""
        if self.persistence is None or coordinate.session_name is None:
            return
        kept = self.persistence.find_waiting(coordinate.language, coordinate.venv_id, None,
                                             coordinate.session_name)
        taken = self.persistence.kept_ids(coordinate.language, coordinate.venv_id)
        if kept is not None or taken:
            self._table.reserve_kept(coordinate, None if kept is None else kept.session_id,
                                     taken)

    def opening(self, key: SessionKey, record: dict[str, Any], session: Session, call: int,
                timeout: float) -> dict[str, Any] | None:
        """The session's first call, before its code runs: bring back what is kept of
        it. Returns what :meth:`ran` adds to the call's outcome."""
        if self.persistence is None or call != 1:
            return None
        return self.persistence.restore(key, record, session, timeout)

    def names_changed(self, key: SessionKey, rebound: Collection[str] | None,
                      deleted: Collection[str] | None) -> bool:
        """Whether a stateful call that rebound and deleted these names changed what a
        snapshot keeps (a shell's state is more than names: always)."""
        return self.persistence is not None and (key.language == "bash" or any(
            name != "_" for name in [*(rebound or ()), *(deleted or ())]))

    def logged(self, result: dict[str, Any], row: LoggedRow, call: int, changed: bool) -> None:
        """Stateful call number ``call`` of a session (``changed``: see
        :meth:`names_changed`) is in the call log as ``row``: its session is kept."""
        if self.persistence is not None:
            self.persistence.after_call(result, row, call, changed)

    # -- sessions -----------------------------------------------------------------------

    def waiting(self, coordinate: Coordinate) -> Identity | None:
        """The kept session ``coordinate`` names, not yet brought back in this process."""
        if self.persistence is None:
            return None
        return self.persistence.find_waiting(coordinate.language, coordinate.venv_id,
                                             coordinate.session_id, coordinate.session_name)

    def find_waiting(self, language: str, venv_id: int | None, session_id: int | None,
                     session_name: str | None) -> Identity | None:
        if self.persistence is None:
            return None
        return self.persistence.find_waiting(language, venv_id, session_id, session_name)

    def kept_ids(self, language: str, venv_id: int | None) -> set[int]:
        """Ids a new session of this place must not take (kept ones not yet back)."""
        return set() if self.persistence is None else \
            self.persistence.kept_ids(language, venv_id)

    def listed(self) -> list[dict[str, Any]]:
        """``list_sessions``: the kept sessions this process does not hold."""
        return [] if self.persistence is None else self.persistence.waiting()

    def describe(self, report: dict[str, Any]) -> None:
        """``inspect_session``: how the session is kept on disk (``kept``)."""
        if self.persistence is not None:
            report["kept"] = self.persistence.describe(report["session"])

    def adopt(self, record: dict[str, Any], session: Session, *, anew: bool = False) -> None:
        """A session whose state came other than by its own calls (a fork, a restored
        checkpoint; held by the caller) is kept from here on (``anew``: what was kept of
        it before goes)."""
        if self.persistence is None:
            return
        with contextlib.suppress(Exception):
            if anew:
                self.persistence.forget(Identity.of(record))
            self.persistence.adopt(record, session)

    def close_waiting(self, coordinate: Coordinate) -> Identity | None:
        """``close_session`` of a kept session not open here: its snapshot goes. Returns
        it (None: not such a session); raises when another live process holds it."""
        kept = self.waiting(coordinate)
        if kept is None or self._table.find(coordinate) is not None:
            return None
        assert self.persistence is not None
        if not self.persistence.forget(kept):
            raise held_elsewhere(kept.record())
        return kept

    def forget(self, record: dict[str, Any]) -> None:
        """``close_session`` of an open session: what is kept of it goes."""
        if self.persistence is not None:
            self.persistence.forget(Identity.of(record))

    def rebuild(self, coordinate: Coordinate, timeout: float,
                bring_back: Callable[[Coordinate, float], dict[str, Any] | None]
                ) -> dict[str, Any] | None:
        """``rebuild_session`` from a kept session's snapshot: a kept session not yet
        restored is restored (``bring_back``); an open one whose state was lost after its
        last snapshot gets that snapshot back plus the calls logged before the loss.
        None: the log alone rebuilds it."""
        if self.persistence is None:
            return None
        persistence = self.persistence
        waiting = self.waiting(coordinate)
        plan = None
        record = waiting.record() if waiting is not None else None
        if waiting is not None and persistence.held_elsewhere(waiting):
            raise held_elsewhere(waiting.record(), "rebuild")
        if waiting is None:
            found = self._table.find(coordinate)
            if found is None or found[0] == PLAN_KEY or self._log is None:
                return None
            record = self._table.record(found[0])
            plan = persistence.plan_rebuild(record)
            if plan is None:
                return None
            _, session = self._table.remove(coordinate)
            if session is not None:
                session.close()
            at = self._log.event("rebuild", record, {"snapshot": True, "until": plan["until"]})
            persistence.rebuilding(record, at, plan["until"])
        restored = bring_back(coordinate, timeout) or {}
        found = self._table.find(coordinate)
        return {"replayed": int(restored.get("replayed") or 0),
                "failed_at": restored.get("failed_at"),
                "session": self._table.record(found[0]) if found else record,
                "calls": plan["calls"] if plan else [],
                "skipped_failed": plan["failed"] if plan else [], "restored": restored}


__all__ = ["Keeping"]
