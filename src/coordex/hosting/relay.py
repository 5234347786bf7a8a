"""A tenant's cluster, reached through the owner of its confined host (SPEC 10, last bullet).

With several tenants on a cluster, each tenant's Executor runs in a confined host on the
server (SPEC 9), and it must not hold a Ray connection of its own: the tenant's code
runs in that Executor's interpreter, and a Ray connection runs anything on any node,
unconfined. The server - the host's owner - holds the one connection instead.

:class:`RelayCluster` is the host's :class:`~.place.RayCluster`: ``RayPlace`` and
``RaySession`` drive it exactly as they drive a real one (conversations, capability
calls and output stay in the host), but every request to an actor travels as a
``node`` line to the owner, and its answer comes back as ``node_reply``
(:mod:`coordex.hosting.wire`). On the owner's side :class:`NodeRelay` makes
the request on one of that tenant's own actors (:class:`.tenant.TenantNodeHost`, which
runs the sessions in a confined host of the tenant on its node). The owner answers
requests on its tenant's actors only, so what the tenant's code might write on that
pipe itself reaches nothing that ``execute_code`` does not.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..backends.ray.place import START_TIMEOUT, NodeLost, RayCluster, _Host
from ..core.errors import CoordexError

# The actor methods a tenant's host may have the owner call (NodeHost's, minus orphans).
TENANT_METHODS = ("begin", "events", "alive", "count", "close_session", "shutdown")
# The owner's bound on one actor request (a request itself waits at most a poll).
CALL_BOUND = 600.0
# Owner threads serving one tenant's requests at once (a request takes a poll at most).
RELAY_THREADS = 16
# Actors of its own (sessions whose environment asks for resources) one tenant may hold
# at once: its code could otherwise ask the owner for any number of them (SPEC 10).
MAX_DEDICATED = 8

Send = Callable[[dict[str, Any]], None]


class RelayTimeout(Exception):
    """No answer yet (as ``ray.exceptions.GetTimeoutError``)."""


class RelayDied(Exception):
    """The actor died or the owner could not reach it (as ``RayActorError``)."""


class RelayUnavailable(RelayDied):
    """The actor is only unreachable for now (as ``ActorUnavailableError``)."""


class _Ref:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: dict[str, Any] = {}


class _Method:
    def __init__(self, relay: RelayCluster, number: int, name: str) -> None:
        self._relay, self._number, self._name = relay, number, name

    def remote(self, *params: Any) -> _Ref:
        return self._relay._request("call", {"host": self._number, "method": self._name,
                                             "params": list(params)})


class _Handle:
    """An actor handle whose ``.method.remote(...)`` goes through the owner."""

    def __init__(self, relay: RelayCluster, number: int) -> None:
        self.number = number
        self._relay = relay

    def __getattr__(self, name: str) -> _Method:
        if name.startswith("_"):
            raise AttributeError(name)
        return _Method(self._relay, self.number, name)


class _RelayRay:
    """The calls of the ``ray`` module that RayCluster makes, answered by the owner."""

    def __init__(self, relay: RelayCluster) -> None:
        self._relay = relay

    def get(self, ref: _Ref, timeout: float | None = None) -> Any:
        if not ref.done.wait(timeout):
            raise RelayTimeout()
        value = ref.value
        if "ok" in value:
            return value["ok"]
        if value.get("unavailable"):
            raise RelayUnavailable(str(value.get("died")))
        raise RelayDied(str(value.get("died") or "no answer"))

    def wait(self, refs: list[_Ref], num_returns: int = 1,
             timeout: float | None = None) -> tuple[list[_Ref], list[_Ref]]:
        end = time.monotonic() + (timeout if timeout is not None else CALL_BOUND)
        for ref in refs:
            ref.done.wait(max(0.0, end - time.monotonic()))
        return [r for r in refs if r.done.is_set()], [r for r in refs if not r.done.is_set()]

    def kill(self, handle: _Handle) -> None:
        self._relay._request("lost", {"host": handle.number, "how": "killed",
                                      "unreachable": False})

    def shutdown(self) -> None:
        pass


class RelayCluster(RayCluster):
    """The tenant host's cluster: a RayCluster whose actor requests go to the owner.

    Args:
        send: writes one message to the owner (the host's protocol writer).
    """

    def __init__(self, send: Send) -> None:  # not super().__init__: that joins Ray
        self._send = send
        self._ids = itertools.count(1)
        self._pending: dict[int, _Ref] = {}
        self._hosts: dict[int, _Host] = {}
        self._ray = _RelayRay(self)
        self._died = (RelayDied,)
        self._unavailable = (RelayUnavailable,)
        self._timeout = RelayTimeout
        self._owns_connection = False
        self.address = "the server's cluster"
        self.capabilities: Any = None  # the Executor sets its own (_join_cluster)
        self.build_timeout = 900.0
        self._lock = threading.Lock()
        self._shared: dict[str, _Host] = {}
        self._dedicated: list[_Host] = []
        self._load: dict[str, int] = {}
        self._dead: set[str] = set()
        self._places: dict[tuple[str, str | None], Any] = {}
        self._closed = False

    # -- the wire
    def _request(self, op: str, args: dict[str, Any]) -> _Ref:
        ref = _Ref()
        number = next(self._ids)
        with self._lock:
            self._pending[number] = ref
        try:
            self._send({"type": "node", "id": number, "op": op, "args": args})
        except OSError as exc:
            self.answer(number, {"died": f"the server is gone ({exc})"})
        return ref

    def detach(self) -> None:
        """The owner stops answering (the host is shutting down): every request, and
        every one still waiting, fails at once; the owner ends the tenant's actors."""
        def refuse(msg: dict[str, Any]) -> None:
            raise OSError("the host is shutting down")

        self._send = refuse
        with self._lock:
            waiting = list(self._pending)
        for number in waiting:
            self.answer(number, {"died": "the host is shutting down"})

    def answer(self, number: Any, value: Any) -> None:
        """A ``node_reply`` from the owner."""
        with self._lock:
            ref = self._pending.pop(number, None) if isinstance(number, int) else None
        if ref is not None:
            ref.value = value if isinstance(value, dict) else {"died": "a malformed answer"}
            ref.done.set()

    # -- what RayCluster does with Ray, asked of the owner
    def host(self, resources: dict[str, float]) -> _Host:
        ref = self._request("host", {"resources": dict(resources)})
        try:
            reply = self._ray.get(ref, timeout=START_TIMEOUT + 10)
        except RelayDied as exc:
            raise CoordexError("crashed", f"Could not start coordex's actor on the cluster: {exc}.",
                               "Check that the cluster's nodes are up (ray status), then run "
                               "the call again.", state_lost=True)
        if "raise" in reply:
            error = dict(reply["raise"])
            raise CoordexError(error.pop("error_type"), error.pop("error"),
                               error.pop("suggestion"), **error)
        number = int(reply["host"])
        with self._lock:
            host = self._hosts.get(number)
            if host is None:
                host = self._hosts[number] = _Host(_Handle(self, number), str(reply["node"]),
                                                   bool(reply["dedicated"]))
        return host

    def placed(self, host: _Host, delta: int) -> None:
        self._request("placed", {"host": host.handle.number, "delta": int(delta)})

    def lost(self, host: _Host, gone: NodeLost) -> None:
        self._forget(host)
        self._request("lost", {"host": host.handle.number, "how": gone.how,
                               "unreachable": gone.unreachable})

    def release(self, host: _Host) -> None:
        self._forget(host)
        self._ray.wait([self._request("release", {"host": host.handle.number})],
                       timeout=START_TIMEOUT)

    def _stop(self, hosts: list[_Host]) -> None:
        for host in hosts:
            self.release(host)

    def _forget(self, host: _Host) -> None:
        with self._lock:
            self._hosts.pop(host.handle.number, None)


class NodeRelay:
    """The owner's side: one tenant's actors on the cluster connection the owner holds.

    Args:
        address: the cluster (joined already by the server, or joined here).
        tenant: ``{"name": NAME, "memory_limit": ..., "network": ..., "max_calls": ...}``,
            what :class:`.tenant.TenantNodeHost` needs to confine the tenant on a node.
        build_timeout: seconds a node may take to build one environment.
    """

    def __init__(self, address: str, tenant: Mapping[str, Any],
                 build_timeout: float = 900.0) -> None:
        self.address = address
        self.tenant = dict(tenant)
        self.build_timeout = build_timeout
        self._lock = threading.Lock()
        self._cluster: RayCluster | None = None
        self._hosts: dict[int, _Host] = {}
        self._numbers: dict[int, int] = {}  # id(host) -> its number
        self._next = itertools.count(1)
        self._starting = 0  # dedicated actors being started
        self._pool = ThreadPoolExecutor(RELAY_THREADS, thread_name_prefix="coordex-relay")

    def serve(self, msg: dict[str, Any], reply: Send) -> None:
        """Answer one ``node`` line from the tenant's host, on a thread of the relay."""
        self._pool.submit(self._serve, msg, reply)

    def _serve(self, msg: dict[str, Any], reply: Send) -> None:
        try:
            value = self._handle(str(msg["op"]), msg["args"])
        except Exception as exc:  # a bad request or a bug: the host's call still ends
            value = {"died": f"{type(exc).__name__}: {exc}"}
        with contextlib.suppress(Exception):
            reply({"type": "node_reply", "id": msg["id"], "value": value})

    def _connected(self) -> RayCluster:
        with self._lock:
            if self._cluster is None:
                from .tenant_node import TenantNodeHost, probe

                self._cluster = RayCluster(self.address, capabilities=None,
                                           build_timeout=self.build_timeout, tenant=self.tenant,
                                           tenant_actor=TenantNodeHost, probe=probe)
            return self._cluster

    def _handle(self, op: str, args: Any) -> dict[str, Any]:
        if not isinstance(args, dict):
            raise ValueError("arguments must be an object")
        cluster = self._connected()
        if op == "host":
            resources = {str(k): float(v) for k, v in dict(args.get("resources") or {}).items()}
            cap = int(self.tenant.get("max_dedicated") or MAX_DEDICATED)
            with self._lock:  # counted with those being started right now, on other threads
                held = sum(1 for h in self._hosts.values() if h.dedicated) + self._starting
                refused = bool(resources) and held >= cap
                if resources and not refused:
                    self._starting += 1
            if refused:
                return {"ok": {"raise": CoordexError(
                    "environment", f"This tenant holds {held} actors of its own on the "
                    f"cluster already, the most it may (sessions whose environment asks "
                    f"for resources: {cap}).",
                    "Close a session of such an environment (close_session) and run the "
                    "call again.").to_dict()}}
            try:
                host = cluster.host(resources)
            except BaseException as exc:
                if resources:
                    with self._lock:
                        self._starting -= 1
                if isinstance(exc, CoordexError):  # no node can take it: the host says why
                    return {"ok": {"raise": exc.to_dict()}}
                raise
            with self._lock:
                self._starting -= 1 if resources else 0
                number = self._numbers.get(id(host))
                if number is None:
                    number = self._numbers[id(host)] = next(self._next)
                    self._hosts[number] = host
            return {"ok": {"host": number, "node": host.node, "dedicated": host.dedicated}}
        with self._lock:  # only this tenant's own actors
            found = self._hosts.get(args["host"]) if isinstance(args.get("host"), int) else None
        if found is None:
            return {"died": "not an actor of this tenant (it was released)"}
        host = found
        if op == "call":
            method, params = args.get("method"), args.get("params")
            if method not in TENANT_METHODS or not isinstance(params, list):
                raise ValueError(f"cannot call {method!r} on a node")
            ray = cluster._ray
            try:
                value = ray.get(getattr(host.handle, method).remote(*params), timeout=CALL_BOUND)
            except cluster._died as exc:
                unavailable = bool(cluster._unavailable) and isinstance(exc, cluster._unavailable)
                return {"died": type(exc).__name__, "unavailable": unavailable}
            except cluster._timeout:
                return {"died": "no answer from the node"}
            return {"ok": value}
        if op == "placed":
            cluster.placed(host, int(args.get("delta", 0)))
        elif op in ("lost", "release"):
            self._drop(host)
            if op == "release" and host.dedicated:
                cluster.release(host)
            elif op == "lost":
                cluster.lost(host, NodeLost(str(args.get("how")),
                                            unreachable=bool(args.get("unreachable"))))
        else:
            raise ValueError(f"unknown request {op!r}")
        return {"ok": None}

    def _drop(self, host: _Host) -> None:
        with self._lock:
            number = self._numbers.pop(id(host), None)
            if number is not None and host.dedicated:
                self._hosts.pop(number, None)
            elif number is not None:
                self._numbers[id(host)] = number  # a shared actor serves other sessions

    def reset(self) -> None:
        """End every actor of the tenant (its host died or closed: their sessions are
        the dead Executor's); the next request starts fresh ones."""
        with self._lock:
            cluster, self._cluster = self._cluster, None
            self._hosts.clear()
            self._numbers.clear()
        if cluster is not None:
            cluster.close()

    def close(self) -> None:
        self.reset()
        self._pool.shutdown(wait=False, cancel_futures=True)


__all__ = ["NodeRelay", "RelayCluster"]
