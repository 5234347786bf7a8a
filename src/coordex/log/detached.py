"""Calls that outlive their request (SPEC 14): the call record behind ``wait``,
``wait_call``, ``cancel_call``, ``busy``, joining and redelivery.

A call given ``wait`` is handed to :meth:`CallBook.run`, which runs it on a thread of
its own and waits at most ``wait`` seconds for its end. A call that ends in time returns
its result with its ``call_id``; one that does not returns a ``running`` record and goes
on under its own timeout (``wait`` never interrupts). The record of every such call is
kept here, by ``call_id``:

- ``wait_call`` waits again (bounded the same way) and hands back the very result the
  call returned, ``call_id`` added; ``cancel_call`` sets the call's cancel event (the
  same one a front end sets when its request is cancelled) and returns its end.
- While a detached call (one that returned ``running``) runs in a session, another
  stateful or read-only call to that session is answered ``busy`` at once.
- An identical call (same tool, same arguments but ``wait``) arriving while one runs is
  joined to it: same ``call_id``, no second run.
- A result whose request was lost before it was delivered (:meth:`CallBook.hold`, called
  by a front end whose stream broke) is held :data:`HOLD_SECONDS` for the identical call,
  which gets it with ``"redelivered": true`` instead of running the code again.

Finished records stay in memory :data:`KEEP_SECONDS`; past that, and after a restart,
``wait_call`` reads the result from the call log (the row carries the ``call_id``).
A held result is also written under the root (:class:`~coordex.log.held.HeldResults`),
so the identical call still gets it, once, after a restart.
Calls made without ``wait`` never come here unless a detached call or a held result
exists (then only to be checked for ``busy``, a join or a redelivery).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..core.errors import CoordexError
from .held import HeldResults
from .running import _Stream

# Seconds a result whose request was lost is held for the identical call (SPEC 14).
HOLD_SECONDS = 600.0
# Seconds a finished call's record is kept in memory (SPEC 14: at least an hour; the
# call log keeps it after that).
KEEP_SECONDS = 3600.0
# Finished records kept in memory at most (the oldest go first, to the log alone).
KEEP_CALLS = 500
# Seconds ``cancel_call`` waits for the interrupted call to end (its place's grace to
# interrupt, then kill, is shorter).
CANCEL_WAIT = 30.0

# Tools whose call is one row of the call log: the row carries the call_id.
LOGGED_AS_ONE_ROW = ("execute_code", "call_function")


def fingerprint(tool: str, arguments: dict[str, Any]) -> str:
    """What makes two calls identical: the tool and its arguments, ``wait`` aside."""
    kept = {k: v for k, v in arguments.items() if k != "wait" and v is not None}
    return json.dumps([tool, kept], sort_keys=True, default=repr)


class CallRecord:
    """One call given ``wait``: from its start to at least an hour after its end."""

    def __init__(self, tool: str, key: str, where: dict[str, Any] | None,
                 state_mode: str | None, cancel: threading.Event,
                 relay: Callable[[str, str], None] | None) -> None:
        self.call_id = "c_" + secrets.token_hex(8)
        self.tool = tool
        self.key = key
        self.where = where  # the session's coordinate as asked (None: stateless)
        self.state_mode = state_mode
        self.cancel = cancel
        self.started = time.monotonic()
        self.ended: float | None = None
        self.done = threading.Event()
        self.result: dict[str, Any] | None = None
        self.detached = False  # a ``running`` record of it was handed out
        self.lost = False  # a request of it was lost before its answer was delivered
        self.session: dict[str, Any] | None = None  # filled in by the executor
        # Reads the session's record as the table holds it now (None: stateless).
        self.session_of: Callable[[], dict[str, Any] | None] | None = None
        # The call's own log row carries its call_id (SPEC 14: read back by it after a
        # restart): given to the first call run under this record, and only once.
        self._row_id: str | None = self.call_id if tool in LOGGED_AS_ONE_ROW else None
        self._relay = relay
        self._streams = {"stdout": _Stream(), "stderr": _Stream()}
        self._lock = threading.Lock()

    def take_row_id(self) -> str | None:
        """The ``call_id`` for the log row of the first call run under this record (the
        tool call itself; a stored function's own calls start later)."""
        row_id, self._row_id = self._row_id, None
        return row_id

    def output(self, stream: str, text: str) -> None:
        kept = self._streams.get(stream)
        if kept is not None:
            with self._lock:
                kept.add(text)
        relay = self._relay
        if relay is not None:
            relay(stream, text)

    def detach(self) -> None:
        """Its first request is answered: output no longer goes to that request."""
        self.detached = True
        self._relay = None

    def running(self) -> dict[str, Any]:
        session = self.session
        if self.session_of is not None and (session is None or session.get("session_id") is None):
            # A session the call itself opens has its id once it is open.
            with contextlib.suppress(Exception):
                session = self.session = self.session_of() or session
        with self._lock:
            stdout, stderr = self._streams["stdout"].text(), self._streams["stderr"].text()
        return {"running": True, "call_id": self.call_id,
                "elapsed_ms": round((time.monotonic() - self.started) * 1000.0, 1),
                "stdout": stdout, "stderr": stderr, "session": session,
                "state_mode": self.state_mode or "stateless",
                "suggestion": f"The call goes on under its own timeout. Call wait_call("
                f"call_id={self.call_id!r}) for its result (it waits again, bounded), or "
                f"cancel_call(call_id={self.call_id!r}) to interrupt it. Calls to other "
                "sessions may run meanwhile."}

    def final(self) -> dict[str, Any]:
        assert self.result is not None
        return {**self.result, "call_id": self.call_id}


# A recorded call's body: ``run(on_output, cancel, record)``. ``record`` is the call
# record it runs under (None: a call not given ``wait``, run on its caller's thread), passed
# down its call path: its ``call_id`` goes on the call's log row (:meth:`take_row_id`),
# its ``cancel`` reaches the code, and the calls it makes itself (a rebuild's replays)
# run as they are, not through the book again.
Run = Callable[[Callable[[str, str], None] | None, threading.Event | None, CallRecord | None],
               dict[str, Any]]


class CallBook:
    """The call records of one executor.

    Args:
        same_session: ``same_session(a, b)`` for two ``where`` dicts: whether they name
            the same session (the executor resolves names and ids).
        from_log: ``from_log(call_id)``: a finished call's result as the call log keeps
            it, or None.
        root: where held results are kept on disk as well (None: in memory only).
    """

    def __init__(self, same_session: Callable[[dict[str, Any], dict[str, Any]], bool],
                 from_log: Callable[[str], dict[str, Any] | None] | None = None,
                 root: Path | None = None) -> None:
        self._same_session = same_session
        self._from_log = from_log
        self._lock = threading.Lock()
        self._running: dict[str, CallRecord] = {}
        self._ended: dict[str, CallRecord] = {}  # oldest first
        self._held: dict[str, CallRecord] = {}  # key -> a lost result, for redelivery
        # The held results on disk: those of an earlier life of this root, and ours.
        self._stored = HeldResults(root, HOLD_SECONDS) if root is not None else None
        # True while anything here can change how a call without ``wait`` is answered.
        self.active = self._stored is not None and self._stored.any()

    # -- a call ------------------------------------------------------------------------

    def run(self, tool: str, arguments: dict[str, Any], where: dict[str, Any] | None,
            state_mode: str | None, run: Run, wait: float | None,
            on_output: Callable[[str, str], None] | None,
            cancel: threading.Event | None,
            session_of: Callable[[], dict[str, Any] | None] | None = None) -> dict[str, Any]:
        """One call: busy, joined, redelivered, or run (on a thread of its own when
        ``wait`` is given), then waited for at most ``wait`` seconds."""
        key = fingerprint(tool, arguments)
        record = None
        with self._lock:
            self._prune()
            joined = next((r for r in self._running.values() if r.key == key), None)
            if joined is None:
                held = self._held.pop(key, None)
                stored = self._stored if self._stored is not None and \
                    (held is not None or self._stored.any()) else None
                if held is not None:
                    self._update_active()
                    if stored is not None:
                        stored.drop(key)
                    return {**held.final(), "redelivered": True}
                earlier = stored.take(key) if stored is not None else None
                if earlier is not None:  # held by this root's earlier life
                    self._update_active()
                    return {**earlier, "redelivered": True}
                busy = self._busy_for(where, state_mode)
                if busy is not None:
                    return busy_error(busy)
                if wait is not None:
                    record = CallRecord(tool, key, where, state_mode,
                                        cancel or threading.Event(), on_output)
                    self._running[record.call_id] = record
                    self.active = True
        if joined is not None:
            return self._await(joined, wait, cancel, joiner=True)
        if record is None:  # no wait: runs here, as any call does
            return run(on_output, cancel, None)
        # The call's context goes with it (its trace context: SPEC 16's TRACEPARENT).
        context = contextvars.copy_context()
        thread = threading.Thread(target=context.run, args=(self._body, record, run, session_of),
                                  name=f"coordex-call-{record.call_id}", daemon=True)
        thread.start()
        return self._await(record, wait, None)

    def _body(self, record: CallRecord, run: Run,
              session_of: Callable[[], dict[str, Any] | None] | None) -> None:
        try:
            if session_of is not None:
                record.session_of = session_of
                record.session = session_of()
            result = run(record.output, record.cancel, record)
        except Exception as exc:  # a coordex bug still ends the call with a result
            from ..tools import internal_error

            result = internal_error(exc)
        if isinstance(result.get("session"), dict):
            record.session = result["session"]
        with self._lock:
            record.result = result
            record.ended = time.monotonic()
            self._running.pop(record.call_id, None)
            self._ended[record.call_id] = record
            lost = record.lost
            if lost:
                self._held[record.key] = record
            self._update_active()
        if lost:
            self._store(record)
        record.done.set()

    def _await(self, record: CallRecord, wait: float | None, cancel: threading.Event | None,
               *, joiner: bool = False) -> dict[str, Any]:
        deadline = None if wait is None else time.monotonic() + wait
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if cancel is not None:  # a joiner's own request may be cancelled
                left = 0.1 if left is None else min(left, 0.1)
            if record.done.wait(left if left is None else max(left, 0.0)):
                break
            if (deadline is not None and time.monotonic() >= deadline) or \
                    (joiner and cancel is not None and cancel.is_set()):
                record.detach()
                return record.running()
        final = record.final()
        if joiner and record.lost:
            with self._lock:  # the lost request's result reaches the re-sent one
                if self._held.get(record.key) is record:
                    del self._held[record.key]
                    self._update_active()
            if self._stored is not None:
                self._stored.drop(record.key)
            final["redelivered"] = True
        return final

    # -- wait_call / cancel_call / hold -----------------------------------------------

    def wait_call(self, call_id: Any, wait: float | None) -> dict[str, Any]:
        record = self._find(call_id)
        if record is None:
            found = self._from_log(call_id) if self._from_log is not None else None
            if found is None:
                raise self._not_found(call_id)
            if self._stored is not None:  # fetched by its call_id: not redelivered too
                self._stored.drop_call(call_id)
                with self._lock:
                    self._update_active()
            return {**found, "call_id": call_id}
        self._forget_held(record)
        return self._await(record, wait, None)

    def cancel_call(self, call_id: Any) -> dict[str, Any]:
        record = self._find(call_id)
        if record is None:
            return self.wait_call(call_id, None)  # ended: its result (or not_found)
        record.cancel.set()
        self._forget_held(record)
        return self._await(record, CANCEL_WAIT, None)

    def hold(self, call_id: Any) -> bool:
        """The answer to a request of ``call_id`` was not delivered (its stream broke):
        the call's result is held for the identical call. Returns whether it is."""
        with self._lock:
            record = self._running.get(call_id) or self._ended.get(call_id)
            if record is None:
                return False
            record.lost = True
            done = record.done.is_set()
            if done:
                self._held[record.key] = record
            self.active = True
        if done:
            self._store(record)
        return True

    def _store(self, record: CallRecord) -> None:
        """Keep a held result on disk too (a restart within the hold does not lose it)."""
        if self._stored is None or record.ended is None:
            return
        ended_at = time.time() - (time.monotonic() - record.ended)
        self._stored.put(record.key, record.final(), ended_at)
        with self._lock:
            if self._held.get(record.key) is not record:  # handed out meanwhile
                self._stored.drop(record.key)

    # -- what the rest of the executor sees ---------------------------------------------

    def busy_for(self, where: dict[str, Any] | None, state_mode: str | None) -> dict[str, Any] | None:
        """The ``busy`` error for a call to ``where``, or None."""
        if not self.active:
            return None
        with self._lock:
            record = self._busy_for(where, state_mode)
        return busy_error(record) if record is not None else None

    def detached_sessions(self) -> list[tuple[dict[str, Any], str]]:
        """The sessions detached calls run in, with their ``call_id``."""
        with self._lock:
            return [(r.where, r.call_id) for r in self._running.values()
                    if r.detached and r.where is not None]

    def running_ids(self) -> list[str]:
        with self._lock:
            return list(self._running)

    def detached_ids(self) -> set[str]:
        with self._lock:
            return {r.call_id for r in self._running.values() if r.detached}

    # -- inside --------------------------------------------------------------------------

    def _busy_for(self, where: dict[str, Any] | None,
                  state_mode: str | None) -> CallRecord | None:
        if where is None or state_mode not in ("stateful", "read_only"):
            return None
        for record in self._running.values():
            if record.detached and record.where is not None and \
                    self._same_session(record.where, where):
                return record
        return None

    def _find(self, call_id: Any) -> CallRecord | None:
        if not isinstance(call_id, str):
            raise CoordexError("validation", f"call_id must be text, got {call_id!r:.80}.",
                               "Pass the call_id of a running result, e.g. call_id='c_…'.")
        with self._lock:
            return self._running.get(call_id) or self._ended.get(call_id)

    def _forget_held(self, record: CallRecord) -> None:
        with self._lock:  # fetched by its call_id: nothing left to redeliver
            held = record.lost or self._held.get(record.key) is record
            if self._held.get(record.key) is record:
                del self._held[record.key]
            record.lost = False
            self._update_active()
        if held and self._stored is not None:
            self._stored.drop(record.key)

    def _not_found(self, call_id: str) -> CoordexError:
        running = self.running_ids()
        shown = ", ".join(repr(c) for c in running) or "none"
        return CoordexError(
            "not_found", f"No call {call_id!r} is running or kept; its result may have "
            "expired, or the id is wrong.",
            f"Calls running now: {shown}. Results are kept at least an hour after a call "
            "ends; run the call again if you still need it.")

    def _prune(self) -> None:
        now = time.monotonic()
        while self._ended:
            oldest = next(iter(self._ended.values()))
            if len(self._ended) <= KEEP_CALLS and now - (oldest.ended or now) < KEEP_SECONDS:
                break
            del self._ended[oldest.call_id]
        for key, record in list(self._held.items()):
            if now - (record.ended or now) > HOLD_SECONDS:
                del self._held[key]
        if self._stored is not None:
            self._stored.prune()
        self._update_active()

    def _update_active(self) -> None:
        self.active = bool(self._held) or bool(self._running) or \
            (self._stored is not None and self._stored.any())


def busy_error(record: CallRecord) -> dict[str, Any]:
    from ..core.messages import detached_busy

    return detached_busy(record.call_id)


__all__ = ["CANCEL_WAIT", "HOLD_SECONDS", "KEEP_SECONDS", "CallBook", "CallRecord", "Run",
           "busy_error", "fingerprint"]
