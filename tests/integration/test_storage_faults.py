"""coordex's own storage failing (a full disk, a read-only or damaged database) gives
error dicts that say what to free or fix, and the executor works again once the cause
is gone (SPEC 6).

A full or read-only disk is a small tmpfs mounted in a private mount namespace
(``unshare -m``) around a child Python, so nothing is left mounted if a test dies.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from coordex import Executor
from tests.fakes.wheels import bulky_wheel, requirement

pytestmark = pytest.mark.timeout(120)


def _can_mount() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs tmpfs /mnt"],
                           capture_output=True)
    return probe.returncode == 0


needs_mount = pytest.mark.skipif(not _can_mount(), reason="needs root and unshare -m")

PRELUDE = '''
import json, os, sys
from coordex import CallError, Executor
from tests.fakes.wheels import bulky_wheel, requirement
DISK = sys.argv[1]

def fill():
    """Fill the disk to the last byte."""
    fd = os.open(os.path.join(DISK, "filler"), os.O_WRONLY | os.O_CREAT)
    try:
        for size in (1 << 16, 1 << 12, 1 << 9, 1):
            try:
                while True:
                    os.write(fd, b"x" * size)
            except OSError:
                pass
    finally:
        os.close(fd)

def free():
    os.remove(os.path.join(DISK, "filler"))

def define(ex, source):
    found = ex.functions.define(source=source)  # SPEC 2: a full disk is a dict, not raised
    return found if isinstance(found, dict) else {"ok": True}

seen = {}
'''


def on_small_disk(tmp_path: Path, body: str, size: str = "2m") -> dict[str, Any]:
    """Run ``body`` in a child whose ``DISK`` folder is a tmpfs of ``size``; what it
    put in ``seen`` comes back."""
    disk = tmp_path / "disk"
    disk.mkdir()
    script = PRELUDE + textwrap.dedent(body) + "\nprint(json.dumps(seen))\n"
    shell = 'mount -t tmpfs -o size="$1" tmpfs "$0" && exec "$2" -c "$3" "$0"'
    done = subprocess.run(["unshare", "-m", "sh", "-c", shell, str(disk), size,
                           sys.executable, script],
                          capture_output=True, text=True, timeout=100,
                          env={**os.environ, "TMPDIR": str(disk)})
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def assert_storage_error(record: dict[str, Any], words: str) -> None:
    assert record.get("error_type") == "environment", record
    assert words in record["error"], record
    assert record["suggestion"] and "traceback" not in record


@needs_mount
def test_a_full_disk_gives_errors_that_say_so_and_passes(tmp_path: Path) -> None:
    seen = on_small_disk(tmp_path, '''
        ex = Executor(root=os.path.join(DISK, "home"))
        seen["before"] = ex.environments.create("", name="empty")
        seen["define_before"] = define(ex, "def f():\\n    return 1\\n")
        fill()
        seen["create"] = ex.environments.create("ledgerlib==1.0\\n" + "x" * 100, name="big" * 50)
        seen["list"] = ex.environments.list()
        seen["run"] = ex.execute_code("1", venv_id=99)
        seen["define"] = define(ex, "def g():\\n    return '" + "y" * 20000 + "'\\n")
        free()
        seen["create_after"] = ex.environments.create("ledgerlib==1.0", name="after")
        seen["list_after"] = ex.environments.list()
        seen["define_after"] = define(ex, "def g():\\n    return 2\\n")
        ex.close()
    ''')
    assert seen["before"]["venv_id"] == 1 and seen["define_before"] == {"ok": True}
    for key in ("create", "define"):
        assert_storage_error(seen[key], "is full")
        assert "Free space" in seen[key]["suggestion"]
    # Reads may still work on a full disk; if they fail, they say why.
    for key in ("list", "run"):
        if "error_type" in seen[key] and seen[key]["error_type"] != "not_found":
            assert_storage_error(seen[key], "is full")
    assert seen["create_after"]["venv_id"] == 2
    assert len(seen["list_after"]["environments"]) == 2
    assert seen["define_after"] == {"ok": True}


@needs_mount
def test_a_fresh_root_on_a_full_disk_is_an_error_not_an_exception(tmp_path: Path) -> None:
    seen = on_small_disk(tmp_path, '''
        os.makedirs(os.path.join(DISK, "home"))
        ex = Executor(root=os.path.join(DISK, "home"))
        fill()
        seen["create"] = ex.environments.create("", name="empty")
        seen["list"] = ex.environments.list()
        seen["run"] = ex.execute_code("1", venv_id=1)
        seen["define"] = define(ex, "def f():\\n    return 1\\n")
        seen["own"] = ex.execute_code("1 + 1")
        free()
        seen["create_after"] = ex.environments.create("", name="empty")
        seen["define_after"] = define(ex, "def f():\\n    return 1\\n")
        ex.close()
    ''')
    for key in ("create", "list", "run", "define"):
        assert_storage_error(seen[key], "is full")
    assert seen["own"]["result"] == "2"
    assert seen["create_after"]["venv_id"] == 1 and seen["define_after"] == {"ok": True}


@needs_mount
def test_a_read_only_disk_says_to_make_it_writable(tmp_path: Path) -> None:
    seen = on_small_disk(tmp_path, '''
        import subprocess
        ex = Executor(root=os.path.join(DISK, "home"))
        ex.environments.create("", name="empty")
        define(ex, "def f():\\n    return 1\\n")
        ex.close()
        subprocess.run(["mount", "-o", "remount,ro", DISK], check=True)
        ex = Executor(root=os.path.join(DISK, "home"))
        seen["create"] = ex.environments.create("ledgerlib==1.0")
        seen["define"] = define(ex, "def g():\\n    return 2\\n")
        ex.close()
    ''')
    for key in ("create", "define"):
        assert_storage_error(seen[key], "cannot be written")
        assert "writable" in seen[key]["suggestion"]


def test_a_damaged_database_says_to_move_it_aside(tmp_path: Path) -> None:
    root = tmp_path / "home"
    with Executor(root=root) as ex:
        assert ex.environments.create("", name="empty")["venv_id"] == 1
        ex.functions.define(source="def f():\n    return 1\n")
    for name in ("environments.sqlite3", "library.sqlite3"):
        for suffix in ("", "-wal", "-shm"):
            path = root / (name + suffix)
            if path.exists():
                path.unlink()
        (root / name).write_bytes(b"this is not a database" * 100)
    with Executor(root=root) as ex:
        for record in (ex.environments.create("ledgerlib==1.0"), ex.environments.list(),
                       ex.execute_code("1", venv_id=1)):
            assert_storage_error(record, "damaged")
            assert "Move" in record["suggestion"]
        damaged = ex.functions.define(source="def g():\n    return 2\n")
        assert isinstance(damaged, dict)  # SPEC 2: returned, never raised
        assert_storage_error(damaged, "damaged")
        for name in ("environments.sqlite3", "library.sqlite3"):
            (root / name).rename(root / (name + ".bad"))
        assert ex.environments.create("", name="empty")["venv_id"] == 1
        assert ex.functions.define(source="def g():\n    return 2\n").name == "g"


@needs_mount
@pytest.mark.slow
def test_a_build_that_runs_out_of_space_says_so(tmp_path: Path) -> None:
    wheel = bulky_wheel(tmp_path / "wheels", modules=1500)  # ~3 MB installed
    seen = on_small_disk(tmp_path, f'''
        os.environ["UV_OFFLINE"] = "1"
        os.environ["UV_CACHE_DIR"] = {str(tmp_path / "uv-cache")!r}
        os.environ.pop("VIRTUAL_ENV", None)
        ex = Executor(root=os.path.join(DISK, "home"))
        venv_id = ex.environments.create({requirement("bulkylib", wheel)!r})["venv_id"]
        seen["build"] = ex.environments.build(venv_id)
        seen["run"] = ex.execute_code("import bulkylib", venv_id=venv_id)
        ex.close()
    ''')
    for key in ("build", "run"):
        record = seen[key]
        assert record["error_type"] == "environment", record
        assert "is full" in record["error"] and "Free space" in record["suggestion"], record
        assert "Change" not in record["suggestion"]


@needs_mount
def test_python_read_only_with_a_tmpdir_it_cannot_write_is_an_error_that_says_so(
        tmp_path: Path) -> None:
    # The place makes the call's scratch folder (its TMPDIR); making it fails here.
    seen = on_small_disk(tmp_path, f'''
        import subprocess, tempfile
        ex = Executor(root={str(tmp_path / "home")!r})
        ex.execute_code("x = 1", state_mode="stateful", session_name="p")
        tempfile.tempdir = DISK
        subprocess.run(["mount", "-o", "remount,ro", DISK], check=True)
        seen["ro"] = ex.execute_code("x + 1", state_mode="read_only", session_name="p")
        subprocess.run(["mount", "-o", "remount,rw", DISK], check=True)
        seen["ro_after"] = ex.execute_code("x + 1", state_mode="read_only",
                                           session_name="p")
        seen["left"] = [n for n in os.listdir(DISK) if n.startswith("coordex-ro-")]
        ex.close()
    ''')
    assert_storage_error(seen["ro"], "cannot be written")
    assert "TMPDIR" in seen["ro"]["error"] and "writable" in seen["ro"]["suggestion"]
    assert seen["ro_after"]["result"] == "2", seen["ro_after"]
    assert seen["left"] == []  # the scratch folder went with the call


@needs_mount
def test_bash_read_only_with_a_full_tmpdir_is_an_error_not_exit_127(tmp_path: Path) -> None:
    seen = on_small_disk(tmp_path, f'''
        import tempfile
        ex = Executor(root={str(tmp_path / "home")!r})
        ex.execute_code("x=1", language="bash", state_mode="stateful", session_name="b")
        fill()
        tempfile.tempdir = DISK  # TMPDIR filled up after the host started
        seen["ro"] = ex.execute_code("echo $x", language="bash", state_mode="read_only",
                                     session_name="b")
        free()
        seen["ro_after"] = ex.execute_code("echo $x", language="bash",
                                           state_mode="read_only", session_name="b")
        seen["exit_127"] = ex.execute_code("no-such-command-here", language="bash",
                                           state_mode="read_only", session_name="b")
        ex.close()
    ''')
    assert_storage_error(seen["ro"], "is full")
    assert "TMPDIR" in seen["ro"]["error"]
    assert seen["ro_after"]["stdout"] == "1\n" and seen["ro_after"]["exit_code"] == 0
    assert seen["exit_127"]["exit_code"] == 127  # a command's own 127 is still its own
