"""The function library on disk: one SQLite table of (name, version) rows under ``root``.

A row is a function held as data: its source text, the environment spec it runs in
(``None`` for the agent's own interpreter) with the spec's normalised text as its
identity, and the docstring and signature shown when listing. Rows are never updated
or deleted, so the history of every name is kept.

Versions: defining a name whose latest row has the same source and the same
(normalised) spec keeps that version; anything else adds ``latest + 1``. The check and
the insert run in one ``BEGIN IMMEDIATE`` transaction, so two processes defining the
same name at once get distinct, consecutive versions. The database runs in WAL mode so
readers in other processes never wait for a writer.

Connections are per process: a read-only call forks the agent's process, and SQLite
connections must not cross a ``fork()``, so a connection opened by another pid is never
used (it is dropped, not closed — closing it would touch the parent's locks).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import storage_error
from ..diskspace import free_bytes
from .errors import CallError

SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS functions (
    name TEXT NOT NULL,
    version INTEGER NOT NULL,
    source TEXT NOT NULL,
    env TEXT,
    env_key TEXT,
    signature TEXT NOT NULL,
    doc TEXT,
    created_at REAL NOT NULL,
    PRIMARY KEY (name, version)
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
_COLUMNS = "name, version, source, env, env_key, signature, doc, created_at"
# Seconds a writer waits for another process's write transaction before failing.
_BUSY_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class FunctionRecord:
    """One stored version of a function.

    Attributes:
        env: the environment spec as the user gave it, or None (own interpreter).
        env_key: the spec's normalised text (its identity), or None.
    """

    name: str
    version: int
    source: str
    env: str | None
    env_key: str | None
    signature: str
    doc: str | None
    created_at: float


class LibraryStore:
    """Thread-safe access to ``library.sqlite3``; safe across processes.

    Args:
        path: the database file; its folder is created if missing.
    """

    def __init__(self, path: Path, *, read_only: bool = False) -> None:
        self.path = Path(path)
        self.read_only = read_only
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._pid = -1
        if read_only:  # a store another process writes (a confined host's, by its owner)
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _storage_failed(exc, self.path) from exc
        with self._connection() as conn:
            conn.executescript(_SCHEMA)
            conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)",
                         (str(SCHEMA_VERSION),))

    # -- connection ---------------------------------------------------------------------

    @contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        if self._pid != os.getpid():
            # In a forked child the parent's lock may be held by a thread that does not
            # exist here; take a fresh one along with a fresh connection.
            self._lock = threading.Lock()
            self._conn = None
        with self._lock:
            try:
                if self._conn is None:
                    self._conn, self._pid = self._open(), os.getpid()
                yield self._conn
            except (sqlite3.Error, OSError) as exc:
                # A full disk, a read-only or damaged file (SPEC 6): the next call starts
                # on a fresh connection, so the library works again once that is fixed.
                if self._conn is not None:
                    with suppress(sqlite3.Error):
                        self._conn.close()
                self._conn = None
                raise _storage_failed(exc, self.path) from exc

    def _open(self) -> sqlite3.Connection:
        if self.read_only:  # and trusting nothing in a file it does not write
            conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True,
                                   timeout=_BUSY_TIMEOUT_S, isolation_level=None,
                                   check_same_thread=False)
            conn.execute("PRAGMA trusted_schema = OFF")
            return conn
        conn = sqlite3.connect(self.path, timeout=_BUSY_TIMEOUT_S,
                               isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None

    # -- writing ------------------------------------------------------------------------

    def define(self, *, name: str, source: str, env: str | None, env_key: str | None,
               signature: str, doc: str | None, now: float) -> tuple[FunctionRecord, bool]:
        """Store a definition. Returns (record, created): created is False when the
        latest version of ``name`` already had this source and environment."""
        with self._connection() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                latest = _one(conn, f"SELECT {_COLUMNS} FROM functions WHERE name = ? "
                                    "ORDER BY version DESC LIMIT 1", (name,))
                if latest is not None and latest.source == source and latest.env_key == env_key:
                    conn.execute("COMMIT")
                    return latest, False
                version = 1 if latest is None else latest.version + 1
                record = FunctionRecord(name, version, source, env, env_key, signature, doc,
                                        now)
                conn.execute(f"INSERT INTO functions ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?)",
                             (name, version, source, env, env_key, signature, doc, now))
                conn.execute("COMMIT")
                return record, True
            except BaseException:
                conn.execute("ROLLBACK")
                raise

    # -- reading ------------------------------------------------------------------------

    def get(self, name: str, version: int | None = None) -> FunctionRecord | None:
        """A version of ``name`` (the latest when ``version`` is None), or None."""
        with self._connection() as conn:
            if version is None:
                return _one(conn, f"SELECT {_COLUMNS} FROM functions WHERE name = ? "
                                  "ORDER BY version DESC LIMIT 1", (name,))
            return _one(conn, f"SELECT {_COLUMNS} FROM functions WHERE name = ? AND "
                              "version = ?", (name, version))

    def versions(self, name: str) -> list[int]:
        with self._connection() as conn:
            rows = conn.execute("SELECT version FROM functions WHERE name = ? "
                                "ORDER BY version", (name,)).fetchall()
        return [int(r[0]) for r in rows]

    def names(self) -> list[str]:
        with self._connection() as conn:
            rows = conn.execute("SELECT DISTINCT name FROM functions ORDER BY name").fetchall()
        return [str(r[0]) for r in rows]

    def latest_all(self) -> list[FunctionRecord]:
        """The latest version of every name, sorted by name."""
        with self._connection() as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM functions AS f WHERE version = "
                "(SELECT MAX(version) FROM functions WHERE name = f.name) ORDER BY name"
            ).fetchall()
        return [_record(r) for r in rows]


def _storage_failed(exc: BaseException, path: Path) -> CallError:
    record = storage_error(exc, path, "function library", free_bytes(path)).to_dict()
    return CallError.from_record(record)


def _one(conn: sqlite3.Connection, sql: str, params: tuple[object, ...]) -> FunctionRecord | None:
    row = conn.execute(sql, params).fetchone()
    return None if row is None else _record(row)


def _record(row: tuple[Any, ...]) -> FunctionRecord:
    name, version, source, env, env_key, signature, doc, created_at = row
    return FunctionRecord(str(name), int(version), str(source), env, env_key, str(signature),
                          doc, float(created_at))
