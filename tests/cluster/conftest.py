"""A real local Ray cluster for the module: a head without CPUs and two one-CPU nodes.

Starting Ray is heavy (seconds, and a few hundred MB per node), so the cluster starts
once per module and every test opens its own Executor on it. Nodes inherit this
process's environment when they start: ``COORDEX_HOME`` points their environment
builds at a throwaway folder and ``UV_OFFLINE`` keeps uv off the network.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

NODE_ARGS: dict[str, Any] = {"num_cpus": 1, "object_store_memory": 75 * 1024 * 1024}
# Node deaths are noticed within about a second instead of Ray's default fifteen.
FAST_HEALTH_CHECKS = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 300,
                      "health_check_timeout_ms": 300, "health_check_failure_threshold": 3}


@dataclass
class LocalCluster:
    cluster: Any
    home: Path

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def node(self, node_id: str) -> Any:
        for node in self.cluster.list_all_nodes():
            if node.node_id == node_id:
                return node
        raise LookupError(node_id)

    def remove(self, node_id: str) -> None:
        """Kill a node without a graceful drain (as a machine would die), and put a
        fresh node in its place for the tests that follow."""
        self.cluster.remove_node(self.node(node_id), allow_graceful=False)
        self.cluster.add_node(**NODE_ARGS)


@pytest.fixture(scope="module")
def local_cluster(tmp_path_factory: pytest.TempPathFactory,
                  request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """The module's cluster; a module's ``HEALTH_CHECKS`` replaces the fast ones (Ray's
    own defaults: ``{}``)."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    home = tmp_path_factory.mktemp("node-home")
    saved = {k: os.environ.get(k) for k in ("COORDEX_HOME", "UV_OFFLINE")}
    os.environ["COORDEX_HOME"] = str(home)
    os.environ.setdefault("UV_OFFLINE", "1")
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "object_store_memory": NODE_ARGS["object_store_memory"],
        "include_dashboard": False,
        "_system_config": getattr(request.module, "HEALTH_CHECKS", FAST_HEALTH_CHECKS)})
    try:
        for _ in range(2):
            cluster.add_node(**NODE_ARGS)
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        yield LocalCluster(cluster, home)
    finally:
        ray.shutdown()
        cluster.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def owned_processes() -> list[int]:
    """Pids of every process a coordex node actor of this module's cluster started (they
    carry an owner token, and the nodes' COORDEX_HOME the cluster fixture set: other
    clusters on the machine are not ours to count)."""
    home = os.environ.get("COORDEX_HOME")
    mine = None if home is None else b"COORDEX_HOME=" + os.fsencode(home)
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if any(item.startswith(b"COORDEX_NODE_OWNER=") for item in env) \
                and (mine is None or mine in env):
            found.append(int(entry))
    return found
