"""Read-only copies of own-interpreter sessions: a fork, or the values in a new process.

How it works:

- Where it can, the copy is a ``fork()`` of the agent's process, made on the
  interpreter's runner thread, where session code runs: the child is that thread's
  copy, so objects bound to the thread that made them (a ``sqlite3`` connection,
  ``threading.local`` data) work in the copy.
  Before user code runs the child closes the descriptors coordex holds (pipes to shells
  and workers, launcher sockets, the output pump), protects the disk, reopens the
  session's writable file descriptors through the protected view or read-only, and
  makes shared memory maps private (``worker/_coordex_copy.py``, the same code the
  environment worker runs).
- Where the agent's process has loaded a library that does not survive ``fork()``
  (polars, duckdb, grpc, torch), the session's values are pickled into a fresh
  interpreter of the same ``sys.executable`` instead (``isolation["copy"] = "values"``;
  names that could not travel are in ``left_out``).
- Either copy reports over its *link* (``docs/protocol.md``, ``copy_ready``): what held
  first, then capability calls, which run here in the agent's process (they are the
  agent's actions, not the session's state), then ``done``. Output arrives on two pipes
  and is streamed as it comes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import io
import os
import selectors
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any, Protocol

from ...core import facts, messages
from ...core.facts import Ran
from ...core.results import OutputBuffer
from ...worker import _coordex_copy as copier
from ...worker import _coordex_engine as engine
from ...worker import _coordex_protocol as wire
from .. import isolation as iso
from ..base import INTERRUPT_GRACE, RunRequest, emit
from . import children
from . import interpreter as own
from .output import EmptyStdin, flush_real_streams, local, utf8_decoder


class CapabilityHost(Protocol):
    def names(self) -> list[str]: ...

    def call(self, name: str, args: list[Any], kwargs: dict[str, Any]) -> Any: ...


# Fork copies made for one read-only call whose protection did not hold before it fails.
COPY_ATTEMPTS = 3


def run_read_only(interp: own.OwnInterpreter, session: own.NamespaceSession,
                  request: RunRequest, protect: own.Protect | None = None,
                  capabilities: Any = None) -> Ran:
    """Run against a copy of ``interp``'s session: a fork, or its values in a new process.

    Where ``fork`` is missing or unsafe, the copy always goes by value. ``capabilities``
    (``names()``, ``call(name, args, kwargs)``): what the copy may call; they run here,
    in the agent's process, never in the copy. (Here, not a method of the interpreter:
    copies build on the interpreter, which knows nothing of them.)
    """
    if session.stuck:
        return Ran(facts.Busy(stuck=True))
    return run_copy(session, request, protect, capabilities, fork=own.FORK_IS_SAFE,
                    fork_on=interp._fork_on_runner)


def run_copy(session: own.NamespaceSession, request: RunRequest,
             protect: own.Protect | None,
             capabilities: CapabilityHost | None, *, fork: bool,
             fork_on: Callable[[Callable[[], int]], int]) -> Ran:
    """Run ``request`` against a copy of ``session``; the fact carries ``isolation``.

    ``fork=False`` (no safe ``fork`` here) always copies by value. ``fork_on(fork)``
    calls ``fork`` on the thread the session's code runs on. Where protection works on
    this machine, a fork copy in which it did not hold this once (``files: "none"``)
    runs nothing and is made again, up to :data:`COPY_ATTEMPTS` times within the
    deadline; then the call fails, never running unprotected.
    """
    expected = iso.best_mode() if request.scratch is not None and protect is not None \
        else "none"
    deadline = time.monotonic() + request.timeout
    for _attempt in range(COPY_ATTEMPTS):
        ran = _run_copy_once(session, request, protect, capabilities, fork=fork,
                             fork_on=fork_on, expected=expected)
        if ran is not None:
            return ran
        if time.monotonic() >= deadline:
            break
    return _not_started("protection did not hold in the copy", "fork")


def _run_copy_once(session: own.NamespaceSession, request: RunRequest,
                   protect: own.Protect | None,
                   capabilities: CapabilityHost | None, *, fork: bool,
                   fork_on: Callable[[Callable[[], int]], int], expected: str) -> Ran | None:
    """One copy (None: it was not protected and ran nothing: make another)."""
    names = [n for n in (capabilities.names() if capabilities else [])
             if n in session.injected]
    unsafe = copier.fork_unsafe_runtimes() if fork else ["fork"]
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    # Held (closed in every other copy forked meanwhile, by another thread): no copy may
    # read or write the pipes of another's call.
    copier.hold(out_r, out_w, err_r, err_w)
    start: Started | str
    if unsafe:
        start = _start_values(session, request, names, out_w, err_w)
        kind = "values"
    else:
        start = _start_fork(session, request, protect, names, out_w, err_w, (out_r, err_r),
                            fork_on, expected)
        kind = "fork"
    copier.release(out_w, err_w)
    os.close(out_w)
    os.close(err_w)
    if isinstance(start, str):  # the copy could not be started
        copier.release(out_r, err_r)
        os.close(out_r)
        os.close(err_r)
        return _not_started(start, kind)
    pid, link_r, link_w, proc, left_out, asking = start
    watched = _watch(pid, out_r, err_r, link_r, link_w, asking, request, capabilities)
    cell, reported, interrupted, out, err = watched
    status = _reap(pid, proc, wait=cell is None)
    isolation = reported or {"names": True, "objects": True, "files": "none", "copy": kind}
    if kind == "fork" and cell is None and reported is not None and not interrupted \
            and reported.get("files") == "none" and expected != "none":
        return None  # it ran nothing (see _child): make another
    if kind == "values":
        isolation.setdefault("left_out", left_out)
    if cell is None or (interrupted and cell.get("interrupted") is not True):
        event: facts.Event = facts.TimedOut(survived=True) if interrupted else \
            facts.Died("copy", copy_status(status))
        ran = own.ran_with_output(out, err, event)
    else:
        ran = dataclasses.replace(
            own.ran_from_cell(cell, out, err), rebound=cell.get("rebound") or [],
            deleted=cell.get("deleted") or [], written=cell.get("written") or [])
    return dataclasses.replace(ran, isolation=isolation)


# -- starting a copy ------------------------------------------------------------------

# A started copy: (pid, link read end, link write end, its Popen for a copy by values,
# the names left out, the (ask, answer) pipes of its identity-map request or None).
Started = tuple[int, int, int, Any, list[str], "tuple[int, int] | None"]


def _start_fork(session: own.NamespaceSession, request: RunRequest,
                protect: own.Protect | None, capability_names: list[str],
                out_w: int, err_w: int, parent_ends: tuple[int, ...],
                fork_on: Callable[[Callable[[], int]], int], expected: str = "none",
                ) -> Started | str:
    link_r, child_w = os.pipe()
    child_r, link_w = os.pipe()
    keep = (out_w, err_w, child_w, child_r)
    # Root: the copy asks this process, which keeps the privilege its user namespace
    # lacks, to write its identity map (``isolation.identity_asker``): ~1 ms less than
    # the helper shell protect() spawns otherwise. (ask_r, answer_w) stay here.
    mapping: tuple[int, int] | None = None
    asking: tuple[int, int] | None = None
    if protect is not None and os.geteuid() == 0:
        ask_r, ask_w = os.pipe()
        answer_r, answer_w = os.pipe()
        mapping, asking = (ask_w, answer_r), (ask_r, answer_w)
    parent_ends = (*parent_ends, link_r, link_w, *(asking or ()))
    copier.hold(link_r, child_w, child_r, link_w, *(mapping or ()), *(asking or ()))

    def fork() -> int:
        flush_real_streams()
        with warnings.catch_warnings():
            # 3.12+ warns that fork() in a threaded process may deadlock; the copy's
            # known risk (another thread's lock held at fork time) ends at its timeout.
            warnings.simplefilter("ignore", DeprecationWarning)
            with children.copying():  # the copy is coordex's, not a child of the code
                pid = os.fork()
        if pid == 0:  # pragma: no cover - the child, reported through its link
            for fd in parent_ends:
                os.close(fd)
            _child(session, request, protect, capability_names, keep, mapping, expected)
        return pid

    try:
        pid = fork_on(fork)
    except OSError as exc:
        for fd in (link_r, child_w, child_r, link_w, *(mapping or ()), *(asking or ())):
            copier.release(fd)
            os.close(fd)
        return f"fork() failed: {exc}"
    for fd in (child_w, child_r, *(mapping or ())):
        copier.release(fd)
        os.close(fd)
    return pid, link_r, link_w, None, [], asking


def _start_values(session: own.NamespaceSession, request: RunRequest,
                  capability_names: list[str], out_w: int, err_w: int,
                  ) -> Started | str:
    skip = set(session.injected)
    values, left_out = copier.pack_values(session.namespace, skip)
    left_out = sorted(set(left_out) | ({"functions"} & skip))
    decode_key = getattr(os.environ, "decodekey", lambda k: k)
    decode_value = getattr(os.environ, "decodevalue", lambda v: v)
    env = {decode_key(k): decode_value(v) for k, v in session.environ.items()}
    if request.env:  # the call's trace context, in the copy alone (SPEC 16)
        env.update(request.env)
    payload = {"values": values, "left_out": left_out, "code": request.code,
               "output_limit": request.result_limit, "protect": list(request.protect_paths),
               "scratch": request.scratch, "capabilities": capability_names,
               "sys_path": list(sys.path)}
    try:
        proc, link_r, link_w = copier.start_values_copy(sys.executable, payload, out_w, err_w,
                                                        env=env, cwd=session.cwd)
    except OSError as exc:
        return f"could not start {sys.executable!r}: {exc}"
    return proc.pid, link_r, link_w, proc, left_out, None


def _child(session: own.NamespaceSession, request: RunRequest,
           protect: own.Protect | None, capability_names: list[str],
           keep: tuple[int, int, int, int], mapping: tuple[int, int] | None,
           expected: str = "none") -> None:
    """The read-only fork child: never returns; reports over its link and ``os._exit``.

    ``mapping`` (root only): the pipes to ask the parent for an identity map.
    ``expected``: the files mode protection reaches on this machine; if it did not
    hold at all here (``"none"``), the child reports that and runs nothing.
    """
    out_w, err_w, link_w, link_r = keep
    code = 70
    try:
        copier.close_held((*keep, *(mapping or ())))
        # Every orphan of what the code starts becomes the copy's child, ended before it
        # exits (and found by the parent's SIGKILL at the deadline). Not a process group
        # of its own: a stale group id signalled elsewhere could be the copy's pid.
        copier.adopt_orphans()
        # Freeze what the session holds: a collection in the copy would walk (and so
        # copy page by page) every object the session owns.
        gc.freeze()
        copier.interrupt_on_sigint()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        # Only fds 1 and 2 may hold the output pipes, so closing them before exit is
        # seen by the parent as end-of-file at once.
        for fd in (out_w, err_w, devnull):
            os.close(fd)
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8",
                                      errors="backslashreplace", write_through=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                      errors="backslashreplace", write_through=True)
        sys.stdin = EmptyStdin()
        local.call = None
        # The copy's code runs on this thread, as a call does: what it calls of the own
        # interpreter (a stored function) runs inline here, not on a runner thread the
        # fork does not have (it would wait out the call's timeout).
        local.in_call = True
        own.chdir(session.cwd)
        own.apply_environ(session.environ)
        if request.env:  # the call's trace context, in the copy alone (SPEC 16)
            os.environ.update(request.env)
        asker = iso.identity_asker(*mapping) if mapping is not None else None
        files = protect(asker) if protect is not None else "none"
        for fd in mapping or ():
            os.close(fd)
        copier.seal_descriptors((0, 1, 2, link_w, link_r), discarded=files == "discarded")
        with contextlib.suppress(ValueError, OSError):
            signal.set_wakeup_fd(-1)  # the host loop's, now /dev/null
        private = copier.privatize_shared_mappings() & copier.wall_off_sysv()
        link = copier.Link(link_w, link_r)
        namespace = session.namespace
        for name in capability_names:
            namespace[name] = copier.CapabilityStub(name, link)
        isolation = {"names": True, "objects": private, "files": files, "copy": "fork"}
        link.send(wire.message("copy_ready", isolation=isolation))
        if files == "none" and expected != "none":
            raise SystemExit  # protection did not hold this once: run nothing
        before = dict(namespace)
        cell = engine.run_cell(request.code, namespace, request.result_limit)
        # What the copy changed, for the call log: the session itself never sees it.
        cell["rebound"], cell["deleted"] = engine.changed_names(before, namespace)
        if files == "discarded":
            cell["written"] = iso.written()
        cell.update(type="done", id="copy", isolation=isolation)
        link.send(cell)
        code = 0
    except BaseException:
        code = 70
    finally:
        # The deadline's SIGINT must not land here: raised past this point it would
        # unwind the copy into the parent's stack (a second agent process).
        with contextlib.suppress(BaseException):
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        # Close the pipes before exiting: tearing down a large copy-on-write image takes
        # milliseconds, and the parent returns as soon as it sees end-of-file.
        for target in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                target.flush()
        # What the code started ends with the copy: a background child would hold the
        # output pipes (the call returning only at its timeout) and outlive the call.
        with contextlib.suppress(BaseException):
            copier.end_descendants()
        for fd in (1, 2, link_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        copier.step_aside()  # after the closes: the parent has its answer; then the teardown
        os._exit(code)


# -- watching a copy --------------------------------------------------------------------


def _watch(pid: int, out_r: int, err_r: int, link_r: int, link_w: int,
           asking: tuple[int, int] | None, request: RunRequest,
           capabilities: CapabilityHost | None,
           ) -> tuple[dict[str, Any] | None, dict[str, Any] | None, bool, OutputBuffer,
                      OutputBuffer]:
    """Stream the copy's output and serve its link until all three pipes end; answer
    its one request for an identity map on ``asking`` (ask, answer), if given.

    Returns (its ``done`` or None, the isolation it reported or None, whether it was
    interrupted, stdout, stderr). Past the deadline (or on cancel) the copy gets SIGINT,
    then SIGKILL after the grace period.
    """
    out, err = OutputBuffer(request.output_limit), OutputBuffer(request.output_limit)
    decoders = {"stdout": utf8_decoder(), "stderr": utf8_decoder()}
    link = copier.LinkReader()
    cell: dict[str, Any] | None = None
    reported: dict[str, Any] | None = None
    sel = selectors.DefaultSelector()
    for fd, name in ((out_r, "stdout"), (err_r, "stderr"), (link_r, "link")):
        sel.register(fd, selectors.EVENT_READ, name)
    if asking is not None:
        sel.register(asking[0], selectors.EVENT_READ, "map")
    deadline = time.monotonic() + request.timeout
    interrupted_at: float | None = None
    call = capabilities.call if capabilities is not None else _no_capabilities
    try:
        while sel.get_map():
            now = time.monotonic()
            if interrupted_at is None and (now >= deadline or _cancelled(request)):
                _signal(pid, signal.SIGINT)
                interrupted_at = now
            if interrupted_at is not None and now >= interrupted_at + INTERRUPT_GRACE:
                _kill_tree(pid)  # the copy and what it started (its children: subreaper)
                break
            wait = deadline if interrupted_at is None else interrupted_at + INTERRUPT_GRACE
            if request.cancel is not None:
                wait = min(wait, now + 0.05)
            for key, _ in sel.select(max(0.0, wait - now)):
                data = os.read(key.fd, 65536)
                if key.data == "map" and asking is not None:  # answered once, then closed
                    if data:
                        mapped = iso.write_identity_maps(pid, data)
                        with contextlib.suppress(OSError):
                            os.write(asking[1], b"1" if mapped else b"0")
                    sel.unregister(key.fd)
                    for fd in asking:
                        copier.release(fd)
                        os.close(fd)
                    asking = None
                    continue
                if not data:
                    sel.unregister(key.fd)
                    continue
                if key.data != "link":
                    text = decoders[key.data].decode(data)
                    (out if key.data == "stdout" else err).write(text)
                    emit(request, key.data, text)
                    continue
                for msg in link.feed(data):
                    if msg["type"] == "copy_ready":
                        reported = dict(msg["isolation"])
                    elif msg["type"] == "capability_call":
                        reply = copier.answer_capability(msg, call)
                        with contextlib.suppress(OSError):
                            copier.write_all(link_w, wire.encode(reply))
                    elif msg["type"] == "done":
                        cell = msg
    finally:
        sel.close()
        for fd in (out_r, err_r, link_r, link_w, *(asking or ())):
            copier.release(fd)
            os.close(fd)
    for name, decoder in decoders.items():
        tail = decoder.decode(b"", final=True)
        if tail:
            (out if name == "stdout" else err).write(tail)
    return cell, reported, interrupted_at is not None, out, err


def _kill_tree(pid: int) -> None:
    """SIGKILL the copy, then everything it started (orphans are its children)."""
    tree = copier.descendants(pid)
    _signal(pid, signal.SIGKILL)
    for child in tree:
        with contextlib.suppress(OSError):
            os.kill(child, signal.SIGKILL)


def _no_capabilities(name: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
    raise LookupError(f"no host capability named {name!r}")


# Copies that answered and were still tearing their memory down (a large image takes
# milliseconds): reaped by the next copy, so no call waits for the kernel. Calls run
# in parallel, so the list is only touched under its lock (two threads reaping the same
# copy made ``remove`` raise out of execute_code).
_unreaped: list[int] = []
_unreaped_lock = threading.Lock()


def _reap(pid: int, proc: Any, wait: bool) -> int | None:
    """The copy's exit status when ``wait`` (it ended without answering), else None.

    A copy that answered is reaped now if it has exited, or by a later call.
    """
    with _unreaped_lock:
        for old in list(_unreaped):
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(old, os.WNOHANG)[0] == 0:
                    continue
            _unreaped.remove(old)
    if proc is not None:
        try:
            proc.wait(0.05 if not wait else INTERRUPT_GRACE)
        except Exception:
            threading.Thread(target=proc.wait, daemon=True).start()
            return None
        code = proc.returncode
        return code << 8 if code >= 0 else -code
    if wait:
        return _reap_soon(pid)
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    if not done:
        with _unreaped_lock:
            _unreaped.append(pid)
    return None


def _not_started(reason: str, kind: str) -> Ran:
    return Ran(facts.StartFailed(reason, copy=True),
               isolation={"names": True, "objects": True, "files": "none", "copy": kind})


__all__ = ["run_copy"]


def _cancelled(request: RunRequest) -> bool:
    return request.cancel is not None and request.cancel.is_set()


def _reap_soon(pid: int) -> int | None:
    """The child's exit status if it has exited, else reap it on a short-lived thread."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    if done:
        return status
    time.sleep(0.0005)
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        return status
    threading.Thread(target=_wait_quietly, args=(pid,), daemon=True).start()
    return None


def _wait_quietly(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def copy_status(status: int | None) -> str:
    """How a read-only copy (a fork child) ended, from its wait status."""
    if status is not None and os.WIFSIGNALED(status):
        return messages.killed_by(os.WTERMSIG(status))
    if status is not None and os.WIFEXITED(status):
        return f"exit status {os.WEXITSTATUS(status)}; os._exit() or a crash"
    return "no reason given"
