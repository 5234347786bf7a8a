"""A call log's journal: the rows one :class:`~coordex.log.store.CallLog` has written
that its own thread may not yet have put in the SQLite file.

How it works: a finished call's row is one line added to a file of that log's own
(``log.sqlite3-rows-<owner>`` beside the SQLite file) before the call returns: copied
into the file's pages, which the log maps into its memory (``MAP_SHARED``). Those pages
are the kernel's page cache: a SIGKILL or the out-of-memory killer of the process a
moment after the copy loses nothing, as with a ``write()`` or a commit of the SQLite
file in WAL mode without ``fsync``, for a small part of their cost (a copy takes no
system call: about 5 us less a call than one ``write()``, measured in a call). The
file's blocks are taken from the disk when it is made (``posix_fallocate``), so a copy
never meets a full disk, which in a map would be a SIGBUS and not an error. The log's
own thread then inserts the lines into the SQLite file, oldest first, and records how
far it got in the same transaction (table ``journals``: ``owner``, ``upto``), so a line
is inserted once whoever inserts it.

The owner holds an exclusive ``flock`` on its journal for as long as it lives; the kernel
drops it when the process dies, however it dies. :func:`recover` (run by whoever opens
or reads the log) takes the lock of each journal it finds: a journal it can lock is a
dead owner's, whose lines past ``upto`` it inserts before removing the file; one it
cannot lock belongs to a log that is alive and inserts its lines itself. An owner that
closes removes its journal while it still holds the lock, and a recoverer checks that
the file it locked is still there, so a journal is never taken from a live owner nor
read after it was closed.

The file: a first line ``{"journal": 1, "owner": ..., "columns": [...]}``, then one
line per row, a JSON array: the row's number in this journal (from 1, never reused in
its life), then its values in the order of ``columns``, as the call gave them (long
texts already cut; the rest of the row's encoding happens on its way into the SQLite
file). Zeros follow the last line. Once half the file is used and every line is in the
SQLite file the owner zeroes it and starts over (the numbers go on); it grows (doubling)
only while the SQLite file is held by another process. A line cut short by a crash
(its end, or any part of it, still zeros), or one that is not what the format says, is
skipped: a reader trusts nothing in the file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import mmap
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

VERSION = 1
# Bytes of a new journal (lines are a few hundred bytes each), and the most it grows to.
SPACE = 1 << 20
MAX_SPACE = 1 << 28
_INFIX = "-rows-"  # log.sqlite3-rows-<owner>: "log.sqlite3-" marks coordex's own files

# Rows of a dead owner's journal go to the SQLite file through this: ``insert(owner,
# [(number, row), ...])`` inserts those past the owner's mark and moves the mark, in
# one transaction; ``forget(owner)`` drops the mark once the journal is gone.
Insert = Callable[[str, list[tuple[int, dict[str, Any]]]], Any]
Forget = Callable[[str], Any]


class Journal:
    """The journal of one log, written by its owner alone (a forked child of the owner
    never writes it: :meth:`forget` in the child).

    Args:
        log_path: the SQLite file the journal's rows go to.
        owner: the log's ``owner`` (unique per log and process).
        columns: the names of a row's values, in the order :meth:`write` is given them.
    """

    def __init__(self, log_path: Path, owner: str, columns: Sequence[str]) -> None:
        self.path = log_path.with_name(f"{log_path.name}{_INFIX}{owner}")
        self.owner = owner
        self.columns = tuple(columns)
        self.written = 0  # the number of the last row written
        self.size = 0  # bytes of lines in the file (zeros follow them)
        self._fd: int | None = None
        self._map: mmap.mmap | None = None

    def open(self) -> None:
        """Create the file and take its lock. Raises OSError."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.fstat(fd).st_nlink == 0:  # a reader took it for a dead owner's, before
                raise OSError(errno.EAGAIN, "the journal was removed as it was made")
            os.posix_fallocate(fd, 0, SPACE)
            self._map = mmap.mmap(fd, SPACE)
            self._fd = fd
            self._write_header()
        except BaseException:
            owned = self._fd is not None
            self.forget()  # the map, and the descriptor once it is this journal's
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            if not owned:
                os.close(fd)
            raise

    def write(self, values_json: str) -> bytes:
        """Append one row (``values_json``: the JSON array of its values, in the order
        of :attr:`columns`); returns its line. Once this returns, the row survives a
        kill of this process. Raises OSError, and then nothing was written."""
        number = self.written + 1
        line = f"[{number},{values_json[1:]}\n".encode()  # [values] -> [number,values]
        room, start = self._map, self.size
        end = start + len(line)
        if room is None or end > len(room):  # closed, or full: ``_put`` says or grows
            self._put(line)
        else:  # (every call: the same as ``_put``, two method calls fewer)
            room[start:end] = line
            self.size = end
        self.written = number
        return line

    @property
    def restart_due(self) -> bool:
        """Half the file is written: time to start over once every row is in the
        SQLite file."""
        return self._map is not None and self.size > len(self._map) // 2

    def restart(self) -> None:
        """Every row is in the SQLite file: empty the file (the numbers go on).
        Raises OSError."""
        room = self._room()
        room[:self.size] = bytes(self.size)  # zeros: no old line can finish a torn one
        self.size = 0
        self._write_header()

    def close(self, remove: bool) -> None:
        """Close the file; ``remove`` it first (every row is in the SQLite file), while
        the lock still says its owner lives."""
        if self._fd is not None and remove:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        self.forget()

    def forget(self) -> None:
        """Close the file and nothing else (in a forked child: the parent keeps the
        file and its lock)."""
        room, self._map = self._map, None
        if room is not None:
            with contextlib.suppress(OSError, ValueError, BufferError):
                room.close()
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _write_header(self) -> None:
        header = {"journal": VERSION, "owner": self.owner, "columns": list(self.columns)}
        self._put((json.dumps(header) + "\n").encode())

    def _put(self, data: bytes) -> None:
        room = self._room()
        end = self.size + len(data)
        if end > len(room):
            room = self._grow(end)
        room[self.size:end] = data
        self.size = end

    def _grow(self, needed: int) -> mmap.mmap:
        room = self._room()
        size = len(room)
        while size < needed:
            size *= 2
        if size > MAX_SPACE:
            raise OSError(errno.ENOSPC, f"the call log's journal {str(self.path)!r} would "
                          f"pass {MAX_SPACE} bytes")
        assert self._fd is not None
        os.posix_fallocate(self._fd, 0, size)
        room.resize(size)
        return room

    def _room(self) -> mmap.mmap:
        if self._map is None:
            raise OSError(errno.EBADF, f"the call log's journal {str(self.path)!r} is closed")
        return self._map


def recover(log_path: Path, insert: Insert, forget: Forget) -> int:
    """Insert into the log at ``log_path`` the rows of every journal beside it whose
    owner is gone (those it had not inserted), then remove those journals. Returns the
    number of journals recovered. Raises what ``insert`` raises (that journal is left
    for the next try); a journal it cannot open or lock is left alone."""
    recovered = 0
    for path in _journals(log_path):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its owner lives (or another reader recovers it right now)
            if os.fstat(fd).st_nlink == 0:
                continue  # its owner closed it after we opened it: nothing left in it
            found = parse(_read_all(fd))
            if found is not None and found[1]:
                insert(*found)
            with contextlib.suppress(OSError):
                os.unlink(path)
            if found is not None:
                forget(found[0])
            recovered += 1
        finally:
            os.close(fd)
    return recovered


def parse(data: bytes) -> tuple[str, list[tuple[int, dict[str, Any]]]] | None:
    """A journal's owner and its rows (number, ``{column: value}``), oldest first, or
    None when it has no valid header. Lines that are not rows are skipped."""
    lines = data.split(b"\n")
    try:
        header = json.loads(lines[0])
        owner, columns = header["owner"], header["columns"]
        if header.get("journal") != VERSION or not isinstance(owner, str) or \
                not isinstance(columns, list) or not all(isinstance(c, str) for c in columns):
            return None
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return None
    rows = []
    for line in lines[1:]:
        found = parse_line(line, columns)
        if found is not None:
            rows.append(found)
    return owner, rows


def parse_line(line: bytes, columns: Sequence[str]) -> tuple[int, dict[str, Any]] | None:
    """One line's number and row (``{column: value}``), or None when it is not a row
    (cut short by a crash, or not what :meth:`Journal.write` writes). What a value
    cannot be, the SQLite file refuses (that row alone)."""
    try:
        values = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(values, list) or len(values) != len(columns) + 1:
        return None
    number = values[0]
    if isinstance(number, bool) or not isinstance(number, int):
        return None
    return number, dict(zip(columns, values[1:], strict=True))


def parse_lines(lines: Sequence[bytes], columns: Sequence[str], as_lists: bool = False
                ) -> list[tuple[int, Any] | None]:
    """:func:`parse_line` of each of ``lines``, in one JSON parse where they all parse
    (a log's own lines: one parse a batch, not one a row), else one a line. With
    ``as_lists`` a row of that one parse is its list of values in the order of
    ``columns`` rather than a dict (a line parsed alone is a dict all the same)."""
    try:
        found = json.loads(b"[" + b",".join(lines) + b"]")
    except (ValueError, RecursionError):
        found = None
    if not isinstance(found, list) or len(found) != len(lines):
        return [parse_line(line, columns) for line in lines]
    width = len(columns) + 1
    rows: list[tuple[int, Any] | None] = []
    for values in found:
        number = values[0] if isinstance(values, list) and len(values) == width else None
        if isinstance(number, bool) or not isinstance(number, int):
            rows.append(None)
        elif as_lists:
            rows.append((number, values[1:]))
        else:
            rows.append((number, dict(zip(columns, values[1:], strict=True))))
    return rows


def _journals(log_path: Path) -> Iterator[Path]:
    prefix = log_path.name + _INFIX
    try:
        with os.scandir(log_path.parent) as entries:
            names = [e.name for e in entries if e.name.startswith(prefix)]
    except OSError:
        return
    for name in sorted(names):
        yield log_path.parent / name


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)
