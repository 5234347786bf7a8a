"""The call log on disk: one SQLite table under ``root`` that every call adds a row to.

How it works: :meth:`CallLog.append` writes a call's row and commits it before the call
returns (SQLite in WAL mode with ``synchronous=NORMAL``: a commit is a ``write()`` of
the new pages into the WAL file, no ``fsync``). Once ``write()`` returned, the row is
the kernel's: a SIGKILL or the out-of-memory killer of this process a moment later
loses nothing; only a crash of the machine itself can take the last commits with it.
One commit of a small row costs 15-20 us on its own (30 us or so right after a call,
with the caches cold); the checkpoints that copy the WAL into the file (and fsync) run
on the log's own thread every few hundred rows, never in a call.

The writing itself is behind :class:`RowWriter` (``append`` a row and get its ``seq``,
``update`` a row, ``close``): :class:`SQLiteWriter` is the one that writes the file in
this process; a writer that hands rows to another process (an owner outside a jail
that holds the file) offers the same three methods. Rows cross that boundary as plain
dicts of :data:`COLUMNS` values (capped, escaped and JSON-encoded here first).

The log is never a cause of a failed call: a database that cannot be opened or written
(a full disk, a read-only or corrupt file) costs that row, counted in
:attr:`CallLog.dropped` with the reason in :attr:`CallLog.problem`; the next row tries
again, so the log resumes once the cause is gone. A file another process holds locked
past the busy timeout keeps the row waiting (bounded) for the next write.

Several processes may share one root: WAL lets readers run beside the one writer,
``seq`` only grows (a new row's is the highest plus one, and only the oldest rows are
ever deleted), so rows keep one order across processes and restarts,
and every row names the Executor that wrote it (``owner``), which is how a rebuild
tells this run's sessions from another's.

A call still running has no row; when a page asks for its ``seq`` (to show or
interrupt it) :meth:`CallLog.reserve` writes a row with no outcome yet, which the call's
end completes. A row that keeps no outcome is a call that was in flight when its
process died.

Bounds: rows beyond ``max_rows`` (plus 1%, so not every call pays for a delete) are
deleted oldest first. A read-only call forks the agent's process: a log inherited
through ``fork()`` never writes or reads in the child (SQLite connections must not
cross it); a log the child opens itself works as anywhere.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import secrets
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

from ..worker._coordex_engine import escape_text

LOG_FILE = "log.sqlite3"
CODE_CAP_BYTES = 64 * 1024
OUTPUT_CAP_BYTES = 16 * 1024
# A bound on rows waiting for a file another process holds, so memory stays bounded.
MAX_PENDING = 10_000
_BUSY_TIMEOUT_MS = 2_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (
    seq INTEGER PRIMARY KEY,
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
DROP INDEX IF EXISTS calls_by_session;
DROP INDEX IF EXISTS calls_by_name;
"""
# No index but the seq, and no AUTOINCREMENT: each would add a page to every commit
# (about 7 us each). A new seq is the highest plus one, and the log only ever deletes
# its oldest rows, so seqs never repeat. Reads of one session scan the log from its
# newest end: a few milliseconds for 100,000 rows.
# What a call returned; added to logs written before these columns existed.
_RETURNED = ("stdout", "stderr", "result", "error", "suggestion", "traceback")

# Row kinds: a call ran; a session was closed; a session was started over by a rebuild.
COLUMNS = ("seq", "at", "owner", "kind", "language", "venv_id", "session_id", "session_name",
           "state_mode", "code", "code_truncated", "duration_ms", "outcome", "exit_code",
           "state_lost", "retried", "isolation", "changed", "replay_of", *_RETURNED)
_WRITTEN = COLUMNS[1:]
_INSERT = (f"INSERT INTO calls ({', '.join(_WRITTEN)}) "
           f"VALUES ({', '.join('?' * len(_WRITTEN))})")

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


def cap_output(text: Any) -> str | None:
    """Text kept of one stream, result or message: at most 16 KiB of UTF-8, the head
    and the tail with a line between them saying how much was left out."""
    if not isinstance(text, str):
        return None if text is None else cap_output(str(text))
    if len(text) * 4 <= OUTPUT_CAP_BYTES:
        return escape_text(text)
    raw = escape_text(text).encode("utf-8")
    if len(raw) <= OUTPUT_CAP_BYTES:
        return raw.decode("utf-8")
    half = OUTPUT_CAP_BYTES // 2 - 64
    cut = len(raw) - 2 * half
    return (raw[:half].decode("utf-8", "ignore") + f"\n[... {cut} bytes left out of the log ...]\n"
            + raw[-half:].decode("utf-8", "ignore"))


# Rows between two checkpoints (each a few hundred KiB of WAL at most).
CHECKPOINT_ROWS = 500


def _busy(exc: BaseException) -> bool:
    """A lock held by another connection (worth retrying), not a broken file."""
    text = str(exc).lower()
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text)


class RowWriter(Protocol):
    """Where rows go: the file in this process, or an owner that holds it elsewhere.

    ``append`` returns once the row is durable (committed), with its ``seq``; ``update``
    changes columns of a row this writer appended. Both raise ``sqlite3.Error`` or
    ``OSError`` when the row could not be written. Rows are dicts of :data:`COLUMNS`
    (``seq`` left out) holding plain values only.
    """

    def append(self, row: dict[str, Any]) -> int: ...

    def update(self, seq: int, values: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class SQLiteWriter:
    """A :class:`RowWriter` over the log file, in this process. Not thread-safe: whoever
    owns it holds a lock around every use.

    ``checkpoints_elsewhere``: the owner runs :meth:`checkpoint` itself, off the path of
    the calls (as :class:`CallLog` does); otherwise SQLite checkpoints as it commits."""

    def __init__(self, path: Path, max_rows: int, checkpoints_elsewhere: bool = False) -> None:
        self.path = path
        self.max_rows = max_rows
        self.checkpoints_elsewhere = checkpoints_elsewhere
        self._slack = max_rows // 100
        self._pruned_to = 0
        self._conn: sqlite3.Connection | None = None
        self.appended = 0  # rows written since the last checkpoint was asked for

    def checkpoint(self) -> None:
        """Copy the WAL's pages into the file, on a connection of its own (a passive
        checkpoint: writers and readers go on meanwhile). Raises ``sqlite3.Error``."""
        conn = sqlite3.connect(self.path, timeout=_BUSY_TIMEOUT_MS / 1000)
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        finally:
            conn.close()

    def append(self, row: dict[str, Any]) -> int:
        conn = self.connection()
        try:
            seq = conn.execute(_INSERT, [row.get(c) for c in _WRITTEN]).lastrowid
        except sqlite3.Error:
            self.drop()
            raise
        assert seq is not None
        if seq - self.max_rows > self._pruned_to + self._slack:
            self._prune(seq)
        self.appended += 1
        return seq

    def update(self, seq: int, values: dict[str, Any]) -> None:
        columns = [c for c in values if c in _WRITTEN]
        if not columns:
            return
        conn = self.connection()
        try:
            conn.execute(f"UPDATE calls SET {', '.join(c + ' = ?' for c in columns)} "
                         "WHERE seq = ?", [*(values[c] for c in columns), seq])
        except sqlite3.Error:
            self.drop()
            raise

    def _prune(self, seq: int) -> None:
        # seq is contiguous apart from pruning, so this keeps exactly max_rows.
        self._pruned_to = seq - self.max_rows
        with contextlib.suppress(sqlite3.Error, OSError):
            self.connection().execute("DELETE FROM calls WHERE seq <= ?", (self._pruned_to,))

    def connection(self) -> sqlite3.Connection:
        if self._conn is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=_BUSY_TIMEOUT_MS / 1000,
                                   isolation_level=None, check_same_thread=False)
            try:
                conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
                conn.execute("PRAGMA page_size = 1024")  # a new file's: less per commit
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute("PRAGMA synchronous = NORMAL")
                if self.checkpoints_elsewhere:  # (they fsync) not in a call
                    conn.execute("PRAGMA wal_autocheckpoint = 0")
                conn.executescript(_SCHEMA)
                have = {r[1] for r in conn.execute("PRAGMA table_info(calls)")}
                for column in _RETURNED:
                    if column not in have:  # a log written before these columns existed
                        conn.execute(f"ALTER TABLE calls ADD COLUMN {column} TEXT")
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def drop(self) -> None:
        """Forget the connection (a broken file is opened afresh next time)."""
        if self._conn is not None:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass
            self._conn = None

    def close(self) -> None:
        if self._conn is not None and self.max_rows:
            with contextlib.suppress(sqlite3.Error, OSError):
                high = self._conn.execute("SELECT MAX(seq) FROM calls").fetchone()[0]
                if high is not None:
                    self._conn.execute("DELETE FROM calls WHERE seq <= ?",
                                       (high - self.max_rows,))
        self.drop()


class CallLog:
    """The call log of one Executor (several may share one file).

    Args:
        path: the SQLite file.
        max_rows: rows kept; older ones are deleted as new ones come.
        writer: where rows go (default: :class:`SQLiteWriter` on ``path``); a writer in
            another process offers the same :class:`RowWriter` methods.
    """

    def __init__(self, path: str | os.PathLike[str], max_rows: int = 100_000,
                 writer: RowWriter | None = None) -> None:
        self.path = Path(path)
        self.max_rows = max_rows
        self.owner = f"{os.getpid()}-{secrets.token_hex(4)}"
        self.dropped = 0
        self.problem: str | None = None
        self.forked = False
        self._sqlite = SQLiteWriter(self.path, max_rows, checkpoints_elsewhere=True)
        self._writer: RowWriter = writer if writer is not None else self._sqlite
        # Rows a busy file kept from being written, and ``changed`` columns worked out
        # off the call's path (a bash copy's names cost a parse).
        self._pending: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_PENDING)
        self._later: collections.deque[tuple[int, Callable[[], Any] | None]] = \
            collections.deque()
        self._lock = threading.Lock()
        self._later_ready = threading.Event()
        self._helper: threading.Thread | None = None
        self._closed = False
        _LIVE_LOGS.add(self)

    # -- writing ----------------------------------------------------------------------

    def append(self, values: dict[str, Any], seq: int | None = None) -> int | None:
        """Write one row (a ``call``, ``close`` or ``rebuild``) and return its ``seq``;
        durable on return. With ``seq`` (from :meth:`reserve`), complete that row
        instead. Never raises: a row that cannot be written is counted in ``dropped``."""
        if self.forked:
            return None
        changed = values.get("changed")
        row = self._encode(values)
        if callable(changed):  # worked out later, off the call's path
            row["changed"] = None
        with self._lock:
            if self._pending:
                self._retry_pending()
            try:
                if seq is None:
                    seq = self._writer.append(row)
                else:
                    self._writer.update(seq, row)
                self.problem = None
            except (sqlite3.Error, OSError, ValueError) as exc:
                self._failed(exc, row if seq is None else None)
                return None
        if callable(changed):
            self._defer(seq, changed)
        elif self._sqlite.appended >= CHECKPOINT_ROWS:
            self._sqlite.appended = 0
            self._defer(seq, None)
        return seq

    def reserve(self, values: dict[str, Any]) -> int | None:
        """Write the row of a call still running (no outcome yet) and return its seq."""
        return self.append({**values, "outcome": None})

    def event(self, kind: str, session: dict[str, Any], detail: Any = None) -> int | None:
        """Write a ``close`` or ``rebuild`` row for ``session`` (a SPEC session record);
        ``detail`` is kept in the row's ``changed`` column (a rebuild's planned replays)."""
        return self.append({"at": time.time(), "kind": kind, "language": session.get("language"),
                            "venv_id": session.get("venv_id"),
                            "session_id": session.get("session_id"),
                            "session_name": session.get("session_name"), "changed": detail})

    def _failed(self, exc: BaseException, row: dict[str, Any] | None) -> None:
        self.problem = f"{type(exc).__name__}: {exc}"
        if _busy(exc) and row is not None:
            self._pending.append(row)  # another process held the file: the next write
            return
        self.dropped += 1

    def _retry_pending(self) -> None:
        while self._pending:
            try:
                self._writer.append(self._pending[0])
            except (sqlite3.Error, OSError, ValueError) as exc:
                self.problem = f"{type(exc).__name__}: {exc}"
                if not _busy(exc):
                    self.dropped += len(self._pending)
                    self._pending.clear()
                return
            self._pending.popleft()

    def _encode(self, values: dict[str, Any]) -> dict[str, Any]:
        row = dict(values)
        row["owner"] = self.owner
        row.setdefault("kind", "call")
        code = row.get("code")
        if isinstance(code, str):
            code, truncated = cap_code(code)
            row["code"], row["code_truncated"] = escape_text(code), int(truncated)
        else:
            row["code_truncated"] = 0
        name = row.get("session_name")
        if isinstance(name, str):
            row["session_name"] = escape_text(name)
        row["state_lost"] = int(bool(row.get("state_lost")))
        row["retried"] = int(bool(row.get("retried")))
        for key in ("isolation", "changed"):
            if key in row:
                row[key] = _json(row[key])
        for key in _RETURNED:
            if row.get(key) is not None:
                row[key] = cap_output(row[key])
        return row

    # -- what is worked out later -------------------------------------------------------

    def _defer(self, seq: int | None, work: Callable[[], Any] | None) -> None:
        """Hand ``work`` (a row's ``changed``, worked out) or a checkpoint (``None``) to
        the log's own thread."""
        if seq is None:
            return
        with self._lock:
            self._later.append((seq, work))
            if self._helper is None and not self._closed:
                self._helper = threading.Thread(target=self._run_later, name="coordex-log",
                                                daemon=True)
                self._helper.start()
        self._later_ready.set()

    def _run_later(self) -> None:
        while True:
            self._later_ready.wait()
            self._later_ready.clear()
            self._do_later()
            if self._closed:
                return

    def _do_later(self) -> None:
        while True:
            with self._lock:
                if not self._later:
                    return
                seq, work = self._later.popleft()
            if work is None:
                with contextlib.suppress(sqlite3.Error, OSError):
                    self._sqlite.checkpoint()
                continue
            try:
                changed = work()
            except Exception:  # the log never costs the call, nor the other rows
                continue
            if changed is None or self.forked:
                continue
            with self._lock:
                try:
                    self._writer.update(seq, {"changed": _json(changed)})
                except (sqlite3.Error, OSError, ValueError) as exc:
                    self.problem = f"{type(exc).__name__}: {exc}"

    def flush(self) -> None:
        """Write what waits (rows a busy file held back, ``changed`` worked out later)
        now. Never raises."""
        if self.forked:
            return
        with self._lock:
            self._retry_pending()
        self._do_later()

    def close(self) -> None:
        """Write what waits and close the file. Safe to call twice."""
        if self.forked:
            return
        self._closed = True
        self._later_ready.set()
        helper = self._helper
        if helper is not None and helper is not threading.current_thread():
            helper.join(timeout=5)
        for _ in range(3):  # another process may hold the file a while
            self.flush()
            if not self._pending:
                break
            time.sleep(0.1)
        with self._lock:
            self.dropped += len(self._pending)
            self._pending.clear()
            self._writer.close()
            if self._writer is not self._sqlite:
                self._sqlite.close()

    # -- reading ------------------------------------------------------------------------

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """Rows of ``SELECT ... FROM calls ...`` as dicts, after a flush. Raises
        ``sqlite3.Error``/``OSError`` when the file cannot be read: callers turn that
        into an error dict."""
        if self.forked:  # the parent's writer may have held the lock when the copy was made
            raise OSError("the call log is not readable from a read-only copy")
        self.flush()
        if self._writer is not self._sqlite:  # written elsewhere: read it read-only here
            return LogReader(self.path).query(sql, params)
        with self._lock:
            try:
                cursor = self._sqlite.connection().execute(sql, tuple(params))
                names = [d[0] for d in cursor.description]
                return [dict(zip(names, values, strict=True)) for values in cursor.fetchall()]
            except sqlite3.Error:
                self._sqlite.drop()
                raise


class LogReader:
    """Reads a log file that another process may be writing (``coordex log``, a page
    of a log this process does not write); offers the same ``query`` as
    :class:`CallLog`. A missing file reads as an empty log. It opens the file read-only
    and trusts nothing in it (no triggers or views of its schema run)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=5.0)
        try:
            conn.execute("PRAGMA trusted_schema = OFF")
            have = {r[1] for r in conn.execute("PRAGMA table_info(calls)")}
            missing = [c for c in _RETURNED if c not in have]
            if missing:  # a log written before these columns existed reads them as NULL
                sql = sql.replace("FROM calls", "FROM (SELECT *, " + ", ".join(
                    f"NULL AS {c}" for c in missing) + " FROM calls)", 1)
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
