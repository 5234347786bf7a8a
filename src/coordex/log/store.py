"""The call log on disk: one SQLite table under ``root`` that every call adds a row to.

How it works: :meth:`CallLog.record` puts a finished call's row in the log's journal
before the call returns (``journal.py``: one line copied into a file of this log's own,
mapped into memory). Once copied, the line is the kernel's (the page cache): a SIGKILL
or the out-of-memory killer of this process a moment later loses nothing. The log's
own thread moves the journal's rows into the SQLite file within milliseconds, many in
one transaction; whoever reads through this log (``history``, the page, a rebuild) has
them moved first, so a read sees every call that returned; another process sees them
once moved, and a dead process's journal is moved by whoever next reads or opens the
file. SQLite runs in WAL mode with ``synchronous=NORMAL`` (a commit is a ``write()``
into the WAL, no ``fsync``): only a crash of the machine itself can take the last rows
with it. Why a journal: a commit of one small row costs 15-20 us on its own and 50 us
or more of a call's time right after the call, with the caches cold; a journal line
costs a few. Rows that need their ``seq`` at once (:meth:`CallLog.append`: a running
call's reserved row, a session closed or rebuilt) are committed straight to the file,
after the journal's rows, so the order holds. The checkpoints that copy the WAL into
the file (and fsync) run on the log's own thread every few hundred rows, never in a
call.

The writing itself is behind :class:`RowWriter` (``append`` a row and get its ``seq``,
``update`` a row, ``close``): :class:`SQLiteWriter` is the one that writes the file in
this process; a writer that hands rows to another process (an owner outside a jail
that holds the file) offers the same three methods. Rows cross that boundary as plain
dicts of :data:`COLUMNS` values (capped, escaped and JSON-encoded here first).

The log is never a cause of a failed call: a database that cannot be opened or written
(a full disk, a read-only or corrupt file) costs the rows it refused, counted in
:attr:`CallLog.dropped` with the reason in :attr:`CallLog.problem`; the next row tries
again, so the log resumes once the cause is gone. A file another process holds locked
past the busy timeout keeps the rows waiting in the journal (bounded) for the next try.

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
cross it) and the child lets go of its journal at once (so the journal's lock is its
parent's alone); a log the child opens itself works as anywhere.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
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
from .journal import Journal, parse_lines, recover

LOG_FILE = "log.sqlite3"
CODE_CAP_BYTES = 64 * 1024
OUTPUT_CAP_BYTES = 16 * 1024
# A bound on rows waiting for a file another process holds, so memory stays bounded.
MAX_PENDING = 10_000
# Seconds between two tries of a file another process holds past the busy timeout.
RETRY_SECONDS = 0.2
# Seconds the log's thread lets rows gather before it moves them to the file: one
# transaction for many rows, and fewer turns of the log's thread beside the calls.
# While calls come fast (BUSY_ROWS or more a turn) it lets them gather twice as long
# each turn, up to GATHER_MAX_SECONDS: every turn takes the GIL from the calls (on a
# small machine a call in a loop paid ~15 us more at 10 ms turns).
GATHER_SECONDS = 0.01
GATHER_MAX_SECONDS = 0.1
BUSY_ROWS = 20
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
    replay_of INTEGER,
    stdout TEXT, stderr TEXT, result TEXT, error TEXT, suggestion TEXT, traceback TEXT,
    call_id TEXT,
    said_by TEXT
);
DROP INDEX IF EXISTS calls_by_session;
DROP INDEX IF EXISTS calls_by_name;
CREATE TABLE IF NOT EXISTS journals (owner TEXT PRIMARY KEY, upto INTEGER NOT NULL)
    WITHOUT ROWID;
"""
# No index but the seq, and no AUTOINCREMENT: each would add a page to every commit
# (about 7 us each). A new seq is the highest plus one, and the log only ever deletes
# its oldest rows, so seqs never repeat. Reads of one session scan the log from its
# newest end: a few milliseconds for 100,000 rows. ``journals``: how far each log's
# journal is in this file (``journal.py``).
# What a call returned; added to logs written before these columns existed.
_RETURNED = ("stdout", "stderr", "result", "error", "suggestion", "traceback", "call_id")
# Who vouches for a row: NULL, coordex from what it ran; "host", a confined host's own
# word, which no call its owner sent ties (``hosting/records.py``): set by the owner.
SAID_BY = "said_by"
_ADDED = (*_RETURNED, SAID_BY)  # added to logs written before these columns existed

# Row kinds: a call ran; a session was closed; a session was started over by a rebuild.
COLUMNS = ("seq", "at", "owner", "kind", "language", "venv_id", "session_id", "session_name",
           "state_mode", "code", "code_truncated", "duration_ms", "outcome", "exit_code",
           "state_lost", "retried", "isolation", "changed", "replay_of", *_RETURNED,
           SAID_BY)
_WRITTEN = COLUMNS[1:]
# The owner: the journal's own; said_by: only an owner's rows of a host have it, and
# those never pass through a journal (so a journal an older process left still reads).
_JOURNALED = tuple(c for c in _WRITTEN if c not in ("owner", SAID_BY))

# Logs that exist when the process forks belong to the parent: in the child (a read-only
# copy, a multiprocessing worker) they fall silent. Logs the child opens itself work.
_LIVE_LOGS: weakref.WeakSet[CallLog] = weakref.WeakSet()


def _silence_inherited_logs() -> None:
    for log in list(_LIVE_LOGS):
        log.forked = True
        if log._journal is not None:
            log._journal.forget()  # the parent's lock stays the parent's alone


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


def encode_row(values: dict[str, Any], owner: str) -> dict[str, Any]:
    """A row as the file keeps it: texts capped and escaped, flags as 0/1, ``isolation``
    and ``changed`` as JSON, written by ``owner``. Once per row, on its way into the
    file (a second time would encode those two JSON columns again)."""
    row = dict(values)
    row["owner"] = owner
    row.setdefault("kind", "call")
    code = row.get("code")
    if isinstance(code, str):
        code, truncated = cap_code(code)
        row["code"] = escape_text(code)
        row["code_truncated"] = int(truncated or bool(values.get("code_truncated")))
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


def _cut(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with its texts cut to what the file keeps (not yet escaped): a row
    far larger than the file would keep is not written whole to the journal."""
    row = dict(values)
    code = row.get("code")
    if isinstance(code, str):
        row["code"], truncated = cap_code(code)
        row["code_truncated"] = int(truncated)
    for key in _RETURNED:
        if row.get(key) is not None:
            row[key] = cap_output(row[key])
    return row


# Rows between two checkpoints (each a few hundred KiB of WAL at most).
CHECKPOINT_ROWS = 500
# Characters of a row's JSON past which its texts are cut before it goes to the journal
# (a row the file keeps whole is about 160 KiB at most).
_LONG_ROW = 256 * 1024
# What makes one row fail alone (a value SQLite cannot store), not the file.
_ROW_REFUSED = (sqlite3.IntegrityError, sqlite3.InterfaceError, sqlite3.DataError,
                ValueError, OverflowError)
# Rows one INSERT statement writes (23 values each: within SQLite's oldest bound of 999
# values a statement). One statement for many rows is one wait for the GIL for the
# log's thread, not one a row, each of which costs the calls' threads a switch.
_MANY = 32


@functools.lru_cache(maxsize=256)
def _insert_sql(columns: tuple[str, ...], rows: int = 1) -> str:
    """``INSERT`` of ``rows`` rows naming only ``columns`` (the others are NULL)."""
    values = f"({', '.join('?' * len(columns))})"
    return (f"INSERT INTO calls ({', '.join(columns)}) VALUES "
            + ", ".join([values] * rows))


def _bound(row: dict[str, Any]) -> tuple[tuple[str, ...], list[Any]]:
    """The columns of ``row`` to name in an ``INSERT`` and their values: a None is left
    out (its column is NULL all the same) rather than bound, as binding one costs
    sqlite3 a failed adapter lookup (an exception made and dropped) per value."""
    return _bound_values(list(map(row.get, _WRITTEN)))


def _bound_values(values: list[Any]) -> tuple[tuple[str, ...], list[Any]]:
    """:func:`_bound` of a row given as its values in the order of :data:`_WRITTEN`."""
    if None not in values:
        return _WRITTEN, values
    flags = bytes([v is not None for v in values])
    named = _NAMED.get(flags)
    if named is None:
        named = tuple(itertools.compress(_WRITTEN, flags))
        if len(_NAMED) < 1024:  # a handful of shapes in practice
            _NAMED[flags] = named
    if not named:  # nothing but NULLs: refused as before (``at`` is NOT NULL)
        return _WRITTEN[:1], [None]
    return named, list(itertools.compress(values, flags))


# The columns a row names, by which of its values are not None (see ``_bound_values``).
_NAMED: dict[bytes, tuple[str, ...]] = {}
# Where a journal row's values sit (``_JOURNALED`` order), for :func:`_bound_journaled`.
_AT_J = {c: i for i, c in enumerate(_JOURNALED)}
_CODE_J, _TRUNC_J, _NAME_J = _AT_J["code"], _AT_J["code_truncated"], _AT_J["session_name"]
_FLAGS_J = (_AT_J["state_lost"], _AT_J["retried"])
_JSON_J = (_AT_J["isolation"], _AT_J["changed"])
_RETURNED_J = tuple(_AT_J[c] for c in _RETURNED)
_CHANGED_J = _AT_J["changed"]
assert (_JOURNALED[0], "owner", *_JOURNALED[1:], SAID_BY) == _WRITTEN


def _bound_journaled(row: dict[str, Any] | list[Any],
                     owner: str) -> tuple[tuple[str, ...], list[Any]]:
    """``_bound(encode_row(row, owner))`` of a journal's row: a dict, or (the log's
    own lines, read back in a batch) a list of values in the order of
    :data:`_JOURNALED`, encoded in place without a dict (the log's thread does this for
    every call: half the work)."""
    if isinstance(row, dict):
        return _bound(encode_row(row, owner))
    values = row
    code = values[_CODE_J]
    if isinstance(code, str):
        code, truncated = cap_code(code)
        values[_CODE_J] = escape_text(code)
        values[_TRUNC_J] = int(truncated or bool(values[_TRUNC_J]))
    else:
        values[_TRUNC_J] = 0
    name = values[_NAME_J]
    if isinstance(name, str):
        values[_NAME_J] = escape_text(name)
    for at in _FLAGS_J:
        values[at] = int(bool(values[at]))
    for at in _JSON_J:
        values[at] = _json(values[at])
    for at in _RETURNED_J:
        if values[at] is not None:
            values[at] = cap_output(values[at])
    return _bound_values([values[0], owner, *values[1:], None])


def _insert_one(conn: sqlite3.Connection, row: dict[str, Any]) -> int | None:
    columns, values = _bound(row)
    return conn.execute(_insert_sql(columns), values).lastrowid


def _insert_many(conn: sqlite3.Connection,
                 rows: list[tuple[int, tuple[tuple[str, ...], list[Any]]]],
                 seqs: list[int | None]) -> None:
    """Insert ``rows`` (``(index, (columns, values))``: a row's :func:`_bound`) in as
    few statements as their columns allow (rows naming the same columns, one after
    another, share one), setting ``seqs[index]``; a row the file refuses (then one
    statement a row) is left out alone."""
    bound = [row for _, row in rows]
    start = 0
    while start < len(rows):
        columns = bound[start][0]
        end = start + 1
        while end < len(rows) and bound[end][0] == columns:
            end += 1
        try:
            last = conn.execute(_insert_sql(columns, end - start),
                                [v for _, values in bound[start:end] for v in values]).lastrowid
        except _ROW_REFUSED:
            for (index, _), (named, values) in zip(rows[start:end], bound[start:end],
                                                   strict=True):
                with contextlib.suppress(*_ROW_REFUSED):
                    seqs[index] = conn.execute(_insert_sql(named), values).lastrowid
        else:
            assert last is not None
            # One statement's rows take the next seqs in order: each is the highest + 1.
            for seq, (index, _) in enumerate(rows[start:end], start=last - (end - start) + 1):
                seqs[index] = seq
        start = end


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


# Rows between two looks at a file's room (a pragma; the room is made again once the
# disk has space after a full disk used it).
ROOM_CHECK_ROWS = 200


def _is_full(exc: BaseException) -> bool:
    return "full" in str(exc).lower()  # SQLITE_FULL: "database or disk is full"


def keep_room(conn: sqlite3.Connection, room: int) -> None:
    """Keep ``room`` bytes of free pages in the file (and as much WAL, which SQLite
    reuses from its start, never shrinking it while the file is open): rows written
    later fill those pages, so a disk another writer filled does not cost this log its
    rows until they are used up. Never raises (a disk already full: no room made)."""
    with contextlib.suppress(sqlite3.Error, OSError):
        page = conn.execute("PRAGMA page_size").fetchone()[0]
        free = conn.execute("PRAGMA freelist_count").fetchone()[0] * page
        if free >= room // 2:
            return
        conn.execute("CREATE TABLE IF NOT EXISTS room (b BLOB)")
        conn.execute("INSERT INTO room VALUES (zeroblob(?))", (room - free,))
        conn.execute("DELETE FROM room")  # its pages stay in the file, free


class SQLiteWriter:
    """A :class:`RowWriter` over the log file, in this process. Not thread-safe: whoever
    owns it holds a lock around every use.

    ``max_rows``: rows kept (None: no bound, for a reader that recovers a journal).
    ``checkpoints_elsewhere``: the owner runs :meth:`checkpoint` itself, off the path of
    the calls (as :class:`CallLog` does); otherwise SQLite checkpoints as it commits."""

    def __init__(self, path: Path, max_rows: int | None,
                 checkpoints_elsewhere: bool = False, room: int = 0) -> None:
        self.path = path
        self.max_rows = max_rows
        self.checkpoints_elsewhere = checkpoints_elsewhere
        self.room = room  # bytes of free pages kept in the file: rows on a full disk
        self._slack = (max_rows or 0) // 100
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
            seq = _insert_one(conn, row)
        except sqlite3.Error as exc:
            if not _is_full(exc):  # a full disk: the file is whole, and its room is kept
                self.drop()
            raise
        assert seq is not None
        self._wrote(seq, 1)
        if self.room and self.appended % ROOM_CHECK_ROWS == 0:
            keep_room(conn, self.room)
        return seq

    def append_journaled(self, owner: str,
                         rows: Sequence[tuple[int, dict[str, Any] | list[Any]]]
                         ) -> list[int | None]:
        """Insert rows of ``owner``'s journal (``(number, row)``, oldest first, each row
        as the journal holds it: :func:`encode_row` makes it a row of the file) that the
        file does not hold yet, and record the last number, in one transaction. Returns
        each row's seq: None for a row this file refuses alone (a value it cannot
        store) or one it held already. Raises ``sqlite3.Error``/``OSError``, and then
        nothing was written."""
        conn = self.connection()
        seqs: list[int | None] = [None] * len(rows)
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                found = conn.execute("SELECT upto FROM journals WHERE owner = ?",
                                     (owner,)).fetchone()
                upto = found[0] if found else 0
                fresh = [(i, _bound_journaled(row, owner))
                         for i, (number, row) in enumerate(rows) if number > upto]
                for start in range(0, len(fresh), _MANY):
                    _insert_many(conn, fresh[start:start + _MANY], seqs)
                upto = max([upto, *(number for number, _ in rows)])
                conn.execute("INSERT OR REPLACE INTO journals (owner, upto) VALUES (?, ?)",
                             (owner, upto))
                conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise
        except sqlite3.Error:
            self.drop()
            raise
        written = [seq for seq in seqs if seq is not None]
        if written:
            self._wrote(written[-1], len(written))
        return seqs

    def forget_journal(self, owner: str) -> None:
        """``owner``'s journal is gone: drop its mark. Never raises."""
        with contextlib.suppress(sqlite3.Error, OSError):
            self.connection().execute("DELETE FROM journals WHERE owner = ?", (owner,))

    def _wrote(self, last_seq: int, count: int) -> None:
        self.appended += count
        if self.max_rows is not None and \
                last_seq - self.max_rows > self._pruned_to + self._slack:
            self._prune(last_seq)

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
        assert self.max_rows is not None
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
                for column in _ADDED:
                    if column not in have:  # a log written before these columns existed
                        try:
                            conn.execute(f"ALTER TABLE calls ADD COLUMN {column} TEXT")
                        except sqlite3.OperationalError as exc:
                            # Another process opening the same old log added it first.
                            if "duplicate column" not in str(exc):
                                raise
            except BaseException:
                conn.close()
                raise
            if self.room:
                keep_room(conn, self.room)
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


class _Entry:
    """A row handed to the log: its journal line, and its ``seq`` once the SQLite file
    holds it (``done``: written, or given up)."""

    __slots__ = ("done", "line", "seq")

    def __init__(self, line: bytes | None = None, seq: int | None = None) -> None:
        self.line = line  # None: written straight to the file
        self.seq = seq
        self.done = line is None


class CallLog:
    """The call log of one Executor (several may share one file).

    Args:
        path: the SQLite file.
        max_rows: rows kept; older ones are deleted as new ones come.
        writer: where rows go (default: :class:`SQLiteWriter` on ``path``, with a
            journal in front for finished calls); a writer in another process offers the
            same :class:`RowWriter` methods.
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
        # Finished calls' rows in the journal that the file does not hold yet, oldest
        # first. The journal is made on the first such row; there is none when another
        # process writes the rows (its commit is what makes them durable), nor once
        # one could not be made or this log closed: rows then go straight to the file.
        self._journal: Journal | None = None
        self._journaling = writer is None
        self._queue: collections.deque[_Entry] = collections.deque()
        self._queue_lock = threading.Lock()  # the journal's lines, in the queue's order
        # Rows a busy file kept from being written straight, and ``changed`` columns
        # worked out off the call's path (a bash copy's names cost a parse).
        self._pending: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_PENDING)
        self._later: collections.deque[tuple[_Entry, Callable[[], Any]]] = collections.deque()
        self._lock = threading.Lock()  # the writer and the file
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._helper: threading.Thread | None = None
        self._recovered = False
        self._closed = False
        _LIVE_LOGS.add(self)

    # -- writing ----------------------------------------------------------------------

    def record(self, values: dict[str, Any]) -> _Entry | None:
        """Log a finished call's row (a ``call``): durable on return, in the journal
        (or, without one, committed to the file), and in the file a moment later, at
        once for whoever reads through this log. Returns the row's handle for
        :meth:`seq_of`. Never raises: a row that cannot be written is counted in
        ``dropped``."""
        return self._record(list(map(values.get, _JOURNALED)), values)

    def record_values(self, values: list[Any]) -> _Entry | None:
        """:meth:`record` of a row given as its values in the order of
        :data:`_JOURNALED` (as ``record_call`` makes it: no dict on a call's path)."""
        return self._record(values, None)

    def _record(self, values: list[Any], row: dict[str, Any] | None) -> _Entry | None:
        if self.forked:
            return None
        later = values[_CHANGED_J]
        if callable(later):  # worked out later, off the call's path
            values = values.copy()
            values[_CHANGED_J] = None
        else:
            later = None
        entry = self._journaled(values)
        if entry is None:
            if row is None:
                row = dict(zip(_JOURNALED, values, strict=True))
            elif later is not None:
                row = {**row, "changed": None}
            entry = _Entry(seq=self._write_now(self._encode(row), None))
        if later is not None:
            self._defer(entry, later)
        if not self._wake.is_set() and (not entry.done or
                                        self._sqlite.appended >= CHECKPOINT_ROWS):
            self._wake_helper()
        return entry

    def append(self, values: dict[str, Any], seq: int | None = None) -> int | None:
        """Write one row (a ``call``, ``close`` or ``rebuild``) straight to the file and
        return its ``seq``; committed on return (after every row recorded before it).
        With ``seq`` (from :meth:`reserve`), complete that row instead. Never raises: a
        row that cannot be written is counted in ``dropped``."""
        if self.forked:
            return None
        changed = values.get("changed")
        row = self._encode(values)
        if callable(changed):
            row["changed"] = None
        seq = self._write_now(row, seq)
        if callable(changed) and seq is not None:
            self._defer(_Entry(seq=seq), changed)
        elif self._sqlite.appended >= CHECKPOINT_ROWS:
            self._wake_helper()
        return seq

    def seq_of(self, entry: _Entry) -> int | None:
        """The seq of a row :meth:`record` took (written now if it waits); None if it
        could not be written."""
        if not entry.done and not self.forked:
            with self._lock:
                self._write_queued()
        return entry.seq

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

    def _journaled(self, values: list[Any]) -> _Entry | None:
        """A row (its values in the order of :data:`_JOURNALED`) written to the journal
        as it is (only a text far past its cap is cut first) and queued for the file, or
        None where there is no journal (or it failed: the row then goes straight to the
        file)."""
        if not self._journaling:
            return None
        try:
            values_json = _dumps(values)
            if len(values_json) > _LONG_ROW:
                values_json = _dumps(list(map(
                    _cut(dict(zip(_JOURNALED, values, strict=True))).get, _JOURNALED)))
        except (TypeError, ValueError, RecursionError):
            return None  # a value JSON cannot hold: the file's encoding copes
        with self._queue_lock:
            journal = self._journal
            if journal is None and self._journaling:
                journal = self._open_journal()
            if journal is None or len(self._queue) >= MAX_PENDING:
                return None
            try:
                entry = _Entry(journal.write(values_json))
            except OSError as exc:
                self.problem = f"{type(exc).__name__}: {exc}"
                return None
            self._queue.append(entry)
        return entry

    def _open_journal(self) -> Journal | None:
        journal = Journal(self.path, self.owner, _JOURNALED)
        for _ in range(3):  # a reader may take a new file for a dead owner's, once
            try:
                journal.open()
            except OSError as exc:
                self.problem = f"{type(exc).__name__}: {exc}"
                continue
            self._journal = journal
            return journal
        self._journaling = False
        return None

    def _write_now(self, row: dict[str, Any], seq: int | None) -> int | None:
        with self._lock:
            self._write_queued()  # rows recorded before this one come first
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
        return seq

    def _write_queued(self) -> bool:
        """Put the journal's rows in the file, oldest first (the caller holds
        ``_lock``). False while another process holds the file: they wait in the
        journal for the next try."""
        with self._queue_lock:
            batch = list(self._queue)
        if not batch:
            return True
        # This log's own lines: each parses (a None would count as a row refused alone).
        rows = [found or (0, {}) for found in parse_lines([e.line or b"" for e in batch],
                                                          _JOURNALED, as_lists=True)]
        try:
            seqs = self._sqlite.append_journaled(self.owner, rows)
        except (sqlite3.Error, OSError) as exc:
            self.problem = f"{type(exc).__name__}: {exc}"
            if _busy(exc):
                return False
            seqs = [None] * len(batch)  # a broken file: those rows are lost, as they come
        else:
            self.problem = None
        self.dropped += seqs.count(None)
        for entry, seq in zip(batch, seqs, strict=True):
            entry.seq, entry.done = seq, True
        with self._queue_lock:
            for _ in batch:
                self._queue.popleft()  # only this lock's holder takes rows out
            if not self._queue and self._journal is not None and self._journal.restart_due:
                with contextlib.suppress(OSError):
                    self._journal.restart()
        return True

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

    def _recover(self) -> None:
        """Insert what the journals of dead logs sharing this file hold (the caller
        holds ``_lock``)."""
        if self._writer is not self._sqlite:
            return
        with contextlib.suppress(sqlite3.Error, OSError):
            recover(self.path, self._sqlite.append_journaled, self._sqlite.forget_journal)

    def _encode(self, values: dict[str, Any]) -> dict[str, Any]:
        return encode_row(values, self.owner)

    # -- the log's own thread ------------------------------------------------------------

    def _defer(self, entry: _Entry, work: Callable[[], Any]) -> None:
        """Hand ``work`` (a row's ``changed``, worked out) to the log's own thread."""
        with self._queue_lock:
            self._later.append((entry, work))
        self._wake_helper()

    def _wake_helper(self) -> None:
        if self._helper is None:
            with self._queue_lock:
                if self._helper is None and not self._closed:
                    helper = threading.Thread(target=self._run_helper, name="coordex-log",
                                              daemon=True)
                    helper.start()  # close() joins only a started helper
                    self._helper = helper
        self._wake.set()

    def _run_helper(self) -> None:
        """Journal rows into the file, ``changed`` worked out, checkpoints; a file
        another process holds is tried again every :data:`RETRY_SECONDS`."""
        waiting = False
        gather = GATHER_SECONDS
        while True:
            self._wake.wait(RETRY_SECONDS if waiting else None)
            self._closing.wait(gather)  # let rows gather: one transaction for many
            self._wake.clear()
            if self.forked:
                return
            with self._lock:
                if not self._recovered:  # journals of logs that died before this one
                    self._recovered = True
                    self._recover()
                busy = len(self._queue) >= BUSY_ROWS
                waiting = not self._write_queued()
            gather = min(2 * gather, GATHER_MAX_SECONDS) if busy else GATHER_SECONDS
            self._do_later()
            if self._sqlite.appended >= CHECKPOINT_ROWS:
                self._sqlite.appended = 0
                with contextlib.suppress(sqlite3.Error, OSError):
                    self._sqlite.checkpoint()
            if self._closed:
                return

    def _do_later(self) -> None:
        while True:
            with self._queue_lock:
                if not self._later or not self._later[0][0].done:
                    return
                entry, work = self._later.popleft()
            if entry.seq is None:
                continue  # its row was not written
            try:
                changed = work()
            except Exception:  # the log never costs the call, nor the other rows
                continue
            if changed is None or self.forked:
                continue
            with self._lock:
                try:
                    self._writer.update(entry.seq, {"changed": _json(changed)})
                except (sqlite3.Error, OSError, ValueError) as exc:
                    self.problem = f"{type(exc).__name__}: {exc}"

    def flush(self) -> None:
        """Write what waits (journal rows, rows a busy file held back, ``changed``
        worked out later) now, and what the journals of dead logs sharing this file
        hold. Never raises."""
        if self.forked:
            return
        with self._lock:
            self._recover()
            self._write_queued()
            self._retry_pending()
        self._do_later()

    def close(self) -> None:
        """Write what waits and close the file. Safe to call twice. Rows another
        process kept the file from taking stay in the journal, for the next reader."""
        if self.forked:
            return
        with self._queue_lock:  # no helper starts after this
            self._closed = True
            helper = self._helper
        self._closing.set()
        self._wake.set()
        if helper is not None and helper is not threading.current_thread():
            helper.join(timeout=5)
        for _ in range(3):  # another process may hold the file a while
            self.flush()
            if not self._pending and not self._queue:
                break
            time.sleep(0.1)
        with self._lock:
            self.dropped += len(self._pending)
            self._pending.clear()
            with self._queue_lock:
                journal, self._journal, self._journaling = self._journal, None, False
                done = not self._queue
            if journal is not None:
                journal.close(remove=done)
                if done:
                    self._sqlite.forget_journal(self.owner)
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
    and trusts nothing in it (no triggers or views of its schema run); only the
    journals of dead writers, if any, are written into it first (:meth:`recover`)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def recover(self) -> None:
        """Insert the rows of journals whose writer died (a process killed after its
        calls returned) into the file, where the file can be written. Never raises."""
        writer = SQLiteWriter(self.path, None)
        try:
            recover(self.path, writer.append_journaled, writer.forget_journal)
        except (sqlite3.Error, OSError):
            pass  # a file this process cannot write: it reads what the file holds
        finally:
            writer.close()

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        self.recover()
        if not self.path.exists():
            return []
        conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=5.0)
        try:
            conn.execute("PRAGMA trusted_schema = OFF")
            have = {r[1] for r in conn.execute("PRAGMA table_info(calls)")}
            missing = [c for c in _ADDED if c not in have]
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
        return _dumps(value)
    except (TypeError, ValueError, RecursionError):
        return None


def _json_encoder() -> Callable[[Any], str]:
    """``json.dumps(value, default=str)`` without making an encoder on every call (a
    call's row is encoded three times: about 3 us of a call): the C encoder that
    ``json.dumps`` itself uses, made once (a circular value raises RecursionError);
    ``json.dumps`` itself where there is no such encoder or it says otherwise."""
    def dumps(value: Any) -> str:
        return json.dumps(value, default=str)

    make = getattr(json.encoder, "c_make_encoder", None)
    escape = getattr(json.encoder, "c_encode_basestring_ascii", None)
    if make is None or escape is None:
        return dumps
    try:
        encoder = make(None, str, escape, None, ": ", ", ", False, False, True)

        def made_once(value: Any) -> str:
            return "".join(encoder(value, 0))

        sample = [1.5, "caf\u00e9\n\udcff\"", None, {"a": [True, 2]}, float("nan"), object]
        if made_once(sample) != dumps(sample):
            return dumps
    except Exception:  # an interpreter whose encoder takes other arguments
        return dumps
    return made_once


_dumps = _json_encoder()


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
