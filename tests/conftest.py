"""Shared fixtures: an Executor on a throwaway root, closed (and checked) after each test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordex import Executor
from coordex.backends import _reap


def cpu_seconds(pid: int) -> float:
    """The CPU time (user and system) process ``pid`` has taken so far, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def child_pids(pid: int | None = None) -> set[int]:
    """Every live descendant of ``pid`` (default: this process), from /proc.

    The host's process keeper (``backends/_reap.py``) is left out: it belongs to the
    host, not to a session, and ends when the host does (its own test checks that).
    """
    pid = os.getpid() if pid is None else pid
    keeper = _reap.keeper().pid
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == b"Z" or int(entry) == keeper:
            continue
        parents[int(entry)] = int(fields[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {c for c, p in parents.items() if p in frontier and c not in found}
        found |= frontier
    return found


def run_then_kill(script: str, *args: str, **popen: object) -> None:
    """Run ``script`` (``python -c``) with ``args`` and the write end of a pipe as its last
    argument; once it writes ``done`` there, SIGKILL it and its whole session, as a host
    dies without closing."""
    read_end, write_end = os.pipe()
    proc = subprocess.Popen([sys.executable, "-c", script, *args, str(write_end)],
                            pass_fds=(write_end,), start_new_session=True, **popen)  # type: ignore[call-overload]
    os.close(write_end)
    try:
        with os.fdopen(read_end, "rb") as report:
            assert report.readline() == b"done\n"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not), from /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "coordex-home"


def assert_no_new_children(before: set[int], within: float = 5.0) -> None:
    """Every child process that was not there in ``before`` ends within ``within`` s."""
    deadline = time.monotonic() + within
    while child_pids() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    left = child_pids() - before
    assert left == set(), f"processes survived close(): {sorted(left)}"


@pytest.fixture
def ex(root: Path) -> Iterator[Executor]:
    before = child_pids()
    executor = Executor(root=root, timeout=30)
    try:
        yield executor
    finally:
        executor.close()
    assert_no_new_children(before)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The cluster's tests run last. A Ray driver in this process leaves fork handlers that
    start a thread in every forked child, and a forked child with a second thread is
    (rightly) refused file protection: the tests that fork this process for a read-only
    copy would see protection refused for a reason of the test run's, not of the code."""
    cluster = [item for item in items if "tests/cluster/" in item.nodeid]
    if cluster:
        items[:] = [item for item in items if "tests/cluster/" not in item.nodeid] + cluster
