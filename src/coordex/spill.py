"""What does not fit a result, kept whole in a file the session can read (SPEC 14).

A call's output passes through its :class:`Tee` as it comes (the ``on_output`` every
place calls). Up to the call's output limit a stream is only held (the chunks the place
keeps anyway); past it, it goes on into a file under the working folder's
``.coordex/out/``, so memory stays bounded however much is printed. When the call ends,
:meth:`Tee.finish` cuts the result to its budget (:func:`coordex.core.results.fit`),
keeps each stream or value that was cut - here or by the place - under its final name,
names it in ``"spilled": {"stdout" | "stderr" | "result": path}``, and deletes the rest.

Files are named for the session they came from (``python-own-3-...``), so closing a
session deletes its files (:func:`forget_session`); at most :data:`MAX_BYTES` of them
stay in one folder, the oldest deleted first. Failing to write (a full disk, a
read-only folder) costs the file, never the call: the result is cut as it would be and
says nothing is spilled.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from .core.results import DEFAULT_OUTPUT_LIMIT, RESULT_BUDGET, fit, json_bytes

OnOutput = Callable[[str, str], None]

FOLDER = os.path.join(".coordex", "out")
# All spilled files of one folder together; the oldest go first beyond it.
MAX_BYTES = 1 << 30
# A value's repr is kept whole up to this many characters (what a place hands back).
VALUE_KEEP_CHARS = 16 * 1024 * 1024
# A file still being written that has not grown for this long was left by a process
# that died during its call.
PARTIAL_STALE_SECONDS = 3600.0
_STREAMS = ("stdout", "stderr")
_numbers = itertools.count(1)


def folder_of(working: str | os.PathLike[str]) -> Path:
    """Where the calls of a process working in ``working`` spill."""
    return Path(working) / FOLDER


def session_prefix(session: dict[str, Any] | None) -> str:
    """The start of the names of a session's files; stateless calls share one."""
    session = session or {}
    if session.get("session_id") is None:
        return "stateless-"
    venv = session.get("venv_id")
    return f"{session.get('language')}-{'own' if venv is None else f'env{venv}'}-" \
        f"{session['session_id']}-"


class _Stream:
    """One stream of one call: its chunks, then (past ``limit``) a file."""

    __slots__ = ("chars", "chunks", "failed", "file", "path", "written")

    def __init__(self) -> None:
        self.chunks: list[str] = []
        self.chars = 0
        self.file: IO[str] | None = None
        self.path: Path | None = None
        self.failed = False
        self.written = 0


class Tee:
    """The output of one call, held or written as it comes; see the module docstring.

    Args:
        folder: where files go (created on first need).
        limit: characters of a stream held in memory before a file is opened.
        relay: the ``on_output`` the output goes on to (the running call's).
    """

    def __init__(self, folder: Path, limit: int = DEFAULT_OUTPUT_LIMIT,
                 relay: OnOutput | None = None) -> None:
        self.folder = folder
        self.limit = limit
        self._relay = relay
        self._streams: dict[str, _Stream] = {}
        self._lock = threading.Lock()
        self._named = ""

    @property
    def _stamp(self) -> str:
        """The part of this call's file names after the session's (made on first need)."""
        if not self._named:
            self._named = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{next(_numbers)}"
        return self._named

    def __call__(self, stream: str, text: str) -> None:
        if stream in _STREAMS and text:
            with self._lock:
                self._add(stream, text)
        if self._relay is not None:
            self._relay(stream, text)

    def _add(self, name: str, text: str) -> None:
        kept = self._streams.get(name)
        if kept is None:
            kept = self._streams[name] = _Stream()
        kept.chars += len(text)
        if kept.failed:
            return
        if kept.file is None:
            kept.chunks.append(text)
            if kept.chars <= self.limit:
                return
            kept.file = self._open(name, kept)
            if kept.file is None:
                return
            text = "".join(kept.chunks)
            kept.chunks = []
        if kept.written >= MAX_BYTES:
            return  # the rest is counted, not kept (said at the end of the file)
        text = text[:MAX_BYTES - kept.written]
        try:
            kept.file.write(text)
            kept.written += len(text)
        except (OSError, ValueError):
            self._drop(kept)

    def _open(self, name: str, kept: _Stream) -> IO[str] | None:
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            kept.path = self.folder / f".partial-{self._stamp}-{name}.txt"
            return open(kept.path, "w", encoding="utf-8", errors="surrogateescape")
        except OSError:
            self._drop(kept)
            return None

    def _drop(self, kept: _Stream) -> None:
        kept.failed = True
        kept.chunks = []
        if kept.file is not None:
            with contextlib.suppress(OSError):
                kept.file.close()
            kept.file = None
        if kept.path is not None:
            with contextlib.suppress(OSError):
                kept.path.unlink()

    def finish(self, record: dict[str, Any], value_limit: int = DEFAULT_OUTPUT_LIMIT,
               budget: int = RESULT_BUDGET) -> dict[str, Any]:
        """``record`` within ``budget``, each field cut (here or by the place) kept whole
        in a file and named in ``spilled``; every file not named is deleted."""
        fitted, cut = fit(record, budget, value_limit)
        if not cut and not self._streams:  # most calls: no output held, nothing cut
            return fitted
        with self._lock:  # many others: nothing cut, nothing written to a file
            if not cut and all(kept.file is None and not kept.failed
                               for kept in self._streams.values()):
                self._streams.clear()
                return fitted
        spilled: dict[str, str] = {}
        prefix = session_prefix(record.get("session"))
        with self._lock:
            for name in _STREAMS:
                kept = self._streams.get(name)
                if kept is None:
                    continue
                if name in cut or kept.file is not None or kept.failed:
                    path = self._keep(name, kept, prefix)
                    if path is not None:
                        spilled[name] = path
                else:
                    kept.chunks = []
            self._streams.clear()
        for name in cut:  # the rest: whole in the record as it came
            label = "result" if name == "value_repr" else name
            if label not in spilled and isinstance(record.get(name), str):
                path = self._write(f"{prefix}{self._stamp}-{label}.txt", record[name])
                if path is not None:
                    spilled[label] = path
        if spilled:
            fitted["spilled"] = spilled
            prune(self.folder)
        return fitted

    def discard(self) -> None:
        """Delete what was written (a call that ended without a result to shape)."""
        with self._lock:
            for kept in self._streams.values():
                self._drop(kept)
            self._streams.clear()

    def _keep(self, name: str, kept: _Stream, prefix: str) -> str | None:
        final = f"{prefix}{self._stamp}-{name}.txt"
        if kept.failed:
            return None
        if kept.file is None:
            return self._write(final, "".join(kept.chunks))
        try:
            if kept.chars > kept.written:
                kept.file.write(f"\n... [{kept.chars - kept.written} more characters not kept: "
                                f"spilled files hold at most {MAX_BYTES} characters] ...\n")
            kept.file.close()
            assert kept.path is not None
            target = self.folder / final
            os.replace(kept.path, target)
            return str(target)
        except OSError:
            self._drop(kept)
            return None

    def _write(self, name: str, text: str) -> str | None:
        target = self.folder / name
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with open(target, "w", encoding="utf-8", errors="surrogateescape") as file:
                file.write(text)
        except OSError:
            with contextlib.suppress(OSError):
                target.unlink()
            return None
        return str(target)


def forget_session(folder: Path, session: dict[str, Any]) -> None:
    """Delete the spilled files of a session being closed."""
    prefix = session_prefix(session)
    if prefix == "stateless-":
        return
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            if entry.name.startswith(prefix):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


def prune(folder: Path, max_bytes: int = MAX_BYTES) -> None:
    """Delete the oldest spilled files until those left hold at most ``max_bytes``."""
    files: list[tuple[float, int, str]] = []
    stale = time.time() - PARTIAL_STALE_SECONDS
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            with contextlib.suppress(OSError):
                stat = entry.stat()
                if not entry.name.startswith(".partial-"):
                    files.append((stat.st_mtime, stat.st_size, entry.path))
                elif stat.st_mtime < stale:  # left by a process killed during its call
                    os.unlink(entry.path)
    total = sum(size for _, size, _ in files)
    for _, size, path in sorted(files):
        if total <= max_bytes:
            break
        with contextlib.suppress(OSError):
            os.unlink(path)
            total -= size


# Characters of a spilled file one read hands back (a resource read over MCP; the rest
# is read with execute_code in the session). A reply line of a confined host carries it
# JSON-escaped, within that wire's 64 MiB.
READ_MAX_CHARS = 8 * 1024 * 1024


def read(folder: Path, uri: Any) -> dict[str, Any]:
    """A spilled file of ``folder`` by its ``file://`` URI (the ``resource_link`` of a
    result): ``{"uri", "mime_type", "text"}``, or a ``not_found`` / ``validation`` error
    dict. Only a regular file directly in ``folder`` is read, never through a link, so a
    link a session planted there reaches nothing else."""
    from urllib.parse import unquote, urlsplit

    from .core.errors import make_error

    parts = urlsplit(uri) if isinstance(uri, str) else None
    if parts is None or parts.scheme != "file" or parts.netloc not in ("", "localhost"):
        return make_error("validation", f"Not the URI of a spilled file: {uri!r:.200}.",
                          "Pass the uri of a resource_link a result carried (file://...).")
    path = unquote(parts.path)
    name = os.path.basename(path)
    missing = make_error(
        "not_found", f"No spilled file {uri!r:.200} is kept here.",
        "Spilled files go with their session (close_session) and the oldest beyond 1 GiB "
        "are deleted; run the call again if you still need its output.")
    try:
        inside = os.path.realpath(os.path.dirname(path)) == os.path.realpath(folder)
    except (OSError, ValueError):
        inside = False
    if not inside or not name or name.startswith("."):
        return missing
    try:
        fd = os.open(os.path.join(folder, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except (OSError, ValueError):
        return missing
    with os.fdopen(fd, "r", encoding="utf-8", errors="replace", newline="") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return missing
        text = f.read(READ_MAX_CHARS)
        rest = len(f.read(1))
    if rest:
        text += (f"\n[... cut at {READ_MAX_CHARS} characters; read the file with "
                 "execute_code in its session for the rest ...]\n")
    return {"uri": uri, "mime_type": "text/plain", "text": text}


def fit_function_result(record: dict[str, Any], folder: Path | None,
                        budget: int = RESULT_BUDGET) -> dict[str, Any]:
    """A stored function's result within ``budget``: its output as :meth:`Tee.finish`
    fits it (the record holds it whole up to the transfer limit), and a value too big for
    its share given as JSON text in ``value_repr`` (``value`` null), cut and spilled as
    ``result``. Without a ``folder`` nothing is written."""
    value = record.get("value")
    if value is not None and json_bytes(value) > budget // 2:
        record = {**record, "value": None,
                  "value_repr": json.dumps(value, ensure_ascii=False, default=str)}
    if folder is None:
        return fit(record, budget, VALUE_KEEP_CHARS)[0]
    return Tee(folder).finish(record, VALUE_KEEP_CHARS, budget)
