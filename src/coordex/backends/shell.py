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

Each call writes one fixed *driver line* to bash's stdin. The code itself travels on a
private *code pipe*: the driver line reads it with ``read -d ''`` and runs it as
``eval "$code" </dev/null``, so a command that reads stdin gets end-of-file at once.
The eval is wrapped in ``. /dev/stdin <<<...`` because bash runs sourced text as
non-interactive: no ``[1] 1234`` job notices, no ``exit`` echo. After it, the driver
line writes ``TOKEN r STATUS`` to a private *status pipe*; reading that line is how
completion is detected. The command's writes to stdout/stderr happened before it, so
both pipes are then drained without blocking. User output is never parsed, so nothing
a command prints (or ``set -x`` traces) can fake completion, and output without a
trailing newline is kept exactly.

On timeout the process group gets SIGINT and a *sync line* that writes ``TOKEN s
STATUS`` is queued behind it; if it arrives within ``INTERRUPT_GRACE`` the shell
survived. Otherwise the group is killed and the next call gets a fresh shell. A pidfd
in the same selector reports the shell's death (``exit 3``, a signal) without polling.

Read-only calls start in a subshell of the session's shell: a forked copy whose
changes die with it. A subshell cannot protect the disk itself (unshare and Landlock
need a fresh process image), so where protection works (SPEC guarantee 3,
:mod:`.isolation`) the subshell writes the session's state to a private file -
variables exported or not, functions, aliases, ``shopt``/``set`` options, positional
parameters; the cwd, umask, limits and open fds pass through ``exec`` - and ``exec``s
the isolation launcher, which protects itself, leaves the session's process group for
its own and ``exec``s a plain bash that restores the state and runs the code. The copy
keeps the session's stdout/stderr pipes (output is captured and streamed exactly as in
a stateful call) and stdin at ``/dev/null``. Its own process group lets a timeout
interrupt it, kill it if it ignores the interrupt, and end whatever it left running,
without touching the session. Where nothing can be protected the plain subshell
(:meth:`ShellSession.read_only_command`) runs the code and says ``files: "none"``.
"""

from __future__ import annotations

import array
import codecs
import fcntl
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import tempfile
import termios
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..core.errors import make_error
from ..core.results import OutputBuffer
from . import isolation
from .base import INTERRUPT_GRACE, Outcome, RunRequest, emit

__all__ = ["ShellSession", "run_stateless"]

# How long close() gives processes to exit after SIGTERM before SIGKILL.
CLOSE_GRACE = 1.0
# Starting bash and inspecting it are ours, not the user's: generous fixed limits.
START_TIMEOUT = 15.0
INSPECT_TIMEOUT = 15.0
# Our pipe ends inside bash sit at fd >= 200: users `exec 3>file`, bash itself saves
# fds at 10 and up, so the low numbers are theirs.
PRIVATE_FD_FLOOR = 200
# Where pidfds are missing (Linux < 5.3), the selector wakes this often to poll bash.
POLL_FALLBACK = 0.05
READ_CHUNK = 65536

BASH_ARGV = ("bash", "--norc", "--noprofile", "--noediting", "-i", "+m")
# Pagers never take over and programs do not draw for a terminal that is not there.
FIXED_ENV = {"PAGER": "cat", "GIT_PAGER": "cat", "MANPAGER": "cat", "TERM": "dumb"}
# Bash's own ever-changing variables, and ones reported elsewhere (PWD is ``cwd``).
VOLATILE_VARIABLES = frozenset({
    "_", "BASHPID", "BASH_SUBSHELL", "RANDOM", "SRANDOM", "SECONDS", "LINENO",
    "EPOCHSECONDS", "EPOCHREALTIME", "BASH_COMMAND", "PIPESTATUS", "BASH_LINENO",
    "BASH_SOURCE", "FUNCNAME", "BASH_ARGC", "BASH_ARGV", "BASH_ARGV0", "HISTCMD",
    "BASH_ALIASES", "BASH_CMDS", "BASH_REMATCH", "PWD", "OLDPWD", "DIRSTACK", "COLUMNS",
    "LINES", "BASHOPTS", "SHELLOPTS",
})
PRIVATE_PREFIX = "__coordex_"

# Prints the session's state as NUL-separated records: ``c PWD``, ``v NAME VALUE``,
# ``a NAME DECLARE-P-TEXT`` (arrays), ``f NAME``, ``l NAME VALUE``. It runs in a subshell
# and resets IFS/noglob/nounset there, so a user's settings cannot skew it.
_DUMP = r"""(
\builtin set +euf; IFS=$' \t\n'
\builtin printf 'c\0%s\0' "$PWD"
for __coordex_n in $(\builtin compgen -v); do
  case ${!__coordex_n@a} in
    *[aA]*) \builtin printf 'a\0%s\0%s\0' "$__coordex_n" "$(\builtin declare -p "$__coordex_n")" ;;
    *) \builtin printf 'v\0%s\0%s\0' "$__coordex_n" "${!__coordex_n}" ;;
  esac
done
for __coordex_n in $(\builtin compgen -A function); do \builtin printf 'f\0%s\0' "$__coordex_n"; done
for __coordex_n in $(\builtin compgen -a); do
  \builtin printf 'l\0%s\0%s\0' "$__coordex_n" "${BASH_ALIASES[$__coordex_n]}"
done
)"""


def _driver_lines(token: str, code_fd: int, status_fd: int) -> tuple[bytes, bytes]:
    """The line that runs one call, and the line that reports after an interrupt.

    Both end in the same bookkeeping: note the status and whether ``set -x``/``set -v``
    are on, switch them off (silently: the group's stderr is /dev/null) so our own
    commands never show in the user's trace, report to the status fd, and empty the
    prompts (an interactive bash prints PS1 before each line). The next call's code
    turns the flags back on as its first, untraced, command.
    """
    p = PRIVATE_PREFIX
    keep = (
        f"{{ {p}status=$?; {p}flags=; [[ $- == *x* ]] && {p}flags+=$'set -x\\n'; "
        f"[[ $- == *v* ]] && {p}flags+=$'set -v\\n'; \\builtin set +xv; }} 2>/dev/null; "
    )
    resets = "PS0= PS1= PS2=; \\builtin unset PROMPT_COMMAND\n"
    report = f"\\builtin printf '%s {{kind}} %d\\n' {token} \"${p}status\" >&{status_fd}; "
    # `. /dev/stdin <<<...` rather than a bare eval: bash runs sourced text as
    # non-interactive, so no "[1] 1234" job notices and no "exit" echo.
    run = (
        f"IFS= \\builtin read -r -d '' -u {code_fd} {p}code; "
        f"\\builtin . /dev/stdin <<<'\\builtin eval \"${{{p}flags-}}${p}code\" "
        f"</dev/null {code_fd}<&- {status_fd}>&-'; "
    )
    driver = run + keep + report.format(kind="r") + resets
    sync = keep + report.format(kind="s") + resets
    return driver.encode(), sync.encode()


def _shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


# -- the protected read-only copy ------------------------------------------------------

# Variables a protected copy does not restore: bash's own (read-only or ever-changing),
# and those the launcher set for the copy (its scratch TMPDIR, the mode).
_NOT_RESTORED = (VOLATILE_VARIABLES - {"PWD", "OLDPWD", "COLUMNS", "LINES"}) | {
    "BASH", "BASH_VERSINFO", "BASH_VERSION", "BASH_EXECUTION_STRING", "EUID", "UID",
    "PPID", "GROUPS", "TMPDIR", "TMP", "TEMP", isolation.MODE_ENV,
    f"{PRIVATE_PREFIX}code", f"{PRIVATE_PREFIX}v", f"{PRIVATE_PREFIX}n",
}
# The copy's bash runs `-c SCRIPT bash STATE`: SCRIPT sources the state file (errors
# silenced there, and `|| :` keeps -e from acting), then holds the trace flags and the
# code itself, so `set -x` traces read "+ cmd" and errors "bash: line N: ..." as in
# the session. Code too long for one argument (Linux: 128 KiB) is eval'd from the state
# instead (its traces then read "++ cmd").
_SOURCE_STATE = '\\builtin . "$1"\n'
_SCRIPT_ARG = "@coordex-copy-script@"  # the exec line expands SCRIPT here
_INLINE_CODE_LIMIT = 120_000
# Every variable name starts with a letter or "_": "${!a@}" ... lists them without a fork.
_ALL_NAMES = " ".join(f'"${{!{c}@}}"' for c in
                      "_abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


class _ProtectedCopy:
    """One protected read-only copy of a session's shell: its private files and group.

    The private folder (not the call's scratch, which the code may write) holds the pid
    the subshell writes before it ``exec``s the launcher (so the copy's process group
    id), the session's options and state, and the mode the launcher reports once
    protection held.
    """

    def __init__(self, request: RunRequest, env: Mapping[str, str]) -> None:
        assert request.scratch is not None
        self.folder = tempfile.mkdtemp(prefix="coordex-bash-ro-")
        self.pid_file = os.path.join(self.folder, "pid")
        self.options_file = os.path.join(self.folder, "options")
        self.state_file = os.path.join(self.folder, "state")
        self.mode_file = os.path.join(self.folder, "mode")
        bash = shutil.which("bash", path=env.get("PATH")) or "/bin/bash"
        self.spec = isolation.protected_bash_argv(
            request.protect_paths, request.scratch, report_path=self.mode_file,
            bash=(bash, "--norc", "--noprofile", "-c", _SCRIPT_ARG, "bash",
                  self.state_file), new_group=True)

    def command(self, code: str) -> str:
        """The bash text, run by the session's driver line, that starts the copy."""
        assert self.spec is not None
        q = _shell_quote
        p = PRIVATE_PREFIX
        skip = "|".join(sorted(_NOT_RESTORED))
        launcher = " ".join(f'"${p}run"' if arg == _SCRIPT_ARG else q(arg)
                            for arg in self.spec[0])
        if len(code.encode("utf-8", "surrogateescape")) < _INLINE_CODE_LIMIT:
            script = f'{p}run={q(_SOURCE_STATE)}"${p}f${p}ro"; '
        else:
            script = f'{p}run={q(_SOURCE_STATE)}\'\\builtin eval "${p}f${p}ro"\'; '
        restore_tail = "\\builtin set +xv\n} 2>/dev/null || :\n"
        return (
            # Note the trace flags (the driver line turned them on for this text), then
            # work untraced and with the user's -e/-u/-f off; the options are saved first.
            f"( {{ {p}f=; [[ $- == *x* ]] && {p}f+='set -x; '; "
            f"[[ $- == *v* ]] && {p}f+='set -v; '; \\builtin set +xv; }} 2>/dev/null\n"
            f"\\builtin printf %s \"$BASHPID\" >| {q(self.pid_file)}\n"
            f"{{ \\builtin shopt -p; \\builtin set +o; }} >| {q(self.options_file)} 2>/dev/null\n"
            f"\\builtin set +euf\n"
            f"{p}ro={q(code)}; {p}v=()\n"
            f"for {p}n in {_ALL_NAMES}; do case ${p}n in ({skip}) ;; "
            f'(*) {p}v+=("${p}n") ;; esac; done\n'
            f"{{ \\builtin printf '{{\\n'; \\builtin declare -p \"${{{p}v[@]}}\"; "
            f"\\builtin declare -f; \\builtin alias -p; "
            f"\\builtin printf '\\\\builtin . %s\\n' {q(q(self.options_file))}; "
            f"\\builtin printf 'set --'; (($#)) && \\builtin printf ' %q' \"$@\"; "
            f"\\builtin printf %s {q(chr(10) + restore_tail)}; }} >| {q(self.state_file)} "
            "2>/dev/null\n"
            f"{script}\\builtin exec {launcher} )"
        )

    def pgid(self) -> int | None:
        """The copy's process group, once the subshell has written its pid."""
        try:
            with open(self.pid_file) as f:
                pid = int(f.read().strip() or 0)
        except (OSError, ValueError):
            return None
        return pid if pid > 1 else None

    def signal(self, sig: signal.Signals) -> None:
        """Signal the copy's process group (before the launcher made it, a no-op)."""
        pgid = self.pgid()
        if pgid is not None:
            _signal_group(pgid, sig)

    def files(self) -> str:
        """The mode the launcher reported, "none" if it never reported one."""
        try:
            with open(self.mode_file) as f:
                mode = f.read().strip()
        except OSError:
            return "none"
        return mode if mode in ("discarded", "refused") else "none"

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


# -- one bash process ------------------------------------------------------------------


class _Stream:
    """One output stream of a call: decoded incrementally, bounded, streamed out."""

    def __init__(self, name: str, request: RunRequest) -> None:
        self.name = name
        self.request = request
        self.buffer = OutputBuffer(request.output_limit)
        # Invalid UTF-8 (binary output) becomes U+FFFD; a character split across two
        # reads is held back until its remaining bytes arrive.
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes, final: bool = False) -> None:
        text = self._decoder.decode(data, final)
        if text:
            self.buffer.write(text)
            emit(self.request, self.name, text)


@dataclass
class _Ending:
    """How one exchange with bash ended (raw facts; wording is ShellSession's job)."""

    exit_code: int | None = None
    timed_out: bool = False
    aborted: bool = False  # SIGINT abandoned the driver line (bash then prints "\n")
    survived: bool = True
    returncode: int | None = None  # bash's own exit status when it ended during the call


class _Shell:
    """One bash process, its pipes and its process group. Knows nothing of sessions."""

    def __init__(self, env: Mapping[str, str], cwd: str | None) -> None:
        self.token = secrets.token_hex(8).encode()
        code_r, code_w = os.pipe()
        status_r, status_w = os.pipe()
        child_code = fcntl.fcntl(code_r, fcntl.F_DUPFD_CLOEXEC, PRIVATE_FD_FLOOR)
        child_status = fcntl.fcntl(status_w, fcntl.F_DUPFD_CLOEXEC, PRIVATE_FD_FLOOR)
        os.close(status_w)
        try:
            self._proc = subprocess.Popen(
                BASH_ARGV, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, env=dict(env), cwd=cwd, start_new_session=True,
                pass_fds=(child_code, child_status), bufsize=0,
            )
        except BaseException:
            for fd in (code_r, code_w, status_r, child_code, child_status):
                os.close(fd)
            raise
        os.close(child_code)
        os.close(child_status)
        self.pid = self._proc.pid
        assert self._proc.stdin and self._proc.stdout and self._proc.stderr
        self._stdin = self._proc.stdin.fileno()
        self._stdout = self._proc.stdout.fileno()
        self._stderr = self._proc.stderr.fileno()
        # We keep the code pipe's read end too: after an interrupt it may hold code bash
        # never read, and we drain it so the next call's read starts clean. It stays
        # blocking: O_NONBLOCK belongs to the open pipe, which bash's copy shares.
        self._code_r, self._code_w, self._status_r = code_r, code_w, status_r
        for fd in (self._stdout, self._stderr, self._status_r, self._code_w):
            os.set_blocking(fd, False)
        self._status_buf = b""
        self._reap_lock = threading.Lock()
        self._reaped = False
        self._released = False

        self._driver, self._sync = _driver_lines(self.token.decode(), child_code,
                                                 child_status)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._stdout, selectors.EVENT_READ, "stdout")
        self._selector.register(self._stderr, selectors.EVENT_READ, "stderr")
        self._selector.register(self._status_r, selectors.EVENT_READ, "status")
        self._pidfd: int | None = None
        try:
            self._pidfd = os.pidfd_open(self.pid)
            self._selector.register(self._pidfd, selectors.EVENT_READ, "pidfd")
        except (AttributeError, OSError):
            self._pidfd = None
        self._start()

    def _start(self) -> None:
        # History off (and no file to write it to), prompts empty, aliases on. The
        # startup warnings of an interactive bash without a terminal ("no job control
        # in this shell") are read and dropped with the rest of this exchange.
        setup = (
            br"\builtin set +o history +H; \builtin unset HISTFILE MAILCHECK; "
            br"\builtin shopt -s expand_aliases; __coordex_flags=; "
        ) + self._sync
        ending = self.exchange(setup, None, RunRequest(code="", timeout=START_TIMEOUT),
                               interruptible=False)
        if ending.timed_out or ending.returncode is not None:
            self.terminate()
            self.release()
            raise RuntimeError(f"bash did not start (pid {self.pid}, ending {ending})")

    # -- state ---------------------------------------------------------------------

    def alive(self) -> bool:
        return not self._reaped and self._proc.poll() is None

    # -- one exchange ------------------------------------------------------------------

    def run(self, code: str, request: RunRequest, copy: _ProtectedCopy | None = None,
            ) -> tuple[_Stream, _Stream, _Ending]:
        """Run ``code`` through the driver line; returns the two streams and the ending.

        With ``copy``, the code starts a protected copy in its own process group: a
        timeout interrupts that group too, kills it (not the session) if it ignores the
        interrupt, and whatever the copy left running is ended afterwards.
        """
        payload = code.replace("\0", "").encode("utf-8", "surrogateescape") + b"\0"
        out, err = _Stream("stdout", request), _Stream("stderr", request)
        try:
            ending = self.exchange(self._driver, payload, request, streams=(out, err),
                                   copy=copy)
        finally:
            if copy is not None:
                copy.signal(signal.SIGKILL)  # its background jobs, and so its namespaces
        return out, err, ending

    def exchange(self, line: bytes, payload: bytes | None, request: RunRequest, *,
                 streams: tuple[_Stream, _Stream] | None = None,
                 interruptible: bool = True, copy: _ProtectedCopy | None = None) -> _Ending:
        out, err = streams or (_Stream("stdout", request), _Stream("stderr", request))
        by_name = {"stdout": (self._stdout, out), "stderr": (self._stderr, err)}
        ending = _Ending()
        pending = memoryview(payload or b"")
        expect = b"s" if payload is None else b"r"
        try:
            os.write(self._stdin, line)
        except OSError:  # bash is gone; its pidfd / poll says so below
            pass
        pending = self._write_code(pending)
        if pending:
            self._selector.register(self._code_w, selectors.EVENT_WRITE, "code")
        deadline = time.monotonic() + request.timeout
        finished = False
        copy_killed = False
        try:
            while not finished:
                wait = deadline - time.monotonic()
                if wait <= 0:
                    if ending.timed_out and copy is not None and not copy_killed:
                        # The copy ignored SIGINT: kill it alone; the session's shell,
                        # waiting for it, then runs the sync line.
                        copy_killed = True
                        copy.signal(signal.SIGKILL)
                        deadline = time.monotonic() + INTERRUPT_GRACE
                        continue
                    if ending.timed_out or not interruptible:
                        ending.timed_out = True
                        ending.survived = False
                        self.terminate()
                        break
                    ending.timed_out = True
                    self._interrupt()
                    if copy is not None:
                        copy.signal(signal.SIGINT)
                    expect = b"s"
                    deadline = time.monotonic() + INTERRUPT_GRACE
                    continue
                if self._pidfd is None:
                    wait = min(wait, POLL_FALLBACK)
                for key, _mask in self._selector.select(wait):
                    what = key.data
                    if what == "code":
                        pending = self._write_code(pending)
                        if not pending:
                            self._selector.unregister(self._code_w)
                    elif what == "status":
                        for kind, status in self._read_status():
                            if kind == b"r":
                                ending.exit_code = status
                            elif ending.exit_code is None:
                                ending.exit_code = status
                                ending.aborted = True
                            if kind == expect:
                                finished = True
                    elif what == "pidfd":
                        finished = True
                    else:
                        fd, stream = by_name[what]
                        self._pump(fd, stream)
                if self._pidfd is None and self._proc.poll() is not None:
                    finished = True
        finally:
            if pending:
                self._selector.unregister(self._code_w)
        for fd, stream in by_name.values():
            self._pump(fd, stream)
            stream.feed(b"", final=True)
        if self._proc.poll() is not None or self._reaped:
            ending.survived = False
            ending.returncode = self._proc.wait()
            self.terminate()  # background jobs of the dead shell go with it
        elif ending.timed_out:
            self._drain_code()
        return ending

    def _interrupt(self) -> None:
        # SIGINT to the whole group reaches the foreground command and bash; background
        # jobs ignore it (bash sets SIGINT to ignored for them without job control).
        _signal_group(self.pid, signal.SIGINT)
        try:
            os.write(self._stdin, self._sync)
        except OSError:
            pass

    def _write_code(self, pending: memoryview) -> memoryview:
        while pending:
            try:
                written = os.write(self._code_w, pending)
            except BlockingIOError:
                return pending
            except OSError:  # bash died; nothing more will be read
                return pending[len(pending):]
            pending = pending[written:]
        return pending

    def _drain_code(self) -> None:
        # An interrupt can land while bash reads the code pipe (or before it read the
        # driver line at all); what it did not read would be the next call's "code".
        # Bash is idle (the sync line ran), so reading no more than FIONREAD reports
        # never blocks.
        size = array.array("i", [0])
        fcntl.ioctl(self._code_w, termios.FIONREAD, size)
        while size[0] > 0:
            size[0] -= len(os.read(self._code_r, size[0]))

    def _pump(self, fd: int, stream: _Stream) -> None:
        """Read what ``fd`` has now (never blocks) into ``stream``."""
        while True:
            try:
                data = os.read(fd, READ_CHUNK)
            except BlockingIOError:
                return
            except OSError:
                return
            if not data:
                # The command closed the shell's stdout/stderr (or bash died): stop
                # watching it, or the selector would report EOF forever.
                try:
                    self._selector.unregister(fd)
                except (KeyError, ValueError):
                    pass
                return
            stream.feed(data)
            if len(data) < READ_CHUNK:
                return

    def _read_status(self) -> list[tuple[bytes, int]]:
        try:
            self._status_buf += os.read(self._status_r, 4096)
        except (BlockingIOError, OSError):
            return []
        records = []
        *lines, self._status_buf = self._status_buf.split(b"\n")
        for raw in lines:
            parts = raw.split()
            if len(parts) == 3 and parts[0] == self.token:
                try:
                    records.append((parts[1], int(parts[2])))
                except ValueError:
                    pass
        return records

    # -- ending ------------------------------------------------------------------------

    def terminate(self, grace: float = CLOSE_GRACE) -> None:
        """End bash and every process in its group: TERM, wait, KILL. Thread-safe."""
        with self._reap_lock:
            if self._reaped:
                return
            _signal_group(self.pid, signal.SIGTERM)
            # An interactive bash ignores SIGTERM; SIGHUP is how it is told to go.
            try:
                os.kill(self.pid, signal.SIGHUP)
            except ProcessLookupError:
                pass
            try:
                self._proc.wait(grace)
            except subprocess.TimeoutExpired:
                _signal_group(self.pid, signal.SIGKILL)
                self._proc.wait()
            # Bash is reaped; anything left in its group ignored SIGTERM (or is a
            # zombie on its way to init). Give it the grace, then SIGKILL.
            end = time.monotonic() + grace
            while _group_exists(self.pid) and time.monotonic() < end:
                time.sleep(0.005)
            _signal_group(self.pid, signal.SIGKILL)
            self._reaped = True

    def release(self) -> None:
        """Close our ends of the pipes. Only when no exchange is running."""
        if self._released:
            return
        self._released = True
        self._selector.close()
        for fd in (self._code_r, self._code_w, self._status_r, self._pidfd):
            if fd is not None:
                os.close(fd)
        for stream in (self._proc.stdin, self._proc.stdout, self._proc.stderr):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_exists(pgid: int) -> bool:
    """Whether a live (non-zombie) process is left in group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    # kill(0) also counts zombies, and an orphaned zombie stays one for good where
    # pid 1 does not reap (many containers); only /proc tells them apart.
    try:
        entries = os.listdir("/proc")
    except OSError:
        return True
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                # "pid (comm) state ppid pgrp ...": comm may hold spaces and parens.
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != b"Z":
            return True
    return False


def _shell_env(env: Mapping[str, str] | None) -> dict[str, str]:
    merged = dict(os.environ if env is None else env)
    merged.update(FIXED_ENV)
    return merged


# -- outcomes ----------------------------------------------------------------------------


def _signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def _outcome(out: _Stream, err: _Stream, ending: _Ending, timeout: float, *,
             stateless: bool) -> Outcome:
    stdout, stderr = out.buffer.getvalue(), err.buffer.getvalue()
    if ending.aborted and stderr.endswith("\n"):
        stderr = stderr[:-1]  # the newline an interactive bash prints for ^C, not the user's
    outcome: Outcome = {
        "stdout": stdout, "stderr": stderr,
        "truncated": out.buffer.truncated or err.buffer.truncated,
        "result": None, "exit_code": ending.exit_code, "images": [],
    }
    state_lost = not ending.survived and not stateless
    if ending.timed_out:
        outcome["error"] = _timeout_error(timeout, ending.survived, stateless,
                                          stdout=stdout, stderr=stderr)
    elif ending.returncode is not None and ending.returncode < 0:
        outcome["exit_code"] = None
        outcome["error"] = _crashed_error(_signal_name(ending.returncode), stateless)
    elif ending.returncode is not None:
        # `exit N` ended the shell: a normal result with that status, never retried.
        outcome["exit_code"] = ending.returncode
    if state_lost:
        outcome["state_lost"] = True
    return outcome


def _timeout_error(timeout: float, survived: bool, stateless: bool, *, stdout: str,
                   stderr: str) -> dict[str, Any]:
    longer = f"timeout={max(timeout * 4, 60):g}"
    background = "run it in the background (`cmd > out.log 2>&1 &`) and read the log later"
    if stateless:
        return make_error(
            "timeout", f"The command was still running after the {timeout:g} s timeout and "
            "was stopped.",
            f"Raise the limit (e.g. {longer}), {background} in a stateful session, or split "
            "the work into shorter steps.",
            stdout=stdout, stderr=stderr, state_lost=False)
    if survived:
        return make_error(
            "timeout", f"The command was still running after the {timeout:g} s timeout and "
            "was interrupted with SIGINT.",
            "The session survived: its variables, functions, aliases, options and cwd are "
            f"kept. Raise the limit (e.g. {longer}), {background}, or split the work into "
            "shorter steps.",
            stdout=stdout, stderr=stderr, state_lost=False)
    return make_error(
        "timeout", f"The command was still running after the {timeout:g} s timeout, did not "
        f"stop within {INTERRUPT_GRACE:g} s of SIGINT, and the shell was killed.",
        "The session was restarted and its state is lost: re-create the variables, "
        "functions, aliases and cwd you need. Then raise the limit (e.g. "
        f"{longer}) or {background}; do not ignore SIGINT (`trap '' INT`).",
        stdout=stdout, stderr=stderr, state_lost=True)


def _crashed_error(signame: str, stateless: bool) -> dict[str, Any]:
    if stateless:
        return make_error(
            "crashed", f"The bash shell was killed by {signame} during the call.",
            "Check whether the command signals its own shell (e.g. `kill $$`); run such a "
            "command in a subshell `( ... )` instead.", state_lost=True)
    return make_error(
        "crashed", f"The session's bash shell was killed by {signame} during the call; the "
        "command was not retried.",
        "The next call starts a fresh shell: re-create the variables, functions, aliases "
        "and cwd you need, then run the command again. If the command signals its own shell "
        "(e.g. `kill $$`), run it in a subshell `( ... )` or a stateless call.",
        state_lost=True)


def _closed_outcome() -> Outcome:
    return {"stdout": "", "stderr": "", "truncated": False, "result": None,
            "exit_code": None, "images": [],
            "error": make_error("crashed", "This bash session was closed (its shell and "
                                "every process it started were ended).",
                                "Start a new session with a stateful call, or use "
                                "state_mode='stateless'.", state_lost=True),
            "state_lost": True}


def _start_failed(exc: BaseException) -> Outcome:
    return {"stdout": "", "stderr": "", "truncated": False, "result": None,
            "exit_code": None, "images": [],
            "error": make_error("crashed", f"Could not start bash: {exc}.",
                                "Check that bash is installed and the working folder "
                                "exists; the session's previous state is lost.",
                                state_lost=True),
            "state_lost": True}


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
        self._loss_reported = False
        self._copy: _ProtectedCopy | None = None  # the read-only copy running now
        self._shell = _Shell(self._env, cwd)
        self._baseline = self._dump(self._shell)

    @property
    def pid(self) -> int:
        """The pid (and process group id) of the current bash."""
        return self._shell.pid

    def alive(self) -> bool:
        return not self._closed and self._shell.alive()

    # -- calls -------------------------------------------------------------------------

    def run(self, request: RunRequest) -> Outcome:
        """Run ``request.code`` in the kept shell; what it changes stays."""
        return self._call(request.code, request)

    def run_read_only(self, request: RunRequest) -> Outcome:
        """Run ``request.code`` against a throwaway copy of the session.

        With ``request.scratch`` set and protection available here, the copy runs under
        :mod:`.isolation` and ``isolation.files`` is the mode its launcher reported;
        otherwise a plain subshell runs it and ``files`` is ``"none"``.
        """
        copy = _ProtectedCopy(request, self._env) if request.scratch is not None else None
        try:
            if copy is None or copy.spec is None:
                outcome = self._call(self.read_only_command(request.code, request.scratch),
                                     request)
                files = "none"
            else:
                outcome = self._call(copy.command(request.code), request, copy)
                files = copy.files()
        finally:
            if copy is not None:
                copy.remove()
        outcome["isolation"] = {"names": True, "objects": True, "files": files}
        return outcome

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

    def inspect(self) -> dict[str, Any]:
        """What the session added to the environment it started with; changes nothing.

        Returns ``{"cwd", "variables": {name: value}, "functions": [names],
        "aliases": {name: value}}``; variables include inherited ones whose value the
        session changed. Adds ``state_lost: True`` if the shell had died and was replaced.
        """
        with self._lock:
            if self._closed:
                return _closed_outcome()["error"]
            lost = self._ensure_shell()
            if isinstance(lost, dict):
                return lost["error"]
            now = self._dump(self._shell)
        base_vars = self._baseline["variables"]
        report: dict[str, Any] = {
            "cwd": now["cwd"],
            "variables": {k: v for k, v in now["variables"].items() if base_vars.get(k) != v},
            "functions": sorted(set(now["functions"]) - set(self._baseline["functions"])),
            "aliases": {k: v for k, v in now["aliases"].items()
                        if self._baseline["aliases"].get(k) != v},
        }
        if lost:
            report["state_lost"] = True
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

    def __enter__(self) -> ShellSession:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------

    def _call(self, code: str, request: RunRequest,
              copy: _ProtectedCopy | None = None) -> Outcome:
        with self._lock:
            if self._closed:
                return _closed_outcome()
            lost = self._ensure_shell()
            if isinstance(lost, dict):
                return lost
            self._copy = copy
            try:
                out, err, ending = self._shell.run(code, request, copy)
            finally:
                self._copy = None
            outcome = _outcome(out, err, ending, request.timeout, stateless=False)
            if self._closed:
                # close() from another thread ended the shell under this call; the call
                # may even have finished normally in the race, but its session is gone.
                closed = _closed_outcome()
                outcome.update(error=closed["error"], state_lost=True)
                return outcome
            if not ending.survived:
                # Already told to the caller in this outcome: the next call's fresh shell
                # is not news.
                self._loss_reported = True
            if lost:
                outcome["state_lost"] = True
            return outcome

    def _ensure_shell(self) -> bool | Outcome:
        """Replace a dead shell. True if state was lost unannounced; an outcome on failure."""
        if self._shell.alive():
            return False
        announced = self._loss_reported
        self._shell.terminate()
        self._shell.release()
        try:
            self._shell = _Shell(self._env, self._cwd)
            self._baseline = self._dump(self._shell)
        except (OSError, RuntimeError) as exc:
            return _start_failed(exc)
        self._loss_reported = False
        return not announced

    @staticmethod
    def _dump(shell: _Shell) -> dict[str, Any]:
        request = RunRequest(code=_DUMP, timeout=INSPECT_TIMEOUT, output_limit=1 << 30)
        out, _err, ending = shell.run(_DUMP, request)
        if ending.timed_out or not ending.survived:
            raise RuntimeError(f"could not read the state of bash (pid {shell.pid})")
        return _parse_dump(out.buffer.getvalue())


def _parse_dump(text: str) -> dict[str, Any]:
    fields = text.split("\0")
    state: dict[str, Any] = {"cwd": "", "variables": {}, "functions": [], "aliases": {}}
    i = 0
    while i < len(fields) - 1:
        kind = fields[i]
        if kind == "c":
            state["cwd"] = fields[i + 1]
            i += 2
        elif kind == "f":
            state["functions"].append(fields[i + 1])
            i += 2
        elif kind in ("v", "a", "l") and i + 2 < len(fields):
            name, value = fields[i + 1], fields[i + 2]
            if kind == "l":
                state["aliases"][name] = value
            elif name not in VOLATILE_VARIABLES and not name.startswith(PRIVATE_PREFIX):
                if kind == "a":  # `declare -a x=(...)`: keep the value text after `=`
                    value = value.split("=", 1)[1] if "=" in value else ""
                state["variables"][name] = value
            i += 3
        else:
            i += 1
    state["functions"] = [f for f in state["functions"] if not f.startswith(PRIVATE_PREFIX)]
    return state


def run_stateless(request: RunRequest, *, env: dict[str, str] | None = None,
                  cwd: str | None = None) -> Outcome:
    """Run ``request.code`` in a fresh shell that is closed (its whole group killed) after."""
    try:
        shell = _Shell(_shell_env(env), cwd)
    except (OSError, RuntimeError) as exc:
        outcome = _start_failed(exc)
        outcome.pop("state_lost")
        outcome["error"]["state_lost"] = False
        return outcome
    try:
        out, err, ending = shell.run(request.code, request)
    finally:
        shell.terminate()
        shell.release()
    return _outcome(out, err, ending, request.timeout, stateless=True)
