"""A tenant's code stops its own host (SPEC 6: no call returns later than its timeout
plus a grace; SPEC 9: a host that dies is started again on its next call).

A model can do this by accident (``kill -STOP`` of its own process group). A stopped
host answers nothing: the owner must not wait for it forever.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from coordex.hosting import ConfinedExecutor, best_level
from coordex.hosting.client import STUCK_GRACE

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180),
              pytest.mark.skipif(best_level() == "none", reason="no confinement on this machine")]

STOP_MYSELF = ("import os, subprocess\n"
               "subprocess.Popen(['sh', '-c', f'sleep 0.5; kill -STOP {os.getpid()}'])\n"
               "'stopping'")


def test_a_host_its_own_code_stopped_does_not_hang_its_calls(tmp_path: Path) -> None:
    with ConfinedExecutor(tmp_path / "tenant", memory_limit=256 << 20) as ex:
        first = ex.call_tool("execute_code", {"code": STOP_MYSELF})
        assert first.get("result") == "'stopping'", first
        time.sleep(1.5)
        started = time.monotonic()
        stuck = ex.call_tool("execute_code", {"code": "1 + 1", "timeout": 2})
        took = time.monotonic() - started
        assert took < 2 + STUCK_GRACE + 10, took
        assert stuck.get("error_type") == "crashed" and stuck.get("state_lost") is True, stuck
        again = ex.call_tool("execute_code", {"code": "2 + 2"})
        assert again.get("result") == "4", again
