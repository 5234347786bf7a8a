"""SPEC section 10 on a real local Ray cluster: the same contract, sessions on nodes.

Bash sessions and sessions in an environment run in processes that coordex's actor on
a node owns; the promises of the other places hold there, and so do the fault rules
when a node dies during a call or between calls.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from coordex import Executor
from coordex.backends.ray.place import RaySession
from tests.cluster.conftest import NODE_ARGS, LocalCluster, owned_processes
from tests.fakes.wheels import ledgerlib_wheel, requirement

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ledgerlib_wheel(tmp_path_factory.mktemp("wheels"), "1.0")


@pytest.fixture
def cex(local_cluster: LocalCluster, tmp_path: Path) -> Iterator[Executor]:
    executor = Executor(root=tmp_path / "home", timeout=30, cluster=local_cluster.address)
    try:
        yield executor
    finally:
        executor.close()


# The conformance suite's promises about sessions, again with the worker and bash places
# on nodes (those about coordinates and a closed executor do not depend on the place).
from tests.conformance.test_places import (  # noqa: E402
    PLACES,
    At,
    Place,
    envs_dir,  # noqa: F401  (a fixture the kept row takes)
    test_a_busy_session_reads_the_same_everywhere,
    test_a_call_whose_session_is_closed_under_it_reads_the_same,
    test_a_checkpoint_of_another_session_is_refused,
    test_a_death_near_the_deadline_returns_within_the_one_timeout,
    test_a_process_found_dead_is_replaced_and_says_state_lost,
    test_a_process_stopped_while_idle_reads_the_same,
    test_a_read_only_copy_that_kills_itself_is_crashed_in_the_same_words,
    test_a_result_holds_the_specs_keys_and_no_others,
    test_a_timeout_that_the_code_survives,
    test_an_exception_in_the_code_reads_the_same_everywhere,
    test_checkpoint_then_restore_undoes_later_steps,
    test_closed_sessions_are_gone,
    test_fork_copies_state_and_never_touches_the_source,
    test_fork_to_a_name_in_use_names_a_free_one,
    test_kept_sessions_come_back_after_a_restart,
    test_list_and_inspect_see_the_session_and_change_nothing,
    test_output_streams_through_on_output,
    test_read_only_sees_the_session_and_changes_nothing,
    test_stateful_keeps_state,
    test_stateful_without_a_session_uses_session_0,
    test_stateless_sees_and_keeps_nothing,
    test_what_does_not_fit_a_result_is_kept_whole_in_a_file,
)

CONFORMANCE = [
    test_a_busy_session_reads_the_same_everywhere,
    test_a_call_whose_session_is_closed_under_it_reads_the_same,
    test_a_death_near_the_deadline_returns_within_the_one_timeout,
    test_a_process_found_dead_is_replaced_and_says_state_lost,
    test_a_process_stopped_while_idle_reads_the_same,
    test_a_read_only_copy_that_kills_itself_is_crashed_in_the_same_words,
    test_a_result_holds_the_specs_keys_and_no_others,
    test_an_exception_in_the_code_reads_the_same_everywhere,
    test_a_timeout_that_the_code_survives, test_closed_sessions_are_gone,
    test_list_and_inspect_see_the_session_and_change_nothing,
    test_output_streams_through_on_output,
    test_read_only_sees_the_session_and_changes_nothing, test_stateful_keeps_state,
    test_stateful_without_a_session_uses_session_0, test_stateless_sees_and_keeps_nothing,
    test_what_does_not_fit_a_result_is_kept_whole_in_a_file,
    # the capability rows: run where a cluster session has the capability, else skipped
    test_kept_sessions_come_back_after_a_restart,
    test_fork_copies_state_and_never_touches_the_source,
    test_fork_to_a_name_in_use_names_a_free_one,
    test_checkpoint_then_restore_undoes_later_steps,
    test_a_checkpoint_of_another_session_is_refused]


@pytest.fixture(params=[p for p in PLACES if p.id in ("worker", "bash")], ids=lambda p: p.id)
def at(request: pytest.FixtureRequest, local_cluster: LocalCluster,
       tmp_path: Path) -> Iterator[At]:
    place: Place = dataclasses.replace(request.param, session=RaySession)
    ex = Executor(root=tmp_path / "home", timeout=30, cluster=local_cluster.address)
    try:
        venv_id = None
        if place.in_environment:
            venv_id = ex.environments.create("# no requirements\n", name="bare")["venv_id"]
        # Start the node's actor (a Ray worker process: seconds on a busy machine) and
        # build the environment there before the promises are timed.
        warm = ex.execute_code("true" if place.language == "bash" else "pass",
                               language=place.language, venv_id=venv_id)
        assert "error" not in warm, warm
        yield At(ex, place, venv_id, process="process on the cluster node")
    finally:
        ex.close()
    # Closing the Executor ended every process its node actors started.
    assert wait_until(lambda: not owned_processes(), 10), owned_processes()


@pytest.fixture
def venv(cex: Executor, wheel: Path) -> int:
    created = cex.environments.create(requirement("ledgerlib", wheel), name="ledger")
    assert created["venv_id"] >= 0, created
    return int(created["venv_id"])


def wait_until(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def node_of(ex: Executor, language: str, name: str) -> str:
    for record in ex.list_sessions()["sessions"]:
        if record["language"] == language and record["session_name"] == name:
            return str(record["node"])
    raise LookupError(name)


def here_node() -> str:
    import ray

    return str(ray.get_runtime_context().get_node_id())


def test_bash_sessions_live_on_a_node_and_keep_every_promise(cex: Executor) -> None:
    r = cex.execute_code("cd /tmp; v=41; f() { echo fn; }; echo $$", language="bash",
                         state_mode="stateful", session_name="b")
    assert r["exit_code"] == 0, r
    shell_pid = int(r["stdout"])
    assert shell_pid != os.getpid()
    node = node_of(cex, "bash", "b")
    assert node and node != here_node()  # the head node is kept for Ray's own services
    assert cex.execute_code('echo "$v $(f) $PWD"', language="bash", state_mode="stateful",
                            session_name="b")["stdout"] == "41 fn /tmp\n"
    # stateless: a fresh shell, on a node too, that sees nothing of the session
    assert cex.execute_code('echo "[$v]"', language="bash")["stdout"] == "[]\n"
    # read-only: sees the session, changes nothing
    r = cex.execute_code('v=99; cd /; echo "$v"', language="bash", state_mode="read_only",
                         session_name="b")
    assert r["stdout"] == "99\n" and r["isolation"]["names"] is True, r
    report = cex.inspect_session(language="bash", session_name="b")
    assert report["variables"]["v"] == "41" and report["cwd"] == "/tmp", report
    assert "f" in report["functions"]
    chunks: list[str] = []
    r = cex.execute_code("for i in 1 2 3; do echo $i; sleep 0.2; done", language="bash",
                         state_mode="stateful", session_name="b",
                         on_output=lambda s, t: chunks.append(t))
    assert "".join(chunks) == r["stdout"] == "1\n2\n3\n" and len(chunks) >= 2


def test_environment_sessions_on_a_node(cex: Executor, venv: int) -> None:
    progress: list[str] = []
    r = cex.execute_code("import ledgerlib, os\nrows = [1, 2, 3]\nos.getpid()",
                         state_mode="stateful", session_name="w", venv_id=venv,
                         on_progress=progress.append)
    assert "error" not in r, r
    assert int(r["result"]) != os.getpid()
    assert progress, "the build on the node reported no progress"
    assert node_of(cex, "python", "w") != here_node()
    r = cex.execute_code("rows.append(4); ledgerlib.total(rows)", state_mode="stateful",
                         session_name="w", venv_id=venv)
    assert r["result"] == "10", r
    r = cex.execute_code("'rows' in globals(), __import__('ledgerlib').VERSION", venv_id=venv)
    assert r["result"] == "(False, '1.0')", r
    r = cex.execute_code("rows.append(5); len(rows)", state_mode="read_only",
                         session_name="w", venv_id=venv)
    assert r["result"] == "5" and r["isolation"]["objects"] is True, r
    assert cex.execute_code("len(rows)", state_mode="stateful", session_name="w",
                            venv_id=venv)["result"] == "4"
    names = {n["name"]: n for n in cex.inspect_session(session_name="w", venv_id=venv)["names"]}
    assert names["rows"]["type"] == "list" and names["rows"]["bound_at_call"] == 1, names
    r = cex.execute_code("1/0", state_mode="stateful", session_name="w", venv_id=venv)
    assert r["error_type"] == "execution" and r["exception"] == "ZeroDivisionError"


def test_timeouts_interrupt_on_the_node_and_keep_state(cex: Executor, venv: int) -> None:
    cex.execute_code("kept = 7", state_mode="stateful", session_name="t", venv_id=venv)
    started = time.monotonic()
    r = cex.execute_code("import time\nwhile True: time.sleep(0.01)", state_mode="stateful",
                         session_name="t", venv_id=venv, timeout=1)
    assert r["error_type"] == "timeout" and r["state_lost"] is False, r
    assert time.monotonic() - started < 8
    assert cex.execute_code("kept", state_mode="stateful", session_name="t",
                            venv_id=venv)["result"] == "7"
    cex.execute_code("kept=8", language="bash", state_mode="stateful", session_name="t")
    r = cex.execute_code("sleep 30", language="bash", state_mode="stateful", session_name="t",
                         timeout=1)
    assert r["error_type"] == "timeout" and r["state_lost"] is False, r
    assert cex.execute_code("echo $kept", language="bash", state_mode="stateful",
                            session_name="t")["stdout"] == "8\n"
    r = cex.execute_code("sleep 30", language="bash", timeout=1)
    assert r["error_type"] == "timeout", r
    # A cancel crosses to the node and interrupts as a timeout does: state kept.
    for place, code in (({"venv_id": venv}, "import time\nwhile True: time.sleep(0.01)"),
                        ({"language": "bash"}, "sleep 30")):
        cancel = threading.Event()
        threading.Timer(1.0, cancel.set).start()
        started = time.monotonic()
        r = cex.execute_code(code, state_mode="stateful", session_name="t", timeout=30,
                             cancel=cancel, **place)  # type: ignore[arg-type]
        assert r["error_type"] == "timeout" and r["state_lost"] is False, r
        assert time.monotonic() - started < 6


def test_capabilities_called_on_a_node_run_in_the_executor(cex: Executor, venv: int) -> None:
    seen: list[int] = []

    @cex.capability
    def lookup(key: str) -> dict[str, object]:
        seen.append(os.getpid())
        if key == "bad":
            raise KeyError(key)
        return {"key": key, "pid": os.getpid()}

    r = cex.execute_code("r = lookup('a'); r['pid']", state_mode="stateful",
                         session_name="c", venv_id=venv)
    assert r["result"] == str(os.getpid()) and seen == [os.getpid()], r
    r = cex.execute_code("lookup('b')['key']", venv_id=venv)  # stateless, forked on a node
    assert r["result"] == "'b'", r
    r = cex.execute_code("lookup('c')['key']", state_mode="read_only", session_name="c",
                         venv_id=venv)
    assert r["result"] == "'c'", r
    r = cex.execute_code("lookup('bad')", state_mode="stateful", session_name="c", venv_id=venv)
    assert r["error_type"] == "execution" and "KeyError" in r["traceback"], r


def test_resources_from_the_spec_place_the_session(cex: Executor, wheel: Path) -> None:
    spec = ('[project]\nname = "e"\nversion = "0"\n'
            f'dependencies = ["ledgerlib @ {wheel.as_uri()}"]\n\n'
            "[tool.coordex]\nnum_cpus = 1\n")
    venv = cex.environments.create(spec)["venv_id"]
    r = cex.execute_code("import ledgerlib", state_mode="stateful", session_name="cpu",
                         venv_id=venv)
    assert "error" not in r, r
    import ray

    # The session's actor holds the CPU it asked for while it lives.
    deadline = time.monotonic() + 10
    while ray.available_resources().get("CPU", 0) > 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ray.available_resources().get("CPU", 0) <= 1
    assert cex.close_session(session_name="cpu", venv_id=venv)["closed"] is True
    # (Resources are not part of an environment's identity: another dependency list.)
    gpu = cex.environments.create('[project]\nname = "g"\nversion = "0"\ndependencies = []\n'
                                  '[tool.coordex]\nnum_gpus = 1\n')["venv_id"]
    r = cex.execute_code("1", state_mode="stateful", session_name="gpu", venv_id=gpu)
    assert r["error_type"] == "environment" and "num_gpus=1" in r["error"], r
    assert "tool.coordex" in r["suggestion"]


def test_a_node_dying_between_calls(cex: Executor, venv: int,
                                    local_cluster: LocalCluster) -> None:
    worker = cex.execute_code("x = 1\nimport os; os.getpid()", state_mode="stateful",
                              session_name="p", venv_id=venv)["result"]
    shell = cex.execute_code("x=1; sleep 300 & echo $$", language="bash",
                             state_mode="stateful", session_name="p")["stdout"]
    pids = {int(worker), int(shell)}
    nodes = {node_of(cex, "python", "p"), node_of(cex, "bash", "p")}
    for node in nodes:
        local_cluster.remove(node)
    # The dead actors' reapers took the sessions' processes with them.
    assert wait_until(lambda: not pids & set(owned_processes()), 10)
    started = time.monotonic()
    r = cex.execute_code("globals().get('x', 'gone')", state_mode="stateful",
                         session_name="p", venv_id=venv, timeout=20)
    assert r["result"] == "'gone'" and r["state_lost"] is True and r["retried"] is True, r
    assert node_of(cex, "python", "p") not in nodes
    r = cex.execute_code('echo "[$x]"', language="bash", state_mode="stateful",
                         session_name="p", timeout=20)
    assert r["error_type"] == "crashed" and r["state_lost"] is True, r
    assert "rebuild_session" in r["suggestion"]
    assert time.monotonic() - started < 30
    r = cex.execute_code('echo "[$x]"', language="bash", state_mode="stateful", session_name="p")
    assert r["stdout"] == "[]\n", r
    assert node_of(cex, "bash", "p") not in nodes


def test_a_node_dying_during_a_call(cex: Executor, venv: int,
                                    local_cluster: LocalCluster) -> None:
    cex.execute_code("y = 1", state_mode="stateful", session_name="m", venv_id=venv)
    cex.execute_code("true", language="bash", state_mode="stateful", session_name="m")
    nodes = {node_of(cex, "python", "m"), node_of(cex, "bash", "m")}
    results: dict[str, dict[str, object]] = {}
    calls = {
        # Sleeps while the state is there; the retry on a fresh process does not.
        "python": lambda: cex.execute_code(
            "import time\ntime.sleep(20 if 'y' in globals() else 0)\n'y' in globals()",
            state_mode="stateful", session_name="m", venv_id=venv, timeout=25),
        "bash": lambda: cex.execute_code("sleep 20; echo done", language="bash",
                                         state_mode="stateful", session_name="m", timeout=25),
    }
    runners = [threading.Thread(target=lambda k=k, f=f: results.update({k: f()}))
               for k, f in calls.items()]
    for runner in runners:
        runner.start()
    time.sleep(1.5)
    started = time.monotonic()
    for node in nodes:
        local_cluster.remove(node)
    for runner in runners:
        runner.join(40)
    assert time.monotonic() - started < 25
    r = results["bash"]
    assert r["error_type"] == "crashed" and r["state_lost"] is True, r
    assert "rebuild_session" in str(r["suggestion"])
    # SPEC 10: a call the lost node had taken is never run a second time elsewhere.
    r = results["python"]
    assert r["error_type"] == "crashed" and r["state_lost"] is True, r
    assert not r.get("retried") and "rebuild_session" in str(r["suggestion"]), r
    r = cex.execute_code("'y' in globals()", state_mode="stateful", session_name="m",
                         venv_id=venv, timeout=25)
    assert r["result"] == "False" and r.get("state_lost") is not True, r  # reported once


def test_a_node_cut_off_from_the_cluster_ends_its_sessions_and_nothing_runs_twice(
        cex: Executor, venv: int, local_cluster: LocalCluster, tmp_path: Path) -> None:
    """Only the node's raylet dies (as when a node loses the cluster): the coordex actor
    there and every process of its sessions end within 10 s (its fence), and the call
    that was running there is not run again elsewhere."""
    import signal

    marks = tmp_path / "runs.txt"
    cex.execute_code("y = 1", state_mode="stateful", session_name="f", venv_id=venv)
    node = node_of(cex, "python", "f")
    before = set(owned_processes())
    result: dict[str, object] = {}
    runner = threading.Thread(target=lambda: result.update(cex.execute_code(
        f"import subprocess, time\nopen({str(marks)!r}, 'a').write('run\\n')\n"
        "p = subprocess.Popen(['sleep', '300'])\ntime.sleep(30)",
        state_mode="stateful", session_name="f", venv_id=venv, timeout=40)))
    runner.start()
    assert wait_until(lambda: marks.exists(), 10)
    raylet = local_cluster.node(node).all_processes["raylet"][0].process
    started = time.monotonic()
    os.kill(raylet.pid, signal.SIGKILL)
    try:
        runner.join(45)
        assert result.get("error_type") == "crashed" and result.get("state_lost") is True, result
        # Fenced: what ran on that node is gone within 10 s of its raylet's death.
        on_node = before | (set(owned_processes()) - before)
        assert wait_until(lambda: not (on_node & set(owned_processes())), 12 - (
            time.monotonic() - started)), owned_processes()
        time.sleep(2)
        assert marks.read_text() == "run\n"  # once, never again elsewhere
    finally:
        with contextlib.suppress(Exception):
            local_cluster.cluster.remove_node(local_cluster.node(node), allow_graceful=False)
        local_cluster.cluster.add_node(**NODE_ARGS)


def test_close_leaves_no_process(local_cluster: LocalCluster, tmp_path: Path, wheel: Path) -> None:
    ex = Executor(root=tmp_path / "home", timeout=30, cluster=local_cluster.address)
    venv = ex.environments.create(requirement("ledgerlib", wheel))["venv_id"]
    ex.execute_code("sleep 300 & sleep 300 &", language="bash", state_mode="stateful",
                    session_name="k")
    ex.execute_code("import subprocess; p = subprocess.Popen(['sleep', '300'])",
                    state_mode="stateful", session_name="k", venv_id=venv)
    ex.execute_code("1", venv_id=venv)
    assert len(owned_processes()) >= 5
    ex.close()
    deadline = time.monotonic() + 10
    while owned_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert owned_processes() == []


def test_killing_an_actor_ends_the_processes_it_owned(cex: Executor) -> None:
    import ray

    out = cex.execute_code("sleep 300 & sleep 300 & echo $$", language="bash",
                           state_mode="stateful", session_name="victim")
    shell = int(out["stdout"])
    assert shell in owned_processes()
    before = set(owned_processes())
    node = node_of(cex, "bash", "victim")
    handle = cex._cluster._shared[node].handle  # the node's coordex actor
    ray.kill(handle)  # no shutdown(): only the reaper can end its children now
    assert wait_until(lambda: not before & set(owned_processes()), 10), owned_processes()
    r = cex.execute_code("echo hi", language="bash", state_mode="stateful",
                         session_name="victim", timeout=10)
    assert r["error_type"] == "crashed" and r["state_lost"] is True, r
    r = cex.execute_code("echo hi", language="bash", state_mode="stateful", session_name="victim")
    assert r["stdout"] == "hi\n", r


def test_a_node_that_stops_answering_costs_a_call_its_timeout_not_a_hang(cex: Executor) -> None:
    import signal

    import ray

    by_node: dict[str, list[str]] = {}
    for i in range(3):  # sessions spread over the two nodes: one node holds two
        cex.execute_code(f"x={i}", language="bash", state_mode="stateful", session_name=f"s{i}")
        by_node.setdefault(node_of(cex, "bash", f"s{i}"), []).append(f"s{i}")
    node, (frozen, other) = next((n, names) for n, names in by_node.items() if len(names) == 2)
    actor_pid = ray.get(cex._cluster._shared[node].handle.info.remote())["pid"]
    os.kill(actor_pid, signal.SIGSTOP)  # the actor (not its shells) stops answering
    try:
        started = time.monotonic()
        r = cex.execute_code("echo hi", language="bash", state_mode="stateful",
                             session_name=frozen, timeout=1)
        took = time.monotonic() - started
    finally:
        os.kill(actor_pid, signal.SIGCONT)
    assert r["error_type"] == "crashed" and r["state_lost"] is True, r
    assert "gave no answer" in r["error"] and took < 15, (took, r)
    # The node's actor was left alive: the other session there still holds its state.
    r = cex.execute_code("echo $x", language="bash", state_mode="stateful", session_name=other)
    assert r["stdout"] == other[1:] + "\n", r
    r = cex.execute_code('echo "[$x]"', language="bash", state_mode="stateful",
                         session_name=frozen)
    assert r["stdout"] == "[]\n", r


def test_sessions_on_a_cluster_come_back_by_replay_after_a_restart(
        local_cluster: LocalCluster, tmp_path: Path) -> None:
    """SPEC 12, last bullet: sessions on a cluster are kept by the log; the next process
    brings them back by replay on a node."""
    home = tmp_path / "home"
    with Executor(root=home, timeout=30, cluster=local_cluster.address, persist=True) as ex:
        made = ex.execute_code("x=41; f() { echo $((x + 1)); }", language="bash",
                               state_mode="stateful", session_name="kept")
        assert made.get("is_error") is not True and "error" not in made, made
    with Executor(root=home, timeout=30, cluster=local_cluster.address, persist=True) as ex:
        r = ex.execute_code("f", language="bash", state_mode="stateful", session_name="kept")
        assert r.get("stdout") == "42\n", r
        assert r["restored"]["from"] == "replay" and "state_lost" not in r, r


def test_a_session_on_a_node_is_forked_and_checkpointed_there(cex: Executor) -> None:
    """SPEC 15 on a cluster: a bash session's fork lives on its node; its checkpoint is
    kept by the executor, so it outlives the node."""
    cex.execute_code("cd /tmp && v=41", language="bash", state_mode="stateful",
                     session_name="b")
    forked = cex.fork_session(session_name="b", language="bash", new_name="t")
    assert forked["session"]["session_name"] == "t", forked
    nodes = {s["session_name"]: s.get("node") for s in cex.list_sessions()["sessions"]}
    assert nodes["t"] == nodes["b"]
    cex.execute_code("v=99", language="bash", state_mode="stateful", session_name="t")
    assert cex.execute_code('echo "$v $PWD"', language="bash", state_mode="stateful",
                            session_name="b")["stdout"] == "41 /tmp\n"
    made = cex.checkpoint_session(language="bash", session_name="t")
    assert made["bytes"] > 0, made
    cex.execute_code("v=0", language="bash", state_mode="stateful", session_name="t")
    back = cex.restore_session(language="bash", session_name="t", checkpoint=made["checkpoint"])
    assert back.get("restored") is True, back
    assert cex.execute_code('echo "$v"', language="bash", state_mode="stateful",
                            session_name="t")["stdout"] == "99\n"


def test_a_checkpoint_of_a_session_on_a_lost_node_restores_on_another(
        cex: Executor, local_cluster: LocalCluster) -> None:
    cex.execute_code("v=41", language="bash", state_mode="stateful", session_name="lost")
    made = cex.checkpoint_session(language="bash", session_name="lost")
    node = next(s["node"] for s in cex.list_sessions()["sessions"]
                if s["session_name"] == "lost")
    local_cluster.remove(node)
    time.sleep(2)  # the cluster notices (fast health checks)
    back = cex.restore_session(language="bash", session_name="lost",
                               checkpoint=made["checkpoint"])
    assert back.get("restored") is True, back
    after = cex.execute_code('echo "$v"', language="bash", state_mode="stateful",
                             session_name="lost")
    assert after["stdout"] == "41\n", after
    now = next(s["node"] for s in cex.list_sessions()["sessions"]
               if s["session_name"] == "lost")
    assert now != node


def test_long_work_on_the_node_wait_wait_call_and_cancel_call(cex: Executor, venv: int) -> None:
    """SPEC 14 on the cluster place: a call past its ``wait`` goes on on the node, once;
    the session answers ``busy`` meanwhile; ``wait_call`` hands back its result;
    ``cancel_call`` interrupts on the node as a timeout does, state kept."""
    for language, venv_id, setup, slow, check, kept in (
            ("bash", None, "n=0", "n=$((n+1)); sleep 2; echo ran $n", "echo $n", "1\n"),
            ("python", venv, "n = 0", "import time\nn += 1\ntime.sleep(2)\nprint('ran', n)",
             "print(n)", "1\n")):
        at = {"language": language, "venv_id": venv_id, "state_mode": "stateful",
              "session_name": "long"}
        assert "error_type" not in cex.execute_code(setup, **at)
        assert node_of(cex, language, "long") != here_node()  # its process is on a node
        started = time.monotonic()
        first = cex.execute_code(slow, wait=0.5, **at)
        assert first["running"] is True and first["call_id"].startswith("c_"), first
        assert time.monotonic() - started < 1.8  # returned at its wait, not its end
        busy = cex.execute_code(check, **at)
        assert busy["error_type"] == "busy" and busy["call_id"] == first["call_id"], busy
        joined = cex.execute_code(slow, wait=0.2, **at)  # identical: joined, no second run
        assert joined["call_id"] == first["call_id"], joined
        final = cex.wait_call(first["call_id"], wait=20)
        assert final["stdout"] == "ran 1\n" and final["call_id"] == first["call_id"], final
        assert "running" not in final and "error_type" not in final
        assert cex.wait_call(first["call_id"]) == final  # fetchable again, unchanged
        assert cex.execute_code(check, **at)["stdout"] == kept  # it ran once
        # cancel_call crosses to the node: interrupted, state kept.
        loop = "sleep 30" if language == "bash" else "import time\ntime.sleep(30)"
        long = cex.execute_code(loop, wait=0.5, **at)
        assert long["running"] is True, long
        started = time.monotonic()
        stopped = cex.cancel_call(long["call_id"])
        assert stopped["error_type"] == "timeout" and stopped["state_lost"] is False, stopped
        assert stopped["call_id"] == long["call_id"] and time.monotonic() - started < 15
        assert cex.execute_code(check, **at)["stdout"] == kept
    missing = cex.wait_call("c_nothing")
    assert missing["error_type"] == "not_found", missing
