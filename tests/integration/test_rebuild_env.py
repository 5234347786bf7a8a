"""Rebuilding sessions in a dedicated environment (a real uv build with no requirements,
offline): after the worker is killed with SIGKILL, and after close_session."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordex import Executor

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def env_ex(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Executor, int]]:
    os.environ.setdefault("UV_OFFLINE", "1")
    with Executor(root=tmp_path_factory.mktemp("home"), timeout=30) as ex:
        venv = ex.environments.create("", name="bare")["venv_id"]
        assert ex.environments.build(venv).get("built") is True
        yield ex, venv


def _pid(ex: Executor, venv: int, name: str) -> int:
    r = ex.execute_code("import os\nos.getpid()", state_mode="stateful", session_name=name,
                        venv_id=venv)
    return int(r["result"])


def _wait_dead(pid: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return
        except FileNotFoundError:
            return
        time.sleep(0.02)


@pytest.mark.parametrize("probe_first", [False, True])
def test_rebuild_after_the_worker_was_killed(env_ex: tuple[Executor, int], probe_first: bool) -> None:
    ex, venv = env_ex
    name = f"killed-{probe_first}"
    ex.execute_code("totals = {'a': 1}", state_mode="stateful", session_name=name, venv_id=venv)
    ex.execute_code("totals['b'] = 2", state_mode="stateful", session_name=name, venv_id=venv)
    ex.execute_code("totals['c'] = 3", state_mode="read_only", session_name=name, venv_id=venv)
    pid = _pid(ex, venv, name)
    os.kill(pid, signal.SIGKILL)
    _wait_dead(pid)
    if probe_first:  # the next call finds the process dead and says so
        lost = ex.execute_code("totals", state_mode="stateful", session_name=name, venv_id=venv)
        assert lost["state_lost"] is True and "rebuild_session(" in lost["suggestion"]
    rebuilt = ex.rebuild_session(session_name=name, venv_id=venv)
    assert rebuilt["failed_at"] is None and rebuilt["replayed"] == 3, rebuilt
    assert rebuilt["session"]["venv_id"] == venv
    r = ex.execute_code("sorted(totals.items()), os.getpid()", state_mode="stateful",
                        session_name=name, venv_id=venv)
    assert r["result"].startswith("([('a', 1), ('b', 2)], ") and str(pid) not in r["result"]


def test_rebuild_after_close_in_an_environment(env_ex: tuple[Executor, int]) -> None:
    ex, venv = env_ex
    ex.execute_code("import sys\nprefix = sys.prefix", state_mode="stateful",
                    session_name="closed", venv_id=venv)
    ex.execute_code("export STEP=1", language="bash", state_mode="stateful",
                    session_name="closed", venv_id=venv)
    ex.close_session(session_name="closed", venv_id=venv)
    ex.close_session(language="bash", session_name="closed", venv_id=venv)
    assert ex.rebuild_session(session_name="closed", venv_id=venv)["replayed"] == 1
    assert ex.rebuild_session(language="bash", session_name="closed",
                              venv_id=venv)["replayed"] == 1
    r = ex.execute_code("prefix == sys.prefix != sys.base_prefix", state_mode="stateful",
                        session_name="closed", venv_id=venv)
    assert r["result"] == "True"
    r = ex.execute_code("echo $STEP", language="bash", state_mode="stateful",
                        session_name="closed", venv_id=venv)
    assert r["stdout"] == "1\n"
    # The session of the same name in the own interpreter was never logged.
    assert ex.rebuild_session(session_name="closed")["error_type"] == "not_found"


def test_a_crashed_call_names_rebuild_session(env_ex: tuple[Executor, int], tmp_path: Path) -> None:
    ex, venv = env_ex
    ex.execute_code("kept = 5", state_mode="stateful", session_name="crash", venv_id=venv)
    r = ex.execute_code("import os; os.kill(os.getpid(), 9)", state_mode="stateful",
                        session_name="crash", venv_id=venv)
    assert r["error_type"] == "crashed" and "rebuild_session(" in r["suggestion"]
    rebuilt = ex.rebuild_session(session_name="crash", venv_id=venv)
    assert rebuilt["replayed"] == 1, rebuilt
    r = ex.execute_code("kept", state_mode="stateful", session_name="crash", venv_id=venv)
    assert r["result"] == "5"


def test_the_log_keeps_what_a_read_only_copy_changed(env_ex: tuple[Executor, int],
                                                    tmp_path: Path) -> None:
    ex, venv = env_ex
    ex.execute_code("a = 1\nb = 2", state_mode="stateful", session_name="look", venv_id=venv)
    ex.execute_code("a = 5\ndel b\nc = 3", state_mode="read_only", session_name="look",
                    venv_id=venv)
    rows = ex._call_log.query("SELECT changed FROM calls WHERE state_mode = 'read_only' "
                              "AND session_name = 'look'")
    assert json.loads(rows[-1]["changed"]) == {"rebound": ["a", "c"], "deleted": ["b"]}
    ex.execute_code(f"import os; os.chdir({str(tmp_path)!r})", state_mode="stateful",
                    session_name="look", venv_id=venv)
    r = ex.execute_code("open('made.txt', 'w').write('x')", state_mode="read_only",
                        session_name="look", venv_id=venv)
    if r["isolation"]["files"] == "discarded":
        rows = ex._call_log.query("SELECT changed FROM calls WHERE state_mode = 'read_only' "
                                  "AND session_name = 'look'")
        assert json.loads(rows[-1]["changed"])["written"] == [str(tmp_path / "made.txt")]
        assert not (tmp_path / "made.txt").exists()
    held = {n["name"] for n in ex.inspect_session(session_name="look", venv_id=venv)["names"]}
    assert held == {"a", "b", "os"}  # the copies changed none of them


def test_the_log_keeps_the_files_an_environments_bash_copy_wrote(
        env_ex: tuple[Executor, int], tmp_path: Path) -> None:
    ex, venv = env_ex
    ex.execute_code(f"cd {str(tmp_path)!r}", language="bash", state_mode="stateful",
                    session_name="look", venv_id=venv)
    r = ex.execute_code("echo x > made.txt; mkdir out", language="bash",
                        state_mode="read_only", session_name="look", venv_id=venv)
    seq = ex.history(language="bash", session_name="look", venv_id=venv)["calls"][-1]["seq"]
    row = ex._call_log.query("SELECT changed FROM calls WHERE seq = ?", [seq])[0]
    if r["isolation"]["files"] != "discarded":
        assert row["changed"] is None
        pytest.skip("writes are refused here, not discarded: nothing is written to list")
    assert json.loads(row["changed"])["written"] == [str(tmp_path / "made.txt"),
                                                     str(tmp_path / "out")]
    assert os.listdir(tmp_path) == []
