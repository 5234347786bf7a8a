"""SPEC section 6: a host that dies without closing (SIGKILL, SIGTERM without a handler)
takes every process coordex started with it, and the background processes code started
in a session, within a few seconds; a process that left with ``setsid`` stays."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import alive

HOST = r"""
import json, sys, threading, time
from coordex import Executor
from coordex.backends.base import RunRequest
from coordex.backends.env.workers import WorkerSession, WorkerTemplate

root, report = sys.argv[1], sys.argv[2]
ex = Executor(root=root, timeout=600)
pids = {}
r = ex.execute_code(
    "sleep 300 & echo $!; nohup sleep 301 >/dev/null 2>&1 & echo $!; "
    "setsid sleep 302 >/dev/null 2>&1 & echo $!; echo $$",
    language="bash", state_mode="stateful")
pids["bash_bg"], pids["bash_nohup"], pids["setsid"], pids["shell"] = map(int, r["stdout"].split())
threading.Thread(target=ex.execute_code, daemon=True,
                 args=(f"echo $$ > {report}.stateless; exec sleep 303",),
                 kwargs={"language": "bash"}).start()
worker = WorkerSession(sys.executable)
out = worker.run(RunRequest(
    "import os, subprocess\np = subprocess.Popen(['sleep', '304'])\nprint(p.pid, os.getpid())",
    timeout=60))
pids["worker_popen"], pids["worker"] = map(int, out.stdout.split())
busy = WorkerSession(sys.executable)
pids["busy_worker"] = busy.pid
threading.Thread(target=busy.run, daemon=True,
                 args=(RunRequest("import time; time.sleep(300)", timeout=600),)).start()
template = WorkerTemplate(sys.executable)
template.run_stateless(RunRequest("1", timeout=60))
pids["template"] = template._idle[0].pid
deadline = time.time() + 20
while time.time() < deadline:
    try:
        pids["stateless_bash"] = int(open(report + ".stateless").read())
        break
    except (OSError, ValueError):
        time.sleep(0.05)
with open(report, "w") as f:
    json.dump(pids, f)
time.sleep(600)
"""


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_every_process_ends_when_the_host_dies(tmp_path: Path, sig: signal.Signals) -> None:
    report = tmp_path / "pids.json"
    log = tmp_path / "host.log"
    with open(log, "wb") as err:
        host = subprocess.Popen([sys.executable, "-c", HOST, str(tmp_path / "home"),
                                 str(report)], stderr=err)
    pids: dict[str, int] = {}
    try:
        deadline = time.monotonic() + 60
        while not report.exists() or not report.read_text():
            assert host.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the host did not report its processes"
            time.sleep(0.05)
        time.sleep(0.1)
        pids = json.loads(report.read_text())
        assert len(pids) == 9
        assert all(alive(pid) for pid in pids.values()), pids
        host.send_signal(sig)
        host.wait(10)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(
                alive(pid) for name, pid in pids.items() if name != "setsid"):
            time.sleep(0.05)
        left = {name: pid for name, pid in pids.items() if alive(pid) and name != "setsid"}
        assert left == {}, f"still running {time.monotonic() - deadline + 5:.1f} s after: {left}"
        assert alive(pids["setsid"]), "a process that left with setsid is not ended"
    finally:
        host.kill()
        host.wait()
        for pid in pids.values():
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_the_keeper_ends_with_the_last_executor(tmp_path: Path) -> None:
    from coordex import Executor
    from coordex.backends import _reap

    with Executor(root=tmp_path) as ex:
        assert ex.execute_code("echo hi", language="bash", state_mode="stateful")["stdout"]
        keeper = _reap.keeper().pid
        assert keeper is not None and alive(keeper)
    assert _reap.keeper().pid is None
    deadline = time.monotonic() + 5
    while alive(keeper) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not alive(keeper)
