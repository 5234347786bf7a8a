"""SPEC promises checked through the public Executor API, one test per promise."""

from __future__ import annotations

import json
import time

import pytest

from coordex import Executor
from coordex.backends import isolation

pytestmark = pytest.mark.timeout(60)



def test_name_and_id_address_the_same_session(ex):
    r = ex.execute_code("v = 'named'", state_mode="stateful", session_name="a")
    sid = r["session"]["session_id"]
    assert sid == 1
    assert ex.execute_code("v", state_mode="stateful", session_id=sid)["result"] == "'named'"
    r = ex.execute_code("w = 1", state_mode="stateful", session_id=5)
    assert r["session"] == {"language": "python", "venv_id": None, "session_id": 5, "session_name": None}
    assert ex.execute_code("w", state_mode="read_only", session_id=5)["result"] == "1"
    assert ex.execute_code("1", state_mode="stateful", session_name="b")["session"]["session_id"] == 2


def test_bash_session_zero_does_not_exist_until_first_stateful_call(ex):
    r = ex.execute_code("echo hi", language="bash", state_mode="read_only", session_id=0)
    assert r["error_type"] == "not_found"
    r = ex.inspect_session(language="bash")
    assert r["error_type"] == "not_found"
    r = ex.execute_code("X=1", language="bash", state_mode="stateful")
    assert r["session"] == {"language": "bash", "venv_id": None, "session_id": 0, "session_name": None}
    keys = {(s["language"], s["session_id"]) for s in ex.list_sessions()["sessions"]}
    assert keys == {("python", 0), ("bash", 0)}


def test_inspect_bash_session_through_executor(ex, tmp_path):
    ex.execute_code(f"cd {tmp_path}; mine=1; export exp=2; greet() {{ :; }}; alias ll='ls -l'",
                    language="bash", state_mode="stateful", session_name="sh")
    r = ex.inspect_session(language="bash", session_name="sh")
    assert r["cwd"] == str(tmp_path)
    assert r["variables"] == {"mine": "1", "exp": "2"}
    assert r["functions"] == ["greet"] and r["aliases"] == {"ll": "ls -l"}
    assert ex.inspect_session(language="bash", session_name="sh") == r


def test_list_sessions_entries_carry_every_key(ex):
    t0 = time.time()
    ex.execute_code("1", state_mode="stateful", session_name="s")
    ex.execute_code("2", state_mode="stateful", session_name="s")
    ex.inspect_session(session_name="s")
    [s] = [s for s in ex.list_sessions()["sessions"] if s["session_name"] == "s"]
    assert set(s) >= {"language", "venv_id", "session_id", "session_name", "created_at",
                      "last_used_at", "calls", "alive"}
    assert s["calls"] == 2 and s["alive"] is True
    assert t0 - 1 <= s["created_at"] <= s["last_used_at"] <= time.time() + 1


def test_capacity_counts_bash_sessions(root):
    with Executor(root=root, max_sessions=2) as small:
        assert "exit_code" in small.execute_code("true", language="bash", state_mode="stateful")
        r = small.execute_code("1", state_mode="stateful", session_name="more")
        assert r["error_type"] == "capacity" and len(r["sessions"]) == 2
        r = small.execute_code("true", language="bash", state_mode="stateful", session_name="x")
        assert r["error_type"] == "capacity"


def test_duration_ms_is_milliseconds(ex):
    r = ex.execute_code("import time; time.sleep(0.3)")
    assert isinstance(r["duration_ms"], float) and 300 <= r["duration_ms"] < 5000
    r = ex.execute_code("sleep 0.3", language="bash")
    assert 300 <= r["duration_ms"] < 5000


def test_default_output_limit_is_64k_per_stream(ex, tmp_path):
    ex.spill_folder = tmp_path / "out"
    r = ex.execute_code("print('a' * 200_000)")
    assert r["truncated"] is True
    assert 60_000 <= len(r["stdout"]) <= 70_000
    assert r["stdout"].startswith("a" * 100) and r["stdout"].endswith("a" * 100 + "\n")
    # Two full streams share one result's budget (SPEC 14), each keeping head and tail.
    r = ex.execute_code("import sys\nprint('a' * 200_000)\nprint('b' * 200_000, file=sys.stderr)")
    assert r["truncated"] is True and set(r["spilled"]) == {"stdout", "stderr"}
    for stream, ch in (("stdout", "a"), ("stderr", "b")):
        assert 30_000 <= len(r[stream]) <= 40_000
        assert r[stream].startswith(ch * 100) and r[stream].endswith(ch * 100 + "\n")


def test_execution_error_carries_stdout_stderr_exception(ex):
    r = ex.execute_code("import sys\nprint('o')\nprint('e', file=sys.stderr)\nraise KeyError('k')")
    assert r["error_type"] == "execution" and r["exception"] == "KeyError"
    assert r["stdout"] == "o\n" and r["stderr"] == "e\n" and "KeyError" in r["traceback"]


@pytest.mark.parametrize("code", ["import sys; sys.exit(3)", "raise SystemExit", "exit()"])
def test_system_exit_is_strictly_an_execution_error(ex, code):
    for kw in ({}, {"state_mode": "stateful"}):
        r = ex.execute_code(code, **kw)
        assert r["error_type"] == "execution" and r["exception"] == "SystemExit"


def test_bash_exit_through_executor_loses_state_and_is_not_an_error(ex):
    ex.execute_code("kept=1", language="bash", state_mode="stateful", session_name="s")
    r = ex.execute_code("echo bye; exit 3", language="bash", state_mode="stateful", session_name="s")
    assert "error_type" not in r
    assert r["exit_code"] == 3 and r["state_lost"] is True and r["stdout"] == "bye\n"
    r = ex.execute_code('echo "k=$kept"', language="bash", state_mode="stateful", session_name="s")
    assert r["stdout"] == "k=\n"


def test_bash_killed_by_signal_through_executor_is_crashed(ex):
    ex.execute_code("true", language="bash", state_mode="stateful", session_name="s")
    r = ex.execute_code("kill -9 $$", language="bash", state_mode="stateful", session_name="s")
    assert r["error_type"] == "crashed" and r["state_lost"] is True
    r = ex.execute_code("echo ok", language="bash", state_mode="stateful", session_name="s")
    assert r["stdout"] == "ok\n"


@pytest.mark.parametrize("kwargs", [
    {"code": None}, {"code": 3}, {"code": "1", "language": "ruby"},
    {"code": "1", "state_mode": "readonly"}, {"code": "1", "session_id": "1", "state_mode": "stateful"},
    {"code": "1", "venv_id": "x"}, {"code": "1", "timeout": -1},
])
def test_bad_arguments_are_validation_errors_specifically(ex, kwargs):
    r = ex.execute_code(**kwargs)
    assert r["error_type"] == "validation" and r["suggestion"]


def test_inspect_and_close_bad_arguments_are_validation(ex):
    for m in (ex.inspect_session, ex.close_session):
        assert m(language="ruby")["error_type"] == "validation"
        assert m(session_id=1, session_name="a")["error_type"] == "validation"
    assert ex.close_session(language="bash")["error_type"] == "validation"


def test_timeout_error_keeps_partial_output(ex):
    r = ex.execute_code("import sys, time\nprint('so far', flush=True)\n"
                        "print('err', file=sys.stderr, flush=True)\n"
                        "while True: time.sleep(0.01)", timeout=0.5, state_mode="stateful", session_name="t")
    assert r["error_type"] == "timeout"
    assert r["stdout"] == "so far\n" and r["stderr"] == "err\n" and r["state_lost"] is False


def test_tool_definitions_method_on_executor(ex):
    for fmt in ("openai", "anthropic", "mcp"):
        defs = ex.tool_definitions(format=fmt)
        assert isinstance(defs, list)
        json.dumps(defs)
    names = [d["name"] for d in ex.tool_definitions(format="anthropic")]
    assert {"execute_code", "list_sessions", "inspect_session", "close_session"} <= set(names)
    assert ex.tool_definitions(format="xml")["error_type"] == "validation"


def test_coordex_home_is_the_default_root(tmp_path, monkeypatch):
    monkeypatch.setenv("COORDEX_HOME", str(tmp_path / "h"))
    with Executor() as e:
        e.functions.define(source="def f():\n    return 1\n")
        assert e.root == tmp_path / "h"
    assert (tmp_path / "h" / "library.sqlite3").exists()


def test_stateless_result_session_block(ex):
    r = ex.execute_code("1")
    assert r["session"] == {"language": "python", "venv_id": None, "session_id": None, "session_name": None}
    assert r["state_mode"] == "stateless"
    r = ex.execute_code("echo", language="bash")
    assert r["session"]["language"] == "bash" and r["session"]["session_id"] is None


@pytest.mark.parametrize("language", ["python", "bash"])
def test_default_read_only_protects_the_session_cwd(ex, tmp_path, language):
    if isolation.best_mode() == "none":
        pytest.skip("no file isolation on this machine")
    (tmp_path / "keep.txt").write_text("keep")
    enter = f"cd {tmp_path}" if language == "bash" else f"import os; os.chdir({str(tmp_path)!r})"
    ex.execute_code(enter, language=language, state_mode="stateful", session_name="s")
    write = ("echo x > new.txt; echo changed > keep.txt" if language == "bash"
             else "open('new.txt','w').write('x'); open('keep.txt','w').write('changed')")
    r = ex.execute_code(write, language=language, state_mode="read_only", session_name="s")
    assert r["isolation"]["files"] in ("discarded", "refused"), r
    assert not (tmp_path / "new.txt").exists() and (tmp_path / "keep.txt").read_text() == "keep"
