"""One conformance suite: every SPEC promise, through the public API, over every place.

The places are the agent's own interpreter (Python), an environment worker (Python in a
built environment) and bash. Each gets the same story — state kept by stateful calls,
nothing kept by stateless ones, read-only copies that change nothing, the same
coordinate errors — and the same event (a timeout that the code survives, a busy
session, a closed executor, a process found dead) gives the same ``error_type``,
``state_lost`` and wording in each.

A new place is one more entry in ``PLACES``.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from coordex import Executor
from coordex.backends import late_output
from coordex.backends.base import Checkpointable, Forkable, Kept, RunsNested
from coordex.backends.env.workers import WorkerSession
from coordex.backends.own import OwnSession
from coordex.backends.shell import ShellSession
from tests.conftest import alive, assert_no_new_children, child_pids

pytestmark = pytest.mark.timeout(60)


@dataclass(frozen=True)
class Place:
    id: str
    language: str
    in_environment: bool
    set_v: str      # binds v to 41
    show_v: str     # prints v (or an empty line when unbound)
    change_v: str   # rebinds v to 99
    slow: str       # runs for ~30 s unless interrupted
    pid: str        # prints the pid of the process holding the session
    killable: bool  # the process holding a session can be killed and replaced
    session: type   # its sessions' class: the capabilities it has (backends/base.py)


PY_SLOW = "import time\nwhile True: time.sleep(0.01)"
PLACES = [
    Place("own", "python", False, "v = 41", "print(globals().get('v', ''))", "v = 99",
          PY_SLOW, "import os; print(os.getpid())", killable=False, session=OwnSession),
    Place("worker", "python", True, "v = 41", "print(globals().get('v', ''))", "v = 99",
          PY_SLOW, "import os; print(os.getpid())", killable=True, session=WorkerSession),
    Place("bash", "bash", False, "v=41", 'echo "$v"', "v=99", "sleep 30", "echo $$",
          killable=True, session=ShellSession),
]

# The optional capabilities a place's sessions may have: each has its rows below, run
# over every place whose sessions implement it, skipped (with the reason) elsewhere.
CAPABILITIES: dict[str, type] = {"kept": Kept, "forked": Forkable,
                                 "checkpointed": Checkpointable, "called into": RunsNested}


def needs(at: At, capability: str) -> None:
    """Skip unless the place's sessions have ``capability``."""
    protocol = CAPABILITIES[capability]
    if not issubclass(at.place.session, protocol):
        pytest.skip(f"a {at.place.session.__name__} cannot be {capability} (it is no "
                    f"backends.base.{protocol.__name__})")


PROCESS = {"own": "agent's own interpreter", "worker": "worker process", "bash": "bash shell"}


@dataclass
class At:
    """An executor and the coordinates of one place in it."""

    ex: Executor
    place: Place
    venv_id: int | None
    process: str = ""  # what messages call the process holding a session here

    def __post_init__(self) -> None:
        self.process = self.process or PROCESS[self.place.id]

    def run(self, code: str, **kw: Any) -> dict[str, Any]:
        return self.ex.execute_code(code, language=self.place.language, venv_id=self.venv_id,
                                    **kw)

    def where(self, **kw: Any) -> dict[str, Any]:
        return {"language": self.place.language, "venv_id": self.venv_id, **kw}


@pytest.fixture(scope="module")
def envs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("envs")


@pytest.fixture(params=PLACES, ids=lambda p: p.id)
def at(request: pytest.FixtureRequest, tmp_path: Path, envs_dir: Path) -> Iterator[At]:
    place: Place = request.param
    before = child_pids()
    ex = Executor(root=tmp_path / "home", timeout=30, envs_dir=envs_dir)
    try:
        venv_id = None
        if place.in_environment:
            # An environment with no requirements: a real uv build, offline, ~0.2 s.
            created = ex.environments.create("# no requirements\n", name="bare")
            venv_id = created["venv_id"]
            assert ex.environments.build(venv_id).get("built") is True
        yield At(ex, place, venv_id)
    finally:
        ex.close()
    assert_no_new_children(before)  # closing an Executor ends every process it started


# -- the three modes ------------------------------------------------------------------


def test_stateful_keeps_state(at: At) -> None:
    at.run(at.place.set_v, state_mode="stateful", session_name="s")
    r = at.run(at.place.show_v, state_mode="stateful", session_name="s")
    assert r["stdout"] == "41\n"
    assert r["session"] == {"language": at.place.language, "venv_id": at.venv_id,
                            "session_id": 1, "session_name": "s"}


def test_stateful_without_a_session_uses_session_0(at: At) -> None:
    at.run(at.place.set_v, state_mode="stateful")
    r = at.run(at.place.show_v, state_mode="stateful", session_id=0)
    assert r["stdout"] == "41\n"
    assert r["session"]["session_id"] == 0


def test_stateless_sees_and_keeps_nothing(at: At) -> None:
    at.run(at.place.set_v, state_mode="stateful", session_name="s")
    assert at.run(at.place.show_v)["stdout"] == "\n"
    at.run(at.place.change_v)
    assert at.run(at.place.show_v)["stdout"] == "\n"
    assert at.run(at.place.show_v, state_mode="stateful", session_name="s")["stdout"] == "41\n"


def test_read_only_sees_the_session_and_changes_nothing(at: At) -> None:
    at.run(at.place.set_v, state_mode="stateful", session_name="s")
    r = at.run(at.place.change_v + "\n" + at.place.show_v, state_mode="read_only",
               session_name="s")
    assert r["stdout"] == "99\n"
    assert r["state_mode"] == "read_only"
    assert r["isolation"]["names"] is True
    assert r["isolation"]["files"] in ("discarded", "refused", "none")
    assert at.run(at.place.show_v, state_mode="stateful", session_name="s")["stdout"] == "41\n"


def test_read_only_of_a_missing_session_is_not_found(at: At) -> None:
    r = at.run(at.place.show_v, state_mode="read_only", session_name="missing")
    assert r["error_type"] == "not_found"
    assert "stateful" in r["suggestion"]


def test_the_same_coordinate_errors(at: At) -> None:
    r = at.run(at.place.show_v, state_mode="read_only")
    assert r["error"] == "Cannot use state_mode='read_only' without specifying a session."
    assert r["error_type"] == "validation"
    assert at.run(at.place.show_v, session_id=1)["error_type"] == "validation"
    r = at.run(at.place.show_v, state_mode="stateful", session_id=1, session_name="x")
    assert r["error_type"] == "validation"
    assert at.run(at.place.show_v, state_mode="sideways")["error_type"] == "validation"


def test_closed_sessions_are_gone(at: At) -> None:
    at.run(at.place.set_v, state_mode="stateful", session_name="gone")
    closed = at.ex.close_session(**at.where(session_name="gone"))
    assert closed["closed"] is True
    assert at.run(at.place.show_v, state_mode="read_only",
                  session_name="gone")["error_type"] == "not_found"
    assert at.run(at.place.show_v, state_mode="stateful", session_name="gone")["stdout"] == "\n"


def test_list_and_inspect_see_the_session_and_change_nothing(at: At) -> None:
    at.run(at.place.set_v, state_mode="stateful", session_name="look")
    listed = [s for s in at.ex.list_sessions()["sessions"] if s["session_name"] == "look"]
    assert len(listed) == 1
    assert listed[0]["alive"] is True and listed[0]["calls"] == 1
    report = at.ex.inspect_session(**at.where(session_name="look"))
    assert "error_type" not in report, report
    if at.place.language == "python":
        assert [n["name"] for n in report["names"]] == ["v"]
    else:
        assert report["variables"].get("v") == "41"
    assert at.run(at.place.show_v, state_mode="stateful", session_name="look")["stdout"] == "41\n"


def test_output_streams_through_on_output(at: At) -> None:
    chunks: list[tuple[str, str]] = []
    r = at.run(at.place.set_v + "\n" + at.place.show_v,
               on_output=lambda s, t: chunks.append((s, t)))
    assert "".join(t for s, t in chunks if s == "stdout") == r["stdout"] == "41\n"


# -- the same event, the same answer ----------------------------------------------------


@pytest.mark.parametrize("mode", ["stateless", "stateful"])
def test_a_timeout_that_the_code_survives(at: At, mode: str) -> None:
    kw: dict[str, Any] = {"state_mode": mode}
    if mode == "stateful":
        kw["session_name"] = "slow"
        at.run(at.place.set_v, **kw)
    started = time.monotonic()
    r = at.run(at.place.slow, timeout=0.5, **kw)
    assert time.monotonic() - started < 5
    assert r["error_type"] == "timeout"
    assert r["state_lost"] is False
    assert "0.5 s" in r["error"] and r["suggestion"]
    if mode == "stateful":
        assert at.run(at.place.show_v, **kw)["stdout"] == "41\n"


def test_a_busy_session_reads_the_same_everywhere(at: At) -> None:
    at.run(at.place.set_v, state_mode="stateful", session_name="busy")
    first: dict[str, Any] = {}
    runner = threading.Thread(target=lambda: first.update(
        at.run(at.place.slow, state_mode="stateful", session_name="busy", timeout=2)))
    runner.start()
    time.sleep(0.3)
    r = at.run(at.place.show_v, state_mode="stateful", session_name="busy", timeout=0.3)
    runner.join()
    assert r["error_type"] == "timeout"
    assert r["error"] == "The session stayed busy with another call for the whole timeout."
    assert r["state_lost"] is False
    assert first["error_type"] == "timeout"


def test_a_closed_executor_answers_with_an_error(at: At) -> None:
    at.run(at.place.set_v, state_mode="stateful", session_name="s")
    at.ex.close()
    for kw in ({}, {"state_mode": "stateful", "session_name": "s"},
               {"state_mode": "read_only", "session_name": "s"}):
        r = at.run(at.place.show_v, **kw)
        assert r["error_type"] == "validation"
        assert r["error"] == "This Executor is closed."


def test_a_process_found_dead_is_replaced_and_says_state_lost(at: At) -> None:
    if not at.place.killable:
        pytest.skip("the agent's own interpreter is this process")
    at.run(at.place.set_v, state_mode="stateful", session_name="k")
    pid = int(at.run(at.place.pid, state_mode="stateful", session_name="k")["stdout"])
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                break
        time.sleep(0.02)
    r = at.run(at.place.show_v, state_mode="stateful", session_name="k")
    assert "error_type" not in r, r
    assert r["state_lost"] is True
    assert r["stdout"] == "\n"
    again = at.run(at.place.show_v, state_mode="stateful", session_name="k")
    assert "state_lost" not in again  # a loss is reported once


def test_stateless_calls_leave_no_process(at: At) -> None:
    before = child_pids()
    for _ in range(3):
        assert at.run(at.place.show_v)["stdout"] == "\n"
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        extra = child_pids() - before
        # Environments keep warm fork-server templates (owned and ended at close).
        if at.place.in_environment or not extra:
            break
        time.sleep(0.05)
    if not at.place.in_environment:
        assert child_pids() - before == set()


def test_a_cancelled_call_is_interrupted_as_at_its_timeout(at: At) -> None:
    at.run(at.place.set_v, state_mode="stateful", session_name="c")
    cancel = threading.Event()
    timer = threading.Timer(0.4, cancel.set)
    timer.start()
    started = time.monotonic()
    try:
        r = at.run(at.place.slow, state_mode="stateful", session_name="c", timeout=30,
                   cancel=cancel)
    finally:
        timer.cancel()
    assert time.monotonic() - started < 5
    assert r["error_type"] == "timeout" and r["state_lost"] is False
    # Said as its caller's doing, not as a timeout to raise (SPEC 11's log shows it so).
    assert r["error"].startswith("The call was cancelled by its caller"), r
    assert "past its timeout" not in r["error"] and "timeout=" not in r["suggestion"]
    assert "survived with its state" in r["error"], r
    assert at.run(at.place.show_v, state_mode="stateful", session_name="c")["stdout"] == "41\n"


def test_a_read_only_copy_that_kills_itself_is_crashed_in_the_same_words(at: At) -> None:
    """Every place: the copy's death is ``crashed`` (never a success with exit code
    137), the session is unchanged, and the signal is spelled one way."""
    at.run(at.place.set_v, state_mode="stateful", session_name="s")
    kill = "kill -9 $$" if at.place.language == "bash" else \
        "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"
    r = at.run(kill, state_mode="read_only", session_name="s")
    assert r["error_type"] == "crashed" and r["state_lost"] is False, r
    assert "read-only copy" in r["error"] and "killed by SIGKILL" in r["error"], r
    assert at.run(at.place.show_v, state_mode="stateful", session_name="s")["stdout"] == "41\n"


def test_an_exception_in_the_code_reads_the_same_everywhere(at: At) -> None:
    """The exception's own last line and one suggestion, whatever the place."""
    if at.place.language == "bash":
        pytest.skip("bash has no exceptions: a failing command is its exit_code")
    for mode, kw, after in (
            ("stateless", {}, "Read the traceback, fix the code and run it again."),
            ("stateful", {"session_name": "s"}, "Read the traceback, fix the code and run it "
             "again; the session's state is kept (names bound before the failing line too)."),
            ("read_only", {"session_name": "s"}, "Read the traceback, fix the code and run "
             "it again; the session is unchanged.")):
        r = at.run("print('before')\nraise ValueError('bad value')", state_mode=mode, **kw)
        assert r["error_type"] == "execution" and r["exception"] == "ValueError", r
        assert r["error"] == "ValueError: bad value"
        assert r["suggestion"] == after
        assert r["state_lost"] is False and r["stdout"] == "before\n"
        assert "ValueError: bad value" in r["traceback"]


def test_a_call_whose_session_is_closed_under_it_reads_the_same(at: At) -> None:
    if not at.place.killable:
        pytest.skip("code running in the agent's own interpreter cannot be ended under it")
    at.run(at.place.set_v, state_mode="stateful", session_name="s")
    closer = threading.Timer(0.5, lambda: at.ex.close_session(**at.where(session_name="s")))
    closer.start()
    started = time.monotonic()
    try:
        r = at.run(at.place.slow, state_mode="stateful", session_name="s", timeout=20)
    finally:
        closer.cancel()
    assert time.monotonic() - started < 10
    assert r["error_type"] == "crashed" and r["state_lost"] is True, r
    assert r["error"] == (f"This code's session was closed while this code ran; its "
                          f"{at.process} was ended.")
    again = at.run(at.place.show_v, state_mode="stateful", session_name="s")
    assert again["stdout"] == "\n" and "state_lost" not in again  # a fresh session


def stop(pid: int) -> None:
    """SIGSTOP ``pid`` and wait until it is stopped: a process the signal has not reached
    yet still takes a request written to it meanwhile (its read returns first)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat", "rb") as f:
            if f.read().rsplit(b")", 1)[1].split()[0] == b"T":
                return
        time.sleep(0.005)


def test_a_process_stopped_while_idle_reads_the_same(at: At) -> None:
    """A stopped process never takes the code: the call returns by its timeout and the
    grace, says the code did not run, and the next call starts fresh."""
    if not at.place.killable:
        pytest.skip("the agent's own interpreter is this process")
    at.run(at.place.set_v, state_mode="stateful", session_name="z")
    pid = int(at.run(at.place.pid, state_mode="stateful", session_name="z")["stdout"])
    stop(pid)
    started = time.monotonic()
    r = at.run(at.place.show_v, state_mode="stateful", session_name="z", timeout=2)
    assert time.monotonic() - started < 2 + 2 + 1.5
    assert r["error_type"] == "timeout" and r["state_lost"] is True, r
    assert r["error"] == (f"The session's {at.process} did not take the code "
                          "within its timeout of 2 s (it was stopped or stuck) and was "
                          "replaced: the code did not run, and the session's state is lost.")
    again = at.run(at.place.show_v, state_mode="stateful", session_name="z")
    assert again["stdout"] == "\n" and "state_lost" not in again, again


def test_a_death_near_the_deadline_returns_within_the_one_timeout(at: At,
                                                                  tmp_path: Path) -> None:
    """SPEC 6: the process dies 2 s into a call with timeout=4. A place that retries
    runs the call again in the 2 s left (then ``timeout``, retried); one that does not
    says ``crashed``. Either way the call is back by its timeout plus the grace."""
    if not at.place.killable:
        pytest.skip("the agent's own interpreter is this process")
    flag = tmp_path / "died-once"
    if at.place.language == "bash":
        code = f"if [ ! -e {flag} ]; then touch {flag}; sleep 2; kill -9 $$; fi; sleep 30"
    else:
        code = (f"import os, signal, time\nif not os.path.exists({str(flag)!r}):\n"
                f"    open({str(flag)!r}, 'w').close()\n    time.sleep(2)\n"
                "    os.kill(os.getpid(), signal.SIGKILL)\ntime.sleep(30)")
    at.run(at.place.set_v, state_mode="stateful", session_name="d")
    started = time.monotonic()
    r = at.run(code, state_mode="stateful", session_name="d", timeout=4)
    assert time.monotonic() - started < 4 + 2 + 0.5
    assert r["state_lost"] is True, r
    if at.place.language == "python":  # a worker is retried once (SPEC 6)
        assert r["error_type"] == "timeout" and r["retried"] is True, r
        assert "state from before this call is lost" in r["error"]
    else:  # a shell command is never run twice
        assert r["error_type"] == "crashed" and "retried" not in r, r
        assert "killed by SIGKILL" in r["error"]


RESULT_KEYS = {"stdout", "stderr", "truncated", "result", "exit_code", "images", "session",
               "state_mode", "duration_ms"}


def test_a_result_holds_the_specs_keys_and_no_others(at: At) -> None:
    """What a place reports for the session table and the log never reaches a result."""
    for mode, kw, extra in (("stateless", {}, set()),
                            ("stateful", {"session_name": "k"}, set()),
                            ("read_only", {"session_name": "k"}, {"isolation"})):
        r = at.run(at.place.set_v, state_mode=mode, **kw)
        assert set(r) == RESULT_KEYS | extra, (mode, r)


# -- results that fit (SPEC 14) ------------------------------------------------------------

BIG = 150_000  # characters of each stream: more than one result may carry


def test_what_does_not_fit_a_result_is_kept_whole_in_a_file(at: At, tmp_path: Path) -> None:
    from coordex.core.results import RESULT_BUDGET, json_bytes

    at.ex.spill_folder = tmp_path / "work" / ".coordex" / "out"
    if at.place.language == "python":
        code = (f"import sys\nprint(''.join(str(i % 10) for i in range({BIG})))\n"
                f"sys.stderr.write('e' * {BIG})\n'v' * {BIG}")
    else:
        code = (f"head -c {BIG} /dev/zero | tr '\\0' 'o'; echo; "
                f"head -c {BIG} /dev/zero | tr '\\0' 'e' >&2")
    r = at.run(code, state_mode="stateful", session_name="big")
    assert json_bytes(r) <= RESULT_BUDGET, json_bytes(r)
    assert set(r) == RESULT_KEYS | {"spilled"}, r.keys()
    assert r["truncated"] is True and "characters truncated" in r["stdout"]
    streams = {"stdout", "stderr"} | ({"result"} if at.place.language == "python" else set())
    assert set(r["spilled"]) == streams
    whole = {name: Path(path).read_text() for name, path in r["spilled"].items()}
    if at.place.language == "python":
        assert whole["stdout"] == "".join(str(i % 10) for i in range(BIG)) + "\n"
        assert whole["result"] == repr("v" * BIG)
    else:
        assert whole["stdout"] == "o" * BIG + "\n"
    assert whole["stderr"] == "e" * BIG
    # The session can read its files; they go with it when it is closed.
    path = r["spilled"]["stderr"]
    reread = at.run(f"wc -c < {path}" if at.place.language == "bash" else
                    f"with open({path!r}) as f:\n    n = len(f.read())\nprint(n)",
                    state_mode="stateful", session_name="big")
    assert reread["stdout"].strip() == str(BIG), reread
    small = at.run(at.place.show_v, state_mode="stateful", session_name="big")
    assert "spilled" not in small
    assert at.ex.close_session(at.place.language, session_name="big", venv_id=at.venv_id)["closed"]
    assert not [p for p in r["spilled"].values() if Path(p).exists()]


def test_a_killed_read_only_copy_is_crashed_not_run_again(at: At) -> None:
    """SPEC 6, "the same event reads the same": an environment's killed copy was run a
    second time (``retried``, "died 2 times") where the own interpreter's and bash's
    said ``crashed`` at once."""
    at.run(at.place.set_v, state_mode="stateful", session_name="s")
    kill = "kill -9 $$" if at.place.language == "bash" else \
        "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"
    r = at.run(kill, state_mode="read_only", session_name="s")
    assert r["error_type"] == "crashed" and r["state_lost"] is False, r
    assert "retried" not in r, r
    assert r["error"] == ("The read-only copy of the session died while running this code "
                          "(killed by SIGKILL); the session itself is unchanged."), r
    assert at.run(at.place.show_v, state_mode="stateful", session_name="s")["stdout"] == "41\n"


def test_calls_in_flight_at_close_read_the_same_in_every_mode(at: At) -> None:
    """SPEC 6: a stateful call in flight at ``close()`` said "This code's session was
    closed" where a stateless one said "The Executor was closed", and a read-only one
    "This session was closed ... its state is gone"; and close() waited on busy
    sessions' snapshots (persist) and on code blocked in C."""
    at.run(at.place.set_v, state_mode="stateful", session_name="s")
    slow = "sleep 30" if at.place.language == "bash" else "import time\ntime.sleep(30)"
    results: dict[str, dict[str, Any]] = {}
    calls = {"stateful": {"session_name": "t"}, "stateless": {},
             "read_only": {"session_name": "s"}}
    if at.place.id == "own":  # one call at a time runs in the agent's own interpreter
        calls = {"stateless": {}}

    def run(mode: str, kw: dict[str, Any]) -> None:
        results[mode] = at.run(slow, state_mode=mode, timeout=30, **kw)

    threads = [threading.Thread(target=run, args=item) for item in calls.items()]
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    started = time.monotonic()
    at.ex.close()
    for thread in threads:
        thread.join(10)
    assert time.monotonic() - started < 1.5
    ended = f"its {at.process} was ended"
    for mode, r in results.items():
        assert r["error_type"] == "crashed", (mode, r)
        assert r["error"].startswith(f"The Executor was closed while this code ran; {ended}"), \
            (mode, r)
        assert r["state_lost"] is (mode != "stateless"), (mode, r)
    assert set(results) == set(calls)


def test_output_written_after_its_call_returned_lands_in_no_later_call(at: At) -> None:
    """SPEC 6 (soak S4): what a background process writes after its call returned went
    into the session's next call (41 and 74 lines in bash and an environment)."""
    late = ("(sleep 0.3; echo LATE; echo LATE >&2) &" if at.place.language == "bash" else
            "import os\nos.spawnlp(os.P_NOWAIT, 'sh', 'sh', '-c', "
            "'sleep 0.3; echo LATE; echo LATE >&2')")
    first = at.run(late, state_mode="stateful", session_name="bg")
    assert "error" not in first and "LATE" not in first["stdout"], first
    time.sleep(1.0)  # it has written by now, between the calls
    mine = "echo mine" if at.place.language == "bash" else "print('mine')"
    r = at.run(mine, state_mode="stateful", session_name="bg")
    assert (r["stdout"], r["stderr"]) == ("mine\n", ""), r


# A writer the first call leaves running: a marker every 10 ms for 2 s on both streams,
# then it leaves a file named DONE, which says it was not stopped by its lost readers.
BACKGROUND_WRITERS = {
    ("bash", "process"): "(for i in $(seq 200); do echo BG; echo BG >&2; sleep 0.01; done; "
                         "touch DONE) &",
    ("python", "process"): (
        "import subprocess\n_bg = subprocess.Popen(['sh', '-c', 'for i in $(seq 200); do "
        "echo BG; echo BG >&2; sleep 0.01; done; touch DONE'])"),
    ("python", "thread"): (
        "import sys, threading, time\n"
        "def _bg():\n"
        "    for _ in range(200):\n"
        "        print('BG', flush=True); print('BG', file=sys.stderr, flush=True)\n"
        "        time.sleep(0.01)\n"
        "    open('DONE', 'w').close()\n"
        "threading.Thread(target=_bg, daemon=True).start()"),
    # Handlers keep the stream they were given: the call's own sys.stdout/sys.stderr.
    ("python", "logging"): (
        "import logging, sys, threading, time\n"
        "_log = logging.getLogger('coordex-bg')\n"
        "_log.propagate = False\n"
        "_log.addHandler(logging.StreamHandler(sys.stdout))\n"
        "_log.addHandler(logging.StreamHandler(sys.stderr))\n"
        "def _bg():\n"
        "    for _ in range(200):\n"
        "        _log.warning('BG')\n"
        "        time.sleep(0.01)\n"
        "    open('DONE', 'w').close()\n"
        "threading.Thread(target=_bg, daemon=True).start()"),
}


@pytest.mark.parametrize("writer", ["process", "thread", "logging"])
def test_output_written_while_a_later_call_runs_lands_in_no_later_call(
        at: At, writer: str, tmp_path: Path) -> None:
    """SPEC 6 (soak S4): a background writer an earlier call left running wrote into
    the later calls that ran while it wrote (bash, an environment; the own interpreter's
    threads too). A call's result holds what its own code wrote, and nothing else."""
    code = BACKGROUND_WRITERS.get((at.place.language, writer))
    if code is None:
        pytest.skip("bash starts no threads")
    done = tmp_path / "DONE"
    code = code.replace("DONE", str(done))
    dropped = late_output.dropped()
    first = at.run(code, state_mode="stateful", session_name="bg")
    assert "error" not in first, first
    mine = ("sleep 0.5; echo mine" if at.place.language == "bash" else
            "import time\ntime.sleep(0.5)\nprint('mine')")
    for _ in range(2):
        r = at.run(mine, state_mode="stateful", session_name="bg")
        assert (r["stdout"], r["stderr"]) == ("mine\n", ""), r
    # A fork of the session made while the writer writes: its calls are its own too.
    forked = at.ex.fork_session(session_name="bg", language=at.place.language,
                                venv_id=at.venv_id, new_name="bg-fork")
    assert "error" not in forked, forked
    r = at.run(mine, state_mode="stateful", session_name="bg-fork")
    assert (r["stdout"], r["stderr"]) == ("mine\n", ""), r
    # The writer wrote on to its end: losing its call's readers did not stop it.
    deadline = time.monotonic() + 10
    while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert done.exists()
    if (at.place.language, writer) == ("python", "process"):
        at.run("_bg.wait()", state_mode="stateful", session_name="bg")
    if at.place.id != "own" and writer == "process":
        # Read and dropped by the host, and the retired pipes closed once it ended.
        assert late_output.dropped() > dropped
        deadline = time.monotonic() + 5
        while any(t.name == "coordex-late-output" for t in threading.enumerate()):
            assert time.monotonic() < deadline
            time.sleep(0.05)


@pytest.mark.parametrize("when", ["idle", "mid-call"])
def test_a_stopped_process_returns_within_its_timeout_and_the_grace(at: At, when: str) -> None:
    """SPEC 6: no call returns later than its ``timeout`` plus 2 s. A SIGSTOPped
    environment worker came back 0.14-0.24 s past it (the kill at exactly timeout + 2 s,
    then the reaping and a new worker's start), a bash shell up to 0.05 s past."""
    if not at.place.killable:
        pytest.skip("the agent's own interpreter is this process")
    pid = int(at.run(at.place.pid, state_mode="stateful", session_name="st")["stdout"])
    if when == "idle":
        stop(pid)
    else:
        threading.Timer(0.5, os.kill, (pid, signal.SIGSTOP)).start()
    started = time.monotonic()
    r = at.run(at.place.slow, state_mode="stateful", session_name="st", timeout=2)
    took = time.monotonic() - started
    assert r["error_type"] == "timeout" and r["state_lost"] is True, r
    assert took <= 2 + 2, took


# -- kept (SPEC 12: the Kept capability) ----------------------------------------------------


def test_kept_sessions_come_back_after_a_restart(at: At, tmp_path: Path, envs_dir: Path
                                                 ) -> None:
    needs(at, "kept")
    root = tmp_path / "kept"

    def executor() -> tuple[Executor, int | None]:
        ex = Executor(root=root, timeout=30, envs_dir=envs_dir, persist=True)
        venv_id = None
        if at.place.in_environment:
            venv_id = ex.environments.create("# no requirements\n", name="bare")["venv_id"]
        return ex, venv_id

    ex, venv_id = executor()
    with ex:
        assert ex.execute_code(at.place.set_v, language=at.place.language, venv_id=venv_id,
                               state_mode="stateful", session_name="k").get("exit_code") \
            in (0, None)
    ex, venv_id = executor()  # a new process would do the same: nothing is in memory
    with ex:
        listed = [s for s in ex.list_sessions()["sessions"] if s["session_name"] == "k"]
        assert [s["held"] for s in listed] == [False]
        r = ex.execute_code(at.place.show_v, language=at.place.language, venv_id=venv_id,
                            state_mode="stateful", session_name="k")
        assert r["stdout"] == "41\n"
        assert r["restored"]["from"] == "snapshot" and r["restored"]["left_out"] == []
        kept = ex.inspect_session(at.place.language, session_name="k", venv_id=venv_id)["kept"]
        assert kept["snapshot"]["bytes"] > 0  # the calls after it are kept by the log


# -- nested calls (the RunsNested capability) -----------------------------------------------


def test_a_stored_function_called_into_the_session_running_it_runs_there(at: At) -> None:
    needs(at, "called into")
    at.ex.functions.define(source="def bump(x):\n    global total\n"
                                  "    total = globals().get('total', 0) + x\n    return total\n")
    r = at.run("first = functions.bump.stateful(session_name='n')(5)\n"
               "first, functions.bump.stateful(session_name='n')(2), total",
               state_mode="stateful", session_name="n")
    assert r["result"] == "(5, 7, 7)", r
    peek = at.run("functions.bump.read_only(session_name='n')(100), total",
                  state_mode="stateful", session_name="n")
    assert peek["result"] == "(107, 7)", peek  # a copy: the session is not changed


# -- branches and checkpoints (SPEC 15: the Forkable and Checkpointable capabilities) -------


def test_fork_copies_state_and_never_touches_the_source(at: At) -> None:
    needs(at, "forked")
    at.run(at.place.set_v, state_mode="stateful", session_name="src")
    forked = at.ex.fork_session(session_name="src", language=at.place.language,
                                venv_id=at.venv_id, new_name="trial")
    assert forked["session"] == {"language": at.place.language, "venv_id": at.venv_id,
                                 "session_id": 2, "session_name": "trial"}
    assert forked["from"]["session_name"] == "src"
    assert "shared" in forked["files"] and forked["left_out"] == []
    if at.place.id in ("worker", "bash"):  # an environment's or a shell's: as a process
        assert forked["copy"] == "process"
    assert at.run(at.place.show_v, state_mode="stateful", session_name="trial")["stdout"] == "41\n"
    at.run(at.place.change_v, state_mode="stateful", session_name="trial")
    assert at.run(at.place.show_v, state_mode="stateful", session_name="src")["stdout"] == "41\n"
    assert at.run(at.place.show_v, state_mode="stateful", session_name="trial")["stdout"] == "99\n"
    names = {s["session_name"] for s in at.ex.list_sessions()["sessions"]}
    assert {"src", "trial"} <= names


def test_fork_to_a_name_in_use_names_a_free_one(at: At) -> None:
    needs(at, "forked")
    at.run(at.place.set_v, state_mode="stateful", session_name="src")
    at.run(at.place.set_v, state_mode="stateful", session_name="taken")
    r = at.ex.fork_session(session_name="src", language=at.place.language,
                           venv_id=at.venv_id, new_name="taken")
    assert r["error_type"] == "validation" and "new_name='taken-2'" in r["suggestion"]
    assert at.ex.fork_session(session_name="nope", language=at.place.language,
                              venv_id=at.venv_id, new_name="x")["error_type"] == "not_found"


def test_checkpoint_then_restore_undoes_later_steps(at: At) -> None:
    needs(at, "checkpointed")
    at.run(at.place.set_v, state_mode="stateful", session_name="s")
    made = at.ex.checkpoint_session(**at.where(session_name="s"), label="before")
    assert made["checkpoint"].startswith("cp-") and made["label"] == "before"
    assert made["bytes"] > 0 and made["left_out"] == [] and made["ms"] >= 0
    at.run(at.place.change_v, state_mode="stateful", session_name="s")
    back = at.ex.restore_session(**at.where(session_name="s"), checkpoint=made["checkpoint"])
    assert back["restored"] is True and "not touched" in back["files"]
    assert at.run(at.place.show_v, state_mode="stateful", session_name="s")["stdout"] == "41\n"
    listed = at.ex.list_checkpoints(**at.where(session_name="s"))["checkpoints"]
    assert [c["checkpoint"] for c in listed] == [made["checkpoint"]]
    at.ex.close_session(**at.where(session_name="s"))
    assert at.ex.list_checkpoints(**at.where(session_name="s"))["error_type"] == "not_found"


def test_a_checkpoint_of_another_session_is_refused(at: At) -> None:
    needs(at, "checkpointed")
    at.run(at.place.set_v, state_mode="stateful", session_name="a")
    at.run(at.place.set_v, state_mode="stateful", session_name="b")
    made = at.ex.checkpoint_session(**at.where(session_name="a"))
    r = at.ex.restore_session(**at.where(session_name="b"), checkpoint=made["checkpoint"])
    assert r["error_type"] == "validation" and "belongs to another session" in r["error"]
    r = at.ex.restore_session(**at.where(session_name="b"), checkpoint="cp-00000000")
    assert r["error_type"] == "not_found"
    other = "bash" if at.place.language == "python" else "python"  # same name, other place
    at.ex.execute_code("x=1", language=other, state_mode="stateful", session_name="a")
    r = at.ex.restore_session(language=other, session_name="a", checkpoint=made["checkpoint"])
    assert r["error_type"] == "validation" and "belongs to another session" in r["error"]


def test_a_fork_beyond_max_sessions_is_a_capacity_error(tmp_path: Path) -> None:
    with Executor(root=tmp_path / "home", max_sessions=2) as ex:
        ex.execute_code("v = 1", state_mode="stateful", session_name="a")
        r = ex.fork_session(session_name="a", new_name="b")
        assert r["error_type"] == "capacity" and r["sessions"]
        assert [s["session_name"] for s in ex.list_sessions()["sessions"]] == [None, "a"]


def test_only_ten_checkpoints_are_kept_and_the_result_says_which_went(tmp_path: Path) -> None:
    with Executor(root=tmp_path / "home") as ex:
        ex.execute_code("v = 0", state_mode="stateful", session_name="a")
        made = [ex.checkpoint_session(session_name="a", label=str(n)) for n in range(11)]
        assert "dropped" not in made[9]
        assert made[10]["dropped"][0]["checkpoint"] == made[0]["checkpoint"]
        assert "oldest" in made[10]["note"]
        listed = ex.list_checkpoints(session_name="a")["checkpoints"]
        assert [c["label"] for c in listed] == [str(n) for n in range(1, 11)]  # newest last
        gone = ex.restore_session(session_name="a", checkpoint=made[0]["checkpoint"])
        assert gone["error_type"] == "not_found"


def test_a_forked_worker_ends_with_the_executor_even_after_its_source(
        tmp_path: Path, envs_dir: Path) -> None:
    ex = Executor(root=tmp_path / "home", envs_dir=envs_dir)
    try:
        venv_id = ex.environments.create("# no requirements\n", name="bare")["venv_id"]
        ex.execute_code("import os", state_mode="stateful", session_name="a", venv_id=venv_id)
        assert ex.fork_session(session_name="a", venv_id=venv_id, new_name="b")["copy"] == \
            "process"
        pid = int(ex.execute_code("print(os.getpid())", state_mode="stateful",
                                  session_name="b", venv_id=venv_id)["stdout"])
        ex.close_session(session_name="a", venv_id=venv_id)  # the fork lives on
        assert ex.execute_code("1", state_mode="stateful", session_name="b",
                               venv_id=venv_id)["result"] == "1"
    finally:
        ex.close()
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid)


def test_what_cannot_be_kept_is_named_in_left_out(at: At) -> None:
    needs(at, "forked")
    needs(at, "checkpointed")
    if at.place.language != "python":
        pytest.skip("a shell's state is text: nothing is left out")
    at.run("import threading\nlock = threading.Lock()\nv = 41", state_mode="stateful",
           session_name="s")
    forked = at.ex.fork_session(session_name="s", venv_id=at.venv_id, new_name="f")
    # A process fork carries everything; a copy by value names what it could not carry.
    carried = forked["copy"] == "process"
    assert forked["left_out"] == ([] if carried else ["lock"])
    shown = at.run("print('lock' in globals())", state_mode="stateful", session_name="f")
    assert shown["stdout"] == f"{carried}\n"
    made = at.ex.checkpoint_session(**at.where(session_name="s"))
    assert made["left_out"] == ["lock"]
    at.run("v = 99", state_mode="stateful", session_name="s")
    back = at.ex.restore_session(**at.where(session_name="s"), checkpoint=made["checkpoint"])
    assert back["left_out"] == ["lock"]
    shown = at.run("print(v, 'lock' in globals())", state_mode="stateful", session_name="s")
    assert shown["stdout"] == "41 False\n"
