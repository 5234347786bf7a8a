"""The bash backend: one kept ``bash`` per session, driven over private pipes.

:class:`ShellSession` keeps one shell (:class:`.process.Shell`, where the trigger lines,
the records and the timeouts are explained) per session, replaces one found dead, and
runs read-only calls in a subshell of it or in a protected copy (:mod:`.copies`).
:class:`ShellPlace` runs each stateless call in a fresh shell.
"""

from __future__ import annotations

import dataclasses
import shutil
import signal
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from ...core import facts, messages
from ...core.facts import Ran
from ...core.messages import PlaceKind
from .. import _reap, isolation
from ..base import Forked, ProgressCallback, RunRequest, Writer, Written, made_scratch, scratch_failed
from . import branches, keep, launcher
from .copies import CopySlot, ProtectedCopy
from .process import Ending, Shell, Stream, shell_env
from .wire import DUMP as _DUMP
from .wire import parse_dump as _parse_dump
from .wire import shell_quote as _shell_quote

__all__ = ["ShellPlace", "ShellSession", "run_stateless"]

# A stateless call's shell is stopped by the one stop policy (module ``_reap``): SIGHUP
# asks bash to leave, then TERM, KILL.
_STATELESS_STEPS = _reap.Steps(interrupt=False)
# Inspecting bash is ours, not the user's: a generous fixed limit.
INSPECT_TIMEOUT = 15.0
# Protected copies tried for one read-only call before it fails (never runs unprotected).
COPY_ATTEMPTS = 3


# -- outcomes ----------------------------------------------------------------------------


def _ran(out: Stream, err: Stream, ending: Ending) -> Ran:
    """One exchange with bash as the fact of one run."""
    # (The newline an interactive bash prints for ^C goes to its fd 2, the status pipe.)
    event: facts.Event = facts.OK
    if ending.timed_out:  # (stopped before it read the code: that never ran)
        event = facts.TimedOut(survived=ending.survived,
                               taken=ending.started or ending.survived)
    elif not (ending.survived or ending.started):  # dead before it read the code
        how = ("the shell had ended" if ending.returncode is None else
               messages.killed_by(-ending.returncode) if ending.returncode < 0 else
               f"the shell had exited with status {ending.returncode}")
        event = facts.Died("process", how, started=False)
    elif ending.returncode is not None and ending.returncode < 0:
        event = facts.Died("process", messages.killed_by(-ending.returncode))
    elif ending.returncode is not None:
        # `exit N` ended the shell: a normal result with that status, never retried.
        event = facts.Exited(ending.returncode)
    elif not ending.survived:
        event = facts.Died("process", "the shell ended")
    return Ran(event, out.getvalue(), err.getvalue(), out.truncated or err.truncated,
               exit_code=ending.exit_code)


def _start_failed(exc: BaseException) -> Ran:
    return Ran(facts.StartFailed(f"bash could not start ({exc})"))


# -- sessions ----------------------------------------------------------------------------


class ShellSession:
    """A kept bash shell: cwd, variables, functions, aliases and options persist.

    Args:
        env: the shell's environment; None inherits ``os.environ``. ``PAGER``,
            ``GIT_PAGER``, ``MANPAGER`` are set to ``cat`` and ``TERM`` to ``dumb``.
        cwd: the starting folder (also of every replacement shell); None inherits ours.

    One call runs at a time per session (a lock); different sessions run in parallel.
    A shell found dead when a call arrives is replaced and the outcome says
    ``state_lost``; a shell that ends *during* a call is not retried (``exit``, or a
    failing command after ``set -e``, as in a terminal). Raises ``OSError`` when bash
    cannot be started at all.
    """

    def __init__(self, *, env: dict[str, str] | None = None, cwd: str | None = None,
                 _forked: tuple[Shell, dict[str, Any]] | None = None) -> None:
        self._env = shell_env(env)
        self._cwd = cwd
        self._lock = threading.Lock()
        self._closed = False
        self._copy: ProtectedCopy | None = None  # the read-only copy running now
        self._standby: ProtectedCopy | None = None  # the next one, protected and waiting
        self._ro_folder: str | None = None  # the copies' state file, mode file, scratch
        # The state file holds the session as of stateful call _dumped (-1: never), with
        # the trace flags it had; _state_version counts the calls that may change it.
        self._state_version = 0
        self._dumped = -1
        self._dump_flags = ""
        self._launcher: launcher.LauncherServer | None = None  # started on first use
        self._bash = shutil.which("bash", path=self._env.get("PATH")) or "/bin/bash"
        if _forked is not None:  # a fork of another session's shell (fork_shell)
            self._shell, self._baseline = _forked
            return
        try:
            self._shell = Shell(self._env, cwd)
            self._baseline = self._dump(self._shell)
        except (OSError, RuntimeError) as exc:
            # A bash that cannot start, or starts and dies during setup: a crashed error
            # the executor returns as a dict (a RuntimeError escaped the call before).
            shell = getattr(self, "_shell", None)
            if shell is not None:
                shell.terminate()
                shell.release()
            raise messages.start_failed("bash", exc) from exc

    @property
    def pid(self) -> int:
        """The pid (and process group id) of the current bash."""
        return self._shell.pid

    def alive(self) -> bool:
        return not self._closed and self._shell.alive()

    # -- calls -------------------------------------------------------------------------

    def run(self, request: RunRequest) -> Ran:
        """Run ``request.code`` in the kept shell; what it changes stays."""
        self._state_version += 1  # a read-only copy's saved state may be stale now
        if request.env:  # the call's trace context, for this call alone (SPEC 16)
            return self._call(with_call_env(request.code, request.env), request)
        return self._call(request.code, request)

    def run_read_only(self, request: RunRequest) -> Ran:
        """Run ``request.code`` against a throwaway copy of the session.

        With ``request.scratch`` set and protection available here, the copy runs under
        :mod:`.isolation` and ``isolation.files`` is the mode its launcher reported
        (its TMPDIR is a scratch folder of its own, made before it was protected);
        otherwise a plain subshell runs it and ``files`` is ``"none"``.
        """
        slot = None
        if request.env:  # the call's trace context, for this call alone (SPEC 16)
            request = dataclasses.replace(request, code=with_call_env(request.code,
                                                                      request.env))
        if request.scratch is not None and isolation.best_mode() != "none":
            slot = CopySlot()
            ran = self._call(request.code, request, slot)
        else:  # a subshell, its TMPDIR the call's scratch folder
            ran = made_scratch(request) or self._call(
                self.read_only_command(request.code, request.scratch), request)
        # The protected copy is a fresh bash given the session's state by value (its
        # variables, functions, aliases, options, cwd); the plain one a forked subshell.
        files = slot.files if slot is not None else "none"
        kind = "values" if slot is not None and slot.launched and files != "none" else "fork"
        # What it wrote and rebound is for the call log; the result never shows it.
        return dataclasses.replace(
            ran, isolation={"names": True, "objects": True, "files": files, "copy": kind},
            written=(slot.written or None) if slot is not None else None,
            rebound=slot.changed if slot is not None and slot.changed is not None else ())

    def read_only_command(self, code: str, scratch: str | None = None) -> str:
        """The bash text that runs ``code`` so that nothing reaches the session.

        A subshell is a fork of the session's shell: it sees every variable, function,
        alias, option and the cwd, and whatever it changes ends with it (``exit`` too).
        It does not protect the disk; see :meth:`run_read_only`. With ``scratch`` it
        becomes the subshell's ``TMPDIR``/``TMP``/``TEMP``.
        """
        temp = ""
        if scratch is not None:
            folder = _shell_quote(scratch)
            temp = f"\\builtin export TMPDIR={folder} TMP={folder} TEMP={folder}; "
        return f"( {temp}\\builtin eval {_shell_quote(code)} )"

    def inspect(self) -> dict[str, Any] | Ran:
        """What the session added to the environment it started with; changes nothing.

        Returns ``{"cwd", "variables": {name: value}, "functions": [names],
        "aliases": {name: value}}``; variables include inherited ones whose value the
        session changed. Adds ``replaced: True`` if the shell had died and was replaced.
        """
        with self._lock:
            replaced = self._ensure_shell()
            if isinstance(replaced, Ran):
                return replaced
            now = self._dump(self._shell)
        base_vars = self._baseline["variables"]
        report: dict[str, Any] = {
            "cwd": now["cwd"],
            "variables": {k: v for k, v in now["variables"].items() if base_vars.get(k) != v},
            "functions": sorted(set(now["functions"]) - set(self._baseline["functions"])),
            "aliases": {k: v for k, v in now["aliases"].items()
                        if self._baseline["aliases"].get(k) != v},
        }
        if replaced:
            report["replaced"] = True
        return report

    def close(self) -> None:
        """End bash and every process in its group (TERM, wait, KILL). Idempotent.

        Safe from another thread while a call runs: that call sees the shell die and
        returns a ``crashed`` outcome.
        """
        self._closed = True
        copy = self._copy
        if copy is not None:  # a read-only copy lives in its own process group
            copy.signal(signal.SIGKILL)
        shell = self._shell
        shell.terminate()
        with self._lock:
            self._shell.terminate()
            self._shell.release()
            shell.release()
            if self._standby is not None:
                self._standby.discard(None)  # its child ends with the launcher server
                self._standby = None
            if self._ro_folder is not None:
                shutil.rmtree(self._ro_folder, ignore_errors=True)
                self._ro_folder = None
            if self._launcher is not None:
                self._launcher.close()
                self._launcher = None

    # -- capabilities (base.Kept, base.Forkable, base.Checkpointable) ----------------------

    def start_snapshot(self, folder: str, *, attempt: int, through: int, max_bytes: int,
                       identity: Mapping[str, Any], close: tuple[int, ...] = ()) -> Writer:
        return keep.start_snapshot(self, folder, attempt=attempt, through=through,
                                   max_bytes=max_bytes, identity=identity)

    def restore_snapshot(self, folder: str, replay: list[str], timeout: float) -> Written:
        return keep.restore_snapshot(self, folder)

    def fork(self, timeout: float) -> Forked:
        return branches.fork(self, timeout)

    def start_checkpoint(self, folder: str, max_bytes: int) -> Callable[[float], Written]:
        return branches.start_checkpoint(self, folder, max_bytes)

    def restore_checkpoint(self, folder: str, timeout: float) -> Written:
        return branches.restore_checkpoint(self, folder, timeout)

    def fork_shell(self, timeout: float) -> ShellSession:
        """A new session on a process fork of this one's shell (see ``Shell.fork``).
        Called with the session held. Raises ``RuntimeError`` when it did not fork."""
        replaced = self._ensure_shell()
        if isinstance(replaced, Ran):
            raise RuntimeError("the session's shell could not be started")
        shell = Shell.fork(self._shell, timeout)
        return ShellSession(env=self._env, cwd=self._cwd, _forked=(shell, self._baseline))

    def sibling(self) -> ShellSession:
        """A new session of the same environment and starting folder."""
        return ShellSession(env=self._env, cwd=self._cwd)

    def start_over(self) -> str | None:
        """Replace the shell with a fresh one; None, or why no new one started."""
        with self._lock:
            if self._closed:
                return "the session is closed"
            self._shell.terminate()
            self._shell.release()
            try:
                self._shell = Shell(self._env, self._cwd)
                self._baseline = self._dump(self._shell)
            except (OSError, RuntimeError) as exc:
                return f"a new shell did not start: {exc}"
            self._state_version += 1
        return None

    def __enter__(self) -> ShellSession:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------

    def _call(self, code: str, request: RunRequest,
              copy: CopySlot | None = None) -> Ran:
        with self._lock:
            replaced = self._ensure_shell()
            if isinstance(replaced, Ran):
                return replaced
            if copy is None:
                # A shell that dies before it reads the code (killed just before the
                # call came) reports it: the call runs again on a fresh shell, in what
                # is left of its one timeout (sessions.attempts decides).
                out, err, ending = self._shell.run(code, request)
            else:
                out, err, ending = self._run_copy(copy, request)
            ran = _ran(out, err, ending)
            failed = self._copy_failed(copy, request, ran) if copy is not None else None
            if failed is not None:
                ran = dataclasses.replace(ran, event=failed, exit_code=None)
            if self._closed:
                # close() from another thread ended the shell under this call; the call
                # may even have finished normally in the race, but its session is gone.
                return dataclasses.replace(ran, event=facts.Closed("session"),
                                           exit_code=None)
            if copy is not None and ending.survived and not self._shell.alive():
                # The session's shell died while a read-only copy ran elsewhere: the
                # copy's result stands, and the loss is this call's news, not the next's
                # (replaced now, so the next call does not find it dead again).
                self._ensure_shell()
                replaced = True
            return dataclasses.replace(ran, replaced=True) if replaced else ran

    def _copy_failed(self, copy: CopySlot, request: RunRequest,
                     ran: Ran) -> facts.Event | None:
        """Why a protected copy did not run the code to its end, if it did not."""
        if ran.exit_code == 127 and ran.stderr.startswith(launcher.START_FAILED):
            # The copy never ran the code (its scratch folder full, say): not a
            # command's exit status 127.
            reason = ran.stderr[len(launcher.START_FAILED):].strip()
            # The state it saved may be cut short too: the next copy dumps it again.
            self._dumped = -1
            if self._standby is not None:
                self._standby.discard(self._launcher)
                self._standby = None
            return scratch_failed(request.scratch, OSError(reason))
        if copy.unprotected is not None:
            return facts.StartFailed(f"it could not be protected: {copy.unprotected}",
                                     copy=True)
        if copy.killed is not None:
            # The copy died, as a Python copy that kills itself does: the same words.
            return facts.Died("copy", messages.killed_by(copy.killed))
        if copy.failure is not None:
            return facts.Died("copy", f"it could not be watched to its end ({copy.failure}) "
                              "and was killed")
        return None

    def _run_copy(self, slot: CopySlot, request: RunRequest,
                  ) -> tuple[Stream, Stream, Ending]:
        """A protected read-only call, through the session's launcher server.

        It takes the waiting copy when that one still fits the session (else launches
        one now) and, once the call is over, launches the next one, which protects
        itself while the session is idle. A copy that could not be protected this once
        (the server died, or protection failed in the copy, which then does not run the
        code) is made again, up to :data:`COPY_ATTEMPTS` times within the deadline;
        then ``slot.unprotected`` says why and the code has not run. Protection is
        never given up silently: no unprotected subshell runs the code here.
        """
        deadline = time.monotonic() + request.timeout
        reason = "the launcher server could not be started"
        for _attempt in range(COPY_ATTEMPTS):
            server = self._launcher_server()
            if server is None:
                break
            try:
                streams = self._run_protected(server, slot, request, deadline)
            except launcher.LauncherError as exc:
                reason = str(exc) or "the launcher server stopped answering"
                self._launcher = None  # the next attempt starts a new one
                server.close()
                if self._standby is not None:
                    self._standby.discard(None)
                    self._standby = None
                if time.monotonic() >= deadline:
                    break
                continue
            if slot.files != "none" or not slot.launched or slot.failure is not None \
                    or launcher.UNPROTECTED not in streams[1].getvalue():
                return streams  # (a copy that could not start, its TMPDIR full: said so)
            # Launched, but its protection did not hold: it exited without running the
            # code (launcher.py). Another copy, another try.
            reason = "protection did not hold in the copy"
            if time.monotonic() >= deadline:
                break
        slot.files, slot.unprotected = "none", reason
        return Stream("stdout", request), Stream("stderr", request), Ending()

    def _run_protected(self, server: launcher.LauncherServer, slot: CopySlot,
                       request: RunRequest, deadline: float,
                       ) -> tuple[Stream, Stream, Ending]:
        """One protected copy on ``server`` (raises LauncherError if it failed)."""
        copy, self._standby = self._standby, None
        current = self._dumped == self._state_version
        if copy is not None and ((copy.ready and not current)
                                 or not copy.fits(self._shell, request.protect_paths,
                                                  request.report_changes)):
            copy.discard(server)
            copy = None
        if self._ro_folder is None:
            self._ro_folder = ProtectedCopy.make_folder()
        if copy is None:
            copy = ProtectedCopy(self._bash, request.protect_paths, self._ro_folder,
                                  changes=request.report_changes)
            copy.launch(server, self._shell)
        self._copy = copy
        try:
            streams = copy.run(server, self._shell, request, deadline)
        finally:
            self._copy = None
        slot.failure, slot.launched, slot.files = copy.failure, copy.launched, \
            copy.files()
        slot.killed = copy.killed
        if slot.files == "discarded":  # as a Python copy lists only then
            slot.written = copy.written
        if copy.changes and copy.launched:  # before the next copy empties its file
            slot.changed = copy.changed()
        if copy.flags is not None:  # it dumped: the state file is current now
            self._dumped, self._dump_flags = self._state_version, copy.flags
        copy.clear_scratch()
        if not self._closed and self._shell.alive():
            ready = self._dumped == self._state_version and not self._dump_flags
            self._standby = ProtectedCopy(self._bash, request.protect_paths,
                                           self._ro_folder, ready=ready,
                                           changes=request.report_changes)
            # The shell is as this call found it: the copy's fingerprint holds.
            self._standby.launch(server, self._shell, copy.fingerprint)
        return streams

    def _launcher_server(self) -> launcher.LauncherServer | None:
        """The session's launcher server, started on first use (None: cannot start)."""
        if self._launcher is not None and not self._launcher.alive():
            self._launcher.close()
            self._launcher = None
            if self._standby is not None:  # the dead server's child: never started
                self._standby.discard(None)
                self._standby = None
        if self._launcher is None:
            try:
                self._launcher = launcher.LauncherServer(self._env)
            except launcher.LauncherError:
                return None
        return self._launcher

    def _ensure_shell(self) -> bool | Ran:
        """Replace a dead shell: whether it was replaced (the fact of a closed session,
        or of a failed start if no new one would start)."""
        if self._closed:
            return Ran(facts.Closed("session", during=False))
        if self._shell.alive():
            return False
        self._shell.terminate()
        self._shell.release()
        try:
            self._shell = Shell(self._env, self._cwd)
            self._baseline = self._dump(self._shell)
        except (OSError, RuntimeError) as exc:
            return dataclasses.replace(_start_failed(exc), replaced=True)
        return True

    @staticmethod
    def _dump(shell: Shell) -> dict[str, Any]:
        request = RunRequest(code=_DUMP, timeout=INSPECT_TIMEOUT, output_limit=1 << 30)
        out, _err, ending = shell.run(_DUMP, request)
        if ending.timed_out or not ending.survived:
            raise RuntimeError(f"could not read the state of bash (pid {shell.pid})")
        return _parse_dump(out.getvalue())


class ShellPlace:
    """Bash of one environment: opens kept sessions and runs stateless calls.

    Each stateless call gets a fresh shell that is stopped when the call returns; the
    shells of calls still running are tracked so that :meth:`close` ends them (and
    their commands) at once, and those calls return a ``crashed`` error dict.
    """

    kind: PlaceKind = "shell"
    retries = False  # shell commands are rarely safe to run twice (SPEC 6)

    def __init__(self, *, env: dict[str, str] | None = None, cwd: str | None = None) -> None:
        self._env = env
        self._cwd = cwd
        self._lock = threading.Lock()
        self._running: set[Shell] = set()
        self._closed = False

    def capabilities_changed(self) -> None:
        """bash sees no capabilities."""

    def open_session(self, on_progress: ProgressCallback | None = None) -> ShellSession:
        return ShellSession(env=self._env, cwd=self._cwd)

    def run_stateless(self, request: RunRequest) -> Ran:
        """Run ``request.code`` in a fresh shell that is closed (its group killed) after."""
        if self._closed:
            return Ran(facts.Closed("executor"))
        try:
            env = shell_env(self._env)
            if request.env:  # the call's trace context (SPEC 16)
                env = {**env, **request.env}
            shell = Shell(env, self._cwd)
        except (OSError, RuntimeError) as exc:
            return _start_failed(exc)
        with self._lock:
            closed = self._closed
            if not closed:
                self._running.add(shell)
        try:
            if closed:
                return Ran(facts.Closed("executor"))
            out, err, ending = shell.run(request.code, request)
        finally:
            with self._lock:
                self._running.discard(shell)
            shell.terminate(_STATELESS_STEPS)
            shell.release()
        ran = _ran(out, err, ending)
        if self._closed:  # close() ended the shell under the call
            return dataclasses.replace(ran, event=facts.Closed("executor"), exit_code=None)
        return ran

    def close(self) -> None:
        """End the shells of stateless calls still running; idempotent, any thread."""
        with self._lock:
            self._closed = True
            running = list(self._running)
        for shell in running:
            shell.terminate(_STATELESS_STEPS)


def with_call_env(code: str, env: Mapping[str, str]) -> str:
    """``code`` run with ``env`` exported for it alone: an assignment before ``eval``
    lasts as long as the eval (bash outside POSIX mode), so the session keeps none."""
    assigned = " ".join(f"{key}={_shell_quote(value)}" for key, value in env.items())
    return f"{assigned} \\builtin eval {_shell_quote(code)}"


def run_stateless(request: RunRequest, *, env: dict[str, str] | None = None,
                  cwd: str | None = None) -> Ran:
    """Run ``request.code`` in a fresh shell that is closed (its whole group killed) after."""
    return ShellPlace(env=env, cwd=cwd).run_stateless(request)
