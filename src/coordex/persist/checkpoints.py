"""Where checkpoints live (SPEC section 15): ``root/checkpoints/<session>/<id>/``.

One folder per session, named as its snapshot folder is (:meth:`Identity.slug`), holding
one folder per checkpoint: the state its session's place wrote there (a snapshot's
``meta.json`` and data file) and ``checkpoint.json`` (id, label, when, which session).
At most :data:`KEEP` per session: the oldest goes first. Policy only: what a state is
and how it is written belongs to each place (``backends.base.Checkpointable``).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

from .store import Identity

FOLDER = "checkpoints"
KEEP = 10
INFO = "checkpoint.json"


class CheckpointStore:
    def __init__(self, root: Path) -> None:
        self.path = Path(root) / FOLDER

    def session_folder(self, identity: Identity) -> Path:
        return self.path / identity.slug()

    def new(self, identity: Identity) -> tuple[str, Path]:
        """A fresh id and its (created, still empty) folder; its info is written by
        :meth:`keep` once its state is."""
        checkpoint = "cp-" + secrets.token_hex(4)
        folder = self.session_folder(identity) / checkpoint
        folder.mkdir(parents=True, mode=0o700)
        return checkpoint, folder

    def keep(self, identity: Identity, checkpoint: str, label: str | None, at: float,
             written: dict[str, Any]) -> list[dict[str, Any]]:
        """Record a written checkpoint; returns those dropped to stay within KEEP."""
        folder = self.session_folder(identity) / checkpoint
        info = {"checkpoint": checkpoint, "label": label, "at": at,
                "bytes": written.get("bytes"), "left_out": written.get("left_out") or [],
                "session": identity.record()}
        tmp = folder / (INFO + ".tmp")
        tmp.write_text(json.dumps(info))
        os.replace(tmp, folder / INFO)
        listed = self.list(identity)
        dropped = listed[:-KEEP] if len(listed) > KEEP else []
        for old in dropped:
            shutil.rmtree(self.session_folder(identity) / old["checkpoint"], ignore_errors=True)
        return dropped

    def discard(self, identity: Identity, checkpoint: str) -> None:
        shutil.rmtree(self.session_folder(identity) / checkpoint, ignore_errors=True)

    def list(self, identity: Identity) -> list[dict[str, Any]]:
        """The session's checkpoints, oldest first (half-written ones skipped)."""
        return sorted((info for folder in _children(self.session_folder(identity))
                       if (info := _info(folder)) is not None),
                      key=lambda info: (info.get("at") or 0.0, info["checkpoint"]))

    def find(self, checkpoint: str) -> tuple[dict[str, Any], Path] | None:
        """A checkpoint of any session of this root, by its id."""
        if not checkpoint.startswith("cp-") or "/" in checkpoint or checkpoint in (".", ".."):
            return None
        for session in _children(self.path):
            folder = session / checkpoint
            info = _info(folder)
            if info is not None:
                return info, folder
        return None

    def forget(self, identity: Identity) -> None:
        """``close_session``: the session's checkpoints go with it."""
        shutil.rmtree(self.session_folder(identity), ignore_errors=True)


def _children(folder: Path) -> list[Path]:
    try:
        return [p for p in folder.iterdir() if p.is_dir()]
    except OSError:
        return []


def _info(folder: Path) -> dict[str, Any] | None:
    try:
        info = json.loads((folder / INFO).read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) and "checkpoint" in info else None


def now() -> float:
    return time.time()
