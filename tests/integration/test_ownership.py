"""Nothing outlives its owner, nothing leaks out of a copy (SPEC sections 1 and 6).

Real processes throughout: own-interpreter read-only copies forked in parallel, code
that starts processes with ``subprocess.Popen`` and ``os.fork``, copies that try to reach
back into the session or into coordex. Every test checks that no process it caused
survives.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from coordex import Executor
from coordex.backends.base import INTERRUPT_GRACE
from tests.said import said

from ..conftest import alive

pytestmark = [
    pytest.mark.skipif(os.uname().sysname != "Linux", reason="Linux kernel features"),
    pytest.mark.timeout(120),
]


def _gone(pids: list[int], within: float = 5.0) -> list[int]:
    """The pids of ``pids`` still alive after ``within`` seconds."""
    deadline = time.monotonic() + within
    left = [p for p in pids if alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if alive(p)]
    return left


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def test_parallel_own_read_only_calls_never_raise(ex: Executor) -> None:
    """Soak N1: copies reaped by several threads at once raised ``list.remove``."""
    for i in range(4):
        assert "error" not in ex.execute_code(f"n = {i}", state_mode="stateful",
                                              session_name=f"s{i}")
    errors: list[BaseException] = []
    results: list[dict[str, Any]] = []
    stop_at = time.monotonic() + 4.0

    def loop(i: int) -> None:
        while time.monotonic() < stop_at:
            try:
                results.append(ex.execute_code("n + 1", state_mode="read_only",
                                               session_name=f"s{i % 4}"))
            except BaseException as exc:  # the bug: an exception out of the API
                errors.append(exc)

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [], errors[:3]
    assert results and all("error" not in r for r in results), \
        [r for r in results if "error" in r][:3]


# -- a read-only copy holds nothing of coordex or of the session's children -----------

_FDS = """
import os
def _kinds():
    out = []
    for name in os.listdir('/proc/self/fd'):
        try:
            out.append(os.readlink('/proc/self/fd/' + name))
        except OSError:
            pass
    return out
_kinds()
"""


def _pipe_inode(fd: int) -> str:
    return f"pipe:[{os.fstat(fd).st_ino}]"


def test_copy_holds_neither_the_keepers_pipe_nor_a_poller(ex: Executor) -> None:
    """Security N11 and N13: the keeper's pipe and the output pump's epoll were inherited."""
    from coordex.backends import _reap

    assert "error" not in ex.execute_code("sleep 0", language="bash", state_mode="stateful")
    keeper = _reap.keeper()._proc
    assert keeper is not None and keeper.stdin is not None
    keeper_pipe = _pipe_inode(keeper.stdin.fileno())
    assert "error" not in ex.execute_code("x = 1", state_mode="stateful", session_name="p")
    result = ex.execute_code(_FDS, state_mode="read_only", session_name="p")
    assert "error" not in result, result
    held = result["result"]
    assert keeper_pipe not in held, held
    assert not [k for k in held if k.startswith("anon_inode:")], held


def test_copy_cannot_drive_a_child_of_the_session(ex: Executor, tmp_path: Path) -> None:
    """Security N14: a copy wrote commands into a shell the session had started."""
    target = tmp_path / "written-by-copy"
    setup = ("import subprocess\n"
             "sh = subprocess.Popen(['sh'], stdin=subprocess.PIPE, stdout=subprocess.PIPE)")
    assert "error" not in ex.execute_code(setup, state_mode="stateful", session_name="c")
    attack = (f"import os\n"
              f"try:\n"
              f"    os.write(sh.stdin.fileno(), b'echo x > {target}\\n')\n"
              f"    sent = 'sent'\n"
              f"except OSError as exc:\n"
              f"    sent = type(exc).__name__\n"
              f"sent")
    result = ex.execute_code(attack, state_mode="read_only", session_name="c")
    assert "error" not in result, result
    assert result["result"] != "'sent'", result
    end = ex.execute_code("sh.stdin.close(); sh.wait(5); out = sh.stdout.read()\n"
                          "sh.stdout.close()\nout", state_mode="stateful", session_name="c")
    assert end["result"] == "b''", end
    assert not target.exists()


_SYSV = """
import ctypes, ctypes.util
libc = ctypes.CDLL(ctypes.util.find_library('c'), use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
"""


def test_copy_cannot_write_the_sessions_sysv_segment(ex: Executor) -> None:
    """Security N12: a copy re-attached the session's System V segment and wrote it."""
    setup = _SYSV + (
        "shmid = libc.shmget(0, 4096, 0o1600)\n"  # IPC_PRIVATE, IPC_CREAT | 0600
        "addr = libc.shmat(shmid, None, 0)\n"
        "ctypes.memmove(addr, b'ORIG', 4)\n"
        "shmid")
    made = ex.execute_code(setup, state_mode="stateful", session_name="v")
    assert "error" not in made and int(made["result"]) >= 0, made
    try:
        attack = ("again = libc.shmat(shmid, None, 0)\n"
                  "ok = again not in (None, ctypes.c_void_p(-1).value)\n"
                  "if ok: ctypes.memmove(again, b'CHGD', 4)\n"
                  "ok")
        result = ex.execute_code(attack, state_mode="read_only", session_name="v")
        assert "error" not in result, result
        after = ex.execute_code("ctypes.string_at(addr, 4)", state_mode="stateful",
                                session_name="v")
        assert result["result"] == "False" or after["result"] == "b'ORIG'", (result, after)
        if after["result"] != "b'ORIG'":
            assert result["isolation"]["objects"] is False, result
    finally:
        ex.execute_code("libc.shmdt(ctypes.c_void_p(addr)); libc.shmctl(shmid, 0, None)",
                        state_mode="stateful", session_name="v")


_BACKGROUND = """
import os, subprocess, time
p = subprocess.Popen(['sleep', '60'])
pid = os.fork()
if pid == 0:
    os.setsid()
    for fd in (0, 1, 2):
        os.close(fd)
    time.sleep(60)
    os._exit(0)
[p.pid, pid]
"""


def test_a_copys_background_children_end_with_it(ex: Executor) -> None:
    """Security N19: a read-only call that forks returned only at its timeout, and what
    it started kept running after."""
    assert "error" not in ex.execute_code("x = 1", state_mode="stateful", session_name="b")
    started = time.monotonic()
    result = ex.execute_code(_BACKGROUND, state_mode="read_only", session_name="b",
                             timeout=20)
    took = time.monotonic() - started
    assert "error" not in result, result
    pids = [int(p) for p in result["result"].strip("[]").split(",")]
    try:
        assert took < 5, took
        assert _gone(pids) == []
    finally:
        _kill(pids)


def _launchers() -> list[int]:
    """Pids of the bash sessions' launcher servers among this process's children."""
    from ..conftest import child_pids

    found = []
    for pid in child_pids():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"launcher.py" in f.read():
                    found.append(pid)
        except OSError:
            pass
    return found


def test_a_bash_copy_is_never_left_unprotected(ex: Executor, tmp_path: Path) -> None:
    """Soak N3: when the launcher failed, the code ran in a plain subshell
    (``files: "none"``) and its writes stayed on disk. A copy is made again instead."""
    from coordex.backends import isolation

    if isolation.best_mode() == "none":
        pytest.skip("no protection on this machine")
    work = tmp_path / "work"
    work.mkdir()
    assert "error" not in ex.execute_code(f"cd {work}", language="bash",
                                          state_mode="stateful")
    first = ex.execute_code("echo hi", language="bash", state_mode="read_only",
                            session_id=0)
    assert first["isolation"]["files"] != "none", first
    for round_ in range(3):
        for pid in _launchers():
            os.kill(pid, signal.SIGKILL)
        result = ex.execute_code(f"echo x > left{round_}", language="bash",
                                 state_mode="read_only", session_id=0)
        assert not (work / f"left{round_}").exists(), result
        assert result["isolation"]["files"] != "none", result


# -- processes the own interpreter's code starts ---------------------------------------

_START_TWO = """
import os, subprocess, time
p = subprocess.Popen(['sleep', '60'])
child = os.fork()
if child == 0:
    time.sleep(60)
    os._exit(0)
[p.pid, child]
"""


# The code below never waits for the Popen it starts, as code a model writes often does:
# Python warns when such an object goes, whoever ended the process.
unwaited = pytest.mark.filterwarnings("ignore::ResourceWarning",
                                      "ignore::pytest.PytestUnraisableExceptionWarning")


def _pids(result: dict[str, Any]) -> list[int]:
    assert "error" not in result, result
    return [int(p) for p in result["result"].strip("[]").split(",")]


@unwaited
def test_own_interpreter_children_end_when_the_executor_closes(root: Path) -> None:
    """Soak N12: ``Popen`` and ``os.fork`` children of own-interpreter code outlived
    ``close()``."""
    ex = Executor(root=root, timeout=30)
    pids: list[int] = []
    try:
        pids += _pids(ex.execute_code(_START_TWO, state_mode="stateful", session_name="k"))
        pids += _pids(ex.execute_code(_START_TWO))  # stateless
        pids += _pids(ex.execute_code(
            "import subprocess\n"
            "[subprocess.Popen(['sh', '-c', 'sleep 60 & sleep 61; wait']).pid, 0][:1] * 2",
            state_mode="stateful", session_name="k"))
        assert all(alive(p) for p in pids)
    finally:
        ex.close()
    try:
        assert _gone(pids) == []
    finally:
        _kill(pids)


@unwaited
def test_own_interpreter_children_end_when_their_session_closes(ex: Executor) -> None:
    pids = _pids(ex.execute_code(_START_TWO, state_mode="stateful", session_name="k"))
    other = _pids(ex.execute_code(_START_TWO, state_mode="stateful", session_name="o"))
    try:
        assert "error" not in ex.close_session(session_name="k")
        assert _gone(pids) == []
        assert all(alive(p) for p in other)
    finally:
        _kill(pids)


def test_output_after_a_call_returned_reaches_no_other_call(ex: Executor) -> None:
    """Soak N2: a background writer started by own-interpreter code put its lines into
    other sessions' results."""
    started = ex.execute_code(
        "import subprocess\n"
        "w = subprocess.Popen(['sh', '-c', 'while :; do echo BGOWN; sleep 0.01; done'])\n"
        "w.pid", state_mode="stateful", session_name="writer")
    assert "error" not in started, started
    try:
        seen = []
        for _ in range(15):
            for kw in ({"state_mode": "stateful", "session_name": "reader"}, {}):
                r = ex.execute_code("import time; time.sleep(0.03); print('mine')", **kw)
                assert "error" not in r, r
                seen.append(r["stdout"])
        assert all(s == "mine\n" for s in seen), [s for s in seen if s != "mine\n"][:3]
        later = ex.execute_code("import time; time.sleep(0.03); print('mine')",
                                state_mode="stateful", session_name="writer")
        assert "BGOWN" not in later["stdout"], later
    finally:
        ex.execute_code("w.kill(); w.wait()", state_mode="stateful", session_name="writer")


def test_own_calls_in_flight_at_close_answer_at_once_and_honestly(root: Path) -> None:
    """Soak N15: own calls in flight at close() answered when their code ended, said it
    was interrupted, and the stateless one claimed ``state_lost``."""
    ex = Executor(root=root, timeout=60)
    results: dict[str, dict[str, Any]] = {}
    answered: dict[str, float] = {}

    def call(kind: str, **kw: Any) -> None:
        results[kind] = ex.execute_code("import time\ntime.sleep(8)", **kw)
        answered[kind] = time.monotonic()

    threads = [threading.Thread(target=call, args=("stateful",),
                                kwargs={"state_mode": "stateful", "session_name": "z"}),
               threading.Thread(target=call, args=("stateless",))]
    for t in threads:
        t.start()
    time.sleep(0.5)
    closed = time.monotonic()
    ex.close()
    for t in threads:
        t.join(10)
    assert set(results) == {"stateful", "stateless"}
    for kind, result in results.items():
        assert result.get("error_type") == "crashed", result
        # The interrupt's grace, not the code's 8 s (a loaded machine adds a little).
        assert answered[kind] - closed < INTERRUPT_GRACE + 2.0, (kind, answered[kind] - closed)
    assert results["stateless"].get("state_lost") is not True, results["stateless"]
    assert results["stateful"]["state_lost"] is True
    running = [r for r in results.values() if "may still run" in r["error"]]
    assert running, results  # the sleep goes on in the agent's process, and it says so


_DYING_HOST = r"""
import json, os, sys, time
from coordex import Executor
ex = Executor(root=sys.argv[1], timeout=60)
r = ex.execute_code("import subprocess\nprint(subprocess.Popen(['sleep', '305']).pid)")
own = int(r["stdout"])
# An os.fork child of own code that lives on: it must not keep the keeper waiting.
r = ex.execute_code("import os, time\nchild = os.fork()\n"
                    "if child == 0:\n    time.sleep(60)\n    os._exit(0)\nprint(child)",
                    state_mode="stateful", session_name="f")
forked = int(r["stdout"])
r = ex.execute_code("sleep 306 & echo $!", language="bash", state_mode="stateful")
with open(sys.argv[2], "w") as f:
    json.dump({"own_popen": own, "bash_bg": int(r["stdout"]), "forked": forked}, f)
time.sleep(600)
"""


@unwaited
def test_own_interpreter_children_end_when_the_host_is_killed(tmp_path: Path) -> None:
    """SPEC 6: processes coordex started, and those session code started, end within a
    few seconds of a host SIGKILL - own-interpreter ``Popen`` and ``os.fork`` children
    included (a fork child held the keeper's pipe, so nothing ended while it lived)."""
    import json
    import subprocess
    import sys

    report = tmp_path / "pids.json"
    host = subprocess.Popen([sys.executable, "-c", _DYING_HOST, str(tmp_path / "home"),
                             str(report)], stderr=subprocess.DEVNULL)
    pids: dict[str, int] = {}
    try:
        deadline = time.monotonic() + 60
        while not report.exists() or not report.read_text():
            assert host.poll() is None
            assert time.monotonic() < deadline
            time.sleep(0.05)
        pids = json.loads(report.read_text())
        assert all(alive(p) for p in pids.values()), pids
        host.kill()
        host.wait(10)
        left = _gone([pids["own_popen"], pids["bash_bg"], pids["forked"]])
        assert left == [], (left, pids)
    finally:
        if host.poll() is None:
            host.kill()
            host.wait()
        _kill(list(pids.values()))


# -- fds 1 and 2 come back for the next call (F11) ---------------------------------------


def test_a_shell_that_closed_its_fds_1_and_2_prints_again(ex: Executor) -> None:
    closed = ex.execute_code("exec 1>&- 2>&-; echo gone", language="bash",
                             state_mode="stateful")
    assert "gone" not in closed["stdout"], closed
    back = ex.execute_code("echo back; echo err >&2; (echo child)", language="bash",
                           state_mode="stateful")
    assert back["stdout"] == "back\nchild\n", back
    assert back["stderr"] == "err\n", back


def test_a_worker_that_closed_its_fds_1_and_2_prints_again() -> None:
    import sys

    from coordex.backends.base import RunRequest
    from coordex.backends.env.workers import WorkerSession

    session = said(WorkerSession(sys.executable))
    try:
        session.run(RunRequest("import os, sys\nos.close(1)\nos.close(2)\nsys.stdout.close()",
                               timeout=30))
        back = session.run(RunRequest(
            "import os, subprocess, sys\nprint('back')\nprint('err', file=sys.stderr)\n"
            "os.write(1, b'raw\\n')\nsubprocess.run(['echo', 'child'])", timeout=30))
        assert back["stdout"] == "back\nraw\nchild\n", back
        assert back["stderr"] == "err\n", back
    finally:
        session.close()


def test_a_copy_survives_a_proc_file_of_a_process_gone(ex: Executor) -> None:
    """Found by the soak: a /proc file the session held open, of a process that has
    ended since, made the copy's reopen fail (ESRCH) and the copy die."""
    setup = ("import subprocess\nchild = subprocess.Popen(['sleep', '0'])\n"
             "f = open(f'/proc/{child.pid}/status', 'rb')\nf.read(10)\nchild.wait()")
    assert "error" not in ex.execute_code(setup, state_mode="stateful", session_name="p")
    result = ex.execute_code("1 + 1", state_mode="read_only", session_name="p")
    assert result.get("result") == "2", result
    ex.execute_code("f.close()", state_mode="stateful", session_name="p")


def test_a_worker_copys_background_children_end_with_it() -> None:
    """Security N19 in an environment worker: what a read-only copy starts ends with it,
    and the copy holds no pipe to the worker's own children."""
    import sys

    from coordex.backends.base import RunRequest
    from coordex.backends.env.workers import WorkerSession

    session = said(WorkerSession(sys.executable))
    pids: list[int] = []
    try:
        session.run(RunRequest("import subprocess\nsh = subprocess.Popen(['cat'], "
                               "stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)", timeout=30))
        started = time.monotonic()
        result = session.run_read_only(RunRequest(_BACKGROUND, timeout=20))
        assert "error" not in result, result
        assert time.monotonic() - started < 5
        pids = [int(p) for p in result["result"].strip("[]").split(",")]
        assert _gone(pids) == []
        drive = session.run_read_only(RunRequest(
            "import os\ntry:\n    os.write(sh.stdin.fileno(), b'x')\n    r = 'sent'\n"
            "except OSError as exc:\n    r = type(exc).__name__\nr", timeout=20))
        assert drive["result"] != "'sent'", drive
        session.run(RunRequest("sh.stdin.close(); sh.wait(5)", timeout=30))
    finally:
        _kill(pids)
        session.close()


def test_a_stateless_call_whose_process_dies_never_says_state_lost(ex: Executor) -> None:
    """Soak F11 (wording): a killed stateless shell said ``state_lost: true``; a
    stateless call had no state to lose (SPEC 6)."""
    import sys

    from coordex.backends.base import RunRequest
    from coordex.backends.env.workers import WorkerTemplate

    killed = ex.execute_code("kill -9 $$", language="bash")
    assert killed["error_type"] == "crashed", killed
    assert killed.get("state_lost") is not True, killed
    template = said(WorkerTemplate(sys.executable))
    try:
        died = template.run_stateless(RunRequest("import os; os._exit(3)", timeout=30))
        assert died["error"]["error_type"] == "crashed", died
        assert died["error"].get("state_lost") is not True, died
        assert died.get("state_lost") is not True, died
    finally:
        template.close()


def test_an_own_copy_whose_protection_failed_once_is_made_again(tmp_path: Path) -> None:
    """SPEC 1, no silent downgrade: where protection works, a fork copy in which it did
    not hold this once runs nothing and is made again (real forks; the first copy's
    protection is made to fail)."""
    from coordex.backends import isolation
    from coordex.backends.base import RunRequest
    from coordex.backends.own.copies import run_read_only
    from coordex.backends.own.interpreter import OwnInterpreter

    if isolation.best_mode() == "none":
        pytest.skip("no protection on this machine")
    tries = tmp_path / "tries"
    tries.mkdir()
    work = tmp_path / "work"
    work.mkdir()

    def flaky(map_identity: Any) -> str:  # in the fork child
        (tries / str(os.getpid())).touch()
        if len(os.listdir(tries)) == 1:
            return "none"  # as if unshare or Landlock failed this once
        scratch = tmp_path / f"scratch-{os.getpid()}"
        scratch.mkdir()
        return str(isolation.protect([str(work)], str(scratch), map_identity=map_identity))

    interp = OwnInterpreter()
    try:
        session = interp.new_session()
        session.cwd = str(work)
        interp.run(session, RunRequest("x = 41", timeout=30))
        code = f"open({str(work / 'written')!r}, 'w').write('x'); x + 1"
        result = run_read_only(interp, session, RunRequest(code, timeout=30,
                                                           scratch=str(tmp_path)), flaky)
        assert result.ok and result.result == "42", result
        assert result.isolation is not None and result.isolation["files"] != "none", result
        assert len(os.listdir(tries)) == 2
        assert not (work / "written").exists()  # neither copy wrote it to the disk
    finally:
        interp.close()


@unwaited
def test_close_leaves_the_agents_own_processes_alone(root: Path) -> None:
    """Only what own-interpreter code started is ended: a process the agent itself
    started, before or between calls, outlives the Executor as it should."""
    import subprocess

    agents = [subprocess.Popen(["sleep", "60"])]
    ex = Executor(root=root, timeout=30)
    pids: list[int] = []
    try:
        pids += _pids(ex.execute_code(_START_TWO, state_mode="stateful", session_name="k"))
        agents.append(subprocess.Popen(["sleep", "60"]))
        ex.close()
        assert _gone(pids) == []
        assert [proc.poll() for proc in agents] == [None, None]
    finally:
        ex.close()
        for proc in agents:
            proc.kill()
            proc.wait()
        _kill(pids)
