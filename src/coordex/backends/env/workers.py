"""Python worker processes: one per stateful session, and fork-server templates.

How it works:

- :class:`_WorkerProcess` owns one OS process running ``worker/_coordex_worker.py``
  (launched by path with the environment's interpreter) and its four pipes: protocol in,
  protocol out, and the worker's fds 1 and 2, which this side reads directly. It knows
  how to start (checking the ``hello`` handshake), hold one *conversation* (send a
  message, stream output, answer capability calls, enforce the timeout by SIGINT then
  escalation) and stop (shutdown -> SIGINT -> SIGTERM -> SIGKILL of its process group,
  always reaped). It applies no fault policy.
- :class:`WorkerSession` holds one process for a stateful session: a process found dead
  is replaced (``state_lost``); one that dies during a call is replaced and the attempt
  reported with the fact ``died``. Whether the call is retried (SPEC section 6: once)
  is decided by the session owner from that fact (:mod:`coordex.core.faults`).
- :class:`WorkerTemplate` keeps clean workers that never run code themselves: each
  stateless call runs in a fresh fork child of one, taken from a few the worker keeps
  forked and warmed up (under a millisecond, against ten or more for an interpreter
  start). Idle templates are pooled so parallel stateless calls do not queue.

A call is one conversation on the protocol pipes; ``select.epoll`` waits on them, after
a short spin for in-process cells (see ``_converse``). Each run's code writes to output
pipes of its own (the run names them; module ``late_output``): a pipe something the
code started still holds when ``done`` arrives is retired, and what that writes later is
dropped - never a later call's output (SPEC 6).

Every outcome is a plain dict (``backends.base``); failures are SPEC error dicts.
"""

from __future__ import annotations

import array
import contextlib
import dataclasses
import fcntl
import os
import select
import signal
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...core import facts, messages
from ...core.coordinates import StateMode
from ...core.errors import ERROR_TYPES, CoordexError
from ...core.facts import Ran
from ...protocol import (
    PROTOCOL_VERSION,
    SPIN_SECONDS,
    WORKER_TO_HOST,
    LineReader,
    ProtocolError,
    decode,
    encode,
    from_wire,
    message,
    to_wire,
)
from ...worker import _coordex_copy as copier
from .. import _reap, late_output
from ..base import (
    INTERRUPT_GRACE,
    PAGER_ENV,
    CapabilityHost,
    Forked,
    RunRequest,
    StreamCapture,
    Writer,
    Written,
    made_scratch,
)
from . import branches, keep

WORKER_SCRIPT = Path(__file__).resolve().parents[2] / "worker" / "_coordex_worker.py"
START_TIMEOUT = 30.0  # a cold venv on a slow disk can take seconds to import site
CHILD_KILL_GRACE = 0.5  # after SIGUSR1 killed a fork child, how long for its `done`
# What ending a call takes after its last escalation (kill, reap, drain the pipes): the
# escalation ends this much before timeout + INTERRUPT_GRACE, so no call returns later
# than that (SPEC 6), a stopped worker's included.
END_MARGIN = 0.2
INSPECT_TIMEOUT = 10.0
_READ_SIZE = 1 << 16
_OUTPUT_EVENTS = select.EPOLLIN | select.EPOLLET  # how the output pipes are watched
_PIPE_SIZE = 1 << 20
RunMode = StateMode  # the state mode, defined once (core.coordinates)
# A read-only run whose copy never reported: no code of it ran against the session.
_NO_COPY_CLAIM = {"names": True, "objects": True, "files": "none", "copy": "fork"}
# After a timeout's interrupt was ignored: straight to SIGKILL.
_CANCEL_POLL = 0.05  # with a cancel event, the wait for a reply wakes this often to look


class WorkerStartError(CoordexError):
    """A worker process could not be started or did not complete the handshake."""

    def __init__(self, error: str, suggestion: str, log: str = "") -> None:
        super().__init__("crashed", error, suggestion, state_lost=True, log=log)


def worker_env(env: dict[str, str] | None) -> dict[str, str]:
    """The worker's environment: the given one (or ours) with pagers and plots tamed."""
    result = dict(os.environ if env is None else env)
    result.update(PAGER_ENV)
    result["MPLBACKEND"] = "Agg"  # workers have no display; figures are collected as PNG
    return result


# -- output capture -----------------------------------------------------------------------




@dataclass
class _Reply:
    """How one conversation with a worker ended."""

    message: dict[str, Any] | None = None  # the reply (`done`, `inspect_result`), if any
    stdout: str = ""
    stderr: str = ""
    truncated: bool = False
    interrupted: bool = False  # we sent SIGINT (the timeout passed)
    worker_killed: bool = False  # we killed the worker (it ignored the interrupt)
    untaken: bool = False  # it ended with the request still unread: the code never ran
    died: bool = False  # the worker ended during the call without us killing it
    notes: list[str] = field(default_factory=list)  # how it ended, for messages


# -- one process --------------------------------------------------------------------------


class _WorkerProcess:
    """One worker OS process, its pipes and its handshake. No fault policy here."""

    def __init__(self, python: str | Path, env: dict[str, str] | None, cwd: str | None,
                 start_timeout: float = START_TIMEOUT) -> None:
        self.python = str(python)
        self.capability_names: list[str] | None = None
        self.hello: dict[str, Any] = {}
        self.close_step: _reap.StopStep | None = None  # how the process was ended
        self._carry: dict[int, bytes] = {}
        self._counter = 0
        self._closed = False
        self._busy = False
        self._state_lock = threading.Lock()
        self._spawn(env, cwd)
        try:
            self._handshake(start_timeout)
        except BaseException:
            self.kill()
            raise

    @property
    def pid(self) -> int:
        return self._proc.pid

    def _spawn(self, env: dict[str, str] | None, cwd: str | None) -> None:
        if not os.path.exists(self.python):
            raise WorkerStartError(
                f"Cannot start a Python worker: interpreter {self.python!r} does not exist.",
                "Build the environment again (environments.build(venv_id)) or check the "
                "interpreter path.")
        to_worker_r, self._to_worker = os.pipe()
        self._from_worker, from_worker_w = os.pipe()
        self._out_r, out_w = os.pipe()
        self._err_r, err_w = os.pipe()
        for fd in (self._out_r, self._err_r):
            with contextlib.suppress(OSError, AttributeError):
                # Linux: a bigger pipe lets a chatty cell run ahead of our reads.
                import fcntl

                fcntl.fcntl(fd, 1031, _PIPE_SIZE)  # F_SETPIPE_SZ
        argv = [self.python, "-u", "-I", str(WORKER_SCRIPT),
                "--in", str(to_worker_r), "--out", str(from_worker_w)]
        try:
            # A session of its own (``_reap.spawn``): close() takes its fork children and
            # the user's subprocesses down with it, and so does the keeper if we die.
            self._proc = _reap.spawn(
                argv, stdin=subprocess.DEVNULL, stdout=out_w, stderr=err_w,
                pass_fds=(to_worker_r, from_worker_w), cwd=cwd, env=worker_env(env))
        except OSError as exc:
            for fd in (self._to_worker, self._from_worker, self._out_r, self._err_r):
                os.close(fd)
            raise WorkerStartError(
                f"Cannot start a Python worker with {self.python!r}: {exc}.",
                "Check that the environment's interpreter runs (rebuild the environment).")
        finally:
            for fd in (to_worker_r, from_worker_w, out_w, err_w):
                os.close(fd)
        self._attach()

    @classmethod
    def adopt(cls, python: str | Path, pid: int, fds: tuple[int, int, int, int],
              start_timeout: float = START_TIMEOUT) -> _WorkerProcess:
        """The worker a session's worker forked (``fork_session``): not our child, a
        session leader of its own, reached over ``fds`` (to it, from it, its stdout, its
        stderr). Waits for its ``hello``."""
        self = cls.__new__(cls)
        self.python = str(python)
        self.capability_names, self.hello, self.close_step = None, {}, None
        self._carry, self._counter, self._closed, self._busy = {}, 0, False, False
        self._state_lock = threading.Lock()
        # Not our child: its parent, the source worker, reaps it.
        self._proc = _reap.Adopted(pid, "(forked worker)")  # type: ignore[assignment]
        self._to_worker, self._from_worker, self._out_r, self._err_r = fds
        _reap.keeper().watch(pid)  # it ends if this process dies, as a spawned one does
        self._attach()
        try:
            self._handshake(start_timeout)
        except BaseException:
            self.kill()
            self._release_fds()
            raise
        return self

    def _attach(self) -> None:
        for fd in (self._out_r, self._err_r):
            os.set_blocking(fd, False)
        # A read-only copy of a Python session in this process must not reach them.
        copier.hold(self._to_worker, self._from_worker, self._out_r, self._err_r)
        self._eof: set[int] = set()
        self._reader = LineReader(self._from_worker)
        # Each call's code opens writers of its own on the output pipes (module
        # late_output); each run names them, and the worker holds none between calls.
        self.outputs: list[str] | None = None
        if late_output.per_call_pipes_work(self._out_r):
            self.outputs = [late_output.writer_path(self._out_r),
                            late_output.writer_path(self._err_r)]
        # epoll rather than selectors: this sits on every call's path, and the
        # selectors layer costs more than the system call it wraps. The output pipes
        # are watched edge-triggered: between calls they have no writer, a hang-up
        # poll() would report again and again.
        self._poll = select.epoll()
        self._poll.register(self._from_worker, select.EPOLLIN)
        for fd in (self._out_r, self._err_r):
            self._poll.register(fd, _OUTPUT_EVENTS)
        self._outputs = select.poll()  # at a call's end: what is left, who hung up
        for fd in (self._out_r, self._err_r):
            self._outputs.register(fd, select.POLLIN)
        copier.hold(self._poll.fileno())

    def _handshake(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        log = bytearray()
        lines: list[bytes] = []
        eof = False
        while not lines and not eof:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WorkerStartError(
                    f"The Python worker ({self.python}) did not announce itself within "
                    f"{timeout:g} s.", "Check that the interpreter starts (run it by hand); "
                    "a very slow disk may need a larger start timeout.", _tail(log))
            for fd, _ in self._poll.poll(left):
                if fd == self._from_worker:
                    data = self._read(fd)
                    if not data:
                        eof = True
                    lines.extend(self._reader.feed(data))
                else:
                    while data := self._read(fd):  # edge-triggered: all of it
                        log += data
        if not lines:
            self._proc.wait()
            raise WorkerStartError(
                f"The Python worker ({self.python}) exited with status "
                f"{self._proc.returncode} before the handshake.",
                "The interpreter must be CPython >= 3.8; the log shows why it stopped.",
                _tail(log))
        try:
            hello = decode(lines[0], WORKER_TO_HOST)
            if hello["type"] != "hello":
                raise ProtocolError(f"expected 'hello' first, got {hello['type']!r}")
        except ProtocolError as exc:
            raise WorkerStartError(
                f"The Python worker ({self.python}) did not start with a valid handshake: "
                f"{exc}.", "Something else printed to the protocol pipe, or the worker file "
                "is not coordex's; reinstall coordex.", _tail(log))
        if hello["protocol"] != PROTOCOL_VERSION:
            raise WorkerStartError(
                f"The Python worker speaks protocol {hello['protocol']!r}; this host speaks "
                f"protocol {PROTOCOL_VERSION}.", "The worker file and the host come from "
                "different coordex versions; reinstall coordex so both match.", _tail(log))
        self.hello = hello
        for line in lines[1:]:  # nothing should follow the hello unasked
            raise WorkerStartError(f"The Python worker sent {line[:200]!r} unasked after "
                                   "its handshake.", "Reinstall coordex.", _tail(log))
        if log:
            self._carry[self._err_r] = bytes(log)  # startup noise: shown with the first call

    # -- state ------------------------------------------------------------------------------

    def alive(self) -> bool:
        return not self._closed and self._proc.poll() is None

    def _read(self, fd: int) -> bytes:
        try:
            return os.read(fd, _READ_SIZE)
        except BlockingIOError:
            return b""
        except OSError:
            return b""  # treated as end of file

    def send(self, msg: dict[str, Any]) -> None:
        """Write one message; raises BrokenPipeError if the worker has gone."""
        data = memoryview(encode(msg))
        while data:
            data = data[os.write(self._to_worker, data):]

    def next_id(self) -> str:
        self._counter += 1
        return str(self._counter)

    def set_capabilities(self, names: list[str]) -> None:
        if names != self.capability_names:
            self.send(message("capabilities", names=names))
            self.capability_names = names

    # -- one conversation -----------------------------------------------------------------

    def converse(self, msg: dict[str, Any], reply_type: str, request: RunRequest,
                 capabilities: CapabilityHost | None, *, fork_child: bool = False) -> _Reply:
        """Send ``msg`` and serve the worker until its ``reply_type`` reply (or its end).

        Output on fds 1/2 is streamed through ``emit`` and captured up to the request's
        limit. Past ``request.timeout`` the worker gets SIGINT; if ``fork_child``, after
        the grace period the worker is told to kill its fork child (SIGUSR1); after a
        last grace the worker itself is killed.
        """
        with self._state_lock:
            if self._closed:
                return _Reply(died=True, notes=["the worker was closed"])
            self._busy = True
        try:
            return self._converse(msg, reply_type, request, capabilities, fork_child)
        finally:
            with self._state_lock:
                self._busy = False
                closed = self._closed
            if closed:
                self._release_fds()

    def _converse(self, msg: dict[str, Any], reply_type: str, request: RunRequest,
                  capabilities: CapabilityHost | None, fork_child: bool) -> _Reply:
        # SPEC 6: what a process an earlier call started wrote since that call returned
        # is no call's output: it is dropped before this call begins.
        if self.outputs is None:
            self._drop_stale_output()
        captures = {self._out_r: StreamCapture("stdout", request),
                    self._err_r: StreamCapture("stderr", request)}
        reply = _Reply()
        for fd, capture in captures.items():
            carried = self._carry.pop(fd, b"")
            if carried:
                capture.feed(carried)
        try:
            self.send(msg)
        except OSError:
            reply.untaken = True
            return self._ended(reply, captures, killed=False)
        escalate_at = time.monotonic() + request.timeout
        # Fork runs take longer than the spin, and spinning would take the CPU a
        # fork child needs on a small machine: spin only for in-process cells.
        spin_until = time.monotonic() + (0.0 if fork_child else SPIN_SECONDS)
        stage = 0  # 0 running, 1 interrupted, 2 fork child killed
        cancel = request.cancel  # a cancelled request is interrupted as at its timeout
        while reply.message is None:
            now = time.monotonic()
            if cancel is not None and cancel.is_set() and stage == 0:
                escalate_at = now
                cancel = None
            if now >= escalate_at:
                if stage == 0:
                    reply.interrupted = True
                    self._signal(signal.SIGINT)
                    last = escalate_at + INTERRUPT_GRACE - END_MARGIN  # the worker's end
                    stage, escalate_at = 1, last - (CHILD_KILL_GRACE if fork_child else 0.0)
                elif stage == 1 and fork_child:
                    self._signal(signal.SIGUSR1)
                    stage, escalate_at = 2, now + CHILD_KILL_GRACE
                else:
                    reply.worker_killed = True
                    # A worker stopped (or stuck) before it read the request leaves it
                    # in the pipe: then the code never ran.
                    reply.untaken = reply.untaken or _unread(self._to_worker) > 0
                    self.kill()
                    return self._ended(reply, captures, killed=True)
            # Spin briefly before sleeping: most cells answer within a few hundred
            # microseconds, and waking a sleeping thread costs tens of them.
            wait = 0.0 if now < spin_until else max(escalate_at - now, 0.0)
            if cancel is not None:
                wait = min(wait, _CANCEL_POLL)
            for fd, events in self._poll.poll(wait):
                if fd in captures:
                    if events & select.EPOLLIN:  # (a hang-up alone: nothing to read)
                        self._pump(fd, captures[fd])
                    continue
                data = self._read(fd)
                if not data:
                    return self._ended(reply, captures, killed=False)
                for line in self._reader.feed(data):
                    try:
                        incoming = decode(line, WORKER_TO_HOST)
                    except ProtocolError as exc:
                        reply.notes.append(f"the worker broke the protocol: {exc}")
                        self.kill()
                        return self._ended(reply, captures, killed=False)
                    if incoming["type"] == "capability_call":
                        self._answer(incoming, capabilities)
                    elif incoming["type"] == reply_type and incoming.get("id") == msg.get("id"):
                        reply.message = incoming
        # Pipes are synchronous: whatever the worker (or a fork child that has exited)
        # wrote to fds 1/2 before `done` is already in the pipes, so one non-blocking
        # drain completes the call's output. Only a background process the code left
        # running can write later: it holds a writer still (no hang-up), so its pipe is
        # retired and what it writes is dropped (late_output); without per-call pipes
        # the next call drops what waits before it begins.
        held = set(captures)
        for fd, events in self._outputs.poll(0):
            if events & select.POLLIN:
                self._pump(fd, captures[fd], drain=True)
            if events & select.POLLHUP:
                held.discard(fd)
        for capture in captures.values():
            capture.finish()
        if self.outputs is not None:
            for fd in held:
                self._poll.unregister(fd)
                late_output.renew(fd, self)
                self._poll.register(fd, _OUTPUT_EVENTS)
        return self._collect(reply, captures)

    def _drop_stale_output(self) -> None:
        """Read and drop what waits on the output pipes now (never blocks)."""
        for fd in (self._out_r, self._err_r):
            while fd not in self._eof:
                try:
                    data = os.read(fd, _READ_SIZE)
                except OSError:  # BlockingIOError: nothing (more) waits
                    break
                if not data:
                    self._eof.add(fd)
                    with contextlib.suppress(KeyError, ValueError, OSError):
                        self._poll.unregister(fd)
                    break

    def _pump(self, fd: int, capture: StreamCapture, drain: bool = False) -> None:
        """Read what is ready on an output pipe (all of it when ``drain``)."""
        while fd not in self._eof:
            try:
                data = os.read(fd, _READ_SIZE)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                if self.outputs is not None:  # no writer now (edge-triggered: once)
                    return
                # Every writer closed it (the code closed fd 1, say): stop watching.
                self._eof.add(fd)
                with contextlib.suppress(KeyError, ValueError, OSError):
                    self._poll.unregister(fd)
                return
            capture.feed(data)
            if not drain and len(data) < _READ_SIZE:
                return

    def _collect(self, reply: _Reply, captures: dict[int, StreamCapture]) -> _Reply:
        out, err = captures[self._out_r], captures[self._err_r]
        reply.stdout = out.getvalue()
        reply.stderr = err.getvalue()
        reply.truncated = out.truncated or err.truncated
        return reply

    def _ended(self, reply: _Reply, captures: dict[int, StreamCapture], killed: bool) -> _Reply:
        """The worker is gone (or going): drain what it wrote, reap it, say how it ended."""
        if not killed:
            reply.died = True
            # Dead with the request still in the pipe: it never read the code.
            reply.untaken = reply.untaken or _unread(self._to_worker) > 0
        # Grandchildren may hold fds 1/2 open: take what is there, never wait for EOF.
        for fd, capture in captures.items():
            self._pump(fd, capture, drain=True)
        for capture in captures.values():
            capture.finish()
        self.kill()
        code = self._proc.returncode
        if code is not None and code < 0:
            reply.notes.append(messages.killed_by(-code))
        else:
            reply.notes.append(f"exited with status {code}")
        return self._collect(reply, captures)

    def _answer(self, call: dict[str, Any], capabilities: CapabilityHost | None) -> None:
        name = call.get("name")
        try:
            if capabilities is None or name not in capabilities.names():
                available = ", ".join(repr(n) for n in (capabilities.names()
                                                        if capabilities else [])) or "none"
                raise LookupError(f"no host capability named {name!r} (available: {available})")
            args = from_wire(call["args"])
            kwargs = from_wire(call["kwargs"])
            value = capabilities.call(str(name), list(args), dict(kwargs))
            reply = message("capability_result", id=call["id"],
                            value=to_wire(value, f"the result of capability {name!r}"))
        except Exception as exc:
            reply = message("capability_result", id=call["id"],
                            error={"type": type(exc).__name__, "message": str(exc)})
        try:
            self.send(reply)
        except OSError:
            pass  # the worker died; the caller sees end of file next

    def _signal(self, signum: int) -> None:
        with contextlib.suppress(OSError):
            if self._proc.poll() is None:
                os.kill(self._proc.pid, signum)

    # -- stopping ---------------------------------------------------------------------------

    def kill(self) -> None:
        """SIGKILL the whole session (the interrupt was already ignored) and reap. Idempotent."""
        self.close_step = _reap.stop(self._proc, "Python worker", steps=_reap.KILL_NOW)

    def close(self) -> None:
        """Stop by the one policy (shutdown, SIGINT, SIGTERM, SIGKILL), release the pipes."""
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
            busy = self._busy

        def ask() -> bool:
            with contextlib.suppress(OSError):
                self.send(message("shutdown"))
            return not busy  # a running cell will not read it; go straight on

        self.close_step = _reap.stop(self._proc, "Python worker", ask=ask,
                                     steps=_reap.SESSION_STEPS)
        with self._state_lock:
            if not self._busy:
                self._release_fds()

    def _release_fds(self) -> None:
        if getattr(self, "_fds_released", False):
            return
        self._fds_released = True
        late_output.forget(self)
        copier.release(self._to_worker, self._from_worker, self._out_r, self._err_r,
                       self._poll.fileno())
        self._poll.close()
        for fd in (self._to_worker, self._from_worker, self._out_r, self._err_r):
            with contextlib.suppress(OSError):
                os.close(fd)


def _unread(fd: int) -> int:
    """Bytes written to a pipe and not read yet (asked on its write end)."""
    count = array.array("i", [0])
    try:
        fcntl.ioctl(fd, termios.FIONREAD, count, True)
    except OSError:
        return 0
    return count[0]


def _tail(data: bytes | bytearray, limit: int = 4000) -> str:
    text = bytes(data).decode("utf-8", "replace")
    return text[-limit:]


# -- outcomes -----------------------------------------------------------------------------


def _ran(reply: _Reply, mode: RunMode) -> Ran:
    """A finished conversation as the fact of one run (no fault policy)."""
    done = reply.message or {}
    error = done.get("error")
    failed = bool(error) or bool(done.get("child_died")) or not done
    event: facts.Event = facts.OK
    if reply.interrupted and failed:
        event = facts.TimedOut(survived=not reply.worker_killed, taken=not reply.untaken)
    elif not done:  # only when the worker was closed under the call
        event = facts.Closed("session")
    elif error:
        coordex_type = error.get("coordex_error_type")
        event = facts.Raised(
            str(error.get("exception") or "Exception"), str(error.get("message") or ""),
            str(error.get("traceback") or ""),
            error_type=coordex_type if coordex_type in ERROR_TYPES else None,
            error=error.get("coordex_error"), suggestion=error.get("coordex_suggestion"))
    ok = isinstance(event, facts.Ok)
    # Names bound before an error or an interrupt stay bound: provenance needs them
    # (for a read-only copy: what it would have changed, for the call log). The copy
    # reports what held before user code runs; without that report (the worker died
    # first) nothing is claimed beyond the names.
    return Ran(event, reply.stdout, reply.stderr,
               reply.truncated or bool(done.get("result_truncated")),
               result=done.get("result") if ok else None,
               images=(done.get("images") or ()) if ok else (),
               rebound=done.get("rebound") or [], deleted=done.get("deleted") or [],
               written=done.get("written") or None,
               isolation=(done.get("isolation") or dict(_NO_COPY_CLAIM))
               if mode == "read_only" else None)


def _fork_child_died(reply: _Reply) -> bool:
    died = (reply.message or {}).get("child_died")
    if died and not reply.interrupted:
        if died.get("signal"):
            how = messages.killed_by(int(died["signal"]))
        else:
            how = f"exited with status {died.get('code')}"
        reply.notes.append(how)
        return True
    return False


def _run_once(proc: _WorkerProcess, request: RunRequest, mode: RunMode,
              capabilities: CapabilityHost | None) -> _Reply:
    try:
        proc.set_capabilities(list(capabilities.names()) if capabilities else [])
    except OSError:
        return _Reply(died=True, untaken=True, notes=["the worker had gone"])
    fields: dict[str, Any] = {}
    if mode == "read_only" and request.scratch is not None:
        # The fork child protects the disk itself; "." resolves to the worker's cwd there.
        fields.update(protect=list(request.protect_paths), scratch=request.scratch)
    if request.env:  # the call's trace context (SPEC 16)
        fields["env"] = dict(request.env)
    if proc.outputs is not None:  # the pipes this call's code writes to
        fields["outputs"] = proc.outputs
    msg = message("run", id=proc.next_id(), code=request.code, mode=mode,
                  output_limit=request.result_limit, timeout=request.timeout, **fields)
    return proc.converse(msg, "done", request, capabilities, fork_child=mode != "stateful")


# -- sessions -----------------------------------------------------------------------------


class WorkerSession:
    """One Python process held open for one stateful session.

    Calls are serialised (one at a time); different sessions run in parallel. The
    process is started here, so a broken interpreter fails at construction with
    :class:`WorkerStartError` (a ``crashed`` :class:`CoordexError`).
    """

    def __init__(self, python: str | Path, *, env: dict[str, str] | None = None,
                 cwd: str | None = None, capabilities: CapabilityHost | None = None,
                 start_timeout: float = START_TIMEOUT, proc: _WorkerProcess | None = None
                 ) -> None:
        self._python = python
        self._env = env
        self._cwd = cwd
        self._capabilities = capabilities
        self._start_timeout = start_timeout
        self._lock = threading.Lock()
        self._closed = False
        self._starting = False  # a new worker starts on a thread (_replace_soon)
        self._proc: _WorkerProcess | None = proc if proc is not None else self._start()

    def _start(self) -> _WorkerProcess:
        return _WorkerProcess(self._python, self._env, self._cwd, self._start_timeout)

    @property
    def pid(self) -> int:
        """The current worker's pid (it changes when the process is replaced)."""
        return self._proc.pid if self._proc is not None else -1

    def alive(self) -> bool:
        if self._closed:
            return False
        proc = self._proc
        return self._starting if proc is None else proc.alive()

    def run(self, request: RunRequest) -> Ran:
        """Run code in the session's namespace (stateful)."""
        return self._call(request, "stateful")

    def run_read_only(self, request: RunRequest) -> Ran:
        """Run code against a fork of the session; the session is never changed."""
        return made_scratch(request) or self._call(request, "read_only")

    def inspect(self) -> dict[str, Any] | Ran:
        """``{"names": [{"name","type","repr"}...], "capabilities": [...]}``; changes nothing."""
        with self._lock:
            proc, replaced = self._ensure()
            if isinstance(proc, Ran):
                return proc
            msg = message("inspect", id=proc.next_id())
            request = RunRequest(code="", timeout=INSPECT_TIMEOUT)
            reply = proc.converse(msg, "inspect_result", request, self._capabilities)
            found = reply.message or {}
            result: dict[str, Any] = {"names": found.get("names", []),
                                      "capabilities": found.get("capabilities", [])}
            if replaced or reply.died or reply.worker_killed:
                result["replaced"] = True
            if reply.died or reply.worker_killed:
                self._replace_quietly()
            return result

    def exchange(self, kind: str, reply_type: str, timeout: float,
                 **fields: Any) -> dict[str, Any] | None:
        """Send one message (a ``snapshot`` or ``restore``: :mod:`.keep`) and
        return the worker's ``reply_type`` reply; None when the worker did not answer."""
        with self._lock:
            proc = self._proc
            if self._closed or proc is None or not proc.alive():
                return None
            reply = proc.converse(message(kind, id=proc.next_id(), **fields), reply_type,
                                  RunRequest(code="", timeout=timeout), self._capabilities)
            if reply.died or reply.worker_killed:
                self._replace_quietly()
            return reply.message

    # -- capabilities (base.Kept, base.Forkable, base.Checkpointable) ----------------------

    def start_snapshot(self, folder: str, *, attempt: int, through: int, max_bytes: int,
                       identity: Mapping[str, Any], close: tuple[int, ...] = ()
                       ) -> Writer | None:
        return keep.start_snapshot(self, folder, attempt=attempt, through=through,
                                   max_bytes=max_bytes, identity=identity)

    def restore_snapshot(self, folder: str, replay: list[str], timeout: float) -> Written:
        return keep.restore_snapshot(self, folder, replay, timeout)

    def fork(self, timeout: float) -> Forked:
        return branches.fork(self, timeout)

    def start_checkpoint(self, folder: str, max_bytes: int) -> Callable[[float], Written]:
        return branches.start_checkpoint(self, folder, max_bytes)

    def restore_checkpoint(self, folder: str, timeout: float) -> Written:
        return branches.restore_checkpoint(self, folder, timeout)

    def sibling(self, proc: _WorkerProcess | None = None) -> WorkerSession:
        """A new session of the same environment, working folder and capabilities (on
        ``proc``, a fork of this session's worker, when given)."""
        if proc is not None and self._capabilities is not None:
            proc.capability_names = self.worker_capabilities()
        return WorkerSession(self._python, env=self._env, cwd=self._cwd,
                             capabilities=self._capabilities,
                             start_timeout=self._start_timeout, proc=proc)

    def worker_capabilities(self) -> list[str] | None:
        proc = self._proc
        return None if proc is None else proc.capability_names

    def fork_process(self, fifos: str, fds: tuple[int, int, int, int], timeout: float
                     ) -> _WorkerProcess | list[str] | None:
        """Ask the worker to fork a worker for a new session that talks over ``fifos``
        (opened here as ``fds``): the new worker, or the runtimes that break under
        ``fork()`` (then nothing was forked), or None when the worker did not answer."""
        reply = self.exchange("fork", "fork_done", timeout, fifos=fifos)
        report = (reply or {}).get("report") or {}
        if report.get("unsafe"):
            return list(report["unsafe"])
        pid = report.get("pid")
        if not isinstance(pid, int):
            return None
        return _WorkerProcess.adopt(self._python, pid, fds, self._start_timeout)

    def start_over(self) -> None:
        """Replace the worker with a fresh one (an empty namespace)."""
        with self._lock:
            self._replace_quietly()

    def close(self) -> None:
        """End the worker (and everything it started); idempotent, safe from any thread."""
        self._closed = True
        proc = self._proc
        if proc is not None:
            proc.close()

    # -- internals ----------------------------------------------------------------------------

    def _ensure(self) -> tuple[_WorkerProcess | Ran, bool]:
        """The live process, replacing a dead one: (the process, or the fact that the
        session is closed or that no process could start; whether it was replaced)."""
        if self._closed:
            return Ran(facts.Closed("session", during=False)), False
        proc = self._proc
        if proc is not None and proc.alive():
            return proc, False
        if proc is not None:
            proc.close()
        self._proc = None
        try:
            self._proc = self._start()
        except CoordexError as exc:
            return Ran(facts.StartFailed(error=exc), replaced=True), True
        return self._proc, True

    def _replace_quietly(self) -> None:
        """After a loss already reported: start the next process now (or on the next call)."""
        if self._proc is not None:
            self._proc.close()
        self._proc = None
        if not self._closed:
            with contextlib.suppress(CoordexError):
                self._proc = self._start()

    def _replace_soon(self) -> None:
        """After a loss this call reports: the old process goes now, the next one starts
        on a thread (its start is not this call's time: SPEC 6's timeout + 2 s), or at
        the next call if that comes first."""
        if self._proc is not None:
            self._proc.close()
        self._proc = None
        if self._closed:
            return

        def start() -> None:
            with self._lock:
                try:
                    if self._proc is not None or self._closed:
                        return
                    with contextlib.suppress(CoordexError):
                        self._proc = self._start()
                    if self._closed and self._proc is not None:  # close() came meanwhile
                        self._proc.close()
                finally:
                    self._starting = False

        self._starting = True
        threading.Thread(target=start, daemon=True, name="coordex-worker-start").start()

    def _call(self, request: RunRequest, mode: RunMode) -> Ran:
        """One attempt at a call. A death during it is the fact ``Died`` (of the
        ``process`` or only its ``copy``); whether the call runs once more is the session
        owner's decision (:mod:`coordex.core.faults`)."""
        with self._lock:
            proc, replaced = self._ensure()
            if isinstance(proc, Ran):
                return proc
            reply = _run_once(proc, request, mode, self._capabilities)
            if self._closed:
                if reply.died or not reply.message or reply.message.get("error"):
                    return Ran(facts.Closed("session"), replaced=replaced)
            elif reply.died or _fork_child_died(reply):
                if reply.died:
                    self._replace_quietly()  # the next attempt runs on a fresh process
                return dataclasses.replace(_died(reply, mode), replaced=replaced)
            ran = _ran(reply, mode)
            unprotected = (reply.message or {}).get("unprotected")
            if unprotected:  # the worker made COPY_ATTEMPTS copies; none was protected
                ran = dataclasses.replace(ran, event=facts.StartFailed(
                    f"it could not be protected: {unprotected}", copy=True))
            if reply.worker_killed or (mode == "read_only" and not proc.alive()):
                # (A worker that died while its read-only fork ran: the fork's result
                # stands, and the loss is this call's news, not the next call's.)
                replaced = True
                self._replace_soon()
            return dataclasses.replace(ran, replaced=True) if replaced else ran


def _died(reply: _Reply, mode: RunMode) -> Ran:
    """An attempt during which the worker (or only its fork child) died."""
    how = "; ".join(dict.fromkeys(reply.notes)) or "no reason given"
    # What a read-only copy reported before it died, else nothing is claimed.
    isolation = ((reply.message or {}).get("isolation") or dict(_NO_COPY_CLAIM)
                 if mode == "read_only" else None)
    return Ran(facts.Died("process" if reply.died and mode != "stateless" else "copy", how,
                          started=not reply.untaken),
               reply.stdout, reply.stderr, reply.truncated, isolation=isolation)


class WorkerTemplate:
    """Fork-server for the stateless calls of one environment.

    Holds clean workers that never run code in their own namespace; each call forks a
    fresh child of one, which starts from an empty namespace and is gone afterwards.
    A template busy with one call is not shared: a parallel call takes another idle
    template or starts one (at most ``max_idle`` are kept afterwards).
    """

    def __init__(self, python: str | Path, *, env: dict[str, str] | None = None,
                 cwd: str | None = None, capabilities: CapabilityHost | None = None,
                 start_timeout: float = START_TIMEOUT, max_idle: int | None = None) -> None:
        self._python = python
        self._env = env
        self._cwd = cwd
        self._capabilities = capabilities
        self._start_timeout = start_timeout
        self._max_idle = max_idle or max(2, min(8, os.cpu_count() or 2))
        self._lock = threading.Lock()
        self._idle: list[_WorkerProcess] = []
        self._busy: set[_WorkerProcess] = set()
        self._closed = False
        self._idle.append(self._start())  # fail early, and make the first call fast

    def _start(self) -> _WorkerProcess:
        return _WorkerProcess(self._python, self._env, self._cwd, self._start_timeout)

    def _checkout(self) -> _WorkerProcess:
        with self._lock:
            while self._idle:
                proc = self._idle.pop()
                if proc.alive():
                    self._busy.add(proc)
                    return proc
                proc.close()
        proc = self._start()
        with self._lock:
            self._busy.add(proc)
        return proc

    def _checkin(self, proc: _WorkerProcess, healthy: bool) -> None:
        with self._lock:
            self._busy.discard(proc)
            keep = healthy and not self._closed and len(self._idle) < self._max_idle
            if keep:
                self._idle.append(proc)
        if not keep:
            proc.close()

    def run_stateless(self, request: RunRequest) -> Ran:
        """Run code in a fresh fork of a clean template; nothing is kept."""
        if self._closed:
            return Ran(facts.Closed("executor"))
        try:
            proc = self._checkout()
        except CoordexError as exc:
            return Ran(facts.StartFailed(error=exc))
        reply = _run_once(proc, request, "stateless", self._capabilities)
        healthy = not (reply.died or reply.worker_killed)
        self._checkin(proc, healthy)
        if self._closed:  # close() stopped the template under the call
            return Ran(facts.Closed("executor"), reply.stdout, reply.stderr)
        if reply.died or _fork_child_died(reply):
            return _died(reply, "stateless")  # a stateless call had no state to lose
        return _ran(reply, "stateless")

    def close(self) -> None:
        """End every template process (idle or busy); idempotent."""
        with self._lock:
            self._closed = True
            procs = list(self._idle) + list(self._busy)
            self._idle.clear()
        for proc in procs:
            proc.close()


__all__ = ["WORKER_SCRIPT", "CapabilityHost", "WorkerSession", "WorkerStartError",
           "WorkerTemplate", "worker_env"]

if sys.platform == "win32":  # pragma: no cover - fork, process groups and pass_fds are POSIX
    raise ImportError("coordex worker processes need a POSIX platform")
