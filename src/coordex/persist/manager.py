"""Sessions that outlive their process (SPEC section 12): when snapshots are written, and
how a kept session comes back.

A session is kept from its first successful stateful call: a marker folder names it
(:class:`~.store.SnapshotStore`), and from then on the session is always the last
snapshot in its folder plus the stateful calls the call log holds after it (a marker
alone: all of them). A snapshot is written

- in the background after a stateful call that changed names, once ``interval`` seconds
  have passed since the session's last snapshot: one thread of this object takes the
  session's lock only if it is free and no later call ran, and starts a copy that writes
  (a fork of the session's process; a bash shell dumps itself in milliseconds), then
  lets go at once, so the session keeps answering while the copy writes;
- at close, for every session that changed since its last one, waiting at most
  ``close_budget`` seconds in all (what is not written by then is kept by the log).

On a session's first call in a new process, :meth:`Persistence.restore` loads the
snapshot before the call's code runs, replays the calls that bound what could not be
pickled (``left_out``) and then the calls logged after the snapshot, and says what
happened in the call's ``restored``.

One root, several processes: a kept session belongs to the one live process that holds
its folder's lock. Another process never restores it nor writes over it; a session it
opens under the same coordinates is *kept apart*: its snapshots go to a folder of
its own under another name (``'work (2)'``, ``'session 0 (2)'``), whose meta names the
coordinates its calls were logged under by that process (``aliases``), and the call's
result says so (``kept_apart``). Whichever process ends first, neither loses what it
returned: a later process restores each by its own name.
"""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..backends.base import Kept, RunRequest, Session, Writer
from ..core.coordinates import SessionKey
from ..core.errors import CoordexError, make_error
from ..log.calls import LoggedRow
from ..log.rebuild import replayable
from ..worker import _coordex_snapshot as snap
from .store import Identity, SnapshotStore

if TYPE_CHECKING:
    from ..sessions import SessionTable

# A snapshot's copy gives up after this long (a stuck pickler never holds a slot).
SNAPSHOT_TIMEOUT = 600.0
# What a snapshot written at close may take in all: SPEC 8 gives a stop 5 s.
CLOSE_BUDGET = 3.0
# At close, how long a session's snapshot waits for the call running in it.
BUSY_WAIT = 0.05


@dataclass
class _Kept:
    """What this process knows of one kept session."""

    identity: Identity
    held: bool = False  # open in this process (restored or created here)
    dirty: bool = False  # a stateful call succeeded since its last snapshot
    last_snapshot: float = field(default_factory=time.monotonic)
    attempt: int = 0
    # (attempt, started, the copy writing it)
    in_flight: tuple[int, float, Writer] | None = None
    meta: dict[str, Any] | None = None  # as found at start, for list_sessions
    # The coordinates this process holds it under, when kept apart under another name.
    local: Identity | None = None


class Persistence:
    """Snapshots of one executor's sessions under ``root/snapshots``.

    ``table`` is the executor's :class:`~coordex.sessions.SessionTable`; ``log`` its call
    log (None: snapshots alone, nothing is replayed).
    """

    def __init__(self, root: Path, table: SessionTable, log: Any, *, interval: float,
                 max_bytes: int) -> None:
        self.store = SnapshotStore(root)
        self._table = table
        self._log = log
        self.interval = float(interval)
        self.max_bytes = int(max_bytes)
        self._lock = threading.Lock()
        self._kept: dict[str, _Kept] = {}
        for identity, meta in self.store.kept():
            self._kept[identity.slug()] = _Kept(identity, meta=meta)
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._owner: str | None = getattr(log, "owner", None)
        self._held: dict[str, int] = {}  # slug -> fd of its folder's lock
        # Sessions of this process kept apart: slug of their coordinates -> the identity
        # they are kept under (another process holds a session at the same coordinates).
        self._apart: dict[str, Identity] = {}
        # slug -> (when counted, calls and last use from the log), for list_sessions
        self._counted: dict[str, tuple[float, dict[str, Any]]] = {}

    # -- what list_sessions shows -----------------------------------------------------

    def waiting(self) -> list[dict[str, Any]]:
        """Kept sessions not held by this process (``held: false``): those it may
        restore, and those another live process holds (``held_by``)."""
        self._rescan()
        with self._lock:
            kept = [k for k in self._kept.values()
                    if not k.held and k.identity.slug() not in self._held]
        open_keys = {(e.key.language, e.key.venv_id, e.key.session_id, e.name)
                     for e, _ in self._table.entries()}  # the plan namespace too: held
        records = []
        for item in kept:
            elsewhere = self.store.held_elsewhere(item.identity)
            if not elsewhere and (item.identity.language, item.identity.venv_id,
                                  item.identity.session_id,
                                  item.identity.session_name) in open_keys:
                continue
            meta = item.meta or {}
            record = {**item.identity.record(), "created_at": meta.get("written_at"),
                      "last_used_at": meta.get("written_at"), "calls": 0,
                      "alive": False, "held": False}
            record.update(self._logged(item.identity))
            if elsewhere:
                record["held_by"] = "another process"
            records.append(record)
        return records

    def _rescan(self) -> None:
        """Sessions kept on disk since this process started (by another process on
        the same root) join what it knows."""
        found = self.store.kept()
        with self._lock:
            for identity, meta in found:
                if identity.slug() not in self._kept:
                    self._kept[identity.slug()] = _Kept(identity, meta=meta)

    def _logged(self, identity: Identity) -> dict[str, Any]:
        """``calls`` and ``last_used_at`` of a kept session, from the log (its calls by
        the processes that held it)."""
        if self._log is None:
            return {}
        counted = self._counted.get(identity.slug())
        if counted is not None and time.monotonic() - counted[0] < _COUNT_FOR:
            return counted[1]  # a page asks every second; a count may lag a few
        from ..log.calls import read

        clause, args = self._where(identity)
        try:
            found = read(self._log, f"SELECT COUNT(*) AS n, MAX(at) AS last FROM calls WHERE "
                         f"kind = 'call' AND {clause}", args)
        except Exception:
            return {}
        logged = {"calls": int(found[0]["n"]), "last_used_at": found[0]["last"]} \
            if found and found[0]["n"] else {}
        self._counted[identity.slug()] = (time.monotonic(), logged)
        return logged

    def kept_ids(self, language: str, venv_id: int | None) -> set[int]:
        """Ids of the kept sessions of one place not yet restored (a new session never
        takes one)."""
        with self._lock:
            return {k.identity.session_id for k in self._kept.values() if not k.held
                    and (k.identity.language, k.identity.venv_id) == (language, venv_id)}

    def find_waiting(self, language: str, venv_id: int | None, session_id: int | None,
                     session_name: str | None) -> Identity | None:
        wanted = Identity(language, venv_id, session_id or 0, session_name)
        with self._lock:
            if wanted.slug() in self._apart:
                return None  # these coordinates name this process's own session here
            for item in self._kept.values():
                if not item.held and item.identity.same_session(wanted):
                    return item.identity
        found = self._on_disk(wanted)
        return None if found is None or found.held else found.identity

    def held_elsewhere(self, identity: Identity) -> bool:
        """Whether another live process holds the kept session ``identity``."""
        with self._lock:
            if identity.slug() in self._held:
                return False
        return self.store.held_elsewhere(identity)

    def _on_disk(self, identity: Identity) -> _Kept | None:
        """What this process knows of ``identity``, or what the disk holds of it now (a
        session another process kept after this one started: never taken unknowingly)."""
        slug = identity.slug()
        with self._lock:
            item = self._kept.get(slug)
        if item is not None or slug in self._held:
            return item
        meta = self.store.meta(identity)
        if meta is None or "language" not in meta:
            return None
        try:
            kept = Identity.of(meta)
        except (TypeError, ValueError):
            return None
        if not kept.same_session(identity):
            return None
        with self._lock:
            return self._kept.setdefault(slug, _Kept(kept, meta=meta))

    def describe(self, record: dict[str, Any]) -> dict[str, Any]:
        """How the session ``record`` names is kept, for ``inspect_session``: its last
        snapshot (or None) and, when the last attempt failed, why."""
        meta = self.store.meta(self._disk(Identity.of(record))) or {}
        snapshot = None
        if meta.get("file"):
            snapshot = {"at": meta.get("written_at"), "bytes": meta.get("bytes"),
                        "through_seq": meta.get("through"), "ms": meta.get("ms"),
                        "left_out": meta.get("left_out") or []}
        kept: dict[str, Any] = {"snapshot": snapshot,
                                "by": "snapshot+replay" if snapshot else "replay"}
        if meta.get("problem"):
            kept["problem"] = meta.get("problem_why") or meta["problem"]
        if meta.get("problem") == "disk_full" or "No space left" in str(meta.get("problem_why")):
            kept["error"] = make_error(
                "environment", f"The last snapshot of this session could not be written: "
                f"{kept['problem']}.", f"Free disk space under {self.store.path}; until then "
                "the session is kept by its calls in the log, and nothing is lost.")
        return kept

    # -- after each call ----------------------------------------------------------------

    def after_call(self, result: dict[str, Any], row: LoggedRow, call: int,
                   changed: bool) -> None:
        """Stateful call number ``call`` of a session (``changed``: it changed names)
        was logged as ``row``: keep its session. The row's seq is asked for only when a
        snapshot is marked or started with it (a row still in the log's journal is moved
        into the file for it)."""
        record = result.get("session")
        if not isinstance(record, dict) or record.get("session_id") is None:
            return
        local = Identity.of(record)
        identity = self._disk(local)
        if identity is local and not self._hold(local):
            # Another live process holds a session at these coordinates: this one is
            # another session, kept apart under a name of its own.
            apart = self._keep_apart(local)
            if apart is None:
                return
            identity = apart
        aliases = None if identity is local else [dict(local.record(), owner=self._owner)]
        slug = identity.slug()
        with self._lock:
            item = self._kept.get(slug)
            if item is None or not item.identity.same_session(identity):
                item = self._kept[slug] = _Kept(identity, held=True)
                fresh = True
            else:
                fresh = not item.held
                item.held = True
                item.identity = identity
            item.local = None if identity is local else local
        if item.local is not None and fresh:
            result["kept_apart"] = _apart_note(local, identity)
        if self._log is None:
            row = LoggedRow(0)  # no log: the snapshot alone keeps the session
        elif not row.written:
            return  # the row could not be written: its call is not counted on
        if result.get("state_lost"):
            # Its state was lost before this call; the calls from here on build it. The
            # snapshot stays: with the calls before the loss it is what rebuild_session
            # brings back (a restore sees the loss in the log and replays after it).
            lost_at = row.seq() if self.store.meta(identity) is None else None
            if lost_at is not None:
                since = lost_at + 1
                self._try(lambda: self.store.mark(identity, since, self._owner, aliases))
            with self._lock:
                item.dirty = True
            return
        if "error_type" in result:
            return
        if fresh and self.store.meta(identity) is None:
            first = row.seq()
            if first is None:
                return
            self._try(lambda: self.store.mark(identity, first, self._owner, aliases))
        with self._lock:
            # Any call may have changed objects in place; only one that rebound names
            # starts a snapshot before close.
            item.dirty = True
            due = changed and time.monotonic() - item.last_snapshot >= self.interval
        seq = row.seq() if due else None
        if seq is not None:
            # Started before this call returns, so no later call of this thread comes
            # first; by this object's thread, which outlives any caller's thread (a
            # fork of the own interpreter dies with the thread that made it).
            started = threading.Event()

            def job() -> None:
                try:
                    self._background(identity, call, seq)
                finally:
                    started.set()

            if self._submit(job):
                started.wait(_START_WAIT)

    def _background(self, identity: Identity, call: int, seq: int) -> None:
        """Start a snapshot of the session as it was after call ``call`` (row ``seq``),
        unless it is busy or a later call ran (that call will ask again)."""
        item = self._kept.get(identity.slug())
        if item is None or self._busy_writing(item):
            return
        found = self._slot(item.local or identity)
        if found is None:
            return
        key, slot = found
        if not slot.lock.acquire(timeout=_START_WAIT):
            return
        try:
            calls = next((e.calls for e, _ in self._table.entries() if e.key == key), None)
            if calls != call or slot.session is None:
                return
            self._start(item, slot.session, seq)
        finally:
            slot.lock.release()

    # -- writing ------------------------------------------------------------------------

    def _start(self, item: _Kept, session: Session, through: int) -> None:
        if not isinstance(session, Kept):
            return  # a place whose sessions are not kept (the cluster's)
        folder = self.store.folder(item.identity, make=True)
        meta = self.store.meta(item.identity) or {}
        item.attempt = max(item.attempt, int(meta.get("attempt") or 0)) + 1
        # ``since``: the first logged call of the session's life, for a replay of it all.
        identity = {**item.identity.record(), "since": meta.get("since"),
                    "owners": meta.get("owners"), "aliases": meta.get("aliases")}
        started = time.monotonic()
        item.dirty, item.last_snapshot = False, started
        free = _free_bytes(folder)
        if free is not None and free < int(meta.get("bytes") or 0) + _SPARE_BYTES:
            # Never fill the disk: the log keeps the session meanwhile.
            snap.write_meta(str(folder), dict(meta or identity, attempt=item.attempt,
                                              problem="disk_full", problem_why=(
                f"only {free} bytes are free where snapshots are kept ({folder.parent}); "
                "the session is kept by replaying its calls until space is freed")))
            return
        with self._lock:
            held = tuple(self._held.values())
        writer = session.start_snapshot(str(folder), attempt=item.attempt, through=through,
                                        max_bytes=self.max_bytes, identity=identity,
                                        close=held)
        if writer is not None:
            item.in_flight = (item.attempt, started, writer)

    def _busy_writing(self, item: _Kept) -> bool:
        """Whether a snapshot of ``item`` is still being written (reaps a finished one)."""
        flight = item.in_flight
        if flight is None:
            return False
        attempt, started, writer = flight
        if writer.running():
            if int((self.store.meta(item.identity) or {}).get("attempt") or 0) >= attempt:
                writer.wait()  # it has written; reaped as it exits
            elif time.monotonic() - started < SNAPSHOT_TIMEOUT:
                return True
            else:
                writer.kill()
        item.in_flight = None
        return False

    # -- closing ----------------------------------------------------------------------

    def close(self, budget: float = CLOSE_BUDGET) -> None:
        """Snapshot every held session that changed since its last snapshot, waiting at
        most ``budget`` seconds in all; then stop this object's thread."""
        deadline = time.monotonic() + budget
        with self._lock:  # no job or thread starts after this
            self._closed = True
            thread = self._thread
        if thread is not None:
            self._jobs.put(None)
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        with self._lock:
            items = [k for k in self._kept.values() if k.held]
        for item in items:
            if item.dirty and not self._busy_writing(item):
                with contextlib.suppress(Exception):
                    self._at_close(item, deadline)
        for item in items:
            while self._busy_writing(item) and time.monotonic() < deadline:
                time.sleep(0.02)
            flight = item.in_flight
            if flight is not None:
                flight[2].kill()  # not done in time: the log keeps what it would have
        with self._lock:
            fds, self._held = list(self._held.values()), {}
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _at_close(self, item: _Kept, deadline: float) -> None:
        found = self._slot(item.local or item.identity)
        if found is None:
            return
        _key, slot = found
        # A call running now runs until close() ends it, after this: waiting for it only
        # delays the stop (SPEC 8: out within 5 s), and the log has what it would hold.
        if not slot.lock.acquire(timeout=max(0.0, min(BUSY_WAIT, deadline - time.monotonic()))):
            return
        try:
            through = self._last_seq(item.identity) if self._log is not None else 0
            if slot.session is not None and through is not None:
                self._start(item, slot.session, through)
        finally:
            slot.lock.release()

    def forget(self, identity: Identity) -> bool:
        """``close_session``: the session and its snapshot are gone. False when another
        live process holds it (nothing was deleted)."""
        with self._lock:
            identity = self._apart.pop(identity.slug(), identity)
            item = self._kept.pop(identity.slug(), None)
            fd = self._held.pop(identity.slug(), None)
        if item is not None and item.in_flight is not None:
            item.in_flight[2].kill()
        if fd is None and self.store.held_elsewhere(identity):
            if item is not None:
                with self._lock:
                    self._kept.setdefault(identity.slug(), item)
            return False  # another process's: not this one's to delete
        self.store.forget(identity)
        if fd is not None:
            os.close(fd)
        return True

    def adopt(self, record: dict[str, Any], session: Session) -> None:
        """A session whose state came other than by its own calls (``fork_session``,
        ``restore_session``; held by the caller): a snapshot of it is started now, and
        only the calls logged after this point are replayed over it after a restart."""
        local = Identity.of(record)
        identity = self._disk(local)
        if identity is local and not self._hold(local):
            apart = self._keep_apart(local)  # another process holds these coordinates
            if apart is None:
                return
            identity = apart
        aliases = None if identity is local else [dict(local.record(), owner=self._owner)]
        through = (self._last_seq(identity) if self._log is not None else 0) or 0
        if aliases is not None and self._log is not None:  # its rows so far: all before
            through = max(through, self._last_seq_of_all())
        with self._lock:
            item = self._kept.get(identity.slug())
            if item is None or not item.identity.same_session(identity):
                item = self._kept[identity.slug()] = _Kept(identity)
            item.held, item.identity, item.attempt = True, identity, 0
            item.local = None if identity is local else local
        self._try(lambda: self.store.mark(identity, through + 1, self._owner, aliases))
        if self._busy_writing(item) and item.in_flight is not None:
            item.in_flight[2].kill()
        item.in_flight = None
        self._start(item, session, through)

    def _hold(self, identity: Identity) -> bool:
        """Whether this process holds the session's folder (locking it on first use)."""
        slug = identity.slug()
        with self._lock:
            if slug in self._held:
                return True
        try:
            fd = self.store.hold(identity)
        except OSError:
            return False
        if fd is None:
            return False
        with self._lock:
            if slug in self._held:
                os.close(fd)
            else:
                self._held[slug] = fd
        return True

    def _disk(self, local: Identity) -> Identity:
        """The identity the session at ``local``'s coordinates is kept under here."""
        with self._lock:
            return self._apart.get(local.slug(), local)

    def _keep_apart(self, local: Identity) -> Identity | None:
        """A name of its own for a session of this process whose coordinates another
        live process holds (``'work (2)'``, ``'session 3 (2)'``): one no session is kept
        under and none of this process is open as; its folder is locked for this
        process. None if none could be taken."""
        base = local.session_name if local.session_name is not None \
            else f"session {local.session_id}"
        names = {e.name for e, _ in self._table.entries()
                 if (e.key.language, e.key.venv_id) == (local.language, local.venv_id)}
        for number in range(2, 100):
            name = f"{base} ({number})"
            apart = Identity(local.language, local.venv_id, local.session_id, name)
            if name in names or self.store.meta(apart) is not None or not self._hold(apart):
                continue
            if self.store.meta(apart) is not None:  # kept by another meanwhile
                self._let_go(apart)
                continue
            with self._lock:
                self._apart[local.slug()] = apart
            return apart
        return None

    def _let_go(self, identity: Identity) -> None:
        with self._lock:
            fd = self._held.pop(identity.slug(), None)
        if fd is not None:
            os.close(fd)

    # -- restoring ----------------------------------------------------------------------

    def restore(self, key: SessionKey, record: dict[str, Any], session: Session,
                timeout: float) -> dict[str, Any] | None:
        """Bring back the kept session ``record`` names into ``session`` (just opened,
        no code run yet). Returns the call's ``restored``; ``{"state_lost": True}`` when
        something was kept and nothing of it could be brought back; None when nothing
        is kept."""
        identity = Identity.of(record)
        if self._disk(identity) is not identity:
            return None  # kept apart: a session of this process's own
        item = self._on_disk(identity)
        if item is None and self.store.undescribed(identity) and self._hold(identity):
            # A snapshot is there but nothing says what it is (meta.json and kept.json
            # both lost): never used, and said as a loss (rebuild_session replays it).
            with self._lock:
                self._kept[identity.slug()] = _Kept(identity, held=True)
            return {"state_lost": True}
        with self._lock:
            if item is None or item.held or not item.identity.same_session(identity):
                return None
        if not self._hold(identity):
            # Another live process holds it: this session is another, kept apart (and
            # never written over that one's snapshot, should that process end first).
            self._keep_apart(identity)
            return None
        with self._lock:
            item.held = True
        for half in self.store.folder(identity).glob(".state-*"):  # a killed writer's
            half.unlink(missing_ok=True)
        started = time.monotonic()
        meta = self.store.meta(item.identity) or {}
        rows = self._rows_after(item.identity, meta.get("through"))
        folder = self.store.folder(item.identity)
        report: dict[str, Any] = {}
        why = None
        lost_since = _last_loss(rows)
        rebuilt = meta.get("rebuilt")
        if lost_since is not None and isinstance(rebuilt, dict) and \
                rows[lost_since].get("seq") == rebuilt.get("at"):
            # rebuild_session brought it back as the snapshot plus the calls before the
            # loss; the calls after that rebuild follow.
            rows = [r for r in rows[:lost_since] if r["seq"] < rebuilt.get("until", 0)] + \
                rows[lost_since + 1:]
            lost_since = None
        if lost_since is not None:
            rows = rows[lost_since + 1:]
            why = "the session lost its state after its last snapshot"
        elif isinstance(session, Kept) and meta.get("file"):
            left = list(meta.get("left_out") or [])
            replay = self._binding_calls(item.identity, left, meta.get("through"))
            report = session.restore_snapshot(str(folder), replay, timeout)
            why = report.get("error")
            if why is not None:  # the whole life is replayed instead
                rows = self._rows_after(item.identity, (meta.get("since") or 1) - 1)
                loss = _last_loss(rows)
                rows = rows if loss is None else rows[loss + 1:]
        elif meta.get("problem_why"):
            why = meta["problem_why"]
        self._try(lambda: self.store.add_owner(item.identity, self._owner))
        loaded = bool(report) and "error" not in report
        replayed, failed_at = self._replay(session, [r for r in rows if replayable(r)])
        replayed += int(report.get("replayed") or 0)  # the calls that bound what was left out
        item.dirty = bool(replayed) or item.dirty
        if not loaded and not replayed:
            # Nothing came back: a fresh session. Said as a loss where something was kept.
            kept = why is not None or failed_at is not None
            return {"state_lost": True} if kept else None
        sources = (["snapshot"] if loaded else []) + (["replay"] if replayed or not loaded else [])
        restored: dict[str, Any] = {
            "from": "+".join(sources), "ms": round((time.monotonic() - started) * 1000.0, 1),
            "left_out": list(report.get("left_out") or []) if loaded else [],
        }
        if replayed:
            restored["replayed"] = replayed
        if failed_at is not None:
            restored["failed_at"] = failed_at
        if why is not None:
            restored["why"] = why
        return restored

    def plan_rebuild(self, record: dict[str, Any]) -> dict[str, Any] | None:
        """For ``rebuild_session`` of an open session: when its state was lost after its
        last snapshot, the plan to bring it back from that snapshot - ``until`` (the row
        that reported the loss), ``calls`` (the seqs replayed after the snapshot) and
        ``failed`` - else None (the log alone rebuilds it)."""
        identity = self._disk(Identity.of(record))
        meta = self.store.meta(identity) or {}
        if not meta.get("file") or not isinstance(meta.get("through"), int):
            return None
        rows = self._rows_after(identity, meta["through"])
        loss = _last_loss(rows)
        if loss is None or rows[loss].get("kind") != "call":
            return None  # nothing lost since the snapshot, or rebuilt already
        before = rows[:loss]
        return {"until": rows[loss]["seq"], "calls": [r["seq"] for r in before if replayable(r)],
                "failed": [r["seq"] for r in before if r.get("kind") == "call"
                           and r.get("outcome") != "ok" and not r.get("state_lost")]}

    def rebuilding(self, record: dict[str, Any], at: int | None, until: int) -> None:
        """The session was closed for a rebuild logged as row ``at``: its next opening
        restores the snapshot and the calls before row ``until``."""
        identity = self._disk(Identity.of(record))
        meta = self.store.meta(identity)
        if meta is not None and at is not None:
            meta["rebuilt"] = {"at": at, "until": until}
            snap.write_meta(str(self.store.folder(identity)), meta)
        with self._lock:
            item = self._kept.get(identity.slug())
            if item is not None:
                item.held = False

    def _replay(self, session: Session, rows: list[dict[str, Any]]) -> tuple[int, int | None]:
        done = 0
        for row in rows:
            code = row.get("code")
            if row.get("code_truncated") or not isinstance(code, str):
                return done, row["seq"]
            took = (row.get("duration_ms") or 0.0) / 1000.0
            ran = session.run(RunRequest(code=code, timeout=max(60.0, 2 * took + 5.0)))
            if not ran.ok or (row.get("exit_code") == 0 and ran.exit_code not in (0, None)):
                return done, row["seq"]
            done += 1
        return done, None

    # -- the log ------------------------------------------------------------------------

    def _rows(self, identity: Identity, where: str, params: list[Any]) -> list[dict[str, Any]]:
        if self._log is None:
            return []
        from ..log.calls import read
        from ..log.store import decode_row

        clause, args = self._where(identity)
        try:
            found = read(self._log, "SELECT seq, kind, state_mode, outcome, state_lost, code, "
                         "code_truncated, changed, exit_code, duration_ms FROM calls WHERE "
                         f"{clause} AND {where} ORDER BY seq", [*args, *params])
        except Exception:
            return []
        return [decode_row(row) for row in found]

    def _where(self, identity: Identity) -> tuple[str, list[Any]]:
        """SQL for the log rows of the kept session ``identity``: its coordinates, by
        the processes that held it (another server on the same root has a session 0 of
        its own), and the coordinates a process that kept it apart logged it under."""
        from ..log.store import rows_where

        def coordinates(of: dict[str, Any]) -> tuple[str, list[Any]]:
            filters: list[tuple[str, Any]] = [("language", of.get("language")),
                                              ("venv_id", of.get("venv_id")),
                                              ("session_name", of.get("session_name"))]
            if of.get("session_name") is None:
                filters.append(("session_id", of.get("session_id") or 0))
            return rows_where(filters)

        meta = self.store.meta(identity) or {}
        clause, args = coordinates(identity.record())
        owners = meta.get("owners")
        if isinstance(owners, list) and owners:
            clause += f" AND owner IN ({', '.join('?' * len(owners))})"
            args = [*args, *owners]
        for alias in meta.get("aliases") or []:
            if isinstance(alias, dict) and alias.get("owner"):
                more, more_args = coordinates(alias)
                clause = f"({clause}) OR ({more} AND owner = ?)"
                args = [*args, *more_args, alias["owner"]]
        return f"({clause})", args

    def _rows_after(self, identity: Identity, through: Any) -> list[dict[str, Any]]:
        after = int(through) if isinstance(through, int) else 0
        return [row for row in self._rows(identity, "seq > ?", [after])
                if row.get("kind") == "rebuild"
                or (row.get("kind") == "call" and row.get("state_mode") == "stateful")]

    def _last_seq(self, identity: Identity) -> int | None:
        rows = self._rows(identity, "kind = 'call' AND state_mode = 'stateful'", [])
        return rows[-1]["seq"] if rows else None

    def _last_seq_of_all(self) -> int:
        from ..log.calls import read

        try:
            found = read(self._log, "SELECT MAX(seq) AS last FROM calls", [])
        except Exception:
            return 0
        return int(found[0]["last"] or 0) if found else 0

    def _binding_calls(self, identity: Identity, names: list[str], through: Any) -> list[str]:
        """The code of the logged calls that last bound each of ``names`` (up to the
        snapshot, since the session's last loss), oldest first."""
        if not names or not isinstance(through, int):
            return []
        rows = [row for row in self._rows(identity, "seq <= ?", [through])
                if row.get("kind") == "call" and row.get("state_mode") == "stateful"]
        loss = _last_loss(rows)
        if loss is not None:
            rows = rows[loss + 1:]
        chosen: dict[int, str] = {}
        for name in names:
            for row in reversed(rows):
                changed = row.get("changed") or {}
                if replayable(row) and name in (changed.get("rebound") or []) and \
                        isinstance(row.get("code"), str) and not row.get("code_truncated"):
                    chosen[row["seq"]] = row["code"]
                    break
        return [chosen[seq] for seq in sorted(chosen)]

    # -- internals ----------------------------------------------------------------------

    def _slot(self, identity: Identity) -> tuple[SessionKey, Any] | None:
        from ..core.coordinates import Coordinate

        coordinate = Coordinate(identity.language, "stateful",  # type: ignore[arg-type]
                                identity.venv_id,
                                None if identity.session_name else identity.session_id,
                                identity.session_name)
        found: tuple[SessionKey, Any] | None = self._table.find(coordinate)
        return found

    def _submit(self, job: Callable[[], None]) -> bool:
        with self._lock:
            if self._closed:
                return False
            if self._thread is None:
                thread = threading.Thread(target=self._serve, name="coordex-snapshots",
                                          daemon=True)
                thread.start()  # close() joins only a started thread
                self._thread = thread
            self._jobs.put(job)
        return True

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            with contextlib.suppress(Exception):  # a snapshot never costs a call
                job()

    @staticmethod
    def _try(action: Callable[[], None]) -> None:
        with contextlib.suppress(OSError):
            action()


# Seconds a kept session's count of logged calls is reused by list_sessions.
_COUNT_FOR = 5.0
# How long a call waits for its session's snapshot to start (a fork: milliseconds).
_START_WAIT = 2.0
# Room a snapshot leaves free on its disk beyond the size of the last one.
_SPARE_BYTES = 64 << 20


def _apart_note(local: Identity, apart: Identity) -> str:
    """What a call's result says when its session is kept apart (SPEC 12)."""
    from ..core.messages import session_arguments

    return (f"Another coordex process on this data folder holds the session "
            f"({session_arguments(local.record())}); this session is a separate one (it does "
            f"not see that session's state) and is kept on disk apart from it, as "
            f"session_name={apart.session_name!r}. Keep calling it as before while this "
            f"process runs; after it ends, it comes back as session_name="
            f"{apart.session_name!r}.")


def held_elsewhere(record: dict[str, Any], action: str = "close") -> CoordexError:
    """``close_session`` (or ``rebuild_session``) of a kept session another live process
    holds."""
    from ..core.messages import session_arguments

    return CoordexError(
        "validation", f"The session ({session_arguments(record)}) is held by another coordex "
        f"process on this data folder; it is that process's to {action}.",
        f"{action.capitalize()} it from the client that uses it, or wait until that "
        "process ends; "
        "list_sessions shows it with held_by.")


def _free_bytes(folder: Path) -> int | None:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def _last_loss(rows: list[dict[str, Any]]) -> int | None:
    """Index of the last row after which the session started over (a loss)."""
    for index in range(len(rows) - 1, -1, -1):
        if rows[index].get("state_lost") or rows[index].get("kind") == "rebuild":
            return index
    return None


__all__ = ["Persistence", "snap"]
