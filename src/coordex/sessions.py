"""The one owner of session state: key -> entry, session, lock.

:class:`SessionTable` is the only code that moves a session through its lifecycle
(``starting → idle ⇄ busy``, ``broken`` when the process holding it died, ``closed`` at
the end; the table of legal moves is :data:`coordex.core.registry.TRANSITIONS`). It
decides from the facts a place reports, settled into one
:class:`~coordex.core.record.Settled` per call (never from words):

- a call whose process died with the session's state leaves the session ``broken``
  (:attr:`Settled.broken <coordex.core.record.Settled.broken>`); its next call moves it
  back through ``starting`` (the place replaces the process and reports ``replaced``);
- ``state_lost`` is reported once per loss: a loss already reported by an earlier
  result is not repeated;
- a call that reserved a new session whose process could not start releases the
  reservation, so a failed start never holds a place under ``max_sessions``;
- a call whose process died is run once more or reported ``crashed``, by
  :func:`attempts` and the table of :mod:`coordex.core.faults` (SPEC section 6), from
  the ``died`` fact its place reported — never by the place itself.

Calls to one session are serialised by its lock; the table's own lock guards only the
bookkeeping and is never held while code runs.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

from .backends.base import Place, RunRequest, Session, wait_for
from .core import facts, faults, messages
from .core.coordinates import Coordinate, SessionKey, StateMode
from .core.errors import CoordexError
from .core.facts import Ran
from .core.record import Settled, render_error
from .core.registry import PLAN_KEY, SessionEntry, SessionRegistry
from .core.results import session_record


@dataclass
class Slot:
    """What the table holds for one session besides its registry entry."""

    session: Session | None
    lock: threading.Lock
    # The session's last result said its process was lost during the call: the fresh
    # process its place puts in at the next call is that loss, not news (the one
    # "reported once" flag).
    told: bool = False


class SessionTable:
    """Sessions by key: registry entry (names, cap, provenance, state), process, lock."""

    def __init__(self, max_sessions: int, plan_session: Session, *,
                 replaces_lost: bool = False) -> None:
        self.lock = threading.RLock()
        self.registry = SessionRegistry(max_sessions, now=time.time())
        self._slots: dict[SessionKey, Slot] = {PLAN_KEY: Slot(plan_session, threading.Lock())}
        self.closed = False
        # This table stands in for one whose every session was lost (a confined host
        # started again after it died, SPEC 9) and no result has said so yet: the first
        # call of code takes it (:meth:`take_unsaid_loss`), and its result says it.
        self.unsaid_loss = replaces_lost

    def take_unsaid_loss(self) -> bool:
        """Whether the loss this table was started after is still unsaid; the caller,
        a call of code whose result says ``state_lost``, says it (once: taken here)."""
        if not self.unsaid_loss:  # the common case, without the lock
            return False
        with self.lock:
            unsaid, self.unsaid_loss = self.unsaid_loss, False
        return unsaid

    # -- lookup ----------------------------------------------------------------------

    def record(self, key: SessionKey) -> dict[str, Any]:
        """The ``session`` dict of a result for ``key``."""
        with self.lock:
            entry = self.registry.get(key)
        name = entry.name if entry is not None else None
        return session_record(key.language, key.venv_id, key.session_id, name)

    def existing(self, coordinate: Coordinate) -> tuple[SessionKey, Slot]:
        """The live session a coordinate names, else ``not_found``."""
        with self.lock:
            self._check_open()
            key = self.registry.require(coordinate)
            slot = self._slots.get(key)
            if slot is None or slot.session is None:
                raise self.registry.not_found(coordinate)
            return key, slot

    def find(self, coordinate: Coordinate) -> tuple[SessionKey, Slot] | None:
        with self.lock:
            key = self.registry.find(coordinate)
            slot = self._slots.get(key) if key is not None else None
            if key is None or slot is None or slot.session is None:
                return None
            return key, slot

    def entries(self) -> list[tuple[SessionEntry, Session | None]]:
        with self.lock:
            return [(e, slot.session if (slot := self._slots.get(e.key)) else None)
                    for e in self.registry.entries()]

    def provenance(self, key: SessionKey, name: str) -> tuple[int, int]:
        with self.lock:
            return self.registry.provenance(key, name)

    # -- a stateful call -------------------------------------------------------------

    def stateful(self, coordinate: Coordinate, timeout: float, cancel: threading.Event | None,
                 opener: Callable[[SessionKey], Session]) -> _Held:
        """Hold the session a stateful call runs in (created with ``opener`` if new).

        A context manager giving ``(key, session, call number)``; ``session`` is None when
        another call kept the session busy for the whole timeout (nothing ran). On exit,
        :meth:`finish` must have been given the outcome.
        """
        return _Held(self, coordinate, timeout, cancel, opener)

    def _hold(self, coordinate: Coordinate, timeout: float, cancel: threading.Event | None,
              opener: Callable[[SessionKey], Session]) -> tuple[SessionKey, Session | None,
                                                                int, Slot | None]:
        """What :meth:`stateful` enters with, and the slot whose lock is then held."""
        with self.lock:
            self._check_open()
            key, created = self.registry.resolve_or_reserve(coordinate, time.time())
            slot = self._slots.get(key)
            if slot is None:
                slot = self._slots[key] = Slot(None, threading.Lock())
        if not wait_for(slot.lock, timeout, cancel):
            return key, None, 0, None
        try:
            session = slot.session
            if session is None:
                session = self._open(key, slot, created, opener)
            with self.lock:
                entry = self.registry.get(key)
                if entry is None:  # closed while we waited for its lock
                    raise CoordexError("not_found", "The session was closed before this call "
                                       "could run.", "Run the call again: a stateful call "
                                       "opens a new session.")
                if entry.state == "broken":
                    self.registry.move(key, "starting")
                    self.registry.move(key, "idle")
                call = self.registry.begin_call(key, time.time())
                self.registry.move(key, "busy")
        except BaseException:
            slot.lock.release()
            raise
        return key, session, call, slot

    def _open(self, key: SessionKey, slot: Slot, created: bool,
              opener: Callable[[SessionKey], Session]) -> Session:
        try:
            session = opener(key)
        except BaseException as exc:
            with self.lock:  # never leave a reserved session without a process
                self._forget(key)
            if isinstance(exc, OSError):
                raise messages.start_failed(key.language, exc) from exc
            raise
        with self.lock:
            if self.closed or key not in self.registry:
                closed = self.closed
                self._forget(key)
                session.close()
                if closed:
                    raise messages.executor_closed()
                raise CoordexError("not_found", "The session was closed while it started.",
                                   "Run the call again: a stateful call opens a new session.")
            slot.session = session
            self.registry.move(key, "idle")
        return session

    def finish(self, key: SessionKey, call: int, settled: Settled | None,
               rebound: Collection[str] = (), deleted: Collection[str] = (), *,
               lost: bool = False) -> None:
        """Record what a call did: its state after, and the names it rebound or deleted.

        ``settled`` None: the call ended without one (the session is idle). ``lost``:
        the session's state went during the call (its settled loss, or a kept session
        nothing could be restored into); with a crash, the session is ``broken``."""
        with self.lock:
            if key not in self.registry:
                return
            broken = lost and settled is not None and settled.crashed
            self.registry.move(key, "broken" if broken else "idle")
            self.registry.record_bindings(key, call, rebound, deleted)
            if lost:
                # What was bound before the loss is gone with it.
                self.registry.keep_bindings_of(key, call)

    # -- read-only and inspect ---------------------------------------------------------

    @contextmanager
    def reading(self, coordinate: Coordinate, timeout: float,
                cancel: threading.Event | None) -> Iterator[tuple[SessionKey, Slot | None]]:
        """Hold an existing session for a read-only call or an inspection.

        Yields ``(key, slot)``, ``slot`` None when the session stayed busy for the whole
        timeout. Counts the call (read-only calls age names too).
        """
        key, slot = self.existing(coordinate)
        if not wait_for(slot.lock, timeout, cancel):
            yield key, None
            return
        try:
            yield key, slot
        finally:
            slot.lock.release()

    def run(self, key: SessionKey, place: Place, mode: StateMode,
            request: RunRequest) -> Settled:
        """One ``stateful`` or ``read_only`` call to the session ``key`` (held by the
        caller) through :func:`attempts`, each loss said once."""
        slot = self._slots[key]
        session = slot.session
        assert session is not None, "the caller holds a live session"
        run = session.run_read_only if mode == "read_only" else session.run

        def attempt(request: RunRequest) -> Ran:
            ran = run(request)
            event = ran.event
            if isinstance(event, facts.Closed) and event.by == "session" and self.closed:
                # The Executor's close() ended the session under this call: that event
                # reads the same as for a stateless call, whatever the place saw (SPEC 6).
                return dataclasses.replace(ran, event=facts.Closed("executor",
                                                                   detail=event.detail))
            return ran

        settled = settle(place, mode, attempt, request, told=slot.told)
        slot.told = settled.during
        return settled

    def inspect(self, key: SessionKey, slot: Slot, place: Place) -> dict[str, Any]:
        """What the session holds (SPEC 7), or the error that kept it from saying; a
        process found dead and replaced is said as ``state_lost`` once, as for a call."""
        report = slot.session.inspect() if slot.session is not None else facts.Ran(
            facts.Closed("session", during=False))
        said, slot.told = inspected(report, place, slot.told)
        return said

    def count_call(self, key: SessionKey) -> None:
        with self.lock:
            if key in self.registry:
                self.registry.begin_call(key, time.time())

    def reserve_kept(self, coordinate: Coordinate, kept_id: int | None,
                     taken: Collection[int]) -> None:
        """A named session kept on disk (SPEC 12) and not yet restored: reserve its old
        id ``kept_id`` for it; a new named session takes none of the ids in ``taken``
        (still kept). A full table is said by the call itself."""
        with self.lock:
            registry = self.registry
            if registry.find(coordinate) is not None:
                return
            held = {e.key.session_id for e in registry.entries()
                    if (e.key.language, e.key.venv_id) == (coordinate.language,
                                                           coordinate.venv_id)}
            if kept_id is not None and kept_id not in held:
                sid = kept_id
            else:
                sid = next(i for i in itertools.count(1) if i not in held | set(taken))
            key = SessionKey(coordinate.language, coordinate.venv_id, sid)
            if key not in registry:
                with suppress(CoordexError):  # capacity: said by the call itself
                    registry.reserve(key, coordinate.session_name, time.time())

    # -- a session made from another (fork_session) ----------------------------------------

    def reserve_named(self, language: Any, venv_id: int | None, name: str,
                      taken: Collection[int] = ()) -> SessionKey:
        """Reserve a new named session (``capacity`` beyond ``max_sessions``), its id the
        next free one not in ``taken``; :meth:`install` or :meth:`release` follows."""
        with self.lock:
            self._check_open()
            used = {e.key.session_id for e in self.registry.entries()
                    if (e.key.language, e.key.venv_id) == (language, venv_id)} | set(taken)
            sid = next(i for i in range(1, len(used) + 2) if i not in used)
            key = SessionKey(language, venv_id, sid)
            self.registry.reserve(key, name, time.time())
            self._slots[key] = Slot(None, threading.Lock())
            return key

    def install(self, key: SessionKey, session: Session, copied_from: SessionKey) -> bool:
        """Put a forked session in its reserved place, with the names' provenance of
        the session it was copied from; False when the table closed meanwhile."""
        with self.lock:
            entry, source = self.registry.get(key), self.registry.get(copied_from)
            slot = self._slots.get(key)
            if self.closed or entry is None or slot is None:
                return False
            slot.session = session
            self.registry.move(key, "idle")
            if source is not None:
                entry.calls, entry.bindings = source.calls, dict(source.bindings)
            return True

    def lock_of(self, key: SessionKey) -> threading.Lock | None:
        """The lock that serialises the calls of ``key``'s session."""
        with self.lock:
            slot = self._slots.get(key)
            return slot.lock if slot is not None else None

    def release(self, key: SessionKey) -> None:
        """Give back a reservation whose session never came."""
        with self.lock:
            self._forget(key)

    # -- closing -----------------------------------------------------------------------

    def remove(self, coordinate: Coordinate) -> tuple[dict[str, Any], Session | None]:
        """Take a session out (``close_session``); the caller closes what is returned."""
        with self.lock:
            self._check_open()
            key = self.registry.require(coordinate)
            record = self.record(key)
            self.registry.remove(key)  # validation error for the plan namespace
            slot = self._slots.pop(key, None)
        return record, slot.session if slot is not None else None

    def drain(self) -> list[Session]:
        """Mark the table closed and hand back every session to close (the plan's too)."""
        with self.lock:
            if self.closed:
                return []
            self.closed = True
            sessions = [s.session for s in self._slots.values() if s.session is not None]
            self._slots.clear()
            return sessions

    def _forget(self, key: SessionKey) -> None:
        if key in self.registry and key != PLAN_KEY:
            self.registry.remove(key)
        self._slots.pop(key, None)

    def _check_open(self) -> None:
        if self.closed:
            raise messages.executor_closed()


class _Held:
    """:meth:`SessionTable.stateful`: a class, not a generator, as every stateful call
    enters one."""

    __slots__ = ("_args", "_slot", "_table")

    def __init__(self, table: SessionTable, *args: Any) -> None:
        self._table, self._args = table, args
        self._slot: Slot | None = None

    def __enter__(self) -> tuple[SessionKey, Session | None, int]:
        key, session, call, self._slot = self._table._hold(*self._args)
        return key, session, call

    def __exit__(self, *exc: object) -> None:
        if self._slot is not None:
            self._slot.lock.release()


def inspected(report: dict[str, Any] | Ran, place: Place,
              told: bool) -> tuple[dict[str, Any], bool]:
    """A session's ``inspect`` answer as the Executor gives it, and whether it said a
    loss whose dead process is yet to be replaced: a report (``replaced``: said as
    ``state_lost`` unless ``told``), or the error a fact is worded into."""
    if isinstance(report, Ran):
        during = facts.lost_state(report, "read_only")
        lost = during or (report.replaced and not told)
        return render_error(Settled(report, place.kind, "read_only", 0.0, lost=lost)), during
    report = dict(report)
    if report.pop("replaced", False) and not told:
        report["state_lost"] = True
    return report, False


# Seconds of the call's timeout a retry must have left to be worth running.
RETRY_FLOOR = 0.5


def attempts(place: Place, mode: StateMode, request: RunRequest, *,
             session: Session | None = None, told: bool = False) -> Settled:
    """Run one call at ``place`` in ``mode`` (a ``stateless`` call through the place, a
    ``stateful`` or ``read_only`` one through ``session``) and settle it by SPEC section
    6: see :func:`settle`."""
    if mode == "stateless":
        return settle(place, mode, place.run_stateless, request, told=told)
    assert session is not None, "a stateful or read-only call runs in a session"
    run = session.run_read_only if mode == "read_only" else session.run
    return settle(place, mode, run, request, told=told)


def settle(place: Place, mode: StateMode, run: Callable[[RunRequest], Ran],
           request: RunRequest, *, told: bool = False) -> Settled:
    """Run one call through ``run`` (one attempt each) and apply SPEC section 6.

    Where the place ``retries`` (Python workers) and what died under the call had not
    taken it for good, the call runs once more, on the fresh process the place puts in,
    within what is left of the call's one timeout (none left: no retry); a second
    death, or any death where no retry is due, is ``crashed`` naming how often it died.

    ``state_lost`` is said once per loss: a process the place found dead and replaced
    before the first attempt is news unless ``told`` (the session's previous result
    already said the loss); a loss during the call always is. A stateless call never
    says it.
    """
    tried: list[faults.Attempt] = []
    hows: list[str] = []
    lost = False
    started = time.monotonic()
    attempt = request
    while True:
        ran = run(attempt)
        if not tried and not ran.replaced and not isinstance(ran.event, facts.Died):
            # The first attempt, nothing died or was replaced: no retry to weigh.
            during = facts.lost_state(ran, mode)
            return Settled(ran, place.kind, mode, request.timeout, 1, (), during, False, during)
        lost = lost or facts.lost_state(ran, mode) or (ran.replaced and (bool(tried) or not told))
        tried.append(faults.attempt(ran))
        step = faults.next_step(place.retries, tried, read_only=mode == "read_only")
        left = request.timeout - (time.monotonic() - started)
        if step == "retry" and left < RETRY_FLOOR:
            step = "crashed"  # SPEC 6: one deadline for the call, retry included
        if step != "retry":
            break
        assert isinstance(ran.event, facts.Died)
        hows.append(ran.event.how)
        attempt = dataclasses.replace(request, timeout=left)
    return Settled(ran, place.kind, mode, request.timeout, attempts=len(tried),
                   hows=tuple(hows), lost=lost and mode != "stateless",
                   retried=faults.retried(tried), during=facts.lost_state(ran, mode))
