"""A small fault soak (SPEC section 6): a few threads call their own sessions, now and
then SIGKILLing the process that holds theirs between two calls, while another thread
SIGKILLs them at random moments, during calls too. Every result
must be one SPEC 6 allows, the state a session reports must be the state it has, and
no process may survive close()."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from coordex import Executor
from tests.conftest import child_pids

THREADS = 3
CALLS = 25
KILLS = 8

PLACES = {
    # code that bumps a counter, and says the pid holding the session and the counter
    "bash": {"language": "bash", "code": "n=$(( ${n:-0} + 1 )); sleep 0.0$((RANDOM % 5)); "
                                          "echo $$ $n"},
    "python": {"code": "import os, time\nn = globals().get('n', 0) + 1\n"
                       "time.sleep(0.01 * (n % 5))\nprint(os.getpid(), n)"},
}


def _soak(ex: Executor, place: str, venv_id: int | None = None) -> list[str]:
    spec = dict(PLACES[place])
    code = spec.pop("code")
    pids: dict[int, int] = {}
    between: set[int] = set()
    problems: list[str] = []
    done = threading.Event()

    def caller(worker: int) -> None:
        expected = 1
        rng = random.Random(worker)
        for _ in range(CALLS):
            killed_before = worker in pids and rng.random() < 0.25
            if killed_before:  # killed between two calls: found dead, never crashed
                between.add(worker)  # (and the other thread leaves this call alone)
                try:
                    os.kill(pids[worker], signal.SIGKILL)
                except ProcessLookupError:
                    pass
            r = ex.execute_code(code, state_mode="stateful", session_name=f"soak{worker}",
                                venv_id=venv_id, timeout=30, **spec)
            between.discard(worker)
            if killed_before and r.get("state_lost") is not True:
                problems.append(f"session {worker}: killed before the call, but {r}")
            if "error" in r:
                # A process killed during a call: crashed, state lost, never retried.
                if killed_before or r["error_type"] != "crashed" \
                        or r.get("state_lost") is not True:
                    problems.append(f"session {worker}: {r}")
                expected = 1
                pids.pop(worker, None)  # gone; the next call says nothing of it again
                continue
            pid, n = map(int, r["stdout"].split())
            pids[worker] = pid
            if r.get("state_lost"):
                expected = 1
            if n != expected:
                problems.append(f"session {worker}: counter {n}, expected {expected} "
                                f"(state_lost={r.get('state_lost')})")
            expected = n + 1

    def killer() -> None:
        rng = random.Random(9)
        for _ in range(KILLS):
            time.sleep(rng.uniform(0.02, 0.15))
            targets = sorted(set(pids) - between)
            pid = pids.get(rng.choice(targets)) if targets else None
            if pid is not None:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if done.is_set():
                return

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(THREADS)]
    kill_thread = threading.Thread(target=killer)
    for thread in threads:
        thread.start()
    kill_thread.start()
    for thread in threads:
        thread.join(120)
    done.set()
    kill_thread.join(10)
    return problems


def test_bash_sessions_under_kills(root: Path) -> None:
    before = child_pids()
    ex = Executor(root=root, timeout=30)
    try:
        assert _soak(ex, "bash") == []
    finally:
        ex.close()
    assert child_pids() - before == set()


@pytest.mark.slow
def test_environment_sessions_under_kills(root: Path, monkeypatch: pytest.MonkeyPatch,
                                          tmp_path_factory: pytest.TempPathFactory) -> None:
    monkeypatch.setenv("UV_OFFLINE", "1")
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "uvc"))
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)
    before = child_pids()
    ex = Executor(root=root, timeout=30)
    try:
        venv_id: Any = ex.environments.create("")["venv_id"]
        assert _soak(ex, "python", venv_id) == []
    finally:
        ex.close()
    assert child_pids() - before == set()
