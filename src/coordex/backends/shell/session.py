"""The bash backend: one kept ``bash`` per session, driven over private pipes.

How it works
------------
A :class:`ShellSession` holds one ``bash --norc --noprofile --noediting -i +m`` started
in a new process session, so it leads its own process group and has no terminal. It is
*interactive* on purpose: only an interactive bash answers SIGINT the way a terminal
user expects (the running command line is abandoned, the shell goes back to reading
the next one, every variable, function, alias, option and the cwd intact). ``+m``
turns job control off, so background jobs stay in the shell's process group (close()
reaps them) and ignore SIGINT (a timeout never kills them).

Bash's own fd 2 is a private *status pipe*; the user's stderr reaches it at a high fd.
Each call is one *trigger line* on bash's stdin: assignments of the call number, of
the code as one ``$'...'`` word, and of ``PROMPT_COMMAND`` to a fixed *runner*. Bash
runs PROMPT_COMMAND after the line, non-interactively (no ``[1] 1234`` job notices,
no ``exit`` echo) and at the top level (``declare`` makes globals). The runner unsets
PROMPT_COMMAND, sources a nameless file (``/dev/fd/N``) whose one line evals the code
with stdin at /dev/null, the user's stderr moved onto fd 2 and our fds closed -
sourced so that bash cleans finished foreground jobs out of its job table and
``return`` ends the code - and then sets PS1 to the *record* ``TOKEN r CALL STATUS
FLAGS``. Bash prints PS1 to its fd 2 (the status pipe) just before it reads the next
line; reading that record is how completion is detected. The code's output was
written before it, so both pipes are then drained without blocking. Everything else
bash prints there - startup warnings, ``set -x`` traces and ``set -v`` echoes of our
own lines, the newline after ^C - is never the user's and is skipped; user output is
never parsed, so nothing a command prints can fake completion, and output without a
trailing newline is kept exactly. PROMPT_COMMAND restores the parser's ``set -v`` and
expand_aliases when it ends; the record's FLAGS let the next trigger line put back
what the code chose. For a short call the caller polls the pipes without sleeping
for a moment (``SPIN_SECONDS``): a wake-up costs more than the whole call.

On timeout the process group gets SIGINT - once bash has read the whole trigger line,
so no interrupt can cut it - and a *sync line* that sets PS1 to ``TOKEN s CALL
STATUS FLAGS`` is queued behind it; if that record arrives within
``INTERRUPT_GRACE`` the shell survived. Otherwise the group is killed and the next
call gets a fresh shell. Records carry the call number, so a prompt printed twice
(an interrupt that lands while bash waits) is never taken for a later call's. A
pidfd reports the shell's death (``exit 3``, a signal) without polling.

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
(:meth:`ShellSession.read_only_command`) runs the code and says ``files: "none"``.
"""

from __future__ import annotations

import array
import contextlib
import dataclasses
import fcntl
import functools
import os
import resource
import secrets
import select
import shutil
import signal
import subprocess
import tempfile
import termios
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...core import facts, messages
from ...core.errors import storage_error
from ...core.facts import Ran
from ...diskspace import free_bytes
from ...worker import _coordex_copy as copier
from .. import _reap, isolation
from ..base import INTERRUPT_GRACE, PAGER_ENV, RunRequest, StreamCapture
from . import launcher
from .wire import DUMP as _DUMP
from .wire import PRIVATE_PREFIX, VOLATILE_VARIABLES
from .wire import SYNC_ALIASES as _SYNC_ALIASES
from .wire import ShellProtocol as _Protocol
from .wire import changed_names as _changed_names
from .wire import parse_dump as _parse_dump
from .wire import parse_flags as _parse_flags
from .wire import quote_code as _quote_code
from .wire import shell_quote as _shell_quote
from .wire import sync_line as _sync_line

__all__ = ["ShellPlace", "ShellSession", "run_stateless"]

# How a shell is stopped (module ``_reap``): SIGHUP asks bash to leave, then TERM, KILL;
# a kept session's shell also takes the members that left its group (``set -m`` jobs).
_SHELL_STEPS = _reap.Steps(interrupt=False, whole_session=True)
_STATELESS_STEPS = _reap.Steps(interrupt=False)
# Past a timeout's grace the shell has had its interrupt: straight to SIGKILL.
# Starting bash and inspecting it are ours, not the user's: generous fixed limits.
START_TIMEOUT = 15.0
INSPECT_TIMEOUT = 15.0
# Protected copies tried for one read-only call before it fails (never runs unprotected).
COPY_ATTEMPTS = 3
# Seconds of its timeout a call must have left to run on a fresh shell when the old one
# never took it (SPEC 6: no call returns later than its timeout and the grace).
RERUN_FLOOR = 0.5
# Our pipe ends inside bash sit at fd >= 200: users `exec 3>file`, bash itself saves
# fds at 10 and up, so the low numbers are theirs.
PRIVATE_FD_FLOOR = 200
# Where pidfds are missing (Linux < 5.3), the selector wakes this often to poll bash.
POLL_FALLBACK = 0.05
READ_CHUNK = 65536

BASH_ARGV = ("bash", "--norc", "--noprofile", "--noediting", "-i", "+m")
# Pagers never take over and programs do not draw for a terminal that is not there.
FIXED_ENV = {**PAGER_ENV, "TERM": "dumb"}


# How long a call watches its pipes without sleeping before it blocks in poll(). A
# blocked waiter costs a wake-up (tens of µs on a VM) when bash answers; a builtin-only
# call answers well within this, and a longer command wastes at most this much CPU.
SPIN_SECONDS = 0.0003
# A timeout never interrupts bash while it still reads a (large) trigger line - what it
# would make of the rest of the line is not something to rely on: it waits for the
# handover, polling this often, for at most INTERRUPT_GRACE.
HANDOVER_POLL = 0.002


# -- the protected read-only copy ------------------------------------------------------

# Variables a protected copy does not restore: bash's own (read-only or ever-changing),
# and those the launcher sets for the copy (its scratch TMPDIR, the mode).
_NOT_RESTORED = (VOLATILE_VARIABLES - {"PWD", "OLDPWD", "COLUMNS", "LINES"}) | {
    "BASH", "BASH_VERSINFO", "BASH_VERSION", "BASH_EXECUTION_STRING", "EUID", "UID",
    "PPID", "GROUPS", "TMPDIR", "TMP", "TEMP", isolation.MODE_ENV,
    f"{PRIVATE_PREFIX}code", f"{PRIVATE_PREFIX}v", f"{PRIVATE_PREFIX}n", f"{PRIVATE_PREFIX}f",
    f"{PRIVATE_PREFIX}run", f"{PRIVATE_PREFIX}record", f"{PRIVATE_PREFIX}call",
}
# Never reported as rebound or deleted by a copy: all of bash's own ever-changing
# variables (a copy's PWD too: the log speaks of names, as for Python), the above, and
# two a non-interactive bash sets for itself where the session's has none.
_NOT_NAMES = VOLATILE_VARIABLES | _NOT_RESTORED | {"BASH_COMPAT", "COMP_WORDBREAKS"}
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


class _ProtectedCopy:
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

    def launch(self, server: launcher.LauncherServer, shell: _Shell) -> None:
        """Have the server fork the child, which protects itself; no wait here.

        Raises :class:`~.launcher.LauncherError` when the server is gone.
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
        self._fingerprint = _fingerprint(shell.pid, self.work_paths)

    def fits(self, shell: _Shell, work_paths: tuple[str, ...], changes: bool) -> bool:
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
        state = q(self.state_file)
        restore_tail = (f"{_OPTIONS_FUNCTION}; \\builtin unset -f {_OPTIONS_FUNCTION}\n"
                        "\\builtin set +xv\n")
        return (
            # Note the trace flags (the driver line turned them on for this text), then
            # work untraced. The state first closes its fd (bash has read the file; no
            # function named exec exists yet: `builtin exec` would not keep the change).
            # The options, saved first, become a function the state calls once
            # everything else is restored; then the user's -e/-u/-f go off here.
            f"( {{ {p}f=; [[ $- == *x* ]] && {p}f+='set -x; '; "
            f"[[ $- == *v* ]] && {p}f+='set -v; '; \\builtin set +xv; }} 2>/dev/null\n"
            f"{{ \\builtin printf '\\\\exec {_STATE_FD}<&-\\n%s() {{\\n' {_OPTIONS_FUNCTION}; "
            f"\\builtin shopt -p; \\builtin set +o; \\builtin printf ':\\n}}\\n'; }} >| {state} 2>/dev/null\n"
            f"\\builtin set +euf; \\builtin printf %s \"${p}f\"\n"
            # What is not restored is unset in this throwaway subshell, so one
            # `declare -p` prints the rest (bash's read-only ones stay, and fail
            # harmlessly in the copy). One pass: `${!a@}` per letter costs ~1 ms.
            f"\\builtin unset -v {' '.join(sorted(_NOT_RESTORED))} 2>/dev/null\n"
            f"{{ \\builtin declare -p; \\builtin declare -f; \\builtin alias -p; "
            f"\\builtin printf 'set --'; (($#)) && \\builtin printf ' %q' \"$@\"; "
            f"\\builtin printf %s {q(chr(10) + restore_tail)}; }} >> {state} 2>/dev/null )"
        )

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

    def run(self, server: launcher.LauncherServer, shell: _Shell, request: RunRequest,
            deadline: float) -> tuple[_Stream, _Stream, _Ending]:
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
                self.launched = True
                copier.write_all(go_w, request.code.replace("\0", "").encode(
                    "utf-8", "surrogateescape"))
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
                return _Stream("stdout", request), _Stream("stderr", request), ending
            go = self.go_text(request.code, self.flags)
            self.launched = True
            copier.write_all(go_w, b"g" + go.encode("utf-8", "surrogateescape"))
            os.close(go_w)
            go_w = -1
            self._receive_layers(server, pid)
            return self._watch(server, pid, (out_r, err_r, end_r), deadline, request)
        finally:
            if go_w >= 0:
                os.close(go_w)  # called off: the child exits without running anything
            if pid is not None:
                _signal_group(pid, signal.SIGKILL)  # its background jobs, its namespaces
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
                _signal_group(pid, signal.SIGKILL)  # a ready copy's bash runs already
                server.release(pid)

    def _watch(self, server: launcher.LauncherServer, pid: int, fds: tuple[int, int, int],
               deadline: float, request: RunRequest) -> tuple[_Stream, _Stream, _Ending]:
        out_r, err_r, end_r = fds
        out, err = _Stream("stdout", request), _Stream("stderr", request)
        streams = {out_r: out, err_r: err}
        poller = select.poll()
        for fd in fds:
            os.set_blocking(fd, False)
            poller.register(fd, select.POLLIN)
        poller.register(server.fileno(), select.POLLIN)
        record = b""
        ending = _Ending()
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
                    _signal_group(pid, signal.SIGINT)
                elif not killed:  # it ignored SIGINT: kill the copy alone
                    killed = True
                    _signal_group(pid, signal.SIGKILL)
                else:
                    self.failure = "the launcher did not report the copy's end"
                deadline = now + INTERRUPT_GRACE
                continue
            wait = deadline - now if cancel is None else min(deadline - now, 0.05)
            for fd, _events in poller.poll(wait * 1000):
                if fd in streams:
                    if not _read_available(fd, streams[fd]):
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
            _read_available(fd, stream)
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
            _signal_group(pid, sig)

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
    try:
        cwd = os.readlink(f"/proc/{shell_pid}/cwd")
        with open(f"/proc/{shell_pid}/status") as f:
            umask = next((line for line in f if line.startswith("Umask:")), "")
    except OSError:
        return (None,)  # never equal to a fingerprint taken from a live shell
    limits: list[Any] = []
    for number in launcher.LIMITS:
        try:
            limits.append(resource.prlimit(shell_pid, number))
        except (OSError, ValueError):
            limits.append(None)
    return (shell_pid, cwd, umask, tuple(limits), work_paths)


@dataclass
class _CopySlot:
    """What one protected read-only call learnt from the copy that ran it."""

    files: str = "none"
    launched: bool = False
    failure: str | None = None
    unprotected: str | None = None  # why no copy could be protected (the code did not run)
    killed: int | None = None  # the signal that killed the copy itself
    written: list[str] = field(default_factory=list)  # in protected folders (discarded)
    # With report_changes: what tells the names it rebound and deleted, or None.
    changed: Callable[[], tuple[list[str], list[str]]] | None = None


def _read_available(fd: int, stream: _Stream) -> bool:
    """Read what ``fd`` holds now (never blocks) into ``stream``; False at end-of-file."""
    while True:
        try:
            data = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            return True
        except OSError:
            return False
        if not data:
            return False
        stream.feed(data)
        if len(data) < READ_CHUNK:
            return True


# -- one bash process ------------------------------------------------------------------


class _Stream(StreamCapture):
    """One output stream of a bash call: terminal queries dropped (see StreamCapture)."""

    __slots__ = ()

    def __init__(self, name: str, request: RunRequest) -> None:
        super().__init__(name, request, queries=True)


@dataclass
class _Ending:
    """How one exchange with bash ended (raw facts; wording is ShellSession's job)."""

    exit_code: int | None = None
    timed_out: bool = False
    aborted: bool = False  # the code did not finish: the status is the sync line's
    survived: bool = True
    returncode: int | None = None  # bash's own exit status when it ended during the call
    started: bool = False  # bash read and parsed the line (its "go" record came)


_STDOUT, _STDERR, _STATUS, _STDIN, _PIDFD = range(5)


class _Shell:
    """One bash process, its pipes and its process group. Knows nothing of sessions."""

    def __init__(self, env: Mapping[str, str], cwd: str | None) -> None:
        token = secrets.token_hex(8)
        self.token = token.encode()
        status_r, status_w = os.pipe()
        err_r, err_w = os.pipe()
        # The user's stderr reaches bash at a high fd; bash's own fd 2 is the status pipe.
        child_err = fcntl.fcntl(err_w, fcntl.F_DUPFD_CLOEXEC, PRIVATE_FD_FLOOR)
        os.close(err_w)
        runner_fd = _anonymous_file()
        # Above the fixed private numbers (_STATE_FD ... _CHANGES_FD) and both passed fds.
        protocol = _Protocol.build(token, child_err, runner_fd,
                                   max(child_err, runner_fd, PRIVATE_FD_FLOOR + 15) + 1)
        try:
            os.write(runner_fd, protocol.runner)
            self._proc = _reap.spawn(
                BASH_ARGV, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=status_w,
                env=dict(env), cwd=cwd, pass_fds=(child_err, runner_fd), bufsize=0,
            )
        except BaseException:
            for fd in (status_r, err_r):
                os.close(fd)
            raise
        finally:
            for fd in (status_w, child_err, runner_fd):
                os.close(fd)
        self.pid = self._proc.pid
        assert self._proc.stdin and self._proc.stdout
        self._stdin = self._proc.stdin.fileno()
        self._stdout = self._proc.stdout.fileno()
        self._stderr, self._status_r = err_r, status_r
        # Our ends only (bash holds other open file descriptions), so O_NONBLOCK is ours.
        for fd in (self._stdin, self._stdout, self._stderr, self._status_r):
            os.set_blocking(fd, False)
        self._status_buf = b""
        self.says_go = False  # this bash prints PS0 (the "go" record); before 4.4, none
        self._number = 0  # the last call or sync line handed to bash
        # set -v as the code left it, and as bash's top level has it (PROMPT_COMMAND
        # restores the latter after every call); the length of BASHOPTS last reported,
        # and whether the next trigger line must re-sync expand_aliases.
        self._verbose = self._top_verbose = False
        self._options_length = -1
        self._sync_aliases = False
        self._reap_lock = threading.Lock()
        self._reaped = False
        self.stop_step: _reap.StopStep | None = None
        self._released = False

        self._setup, self._trigger = protocol.setup, protocol.trigger
        self._kinds = {self._stdout: _STDOUT, self._stderr: _STDERR,
                       self._status_r: _STATUS, self._stdin: _STDIN}
        self._poller = select.poll()
        for fd in (self._stdout, self._stderr, self._status_r):
            self._poller.register(fd, select.POLLIN)
        self._outputs = select.poll()
        for fd in (self._stdout, self._stderr):
            self._outputs.register(fd, select.POLLIN)
        self._pidfd: int | None = None
        try:
            self._pidfd = os.pidfd_open(self.pid)
            self._poller.register(self._pidfd, select.POLLIN)
            self._kinds[self._pidfd] = _PIDFD
        except (AttributeError, OSError):
            self._pidfd = None
        copier.hold(*self._held())  # closed in read-only copies of Python sessions
        self._start()

    def _held(self) -> list[int]:
        return [fd for fd in (self._stdin, self._stdout, self._stderr, self._status_r,
                              self._pidfd) if fd is not None]

    def _start(self) -> None:
        # History off (and no file to write it to), aliases on, the runner stored. What
        # bash prints while starting ("no job control in this shell", the first prompt)
        # goes to its fd 2, the status pipe, where only records are looked for.
        ending = self.exchange(self._setup, 0, RunRequest(code="", timeout=START_TIMEOUT),
                               kind=b"s", interruptible=False)
        if ending.timed_out or ending.returncode is not None:
            self.terminate()
            self.release()
            raise RuntimeError(f"bash did not start (pid {self.pid}, ending {ending})")

    # -- state ---------------------------------------------------------------------

    def alive(self) -> bool:
        return not self._reaped and self._proc.poll() is None

    # -- one exchange ------------------------------------------------------------------

    def run(self, code: str, request: RunRequest, *, spin: bool = True,
            ) -> tuple[_Stream, _Stream, _Ending]:
        """Run ``code`` through a trigger line; returns the two streams and the ending.

        ``spin=False``: wait in poll() at once (when a CPU is better left to others).
        """
        self._number += 1
        line = self._trigger % self._number + _quote_code(code) + b"\n"
        if self._sync_aliases:
            line = _SYNC_ALIASES.encode() + b"; " + line
            self._sync_aliases = False
        if self._verbose != self._top_verbose:
            self._top_verbose = self._verbose
            line = (b"\\builtin set -v; " if self._verbose else b"\\builtin set +v; ") + line
        out, err = _Stream("stdout", request), _Stream("stderr", request)
        ending = self.exchange(line, self._number, request, streams=(out, err), spin=spin)
        if not ending.survived and not self.says_go:
            ending.started = True  # a bash without PS0 cannot tell: assume it started
        return out, err, ending

    def exchange(self, line: bytes, number: int, request: RunRequest, *,
                 streams: tuple[_Stream, _Stream] | None = None, kind: bytes = b"r",
                 interruptible: bool = True, spin: bool = True) -> _Ending:
        """Hand ``line`` to bash and wait for record ``kind number`` (or bash's end)."""
        out, err = streams or (_Stream("stdout", request), _Stream("stderr", request))
        ending = _Ending()
        pending = self._write_input(memoryview(line))
        if pending:
            self._poller.register(self._stdin, select.POLLOUT)
        now = time.monotonic()
        deadline = now + request.timeout
        handover_deadline = deadline + INTERRUPT_GRACE
        spin_until = time.perf_counter() + SPIN_SECONDS if spin else 0
        sync_number = -1
        ended = finished = False
        # A cancelled request is interrupted at once, exactly as at its timeout.
        cancel = request.cancel if interruptible else None
        try:
            while not finished:
                if cancel is not None and cancel.is_set() and now < deadline \
                        and not ending.timed_out:
                    deadline = now
                    handover_deadline = min(handover_deadline, now + INTERRUPT_GRACE)
                    cancel = None
                if now >= deadline:
                    if not interruptible or ending.timed_out:
                        ending.timed_out = True
                        ending.survived = False
                        self.terminate(_reap.KILL_NOW)  # it ignored the interrupt
                        break
                    if pending or self._unread_input():
                        if now >= handover_deadline:
                            interruptible = False  # bash stopped reading: kill it
                        else:
                            deadline = now + HANDOVER_POLL
                        continue
                    ending.timed_out = True
                    sync_number = self._interrupt()
                    deadline = now + INTERRUPT_GRACE
                    continue
                if spin_until:
                    timeout_ms: float = 0
                    if time.perf_counter() >= spin_until:
                        spin_until = 0
                else:
                    timeout_ms = (deadline - now) * 1000
                    if self._pidfd is None or cancel is not None:
                        timeout_ms = min(timeout_ms, POLL_FALLBACK * 1000)
                for fd, _events in self._poller.poll(timeout_ms):
                    what = self._kinds[fd]
                    if what == _STATUS:
                        for rkind, rnumber, status, flags in self._read_status():
                            if rkind == b"g":
                                ending.started = self.says_go = True
                            elif rkind == kind and rnumber == number:
                                ending.exit_code = status
                                self._note_flags(flags, top_level=kind == b"s")
                                finished = finished or sync_number < 0
                            elif rkind == b"s" and rnumber == sync_number:
                                if ending.exit_code is None:
                                    ending.exit_code = status
                                    ending.aborted = True
                                self._note_flags(flags, top_level=True)
                                finished = True
                    elif what == _STDOUT:
                        self._pump(fd, out)
                    elif what == _STDERR:
                        self._pump(fd, err)
                    elif what == _STDIN:
                        pending = self._write_input(pending)
                        if not pending:
                            self._poller.unregister(self._stdin)
                    else:
                        ended = finished = True
                if self._pidfd is None and not spin_until and self._proc.poll() is not None:
                    ended = finished = True
                now = time.monotonic()
        finally:
            if pending:
                self._poller.unregister(self._stdin)
        # What the code wrote came before the record; a pipe poll() saw empty then may
        # hold it now.
        for fd, _events in self._outputs.poll(0):
            self._pump(fd, out if fd == self._stdout else err)
        out.feed(b"", final=True)
        err.feed(b"", final=True)
        if ended or self._reaped or (self._pidfd is None and self._proc.poll() is not None):
            ending.survived = False
            ending.returncode = self._proc.wait()
            self.terminate()  # background jobs of the dead shell go with it
        return ending

    def _note_flags(self, field: bytes, *, top_level: bool) -> None:
        """Take in a record's flags; ``top_level``: a sync line's, already in force."""
        verbose, length = _parse_flags(field)
        self._verbose = verbose
        if top_level:
            self._top_verbose = verbose
            self._sync_aliases = False
        elif length != self._options_length:
            self._sync_aliases = True
        self._options_length = length

    def _interrupt(self) -> int:
        # SIGINT to the whole group reaches the foreground command and bash; background
        # jobs ignore it (bash sets SIGINT to ignored for them without job control).
        # Bash abandons the runner and reads the sync line next.
        _signal_group(self.pid, signal.SIGINT)
        self._number += 1
        try:
            os.write(self._stdin, _sync_line(self.token.decode(), self._number))
        except OSError:
            pass
        return self._number

    def _write_input(self, pending: memoryview) -> memoryview:
        while pending:
            try:
                written = os.write(self._stdin, pending)
            except BlockingIOError:
                return pending
            except OSError:  # bash died; nothing more will be read
                return pending[len(pending):]
            pending = pending[written:]
        return pending

    def _unread_input(self) -> int:
        """Bytes of our input bash has not read yet (it reads into its own buffer)."""
        size = array.array("i", [0])
        try:
            fcntl.ioctl(self._stdin, termios.FIONREAD, size)
        except OSError:
            return 0
        return size[0]

    def _pump(self, fd: int, stream: _Stream) -> None:
        """Read what ``fd`` has now (never blocks) into ``stream``."""
        while True:
            try:
                data = os.read(fd, READ_CHUNK)
            except OSError:  # BlockingIOError: drained
                return
            if not data:
                # The command closed the shell's stdout/stderr (or bash died): stop
                # watching it, or poll() would report end-of-file forever.
                for poller in (self._poller, self._outputs):
                    try:
                        poller.unregister(fd)
                    except KeyError:
                        pass
                return
            stream.feed(data)
            if len(data) < READ_CHUNK:
                return

    def _read_status(self) -> list[tuple[bytes, int, int, bytes]]:
        """Records ``\\nTOKEN KIND NUMBER STATUS FLAGS\\n`` among whatever else bash printed."""
        try:
            data = os.read(self._status_r, READ_CHUNK)
        except OSError:
            return []
        if not data:
            try:
                self._poller.unregister(self._status_r)
            except KeyError:
                pass
            return []
        buf = self._status_buf + data
        head = b"\n" + self.token + b" "
        records: list[tuple[bytes, int, int, bytes]] = []
        start = 0
        while True:
            i = buf.find(head, start)
            if i < 0:
                # Keep what could be the start of a record split across two reads.
                self._status_buf = buf[max(start, len(buf) - len(head) + 1):]
                return records
            end = buf.find(b"\n", i + len(head))
            if end < 0:
                self._status_buf = buf[i:]
                return records
            parts = buf[i + len(head):end].split(b" ")
            if len(parts) == 4:
                try:
                    records.append((parts[0], int(parts[1]), int(parts[2]), parts[3]))
                except ValueError:
                    pass
            start = end  # this record's newline may open the next one

    # -- ending ------------------------------------------------------------------------

    def terminate(self, steps: _reap.Steps | None = None) -> _reap.StopStep:
        """End bash and every process in its session by the one stop policy. Thread-safe.

        An interactive bash ignores SIGINT and SIGTERM as ways to leave; SIGHUP is how
        it is told to go (it passes the hangup on to its jobs). Returns the step reached.
        """
        with self._reap_lock:
            if self._reaped:
                return self.stop_step or "exited"

            def hang_up() -> bool:
                try:
                    os.kill(self.pid, signal.SIGHUP)
                except ProcessLookupError:
                    pass
                return True

            self.stop_step = _reap.stop(self._proc, "bash", ask=hang_up,
                                        steps=steps or _SHELL_STEPS)
            self._reaped = True
            return self.stop_step

    def release(self) -> None:
        """Close our ends of the pipes. Only when no exchange is running."""
        if self._released:
            return
        self._released = True
        copier.release(*self._held())
        for fd in (self._stderr, self._status_r, self._pidfd):
            if fd is not None:
                os.close(fd)
        for stream in (self._proc.stdin, self._proc.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass


def _anonymous_file() -> int:
    """A file with no name at an fd >= PRIVATE_FD_FLOOR (close-on-exec here).

    Bash sources it as ``/dev/fd/N``, which Linux opens afresh at offset 0; with no
    name on disk, nothing a command deletes can break the session.
    """
    try:
        fd = os.memfd_create("coordex-bash-runner", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        fd, path = tempfile.mkstemp(prefix="coordex-bash-runner-")
        os.unlink(path)
    try:
        return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, PRIVATE_FD_FLOOR)
    finally:
        os.close(fd)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _shell_env(env: Mapping[str, str] | None) -> dict[str, str]:
    merged = dict(os.environ if env is None else env)
    merged.update(FIXED_ENV)
    return merged


# -- outcomes ----------------------------------------------------------------------------


def _ran(out: _Stream, err: _Stream, ending: _Ending) -> Ran:
    """One exchange with bash as the fact of one run."""
    # (The newline an interactive bash prints for ^C goes to its fd 2, the status pipe.)
    event: facts.Event = facts.OK
    if ending.timed_out:
        event = facts.TimedOut(survived=ending.survived)
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

    def __init__(self, *, env: dict[str, str] | None = None, cwd: str | None = None) -> None:
        self._env = _shell_env(env)
        self._cwd = cwd
        self._lock = threading.Lock()
        self._closed = False
        self._copy: _ProtectedCopy | None = None  # the read-only copy running now
        self._standby: _ProtectedCopy | None = None  # the next one, protected and waiting
        self._ro_folder: str | None = None  # the copies' state file, mode file, scratch
        # The state file holds the session as of stateful call _dumped (-1: never), with
        # the trace flags it had; _state_version counts the calls that may change it.
        self._state_version = 0
        self._dumped = -1
        self._dump_flags = ""
        self._launcher: launcher.LauncherServer | None = None  # started on first use
        self._bash = shutil.which("bash", path=self._env.get("PATH")) or "/bin/bash"
        try:
            self._shell = _Shell(self._env, cwd)
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
        return self._call(request.code, request)

    def run_read_only(self, request: RunRequest) -> Ran:
        """Run ``request.code`` against a throwaway copy of the session.

        With ``request.scratch`` set and protection available here, the copy runs under
        :mod:`.isolation` and ``isolation.files`` is the mode its launcher reported
        (its TMPDIR is a scratch folder of its own, made before it was protected);
        otherwise a plain subshell runs it and ``files`` is ``"none"``.
        """
        slot = None
        if request.scratch is not None and isolation.best_mode() != "none":
            slot = _CopySlot()
            ran = self._call(request.code, request, slot)
        else:
            ran = self._call(self.read_only_command(request.code, request.scratch), request)
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

    def __enter__(self) -> ShellSession:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------

    def _call(self, code: str, request: RunRequest,
              copy: _CopySlot | None = None) -> Ran:
        with self._lock:
            replaced = self._ensure_shell()
            if isinstance(replaced, Ran):
                return replaced
            if copy is None:
                began = time.monotonic()
                out, err, ending = self._shell.run(code, request)
                if not (ending.survived or ending.started or self._closed):
                    # Dead before it read the call (killed just before it arrived, or
                    # stopped): the code never ran, so this is a shell found dead -
                    # replace, run there, in what is left of the call's one timeout.
                    fresh = self._ensure_shell()
                    if isinstance(fresh, Ran):
                        return fresh
                    left = request.timeout - (time.monotonic() - began)
                    if left < RERUN_FLOOR:
                        return Ran(facts.TimedOut(survived=False, taken=False), replaced=True)
                    replaced = True
                    out, err, ending = self._shell.run(
                        code, dataclasses.replace(request, timeout=left))
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
            if ending.survived and not self._shell.alive():
                # The session's shell died while a read-only copy ran elsewhere: the
                # copy's result stands, and the loss is this call's news, not the next's.
                replaced = True
            return dataclasses.replace(ran, replaced=replaced)

    def _copy_failed(self, copy: _CopySlot, request: RunRequest,
                     ran: Ran) -> facts.Event | None:
        """Why a protected copy did not run the code to its end, if it did not."""
        if ran.exit_code == 127 and ran.stderr.startswith(launcher.START_FAILED):
            # The copy never ran the code (its scratch folder full, say): not a
            # command's exit status 127.
            reason = ran.stderr[len(launcher.START_FAILED):].strip()
            folder = os.path.dirname(request.scratch or tempfile.gettempdir())
            # The state it saved may be cut short too: the next copy dumps it again.
            self._dumped = -1
            if self._standby is not None:
                self._standby.discard(self._launcher)
                self._standby = None
            return facts.StartFailed(copy=True, error=storage_error(
                OSError(reason), folder, "temporary folder (TMPDIR)", free_bytes(Path(folder))))
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

    def _run_copy(self, slot: _CopySlot, request: RunRequest,
                  ) -> tuple[_Stream, _Stream, _Ending]:
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
        return _Stream("stdout", request), _Stream("stderr", request), _Ending()

    def _run_protected(self, server: launcher.LauncherServer, slot: _CopySlot,
                       request: RunRequest, deadline: float,
                       ) -> tuple[_Stream, _Stream, _Ending]:
        """One protected copy on ``server`` (raises LauncherError if it failed)."""
        copy, self._standby = self._standby, None
        current = self._dumped == self._state_version
        if copy is not None and ((copy.ready and not current)
                                 or not copy.fits(self._shell, request.protect_paths,
                                                  request.report_changes)):
            copy.discard(server)
            copy = None
        if self._ro_folder is None:
            self._ro_folder = _ProtectedCopy.make_folder()
        if copy is None:
            copy = _ProtectedCopy(self._bash, request.protect_paths, self._ro_folder,
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
            self._standby = _ProtectedCopy(self._bash, request.protect_paths,
                                           self._ro_folder, ready=ready,
                                           changes=request.report_changes)
            self._standby.launch(server, self._shell)
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
            self._shell = _Shell(self._env, self._cwd)
            self._baseline = self._dump(self._shell)
        except (OSError, RuntimeError) as exc:
            return dataclasses.replace(_start_failed(exc), replaced=True)
        return True

    @staticmethod
    def _dump(shell: _Shell) -> dict[str, Any]:
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

    kind = "shell"
    retries = False  # shell commands are rarely safe to run twice (SPEC 6)

    def __init__(self, *, env: dict[str, str] | None = None, cwd: str | None = None) -> None:
        self._env = env
        self._cwd = cwd
        self._lock = threading.Lock()
        self._running: set[_Shell] = set()
        self._closed = False

    def capabilities_changed(self) -> None:
        """bash sees no capabilities."""

    def open_session(self) -> ShellSession:
        return ShellSession(env=self._env, cwd=self._cwd)

    def run_stateless(self, request: RunRequest) -> Ran:
        """Run ``request.code`` in a fresh shell that is closed (its group killed) after."""
        if self._closed:
            return Ran(facts.Closed("executor"))
        try:
            shell = _Shell(_shell_env(self._env), self._cwd)
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


def run_stateless(request: RunRequest, *, env: dict[str, str] | None = None,
                  cwd: str | None = None) -> Ran:
    """Run ``request.code`` in a fresh shell that is closed (its whole group killed) after."""
    return ShellPlace(env=env, cwd=cwd).run_stateless(request)
