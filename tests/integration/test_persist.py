"""Sessions that outlive their process (SPEC 12): a session built under one Executor is
found, with its values, by the next Executor on the same root - after close, and after
the process holding it was SIGKILLed (its last snapshot plus the calls logged after it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordex import Executor
from tests.conftest import assert_no_new_children, child_pids, run_then_kill

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def no_leftovers() -> Iterator[None]:
    before = child_pids()
    yield
    assert_no_new_children(before)


def _ok(result: dict) -> dict:
    assert "error_type" not in result, result
    return result


def _kept(ex: Executor) -> list[dict]:
    return [s for s in ex.list_sessions()["sessions"] if s.get("held") is False]


BUILD = textwrap.dedent("""
    import math
    import numpy as np
    scale = 3
    def scaled(v):
        return v * scale
    class Point:
        def __init__(self, x):
            self.x = x
        def norm(self):
            return scaled(abs(self.x))
    p = Point(-4)
    arr = np.arange(1_000_000, dtype=np.int64)
    shared = [1, 2]
    also = {'list': shared}
""")


def test_own_sessions_come_back_after_close(root: Path, no_leftovers: None) -> None:
    with Executor(root=root, persist=True) as ex:
        _ok(ex.execute_code(BUILD, state_mode="stateful"))
        _ok(ex.execute_code("notes = ['a']", state_mode="stateful", session_name="work"))
        _ok(ex.execute_code("other = 1", state_mode="stateful", session_name="spare"))
        _ok(ex.execute_code("notes.append('b')", state_mode="stateful", session_name="work"))
        (work_id,) = [s["session_id"] for s in ex.list_sessions()["sessions"]
                      if s["session_name"] == "work"]

    with Executor(root=root, persist=True, max_sessions=2) as ex:
        kept = {(s["language"], s["session_name"]) for s in _kept(ex)}
        assert ("python", "work") in kept and ("python", "spare") in kept
        # Kept sessions do not count toward max_sessions until restored (2 kept + plan).
        r = _ok(ex.execute_code("scale = 10\n(p.norm(), math.pi > 3, int(arr.sum()), "
                                "also['list'] is shared, arr.flags.writeable)",
                                state_mode="stateful"))
        assert r["result"] == "(40, True, 499999500000, True, True)"
        assert r["restored"]["from"] == "snapshot" and r["restored"]["left_out"] == []
        assert isinstance(r["restored"]["ms"], float)
        r = _ok(ex.execute_code("notes", state_mode="stateful", session_name="work"))
        assert r["result"] == "['a', 'b']" and r["session"]["session_id"] == work_id
        assert "restored" not in _ok(ex.execute_code("notes", state_mode="stateful",
                                                     session_name="work"))
        # A new session numbered after the kept ones never takes a kept one's state.
        assert not [s for s in _kept(ex) if s["session_name"] == "work"]


def test_a_name_that_cannot_be_pickled_is_rebuilt_by_replaying_its_call(
        root: Path, tmp_path: Path, no_leftovers: None) -> None:
    data = tmp_path / "data.txt"
    data.write_text("line one\n")
    with Executor(root=root, persist=True) as ex:
        _ok(ex.execute_code(f"fh = open({str(data)!r})\ncount = 5", state_mode="stateful",
                            session_name="files"))
        _ok(ex.execute_code("count += 1\nfh.close()", state_mode="stateful",
                            session_name="files"))
    with Executor(root=root, persist=True) as ex:
        r = _ok(ex.execute_code("(fh.read(), count)", state_mode="stateful",
                                session_name="files"))
        _ok(ex.execute_code("fh.close()", state_mode="stateful", session_name="files"))
    # The file was opened again by its call; count keeps the value it had (6), not the
    # 5 the replayed call set.
    assert r["result"] == "('line one\\n', 6)"
    assert r["restored"]["from"] == "snapshot+replay" and r["restored"]["left_out"] == []


def test_what_no_logged_call_can_rebuild_is_listed_in_left_out(root: Path,
                                                                no_leftovers: None) -> None:
    with Executor(root=root, persist=True, log=False) as ex:
        _ok(ex.execute_code("import threading\nlock = threading.Lock()\nkept = 7",
                            state_mode="stateful", session_name="s"))
    with Executor(root=root, persist=True, log=False) as ex:
        r = _ok(ex.execute_code("(kept, 'lock' in globals(), threading.active_count() > 0)",
                                state_mode="stateful", session_name="s"))
    assert r["result"] == "(7, False, True)"
    assert r["restored"]["left_out"] == ["lock"]


def test_bash_keeps_cwd_variables_functions_aliases_options_and_umask(
        root: Path, tmp_path: Path, no_leftovers: None) -> None:
    work = tmp_path / "work dir"
    work.mkdir()
    with Executor(root=root, persist=True) as ex:
        _ok(ex.execute_code(f"cd '{work}'; export EXP=1; LOCAL='two words'; arr=(a b c)\n"
                            "greet() { echo \"hi $1\"; }\nalias ll='echo listed'\n"
                            "set -o pipefail; shopt -s extglob; umask 027",
                            language="bash", state_mode="stateful", session_name="sh"))
    with Executor(root=root, persist=True) as ex:
        r = _ok(ex.execute_code(
            "pwd; echo \"$EXP|$LOCAL|${arr[2]}\"; env | grep -c '^LOCAL=' || true; greet bob\n"
            "shopt -q -o pipefail && echo pipefail; shopt -q extglob && echo extglob; umask\n"
            "eval ll", language="bash", state_mode="stateful", session_name="sh"))
    assert r["stdout"].split("\n")[:-1] == [str(work), "1|two words|c", "0", "hi bob",
                                            "pipefail", "extglob", "0027", "listed"]
    assert r["restored"]["from"] == "snapshot"


def test_close_session_deletes_what_was_kept(root: Path, no_leftovers: None) -> None:
    with Executor(root=root, persist=True) as ex:
        _ok(ex.execute_code("a = 1", state_mode="stateful", session_name="gone"))
        _ok(ex.execute_code("b = 1", state_mode="stateful", session_name="kept"))
    with Executor(root=root, persist=True) as ex:
        assert ex.close_session(session_name="gone")["closed"] is True
        assert [s["session_name"] for s in _kept(ex)] == ["kept"]
    with Executor(root=root, persist=True) as ex:
        assert [s["session_name"] for s in _kept(ex)] == ["kept"]
        r = _ok(ex.execute_code("'a' in globals()", state_mode="stateful", session_name="gone"))
        assert r["result"] == "False" and "restored" not in r


def test_too_large_a_snapshot_is_not_written_and_the_log_keeps_the_session(
        root: Path, no_leftovers: None) -> None:
    with Executor(root=root, persist=True, persist_max_bytes=1000) as ex:
        _ok(ex.execute_code("blob = 'x' * 5000\nn = 1", state_mode="stateful", session_name="s"))
        _ok(ex.execute_code("n += 1", state_mode="stateful", session_name="s"))
    assert not list((root / "snapshots").glob("*/state-*"))
    with Executor(root=root, persist=True, persist_max_bytes=1000) as ex:
        r = _ok(ex.execute_code("(len(blob), n)", state_mode="stateful", session_name="s"))
    assert r["result"] == "(5000, 2)"
    assert r["restored"]["from"] == "replay" and r["restored"]["replayed"] == 2
    assert "persist_max_bytes" in r["restored"]["why"]


def test_a_damaged_snapshot_falls_back_to_replay_and_says_why(root: Path,
                                                              no_leftovers: None) -> None:
    with Executor(root=root, persist=True) as ex:
        _ok(ex.execute_code("n = 41", state_mode="stateful", session_name="s"))
    (data,) = (root / "snapshots").glob("*/state-*")
    data.write_bytes(data.read_bytes()[:-30])  # cut short
    with Executor(root=root, persist=True) as ex:
        r = _ok(ex.execute_code("n + 1", state_mode="stateful", session_name="s"))
    assert r["result"] == "42"
    assert r["restored"]["from"] == "replay" and "cut short" in r["restored"]["why"]


def test_a_background_snapshot_is_written_while_the_session_answers(
        root: Path, no_leftovers: None) -> None:
    with Executor(root=root, persist=True, snapshot_interval=0.0) as ex:
        _ok(ex.execute_code("import numpy as np\nbig = np.ones(20_000_000)",
                            state_mode="stateful", session_name="s"))
        meta_file = next((root / "snapshots").glob("*/meta.json"))
        # The session answers while its copy writes 160 MB.
        r = _ok(ex.execute_code("1 + 1", state_mode="stateful", session_name="s", timeout=5))
        assert r["result"] == "2"
        deadline = time.monotonic() + 30
        while not json.loads(meta_file.read_text()).get("file") and time.monotonic() < deadline:
            time.sleep(0.05)
        meta = json.loads(meta_file.read_text())
        assert meta["file"] and meta["bytes"] > 160_000_000 and meta["problem"] is None


# A process that builds sessions and is then SIGKILLed: with a short interval its first
# calls are snapshotted once it has passed, and the three calls after that (within the
# interval) are only in the log; with a long one, every call is only in the log.
CHILD = textwrap.dedent("""
    import json, os, sys, time
    from coordex import Executor
    ex = Executor(root=sys.argv[1], persist=True, snapshot_interval=float(sys.argv[2]))
    def run(code, **kw):
        r = ex.execute_code(code, state_mode="stateful", **kw)
        assert "error_type" not in r, r
    run("def bump(v):\\n    return v + 1\\nn = 1", session_name="py")
    run("N=1; twice() { echo $((N*2)); }", language="bash", session_name="sh")
    if float(sys.argv[2]) < 100:  # once the interval has passed, a call that changes names
        time.sleep(float(sys.argv[2]) + 0.1)
        run("n = n", session_name="py")
        run("N=$N", language="bash", session_name="sh")
        deadline = time.time() + 30
        for folder in os.listdir(os.path.join(sys.argv[1], "snapshots")):
            meta = os.path.join(sys.argv[1], "snapshots", folder, "meta.json")
            while not json.load(open(meta)).get("file") and time.time() < deadline:
                time.sleep(0.02)
    for _ in range(3):
        run("n = bump(n)", session_name="py")
        run("N=$((N+1))", language="bash", session_name="sh")
    os.write(int(sys.argv[3]), b"done\\n")
    time.sleep(600)
""")


@pytest.mark.parametrize("interval", [2.0, 3600.0])
def test_after_a_sigkill_nothing_a_returned_result_showed_is_lost(
        root: Path, tmp_path: Path, interval: float, no_leftovers: None) -> None:
    run_then_kill(CHILD, str(root), str(interval), cwd=os.getcwd())
    with Executor(root=root, persist=True) as ex:
        py = _ok(ex.execute_code("(n, bump(n))", state_mode="stateful", session_name="py"))
        sh = _ok(ex.execute_code("echo $N; twice", language="bash", state_mode="stateful",
                                 session_name="sh"))
    assert py["result"] == "(4, 5)" and sh["stdout"] == "4\n8\n"
    expected = "snapshot+replay" if interval < 100 else "replay"
    assert py["restored"]["from"] == expected and sh["restored"]["from"] == expected
    # The snapshot plus the three calls after it; or all four calls.
    assert py["restored"]["replayed"] == (3 if interval < 100 else 4)


def test_the_library_does_not_persist_unless_asked(root: Path, no_leftovers: None) -> None:
    with Executor(root=root) as ex:
        _ok(ex.execute_code("a = 1", state_mode="stateful", session_name="s"))
    assert not (root / "snapshots").exists()
    with Executor(root=root, persist=True) as ex:
        assert _kept(ex) == []


def test_inspect_session_says_how_a_session_is_kept(root: Path, no_leftovers: None) -> None:
    with Executor(root=root, persist=True, persist_max_bytes=1000) as ex:
        _ok(ex.execute_code("small = 1", state_mode="stateful", session_name="small"))
        _ok(ex.execute_code("blob = 'x' * 5000", state_mode="stateful", session_name="big"))
        assert ex.inspect_session(session_name="small")["kept"] == \
            {"snapshot": None, "by": "replay"}
    with Executor(root=root, persist=True, persist_max_bytes=1000) as ex:
        _ok(ex.execute_code("small", state_mode="stateful", session_name="small"))
        _ok(ex.execute_code("len(blob)", state_mode="stateful", session_name="big"))
        small = ex.inspect_session(session_name="small")["kept"]
        big = ex.inspect_session(session_name="big")["kept"]
    assert small["by"] == "snapshot+replay" and small["snapshot"]["bytes"] > 0
    assert big["snapshot"] is None and "persist_max_bytes=1000" in big["problem"]


def test_a_kept_session_that_cannot_come_back_says_state_lost(root: Path,
                                                              no_leftovers: None) -> None:
    with Executor(root=root, persist=True, log=False) as ex:
        _ok(ex.execute_code("n = 41", state_mode="stateful", session_name="s"))
    (data,) = (root / "snapshots").glob("*/state-*")
    data.write_bytes(b"not a snapshot")
    with Executor(root=root, persist=True, log=False) as ex:
        r = ex.execute_code("'n' in globals()", state_mode="stateful", session_name="s")
    # No log to replay from: the claim is a loss, never a restore that did not happen.
    assert r["result"] == "False" and r["state_lost"] is True and "restored" not in r


def test_two_servers_on_one_root_never_take_each_others_sessions(root: Path,
                                                                 no_leftovers: None) -> None:
    a = Executor(root=root, persist=True)
    b = None
    try:
        _ok(a.execute_code("who = 'a'", state_mode="stateful"))
        b = Executor(root=root, persist=True)
        # Session 0 is held by the other one: listed as such, never restored here.
        assert [(s["session_id"], s["held_by"]) for s in _kept(b)] == [(0, "another process")]
        r = _ok(b.execute_code("who = 'b'\n'restored'", state_mode="stateful"))
        assert "restored" not in r and "'session 0 (2)'" in r["kept_apart"]
        _ok(a.execute_code("who += '!'", state_mode="stateful"))
        # A session a holds is not b's to close (nor to delete from disk).
        _ok(a.execute_code("n = 1", state_mode="stateful", session_name="held"))
        refused = b.close_session(session_name="held")
        assert "held by another coordex process" in refused["error"], refused
        refused = b.rebuild_session(session_name="held")
        assert "that process's to rebuild" in refused["error"], refused
        # b's own session 0, kept apart, is b's to rebuild (nothing was lost).
        assert "nothing to rebuild" in b.rebuild_session()["error"]
        assert _ok(a.execute_code("n", state_mode="stateful", session_name="held"))["result"] == "1"
    finally:
        a.close()
        if b is not None:
            b.close()
    with Executor(root=root, persist=True) as ex:
        assert _ok(ex.execute_code("who", state_mode="stateful"))["result"] == "'a!'"
        assert _ok(ex.execute_code("who", state_mode="stateful",
                                   session_name="session 0 (2)"))["result"] == "'b'"
    # Replayed from the log alone, session 0 is the calls of the process that held it,
    # never the other server's (its call came between them).
    for data in (root / "snapshots").glob("python-own-id0/state-*"):
        data.unlink()
    with Executor(root=root, persist=True) as ex:
        r = _ok(ex.execute_code("who", state_mode="stateful"))
    assert r["result"] == "'a!'" and r["restored"]["from"] == "replay"


def test_a_read_only_look_or_an_inspection_finds_a_kept_session(root: Path,
                                                                 no_leftovers: None) -> None:
    with Executor(root=root, persist=True) as ex:
        _ok(ex.execute_code("rows = [1, 2]", state_mode="stateful", session_name="s"))
        _ok(ex.execute_code("X=5", language="bash", state_mode="stateful", session_name="sh"))
    with Executor(root=root, persist=True) as ex:
        r = _ok(ex.execute_code("rows.append(3)\nrows", state_mode="read_only", session_name="s"))
        assert r["result"] == "[1, 2, 3]" and r["restored"]["from"] == "snapshot"
        assert _ok(ex.execute_code("rows", state_mode="stateful", session_name="s"))["result"] \
            == "[1, 2]"
        seen = ex.inspect_session(language="bash", session_name="sh")
        assert seen["variables"]["X"] == "5" and seen["restored"]["from"] == "snapshot"


def test_a_half_written_snapshot_is_never_read_and_is_cleared(root: Path,
                                                              no_leftovers: None) -> None:
    with Executor(root=root, persist=True) as ex:
        _ok(ex.execute_code("n = 1", state_mode="stateful", session_name="s"))
        _ok(ex.execute_code("n = 2", state_mode="stateful", session_name="s"))
    (folder,) = (root / "snapshots").iterdir()
    # What a writer killed half-way leaves: a temporary name, never named by meta.json.
    (folder / ".state-9.pickle.4242.tmp").write_bytes(b"coordex-snapshot 1\nhalf")
    with Executor(root=root, persist=True) as ex:
        r = _ok(ex.execute_code("n", state_mode="stateful", session_name="s"))
    assert r["result"] == "2" and r["restored"]["from"] == "snapshot"
    names = sorted(p.name for p in folder.iterdir())
    assert names[:3] == ["kept.json", "lock", "meta.json"] and len(names) == 4, names
    assert names[3] == json.loads((folder / "meta.json").read_text())["file"]


def test_a_new_session_never_takes_the_id_of_a_kept_one(root: Path, no_leftovers: None) -> None:
    with Executor(root=root, persist=True) as ex:
        _ok(ex.execute_code("mine = 'by id'", state_mode="stateful", session_id=1))
        _ok(ex.execute_code("mine = 'named'", state_mode="stateful", session_name="old"))
    with Executor(root=root, persist=True) as ex:
        fresh = _ok(ex.execute_code("1", state_mode="stateful", session_name="fresh"))
        assert fresh["session"]["session_id"] not in (1, 2)
        by_id = _ok(ex.execute_code("mine", state_mode="stateful", session_id=1))
        old = _ok(ex.execute_code("mine", state_mode="stateful", session_name="old"))
    assert by_id["result"] == "'by id'" and old["result"] == "'named'"
    assert old["session"]["session_id"] == 2
    assert oct((root / "snapshots").stat().st_mode & 0o777) == "0o700"


FULL_DISK = textwrap.dedent("""
    import json, sys
    from coordex import Executor
    root = sys.argv[1]
    with Executor(root=root, persist=True, snapshot_interval=0.0) as ex:
        r = ex.execute_code("n = 41", state_mode="stateful", session_name="s")
        print(json.dumps([r, ex.inspect_session(session_name="s")]))
    with Executor(root=root, persist=True) as ex:
        print(json.dumps(ex.execute_code("n + 1", state_mode="stateful", session_name="s")))
""")


def test_a_full_disk_is_an_error_in_inspect_session_never_a_failed_call(
        root: Path, no_leftovers: None) -> None:
    """The snapshots folder on a 64 KiB file system (a mount namespace of the test's own)."""
    import shutil

    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed")
    (root / "snapshots").mkdir(parents=True)
    script = (f"mount -t tmpfs -o size=64k none '{root}/snapshots' && exec "
              f"'{sys.executable}' -c \"$0\" '{root}'")
    done = subprocess.run(["unshare", "-rm", "sh", "-c", script, FULL_DISK], cwd=os.getcwd(),
                          capture_output=True, text=True, timeout=60)
    if done.returncode and "Traceback" not in done.stderr:  # unshare or mount refused
        pytest.skip(f"no mount namespace here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    first, second = (json.loads(line) for line in done.stdout.splitlines())
    call, seen = first
    assert "error_type" not in call
    assert seen["kept"]["snapshot"] is None
    assert seen["kept"]["error"]["error_type"] == "environment"
    assert "Free disk space" in seen["kept"]["error"]["suggestion"]
    assert second["result"] == "42" and second["restored"]["from"] == "replay"


def test_a_python_session_keeps_its_working_folder(root: Path, tmp_path: Path,
                                                   no_leftovers: None) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("kept\n")
    with Executor(root=root, persist=True) as ex:
        _ok(ex.execute_code(f"import os\nos.chdir({str(work)!r})", state_mode="stateful",
                            session_name="s"))
    with Executor(root=root, persist=True) as ex:
        r = _ok(ex.execute_code("with open('notes.txt') as f:\n    seen = f.read(4)\n"
                                "os.getcwd(), seen", state_mode="stateful", session_name="s"))
    assert r["result"] == repr((str(work), "kept"))


def test_rebuild_session_brings_back_the_snapshot_and_the_calls_before_the_loss(
        root: Path, no_leftovers: None) -> None:
    with Executor(root=root, persist=True) as ex:
        _ok(ex.execute_code("X=1; f() { echo from-f; }", language="bash", state_mode="stateful",
                            session_name="sh"))
        _ok(ex.execute_code("X=$((X+1))", language="bash", state_mode="stateful",
                            session_name="sh"))
    with Executor(root=root, persist=True) as ex:  # restored from the snapshot at close
        _ok(ex.execute_code("X=$((X+10))", language="bash", state_mode="stateful",
                            session_name="sh"))
        lost = ex.execute_code("exit 3", language="bash", state_mode="stateful",
                               session_name="sh")
        assert lost["state_lost"] is True
        rebuilt = ex.rebuild_session(language="bash", session_name="sh")
        assert rebuilt["restored"]["from"] == "snapshot+replay", rebuilt
        assert rebuilt["replayed"] == 1 and rebuilt["failed_at"] is None
        r = _ok(ex.execute_code("echo $X; f", language="bash", state_mode="stateful",
                                session_name="sh"))
        assert r["stdout"] == "12\nfrom-f\n"
        # Asked again, there is nothing left to rebuild.
        assert ex.rebuild_session(language="bash", session_name="sh")["error_type"] == \
            "validation"


REBUILT_THEN_KILLED = textwrap.dedent("""
    import os, sys, time
    from coordex import Executor
    def run(ex, code):
        r = ex.execute_code(code, language="bash", state_mode="stateful", session_name="sh")
        return r
    with Executor(root=sys.argv[1], persist=True) as ex:
        run(ex, "X=1")
    ex = Executor(root=sys.argv[1], persist=True, snapshot_interval=3600)
    run(ex, "X=$((X+10))")
    run(ex, "exit 3")
    assert ex.rebuild_session(language="bash", session_name="sh")["replayed"] == 1
    run(ex, "X=$((X+100))")
    os.write(int(sys.argv[2]), b"done\\n")
    time.sleep(600)
""")


def test_a_rebuilt_session_comes_back_after_a_sigkill_as_it_was(root: Path,
                                                                no_leftovers: None) -> None:
    run_then_kill(REBUILT_THEN_KILLED, str(root))
    with Executor(root=root, persist=True) as ex:
        r = _ok(ex.execute_code("echo $X", language="bash", state_mode="stateful",
                                session_name="sh"))
    # The snapshot (1), the call before the loss (+10), the call after the rebuild (+100).
    assert r["stdout"] == "111\n" and r["restored"]["from"] == "snapshot+replay"


def test_bash_values_with_odd_characters_and_errexit_come_back(root: Path,
                                                               no_leftovers: None) -> None:
    with Executor(root=root, persist=True) as ex:
        _ok(ex.execute_code("TEXT=$'two\\nlines \"quoted\" $dollar \\\\ back'\n"
                            "declare -A MAP=([k one]=v1 [k2]=$'v\\n2')\ndeclare -i NUM=7\n"
                            "readonly FIXED=1\nset -e", language="bash",
                            state_mode="stateful", session_name="sh"))
    with Executor(root=root, persist=True) as ex:
        r = _ok(ex.execute_code("printf '%s|' \"$TEXT\" \"${MAP[k one]}\" \"${MAP[k2]}\" "
                                "\"$FIXED\"; NUM+=1; echo $NUM; [[ $- == *e* ]] && echo errexit",
                                language="bash", state_mode="stateful", session_name="sh"))
    assert r["stdout"] == 'two\nlines "quoted" $dollar \\ back|v1|v\n2|1|8\nerrexit\n'


PYTHON_SHAPES = textwrap.dedent("""
    import dataclasses
    import os.path as osp
    from math import sqrt
    import pandas as pd
    @dataclasses.dataclass
    class Row:
        name: str
        size: int
        def double(self):
            return twice(self.size)
    def twice(v):
        return 2 * v
    def counter():
        count = 0
        def step():
            nonlocal count
            count += 1
            return count
        return step
    step = counter()
    step()
    square = lambda v: v * v
    rows = [Row('a', 1), Row('b', 2)]
    frame = pd.DataFrame({'n': range(100_000), 'tag': ['x', 'y'] * 50_000})
    numbers = (i for i in range(3))
""")


def test_python_values_of_many_shapes_come_back(root: Path, no_leftovers: None) -> None:
    with Executor(root=root, persist=True, log=False) as ex:
        _ok(ex.execute_code(PYTHON_SHAPES, state_mode="stateful", session_name="py"))
    with Executor(root=root, persist=True, log=False) as ex:
        r = _ok(ex.execute_code(
            "(rows[1].double(), isinstance(rows[0], Row), step(), square(4), sqrt(16.0), "
            "osp.join('a', 'b'), int(frame.n.sum()), frame.tag.iloc[1], "
            "dataclasses.asdict(rows[0]))", state_mode="stateful", session_name="py"))
    assert r["result"] == ("(4, True, 2, 16, 4.0, 'a/b', 4999950000, 'y', "
                           "{'name': 'a', 'size': 1})")
    # A generator cannot be pickled, and with the log off no call can rebuild it.
    assert r["restored"]["left_out"] == ["numbers"]


def test_a_kept_session_is_listed_with_its_calls_from_the_log(root: Path,
                                                              no_leftovers: None) -> None:
    with Executor(root=root, persist=True) as ex:
        for step in range(3):
            _ok(ex.execute_code(f"n = {step}", state_mode="stateful", session_name="s"))
        last = time.time()
    time.sleep(0.2)
    with Executor(root=root, persist=True) as ex:
        (kept,) = _kept(ex)
    # What the page shows after a restart: its calls and when it was last used, not 0
    # and the restart's time.
    assert kept["calls"] == 3 and kept["last_used_at"] <= last, kept
