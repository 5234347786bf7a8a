"""Where snapshots live: one folder per kept session under ``root/snapshots``.

A session is named on disk by what names it for a caller: (language, environment, name)
for a named session, (language, environment, id) otherwise, so a snapshot is only ever
restored into the session that wrote it. Each folder holds ``meta.json`` and the data
file it names (:mod:`coordex.worker._coordex_snapshot` writes both, atomically); a
folder whose meta names no file is a *marker*: the session is kept by replaying its
logged calls alone (none was written yet, it was too large, or it failed).

``kept.json`` repeats what names the session and where its calls are in the log (its
identity, ``since``, ``owners``, ``aliases``), written only when those change: a
``meta.json`` that is lost or damaged then costs the snapshot, never the session - it
comes back by replay, and says why (:meth:`SnapshotStore.meta`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..worker import _coordex_snapshot as snap

FOLDER = "snapshots"
LOCK = "lock"
KEPT = "kept.json"
# What kept.json holds: what a replay of the whole life needs.
_KEPT_FIELDS = ("language", "venv_id", "session_id", "session_name", "since", "owners",
                "aliases")


@dataclass(frozen=True)
class Identity:
    """What names a kept session: its coordinates and its id."""

    language: str
    venv_id: int | None
    session_id: int
    session_name: str | None

    @classmethod
    def of(cls, record: dict[str, Any]) -> Identity:
        return cls(record["language"], record.get("venv_id"), int(record.get("session_id") or 0),
                   record.get("session_name"))

    def record(self) -> dict[str, Any]:
        return {"language": self.language, "venv_id": self.venv_id,
                "session_id": self.session_id, "session_name": self.session_name}

    def slug(self) -> str:
        place = "own" if self.venv_id is None else f"venv{self.venv_id}"
        if self.session_name is None:
            return f"{self.language}-{place}-id{self.session_id}"
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", self.session_name)[:40]
        digest = hashlib.sha256(self.session_name.encode("utf-8", "surrogatepass")).hexdigest()
        return f"{self.language}-{place}-name-{safe}-{digest[:12]}"

    def same_session(self, other: Identity) -> bool:
        """The same session for a caller: by name if named, else by id."""
        if (self.language, self.venv_id, self.session_name) != \
                (other.language, other.venv_id, other.session_name):
            return False
        return self.session_name is not None or self.session_id == other.session_id


class SnapshotStore:
    """The folders of kept sessions under ``root/snapshots``."""

    def __init__(self, root: Path) -> None:
        self.path = Path(root) / FOLDER

    def folder(self, identity: Identity, *, make: bool = False) -> Path:
        folder = self.path / identity.slug()
        if make:  # a session's values are its user's alone
            self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
            folder.mkdir(mode=0o700, exist_ok=True)
        return folder

    def meta(self, identity: Identity) -> dict[str, Any] | None:
        """The folder's ``meta.json``; when it is lost or damaged, a marker rebuilt from
        ``kept.json`` whose ``problem_why`` says so (the session comes back by replay)."""
        return _read(self.folder(identity))

    def undescribed(self, identity: Identity) -> bool:
        """Whether the folder holds a snapshot's data but neither ``meta.json`` nor
        ``kept.json`` can say what it is."""
        folder = self.folder(identity)
        return any(folder.glob("state-*")) and _read(folder) is None

    def keep(self, identity: Identity, meta: dict[str, Any]) -> None:
        """Write ``kept.json`` from ``meta`` (what names the session and its calls)."""
        folder = self.folder(identity)
        kept = {k: meta.get(k) for k in _KEPT_FIELDS}
        if _read_kept(folder) != kept:
            _write_json(folder, KEPT, kept)

    def mark(self, identity: Identity, since: int, owner: str | None,
             aliases: list[dict[str, Any]] | None = None) -> None:
        """Keep ``identity`` by replay from log row ``since`` on, with no snapshot;
        ``owner``: the call log's name for this process (its rows are the session's);
        ``aliases``: other coordinates its rows were logged under, by owner (a session
        kept apart: :meth:`~coordex.persist.Persistence.after_call`)."""
        folder = self.folder(identity, make=True)
        meta = dict(identity.record(), format=snap.FORMAT, file=None, since=since,
                    through=since - 1, attempt=0, owners=[owner] if owner else None,
                    aliases=aliases, problem=None)
        self.keep(identity, meta)
        snap.write_meta(str(folder), meta)
        for old in folder.glob("state-*"):
            old.unlink(missing_ok=True)

    def kept(self) -> list[tuple[Identity, dict[str, Any]]]:
        """Every kept session with its meta (folders whose meta cannot be read are skipped)."""
        found: list[tuple[Identity, dict[str, Any]]] = []
        if not self.path.is_dir():
            return found
        for folder in sorted(self.path.iterdir()):
            meta = _read(folder)
            if meta is None or "language" not in meta:
                continue
            try:
                found.append((Identity.of(meta), meta))
            except (TypeError, ValueError):
                continue
        return found

    def add_owner(self, identity: Identity, owner: str | None) -> None:
        """This process holds the session now: its log rows are the session's too."""
        meta = self.meta(identity)
        if meta is None or not owner or not isinstance(meta.get("owners"), list):
            return
        if owner not in meta["owners"]:
            meta["owners"] = [*meta["owners"], owner]
            self.keep(identity, meta)
            snap.write_meta(str(self.folder(identity)), meta)

    def hold(self, identity: Identity) -> int | None:
        """Lock the session's folder for this process (an fd to keep open), or None when
        another live process holds it: one session, one holder."""
        folder = self.folder(identity, make=True)
        fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None
        return fd

    def held_elsewhere(self, identity: Identity) -> bool:
        fd = self.hold(identity)
        if fd is None:
            return True
        os.close(fd)  # closing drops the lock
        return False

    def forget(self, identity: Identity) -> None:
        shutil.rmtree(self.folder(identity), ignore_errors=True)


def _read(folder: Path) -> dict[str, Any] | None:
    meta = snap.read_meta(str(folder))
    if meta is not None and "language" in meta:
        if not (folder / KEPT).exists():  # kept before kept.json was written
            with contextlib.suppress(OSError):
                _write_json(folder, KEPT, {k: meta.get(k) for k in _KEPT_FIELDS})
        return meta
    kept = _read_kept(folder)
    if kept is None or "language" not in kept:
        return None
    since: int = kept["since"] if isinstance(kept.get("since"), int) else 1
    what = "is missing" if not (folder / snap.META).exists() else "cannot be read"
    return dict(kept, format=snap.FORMAT, file=None, since=since, through=since - 1,
                attempt=0, problem="meta", problem_why=(
                    f"the snapshot's description (meta.json) {what}, so the snapshot was "
                    "not used"))


def _read_kept(folder: Path) -> dict[str, Any] | None:
    try:
        kept = json.loads((folder / KEPT).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return kept if isinstance(kept, dict) else None


def _write_json(folder: Path, name: str, value: dict[str, Any]) -> None:
    """``name`` replaced whole: written, synced and renamed."""
    tmp = folder / f".{name}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(value, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder / name)
