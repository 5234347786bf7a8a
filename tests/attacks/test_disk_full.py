"""One tenant fills the disk (R12): the other's rows and state stay its own.

The server's root is a small tmpfs (root only: ``mount -t tmpfs``); Alice writes until
the disk is full; Bob's calls must keep their rows in his call log, and his session,
after his host restarts, must come back as his last result showed it, or say it did not.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordex.hosting import best_level
from tests.e2e._procs import child_env, spawn
from tests.e2e.test_confinement import ALICE, BOB, MEMORY_LIMIT, Server, write_tokens
from tests.e2e.test_mcp_http import READY

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(best_level() == "none", reason="no confinement on this machine"),
              pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small disk needs root")]

FILL = """
import os
n = 0
try:
    with open('fill.bin', 'wb') as f:
        while True:
            f.write(b'\\0' * (1 << 20))
            f.flush()
            n += 1
except OSError as exc:
    full = exc.errno
try:
    for i in range(100000):  # the last blocks, in small files
        with open('small-%d' % i, 'wb') as f:
            f.write(b'x' * 4096)
except OSError:
    pass
(n, full)
"""


@pytest.fixture
def small_disk() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="coordex-disk-", dir="/var/tmp"))
    os.chmod(base, 0o755)
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96m,mode=755", "tmpfs",
                           str(base)], capture_output=True, text=True)
    if made.returncode != 0:
        shutil.rmtree(base, ignore_errors=True)
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    try:
        yield base
    finally:
        subprocess.run(["umount", "-l", str(base)], check=False)
        shutil.rmtree(base, ignore_errors=True)


def _n(result: dict) -> int:
    assert not result["is_error"], result
    return int(ast.literal_eval(str(result["result"])))


def test_another_tenants_full_disk_loses_no_row_and_rolls_nothing_back(
        small_disk: Path) -> None:
    from coordex.log.store import LogReader

    tokens = write_tokens(small_disk, f"alice {ALICE}\nbob {BOB}\n")
    home = small_disk / "home"
    env = child_env(home, UV_OFFLINE="1")
    with spawn("serve", "--port", "0", "--tokens", str(tokens), "--memory-limit",
               MEMORY_LIMIT, env=env) as running:
        srv = Server(running, running.wait_for(READY).group(1), home, tokens)
        bob = {"state_mode": "stateful", "session_name": "b"}
        assert _n(srv.code(BOB, "n = 1\nn", **bob)) == 1
        assert _n(srv.code(BOB, "n += 1\nn", **bob)) == 2
        filled = srv.code(ALICE, FILL, timeout=120)
        assert not filled["is_error"], filled
        assert shutil.disk_usage(small_disk).free < 64 * 1024, shutil.disk_usage(small_disk)
        said = []
        for expect in (3, 4, 5, 6):
            r = srv.code(BOB, "n += 1\nn", **bob)
            assert _n(r) == expect
            said.append(r)
        log = home / "records" / "tenants" / "bob" / "log.sqlite3"
        rows = LogReader(log).query(
            "SELECT seq, code FROM calls WHERE kind = 'call' AND session_name = 'b' ORDER BY seq")
        # Every call's row is kept; a call whose row could not be kept says so.
        unlogged = [r for r in said if "not in the call log" not in str(r.get("structured"))
                    and "not in the call log" not in str(r)]
        assert len(rows) == 6 or len(unlogged) == 0, (rows, said)
        # Bob's host restarts: his session comes back as his last result showed it.
        srv.code(BOB, "import os\nos._exit(3)")
        back = srv.code(BOB, "n", **bob)
        assert not back["is_error"], back
        assert _n(back) == 6, back  # every row was kept: nothing rolled back
        # Alice's own rows: once her log's room is used, each result says its row is
        # not kept, and after her host restarts her session says calls are missing.
        mine = {"state_mode": "stateful", "session_name": "a"}
        assert _n(srv.code(ALICE, "a = 0\na", **mine)) == 0
        step = ("execute_code", {"code": "a += 1\nprint('y' * 20000)\na", **mine})
        results = srv.run(ALICE, *[step] * 400)
        assert [_n(r) for r in results] == list(range(1, 401))
        warned = [r for r in results if "could not be written to the call log" in
                  str(r.get("warning"))]
        assert warned and all(not r.get("warning") for r in results[:100]), len(warned)
        srv.code(ALICE, "import os\nos._exit(3)")
        again = srv.code(ALICE, "a", **mine)
        # Back as her last result showed, or said otherwise: state_lost (nothing came
        # back), or a restore that names the calls the log is missing.
        if again.get("state_lost"):
            return
        assert not again["is_error"], again
        if _n(again) != 400:
            assert again["restored"]["missing_rows"] >= 1, again
            assert "no row in the call log" in again["restored"]["why"], again
