"""How each kind of session is written to and read from a snapshot folder.

- **own interpreter** (a namespace in this process): a fork of this process writes the
  snapshot (:func:`fork_own_snapshot`) with :mod:`~coordex.worker._coordex_snapshot`,
  so the namespace keeps answering; restoring loads it into the fresh namespace.
- **environment** (a worker process): the worker's ``snapshot`` message forks the
  worker and the fork writes; ``restore`` loads it in the worker before any code runs.
  Both name the pickler by path (:func:`pickler_path`), never by ``sys.path``.
- **bash**: the shell dumps its state as bash text (variables exported or not,
  functions, aliases, ``shopt``/``set`` options, ``umask`` and the working folder) the
  way a read-only copy's state file is written, from a subshell, and a fresh shell
  sources it. A dump takes milliseconds, so it is written by the shell itself.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shlex
import signal
import time
import warnings
from pathlib import Path
from typing import Any

from ..backends.base import RunRequest
from ..worker import _coordex_snapshot as snap

# A background snapshot gives up after this long (a stuck pickler never holds a slot).
SNAPSHOT_TIMEOUT = 600.0
_PR_SET_PDEATHSIG = 1


def pickler_path() -> str:
    """The file ``cloudpickle/cloudpickle.py`` of coordex's own install."""
    import importlib.util

    spec = importlib.util.find_spec("cloudpickle")
    if spec is None or spec.origin is None:
        raise RuntimeError("cloudpickle is not installed; it is a dependency of coordex")
    return str(Path(spec.origin).parent / "cloudpickle.py")


def kind_of(session: Any) -> str | None:
    """``"own"``, ``"env"``, ``"bash"``, or None for a session that is not kept."""
    from ..backends.env.workers import WorkerSession
    from ..backends.own import OwnSession
    from ..backends.shell import ShellSession

    if isinstance(session, OwnSession):
        return "own"
    if isinstance(session, WorkerSession):
        return "env"
    if isinstance(session, ShellSession):
        return "bash"
    return None


# -- own interpreter -------------------------------------------------------------------


def own_names(session: Any) -> tuple[dict[str, Any], list[str]]:
    state = session.state
    return state.namespace, snap.user_names(state.namespace, skip=state.injected)


def fork_own_snapshot(session: Any, folder: Path, *, attempt: int, through: int,
                      max_bytes: int, identity: dict[str, Any], close: tuple[int, ...] = ()
                      ) -> int:
    """Fork this process; the child writes the snapshot and exits. Returns its pid.
    ``close``: descriptors the child lets go of first (the folders' locks: a lock is
    this process's, never a child's that may outlive it by a moment)."""
    namespace, names = own_names(session)
    identity = dict(identity, cwd=session.state.cwd)  # its own working folder
    path = pickler_path()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads: see below
        pid = os.fork()
    if pid == 0:
        # Only this thread exists in the child; it touches nothing but the namespace's
        # objects and its own files, and it ends with os._exit (no atexit, no flushing
        # of the parent's buffers). It dies with the thread that forked it.
        status = 1
        try:
            for fd in close:
                os.close(fd)
            _die_with_parent()
            snap.idle()
            snap.write(namespace, str(folder), names=names, pickler_path=path,
                       attempt=attempt, through=through, max_bytes=max_bytes,
                       identity=identity)
            status = 0
        finally:
            os._exit(status)
    return pid


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def restore_own(session: Any, folder: Path, replay: list[str]) -> dict[str, Any]:
    cwd = (snap.read_meta(str(folder)) or {}).get("cwd")
    if isinstance(cwd, str) and os.path.isdir(cwd):
        session.state.cwd = cwd  # entered when its calls run
    namespace = session.state.namespace
    return snap.read(namespace, str(folder), pickler_path=pickler_path(), replay=replay,
                     run=snap.run_quietly(namespace))


# -- environment worker -----------------------------------------------------------------


def start_env_snapshot(session: Any, folder: Path, *, attempt: int, through: int,
                       max_bytes: int, identity: dict[str, Any]) -> int | None:
    """Ask the worker to fork a writer; returns the writer's pid (None: no answer)."""
    reply = session.exchange("snapshot", "snapshot_done", 30.0, folder=str(folder),
                             pickler=pickler_path(), attempt=attempt, through=through,
                             max_bytes=max_bytes, identity=identity)
    if reply is None:
        return None
    pid = (reply.get("report") or {}).get("pid")
    return pid if isinstance(pid, int) else None


def restore_env(session: Any, folder: Path, replay: list[str], timeout: float) -> dict[str, Any]:
    reply = session.exchange("restore", "restore_done", timeout, folder=str(folder),
                             pickler=pickler_path(), replay=replay)
    if reply is None:
        return {"error": "the environment's worker did not answer"}
    report: dict[str, Any] = reply.get("report") or {}
    return report


# -- bash ------------------------------------------------------------------------------

_OPTIONS = "__coordex_kept_options"


def bash_dump_code(target: str) -> str:
    """Bash text that writes the shell's state to ``target`` (a subshell: the session's
    own state, ``$?`` aside, is untouched)."""
    from ..backends.shell.copies import NOT_RESTORED

    t = shlex.quote(target)
    return (
        f"( {{ \\builtin printf '%s() {{\\n' {_OPTIONS}; \\builtin shopt -p; \\builtin set +o; "
        f"\\builtin printf ':\\n}}\\n'; }} >| {t} 2>/dev/null\n"
        "\\builtin set +xveuf\n"
        f"\\builtin unset -v {' '.join(sorted(NOT_RESTORED))} 2>/dev/null\n"
        "{ \\builtin declare -p; \\builtin declare -f; \\builtin alias -p; "
        "\\builtin printf '\\\\builtin cd -- %q\\n' \"$PWD\"; "
        "\\builtin printf '\\\\builtin umask %s\\n' \"$(\\builtin umask)\"; "
        f"\\builtin printf '%s\\n\\\\builtin unset -f %s\\n' {_OPTIONS} {_OPTIONS}; "
        f"}} >> {t} 2>/dev/null )"
    )


def snapshot_bash(session: Any, folder: Path, *, attempt: int, through: int,
                  max_bytes: int, identity: dict[str, Any]) -> dict[str, Any]:
    started = time.monotonic()
    name = f"state-{attempt}.sh"
    tmp = folder / f".{name}.tmp"
    ran = session.run(RunRequest(code=bash_dump_code(str(tmp)), timeout=30.0))
    problem = None
    size = tmp.stat().st_size if tmp.exists() else 0
    if not ran.ok or not size:
        problem = "the shell's state could not be dumped"
    elif size > max_bytes:
        problem = f"the snapshot would be larger than persist_max_bytes={max_bytes}"
    if problem is not None:
        tmp.unlink(missing_ok=True)
        meta = snap.read_meta(str(folder)) or dict(identity, format=snap.FORMAT, file=None,
                                                    through=None)
        meta.update(attempt=attempt, problem="failed", problem_why=problem)
        snap.write_meta(str(folder), meta)
        return meta
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
        digest = hashlib.sha256(f.read()).hexdigest()
    os.replace(tmp, folder / name)
    meta = dict(identity, format=snap.FORMAT, kind="bash", file=name, through=through,
                attempt=attempt, bytes=size, sha256=digest, left_out=[], written_at=time.time(),
                ms=round((time.monotonic() - started) * 1000.0, 1), problem=None)
    snap.write_meta(str(folder), meta)
    for old in folder.glob("state-*"):
        if old.name != name:
            old.unlink(missing_ok=True)
    return meta


def bash_snapshot_problem(path: Path, meta: dict[str, Any]) -> str | None:
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
    if not data.endswith(f"\\builtin unset -f {_OPTIONS}\n".encode()):
        return "the snapshot cannot be read: it is cut short"
    return None


def restore_bash(session: Any, folder: Path) -> dict[str, Any]:
    started = time.monotonic()
    meta = snap.read_meta(str(folder)) or {}
    path = folder / str(meta.get("file"))
    if not path.is_file():
        return {"error": "there is no snapshot"}
    problem = bash_snapshot_problem(path, meta)
    if problem is not None:
        return {"error": problem}
    code = f"\\builtin . {shlex.quote(str(path))} 2>/dev/null || :"
    if not session.run(RunRequest(code=code, timeout=60.0)).ok:
        return {"error": "the shell could not read the snapshot"}
    return {"names": [], "left_out": [], "replayed": 0,
            "ms": round((time.monotonic() - started) * 1000.0, 1)}
