"""Real worker processes: semantics, state, read-only forks, faults, capabilities.

Every test drives ``coordex.backends.env.workers`` against real interpreters: the venv's
own Python, and (for the stdlib-only guarantee) a bare ``python -m venv --without-pip``
where coordex is not importable. Each session is closed in ``finally`` and the tests
check that no child process survives.
"""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import threading
import time
import venv
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coordex import sessions
from coordex.backends.base import INTERRUPT_GRACE, RunRequest
from coordex.backends.env import workers
from coordex.backends.env.workers import WorkerSession, WorkerStartError, WorkerTemplate
from coordex.core import facts
from tests.conftest import child_pids, cpu_seconds
from tests.said import said

pytestmark = pytest.mark.timeout(90)

FAKE_WORKER = Path(__file__).resolve().parent.parent / "fakes" / "fake_worker.py"


def req(code: str, timeout: float = 20.0, **kwargs: Any) -> RunRequest:
    return RunRequest(code=code, timeout=timeout, **kwargs)


@pytest.fixture(scope="session")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A plain venv without pip or coordex: the worker must run on the stdlib alone."""
    folder = tmp_path_factory.mktemp("bare-venv")
    venv.EnvBuilder(with_pip=False, symlinks=True).create(folder)
    python = folder / "bin" / "python"
    probe = subprocess.run([str(python), "-I", "-c", "import coordex"], capture_output=True)
    assert probe.returncode != 0, "coordex must not be importable in the bare venv"
    return str(python)


@pytest.fixture(params=["own-venv", "bare-venv"])
def python(request: pytest.FixtureRequest) -> str:
    if request.param == "own-venv":
        return sys.executable
    return str(request.getfixturevalue("bare_python"))


class Caps:
    """A CapabilityHost with a few host functions."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[Any], dict[str, Any]]] = []
        self.table: dict[str, Any] = {
            "add": lambda a, b: a + b,
            "echo": lambda *a, **k: {"args": a, "kwargs": k},
            "explode": self._explode,
            "give_object": lambda: object(),
        }

    @staticmethod
    def _explode() -> None:
        raise ValueError("host side broke")

    def names(self) -> list[str]:
        return sorted(self.table)

    def call(self, name: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        self.calls.append((name, args, kwargs))
        return self.table[name](*args, **kwargs)


@pytest.fixture
def session(python: str) -> Iterator[WorkerSession]:
    s = said(WorkerSession(python, capabilities=Caps()))
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def template(python: str) -> Iterator[WorkerTemplate]:
    t = said(WorkerTemplate(python, capabilities=Caps()))
    try:
        yield t
    finally:
        t.close()


# -- semantics ----------------------------------------------------------------------------


def test_last_expression_output_streams_and_errors(session: WorkerSession) -> None:
    assert session.run(req("1 + 1"))["result"] == "2"
    assert session.run(req("1 + 1;"))["result"] is None
    assert session.run(req("None"))["result"] is None
    chunks: list[tuple[str, str]] = []
    r = session.run(req(
        "import os, sys, subprocess\nprint('from print')\nos.write(1, b'from fd 1\\n')\n"
        "subprocess.run(['echo', 'from a child'])\nprint('oops', file=sys.stderr)\n"
        "os.write(2, b'fd 2\\n')",
        on_output=lambda stream, text: chunks.append((stream, text))))
    assert "error" not in r
    assert r["stdout"] == "from print\nfrom fd 1\nfrom a child\n"
    assert r["stderr"] == "oops\nfd 2\n"
    assert "".join(t for s, t in chunks if s == "stdout") == r["stdout"]
    assert r["exit_code"] is None and r["images"] == [] and r["truncated"] is False


def test_execution_error_keeps_earlier_names(session: WorkerSession) -> None:
    r = session.run(req("a = 1\nprint('before')\n1 / 0"))
    err = r["error"]
    assert err["error_type"] == "execution" and err["exception"] == "ZeroDivisionError"
    assert "ZeroDivisionError" in err["traceback"] and "line 3" in err["traceback"]
    assert "_coordex" not in err["traceback"]
    assert err["stdout"] == "before\n" and err["suggestion"]
    assert session.run(req("a"))["result"] == "1"


def test_syntax_error_and_system_exit_leave_the_worker_alive(session: WorkerSession) -> None:
    pid = session.pid
    r = session.run(req("def f(:\n  pass"))
    assert r["error"]["exception"] == "SyntaxError" and "compile" in r["error"]["suggestion"]
    for code in ("import sys; sys.exit(3)", "exit()", "raise SystemExit('bye')"):
        r = session.run(req(code))
        assert r["error"]["exception"] == "SystemExit", code
    assert session.pid == pid and session.alive()
    assert session.run(req("'alive'"))["result"] == "'alive'"


def test_stdin_is_closed_and_pagers_are_cat(session: WorkerSession) -> None:
    r = session.run(req("input('name? ')"))
    assert r["error"]["exception"] == "EOFError"
    r = session.run(req("import os, sys\n(os.environ['PAGER'], os.environ['MPLBACKEND'], "
                        "sys.stdin.read())"))
    assert r["result"] == "('cat', 'Agg', '')"


def test_state_persists_and_rebinding_is_reported(session: WorkerSession) -> None:
    r = session.run(req("x = [1]\ny = 2\nimport json"))
    assert sorted(r["rebound"]) == ["json", "x", "y"] and "deleted" not in r  # none: not said
    r = session.run(req("x.append(2)\ny = 3\ndel json"))
    assert r["rebound"] == ["y"] and r["deleted"] == ["json"]
    assert session.run(req("x, y"))["result"] == "([1, 2], 3)"
    names = {n["name"]: n for n in session.inspect()["names"]}
    assert set(names) == {"x", "y"}
    assert names["x"] == {"name": "x", "type": "list", "repr": "[1, 2]"}


def test_user_classes_pickle_through_main(session: WorkerSession) -> None:
    r = session.run(req("import pickle\nclass P:\n    pass\n"
                        "pickle.loads(pickle.dumps(P())).__class__.__name__"))
    assert r["result"] == "'P'"


# -- read-only ----------------------------------------------------------------------------


def test_read_only_sees_everything_and_changes_nothing(session: WorkerSession,
                                                        tmp_path: Path) -> None:
    path = tmp_path / "data.txt"
    path.write_text("line1\nline2\n")
    session.run(req(
        "import threading\nlock = threading.Lock()\ngen = (i * i for i in range(10))\n"
        f"fh = open({str(path)!r})\nrecords = [{{'n': i}} for i in range(1000)]\nx = 1"))
    r = session.run_read_only(req(
        "acquired = lock.acquire(timeout=1)\nfirst = next(gen)\nline = fh.readline()\n"
        "records.append('junk'); records[0]['n'] = -1; x = 2; del lock\n"
        "(acquired, first, line, len(records), x)"))
    assert r["result"] == "(True, 0, 'line1\\n', 1001, 2)"
    assert r["isolation"] == {"names": True, "objects": True, "files": "none", "copy": "fork"}
    after = session.run(req(
        "(lock.locked(), next(gen), len(records), records[0]['n'], x, 'acquired' in dir())"))
    assert after["result"] == "(False, 0, 1000, 0, 1, False)"


def test_read_only_errors_carry_isolation(session: WorkerSession) -> None:
    session.run(req("v = 1"))
    r = session.run_read_only(req("v = 5\nraise KeyError('k')"))
    assert r["error"]["error_type"] == "execution" and r["error"]["exception"] == "KeyError"
    assert r["isolation"]["names"] is True
    assert session.run(req("v"))["result"] == "1"


# -- stateless ----------------------------------------------------------------------------


def test_stateless_runs_start_from_nothing(template: WorkerTemplate) -> None:
    r = template.run_stateless(req("secret = 42\nprint('made it')\nsecret"))
    assert r["result"] == "42" and r["stdout"] == "made it\n"
    r = template.run_stateless(req("secret"))
    assert r["error"]["exception"] == "NameError"
    r = template.run_stateless(req("import sys; sys.modules['__main__'].__dict__.get('secret')"))
    assert r["result"] is None


def test_stateless_runs_hold_no_other_calls_pipes(template: WorkerTemplate) -> None:
    # Standbys wait side by side; none may reach another's pipes (its code or result).
    code = ("import os\nfds = {}\nfor fd in os.listdir('/proc/self/fd'):\n    try:\n"
            "        fds[int(fd)] = os.readlink('/proc/self/fd/' + fd)\n    except OSError:\n"
            "        pass\nsorted(fd for fd, what in fds.items() if what.startswith('pipe:'))")
    for _ in range(5):
        pipes = ast.literal_eval(template.run_stateless(req(code))["result"])
        # fds 1 and 2, the two protocol pipes and the child's own result pipe
        assert len(pipes) == 5 and {1, 2} <= set(pipes), pipes


def test_long_results_are_relayed_whole(session: WorkerSession,
                                        template: WorkerTemplate) -> None:
    # A `done` longer than one atomic pipe write goes through the worker.
    code = "'x' * 20000"
    assert template.run_stateless(req(code))["result"] == repr("x" * 20000)
    assert session.run_read_only(req(code))["result"] == repr("x" * 20000)
    assert template.run_stateless(req("'short'"))["result"] == "'short'"


def test_parallel_stateless_calls_do_not_queue(template: WorkerTemplate) -> None:
    results: list[dict[str, Any]] = []
    started = time.monotonic()
    threads = [threading.Thread(target=lambda: results.append(
        template.run_stateless(req("import time; time.sleep(1); 'ok'")))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r["result"] for r in results] == ["'ok'"] * 3
    assert time.monotonic() - started < 2.5


def test_parallel_sessions_run_at_once(python: str) -> None:
    a, b = said(WorkerSession(python)), said(WorkerSession(python))
    try:
        started = time.monotonic()
        threads = [threading.Thread(target=s.run, args=(req("import time; time.sleep(1)"),))
                   for s in (a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert time.monotonic() - started < 1.8
    finally:
        a.close()
        b.close()


# -- faults -------------------------------------------------------------------------------


def test_worker_found_dead_is_replaced(session: WorkerSession) -> None:
    session.run(req("x = 1"))
    old = session.pid
    os.kill(old, signal.SIGKILL)
    time.sleep(0.1)
    r = session.run(req("'x' in dir()"))
    assert r["result"] == "False" and r["state_lost"] is True and "retried" not in r
    assert session.pid != old
    r = session.run(req("1"))
    assert "state_lost" not in r


class _WorkerPlace:
    """What the session owner knows of an environment place: it retries after a death."""

    kind = "worker"
    retries = True


def owned(session: WorkerSession, request: RunRequest, mode: Any = "stateful") -> dict[str, Any]:
    """One call as the session owner makes it: SPEC 6's retry applied to the attempts."""
    from tests.said import outcome

    return outcome(sessions.settle(_WorkerPlace(), mode, session.target.run, request))  # type: ignore[arg-type]


def test_a_death_during_a_call_is_reported_as_a_fact(session: WorkerSession) -> None:
    session.run(req("x = 1"))
    ran = session.target.run(req("import os; os.kill(os.getpid(), 9)"))
    assert ran.event == facts.Died("process", "killed by SIGKILL")  # the owner decides
    r = session.run(req("'x' in dir()"))
    assert r["result"] == "False" and "state_lost" not in r  # replaced before it returned


def test_death_during_a_call_is_retried_once(session: WorkerSession, tmp_path: Path) -> None:
    flag = tmp_path / "died-once"
    session.run(req("x = 1"))
    r = owned(session, req(
        f"import os, signal\nif not os.path.exists({str(flag)!r}):\n"
        f"    open({str(flag)!r}, 'w').close()\n    os.kill(os.getpid(), signal.SIGKILL)\n"
        "'second try'"))
    assert r["result"] == "'second try'"
    assert r["retried"] is True and r["state_lost"] is True
    assert session.run(req("'x' in dir()"))["result"] == "False"


def test_death_twice_is_crashed_and_the_next_call_works(session: WorkerSession) -> None:
    r = owned(session, req("import os; os.kill(os.getpid(), 9)"))
    err = r["error"]
    assert err["error_type"] == "crashed" and err["state_lost"] is True
    assert "SIGKILL" in err["error"] and "2 times" in err["error"] and err["suggestion"]
    assert r["retried"] is True
    r = session.run(req("'fresh'"))
    assert r["result"] == "'fresh'" and "state_lost" not in r


def test_a_retry_runs_in_what_is_left_of_the_calls_timeout(session: WorkerSession,
                                                           tmp_path: Path) -> None:
    """SPEC 6: one deadline per call. The first run dies after 2 s; the second gets the
    2 s left of timeout=4, not a fresh 4 s, and its timeout says the state is lost."""
    import time

    flag = tmp_path / "died-once"
    started = time.monotonic()
    r = owned(session, req(
        f"import os, signal, time\nif not os.path.exists({str(flag)!r}):\n"
        f"    open({str(flag)!r}, 'w').close()\n    time.sleep(2)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\ntime.sleep(30)", timeout=4))
    took = time.monotonic() - started
    assert r["error"]["error_type"] == "timeout" and r["retried"] is True, r
    assert r["state_lost"] is True and "state from before this call is lost" in r["error"]["error"]
    assert "survived" not in r["error"]["error"] + r["error"]["suggestion"]  # one story
    assert took < 4 + 2 + 0.5, took


def test_read_only_child_death_keeps_the_session(session: WorkerSession) -> None:
    session.run(req("keep = 'me'"))
    pid = session.pid
    r = session.run_read_only(req("import os; os._exit(4)"))
    assert r["error"]["error_type"] == "crashed" and r["error"]["state_lost"] is False
    assert "status 4" in r["error"]["error"]
    assert session.pid == pid and session.run(req("keep"))["result"] == "'me'"


def test_an_idle_worker_sleeps(session: WorkerSession) -> None:
    # After each message the worker tries its pipe a moment before it sleeps (calls
    # back to back then wake no one); between calls an agent spends thinking, it
    # takes no CPU. A worker still spinning would take about a second of it here.
    for _ in range(20):
        session.run(req("x = 1"))
    before = cpu_seconds(session.pid)
    time.sleep(1.0)
    assert cpu_seconds(session.pid) - before < 0.1
    assert session.run(req("x"))["result"] == "1"  # and wakes for the next call


def test_timeout_interrupts_and_keeps_state(session: WorkerSession) -> None:
    session.run(req("x = 1"))
    started = time.monotonic()
    r = session.run(req("import time\nprint('working')\nx = 2\ntime.sleep(30)\nx = 3",
                        timeout=0.5))
    assert time.monotonic() - started < 0.5 + INTERRUPT_GRACE
    err = r["error"]
    assert err["error_type"] == "timeout" and err["state_lost"] is False
    assert err["stdout"] == "working\n" and "survived" in err["error"]
    assert session.run(req("x"))["result"] == "2"


def test_timeout_ignoring_sigint_kills_and_loses_state(session: WorkerSession) -> None:
    session.run(req("x = 1"))
    old = session.pid
    r = session.run(req("import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                        "time.sleep(60)", timeout=0.3))
    err = r["error"]
    assert err["error_type"] == "timeout" and err["state_lost"] is True
    assert r["state_lost"] is True and "restarted" in err["error"]
    assert session.alive()  # its new worker starts on a thread, not in the call's time
    r = session.run(req("'x' in dir()"))
    assert r["result"] == "False" and "state_lost" not in r
    assert session.pid not in (old, -1)


def test_read_only_timeout_kills_only_the_copy(session: WorkerSession) -> None:
    session.run(req("x = 1"))
    old = session.pid
    r = session.run_read_only(req("import signal, time\nx = 5\n"
                                  "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                                  "time.sleep(60)", timeout=0.3))
    assert r["error"]["error_type"] == "timeout" and r["error"]["state_lost"] is False
    assert "isolation" in r
    assert session.pid == old and session.run(req("x"))["result"] == "1"


def test_stateless_timeout(template: WorkerTemplate) -> None:
    r = template.run_stateless(req("import time; time.sleep(30)", timeout=0.3))
    assert r["error"]["error_type"] == "timeout"
    assert template.run_stateless(req("2"))["result"] == "2"


# -- capabilities -------------------------------------------------------------------------


def test_capabilities_cross_both_ways(session: WorkerSession) -> None:
    r = session.run(req("add(2, 3)"))
    assert r["result"] == "5"
    r = session.run(req("echo(b'\\x00\\xff', (1, 2), k={'__bytes__': 'x', 'n': None})"))
    assert r["result"] == ("{'args': [b'\\x00\\xff', [1, 2]], 'kwargs': {'k': "
                           "{'__bytes__': 'x', 'n': None}}}")
    assert session.run_read_only(req("add(1, 1)"))["result"] == "2"
    names = session.inspect()
    assert names["names"] == [] and "add" in names["capabilities"]


def test_capability_errors_are_execution_errors(session: WorkerSession) -> None:
    err = session.run(req("explode()"))["error"]
    assert err["error_type"] == "execution" and err["exception"] == "CapabilityError"
    assert "'explode'" in err["error"] and "ValueError: host side broke" in err["error"]
    err = session.run(req("import threading\nadd(threading.Lock(), 1)"))["error"]
    assert err["exception"] == "TypeError"
    assert "lock" in err["error"] and "file" in err["error"]
    err = session.run(req("give_object()"))["error"]
    assert err["exception"] == "CapabilityError" and "builtins.object" in err["error"]
    assert session.run(req("add(1, 2)"))["result"] == "3"


def test_capabilities_in_stateless_runs(python: str) -> None:
    caps = Caps()
    template = said(WorkerTemplate(python, capabilities=caps))
    try:
        assert template.run_stateless(req("add('a', 'b')"))["result"] == "'ab'"
        # A standby child forked before the change still sees the new name.
        caps.table["late"] = lambda: "arrived"
        assert template.run_stateless(req("late()"))["result"] == "'arrived'"
        del caps.table["add"]
        assert template.run_stateless(req("add"))["error"]["exception"] == "NameError"
    finally:
        template.close()


# -- output -------------------------------------------------------------------------------


def test_huge_output_is_truncated_in_the_middle(session: WorkerSession) -> None:
    r = session.run(req("for i in range(200000): print('line', i)", output_limit=4096))
    assert r["truncated"] is True and len(r["stdout"]) < 4200
    assert r["stdout"].startswith("line 0\n") and r["stdout"].endswith("line 199999\n")
    assert session.run(req("print('next')"))["stdout"] == "next\n"


def test_matplotlib_figures_come_back_as_png(python: str) -> None:
    probe = subprocess.run([python, "-c", "import matplotlib"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("matplotlib is not installed in this interpreter")
    s = said(WorkerSession(python))
    try:
        r = s.run(req("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nNone"))
        assert len(r["images"]) == 1 and r["images"][0]["mime"] == "image/png"
        import base64

        assert base64.b64decode(r["images"][0]["data"]).startswith(b"\x89PNG")
    finally:
        s.close()


# -- lifecycle ----------------------------------------------------------------------------


def test_close_leaves_no_child_alive(python: str) -> None:
    before = child_pids()
    s = said(WorkerSession(python))
    t = said(WorkerTemplate(python))
    assert t.run_stateless(req("1"))["result"] == "1"  # the template now keeps standbys
    r = s.run(req("import subprocess\np = subprocess.Popen(['sleep', '60'])\np.pid"))
    grandchild = int(r["result"])
    assert grandchild in child_pids()
    s.close()
    t.close()
    s.close()  # idempotent
    assert child_pids() - before == set()
    assert not s.alive()
    assert s.run(req("1"))["error"]["error_type"] == "crashed"


def test_close_during_a_call_returns_quickly(python: str) -> None:
    s = said(WorkerSession(python))
    out: list[dict[str, Any]] = []
    thread = threading.Thread(target=lambda: out.append(s.run(req("import time; time.sleep(30)"))))
    thread.start()
    time.sleep(0.3)
    started = time.monotonic()
    s.close()
    thread.join(10)
    assert time.monotonic() - started < 5
    assert out[0]["error"]["error_type"] in ("crashed", "timeout")


# -- misbehaving workers ------------------------------------------------------------------


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers, "WORKER_SCRIPT", FAKE_WORKER)


def _fake_env(mode: str) -> dict[str, str]:
    return {**os.environ, "COORDEX_FAKE_WORKER": mode}


@pytest.mark.usefixtures("fake")
@pytest.mark.parametrize(("mode", "words"), [
    ("silent", "did not announce itself"),
    ("garbage", "valid handshake"),
    ("old_protocol", "protocol 999"),
    ("exit", "exited with status 3"),
])
def test_a_broken_worker_fails_to_start_clearly(mode: str, words: str) -> None:
    before = child_pids()
    with pytest.raises(WorkerStartError) as info:
        WorkerSession(sys.executable, env=_fake_env(mode), start_timeout=1.0)
    record = info.value.to_dict()
    assert words in record["error"] and record["suggestion"]
    if mode == "exit":
        assert "refusing to start" in record["log"]
    assert child_pids() - before == set()


@pytest.mark.usefixtures("fake")
def test_garbage_during_a_call_is_crashed() -> None:
    s = said(WorkerSession(sys.executable, env=_fake_env("garbage_later")))
    try:
        r = s.run(req("1"))
        assert r["error"]["error_type"] == "crashed"
        assert "broke the protocol" in r["error"]["error"]
    finally:
        s.close()


def test_missing_interpreter_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(WorkerStartError) as info:
        WorkerSession(tmp_path / "no-python")
    assert "does not exist" in info.value.to_dict()["error"]
