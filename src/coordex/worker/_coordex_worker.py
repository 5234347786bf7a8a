"""The worker program: holds one Python namespace and runs cells in it for the host.

Launched by path, ``<env python> -u -I _coordex_worker.py --in R --out W``, in any
CPython >= 3.8 with the standard library only (coordex itself is not importable there).
It reads protocol lines on fd R, writes them on fd W (see ``_coordex_protocol``); fds 1
and 2 are pipes the host reads directly, and fd 0 is at end of file.

Run modes:

- ``stateful`` runs in this process's namespace; the ``done`` line reports which names
  the cell rebound or deleted (compared by identity).
- ``read_only`` ``fork()``s: the child runs the cell against a copy-on-write copy of the
  whole process (any object works: locks, generators, DataFrames) and leaves with
  ``os._exit``; this process, and so the session, never sees what it changed. When the
  ``run`` names a scratch folder, the child first protects the disk with coordex's
  ``backends/isolation.py``, which this worker loads by path (it is standard-library
  only and 3.8-compatible too): one copy of that logic for every backend. The child
  closes the protocol pipes, seals the session's descriptors and shared maps and
  talks to this process over a link of its own (``_coordex_copy``); where a loaded
  library does not survive ``fork()``, the copy is a fresh interpreter given the
  session's values instead. Either way this process sends the one ``done``.
- ``stateless`` forks too, but the child starts from a fresh namespace. A worker that
  only ever serves stateless runs is a clean *template* (a fork server); it keeps a few
  *standby* children forked and warmed up between calls, so a call only hands one the
  code (see :func:`fill_standbys`).

A stateless fork child sends its ``done`` to the host itself when the line fits one
atomic pipe write, so the answer does not wait for this process to wake up and relay it.

SIGINT raises KeyboardInterrupt in the cell (the engine reports it, the state stays);
while a fork child runs, SIGINT is forwarded to it and SIGUSR1 kills it. Between cells
SIGINT is ignored, so a late interrupt can never end the worker.
"""

from __future__ import annotations

import _signal
import io
import os
import select
import signal
import sys
from typing import Any, Dict, List, Optional, Tuple

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
try:
    import _coordex_copy as copier
    import _coordex_engine as engine
    import _coordex_env as call_env
    import _coordex_protocol as wire
finally:
    # The folder is only needed for these two imports; keep the user's sys.path clean.
    if sys.path and sys.path[0] == _HERE:
        del sys.path[0]

_HIDDEN_NAMES = ("__builtins__", "_")
STANDBYS = 3  # warmed fork children a template keeps (see fill_standbys)
_ATOMIC_WRITE = getattr(select, "PIPE_BUF", 512)  # longest pipe write that is atomic
_SENT = b"+"  # on a result pipe: the child has sent its `done` to the host itself
# Read-only file protection: coordex/backends/isolation.py, beside this folder.
ISOLATION_PATH = os.path.join(os.path.dirname(_HERE), "backends", "isolation.py")


class CapabilityError(Exception):
    """A host capability raised; the message names the capability and the host error."""


class _State:
    """Process-wide worker state the signal handlers read."""

    in_user_code = False  # SIGINT raises KeyboardInterrupt only while a cell runs
    fork_child = 0  # pid of the running read_only/stateless child, else 0
    in_fork_child = False
    channel: Optional[Channel] = None  # set by main()
    capabilities: Dict[str, Capability] = {}  # name -> stub currently installed
    script_module: Any = None
    unreaped: List[int] = []  # fork children that answered and are still exiting
    standbys: List[Tuple[int, int, int]] = []  # (pid, run pipe, result pipe), oldest first
    isolation: Any = None  # backends/isolation.py once loaded (see load_isolation)
    isolation_error = ""  # why it could not be loaded
    copy_link: Optional[copier.Link] = None  # in a read-only copy: the link to this worker
    # fd -> (a private copy, its identity): fds 1 and 2 as the host gave them.
    std_fds: Dict[int, Tuple[int, Tuple[int, int]]] = {}
    per_call = False  # runs name their own output pipes (attach_outputs)


class Channel:
    """The protocol pipes: line reads in (a moment's tries, then a sleep), whole-line
    writes out."""

    def __init__(self, in_fd: int, out_fd: int) -> None:
        os.set_blocking(in_fd, False)  # the reader spins a moment before it sleeps
        self.reader = wire.LineReader(in_fd, spin=wire.SPIN_SECONDS)
        self.out_fd = out_fd
        self._next_call = 0

    def send(self, msg: Dict[str, Any]) -> None:
        _write_all(self.out_fd, wire.encode(msg))

    def receive(self) -> Optional[Dict[str, Any]]:
        """The next message from the host, or None when the host has gone."""
        line = self.reader.read_line()
        if line is None:
            return None
        return wire.decode(line, wire.HOST_TO_WORKER)

    def call_capability(self, name: str, args: Any, kwargs: Any) -> Dict[str, Any]:
        """Send one capability call and block until its result arrives."""
        self._next_call += 1
        call_id = "%d-%d" % (os.getpid(), self._next_call)
        self.send(wire.message("capability_call", id=call_id, name=name,
                               args=args, kwargs=kwargs))
        while True:
            msg = self.receive()
            if msg is None:
                raise CapabilityError("capability %r: the host went away" % name)
            # A result for an earlier, interrupted call may still be in the pipe: skip it.
            if msg["type"] == "capability_result" and msg["id"] == call_id:
                return msg


class Capability:
    """A host function visible as a global name; calling it runs it on the host."""

    def __init__(self, name: str) -> None:
        self.__name__ = name
        self.__qualname__ = name
        self.__doc__ = ("Host capability %r: runs in the host process. Arguments and the "
                        "result must be plain values (%s)." % (name, wire.PLAIN_TYPES))

    def __repr__(self) -> str:
        return "<capability %r (runs on the host)>" % self.__name__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        name = self.__name__
        channel = _State.copy_link or _State.channel
        if channel is None or not (_State.in_user_code or _State.in_fork_child):
            raise CapabilityError("capability %r can only be called while a call runs "
                                  "(not from a thread left running after it)" % name)
        wire_args = wire.to_wire(list(args), "capability %r argument" % name)
        wire_kwargs = wire.to_wire(kwargs, "capability %r keyword argument" % name)
        # From a read-only copy the call goes to this worker over the copy's link and
        # on to the host from there: the copy holds no protocol pipe of its own.
        reply = channel.call_capability(name, wire_args, wire_kwargs)
        error = reply.get("error")
        if error is not None:
            raise CapabilityError("capability %r failed on the host: %s: %s"
                                  % (name, error.get("type", "Error"), error.get("message", "")))
        return wire.from_wire(reply.get("value"))


def load_isolation() -> Any:
    """The isolation module, loaded by path on first use; None if it cannot load.

    Called in this process before a protected fork, so every later child inherits it
    loaded (with libc) instead of paying the import each call.
    """
    if _State.isolation is None and not _State.isolation_error:
        try:
            import importlib.util

            spec = importlib.util.spec_from_file_location("_coordex_isolation",
                                                          ISOLATION_PATH)
            if spec is None or spec.loader is None:
                raise ImportError("no module at %r" % ISOLATION_PATH)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            module.prepare()  # libc, the Landlock ABI and the seccomp filters, once
            _State.isolation = module
        except Exception as exc:
            _State.isolation_error = "%s: %s" % (type(exc).__name__, exc)
    return _State.isolation


def protect(paths: List[str], scratch: Optional[str],
            mapping: Optional[Tuple[int, int]] = None) -> str:
    """Called in a read_only fork child before user code; returns the files mode.

    ``mapping`` (root only): the pipes to ask this worker for the copy's identity map.

    SPEC guarantee 3: ``scratch`` becomes TMPDIR/TMP/TEMP and stays writable; writes to
    ``paths`` ("." is this process's cwd) are discarded, writes elsewhere refused. Without
    a scratch folder (the host asked for nothing) or without the isolation module, nothing
    is protected and the result says so.
    """
    if not scratch:
        return "none"
    for name in ("TMPDIR", "TMP", "TEMP"):
        os.environ[name] = scratch
    if "tempfile" in sys.modules:  # it may have cached the old folder
        import tempfile  # already loaded: free
        tempfile.tempdir = scratch
    module = _State.isolation
    if module is None:
        sys.stderr.write("coordex: file protection unavailable (%s)\n"
                         % (_State.isolation_error or "not loaded"))
        return "none"
    try:
        asker = module.identity_asker(*mapping) if mapping is not None else None
        mode = module.protect(paths, scratch, map_identity=asker)
    except Exception as exc:  # protection failed: never over-claim
        sys.stderr.write("coordex: file protection failed (%s: %s)\n"
                         % (type(exc).__name__, exc))
        return "none"
    return mode if mode in ("discarded", "refused") else "none"


def _on_sigint(signum: int, frame: Any) -> None:
    if _State.fork_child:
        _signal_child(signal.SIGINT)
    elif _State.in_user_code:
        raise engine.Interrupt
    # else: a late interrupt for a cell that already finished; ignore it.


def _on_sigusr1(signum: int, frame: Any) -> None:
    # The host gave up on an interrupted fork child: only the child dies, the session lives.
    if _State.fork_child:
        _signal_child(signal.SIGKILL)


def install_signal_handlers() -> None:
    """(Re)install our handlers; cheap when they are already in place.

    ``_signal`` is the C module under ``signal``: its getsignal/signal skip the enum
    conversions that made this a measurable part of every call.
    """
    for signum, handler in ((signal.SIGINT, _on_sigint), (signal.SIGUSR1, _on_sigusr1)):
        if _signal.getsignal(signum) is not handler:
            _signal.signal(signum, handler)


def _signal_child(signum: int) -> None:
    try:
        os.kill(_State.fork_child, signum)
    except OSError:
        pass


def fresh_namespace() -> Dict[str, Any]:
    """A new ``__main__`` module's dict, with the capability stubs bound in it.

    The module replaces ``sys.modules["__main__"]`` so that pickle (and so
    multiprocessing) finds classes and functions the user defines, as in a notebook.
    """
    import builtins
    import types

    module = types.ModuleType("__main__")
    namespace = module.__dict__
    namespace["__builtins__"] = builtins
    sys.modules["__main__"] = module
    for name, stub in _State.capabilities.items():
        namespace[name] = stub
    return namespace


def set_capabilities(namespace: Dict[str, Any], names: List[str]) -> None:
    """Install a stub per capability name; never clobber a user's own binding."""
    old = _State.capabilities
    new = {}
    for name in names:
        new[name] = old.get(name) or Capability(name)
        if name not in namespace or namespace[name] is old.get(name):
            namespace[name] = new[name]
    for name, stub in old.items():
        if name not in new and namespace.get(name) is stub:
            del namespace[name]
    _State.capabilities = new


def _user_names(namespace: Dict[str, Any]) -> List[str]:
    return [name for name in namespace if _is_user_name(namespace, name)]


def _is_user_name(namespace: Dict[str, Any], name: str) -> bool:
    if name in _HIDDEN_NAMES or (name.startswith("__") and name.endswith("__")):
        return False
    stub = _State.capabilities.get(name)
    return stub is None or namespace.get(name) is not stub


def _flush_user_streams() -> None:
    """Push what the code printed into fds 1/2 before ``done`` is sent.

    The host drains the output pipes once it reads ``done``; pipe writes are
    synchronous, so flushing first is all the ordering the two need.
    """
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except BaseException:
            pass


def enter_call_env(msg: Dict[str, Any]) -> List[Tuple[str, Optional[str]]]:
    """Set the call's own variables (the trace context, ``env``); what they replaced.
    (Not ``os.environ``: glibc would keep every TRACEPARENT ever set; ``_coordex_env``.)"""
    return call_env.enter(msg.get("env") or {})


def leave_call_env(saved: List[Tuple[str, Optional[str]]]) -> None:
    call_env.leave(saved)


def run_stateful(msg: Dict[str, Any], namespace: Dict[str, Any]) -> Dict[str, Any]:
    # A plain copy (C speed) and a filter over the few names that changed: the diff
    # costs next to nothing however many names the session holds.
    before = namespace.copy()
    outcome = None
    saved = enter_call_env(msg) if "env" in msg else None
    try:
        try:
            _State.in_user_code = True
            outcome = engine.run_cell(msg["code"], namespace, msg["output_limit"])
        finally:
            _State.in_user_code = False
            if saved is not None:
                leave_call_env(saved)
            # A cell may have replaced our handlers (even with SIG_IGN for itself); the
            # next cell must be interruptible again.
            install_signal_handlers()
    except KeyboardInterrupt:  # landed between the engine's handler and ours
        if outcome is None:
            outcome = {"result": None, "interrupted": True, "images": [],
                       "error": {"exception": "KeyboardInterrupt", "message": "",
                                 "traceback": "KeyboardInterrupt\n"}}
    outcome["rebound"], outcome["deleted"] = _changed_names(before, namespace)
    return outcome


def keep_std_fds() -> None:
    """Keep a private copy of fds 1 and 2 (the pipes to the host) for
    :func:`restore_std_fds`."""
    import fcntl

    for fd in (1, 2):
        try:
            st = os.fstat(fd)
            copy = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 200)
        except OSError:
            continue
        _State.std_fds[fd] = (copy, (st.st_dev, st.st_ino))


def restore_std_fds() -> None:
    """Before each call: fds 1 and 2 (and sys.stdout/sys.stderr) are the host's pipes
    again, whatever an earlier cell did to them (``os.close(1)``, ``sys.stdout.close()``,
    a redirect): two fstat calls when nothing changed."""
    for fd, (copy, identity) in _State.std_fds.items():
        try:
            st = os.fstat(fd)
            same = (st.st_dev, st.st_ino) == identity
        except OSError:
            same = False
        if not same:
            try:
                os.dup2(copy, fd)
            except OSError:
                continue
        name = "stdout" if fd == 1 else "stderr"
        stream = getattr(sys, name)
        if stream is None or getattr(stream, "closed", True) or not same:
            fresh = io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding="utf-8",
                                     errors="backslashreplace", write_through=True)
            setattr(sys, name, fresh)
            setattr(sys, "__%s__" % name, fresh)


def attach_outputs(msg: Dict[str, Any]) -> None:
    """Fds 1 and 2 become writers of this call's own on the host's output pipes, which
    the run names (``outputs``, docs/protocol.md); :func:`detach_outputs` closes them
    before ``done``. What a process or thread an earlier call left running writes then
    goes elsewhere (SPEC 6): the earlier call's pipes, or ``/dev/null``."""
    if not _State.per_call:
        start_per_call()
    outputs = msg["outputs"]
    for fd, path in ((1, outputs[0]), (2, outputs[1])):
        try:
            new = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            continue  # the host has gone; nothing will read it
        if new != fd:  # (the code may have closed fd 1 or 2: then it got that number)
            os.dup2(new, fd)
            os.close(new)
    for fd, name in ((1, "stdout"), (2, "stderr")):
        stream = getattr(sys, name)
        if stream is None or getattr(stream, "closed", True):
            fresh = io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding="utf-8",
                                     errors="backslashreplace", write_through=True)
            setattr(sys, name, fresh)
            setattr(sys, "__%s__" % name, fresh)


def start_per_call() -> None:
    """The first run naming its pipes: the copies of fds 1 and 2 kept since the start
    (:func:`keep_std_fds`) are writers the host would wait on for ever; they go."""
    _State.per_call = True
    for copy, _identity in _State.std_fds.values():
        try:
            os.close(copy)
        except OSError:
            pass
    _State.std_fds = {}


def detach_outputs() -> None:
    """Flush, then point fds 1 and 2 at ``/dev/null``: no writer of this process is
    left on the call's pipes, so one the host still sees there is a process the code
    left running."""
    _flush_user_streams()
    try:
        null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return
    for fd in (1, 2):
        if null != fd:
            os.dup2(null, fd)
    if null > 2:  # (with fd 1 or 2 closed by the code, it took that number)
        os.close(null)


class _ThreadFilter(io.TextIOBase):
    """sys.stdout/sys.stderr from the worker's start on, so that a stream a handler
    keeps (``logging.basicConfig(stream=sys.stderr)``) is this one too: writes of
    threads an earlier call started (``old``, set as each stateful call starts) are
    dropped (SPEC 6), every other thread's go through."""

    old = frozenset()  # type: frozenset

    def __init__(self, stream: Any) -> None:
        super().__init__()
        self.stream = stream

    def write(self, text: str) -> int:
        if _ThreadFilter.old:
            import threading

            if threading.current_thread() in _ThreadFilter.old:
                return len(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def fileno(self) -> int:
        return self.stream.fileno()

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> Any:  # type: ignore[override]
        return getattr(self.stream, "encoding", None)

    @property
    def errors(self) -> Any:  # type: ignore[override]
        return getattr(self.stream, "errors", None)

    def __getattr__(self, item: str) -> Any:
        return getattr(self.stream, item)


def filter_streams() -> None:
    """sys.stdout/sys.stderr go through a :class:`_ThreadFilter` (again, where the code
    put its own stream in)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, _ThreadFilter):
            setattr(sys, name, _ThreadFilter(stream))


def filter_old_threads() -> None:
    """Before a stateful call: the threads an earlier call started and that still run
    print to no later call."""
    filter_streams()
    threading = sys.modules.get("threading")
    if threading is None or threading.active_count() <= 1:
        _ThreadFilter.old = frozenset()
        return
    current = threading.current_thread()
    _ThreadFilter.old = frozenset(t for t in threading.enumerate() if t is not current)


def _changed_names(before: Dict[str, Any], namespace: Dict[str, Any]) -> Tuple[List[str], List[str]]:
    """User names a cell rebound (by identity) and deleted, given a copy from before it."""
    rebound, deleted = engine.changed_names(before, namespace)
    return ([name for name in rebound if _is_user_name(namespace, name)],
            [name for name in deleted if _is_user_name(before, name)])


def _fork() -> int:
    import warnings

    _flush_user_streams()  # buffered text must not be written twice (by both processes)
    with warnings.catch_warnings():
        # 3.12+ warns that fork() in a multi-threaded process may deadlock. Threads the
        # user started are a known risk of read_only; the warning would only be noise
        # in the user's stderr.
        warnings.simplefilter("ignore", DeprecationWarning)
        return os.fork()


def run_forked(msg: Dict[str, Any], namespace: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """Run the cell in a fork child; this process's state is never touched.

    A stateless run takes the oldest waiting standby child when there is one (see
    :func:`fill_standbys`). The child sends ``done`` to the host itself when the line
    fits one atomic pipe write (then this returns None), otherwise it hands the outcome
    back here to relay. Either way it closes the result pipe before it exits, so this
    process learns the run is over while the kernel still tears the child's
    copy-on-write memory down; it is reaped later (see :func:`reap_children`).
    """
    standby = None
    if msg["mode"] == "stateless" and _State.standbys:
        standby = _State.standbys.pop(0)
    if standby is not None:
        pid, read_fd = standby[0], standby[2]
        handoff = dict(msg, capabilities=sorted(_State.capabilities))
        try:
            _write_all(standby[1], wire.encode(handoff))
        except OSError:
            pass  # the standby died; reported below as a child that did not answer
        os.close(standby[1])
    else:
        read_fd, write_fd = os.pipe()
        pid = _fork()
        if pid == 0:
            os.close(read_fd)
            _child_main(msg, namespace, write_fd)  # never returns
        os.close(write_fd)
    _State.fork_child = pid
    try:
        chunks = []
        while True:
            try:
                data = os.read(read_fd, 1 << 16)
            except InterruptedError:
                continue
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(read_fd)
    raw = b"".join(chunks)
    if raw:
        _State.unreaped.append(pid)
        _State.fork_child = 0
        if raw == _SENT:
            return None
        import json

        outcome = json.loads(raw.decode("ascii"))  # type: Dict[str, Any]
        return outcome
    # The child died before it could report (os._exit, a signal, SIGUSR1 from the host).
    return _child_died(pid)


def _child_died(pid: int) -> Dict[str, Any]:
    """Reap fork child ``pid``, which ended without reporting; the outcome saying how."""
    try:
        status = os.waitpid(pid, 0)[1]
    except ChildProcessError:
        status = 0
    finally:
        _State.fork_child = 0
    died: Dict[str, Optional[int]] = {"code": None, "signal": None}
    if os.WIFSIGNALED(status):
        died["signal"] = os.WTERMSIG(status)
    elif os.WIFEXITED(status):
        died["code"] = os.WEXITSTATUS(status)
    return {"result": None, "error": None, "interrupted": False, "images": [],
            "child_died": died}


# Fork copies made for one read-only call whose protection did not hold before it fails.
COPY_ATTEMPTS = 3


def _expected_files(msg: Dict[str, Any]) -> str:
    """The files mode protection reaches here for this call ("none": not asked/able)."""
    if not msg.get("scratch") or _State.isolation is None:
        return "none"
    try:
        return str(_State.isolation.best_mode())
    except Exception:
        return "none"


def run_read_only(msg: Dict[str, Any], namespace: Dict[str, Any],
                  attempt: int = 1) -> Dict[str, Any]:
    """Run the cell in a copy of this process; the session is never touched.

    The copy is a fork child (see :func:`_copy_child_main`) or, when a loaded library
    does not survive ``fork()``, a fresh interpreter given the session's values
    (``_coordex_copy``). Either way it holds no protocol pipe: it talks to this
    process over its own link, and this process relays its capability calls to the
    host and sends the host the one ``done``.
    """
    if msg.get("scratch"):
        load_isolation()
    unsafe = copier.fork_unsafe_runtimes()
    kind = "values" if unsafe else "fork"
    mapping = asking = None  # type: Optional[Tuple[int, int]]
    if unsafe:
        skip = [name for name, stub in _State.capabilities.items()
                if namespace.get(name) is stub]
        values, left_out = copier.pack_values(namespace, skip)
        payload = {"values": values, "left_out": left_out, "code": msg["code"],
                   "output_limit": msg["output_limit"], "protect": msg.get("protect"),
                   "scratch": msg.get("scratch"), "capabilities": skip,
                   "sys_path": list(sys.path)}
        _flush_user_streams()
        proc, read_fd, write_fd = copier.start_values_copy(sys.executable, payload, 1, 2,
                                                           cwd=os.getcwd())
        pid = proc.pid
    else:
        read_fd, child_w = os.pipe()
        child_r, write_fd = os.pipe()
        # Root: the copy asks this process, which keeps the privilege its user namespace
        # lacks, for its identity map instead of spawning a helper shell (~1 ms).
        if msg.get("scratch") and _State.isolation is not None and os.geteuid() == 0:
            ask_r, ask_w = os.pipe()
            answer_r, answer_w = os.pipe()
            mapping, asking = (ask_w, answer_r), (ask_r, answer_w)
        copier.prepare()  # once, here, rather than in every copy
        pid = _fork()
        if pid == 0:
            os.close(read_fd)
            os.close(write_fd)
            for fd in asking or ():
                os.close(fd)
            _copy_child_main(msg, namespace, child_w, child_r, mapping)  # never returns
        for fd in (child_w, child_r) + (mapping or ()):
            os.close(fd)
    _State.fork_child = pid
    try:
        done, reported = _relay_copy(read_fd, write_fd, pid, asking)
    finally:
        for fd in (read_fd, write_fd) + (asking or ()):
            os.close(fd)
    isolation = reported or {"names": True, "objects": True, "files": "none", "copy": kind}
    if done is not None:
        _State.unreaped.append(pid)
        _State.fork_child = 0
        done.setdefault("isolation", isolation)
        return done
    if kind == "fork" and reported is not None and reported.get("files") == "none" \
            and _expected_files(msg) != "none":
        # Protection did not hold in that copy this once, and it ran nothing (see
        # _copy_child_main): another copy; never the code unprotected.
        _child_died(pid)
        if attempt < COPY_ATTEMPTS:
            return run_read_only(msg, namespace, attempt + 1)
        return {"result": None, "error": None, "interrupted": False, "images": [],
                "unprotected": "protection did not hold in the copy", "isolation": isolation}
    outcome = _child_died(pid)
    outcome["isolation"] = isolation
    return outcome


def _relay_copy(read_fd: int, write_fd: int, pid: int,
                asking: Optional[Tuple[int, int]]) -> Tuple[Optional[Dict[str, Any]],
                                                          Optional[Dict[str, Any]]]:
    """Serve a copy's link until its ``done``: (done or None, the isolation it reported).

    Until the copy asked for its identity map on ``asking`` (ask, answer) and was
    answered, both the link and that request are waited on (the pipes stay open).
    """
    reader = copier.LinkReader()
    done = isolation = None
    while done is None:
        try:
            if asking is not None and asking[0] in select.select([read_fd, asking[0]],
                                                                 [], [])[0]:
                request = os.read(asking[0], 65536)
                if request:
                    mapped = _State.isolation.write_identity_maps(pid, request)
                    try:
                        os.write(asking[1], b"1" if mapped else b"0")
                    except OSError:
                        pass
                asking = None  # answered once; the caller closes the pipes
                continue
            data = os.read(read_fd, 1 << 16)
        except InterruptedError:
            continue
        if not data:
            break
        for incoming in reader.feed(data):
            kind = incoming["type"]
            if kind == "copy_ready":
                isolation = incoming["isolation"]
            elif kind == "capability_call" and _State.channel is not None:
                reply = _State.channel.call_capability(
                    incoming["name"], incoming["args"], incoming["kwargs"])
                try:
                    copier.write_all(write_fd, wire.encode(dict(reply, id=incoming["id"])))
                except OSError:
                    pass  # the copy died; its end of file comes next
            elif kind == "done":
                done = incoming
    return done, isolation


def _copy_child_main(msg: Dict[str, Any], namespace: Dict[str, Any], out_fd: int,
                     in_fd: int, mapping: Optional[Tuple[int, int]]) -> None:
    """The read-only fork child: seal, protect, report, run, report. Never returns."""
    status = 70
    try:
        _prepare_child()
        channel = _State.channel
        if channel is not None:  # no channel back into the session or the host
            for fd in (channel.reader.fd, channel.out_fd):
                os.close(fd)
            _State.channel = None
        link = _State.copy_link = copier.Link(out_fd, in_fd)
        copier.adopt_orphans()
        copier.interrupt_on_sigint()
        files = protect(msg.get("protect") or [], msg.get("scratch"), mapping)
        for fd in mapping or ():
            os.close(fd)
        copier.seal_descriptors((0, 1, 2, out_fd, in_fd), discarded=files == "discarded")
        private = copier.privatize_shared_mappings() & copier.wall_off_sysv()
        isolation = {"names": True, "objects": private, "files": files, "copy": "fork"}
        link.send(wire.message("copy_ready", isolation=isolation))
        if files == "none" and _expected_files(msg) != "none":
            raise SystemExit  # protection did not hold this once: run nothing
        before = namespace.copy()
        enter_call_env(msg)
        outcome = copier.run_cell(msg["code"], namespace, msg["output_limit"])
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        # What the copy changed, for the host's call log; the session never sees it.
        outcome["rebound"], outcome["deleted"] = _changed_names(before, namespace)
        if files == "discarded" and _State.isolation is not None:
            outcome["written"] = _State.isolation.written()
        outcome.update(isolation=isolation, id=msg["id"], type="done")
        _flush_user_streams()
        copier.end_descendants()  # what the code started ends with the copy
        if "outputs" in msg:
            detach_outputs()
        link.send(outcome)
        copier.step_aside()
        os.close(out_fd)
        status = 0
    except BaseException:
        pass
    finally:
        os._exit(status)


def fill_standbys(channel: Channel) -> None:
    """Keep ``STANDBYS`` fork children ready for the next stateless runs (templates only).

    Called after each stateless run, so usually one fork replaces the child that run
    used. Each child's warm-up (its copy-on-write faults, about a millisecond) happens
    while it waits for its ``run`` on a private pipe; with several in the pool,
    back-to-back calls take a child that warmed up while earlier calls ran. Standbys
    are only ever forked from a worker that has run nothing in its own namespace, so
    each is as fresh as a child forked on demand.
    """
    while len(_State.standbys) < STANDBYS:
        fork_standby()
        _warm_template(channel)


def fork_standby() -> None:
    """Fork one standby child and add it to the pool."""
    msg_r, msg_w = os.pipe()
    result_r, result_w = os.pipe()
    pid = _fork()
    if pid == 0:
        os.close(msg_w)
        os.close(result_r)
        _standby_main(msg_r, result_w)  # never returns
    os.close(msg_r)
    os.close(result_w)
    _State.standbys.append((pid, msg_w, result_r))


def _warm_template(channel: Channel) -> None:
    """Take this process's own copy-on-write faults for the next handoff now.

    After a fork every page is shared with the child, and the first write to one (a
    reference count is enough) copies it. Going through the handoff path once while
    idle keeps those copies off the next caller's time.
    """
    line = wire.encode(wire.message("run", id="warm-up", code="", mode="stateless",
                                    output_limit=1))
    msg = wire.decode(line[:-1], wire.HOST_TO_WORKER)
    wire.encode(dict(msg, capabilities=sorted(_State.capabilities)))
    channel.reader.pending()


def _standby_main(msg_fd: int, result_fd: int) -> None:
    status = 70
    try:
        _prepare_child()
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # until it has a cell to interrupt
        # The first cell in a fresh fork spends most of its time in copy-on-write page
        # faults (allocator pools, the compiler, json); take them now, while idle, on
        # the same path a real run takes.
        warm = engine.run_cell("_warm = [{'a': 1}]\nlen(_warm)", {}, 100)
        warm.update(id="warm-up", type="done")
        wire.decode(wire.encode(warm), wire.WORKER_TO_HOST)
        wire.decode(wire.encode(wire.message("run", id="warm-up", code="", mode="stateless",
                                             output_limit=1, capabilities=[])))
        _flush_user_streams()
        namespace = fresh_namespace()
        reader = wire.LineReader(msg_fd)
        line = reader.read_line()
        os.close(msg_fd)  # the template has closed its end; nothing else comes
        if line is None:  # the template is closing
            status = 0
        else:
            msg = wire.decode(line)
            set_capabilities(namespace, msg["capabilities"])  # names may have changed
            _child_main(msg, namespace, result_fd)  # never returns
    except BaseException:
        pass
    os._exit(status)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def reap_children(block: bool = False) -> None:
    """Reap fork children that reported and are exiting.

    Without ``block`` a child still tearing its memory down stays listed and is reaped
    after a later message, so the worker never waits on the kernel between calls.
    """
    waiting = []
    for pid in _State.unreaped:
        try:
            done, _ = os.waitpid(pid, 0 if block else os.WNOHANG)
        except ChildProcessError:
            continue
        if not done:
            waiting.append(pid)
    _State.unreaped = waiting


def _prepare_child() -> None:
    import gc

    # Everything inherited is frozen out of the collector: a full collection would
    # walk (and so copy-on-write) every page of a large session.
    gc.freeze()
    _State.in_fork_child = True
    _State.fork_child = 0
    _State.unreaped = []
    # Another standby's pipes must not reach this child's code: it could hand that
    # standby code of its own, or read another call's result.
    for _, msg_w, result_r in _State.standbys:
        os.close(msg_w)
        os.close(result_r)
    _State.standbys = []
    for copy, _ in _State.std_fds.values():  # fds 1 and 2 are the child's to keep
        try:
            os.close(copy)
        except OSError:
            pass
    _State.std_fds = {}
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)


def _child_main(msg: Dict[str, Any], namespace: Dict[str, Any], result_fd: int) -> None:
    status = 70
    try:
        if not _State.in_fork_child:
            _prepare_child()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if "capabilities" not in msg:  # forked on demand, not a prepared standby
            namespace = fresh_namespace()
        if "outputs" in msg:
            attach_outputs(msg)
        enter_call_env(msg)
        outcome = copier.run_cell(msg["code"], namespace, msg["output_limit"])
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _flush_user_streams()
        if "outputs" in msg:
            detach_outputs()  # before `done`: the host then sees who else holds them
        outcome["id"] = msg["id"]
        outcome["type"] = "done"
        line = wire.encode(outcome)
        channel = _State.channel
        if channel is not None and len(line) <= _ATOMIC_WRITE:
            # One write of at most PIPE_BUF bytes is atomic: the host gets the whole
            # line or, if this child is killed first, none of it. Longer lines go
            # through the parent, which never dies half-way through one.
            _write_all(channel.out_fd, line)
            _write_all(result_fd, _SENT)
        else:
            _write_all(result_fd, line)
        os.close(result_fd)
        status = 0
    except BaseException:
        pass
    finally:
        os._exit(status)


def inspect_names(namespace: Dict[str, Any], limit: int = 200) -> List[Dict[str, str]]:
    names = []
    _State.in_user_code = True  # a hanging __repr__ can then be interrupted by the host
    try:
        for name in sorted(_user_names(namespace)):
            value = namespace[name]
            names.append({"name": name, "type": type(value).__name__,
                          "repr": engine.safe_repr(value, limit)})
    finally:
        _State.in_user_code = False
    return names


def serve(channel: Channel, namespace: Dict[str, Any]) -> None:
    """Answer host messages until ``shutdown`` or end of file."""
    while True:
        try:
            msg = channel.receive()
            if msg is None or msg["type"] == "shutdown":
                return
            kind = msg["type"]
            if kind == "capabilities":
                set_capabilities(namespace, msg["names"])
            elif kind == "run":
                # The run's own pipes: a stateless run's fork child attaches them itself
                # (a standby was forked before this run named them).
                attached = "outputs" in msg and msg["mode"] != "stateless"
                if "outputs" not in msg:
                    restore_std_fds()
                elif attached:
                    attach_outputs(msg)
                elif not _State.per_call:
                    start_per_call()
                    detach_outputs()
                if msg["mode"] == "stateful":
                    filter_old_threads()
                if msg["mode"] == "stateful":
                    outcome = run_stateful(msg, namespace)  # type: Optional[Dict[str, Any]]
                elif msg["mode"] == "read_only":
                    outcome = run_read_only(msg, namespace)
                else:
                    outcome = run_forked(msg, namespace)
                if attached:
                    detach_outputs()
                if outcome is not None:  # else the fork child has sent `done` itself
                    _flush_user_streams()
                    outcome["id"] = msg["id"]
                    outcome["type"] = "done"
                    channel.send(outcome)
                if msg["mode"] == "stateless":
                    fill_standbys(channel)
            elif kind == "fork":  # fork_session: the child serves the new session
                channel.send(fork_session(msg, channel, namespace))
            elif kind in ("snapshot", "restore"):  # coordex.persist
                channel.send(_snapshots().answer(msg, namespace, _user_names(namespace), _fork,
                                                 _prepare_child, _State.unreaped))
            elif kind == "inspect":
                names = inspect_names(namespace)
                channel.send(wire.message("inspect_result", id=msg["id"], names=names,
                                          capabilities=sorted(_State.capabilities)))
            # capability_result outside a call: a reply to an interrupted call; drop it.
            if _State.unreaped:
                reap_children()
        except KeyboardInterrupt:
            continue  # an interrupt that raced the end of a cell; the host has its answer


def fork_session(msg: Dict[str, Any], channel: Channel, namespace: Dict[str, Any]
                 ) -> Dict[str, Any]:
    """Fork this worker into the worker of a new session (``fork_session``, SPEC 15).

    The child is a session leader of its own (closing either worker never ends the
    other) and talks to the host over the FIFOs in ``msg["fifos"]`` (``in``, ``out``,
    ``stdout``, ``stderr``); it announces itself with a ``hello`` there and serves on,
    its namespace a copy-on-write copy of this one. This worker answers at once.
    """
    unsafe = copier.fork_unsafe_runtimes()
    if unsafe:  # a runtime that breaks under fork(): the host copies by value instead
        return wire.message("fork_done", id=msg["id"], report={"unsafe": list(unsafe)})
    folder = msg["fifos"]
    pid = _fork()
    if pid:  # (not in unreaped: a shutdown waits for those, and this one lives on)
        return wire.message("fork_done", id=msg["id"], report={"pid": pid})
    status = 1
    try:
        os.setsid()
        old = (channel.reader.fd, channel.out_fd)
        out_fd = os.open(os.path.join(folder, "out"), os.O_WRONLY)
        for fd, name in ((1, "stdout"), (2, "stderr")):
            new = os.open(os.path.join(folder, name), os.O_WRONLY)
            os.dup2(new, fd)
            os.close(new)
        in_fd = os.open(os.path.join(folder, "in"), os.O_RDONLY)
        for fd in old:
            os.close(fd)
        for copy, _identity in _State.std_fds.values():
            os.close(copy)
        _State.std_fds = {}
        for _pid, msg_w, result_r in _State.standbys:  # the template's, not ours
            os.close(msg_w)
            os.close(result_r)
        _State.standbys, _State.unreaped, _State.fork_child = [], [], 0
        _State.per_call = False  # its first run drops the copies kept here
        keep_std_fds()
        restore_std_fds()
        forked = Channel(in_fd, out_fd)
        _State.channel = forked
        forked.send(wire.message(
            "hello", protocol=wire.PROTOCOL_VERSION, python=list(sys.version_info[:3]),
            pid=os.getpid(), fork=True, executable=sys.executable))
        serve(forked, namespace)
        reap_children(block=True)
        status = 0
    finally:
        os._exit(status)


def _snapshots() -> Any:
    """_coordex_snapshot.py, loaded by path beside this file on first use."""
    loaded = sys.modules.get("_coordex_snapshot")
    if loaded is None:
        import importlib.util

        spec = importlib.util.spec_from_file_location(
            "_coordex_snapshot", os.path.join(_HERE, "_coordex_snapshot.py"))
        assert spec is not None and spec.loader is not None
        loaded = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(loaded)
        sys.modules["_coordex_snapshot"] = loaded
    return loaded


def _parse_fds(argv: List[str]) -> tuple:
    fds = {}
    for flag in ("--in", "--out"):
        fds[flag] = int(argv[argv.index(flag) + 1])
    return fds["--in"], fds["--out"]


def main(argv: List[str]) -> int:
    in_fd, out_fd = _parse_fds(argv)
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(encoding="utf-8", errors="backslashreplace")
    # Notebook semantics: modules in the working folder are importable, as with `python -c`.
    sys.path.insert(0, "")
    os.environ.setdefault("MPLBACKEND", "Agg")  # the host sets it (and the pagers) too
    install_signal_handlers()
    keep_std_fds()
    filter_streams()
    channel = Channel(in_fd, out_fd)
    _State.channel = channel
    _State.script_module = sys.modules["__main__"]  # our own globals stay apart from the user's
    namespace = fresh_namespace()
    channel.send(wire.message(
        "hello", protocol=wire.PROTOCOL_VERSION, python=list(sys.version_info[:3]),
        pid=os.getpid(), fork=hasattr(os, "fork"), executable=sys.executable))
    serve(channel, namespace)
    reap_children(block=True)
    standbys, _State.standbys = _State.standbys, []
    for _, msg_w, result_r in standbys:  # end of file on its pipe makes each one exit
        os.close(msg_w)
        os.close(result_r)
    for pid, _, _ in standbys:
        os.waitpid(pid, 0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
