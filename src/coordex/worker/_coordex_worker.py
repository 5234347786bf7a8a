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
  ``os._exit``; this process, and so the session, never sees what it changed.
- ``stateless`` forks too, but the child starts from a fresh namespace. A worker that
  only ever serves stateless runs is a clean *template* (a fork server).

SIGINT raises KeyboardInterrupt in the cell (the engine reports it, the state stays);
while a fork child runs, SIGINT is forwarded to it and SIGUSR1 kills it. Between cells
SIGINT is ignored, so a late interrupt can never end the worker.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any, Dict, List, Optional

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
try:
    import _coordex_engine as engine
    import _coordex_protocol as wire
finally:
    # The folder is only needed for these two imports; keep the user's sys.path clean.
    if sys.path and sys.path[0] == _HERE:
        del sys.path[0]

_HIDDEN_NAMES = ("__builtins__", "_")


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


class Channel:
    """The protocol pipes: blocking line reads in, whole-line writes out."""

    def __init__(self, in_fd: int, out_fd: int) -> None:
        self.reader = wire.LineReader(in_fd)
        self.out_fd = out_fd
        self._next_call = 0

    def send(self, msg: Dict[str, Any]) -> None:
        data = wire.encode(msg)
        view = memoryview(data)
        while view:
            written = os.write(self.out_fd, view)
            view = view[written:]

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
        channel = _State.channel
        if channel is None or not (_State.in_user_code or _State.in_fork_child):
            raise CapabilityError("capability %r can only be called while a call runs "
                                  "(not from a thread left running after it)" % name)
        wire_args = wire.to_wire(list(args), "capability %r argument" % name)
        wire_kwargs = wire.to_wire(kwargs, "capability %r keyword argument" % name)
        reply = channel.call_capability(name, wire_args, wire_kwargs)
        error = reply.get("error")
        if error is not None:
            raise CapabilityError("capability %r failed on the host: %s: %s"
                                  % (name, error.get("type", "Error"), error.get("message", "")))
        return wire.from_wire(reply.get("value"))


def protect(paths: List[str]) -> str:
    """Called in a read_only fork child before user code; returns the files mode.

    The seam for read-only file protection (SPEC guarantee 3): an optional sibling
    module ``_coordex_isolation`` with ``protect(paths) -> "discarded"|"refused"|"none"``
    takes over when present. Without it nothing is protected, and the result says so.
    """
    try:
        import _coordex_isolation
    except ImportError:
        return "none"
    try:
        return _coordex_isolation.protect(paths)
    except Exception as exc:  # protection failed: run unprotected, never over-claim
        sys.stderr.write("coordex: file protection unavailable (%s: %s)\n"
                         % (type(exc).__name__, exc))
        return "none"


def _on_sigint(signum: int, frame: Any) -> None:
    if _State.fork_child:
        _signal_child(signal.SIGINT)
    elif _State.in_user_code:
        raise KeyboardInterrupt
    # else: a late interrupt for a cell that already finished; ignore it.


def _on_sigusr1(signum: int, frame: Any) -> None:
    # The host gave up on an interrupted fork child: only the child dies, the session lives.
    if _State.fork_child:
        _signal_child(signal.SIGKILL)


def install_signal_handlers() -> None:
    signal.signal(signal.SIGINT, _on_sigint)
    signal.signal(signal.SIGUSR1, _on_sigusr1)


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
    stubs = _State.capabilities
    return [name for name in namespace
            if name not in _HIDDEN_NAMES and not (name.startswith("__") and name.endswith("__"))
            and not (name in stubs and namespace[name] is stubs[name])]


def _finish_output(mark: str) -> None:
    """Flush the user's streams and write the run's mark to fds 1 and 2."""
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except BaseException:
            pass
    data = mark.encode("ascii")
    for fd in (1, 2):
        try:
            os.write(fd, data)
        except OSError:
            pass  # the cell closed the fd; the host stops waiting for the mark after a moment


def run_stateful(msg: Dict[str, Any], namespace: Dict[str, Any]) -> Dict[str, Any]:
    before = {name: namespace[name] for name in _user_names(namespace)}
    outcome = None
    try:
        try:
            _State.in_user_code = True
            outcome = engine.run_cell(msg["code"], namespace, msg["output_limit"])
        finally:
            _State.in_user_code = False
            # A cell may have replaced our handlers (even with SIG_IGN for itself); the
            # next cell must be interruptible again.
            install_signal_handlers()
    except KeyboardInterrupt:  # landed between the engine's handler and ours
        if outcome is None:
            outcome = {"result": None, "interrupted": True, "images": [],
                       "error": {"exception": "KeyboardInterrupt", "message": "",
                                 "traceback": "KeyboardInterrupt\n"}}
    after = _user_names(namespace)
    outcome["rebound"] = [name for name in after
                          if name not in before or namespace[name] is not before[name]]
    outcome["deleted"] = [name for name in before if name not in namespace]
    return outcome


def run_forked(msg: Dict[str, Any], namespace: Dict[str, Any]) -> Dict[str, Any]:
    """Run the cell in a fork child; this process's state is never touched."""
    read_fd, write_fd = os.pipe()
    import warnings

    with warnings.catch_warnings():
        # 3.12+ warns that fork() in a multi-threaded process may deadlock. Threads the
        # user started are a known risk of read_only; the warning would only be noise
        # in the user's stderr.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
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
        status = os.waitpid(pid, 0)[1]
    finally:
        _State.fork_child = 0
        os.close(read_fd)
    raw = b"".join(chunks)
    if raw:
        import json

        return json.loads(raw.decode("ascii"))
    # The child died before it could report (os._exit, a signal, SIGUSR1 from the host).
    died: Dict[str, Optional[int]] = {"code": None, "signal": None}
    if os.WIFSIGNALED(status):
        died["signal"] = os.WTERMSIG(status)
    elif os.WIFEXITED(status):
        died["code"] = os.WEXITSTATUS(status)
    outcome: Dict[str, Any] = {"result": None, "error": None, "interrupted": False,
                               "images": [], "child_died": died}
    if msg["mode"] == "read_only":
        outcome["isolation"] = {"names": True, "objects": True, "files": "none"}
    return outcome


def _child_main(msg: Dict[str, Any], namespace: Dict[str, Any], result_fd: int) -> None:
    status = 70
    try:
        _State.in_fork_child = True
        _State.fork_child = 0
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if msg["mode"] == "stateless":
            namespace = fresh_namespace()
            files = None
        else:
            files = protect(msg.get("protect") or [])
        outcome = None
        try:
            outcome = engine.run_cell(msg["code"], namespace, msg["output_limit"])
        except KeyboardInterrupt:
            pass
        if outcome is None:
            outcome = {"result": None, "interrupted": True, "images": [],
                       "error": {"exception": "KeyboardInterrupt", "message": "",
                                 "traceback": "KeyboardInterrupt\n"}}
        if files is not None:
            outcome["isolation"] = {"names": True, "objects": True, "files": files}
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        import json

        data = json.dumps(outcome, separators=(",", ":")).encode("ascii")
        view = memoryview(data)
        while view:
            view = view[os.write(result_fd, view):]
        status = 0
    except BaseException:
        pass
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
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
                if msg["mode"] == "stateful":
                    outcome = run_stateful(msg, namespace)
                else:
                    outcome = run_forked(msg, namespace)
                _finish_output(msg["mark"])
                outcome["id"] = msg["id"]
                outcome["type"] = "done"
                channel.send(outcome)
            elif kind == "inspect":
                names = inspect_names(namespace)
                channel.send(wire.message("inspect_result", id=msg["id"], names=names,
                                          capabilities=sorted(_State.capabilities)))
            # capability_result outside a call: a reply to an interrupted call; drop it.
        except KeyboardInterrupt:
            continue  # an interrupt that raced the end of a cell; the host has its answer


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
    os.environ.setdefault("MPLBACKEND", "Agg")
    os.environ.setdefault("PAGER", "cat")
    os.environ.setdefault("GIT_PAGER", "cat")
    install_signal_handlers()
    channel = Channel(in_fd, out_fd)
    _State.channel = channel
    _State.script_module = sys.modules["__main__"]  # our own globals stay apart from the user's
    namespace = fresh_namespace()
    channel.send(wire.message(
        "hello", protocol=wire.PROTOCOL_VERSION, python=list(sys.version_info[:3]),
        pid=os.getpid(), fork=hasattr(os, "fork"), executable=sys.executable))
    serve(channel, namespace)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
