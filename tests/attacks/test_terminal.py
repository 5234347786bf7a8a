"""A tenant reaches for the terminal the server was started from (SPEC 8 and 9).

An operator starts ``coordex serve`` from a shell; the server's controlling terminal is
that shell's. Anything a tenant runs that kept it could open ``/dev/tty``, read what the
operator types, and type into the shell with ``TIOCSTI`` - commands that run as the
operator, outside every jail. Here the server runs under a real pseudo-terminal (its
controlling terminal, as a shell's child would have), with its root outside ``/tmp``.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import queue
import shutil
import subprocess
import tempfile
import termios
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from coordex.hosting import best_level
from tests.e2e._procs import COORDEX, Running, _pump, child_env, stop
from tests.e2e.test_confinement import ALICE, BOB, MEMORY_LIMIT, Server, as_nobody, write_tokens
from tests.e2e.test_mcp_http import READY

pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(best_level() == "none", reason="no confinement on this machine")]

MARK = "typed-by-a-tenant-4242"

ATTACK = f"""
import fcntl, json, os, termios
out = {{}}
try:
    fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
except OSError as exc:
    out["open"] = exc.errno
else:
    out["open"] = "opened"
    try:
        for ch in b"echo {MARK}\\n":
            fcntl.ioctl(fd, termios.TIOCSTI, bytes([ch]))
        out["tiocsti"] = "typed"
    except OSError as exc:
        out["tiocsti"] = exc.errno
    try:
        os.write(fd, b"{MARK} written\\r\\n")
        out["write"] = "written"
    except OSError as exc:
        out["write"] = exc.errno
# The same through the descriptors every process of the host was given.
for n in (0, 1, 2):
    try:
        fcntl.ioctl(n, termios.TIOCSTI, b"x")
        out[f"fd{{n}}"] = "typed"
    except OSError as exc:
        out[f"fd{{n}}"] = exc.errno
json.dumps(out)
"""


def _can_be_nobody() -> bool:
    return os.geteuid() == 0 and bool(shutil.which("setpriv") and shutil.which("unshare"))


def _under_a_terminal(argv: list[str], env: dict[str, str]
                      ) -> tuple[subprocess.Popen[str], int]:
    """``argv`` in a session of its own whose controlling terminal is a new pty; the
    pty's other end (what an operator's terminal emulator holds) is returned."""
    master, slave = pty.openpty()

    def take_terminal() -> None:
        os.setsid()
        fcntl.ioctl(slave, termios.TIOCSCTTY, 0)

    process = subprocess.Popen(argv, env=env, stdin=slave, stdout=slave, stderr=subprocess.PIPE,
                               text=True, preexec_fn=take_terminal)
    os.close(slave)
    return process, master


def _drain(master: int) -> bytes:
    """What reached the terminal so far (echoed input among it)."""
    seen = b""
    flags = fcntl.fcntl(master, fcntl.F_GETFL)
    fcntl.fcntl(master, fcntl.F_SETFL, flags | os.O_NONBLOCK)
    while True:
        try:
            chunk = os.read(master, 65536)
        except (BlockingIOError, OSError):
            break
        if not chunk:
            break
        seen += chunk
    return seen


PARAMS = [pytest.param(("namespaces+landlock", None), id="namespaces-root"),
          pytest.param(("landlock", None), id="landlock-root"),
          pytest.param(("namespaces+landlock", 65534), id="namespaces-nobody",
                       marks=pytest.mark.skipif(not _can_be_nobody(), reason="needs root"))]


@pytest.fixture(scope="module", params=PARAMS)
def on_a_terminal(request: pytest.FixtureRequest) -> Iterator[tuple[Server, int]]:
    level, user = request.param
    if level == "namespaces+landlock" and best_level() != "namespaces+landlock":
        pytest.skip("user namespaces are not available here")
    base = Path(tempfile.mkdtemp(prefix="coordex-tty-", dir="/var/tmp"))
    os.chmod(base, 0o755)
    try:
        home = base / "home"
        home.mkdir()
        tokens = write_tokens(base, f"alice {ALICE}\nbob {BOB}\n")
        wrap: Callable[[list[str]], list[str]] = list
        if user is not None:
            for path in (home, tokens):
                os.chown(path, user, user)
            wrap = as_nobody
        extra = {"COORDEX_ISOLATION_FORCE": "refused"} if level == "landlock" else {}
        env = child_env(home, UV_OFFLINE="1", **extra)
        process, master = _under_a_terminal(
            wrap([*COORDEX, "serve", "--port", "0", "--tokens", str(tokens),
                  "--memory-limit", MEMORY_LIMIT]), env)
        running = Running(process, queue.Queue())
        reader = threading.Thread(target=_pump, args=(process.stderr, running.lines),
                                  daemon=True)
        reader.start()
        try:
            url = running.wait_for(READY).group(1)
            assert running.wait_for(r"confinement: (\S+)").group(1) == level
            yield Server(running, url, home, tokens), master
        finally:
            stop(process)
            reader.join(timeout=5)
            os.close(master)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("language", ["python", "bash"])
def test_a_tenant_cannot_reach_the_servers_terminal(on_a_terminal: tuple[Server, int],
                                                    language: str) -> None:
    server, master = on_a_terminal
    _drain(master)
    if language == "python":
        found = server.code(ALICE, ATTACK, state_mode="stateful")
        assert not found["is_error"], found
        seen = json.loads(eval(str(found["result"])))
        assert seen["open"] != "opened", seen
        assert all(seen[f"fd{n}"] != "typed" for n in range(3)), seen
    else:
        found = server.code(ALICE, f"echo {MARK} > /dev/tty; echo rc=$?", language="bash")
        assert "rc=0" not in found["stdout"], found
    time.sleep(0.5)
    assert MARK.encode() not in _drain(master)
    assert server.alive()
    assert server.code(BOB, "1 + 1")["result"] == "2"
