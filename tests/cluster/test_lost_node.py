"""SPEC 10 with Ray's own health checks (as a cluster runs by default): a node whose
raylet dies is declared dead only after many seconds, so its coordex actor's fence ends
its sessions first, while the driver still reaches the actor."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Any

import pytest

from coordex import Executor
from tests.cluster.conftest import NODE_ARGS, LocalCluster
from tests.cluster.test_cluster_promises import (  # noqa: F401 - fixtures
    cex,
    node_of,
    venv,
    wheel,
)

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(180)]

HEALTH_CHECKS: dict[str, Any] = {}  # Ray's defaults (the soak's cluster), not the fast ones


def test_calls_in_flight_when_a_raylet_dies_say_the_node_was_lost(
        cex: Executor, venv: int, local_cluster: LocalCluster) -> None:  # noqa: F811
    """SPEC 10 (soak S2): with a node's raylet killed 2 s into a 20 s call (timeout 25),
    its in-flight calls said ``timeout`` with ``state_lost: false`` ("ran past its
    timeout of 25 s ... the session survived with its state") 2-3 s into the call, or
    "the session was closed while this code ran": the fence's ending of the sessions
    read as what it looked like on the node. Each must be ``crashed``, ``state_lost``,
    worded as a lost node; the next call opens a fresh session, the loss said once."""
    import signal

    sessions = [(language, f"s{i}") for i in range(4) for language in ("python", "bash")]
    for language, name in sessions:  # each holds a value and a child, as in the soak
        code = ("import subprocess\nn = 1\np = subprocess.Popen(['sleep', '600'])"
                if language == "python" else "n=1; sleep 600 &")
        r = cex.execute_code(code, language=language, state_mode="stateful",
                             session_name=name, venv_id=venv if language == "python" else None)
        assert "error" not in r, r
    where = {s: node_of(cex, *s) for s in sessions}
    lost = where[("bash", "s0")]
    results: dict[tuple[str, str], dict[str, Any]] = {}
    took: dict[tuple[str, str], float] = {}

    def run(language: str, name: str) -> None:
        started = time.monotonic()
        results[(language, name)] = cex.execute_code(
            "import time\ntime.sleep(20)" if language == "python" else "sleep 20",
            language=language, state_mode="stateful", session_name=name,
            venv_id=venv if language == "python" else None, timeout=25)
        took[(language, name)] = time.monotonic() - started

    runners = [threading.Thread(target=run, args=s) for s in sessions]
    for runner in runners:
        runner.start()
    time.sleep(2.0)
    try:
        os.kill(local_cluster.node(lost).all_processes["raylet"][0].process.pid,
                signal.SIGKILL)
        for runner in runners:
            runner.join(40)
        assert set(results) == set(sessions)
        for session, r in results.items():
            if where[session] != lost:
                assert "error" not in r, (session, r)
                continue
            assert r["error_type"] == "crashed" and r["state_lost"] is True, (session, r)
            assert r["error"].startswith("The node holding this session was lost"), (session, r)
            assert "rebuild_session" in r["suggestion"] and not r.get("retried"), (session, r)
            assert took[session] < 15, (session, took)  # when the node went, not at 25 s
    finally:
        with contextlib.suppress(Exception):
            local_cluster.cluster.remove_node(local_cluster.node(lost), allow_graceful=False)
        local_cluster.cluster.add_node(**NODE_ARGS)
    # The loss was said once: the next call runs in a fresh session, elsewhere.
    for (language, name), node in where.items():
        if node != lost:
            continue
        r = cex.execute_code("'n' in globals()" if language == "python" else "echo ${n:-unset}",
                             language=language, state_mode="stateful", session_name=name,
                             venv_id=venv if language == "python" else None, timeout=25)
        assert "error" not in r and r.get("state_lost") is not True, (name, r)
        assert (r["result"] == "False") if language == "python" else r["stdout"] == "unset\n", r
