"""Sessions on a Ray cluster, seen from the Executor's process (the driver).

:class:`RayCluster` joins the cluster and keeps coordex's actors (:class:`.node.NodeHost`
wrapped with ``ray.remote``): one shared actor per node, pinned there, for sessions
that ask for no resources, and one actor of its own for each session (or stateless
runner) whose environment asks for ``num_cpus``/``num_gpus``/``memory`` - Ray places
that actor on a node that has them and holds them while it lives.

:class:`RayPlace` is one (language, environment) on the cluster and implements the
``Place`` protocol; :class:`RaySession` implements ``Session`` and says on which
``node`` it lives. A call is a *conversation* with an actor (:meth:`RayCluster.converse`):
``begin``, then ``events`` polls until the outcome arrives, streaming output to
``on_output``, running capability calls here and sending their answers back, passing a
cancel on. Every wait is bounded: a poll that gets no answer is asked again until the
call's deadline (its timeout plus the node's own escalation grace, twice for Python,
which the node may retry once), so an unreachable node costs at most that; a dead
actor (``RayActorError``) ends the conversation at once.

Faults follow SPEC sections 6 and 10: a Python session whose node died between calls
is opened again on another node and the call runs there (``retried``, ``state_lost``);
a call the lost node had already taken is never run a second time elsewhere (its first
run may still be going on a node cut off from the cluster, until the node's fence,
:func:`.node.fence`, ends it): it returns ``crashed`` with ``state_lost`` and a
suggestion naming ``rebuild_session``, as a bash call always does; the next call opens
a fresh session elsewhere.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...core import facts, messages
from ...core.errors import CoordexError
from ...core.facts import Ran
from ..base import INTERRUPT_GRACE, CapabilityHost, Forked, RunRequest, Written
from .node import CLUSTER_WIRE_VERSION, NodeHost

# Each wait of the driver on an actor: a poll returns as soon as there is output, so
# this only bounds how often an idle long call is polled.
POLL_WAIT = 0.25
# Extra seconds a ray.get may take beyond the actor's own wait (scheduling, a busy node)
# before the driver asks again.
GET_SLACK = 2.0
# Past a call's timeout the node interrupts, waits INTERRUPT_GRACE, kills and reports:
# the driver waits that long and a little more before it calls the node lost.
NODE_GRACE = 2 * INTERRUPT_GRACE + 2.0
# Starting an actor (a Ray worker process) and opening or inspecting a session.
START_TIMEOUT = 60.0
INSPECT_TIMEOUT = 15.0
ALIVE_TIMEOUT = 2.0
CLOSE_TIMEOUT = 10.0
# Threads of one actor that may serve driver requests at once (calls run on their own).
MAX_CONCURRENCY = 64

ProgressCallback = Callable[[str], None]


def import_ray() -> Any:
    """The ``ray`` module, or a ``validation`` error saying how to install it."""
    try:
        import ray
    except ImportError:
        raise CoordexError(
            "validation", "Executor(cluster=...) needs Ray, which is not installed here.",
            "Install the extra with pip install 'coordex[ray]' (Ray 2.x, on this machine "
            "and on every node), then create the Executor again; or pass cluster=None to "
            "keep every session on this machine.")
    return ray


@dataclass(frozen=True)
class EnvRef:
    """What a node needs to build an environment: the spec text and its hash."""

    spec_text: str
    spec_hash: str
    label: str
    resources: dict[str, float] = field(default_factory=dict)

    def wire(self) -> dict[str, Any]:
        return {"spec_text": self.spec_text, "spec_hash": self.spec_hash,
                "label": self.label}


@dataclass
class _Host:
    """One coordex actor: its handle, its node, and whether one session owns it."""

    handle: Any
    node: str
    dedicated: bool


class NodeLost(Exception):
    """The actor holding a call died, or did not answer before the call's deadline.

    ``started``: the node had taken the call (it answered for it at least once), so its
    first run may still be going there (a node cut off from the cluster runs on until
    its fence ends it): SPEC 10 never runs such a call a second time elsewhere.
    """

    def __init__(self, how: str, *, unreachable: bool = False, started: bool = False) -> None:
        super().__init__(how)
        self.how = how
        self.unreachable = unreachable
        self.started = started


def wire_refused(info: Any, what: str) -> CoordexError | None:
    """The error for an actor that speaks another version of the driver <-> node
    conversation than this coordex (its ``info``'s ``wire``), or None when it matches."""
    found = info.get("wire") if isinstance(info, dict) else None
    if found == CLUSTER_WIRE_VERSION:
        return None
    return messages.cluster_wire_mismatch(what, found, CLUSTER_WIRE_VERSION)


class RayCluster:
    """The Executor's connection to a Ray cluster and the coordex actors on it.

    Args:
        address: ``"auto"``, ``"ray://host:port"`` or a cluster's address; when Ray is
            already initialised in this process, that connection is used as it is.
        capabilities: the host's capabilities (``names()``, ``call(...)``).
        build_timeout: seconds a node may take to build one environment.
        tenant: one tenant of a server with several (``name`` and the limits of SPEC 9):
            its sessions run in a confined host of that tenant on each node
            (:class:`.tenant.TenantNodeHost`), and only on nodes that can confine.

    Raises:
        CoordexError: ``validation`` when Ray is missing or the cluster cannot be joined.
    """

    def __init__(self, address: str, *, capabilities: Any, build_timeout: float = 900.0,
                 tenant: dict[str, Any] | None = None, tenant_actor: type | None = None,
                 probe: Callable[[], dict[str, str]] | None = None) -> None:
        ray = import_ray()
        self._ray = ray
        from ray import exceptions

        self._died: tuple[type[Exception], ...] = (exceptions.RayActorError,
                                                   exceptions.ActorUnschedulableError)
        self._unavailable: Any = getattr(exceptions, "ActorUnavailableError", ())
        self._timeout: type[Exception] = exceptions.GetTimeoutError
        self._owns_connection = not ray.is_initialized()
        if self._owns_connection:
            try:
                # Ray retries an address that does not answer for minutes: ask it first.
                _check_reachable(address)
                ray.init(address=address, log_to_driver=False, configure_logging=False)
            except Exception as exc:
                raise CoordexError(
                    "validation", f"Could not join the Ray cluster at {address!r}: "
                    f"{type(exc).__name__}: {exc}",
                    "Start the cluster first (ray start --head on the head node, ray start "
                    "--address=HEAD:6379 on the others), then pass cluster='auto' on a node "
                    "of it or cluster='ray://HEAD:10001' from elsewhere.")
        self.address = address
        self.capabilities = capabilities
        self.build_timeout = float(build_timeout)
        self.tenant = dict(tenant) if tenant is not None else None
        # A tenant's sessions run in its confined host on each node: the hosting side
        # (coordex.hosting.tenant_node) gives the actor that starts it, and the probe
        # that says what a node can confine. A place knows neither.
        if self.tenant is not None and tenant_actor is None:
            raise ValueError("a tenant's cluster needs the actor that hosts it on a node")
        self._actor = ray.remote(tenant_actor if self.tenant is not None else NodeHost)
        self._probe = probe
        self._levels: dict[str, dict[str, str]] = {}  # node id -> its confinement (tenants)
        self._lock = threading.Lock()
        self._shared: dict[str, _Host] = {}  # node id -> the node's shared actor
        self._dedicated: list[_Host] = []
        self._load: dict[str, int] = {}  # node id -> sessions placed there by us
        self._dead: set[str] = set()
        self._places: dict[tuple[str, str | None], RayPlace] = {}
        self._closed = False

    # -- places and hosts -----------------------------------------------------------------

    def place(self, language: str, env: EnvRef | None) -> RayPlace:
        """The place of one (language, environment) on the cluster (kept per spec hash)."""
        key = (language, env.spec_hash if env is not None else None)
        with self._lock:
            found = self._places.get(key)
            if found is None:
                found = self._places[key] = RayPlace(self, language, env)
            return found

    def host(self, resources: dict[str, float]) -> _Host:
        """An actor for one more session: its own when ``resources`` ask for any, else
        the shared actor of the least loaded live node."""
        if resources:
            return self._dedicated_host(resources)
        node = self._pick_node()
        with self._lock:
            host = self._shared.get(node)
        if host is None:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            handle = self._actor.options(
                num_cpus=0, max_concurrency=MAX_CONCURRENCY, max_restarts=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
            ).remote(self.tenant, self.build_timeout)
            host = self._started(handle, False, "the node's coordex actor")
            with self._lock:
                host = self._shared.setdefault(node, host)
        return host

    def _dedicated_host(self, resources: dict[str, float]) -> _Host:
        node = self._check_fits(resources)
        options: dict[str, Any] = {"num_cpus": resources.get("num_cpus", 0),
                                   "max_concurrency": MAX_CONCURRENCY, "max_restarts": 0}
        if self.tenant is not None:  # on a node that fits and can confine, not any
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
        if resources.get("num_gpus"):
            options["num_gpus"] = resources["num_gpus"]
        if resources.get("memory"):
            options["memory"] = int(resources["memory"])
        handle = self._actor.options(**options).remote(self.tenant, self.build_timeout)
        what = "an actor with " + _describe(resources)
        host = self._started(handle, True, what)
        with self._lock:
            self._dedicated.append(host)
        return host

    def _started(self, handle: Any, dedicated: bool, what: str) -> _Host:
        try:
            info = self._ray.get(handle.info.remote(), timeout=START_TIMEOUT)
        except Exception as exc:
            with contextlib.suppress(Exception):
                self._ray.kill(handle)
            raise messages.cluster_start_failed(
                f"{what} did not start within {START_TIMEOUT:g} s ({type(exc).__name__})")
        refused = wire_refused(info, what)
        if refused is not None:  # another coordex on that node: no call goes to it
            with contextlib.suppress(Exception):
                self._ray.kill(handle)
            raise refused
        return _Host(handle, str(info.get("node") or ""), dedicated)

    def _live_nodes(self) -> list[dict[str, Any]]:
        nodes = [n for n in self._ray.nodes()
                 if n.get("Alive") and n.get("NodeID") not in self._dead]
        if self.tenant is not None:  # SPEC 10: a node that cannot confine is not used
            levels = self.node_levels([n["NodeID"] for n in nodes])
            nodes = [n for n in nodes if levels.get(n["NodeID"], {}).get("level") not in
                     (None, "none")]
        return nodes

    def node_levels(self, nodes: list[str] | None = None) -> dict[str, dict[str, str]]:
        """Each live node's confinement for tenants (``host``, ``level``), probed once
        per node by a small task there."""
        if nodes is None:
            nodes = [n["NodeID"] for n in self._ray.nodes() if n.get("Alive")]
        with self._lock:
            known = {n: self._levels[n] for n in nodes if n in self._levels}
        missing = [n for n in nodes if n not in known]
        if missing:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            if self._probe is None:
                raise ValueError("node_levels needs the probe of what a node can confine")
            task = self._ray.remote(self._probe)
            refs = [task.options(num_cpus=0, max_retries=0, scheduling_strategy=(
                NodeAffinitySchedulingStrategy(n, soft=False))).remote() for n in missing]
            for node, ref in zip(missing, refs, strict=True):
                try:
                    found = dict(self._ray.get(ref, timeout=START_TIMEOUT))
                except Exception as exc:  # a node that cannot run the probe is not used
                    found = {"host": "?", "level": "none", "error": type(exc).__name__}
                found.pop("node", None)
                known[node] = found
                with self._lock:
                    self._levels[node] = found
        return known

    def _pick_node(self) -> str:
        nodes = self._live_nodes()
        if not nodes:
            raise messages.no_live_node(confining=self.tenant is not None)
        # The head node runs the cluster's own services: use it when it is the only one.
        with self._lock:
            best = min(nodes, key=lambda n: ("node:__internal_head__" in n.get("Resources", {}),
                                             self._load.get(n["NodeID"], 0), n["NodeID"]))
        return str(best["NodeID"])

    def _check_fits(self, resources: dict[str, float]) -> str:
        """A live node (that can confine, for a tenant) with ``resources``: its id."""
        wanted = {"num_cpus": "CPU", "num_gpus": "GPU", "memory": "memory"}
        for node in self._live_nodes():
            have = node.get("Resources", {})
            if all(have.get(wanted[k], 0) >= v for k, v in resources.items()):
                return str(node["NodeID"])
        raise messages.no_node_fits(_describe(resources))

    def placed(self, host: _Host, delta: int) -> None:
        with self._lock:
            self._load[host.node] = max(0, self._load.get(host.node, 0) + delta)

    def lost(self, host: _Host, gone: NodeLost) -> None:
        """Forget an actor that died (and, for a shared one, its node).

        A shared actor that only stopped answering is left alone: the sessions of
        others live in it, and if its node is dead their calls find out themselves.
        """
        if gone.unreachable and not host.dedicated:
            return
        with self._lock:
            if not host.dedicated and self._shared.get(host.node) is host:
                del self._shared[host.node]
                self._dead.add(host.node)
            if host in self._dedicated:
                self._dedicated.remove(host)
        with contextlib.suppress(Exception):
            self._ray.kill(host.handle)

    def release(self, host: _Host) -> None:
        """End a dedicated actor (its session closed): its processes go with it."""
        with self._lock:
            if host in self._dedicated:
                self._dedicated.remove(host)
        self._stop([host])

    def _stop(self, hosts: list[_Host]) -> None:
        refs = [h.handle.shutdown.remote() for h in hosts]
        with contextlib.suppress(Exception):
            self._ray.wait(refs, num_returns=len(refs), timeout=CLOSE_TIMEOUT)
        for host in hosts:
            # ray.kill alone would leave the actor's children alive; its reaper ends
            # them when the actor goes, and shutdown() above already closed them.
            with contextlib.suppress(Exception):
                self._ray.kill(host.handle)

    # -- one conversation -----------------------------------------------------------------

    def converse(self, host: _Host, op: str, args: dict[str, Any], request: RunRequest | None,
                 deadline: float, progress: ProgressCallback | None = None) -> dict[str, Any]:
        """Run ``op`` on ``host`` and serve it until its reply; see the module docstring.

        Returns the node's reply: ``{"ran": facts.to_wire(...)}`` for a run,
        ``{"outcome": ...}`` for other requests, or ``{"raise": error dict}``.

        Raises:
            NodeLost: the actor died, or gave no answer before ``deadline``.
        """
        ray = self._ray
        call_id = uuid.uuid4().hex
        ref = host.handle.begin.remote(call_id, op, args, POLL_WAIT)
        cancel_sent = False
        started = False  # the node answered for this call: it has taken it
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                with contextlib.suppress(Exception):
                    host.handle.events.remote(call_id, 0.0, None, True)
                raise NodeLost(f"the node {host.node[:12]} gave no answer in time",
                               unreachable=True, started=True)
            try:
                reply = ray.get(ref, timeout=min(left, POLL_WAIT + GET_SLACK))
                started = True
            except self._timeout:
                continue  # ask the same request again: the node may only be slow
            except self._died as exc:
                if self._unavailable and isinstance(exc, self._unavailable):
                    # Temporarily unreachable: the request may not have arrived; begin
                    # is idempotent per call id, so asking again never runs code twice.
                    time.sleep(min(0.2, max(0.0, left)))
                    ref = host.handle.begin.remote(call_id, op, args, POLL_WAIT)
                    continue
                raise NodeLost(f"the node {host.node[:12]} or its coordex actor died "
                               f"({type(exc).__name__})", started=started)
            answers: list[tuple[int, bool, Any]] = []
            for event in reply["events"]:
                if event[0] == "output":
                    if request is not None and request.on_output is not None:
                        with contextlib.suppress(Exception):
                            request.on_output(event[1], event[2])
                elif event[0] == "progress":
                    if progress is not None:
                        with contextlib.suppress(Exception):
                            progress(event[1])
                elif event[0] == "capability":
                    answers.append(self._capability(event))
            if reply["done"] is not None:
                return dict(reply["done"])
            cancel = (request is not None and request.cancel is not None
                      and request.cancel.is_set() and not cancel_sent)
            cancel_sent = cancel_sent or cancel
            ref = host.handle.events.remote(call_id, POLL_WAIT, answers or None, cancel)

    def _capability(self, event: tuple[Any, ...]) -> tuple[int, bool, Any]:
        _, number, name, args, kwargs = event
        try:
            return number, True, self.capabilities.call(name, list(args), dict(kwargs))
        except Exception as exc:
            return number, False, (type(exc).__name__, str(exc))

    # -- ending ---------------------------------------------------------------------------

    def close(self) -> None:
        """End every coordex actor this cluster connection started, and its processes."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            hosts = list(self._shared.values()) + list(self._dedicated)
            places = list(self._places.values())
            self._shared.clear()
            self._dedicated.clear()
            self._places.clear()
        for place in places:
            place.close()
        self._stop(hosts)
        if self._owns_connection:
            with contextlib.suppress(Exception):
                self._ray.shutdown()


def run_args(request: RunRequest, capabilities: CapabilityHost) -> dict[str, Any]:
    """A request as plain values for the node (callables stay here)."""
    args = {"code": request.code, "timeout": request.timeout,
            "output_limit": request.output_limit, "value_limit": request.value_limit,
            "stream": request.on_output is not None,
            "protect_paths": list(request.protect_paths),
            "scratch": request.scratch is not None,
            "capabilities": list(capabilities.names())}
    if request.env:  # the call's trace context: its code on the node sees it (SPEC 16)
        args["call_env"] = dict(request.env)  # ("env" is the environment's reference)
    return args


class RayPlace:
    """One (language, environment) on the cluster: opens sessions, serves stateless calls."""

    def __init__(self, cluster: RayCluster, language: str, env: EnvRef | None) -> None:
        self.cluster = cluster
        self.language = language
        # Python on a node is retried once after a death, bash never (SPEC 6).
        self.kind: messages.PlaceKind = "cluster"
        self.retries = language == "python"
        self.env = env
        self.resources = dict(env.resources) if env is not None else {}
        self._lock = threading.Lock()
        self._stateless: _Host | None = None  # its own actor, when resources are asked

    def open_session(self, on_progress: ProgressCallback | None = None) -> RaySession:
        return RaySession(self, on_progress)

    def capabilities_changed(self) -> None:
        """Nothing to tell the nodes: each call sends the names it may use (run_args)."""

    def run_stateless(self, request: RunRequest) -> Ran:
        """A fresh shell or fork child on a node (a Python call whose node was lost
        before it took the call runs once more elsewhere: :func:`coordex.sessions.attempts`)."""
        args = run_args(request, self.cluster.capabilities)
        args.update(language=self.language, env=self.env.wire() if self.env else None)
        deadline = _deadline(request.timeout) + (self.cluster.build_timeout if self.env else 0)
        try:
            host = self._stateless_host()
            reply = self.cluster.converse(host, "stateless", args, request, deadline,
                                          request.on_progress)
        except CoordexError as exc:
            return Ran(facts.StartFailed(error=exc))
        except NodeLost as lost:
            self._forget_stateless(host, lost)
            return Ran(_node_died(lost))
        ran = _unwrap(reply)
        if _said_node_lost(ran):
            self._forget_stateless(host, NodeLost(ran.event.how, started=True))  # type: ignore[union-attr]
        return ran

    def _stateless_host(self) -> _Host:
        if not self.resources:
            return self.cluster.host({})
        with self._lock:
            if self._stateless is None:
                self._stateless = self.cluster.host(self.resources)
            return self._stateless

    def _forget_stateless(self, host: _Host, gone: NodeLost) -> None:
        with self._lock:
            if self._stateless is host:
                self._stateless = None
        self.cluster.lost(host, gone)

    def close(self) -> None:
        with self._lock:
            host, self._stateless = self._stateless, None
        if host is not None:
            self.cluster.release(host)


class RaySession:
    """One kept session held by a coordex actor on a node (``Session`` protocol).

    ``node`` is the Ray node id of the node that holds it now; it changes when the
    session is opened again elsewhere after its node died.
    """

    def __init__(self, place: RayPlace, on_progress: ProgressCallback | None = None) -> None:
        self.place = place
        self.node = ""
        self._lock = threading.Lock()
        self._closed = False
        self._host: _Host | None = None
        self._sid = ""
        self._open(on_progress)

    # -- Session ---------------------------------------------------------------------------

    def run(self, request: RunRequest) -> Ran:
        return self._call("run", request)

    def run_read_only(self, request: RunRequest) -> Ran:
        ran = self._call("read_only", request)
        if ran.isolation is None:
            ran = dataclasses.replace(ran, isolation={"names": True, "objects": True,
                                                      "files": "none", "copy": "none"})
        return ran

    def inspect(self) -> dict[str, Any] | Ran:
        with self._lock:
            if self._closed:
                return Ran(facts.Closed("session", during=False))
            if self._host is None:
                return Ran(facts.Died("node", "the session's node was lost"))
            host = self._host
            try:
                reply = self.place.cluster.converse(
                    host, "inspect", {"sid": self._sid}, None,
                    time.monotonic() + INSPECT_TIMEOUT)
            except NodeLost as lost:
                self._drop(host, lost)
                return Ran(_node_died(lost))
        if "raise" in reply:
            return dict(reply["raise"])
        if "ran" in reply:
            return facts.from_wire(reply["ran"])
        return dict(reply["outcome"])

    def alive(self) -> bool:
        host = self._host
        if self._closed or host is None:
            return False
        try:
            return bool(self.place.cluster._ray.get(host.handle.alive.remote(self._sid),
                                                    timeout=ALIVE_TIMEOUT))
        except Exception:
            return False

    def close(self) -> None:
        self._closed = True
        host, self._host = self._host, None
        if host is None:
            return
        self.place.cluster.placed(host, -1)
        if host.dedicated:
            self.place.cluster.release(host)
            return
        with contextlib.suppress(Exception):
            self.place.cluster._ray.get(host.handle.close_session.remote(self._sid),
                                        timeout=CLOSE_TIMEOUT)

    # -- capabilities (base.Forkable, base.Checkpointable), made on the node ------------------

    def fork(self, timeout: float) -> Forked:
        """Fork the session on its node, where the node can hold the copy (a node shared by
        sessions; a node dedicated to this one session cannot)."""
        with self._lock:
            host = self._held_host()
            if host.dedicated:
                raise CoordexError(
                    "capacity", "This session's node is dedicated to it (its environment "
                    "asks for resources), so it cannot hold a fork.",
                    "Checkpoint the session instead (checkpoint_session), or fork a session "
                    "whose environment asks for no resources.")
            new_sid = uuid.uuid4().hex
            outcome = self._branch_op(host, "fork", {"sid": self._sid, "new_sid": new_sid,
                                                     "timeout": timeout}, timeout)
            forked = RaySession.__new__(RaySession)
            forked.place, forked.node, forked._lock = self.place, host.node, threading.Lock()
            forked._closed, forked._host, forked._sid = False, host, new_sid
            self.place.cluster.placed(host, +1)
        return Forked(forked, str(outcome.get("copy") or "process"),
                      tuple(outcome.get("left_out") or ()))

    def start_checkpoint(self, folder: str, max_bytes: int) -> Callable[[float], Written]:
        """The node's copy of the session writes; ``finish`` brings what it wrote into
        ``folder`` (the tenant's store): a checkpoint outlives the node."""
        with self._lock:
            host = self._held_host()
            token = self._branch_op(host, "checkpoint_start", {
                "sid": self._sid, "max_bytes": max_bytes}, 60.0)["token"]

        def finish(timeout: float) -> Written:
            try:
                reply = self._branch_op(host, "checkpoint_finish",
                                        {"token": token, "timeout": timeout}, timeout)
            except CoordexError as exc:
                return {"error": exc.error}
            for name, data in dict(reply.get("files") or {}).items():
                if "/" not in name:
                    (Path(folder) / name).write_bytes(base64.b64decode(data))
            written: Written = dict(reply.get("written") or {})
            return written

        return finish

    def restore_checkpoint(self, folder: str, timeout: float) -> Written:
        """Restore on the session's node - on another node if its own was lost (the
        session is opened again there first)."""
        files = {p.name: base64.b64encode(p.read_bytes()).decode("ascii")
                 for p in Path(folder).iterdir() if p.is_file() and p.name != "checkpoint.json"}
        with self._lock:
            for attempt in range(2):  # its node found lost by the first: on another
                try:
                    if self._host is None:
                        self._open()
                    host = self._held_host()
                    report: Written = self._branch_op(host, "restore", {
                        "sid": self._sid, "files": files, "timeout": timeout}, timeout)
                    return report
                except CoordexError as exc:
                    if attempt or self._host is not None:
                        return {"error": exc.error}
        return {"error": "no node could hold the session"}

    def _held_host(self) -> _Host:
        if self._closed:
            raise CoordexError("not_found", "The session is closed.", "Open it again with a "
                               "stateful call.")
        if self._host is None:
            raise CoordexError("crashed", "The session's node was lost; its state is gone.",
                               "Restore a checkpoint of it (restore_session) or rebuild it "
                               "(rebuild_session).", state_lost=True)
        return self._host

    def _branch_op(self, host: _Host, op: str, args: dict[str, Any],
                   timeout: float) -> dict[str, Any]:
        try:
            reply = self.place.cluster.converse(host, op, args, None, _deadline(timeout))
        except NodeLost as lost:
            if self._host is host:
                self._drop(host, lost)
            raise CoordexError("crashed", f"The session's node was lost ({lost.how}).",
                               "Restore a checkpoint of it (restore_session) or rebuild it "
                               "(rebuild_session).", state_lost=True) from None
        if "raise" in reply:
            error = dict(reply["raise"])
            raise CoordexError(error.pop("error_type"), error.pop("error"),
                               error.pop("suggestion"), **error)
        if "ran" in reply:  # the node failed under it
            ran = facts.from_wire(reply["ran"])
            raise CoordexError("crashed", f"The node could not do it: {ran.event}.",
                               "Run a call in the session, then try again.")
        outcome: dict[str, Any] = dict(reply.get("outcome") or {})
        return outcome

    # -- internals ------------------------------------------------------------------------

    def _open(self, on_progress: ProgressCallback | None = None) -> None:
        """Open the session on a node (building its environment there first, its lines
        to ``on_progress``)."""
        cluster, place = self.place.cluster, self.place
        host = cluster.host(place.resources)
        sid = uuid.uuid4().hex
        args: dict[str, Any] = {"sid": sid, "language": place.language,
                "env": place.env.wire() if place.env else None, "capabilities": []}
        deadline = time.monotonic() + START_TIMEOUT + (cluster.build_timeout if place.env else 0)
        try:
            reply = cluster.converse(host, "open", args, None, deadline, on_progress)
        except NodeLost as lost:
            cluster.lost(host, lost)
            raise messages.cluster_start_failed(f"the session could not be opened ({lost.how})")
        if "raise" in reply:
            if host.dedicated:
                cluster.release(host)
            error = dict(reply["raise"])
            raise CoordexError(error.pop("error_type"), error.pop("error"),
                               error.pop("suggestion"), **error)
        self._host, self._sid, self.node = host, sid, host.node
        cluster.placed(host, +1)

    def _drop(self, host: _Host, gone: NodeLost) -> None:
        """The session's actor is gone (or unreachable): forget it; the next call opens
        the session again elsewhere."""
        if self._host is host:
            self._host = None
            self.place.cluster.placed(host, -1)
        if gone.unreachable and not host.dedicated:  # it may still hold the session
            with contextlib.suppress(Exception):
                host.handle.close_session.remote(self._sid)
        self.place.cluster.lost(host, gone)

    def _call(self, op: str, request: RunRequest) -> Ran:
        """One attempt on the session's node. A session whose node was lost (said by
        that call) is opened again on another node first (``replaced``); whether a call
        the lost node had not taken runs once more is :func:`coordex.sessions.attempts`'s
        to decide (never one it had taken: it may still run there, SPEC 10)."""
        with self._lock:
            if self._closed:
                return Ran(facts.Closed("session", during=False))
            replaced = False
            if self._host is None:
                try:
                    self._open(request.on_progress)
                except CoordexError as exc:
                    return Ran(facts.StartFailed(error=exc), replaced=True)
                replaced = True
            host = self._host
            assert host is not None
            args = run_args(request, self.place.cluster.capabilities)
            args["sid"] = self._sid
            try:
                reply = self.place.cluster.converse(host, op, args, request,
                                                    _deadline(request.timeout))
            except NodeLost as gone:
                self._drop(host, gone)
                return Ran(_node_died(gone), replaced=replaced)
            ran = _unwrap(reply)
            if _said_node_lost(ran):  # the node said it lost the cluster: gone, as above
                self._drop(host, NodeLost(ran.event.how, started=True))  # type: ignore[union-attr]
            return dataclasses.replace(ran, replaced=replaced or ran.replaced)


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """Raise ConnectionError unless ``host:port`` (or ``ray://host:port``) accepts a TCP
    connection; ``"auto"`` and addresses without a port are left to Ray."""
    import socket

    target = address.split("://", 1)[-1]
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ConnectionError(f"nothing answers at {target} ({exc.strerror or exc})") from None


def _deadline(timeout: float) -> float:
    """When the driver stops waiting for a node: the node enforces the timeout itself."""
    return time.monotonic() + timeout + NODE_GRACE


def _unwrap(reply: dict[str, Any]) -> Ran:
    if "raise" in reply:  # nothing ran: the session or environment could not be had
        error = dict(reply["raise"])
        return Ran(facts.StartFailed(error=CoordexError(
            error.pop("error_type"), error.pop("error"), error.pop("suggestion"), **error)))
    try:
        return facts.from_wire(reply["ran"])
    except (KeyError, TypeError, ValueError) as exc:  # never an exception out of a call
        return Ran(facts.Died("node", f"the node answered in a form this coordex does not "
                              f"read ({type(exc).__name__}: {exc}; is it another version?)",
                              taken=True))


def _said_node_lost(ran: Ran) -> bool:
    return isinstance(ran.event, facts.Died) and ran.event.what == "node"


def _node_died(lost: NodeLost) -> facts.Died:
    # A node that may still run the call (unreachable, or it had taken it) is never
    # given it again (SPEC 10).
    return facts.Died("node", lost.how, taken=lost.unreachable or lost.started)


def _describe(resources: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in resources.items())


__all__ = ["EnvRef", "NodeLost", "RayCluster", "RayPlace", "RaySession", "import_ray"]
