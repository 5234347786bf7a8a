"""What a place reports about one attempt at a call: facts, never sentences.

Every place (the own interpreter, a worker, a shell, a cluster node) ends a run in one
frozen :class:`Ran`: the output fields and exactly one *event* saying how the run ended.
The session table decides what follows from it (a retry, a loss to report, a broken
session) and :func:`coordex.core.record.render` words it, so the same event reads the
same in every place.

=============  ===========================================================================
event          what happened
=============  ===========================================================================
``Ok``         the code ran to its end (a bash command's own status is ``exit_code``)
``Exited``     the code ended the session's own process with a status (bash ``exit 3``)
``Raised``     the code raised an exception (Python)
``TimedOut``   the code ran past its timeout: interrupted (``survived``), killed, or
               beyond reach (``stuck``); or never taken by a stopped process
``Died``       a process died under the code: the session's (``process``), the
               throwaway copy running it (``copy``), or the cluster node (``node``)
``Closed``     the session or the Executor was closed before or during the call
``StartFailed`` nothing ran: the process, or the read-only copy, could not be started
``Busy``       nothing ran: the place was busy with another call's code
=============  ===========================================================================

Pure: no processes, no disk, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal

from .errors import CoordexError
from .quick import quick_init


@dataclass(frozen=True)
class Ok:
    """The code ran to its end."""


@dataclass(frozen=True)
class Exited:
    """The code ended the session's own process itself (bash ``exit 3``): not a crash,
    but what the session held is gone."""

    status: int


@dataclass(frozen=True)
class Raised:
    """The code raised ``exception``; a coordex error raised inside the code (a stored
    function's ``CallError``) carries its own ``error_type``, words and suggestion."""

    exception: str
    message: str
    traceback: str = ""
    error_type: str | None = None
    error: str | None = None
    suggestion: str | None = None


@dataclass(frozen=True)
class TimedOut:
    """The code ran past its timeout.

    ``survived``: the interrupt stopped it and the process kept its state. ``stuck``: it
    did not stop and its process cannot be killed (the agent's own interpreter).
    ``taken=False``: the process never took the code (stopped or stuck before it) and
    was replaced: the code did not run.
    """

    survived: bool
    stuck: bool = False
    taken: bool = True


@dataclass(frozen=True)
class Died:
    """A process died under the code, ``how`` (``"killed by SIGKILL"``).

    ``what``: ``"process"`` the session's own process (its state is gone), ``"copy"``
    only the throwaway fork or copy running the call, ``"node"`` the cluster node that
    held it. ``taken``: the call had reached what died and may still run there (a lost
    node), so it is never run again. ``started=False``: the process died before it read
    the code, which never ran (it was killed just before the call came).
    """

    what: Literal["process", "copy", "node"]
    how: str
    taken: bool = False
    started: bool = True


@dataclass(frozen=True)
class Closed:
    """The call's session (``by="session"``) or the Executor (``by="executor"``) was
    closed, before the call (``during=False``) or under it. ``detail`` says what may
    still run (code blocked in C in the agent's own process)."""

    by: Literal["session", "executor"]
    during: bool = True
    detail: str = ""


@dataclass(frozen=True)
class StartFailed:
    """Nothing ran: the session's process (``copy=False``) or the read-only copy could
    not be started, ``reason``. ``error``: a refusal already worded by the core (a full
    disk, a cluster without a node that fits), given as it is."""

    reason: str = ""
    copy: bool = False
    error: CoordexError | None = None


@dataclass(frozen=True)
class Busy:
    """Nothing ran: the place was busy. ``stuck``: with code of an earlier call that
    timed out and did not stop (the own interpreter); else with another call."""

    stuck: bool = False


Event = Ok | Exited | Raised | TimedOut | Died | Closed | StartFailed | Busy

OK = Ok()


# The names a call rebound: the names, or - a bash copy's, whose names cost a parse - a
# callable giving (rebound, deleted), asked after the call's row is written, off its path.
Rebound = Sequence[str] | Callable[[], tuple[Sequence[str], Sequence[str]]]


@quick_init
@dataclass(frozen=True)
class Ran:
    """One attempt at a call, as its place saw it.

    ``replaced``: the session's process was found dead and replaced before the code
    ran (whether that is news is the session table's to decide). ``rebound`` /
    ``deleted``: names a Python call changed (a read-only copy: what it would have
    changed); a bash copy gives ``rebound`` as a callable the log's writer calls.
    ``written``: files a read-only copy wrote (for the log). ``isolation``: what held
    for a read-only copy.
    """

    event: Event = OK
    stdout: str = ""
    stderr: str = ""
    truncated: bool = False
    result: Any = None
    exit_code: int | None = None
    images: Sequence[Any] = ()
    replaced: bool = False
    isolation: dict[str, Any] | None = None
    rebound: Rebound = ()
    deleted: Sequence[str] = ()
    written: Sequence[str] | None = None

    def naming(self, rebound: Rebound, deleted: Sequence[str]) -> Ran:
        """This run with the names it changed (a copy: every call of a Python session
        makes one, so it is built directly, not by ``dataclasses.replace``)."""
        return Ran(self.event, self.stdout, self.stderr, self.truncated, self.result,
                   self.exit_code, self.images, self.replaced, self.isolation, rebound,
                   deleted, self.written)

    @property
    def ok(self) -> bool:
        """The code ran to its end (a bash command's status aside)."""
        return isinstance(self.event, Ok)


_EVENTS: dict[str, type[Event]] = {
    kind.__name__: kind for kind in (Ok, Exited, Raised, TimedOut, Died, Closed,
                                     StartFailed, Busy)}


def to_wire(ran: Ran) -> dict[str, Any]:
    """``ran`` as plain JSON values, for a place that answers from another process (a
    cluster node, a node host in a jail). A ``rebound`` callable is asked now."""
    event = {"kind": type(ran.event).__name__, **{
        f.name: getattr(ran.event, f.name) for f in fields(ran.event)}}
    if isinstance(ran.event, StartFailed) and ran.event.error is not None:
        event["error"] = ran.event.error.to_dict()
    wire = {f.name: getattr(ran, f.name) for f in fields(ran) if f.name != "event"}
    if callable(ran.rebound):
        wire["rebound"], wire["deleted"] = ran.rebound()
    wire.update(event=event, images=list(ran.images), rebound=list(wire["rebound"]),
                deleted=list(wire["deleted"]))
    return wire


def from_wire(wire: dict[str, Any]) -> Ran:
    """The :class:`Ran` :func:`to_wire` gave (unknown keys are refused)."""
    values = dict(wire)
    event = dict(values.pop("event"))
    kind = _EVENTS[event.pop("kind")]
    if kind is StartFailed and event.get("error") is not None:
        error = dict(event["error"])
        event["error"] = CoordexError(error.pop("error_type"), error.pop("error"),
                                      error.pop("suggestion"), **error)
    return Ran(kind(**event), **values)


def lost_state(ran: Ran, mode: str) -> bool:
    """Whether the session's own process, and so its state, went during this run of a
    call in ``mode`` (a stateless call has none; a read-only copy's own end is not the
    session's)."""
    event = ran.event
    if mode == "stateless":
        return False
    if isinstance(event, Died):
        return event.what != "copy"
    if isinstance(event, StartFailed):
        return not event.copy
    if isinstance(event, Closed):
        return True
    if mode == "read_only":
        return False
    if isinstance(event, TimedOut):
        return not (event.survived or event.stuck) or not event.taken
    return isinstance(event, Exited)


__all__ = ["OK", "Busy", "Closed", "Died", "Event", "Exited", "Ok", "Raised", "Ran",
           "StartFailed", "TimedOut", "from_wire", "lost_state", "to_wire"]
