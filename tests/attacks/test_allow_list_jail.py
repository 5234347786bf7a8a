"""A tenant looks for what it was not given (SPEC 9: the jail by allow-list).

The server's root, its tokens file and an operator's folder of the machine lie under
``/var/tmp`` here, outside ``/tmp``: a jail's private ``/tmp`` would hide a root kept
there and mask exactly the leaks these attacks look for. Each test is an attack that
worked while the jail was the machine minus a list of secrets: listing the machine's
folders, reading root's files, another tenant's System V shared memory and terminals,
and (at the ``landlock`` level) changing the limits or priority of processes outside.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from coordex.hosting import best_level
from tests.e2e._procs import child_env, spawn
from tests.e2e.test_confinement import ALICE, BOB, MEMORY_LIMIT, SECRET, Server, as_nobody, write_tokens
from tests.e2e.test_mcp_http import READY

pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(best_level() == "none", reason="no confinement on this machine")]

OUTSIDE_TMP = "/var/tmp"


@dataclass
class Room:
    """A server whose root lies outside /tmp, with the machine's folders beside it."""

    server: Server
    base: Path
    operator: Path  # an operator's folder of the machine (a checkout, keys): not given
    wheelhouse: Path  # given with --readable
    level: str


def _room(level: str, as_user: int | None) -> Iterator[Room]:
    base = Path(tempfile.mkdtemp(prefix="coordex-jail-", dir=OUTSIDE_TMP))
    os.chmod(base, 0o755)
    try:
        home = base / "home"
        home.mkdir()
        operator = base / "operator"
        operator.mkdir()
        (operator / "deploy-key").write_text(SECRET)
        wheelhouse = base / "wheelhouse"
        wheelhouse.mkdir()
        (wheelhouse / "README").write_text("wheels\n")
        (wheelhouse / "root-only").write_text(SECRET)
        os.chmod(wheelhouse / "root-only", 0o600)
        tokens = write_tokens(base, f"alice {ALICE}\nbob {BOB}\n")
        wrap: Callable[[list[str]], list[str]] = list
        if as_user is not None:
            for path in (home, tokens):
                os.chown(path, as_user, as_user)
            wrap = as_nobody
        extra = {"COORDEX_ISOLATION_FORCE": "refused"} if level == "landlock" else {}
        env = child_env(home, UV_OFFLINE="1", **extra)
        with spawn("serve", "--port", "0", "--tokens", str(tokens), "--memory-limit",
                   MEMORY_LIMIT, "--readable", str(wheelhouse), env=env, wrap=wrap) as running:
            url = running.wait_for(READY).group(1)
            assert running.wait_for(r"confinement: (\S+)").group(1) == level
            srv = Server(running, url, home, tokens)
            made = srv.run(BOB, ("execute_code", {"code": f"echo {SECRET} > notes.txt",
                                                  "language": "bash"}))
            assert not made[0]["is_error"], made
            yield Room(srv, base, operator, wheelhouse, level)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _can_be_nobody() -> bool:
    return os.geteuid() == 0 and bool(shutil.which("setpriv") and shutil.which("unshare"))


LEVELS = [pytest.param(("namespaces+landlock", None), id="namespaces-root"),
          pytest.param(("landlock", None), id="landlock-root"),
          pytest.param(("namespaces+landlock", 65534), id="namespaces-nobody",
                       marks=pytest.mark.skipif(not _can_be_nobody(), reason="needs root")),
          pytest.param(("landlock", 65534), id="landlock-nobody",
                       marks=pytest.mark.skipif(not _can_be_nobody(), reason="needs root"))]


@pytest.fixture(scope="module", params=LEVELS)
def room(request: pytest.FixtureRequest) -> Iterator[Room]:
    level, user = request.param
    if level == "namespaces+landlock" and best_level() != "namespaces+landlock":
        pytest.skip("user namespaces are not available here")
    yield from _room(level, user)


def _value(result: dict[str, object]) -> object:
    assert not result["is_error"], result
    return json.loads(ast.literal_eval(str(result["result"])))


def _on_the_way(folder: str) -> set[str]:
    import coordex

    given = [sys.prefix, sys.base_prefix, os.path.realpath(sys.executable),
             os.path.dirname(os.path.dirname(coordex.__file__))]
    return {Path(os.path.realpath(p)).relative_to(folder).parts[0] for p in given
            if os.path.realpath(p).startswith(folder + "/")}


def test_nothing_of_the_machine_that_was_not_given_exists(room: Room) -> None:
    found = room.server.code(ALICE, f"""
import json, os
base = {str(room.base)!r}
def seen(path):
    try:
        return sorted(os.listdir(path))
    except OSError:
        return None
def readable(path):
    try:
        return open(path, 'rb').read()[:64].decode('utf-8', 'replace')
    except OSError:
        return None
json.dumps({{
    "base": seen(base),
    "tenants": seen(os.path.join(base, 'home', 'tenants')),
    "tokens": readable(os.path.join(base, 'tokens.txt')),
    "key": readable(os.path.join(base, 'operator', 'deploy-key')),
    "bob": readable(os.path.join(base, 'home', 'tenants', 'bob', 'notes.txt')),
    "shadow": readable('/etc/shadow'),
    "root": seen('/root'), "home": seen('/home'), "srv": seen('/srv'),
    "wheels": readable(os.path.join(base, 'wheelhouse', 'README')),
    "root_only": readable(os.path.join(base, 'wheelhouse', 'root-only')),
}})""")
    seen = _value(found)
    assert isinstance(seen, dict)
    assert seen["tokens"] is None and seen["key"] is None and seen["bob"] is None, seen
    assert seen["shadow"] is None and seen["root_only"] is None, seen
    assert seen["wheels"] == "wheels\n", seen
    assert "tokens.txt" not in (seen["base"] or []) and "operator" not in (seen["base"] or [])
    assert "bob" not in (seen["tenants"] or []), seen
    for folder in ("root", "home", "srv"):
        # Absent from the view, or holding only the way to the Python installation.
        assert set(seen[folder] or []) <= _on_the_way(f"/{folder}"), seen


def test_bash_finds_nothing_either(room: Room) -> None:
    found = room.server.code(ALICE, (
        f"cat {room.base}/tokens.txt {room.operator}/deploy-key "
        f"{room.base}/home/tenants/bob/notes.txt /etc/shadow 2>/dev/null; "
        f"ls {room.base} {room.base}/home/tenants /root /home 2>/dev/null; true"),
        language="bash")
    out = found["stdout"]
    assert SECRET not in out and BOB not in out, found
    assert "operator" not in out and "tokens.txt" not in out and "bob" not in out, found


SHM = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
KEY, SIZE = 0xC0DE5, 4096
"""


def test_system_v_shared_memory_is_the_tenants_own(room: Room) -> None:
    made = room.server.code(BOB, SHM + (
        "shmid = libc.shmget(KEY, SIZE, 0o1666)  # IPC_CREAT | 0666\n"
        "if shmid >= 0:\n"
        "    address = libc.shmat(shmid, None, 0)\n"
        f"    ctypes.memmove(address, {SECRET.encode()!r}, {len(SECRET)})\n"
        "shmid >= 0"), state_mode="stateful", session_name="shm")
    # Bob's own namespace holds it; without one (landlock) System V IPC is refused.
    assert made["result"] == ("True" if "namespaces" in room.level else "False"), made
    stolen = room.server.code(ALICE, SHM + (
        "shmid = libc.shmget(KEY, 0, 0)\n"
        "data = b''\n"
        "if shmid >= 0:\n"
        "    address = libc.shmat(shmid, None, 0)\n"
        "    data = ctypes.string_at(address, 64)\n"
        "rows = open('/proc/sysvipc/shm').read().count('\\n')\n"
        "(shmid, data.rstrip(bytes(1)).decode(), rows)"))
    shmid, data, rows = eval(str(stolen["result"]))
    assert shmid == -1 and data == "", stolen
    if "namespaces" in room.level:
        assert rows == 1, stolen  # the header line alone: none of the machine's either


def test_another_tenants_terminal_is_not_in_its_devpts(room: Room) -> None:
    # Bob's session holds a terminal; Alice looks for it and for the machine's. At the
    # landlock level, which has no devpts of its own, no host gets a terminal at all.
    namespaces = "namespaces" in room.level
    held = room.server.code(BOB, "import os\nmaster, slave = os.openpty()\nos.ttyname(slave)",
                            state_mode="stateful", session_name="tty")
    assert held.get("result", "").startswith("'/dev/pts/") == namespaces, held
    outside_master, outside_slave = os.openpty()
    try:
        targets = [os.ttyname(outside_slave)]
        if namespaces:
            targets.append(ast.literal_eval(held["result"]))
        found = room.server.code(ALICE, (
            "import os\n"
            f"targets = {targets!r}\n"
            "opened = []\n"
            "for t in targets:\n"
            "    try:\n"
            "        os.close(os.open(t, os.O_RDWR | os.O_NOCTTY))\n"
            "        opened.append(t)\n"
            "    except OSError:\n"
            "        pass\n"
            "opened"))
        assert found["result"] == "[]", found
    finally:
        os.close(outside_master)
        os.close(outside_slave)


def test_a_root_server_runs_each_tenant_as_a_user_of_its_own(room: Room) -> None:
    ids = [room.server.code(who, "import os\n(os.getuid(), os.getgid(), os.geteuid())")
           for who in (ALICE, BOB)]
    alice, bob = (eval(str(r["result"])) for r in ids)
    assert 0 not in alice and 0 not in bob, ids
    assert alice != bob or alice[0] == 65534, ids  # nobody's server keeps its user
    # Stable: the host started again (after its death) runs as the same user.
    room.server.code(ALICE, "import os\nos._exit(3)")
    again = room.server.code(ALICE, "import os\n(os.getuid(), os.getgid(), os.geteuid())")
    assert eval(str(again["result"])) == alice, again


RENICE = """
import ctypes, os, resource
libc = ctypes.CDLL(None, use_errno=True)
target = {pid}
out = {{}}
def tried(name, call):
    try:
        call()
        out[name] = 'done'
    except OSError as exc:
        out[name] = exc.errno
tried('prlimit', lambda: resource.prlimit(target, resource.RLIMIT_NOFILE, (10, 10)))
tried('setpriority', lambda: os.setpriority(os.PRIO_PROCESS, target, 19))
tried('affinity', lambda: os.sched_setaffinity(target, {{0}}))
tried('cmdline', lambda: open(f'/proc/{{target}}/cmdline', 'rb').read())
tried('own', lambda: resource.setrlimit(resource.RLIMIT_CORE, (0, 0)) or os.nice(1))
out
"""


def test_processes_outside_the_jail_cannot_be_reniced_or_limited(room: Room) -> None:
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        found = room.server.code(ALICE, RENICE.format(pid=victim.pid))
        out = eval(str(found["result"]))
        assert out["own"] == "done", found
        for name in ("prlimit", "setpriority", "affinity"):
            assert out[name] != "done", found
        with open(f"/proc/{victim.pid}/limits") as f:
            assert "Max open files            10" not in f.read().replace("  ", " " * 2)
        assert os.getpriority(os.PRIO_PROCESS, victim.pid) == 0
    finally:
        victim.kill()
        victim.wait()


def test_programs_run_on_the_listed_etc_files(room: Room) -> None:
    found = room.server.code(ALICE, (
        "set -e\n"
        "python3 -c 'import ssl, socket, time, pwd, os; ssl.create_default_context(); "
        "socket.getaddrinfo(\"localhost\", 80); time.localtime(); "
        "print(os.path.expanduser(\"~\"))'\n"
        "uv --version >/dev/null && echo uv-ok\n"
        # A program pip installed (a console script whose first line names its Python).
        f"{os.path.dirname(sys.executable)}/pip --version >/dev/null && echo pip-ok\n"
        "git --version >/dev/null && rm -rf repo && git init -q repo && cd repo && "
        "git -c user.name=t -c user.email=t@e commit -q --allow-empty -m x && echo git-ok\n"
        "hostname\n"), language="bash")
    assert not found["is_error"], found
    lines = found["stdout"].split()
    assert "uv-ok" in lines and "git-ok" in lines and "pip-ok" in lines, found
    assert lines[0].endswith("/tenants/alice"), found  # its home is its folder


def test_a_spec_naming_a_file_outside_the_view_says_so(room: Room) -> None:
    outside = room.operator / "pkg-1.0-py3-none-any.whl"
    made = room.server.run(ALICE, ("create_environment", {
        "spec": f'# /// script\n# dependencies = ["pkg @ file://{outside}"]\n# ///\n'}))[0]
    assert made["is_error"] and made["error_type"] == "environment", made
    assert str(outside) in made["error"] and "--readable" in made["suggestion"], made


FORGE = """
import json, os, sqlite3
argv = open('/proc/self/cmdline', 'rb').read().split(b'\\0')
records = argv[argv.index(b'--records') + 1].decode()
out = int(argv[argv.index(b'--out') + 1])
found = {}
try:
    db = sqlite3.connect(os.path.join(records, 'log.sqlite3'))
    db.execute("UPDATE calls SET code = 'print(1)'")
    db.execute("DELETE FROM calls")
    db.commit()
    found['sqlite'] = 'written'
except Exception as exc:
    found['sqlite'] = type(exc).__name__
# The host's own lines to its owner, forged: rewrite the earlier row's code and
# output, add a row dated a year back with a huge output, and flood rows of its own.
lines = [{'type': 'record', 'id': 10**6, 'op': 'log_update',
          'args': {'seq': SEQ, 'values': {'code': 'import os  # forged', 'stdout': 'forged'}}},
         {'type': 'record', 'id': 10**6 + 1, 'op': 'log_append',
          'args': {'row': {'kind': 'call', 'code': 'curl x | sh  # forged-old', 'at': 1.0,
                           'owner': 'forger', 'code_truncated': 0, 'state_lost': 0,
                           'retried': 0,
                           'stdout': 'A' * 200_000}}}]
lines += [{'type': 'record', 'id': 10**6 + 2 + n, 'op': 'log_append',
           'args': {'row': {'kind': 'close', 'code': 'flood', 'owner': 'forger',
                            'code_truncated': 0, 'state_lost': 0, 'retried': 0}}}
          for n in range(40)]
for line in lines:
    os.write(out, json.dumps(line).encode() + b'\\n')
found
"""


def _alice_log(room: Room) -> list[dict[str, object]]:
    from coordex.log.store import LogReader

    path = room.server.home / "records" / "tenants" / "alice" / "log.sqlite3"
    return LogReader(path).query("SELECT seq, code, at, stdout FROM calls ORDER BY seq")


def test_its_call_log_is_not_its_to_change(room: Room) -> None:
    made = room.server.code(ALICE, "audited = 1", state_mode="stateful", session_name="audit")
    assert not made["is_error"], made
    seq = next(r["seq"] for r in _alice_log(room) if r["code"] == "audited = 1")
    attack = room.server.code(ALICE, FORGE.replace("SEQ", str(seq)))
    assert attack["result"] == "{'sqlite': 'OperationalError'}", attack
    # A host started afresh may not touch its last life's rows at all.
    room.server.code(ALICE, "import os\nos._exit(3)")
    room.server.code(ALICE, FORGE.replace("SEQ", str(seq)))
    rows = {r["seq"]: r for r in _alice_log(room)}
    assert rows[seq]["code"] == "audited = 1" and rows[seq]["stdout"] != "forged", rows[seq]
    assert not any(str(r["code"]).startswith("import os  # forged") for r in rows.values())
    old = [r for r in rows.values() if "forged-old" in str(r["code"])]
    assert old and all(r["at"] > time.time() - 600 for r in old), old  # never back-dated
    assert all(len(str(r["stdout"] or "")) < 100_000 for r in rows.values())
    assert sum(r["code"] == "flood" for r in rows.values()) <= 2 * 16  # per owner call
    assert not (room.server.home / "tenants" / "alice" / "log.sqlite3").exists()


FORGE_OWN = """
import json, os, threading
argv = open('/proc/self/cmdline', 'rb').read().split(b'\\0')
out = int(argv[argv.index(b'--out') + 1])
def send():  # from a thread of its own: the line carries no call of the owner's
    os.write(out, json.dumps({'type': 'record', 'id': 10**7, 'op': 'log_append', 'args': {
        'row': {'kind': 'call', 'code': "print('hello')  # forged own row",
                'language': 'python', 'state_mode': 'stateful', 'session_name': 'admin',
                'outcome': 'ok', 'said_by': None, 'stdout': 'hello', 'owner': 'x',
                'code_truncated': 0, 'state_lost': 0, 'retried': 0}}}).encode() + b'\\n')
t = threading.Thread(target=send)
t.start()
t.join()
'sent'
"""


def test_rows_of_the_hosts_own_are_marked_as_its_word(room: Room) -> None:
    """R10: a row no call of the owner's ties (the host's own word) is marked so by the
    owner, whatever the host says, and ``coordex log``, ``history(seq=)`` and the page's
    list say so; a row of a call the owner sent bears no mark."""
    from coordex.log.calls import calls_page, history
    from coordex.log.store import LogReader

    sent = room.server.code(ALICE, FORGE_OWN)
    assert sent["result"] == "'sent'", sent
    records = room.server.home / "records" / "tenants" / "alice"
    deadline = time.monotonic() + 10
    while True:
        rows = LogReader(records / "log.sqlite3").query(
            "SELECT seq, code, said_by FROM calls WHERE kind = 'call' ORDER BY seq")
        forged = [r for r in rows if str(r["code"]).startswith("print('hello')")]
        if forged or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert forged and all(r["said_by"] == "host" for r in forged), rows
    real = [r for r in rows if str(r["code"]).startswith("\nimport json, os, threading")]
    assert real and all(r["said_by"] is None for r in real), rows
    reader = LogReader(records / "log.sqlite3")
    seq = forged[-1]["seq"]
    assert history(reader, seq=seq)["call"]["said_by"] == "host"
    page = {c["seq"]: c for c in calls_page(reader)["calls"]}
    assert page[seq]["said_by"] == "host" and "said_by" not in page[real[-1]["seq"]], page
    shown = subprocess.run([sys.executable, "-m", "coordex", "log", "--home", str(records)],
                           capture_output=True, text=True, timeout=60)
    line = next(x for x in shown.stdout.splitlines() if x.lstrip().startswith(f"{seq} "))
    assert "host's word" in line, shown.stdout
    detail = subprocess.run([sys.executable, "-m", "coordex", "log", "--home", str(records),
                             "--seq", str(seq)], capture_output=True, text=True, timeout=60)
    assert "the host's own word" in detail.stdout, detail.stdout


USERNS = """
import ctypes, json, os, platform, subprocess, sys
child = '''
import ctypes, json, os, platform
libc = ctypes.CDLL(None, use_errno=True)
out = {}
made = libc.unshare(0x10000000)  # CLONE_NEWUSER, in a process of one thread
out["unshare"] = [made, ctypes.get_errno()]
with open("/proc/self/status") as f:
    out["CapEff"] = [line.split()[1] for line in f if line.startswith("CapEff")][0]
if platform.machine() == "x86_64":  # clone(CLONE_NEWUSER | SIGCHLD): a child in one
    pid = libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0)
    if pid == 0:
        os._exit(0)
    out["clone"] = [pid, ctypes.get_errno()]
    if pid > 0:
        os.waitpid(pid, 0)
print(json.dumps(out))
'''
found = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True)
json.dumps({"out": found.stdout, "err": found.stderr[-400:],
            "unshare1": subprocess.run(["unshare", "-U", "true"], capture_output=True,
                                       text=True).returncode})
"""


def test_no_user_namespace_of_its_own(room: Room) -> None:
    """A user namespace of its own would give the tenant's code every capability there
    (CAP_NET_ADMIN: nf_tables, the kernel's network administration): refused, at every
    level, by unshare(2), clone(2) and unshare(1) alike."""
    seen = _value(room.server.code(ALICE, USERNS))
    assert isinstance(seen, dict)
    out = json.loads(seen["out"])
    assert out["unshare"][0] == -1, seen
    assert int(out["CapEff"], 16) == 0, seen
    if "clone" in out:
        assert out["clone"][0] == -1, seen
    assert seen["unshare1"] != 0, seen


TERMINALS = """
import json, os, subprocess, sys
child = '''
import fcntl, os, pty, termios
try:
    master, slave = pty.openpty()  # a terminal of the jail's own devpts
except OSError:
    print("no-pty")
    raise SystemExit
os.setsid()
fcntl.ioctl(slave, termios.TIOCSCTTY, 0)  # now this process's controlling terminal
try:
    fcntl.ioctl(slave, termios.TIOCSTI, b"x")
    print("typed")
except OSError as exc:
    print(exc.errno)
'''
out = {}
try:
    fd = os.open("/dev/tty", os.O_RDWR)
    out["tty"] = "opened"
    os.close(fd)
except OSError as exc:
    out["tty"] = exc.errno
found = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True)
out["tiocsti"] = found.stdout.strip() or found.stderr[-300:]
json.dumps(out)
"""


def test_nothing_can_be_typed_into_a_terminal(room: Room) -> None:
    """/dev/tty is not in the view (the host has no controlling terminal anyway), and
    TIOCSTI is refused even on a terminal the jail made and controls itself."""
    seen = _value(room.server.code(ALICE, TERMINALS))
    assert isinstance(seen, dict)
    assert seen["tty"] != "opened", seen
    assert seen["tiocsti"] != "typed", seen
    if room.level == "namespaces+landlock":
        assert seen["tiocsti"] == "1", seen  # EPERM, from the filter


def test_no_command_line_in_the_jail_names_what_it_hides(room: Room) -> None:
    """The jail's pid 1 (and every process of the host) is a fork of the keeper: a
    command line holding ``--hide`` named the server's root and tokens file."""
    # At the landlock level /proc is the machine's (the server's own command line is
    # there, as the README's threat model says): the host's own processes are looked at.
    found = room.server.code(ALICE, """
import os
def line(pid):
    try:
        return open(f'/proc/{pid}/cmdline', 'rb').read().decode('utf-8', 'replace')
    except OSError:
        return ''
def parent(pid):
    try:
        return int(open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0
seen, pid = [], os.getpid()
while pid > 0 and ('coordex.hosting.host' in line(pid) or pid == os.getpid()):
    seen.append(line(pid))
    pid = parent(pid)
seen.append(line(1))
'\\n'.join(seen)""")
    assert not found["is_error"], found
    text = str(found["result"])
    assert "coordex.hosting.host" in text or room.level == "landlock", found
    assert "tokens.txt" not in text and "--hide\\x00" not in text, found
