"""The call log on disk: one SQLite table under ``root`` that every call adds a row to.

How it works: :meth:`CallLog.record` only appends a tuple to an in-memory queue (a
``deque`` append, well under a microsecond), so logging adds next to nothing to a call.
A background thread wakes every ``flush_interval`` seconds and writes what is queued in
one transaction; :meth:`CallLog.flush` does the same at once, so a reader in this
process (``history``, ``rebuild_session``) always sees every call that returned before
it. A crash of the host loses at most the last interval's rows.

The log is never a cause of a failed call: a database that cannot be opened or written
(a full disk, a read-only or corrupt file) costs the rows of that batch, which are
counted in :attr:`CallLog.dropped` with the reason in :attr:`CallLog.problem`; the next
batch tries again, so the log resumes once the cause is gone.

Several processes may share one root: the database runs in WAL mode, writes are short
``BEGIN IMMEDIATE`` transactions made by the background thread (which may wait for
another writer; a call never does), and ``seq`` is an AUTOINCREMENT key, so rows keep
one order across processes and restarts. Every row names the Executor that wrote it
(``owner``), which is how a rebuild tells this run's sessions from another's.

Bounds: after each batch, rows beyond ``max_rows`` are deleted oldest first. A
read-only call forks the agent's process: a log inherited through ``fork()`` never
writes or reads in the child (SQLite connections must not cross it); a log the child
opens itself works as anywhere.
"""

from __future__ import annotations

import collections
import json
import os
import secrets
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..worker._coordex_engine import escape_text

LOG_FILE = "log.sqlite3"
CODE_CAP_BYTES = 64 * 1024
# A bound on rows waiting for the writer, so a stuck disk cannot grow memory without end.
MAX_PENDING = 50_000
_BUSY_TIMEOUT_MS = 5_000
# Writes close() tries before it gives the last rows up (each waits the busy timeout).
_CLOSE_ATTEMPTS = 3

_SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    owner TEXT NOT NULL,
    kind TEXT NOT NULL,
    language TEXT,
    venv_id INTEGER,
    session_id INTEGER,
    session_name TEXT,
    state_mode TEXT,
    code TEXT,
    code_truncated INTEGER NOT NULL DEFAULT 0,
    duration_ms REAL,
    outcome TEXT,
    exit_code INTEGER,
    state_lost INTEGER NOT NULL DEFAULT 0,
    retried INTEGER NOT NULL DEFAULT 0,
    isolation TEXT,
    changed TEXT,
    replay_of INTEGER
);
CREATE INDEX IF NOT EXISTS calls_by_session ON calls (language, venv_id, session_id);
CREATE INDEX IF NOT EXISTS calls_by_name ON calls (session_name);
"""

# Row kinds: a call ran; a session was closed; a session was started over by a rebuild.

COLUMNS = ("seq", "at", "owner", "kind", "language", "venv_id", "session_id", "session_name",
           "state_mode", "code", "code_truncated", "duration_ms", "outcome", "exit_code",
           "state_lost", "retried", "isolation", "changed", "replay_of")
_INSERT = (f"INSERT INTO calls ({', '.join(COLUMNS[1:])}) "
           f"VALUES ({', '.join('?' * (len(COLUMNS) - 1))})")

# Logs that exist when the process forks belong to the parent: in the child (a read-only
# copy, a multiprocessing worker) they fall silent. Logs the child opens itself work.
_LIVE_LOGS: weakref.WeakSet[CallLog] = weakref.WeakSet()


def _silence_inherited_logs() -> None:
    for log in list(_LIVE_LOGS):
        log.forked = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_silence_inherited_logs)


def cap_code(code: str) -> tuple[str, bool]:
    """``code`` cut to at most 64 KiB of UTF-8, and whether it was cut."""
    if len(code) * 4 <= CODE_CAP_BYTES:  # cheap: no encoding needed for short code
        return code, False
    raw = code.encode("utf-8", "surrogatepass")
    if len(raw) <= CODE_CAP_BYTES:
        return code, False
    return raw[:CODE_CAP_BYTES].decode("utf-8", "ignore"), True


def _busy(exc: BaseException) -> bool:
    """A lock held by another connection (worth retrying), not a broken file."""
    text = str(exc).lower()
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text)


class CallLog:
    """The call log of one Executor (several may share one file).

    Args:
        path: the SQLite file.
        max_rows: rows kept; older ones are deleted after each batch.
        flush_interval: seconds between background writes.
    """

    def __init__(self, path: str | os.PathLike[str], max_rows: int = 100_000,
                 flush_interval: float = 0.2) -> None:
        self.path = Path(path)
        self.max_rows = max_rows
        self.owner = f"{os.getpid()}-{secrets.token_hex(4)}"
        self.dropped = 0
        self.problem: str | None = None
        self._pending: collections.deque[tuple[Any, ...]] = collections.deque(maxlen=MAX_PENDING)
        self._db_lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._stop = threading.Event()
        self._interval = flush_interval
        self.forked = False
        self._thread = threading.Thread(target=self._run, name="coordex-log", daemon=True)
        self._thread.start()
        _LIVE_LOGS.add(self)

    # -- writing ----------------------------------------------------------------------

    def record(self, row: tuple[Any, ...]) -> None:
        """Queue one row: ``(at, kind, language, venv_id, session_id, session_name,
        state_mode, code, duration_ms, outcome, exit_code, state_lost, retried,
        isolation, changed, replay_of)``; the writer serialises and caps it."""
        if not self.forked:
            self._pending.append(row)

    def event(self, kind: str, session: dict[str, Any], detail: Any = None) -> None:
        """Queue a ``close`` or ``rebuild`` row for ``session`` (a SPEC session record);
        ``detail`` is kept in the row's ``changed`` column (a rebuild's planned replays)."""
        self.record((time.time(), kind, session.get("language"), session.get("venv_id"),
                     session.get("session_id"), session.get("session_name"), None, None, None,
                     None, None, False, False, None, detail, None))

    def flush(self) -> None:
        """Write every queued row now. Never raises; failures count in ``dropped``."""
        if self.forked:
            return
        with self._db_lock:
            batch = []
            while self._pending:
                batch.append(self._pending.popleft())
            if batch:
                self._write(batch)

    def _write(self, batch: list[tuple[Any, ...]]) -> None:
        try:
            rows = [self._encode(row) for row in batch]
            conn = self._connect()
            with conn:  # one transaction: rows and pruning together
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany(_INSERT, rows)
                low, high = conn.execute("SELECT MIN(seq), MAX(seq) FROM calls").fetchone()
                # seq is contiguous apart from pruning, so this keeps exactly max_rows.
                if high is not None and high - low + 1 > self.max_rows:
                    conn.execute("DELETE FROM calls WHERE seq <= ?", (high - self.max_rows,))
            self.problem = None
        except (sqlite3.Error, OSError, ValueError) as exc:
            self.problem = f"{type(exc).__name__}: {exc}"
            self._drop_connection()
            if _busy(exc):
                # Another process held the file past the busy timeout: the rows wait for
                # the next batch (the queue stays bounded) instead of being lost.
                self._pending.extendleft(reversed(batch))
                return
            self.dropped += len(batch)

    def _encode(self, row: tuple[Any, ...]) -> tuple[Any, ...]:
        (at, kind, language, venv_id, session_id, session_name, state_mode, code,
         duration_ms, outcome, exit_code, state_lost, retried, isolation, changed,
         replay_of) = row
        truncated = False
        if callable(changed):  # a copy's names, worked out here (note_changes)
            try:
                changed = changed()
            except Exception:  # the log never costs the call, nor the other rows
                changed = None
        if isinstance(code, str):
            code, truncated = cap_code(code)
            code = escape_text(code)
        if isinstance(session_name, str):
            session_name = escape_text(session_name)
        return (at, self.owner, kind, language, venv_id, session_id, session_name, state_mode,
                code, int(truncated), duration_ms, outcome, exit_code, int(bool(state_lost)),
                int(bool(retried)), _json(isolation), _json(changed), replay_of)

    # -- the background writer ----------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            if self._pending:
                self.flush()

    def close(self) -> None:
        """Write what is queued and stop the writer. Safe to call twice."""
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)
        for _ in range(_CLOSE_ATTEMPTS):  # another process may hold the file a while
            self.flush()
            if not self._pending or self.forked:
                break
            time.sleep(0.1)
        with self._db_lock:
            self.dropped += len(self._pending)
            self._pending.clear()
            self._drop_connection()

    # -- connection -------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=_BUSY_TIMEOUT_MS / 1000,
                                   isolation_level=None, check_same_thread=False)
            try:
                conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute("PRAGMA synchronous = NORMAL")
                conn.executescript(_SCHEMA)
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def _drop_connection(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass
            self._conn = None

    # -- reading ------------------------------------------------------------------------

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """Rows of ``SELECT ... FROM calls ...`` as dicts, after a flush. Raises
        ``sqlite3.Error``/``OSError`` when the file cannot be read: callers turn that
        into an error dict."""
        if self.forked:  # the parent's writer may have held the lock when the copy was made
            raise OSError("the call log is not readable from a read-only copy")
        self.flush()
        with self._db_lock:
            conn = self._connect()
            cursor = conn.execute(sql, tuple(params))
            names = [d[0] for d in cursor.description]
            return [dict(zip(names, values, strict=True)) for values in cursor.fetchall()]


class LogReader:
    """Reads a log file that another process may be writing (``coordex log``); offers
    the same ``query`` as :class:`CallLog`. A missing file reads as an empty log."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=5.0)
        try:
            cursor = conn.execute(sql, tuple(params))
            names = [d[0] for d in cursor.description]
            return [dict(zip(names, values, strict=True)) for values in cursor.fetchall()]
        finally:
            conn.close()


def decode_row(row: dict[str, Any]) -> dict[str, Any]:
    """A stored row with its JSON columns and flags back as Python values."""
    out = dict(row)
    for key in ("isolation", "changed"):
        if isinstance(out.get(key), str):
            try:
                out[key] = json.loads(out[key])
            except ValueError:
                out[key] = None
    for key in ("state_lost", "retried", "code_truncated"):
        if key in out:
            out[key] = bool(out[key])
    return out


def _json(value: Any) -> str | None:
    if value is None:
        return None
    try:
        return json.dumps(value, default=str)
    except (TypeError, ValueError):
        return None


def rows_where(filters: Iterable[tuple[str, Any]]) -> tuple[str, list[Any]]:
    """``WHERE`` text and parameters for equality filters; ``None`` values match NULL."""
    clauses, params = [], []
    for column, value in filters:
        if value is None:
            clauses.append(f"{column} IS NULL")
        else:
            clauses.append(f"{column} = ?")
            params.append(value)
    return (" AND ".join(clauses) or "1"), params
