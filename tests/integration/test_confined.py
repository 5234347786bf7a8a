"""ConfinedExecutor: a real host process in a real jail, driven from Python."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordex import ConfinedExecutor
from coordex.backends.isolation import landlock_abi
from coordex.hosting import best_level
from tests.conftest import child_pids

pytestmark = pytest.mark.timeout(120)

needs_namespaces = pytest.mark.skipif(best_level() != "namespaces+landlock",
                                      reason="user namespaces are blocked here")


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    (folder / "secret.txt").write_text("not for the tenant")
    return folder


@pytest.fixture
def confined(tmp_path: Path, secret: Path) -> Iterator[ConfinedExecutor]:
    ex = ConfinedExecutor(tmp_path / "tenant", hide=[secret], memory_limit=256 << 20, timeout=20)
    try:
        yield ex
    finally:
        ex.close()


def test_the_host_says_what_holds(confined: ConfinedExecutor) -> None:
    held = confined.confinement
    assert held["level"] == best_level()
    assert held["memory"] in ("cgroup", "per-process") and held["network"] is True


def test_the_folder_is_cwd_and_home_and_the_rest_is_hidden_or_read_only(
        confined: ConfinedExecutor, tmp_path: Path, secret: Path) -> None:
    where = confined.execute_code("import os; (os.getcwd(), os.path.expanduser('~'))")
    folder = str(tmp_path / "tenant")
    assert where["result"] == repr((folder, folder))
    probe = confined.execute_code(
        f"cat {secret}/secret.txt; echo made > here.txt && cat here.txt; touch /usr/x; "
        f"touch {tmp_path}/x", language="bash")
    assert "not for the tenant" not in probe["stdout"]
    assert probe["stdout"].strip() == "made"
    assert not (tmp_path / "x").exists()


def test_output_streams_while_the_call_runs(confined: ConfinedExecutor) -> None:
    chunks: list[tuple[str, str, float]] = []
    started = time.monotonic()
    result = confined.execute_code(
        "import time\nprint('first', flush=True)\ntime.sleep(0.5)\nprint('second')",
        on_output=lambda stream, text: chunks.append((stream, text, time.monotonic())))
    assert result["stdout"] == "first\nsecond\n"
    first = next(c for c in chunks if "first" in c[1])
    assert first[0] == "stdout" and first[2] - started < result["duration_ms"] / 1000


def test_a_background_job_writes_into_no_later_call_in_the_jail(
        confined: ConfinedExecutor) -> None:
    """SPEC 6 in a jail too: each bash call's code opens its own output pipes there
    (the jail's /proc), so a job an earlier call left running writes into no later call."""
    confined.execute_code("(for i in $(seq 100); do echo BG; echo BG >&2; sleep 0.01; "
                          "done) &", language="bash", state_mode="stateful")
    r = confined.execute_code("sleep 0.5; echo mine", language="bash", state_mode="stateful")
    assert (r["stdout"], r["stderr"]) == ("mine\n", ""), r


def test_a_dead_host_is_restarted_with_state_lost(confined: ConfinedExecutor) -> None:
    confined.execute_code("kept = 1", state_mode="stateful")
    died = confined.execute_code("import os; os._exit(3)")
    assert died["error_type"] == "crashed" and died["state_lost"] is True
    assert "exit status 3" in died["error"]
    after = confined.execute_code("'kept' in globals()", state_mode="stateful")
    assert after["result"] == "False" and after["state_lost"] is True
    assert "state_lost" not in confined.execute_code("1")
    assert confined.restarts == 1


def test_a_host_lost_between_calls_is_said_once_by_the_next_result_that_can_say_it(
        confined: ConfinedExecutor) -> None:
    """SPEC 9: a host that died while no call was in flight is started again by the next
    call, which says ``state_lost: true`` (a listing too); a result that cannot carry it
    (a list) leaves it to the next that can, and it is said only once."""
    confined.execute_code("kept = 1", state_mode="stateful")
    confined.execute_code("import os, threading, time\n"
                          "threading.Thread(target=lambda: (time.sleep(0.3), os._exit(1))).start()")
    deadline = time.monotonic() + 10
    while confined.host_alive and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not confined.host_alive
    assert isinstance(confined.tool_definitions(), list)  # a list: says nothing
    listed = confined.list_sessions()
    assert [s["session_id"] for s in listed["sessions"]] == [0], listed  # the plan alone
    assert listed["state_lost"] is True, listed
    assert "state_lost" not in confined.list_sessions()
    assert "state_lost" not in confined.execute_code("2")
    assert confined.restarts == 1
    # A code call first after another loss says it from its own record.
    confined.execute_code("import os, threading, time\n"
                          "threading.Thread(target=lambda: (time.sleep(0.3), os._exit(1))).start()")
    deadline = time.monotonic() + 10
    while confined.host_alive and time.monotonic() < deadline:
        time.sleep(0.05)
    after = confined.execute_code("1 + 1")
    assert after["result"] == "2" and after["state_lost"] is True, after
    assert "state_lost" not in confined.list_sessions()
    assert confined.restarts == 2


def test_an_operators_scrape_never_takes_the_loss_the_model_is_to_be_told(
        confined: ConfinedExecutor) -> None:
    """SPEC 9 and 16: a host started again by a call whose reply cannot say the loss (a
    list) leaves it to the model's next result; a /metrics scrape in between reads the
    sessions through the host too, and took it (the model was never told). Nor do a
    front end's own requests (a held answer, a spilled file, a task's poll or cancel)
    take it."""
    from prometheus_client.parser import text_string_to_metric_families

    from coordex.observe.figures import Figures

    def scrape() -> None:
        text = Figures(sources=lambda: [(None, confined)]).render().decode()
        held = {s.labels["state"]: s.value for f in text_string_to_metric_families(text)
                if f.name == "coordex_sessions" for s in f.samples}
        assert held.get("open", 0) >= 1, text  # the plan namespace, read through the host

    for between in (scrape, lambda: confined.hold_call("c-1"),
                    lambda: confined.read_spilled("file:///nothing"),
                    lambda: confined.poll_call("c-1"), lambda: confined.stop_call("c-1")):
        confined.execute_code("kept = 1", state_mode="stateful")
        confined.execute_code(
            "import os, threading, time\n"
            "threading.Thread(target=lambda: (time.sleep(0.3), os._exit(1))).start()")
        deadline = time.monotonic() + 10
        while confined.host_alive and time.monotonic() < deadline:
            time.sleep(0.05)
        assert isinstance(confined.tool_definitions(), list)  # starts the host: says nothing
        assert confined.host_alive
        restarts = confined.restarts
        between()
        assert confined.restarts == restarts and confined.host_alive  # answered, alive
        after = confined.execute_code("'kept' in globals()", state_mode="stateful")
        assert after["result"] == "False" and after.get("state_lost") is True, after
        assert "state_lost" not in confined.execute_code("1")


def test_history_and_rebuild_take_their_arguments_as_the_executor_does(
        confined: ConfinedExecutor) -> None:
    """SPEC 9: the Executor's methods over the pipe, called as the Executor's are (the
    positional arguments raised TypeError)."""
    confined.execute_code("x = 41", state_mode="stateful", session_name="a")
    rows = confined.history("python", None, "a")["calls"]
    assert [row["code"] for row in rows] == ["x = 41"]
    confined.close_session("python", None, "a")
    rebuilt = confined.rebuild_session("python", None, "a")
    assert "error" not in rebuilt, rebuilt
    assert confined.execute_code("x + 1", state_mode="stateful", session_name="a")["result"] == "42"


def test_a_rebuild_first_after_a_lost_host_says_the_loss_and_leaves_the_log_whole(
        confined: ConfinedExecutor) -> None:
    """The first call after a host died is a rebuild: its reply says the loss, and its
    replays' rows do not (a replay that took it marked its row as a new life, so the
    next rebuild started from there and failed on a name bound before)."""
    confined.execute_code("x = 1", state_mode="stateful", session_name="s")
    confined.execute_code("y = x + 1", state_mode="stateful", session_name="s")
    confined.execute_code("import os, threading, time\n"
                          "threading.Thread(target=lambda: (time.sleep(0.3), os._exit(1))).start()")
    deadline = time.monotonic() + 10
    while confined.host_alive and time.monotonic() < deadline:
        time.sleep(0.05)
    rebuilt = confined.rebuild_session("python", None, "s")
    assert rebuilt["replayed"] == 2 and rebuilt["state_lost"] is True, rebuilt
    confined.close_session("python", None, "s")
    again = confined.rebuild_session("python", None, "s")
    assert again["replayed"] == 2 and again["failed_at"] is None, again
    assert confined.execute_code("y", state_mode="stateful", session_name="s")["result"] == "2"


def test_calls_run_side_by_side_up_to_max_calls(confined: ConfinedExecutor) -> None:
    results: list[dict[str, object]] = []
    started = time.monotonic()
    threads = [threading.Thread(target=lambda: results.append(
        confined.execute_code("sleep 1", language="bash"))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(r["exit_code"] == 0 for r in results)
    assert time.monotonic() - started < 2.5


def test_cancel_interrupts_the_call(confined: ConfinedExecutor) -> None:
    cancel = threading.Event()
    threading.Timer(0.5, cancel.set).start()
    started = time.monotonic()
    result = confined.execute_code("import time; time.sleep(10)", state_mode="stateful",
                                   cancel=cancel)
    assert time.monotonic() - started < 5
    assert result.get("error_type") in ("timeout", "execution"), result


def test_who_stopped_a_call_reaches_the_host_and_its_words(confined: ConfinedExecutor,
                                                            tmp_path: Path) -> None:
    from coordex import Executor
    from coordex.core.record import stop

    def stopped(ex: ConfinedExecutor | Executor, who: str) -> dict[str, object]:
        cancel = threading.Event()
        threading.Timer(0.5, stop, (cancel, who)).start()
        return dict(ex.execute_code("import time; time.sleep(10)", state_mode="stateful",
                                    session_name=who, cancel=cancel))

    with Executor(root=tmp_path / "local", timeout=20) as local:
        for who, words in (("person", "interrupted from the page"),
                           ("caller", "cancelled by its caller")):
            there, here = stopped(confined, who), stopped(local, who)
            assert there["error_type"] == "timeout" and words in str(there["error"]), there
            # Said once, and as the owner's own Executor says it.
            assert str(there["error"]).count("The call was") == 1, there
            assert (there["error"], there["suggestion"]) == (here["error"], here["suggestion"])


def test_the_memory_limit_holds(confined: ConfinedExecutor) -> None:
    hog = confined.execute_code("hog = bytearray(512 << 20); hog[::4096] = b'x' * len(hog[::4096])")
    assert hog.get("error_type") in ("crashed", "execution"), hog
    assert confined.execute_code("1 + 1")["result"] == "2"


@needs_namespaces
def test_no_network_leaves_loopback(tmp_path: Path) -> None:
    with ConfinedExecutor(tmp_path / "t", network=False) as ex:
        assert ex.confinement["network"] is False
        probe = ex.execute_code(
            "import socket\n"
            "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
            "c = socket.create_connection(s.getsockname(), timeout=2)\n"
            "try:\n"
            "    socket.create_connection(('192.0.2.1', 80), timeout=2)\n"
            "    outside = 'reached'\n"
            "except OSError as exc:\n"
            "    outside = type(exc).__name__\n"
            "outside")
        assert probe["result"] != "'reached'", probe


@needs_namespaces
def test_signals_do_not_reach_outside(confined: ConfinedExecutor) -> None:
    import os

    me = os.getpid()
    probe = confined.execute_code(
        f"import os, signal\ntry:\n    os.kill({me}, 0)\n    got = 'reached'\n"
        "except OSError as e:\n    got = type(e).__name__\ngot")
    assert probe["result"] in ("'ProcessLookupError'", "'PermissionError'"), probe
    ppid = confined.execute_code(
        "import os, signal\ntry:\n    os.kill(os.getppid(), signal.SIGKILL)\n    got = 'sent'\n"
        "except OSError as e:\n    got = type(e).__name__\ngot")
    assert ppid["result"] == "'PermissionError'", ppid
    assert confined.execute_code("1")["result"] == "1"


def test_landlock_alone_hides_and_refuses(tmp_path: Path, secret: Path) -> None:
    with ConfinedExecutor(tmp_path / "t", hide=[secret], level="landlock") as ex:
        assert ex.confinement["level"] == "landlock"
        probe = ex.execute_code(f"cat {secret}/secret.txt; touch {tmp_path}/x; echo ok > mine",
                                language="bash")
        assert "not for the tenant" not in probe["stdout"]
        assert not (tmp_path / "x").exists() and (tmp_path / "t" / "mine").exists()
        ex.execute_code("x = [1]", state_mode="stateful", session_name="s")
        copy = ex.execute_code("x.append(2); x", state_mode="read_only", session_name="s")
        assert copy["result"] == "[1, 2]" and copy["isolation"]["files"] == "refused", copy


def test_level_none_says_so(tmp_path: Path) -> None:
    with ConfinedExecutor(tmp_path / "t", level="none") as ex:
        assert ex.confinement["level"] == "none"
        assert ex.confinement["builds"] == "host"  # nothing to keep the host out of them
        assert ex.execute_code("1 + 1")["result"] == "2"


def test_close_ends_every_process_of_the_jail(tmp_path: Path) -> None:
    before = child_pids()
    ex = ConfinedExecutor(tmp_path / "t")
    ex.execute_code("sleep 300 &", language="bash", state_mode="stateful")
    ex.execute_code("import subprocess; p = subprocess.Popen(['sleep', '300'])",
                    state_mode="stateful")
    assert len(child_pids() - before) >= 4
    ex.close()
    deadline = time.monotonic() + 5
    while child_pids() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert child_pids() - before == set()
    closed = ex.execute_code("1")  # as a closed Executor answers, word for word
    assert (closed["error_type"], closed["error"]) == ("validation", "This Executor is closed.")


def test_bad_executor_arguments_fail_at_start(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="max_sessions"):
        ConfinedExecutor(tmp_path / "t", max_sessions=0)


def test_a_host_stuck_holding_the_gil_is_ended_on_cancel(confined: ConfinedExecutor,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from coordex.hosting import client

    monkeypatch.setattr(client, "CANCEL_GRACE", 1.0)
    cancel = threading.Event()
    threading.Timer(0.5, cancel.set).start()
    started = time.monotonic()
    stuck = confined.execute_code("import ctypes; ctypes.PyDLL(None).sleep(60)", cancel=cancel)
    assert time.monotonic() - started < 10
    assert stuck["error_type"] == "crashed" and stuck["state_lost"] is True
    assert confined.execute_code("1 + 1")["result"] == "2"


@needs_namespaces
def test_a_hidden_file_inside_the_folder_stays_hidden(tmp_path: Path) -> None:
    folder = tmp_path / "t"
    folder.mkdir()
    (folder / "tokens").write_text("alice alice-token-0123456789")
    with ConfinedExecutor(folder, hide=[folder / "tokens"]) as ex:
        seen = ex.execute_code("cat tokens; ls", language="bash")
        assert "alice-token" not in seen["stdout"]


def test_the_process_limit_holds(tmp_path: Path) -> None:
    with ConfinedExecutor(tmp_path / "t", max_processes=40) as ex:
        if ex.confinement["processes"] != "cgroup":
            pytest.skip("no pids cgroup here (the rlimit counts every process of the user)")
        # Python, not a bash loop: bash retries a refused fork for seconds at a time. The
        # jail's own processes and threads count too, so fewer than 40 sleeps start.
        burst = ex.execute_code(
            "import subprocess\nheld = []\ntry:\n    while len(held) < 80:\n"
            "        held.append(subprocess.Popen(['sleep', '30']))\nexcept OSError:\n"
            "    pass\nfor p in held:\n    p.kill()\n    p.wait()\nlen(held)")
        assert 0 < int(burst.get("result", 0)) < 40, burst
        assert ex.execute_code("1 + 1")["result"] == "2"


def test_confined_mcp_tenants_keep_the_mcp_default_timeout(tmp_path: Path) -> None:
    import argparse

    from coordex import router
    from coordex.tools import MCP_DEFAULT_TIMEOUT

    args = argparse.Namespace(timeout=None, max_sessions=None, memory_limit=1 << 30,
                              no_network=False, max_calls=8)
    ex = router.confined_executor(args, tmp_path / "t", name="t", hidden=[], lazy=True)
    assert ex.timeout == MCP_DEFAULT_TIMEOUT
    args.timeout = 7.0
    assert router.confined_executor(args, tmp_path / "u", name="u", hidden=[], lazy=True).timeout == 7.0


# --- built environments: read-only to the tenant's code (SPEC 9) ------------------------

# The tenant's code goes after its own environment: a .pth in site-packages, an edit of
# an installed module, the uv cache and the environments' store beside the folder, and
# the folder itself. It reports what got through (paths derived from the environment's
# own path: the store lies two levels up; the cache there or under ~/.cache/uv).
TAMPER = """
import glob, os, shutil, sqlite3
env = {env!r}
site = glob.glob(os.path.join(env, 'lib', 'python*', 'site-packages'))[0]
base = os.path.dirname(os.path.dirname(env))
got = []
def attempt(name, action):
    try:
        action()
        got.append(name)
    except Exception:
        pass
def pth():
    with open(os.path.join(site, 'zz_planted.pth'), 'w') as f:
        f.write("import os; os.environ['PLANTED'] = 'yes'\\n")
def module():
    with open(os.path.join(site, 'ledgerlib', '__init__.py'), 'a') as f:
        f.write("\\nVERSION = 'planted'\\n")
def cache():
    tags = glob.glob(base + '/**/CACHEDIR.TAG', recursive=True)
    tags += glob.glob(os.path.expanduser('~/.cache/uv/CACHEDIR.TAG'))
    for tag in tags:
        with open(os.path.join(os.path.dirname(tag), 'planted'), 'w') as f:
            f.write('x')
    assert tags
def store():
    db = sqlite3.connect(os.path.join(base, 'environments.sqlite3'))
    db.execute("UPDATE environments SET spec_text = 'planted'")
    db.commit()
    db.close()
def remove():
    shutil.rmtree(env)
    assert not os.path.exists(env)
for name, action in [('pth', pth), ('module', module), ('cache', cache), ('store', store),
                     ('remove', remove)]:
    attempt(name, action)
got
"""

USE = ("import os, ledgerlib; (ledgerlib.VERSION, ledgerlib.total([1, 2]), "
       "os.environ.get('PLANTED'))")


def _built(ex: ConfinedExecutor, wheels: Path, version: str = "1.0") -> dict[str, object]:
    from tests.fakes.wheels import ledgerlib_wheel, requirement

    created = ex.environments.create(spec=requirement("ledgerlib", ledgerlib_wheel(wheels, version)))
    assert "venv_id" in created, created
    lines: list[str] = []
    built = ex.execute_code("1", venv_id=created["venv_id"],
                            on_output=lambda stream, text: lines.append(stream))
    assert built.get("result") == "1", built
    assert "build" in lines  # build progress reached the caller from the builder
    found = ex.environments.build(venv_id=created["venv_id"])
    assert found.get("built") is True and found["cached"] is True, found
    return {"venv_id": created["venv_id"], "path": found["path"]}


@pytest.mark.slow
@pytest.mark.parametrize("level", [best_level(), "landlock"])
def test_the_tenant_cannot_change_its_built_environments(tmp_path: Path, level: str) -> None:
    folder = tmp_path / "tenant"
    with ConfinedExecutor(folder, level=level, env={"UV_OFFLINE": "1"}, timeout=60) as ex:
        assert ex.confinement["level"] == level
        env = _built(ex, folder / "wheels")
        tampered = ex.execute_code(TAMPER.format(env=env["path"]))
        assert tampered.get("result") == "[]", tampered
        used = ex.execute_code(USE, venv_id=env["venv_id"])
        assert used.get("result") == "('1.0', 3, None)", used
        bash = ex.execute_code("touch $VIRTUAL_ENV/x 2>/dev/null && echo wrote || echo refused",
                               language="bash", venv_id=env["venv_id"])
        assert bash["stdout"].strip() == "refused", bash
        # A second tenant's build of its own is its own, and unaffected.
        with ConfinedExecutor(tmp_path / "other", level=level, env={"UV_OFFLINE": "1"}) as other:
            theirs = _built(other, tmp_path / "other" / "wheels", "2.0")
            assert theirs["path"] != env["path"]
            used = other.execute_code("import ledgerlib; ledgerlib.VERSION",
                                      venv_id=theirs["venv_id"])
            assert used.get("result") == "'2.0'", used


# Inside the host: the builder is the other child of the host's parent (the jail's init).
PROBE_BUILDER = """
import ctypes, os, signal
me, parent = os.getpid(), os.getppid()
builders = []
for entry in os.listdir('/proc'):
    try:
        fields = open(f'/proc/{entry}/stat').read().rsplit(')', 1)[1].split()
    except (OSError, ValueError):
        continue
    if entry.isdigit() and int(entry) != me and int(fields[1]) == parent:
        builders.append(int(entry))
assert len(builders) == 1, builders
pid = builders[0]
found = {}
try:
    os.kill(pid, signal.SIGKILL)
    found['kill'] = 'sent'
except OSError as exc:
    found['kill'] = type(exc).__name__
try:
    with open(f'/proc/{pid}/mem', 'rb') as f:
        f.read(1)
    found['mem'] = 'read'
except OSError as exc:
    found['mem'] = type(exc).__name__
found['ptrace'] = ctypes.CDLL(None, use_errno=True).ptrace(16, pid, 0, 0)
found
"""


@pytest.mark.parametrize("level", [best_level(), "landlock"])
def test_the_host_cannot_signal_trace_or_read_its_builder(tmp_path: Path, level: str) -> None:
    with ConfinedExecutor(tmp_path / "t", level=level) as ex:
        assert (ex.confinement["level"], ex.confinement["builds"]) == (level, "builder")
        probe = ex.execute_code(PROBE_BUILDER)
        # Signals are scoped from Landlock ABI 6 on (the `landlock` level needs it).
        kill = "PermissionError" if landlock_abi() >= 6 else "sent"
        assert probe.get("result") == (
            f"{{'kill': '{kill}', 'mem': 'PermissionError', 'ptrace': -1}}"), probe
        jail = child_pids(ex.pid)
        assert ex.execute_code("import os; os._exit(3)")["error_type"] == "crashed"
        deadline = time.monotonic() + 5
        while jail & child_pids(ex.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ex.execute_code("1")["state_lost"] is True
        assert not jail & child_pids(ex.pid)  # the old builder ended with its host


@pytest.mark.slow
@pytest.mark.parametrize("level", [best_level(), "landlock"])
def test_a_build_in_flight_ends_with_its_host(tmp_path: Path, level: str) -> None:
    from tests.conftest import alive
    from tests.fakes.wheels import build_wheel, requirement

    folder = tmp_path / "t"
    # The build's import check imports this module: the build stays in flight.
    wheel = build_wheel(folder / "wheels", "sleepy", "1.0",
                        {"sleepy/__init__.py": "import time\ntime.sleep(120)\n"})
    with ConfinedExecutor(folder, level=level, env={"UV_OFFLINE": "1"}) as ex:
        created = ex.environments.create(spec=requirement("sleepy", wheel))
        built: list[dict[str, object]] = []
        building = threading.Thread(target=lambda: built.append(
            ex.environments.build(venv_id=created["venv_id"])))
        building.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(
                b"_coordex_import_check" in _cmdline(pid) for pid in child_pids(ex.pid)):
            time.sleep(0.05)
        jail = child_pids(ex.pid)
        assert any(b"_coordex_import_check" in _cmdline(pid) for pid in jail)
        assert ex.execute_code("import os; os._exit(1)")["error_type"] == "crashed"
        building.join(timeout=30)
        assert built and built[0]["error_type"] == "crashed", built
        deadline = time.monotonic() + 5
        while any(alive(pid) for pid in jail) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [pid for pid in jail if alive(pid)]


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def test_an_environments_folder_inside_the_tenants_stays_read_only(tmp_path: Path) -> None:
    folder = tmp_path / "t"
    with ConfinedExecutor(folder, environments=folder / "envs") as ex:
        if ex.confinement["level"] == "namespaces+landlock":
            probe = ex.execute_code("touch envs/x && echo wrote || echo refused; touch y && "
                                    "echo mine", language="bash")
            assert probe["stdout"].split() == ["refused", "mine"], probe
    # Landlock alone cannot take rights away beneath a writable folder: it says so.
    with ConfinedExecutor(folder, environments=folder / "envs", level="landlock") as ex:
        assert ex.confinement["level"] == "none"
    with pytest.raises(ValueError, match="is or holds"):
        ConfinedExecutor(folder, environments=tmp_path)


def test_stored_functions_are_defined_and_called_through_the_wire(
        confined: ConfinedExecutor) -> None:
    made = confined.functions.define(source="def double(x):\n    return 2 * x\n")
    assert made.get("name") == "double" and made.get("version") == 1, made
    again = confined.functions.define(source="def double(x):\n    return x + x\n")
    assert again.get("version") == 2, again
    called = confined.functions.call(name="double", args=[21])
    assert called.get("value") == 42 and called["function"]["version"] == 2, called
    assert confined.functions.versions(name="double") == [1, 2]
    assert confined.functions.show(name="double", version=1)["source"].endswith("2 * x\n")
    # Written by the owner: the host's folder holds no store of its own.
    assert not (confined.folder / "library.sqlite3").exists()
    assert (confined.records_folder / "library.sqlite3").exists()
    missing = confined.environments.show(venv_id=99)
    assert missing.get("error_type") == "not_found", missing


@pytest.mark.parametrize("level", ["namespaces+landlock", "landlock"])
def test_no_network_holds_at_both_levels(tmp_path: Path, level: str) -> None:
    import socket

    if level == "namespaces+landlock" and best_level() != level:
        pytest.skip("user namespaces are blocked here")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    try:
        with ConfinedExecutor(tmp_path / "t", network=False, level=level) as ex:
            assert ex.confinement["level"] == level and ex.confinement["network"] is False
            tried = ex.execute_code(
                "import socket\n"
                "try:\n"
                f"    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
                "    out = 'reached'\n"
                "except OSError as exc:\n"
                "    out = type(exc).__name__\n"
                "out")
            assert tried.get("result") not in (None, "'reached'"), tried
    finally:
        listener.close()


def test_a_confined_hosts_sessions_outlive_it_in_its_own_folder(tmp_path: Path) -> None:
    """SPEC 12, last bullet: a confined host keeps its snapshots in its tenant's folder and
    restores them inside its own jail; after the host dies they come back by replay of
    the log its owner wrote."""
    folder = tmp_path / "t"
    with ConfinedExecutor(folder, persist=True, memory_limit=512 << 20) as ex:
        ex.execute_code("x = 41\ndef f():\n    return x + 1", state_mode="stateful",
                        session_name="keep")
        ex.execute_code("y=7; cd /tmp", language="bash", state_mode="stateful",
                        session_name="sh")
    assert any((folder / "snapshots").iterdir())  # in the tenant's own folder
    with ConfinedExecutor(folder, persist=True, memory_limit=512 << 20) as ex:
        held = {r["session_name"]: r["held"] for r in ex.list_sessions()["sessions"]}
        assert held.get("keep") is False and held.get("sh") is False, held
        py = ex.execute_code("f()", state_mode="stateful", session_name="keep")
        assert py["result"] == "42" and py["restored"]["from"] == "snapshot", py
        sh = ex.execute_code('echo "$y $PWD"', language="bash", state_mode="stateful",
                             session_name="sh")
        assert sh["stdout"] == "7 /tmp\n" and sh["restored"]["from"] == "snapshot", sh
        ex.execute_code("x = 99", state_mode="stateful", session_name="keep")
        ex.execute_code("import os; os._exit(3)")  # the host dies; nothing written at close
        again = ex.execute_code("x", state_mode="stateful", session_name="keep")
        assert again["result"] == "99" and "replay" in again["restored"]["from"], again
        assert "state_lost" not in again


def test_branches_and_checkpoints_inside_the_host(confined: ConfinedExecutor,
                                                   tmp_path: Path) -> None:
    """SPEC 15 through the confined host's wire: the fork and the checkpoint are made in
    the host, the checkpoint kept in the tenant's own folder, and call_tool routes them."""
    confined.execute_code("rows = [3, 1, 2]", state_mode="stateful", session_name="a")
    forked = confined.fork_session(session_name="a", new_name="b")
    assert forked["session"]["session_name"] == "b", forked
    confined.execute_code("rows.sort()", state_mode="stateful", session_name="b")
    assert confined.execute_code("rows", state_mode="stateful",
                                 session_name="a")["result"] == "[3, 1, 2]"
    made = confined.call_tool("checkpoint_session", {"session_name": "b", "label": "sorted"})
    assert made["label"] == "sorted", made
    assert list((tmp_path / "tenant").glob(f"**/checkpoints/*/{made['checkpoint']}"))
    confined.execute_code("rows = None", state_mode="stateful", session_name="b")
    back = confined.restore_session(session_name="b", checkpoint=made["checkpoint"])
    assert back["restored"] is True, back
    assert confined.execute_code("rows", state_mode="stateful",
                                 session_name="b")["result"] == "[1, 2, 3]"
    listed = confined.list_checkpoints(session_name="b")["checkpoints"]
    assert [c["checkpoint"] for c in listed] == [made["checkpoint"]]
    refused = confined.restore_session(session_name="a", checkpoint=made["checkpoint"])
    assert refused["error_type"] == "validation"
