"""Python in the agent's own interpreter, through the public Executor API."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from coordex import Executor

pytestmark = pytest.mark.timeout(60)


def test_session_zero_is_the_plan_namespace(ex: Executor) -> None:
    ex.plan_namespace["ledger"] = [1, 2, 3]
    r = ex.execute_code("total = sum(ledger)\ntotal", state_mode="stateful")
    assert r["result"] == "6"
    assert r["session"] == {"language": "python", "venv_id": None, "session_id": 0,
                            "session_name": None}
    assert ex.plan_namespace["total"] == 6


def test_named_sessions_are_separate_namespaces(ex: Executor) -> None:
    ex.execute_code("x = 'plan'", state_mode="stateful")
    ex.execute_code("x = 'audit'", state_mode="stateful", session_name="audit")
    assert ex.execute_code("x", state_mode="stateful", session_name="audit")["result"] == "'audit'"
    assert ex.execute_code("x", state_mode="stateful")["result"] == "'plan'"
    r = ex.execute_code("x", state_mode="stateless")
    assert r["error_type"] == "execution" and r["exception"] == "NameError"


def test_result_follows_ipython_rules(ex: Executor) -> None:
    assert ex.execute_code("1 + 1")["result"] == "2"
    assert ex.execute_code("1 + 1;")["result"] is None
    assert ex.execute_code("None")["result"] is None
    assert ex.execute_code("x = 3")["result"] is None
    assert ex.execute_code("'a' * 10")["result"] == repr("a" * 10)


def test_long_result_is_shortened_in_the_middle(root: Path) -> None:
    with Executor(root=root, output_limit=1000) as small:
        r = small.execute_code("list(range(100000))")
        assert r["result"].startswith("[0, 1, 2") and r["result"].endswith("99999]")
        assert len(r["result"]) < 1200


def test_print_stderr_and_child_process_output_are_captured(ex: Executor) -> None:
    r = ex.execute_code(
        "import sys, os, subprocess\n"
        "print('out')\n"
        "print('err', file=sys.stderr)\n"
        "os.write(1, b'fd1\\n')\n"
        "subprocess.run(['sh', '-c', 'echo child; echo childerr >&2'])\n")
    assert r["stdout"] == "out\nfd1\nchild\n"
    assert r["stderr"] == "err\nchilderr\n"
    assert r["truncated"] is False and r["exit_code"] is None


def test_huge_output_is_truncated_keeping_head_and_tail(root: Path) -> None:
    with Executor(root=root, output_limit=2000) as small:
        r = small.execute_code("for i in range(200000): print(i)")
        assert r["truncated"] is True
        assert r["stdout"].startswith("0\n1\n") and r["stdout"].endswith("199999\n")
        assert len(r["stdout"]) < 2200


def test_exceptions_become_execution_errors_and_the_session_survives(ex: Executor) -> None:
    ex.execute_code("keep = 41", state_mode="stateful", session_name="s")
    r = ex.execute_code("print('before')\nraise ValueError('bad value')",
                        state_mode="stateful", session_name="s")
    assert r["error_type"] == "execution"
    assert r["exception"] == "ValueError"
    assert "bad value" in r["error"]
    assert "ValueError: bad value" in r["traceback"]
    assert "_coordex_engine" not in r["traceback"]
    assert r["stdout"] == "before\n"
    assert r["suggestion"]
    assert ex.execute_code("keep + 1", state_mode="stateful", session_name="s")["result"] == "42"


@pytest.mark.parametrize(("code", "exception"), [
    ("def f(:\n  pass", "SyntaxError"),
    ("import sys; sys.exit(3)", "SystemExit"),
    ("raise SystemExit", "SystemExit"),
    ("exit()", "SystemExit"),
    ("raise KeyboardInterrupt", "KeyboardInterrupt"),
])
def test_syntax_error_and_exits_never_end_the_host(ex: Executor, code: str, exception: str) -> None:
    r = ex.execute_code(code, state_mode="stateful")
    assert r["error_type"] in ("execution", "timeout")
    if r["error_type"] == "execution":
        assert r["exception"] == exception
    assert ex.execute_code("'alive'")["result"] == "'alive'"


def test_input_raises_eof_and_children_read_eof(ex: Executor) -> None:
    r = ex.execute_code("input('name? ')")
    assert r["exception"] == "EOFError"
    r = ex.execute_code("import subprocess\nsubprocess.run(['cat'], capture_output=True, timeout=5).stdout")
    assert r["result"] == "b''"


def test_timeout_interrupts_and_keeps_state(ex: Executor) -> None:
    ex.execute_code("count = 0", state_mode="stateful", session_name="t")
    started = time.monotonic()
    r = ex.execute_code("while True:\n    count += 1", state_mode="stateful",
                        session_name="t", timeout=0.5)
    assert time.monotonic() - started < 3
    assert r["error_type"] == "timeout" and r["state_lost"] is False
    assert "state kept" in r["suggestion"]
    r = ex.execute_code("count > 0", state_mode="stateful", session_name="t")
    assert r["result"] == "True"


def test_code_stuck_outside_bytecode_never_hangs_the_caller(ex: Executor) -> None:
    started = time.monotonic()
    r = ex.execute_code("import time; time.sleep(4)", state_mode="stateful",
                        session_name="stuck", timeout=0.3)
    assert r["error_type"] == "timeout" and r["state_lost"] is False
    assert "still busy" in r["suggestion"]
    assert time.monotonic() - started < 3.5
    again = ex.execute_code("1", state_mode="stateful", session_name="stuck")
    assert again["error_type"] == "timeout" and "still busy" in again["error"]
    assert time.monotonic() - started < 3.8
    assert ex.execute_code("2", state_mode="stateful", session_name="other")["result"] == "2"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        r = ex.execute_code("'done'", state_mode="stateful", session_name="stuck")
        if "result" in r:
            break
        time.sleep(0.2)
    assert r["result"] == "'done'"


def test_read_only_copy_is_deep_and_names_cannot_be_rebound(ex: Executor) -> None:
    ex.execute_code("rows = [{'n': i} for i in range(5)]\nflag = 'orig'",
                    state_mode="stateful", session_name="audit")
    r = ex.execute_code("rows.append({'n': 99}); rows[0]['n'] = -1; flag = 'changed'\n"
                        "import os\nos.chdir('/')\nlen(rows)",
                        state_mode="read_only", session_name="audit")
    assert r["result"] == "6"
    assert r["isolation"]["names"] is True and r["isolation"]["objects"] is True
    assert r["isolation"]["files"] in ("discarded", "refused", "none")
    after = ex.execute_code("len(rows), rows[0]['n'], flag", state_mode="stateful",
                            session_name="audit")
    assert after["result"] == "(5, 0, 'orig')"


def test_read_only_reports_isolation_on_errors_and_timeouts(ex: Executor) -> None:
    ex.execute_code("x = 1", state_mode="stateful", session_name="ro")
    r = ex.execute_code("1/0", state_mode="read_only", session_name="ro")
    assert r["error_type"] == "execution" and r["isolation"]["objects"] is True
    r = ex.execute_code("import time; time.sleep(30)", state_mode="read_only",
                        session_name="ro", timeout=0.5)
    assert r["error_type"] == "timeout" and r["state_lost"] is False
    assert "isolation" in r
    r = ex.execute_code("import os; os._exit(3)", state_mode="read_only", session_name="ro")
    assert r["error_type"] == "crashed"
    assert ex.execute_code("x", state_mode="stateful", session_name="ro")["result"] == "1"


def test_read_only_needs_an_existing_session(ex: Executor) -> None:
    r = ex.execute_code("1", state_mode="read_only", session_name="nope")
    assert r["error_type"] == "not_found"
    assert "state_mode='stateful'" in r["suggestion"]


def test_read_only_in_a_host_with_busy_threads(ex: Executor) -> None:
    """The fork copies only the calling thread; other threads' locks must not hang it."""
    held = threading.Lock()
    stop = threading.Event()
    ex.plan_namespace["held"] = held

    def chatter() -> None:
        with held:
            while not stop.is_set():
                os.write(2, b"")
                time.sleep(0.001)

    thread = threading.Thread(target=chatter, daemon=True)
    thread.start()
    try:
        ex.execute_code("data = list(range(10))", state_mode="stateful")
        for _ in range(5):
            r = ex.execute_code("data.clear(); print('in copy'); len(data)",
                                state_mode="read_only", session_id=0)
            assert r["result"] == "0" and r["stdout"] == "in copy\n"
        # A lock held by another thread at fork time stays held in the copy: the copy is
        # stopped at the timeout and the session is unaffected.
        r = ex.execute_code("held.acquire()", state_mode="read_only", session_id=0,
                            timeout=0.5)
        assert r["error_type"] == "timeout"
    finally:
        stop.set()
        thread.join()
    assert ex.execute_code("len(data)", state_mode="stateful")["result"] == "10"


def test_cwd_and_environment_are_kept_per_session(ex: Executor, tmp_path: Path) -> None:
    host_cwd = os.getcwd()
    ex.execute_code(f"import os; os.chdir({str(tmp_path)!r}); os.environ['COORDEX_T'] = 'a'",
                    state_mode="stateful", session_name="a")
    assert os.getcwd() == host_cwd and "COORDEX_T" not in os.environ
    r = ex.execute_code("import os; os.getcwd(), os.environ.get('COORDEX_T')",
                        state_mode="stateful", session_name="a")
    assert r["result"] == repr((str(tmp_path), "a"))
    r = ex.execute_code("import os; os.environ.get('COORDEX_T')", state_mode="stateful",
                        session_name="b")
    assert r["result"] is None


def test_cwd_moves_of_the_host_and_of_code_threads_are_seen(ex: Executor,
                                                             tmp_path: Path) -> None:
    """The cwd is read again only after an os.chdir: one by the host between calls,
    or by a thread the code left running, must still be noticed."""
    host_cwd = os.getcwd()
    first, second = tmp_path / "one", tmp_path / "two"
    first.mkdir()
    second.mkdir()
    ex.execute_code("import os; os.getcwd()", state_mode="stateful", session_name="c")
    try:
        os.chdir(first)  # the host moves between calls: a new session starts there
        r = ex.execute_code("import os; os.getcwd()", state_mode="stateful", session_name="d")
        assert r["result"] == repr(str(first))
        assert os.getcwd() == str(first)
        r = ex.execute_code("import os; os.getcwd()", state_mode="stateful", session_name="c")
        assert r["result"] == repr(host_cwd) and os.getcwd() == str(first)
        # A thread of the code moves the process after its call returned: the session
        # that next runs finds the process where the thread left it, and the host gets
        # its own cwd back after that call.
        code = (f"import os, threading, time\n"
                f"def later():\n    time.sleep(0.2)\n    os.chdir({str(second)!r})\n"
                f"t = threading.Thread(target=later); t.start()")
        ex.execute_code(code, state_mode="stateful", session_name="e")
        import time

        time.sleep(0.5)
        assert os.getcwd() == str(second)
        os.chdir(first)
        r = ex.execute_code("import os; os.getcwd()", state_mode="stateful", session_name="d")
        assert r["result"] == repr(str(first)) and os.getcwd() == str(first)
    finally:
        os.chdir(host_cwd)


def test_capabilities_are_globals_in_every_session(ex: Executor) -> None:
    @ex.capability
    def lookup(key: str) -> str:
        return key.upper()

    ex.capability(lambda: 7, name="seven")
    assert ex.execute_code("lookup('a')", state_mode="stateful")["result"] == "'A'"
    assert ex.execute_code("lookup('b')", state_mode="stateful", session_name="n")["result"] == "'B'"
    assert ex.execute_code("seven()")["result"] == "7"
    inspected = ex.inspect_session()
    assert "lookup" not in [n["name"] for n in inspected["names"]]
    assert inspected["capabilities"] == ["lookup", "seven"]


def test_open_matplotlib_figure_comes_back_as_png(ex: Executor) -> None:
    pytest.importorskip("matplotlib")
    r = ex.execute_code("import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
                        "plt.plot([1, 2, 3])")
    assert len(r["images"]) == 1
    assert r["images"][0]["mime"] == "image/png"
    import base64

    assert base64.b64decode(r["images"][0]["data"]).startswith(b"\x89PNG")
    assert ex.execute_code("1")["images"] == []


def test_on_output_streams_before_the_call_returns(ex: Executor) -> None:
    seen: list[tuple[str, str, float]] = []
    started = time.monotonic()
    r = ex.execute_code("import sys, time\nprint('first', flush=True)\ntime.sleep(0.5)\n"
                        "print('second', file=sys.stderr)",
                        on_output=lambda s, t: seen.append((s, t, time.monotonic())))
    assert r["stdout"] == "first\n"
    assert seen[0][0] == "stdout" and seen[0][2] - started < 0.4
    assert "".join(t for s, t, _ in seen if s == "stdout") == "first\n"
    assert "".join(t for s, t, _ in seen if s == "stderr") == "second\n"


def test_child_process_output_streams_while_it_runs(ex: Executor) -> None:
    seen: list[tuple[str, float]] = []
    started = time.monotonic()
    r = ex.execute_code("import subprocess\n"
                        "subprocess.run(['sh', '-c', 'echo early; sleep 0.6; echo late >&2'])",
                        on_output=lambda s, t: seen.append((t, time.monotonic() - started)))
    assert r["stdout"] == "early\n" and r["stderr"] == "late\n"
    early = next(at for text, at in seen if "early" in text)
    assert early < 0.5  # delivered before the child went on to sleep


def test_inspect_and_provenance(ex: Executor) -> None:
    ex.execute_code("a = 1\nb = 2", state_mode="stateful", session_name="p")
    ex.execute_code("b = 3", state_mode="stateful", session_name="p")
    ex.execute_code("c = [1]", state_mode="stateful", session_name="p")
    report = ex.inspect_session(session_name="p")
    names = {n["name"]: n for n in report["names"]}
    assert set(names) == {"a", "b", "c"}
    assert names["a"]["bound_at_call"] == 1 and names["a"]["calls_ago"] == 2
    assert names["b"]["bound_at_call"] == 2 and names["b"]["calls_ago"] == 1
    assert names["c"]["type"] == "list" and names["c"]["repr"] == "[1]"
    again = ex.inspect_session(session_name="p")
    assert again["names"] == report["names"]  # inspecting changes nothing


def test_sessions_list_close_and_the_plan_cannot_be_closed(ex: Executor) -> None:
    ex.execute_code("x = 1", state_mode="stateful", session_name="tmp")
    listed = ex.list_sessions()
    assert listed["max_sessions"] == 20
    keys = {(s["language"], s["session_id"], s["session_name"]) for s in listed["sessions"]}
    assert keys == {("python", 0, None), ("python", 1, "tmp")}
    assert ex.close_session()["error_type"] == "validation"
    assert ex.close_session(session_id=0)["error_type"] == "validation"
    assert ex.close_session(session_name="tmp")["closed"] is True
    assert ex.close_session(session_name="tmp")["error_type"] == "not_found"
    assert len(ex.list_sessions()["sessions"]) == 1


def test_capacity_is_enforced_across_languages(root: Path) -> None:
    with Executor(root=root, max_sessions=2) as small:
        assert "result" in small.execute_code("1", state_mode="stateful", session_name="one")
        r = small.execute_code("1", state_mode="stateful", session_name="two")
        assert r["error_type"] == "capacity" and len(r["sessions"]) == 2
        small.close_session(session_name="one")
        assert "result" in small.execute_code("1", state_mode="stateful", session_name="two")


def test_calls_to_one_session_are_serialised(ex: Executor) -> None:
    ex.execute_code("n = 0", state_mode="stateful", session_name="c")
    code = "for _ in range(2000):\n    v = n\n    n = v + 1"

    def work() -> None:
        ex.execute_code(code, state_mode="stateful", session_name="c")

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert ex.execute_code("n", state_mode="stateful", session_name="c")["result"] == "8000"


def test_closed_executor_returns_errors(root: Path) -> None:
    executor = Executor(root=root)
    executor.close()
    executor.close()
    assert executor.execute_code("1")["error_type"] == "validation"


def test_without_a_safe_fork_read_only_copies_the_values_into_a_new_process(
        ex: Executor, monkeypatch: pytest.MonkeyPatch) -> None:
    from coordex.backends.own import interpreter as own_interpreter

    monkeypatch.setattr(own_interpreter, "FORK_IS_SAFE", False)
    ex.execute_code("rows = [1]\nflag = 1", state_mode="stateful", session_name="a")
    r = ex.execute_code("rows.append(2); flag = 2; len(rows)", state_mode="read_only",
                        session_name="a")
    assert r["result"] == "2"
    assert r["isolation"]["copy"] == "values" and r["isolation"]["objects"] is True
    assert r["isolation"]["left_out"] == ["functions"]
    after = ex.execute_code("rows, flag", state_mode="stateful", session_name="a")
    assert after["result"] == "([1], 1)"  # neither the name nor the list changed


def test_pagers_never_take_over(ex: Executor) -> None:
    code = ("import subprocess\n"
            "subprocess.run(['sh', '-c', 'echo $PAGER $GIT_PAGER'], capture_output=True,"
            " text=True).stdout")
    for kwargs in ({}, {"state_mode": "stateful", "session_name": "p"}):
        assert ex.execute_code(code, **kwargs)["result"] == repr("cat cat\n")


def test_a_shortened_result_counts_as_truncated(root: Path) -> None:
    with Executor(root=root, output_limit=500) as small:
        r = small.execute_code("'y' * 10_000")
        assert r["truncated"] is True and len(r["result"]) < 700
        assert small.execute_code("'y' * 10")["truncated"] is False


def test_a_busy_session_still_reports_isolation_on_read_only(ex: Executor) -> None:
    ex.execute_code("import time; time.sleep(3)", state_mode="stateful", session_name="busy",
                    timeout=0.2)
    r = ex.execute_code("1", state_mode="read_only", session_name="busy")
    assert r["error_type"] == "timeout"
    assert r["isolation"] == {"names": True, "objects": True, "files": "none", "copy": "none"}


def test_stateless_errors_do_not_speak_of_a_session(ex: Executor) -> None:
    r = ex.execute_code("1/0")
    assert "session" not in r["suggestion"]
    r = ex.execute_code("while True: pass", timeout=0.3)
    assert r["error_type"] == "timeout" and "session" not in r["suggestion"]


def test_a_closed_executor_lists_nothing_and_closes_nothing(root: Path) -> None:
    executor = Executor(root=root)
    executor.execute_code("1", state_mode="stateful", session_name="x")
    executor.close()
    assert executor.list_sessions()["sessions"] == []
    assert executor.close_session(session_name="x")["error_type"] == "validation"


def test_a_session_that_cannot_start_is_not_left_reserved(
        ex: Executor, monkeypatch: pytest.MonkeyPatch) -> None:
    from coordex.backends import shell

    def cannot_start(self: object, **kwargs: object) -> None:
        raise OSError("no bash here")

    monkeypatch.setattr(shell.ShellSession, "__init__", cannot_start)
    r = ex.execute_code("echo", language="bash", state_mode="stateful", session_name="x")
    assert r["error_type"] == "crashed" and "no bash here" in r["error"]
    assert [s["language"] for s in ex.list_sessions()["sessions"]] == ["python"]


def test_environment_changes_between_and_during_calls_land_where_they_belong(
        ex: Executor) -> None:
    """os.environ is copied only after a change (counted): a host change between calls,
    a session's own change and a call that changes nothing each leave the host and the
    sessions as they were."""
    try:
        ex.execute_code("import os; os.environ['COORDEX_S'] = 's'", state_mode="stateful",
                        session_name="a")
        os.environ["COORDEX_H"] = "1"  # the host, between calls
        for _ in range(2):  # the second call changes nothing: the copies are reused
            r = ex.execute_code("import os; os.environ.get('COORDEX_S'), "
                                "os.environ.get('COORDEX_H')",
                                state_mode="stateful", session_name="a")
            assert r["result"] == "('s', None)", r
            assert os.environ.get("COORDEX_H") == "1" and "COORDEX_S" not in os.environ
        r = ex.execute_code("import os; del os.environ['COORDEX_H']; 1",
                            state_mode="stateful", session_name="b")
        assert os.environ.get("COORDEX_H") == "1", r  # the host's own is back
        os.environ["COORDEX_H"] = "2"
        r = ex.execute_code("import os; os.environ.get('COORDEX_H')", state_mode="stateful",
                            session_name="b")
        assert r["result"] is None and os.environ["COORDEX_H"] == "2", r
        r = ex.execute_code("import os; os.environ.get('COORDEX_H')")  # stateless: the host's
        assert r["result"] == "'2'", r
    finally:
        os.environ.pop("COORDEX_H", None)
