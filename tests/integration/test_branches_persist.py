"""Forks and restores outlive their process (SPEC 12 and 15): a forked session and a
session put back to a checkpoint come back after a restart with the state they were
given plus the calls made after it - whether the host closed or was killed (then no
snapshot is written at close: the one taken at the fork or restore is what holds it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from coordex import Executor
from tests.conftest import run_then_kill

pytestmark = pytest.mark.timeout(60)

# Run with ``ex``, ``language`` and ``py`` bound.
STEPS = """
ex.execute_code("rows = [1]" if py else "rows=1", language=language,
                state_mode="stateful", session_name="src")
assert ex.fork_session(session_name="src", language=language, new_name="trial")["session"]
ex.execute_code("rows.append(2)" if py else "rows=${rows}2", language=language,
                state_mode="stateful", session_name="trial")
made = ex.checkpoint_session(language=language, session_name="src")
ex.execute_code("rows = None" if py else "rows=gone", language=language,
                state_mode="stateful", session_name="src")
ex.restore_session(language=language, session_name="src", checkpoint=made["checkpoint"])
ex.execute_code("rows.append(3)" if py else "rows=${rows}3", language=language,
                state_mode="stateful", session_name="src")
"""

KILLED = """
import os, sys, time
from coordex import Executor
language = sys.argv[2]
py = language == "python"
ex = Executor(root=sys.argv[1], persist=True)
""" + STEPS + """
time.sleep(1.5)  # the snapshots the fork and the restore started are written
os.write(int(sys.argv[3]), b"done\\n")
time.sleep(60)
"""


@pytest.mark.parametrize("killed", [False, True], ids=["closed", "killed"])
@pytest.mark.parametrize("language", ["python", "bash"])
def test_a_fork_and_a_restore_come_back_after_a_restart(tmp_path: Path, language: str,
                                                        killed: bool) -> None:
    root = tmp_path / "home"
    py = language == "python"
    if killed:
        run_then_kill(KILLED, str(root), language)
    else:
        with Executor(root=root, persist=True) as ex:
            exec(STEPS, {"ex": ex, "language": language, "py": py})
    show = "print(rows)" if py else 'echo "$rows"'
    with Executor(root=root, persist=True) as ex:
        trial = ex.execute_code(show, language=language, state_mode="stateful",
                                session_name="trial")
        src = ex.execute_code(show, language=language, state_mode="stateful",
                              session_name="src")
        assert trial["stdout"] == ("[1, 2]\n" if py else "12\n"), trial
        assert src["stdout"] == ("[1, 3]\n" if py else "13\n"), src
        assert len(ex.list_checkpoints(language=language,
                                       session_name="src")["checkpoints"]) == 1


@pytest.mark.parametrize("language", ["python", "bash"])
def test_a_checkpoint_over_persist_max_bytes_is_a_capacity_error_naming_the_bound(
        tmp_path: Path, language: str) -> None:
    """SPEC 4: the error names what to change (it read ``execution``, with persistence's
    words, and sent the caller to free disk space)."""
    big = "x = bytes(10**6)" if language == "python" else "x=$(head -c 100000 /dev/zero | tr '\\0' a)"
    bound = 1000 if language == "python" else 50_000  # (a shell's dump holds its functions)
    with Executor(root=tmp_path, persist_max_bytes=bound) as ex:
        ex.execute_code(big, language=language, state_mode="stateful", session_name="a")
        r = ex.checkpoint_session(session_name="a", language=language)
        assert r["error_type"] == "capacity", r
        assert f"persist_max_bytes={bound}" in r["error"] and "persist_max_bytes" in r["suggestion"]
        assert "replaying" not in r["error"] and "disk" not in r["suggestion"]
        assert ex.list_checkpoints(session_name="a", language=language)["checkpoints"] == []
        ex.execute_code("y = 1" if language == "python" else "y=1", language=language,
                        state_mode="stateful", session_name="a")
        small = ex.execute_code("x = None" if language == "python" else "x=", language=language,
                                state_mode="stateful", session_name="a")
        assert "error" not in small
        assert "checkpoint" in ex.checkpoint_session(session_name="a", language=language)
