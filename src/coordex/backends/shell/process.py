"""One bash process, its pipes and its process group; it knows nothing of sessions.

How it works
------------
A :class:`Shell` is one ``bash --norc --noprofile --noediting -i +m`` started in a new
process session, so it leads its own process group and has no terminal. It is
*interactive* on purpose: only an interactive bash answers SIGINT the way a terminal
user expects (the running command line is abandoned, the shell goes back to reading
the next one, every variable, function, alias, option and the cwd intact). ``+m``
turns job control off, so background jobs stay in the shell's process group (close()
reaps them) and ignore SIGINT (a timeout never kills them).

Bash's own fd 2 is a private *status pipe*, its fd 1 ``/dev/null``. The user's stdout
and stderr are two pipes the host reads and bash holds no writer on: each call's code
opens writers of its own on them by path (``/proc/HOST/fd/N``) and closes them when it
ends, so a pipe still held after a call is held by a job the call left running, and is
retired (:mod:`..late_output`): that job's later output is dropped, never another
call's. (Without ``/proc``, bash keeps the pipes and every call shares them.)
Each call is one *trigger line* on bash's stdin: assignments of the call number, of
the code as one ``$'...'`` word, and of ``PROMPT_COMMAND`` to a fixed *runner*. Bash
runs PROMPT_COMMAND after the line, non-interactively (no ``[1] 1234`` job notices,
no ``exit`` echo) and at the top level (``declare`` makes globals). The runner unsets
PROMPT_COMMAND, sources a nameless file (by the path of our descriptor of it,
``/proc/HOST/fd/N``, so bash holds none of ours) whose one line evals the code
with stdin at /dev/null, the call's output pipes on fds 1 and 2 -
sourced so that bash cleans finished foreground jobs out of its job table and
``return`` ends the code - and then sets PS1 to the *record* ``TOKEN r CALL STATUS
FLAGS``, prints it to bash's fd 2 (the status pipe) and empties PS1 (an interrupt
before the print leaves it to bash, which prints PS1 just before it reads the next
line); reading that record is how completion is detected. The runner then tries
stdin a moment before bash sleeps in its read (``wire.SPIN_READS``). The code's
output was written before the record, so both pipes are then drained without
blocking. Everything else bash prints there - startup warnings, ``set -x`` traces and
``set -v`` echoes of our own lines, the newline after ^C - is never the user's and is
skipped; user output is never parsed, so nothing a command prints can fake completion,
and output without a trailing newline is kept exactly. PROMPT_COMMAND restores the
parser's ``set -v`` and expand_aliases when it ends; the record's FLAGS let the next
trigger line put back what the code chose. For a short call the caller polls the
pipes without sleeping for a moment (``SPIN_SECONDS``): a wake-up costs more than the
whole call.

On timeout the process group gets SIGINT - once bash has read the whole trigger line,
so no interrupt can cut it - and a *sync line* that sets PS1 to ``TOKEN s CALL
STATUS FLAGS`` is queued behind it; if that record arrives within
``INTERRUPT_GRACE`` the shell survived. Otherwise the group is killed and the next
call gets a fresh shell. Records carry the call number, so a prompt printed twice
(an interrupt that lands while bash waits) is never taken for a later call's. A
pidfd reports the shell's death (``exit 3``, a signal) without polling.

:mod:`.session` keeps one :class:`Shell` per session (and a fresh one per stateless
call); :mod:`.copies` runs read-only calls in protected copies of it.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import os
import secrets
import select
import shutil
import signal
import subprocess
import tempfile
import termios
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from ...protocol import SPIN_SECONDS
from ...worker import _coordex_copy as copier
from .. import _reap, late_output
from ..base import INTERRUPT_GRACE, PAGER_ENV, RunRequest, StreamCapture
from .wire import SYNC_ALIASES as _SYNC_ALIASES
from .wire import ShellProtocol as _Protocol
from .wire import fork_line as _fork_line
from .wire import parse_flags as _parse_flags
from .wire import quote_code as _quote_code
from .wire import sync_line as _sync_line

# How a shell is stopped (module ``_reap``): SIGHUP asks bash to leave, then TERM, KILL;
# a kept session's shell also takes the members that left its group (``set -m`` jobs).
_SHELL_STEPS = _reap.Steps(interrupt=False, whole_session=True)
# Past a timeout's grace the shell has had its interrupt: straight to SIGKILL.
# Starting bash is ours, not the user's: a generous fixed limit.
START_TIMEOUT = 15.0
# Our pipe ends inside bash sit at fd >= 200: users `exec 3>file`, bash itself saves
# fds at 10 and up, so the low numbers are theirs.
PRIVATE_FD_FLOOR = 200
# Where pidfds are missing (Linux < 5.3), the selector wakes this often to poll bash.
POLL_FALLBACK = 0.05
READ_CHUNK = 65536

BASH_ARGV = ("bash", "--norc", "--noprofile", "--noediting", "-i", "+m")
# Pagers never take over and programs do not draw for a terminal that is not there.
FIXED_ENV = {**PAGER_ENV, "TERM": "dumb"}


# What ending a call takes after its kill (reap, drain): kept inside timeout + grace.
END_MARGIN = 0.2
# A timeout never interrupts bash while it still reads a (large) trigger line - what it
# would make of the rest of the line is not something to rely on: it waits for the
# handover, polling this often, for at most INTERRUPT_GRACE.
HANDOVER_POLL = 0.002


def read_available(fd: int, stream: Stream) -> bool:
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


class Stream(StreamCapture):
    """One output stream of a bash call: terminal queries dropped (see StreamCapture)."""

    __slots__ = ()

    def __init__(self, name: str, request: RunRequest) -> None:
        super().__init__(name, request, queries=True)


@dataclass
class Ending:
    """How one exchange with bash ended (raw facts; wording is ShellSession's job)."""

    exit_code: int | None = None
    timed_out: bool = False
    aborted: bool = False  # the code did not finish: the status is the sync line's
    survived: bool = True
    returncode: int | None = None  # bash's own exit status when it ended during the call
    started: bool = False  # bash read and parsed the line (its "go" record came)


_STDOUT, _STDERR, _STATUS, _STDIN, _PIDFD = range(5)
# How the output pipes are watched during a call (see Shell.__init__).
_OUTPUT_EVENTS = select.EPOLLIN | select.EPOLLET


class Shell:
    """One bash process, its pipes and its process group. Knows nothing of sessions."""

    framed = False  # each line sent after its length (a fork's loop: wire.FORK_LOOP)

    def __init__(self, env: Mapping[str, str], cwd: str | None) -> None:
        token = secrets.token_hex(8)
        self.token = token.encode()
        status_r, status_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        # Each call's code opens writers of its own on the two pipes (late_output); bash
        # holds none. Without /proc, bash keeps them as before: its fd 1, and the user's
        # stderr at a high fd (bash's own fd 2 is the status pipe).
        self.per_call = late_output.per_call_pipes_work(out_r)
        child_err = fcntl.fcntl(err_w, fcntl.F_DUPFD_CLOEXEC, PRIVATE_FD_FLOOR)
        os.close(err_w)
        runner_fd = _anonymous_file()
        outputs = ((late_output.writer_path(out_r), late_output.writer_path(err_r))
                   if self.per_call else None)
        # Above the fixed private numbers (copies.py: _STATE_FD ... _CHANGES_FD) and both
        # passed fds.
        out_fd = max(child_err, runner_fd, PRIVATE_FD_FLOOR + 15) + 1
        # The numbers our fds have inside bash: a fork of it keeps them (fork_line).
        self.private_fds = (child_err, runner_fd, out_fd)
        # With per-call pipes bash opens the runner by the path of our own descriptor
        # of it, kept while the shell lives: bash holds none of ours.
        self._runner = runner_fd if self.per_call else -1
        protocol = _Protocol.build(
            token, child_err, runner_fd, out_fd, outputs=outputs,
            runner_path=late_output.writer_path(runner_fd) if self.per_call else None)
        try:
            os.write(runner_fd, protocol.runner)
            self._proc = _reap.spawn(
                BASH_ARGV, stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL if self.per_call else out_w, stderr=status_w,
                env=dict(env), cwd=cwd,
                pass_fds=() if self.per_call else (child_err, runner_fd),
                bufsize=0,
            )
        except BaseException:
            for fd in (status_r, err_r, out_r, self._runner):
                if fd >= 0:
                    os.close(fd)
            raise
        finally:
            for fd in (status_w, child_err, out_w):
                os.close(fd)
            if not self.per_call:
                os.close(runner_fd)
        self.family = self._proc.pid  # its process session (forks of it share it)
        assert self._proc.stdin
        self._attach(protocol, self._proc.stdin.fileno(), out_r, err_r, status_r)
        self._start()

    @classmethod
    def fork(cls, source: Shell, timeout: float) -> Shell:
        """A process fork of ``source`` (idle, between calls) driven as a shell of its
        own: a subshell of it running :data:`.wire.FORK_LOOP` on FIFOs opened here.

        It is not our child nor its session's leader (bash cannot ``setsid`` without
        exec): it leads a process group of its own in the source's process session,
        which stays watched by the keeper while any of them lives (``_reap.join``).
        Raises ``RuntimeError`` when no fork answered within ``timeout``.
        """
        folder = tempfile.mkdtemp(prefix="coordex-bash-fork-")
        fds: list[int] = []
        runner = -1
        try:
            for name in ("in", "out", "err", "status"):
                os.mkfifo(os.path.join(folder, name), 0o600)
            # Ours are opened first without blocking, so the fork's opens return at once
            # (``in`` read-write: its open for reading needs a writer).
            fds = [os.open(os.path.join(folder, "in"), os.O_RDWR | os.O_CLOEXEC)]
            fds += [os.open(os.path.join(folder, name),
                            os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
                    for name in ("out", "err", "status")]
            child_err, _runner_fd, out_fd = source.private_fds
            token = secrets.token_hex(8)
            if source.per_call:  # its calls open the fork's pipes, named by its own runner
                outputs = (late_output.writer_path(fds[1]), late_output.writer_path(fds[2]))
                runner = _anonymous_file()
                protocol = _Protocol.build(token, *source.private_fds, outputs=outputs,
                                           runner_path=late_output.writer_path(runner))
                os.write(runner, protocol.runner)
                line = _fork_line(folder, child_err, out_fd, per_call=True)
            else:
                protocol = _Protocol.build(token, *source.private_fds)
                line = _fork_line(folder, child_err, out_fd)
            ending = source.exchange_line(line.encode(), timeout)
            if ending.timed_out or not ending.survived:
                raise RuntimeError("the shell did not fork")
            deadline = time.monotonic() + timeout
            pid = 0
            while not pid:
                with contextlib.suppress(OSError, ValueError), \
                        open(os.path.join(folder, "pid"), "rb") as f:
                    pid = int(f.read() or b"0")
                if not pid:
                    if time.monotonic() > deadline:
                        raise RuntimeError("the shell's fork did not start")
                    time.sleep(0.001)
            self = cls.__new__(cls)
            self._proc = _Adopted(pid)  # type: ignore[assignment]
            self.private_fds = source.private_fds
            # Its process session is the source's: watched (and swept) while any of
            # the family lives, its group spared when the source closes.
            self.family = source.family
            self.framed = True
            self.per_call = source.per_call
            self._runner, runner = runner, -1  # kept while the fork lives (it reads it)
            _reap.join_family(self.family, pid)
            self.token = token.encode()
            self._attach(protocol, *fds)
            fds = []  # the fork's now
            self._start()
            return self
        finally:
            for fd in fds:
                os.close(fd)
            if runner >= 0:  # the fork did not start
                os.close(runner)
            shutil.rmtree(folder, ignore_errors=True)

    def exchange_line(self, line: bytes, timeout: float) -> Ending:
        """Hand bash ``line`` (ours, not a user's) followed by a sync line, and wait for
        the sync record."""
        self._number += 1
        line += _sync_line(self.token.decode(), self._number)
        return self.exchange(line, self._number, RunRequest(code="", timeout=timeout),
                             kind=b"s", interruptible=False)

    def _attach(self, protocol: _Protocol, stdin: int, stdout: int, stderr: int,
                status_r: int) -> None:
        self.pid = self._proc.pid
        self._stdin, self._stdout = stdin, stdout
        self._stderr, self._status_r = stderr, status_r
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
        # epoll: the output pipes are watched edge-triggered (between calls nobody
        # writes to them, and poll would report that hang-up again and again).
        self._poller = select.epoll()
        for fd in (self._stdout, self._stderr):
            self._poller.register(fd, _OUTPUT_EVENTS)
        self._poller.register(self._status_r, select.EPOLLIN)
        self._outputs = select.poll()
        for fd in (self._stdout, self._stderr):
            self._outputs.register(fd, select.POLLIN)
        self._pidfd: int | None = None
        try:
            self._pidfd = os.pidfd_open(self.pid)
            self._poller.register(self._pidfd, select.EPOLLIN)
            self._kinds[self._pidfd] = _PIDFD
        except (AttributeError, OSError):
            self._pidfd = None
        copier.hold(*self._held())  # closed in read-only copies of Python sessions

    def _held(self) -> list[int]:
        return [fd for fd in (self._stdin, self._stdout, self._stderr, self._status_r,
                              self._pidfd, self._poller.fileno(), self._runner)
                if fd is not None and fd >= 0]

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
            ) -> tuple[Stream, Stream, Ending]:
        """Run ``code`` through a trigger line; returns the two streams and the ending.

        ``spin=False``: wait in poll() at once (when a CPU is better left to others).
        """
        self._number += 1
        line = self._trigger % self._number + _quote_code(code, self.framed) + b"\n"
        if self._sync_aliases:
            line = _SYNC_ALIASES.encode() + b"; " + line
            self._sync_aliases = False
        if self._verbose != self._top_verbose:
            self._top_verbose = self._verbose
            line = (b"\\builtin set -v; " if self._verbose else b"\\builtin set +v; ") + line
        out, err = Stream("stdout", request), Stream("stderr", request)
        if not self.per_call:
            # SPEC 6: what a background job of an earlier call wrote since that call
            # returned is no call's output: it is dropped before this call begins.
            # (With per-call pipes, nothing the earlier call started writes here.)
            self._drop_stale_output()
        ending = self.exchange(line, self._number, request, streams=(out, err), spin=spin)
        if not ending.survived and not self.says_go:
            ending.started = True  # a bash without PS0 cannot tell: assume it started
        return out, err, ending

    def exchange(self, line: bytes, number: int, request: RunRequest, *,
                 streams: tuple[Stream, Stream] | None = None, kind: bytes = b"r",
                 interruptible: bool = True, spin: bool = True) -> Ending:
        """Hand ``line`` to bash and wait for record ``kind number`` (or bash's end)."""
        out, err = streams or (Stream("stdout", request), Stream("stderr", request))
        ending = Ending()
        if self.framed:  # a fork's loop reads each line after its length (wire.FORK_LOOP)
            line = b"%d\n" % len(line) + line
        pending = self._write_input(memoryview(line))
        if pending:
            self._poller.register(self._stdin, select.EPOLLOUT)
        now = time.monotonic()
        deadline = now + request.timeout
        # The kill comes END_MARGIN before timeout + grace: ending the group and draining
        # the pipes then fits in SPEC 6's bound, a stopped shell's included.
        handover_deadline = deadline + INTERRUPT_GRACE - END_MARGIN
        spin_until = now + SPIN_SECONDS if spin else 0
        sync_number = -1
        ended = finished = False
        # A cancelled request is interrupted at once, exactly as at its timeout.
        cancel = request.cancel if interruptible else None
        # Bash often answers while our write runs (woken on this CPU, it runs first):
        # its records are read at once, before any poll.
        ready_now: list[tuple[int, int]] | None = [(self._status_r, select.EPOLLIN)]
        try:
            while not finished:
                if cancel is not None and cancel.is_set() and now < deadline \
                        and not ending.timed_out:
                    deadline = now
                    handover_deadline = min(handover_deadline,
                                            now + INTERRUPT_GRACE - END_MARGIN)
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
                    deadline = min(now + INTERRUPT_GRACE, handover_deadline)
                    continue
                if spin_until:
                    wait: float = 0
                    if now >= spin_until:
                        spin_until = 0
                else:
                    wait = max(deadline - now, 0.0)
                    if self._pidfd is None or cancel is not None:
                        wait = min(wait, POLL_FALLBACK)
                if ready_now is not None:
                    ready, ready_now = ready_now, None
                else:
                    ready = self._poller.poll(wait)
                for fd, events in ready:
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
                            elif rkind == b"e" and isinstance(self._proc, _Adopted):
                                self._proc.said = status  # a fork's exit status
                    elif what == _STDOUT:
                        if events & select.EPOLLIN:  # (a hang-up alone: nothing to read)
                            self._pump(fd, out)
                    elif what == _STDERR:
                        if events & select.EPOLLIN:
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
        hung_up = set()
        for fd, events in self._outputs.poll(0):
            if events & select.POLLIN:
                self._pump(fd, out if fd == self._stdout else err)
            if events & select.POLLHUP:
                hung_up.add(fd)
        out.feed(b"", final=True)
        err.feed(b"", final=True)
        if ended or self._reaped or (self._pidfd is None and self._proc.poll() is not None):
            ending.survived = False
            if isinstance(self._proc, _Adopted):  # a fork says its status as it exits
                self._proc.take_status(self._read_status())
            ending.returncode = self._proc.wait()
            self.terminate()  # background jobs of the dead shell go with it
        elif self.per_call and kind == b"r" and len(hung_up) < 2:
            self._retire_held_pipes(hung_up)  # (only a call's code opens writers)
        return ending

    def _retire_held_pipes(self, hung_up: set[int]) -> None:
        """The code's writers are closed now: a pipe that did not hang up is held by a
        process the code left running. It gets a fresh pipe in its place, and what
        that process writes from now on is dropped (SPEC 6, module late_output)."""
        for fd in (self._stdout, self._stderr):
            if fd not in hung_up:
                self._poller.unregister(fd)
                late_output.renew(fd, self)
                self._poller.register(fd, _OUTPUT_EVENTS)

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
        signal_group(self.pid, signal.SIGINT)
        self._number += 1
        line = _sync_line(self.token.decode(), self._number)
        if self.framed:
            line = b"%d\n" % len(line) + line
        try:
            os.write(self._stdin, line)
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

    def _drop_stale_output(self) -> None:
        """Read and drop what waits on the output pipes now (never blocks); without
        per-call pipes only."""
        for fd, _events in self._outputs.poll(0):
            while True:
                try:
                    data = os.read(fd, READ_CHUNK)
                except OSError:  # BlockingIOError: drained
                    break
                if not data:
                    for poller in (self._poller, self._outputs):
                        try:
                            poller.unregister(fd)
                        except (KeyError, OSError):
                            pass
                    break

    def _pump(self, fd: int, stream: Stream) -> None:
        """Read what ``fd`` has now (never blocks) into ``stream``."""
        while True:
            try:
                data = os.read(fd, READ_CHUNK)
            except OSError:  # BlockingIOError: drained
                return
            if not data:
                if self.per_call:  # no writer now (edge-triggered: reported once)
                    return
                # The command closed the shell's stdout/stderr (or bash died): stop
                # watching it, or poll() would report end-of-file forever.
                for poller in (self._poller, self._outputs):
                    try:
                        poller.unregister(fd)
                    except (KeyError, OSError):
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
            except (KeyError, OSError):
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
            if isinstance(self._proc, _Adopted):  # a fork: its family may end with it
                _reap.leave_family(self.family, self.pid)
            return self.stop_step

    def release(self) -> None:
        """Close our ends of the pipes. Only when no exchange is running."""
        if self._released:
            return
        self._released = True
        copier.release(*self._held())
        late_output.forget(self)
        self._poller.close()
        for fd in (self._stdout, self._stderr, self._status_r, self._pidfd, self._runner):
            if fd is not None and fd >= 0:
                os.close(fd)
        if isinstance(self._proc, _Adopted):  # a fork's input is a FIFO opened here
            os.close(self._stdin)
        elif self._proc.stdin is not None:
            try:
                self._proc.stdin.close()
            except OSError:
                pass


class _Adopted(_reap.Adopted):
    """A fork of a session's shell: not our child (its parent is gone, or is a
    subreaper: reaped here then), its end read from ``/proc``; the status its EXIT
    trap said where it could not be reaped here."""

    def __init__(self, pid: int) -> None:
        super().__init__(pid, "(forked bash)", reaps=True, pause=0.002)
        self.said: int | None = None

    def take_status(self, records: list[tuple[bytes, int, int, bytes]]) -> None:
        """The exit status the fork's EXIT trap reported (``TOKEN e 0 STATUS :``)."""
        for kind, _number, status, _flags in records:
            if kind == b"e":
                self.said = status

    def ended(self) -> int:
        return -signal.SIGKILL if self.said is None else self.said  # else: it was killed


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


def signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def shell_env(env: Mapping[str, str] | None) -> dict[str, str]:
    merged = dict(os.environ if env is None else env)
    merged.update(FIXED_ENV)
    return merged
