"""The fault soak at size (SPEC section 6): 5,000 bash calls in four sessions with
SIGKILLs between and during calls, while own-interpreter read-only calls run in
parallel (they raised out of execute_code once, soak N1) and own-interpreter code keeps
background processes running. Every result must be one SPEC 6 allows, no call raises,
and no process survives close()."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from coordex import Executor
from tests.conftest import child_pids

from .test_ownership import _gone, _kill

THREADS = 4
CALLS = 1250  # per thread: 5,000 calls, a quarter of them after a SIGKILL of the shell
KILLS = 60  # and this many more at random moments, during calls too
CODE = "n=$(( ${n:-0} + 1 )); sleep 0.0$((RANDOM % 3)); echo $$ $n"


def _soak(ex: Executor) -> tuple[list[str], int]:
    """test_fault_soak's soak at size, with one more outcome it allows: a shell killed
    after the code ran but before the call returned gives the code's result with
    ``state_lost: true`` (the loss is that call's news), and the next call starts on a
    fresh shell. Returns (problems, kills)."""
    import os
    import random
    import signal

    pids: dict[int, int] = {}
    between: set[int] = set()
    problems: list[str] = []
    kills = [0]
    done = threading.Event()

    def kill(pid: int) -> None:
        # A shell already gone may have left its pid to a read-only copy: bash only.
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() != "bash":
                    return
        except OSError:
            return
        try:
            os.kill(pid, signal.SIGKILL)
            kills[0] += 1
        except ProcessLookupError:
            pass

    def caller(worker: int) -> None:
        allowed = {1}  # what the counter may say next
        rng = random.Random(worker)
        for _ in range(CALLS):
            killed_before = worker in pids and rng.random() < 0.25
            if killed_before:
                between.add(worker)
                kill(pids[worker])
            r = ex.execute_code(CODE, language="bash", state_mode="stateful",
                                session_name=f"soak{worker}", timeout=30)
            between.discard(worker)
            lost = r.get("state_lost") is True
            # (a shell already lost and reported by the last call: its fresh one says
            # nothing of it again)
            if killed_before and not lost and 1 not in allowed:
                problems.append(f"session {worker}: killed before the call, but {r}")
            if "error" in r:
                if killed_before or r["error_type"] != "crashed" or not lost:
                    problems.append(f"session {worker}: {r}")
                allowed = {1}
                pids.pop(worker, None)
                continue
            pid, n = map(int, r["stdout"].split())
            pids[worker] = pid
            # state_lost with a fresh count: lost before the code ran; with the count
            # going on: the shell died after the code ran, the next call starts fresh.
            if n not in (allowed | ({1} if lost else set())) or (killed_before and n != 1):
                # killed before the call: a fresh shell counts from 1
                problems.append(f"session {worker}: counter {n}, expected one of "
                                f"{sorted(allowed)} (state_lost={lost})")
            allowed = {n + 1, 1} if lost else {n + 1}

    def killer() -> None:
        rng = random.Random(9)
        for _ in range(KILLS):
            time.sleep(rng.uniform(0.02, 0.15))
            targets = sorted(set(pids) - between)
            pid = pids.get(rng.choice(targets)) if targets else None
            if pid is not None:
                kill(pid)
            if done.is_set():
                return

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(THREADS)]
    kill_thread = threading.Thread(target=killer)
    for thread in threads:
        thread.start()
    kill_thread.start()
    for thread in threads:
        thread.join(600)
    done.set()
    kill_thread.join(10)
    return problems, kills[0]


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.filterwarnings("ignore::ResourceWarning",
                            "ignore::pytest.PytestUnraisableExceptionWarning")
def test_five_thousand_calls_under_kills(root: Path) -> None:
    before = child_pids()
    ex = Executor(root=root, timeout=30)
    raised: list[BaseException] = []
    wrong: list[dict[str, Any]] = []
    reads = [0]
    done = threading.Event()
    started = ex.execute_code(
        "import subprocess\nbg = subprocess.Popen(['sleep', '600'])\nn = 41\nbg.pid",
        state_mode="stateful", session_name="own")
    assert "error" not in started, started
    background = [int(started["result"])]

    def reader() -> None:
        while not done.is_set():
            try:
                r = ex.execute_code("n + 1", state_mode="read_only", session_name="own")
            except BaseException as exc:  # never: calls do not raise
                raised.append(exc)
                continue
            reads[0] += 1
            if r.get("result") != "42":
                wrong.append(r)

    readers = [threading.Thread(target=reader) for _ in range(2)]
    try:
        for t in readers:
            t.start()
        problems, kills = _soak(ex)
        assert problems == []
        assert kills >= 50 + KILLS // 2, kills
    finally:
        done.set()
        for t in readers:
            t.join(60)
        ex.close()
    try:
        assert raised == [] and wrong == [], (raised[:3], wrong[:3])
        assert reads[0] > 50
        assert _gone(background) == []
        deadline = time.monotonic() + 5
        while child_pids() - before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert child_pids() - before == set()
    finally:
        _kill(background)
