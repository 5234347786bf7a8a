"""The environment registry: one SQLite table under ``root/environments.sqlite3``.

A row is one environment as the agent knows it: its ``venv_id``, optional ``name``, the
spec text it was first created from, the normalised spec (its identity: UNIQUE, so equal
specs get one id even when two processes create them at once), the ``spec_hash`` of the
folder it is built into, a ``built`` flag and two timestamps. The built folders
themselves live elsewhere (``envs/<hash>``, possibly shared between tenants); this table
only points at them.

Concurrency: WAL journal (readers never block the writer), a generous busy timeout, and
``BEGIN IMMEDIATE`` around read-then-write sequences so two processes cannot both decide
to insert. A connection is opened per operation: cheap next to a build, and safe from
any thread.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import storage_error
from ..diskspace import free_bytes

SCHEMA_VERSION = 1
BUSY_TIMEOUT_S = 30.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS environments (
    venv_id      INTEGER PRIMARY KEY,
    name         TEXT UNIQUE,
    kind         TEXT NOT NULL,
    spec_text    TEXT NOT NULL,
    normalised   TEXT NOT NULL UNIQUE,
    spec_hash    TEXT NOT NULL,
    built        INTEGER NOT NULL DEFAULT 0,
    created_at   REAL NOT NULL,
    last_used_at REAL NOT NULL
)
"""

_COLUMNS = ("venv_id, name, kind, spec_text, normalised, spec_hash, built, created_at, "
            "last_used_at")


@dataclass(frozen=True)
class EnvironmentRecord:
    venv_id: int
    name: str | None
    kind: str
    spec_text: str
    normalised: str
    spec_hash: str
    built: bool
    created_at: float
    last_used_at: float


class NameTaken(Exception):
    """The name already belongs to another environment (the caller words the error)."""

    def __init__(self, record: EnvironmentRecord) -> None:
        super().__init__(record.name)
        self.record = record


class EnvironmentStore:
    """CRUD over the ``environments`` table; every method is one short transaction."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise storage_error(exc, path, "environment registry", free_bytes(path)) from exc
        with self._connect() as db:
            # WAL persists in the file; setting it again is a no-op.
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(_SCHEMA)
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """A connection; a full disk or a read-only or damaged file becomes the
        ``environment`` error that says what to free or fix (SPEC 6)."""
        try:
            db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
            try:
                db.execute("PRAGMA synchronous=NORMAL")  # durable enough in WAL, fewer fsyncs
                yield db
            finally:
                db.close()
        except (sqlite3.Error, OSError) as exc:
            raise storage_error(exc, self.path, "environment registry",
                                free_bytes(self.path)) from exc

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    # -- reads -------------------------------------------------------------------------------

    def get(self, venv_id: int) -> EnvironmentRecord | None:
        with self._connect() as db:
            row = db.execute(f"SELECT {_COLUMNS} FROM environments WHERE venv_id = ?",
                             (venv_id,)).fetchone()
        return None if row is None else _record(row)

    def by_name(self, name: str) -> EnvironmentRecord | None:
        with self._connect() as db:
            row = db.execute(f"SELECT {_COLUMNS} FROM environments WHERE name = ?",
                             (name,)).fetchone()
        return None if row is None else _record(row)

    def all(self) -> list[EnvironmentRecord]:
        with self._connect() as db:
            rows = db.execute(f"SELECT {_COLUMNS} FROM environments ORDER BY venv_id").fetchall()
        return [_record(r) for r in rows]

    # -- writes --------------------------------------------------------------------------------

    def add(self, *, kind: str, spec_text: str, normalised: str, spec_hash: str,
            name: str | None, now: float) -> tuple[EnvironmentRecord, bool]:
        """Insert the spec, or return the row already holding its normalised form.

        Returns (record, created). An existing row keeps its name unless it had none and
        ``name`` is free; the hash is refreshed when the build inputs changed.

        Raises:
            NameTaken: ``name`` belongs to an environment with a different spec.
        """
        with self._transaction() as db:
            row = db.execute(f"SELECT {_COLUMNS} FROM environments WHERE normalised = ?",
                             (normalised,)).fetchone()
            owner = None
            if name is not None:
                found = db.execute(f"SELECT {_COLUMNS} FROM environments WHERE name = ?",
                                   (name,)).fetchone()
                owner = None if found is None else _record(found)
            if row is not None:
                existing = _record(row)
                if name is not None and existing.name is None and owner is None:
                    db.execute("UPDATE environments SET name = ? WHERE venv_id = ?",
                               (name, existing.venv_id))
                if existing.spec_hash != spec_hash:
                    db.execute("UPDATE environments SET spec_hash = ?, built = 0 "
                               "WHERE venv_id = ?", (spec_hash, existing.venv_id))
                fresh = db.execute(f"SELECT {_COLUMNS} FROM environments WHERE venv_id = ?",
                                   (existing.venv_id,)).fetchone()
                return _record(fresh), False
            if owner is not None:
                raise NameTaken(owner)
            cursor = db.execute(
                "INSERT INTO environments (name, kind, spec_text, normalised, spec_hash, "
                "built, created_at, last_used_at) VALUES (?, ?, ?, ?, ?, 0, ?, ?)",
                (name, kind, spec_text, normalised, spec_hash, now, now))
            created = db.execute(f"SELECT {_COLUMNS} FROM environments WHERE venv_id = ?",
                                 (cursor.lastrowid,)).fetchone()
            return _record(created), True

    def mark_built(self, venv_id: int, spec_hash: str, now: float) -> None:
        with self._transaction() as db:
            db.execute("UPDATE environments SET spec_hash = ?, built = 1, last_used_at = ? "
                       "WHERE venv_id = ?", (spec_hash, now, venv_id))

    def set_hash(self, venv_id: int, spec_hash: str) -> None:
        with self._transaction() as db:
            db.execute("UPDATE environments SET spec_hash = ?, built = 0 "
                       "WHERE venv_id = ? AND spec_hash != ?", (spec_hash, venv_id, spec_hash))

    def touch(self, venv_id: int, now: float) -> None:
        with self._connect() as db:
            db.execute("UPDATE environments SET last_used_at = ? WHERE venv_id = ?",
                       (now, venv_id))


def _record(row: Any) -> EnvironmentRecord:
    venv_id, name, kind, spec_text, normalised, spec_hash, built, created, used = row
    return EnvironmentRecord(
        venv_id=int(venv_id), name=None if name is None else str(name), kind=str(kind),
        spec_text=str(spec_text), normalised=str(normalised), spec_hash=str(spec_hash),
        built=bool(built), created_at=float(created), last_used_at=float(used),
    )


__all__ = ["EnvironmentRecord", "EnvironmentStore", "NameTaken"]
