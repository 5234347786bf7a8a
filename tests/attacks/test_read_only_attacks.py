"""Code in a read-only call attacks the session it reads (SPEC section 1).

Each test goes through the public ``Executor``, as ``tests/integration/test_read_only_files.py``
does (which holds writes, deletes, renames, creates and truncation; not repeated here):
a session whose cwd is a throwaway folder, then a read-only call that tries to change
the session or the disk by a way that is not a plain write.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from coordex import Executor
from coordex.backends import isolation
from coordex.worker import _coordex_copy as copier

pytestmark = [
    pytest.mark.skipif(os.uname().sysname != "Linux", reason="Linux kernel features"),
    pytest.mark.timeout(60),
]


@dataclass
class Tree:
    work: Path  # the session's cwd: protected (its writes are discarded or refused)
    outside: Path  # neither home nor cwd: writes there are refused in every mode


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    found = Tree(tmp_path / "work", tmp_path / "outside")
    for folder in (found.work, found.outside):
        folder.mkdir()
        (folder / "keep.txt").write_text("keep\n")
        os.chmod(folder / "keep.txt", 0o644)
        os.utime(folder / "keep.txt", (1_000_000, 1_000_000))
    return found


@pytest.fixture(params=[None, "refused"], ids=["best", "refused"])
def ex(request: pytest.FixtureRequest, tree: Tree, tmp_path: Path,
       monkeypatch: pytest.MonkeyPatch) -> Iterator[Executor]:
    if request.param is None:
        monkeypatch.delenv(isolation.FORCE_ENV, raising=False)
    else:
        monkeypatch.setenv(isolation.FORCE_ENV, request.param)
    if isolation.best_mode() == "none":
        pytest.skip(f"no file protection on this machine: {isolation.probe()}")
    executor = Executor(root=tmp_path / "root", timeout=30, read_only_paths=["."])
    try:
        yield executor
    finally:
        executor.close()


def _enter(ex: Executor, language: str, folder: Path, code: str = "") -> None:
    enter = (f"cd {str(folder)!r}\n" if language == "bash"
             else f"import os\nos.chdir({str(folder)!r})\n")
    started = ex.execute_code(enter + code, language=language, state_mode="stateful",
                              session_name="s")
    assert "error" not in started, started


METADATA_PY = """
import os
done = []
for path in {paths!r}:
    for name, change in (("chmod", lambda: os.chmod(path, 0o600)),
                         ("utime", lambda: os.utime(path, (2_000_000, 2_000_000))),
                         ("xattr", lambda: os.setxattr(path, "user.coordex", b"1"))):
        try:
            change()
            done.append(name)
        except OSError:
            pass
done
"""
METADATA_BASH = """
for path in {paths}; do
  chmod 600 "$path" 2>/dev/null
  touch -d @2000000 "$path" 2>/dev/null
done
true
"""


@pytest.mark.parametrize("language", ["python", "bash"])
def test_no_mode_or_time_or_xattr_of_a_file_changes(ex: Executor, tree: Tree,
                                                    language: str) -> None:
    # Landlock has no right for chmod, chown, utime or setxattr: before, a read-only call
    # changed them on the real file (outside the overlays in "discarded", anywhere in
    # "refused") while its result claimed the disk was protected.
    _enter(ex, language, tree.work)
    targets = [tree.work / "keep.txt", tree.outside / "keep.txt"]
    code = (METADATA_BASH.format(paths=" ".join(repr(str(p)) for p in targets))
            if language == "bash" else METADATA_PY.format(paths=[str(p) for p in targets]))
    result = ex.execute_code(code, language=language, state_mode="read_only",
                             session_name="s")
    assert "error" not in result, result
    assert result["isolation"]["files"] in ("discarded", "refused"), result
    for path in targets:
        st = path.stat()
        assert (oct(st.st_mode & 0o777), st.st_mtime) == ("0o644", 1_000_000), (path, result)
        assert os.listxattr(path) == [], (path, result)


def test_reading_on_the_sessions_file_does_not_move_its_position(ex: Executor,
                                                                 tree: Tree) -> None:
    (tree.work / "rows.txt").write_text("".join(f"row {i}\n" for i in range(50_000)))
    _enter(ex, "python", tree.work,
           "f = open('rows.txt')\nheader = f.readline()\n"
           "fd = os.open('rows.txt', os.O_RDONLY)\nfirst = os.read(fd, 4)")
    try:
        peek = ex.execute_code("rest = sum(1 for _ in f); os.lseek(fd, 0, os.SEEK_END); rest",
                               state_mode="read_only", session_name="s")
        assert peek["result"] == "49999", peek
        after = ex.execute_code("(sum(1 for _ in f), os.read(fd, 4))", state_mode="stateful",
                                session_name="s")
        assert after["result"] == "(49999, b'0\\nro')", after
    finally:  # the session lives in this process: its files must not outlive the test
        ex.execute_code("f.close(); os.close(fd)", state_mode="stateful", session_name="s")


# Small read-only maps are copied outright; past the limit the copy asks smaps which of
# them mprotect could make writable (their file was opened for writing) and copies those.
@pytest.mark.parametrize("size", [4096, copier.COPY_READ_ONLY_LIMIT + 4096],
                         ids=["copied", "asked-smaps"])
def test_a_read_only_map_made_writable_in_the_copy_does_not_reach_the_file(
        ex: Executor, tree: Tree, size: int) -> None:
    (tree.work / "blob.bin").write_bytes(b"A" * size)
    _enter(ex, "python", tree.work,
           "import mmap\nfh = open('blob.bin', 'r+b')\n"
           "view = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)\n"
           "with open('/proc/self/maps') as maps:\n"
           "    addr = next(int(line.split('-')[0], 16) for line in maps\n"
           "                if line.rstrip().endswith('/blob.bin'))")
    try:
        _mprotect_attack(ex, tree)
    finally:
        ex.execute_code("view.close(); fh.close()", state_mode="stateful", session_name="s")


def _mprotect_attack(ex: Executor, tree: Tree) -> None:
    attack = ex.execute_code(
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]\n"
        "if libc.mprotect(addr, 4096, 3) == 0:  # the address the session mapped it at\n"
        "    ctypes.memmove(addr, b'CHANGED', 7)\n"
        "view[:7]", state_mode="read_only", session_name="s")
    assert "error" not in attack, attack
    assert (tree.work / "blob.bin").read_bytes()[:7] == b"AAAAAAA", attack
    after = ex.execute_code("view[:7]", state_mode="stateful", session_name="s")
    assert after["result"] == "b'AAAAAAA'", after
