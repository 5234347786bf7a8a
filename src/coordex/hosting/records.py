"""A confined tenant's records, written by its owner (SPEC 9: "its records are not its
to change").

The call log and the store of stored functions of a confined host live in a folder of
the owner's (``records``), outside every writable folder of the jail: the host sees it
read-only (its ``history``, ``rebuild_session`` and ``functions.list`` read it there) and
asks its owner to write, over the host wire (``record`` / ``record_reply`` lines):

- ``log_append``: one row, answered with its ``seq`` once it is committed (so a row is
  durable before the call's result leaves the host, as in any Executor);
- ``log_update``: columns of a row this host appended in its present life (the row of a
  call in flight, its ``changed`` worked out later), never an older one, and never its
  code, language or mode, which are set once, when the row is appended;
- ``define_function``: one stored function's new version.

The owner knows every call it sent: a row the host appends while an ``execute_code``
call of the owner's is in flight carries that call's code, language and mode as the
owner sent them, whatever the host says. Rows of the host's own doing (a session it
closed) are its word, and the owner marks them so (``said_by: "host"``), whatever the
host sends: ``coordex log``, ``history(seq=)`` and the page show the mark. So a tenant
can neither rewrite nor delete what it did before, nor put code it never sent into a
row of a call it made, nor pass its word off as a call the owner saw.

:class:`OwnerRecords` is the owner's side; :class:`HostRecords` the host's, given to its
Executor (``records=``), which then makes its call log and function store from it.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import itertools
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..library.store import FunctionRecord, LibraryStore, _storage_failed
from ..log.store import (
    CODE_CAP_BYTES,
    COLUMNS,
    LOG_FILE,
    OUTPUT_CAP_BYTES,
    SAID_BY,
    CallLog,
    SQLiteWriter,
)

LIBRARY_FILE = "library.sqlite3"
RECORD_OPS = ("log_append", "log_update", "define_function")
ANSWER_TIMEOUT = 30.0  # seconds the host waits for its owner to write a record
_CALL_FIELDS = ("code", "language", "state_mode")  # what the owner sent, kept true
_LATER = ("changed",)  # what a row may gain after its call returned (worked out later)
LOG_ROOM = 4 << 20  # bytes of free pages each tenant's log keeps (and as much WAL)
MAX_SAID = 16  # rows of the host's own (a session closed) per call of the owner

# The owner's call being served: a context variable, so a call the tools run on a
# thread of their own (a detached call, the MCP tools' default wait) keeps it.
_current: contextvars.ContextVar[Any] = contextvars.ContextVar("coordex_serving_call",
                                                                default=None)


@contextlib.contextmanager
def serving_call(call_id: Any) -> Iterator[None]:
    """Mark the calling context as running the owner's call ``call_id`` (its log row is
    then tied to that call)."""
    token = _current.set(call_id)
    try:
        yield
    finally:
        _current.reset(token)


# ------------------------------------------------------------------------- the owner

class OwnerRecords:
    """The owner's side: the files, and the rules a host's requests must keep.

    Args:
        folder: the tenant's records folder (made if missing, with both files, so the
            host can read them from its first call).
        max_rows: rows the call log keeps.
    """

    def __init__(self, folder: str | os.PathLike[str], max_rows: int = 100_000) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        # Room of its own in the file: another tenant filling the disk costs this one
        # no rows until LOG_ROOM bytes of them are written.
        self._log = SQLiteWriter(self.folder / LOG_FILE, max_rows, room=LOG_ROOM)
        self._library: LibraryStore | None = None
        self._lock = threading.Lock()
        # seqs of the present host's life -> the owner's call the row is tied to, or None
        self._appended: dict[int, Any] = {}
        self._said = 0  # rows the host appended of its own since the owner's last call
        # Sessions whose rows this file refused (a full disk), in this host's life and
        # in the last one: a session the next host restores may then be older than its
        # last results showed, and its ``restored`` says so (never a silent roll-back).
        self._refused: dict[tuple[Any, ...], int] = {}
        self._refused_before: dict[tuple[Any, ...], int] = {}
        with self._lock:
            self._log.connection()
        self._library = LibraryStore(self.folder / LIBRARY_FILE)

    def new_life(self) -> None:
        """A new host: rows of the last one are closed to it."""
        with self._lock:
            self._appended.clear()
            self._said = 0
            for key, count in self._refused.items():
                self._refused_before[key] = self._refused_before.get(key, 0) + count
            self._refused = {}

    def sent_call(self) -> None:
        """The owner sent the host a call: the host may say a few rows of its own again."""
        with self._lock:
            self._said = 0

    def handle(self, op: str, args: Any, call_id: Any = None,
               call: dict[str, Any] | None = None) -> Any:
        """Do one request of the host; ``call`` is the owner's call ``call_id`` in flight
        that the request was made for (its method and arguments), if any. Returns the
        answer's value: a ``seq``, None, a function record, or ``{"error": ...}``."""
        if not isinstance(args, dict):
            return {"error": "arguments must be an object"}
        call = _as_execute_code(call)
        tied = call is not None and call.get("method") == "execute_code"
        try:
            if op == "log_append":
                row = _row(args.get("row"))
                now = time.time()
                if tied:
                    assert call is not None
                    sent = call.get("args") or {}
                    row.update({k: sent.get(k) for k in _CALL_FIELDS if k in sent})
                    started = float(call.get("at") or now)
                    at = row.get("at")
                    row["at"] = min(max(at, started), now) if isinstance(at, float) else now
                else:
                    row["at"] = now  # the host's word, but never back-dated
                # Marked here, never by the host: a row no call of the owner's ties is
                # the host's word, and every reader of the log says so.
                row[SAID_BY] = None if tied else "host"
                with self._lock:
                    if not tied:
                        if self._said >= MAX_SAID:
                            return {"error": f"more than {MAX_SAID} rows of the host's own "
                                    "since the owner's last call"}
                        self._said += 1
                    seq = self._log.append(row)
                    self._appended[seq] = call_id if tied else None
                return seq
            if op == "log_update":
                which = args.get("seq")
                with self._lock:
                    if not isinstance(which, int) or which not in self._appended:
                        return {"error": f"row {which!r} is not one this host wrote"}
                    values = _row(args.get("values"))
                    values.pop("at", None)
                    values.pop(SAID_BY, None)  # set once, by the owner
                    if tied and self._appended[which] in (None, call_id):
                        # The call in flight completes its own row (or one the host
                        # reserved for it): what the owner sent stays as it was sent.
                        assert call is not None
                        sent = call.get("args") or {}
                        values.update({k: sent.get(k) for k in _CALL_FIELDS if k in sent})
                        self._appended[which] = call_id
                    else:  # afterwards, only what is worked out later (a copy's names)
                        values = {k: v for k, v in values.items() if k in _LATER}
                    if values:
                        self._log.update(which, values)
                return None
            if op == "define_function":
                assert self._library is not None
                fields = _row(args, columns=None)
                record, created = self._library.define(
                    name=str(fields["name"]), source=str(fields["source"]),
                    env=fields.get("env"), env_key=fields.get("env_key"),
                    signature=str(fields["signature"]), doc=fields.get("doc"),
                    now=float(fields["now"]))
                return {"record": dataclasses.asdict(record), "created": created}
            return {"error": f"unknown record op {op!r}"}
        except (KeyError, TypeError, ValueError) as exc:
            return {"error": f"{op}: {type(exc).__name__}: {exc}"[:300]}
        except (sqlite3.Error, OSError, Exception) as exc:  # the disk: the host says so
            if op == "log_append" and isinstance(args.get("row"), dict):
                key = _session_key(args["row"])
                if key is not None:
                    with self._lock:
                        self._refused[key] = self._refused.get(key, 0) + 1
            return {"error": f"{op} failed: {type(exc).__name__}: {exc}"[:300],
                    "storage": True}

    def mark_restored(self, value: Any) -> None:
        """A reply of the host's: when it restored a session some of whose rows this
        file refused before the host restarted, its ``restored`` says those calls are
        missing from the log (so the state may be older than their results showed)."""
        if not self._refused_before or not isinstance(value, dict):
            return
        restored, session = value.get("restored"), value.get("session")
        if not isinstance(restored, dict) or not isinstance(session, dict):
            return
        key = _session_key(session)
        with self._lock:
            missing = self._refused_before.pop(key, 0) if key is not None else 0
        if missing:
            restored["missing_rows"] = missing
            why = (f"{missing} call(s) of this session before its host restarted have no "
                   "row in the call log (the disk was full), so their changes may be "
                   "missing from what came back")
            restored["why"] = f"{restored['why']}; {why}" if restored.get("why") else why

    def close(self) -> None:
        with self._lock:
            self._log.close()
            if self._library is not None:
                self._library.close()


def _session_key(row: dict[str, Any]) -> tuple[Any, ...] | None:
    """A stateful session's coordinates as a row or a result's ``session`` names it."""
    if row.get("session_id") is None and row.get("session_name") is None:
        return None
    return (row.get("language"), row.get("venv_id"), row.get("session_name"),
            None if row.get("session_name") else row.get("session_id"))


def _as_execute_code(call: dict[str, Any] | None) -> dict[str, Any] | None:
    """A ``call_tool`` of ``execute_code`` (how the MCP server hands calls over) read as
    the ``execute_code`` call it is: its row then keeps the code the owner sent."""
    if call is None or call.get("method") != "call_tool":
        return call
    args = call.get("args") or {}
    if not isinstance(args, dict) or args.get("name") != "execute_code" \
            or not isinstance(args.get("arguments"), dict):
        return call
    return {**call, "method": "execute_code", "args": args["arguments"]}


def _cut(text: str, limit: int) -> str:
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) <= limit:
        return text
    half = limit // 2 - 64
    return (raw[:half].decode("utf-8", "ignore") + "\n[... cut by the owner ...]\n"
            + raw[-half:].decode("utf-8", "ignore"))


def _row(value: Any, columns: tuple[str, ...] | None = COLUMNS) -> dict[str, Any]:
    """The plain values of ``value``; for a log row (``columns``), of those columns
    only, each string cut to the log's own caps (code 64 KiB, any other text 16 KiB of
    UTF-8): a host cannot make its owner hold or store more than the log keeps of a
    call."""
    if not isinstance(value, dict):
        raise TypeError("expected an object")
    row: dict[str, Any] = {}
    for key, item in value.items():
        if columns is not None and key not in columns:
            continue
        if columns is not None and isinstance(item, str) and len(item) * 4 > OUTPUT_CAP_BYTES:
            item = _cut(item, CODE_CAP_BYTES if key == "code" else OUTPUT_CAP_BYTES)
        if item is None or isinstance(item, (str, int, float, bool)):
            row[str(key)] = item
    return row


# ------------------------------------------------------------------------- the host

class HostRecords:
    """The host's side: sends ``record`` lines with ``send`` and waits for the owner's
    ``record_reply`` (:meth:`answer`); the Executor makes its call log and function
    store from it (``Executor(records=...)``)."""

    def __init__(self, folder: str, send: Callable[[dict[str, Any]], None]) -> None:
        self.folder = Path(folder)
        self._send = send
        self._ids = itertools.count(1)
        self._waiting: dict[int, tuple[threading.Event, list[Any]]] = {}
        self._lock = threading.Lock()
        self._gone = False

    def request(self, op: str, args: dict[str, Any]) -> Any:
        """The owner's answer; raises OSError when it gives none or refuses."""
        ident = next(self._ids)
        done: tuple[threading.Event, list[Any]] = (threading.Event(), [])
        with self._lock:
            if self._gone:
                raise OSError("the owner no longer answers")
            self._waiting[ident] = done
        msg = {"type": "record", "id": ident, "op": op, "args": args}
        call = _current.get()
        if call is not None:
            msg["call"] = call
        try:
            self._send(msg)
            if not done[0].wait(ANSWER_TIMEOUT):
                raise OSError(f"the owner did not answer {op} in {ANSWER_TIMEOUT:.0f} s")
        finally:
            with self._lock:
                self._waiting.pop(ident, None)
        value = done[1][0] if done[1] else None
        if isinstance(value, dict) and "error" in value:
            raise OSError(str(value["error"]))
        return value

    def answer(self, ident: Any, value: Any) -> None:
        with self._lock:
            waiting = self._waiting.get(ident)
        if waiting is not None:
            waiting[1].append(value)
            waiting[0].set()

    def detach(self) -> None:
        """The wire is closing: no answer comes any more."""
        with self._lock:
            self._gone = True
            waiting, self._waiting = list(self._waiting.values()), {}
        for event, _ in waiting:
            event.set()

    # -- what the Executor makes of it

    def call_log(self, max_rows: int) -> CallLog:
        return CallLog(self.folder / LOG_FILE, max_rows, writer=_OwnerWriter(self))

    def library_store(self) -> LibraryStore:
        return _ReadOnlyLibrary(self.folder / LIBRARY_FILE, self)


class _OwnerWriter:
    """A :class:`~coordex.log.store.RowWriter` whose rows the owner writes."""

    def __init__(self, records: HostRecords) -> None:
        self._records = records

    def append(self, row: dict[str, Any]) -> int:
        seq = self._records.request("log_append", {"row": row})
        if not isinstance(seq, int):
            raise OSError(f"the owner answered {seq!r} for a row")
        return seq

    def update(self, seq: int, values: dict[str, Any]) -> None:
        self._records.request("log_update", {"seq": seq, "values": values})

    def close(self) -> None:
        pass


class _ReadOnlyLibrary(LibraryStore):
    """The function store, read where the owner writes it; ``define`` asks the owner."""

    def __init__(self, path: Path, records: HostRecords) -> None:
        super().__init__(path, read_only=True)
        self._records = records

    def define(self, *, name: str, source: str, env: str | None, env_key: str | None,
               signature: str, doc: str | None, now: float) -> tuple[FunctionRecord, bool]:
        try:
            value = self._records.request("define_function", {
                "name": name, "source": source, "env": env, "env_key": env_key,
                "signature": signature, "doc": doc, "now": now})
            return FunctionRecord(**value["record"]), bool(value["created"])
        except (OSError, KeyError, TypeError) as exc:
            raise _storage_failed(OSError(str(exc)), self.path) from exc


__all__ = ["LIBRARY_FILE", "RECORD_OPS", "HostRecords", "OwnerRecords", "serving_call"]
