"""Nothing outlives its owner, nothing leaks out of a copy (SPEC sections 1 and 6).

Real processes throughout: own-interpreter read-only copies forked in parallel, code
that starts processes with ``subprocess.Popen`` and ``os.fork``, copies that try to reach
back into the session or into coordex. Every test checks that no process it caused
survives.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from coordex import Executor

from ..conftest import alive

pytestmark = [
    pytest.mark.skipif(os.uname().sysname != "Linux", reason="Linux kernel features"),
    pytest.mark.timeout(120),
]


def _gone(pids: list[int], within: float = 5.0) -> list[int]:
    """The pids of ``pids`` still alive after ``within`` seconds."""
    deadline = time.monotonic() + within
    left = [p for p in pids if alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if alive(p)]
    return left


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def test_parallel_own_read_only_calls_never_raise(ex: Executor) -> None:
    """Soak N1: copies reaped by several threads at once raised ``list.remove``."""
    for i in range(4):
        assert "error" not in ex.execute_code(f"n = {i}", state_mode="stateful",
                                              session_name=f"s{i}")
    errors: list[BaseException] = []
    results: list[dict[str, Any]] = []
    stop_at = time.monotonic() + 4.0

    def loop(i: int) -> None:
        while time.monotonic() < stop_at:
            try:
                results.append(ex.execute_code("n + 1", state_mode="read_only",
                                               session_name=f"s{i % 4}"))
            except BaseException as exc:  # the bug: an exception out of the API
                errors.append(exc)

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [], errors[:3]
    assert results and all("error" not in r for r in results), \
        [r for r in results if "error" in r][:3]
