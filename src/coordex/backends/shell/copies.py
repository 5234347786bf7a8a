"""The protected read-only copy of a bash session, made ahead while the session is idle.

Read-only calls start in a subshell of the session's shell: a forked copy whose
changes die with it. A subshell cannot protect the disk itself (unshare and Landlock
need a fresh single-threaded process), so where protection works (SPEC guarantee 3,
:mod:`.isolation`) the session's :class:`~.launcher.LauncherServer` - one small Python
process per session, started by its first protected call and closed with it - forks
a child that protects itself, in a process group of its own, with the call's own
stdout/stderr pipes, stdin ``/dev/null`` and the session shell's cwd, umask and
limits. Meanwhile a subshell of the session writes the session's state to a private
file - variables exported or not, functions, aliases, ``shopt``/``set`` options,
positional parameters - and prints the trace flags; those are the child's go: it
``exec``s a plain bash that restores the state and runs the code. Output is captured
and streamed as in a stateful call. Its own process group lets a timeout interrupt
the copy, kill it if it ignores the interrupt, and end whatever it left running,
without touching the session. Once protected, and before any code runs, the child
sends the host handles on its overlays' upper layers; when the call's group has ended
the host lists them (:func:`.isolation.written`, as a Python copy lists its own) - what
the copy wrote in protected folders, for the call log - and lets them go. Where nothing
can be protected (or the server cannot start) the plain subshell
(:meth:`.session.ShellSession.read_only_command`) runs the code and says ``files: "none"``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import resource
import select
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...worker import _coordex_copy as copier
from .. import isolation
from ..base import INTERRUPT_GRACE, RunRequest
from . import launcher
from .process import PRIVATE_FD_FLOOR, Ending, Shell, Stream, read_available, signal_group
from .wire import FUNCTIONS, PRIVATE_PREFIX, VOLATILE_VARIABLES
from .wire import changed_names as _changed_names
from .wire import quote_code as _quote_code
from .wire import shell_quote as _shell_quote

# Variables a protected copy does not restore: bash's own (read-only or ever-changing),
# and those the launcher sets for the copy (its scratch TMPDIR, the mode).
NOT_RESTORED = (VOLATILE_VARIABLES - {"PWD", "OLDPWD", "COLUMNS", "LINES"}) | {
    "BASH", "BASH_VERSINFO", "BASH_VERSION", "BASH_EXECUTION_STRING", "EUID", "UID",
    "PPID", "GROUPS", "TMPDIR", "TMP", "TEMP", isolation.MODE_ENV,
    f"{PRIVATE_PREFIX}code", f"{PRIVATE_PREFIX}v", f"{PRIVATE_PREFIX}n", f"{PRIVATE_PREFIX}f",
    f"{PRIVATE_PREFIX}run", f"{PRIVATE_PREFIX}record", f"{PRIVATE_PREFIX}call",
    f"{PRIVATE_PREFIX}go",  # its token is the dumped shell's, not the restored one's
    f"{PRIVATE_PREFIX}i", f"{PRIVATE_PREFIX}loop", f"{PRIVATE_PREFIX}aliased",
    f"{PRIVATE_PREFIX}errexit",
}
# Never reported as rebound or deleted by a copy: all of bash's own ever-changing
# variables (a copy's PWD too: the log speaks of names, as for Python), the above, and
# two a non-interactive bash sets for itself where the session's has none.
_NOT_NAMES = VOLATILE_VARIABLES | NOT_RESTORED | {"BASH_COMPAT", "COMP_WORDBREAKS"}


def dump_state(target: str, *, options: str, reset: str, after: str, before: str = "",
               opening: str = "") -> str:
    """The one bash text that writes a shell's state to ``target`` (quoted), from a
    subshell, so the session's own state (``$?`` aside) is untouched: a protected copy's
    state file (:meth:`ProtectedCopy.dump_command`) and a snapshot or checkpoint
    (:mod:`.keep`) are both this dump.

    The ``shopt``/``set`` options come first, as a function named ``options`` that the
    state calls once everything else is restored; ``reset`` then turns off the user's
    -e/-u/-f in the subshell. What is not restored is unset there, so one ``declare -p``
    prints the rest (bash's read-only ones stay, and fail harmlessly when sourced). One
    pass: ``${!a@}`` per letter costs ~1 ms. ``before`` runs first, ``opening`` starts
    the file, ``after`` (commands, each ending in ``;``) adds what the state ends with.
    """
    return (
        f"( {before}"
        f"{{ \\builtin printf '{opening}%s() {{\\n' {options}; \\builtin shopt -p; "
        f"\\builtin set +o; \\builtin printf ':\\n}}\\n'; }} >| {target} 2>/dev/null\n"
        f"{reset}\n"
        f"\\builtin unset -v {' '.join(sorted(NOT_RESTORED))} 2>/dev/null\n"
        f"\\builtin unset -f {' '.join(FUNCTIONS)} 2>/dev/null\n"  # the restoring shell's own
        f"{{ \\builtin declare -p; \\builtin declare -f; \\builtin alias -p; "
        f"{after}}} >> {target} 2>/dev/null )"
    )
# The copy's bash runs `-c SCRIPT bash`: SCRIPT sources the state (from an fd the
# launcher placed at _STATE_FD: the copy's view of the private folder may be an overlay
# mounted before the state was written; errors silenced, and `|| :` keeps -e from
# acting), then holds the trace flags and the code itself, so `set -x` traces read
# "+ cmd" and errors "bash: line N: ..." as in the session. The state is one command a
# line, never a group: `declare -a BASH_ARGV=...` (printed because the dump runs in a
# sourced file, where bash keeps it) silently abandons the rest of its command list. Code too long for one
# argument (Linux: 128 KiB) is read from a file and eval'd instead (traces "++ cmd").
_STATE_FD = PRIVATE_FD_FLOOR
# Then an EXIT trap writes the copy's exit status to a pipe at _END_FD: the call is over
# at that moment, before the process has exited (tearing its namespaces down takes
# milliseconds). The code runs with _END_FD closed (its children see 0-2 only), inside
# `eval ... 202>&-` or after `exec 202>&-`; an `exit` in the code, an EXIT trap of its
# own or a signal leave the end to the launcher's report.
_END_FD = PRIVATE_FD_FLOOR + 2
_SOURCE_STATE = (f"\\builtin . /dev/fd/{_STATE_FD} 2>/dev/null || :; \\builtin trap "
                 f"'{{ \\builtin printf \"%d\\n\" \"$?\" >&{_END_FD}; }} 2>/dev/null' EXIT\n")
# For the call log (``RunRequest.report_changes``) the EXIT trap first writes the copy's
# state as the state file holds it - variables, functions, aliases - to the changes
# file at _CHANGES_FD (opened by the host: the copy's own view of the private folder
# may be an overlay), and the host compares the two (:func:`.wire.changed_names`). The
# dump comes before the end record: once that arrives the copy's group is killed. The
# code never holds the fd either.
_CHANGES_FD = PRIVATE_FD_FLOOR + 3
_SOURCE_STATE_AND_DUMP = (
    f"\\builtin . /dev/fd/{_STATE_FD} 2>/dev/null || :; \\builtin trap "
    f"'{{ {PRIVATE_PREFIX}s=$?; {{ \\builtin declare -p; \\builtin declare -f; "
    f"\\builtin alias -p; }} >&{_CHANGES_FD}; \\builtin printf \"%d\\n\" "
    f"\"${PRIVATE_PREFIX}s\" >&{_END_FD}; }} 2>/dev/null' EXIT\n")
_HIDE_END = f" {_END_FD}>&- {_CHANGES_FD}>&-"
_READ_CODE = (f"{{ IFS= \\builtin read -r -d '' {PRIVATE_PREFIX}ro <%s; }} 2>/dev/null || :\n"
              f'\\builtin eval "')
_INLINE_CODE_LIMIT = 120_000
_OPTIONS_FUNCTION = f"{PRIVATE_PREFIX}options"
# A *ready* copy has restored the state already and reads its code from a pipe at
# _CODE_FD; eval keeps errors reading "bash: line N: ..." (traces would read "++ cmd",
# so a session tracing itself with set -x/-v never gets a ready copy).
_CODE_FD = PRIVATE_FD_FLOOR + 1
# One line, the script's second, as the code is in a waiting copy's: errors read
# "bash: line N:" with the same N in both.
_RUN_PIPED = (f"{{ IFS= \\builtin read -r -d '' {PRIVATE_PREFIX}ro <&{_CODE_FD}; }} "
              f"2>/dev/null || :; \\builtin exec {_CODE_FD}<&-; "
              f'\\builtin eval "\\builtin unset {PRIVATE_PREFIX}ro; ${PRIVATE_PREFIX}ro"'
              + _HIDE_END)


def _hand_over(go_w: int, data: bytes) -> None:
    """Give a launched copy its code; a copy gone before it (its launcher killed under
    it) is a :class:`~.launcher.LauncherError`, so the session makes another copy."""
    try:
        copier.write_all(go_w, data)
    except BrokenPipeError as exc:
        raise launcher.LauncherError("the copy ended before its code reached it") from exc


class ProtectedCopy:
    """One protected read-only copy of a session's shell: a launcher child and its group.

    :meth:`launch` asks the session's :class:`~.launcher.LauncherServer` for a child that
    protects itself. The session launches the next copy as soon as a call ends, so a
    call finds one protected while the session was idle, in one of two states:

    - *waiting* (``ready=False``): :meth:`run` has a subshell of the session
      (:meth:`dump_command`) write the session's state to the session's private folder
      (not the scratch folder, which the code may write) and print the trace flags;
      the flags and the code are the child's go: it execs a fresh bash that restores
      the state and runs the code.
    - *ready* (``ready=True``, when the state file already holds the session's state:
      no stateful call since the last dump, and no trace flags): the child has exec'd
      bash at once, which restored that state and waits for the code on a pipe, so a
      call only hands it the code.

    Either way the code runs in the copy's own process group. The launcher writes the
    mode that held to the mode file. A launched copy is used only while the session
    still has the cwd, umask and limits it was protected for (:meth:`fits`).
    """

    def __init__(self, bash: str, work_paths: tuple[str, ...], folder: str,
                 ready: bool = False, changes: bool = False) -> None:
        self.bash = bash
        self.changes = changes  # it dumps its state at its end (changes_file)
        self.work_paths = work_paths
        self.ready = ready
        self.folder = folder  # the session's private folder, kept across copies
        self.scratch = os.path.join(folder, "coordex-ro-scratch")  # the copy's TMPDIR
        self.state_file = os.path.join(folder, "state")
        self.mode_file = os.path.join(folder, "mode")
        self.code_file = os.path.join(folder, "code")
        self.changes_file = os.path.join(folder, "changes")
        self.pid: int | None = None  # the copy's pid and process group, once known
        self.launched = False  # a protected bash ran the code (the state went by value)
        self.failure: str | None = None  # why the copy's end is unknown (launcher lost)
        self.killed: int | None = None  # the signal that killed the copy's bash
        self._fds: tuple[int, int, int, int] | None = None  # out, err, go/code, end (ours)
        self._fingerprint: tuple[Any, ...] | None = None
        self.flags: str | None = None  # the trace flags the dump printed (it ran)
        self._uppers = False  # whether the child was asked to send its upper layers
        self._layers: tuple[list[str], list[int]] | None = None  # its folders, handles
        self.written: list[str] = []  # what the code wrote there, listed after it ended

    @staticmethod
    def make_folder() -> str:
        """A session's private folder: the state, mode and code files, the scratch."""
        folder = tempfile.mkdtemp(prefix="coordex-bash-ro-")
        with open(os.path.join(folder, "state"), "w"):
            pass  # a child opens it before the dump fills it
        os.mkdir(os.path.join(folder, "coordex-ro-scratch"), 0o700)
        return folder

    def launch(self, server: launcher.LauncherServer, shell: Shell,
               fingerprint: tuple[Any, ...] | None = None) -> None:
        """Have the server fork the child, which protects itself; no wait here.

        ``fingerprint``: the session shell's, taken this very call (a read-only call
        changes nothing in the shell, so the copy that ran it took the one the next
        copy needs); else read now. Raises :class:`~.launcher.LauncherError` when the
        server is gone.
        """
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        go_r, go_w = os.pipe()
        state_fd = os.open(self.state_file, os.O_RDONLY | os.O_CLOEXEC)
        end_r, end_w = os.pipe()
        script, fds, keep = _SOURCE_STATE, [out_w, err_w, go_r, state_fd], [_STATE_FD]
        if self.ready:
            code_r, code_w = os.pipe()
            script += _RUN_PIPED
            fds.append(code_r)
            keep.append(_CODE_FD)
        fds.append(end_w)
        keep.append(_END_FD)  # the fds in keep go in ascending order
        if self.changes:
            try:
                fds.append(os.open(self.changes_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC
                                   | os.O_CLOEXEC, 0o600))
                keep.append(_CHANGES_FD)
                script = _SOURCE_STATE_AND_DUMP + script[len(_SOURCE_STATE):]
            except OSError:
                self.changes = False  # the call runs; the log only misses its names
        # Only overlays hold what a copy wrote: the child sends its layers only then.
        self._uppers = isolation.best_mode() == "discarded"
        argv = [self.bash, "--norc", "--noprofile", "-c", script, "bash"]
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.mode_file)  # the mode is this child's to report
            server.start(argv, fds, session_pid=shell.pid, work_paths=self.work_paths,
                         scratch=self.scratch, allow="discarded", report_path=self.mode_file,
                         splice=(4, len(script)), keep=keep, uppers=self._uppers)
        except BaseException:
            for fd in (out_r, err_r, go_w, end_r, *((code_w,) if self.ready else ())):
                os.close(fd)
            raise
        finally:
            for fd in (*fds,):
                os.close(fd)
        if self.ready:
            copier.write_all(go_w, b"g")  # exec bash now: it restores the state and waits
            os.close(go_w)
            go_w = code_w
        self._fds = (out_r, err_r, go_w, end_r)
        self._fingerprint = fingerprint if fingerprint is not None and \
            fingerprint[-1] == self.work_paths else _fingerprint(shell.pid, self.work_paths)

    @property
    def fingerprint(self) -> tuple[Any, ...] | None:
        """What this copy took from the session shell (see :meth:`fits`)."""
        return self._fingerprint

    def fits(self, shell: Shell, work_paths: tuple[str, ...], changes: bool) -> bool:
        """Whether this waiting copy was protected for the session as it is now (and
        dumps its state at its end exactly when the call wants it)."""
        return self._fds is not None and self.changes == changes and \
            self._fingerprint == _fingerprint(shell.pid, work_paths)

    def changed(self) -> Callable[[], tuple[list[str], list[str]]] | None:
        """What tells (rebound, deleted), the names this copy's code changed, from its
        end dump and the state file it restored: the texts are read now (the next copy
        rewrites the files), compared when called (by the log's writer, off the call's
        path). None without a dump (the code's own EXIT trap, an interrupt). Never
        raises."""
        try:
            with open(self.changes_file, encoding="utf-8", errors="surrogateescape") as f:
                after = f.read()
            if not after:
                return None
            with open(self.state_file, encoding="utf-8", errors="surrogateescape") as f:
                before = f.read()
        except OSError:  # the log never costs the call
            return None
        return functools.partial(_changed_names, before, after, _NOT_NAMES)

    def dump_command(self) -> str:
        """The bash text, run by the session's driver line, that writes the state.

        It prints the trace flags (``set -x; `` ...) the copy's code starts with.
        """
        q = _shell_quote
        p = PRIVATE_PREFIX
        restore_tail = (f"{_OPTIONS_FUNCTION}; \\builtin unset -f {_OPTIONS_FUNCTION}\n"
                        "\\builtin set +xv\n")
        # Note the trace flags (the driver line turned them on for this text), then work
        # untraced. The state first closes its fd (bash has read the file; no function
        # named exec exists yet: `builtin exec` would not keep the change); then the
        # user's -e/-u/-f go off here, and the trace flags are printed.
        return dump_state(
            q(self.state_file), options=_OPTIONS_FUNCTION,
            before=(f"{{ {p}f=; [[ $- == *x* ]] && {p}f+='set -x; '; "
                    f"[[ $- == *v* ]] && {p}f+='set -v; '; \\builtin set +xv; }} 2>/dev/null\n"),
            opening=f"\\\\exec {_STATE_FD}<&-\\n",
            reset=f"\\builtin set +euf; \\builtin printf %s \"${p}f\"",
            after=(f"\\builtin printf 'set --'; (($#)) && \\builtin printf ' %q' \"$@\"; "
                   f"\\builtin printf %s {q(chr(10) + restore_tail)}; "))

    def go_text(self, code: str, flags: str) -> str:
        """What the child splices into its script: the trace flags, then the code.

        Untraced code runs in an ``eval`` with the end pipe closed. Traced code (set
        -x/-v) stands in the script itself, so its traces read "+ cmd" as in the session,
        after the end pipe is closed. Code too long for one argument is written to
        ``code_file`` and read from there.
        """
        code = code.replace("\0", "")
        inline = len(code.encode("utf-8", "surrogateescape")) < _INLINE_CODE_LIMIT
        if inline and not flags:
            quoted = _quote_code(code).decode("utf-8", "surrogateescape")
            return f"\\builtin eval {quoted}{_HIDE_END}"
        if inline:
            return f"\\builtin exec{_HIDE_END}; {flags}{code}"
        with open(self.code_file, "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(code)
        hide = f"\\builtin exec{_HIDE_END}; " if flags else ""
        tail = _HIDE_END if not flags else ""
        return (hide + _READ_CODE % _shell_quote(self.code_file) + flags
                + f'${PRIVATE_PREFIX}ro"' + tail)

    def run(self, server: launcher.LauncherServer, shell: Shell, request: RunRequest,
            deadline: float) -> tuple[Stream, Stream, Ending]:
        """Run ``request.code`` in this (launched) copy and watch it until it ends.

        A timeout interrupts the copy's group, kills it if it ignores the interrupt, and
        whatever the copy left running is killed when it ends. Raises
        :class:`~.launcher.LauncherError` if the server died before the code ran.
        """
        assert self._fds is not None
        out_r, err_r, go_w, end_r = self._fds
        self._fds = None
        pid = None
        try:
            if self.ready:  # bash has restored the state: hand it the code
                pid = self.pid = server.started()
                _hand_over(go_w, request.code.replace("\0", "").encode(
                    "utf-8", "surrogateescape"))
                self.launched = True
                os.close(go_w)
                go_w = -1
                self._receive_layers(server, pid)
                return self._watch(server, pid, (out_r, err_r, end_r), deadline, request)
            # A copy launched just now protects itself while the session writes its
            # state (which takes less time: no spinning, the CPU is theirs).
            dump = RunRequest(code="", timeout=max(deadline - time.monotonic(), 0.0),
                              output_limit=1 << 20)
            flags, _err, ending = shell.run(self.dump_command(), dump, spin=False)
            self.flags = flags.getvalue()
            pid = self.pid = server.started()
            if ending.timed_out or not ending.survived:
                self.flags = None
                return Stream("stdout", request), Stream("stderr", request), ending
            go = self.go_text(request.code, self.flags)
            _hand_over(go_w, b"g" + go.encode("utf-8", "surrogateescape"))
            self.launched = True
            os.close(go_w)
            go_w = -1
            self._receive_layers(server, pid)
            return self._watch(server, pid, (out_r, err_r, end_r), deadline, request)
        finally:
            if go_w >= 0:
                os.close(go_w)  # called off: the child exits without running anything
            if pid is not None:
                signal_group(pid, signal.SIGKILL)  # its background jobs, its namespaces
                self.pid = None
                # After the code and all it started have ended: nothing writes there now
                # (and before the pid can be reused, so the message is this copy's).
                if self.launched:
                    self._receive_layers(server, pid)
                self.written = self._list_layers()
                server.release(pid)  # only now may its pid (and group id) be reused
            for fd in (out_r, err_r, end_r):
                os.close(fd)

    def discard(self, server: launcher.LauncherServer | None) -> None:
        """Call off a copy that never ran: it exits; its files are removed."""
        if self._fds is not None:
            fds, self._fds = self._fds, None
            for fd in fds:
                os.close(fd)  # end of file on the go pipe: the child exits quietly
            if server is not None:
                try:
                    pid = server.started()
                except launcher.LauncherError:
                    return
                signal_group(pid, signal.SIGKILL)  # a ready copy's bash runs already
                server.release(pid)

    def _watch(self, server: launcher.LauncherServer, pid: int, fds: tuple[int, int, int],
               deadline: float, request: RunRequest) -> tuple[Stream, Stream, Ending]:
        out_r, err_r, end_r = fds
        out, err = Stream("stdout", request), Stream("stderr", request)
        streams = {out_r: out, err_r: err}
        poller = select.poll()
        for fd in fds:
            os.set_blocking(fd, False)
            poller.register(fd, select.POLLIN)
        poller.register(server.fileno(), select.POLLIN)
        record = b""
        ending = Ending()
        killed = False
        now = time.monotonic()
        cancel = request.cancel
        while ending.exit_code is None and self.failure is None:
            if cancel is not None and cancel.is_set() and not ending.timed_out:
                deadline = now  # a cancelled request is interrupted as at its timeout
                cancel = None
            if now >= deadline:
                if not ending.timed_out:
                    ending.timed_out = True
                    signal_group(pid, signal.SIGINT)
                elif not killed:  # it ignored SIGINT: kill the copy alone
                    killed = True
                    signal_group(pid, signal.SIGKILL)
                else:
                    self.failure = "the launcher did not report the copy's end"
                deadline = now + INTERRUPT_GRACE
                continue
            wait = deadline - now if cancel is None else min(deadline - now, 0.05)
            for fd, _events in poller.poll(wait * 1000):
                if fd in streams:
                    if not read_available(fd, streams[fd]):
                        poller.unregister(fd)
                    continue
                if fd == end_r:
                    try:
                        data = os.read(end_r, 64)
                    except BlockingIOError:
                        continue
                    record += data
                    if record.endswith(b"\n") and record[:-1].isdigit():
                        ending.exit_code = int(record[:-1])
                    elif not data or len(record) > 16:
                        poller.unregister(end_r)  # no record (or a garbled one) comes
                    continue
                try:
                    events = server.read_events()
                except launcher.LauncherError as exc:
                    self.failure = str(exc)
                    break
                for kind, event_pid, value in events:
                    if kind == b"X" and event_pid == pid:
                        if value < 0:  # the copy's bash itself was killed
                            if not ending.timed_out:  # by its code (`kill -9 $$`), not us
                                self.killed = -value
                            value = 128 - value
                        ending.exit_code = value
            now = time.monotonic()
        # What the copy wrote came before its end; background jobs may still hold the
        # pipes, so take what is there without waiting for end-of-file.
        for fd, stream in streams.items():
            read_available(fd, stream)
            stream.feed(b"", final=True)
        return out, err, ending

    def _receive_layers(self, server: launcher.LauncherServer, pid: int) -> None:
        """Take the handles on the upper layers child ``pid`` sent once protected, if
        they have come. Tried first while the code runs (a ready copy's came long ago),
        so the call's end pays only the listing."""
        if self._uppers and self._layers is None:
            self._layers = server.receive_layers(pid)

    def _list_layers(self) -> list[str]:
        """What the copy wrote in protected folders (:func:`.isolation.written`, as a
        Python copy lists its own), then the handles go; [] without them. Never raises."""
        if self._layers is None:
            return []
        (lowers, fds), self._layers = self._layers, None
        try:
            return isolation.written(uppers=list(zip(lowers, fds, strict=True)))
        except Exception:  # the log never costs the call
            return []
        finally:
            for fd in fds:
                os.close(fd)

    def signal(self, sig: signal.Signals) -> None:
        """Signal the copy's process group (when none runs, a no-op)."""
        pid = self.pid
        if pid is not None:
            signal_group(pid, sig)

    def files(self) -> str:
        """The mode the launcher reported, "none" if it never reported one."""
        try:
            with open(self.mode_file) as f:
                mode = f.read().strip()
        except OSError:
            return "none"
        return mode if mode in ("discarded", "refused") else "none"

    def clear_scratch(self) -> None:
        """Empty the scratch folder for the next copy (it is usually empty already)."""
        try:
            names = os.listdir(self.scratch)
        except OSError:
            names = []
            with contextlib.suppress(OSError):
                os.mkdir(self.scratch, 0o700)
        for name in names:
            path = os.path.join(self.scratch, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(path)


def _fingerprint(shell_pid: int, work_paths: tuple[str, ...]) -> tuple[Any, ...]:
    """What a waiting copy took from the session shell: cwd, umask, limits (and paths)."""
    # Read with as few steps as can be: this is the first work of a read-only call,
    # which runs slowest on a CPU that sat idle (several times as long as on a busy one).
    try:
        cwd = os.readlink(f"/proc/{shell_pid}/cwd")
        fd = os.open(f"/proc/{shell_pid}/status", os.O_RDONLY | os.O_CLOEXEC)
        try:
            status = os.read(fd, 1 << 16)
        finally:
            os.close(fd)
    except OSError:
        return (None,)  # never equal to a fingerprint taken from a live shell
    at = status.find(b"\nUmask:") + 1
    umask = status[at:status.find(b"\n", at)] if at else b""
    limits: list[Any] = []
    for number in launcher.LIMITS:
        try:
            limits.append(resource.prlimit(shell_pid, number))
        except (OSError, ValueError):
            limits.append(None)
    return (shell_pid, cwd, umask, tuple(limits), work_paths)


@dataclass
class CopySlot:
    """What one protected read-only call learnt from the copy that ran it."""

    files: str = "none"
    launched: bool = False
    failure: str | None = None
    unprotected: str | None = None  # why no copy could be protected (the code did not run)
    killed: int | None = None  # the signal that killed the copy itself
    written: list[str] = field(default_factory=list)  # in protected folders (discarded)
    # With report_changes: what tells the names it rebound and deleted, or None.
    changed: Callable[[], tuple[list[str], list[str]]] | None = None
