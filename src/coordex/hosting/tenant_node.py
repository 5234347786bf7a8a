"""A tenant's sessions on a node run in a confined host of that tenant there (SPEC 10).

:class:`TenantNodeHost` is coordex's actor on a node for one tenant of a server with
several (``coordex serve --tokens FILE --cluster ADDRESS``). It runs nothing of the
tenant's itself: it starts, on its node, the same confined host program the server
runs (:mod:`coordex.hosting.host`, SPEC 9) with ``--serve node`` - folder
``COORDEX_HOME/tenants/NAME`` on that node, the rest of the node's coordex folder out of
sight, the server's memory, process and call limits - and that host runs a
:class:`~.node.NodeHost` inside the jail. The actor forwards each request of the
driver to it over the host wire (``call`` / ``reply``), so the conversation the driver
holds (:meth:`.place.RayCluster.converse`) is unchanged. The actor owns the host
through its lifeline: when the actor dies in any way, the keeper ends the whole jail.

A node that cannot confine (:func:`node_level` says ``none``) starts no host: its actor
refuses every call, and the driver never places a tenant's session there
(:meth:`.place.RayCluster.node_levels`).
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Any

from ..backends.ray.node import CLUSTER_WIRE_VERSION, fence
from ..core import facts
from ..core.errors import CoordexError, make_error
from ..core.facts import Ran

# Seconds past a request's own wait before the actor counts the node's host as stuck.
FORWARD_SLACK = 30.0


def node_root() -> Path:
    """This node's coordex folder (``COORDEX_HOME`` here, else the user data dir)."""
    from ..core.root import default_root

    return default_root()


def ray_secrets() -> list[str]:
    """Ray's own secrets on this machine (its token for clusters with token
    authentication): hidden from every tenant's host, which could otherwise join the
    cluster and run anything anywhere on it."""
    paths = [os.path.expanduser("~/.ray"), os.environ.get("RAY_AUTH_TOKEN_PATH", "")]
    # And its folder of sockets and logs (under /tmp, already private in a jail, unless
    # the cluster was started with --temp-dir elsewhere): where this process joined one.
    ray = sys.modules.get("ray")
    try:
        node = ray._private.worker._global_node if ray is not None else None
        if node is not None:
            paths.append(str(node.get_temp_dir_path()))
    except Exception:
        pass
    return [p for p in paths if p]


def node_level(root: Path | None = None, hidden: list[str] | None = None) -> str:
    """The confinement a tenant's host reaches on this node, hiding the node's root
    (and ``hidden``)."""
    from .client import confinement_level

    return confinement_level([str(root or node_root()), *ray_secrets(), *(hidden or ())])


def tenant_folder(root: Path, tenant: dict[str, Any]) -> Path:
    """A tenant's folder on this node: ``tenants/SERVER/NAME``, keyed by the server's
    identity as well as the tenant's name (its user is numbered from this path), so two
    servers sharing a cluster never share a tenant's folder, user or environments;
    ``tenants/NAME`` for a server that names none."""
    name = str(tenant["name"])
    server = str(tenant.get("server") or "")
    if server and server.isalnum() and server.isascii():
        return root / "tenants" / server / name
    return root / "tenants" / name


def probe() -> dict[str, str]:
    """Run on a node (a Ray task): its id, host name and confinement level."""
    node = ""
    try:
        import ray

        node = ray.get_runtime_context().get_node_id()
    except Exception:
        pass
    return {"node": node, "host": socket.gethostname(), "level": node_level()}


class TenantNodeHost:
    """coordex's actor on one node for one tenant: its sessions run in the tenant's
    confined host here (see the module docstring).

    Args:
        tenant: ``name`` and the limits of SPEC 9: ``memory_limit`` (bytes),
            ``network``, ``max_calls``, ``max_processes``.
        build_timeout: seconds one environment build may take on this node.
    """

    def __init__(self, tenant: dict[str, Any], build_timeout: float = 900.0) -> None:
        from .client import ConfinedExecutor
        from .wire import DEFAULT_MAX_CALLS, DEFAULT_MAX_PROCESSES

        self.name = str(tenant["name"])
        root = node_root()
        self.folder = tenant_folder(root, tenant)
        # What the server hides (its root, its tokens file) stays hidden here too, where
        # a node shares the server's machine; and the node's own root and Ray's secrets.
        hidden = [str(root), *ray_secrets(), *(str(p) for p in tenant.get("hide") or ())]
        self.level = node_level(root, hidden)
        self._host: Any = None
        if self.level == "none":
            return
        self._host = ConfinedExecutor(
            self.folder, memory_limit=tenant.get("memory_limit"),
            network=bool(tenant.get("network", True)),
            max_calls=int(tenant.get("max_calls") or DEFAULT_MAX_CALLS),
            max_processes=int(tenant.get("max_processes") or DEFAULT_MAX_PROCESSES),
            hide=hidden, readable=list(tenant.get("readable") or ()),
            level=self.level, name=f"{self.name}-node", serve="node",
            # Under the node's root, which the jail hides: bound back read-only, built by
            # the jail's builder (the tenant's code on the node cannot change it).
            environments=root / "environments" / self.folder.relative_to(root),
            build_timeout=build_timeout)
        fence(self.shutdown)  # the jail ends with this actor (its lifeline)

    def info(self) -> dict[str, Any]:
        node = ""
        try:
            import ray

            node = ray.get_runtime_context().get_node_id()
        except Exception:
            pass
        host = self._host
        return {"node": node, "host": socket.gethostname(), "pid": os.getpid(),
                "wire": CLUSTER_WIRE_VERSION, "tenant": self.name, "confinement": self.level,
                "host_pid": host.pid if host is not None else None}

    # -- NodeHost's methods, answered by the tenant's host on this node

    def begin(self, call_id: str, op: str, args: dict[str, Any], wait: float) -> dict[str, Any]:
        return self._reply(self._forward("begin", {"call_id": call_id, "op": op,
                                                   "args": args, "wait": wait}, wait))

    def events(self, call_id: str, wait: float, answers: list[Any] | None = None,
               cancel: bool = False) -> dict[str, Any]:
        return self._reply(self._forward("events", {"call_id": call_id, "wait": wait,
                                                    "answers": answers, "cancel": cancel}, wait))

    def alive(self, sid: str) -> bool:
        return self._forward("alive", {"sid": sid}) is True

    def count(self) -> int:
        value = self._forward("count", {})
        return value if isinstance(value, int) else 0

    def close_session(self, sid: str) -> bool:
        return self._forward("close_session", {"sid": sid}) is True

    def shutdown(self) -> None:
        """End the tenant's host on this node and every process in its jail."""
        if self._host is not None:
            self._host.close()

    def orphans(self) -> list[int]:
        return []  # everything runs in the jail, which ends with its keeper

    def _forward(self, method: str, args: dict[str, Any], wait: float = 0.0) -> Any:
        if self._host is None:
            return make_error(
                "crashed", f"This node cannot confine tenant {self.name!r}'s sessions "
                "(confinement 'none'), so it runs none of them.",
                "Run the call again: the server places tenants' sessions on nodes that can "
                "confine them.", state_lost=True)
        return self._host.call(method, args, deadline=wait + FORWARD_SLACK)

    @staticmethod
    def _reply(value: Any) -> dict[str, Any]:
        if isinstance(value, dict) and "events" in value:
            return value
        if isinstance(value, dict) and "error_type" in value:  # nothing could run here
            error = dict(value)
            ran = Ran(facts.StartFailed(error=CoordexError(
                error.pop("error_type"), error.pop("error"), error.pop("suggestion"), **error)))
        else:
            ran = Ran(facts.Died("node", f"the tenant's host on the node answered "
                                 f"{value!r:.200}", taken=True))
        return {"events": [], "done": {"ran": facts.to_wire(ran)}}


__all__ = ["TenantNodeHost", "node_level", "node_root", "probe", "ray_secrets", "tenant_folder"]
