"""Calls in flight: what the page shows as running, with their output so far, and the
way a person interrupts one.

Every call the Executor makes is registered here from its start to its end
(:meth:`RunningCalls.start` / :meth:`RunningCalls.finish`, a dict insert and delete).
Its output reaches :meth:`RunningCall.output` through the same ``on_output`` relay a
front end uses; what is kept is bounded (the head and the tail of each stream, as the
log keeps them). A running call has no log row until it ends; when the page asks for
its ``seq`` (:meth:`RunningCalls.running`), a row with no outcome is written for it
(:meth:`~coordex.log.store.CallLog.reserve`) and the call's end completes that row, so
a fast call never pays for two writes.

A front end whose executor runs elsewhere (a confined host's client) tracks the calls
it hands over with :func:`tracked`, on its own side of the pipe.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from ..contract import ExecutorLike
from ..core.errors import CoordexError
from ..core.record import stop

OnOutput = Callable[[str, str], None]
# Characters of each stream a running call keeps: the first and the last this many.
KEEP_CHARS = 8 * 1024
# Seconds past its timeout a detached call a confined host runs stays listed when no
# final result of it passed by (it has surely ended by then).
DETACHED_GRACE = 60.0


class _Stream:
    """One stream's output so far: its head and its tail, bounded."""

    __slots__ = ("dropped", "head", "tail")

    def __init__(self) -> None:
        self.head = ""
        self.tail = ""
        self.dropped = 0

    def add(self, text: str) -> None:
        if len(self.head) < KEEP_CHARS:
            room = KEEP_CHARS - len(self.head)
            self.head += text[:room]
            text = text[room:]
        if text:
            self.tail += text
            if len(self.tail) > 2 * KEEP_CHARS:
                self.dropped += len(self.tail) - KEEP_CHARS
                self.tail = self.tail[-KEEP_CHARS:]

    def text(self) -> str:
        if not self.dropped:
            return self.head + self.tail
        return f"{self.head}\n[... {self.dropped} characters not kept ...]\n{self.tail}"


class RunningCall:
    """One call in flight."""

    def __init__(self, run_id: int, where: dict[str, Any], code: Any,
                 cancel: threading.Event | None, relay: OnOutput | None) -> None:
        self.id = run_id
        self.where = where
        self.code = code if isinstance(code, str) else ""
        self.cancel = cancel
        self.started = time.monotonic()
        self.at = time.time()
        self.seq: int | None = None
        self.interrupted = False
        # The call record of a call given ``wait`` (SPEC 14), for its call_id and
        # whether its client was answered "running".
        self.recorded: Any = None
        self.expires: float | None = None  # a detached forwarded call: listed until then
        self._relay = relay
        self._streams: dict[str, _Stream] = {}
        self._lock = threading.Lock()

    def output(self, stream: str, text: str) -> None:
        """The ``on_output`` this call's code writes through (then the caller's own)."""
        with self._lock:
            kept = self._streams.get(stream)
            if kept is None:
                kept = self._streams[stream] = _Stream()
            kept.add(text)
        if self._relay is not None:
            self._relay(stream, text)

    def progress(self, relay: Callable[[str], None] | None) -> Callable[[str], None]:
        """The ``on_progress`` of this call: an environment build's lines, kept as the
        ``build`` stream (then the caller's own, whose failure never costs the build)."""
        def line(text: str) -> None:
            with self._lock:
                kept = self._streams.get("build")
                if kept is None:
                    kept = self._streams["build"] = _Stream()
                kept.add(text if text.endswith("\n") else text + "\n")
            if relay is not None:
                with contextlib.suppress(Exception):
                    relay(text)

        return line

    def record(self) -> dict[str, Any]:
        with self._lock:
            out = {name: s.text() for name, s in self._streams.items()}
        return {"seq": self.seq, "id": self.id, "at": self.at, **self.where, "code": self.code,
                "elapsed_ms": round((time.monotonic() - self.started) * 1000.0, 1),
                "stdout": out.get("stdout", ""), "stderr": out.get("stderr", ""),
                "build": out.get("build", ""), "interrupted": self.interrupted,
                "interruptible": self.cancel is not None,
                "call_id": getattr(self.recorded, "call_id", None),
                "detached": bool(getattr(self.recorded, "detached", False))}


class RunningCalls:
    """The calls in flight of one executor.

    Args:
        reserve: ``reserve(row) -> seq | None`` writes a running call's row (the
            executor's call log), or None where there is no log.
    """

    def __init__(self, reserve: Callable[[dict[str, Any]], int | None] | None = None) -> None:
        self._reserve = reserve
        self._calls: dict[int, RunningCall] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def start(self, where: dict[str, Any], code: Any, cancel: threading.Event | None,
              relay: OnOutput | None) -> RunningCall:
        call = RunningCall(next(self._ids), where, code, cancel, relay)
        self._calls[call.id] = call
        return call

    def finish(self, call: RunningCall) -> int | None:
        """The call ended; its reserved ``seq``, which its row then completes."""
        with self._lock:  # a page reserving the row right now finishes first
            self._calls.pop(call.id, None)
            return call.seq

    def keep(self, call: RunningCall, call_id: str, executor: ExecutorLike | None,
             expires: float) -> bool:
        """A forwarded call answered ``running``: it stays listed, detached, until
        :meth:`ended` or ``expires`` (monotonic); the page's interrupt cancels it.
        False (not kept) when a call joined to the same ``call_id`` is listed already."""
        with self._lock:
            if any(getattr(c.recorded, "call_id", None) == call_id
                   for c in self._calls.values()):
                return False
        call.recorded = _Detached(call_id)
        call.expires = expires
        if executor is not None and hasattr(executor, "cancel_call"):
            call.cancel = _CancelCall(executor, call_id)
        return True

    def ended(self, call_id: str) -> None:
        """A final result of ``call_id`` passed by."""
        with self._lock:
            for run_id, call in list(self._calls.items()):
                if getattr(call.recorded, "call_id", None) == call_id:
                    del self._calls[run_id]

    def running(self) -> list[dict[str, Any]]:
        """The calls in flight, oldest first, each with a ``seq`` of its own row."""
        now = time.monotonic()
        with self._lock:
            for run_id, call in list(self._calls.items()):
                if call.expires is not None and now > call.expires:
                    del self._calls[run_id]
            calls = sorted(self._calls.values(), key=lambda c: c.id)
            for call in calls:
                if call.seq is None and self._reserve is not None:
                    call.seq = self._reserve({"at": call.at, "kind": "call", **call.where,
                                              "code": call.code})
        return [call.record() for call in calls]

    def find(self, seq: Any = None, run_id: Any = None) -> RunningCall | None:
        for call in list(self._calls.values()):
            if (seq is not None and call.seq == seq) or (run_id is not None and call.id == run_id):
                return call
        return None

    def interrupt(self, seq: Any = None, run_id: Any = None) -> dict[str, Any]:
        """Interrupt a call in flight as its timeout would (state kept; killed only if it
        ignores the interrupt past the grace period). Raises CoordexError."""
        for name, value in (("seq", seq), ("id", run_id)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise CoordexError("validation", f"{name} must be an integer, got {value!r}.",
                                   "Pass the seq of a call that GET running lists.")
        if seq is None and run_id is None:
            raise CoordexError("validation", "interrupt needs the seq of a running call.",
                               "Pass {\"seq\": N} with N from GET running.")
        call = self.find(seq, run_id)
        if call is None:
            shown = ", ".join(str(c.seq if c.seq is not None else f"id {c.id}")
                              for c in list(self._calls.values())) or "none"
            raise CoordexError("not_found", f"No call {seq if seq is not None else run_id} is "
                               "running; it may have ended.",
                               f"Calls running now: {shown}. GET running lists them.")
        if call.cancel is None:
            raise CoordexError("validation", "This call was started without a way to "
                               "interrupt it (no cancel event).",
                               "Wait for its timeout, or close its session.")
        call.interrupted = True
        stop(call.cancel, "person")
        return {"interrupted": True, "seq": call.seq, "id": call.id, "session": call.where}


class _Detached:
    """What a front end knows of a detached call a confined host runs."""

    detached = True

    def __init__(self, call_id: str) -> None:
        self.call_id = call_id


def where(language: Any, venv_id: Any, session_id: Any, session_name: Any,
          state_mode: Any) -> dict[str, Any]:
    return {"language": language, "venv_id": venv_id, "session_id": session_id,
            "session_name": session_name, "state_mode": state_mode}


# Calls a front end hands to an executor that runs elsewhere (a confined host's client),
# tracked on the front end's side, one registry per executor.
_FORWARDED: weakref.WeakKeyDictionary[Any, RunningCalls] = weakref.WeakKeyDictionary()
_FORWARDED_LOCK = threading.Lock()
_UNREFERENCED: dict[int, RunningCalls] = {}


def calls_of(executor: ExecutorLike) -> RunningCalls:
    """The registry of ``executor``'s running calls: its own, or the front end's."""
    own = getattr(executor, "running_calls", None)
    if isinstance(own, RunningCalls):
        return own
    with _FORWARDED_LOCK:
        try:
            found = _FORWARDED.get(executor)
            if found is None:
                found = _FORWARDED[executor] = RunningCalls()
        except TypeError:  # an executor-like object that takes no weak reference
            found = _UNREFERENCED.setdefault(id(executor), RunningCalls())
        return found


class Watch:
    """What :func:`tracked` yields: the ``on_output`` to hand over, and ``done(result)``
    which follows long work (SPEC 14): a call answered ``running`` stays listed,
    detached, until its final result passes by (a ``wait_call``) or its timeout has
    surely passed. A call a person interrupts here is stopped through its cancel event,
    which says so (:func:`~coordex.core.record.stop`): the host words it."""

    def __init__(self, output: OnOutput | None, call: RunningCall | None,
                 registry: RunningCalls | None = None, executor: ExecutorLike | None = None,
                 expires: float = 0.0) -> None:
        self.output = output
        self._call = call
        self._registry = registry
        self._executor = executor
        self._expires = expires
        self.kept = False

    def done(self, result: dict[str, Any]) -> dict[str, Any]:
        if self._registry is not None and isinstance(result, dict) and \
                isinstance(result.get("call_id"), str):
            if result.get("running") and self._call is not None:
                self.kept = self._registry.keep(self._call, result["call_id"], self._executor,
                                                self._expires)
            elif not result.get("running"):
                self._registry.ended(result["call_id"])
        return result


class _CancelCall(threading.Event):
    """The cancel event of a detached call a confined host runs: setting it (the page's
    interrupt) asks the host to ``cancel_call`` it."""

    def __init__(self, executor: ExecutorLike, call_id: str) -> None:
        super().__init__()
        self._executor, self._call_id = executor, call_id

    def set(self) -> None:
        super().set()
        threading.Thread(target=self._executor.cancel_call, args=(self._call_id,),
                         name="coordex-cancel", daemon=True).start()


@contextlib.contextmanager
def tracked(executor: ExecutorLike, tool: str, arguments: Any, on_output: OnOutput | None,
            cancel: threading.Event | None) -> Iterator[Watch]:
    """Track one tool call a front end forwards to ``executor`` (an ``execute_code``
    only; other tools pass through)."""
    if isinstance(getattr(executor, "running_calls", None), RunningCalls):
        yield Watch(on_output, None)
        return
    registry = calls_of(executor)
    if tool in ("wait_call", "cancel_call"):  # a final result ends a detached call's listing
        yield Watch(on_output, None, registry)
        return
    if tool != "execute_code":
        yield Watch(on_output, None)
        return
    args = arguments if isinstance(arguments, dict) else {}
    call = registry.start(where(args.get("language") or "python", args.get("venv_id"),
                                args.get("session_id"), args.get("session_name"),
                                args.get("state_mode") or "stateless"),
                          args.get("code"), cancel, on_output)
    limit = args.get("timeout") or getattr(executor, "timeout", None) or 60.0
    expires = time.monotonic() + (float(limit) if isinstance(limit, int | float) else 60.0) \
        + DETACHED_GRACE
    watch = Watch(call.output, call, registry, executor, expires)
    try:
        yield watch
    finally:
        if not watch.kept:
            registry.finish(call)
