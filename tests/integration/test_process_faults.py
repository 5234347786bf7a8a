"""Faults of process lifetime, through the public Executor API (SPEC section 6): close
while calls run, cancel in every place, shells killed between and during calls, and
terminal queries in bash output."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from coordex import Executor
from tests.conftest import alive, child_pids


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    monkeypatch.setenv("UV_OFFLINE", "1")
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "uvc"))
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)


def test_terminal_queries_never_reach_the_client(ex: Executor) -> None:
    code = (r"printf 'a\033[6nb\033[cc\033]11;?\007d\033[31me\033[0m\n'; "
            r"printf '\033[>0c' >&2; printf '\033P$qm\033\\'")
    for mode in ("stateless", "stateful"):
        chunks: list[str] = []
        r = ex.execute_code(code, language="bash", state_mode=mode,
                            on_output=lambda stream, text, c=chunks: c.append(text))
        assert r["stdout"] == "abcd\x1b[31me\x1b[0m\n", r
        assert r["stderr"] == ""
        assert "".join(chunks) == r["stdout"]
    r = ex.execute_code(code, language="bash", state_mode="read_only", session_id=0)
    assert r["stdout"] == "abcd\x1b[31me\x1b[0m\n", r


def _cancelled_call(ex: Executor, code: str, after: float = 0.8, **where: Any) -> dict[str, Any]:
    cancel = threading.Event()
    timer = threading.Timer(after, cancel.set)
    timer.start()
    started = time.monotonic()
    try:
        r = ex.execute_code(code, timeout=60, cancel=cancel, **where)
    finally:
        timer.cancel()
    assert time.monotonic() - started < after + 3, r
    return r


BASH_LOOP = "n=0; while :; do n=$((n+1)); echo $n > {out}; sleep 0.05; done"
PY_LOOP = ("import time\nn = 0\nwhile True:\n    n += 1\n"
           "    open({out!r}, 'w').write(str(n))\n    time.sleep(0.05)")


def _stopped(counter: Path) -> None:
    """The loop writing ``counter`` no longer runs."""
    first = counter.read_text()
    time.sleep(0.3)
    assert counter.read_text() == first, "the cancelled code ran on"


def test_cancel_interrupts_bash_and_keeps_the_session(ex: Executor, tmp_path: Path) -> None:
    out = tmp_path / "n"
    ex.execute_code("kept=yes", language="bash", state_mode="stateful")
    r = _cancelled_call(ex, BASH_LOOP.format(out=out), language="bash", state_mode="stateful")
    assert r["error_type"] == "timeout" and r["state_lost"] is False, r
    _stopped(out)
    assert ex.execute_code("echo $kept", language="bash", state_mode="stateful")["stdout"] == "yes\n"
    r = _cancelled_call(ex, BASH_LOOP.format(out=out), language="bash")
    assert r["error_type"] == "timeout", r
    _stopped(out)


def test_cancel_interrupts_a_protected_bash_read_only_copy(ex: Executor) -> None:
    ex.execute_code("kept=yes", language="bash", state_mode="stateful", session_name="ro")
    r = _cancelled_call(ex, "while :; do sleep 0.05; done", language="bash",
                        state_mode="read_only", session_name="ro")
    assert r["error_type"] == "timeout" and r["state_lost"] is False, r
    assert "isolation" in r
    assert ex.execute_code("echo $kept", language="bash", state_mode="stateful",
                           session_name="ro")["stdout"] == "yes\n"


@pytest.mark.slow
@pytest.mark.usefixtures("offline")
def test_cancel_interrupts_environment_code(ex: Executor, tmp_path: Path) -> None:
    out = tmp_path / "n"
    v = ex.environments.create("")["venv_id"]
    ex.execute_code("kept = 'yes'", state_mode="stateful", venv_id=v)
    r = _cancelled_call(ex, PY_LOOP.format(out=str(out)), state_mode="stateful", venv_id=v)
    assert r["error_type"] == "timeout" and r["state_lost"] is False, r
    _stopped(out)
    assert ex.execute_code("kept", state_mode="stateful", venv_id=v)["result"] == "'yes'"
    r = _cancelled_call(ex, PY_LOOP.format(out=str(out)), venv_id=v)
    assert r["error_type"] == "timeout", r
    _stopped(out)
    ignoring = ("import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                "time.sleep(60)")
    r = _cancelled_call(ex, ignoring, state_mode="stateful", venv_id=v)
    assert r["error_type"] == "timeout" and r["state_lost"] is True, r


def _calls_in_flight(ex: Executor, calls: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Start ``calls`` in threads, close ``ex`` under them; each call's result (or what it
    raised) and when it came back, in seconds after close."""
    results: dict[str, Any] = {}

    def run(name: str, kwargs: dict[str, Any]) -> None:
        try:
            results[name] = ex.execute_code(**kwargs)
        except BaseException as exc:  # the fault under test: a call that raises
            results[name] = exc
        results[name + " after"] = time.monotonic() - closed_at

    closed_at = float("inf")
    threads = [threading.Thread(target=run, args=item) for item in calls.items()]
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    closed_at = time.monotonic()
    ex.close()
    for thread in threads:
        thread.join(20)
    return results


def test_close_ends_calls_in_flight_with_error_dicts(root: Path, tmp_path: Path) -> None:
    before = child_pids()
    ex = Executor(root=root, timeout=30)
    slow_py = "import time\nfor i in range(100):\n    time.sleep(0.05)\nprint('done')"
    # The commands write their pids: once their shell is gone they are no children of
    # ours, so only /proc can tell whether they still run.
    slow_sh = "sleep 5 & echo $! > {}; wait; echo done"
    results = _calls_in_flight(ex, {
        "own stateless": {"code": slow_py},
        "bash stateless": {"code": slow_sh.format(tmp_path / "a"), "language": "bash"},
        "bash stateful": {"code": slow_sh.format(tmp_path / "b"), "language": "bash",
                          "state_mode": "stateful"},
    })
    for name in ("a", "b"):
        pid = int((tmp_path / name).read_text())
        assert not alive(pid), f"the command of a call in flight still runs after close ({name})"
    for name in ("own stateless", "bash stateless", "bash stateful"):
        r = results[name]
        assert isinstance(r, dict), f"{name} raised {r!r}"
        assert r.get("error_type") in ("crashed", "timeout"), (name, r)
        assert "done" not in r.get("stdout", ""), (name, r)
        assert results[name + " after"] < 3, (name, results[name + " after"])
    assert child_pids() - before == set()


@pytest.mark.slow
@pytest.mark.usefixtures("offline")
def test_close_ends_environment_calls_in_flight(root: Path) -> None:
    before = child_pids()
    ex = Executor(root=root, timeout=30)
    v = ex.environments.create("")["venv_id"]
    assert ex.execute_code("1", venv_id=v)["result"] == "1"
    slow = "import time\ntime.sleep(5)\nprint('done')"
    results = _calls_in_flight(ex, {
        "stateless": {"code": slow, "venv_id": v},
        "stateful": {"code": slow, "venv_id": v, "state_mode": "stateful"},
    })
    for name in ("stateless", "stateful"):
        r = results[name]
        assert isinstance(r, dict) and r.get("error_type") == "crashed", (name, r)
        assert results[name + " after"] < 3, (name, results[name + " after"])
    assert child_pids() - before == set()


def test_a_shell_killed_between_calls_is_replaced_never_crashed(ex: Executor) -> None:
    for _ in range(30):
        pid = int(ex.execute_code("echo $$", language="bash", state_mode="stateful")["stdout"])
        os.kill(pid, signal.SIGKILL)  # dead before the next call arrives
        r = ex.execute_code("echo hi", language="bash", state_mode="stateful")
        assert r.get("error_type") is None and r["stdout"] == "hi\n", r
        assert r["state_lost"] is True


def test_a_shell_that_dies_during_setup_is_a_crashed_dict(
        ex: Executor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "bash").write_text("#!/bin/sh\nexit 1\n")
    (fake / "bash").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    for mode in ("stateful", "stateless"):
        r = ex.execute_code("echo hi", language="bash", state_mode=mode)
        assert r["error_type"] == "crashed" and r["suggestion"], r
    monkeypatch.undo()
    r = ex.execute_code("echo hi", language="bash", state_mode="stateful")
    assert r["stdout"] == "hi\n", r


def test_a_shell_killed_during_a_read_only_call_is_reported_on_that_call(ex: Executor) -> None:
    pid = int(ex.execute_code("x=1; echo $$", language="bash", state_mode="stateful")["stdout"])
    threading.Timer(0.3, os.kill, (pid, signal.SIGKILL)).start()
    r = ex.execute_code("sleep 1; echo $x", language="bash", state_mode="read_only",
                        session_id=0)
    assert r.get("state_lost") is True, r
    after = ex.execute_code("echo ${x:-gone}", language="bash", state_mode="stateful")
    assert after["stdout"] == "gone\n" and "state_lost" not in after, after


def test_back_to_back_calls_never_find_the_session_busy(ex: Executor) -> None:
    # A tiny switch interval makes threads change hands between any two bytecodes, so
    # a busy flag cleared after the caller woke shows within a few hundred calls.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        ex.execute_code("n = 0", state_mode="stateful", session_name="quick")
        for _ in range(1500):
            r = ex.execute_code("n += 1", state_mode="stateful", session_name="quick")
            assert "error" not in r, r
    finally:
        sys.setswitchinterval(interval)


def test_a_shell_the_code_kills_is_never_run_again(ex: Executor, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    r = ex.execute_code(f"echo x >> {marks}; kill -9 $$", language="bash",
                        state_mode="stateful")
    assert r["error_type"] == "crashed" and r["state_lost"] is True, r
    assert marks.read_text() == "x\n"  # ran once, not retried
    r = ex.execute_code("exit 3", language="bash", state_mode="stateful")
    assert r["exit_code"] == 3 and r["state_lost"] is True, r


@pytest.mark.slow
@pytest.mark.usefixtures("offline")
def test_a_worker_killed_during_a_read_only_call_is_reported_on_that_call(
        ex: Executor) -> None:
    v = ex.environments.create("")["venv_id"]
    pid = int(ex.execute_code("import os\nx = 1\nos.getpid()", state_mode="stateful",
                              venv_id=v)["result"])
    threading.Timer(0.3, os.kill, (pid, signal.SIGKILL)).start()
    r = ex.execute_code("import time\ntime.sleep(1)\nx", state_mode="read_only",
                        session_id=0, venv_id=v)
    assert r.get("state_lost") is True, r
    after = ex.execute_code("'x' in globals()", state_mode="stateful", venv_id=v)
    assert after["result"] == "False" and "state_lost" not in after, after


def test_a_stopped_shell_costs_a_call_its_timeout_and_the_grace_not_more(ex: Executor) -> None:
    """SIGSTOP on an idle kept shell: the call cannot be taken. It returns by its timeout
    plus the interrupt grace (SPEC 6), says the code did not run and the state is lost
    (not a success after a second full timeout), and the next call runs on a fresh shell."""
    shell = int(ex.execute_code("x=5; echo $$", language="bash", state_mode="stateful",
                                session_name="stopped")["stdout"])
    os.kill(shell, signal.SIGSTOP)
    started = time.monotonic()
    r = ex.execute_code("echo ran > ran.txt", language="bash", state_mode="stateful",
                        session_name="stopped", timeout=3)
    took = time.monotonic() - started
    assert r["error_type"] == "timeout" and r["state_lost"] is True, r
    assert "did not run" in r["error"] and took < 3 + 2 + 0.5, (took, r)
    assert not (ex.root / "ran.txt").exists()
    again = ex.execute_code('echo "[$x]"', language="bash", state_mode="stateful",
                            session_name="stopped")
    assert again["stdout"] == "[]\n" and not again.get("state_lost"), again  # reported once


IGNORING_HOST = r"""
import json, sys, tempfile
from coordex import Executor
with Executor(root=tempfile.mkdtemp()) as ex:
    out = {}
    for language, setup, slow, show in (
            ("bash", "kept=yes", "sleep 30", "echo $kept"),
            ("python", "kept = 'yes'", "import time\nwhile True: time.sleep(0.01)", "print(kept)")):
        ex.execute_code(setup, language=language, state_mode="stateful")
        r = ex.execute_code(slow, language=language, state_mode="stateful", timeout=0.5)
        after = ex.execute_code(show, language=language, state_mode="stateful")
        out[language] = [r.get("error_type"), r.get("state_lost"), after.get("stdout")]
    print(json.dumps(out))
"""


def test_a_host_that_ignores_sigint_still_interrupts_its_sessions() -> None:
    """A host started in the background of a script (or under nohup) inherits SIGINT
    ignored; its shells and workers must not, or no timeout could interrupt them and
    every one would cost the session its state."""
    import json
    import signal
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", IGNORING_HOST], capture_output=True, text=True, timeout=120,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found == {"bash": ["timeout", False, "yes\n"],
                     "python": ["timeout", False, "yes\n"]}, found
