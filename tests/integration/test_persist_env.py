"""Sessions of a dedicated environment outlive their worker (SPEC 12), with a real uv
build (offline, a tiny local wheel): the worker loads the pickler by path for the
snapshot and the restore only, and the environment's own imports never see it."""

from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path

import pytest

from coordex import Executor
from tests.conftest import assert_no_new_children, child_pids, run_then_kill
from tests.fakes.wheels import ledgerlib_wheel, requirement

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _ok(result: dict) -> dict:
    assert "error_type" not in result, result
    return result


BUILD = textwrap.dedent("""
    import ledgerlib
    class Account:
        def __init__(self, owner):
            self.owner = owner
            self.entries = []
        def balance(self):
            return ledgerlib.total(self.entries)
    acct = Account('ada')
    acct.entries += [5, 7]
    payload = bytearray(b'x' * 3_000_000)
""")

PROBE = textwrap.dedent("""
    import importlib.util, sys
    (acct.balance(), acct.owner, len(payload), importlib.util.find_spec('cloudpickle'),
     'cloudpickle' in sys.modules, any('site-packages' in p and 'coordex' in p for p in sys.path))
""")


def test_an_environment_session_comes_back_in_a_new_executor(tmp_path: Path) -> None:
    os.environ.setdefault("UV_OFFLINE", "1")
    root = tmp_path / "home"
    wheel = ledgerlib_wheel(tmp_path / "wheels", "1.0")
    before = child_pids()
    with Executor(root=root, persist=True) as ex:
        venv = ex.environments.create(requirement("ledgerlib", wheel))["venv_id"]
        _ok(ex.execute_code(BUILD, state_mode="stateful", venv_id=venv, session_name="books"))
        _ok(ex.execute_code(f"acct.entries.append(30)\nimport os\nos.chdir({str(tmp_path)!r})",
                            state_mode="stateful", venv_id=venv, session_name="books"))
    with Executor(root=root, persist=True) as ex:
        kept = [s for s in ex.list_sessions()["sessions"] if s.get("held") is False]
        assert [(s["venv_id"], s["session_name"]) for s in kept] == [(venv, "books")]
        r = _ok(ex.execute_code(PROBE, state_mode="stateful", venv_id=venv,
                                session_name="books"))
        where = _ok(ex.execute_code("os.getcwd()", state_mode="stateful", venv_id=venv,
                                    session_name="books"))
    assert where["result"] == repr(str(tmp_path))  # its working folder too
    # The class the session defined came back by value; the environment has no
    # cloudpickle of its own and still has none, nor coordex's packages on its path.
    assert r["result"] == "(42, 'ada', 3000000, None, False, False)"
    assert r["restored"]["from"] == "snapshot" and r["restored"]["left_out"] == []
    assert_no_new_children(before)


CHILD = textwrap.dedent("""
    import json, os, sys, time
    from coordex import Executor
    root, venv, report = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    ex = Executor(root=root, persist=True, snapshot_interval=0.0)
    def run(code):
        r = ex.execute_code(code, state_mode="stateful", venv_id=venv, session_name="books")
        assert "error_type" not in r, r
    run("n = 1\\ndef bump(v):\\n    return v + 1")
    meta = os.path.join(root, "snapshots", os.listdir(os.path.join(root, "snapshots"))[0],
                        "meta.json")
    deadline = time.time() + 60
    while not json.load(open(meta)).get("file") and time.time() < deadline:
        time.sleep(0.02)
    run("n = bump(n)")
    run("n = bump(n)")
    os.write(report, b"done\\n")
    time.sleep(600)
""")


def test_after_a_sigkill_an_environment_session_is_its_snapshot_plus_its_later_calls(
        tmp_path: Path) -> None:
    os.environ.setdefault("UV_OFFLINE", "1")
    root = tmp_path / "home"
    with Executor(root=root) as ex:
        venv = ex.environments.create("", name="bare")["venv_id"]
        assert ex.environments.build(venv).get("built") is True
    before = child_pids()
    run_then_kill(CHILD, str(root), str(venv))
    time.sleep(0.5)
    with Executor(root=root, persist=True) as ex:
        r = _ok(ex.execute_code("(n, bump(n))", state_mode="stateful", venv_id=venv,
                                session_name="books"))
    assert r["result"] == "(3, 4)"
    assert r["restored"]["from"] == "snapshot+replay" and r["restored"]["replayed"] == 2
    meta = json.loads(next((root / "snapshots").glob("*/meta.json")).read_text())
    assert meta["file"].startswith("state-") and meta["problem"] is None
    assert_no_new_children(before)
