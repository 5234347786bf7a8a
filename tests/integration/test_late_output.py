"""Retired output pipes (backends/late_output.py): drained, dropped, closed."""

from __future__ import annotations

import os
import threading
import time

import pytest

from coordex.backends import late_output

pytestmark = pytest.mark.timeout(30)


def _drain_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "coordex-late-output")


def _wait_for(condition: object, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_retired_pipe_never_blocks_its_writer_and_its_output_is_dropped() -> None:
    r, w = os.pipe()
    os.set_blocking(r, False)
    owner = object()
    dropped = late_output.dropped()
    late_output.renew(r, owner)  # `w` is the job that outlived its call
    try:
        os.write(w, b"x" * 1000)
        # A fresh, empty pipe at the same number, no writer on it: nothing the job
        # writes reaches it.
        assert os.read(r, 10) == b""
        # Far more than a pipe holds: the job is never blocked, its bytes are dropped.
        os.set_blocking(w, True)
        for _ in range(64):
            os.write(w, b"y" * 65536)
        _wait_for(lambda: late_output.dropped() >= dropped + 1000 + 64 * 65536)
        assert os.read(r, 10) == b""
    finally:
        os.close(w)
    _wait_for(lambda: _drain_threads() == 0)  # the last writer gone: closed, thread ended
    os.close(r)


def test_forget_closes_an_owners_pipes_and_ends_the_thread_at_once() -> None:
    r, w = os.pipe()
    os.set_blocking(r, False)
    owner = object()
    late_output.renew(r, owner)
    try:
        assert _drain_threads() == 1
        late_output.forget(owner)
        _wait_for(lambda: _drain_threads() == 0, 1.0)
        with pytest.raises(BrokenPipeError):  # no reader is left on the retired pipe
            os.write(w, b"late")
    finally:
        os.close(w)
        os.close(r)


def test_a_writer_opens_its_own_end_on_a_pipe_by_path() -> None:
    r, w = os.pipe()
    os.close(w)
    os.set_blocking(r, False)
    try:
        assert late_output.per_call_pipes_work(r)
        writer = os.open(late_output.writer_path(r), os.O_WRONLY)
        os.write(writer, b"mine")
        os.close(writer)
        assert os.read(r, 10) == b"mine"
        assert os.read(r, 10) == b""  # no writer left: end of file, until the next opens one
    finally:
        os.close(r)


@pytest.mark.parametrize("place", ["bash", "worker"])
def test_without_proc_the_calls_share_the_pipes_as_before(
        place: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where /proc is missing: one pair of pipes for every call, what waits on them is
    dropped before each call (docs/protocol.md), and a closed fd 1 comes back."""
    import sys

    from coordex.backends.base import RunRequest
    from coordex.backends.env.workers import WorkerSession
    from coordex.backends.shell import ShellSession

    monkeypatch.setattr(late_output, "per_call_pipes_work", lambda fd: False)
    if place == "bash":
        session: ShellSession | WorkerSession = ShellSession()
        late, mine = "(sleep 0.2; echo LATE) &", "echo mine; exec 1>&-"
    else:
        session = WorkerSession(sys.executable)
        late = "import subprocess\n_p = subprocess.Popen(['sh', '-c', 'sleep 0.2; echo LATE'])"
        mine = "print('mine')"
    try:
        assert session.run(RunRequest(late, timeout=10)).stdout == ""
        time.sleep(0.5)  # it wrote between the calls
        assert session.run(RunRequest(mine, timeout=10)).stdout == "mine\n"
        again = "echo again" if place == "bash" else "print('again')"
        assert session.run(RunRequest(again, timeout=10)).stdout == "again\n"
    finally:
        session.close()


def test_the_drain_sleeps_while_retired_pipes_are_quiet() -> None:
    """A wake left in the drain's pipe while retired pipes remain (as when one owner is
    forgotten and another retires a pipe before the drain woke): the drain then waits
    for writes, using no CPU (it spun at 100%)."""
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    first, second = object(), object()
    try:
        late_output._DRAIN.retire(r1, first)  # jobs still hold w1 and w2
        late_output._DRAIN.retire(r2, second)
        wake = late_output._DRAIN._wake
        assert wake is not None
        os.write(wake[1], b"x")  # what forget() writes
        time.sleep(0.2)
        drain = next(t for t in threading.enumerate() if t.name == "coordex-late-output")
        used = _thread_cpu(drain.native_id or 0)
        time.sleep(1.0)
        assert _thread_cpu(drain.native_id or 0) - used < 0.1
    finally:
        late_output.forget(first)
        late_output.forget(second)
        os.close(w1)
        os.close(w2)
    _wait_for(lambda: _drain_threads() == 0)


def _thread_cpu(tid: int) -> float:
    """Seconds of CPU thread ``tid`` of this process used, from /proc."""
    with open(f"/proc/self/task/{tid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
