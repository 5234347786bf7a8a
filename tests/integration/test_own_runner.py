"""The own interpreter's runner: memory released, no thread per session, thread output
routed by origin, and only coordex's own interrupt counted as a timeout (SPEC 6)."""

from __future__ import annotations

import gc
import os
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import pytest

from coordex import Executor

pytestmark = pytest.mark.timeout(60)

MB = 2**20
BIG = 400 * MB


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def tracker(ex: Executor) -> list[weakref.ref[Any]]:
    """A capability ``track(obj)`` that keeps a weak reference to ``obj`` for the test."""
    refs: list[weakref.ref[Any]] = []
    ex.capability(lambda obj: refs.append(weakref.ref(obj)), name="track")
    return refs


# Holds a tracked object, and a function whose globals are the namespace: a cycle that
# only a collection (or coordex emptying the namespace) would free.
HOLD = "class Held:\n    pass\nheld = Held()\ntrack(held)\ndef keep():\n    return held\n"


def runner_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("coordex-runner")
               or t.name in ("coordex-session", "coordex-stateless"))


# -- memory ----------------------------------------------------------------------------


def test_closed_session_releases_its_memory(ex: Executor) -> None:
    before = rss()
    r = ex.execute_code(f"blob = b'x' * {BIG}\ndef f():\n    return blob\n",
                        state_mode="stateful", session_name="big")
    assert "error" not in r, r
    assert rss() - before > BIG * 0.9
    assert ex.close_session(session_name="big")["closed"] is True
    assert rss() - before < BIG * 0.25


def test_closed_session_namespace_is_not_kept_alive(ex: Executor) -> None:
    refs = tracker(ex)
    assert "error" not in ex.execute_code(HOLD, state_mode="stateful", session_name="s")
    ex.close_session(session_name="s")
    assert refs[0]() is None  # no collection needed


def test_executor_close_releases_session_namespaces(root: Path) -> None:
    ex = Executor(root=root)
    refs = tracker(ex)
    for name in ("a", "b"):
        ex.execute_code(HOLD, state_mode="stateful", session_name=name)
    ex.close()
    gc.collect()
    assert [r() for r in refs] == [None, None]


def test_stateless_namespace_is_released_when_the_call_returns(ex: Executor) -> None:
    refs = tracker(ex)
    before = rss()
    r = ex.execute_code(f"blob = b'x' * {BIG}\n" + HOLD)
    assert "error" not in r, r
    assert refs[0]() is None
    assert rss() - before < BIG * 0.25


def test_no_runner_thread_is_kept_per_session(ex: Executor) -> None:
    ex.execute_code("1", state_mode="stateful")
    start = runner_threads()
    for i in range(8):
        ex.execute_code("x = 1", state_mode="stateful", session_name=f"s{i}")
        ex.execute_code("1")
    assert runner_threads() <= max(start, 1)
    for i in range(8):
        ex.close_session(session_name=f"s{i}")
    assert runner_threads() <= max(start, 1)


def test_a_stuck_runner_ends_with_its_code_and_the_session_works_again(ex: Executor) -> None:
    r = ex.execute_code("import time\nx = 'kept'\ntime.sleep(1.5)", state_mode="stateful",
                        session_name="slow", timeout=0.2)
    assert r["error_type"] == "timeout"  # time.sleep ignores the interrupt until it returns
    assert ex.execute_code("1")["result"] == "1"  # another runner serves other calls
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        r = ex.execute_code("x", state_mode="stateful", session_name="slow")
        if "error" not in r:
            break
        time.sleep(0.1)
    assert r.get("result") == "'kept'", r
    time.sleep(0.1)
    assert runner_threads() <= 1


def test_a_session_closed_while_its_thread_runs_keeps_the_namespace_for_it(
        ex: Executor) -> None:
    ex.execute_code("import threading, time\nbox = []\n"
                    "t = threading.Thread(target=lambda: (time.sleep(0.3), box.append(len(box))))\n"
                    "t.start()", state_mode="stateful", session_name="bg")
    refs = tracker(ex)
    ex.execute_code("track(t)", state_mode="stateful", session_name="bg")
    ex.close_session(session_name="bg")
    thread = refs[0]()
    assert thread is not None
    thread.join(5)
    assert not thread.is_alive()  # it ran to its end: its globals were still there


# -- thread output ---------------------------------------------------------------------

CHATTY = ("import threading, time\nstop = threading.Event()\n"
          "def chat():\n    while not stop.is_set():\n        print('chatter from A')\n"
          "        time.sleep(0.005)\n"
          "threading.Thread(target=chat, daemon=True).start()\ntime.sleep(0.05)\n")


def test_a_thread_of_one_session_never_prints_into_another(ex: Executor) -> None:
    r = ex.execute_code(CHATTY, state_mode="stateful", session_name="A")
    assert "chatter from A" in r["stdout"]
    try:
        for mode, name in (("stateful", "B"), ("stateless", None), ("stateful", None)):
            r = ex.execute_code("import time\nprint('B here')\ntime.sleep(0.1)",
                                state_mode=mode, session_name=name)
            assert r["stdout"] == "B here\n", (mode, name, r["stdout"][:200])
    finally:
        ex.execute_code("stop.set()", state_mode="stateful", session_name="A")


def test_a_thread_prints_into_the_call_that_started_it(ex: Executor) -> None:
    chunks: list[str] = []
    r = ex.execute_code(
        "import threading\n"
        "def work(n):\n    print('worker', n)\n"
        "ts = [threading.Thread(target=work, args=(i,)) for i in range(3)]\n"
        "[t.start() for t in ts]; [t.join() for t in ts]\nprint('main')",
        on_output=lambda stream, text: chunks.append(text))
    assert sorted(r["stdout"].splitlines()) == ["main", "worker 0", "worker 1", "worker 2"]
    assert "".join(chunks) == r["stdout"]


def test_a_thread_of_an_ended_stateless_call_goes_nowhere(ex: Executor) -> None:
    ex.execute_code("import threading, time\nstop = threading.Event()\n"
                    "def chat():\n    while not stop.wait(0.005):\n        print('stray')\n"
                    "threading.Thread(target=chat, daemon=True).start()\n"
                    "import builtins\nbuiltins._coordex_test_stop = stop")
    try:
        r = ex.execute_code("import time\ntime.sleep(0.1)\nprint('mine')",
                            state_mode="stateful", session_name="other")
        assert r["stdout"] == "mine\n"
    finally:
        import builtins

        builtins._coordex_test_stop.set()  # type: ignore[attr-defined]
        del builtins._coordex_test_stop  # type: ignore[attr-defined]


# -- interrupts ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["stateless", "stateful"])
def test_keyboard_interrupt_raised_by_the_code_is_an_execution_error(
        ex: Executor, mode: str) -> None:
    r = ex.execute_code("print('before')\nraise KeyboardInterrupt('mine')", state_mode=mode)
    assert r["error_type"] == "execution", r
    assert r["exception"] == "KeyboardInterrupt" and r["stdout"] == "before\n"
    assert "KeyboardInterrupt: mine" in r["traceback"]


def test_keyboard_interrupt_in_read_only(ex: Executor) -> None:
    ex.execute_code("x = 1", state_mode="stateful", session_name="ro")
    r = ex.execute_code("raise KeyboardInterrupt", state_mode="read_only", session_name="ro")
    assert r["error_type"] == "execution" and r["exception"] == "KeyboardInterrupt", r


def test_coordex_interrupt_is_still_a_timeout_and_cancel(ex: Executor) -> None:
    r = ex.execute_code("while True: pass", timeout=0.3)
    assert r["error_type"] == "timeout" and r["state_lost"] is False
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    r = ex.execute_code("while True: pass", state_mode="stateful", cancel=cancel)
    assert r["error_type"] == "timeout"
    # The code may catch it and go on; what it does after is its own.
    r = ex.execute_code("import time\ntry:\n    while True:\n        time.sleep(0.001)\n"
                        "except KeyboardInterrupt:\n    print('cleaned')\n    raise", timeout=0.3)
    assert r["error_type"] == "timeout" and r["stdout"] == "cleaned\n"
