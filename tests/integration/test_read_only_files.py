"""Read-only calls leave the disk as it was (SPEC section 1, guarantee 3), per backend.

Every test goes through the public ``Executor``: a session in a throwaway working folder,
``read_only_paths`` naming that folder (".") and a second folder, so no test touches
the real home. The same file operations run in the own interpreter, in bash and in an
environment worker; afterwards every file is compared byte for byte (and by mtime and
mode), and ``isolation.files`` must name the mechanism that held. The weaker modes are
reached with the ``COORDEX_ISOLATION_FORCE`` hook, set before the executor starts so
every child inherits it. Modes this machine cannot reach are skipped, never faked.
"""

from __future__ import annotations

import ast
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from coordex import Executor
from coordex.backends import isolation
from tests.conftest import child_pids

pytestmark = [
    pytest.mark.skipif(os.uname().sysname != "Linux", reason="Linux kernel features"),
    pytest.mark.timeout(120),
]

Snapshot = dict[str, tuple[str, bytes, int, int]]


@dataclass
class Tree:
    work: Path  # the session's cwd
    data: Path  # a second protected folder
    outside: Path  # not protected: writes there are refused

    def snapshot(self) -> Snapshot:
        found: Snapshot = {}
        for top in (self.work, self.data, self.outside):
            for dirpath, dirnames, filenames in os.walk(top):
                for name in sorted(dirnames + filenames):
                    path = Path(dirpath, name)
                    st = path.lstat()
                    content = path.read_bytes() if path.is_file() else b""
                    found[str(path)] = ("dir" if path.is_dir() else "file", content,
                                        st.st_mtime_ns, st.st_mode)
        return found


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    t = Tree(tmp_path / "work", tmp_path / "data", tmp_path / "outside")
    for folder in (t.work / "sub", t.data, t.outside):
        folder.mkdir(parents=True)
    for path, text in ((t.work / "keep.txt", "keep"), (t.work / "gone.txt", "gone"),
                       (t.work / "old.txt", "old"), (t.work / "sub" / "deep.txt", "deep"),
                       (t.data / "notes.txt", "notes"), (t.outside / "o.txt", "o")):
        path.write_text(text)
    return t


@pytest.fixture(scope="module")
def envs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("envs")  # the empty environment is built once


@pytest.fixture
def offline_uv(tmp_path_factory: pytest.TempPathFactory,
               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "uv-cache"))
    monkeypatch.setenv("UV_OFFLINE", "1")
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)


# -- one place per backend ----------------------------------------------------------------

PY_OPS = """
import os, tempfile
def attempt(name, action):
    try:
        action()
        print(name, "ok")
    except OSError as e:
        print(name, type(e).__name__)
attempt("delete", lambda: os.remove("gone.txt"))
attempt("overwrite", lambda: open("keep.txt", "w").write("changed"))
attempt("rename", lambda: os.rename("old.txt", "renamed.txt"))
attempt("create", lambda: open("new.txt", "w").write("new"))
attempt("mkdir", lambda: os.mkdir("newdir"))
attempt("deep", lambda: os.remove("sub/deep.txt"))
attempt("data", lambda: open(DATA + "/notes.txt", "a").write("more"))
attempt("data-create", lambda: open(DATA + "/extra.txt", "w").write("x"))
attempt("outside", lambda: open(OUTSIDE + "/o.txt", "w").write("x"))
attempt("scratch", lambda: open(os.path.join(tempfile.gettempdir(), "t"), "w").write("x"))
print("seen", sorted(os.listdir(".")), open("keep.txt").read())
print("tmp", os.environ.get("TMPDIR"), tempfile.gettempdir())
"""

BASH_OPS = """
attempt() { local name=$1; shift; if "$@" 2>/dev/null; then echo "$name ok"; else echo "$name failed"; fi; }
attempt delete rm gone.txt
attempt overwrite eval 'echo changed > keep.txt'
attempt rename mv old.txt renamed.txt
attempt create eval 'echo new > new.txt'
attempt mkdir mkdir newdir
attempt deep rm sub/deep.txt
attempt data eval 'echo more >> "$DATA/notes.txt"'
attempt data-create eval 'echo x > "$DATA/extra.txt"'
attempt outside eval 'echo x > "$OUTSIDE/o.txt"'
attempt scratch eval 'echo x > "$TMPDIR/t"'
echo seen $(ls) $(cat keep.txt)
echo tmp $TMPDIR $TMPDIR
"""


@dataclass
class Place:
    """Where a backend's session lives and how to talk to it."""

    name: str
    ex: Executor
    venv_id: int | None
    language: str

    def run(self, code: str, mode: str = "read_only", **kw: Any) -> dict[str, Any]:
        return self.ex.execute_code(code, language=self.language, state_mode=mode,
                                    session_name="s", venv_id=self.venv_id, **kw)

    def ops(self, tree: Tree) -> str:
        if self.language == "bash":
            return f"DATA={str(tree.data)!r}; OUTSIDE={str(tree.outside)!r}\n" + BASH_OPS
        return f"DATA = {str(tree.data)!r}\nOUTSIDE = {str(tree.outside)!r}\n" + PY_OPS

    def write(self, path: Path, text: str) -> str:
        if self.language == "bash":
            return f"echo -n {text} > {str(path)!r}"
        return f"import pathlib; pathlib.Path({str(path)!r}).write_text({text!r})"


BACKENDS = ["own", "bash", pytest.param("worker", marks=pytest.mark.slow)]


@pytest.fixture
def forced_mode() -> str | None:
    """The test hook's value; a test parametrizes it to reach a weaker mode."""
    return None


@pytest.fixture
def hook(forced_mode: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Set (or clear) the hook before any executor starts, so every child inherits it."""
    if forced_mode is None:
        monkeypatch.delenv(isolation.FORCE_ENV, raising=False)
    else:
        monkeypatch.setenv(isolation.FORCE_ENV, forced_mode)


@pytest.fixture(params=BACKENDS)
def place(request: pytest.FixtureRequest, hook: None, tree: Tree, tmp_path: Path,
          envs_dir: Path) -> Iterator[Place]:
    """A session of one backend whose cwd is ``tree.work``."""
    kind = request.param
    ex = Executor(root=tmp_path / "root", timeout=30, envs_dir=envs_dir,
                  read_only_paths=[".", str(tree.data)])
    try:
        venv_id = None
        if kind == "worker":
            request.getfixturevalue("offline_uv")
            created = ex.environments.create("")
            assert "venv_id" in created, created
            venv_id = created["venv_id"]
        where = Place(kind, ex, venv_id, "bash" if kind == "bash" else "python")
        enter = (f"cd {str(tree.work)!r}" if kind == "bash"
                 else f"import os; os.chdir({str(tree.work)!r})")
        started = where.run(enter, "stateful")
        assert "error" not in started, started
        yield where
    finally:
        ex.close()


def lines(result: dict[str, Any]) -> dict[str, str]:
    assert "error" not in result, result
    return dict(line.split(" ", 1) for line in result["stdout"].splitlines())


def require(mode: str) -> None:
    reachable = isolation.best_mode()
    if isolation._RANK[reachable] < isolation._RANK[mode]:
        pytest.skip(f"this machine reaches {reachable!r}, not {mode!r}: {isolation.probe()}")


# -- the three modes ----------------------------------------------------------------------


def test_discarded_the_code_sees_its_writes_and_the_disk_keeps_none(
        tree: Tree, place: Place) -> None:
    require("discarded")
    before = tree.snapshot()
    result = place.run(place.ops(tree))
    seen = lines(result)
    assert result["isolation"] == {"names": True, "objects": True, "files": "discarded",
                                   "copy": "values" if place.language == "bash" else "fork"}
    for op in ("delete", "overwrite", "rename", "create", "mkdir", "deep", "data",
               "data-create", "scratch"):
        assert seen[op] == "ok", (op, result["stdout"])
    assert seen["outside"] in ("PermissionError", "failed")
    listing = "['keep.txt', 'new.txt', 'newdir', 'renamed.txt', 'sub'] changed"
    if place.language == "bash":
        listing = "keep.txt new.txt newdir renamed.txt sub changed"
    assert seen["seen"] == listing
    assert tree.snapshot() == before


@pytest.mark.parametrize("forced_mode", ["refused"])
def test_refused_writes_fail_visibly_and_change_nothing(tree: Tree, place: Place) -> None:
    require("refused")
    before = tree.snapshot()
    result = place.run(place.ops(tree))
    seen = lines(result)
    assert result["isolation"]["files"] == "refused"
    refused = "failed" if place.language == "bash" else "PermissionError"
    for op in ("delete", "overwrite", "rename", "create", "mkdir", "deep", "data",
               "data-create", "outside"):
        assert seen[op] == refused, (op, result["stdout"])
    assert seen["scratch"] == "ok"
    assert tree.snapshot() == before


@pytest.mark.parametrize("forced_mode", ["none"])
def test_none_is_reported_as_none(place: Place) -> None:
    code = ("echo tmp $TMPDIR" if place.language == "bash"
            else "import os\nprint('tmp', os.environ['TMPDIR'])")
    result = place.run(code)
    assert result["isolation"]["files"] == "none"
    scratch = lines(result)["tmp"]
    assert Path(scratch).name.startswith("coordex-ro-")
    assert not Path(scratch).exists()  # the scratch folder is removed after the call


def test_tmpdir_is_the_calls_scratch_folder_and_is_removed(
        tree: Tree, place: Place) -> None:
    require("refused")
    seen = lines(place.run(place.ops(tree)))
    first, second = seen["tmp"].split()
    assert first == second and Path(first).name.startswith("coordex-ro-")
    # Python copies get the Executor's folder, removed; a bash session's copies share
    # one made before they are protected (ahead of the call), emptied after each.
    assert not Path(first).exists() or not any(Path(first).iterdir())


# -- nothing leaks out of the call --------------------------------------------------------


def test_protection_never_leaks_into_the_next_stateful_call(
        tree: Tree, place: Place) -> None:
    require("refused")
    assert place.run(place.ops(tree))["isolation"]["files"] in ("discarded", "refused")
    target = tree.work / "after.txt"
    result = place.run(place.write(target, "kept"), "stateful")
    assert "error" not in result, result
    assert target.read_text() == "kept"
    outside = tree.outside / "after.txt"
    assert "error" not in place.run(place.write(outside, "kept"), "stateful")
    assert outside.read_text() == "kept"


def _namespaces_of_descendants() -> dict[int, str]:
    """Mount namespaces of this process's descendants, but a bash session's next copy.

    That one (a child of the launcher server, or the bash it became, which has
    restored the state and reads its code from a pipe) is protected and waits for the
    next read-only call; it has run no code.
    """
    found = {}
    for pid in child_pids():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"launcher.py" in cmdline or b"ro <&201" in cmdline:
                continue
            found[pid] = os.readlink(f"/proc/{pid}/ns/mnt")
        except OSError:
            pass  # exited meanwhile
    return found


def test_no_mount_or_namespace_outlives_the_call(tree: Tree,
                                                 place: Place) -> None:
    require("discarded")
    mounts = Path("/proc/self/mountinfo").read_text()
    ours = os.readlink("/proc/self/ns/mnt")
    result = place.run(place.ops(tree))
    assert result["isolation"]["files"] == "discarded"
    deadline = time.monotonic() + 5
    while True:  # a fork child may still be tearing its memory down
        foreign = {pid: ns for pid, ns in _namespaces_of_descendants().items() if ns != ours}
        if not foreign or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert foreign == {}
    assert Path("/proc/self/mountinfo").read_text() == mounts


# -- bash: the protected copy behaves like the session ------------------------------------


@pytest.fixture
def bash(hook: None, tree: Tree, tmp_path: Path) -> Iterator[Place]:
    require("refused")
    ex = Executor(root=tmp_path / "root", timeout=30, read_only_paths=[".", str(tree.data)])
    try:
        where = Place("bash", ex, None, "bash")
        assert "error" not in where.run(f"cd {str(tree.work)!r}", "stateful")
        yield where
    finally:
        ex.close()


def test_bash_copy_has_the_whole_session_state(bash: Place, tree: Tree) -> None:
    setup = ("plain='a b'; export exported=1; declare -A assoc=([k]=v); declare -i num=4; "
             "arr=(x 'y z'); greet() { echo \"hi $1\"; }; alias al='echo aliased'; "
             "set -- one 'two 2'; shopt -s extglob; set -o pipefail; mkdir -p d; cd d; umask 027")
    assert "error" not in bash.run(setup, "stateful")
    result = bash.run(
        'echo "$plain|$exported|${assoc[k]}|$((num+1))|${arr[1]}|$#:$2|$PWD"; greet x; al\n'
        "shopt -q extglob && echo extglob; [[ -o pipefail ]] && echo pipefail; umask\n"
        "read -r line; echo \"read=$?\"; echo mode=$COORDEX_ISOLATION")
    assert "error" not in result, result
    mode = result["isolation"]["files"]
    assert mode in ("discarded", "refused")
    assert result["stdout"] == (f"a b|1|v|5|y z|2:two 2|{tree.work}/d\nhi x\naliased\n"
                                f"extglob\npipefail\n0027\nread=1\nmode={mode}\n")


def test_bash_ready_copies_see_every_stateful_change(bash: Place, tree: Tree) -> None:
    """The copy made ahead of a call is used only while it still holds the session."""
    steps = [("x=1", "echo $x", "1\n"), (None, "echo $x; x=9", "1\n"),
             (None, "echo $x", "1\n"), ("x=2; f() { echo f$x; }", "f", "f2\n"),
             ("mkdir -p sub; cd sub", "echo ${PWD##*/}", "sub\n"),
             (None, "echo ${PWD##*/}", "sub\n"), ("umask 077", "umask", "0077\n"),
             ("ulimit -n 512", "ulimit -n", "512\n"), (None, "ulimit -n", "512\n"),
             ("set -e", "false; echo not-reached", ""),
             ("set +e", "echo 'bad syntax (' ; echo after", None)]
    for stateful, look, expected in steps:
        if stateful is not None:
            assert "error" not in bash.run(stateful, "stateful")
        result = bash.run(look)
        assert "error" not in result, result
        assert result["isolation"]["files"] in ("discarded", "refused")
        if expected is not None:
            assert result["stdout"] == expected, (stateful, look, result)
    assert "error" not in bash.run("y=1", "stateful")
    code = "echo\nnosuchcommand_x"
    waiting, ready = bash.run(code), bash.run(code)  # dumped afresh; then made ahead
    assert waiting["stderr"] == ready["stderr"] == (
        "bash: line 3: nosuchcommand_x: command not found\n"), (waiting, ready)
    assert waiting["exit_code"] == ready["exit_code"] == 127


def test_bash_copy_exit_status_output_and_traces(bash: Place) -> None:
    chunks: list[tuple[str, str]] = []
    result = bash.run("echo out; echo err >&2; exit 7", on_output=lambda s, t: chunks.append((s, t)))
    assert (result["stdout"], result["stderr"], result["exit_code"]) == ("out\n", "err\n", 7)
    assert ("stdout", "out\n") in chunks and ("stderr", "err\n") in chunks
    assert "error" not in bash.run("set -x", "stateful")
    traced = bash.run("echo t")
    assert traced["stdout"] == "t\n" and traced["stderr"] == "+ echo t\n"


def test_bash_copy_output_is_bounded(bash: Place) -> None:
    result = bash.run("head -c 3000000 /dev/zero | tr '\\0' x")
    assert result["truncated"] is True
    assert len(result["stdout"]) <= 70000


def test_bash_copy_ignoring_the_interrupt_is_killed_alone(bash: Place, tree: Tree) -> None:
    assert "error" not in bash.run("kept=1", "stateful")
    shell = bash.run("echo $$", "stateful")["stdout"]
    before = tree.snapshot()
    started = time.monotonic()
    result = bash.run("trap '' INT; rm gone.txt; kept=2; sleep 30", timeout=0.5)
    assert time.monotonic() - started < 10
    assert result["error_type"] == "timeout" and result["state_lost"] is False
    assert result["isolation"]["files"] in ("discarded", "refused")
    after = bash.run("echo $kept $$", "stateful")
    assert after["stdout"] == f"1 {shell.strip()}\n" and "state_lost" not in after
    assert tree.snapshot() == before


def _cmdline(pid: int) -> bytes:
    """A process's command line; b"" for one that ended since it was listed."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return b""


def test_bash_copy_background_jobs_end_with_the_call(bash: Place, tree: Tree) -> None:
    mounts = Path("/proc/self/mountinfo").read_text()
    ours = os.readlink("/proc/self/ns/mnt")
    result = bash.run("sleep 60 & echo started")
    assert result["stdout"] == "started\n"
    deadline = time.monotonic() + 5
    while any(ns != ours for ns in _namespaces_of_descendants().values()):
        assert time.monotonic() < deadline, "a process of the copy outlived the call"
        time.sleep(0.02)
    sleeping = [pid for pid in child_pids() if _cmdline(pid).startswith(b"sleep\0")]
    assert sleeping == []
    assert Path("/proc/self/mountinfo").read_text() == mounts


def test_bash_copy_sees_unset_names_as_unset_and_default_signals(bash: Place) -> None:
    setup = "unset HOME; export ONLY=1; ulimit -S -n 512"
    assert "error" not in bash.run(setup, "stateful")
    result = bash.run('echo "${HOME-unset} $ONLY $(ulimit -n)"; yes | head -1; '
                      "ls /proc/self/fd | sort -n | tr '\\n' ' '")
    assert "error" not in result, result
    # SIGPIPE is not ignored in the copy (it would be, inherited from Python): no
    # "yes: standard output: Broken pipe"; only 0-2 and ls's own fd are open.
    assert result["stdout"] == "unset 1 512\ny\n0 1 2 3 "
    assert result["stderr"] == ""


def test_bash_launcher_server_ends_with_the_session(hook: None, tree: Tree,
                                                    tmp_path: Path) -> None:
    require("refused")
    ex = Executor(root=tmp_path / "root", timeout=30, read_only_paths=["."])
    try:
        place = Place("bash", ex, None, "bash")
        assert "error" not in place.run(f"cd {str(tree.work)!r}", "stateful")
        for _ in range(2):  # the server is started once, then reused
            assert place.run("true")["isolation"]["files"] in ("discarded", "refused")
        assert child_pids() != set()
    finally:
        ex.close()
    assert child_pids() == set()


def test_bash_long_code_runs_in_the_copy(bash: Place) -> None:
    code = "".join(f"v{i}={i}\n" for i in range(15000)) + "echo $v14999"
    assert len(code) > 150_000
    result = bash.run(code)
    assert result["stdout"] == "14999\n" and result["isolation"]["files"] != "none"


# -- the worker side ----------------------------------------------------------------------


def test_isolation_module_stays_loadable_by_old_workers() -> None:
    source = Path(isolation.__file__).read_text()
    ast.parse(source, feature_version=(3, 8))
    for name in ("json", "tempfile", "typing", "platform", "re"):
        # The launcher imports the module on every protected bash call: keep it light.
        assert f"\nimport {name}\n" not in source and f"\nfrom {name} " not in source
