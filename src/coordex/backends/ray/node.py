"""The coordex actor of one node: it owns the processes of the sessions placed there.

:class:`NodeHost` runs inside a Ray worker process on a cluster node (:mod:`.place`
wraps it with ``ray.remote``; nothing here imports Ray at module level, so the class
loads where Ray is missing). It holds the very backends the Executor holds on the
server - :class:`~coordex.backends.shell.session.ShellSession`,
:class:`~coordex.backends.env.workers.WorkerSession` and
:class:`~coordex.backends.env.workers.WorkerTemplate` - so a session on a node keeps every
promise it keeps at home: read-only copies fork the worker (or subshell the shell) on
this node, never the actor; timeouts interrupt and escalate here.

A call is begun by :meth:`NodeHost.begin` and runs on a thread of its own. What the
driver must see while it runs - output chunks, build progress lines, capability calls
waiting for their answer - is queued as *events*; ``begin`` and :meth:`NodeHost.events`
each wait until there is something to hand back or the call ended, so a short call
costs one actor round trip. Capability calls travel back to the driver as events and
their answers come with the driver's next ``events`` request: capabilities run in the
Executor's process, as everywhere.

Every process this actor starts carries ``COORDEX_NODE_OWNER=<token>`` in its
environment. A small *reaper* process holds the read end of a pipe whose write end
only the actor has; when the actor dies in any way (``ray.kill``, its node removed, a
crash) the pipe reads end-of-file and the reaper SIGKILLs every process carrying the
token - shells, workers, their fork children and whatever the code left running.
"""

from __future__ import annotations

import base64
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...core import facts
from ...core.errors import CoordexError
from ...core.facts import Ran
from ..base import RunRequest

OWNER_ENV = "COORDEX_NODE_OWNER"

# The driver <-> node actor conversation (docs/protocol.md, "The driver ↔ node actor
# conversation"): the actor's methods, the operations ``begin`` runs, the events a call
# hands back and the keys its end carries. A change to any of them raises the version:
# the actor says it in ``info``, and the driver refuses an actor of another version
# when it starts (a node running another coordex), before any call goes to it.
CLUSTER_WIRE_VERSION = 1
ACTOR_METHODS = ("info", "alive", "count", "begin", "events", "close_session", "shutdown",
                 "orphans")
BRANCH_OPS = ("fork", "checkpoint_start", "checkpoint_finish", "restore")  # SPEC 15
OPS = ("open", "run", "read_only", "stateless", "inspect", *BRANCH_OPS)
# Each event is a list: its kind, then these fields.
EVENTS = {"output": ("stream", "text"), "progress": ("line",),
          "capability": ("number", "name", "args", "kwargs")}
# A call's end (``done``) holds exactly one of these.
DONE_KEYS = ("ran", "outcome", "raise")
# How long a capability call on a node waits for the driver's answer before it fails.
CAPABILITY_WAIT = 300.0

# Runs as ``python -I -c REAPER OWNER_ENV=TOKEN``: forks once and lets its parent exit
# (Ray kills the direct children of a worker that exits, which would take the reaper
# before it acted), waits for end-of-file on stdin (the actor is gone), then kills
# every process whose environment carries the token. Three passes: a process may fork
# while the first pass runs.
_REAPER = r"""
import os, signal, sys
if os.fork():
    os._exit(0)
mark = sys.argv[1].encode()
while os.read(0, 4096):
    pass
me = os.getpid()
for _ in range(3):
    found = False
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open("/proc/" + entry + "/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if mark in env:
            found = True
            try:
                os.kill(int(entry), signal.SIGKILL)
            except OSError:
                pass
    if not found:
        break
"""


@dataclass
class _Call:
    """One call in flight on this node and what it has for the driver."""

    cond: threading.Condition = field(default_factory=threading.Condition)
    events: list[tuple[Any, ...]] = field(default_factory=list)
    done: dict[str, Any] | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    answers: dict[int, tuple[bool, Any]] = field(default_factory=dict)
    asked: int = 0

    def post(self, event: tuple[Any, ...]) -> None:
        with self.cond:
            self.events.append(event)
            self.cond.notify_all()

    def finish(self, reply: dict[str, Any]) -> None:
        with self.cond:
            self.done = reply
            self.cond.notify_all()

    def take(self, wait: float) -> dict[str, Any]:
        deadline = time.monotonic() + wait
        with self.cond:
            while not self.events and self.done is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(left)
            events, self.events = self.events, []
            return {"events": events, "done": self.done}


_current = threading.local()  # the _Call a thread is running (capability calls need it)


class _NodeCapabilities:
    """The driver's capabilities as a node's worker sees them (``CapabilityHost``).

    One object serves every session and template of the node: the call running on the
    asking thread is found through ``_current``; its names came with the request.
    """

    def names(self) -> list[str]:
        return list(getattr(_current, "names", []))

    def call(self, name: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        call: _Call | None = getattr(_current, "call", None)
        if call is None:
            raise RuntimeError("capability called outside a call")
        with call.cond:
            call.asked += 1
            number = call.asked
            call.events.append(("capability", number, name, args, kwargs))
            call.cond.notify_all()
            deadline = time.monotonic() + CAPABILITY_WAIT
            while number not in call.answers:
                left = deadline - time.monotonic()
                if left <= 0 or call.cancel.is_set():
                    raise TimeoutError(f"the host did not answer capability {name!r}")
                call.cond.wait(min(left, 0.5))
            ok, value = call.answers.pop(number)
        if ok:
            return value
        kind, message = value
        # The worker reports the error's type by name: keep the driver's name.
        raise type(str(kind), (Exception,), {})(message)


class NodeHost:
    """Sessions, stateless runners and environments of one node (one Ray actor).

    Args:
        envs_dir: where this node builds environments; default ``envs`` under the
            node's coordex data folder (``COORDEX_HOME`` there, else the user data dir).
        build_timeout: seconds one build may take.
        max_calls: calls run at once (more wait their turn); None: no limit. A tenant's
            host on a node sets it to the server's ``--max-calls`` (SPEC 9's limits).
        environments_manager: builds through this manager's ``build_spec`` instead (a
            tenant's host on a node: its jail's builder, the folder read-only here).
    """

    def __init__(self, envs_dir: str | None = None, build_timeout: float = 900.0,
                 max_calls: int | None = None, environments_manager: Any = None) -> None:
        self._token = secrets.token_hex(8)
        os.environ[OWNER_ENV] = self._token  # inherited by every process started here
        self._sessions: dict[str, Any] = {}
        self._templates: dict[str, Any] = {}
        self._calls: dict[str, _Call] = {}
        self._pythons: dict[str, Path] = {}
        self._pending: dict[str, tuple[str, Any]] = {}  # checkpoints being written
        self._lock = threading.Lock()
        self._capabilities = _NodeCapabilities()
        self._envs_dir = envs_dir
        self._build_timeout = build_timeout
        self._builder: Any = None
        self._environments = environments_manager
        self._turns = threading.BoundedSemaphore(max_calls) if max_calls else None
        self._reaper = self._start_reaper()
        # Set once this node lost the cluster (its fence ends everything after): a call
        # in flight then reports the lost node, never what ending its process looked
        # like from here (an interrupt, a closed session).
        self._lost: str | None = None
        fence(self._fenced)

    def _start_reaper(self) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if k != OWNER_ENV}
        reaper = subprocess.Popen([sys.executable, "-I", "-c", _REAPER,
                                   f"{OWNER_ENV}={self._token}"],
                                  stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, env=env, start_new_session=True)
        reaper.wait()  # the parent half exits at once; its child holds the pipe
        return reaper

    # -- facts ----------------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        """Where this actor runs: node id, host name, pid, the owner token, and the
        version of the conversation it speaks (``wire``: :data:`CLUSTER_WIRE_VERSION`)."""
        import socket

        node = ""
        with contextlib.suppress(Exception):
            import ray

            node = ray.get_runtime_context().get_node_id()
        return {"node": node, "host": socket.gethostname(), "pid": os.getpid(),
                "owner": self._token, "wire": CLUSTER_WIRE_VERSION}

    def alive(self, sid: str) -> bool:
        session = self._sessions.get(sid)
        return session is not None and bool(session.alive())

    def count(self) -> int:
        return len(self._sessions)

    # -- calls ----------------------------------------------------------------------------

    def begin(self, call_id: str, op: str, args: dict[str, Any], wait: float) -> dict[str, Any]:
        """Start ``op`` on a thread of its own; hand back what it has within ``wait``.

        Idempotent per ``call_id`` (a retried request does not run the code twice).
        """
        with self._lock:
            call = self._calls.get(call_id)
            fresh = call is None
            if call is None:
                call = self._calls[call_id] = _Call()
        if fresh:
            threading.Thread(target=self._serve, args=(call, op, args), daemon=True,
                             name=f"coordex-{op}").start()
        return self._reply(call_id, call, wait)

    def events(self, call_id: str, wait: float,
               answers: list[tuple[int, bool, Any]] | None = None,
               cancel: bool = False) -> dict[str, Any]:
        """Answers to capability calls in; events (or the end) of the call out."""
        call = self._calls.get(call_id)
        if call is None:
            return {"events": [], "done": {"ran": facts.to_wire(Ran(facts.Died(
                "node", "the node no longer knows this call (its actor restarted)",
                taken=True)))}}
        with call.cond:
            for number, ok, value in answers or ():
                call.answers[number] = (ok, value)
            if cancel:
                call.cancel.set()
            call.cond.notify_all()
        return self._reply(call_id, call, 0.0 if answers else wait)

    def _reply(self, call_id: str, call: _Call, wait: float) -> dict[str, Any]:
        reply = call.take(wait)
        if reply["done"] is not None:
            with self._lock:
                self._calls.pop(call_id, None)
        return reply

    def _serve(self, call: _Call, op: str, args: dict[str, Any]) -> None:
        # Ray's threads block signals, and a blocked mask is inherited through fork and
        # exec: a shell or worker started from such a thread would never see the SIGINT
        # of a timeout. The processes of this call start from this thread.
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        _current.call = call
        _current.names = list(args.get("capabilities") or [])
        turn = self._turns if self._turns is not None else contextlib.nullcontext()
        try:
            with turn:
                value = self._op(call, op, args)
            reply: dict[str, Any] = ({"ran": facts.to_wire(value)} if isinstance(value, Ran)
                                     else {"outcome": value})
        except CoordexError as exc:
            reply = {"raise": exc.to_dict()}
        except Exception as exc:  # a bug here must still end the driver's wait
            reply = {"ran": facts.to_wire(Ran(facts.Died(
                "node", f"coordex's actor on the node failed: {type(exc).__name__}: {exc}",
                taken=True)))}
        finally:
            _current.call = None
        if self._lost is not None and op in ("run", "read_only", "stateless"):
            reply = {"ran": facts.to_wire(Ran(facts.Died("node", self._lost, taken=True)))}
        call.finish(reply)

    def _op(self, call: _Call, op: str, args: dict[str, Any]) -> Any:
        if op == "open":
            return self._open(call, args)
        if op in _BRANCH_OPS:  # SPEC 15: a fork or a checkpoint of a session here
            return getattr(self, "_" + op)(args)
        if op == "inspect":
            session = self._session(args["sid"])
            return session.inspect() if session is not None else _gone_session()
        request = self._request(call, args)
        try:
            if op == "stateless":
                return self._stateless(call, args, request)
            session = self._session(args["sid"])
            if session is None:
                return _gone_session()
            if op == "read_only":
                return session.run_read_only(request)
            return session.run(request)
        finally:
            if request.scratch is not None:
                shutil.rmtree(request.scratch, ignore_errors=True)

    def _request(self, call: _Call, args: dict[str, Any]) -> RunRequest:
        def on_output(stream: str, text: str) -> None:
            call.post(("output", stream, text))

        # The scratch folder of a read-only call must exist where the copy runs: here.
        scratch = tempfile.mkdtemp(prefix="coordex-ro-") if args.get("scratch") else None
        return RunRequest(code=args["code"], timeout=float(args["timeout"]),
                          on_output=on_output if args.get("stream") else None,
                          output_limit=int(args["output_limit"]),
                          value_limit=args.get("value_limit"),
                          protect_paths=tuple(args.get("protect_paths") or ()),
                          scratch=scratch, cancel=call.cancel,
                          env=args.get("call_env"))  # the trace context (SPEC 16)

    # -- branches and checkpoints (SPEC 15) --------------------------------------------------

    def _fork(self, args: dict[str, Any]) -> dict[str, Any]:
        from ..base import Forkable

        session = self._session(args["sid"])
        if session is None:
            raise _gone_error()
        if not isinstance(session, Forkable):
            raise CoordexError("validation", "This session cannot be forked on its node.",
                               "Use state_mode='read_only' to try a step on a copy.")
        forked = session.fork(float(args["timeout"]))
        with self._lock:
            self._sessions[args["new_sid"]] = forked.session
        return {"copy": forked.copy, "left_out": list(forked.left_out)}

    def _checkpoint_start(self, args: dict[str, Any]) -> dict[str, Any]:
        """Start the session's copy writing into a folder of this node; the driver asks
        for what it wrote with ``checkpoint_finish`` (the session answers meanwhile)."""
        from ..base import Checkpointable

        session = self._session(args["sid"])
        if session is None:
            raise _gone_error()
        if not isinstance(session, Checkpointable):
            raise CoordexError("validation", "This session cannot be checkpointed on its "
                               "node.", "Rebuild the state in a new session instead.")
        folder = tempfile.mkdtemp(prefix="coordex-checkpoint-")
        token = secrets.token_hex(8)
        finish = session.start_checkpoint(folder, int(args["max_bytes"]))
        with self._lock:
            self._pending[token] = (folder, finish)
        return {"token": token}

    def _checkpoint_finish(self, args: dict[str, Any]) -> dict[str, Any]:
        """What the copy wrote: ``{"written", "files": {name: base64}}`` (the folder goes;
        the driver keeps the checkpoint, so it outlives this node)."""
        with self._lock:
            folder, finish = self._pending.pop(args["token"])
        try:
            written = finish(float(args["timeout"]))
            files = {} if "error" in written else {
                p.name: base64.b64encode(p.read_bytes()).decode("ascii")
                for p in Path(folder).iterdir() if p.is_file()}
            return {"written": written, "files": files}
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _restore(self, args: dict[str, Any]) -> dict[str, Any]:
        session = self._session(args["sid"])
        if session is None:
            raise _gone_error()
        folder = tempfile.mkdtemp(prefix="coordex-checkpoint-")
        try:
            for name, data in dict(args["files"]).items():
                if "/" in name or name.startswith("."):
                    continue
                (Path(folder) / name).write_bytes(base64.b64decode(data))
            report: dict[str, Any] = session.restore_checkpoint(folder, float(args["timeout"]))
            return report
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _session(self, sid: str) -> Any:
        with self._lock:
            return self._sessions.get(sid)

    # -- sessions and stateless calls -----------------------------------------------------

    def _open(self, call: _Call, args: dict[str, Any]) -> dict[str, Any]:
        sid, language, env = args["sid"], args["language"], args.get("env")
        folder = self._environment(call, env) if env is not None else None
        if language == "bash":
            from ..shell import ShellSession

            session: Any = ShellSession(env=_activated(folder))
        else:
            from ..env.workers import WorkerSession

            assert folder is not None and env is not None
            session = WorkerSession(self._pythons[env["spec_hash"]], env=_activated(folder),
                                    capabilities=self._capabilities)
        with self._lock:
            self._sessions[sid] = session
        return {"opened": sid}

    def _stateless(self, call: _Call, args: dict[str, Any], request: RunRequest) -> Ran:
        env = args.get("env")
        folder = self._environment(call, env) if env is not None else None
        if args["language"] == "bash":
            from ..shell import run_stateless

            return run_stateless(request, env=_activated(folder))
        assert env is not None and folder is not None
        from ..env.workers import WorkerTemplate

        with self._lock:
            template = self._templates.get(env["spec_hash"])
        if template is None:
            made = WorkerTemplate(self._pythons[env["spec_hash"]], env=_activated(folder),
                                  capabilities=self._capabilities)
            with self._lock:
                template = self._templates.setdefault(env["spec_hash"], made)
            if template is not made:
                made.close()
        ran: Ran = template.run_stateless(request)
        return ran

    def _environment(self, call: _Call, env: dict[str, Any]) -> Path:
        """Build the environment here (cached per node by its spec hash); its folder."""
        spec_hash = env["spec_hash"]
        python = self._pythons.get(spec_hash)
        if python is not None and python.exists():
            return python.parent.parent
        if self._environments is not None:
            built = self._environments.build_spec(
                env["spec_text"], spec_hash, env["label"],
                on_progress=lambda line: call.post(("progress", line)))
            self._pythons[spec_hash] = Path(built["python"])
            return Path(built["path"])
        from ...core.spec import parse_spec
        from ...environments.builder import EnvironmentBuilder, find_interpreter

        with self._lock:
            if self._builder is None:
                root = Path(self._envs_dir).parent if self._envs_dir else _node_root()
                envs = Path(self._envs_dir) if self._envs_dir else root / "envs"
                self._builder = EnvironmentBuilder(envs, root / "logs",
                                                   timeout=self._build_timeout)
            builder = self._builder
        spec = parse_spec(env["spec_text"])
        built = builder.ensure_built(
            spec, spec_hash, find_interpreter(spec.requires_python),
            on_progress=lambda line: call.post(("progress", line)), label=env["label"])
        self._pythons[spec_hash] = built.python
        return Path(built.path)

    # -- ending ---------------------------------------------------------------------------

    def close_session(self, sid: str) -> bool:
        with self._lock:
            session = self._sessions.pop(sid, None)
        if session is None:
            return False
        session.close()
        return True

    def shutdown(self) -> None:
        """End every process this actor started; the actor itself is killed after."""
        with self._lock:
            backends = list(self._sessions.values()) + list(self._templates.values())
            self._sessions.clear()
            self._templates.clear()
            calls = list(self._calls.values())
        for call in calls:
            call.cancel.set()
        for backend in backends:
            with contextlib.suppress(Exception):
                backend.close()

    close = shutdown  # as a confined host's served object (``--serve node``)

    def _fenced(self) -> None:
        """The node lost the cluster: every call in flight says so (SPEC 10), then
        every process ends."""
        self._lost = ("its node lost the cluster: the raylet there is gone, and coordex "
                      "ended the session's processes on it")
        self.shutdown()

    def orphans(self) -> list[int]:
        """Pids on this machine that carry this actor's token (tests and diagnostics)."""
        return _marked_pids(self._token, exclude=os.getpid())


# How often an actor checks that its node's raylet still lives (SPEC 10: a node that
# loses the cluster ends its sessions' processes within 10 s).
FENCE_PERIOD = 1.0


def fence(end: Any) -> threading.Thread | None:
    """Watch this Ray worker's raylet; when it is gone (the node lost the cluster: a
    raylet killed, a node cut off), call ``end`` (bounded) and exit, so the reaper ends
    every process the actor started and no session runs on unseen. A node's raylet is
    the worker's parent; outside Ray (a jail's ``--serve node``) nothing is watched."""
    raylet = os.environ.get("RAY_RAYLET_PID", "")
    if not raylet.isdigit():
        return None
    pid = int(raylet)

    def watch() -> None:
        while True:
            time.sleep(FENCE_PERIOD)
            try:
                os.kill(pid, 0)
                if os.getppid() == pid:
                    continue
            except ProcessLookupError:
                pass
            except PermissionError:
                continue
            ender = threading.Thread(target=end, daemon=True)
            ender.start()
            ender.join(5.0)
            os._exit(70)

    thread = threading.Thread(target=watch, name="coordex-fence", daemon=True)
    thread.start()
    return thread


def _node_root() -> Path:
    from ...core.root import default_root

    return default_root()


def _activated(folder: Path | None) -> dict[str, str] | None:
    """This node's environment with ``folder`` activated (None: as it is)."""
    if folder is None:
        return None
    env = dict(os.environ)
    env["VIRTUAL_ENV"] = str(folder)
    env["PATH"] = str(folder / "bin") + os.pathsep + env.get("PATH", "")
    env.pop("PYTHONHOME", None)
    return env


def _marked_pids(token: str, exclude: int = -1) -> list[int]:
    mark = f"{OWNER_ENV}={token}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == exclude:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if mark in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


_BRANCH_OPS = BRANCH_OPS


def _gone_error() -> CoordexError:
    return CoordexError("crashed", "The session is no longer held on its node (it was closed "
                        "or its node's actor restarted).", "Run a call in the session to open "
                        "it again, then retry.", state_lost=True)


def _gone_session() -> Ran:
    return Ran(facts.Died("process", "the session is no longer held on its node (it was "
                          "closed or its actor restarted)"))


__all__ = ["OWNER_ENV", "NodeHost"]
