"""Long work (SPEC 14) for one Executor: calls given ``wait``, ``wait_call``,
``cancel_call`` and ``hold_call``, over the call book (:mod:`coordex.log.detached`).

The Executor hands a call here when it was given ``wait``, or when the book is
``active`` (a detached call or a held result exists, which may make the call ``busy``,
joined or redelivered); otherwise the call runs as it is. What this needs of the
Executor is small and passed in: its session table (to tell whether two calls name the
same session, and to describe the session a call asked for), its call log (a finished
call's result after a restart) and its ``check_open``.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .core import coordinates as coords
from .core.coordinates import SessionKey
from .core.errors import CoordexError, validation
from .core.record import CallRecord, render
from .core.results import session_record
from .log.detached import CallBook, Run
from .observe.hook import telling_end

if TYPE_CHECKING:
    from .log import CallLog
    from .sessions import SessionTable

OnOutput = Callable[[str, str], None]


class LongWork:
    """The call records of one Executor and the calls that go through them."""

    def __init__(self, table: SessionTable, call_log: CallLog | None,
                 check_open: Callable[[], None], root: Path | None = None) -> None:
        self._table = table
        self._call_log = call_log
        self._check_open = check_open
        # Held results are kept under the root as well, where the executor keeps a log
        # (a restart within the hold does not lose them).
        self.book = CallBook(self._same_session, self._result_from_log,
                             root if call_log is not None else None)

    @property
    def active(self) -> bool:
        """Whether a call without ``wait`` must come here too (to be checked for
        ``busy``, a join or a redelivery)."""
        return self.book.active

    def mark_busy(self, records: list[dict[str, Any]]) -> None:
        """Mark the listed sessions a detached call holds ``busy``, with its ``call_id``."""
        for place, call_id in self.book.detached_sessions():
            key = self._session_key(place)
            for record in records:
                if key is not None and (record.get("language"), record.get("venv_id"),
                                        record.get("session_id")) == (
                                            key.language, key.venv_id, key.session_id):
                    record["busy"], record["call_id"] = True, call_id

    def run(self, tool: str, asked: dict[str, Any], state_mode: Any, run: Run, wait: Any,
            on_output: OnOutput | None, cancel: threading.Event | None) -> dict[str, Any]:
        """One call through the call book: ``busy``, joined, redelivered or run, and
        waited for at most ``wait`` seconds."""
        started = time.perf_counter()
        try:
            wait = check_wait(wait)
            self._check_open()
        except CoordexError as exc:
            return render(CallRecord(None, None, ms(started), refused=exc))
        place = None if state_mode == "stateless" else {
            "language": asked.get("language") or "python", "venv_id": asked.get("venv_id"),
            "session_id": asked.get("session_id"), "session_name": asked.get("session_name")}
        mode = state_mode if isinstance(state_mode, str) else None
        run = telling_end(run, wait)  # a span for the run of a call answered running
        return self.book.run(tool, asked, place, mode, run, wait, on_output, cancel,
                             functools.partial(self._asked_session, place))

    def wait_call(self, call_id: str, wait: float | None) -> dict[str, Any]:
        try:
            return self.book.wait_call(call_id, check_wait(wait))
        except CoordexError as exc:
            return exc.to_dict()

    def cancel_call(self, call_id: str) -> dict[str, Any]:
        try:
            return self.book.cancel_call(call_id)
        except CoordexError as exc:
            return exc.to_dict()

    def hold_call(self, call_id: str) -> dict[str, Any]:
        return {"held": self.book.hold(call_id), "call_id": call_id}

    # -- what the book asks of the executor ---------------------------------------------

    def _same_session(self, a: dict[str, Any], b: dict[str, Any]) -> bool:
        key_a, key_b = self._session_key(a), self._session_key(b)
        if key_a is not None and key_b is not None:
            return key_a == key_b
        return all(a.get(k) == b.get(k) for k in ("language", "venv_id", "session_id",
                                                    "session_name"))

    def _session_key(self, place: dict[str, Any]) -> SessionKey | None:
        try:
            coordinate = coords.check_coordinate(place.get("language"), "stateful",
                                                 place.get("session_id"),
                                                 place.get("session_name"),
                                                 place.get("venv_id"))
        except CoordexError:
            return None
        with self._table.lock:
            return self._table.registry.find(coordinate)

    def _asked_session(self, place: dict[str, Any] | None) -> dict[str, Any] | None:
        if place is None:
            return None
        key = self._session_key(place)
        if key is not None:
            return self._table.record(key)
        return session_record(place["language"], place.get("venv_id"),
                              place.get("session_id"), place.get("session_name"))

    def _result_from_log(self, call_id: str) -> dict[str, Any] | None:
        """A finished call's result as its log row keeps it (SPEC 14 after a restart)."""
        from .log.calls import result_of_row

        if self._call_log is None:
            return None
        try:
            rows = self._call_log.query(
                "SELECT * FROM calls WHERE call_id = ? ORDER BY seq DESC LIMIT 1", [call_id])
        except Exception:
            return None
        return result_of_row(rows[0]) if rows else None


def check_wait(wait: Any) -> float | None:
    """``wait`` as seconds, or a ``validation`` error naming the fix."""
    if wait is None:
        return None
    if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not wait > 0 \
            or wait != wait:
        raise validation(f"wait must be a number of seconds > 0, got {wait!r:.80}.",
                         "Pass e.g. wait=30, or leave it out to wait for the end.")
    return float(min(wait, 604800.0))


def ms(started: float) -> float:
    """Milliseconds since ``started`` (a ``time.perf_counter()``)."""
    return round((time.perf_counter() - started) * 1000.0, 3)


__all__ = ["LongWork", "check_wait", "ms"]
