"""The own interpreter's runner: memory released, no thread per session, thread output
routed by origin, and only coordex's own interrupt counted as a timeout (SPEC 6)."""

from __future__ import annotations

import contextlib
import gc
import os
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coordex import Executor
from tests.said import said

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
    # Runners a stuck call of an earlier test left can only end meanwhile.
    assert runner_threads() <= start
    for i in range(8):
        ex.close_session(session_name=f"s{i}")
    assert runner_threads() <= start


def test_a_stuck_runner_ends_with_its_code_and_the_session_works_again(ex: Executor) -> None:
    before = runner_threads()
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
    assert runner_threads() <= before + 1  # the stuck one ended; one serves the calls


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


def output_lines(ex: Executor, code: str) -> list[str]:
    """The sorted stdout lines of a stateless call, checked against what streamed."""
    chunks: list[str] = []
    r = ex.execute_code(code, on_output=lambda stream, text: chunks.append(text))
    assert "".join(chunks) == r["stdout"], r
    return sorted(r["stdout"].splitlines())


def test_a_thread_prints_into_the_call_that_started_it(ex: Executor) -> None:
    assert output_lines(ex, "import threading\n"
                            "def work(n):\n    print('worker', n)\n"
                            "ts = [threading.Thread(target=work, args=(i,)) for i in range(3)]\n"
                            "[t.start() for t in ts]; [t.join() for t in ts]\nprint('main')",
                        ) == ["main", "worker 0", "worker 1", "worker 2"]


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


# -- on the caller's thread (own_on_caller_thread=True) ---------------------------------


@pytest.fixture
def inline_ex(root: Path) -> Iterator[Executor]:
    assert threading.current_thread() is threading.main_thread()
    executor = Executor(root=root, timeout=30, own_on_caller_thread=True)
    try:
        yield executor
    finally:
        executor.close()


@pytest.mark.parametrize("code", [
    "while True: pass",
    "import time\ntime.sleep(30)",
    "import threading\nthreading.Event().wait()",
    "import subprocess\nsubprocess.run(['sleep', '30'])",
    "import select, os\nr, w = os.pipe()\nselect.select([r], [], [])",
])
def test_on_the_caller_thread_a_timeout_interrupts_blocking_calls(inline_ex: Executor,
                                                                   code: str) -> None:
    inline_ex.execute_code("x = 1", state_mode="stateful")
    started = time.monotonic()
    r = inline_ex.execute_code(code, state_mode="stateful", timeout=0.3)
    assert time.monotonic() - started < 1.5
    assert r["error_type"] == "timeout" and r["state_lost"] is False, r
    assert "interrupted" in r["error"]
    assert inline_ex.execute_code("x", state_mode="stateful")["result"] == "1"


def test_on_the_caller_thread_the_code_runs_on_the_main_thread(inline_ex: Executor) -> None:
    r = inline_ex.execute_code("import threading\nthreading.current_thread().name")
    assert r["result"] == repr(threading.main_thread().name)
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    r = inline_ex.execute_code("while True: pass", cancel=cancel)
    assert r["error_type"] == "timeout"
    r = inline_ex.execute_code("raise KeyboardInterrupt")
    assert r["error_type"] == "execution" and r["exception"] == "KeyboardInterrupt"


def test_on_the_caller_thread_output_and_nested_calls_work(inline_ex: Executor) -> None:
    # Writes to fds 1/2 reach the call through a reader thread: their order against
    # print()s is not kept.
    assert output_lines(inline_ex, "import os, subprocess, threading\nprint('p')\n"
                                   "os.write(1, b'fd\\n')\nsubprocess.run(['echo', 'child'])\n"
                                   "t = threading.Thread(target=print, args=('thread',))\n"
                                   "t.start(); t.join()") == ["child", "fd", "p", "thread"]
    inline_ex.functions.define(source="def double(a):\n    return a * 2\n")
    inline_ex.execute_code("y = 5", state_mode="stateful")
    assert inline_ex.execute_code("functions.double(y)", state_mode="stateful")["result"] == "10"
    r = inline_ex.execute_code("functions.double.stateful()(3)", state_mode="stateful")
    assert r["result"] == "6"
    assert inline_ex.execute_code("y", state_mode="read_only", session_id=0)["result"] == "5"


def test_on_the_caller_thread_an_interrupt_never_escapes_into_the_host(
        inline_ex: Executor) -> None:
    # Code that ends right at its deadline: the interrupt races the end of the call.
    for i in range(60):
        r = inline_ex.execute_code(f"import time\ntime.sleep({0.01 + (i % 6) * 0.001})",
                                   timeout=0.012)
        assert r.get("error_type") in (None, "timeout"), r
    time.sleep(0.05)  # a late signal would land here, in the test, and fail it
    assert inline_ex.execute_code("1")["result"] == "1"


def test_on_the_caller_thread_other_threads_still_use_a_runner(inline_ex: Executor) -> None:
    box: dict[str, Any] = {}

    def call() -> None:
        box["r"] = inline_ex.execute_code(
            "import time\nend = time.monotonic() + 4\nwhile time.monotonic() < end:\n"
            "    try:\n        time.sleep(0.05)\n    except KeyboardInterrupt:\n        pass",
            state_mode="stateful",
            session_name="stubborn", timeout=0.2)

    caller = threading.Thread(target=call)
    caller.start()
    caller.join(10)
    assert not caller.is_alive()  # the timeout returned although the code goes on
    assert box["r"]["error_type"] == "timeout" and "still busy" in box["r"]["suggestion"]


def test_a_worker_tells_its_own_keyboard_interrupt_from_a_timeout() -> None:
    import sys

    from coordex.backends.base import RunRequest
    from coordex.backends.env.workers import WorkerSession

    worker = said(WorkerSession(sys.executable))
    try:
        r = worker.run(RunRequest("raise KeyboardInterrupt('mine')", timeout=20))
        assert r["error"]["error_type"] == "execution", r
        assert r["error"]["exception"] == "KeyboardInterrupt"
        r = worker.run(RunRequest("import time\ntime.sleep(30)", timeout=0.3))
        assert r["error"]["error_type"] == "timeout" and r["error"]["state_lost"] is False
    finally:
        worker.close()


def test_on_the_caller_thread_close_during_a_call_returns_an_error(root: Path) -> None:
    ex = Executor(root=root, own_on_caller_thread=True)
    threading.Timer(0.3, ex.close).start()
    started = time.monotonic()
    r = ex.execute_code("import time\ntime.sleep(30)", state_mode="stateful")
    assert time.monotonic() - started < 5
    assert "error_type" in r, r
    assert ex.execute_code("1")["error_type"] == "validation"  # closed


HOST_BEAT = """
import json, sys, tempfile, threading, time
from coordex import Executor
stop = threading.Event()
def beat():
    while not stop.is_set():
        print("heartbeat", flush=True)
        time.sleep(0.005)
with Executor(root=tempfile.mkdtemp(), own_on_caller_thread=sys.argv[1] == "1") as ex:
    threading.Thread(target=beat, daemon=True).start()
    time.sleep(0.05)
    r = ex.execute_code("import time\\ntime.sleep(0.3)\\nprint('mine')")
    stop.set()
    sys.stderr.write(json.dumps(r["stdout"]) + "\\n")
"""


@pytest.mark.parametrize("here", ["0", "1"])
def test_a_host_thread_prints_to_the_host_never_into_a_call(here: str) -> None:
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", HOST_BEAT, here], capture_output=True,
                          text=True, timeout=60)
    assert json.loads(done.stderr.strip().splitlines()[-1]) == "mine\n", done.stderr[-500:]
    # The host's lines written during the call came out after it, on the host's stdout.
    assert done.stdout.count("heartbeat") > 40


HOST_BLOCKED = """
import json, sys, tempfile, threading, time
from coordex import Executor
ex = Executor(root=tempfile.mkdtemp())
ex.execute_code("1")
def spam():
    while True:
        sys.stdout.write("x" * 65536)
threading.Thread(target=spam, daemon=True).start()
time.sleep(0.5)  # the pipe to the parent is full: spam is blocked in the host's write
started = time.monotonic()
r = ex.execute_code("print('hi')", timeout=2)
sys.stderr.write(json.dumps([time.monotonic() - started, r.get("stdout")]) + "\\n")
sys.stderr.flush()
import os
os._exit(0)  # (a daemon thread blocked in a write would fail the interpreter's exit)
"""


def test_a_host_thread_blocked_on_its_own_stdout_never_stops_a_call() -> None:
    """A host thread stuck writing to a stdout pipe no one reads: calls still run and
    return within their timeout (they waited for that write forever before)."""
    import json
    import subprocess
    import sys

    with subprocess.Popen([sys.executable, "-c", HOST_BLOCKED], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as process:
        try:
            deadline = time.monotonic() + 30
            while process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)  # stdout is never read while the child runs
            assert process.poll() == 0, "the call never returned"
            err = process.stderr.read() if process.stderr else ""
            took, stdout = json.loads(err.strip().splitlines()[-1])
            assert stdout == "hi\n" and took < 2 + 2, err[-500:]
        finally:
            process.kill()


HOST_STREAMS = """
import sys, tempfile
from coordex import Executor
before = (sys.stdout, sys.stderr, sys.stdin)
with Executor(root=tempfile.mkdtemp()) as ex:
    ex.execute_code("1")
    assert type(sys.stdout).__name__ == "_RoutedStream"
    assert (sys.stdout.encoding, sys.stdout.errors) == (before[0].encoding, before[0].errors)
    assert sys.stderr.errors == before[1].errors
assert (sys.stdout, sys.stderr, sys.stdin) == before
print("ok")
"""


def test_a_timeout_that_ends_before_the_code_starts_is_a_result(root: Path) -> None:
    """SPEC 2: a call never raises. An interrupt that reached the runner before the job
    began left no cell, and the call raised KeyError (44 of 200 such calls)."""
    with Executor(root=root, log=False) as ex:
        for _ in range(200):
            r = ex.execute_code("x = 1", timeout=0.000001)
            assert "error" not in r or r["error_type"] == "timeout", r
        assert ex.execute_code("1 + 1")["result"] == "2"


def test_a_host_write_stuck_for_good_is_waited_for_once(root: Path) -> None:
    """A host thread blocked in its own stream's write: the first call waits its 0.5 s
    for it, the next calls do not wait for it again (each paid 0.5 s of its timeout)."""
    import io
    import sys

    from coordex.backends.own import output

    release = threading.Event()

    class Blocked(io.TextIOBase):
        def write(self, text: str) -> int:
            release.wait(30)  # a write stuck on a full pipe
            return len(text)

        def writable(self) -> bool:
            return True

    with Executor(root=root, log=False) as ex:
        ex.execute_code("1")
        saved = output._STDOUT.original
        output._STDOUT.original = Blocked()
        try:
            threading.Thread(target=lambda: sys.stdout.write("stuck"), daemon=True).start()
            time.sleep(0.1)
            took = []
            for _ in range(3):
                started = time.monotonic()
                assert ex.execute_code("2 + 2", timeout=5)["result"] == "4"
                took.append(time.monotonic() - started)
            assert took[0] < 2 and max(took[1:]) < 0.25, took
        finally:
            release.set()
            output._STDOUT.original = saved


def test_an_executor_closed_while_another_ones_call_runs_leaves_nothing(
        tmp_path: Path) -> None:
    """Closing an Executor while another Executor's own-interpreter call holds the
    process's own lock: its runner and fd pump go once that call ends (they stayed for
    good: +51 fds and +11 threads over five such closes)."""
    busy = Executor(root=tmp_path / "busy", log=False)
    try:
        busy.execute_code("1")
        fds, threads = len(os.listdir("/proc/self/fd")), threading.active_count()
        for n in range(5):
            ex = Executor(root=tmp_path / f"ex{n}", log=False)
            ex.execute_code("print('hi')")
            call = threading.Thread(target=busy.execute_code,
                                    args=("import time; time.sleep(0.4)",))
            call.start()
            time.sleep(0.1)
            ex.close()
            call.join()
        deadline = time.monotonic() + 5
        while threading.active_count() > threads and time.monotonic() < deadline:
            time.sleep(0.05)
        assert threading.active_count() <= threads
        assert len(os.listdir("/proc/self/fd")) <= fds + 2
    finally:
        busy.close()


def test_the_host_streams_keep_their_encoding_and_come_back_at_close() -> None:
    """The routing proxies answer ``sys.stdout.encoding`` as the host's stream does (it
    read None), and the host's own streams are back once the last Executor closed."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", HOST_STREAMS], capture_output=True,
                          text=True, timeout=60)
    assert done.stdout == "ok\n", done.stderr[-800:]


# -- the hand-off held on one CPU --------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs two CPUs this process may set")
def test_code_sees_every_cpu_though_the_hand_off_held_one(ex: Executor) -> None:
    """While a hand-off crosses CPUs both threads are held on the caller's for it; the
    code (and what it starts) still sees the CPUs the process has, and the caller gets
    its own back."""
    from coordex.backends.own import runner

    cpus = sorted(os.sched_getaffinity(0))
    ex.execute_code("pass", state_mode="stateful")  # the runner has read its CPUs
    for _ in range(3):
        runner._hold_left[0] = 5  # as after a hand-off that crossed CPUs
        r = ex.execute_code(
            "import os, subprocess, sys\n"
            "print(sorted(os.sched_getaffinity(0)))\n"
            "subprocess.run([sys.executable, '-c', 'import os; "
            "print(sorted(os.sched_getaffinity(0)))'])",
            state_mode="stateful")
        assert r["stdout"].split("\n")[:2] == [str(cpus), str(cpus)], r
        assert runner._hold_left[0] == 4  # this call was held
        assert sorted(os.sched_getaffinity(0)) == cpus


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs two CPUs this process may set")
def test_a_hand_off_that_crosses_cpus_holds_the_next_ones_on_one(ex: Executor) -> None:
    """The runner placed on another CPU than the caller's (as the scheduler does where
    that CPU is idle): a watched hand-off sees it, the next ones are held on the
    caller's CPU, and the code still sees every CPU."""
    from coordex.backends.own import runner

    cpus = sorted(os.sched_getaffinity(0))
    ex.execute_code("pass", state_mode="stateful")
    runners = [t for t in threading.enumerate() if t.name == "coordex-runner" and t.native_id]
    runner._hold_left[:3] = [0, 0, 0]
    try:
        os.sched_setaffinity(0, {cpus[0]})
        for thread in runners:
            os.sched_setaffinity(thread.native_id or 0, {cpus[1]})
        for _ in range(4 * runner.PROBE_EVERY):  # two watched hand-offs
            ex.execute_code("pass", state_mode="stateful")
            if runner._hold_left[0] > 0:
                break
        assert runner._hold_left[0] > 0  # seen crossing: held from now on
        os.sched_setaffinity(0, cpus)
        r = ex.execute_code("import os; sorted(os.sched_getaffinity(0))", state_mode="stateful")
        assert r["result"] == repr(cpus), r
    finally:
        os.sched_setaffinity(0, cpus)
        for thread in runners:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(thread.native_id or 0, cpus)
        runner._hold_left[0] = 0


def test_a_fork_of_the_code_that_lives_on_never_takes_the_runners_next_calls(
        ex: Executor) -> None:
    """Code forks and its child returns from the cell (no ``os._exit``): the child's copy
    of the runner waits for work of its own, never for the parent's, so every later call
    runs at once (a go signal shared across the fork would wake either runner)."""
    forked = ex.execute_code("import os\npid = os.fork()", state_mode="stateful")
    assert forked.get("error_type") is None, forked
    child = ex.execute_code("pid", state_mode="stateful")["result"]
    try:
        for i in range(30):
            started = time.monotonic()
            out = ex.execute_code(f"n = {i}", state_mode="stateful", timeout=10)
            assert out.get("error_type") is None, (i, out)
            assert time.monotonic() - started < 5, i
    finally:
        with contextlib.suppress(OSError, ValueError, TypeError):
            os.kill(int(child), 9)


def test_code_a_timeout_stopped_before_it_began_never_runs_later(root: Path,
                                                                 tmp_path: Path) -> None:
    """A call whose timeout ends before the runner took its code answers at once, and
    that code never runs after the answer: not on the runner's next wake, not at close.
    Each call appends its number to a file; no number may appear once its call returned
    without it. (The interrupt was aimed at the runner before it took the job: landing
    in its bookkeeping, it left the job for a later wake, or ended the thread and the
    session answered ``busy`` for good.)"""
    trail = tmp_path / "trail"
    trail.touch()

    def seen() -> set[int]:
        return {int(n) for n in trail.read_text().split()}

    ex = Executor(root=root, log=False)
    said_not_run: set[int] = set()
    try:
        for i in range(300):
            if i % 50 == 25:  # the session still answers
                assert ex.execute_code("1 + 1", state_mode="stateful")["result"] == "2"
            r = ex.execute_code(f"with open({str(trail)!r}, 'a') as f: f.write('{i} ')",
                                state_mode="stateful", timeout=0.000001)
            now = seen()
            assert now <= set(range(i + 1)) - said_not_run, (i, r)
            if i not in now:
                said_not_run.add(i)
    finally:
        ex.close()  # right after a call whose code the runner may not have taken
    assert not seen() & said_not_run


def test_an_interrupt_pending_as_the_code_returns_never_ends_the_runner() -> None:
    """The caller's interrupt sent just as the code returns is still pending when the
    job is over: it must land where the runner catches it. (It landed at the runner
    loop's backward jump, outside its ``try``: the thread ended, the caller was never
    told, and the session answered busy for good.)"""
    import ctypes
    import functools

    from coordex.backends.own.runner import Runner
    from coordex.worker import _coordex_engine as engine

    runner = Runner()

    class Late:  # ``Late() == 0`` sets the interrupt from C: nothing delivers it before
        __eq__ = functools.partial(  # the job has returned
            ctypes.pythonapi.PyThreadState_SetAsyncExc, ctypes.c_ulong(runner.ident),
            ctypes.py_object(engine.Interrupt))

    def job() -> None:
        Late() == 0  # noqa: B015

    ended: list[type[BaseException]] = []
    old_hook = threading.excepthook
    threading.excepthook = lambda args: ended.append(args.exc_type)
    try:
        runner.submit(job)
        told = runner.done.acquire(True, 2.0)
    finally:
        threading.excepthook = old_hook
        runner.close()
    assert told and not ended, ended


@pytest.mark.slow
def test_timeouts_that_end_as_the_code_returns_never_leave_the_session_busy(
        root: Path) -> None:
    """Calls whose 2 ms timeout ends about when their code does, with threads switched
    often (as on a loaded machine): the session answers the next call every time."""
    import random
    import sys

    ended: list[type[BaseException]] = []
    old_hook, old_interval = threading.excepthook, sys.getswitchinterval()
    threading.excepthook = lambda args: ended.append(args.exc_type)
    sys.setswitchinterval(1e-5)
    ex = Executor(root=root, log=False)
    try:
        spin = "import time\nend = time.perf_counter() + {}\nwhile time.perf_counter() < end: pass"
        until = time.monotonic() + 10
        while time.monotonic() < until and not ended:
            ex.execute_code(spin.format(random.uniform(0, 0.004)), state_mode="stateful",
                            timeout=0.002)
        after = ex.execute_code("1 + 1", state_mode="stateful")
    finally:
        sys.setswitchinterval(old_interval)
        threading.excepthook = old_hook
        ex.close()
    assert not ended and after.get("result") == "2", (ended, after)
