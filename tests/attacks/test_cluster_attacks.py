"""A tenant's session on a cluster node looks for the server (SPEC 9, "One jail
everywhere"; SPEC 8 and 10).

The nodes run on the server's machine, as they do for a small deployment, and every
root lies outside ``/tmp``. The cluster starts from one folder (the test's); each server
from a base folder of its own that holds its tokens file and its root, as an operator
who ``cd``s there and runs ``coordex serve --tokens tokens.txt`` would. Ray puts its
driver's working folder on every worker's ``sys.path``: the node's host once made that
folder readable in the tenant's jail.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.conftest import LocalCluster, local_cluster  # noqa: F401  (the fixture)
from tests.e2e._procs import Running, child_env, spawn
from tests.e2e.test_mcp_http import READY, call_with_sdk

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(300)]

BOB = "bob-token-0123456789abcdef"
ALICE_X = "alice-of-x-token-0123456789"
ALICE_Y = "alice-of-y-token-0123456789"
SECRET = "alice-of-x-private-notes-5d1e"


@dataclass
class Served:
    running: Running
    url: str
    base: Path  # the server's working folder: its tokens file and root lie here

    def code(self, token: str, code: str, **arguments: Any) -> dict[str, Any]:
        return call_with_sdk(self.url, token, [("execute_code", {"code": code, **arguments})])[0]

    def call(self, token: str, tool: str, **arguments: Any) -> dict[str, Any]:
        return call_with_sdk(self.url, token, [(tool, arguments)])[0]


def _serve(cluster: LocalCluster, tokens: str) -> Iterator[Served]:
    base = Path(tempfile.mkdtemp(prefix="coordex-cluster-cwd-", dir="/var/tmp"))
    os.chmod(base, 0o755)
    try:
        (base / "tokens.txt").write_text(tokens)
        os.chmod(base / "tokens.txt", 0o600)
        (base / "serve.log").write_text("the operator's own notes\n")
        env = child_env(base / "home", UV_OFFLINE="1")
        with spawn("serve", "--port", "0", "--tokens", "tokens.txt", "--cluster",
                   cluster.address, "--memory-limit", "512M", env=env, cwd=base) as running:
            yield Served(running, running.wait_for(READY, timeout=120).group(1), base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def server_x(local_cluster: LocalCluster) -> Iterator[Served]:  # noqa: F811
    yield from _serve(local_cluster, f"alice {ALICE_X}\nbob {BOB}\n")


@pytest.fixture(scope="module")
def server_y(local_cluster: LocalCluster) -> Iterator[Served]:  # noqa: F811
    yield from _serve(local_cluster, f"alice {ALICE_Y}\n")


def _on_a_node(served: Served, token: str, command: str, session: str) -> str:
    found = served.code(token, command, language="bash", state_mode="stateful",
                        session_name=session, timeout=120)
    assert found.get("is_error") is False, found
    shells = [r for r in served.call(token, "list_sessions")["sessions"]
              if r["language"] == "bash" and r.get("session_name") == session]
    assert shells and shells[0].get("node"), shells  # it ran on a node, not on the server
    return str(found["stdout"])


def test_the_servers_working_folder_is_not_in_a_nodes_jail(server_x: Served) -> None:
    base = server_x.base
    made = server_x.code(BOB, "open('bob_private.txt', 'w').write('bob-private-1b2c')",
                         state_mode="stateful")
    assert made.get("is_error") is False, made
    out = _on_a_node(server_x, ALICE_X, (
        f"ls {base}; cat {base}/tokens.txt {base}/serve.log "
        f"{base}/home/tenants/bob/bob_private.txt; ls {base}/home/tenants "
        f"{base}/home/records/tenants; echo done"), "r1")
    assert "done" in out, out
    for seen in ("tokens.txt", "serve.log", BOB, ALICE_X, "operator's own", "bob-private",
                 "bob"):
        assert seen not in out, out


def test_two_servers_on_one_cluster_never_share_a_tenants_node_folder(
        server_x: Served, server_y: Served) -> None:
    """Both servers name a tenant ``alice``: on a node each gets a folder, a user and
    environments of its own, keyed by its server."""
    x = _on_a_node(server_x, ALICE_X, f"echo {SECRET} > notes.txt; pwd; id -u", "r5")
    y = _on_a_node(server_y, ALICE_Y, "pwd; id -u; cat notes.txt 2>&1; echo done", "r5")
    x_folder, x_uid = x.split()[:2]
    y_folder, y_uid = y.split()[:2]
    assert x_folder != y_folder, (x, y)
    assert SECRET not in y and "done" in y, y
    if os.geteuid() == 0:  # a root server's tenants each run as a user of their own
        assert x_uid != y_uid, (x, y)
    z = _on_a_node(server_y, ALICE_Y, f"cat {x_folder}/notes.txt 2>&1; echo done", "r5")
    assert SECRET not in z, z
