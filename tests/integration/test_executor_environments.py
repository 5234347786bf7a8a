"""Dedicated environments through the public Executor API: real uv builds, offline.

One environment (ledgerlib 1.0 from a wheel made on the fly) is built once for the
module; each test opens its own sessions in it.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordex import Executor
from tests.conftest import child_pids
from tests.fakes.wheels import ledgerlib_wheel, requirement

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("wheels")
    ledgerlib_wheel(dest, "1.0")
    ledgerlib_wheel(dest, "2.0")
    return dest


@pytest.fixture(scope="module")
def env_ex(tmp_path_factory: pytest.TempPathFactory, wheels: Path) -> Iterator[tuple[Executor, int]]:
    os.environ.setdefault("UV_OFFLINE", "1")
    root = tmp_path_factory.mktemp("home")
    with Executor(root=root, timeout=30) as ex:
        spec = requirement("ledgerlib", next(wheels.glob("ledgerlib-1.0-*.whl")))
        created = ex.environments.create(spec, name="ledger-v1")
        assert created["venv_id"] >= 0, created
        built = ex.environments.build(created["venv_id"])
        assert built.get("built") is True, built
        yield ex, created["venv_id"]


def test_python_sessions_in_an_environment_keep_state(env_ex: tuple[Executor, int]) -> None:
    ex, venv = env_ex
    r = ex.execute_code("import ledgerlib, sys\nrows = [1, 2, 3]\nledgerlib.VERSION",
                        state_mode="stateful", session_name="work", venv_id=venv)
    assert r["result"] == "'1.0'", r
    assert r["session"] == {"language": "python", "venv_id": venv, "session_id": 1,
                            "session_name": "work"}
    r = ex.execute_code("rows.append(4); ledgerlib.total(rows)", state_mode="stateful",
                        session_name="work", venv_id=venv)
    assert r["result"] == "10"
    r = ex.execute_code("import sys; sys.prefix", venv_id=venv)
    assert "envs" in r["result"]
    assert ex.execute_code("'rows' in globals()", venv_id=venv)["result"] == "False"


def test_same_name_in_another_environment_is_another_session(env_ex: tuple[Executor, int]) -> None:
    ex, venv = env_ex
    ex.execute_code("where = 'env'", state_mode="stateful", session_name="twin", venv_id=venv)
    ex.execute_code("where = 'own'", state_mode="stateful", session_name="twin")
    assert ex.execute_code("where", state_mode="stateful", session_name="twin",
                           venv_id=venv)["result"] == "'env'"
    assert ex.execute_code("where", state_mode="stateful", session_name="twin")["result"] == "'own'"
    r = ex.execute_code("import ledgerlib", state_mode="stateful", session_name="twin")
    assert r["error_type"] == "execution" and r["exception"] == "ModuleNotFoundError"
    assert "venv_id" in r["suggestion"]


def test_read_only_in_an_environment_changes_nothing(env_ex: tuple[Executor, int]) -> None:
    ex, venv = env_ex
    ex.execute_code("import threading\nbook = {'a': [1, 2]}\nlock = threading.Lock()\n"
                    "gen = (i for i in range(3))", state_mode="stateful", session_name="ro",
                    venv_id=venv)
    r = ex.execute_code("book['a'].append(3); book['b'] = []; lock.acquire(); next(gen); "
                        "del book['a']; len(book)", state_mode="read_only", session_name="ro",
                        venv_id=venv)
    assert r["result"] == "1", r
    assert r["isolation"]["objects"] is True and r["isolation"]["names"] is True
    r = ex.execute_code("book, lock.locked(), next(gen)", state_mode="stateful",
                        session_name="ro", venv_id=venv)
    assert r["result"] == "({'a': [1, 2]}, False, 0)"


def test_bash_in_an_environment_is_activated(env_ex: tuple[Executor, int]) -> None:
    ex, venv = env_ex
    r = ex.execute_code('echo "$VIRTUAL_ENV"; command -v python; python -c "import ledgerlib; '
                        'print(ledgerlib.VERSION)"', language="bash", venv_id=venv)
    venv_dir, python, version = r["stdout"].splitlines()
    assert python == f"{venv_dir}/bin/python"
    assert version == "1.0" and r["exit_code"] == 0


def test_capabilities_reach_the_host_from_an_environment(env_ex: tuple[Executor, int]) -> None:
    ex, venv = env_ex
    calls: list[tuple[str, int]] = []

    @ex.capability
    def record(name: str, amount: int) -> dict[str, object]:
        calls.append((name, amount))
        return {"ok": True, "seen": len(calls)}

    @ex.capability
    def refuse(reason: str) -> None:
        raise PermissionError(f"host says no: {reason}")

    r = ex.execute_code("record('rent', 700)", venv_id=venv, state_mode="stateful",
                        session_name="caps")
    assert r["result"] == "{'ok': True, 'seen': 1}", r
    assert calls == [("rent", 700)]
    r = ex.execute_code("refuse('audit')", venv_id=venv)
    assert r["error_type"] == "execution"
    assert "host says no: audit" in r["error"] + r["traceback"]
    r = ex.execute_code("record(object(), 1)", venv_id=venv)
    assert r["error_type"] == "execution" and "object" in r["error"]


def test_a_killed_worker_is_replaced_and_says_state_was_lost(env_ex: tuple[Executor, int]) -> None:
    ex, venv = env_ex
    r = ex.execute_code("import os\nkeep = 1\nos.getpid()", state_mode="stateful",
                        session_name="fragile", venv_id=venv)
    pid = int(r["result"])
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    r = ex.execute_code("'keep' in globals()", state_mode="stateful", session_name="fragile",
                        venv_id=venv)
    assert r["result"] == "False" and r["state_lost"] is True
    r = ex.execute_code("import os; os.kill(os.getpid(), 9)", state_mode="stateful",
                        session_name="fragile", venv_id=venv)
    assert r["error_type"] == "crashed" and r["state_lost"] is True
    r = ex.execute_code("1 + 1", state_mode="stateful", session_name="fragile", venv_id=venv)
    assert r["result"] == "2"


def test_timeout_in_an_environment_interrupts_and_keeps_state(env_ex: tuple[Executor, int]) -> None:
    ex, venv = env_ex
    ex.execute_code("n = 5", state_mode="stateful", session_name="slow", venv_id=venv)
    r = ex.execute_code("while True: n += 0", state_mode="stateful", session_name="slow",
                        venv_id=venv, timeout=0.5)
    assert r["error_type"] == "timeout" and r["state_lost"] is False
    assert ex.execute_code("n", state_mode="stateful", session_name="slow",
                           venv_id=venv)["result"] == "5"


def test_sessions_in_environments_are_listed_inspected_and_closed(env_ex: tuple[Executor, int]) -> None:
    ex, venv = env_ex
    ex.execute_code("alpha = 1", state_mode="stateful", session_name="insp", venv_id=venv)
    ex.execute_code("beta = [2]", state_mode="stateful", session_name="insp", venv_id=venv)
    report = ex.inspect_session(session_name="insp", venv_id=venv)
    names = {n["name"]: n for n in report["names"]}
    assert names["alpha"]["bound_at_call"] == 1 and names["beta"]["bound_at_call"] == 2
    assert names["beta"]["calls_ago"] == 0 and names["beta"]["repr"] == "[2]"
    listed = [s for s in ex.list_sessions()["sessions"] if s["session_name"] == "insp"]
    assert listed and listed[0]["venv_id"] == venv and listed[0]["alive"] is True
    assert ex.close_session(session_name="insp", venv_id=venv)["closed"] is True
    assert ex.inspect_session(session_name="insp", venv_id=venv)["error_type"] == "not_found"


def test_names_bound_before_an_error_keep_their_provenance(env_ex: tuple[Executor, int]) -> None:
    ex, venv = env_ex
    r = ex.execute_code("early = 1\n1/0", state_mode="stateful", session_name="prov",
                        venv_id=venv)
    assert r["error_type"] == "execution"
    ex.execute_code("late = 2", state_mode="stateful", session_name="prov", venv_id=venv)
    names = {n["name"]: n for n in ex.inspect_session(session_name="prov", venv_id=venv)["names"]}
    assert names["early"]["bound_at_call"] == 1 and names["late"]["bound_at_call"] == 2


def test_a_shortened_result_counts_as_truncated_in_a_worker(env_ex: tuple[Executor, int]) -> None:
    ex, venv = env_ex
    r = ex.execute_code("'y' * 200_000", venv_id=venv)
    assert r["truncated"] is True and len(r["result"]) < 70_000


def test_unknown_environment_lists_the_known_ones(env_ex: tuple[Executor, int]) -> None:
    ex, venv = env_ex
    r = ex.execute_code("1", venv_id=venv + 40)
    assert r["error_type"] == "not_found"
    assert f"{venv} ('ledger-v1')" in r["suggestion"]


def test_unresolvable_environment_is_an_environment_error(env_ex: tuple[Executor, int]) -> None:
    ex, _ = env_ex
    created = ex.environments.create("ledgerlib-does-not-exist==9.9")
    r = ex.execute_code("1", venv_id=created["venv_id"])
    assert r["error_type"] == "environment", r
    assert r["log"] and r["suggestion"]


def test_bash_builds_its_environment_on_first_use(tmp_path: Path) -> None:
    os.environ.setdefault("UV_OFFLINE", "1")
    with Executor(root=tmp_path / "home") as ex:
        venv = ex.environments.create("", name="empty")["venv_id"]
        lines: list[str] = []
        r = ex.execute_code('command -v python; python -c "import sys; print(sys.prefix)"',
                            language="bash", venv_id=venv, on_progress=lines.append)
        python, prefix = r["stdout"].splitlines()
        assert python == f"{prefix}/bin/python"
        assert lines, "the build on first use reports progress"
        assert ex.environments.list()["environments"][0]["built"] is True


def test_two_pins_side_by_side_and_close_ends_every_process(tmp_path: Path, wheels: Path) -> None:
    os.environ.setdefault("UV_OFFLINE", "1")
    before = child_pids()
    with Executor(root=tmp_path / "home") as ex:
        ids = []
        for version in ("1.0", "2.0"):
            wheel = next(wheels.glob(f"ledgerlib-{version}-*.whl"))
            ids.append(ex.environments.create(requirement("ledgerlib", wheel))["venv_id"])
        assert ids[0] != ids[1]
        v1 = ex.execute_code("import ledgerlib; ledgerlib.total([1, 2])",
                             state_mode="stateful", venv_id=ids[0])
        v2 = ex.execute_code("import ledgerlib; ledgerlib.total([1, 2], currency='EUR')",
                             state_mode="stateful", venv_id=ids[1])
        assert (v1["result"], v2["result"]) == ("3", "'3 EUR'")
        ex.execute_code("true", language="bash", state_mode="stateful", venv_id=ids[0])
        ex.execute_code("1", venv_id=ids[1])  # starts a stateless template
        assert child_pids() - before
    deadline = time.monotonic() + 5
    while child_pids() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not (child_pids() - before)
