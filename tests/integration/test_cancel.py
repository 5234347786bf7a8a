"""A cancel event interrupts shell and worker calls as a timeout does (SPEC section 6)."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from coordex.backends.base import RunRequest
from coordex.backends.shell import ShellSession
from coordex.backends.workers import WorkerSession

pytestmark = pytest.mark.timeout(60)


def cancelled_after(seconds: float) -> threading.Event:
    event = threading.Event()
    threading.Timer(seconds, event.set).start()
    return event


def test_cancel_interrupts_a_shell_call_and_keeps_the_shell() -> None:
    with ShellSession() as shell:
        shell.run(RunRequest("kept=1", timeout=10))
        started = time.monotonic()
        out = shell.run(RunRequest("sleep 30", timeout=30, cancel=cancelled_after(0.5)))
        assert out["error"]["error_type"] == "timeout", out
        assert out["error"]["state_lost"] is False
        assert time.monotonic() - started < 5
        assert shell.run(RunRequest("echo $kept", timeout=10))["stdout"] == "1\n"


def test_cancel_interrupts_a_worker_call_and_keeps_the_session() -> None:
    worker = WorkerSession(sys.executable)
    try:
        worker.run(RunRequest("kept = 1", timeout=10))
        started = time.monotonic()
        out = worker.run(RunRequest("import time\nwhile True: time.sleep(0.01)", timeout=30,
                                    cancel=cancelled_after(0.5)))
        assert out["error"]["error_type"] == "timeout", out
        assert out["error"]["state_lost"] is False
        assert time.monotonic() - started < 5
        assert worker.run(RunRequest("kept", timeout=10))["result"] == "1"
    finally:
        worker.close()
