"""Real-kernel tests of read-only file protection (coordex.backends.isolation).

Every protect() runs in a forked child that reports back through a pipe and always
leaves with os._exit; the parent then checks the disk, its own mounts and that it can
still write. Modes the machine cannot reach are skipped, never faked.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from coordex.backends import isolation

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux kernel features"),
    pytest.mark.timeout(60),
]

Snapshot = dict[str, tuple[str, bytes, int]]


def in_child(body: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run ``body`` in a forked child and return the dict it produced."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(read_end)
            produced = body()
        except BaseException:
            produced = {"crash": traceback.format_exc()}
        try:
            os.write(write_end, json.dumps(produced).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    data = b""
    try:
        while chunk := os.read(read_end, 65536):
            data += chunk
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    report: dict[str, Any] = json.loads(data)
    assert "crash" not in report, report["crash"]
    return report


def attempt(action: Callable[[], object]) -> str:
    """'ok', or the name and errno of the OSError the action raised."""
    try:
        action()
    except OSError as e:
        return f"{type(e).__name__}:{e.errno}"
    return "ok"


def snapshot(root: Path) -> Snapshot:
    """Every entry under root but the scratch folder: kind, content and mtime."""
    found: Snapshot = {}
    for dirpath, dirnames, filenames in os.walk(root):
        if dirpath == str(root):
            dirnames[:] = [d for d in dirnames if d != "scratch"]
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            st = path.lstat()
            content = path.read_bytes() if path.is_file() else b""
            found[str(path.relative_to(root))] = ("dir" if path.is_dir() else "file",
                                                   content, st.st_mtime_ns)
    return found


def mountinfo() -> str:
    return Path("/proc/self/mountinfo").read_text()


@pytest.fixture
def tree() -> Iterator[dict[str, Path]]:
    """A home-like and a project-like work dir, an unprotected dir, and a scratch dir.

    Made under /tmp with world-readable modes so an unprivileged child can use them.
    """
    base = Path(tempfile.mkdtemp(prefix="coordex-iso-"))
    base.chmod(0o755)
    paths = {name: base / name for name in ("home", "work", "other", "scratch")}
    for path in paths.values():
        path.mkdir(mode=0o755)
    (paths["home"] / ".bashrc").write_text("export A=1\n")
    (paths["work"] / "data.csv").write_text("a,b\n1,2\n")
    (paths["work"] / "keep.txt").write_text("keep\n")
    (paths["work"] / "sub").mkdir()
    (paths["work"] / "sub" / "inner.txt").write_text("inner\n")
    (paths["other"] / "note.txt").write_text("note\n")
    try:
        yield paths
    finally:
        shutil.rmtree(base, ignore_errors=True)


def mutate(home: Path, work: Path) -> dict[str, str]:
    """Delete, overwrite, rename and create, in the cwd (relative paths) and in home."""
    os.chdir(work)
    return {
        "overwrite": attempt(lambda: Path("data.csv").write_text("x,y\n")),
        "delete": attempt(lambda: os.unlink("keep.txt")),
        "rename": attempt(lambda: os.rename("sub/inner.txt", "sub/moved.txt")),
        "create": attempt(lambda: Path("new.txt").write_text("new\n")),
        "mkdir": attempt(lambda: os.mkdir("newdir")),
        "home_delete": attempt(lambda: os.unlink(home / ".bashrc")),
        "home_create": attempt(lambda: (home / ".cache").mkdir()),
    }


def require(mode: isolation.FilesMode) -> None:
    reachable = isolation.best_mode()
    if isolation._RANK[reachable] < isolation._RANK[mode]:
        pytest.skip(f"this machine reaches {reachable!r}, not {mode!r}: {isolation.probe()}")


def test_probe_reports_capabilities_and_is_cached() -> None:
    first = isolation.probe()
    assert set(first) == {"userns", "overlay", "landlock_abi"}
    assert isinstance(first["landlock_abi"], int)
    assert isolation.probe() == first
    assert isolation._probe_cache is not None


def test_discarded_child_sees_its_writes_and_disk_is_unchanged(tree: dict[str, Path]) -> None:
    require("discarded")
    home, work, scratch = tree["home"], tree["work"], tree["scratch"]
    before = snapshot(tree["home"].parent)
    mounts_before = mountinfo()

    def body() -> dict[str, Any]:
        mode = isolation.protect([str(home), str(work)], str(scratch))
        ops = mutate(home, work)
        return {"mode": mode, "ops": ops,
                "seen": sorted(os.listdir(work)), "seen_sub": sorted(os.listdir("sub")),
                "content": Path("data.csv").read_text(),
                "home": sorted(os.listdir(home)),
                "scratch": attempt(lambda: Path(tempfile.mkstemp()[1]).write_text("t")),
                "tmpdir": [os.environ["TMPDIR"], tempfile.gettempdir()]}

    report = in_child(body)
    assert report["mode"] == "discarded"
    assert set(report["ops"].values()) == {"ok"}, report["ops"]
    assert report["seen"] == ["data.csv", "new.txt", "newdir", "sub"]
    assert report["seen_sub"] == ["moved.txt"]
    assert report["content"] == "x,y\n"
    assert report["home"] == [".cache"]
    assert report["scratch"] == "ok"
    assert report["tmpdir"] == [str(scratch), str(scratch)]
    assert snapshot(tree["home"].parent) == before
    assert len(os.listdir(scratch)) == 1, "the scratch folder keeps what the child wrote"
    assert mountinfo() == mounts_before
    (work / "parent.txt").write_text("the parent is not protected")


def test_discarded_refuses_writes_outside_work_paths(tree: dict[str, Path]) -> None:
    require("discarded")
    other = tree["other"]
    before = snapshot(other)

    def body() -> dict[str, Any]:
        mode = isolation.protect([str(tree["home"]), str(tree["work"])], str(tree["scratch"]))
        return {"mode": mode,
                "create": attempt(lambda: (other / "x").write_text("x")),
                "delete": attempt(lambda: os.unlink(other / "note.txt")),
                "overwrite": attempt(lambda: (other / "note.txt").write_text("x")),
                "truncate": attempt(lambda: os.truncate(other / "note.txt", 0)),
                "devnull": attempt(lambda: Path("/dev/null").write_text("x")),
                "signal_parent": attempt(lambda: os.kill(os.getppid(), 0))}

    report = in_child(body)
    assert report.pop("mode") == "discarded"
    assert report.pop("devnull") == "ok"
    # Landlock ABI 6 scopes signals to the child's own domain.
    expected_signal = "PermissionError:1" if isolation.landlock_abi() >= 6 else "ok"
    assert report.pop("signal_parent") == expected_signal
    assert set(report.values()) == {"PermissionError:13"}, report
    assert snapshot(other) == before


def test_refused_mode_fails_visibly_and_changes_nothing(
        tree: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    require("refused")
    monkeypatch.setenv(isolation.FORCE_ENV, "refused")
    home, work, scratch = tree["home"], tree["work"], tree["scratch"]
    before = snapshot(home.parent)
    mounts_before = mountinfo()

    def body() -> dict[str, Any]:
        mode = isolation.protect([str(home), str(work)], str(scratch))
        return {"mode": mode, "ops": mutate(home, work),
                "scratch": attempt(lambda: (scratch / "s.txt").write_text("s")),
                "scratch_rm": attempt(lambda: os.unlink(scratch / "s.txt"))}

    report = in_child(body)
    assert report["mode"] == "refused"
    assert set(report["ops"].values()) == {"PermissionError:13"}, report["ops"]
    assert report["scratch"] == report["scratch_rm"] == "ok"
    assert snapshot(home.parent) == before
    assert mountinfo() == mounts_before
    (work / "parent.txt").write_text("the parent is not protected")


def test_forced_none_reports_none(tree: dict[str, Path],
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(isolation.FORCE_ENV, "none")
    assert isolation.best_mode() == "none"
    report = in_child(lambda: {"mode": isolation.protect([str(tree["work"])],
                                                         str(tree["scratch"])),
                               "tmpdir": os.environ["TMPDIR"]})
    assert report == {"mode": "none", "tmpdir": str(tree["scratch"])}


def test_allow_caps_the_mode(tree: dict[str, Path]) -> None:
    require("refused")
    report = in_child(lambda: {"mode": isolation.protect([str(tree["work"])],
                                                         str(tree["scratch"]),
                                                         allow="refused")})
    assert report["mode"] == "refused"


def test_force_unavailable_sets_and_restores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(isolation.FORCE_ENV, raising=False)
    assert isolation.force_unavailable("refused") is None
    assert isolation.forced_ceiling() == "refused"
    assert isolation.force_unavailable(None) == "refused"
    assert isolation.forced_ceiling() == "discarded"
    with pytest.raises(ValueError, match="'bogus'"):
        isolation.force_unavailable("bogus")  # type: ignore[arg-type]


def test_scratch_inside_a_work_dir_stays_writable(tree: dict[str, Path]) -> None:
    require("discarded")
    work = tree["work"]
    scratch = work / "scratch"
    scratch.mkdir()

    def body() -> dict[str, Any]:
        mode = isolation.protect([str(work)], str(scratch))
        return {"mode": mode,
                "scratch": attempt(lambda: (scratch / "out.txt").write_text("kept")),
                "work": attempt(lambda: (work / "gone.txt").write_text("discarded"))}

    report = in_child(body)
    assert report == {"mode": "discarded", "scratch": "ok", "work": "ok"}
    assert (scratch / "out.txt").read_text() == "kept"
    assert not (work / "gone.txt").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a submount needs root")
def test_submount_inside_a_work_dir_is_readable_but_not_writable(
        tree: dict[str, Path]) -> None:
    require("discarded")
    import ctypes

    work = tree["work"]

    def body() -> dict[str, Any]:
        libc = ctypes.CDLL(None, use_errno=True)
        # A private mount namespace so the test's own tmpfs never reaches the host.
        assert libc.unshare(isolation._CLONE_NEWNS) == 0
        isolation._mount(None, "/", None, isolation._MS_REC | isolation._MS_PRIVATE)
        isolation._mount("tmpfs", str(work / "sub"), "tmpfs", 0)
        (work / "sub" / "mounted.txt").write_text("on the submount")
        mode = isolation.protect([str(work)], str(tree["scratch"]))
        return {"mode": mode, "read": (work / "sub" / "mounted.txt").read_text(),
                "write": attempt(lambda: (work / "sub" / "w.txt").write_text("w"))}

    report = in_child(body)
    assert report == {"mode": "discarded", "read": "on the submount",
                      "write": "OSError:30"}  # EROFS


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become an unprivileged user")
def test_unprivileged_user_gets_the_same_protection(tree: dict[str, Path]) -> None:
    require("discarded")
    nobody = 65534
    for path in tree.values():
        for dirpath, _, filenames in os.walk(path):
            for name in [dirpath, *(os.path.join(dirpath, f) for f in filenames)]:
                os.chown(name, nobody, nobody)
    home, work = tree["home"], tree["work"]
    before = snapshot(home.parent)

    def body() -> dict[str, Any]:
        import ctypes

        os.setgroups([])
        os.setgid(nobody)
        os.setuid(nobody)
        # setuid() made us non-dumpable, so /proc/self/uid_map would belong to root;
        # a user's own processes normally are dumpable.
        ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE
        isolation._probe_cache = None
        mode = isolation.protect([str(home), str(work)], str(tree["scratch"]))
        return {"mode": mode, "ops": mutate(home, work), "uid": os.getuid(),
                "owner": os.stat(work / "data.csv").st_uid,
                "other": attempt(lambda: (tree["other"] / "x").write_text("x"))}

    report = in_child(body)
    if report["mode"] != "discarded":
        pytest.skip(f"unprivileged user namespaces unavailable: {report['mode']}")
    assert set(report["ops"].values()) == {"ok"}, report["ops"]
    assert report["uid"] == report["owner"] == nobody
    assert report["other"] == "PermissionError:13"
    assert snapshot(home.parent) == before


def test_protected_bash_argv_runs_bash_under_protection(tree: dict[str, Path]) -> None:
    require("refused")
    work, scratch = tree["work"], tree["scratch"]
    before = snapshot(work)
    report_path = tree["other"] / "mode"
    script = 'rm -f data.csv; echo "$COORDEX_ISOLATION $TMPDIR"; ls'
    spec = isolation.protected_bash_argv(
        [str(work)], str(scratch), report_path=str(report_path),
        bash=("bash", "--norc", "--noprofile", "-c", script))
    assert spec is not None
    argv, expected = spec
    done = subprocess.run(argv, cwd=work, capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL)
    first, *listing = done.stdout.splitlines()
    assert first == f"{expected} {scratch}"
    assert report_path.read_text() == expected
    if expected == "discarded":
        assert "data.csv" not in listing
    else:
        assert "data.csv" in listing and "Permission denied" in done.stderr
    assert snapshot(work) == before


def test_restricted_argv_writes_only_beneath_its_folders(tree: dict[str, Path]) -> None:
    # What each process of a confined build runs under (jail.confine_build_step).
    require("refused")
    work, other = tree["work"], tree["other"]
    script = (f"echo in > {work}/new.txt; echo out > {other}/new.txt; "
              f"chmod 600 {work}/new.txt; echo $?")

    def run(may_chmod: bool) -> subprocess.CompletedProcess[str]:
        argv = isolation.restricted_argv([str(work)], ["/bin/bash", "--norc", "-c", script],
                                         may_chmod=may_chmod)
        return subprocess.run(argv, capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL)

    done = run(False)
    assert (work / "new.txt").read_text() == "in\n"
    assert not (other / "new.txt").exists() and "Permission denied" in done.stderr
    assert done.stdout.strip() == "1"  # chmod refused (seccomp) without may_chmod
    assert run(True).stdout.strip() == "0"


@pytest.mark.skipif(os.uname().machine not in isolation._TRUNCATE_SYSCALLS,
                    reason="no seccomp fallback for this architecture")
def test_seccomp_fallback_refuses_truncate(tree: dict[str, Path]) -> None:
    target = tree["other"] / "note.txt"

    def body() -> dict[str, Any]:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.prctl(isolation._PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
        isolation._deny_truncate()
        return {"truncate": attempt(lambda: os.truncate(target, 0))}

    report = in_child(body)
    assert report["truncate"] == "PermissionError:1"
    assert target.read_text() == "note\n"


def test_landlock_abi_1_rules_still_refuse_everything_outside_scratch(
        tree: dict[str, Path]) -> None:
    """The oldest ABI (kernel 5.13): no REFER or TRUNCATE rights, seccomp fills in."""
    if isolation.landlock_abi() < 1 or not isolation._landlock_usable(1):
        pytest.skip("needs Landlock and the seccomp truncate fallback")
    other, scratch = tree["other"], tree["scratch"]
    (scratch / "a").mkdir()

    def body() -> dict[str, Any]:
        isolation._landlock_restrict(1, [str(scratch)])
        return {"write": attempt(lambda: (other / "note.txt").write_text("x")),
                "truncate": attempt(lambda: os.truncate(other / "note.txt", 0)),
                "scratch": attempt(lambda: (scratch / "f").write_text("f")),
                "same_dir_rename": attempt(lambda: os.rename(scratch / "f", scratch / "g"))}

    report = in_child(body)
    assert report == {"write": "PermissionError:13", "truncate": "PermissionError:1",
                      "scratch": "ok", "same_dir_rename": "ok"}
    assert (other / "note.txt").read_text() == "note\n"


def test_threaded_process_is_never_claimed_protected(tree: dict[str, Path]) -> None:
    def body() -> dict[str, Any]:
        import threading

        stop = threading.Event()
        thread = threading.Thread(target=stop.wait)
        thread.start()
        try:
            mode = isolation.protect([str(tree["work"])], str(tree["scratch"]))
        finally:
            stop.set()
            thread.join()
        return {"mode": mode}

    assert in_child(body) == {"mode": "none"}


def test_written_lists_a_layer_without_following_its_links(tmp_path: Path) -> None:
    # An upper layer as written() finds it: files, an empty folder, a folder with a
    # file, links to a folder and to a file outside it (listed, never followed).
    layer, outside = tmp_path / "layer", tmp_path / "outside"
    (layer / "full").mkdir(parents=True)
    (layer / "empty").mkdir()
    (layer / "full" / "f.txt").write_text("x")
    (layer / "a.txt").write_text("x")
    outside.mkdir()
    for n in range(5):
        (outside / f"o{n}").write_text("o")
    (layer / "to_dir").symlink_to(outside)
    (layer / "to_file").symlink_to(outside / "o0")
    fd = os.open(layer, os.O_PATH)
    try:
        assert isolation.written(uppers=[("/data", fd)]) == [
            "/data/a.txt", "/data/empty", "/data/to_dir", "/data/to_file", "/data/full/f.txt"]
        assert isolation.written(limit=2, uppers=[("/data", fd)]) == [
            "/data/a.txt", "/data/empty", "..."]
        assert isolation.written() == []  # this process overlaid nothing
    finally:
        os.close(fd)
