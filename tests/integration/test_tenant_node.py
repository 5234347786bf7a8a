"""A tenant's host on a cluster node, as an unprivileged user (SPEC 10's last bullet).

coordex's actor on a node for one tenant (``TenantNodeHost``) needs nothing of Ray to
start the tenant's confined host and forward calls to it, so this runs it directly -
two tenants on one "node", as ``nobody`` (as most nodes run Ray) - and tries the
attack of tests/cluster/test_tenants.py: alice reads bob's file and signals bob's
process there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.test_confinement import as_nobody, open_tmp  # noqa: F401 (a fixture)

pytestmark = pytest.mark.timeout(120)

SCRIPT_HEAD = r"""
import json, os, re, sys, time
from coordex.hosting.tenant_node import TenantNodeHost

def run(host, op, args):
    call = f"{op}-{time.monotonic()}"
    reply = host.begin(call, op, args, 5.0)
    while reply["done"] is None:
        reply = host.events(call, 0.25)
    done = reply["done"]
    return done["ran"] if "ran" in done else done["outcome"]  # a run's facts, or a reply

def bash(host, sid, code):
    return run(host, "run", {"sid": sid, "code": code, "timeout": 20, "output_limit": 10000,
                             "stream": False, "protect_paths": [], "scratch": False,
                             "capabilities": []})

def sleepers():
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if f.read() == b"sleep\0985\0":
                    found.append(int(entry))
        except OSError:
            pass
    return found

"""

SCRIPT = SCRIPT_HEAD + r"""
home = os.environ["COORDEX_HOME"]
hosts = {name: TenantNodeHost({"name": name, "memory_limit": 512 << 20})
         for name in ("bob", "alice")}
try:
    for name, host in hosts.items():
        run(host, "open", {"sid": name, "language": "bash", "env": None, "capabilities": []})
    bob = bash(hosts["bob"], "bob", "echo bobs-secret > secret.txt; sleep 985 & id -u")
    deadline = time.monotonic() + 10
    while not sleepers() and time.monotonic() < deadline:
        time.sleep(0.1)
    pid = sleepers()[0]
    attack = bash(hosts["alice"], "alice",
                  f"cat {home}/tenants/bob/secret.txt; kill -9 {pid}; echo kill=$?")
    print(json.dumps({"level": hosts["alice"].level, "uid": bob["stdout"].strip(),
                      "attack": attack["stdout"] + attack["stderr"],
                      "bob_alive": sleepers() == [pid]}))
finally:
    for host in hosts.values():
        host.shutdown()
"""


@pytest.mark.skipif(os.geteuid() != 0 or not (shutil.which("setpriv") and shutil.which("unshare")),
                    reason="switching to nobody needs root, setpriv and unshare (util-linux)")
def test_as_nobody_a_tenant_on_a_node_cannot_reach_another(open_tmp: Path) -> None:  # noqa: F811
    home = open_tmp / "node-home"
    home.mkdir()
    os.chown(home, 65534, 65534)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "COORDEX_HOME": str(home),
           "HOME": str(home)}
    done = subprocess.run(as_nobody([sys.executable, "-c", SCRIPT]), env=env,
                          capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["uid"] == "65534", found
    assert found["level"] == "namespaces+landlock", found
    assert "bobs-secret" not in found["attack"] and "kill=1" in found["attack"], found
    assert found["bob_alive"], found


def test_max_calls_bounds_a_tenants_calls_on_a_node(tmp_path: Path) -> None:
    """SPEC 9's call limit holds in a tenant's host on a node: with ``max_calls`` 1, two
    one-second calls from two sessions take two seconds."""
    script = SCRIPT_HEAD + r"""
import threading
host = TenantNodeHost({"name": "alice", "memory_limit": 512 << 20, "max_calls": 1})
try:
    for sid in ("a", "b"):
        run(host, "open", {"sid": sid, "language": "bash", "env": None, "capabilities": []})
    started = time.monotonic()
    threads = [threading.Thread(target=bash, args=(host, sid, "sleep 1")) for sid in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps({"seconds": time.monotonic() - started}))
finally:
    host.shutdown()
"""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "COORDEX_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-3000:]
    seconds = json.loads(done.stdout.strip().splitlines()[-1])["seconds"]
    assert 2.0 <= seconds < 10, seconds


@pytest.mark.slow
def test_a_tenants_code_on_a_node_cannot_change_its_built_environment(tmp_path: Path) -> None:
    """SPEC 9's read-only environments hold in a tenant's host on a node too: the node's
    jail builds with its builder, and the tenant's session there goes after the result."""
    from tests.fakes.wheels import ledgerlib_wheel, requirement
    from tests.integration.test_confined import TAMPER

    wheels = tmp_path / "tenants" / "alice" / "wheels"  # the tenant's own folder there
    spec = requirement("ledgerlib", ledgerlib_wheel(wheels, "1.0"))
    script = SCRIPT_HEAD + r"""
from pathlib import Path
from coordex.environments.manager import EnvironmentManager

driver = EnvironmentManager(Path(sys.argv[2]))  # the driver's registry describes it
text, spec_hash, label = driver.describe(driver.create(sys.argv[1])["venv_id"])
env = {"spec_text": text, "spec_hash": spec_hash, "label": label}
host = TenantNodeHost({"name": "alice", "memory_limit": 512 << 20})
try:
    run(host, "open", {"sid": "e", "language": "python", "env": env, "capabilities": []})
    def python(code):
        return run(host, "run", {"sid": "e", "code": code, "timeout": 20,
                                 "output_limit": 10000, "stream": False, "protect_paths": [],
                                 "scratch": False, "capabilities": []})
    where = python("import sys; sys.prefix")
    tampered = python(sys.argv[3].format(env=eval(where["result"])))
    used = python("import os, ledgerlib; ledgerlib.VERSION, os.environ.get('PLANTED')")
    print(json.dumps({"where": where["result"], "tampered": tampered.get("result", tampered),
                      "used": used.get("result", used)}))
finally:
    host.shutdown()
"""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "COORDEX_HOME": str(tmp_path),
           "UV_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", script, spec, str(tmp_path / "driver"),
                           TAMPER], env=env, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert "/environments/tenants/alice/" in found["where"], found
    assert found["tampered"] == "[]" and found["used"] == "('1.0', None)", found
