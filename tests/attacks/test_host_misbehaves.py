"""A tenant's code turns its own host against the server that owns it (SPEC 6: no call
returns later than its timeout plus a grace; SPEC 9: nothing outside the host notices;
SPEC 11: one tenant's page never slows another's).

It stops its host (a model can do this by accident: ``kill -STOP`` of its own process
group), or makes it answer with tens of MB that the one server process would parse.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from coordex.hosting import ConfinedExecutor, best_level

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
        assert took < 2 + 2 + 4, took  # its timeout and SPEC 6's grace, and some slack
        assert stuck.get("error_type") == "crashed" and stuck.get("state_lost") is True, stuck
        # The same for a read that has no timeout of its own.
        assert ex.execute_code(STOP_MYSELF)["result"] == "'stopping'"
        time.sleep(1.5)
        started = time.monotonic()
        stuck = ex.list_sessions()
        took = time.monotonic() - started
        assert took < 2 + 2 + 4, took  # its timeout and SPEC 6's grace, and some slack
        assert stuck.get("error_type") == "crashed" and stuck.get("state_lost") is True, stuck
        again = ex.call_tool("execute_code", {"code": "2 + 2"})
        assert again.get("result") == "4", again


HUGE_ANSWERS = """
import gc
host = [o for o in gc.get_objects() if type(o).__name__ == 'Executor'][0]
big = {'sessions': [{'language': 'python', 'session_name': 'x' * 1000}] * 40000}
host.list_sessions = lambda big=big: big
'patched'
"""


def test_a_hosts_huge_answer_to_a_page_read_is_refused_unparsed(tmp_path: Path) -> None:
    """A tenant's host answered the page's sessions request with ~45 MB; the one server
    process parsed it for every page request, slowing every tenant."""
    with ConfinedExecutor(tmp_path / "tenant", memory_limit=512 << 20) as ex:
        assert ex.execute_code(HUGE_ANSWERS)["result"] == "'patched'"
        started = time.monotonic()
        found = ex.list_sessions()
        assert found.get("error_type") == "capacity", str(found)[:300]
        assert time.monotonic() - started < 10
        assert ex.execute_code("1 + 1")["result"] == "2"
