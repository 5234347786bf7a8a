"""One call, settled: the record the session table and the Executor fill in, and the one
function that turns it into the SPEC result or error dict.

A call's story is decided in two steps and written down as data, never as text:

1. the session table runs the attempts (:func:`coordex.sessions.attempts`) and hands
   back a :class:`Settled`: the last attempt's facts (:class:`~coordex.core.facts.Ran`),
   how often it ran and how each death happened, whether the session's state was lost
   (said once per loss) and whether it was retried. The table decides the session's
   lifecycle from it (:attr:`Settled.broken`), not from words;
2. the Executor adds what it alone knows and makes one :class:`CallRecord`: the session
   the call named, what a restore brought back, who stopped the call, whether the call
   log is on (then a lost state's suggestion names the exact ``rebuild_session`` call),
   and how long it took.

:func:`render` is the only producer of a call's result and error dicts, called once, at
the edge (the Executor's public methods). "Why does this result say X?" is answered by
the record and :func:`render`; the sentences themselves are :mod:`coordex.core.messages`.

Pure: no processes, no disk, no clock.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from . import facts
from .coordinates import StateMode
from .errors import CoordexError
from .messages import (
    REBUILD_HINT,
    PlaceKind,
    StoppedBy,
    error_of,
    rebuild_hint,
    session_busy,
)
from .quick import quick_init
from .results import success

# What a read-only call claims when nothing says otherwise (nothing ran: no copy).
_NO_COPY = {"names": True, "objects": True, "files": "none", "copy": "none"}
_OUTPUT = ("stdout", "stderr", "truncated", "result", "exit_code", "images")


@quick_init
@dataclass(frozen=True)
class Settled:
    """What the session table settled for one call in ``mode`` at a ``place``: the last
    attempt's facts, how often the call ran (``hows``: how each death before the last
    attempt happened), whether this result says the session's state was ``lost``, and
    whether it was ``retried``. ``during``: the state went during this run, so the fresh
    process the place puts in at the next call is this loss, not news."""

    ran: facts.Ran
    place: PlaceKind
    mode: StateMode
    timeout: float
    attempts: int = 1
    hows: tuple[str, ...] = ()
    lost: bool = False
    retried: bool = False
    during: bool = False

    def __init__(self, ran: facts.Ran, place: PlaceKind, mode: StateMode, timeout: float,
                 attempts: int = 1, hows: tuple[str, ...] = (), lost: bool = False,
                 retried: bool = False, during: bool = False) -> None:
        # Set once, in one step: the generated frozen __init__ costs a microsecond more
        # on every call (tests/unit/test_record.py holds these to the fields).
        self.__dict__.update(ran=ran, place=place, mode=mode, timeout=timeout,
                             attempts=attempts, hows=hows, lost=lost, retried=retried,
                             during=during)

    @property
    def errored(self) -> bool:
        """The code did not run to its end (the result is an error)."""
        return not isinstance(self.ran.event, (facts.Ok, facts.Exited))

    @property
    def broken(self) -> bool:
        """The session's process went with its state and nothing stands in its place
        yet: the session is ``broken`` until its next call starts a fresh one."""
        return self.lost and self.crashed

    @property
    def crashed(self) -> bool:
        """What ended the call took a process with it (the error is ``crashed``)."""
        event = self.ran.event
        if isinstance(event, (facts.Died, facts.Closed)):
            return True
        if isinstance(event, facts.StartFailed):
            return event.error is None or event.error.error_type == "crashed"
        if isinstance(event, facts.Raised):
            return event.error_type == "crashed"
        return False

    @property
    def rebound(self) -> facts.Rebound:
        """Names the call rebound (a bash copy's: a callable); none for stateless."""
        return self.ran.rebound if self.mode != "stateless" else ()

    @property
    def deleted(self) -> Sequence[str]:
        return self.ran.deleted if self.mode != "stateless" else ()


@quick_init
@dataclass(frozen=True)
class CallRecord:
    """One ``execute_code`` (or stored-function) call as its result tells it.

    Exactly one of ``settled`` (it ran), ``refused`` (coordex refused it before it ran)
    or neither (the session stayed busy for the whole timeout: nothing ran).
    ``session``: the session record the call named (a refused call: the coordinate's,
    used for the rebuild hint only). ``restored``: what a restore of a kept session
    brought back; ``restore_lost``: it was kept, but nothing could be restored.
    ``stopped_by``: a person (the page) or the caller (cancel) stopped it.
    ``log_on``: the call log keeps the calls a ``rebuild_session`` replays, so a result
    that says state was lost names that exact call. ``lost_before``: every session was
    lost before this call ran (a confined host started again after it died, SPEC 9) and
    this is the first result to say it; a result that says ``restored`` says that instead.
    """

    mode: StateMode | None
    session: dict[str, Any] | None
    duration_ms: float
    settled: Settled | None = None
    refused: CoordexError | None = None
    restored: dict[str, Any] | None = None
    restore_lost: bool = False
    stopped_by: StoppedBy | None = None
    log_on: bool = False
    lost_before: bool = False

    def __init__(self, mode: StateMode | None, session: dict[str, Any] | None,
                 duration_ms: float, settled: Settled | None = None,
                 refused: CoordexError | None = None, restored: dict[str, Any] | None = None,
                 restore_lost: bool = False, stopped_by: StoppedBy | None = None,
                 log_on: bool = False, lost_before: bool = False) -> None:
        # As Settled's: set once, in one step.
        self.__dict__.update(mode=mode, session=session, duration_ms=duration_ms,
                             settled=settled, refused=refused, restored=restored,
                             restore_lost=restore_lost, stopped_by=stopped_by, log_on=log_on,
                             lost_before=lost_before)


def render(record: CallRecord) -> dict[str, Any]:
    """The SPEC result or error dict of ``record``: the only place one is made."""
    if record.refused is not None:
        result = record.refused.to_dict()
        if record.lost_before:
            result["state_lost"] = True
        if record.mode is not None:
            result.setdefault("state_mode", record.mode)
        result["duration_ms"] = record.duration_ms
        _hint(result, result.get("session") or record.session, record.log_on)
        return result
    settled = record.settled
    if settled is None:
        result = _busy(record)
    elif settled.errored:
        result = _error(record, settled)
    else:
        result = _success(record, settled)
    _hint(result, record.session, record.log_on)
    return result


def render_error(settled: Settled) -> dict[str, Any]:
    """The error dict alone of a call that did not run to its end (an inspection that
    could not answer), worded as for a call; the generic rebuild hint."""
    error = error_of(settled.ran.event, settled.place, settled.mode, settled.timeout,
                     settled.attempts, settled.hows)
    error.update(stdout=settled.ran.stdout, stderr=settled.ran.stderr, state_lost=settled.lost)
    return error


def stop(cancel: threading.Event, who: StoppedBy) -> None:
    """Stop a call through its ``cancel`` event, saying who did: the fact its record is
    rendered from (:func:`stopped_by`), here or in the host a forwarded call runs in
    (the confined host's ``cancel`` message carries it)."""
    setattr(cancel, _BY, who)
    cancel.set()


def stopped_by(cancel: threading.Event | None) -> StoppedBy | None:
    """Who stopped a call whose ``cancel`` is set: as :func:`stop` said, else its caller
    (a front end's request cancelled); None while it is not set."""
    if cancel is None or not cancel.is_set():
        return None
    who = getattr(cancel, _BY, None)
    return who if who in ("person", "caller") else "caller"


_BY = "_coordex_stopped_by"


def _success(record: CallRecord, settled: Settled) -> dict[str, Any]:
    ran = settled.ran
    event = ran.event
    extra: dict[str, Any] = {}
    if settled.mode == "read_only":
        extra["isolation"] = dict(ran.isolation) if ran.isolation else dict(_NO_COPY)
    elif settled.mode == "stateful" and ran.written:
        extra["written"] = list(ran.written)
    lost = settled.lost or record.restore_lost or (record.lost_before
                                                   and record.restored is None)
    if lost:
        extra["state_lost"] = True
    if settled.retried:
        extra["retried"] = True
    if record.restored is not None:
        extra["restored"] = record.restored
    exit_code = event.status if isinstance(event, facts.Exited) else ran.exit_code
    return success(stdout=ran.stdout, stderr=ran.stderr, truncated=bool(ran.truncated),
                   result=ran.result, exit_code=exit_code, images=list(ran.images),
                   session=record.session or {}, state_mode=settled.mode,
                   duration_ms=record.duration_ms, **extra)


def _error(record: CallRecord, settled: Settled) -> dict[str, Any]:
    ran = settled.ran
    event = ran.event
    hint = rebuild_hint(record.session) if record.log_on and _names_session(
        record.session) else REBUILD_HINT
    result = error_of(event, settled.place, settled.mode, settled.timeout, settled.attempts,
                      settled.hows, hint=hint, stopped=record.stopped_by)
    result.update(stdout=ran.stdout, stderr=ran.stderr,
                  state_lost=settled.lost or record.restore_lost or (
                      record.lost_before and record.restored is None))
    result.setdefault("session", record.session)
    result.setdefault("state_mode", settled.mode)
    if settled.mode == "read_only":
        result.setdefault("isolation", dict(ran.isolation) if ran.isolation else dict(_NO_COPY))
    if settled.retried:
        result.setdefault("retried", True)
    if ran.images and isinstance(event, facts.Raised):
        result.setdefault("images", list(ran.images))
    if record.restored:
        result["restored"] = record.restored
    result["duration_ms"] = record.duration_ms
    return result


def _busy(record: CallRecord) -> dict[str, Any]:
    """The session stayed busy with another call for the whole timeout: nothing ran."""
    result = session_busy(record.stopped_by)
    if record.lost_before:
        result["state_lost"] = True
    result["session"] = record.session
    result["state_mode"] = record.mode
    if record.mode == "read_only":
        result["isolation"] = dict(_NO_COPY)
    result["duration_ms"] = record.duration_ms
    return result


def _names_session(session: dict[str, Any] | None) -> bool:
    return session is not None and (session.get("session_id") is not None
                                    or session.get("session_name") is not None)


def _hint(result: dict[str, Any], session: dict[str, Any] | None, log_on: bool) -> None:
    """Complete a ``crashed`` or ``state_lost`` result's suggestion with the exact
    rebuild call where its own words do not name one yet."""
    if not log_on or not _names_session(session):
        return
    if not (result.get("state_lost") or result.get("error_type") == "crashed"):
        return
    current = result.get("suggestion")
    hint = rebuild_hint(session)
    if not current:
        result["suggestion"] = "The session's earlier state is gone. " + hint
    elif "rebuild_session" not in current:
        result["suggestion"] = f"{current.rstrip()} {hint}"


__all__ = ["CallRecord", "Settled", "StoppedBy", "render", "render_error", "stop", "stopped_by"]
