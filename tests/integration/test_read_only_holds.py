"""Read-only holds against everything a session holds (SPEC section 1), per backend.

Each test is an attack a session's own objects make possible: a file object opened
before the call, a SQLite connection, a shared memory map, coordex's own pipes to other
sessions, a library whose thread pool does not survive ``fork()``, a capability. Every
test goes through the public ``Executor`` in the own interpreter and in an environment
worker (an empty environment, built offline), with the session's cwd in a throwaway
protected folder; afterwards the disk and the session are checked, and ``isolation``
must claim only what held.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from coordex import Executor
from coordex.backends import isolation

pytestmark = [
    pytest.mark.skipif(os.uname().sysname != "Linux", reason="Linux kernel features"),
    pytest.mark.timeout(120),
]


@dataclass
class Place:
    name: str
    ex: Executor
    venv_id: int | None
    work: Path
    outside: Path

    def run(self, code: str, mode: str = "read_only", **kw: Any) -> dict[str, Any]:
        return self.ex.execute_code(code, state_mode=mode, session_name="s",
                                    venv_id=self.venv_id, **kw)

    def ok(self, code: str, mode: str = "stateful", **kw: Any) -> dict[str, Any]:
        result = self.run(code, mode, **kw)
        assert "error" not in result, result
        return result


@pytest.fixture(scope="module")
def envs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("envs")


@pytest.fixture
def offline_uv(tmp_path_factory: pytest.TempPathFactory,
               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "uv-cache"))
    monkeypatch.setenv("UV_OFFLINE", "1")
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)


@pytest.fixture(params=["own", pytest.param("worker", marks=pytest.mark.slow)])
def place(request: pytest.FixtureRequest, tmp_path: Path, envs_dir: Path,
          monkeypatch: pytest.MonkeyPatch) -> Iterator[Place]:
    monkeypatch.delenv(isolation.FORCE_ENV, raising=False)
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    ex = Executor(root=tmp_path / "root", timeout=30, envs_dir=envs_dir,
                  read_only_paths=["."])
    try:
        venv_id = None
        if request.param == "worker":
            request.getfixturevalue("offline_uv")
            created = ex.environments.create("")
            assert "venv_id" in created, created
            venv_id = created["venv_id"]
        where = Place(request.param, ex, venv_id, work, outside)
        where.ok(f"import os; os.chdir({str(work)!r})")
        yield where
    finally:
        ex.close()


def require(mode: str) -> None:
    reachable = isolation.best_mode()
    if isolation._RANK[reachable] < isolation._RANK[mode]:
        pytest.skip(f"this machine reaches {reachable!r}, not {mode!r}")


# -- descriptors the session opened --------------------------------------------------------


def test_a_file_object_in_a_protected_folder_writes_to_the_throwaway_view(
        place: Place) -> None:
    require("discarded")
    place.ok("fh = open('data.txt', 'a'); fh.write('one\\n')")  # left in the buffer
    result = place.run("fh.write('two\\n'); fh.flush(); open('data.txt').read()")
    assert "error" not in result, result
    assert result["result"] == repr("one\ntwo\n")  # the copy sees its own writes
    assert result["isolation"]["files"] == "discarded"
    place.ok("fh.close()")
    # Written once, by the session: not by the copy, and not twice.
    assert (place.work / "data.txt").read_text() == "one\n"
    assert result["isolation"]["copy"] == "fork"


def test_a_file_object_elsewhere_is_read_only_in_the_copy(place: Place) -> None:
    target = place.outside / "log.txt"
    place.ok(f"fh = open({str(target)!r}, 'a'); fh.write('one\\n')")
    result = place.run("fh.write('two\\n')\ntry:\n    fh.flush()\n    print('wrote')\n"
                       "except OSError as e:\n    print('refused', type(e).__name__)")
    assert "error" not in result, result
    assert result["stdout"].startswith("refused"), result
    place.ok("fh.close()")
    assert target.read_text() == "one\n"


def test_a_sqlite_connection_works_in_the_copy_and_the_database_keeps_nothing(
        place: Place) -> None:
    require("discarded")
    place.ok("import sqlite3; con = sqlite3.connect('db.sqlite')\n"
             "con.execute('create table t (x)'); con.commit()")
    result = place.run("con.execute('insert into t values (1)'); con.commit()\n"
                       "con.execute('select count(*) from t').fetchone()[0]")
    assert "error" not in result, result
    assert result["result"] == "1"
    assert place.ok("con.execute('select count(*) from t').fetchone()[0]")["result"] == "0"
    place.ok("con.close()")
    fresh = sqlite3.connect(place.work / "db.sqlite")
    try:
        assert fresh.execute("select count(*) from t").fetchone()[0] == 0
    finally:
        fresh.close()


def test_objects_of_the_callers_thread_work_in_a_copy_with_code_on_that_thread(
        tmp_path: Path) -> None:
    # own_on_caller_thread=True: the session's code ran on this (main) thread, so the
    # copy must be this thread's fork too, or the connection and the thread-local data
    # the code made here are another thread's in the copy.
    with Executor(root=tmp_path / "root", timeout=30, own_on_caller_thread=True) as ex:
        made = ex.execute_code(
            "import sqlite3, threading\ncon = sqlite3.connect(':memory:')\n"
            "con.execute('create table t (x)')\nlocal = threading.local(); local.v = 5",
            state_mode="stateful", session_name="s")
        assert "error" not in made, made
        result = ex.execute_code(
            "con.execute('insert into t values (1)')\n"
            "(con.execute('select count(*) from t').fetchone()[0], local.v)",
            state_mode="read_only", session_name="s")
        assert "error" not in result, result
        assert result["result"] == "(1, 5)"
        after = ex.execute_code("con.execute('select count(*) from t').fetchone()[0]",
                                state_mode="stateful", session_name="s")
        assert after["result"] == "0", after


def test_coordex_pipes_are_closed_in_the_copy(place: Place) -> None:
    """Code in the copy writes a command into every pipe and socket it can find."""
    ex = place.ex
    assert "error" not in ex.execute_code("MARK=session", language="bash",
                                          state_mode="stateful", session_name="b")
    place.ok("kept = 42")
    attack = (
        "import os, stat\nhit = []\n"
        "for name in os.listdir('/proc/self/fd'):\n"
        "    fd = int(name)\n"
        "    try:\n        mode = os.fstat(fd).st_mode\n    except OSError:\n        continue\n"
        "    if fd > 2 and (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):\n"
        "        try:\n"
        "            os.write(fd, b'MARK=pwned; kept=0\\n')\n"
        "            hit.append(fd)\n"
        "        except OSError:\n            pass\n"
        "print(hit)\n")
    place.run(attack)
    bash = ex.execute_code("echo $MARK", language="bash", state_mode="stateful",
                           session_name="b")
    assert bash["stdout"] == "session\n", bash
    after = place.ok("kept")
    assert after["result"] == "42" and not after.get("state_lost"), after


# -- shared mappings ----------------------------------------------------------------------


def test_shared_maps_are_private_in_the_copy(place: Place) -> None:
    (place.work / "map.bin").write_bytes(b"\0" * 4096)
    place.ok(f"import mmap\nanon = mmap.mmap(-1, 4096); anon[:5] = b'hello'\n"
             f"f = open({str(place.work / 'map.bin')!r}, 'r+b'); fm = mmap.mmap(f.fileno(), 4096)")
    result = place.run("anon[:5] = b'WORLD'; fm[:5] = b'WORLD'; fm.flush(); "
                       "bytes(anon[:5]) + bytes(fm[:5])")
    assert "error" not in result, result
    assert result["result"] == repr(b"WORLDWORLD")
    assert result["isolation"]["objects"] is True
    assert place.ok("bytes(anon[:5]) + bytes(fm[:5])")["result"] == repr(b"hello\0\0\0\0\0")
    assert (place.work / "map.bin").read_bytes() == b"\0" * 4096
    place.ok("fm.close(); anon.close(); f.close()")


# -- capabilities -------------------------------------------------------------------------


def test_capabilities_run_in_the_agents_process(place: Place) -> None:
    calls: list[Any] = []

    @place.ex.capability
    def record(value: Any) -> str:
        calls.append(value)
        return f"recorded {value}"

    place.ok("x = 1")
    result = place.run("record(7)")
    assert "error" not in result, result
    assert result["result"] == repr("recorded 7")
    assert calls == [7]


# -- isolation says what held, whatever the ending ----------------------------------------


def test_a_timed_out_copy_still_says_which_protection_held(place: Place) -> None:
    require("refused")
    place.ok("x = 1")
    result = place.run("import time; time.sleep(30)", timeout=1.5)
    assert result["error_type"] == "timeout", result
    assert result["isolation"]["files"] == isolation.best_mode()
    assert result["isolation"]["copy"] == "fork"


def test_an_execution_error_says_which_protection_held(place: Place) -> None:
    require("refused")
    place.ok("x = 1")
    result = place.run("1 / 0")
    assert result["error_type"] == "execution", result
    assert result["isolation"]["files"] == isolation.best_mode()
    assert result["isolation"]["copy"] == "fork"


# -- runtimes that break under fork() -----------------------------------------------------

POLARS_SETUP = ("import polars as pl\n"
                "df = pl.DataFrame({'k': ['a', 'b'] * 50_000, 'v': list(range(100_000))})\n"
                "df.group_by('k').agg(pl.col('v').sum())")  # the pool now exists
POLARS_LOOK = "df.group_by('k').agg(pl.col('v').sum()).sort('k')['v'].to_list()"
POLARS_ANSWER = repr([sum(range(0, 100_000, 2)), sum(range(1, 100_000, 2))])


OWN_POLARS_SCRIPT = """
import json, sys
from coordex import Executor
with Executor(root=sys.argv[1], timeout=30) as ex:
    setup = ex.execute_code(sys.argv[2] + "\\nclass Local: pass\\nmine = Local()",
                            state_mode="stateful", session_name="pl")
    look = ex.execute_code(sys.argv[3], state_mode="read_only", session_name="pl", timeout=30)
    sort = ex.execute_code("df.sort('v', descending=True)", state_mode="read_only",
                           session_name="pl")
    after = ex.execute_code("df['v'][0]", state_mode="stateful", session_name="pl")
    print(json.dumps([setup, look, sort, after]))
"""


def test_polars_in_a_read_only_call_answers_within_its_timeout(tmp_path: Path) -> None:
    """In a process of its own: once polars' pool runs, every own copy goes by value."""
    pytest.importorskip("polars")
    done = subprocess.run([sys.executable, "-c", OWN_POLARS_SCRIPT, str(tmp_path / "root"),
                           POLARS_SETUP, POLARS_LOOK], capture_output=True, text=True,
                          timeout=100, check=False)
    assert done.returncode == 0, done.stderr
    setup, look, sort, after = json.loads(done.stdout.splitlines()[-1])
    assert "error" not in setup, setup
    assert "error" not in look, look
    assert look["result"] == POLARS_ANSWER
    assert look["isolation"]["copy"] == "values"
    assert {"Local", "mine"} <= set(look["isolation"]["left_out"])
    assert "error" not in sort, sort
    assert after["result"] == "0"


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.timeout(600)
def test_polars_in_an_environment_read_only_call_answers(tmp_path: Path) -> None:
    with Executor(root=tmp_path / "root", timeout=60) as ex:
        created = ex.environments.create("polars\n")
        assert "venv_id" in created, created
        venv = created["venv_id"]
        setup = ex.execute_code(POLARS_SETUP, state_mode="stateful", session_name="pl",
                                venv_id=venv)
        assert "error" not in setup, setup
        result = ex.execute_code(POLARS_LOOK, state_mode="read_only", session_name="pl",
                                 venv_id=venv, timeout=30)
        assert "error" not in result, result
        assert result["result"] == POLARS_ANSWER
        assert result["isolation"]["copy"] == "values"


# -- a copy by values holds the same promises ---------------------------------------------


@pytest.fixture
def by_values(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Place]:
    """An own-interpreter session whose copies go by value (as where fork is unsafe)."""
    from coordex.backends.own import interpreter as own_interpreter

    monkeypatch.setattr(own_interpreter, "FORK_IS_SAFE", False)
    monkeypatch.delenv(isolation.FORCE_ENV, raising=False)
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    ex = Executor(root=tmp_path / "root", timeout=30, read_only_paths=["."])
    try:
        where = Place("values", ex, None, work, outside)
        where.ok(f"import os; os.chdir({str(work)!r}); rows = [1, 2]")
        yield where
    finally:
        ex.close()


def test_a_copy_by_values_protects_files_and_calls_capabilities_here(
        by_values: Place) -> None:
    require("refused")
    calls: list[Any] = []

    @by_values.ex.capability
    def record(value: Any) -> str:
        calls.append(value)
        return "ok"

    result = by_values.run("rows.append(3); open('new.txt', 'w').write('x')\n"
                           "import os; (record(len(rows)), sorted(os.listdir('.')))")
    assert "error" not in result, result
    assert result["result"] == repr(("ok", ["new.txt"]))
    assert result["isolation"]["copy"] == "values"
    assert result["isolation"]["files"] == isolation.best_mode()
    assert calls == [3]
    assert not (by_values.work / "new.txt").exists()
    assert by_values.ok("rows")["result"] == "[1, 2]"


def test_a_timed_out_copy_by_values_says_what_held(by_values: Place) -> None:
    result = by_values.run("import time; time.sleep(30)", timeout=1.5)
    assert result["error_type"] == "timeout", result
    assert result["isolation"]["copy"] == "values"
    assert result["isolation"]["files"] == isolation.best_mode()
