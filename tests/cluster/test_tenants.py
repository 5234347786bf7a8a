"""SPEC 10, last bullet: with several tenants, a tenant's sessions on a node run in a
confined host of that tenant there; a node that cannot confine is not used for tenants.

``coordex serve --tokens FILE --cluster ADDRESS`` runs as a subprocess against the
module's local cluster, and the tenants call it through the official MCP client. Every
node of that cluster runs on this machine, so the test can see, from outside, the files
and processes each tenant has on a node. A third node starts with confinement forced
off (``COORDEX_ISOLATION_FORCE=none``, as a node without user namespaces or Landlock
would be): the server says so at start and never places a tenant's session there.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from coordex import Executor
from coordex.backends.isolation import force_unavailable
from tests.cluster.conftest import NODE_ARGS, LocalCluster
from tests.e2e._procs import Running, child_env, spawn
from tests.e2e.test_mcp_http import READY, call_with_sdk

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(180)]

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef"
SECRET = "bobs-node-secret-7f3a"
MARKS = ("987", "986")  # bob's background `sleep N` on a node: what alice tries to kill


@dataclass
class Served:
    running: Running
    url: str
    blocked: str  # the node id that cannot confine
    home: Path  # the server's root, outside /tmp (a jail's private /tmp would hide it)
    tokens: Path

    def code(self, token: str, code: str, **arguments: Any) -> dict[str, Any]:
        return call_with_sdk(self.url, token, [("execute_code", {"code": code, **arguments})])[0]

    def call(self, token: str, tool: str, **arguments: Any) -> dict[str, Any]:
        return call_with_sdk(self.url, token, [(tool, arguments)])[0]


def _blocked_node(local_cluster: LocalCluster) -> Any:
    """A node whose processes cannot confine (its raylet, and so its workers, inherit
    the forced level from this process's environment when it starts)."""
    previous = force_unavailable("none")
    try:
        return local_cluster.cluster.add_node(**NODE_ARGS)
    finally:
        force_unavailable(previous)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def served(local_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Served]:
    node = _blocked_node(local_cluster)
    base = Path(tempfile.mkdtemp(prefix="coordex-cluster-", dir="/var/tmp"))
    tokens = base / "tokens.txt"
    tokens.write_text(f"alice {ALICE}\nbob {BOB}\n")
    os.chmod(tokens, 0o600)
    env = child_env(base / "server", UV_OFFLINE="1")
    try:
        with spawn("serve", "--port", "0", "--tokens", str(tokens), "--cluster",
                   local_cluster.address, "--memory-limit", "512M", env=env) as running:
            url = running.wait_for(READY, timeout=120).group(1)
            yield Served(running, url, node.node_id, base / "server", tokens)
    finally:
        local_cluster.cluster.remove_node(node, allow_graceful=False)
        shutil.rmtree(base, ignore_errors=True)


def _node_pids(pattern: str) -> list[int]:
    """Pids on this machine whose command line matches ``pattern`` (the nodes are here)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if re.fullmatch(pattern, cmdline):
            found.append(int(entry))
    return found


def _tenants(served: Served, home: Path) -> Path:
    """The folder of this server's tenants on a node whose root is ``home``: keyed by
    the server's identity, kept in its root (two servers on one cluster never share
    one)."""
    return home / "tenants" / (served.home / "server-id").read_text().strip()


def _bobs_secret_and_sleeper(served: Served, home: Path, mark: str) -> int:
    """Bob keeps a file and a background process in his bash session on a node."""
    bob = served.code(BOB, f"echo {SECRET} > secret.txt; sleep {mark} & pwd",
                      language="bash", state_mode="stateful", session_name="vault")
    assert bob.get("is_error") is False, bob
    assert bob["stdout"].strip() == str(_tenants(served, home) / "bob"), bob
    assert (_tenants(served, home) / "bob" / "secret.txt").read_text().strip() == SECRET
    deadline = time.monotonic() + 10
    while not (pids := _node_pids(f"sleep {mark}")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(pids) == 1, pids
    return pids[0]


ATTACK = ("cat {tenants}/bob/secret.txt; ls {tenants} {home}/tenants; kill -9 {pid}; "
          "echo kill=$?; ls /proc | grep -c '^[0-9]'")


def test_a_tenant_cannot_read_or_signal_another_tenants_session_on_a_node(
        served: Served, local_cluster: LocalCluster) -> None:
    home = local_cluster.home
    sleeper = _bobs_secret_and_sleeper(served, home, MARKS[0])
    stolen = served.code(ALICE, ATTACK.format(home=home, tenants=_tenants(served, home),
                                              pid=sleeper), language="bash",
                         state_mode="stateful")
    assert stolen.get("is_error") is False, stolen
    assert SECRET not in stolen["stdout"], stolen
    assert "kill=1" in stolen["stdout"], stolen  # no such process: bob's is out of sight
    assert "bob" not in stolen["stdout"].split("kill=")[0], stolen
    assert int(stolen["stdout"].split()[-1]) < 20, stolen  # a pid namespace of its own
    assert _node_pids(f"sleep {MARKS[0]}") == [sleeper]
    # Both sessions are on nodes, and never on the node that cannot confine.
    for token in (ALICE, BOB):
        records = served.call(token, "list_sessions")["sessions"]
        nodes = {r.get("node") for r in records if r["language"] == "bash"}
        assert nodes and None not in nodes and served.blocked not in nodes, records
    still = served.code(BOB, "cat secret.txt; jobs | wc -l", language="bash",
                        state_mode="stateful", session_name="vault")
    assert still["stdout"].split() == [SECRET, "1"], still  # the sleeper is still its job


def test_the_same_attack_succeeds_on_the_unconfined_path(
        served: Served, local_cluster: LocalCluster, tmp_path: Path) -> None:
    """Before confinement on nodes, a session on a node ran in coordex's actor there,
    as any tenant's did: the attack above read bob's file and killed his process."""
    home = local_cluster.home
    sleeper = _bobs_secret_and_sleeper(served, home, MARKS[1])
    with Executor(root=tmp_path / "alice", timeout=30, cluster=local_cluster.address) as ex:
        stolen = ex.execute_code(ATTACK.format(home=home, tenants=_tenants(served, home),
                                               pid=sleeper), language="bash")
    assert SECRET in stolen["stdout"], stolen
    assert "kill=0" in stolen["stdout"], stolen
    assert not _node_pids(f"sleep {MARKS[1]}")


def test_the_server_says_which_nodes_cannot_confine_and_uses_only_the_others(
        served: Served) -> None:
    line = served.running.wait_for(rf"cluster node {served.blocked[:12]} \(.*\): (.*)").group(1)
    assert line == "confinement none - not used for tenants' sessions"
    others = [m for m in served.running.seen if re.search(r"cluster node \w+ .*: confinement "
                                                          r"namespaces\+landlock$", m.strip())]
    assert len(others) >= 2, served.running.seen
    # Many sessions, none on the node that cannot confine.
    for number in range(1, 4):
        result = served.code(ALICE, "echo $$", language="bash", state_mode="stateful",
                             session_id=number)
        assert result.get("is_error") is False, result
    nodes = {r.get("node") for r in served.call(ALICE, "list_sessions")["sessions"]
             if r["language"] == "bash"}
    assert nodes and served.blocked not in nodes and None not in nodes


def test_a_tenants_environment_is_built_and_run_in_its_host_on_a_node(
        served: Served, local_cluster: LocalCluster) -> None:
    home = local_cluster.home
    created = served.call(ALICE, "create_environment", spec="# no requirements\n")
    assert isinstance(created.get("venv_id"), int), created
    # Built by the node jail's builder into the tenant's environments folder there: not
    # inside its own (writable) folder.
    tenants = _tenants(served, home)
    built_in = str(home / "environments" / tenants.relative_to(home) / "alice") + "/"
    probe = ("import os, sys\n"
             f"(os.getcwd(), sys.prefix.startswith({built_in!r}), "
             f"os.path.exists({str(tenants / 'bob')!r}), "
             "len([p for p in os.listdir('/proc') if p.isdigit()]) < 20)")
    kept = served.code(ALICE, probe, venv_id=created["venv_id"], state_mode="stateful")
    assert kept.get("is_error") is False, kept
    assert kept["result"] == repr((str(tenants / "alice"), True, False, True)), kept
    once = served.code(ALICE, "import os; os.getcwd()", venv_id=created["venv_id"])
    assert once["result"] == repr(str(tenants / "alice")), once


def test_read_only_and_inspect_work_on_a_tenants_session_on_a_node(served: Served) -> None:
    made = served.code(BOB, "export KEPT=7; echo base > ro.txt", language="bash",
                       state_mode="stateful", session_name="ro")
    assert made.get("is_error") is False, made
    look = served.code(BOB, "echo $KEPT; echo changed > ro.txt; cat ro.txt", language="bash",
                       state_mode="read_only", session_name="ro")
    assert look.get("is_error") is False and look["stdout"].split()[0] == "7", look
    after = served.code(BOB, "cat ro.txt", language="bash", state_mode="stateful",
                        session_name="ro")
    assert after["stdout"] == "base\n", (look, after)
    seen = served.call(BOB, "inspect_session", language="bash", session_name="ro")
    assert "error" not in seen, seen


def test_the_memory_limit_holds_for_a_tenants_host_on_a_node(served: Served) -> None:
    hog = served.code(ALICE, f"{sys.executable} -c 'bytearray(900 << 20)'; echo exit=$?",
                      language="bash", state_mode="stateful", session_name="hog")
    assert hog.get("is_error") is False, hog
    assert "exit=0" not in hog["stdout"], hog  # 900 MiB in a host limited to 512M
    assert served.code(ALICE, "echo $((1 + 1))", language="bash", state_mode="stateful",
                       session_name="hog")["stdout"] == "2\n"


def test_a_tenant_host_that_dies_takes_its_processes_on_nodes_with_it(served: Served) -> None:
    started = served.code(ALICE, "sleep 984 &", language="bash", state_mode="stateful",
                          session_name="left")
    assert started.get("is_error") is False, started
    assert _node_pids("sleep 984")
    died = served.code(ALICE, "import os; os._exit(1)")
    assert died["error_type"] == "crashed" and died["state_lost"] is True, died
    again = served.code(ALICE, "1 + 1")
    assert again["result"] == "2" and again["state_lost"] is True, again
    deadline = time.monotonic() + 20
    while _node_pids("sleep 984") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _node_pids("sleep 984")  # the dead Executor's node sessions ended with it
    fresh = served.code(ALICE, "echo $((6 * 7))", language="bash", state_mode="stateful",
                        session_name="left")
    assert fresh.get("stdout") == "42\n", fresh
    assert served.code(BOB, "cat secret.txt", language="bash", state_mode="stateful",
                       session_name="vault")["stdout"] == SECRET + "\n"


def test_closing_a_tenant_ends_its_hosts_on_nodes_at_once(
        local_cluster: LocalCluster, tmp_path: Path) -> None:
    from coordex.hosting import ConfinedExecutor
    from coordex.hosting.relay import NodeRelay

    nodes = NodeRelay(local_cluster.address, {"name": "carol", "memory_limit": 512 << 20})
    carol = ConfinedExecutor(tmp_path / "carol", nodes=nodes)
    try:
        started = carol.execute_code("sleep 983 &", language="bash", state_mode="stateful")
        assert "error" not in started, started
        shells = [r for r in carol.list_sessions()["sessions"] if r["language"] == "bash"]
        assert shells and shells[0].get("node"), shells
        # The call returns once bash has forked the job; its exec of sleep may come later.
        deadline = time.monotonic() + 5
        while not _node_pids("sleep 983") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _node_pids("sleep 983")
    finally:
        began = time.monotonic()
        carol.close()
    assert carol.close_step == "shutdown" and time.monotonic() - began < 10
    deadline = time.monotonic() + 5
    while _node_pids("sleep 983") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _node_pids("sleep 983")


def test_nothing_of_the_server_is_in_sight_on_a_node_of_its_machine(
        served: Served, local_cluster: LocalCluster) -> None:
    """The nodes run on the server's machine, whose root lies outside /tmp: a tenant's
    session on a node sees neither the server's root, nor its tokens file, nor another
    tenant's folder there; its own interpreter on the server sees no node's folders."""
    made = served.code(BOB, f"open('bob_private.txt', 'w').write({SECRET!r})",
                       state_mode="stateful")
    assert made.get("is_error") is False, made
    assert (served.home / "tenants" / "bob" / "bob_private.txt").read_text() == SECRET
    on_node = served.code(ALICE, (
        f"cat {served.tokens} {served.home}/tenants/bob/bob_private.txt; "
        f"ls {served.home} {served.home}/tenants {served.tokens.parent}; echo done"),
        language="bash", state_mode="stateful", session_name="probe")
    assert on_node.get("is_error") is False, on_node
    assert "done" in on_node["stdout"], on_node
    for secret in (SECRET, BOB, ALICE, "tokens.txt", "bob"):
        assert secret not in on_node["stdout"], on_node
    on_server = served.code(ALICE, (
        "import os\n"
        f"[p for p in ({str(local_cluster.home / 'tenants')!r}, {str(served.tokens)!r}) "
        "if os.path.exists(p)]"))
    assert on_server["result"] == "[]", on_server


ASK_FOR_ACTORS = """
import json, os, time
argv = open('/proc/self/cmdline', 'rb').read().split(b'\\0')
out = int(argv[argv.index(b'--out') + 1])
for n in range(12):
    line = {'type': 'node', 'id': 10**6 + n, 'op': 'host',
            'args': {'resources': {'num_cpus': 0.01}}}
    os.write(out, json.dumps(line).encode() + b'\\n')
time.sleep(20)
'asked'
"""


def _alices_node_hosts() -> int:
    """Alice's confined hosts on the nodes (their keepers: each actor of hers has one)."""
    pids = set(_node_pids(r".*coordex\.hosting\.host .*--name alice-node .*"))
    keepers = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        keepers += parent not in pids
    return keepers


def test_a_tenant_cannot_start_actors_of_its_own_without_bound(served: Served) -> None:
    """The tenant's code writes the host's own requests for dedicated actors to the
    server's relay, a dozen of them; the server starts at most 8 per tenant."""
    before = _alices_node_hosts()
    asked = served.code(ALICE, ASK_FOR_ACTORS, timeout=60)
    assert asked.get("result") == "'asked'", asked
    assert 0 < _alices_node_hosts() - before <= 8
