"""How much room the disk under a path has left: measured only once a write failed, to
tell a full disk from other failures (the wording is :func:`core.errors.storage_error`)."""

from __future__ import annotations

import shutil
from pathlib import Path


def free_bytes(path: Path) -> int | None:
    """Free bytes on the disk holding ``path`` (its nearest existing folder), or None;
    measured only once a write failed, to tell a full disk from other failures."""
    folder = path.absolute()
    while not folder.is_dir() and folder.parent != folder:
        folder = folder.parent
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None
