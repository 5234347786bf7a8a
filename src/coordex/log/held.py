"""Results held for redelivery, kept on disk so a restart does not lose them (SPEC 14).

A result whose request was lost before it was delivered is held for the identical call
for :data:`~coordex.log.detached.HOLD_SECONDS`. The call book keeps it in memory; this
keeps a copy in one file per held result under the executor's root (``held/``, so per
tenant), written when the result is held and deleted when it is handed out, fetched by
its ``call_id``, or expired. A process that starts reads each held file once, to index
it (its key, end time and ``call_id``; the result is not kept in memory), and hands each
result out at most once: taking one renames its file first, so two processes sharing a
root cannot both deliver it.

Writing is best effort, as the spill files are: a full disk or a read-only root costs
the durability of that one result, never the call. A file that is not a held result
(truncated, or not ours) is deleted unread.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

FOLDER = "held"
_SUFFIX = ".json"
# A held file larger than this is not one coordex wrote (a result stays within 80 KB;
# its record with the key, well within this).
MAX_FILE_BYTES = 4 * 1024 * 1024


def _name(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:40] + _SUFFIX


class HeldResults:
    """The held results of one root, by call fingerprint.

    Args:
        root: the executor's root; the files go in its ``held/`` folder.
        hold_seconds: how long after its call ended a result may be handed out.
    """

    def __init__(self, root: Path, hold_seconds: float) -> None:
        self.folder = Path(root) / FOLDER
        self._hold_seconds = hold_seconds
        self._lock = threading.Lock()
        # file name -> the wall time its call ended, and its call_id
        self._index: dict[str, tuple[float, str | None]] = {}
        self._scan()

    def any(self) -> bool:
        """Whether any result may be held here (a call must then be checked)."""
        return bool(self._index)

    def put(self, key: str, result: dict[str, Any], ended_at: float) -> None:
        """Keep ``result`` (its ``call_id`` in it) for the identical call to ``key``."""
        name = _name(key)
        body = json.dumps({"key": key, "ended_at": ended_at, "result": result},
                          default=repr, ensure_ascii=True)
        temporary = self.folder / f".{name}.{os.getpid()}.{threading.get_ident()}"
        try:
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW,
                         0o600)
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(body)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, self.folder / name)
        except OSError:  # the result stays held in memory; only its durability is lost
            with contextlib.suppress(OSError):
                temporary.unlink()
            return
        call_id = result.get("call_id")
        with self._lock:
            self._index[name] = (ended_at, call_id if isinstance(call_id, str) else None)

    def take(self, key: str) -> dict[str, Any] | None:
        """The result held for ``key`` (removed: it is handed out once), or None."""
        name = _name(key)
        with self._lock:
            if self._index.pop(name, None) is None:
                return None
        taken = self.folder / f".{name}.taken.{os.getpid()}.{threading.get_ident()}"
        try:
            os.rename(self.folder / name, taken)  # one taker only, across processes
        except OSError:
            return None
        try:
            record = self._read(taken)
        finally:
            with contextlib.suppress(OSError):
                taken.unlink()
        if record is None or record.get("key") != key:
            return None
        if time.time() - _ended(record) > self._hold_seconds:
            return None
        result = record.get("result")
        return result if isinstance(result, dict) else None

    def drop(self, key: str) -> None:
        """Forget the result held for ``key`` (fetched by its ``call_id``)."""
        name = _name(key)
        with self._lock:
            if self._index.pop(name, None) is None:
                return
        with contextlib.suppress(OSError):
            (self.folder / name).unlink()

    def drop_call(self, call_id: str) -> None:
        """Forget the result held for ``call_id`` (fetched by it from the call log)."""
        with self._lock:
            names = [name for name, (_, held) in self._index.items() if held == call_id]
            for name in names:
                del self._index[name]
        for name in names:
            with contextlib.suppress(OSError):
                (self.folder / name).unlink()

    def prune(self) -> None:
        """Delete the results held longer than the hold."""
        limit = time.time() - self._hold_seconds
        with self._lock:
            expired = [name for name, (ended, _) in self._index.items() if ended < limit]
            for name in expired:
                del self._index[name]
        for name in expired:
            with contextlib.suppress(OSError):
                (self.folder / name).unlink()

    # -- inside --------------------------------------------------------------------------

    def _scan(self) -> None:
        try:
            entries = list(os.scandir(self.folder))
        except OSError:
            return
        limit = time.time() - self._hold_seconds
        for entry in entries:
            if entry.name.startswith("."):  # a write or take a process died during
                with contextlib.suppress(OSError):
                    if entry.stat(follow_symlinks=False).st_mtime < limit:
                        os.unlink(entry.path)
                continue
            if not entry.name.endswith(_SUFFIX):
                continue
            record = self._read(Path(entry.path))
            ended = _ended(record)
            if record is None or ended < limit or entry.name != _name(str(record.get("key"))):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
                continue
            result = record.get("result")
            call_id = result.get("call_id") if isinstance(result, dict) else None
            self._index[entry.name] = (ended, call_id if isinstance(call_id, str) else None)

    @staticmethod
    def _read(path: Path) -> dict[str, Any] | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return None
        try:
            with os.fdopen(fd, "rb") as f:
                data = f.read(MAX_FILE_BYTES + 1)
        except OSError:
            return None
        if len(data) > MAX_FILE_BYTES:
            return None
        try:
            record = json.loads(data)
        except ValueError:
            return None
        return record if isinstance(record, dict) else None


def _ended(record: dict[str, Any] | None) -> float:
    """When a held file's call ended (0: never, for a file that does not say)."""
    ended = record.get("ended_at") if record is not None else None
    return float(ended) if isinstance(ended, int | float) and ended == ended else 0.0


__all__ = ["FOLDER", "HeldResults"]
