"""The one stop policy (``backends/_reap.py``): every kind of process coordex starts is
stopped interrupt -> TERM -> KILL, and the step reached is returned and logged."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest

from coordex.backends import _reap
from coordex.backends.base import RunRequest
from coordex.backends.env import workers
from coordex.backends.env.workers import WorkerSession
from coordex.backends.shell import ShellSession
from coordex.backends.shell.launcher import LauncherServer
from tests.conftest import alive, child_pids
from tests.said import said

FAKE_WORKER = Path(__file__).resolve().parent.parent / "fakes" / "fake_worker.py"


def req(code: str, timeout: float = 10.0) -> RunRequest:
    return RunRequest(code=code, timeout=timeout)


@pytest.mark.parametrize(("mode", "step"), [
    ("ignore_shutdown", "interrupt"),
    ("ignore_interrupt", "terminate"),
    ("ignore_term", "kill"),
])
def test_a_worker_that_ignores_a_step_gets_the_next(monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture,
                                                    mode: str, step: str) -> None:
    monkeypatch.setattr(workers, "WORKER_SCRIPT", FAKE_WORKER)
    monkeypatch.setattr(_reap, "STEP_SECONDS", 0.3)
    before = child_pids()
    session = said(WorkerSession(sys.executable, env={**os.environ, "COORDEX_FAKE_WORKER": mode}))
    pid = session.pid
    with caplog.at_level(logging.DEBUG, logger="coordex.processes"):
        session.close()
    assert session._proc is not None and session._proc.close_step == step
    assert child_pids() - before == set()
    record = next(r for r in caplog.records if f"pid {pid}" in r.getMessage())
    assert repr(step) in record.getMessage()
    assert record.levelno == (logging.WARNING if step in ("terminate", "kill")
                              else logging.DEBUG)


def test_a_real_worker_leaves_when_asked() -> None:
    session = said(WorkerSession(sys.executable))
    session.run(req("import subprocess; p = subprocess.Popen(['sleep', '60'])"))
    before_close = child_pids()
    session.close()
    assert session._proc is not None and session._proc.close_step == "asked"
    assert not (before_close & child_pids())


@pytest.mark.parametrize(("code", "step"), [
    ("sleep 60 & nohup sleep 61 >/dev/null 2>&1 &", "asked"),
    ("trap '' HUP; sleep 60 &", "kill"),  # bash ignores SIGTERM and SIGINT already
])
def test_a_shell_stops_at_the_step_it_needs(monkeypatch: pytest.MonkeyPatch, code: str,
                                            step: str) -> None:
    monkeypatch.setattr(_reap, "STEP_SECONDS", 0.3)
    before = child_pids()
    shell = said(ShellSession())
    shell.run(req(code))
    shell.close()
    assert shell._shell.stop_step == step
    assert child_pids() - before == set()


def test_the_launcher_leaves_when_its_socket_closes() -> None:
    server = LauncherServer(dict(os.environ))
    assert server.close() == "asked"


def test_stop_reports_a_process_already_gone() -> None:
    proc = _reap.spawn(["true"])
    proc.wait()
    assert _reap.stop(proc, "true") == "exited"
    assert _reap.stop(proc, "true") == "exited"  # idempotent


def test_closing_a_session_ends_jobs_that_left_its_group() -> None:
    before = child_pids()
    shell = said(ShellSession())
    r = shell.run(req("set -m; nohup sleep 60 >/dev/null 2>&1 & echo $!"))
    job = int(r["stdout"])
    assert os.getpgid(job) != shell.pid  # job control put it in a group of its own
    shell.close()
    try:
        assert not alive(job)  # (an orphan is no child of ours: ask /proc about it)
    finally:
        if alive(job):
            os.kill(job, 9)
    assert child_pids() - before == set()
