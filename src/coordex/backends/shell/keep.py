"""Snapshots of bash sessions (SPEC 12; :class:`~..base.Kept`).

The shell dumps its state as bash text (variables exported or not, functions, aliases,
``shopt``/``set`` options, ``umask`` and the working folder) with the one dump a
protected copy's state file is written with (:func:`.copies.dump_state`), from a
subshell, and a fresh shell sources it. A dump takes milliseconds, so it is written by
the shell itself before :meth:`start_snapshot` returns. Checkpoints and forks (SPEC 15)
are the same dump.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...worker import _coordex_snapshot as snap
from ..base import Done, RunRequest, Written
from .copies import dump_state

if TYPE_CHECKING:
    from .session import ShellSession

# Named apart from a copy's state file's: a snapshot written before stays readable.
_OPTIONS = "__coordex_kept_options"
# The line a whole dump ends with (a file without it was cut short).
_LAST_LINE = f"\\builtin unset -f {_OPTIONS}\n".encode()


def dump_code(target: str) -> str:
    """Bash text that writes the shell's state to ``target``."""
    return dump_state(
        shlex.quote(target), options=_OPTIONS, reset="\\builtin set +xveuf",
        after=("\\builtin printf '\\\\builtin cd -- %q\\n' \"$PWD\"; "
               "\\builtin printf '\\\\builtin umask %s\\n' \"$(\\builtin umask)\"; "
               f"\\builtin printf '%s\\n\\\\builtin unset -f %s\\n' {_OPTIONS} {_OPTIONS}; "))


def start_snapshot(session: ShellSession, folder: str, *, attempt: int, through: int,
                   max_bytes: int, identity: Mapping[str, Any]) -> Done:
    """Dump the shell's state into ``folder`` (done when this returns)."""
    started = time.monotonic()
    where = Path(folder)
    name = f"state-{attempt}.sh"
    tmp = where / f".{name}.tmp"
    ran = session.run(RunRequest(code=dump_code(str(tmp)), timeout=30.0))
    problem = kind = None
    size = tmp.stat().st_size if tmp.exists() else 0
    if not ran.ok or not size:
        problem, kind = "the shell's state could not be dumped", "failed"
    elif size > max_bytes:
        problem = f"the snapshot would be larger than persist_max_bytes={max_bytes}"
        kind = "too_large"
    if problem is not None:
        tmp.unlink(missing_ok=True)
        meta = snap.read_meta(folder) or dict(identity, format=snap.FORMAT, file=None,
                                              through=None)
        meta.update(attempt=attempt, problem=kind, problem_why=problem)
        snap.write_meta(folder, meta)
        return Done()
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
        digest = hashlib.sha256(f.read()).hexdigest()
    os.replace(tmp, where / name)
    meta = dict(identity, format=snap.FORMAT, kind="bash", file=name, through=through,
                attempt=attempt, bytes=size, sha256=digest, left_out=[], written_at=time.time(),
                ms=round((time.monotonic() - started) * 1000.0, 1), problem=None)
    snap.write_meta(folder, meta)
    for old in where.glob("state-*"):
        if old.name != name:
            old.unlink(missing_ok=True)
    return Done()


def problem_of(path: Path, meta: Mapping[str, Any]) -> str | None:
    """Why the bash state file ``path`` cannot be trusted (checked against the size and
    checksum its meta recorded, and for the line a whole dump ends with), or None.
    Sourcing a cut file would bring back part of the state and claim all of it."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        return f"the snapshot could not be read ({exc.strerror or exc})"
    if not data:
        return "the snapshot cannot be read: it is empty"
    size = meta.get("bytes")
    if isinstance(size, int) and len(data) != size:
        return (f"the snapshot cannot be read: it is cut short ({len(data)} of {size} bytes)"
                if len(data) < size else
                f"the snapshot cannot be read: it is {len(data)} bytes, not the {size} written")
    digest = meta.get("sha256")
    if isinstance(digest, str) and hashlib.sha256(data).hexdigest() != digest:
        return "the snapshot cannot be read: it is damaged (its checksum does not match)"
    if not data.endswith(_LAST_LINE):
        return "the snapshot cannot be read: it is cut short"
    return None


def restore_snapshot(session: ShellSession, folder: str) -> Written:
    """Source the snapshot in the shell (a shell's state is text: nothing is left out,
    nothing replayed)."""
    started = time.monotonic()
    meta = snap.read_meta(folder) or {}
    path = Path(folder) / str(meta.get("file"))
    if not path.is_file():
        return {"error": "there is no snapshot"}
    problem = problem_of(path, meta)
    if problem is not None:
        return {"error": problem}
    code = f"\\builtin . {shlex.quote(str(path))} 2>/dev/null || :"
    if not session.run(RunRequest(code=code, timeout=60.0)).ok:
        return {"error": "the shell could not read the snapshot"}
    return {"names": [], "left_out": [], "replayed": 0,
            "ms": round((time.monotonic() - started) * 1000.0, 1)}
