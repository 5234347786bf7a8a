"""The writers a place's ``Kept`` returns, and a checkpoint made from one (backends/_kept).

Real forks: a copy that writes, one that never does (killed at its time, reaped: no
process left), and a session that does not answer.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from coordex.backends import _kept
from coordex.backends.base import Done, Kept, Writer, Written
from coordex.worker import _coordex_snapshot as snap
from tests.conftest import child_pids


class _Forking:
    """A session whose snapshot is written by a fork of this process (as the own
    interpreter's), after ``delay`` seconds; None: it never answers."""

    def __init__(self, delay: float | None) -> None:
        self.delay = delay

    def start_snapshot(self, folder: str, *, attempt: int, through: int, max_bytes: int,
                       identity: Mapping[str, Any], close: tuple[int, ...] = ()
                       ) -> Writer | None:
        if self.delay is None:
            return None
        pid = os.fork()
        if pid == 0:
            try:
                time.sleep(self.delay)
                Path(folder, "state").write_text("x" * 10)
                snap.write_meta(folder, {"attempt": attempt, "file": "state", "bytes": 10,
                                         "left_out": ["lock"]})
            finally:
                os._exit(0)
        return _kept.ChildWriter(pid)

    def restore_snapshot(self, folder: str, replay: list[str], timeout: float) -> Written:
        return {"names": ["v"], "left_out": [], "replayed": 0, "ms": 0.0}


def _gone(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def test_a_checkpoint_waits_for_its_copy_and_reaps_it(tmp_path: Path) -> None:
    session = _Forking(0.2)
    assert isinstance(session, Kept)
    written = _kept.start_checkpoint(session, str(tmp_path), 1 << 20)(10.0)
    assert written["bytes"] == 10 and written["left_out"] == ["lock"]


def test_a_copy_that_does_not_write_in_time_is_killed_and_reaped(tmp_path: Path) -> None:
    session = _Forking(30.0)
    writer = session.start_snapshot(str(tmp_path), attempt=1, through=0, max_bytes=1,
                                    identity={})
    assert isinstance(writer, _kept.ChildWriter) and writer.running()
    started = time.monotonic()
    before = child_pids()
    finish = _kept.start_checkpoint(session, str(tmp_path / "b"), 1 << 20)
    written = finish(0.3)
    assert written == {"error": "the checkpoint was not written within 0.3 s", "problem": "timeout"}
    assert time.monotonic() - started < 5
    assert child_pids() - before == set()  # the checkpoint's own copy: killed, reaped
    writer.kill()
    assert not writer.running() and _gone(writer.pid)


def test_a_session_that_does_not_answer_is_said(tmp_path: Path) -> None:
    finish = _kept.start_checkpoint(_Forking(None), str(tmp_path), 1, silent="no answer")
    assert finish(1.0) == {"error": "no answer", "problem": "no_answer"}


def test_a_writer_done_before_it_returned_is_never_running() -> None:
    done = Done()
    assert not done.running() and isinstance(done, Writer)
    done.wait()
    done.kill()


def test_a_restore_over_a_checkpoint_that_holds_nothing_changes_nothing(tmp_path: Path) -> None:
    emptied: list[bool] = []

    def start_over() -> None:
        emptied.append(True)

    report = _kept.restore_checkpoint(_Forking(0.0), str(tmp_path), 1.0, start_over)
    assert report == {"error": "the checkpoint holds no state"} and emptied == []
