"""A second tenant attacks the server and the other tenant (SPEC sections 8 and 9).

``coordex serve --tokens FILE`` runs as a subprocess; every call goes through the
official MCP client with a tenant's token, as in ``tests/e2e/test_confinement.py``
(which holds the attacks already covered there: gc walks, reading files and the tokens
file, ``/proc/*/environ``, signals, memory hogs, planted environments).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e._procs import child_env, spawn
from tests.e2e.test_confinement import (
    ALICE,
    BOB,
    MEMORY_LIMIT,
    SECRET,
    Server,
    as_nobody,
    bob_still_fine,
    landlock_server,
    write_tokens,
)
from tests.e2e.test_mcp_http import READY

pytestmark = pytest.mark.timeout(180)

ATTACKER = "mallory"

# The host's end of the pipe to the server is one of its descriptors; the tenant's code
# runs in the host's own interpreter, so it can write there. It writes junk with no end.
FLOOD = """
import os
argv = open('/proc/self/cmdline', 'rb').read().split(b'\\0')
fd = int(argv[argv.index(b'--out') + 1])
chunk = b'x' * (1 << 20)
for _ in range(256):
    os.write(fd, chunk)
'sent'
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    base = tmp_path_factory.mktemp("attacks")
    # Names of their own: the cgroups of these hosts are told apart by them.
    tokens = write_tokens(base, f"{ATTACKER} {ALICE}\nvictim {BOB}\n")
    home = base / "home"
    env = child_env(home, UV_OFFLINE="1")
    # Another Python of the machine, in the view for the planting attack below (nothing
    # of the machine is, unless the operator names it).
    other = _another_python()
    readable = ["--readable", str(Path(other["executable"]).parent.parent)] if other else []
    with spawn("serve", "--port", "0", "--tokens", str(tokens), "--memory-limit",
               MEMORY_LIMIT, *readable, env=env) as running:
        url = running.wait_for(READY).group(1)
        srv = Server(running, url, home, tokens)
        bob = srv.run(BOB, ("execute_code", {"code": f"password = {SECRET!r}",
                                             "state_mode": "stateful"}),
                      ("execute_code", {"code": "vault = 42", "state_mode": "stateful",
                                        "session_name": "vault"}))
        assert not any(r["is_error"] for r in bob), bob
        yield srv


def test_a_flood_down_the_hosts_pipe_ends_only_that_host(server: Server) -> None:
    # Before: the server buffered the endless line and rescanned it on every read
    # (quadratic), so one tenant kept a core of the server busy and its memory growing.
    started = time.monotonic()
    flood = server.code(ALICE, FLOOD, timeout=30)
    took = time.monotonic() - started
    assert flood["error_type"] == "crashed" and flood["state_lost"] is True, flood
    assert took < 20, f"the server took {took:.1f} s to end a flooding host"
    # The ended host's cgroups are gone (before: its keeper was killed with them in place,
    # so a tenant could use up the machine's cgroups by getting its host ended).
    left = [g for g in glob.glob(f"/sys/fs/cgroup/*/coordex/{ATTACKER}-*")
            if not _processes(g)]
    assert left == [], f"cgroups of an ended host were left behind: {left}"
    bob_still_fine(server)
    assert server.code(ALICE, "1 + 1")["result"] == "2"


def _processes(group: str) -> list[str]:
    try:
        with open(os.path.join(group, "cgroup.procs")) as f:
            return f.read().split()
    except OSError:
        return []


# -- as an unprivileged user: no cgroups, so the limits are rlimits ----------------------


@pytest.fixture(scope="module")
def nobody_server() -> Iterator[Server]:
    if os.geteuid() != 0 or not (shutil.which("setpriv") and shutil.which("unshare")):
        pytest.skip("switching to nobody needs root, setpriv and unshare (util-linux)")
    base = Path(tempfile.mkdtemp(prefix="coordex-nobody-"))
    os.chmod(base, 0o755)
    home = base / "home"
    home.mkdir()
    os.chown(home, 65534, 65534)
    tokens = write_tokens(base, f"{ATTACKER} {ALICE}\nvictim {BOB}\n")
    os.chown(tokens, 65534, 65534)
    try:
        with spawn("serve", "--port", "0", "--tokens", str(tokens), "--memory-limit",
                   MEMORY_LIMIT, env=child_env(home, UV_OFFLINE="1"), wrap=as_nobody) as running:
            url = running.wait_for(READY).group(1)
            yield Server(running, url, home, tokens)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_as_nobody_the_private_tmp_holds_no_more_than_the_memory_limit(
        nobody_server: Server) -> None:
    # Files in the private /tmp and /dev/shm are memory that RLIMIT_AS does not count:
    # before, a host limited to 256M wrote 1G there (up to half of the machine's RAM).
    filled = nobody_server.code(ALICE, (
        "for d in /tmp /dev/shm; do\n"
        "  dd if=/dev/zero of=$d/fill bs=1M count=400 2>/dev/null; du -m $d/fill | cut -f1\n"
        "  rm -f $d/fill\n"
        "done"), language="bash")
    sizes = [int(n) for n in filled["stdout"].split()]
    assert len(sizes) == 2 and max(sizes) <= 256, filled
    assert nobody_server.code(BOB, "1 + 1")["result"] == "2"


@pytest.mark.slow
def test_as_nobody_built_environments_stay_read_only_and_the_builder_untouchable(
        nobody_server: Server) -> None:
    from tests.fakes.wheels import ledgerlib_wheel, requirement
    from tests.integration.test_confined import PROBE_BUILDER, TAMPER, USE

    wheels = nobody_server.home / "tenants" / ATTACKER / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    spec = requirement("ledgerlib", ledgerlib_wheel(wheels, "1.0"))
    built = nobody_server.run(ALICE, ("create_environment", {"spec": spec, "build": True}))[0]
    assert built.get("built") is True, built
    tampered, probe, used = nobody_server.run(
        ALICE, ("execute_code", {"code": TAMPER.format(env=built["path"])}),
        ("execute_code", {"code": PROBE_BUILDER}),
        ("execute_code", {"code": USE, "venv_id": built["venv_id"]}))
    assert tampered.get("result") == "[]", tampered
    assert probe.get("result") == (
        "{'kill': 'PermissionError', 'mem': 'PermissionError', 'ptrace': -1}"), probe
    assert used.get("result") == "('1.0', 3, None)", used
    assert nobody_server.code(BOB, "1 + 1")["result"] == "2"


def test_as_nobody_as_processes_leave_bob_room_to_start_his(nobody_server: Server) -> None:
    spawned = nobody_server.code(ALICE, (
        "import subprocess\n"
        "held = []\n"
        "try:\n"
        "    while len(held) < 2000:\n"
        "        held.append(subprocess.Popen(['sleep', '30']))\n"
        "except (OSError, MemoryError) as exc:\n"
        "    print(repr(exc))\n"
        "len(held)"), state_mode="stateful")
    try:
        # Held by the host's own limit (512), not by the machine's: Alice is stopped too.
        assert 100 < int(spawned.get("result", 0)) <= 512, spawned
        bob = nobody_server.code(BOB, "echo fine", language="bash")
    finally:
        nobody_server.code(ALICE, "for p in held:\n    p.kill()\n    p.wait()",
                           state_mode="stateful")
    assert bob.get("stdout", "").strip() == "fine", bob


def test_the_jail_cannot_be_climbed_out_of(server: Server) -> None:
    # ptrace, process_vm_readv and /proc/1/root of the jail's init; lifting the tmpfs
    # that hides the server's root; a chroot walk up (the view itself is the jail).
    climbed = server.code(ALICE, (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "found = {}\n"
        "found['ptrace'] = libc.ptrace(16, 1, 0, 0)\n"
        "buf = ctypes.create_string_buffer(8)\n"
        "iov = (ctypes.c_void_p * 2)(ctypes.cast(buf, ctypes.c_void_p), 8)\n"
        "found['vm_readv'] = libc.process_vm_readv(1, iov, 1, iov, 1, 0)\n"
        "try:\n"
        "    found['root'] = len(os.listdir('/proc/1/root'))\n"
        "except OSError:\n"
        "    found['root'] = -1\n"
        f"found['umount'] = libc.umount2({str(server.home)!r}.encode(), 2)\n"
        "os.makedirs('cell', exist_ok=True)\n"
        "child = os.fork()\n"
        "if child == 0:  # the walk changes the root of the process: not the host's own\n"
        "    try:\n"
        "        os.chroot('cell')\n"
        "        for _ in range(64):\n"
        "            os.chdir('..')\n"
        "        os.chroot('.')\n"
        f"        os._exit(3 if 'victim' in os.listdir({str(server.home / 'tenants')!r}) else 0)\n"
        "    except BaseException:\n"
        "        os._exit(0)\n"
        "found['chroot'] = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])\n"
        f"found['seen'] = os.listdir({str(server.home)!r}) if os.path.isdir({str(server.home)!r}) "
        "else []\n"
        "found"))
    found = eval(climbed["result"])  # a dict of ints and a list of names, printed by repr
    assert found["ptrace"] == found["vm_readv"] == found["root"] == found["umount"] == -1, found
    assert "victim" not in found["seen"] and found["chroot"] == 0, found
    bob_still_fine(server)


@pytest.mark.parametrize(("call_id", "value"), [
    ("%d", '"a string"'), ("%d", '{"stdout": 5, "images": [{"x": 1}]}'),
    ("%d", "[" * 100_000 + "]" * 100_000), ("[%d]", "1")])
def test_replies_forged_down_the_hosts_pipe_reach_only_the_forger(server: Server, call_id: str,
                                                                  value: str) -> None:
    forge = (
        "import os\n"
        "argv = open('/proc/self/cmdline', 'rb').read().split(b'\\0')\n"
        "fd = int(argv[argv.index(b'--out') + 1])\n"
        "for call in range(1, 400):\n"
        f"    os.write(fd, b'{{\"type\":\"reply\",\"id\":{call_id},\"value\":' % call"
        f" + {value!r}.encode()"
        " + b'}\\n')\n"
        "'sent'")
    started = time.monotonic()
    try:
        server.code(ALICE, forge, timeout=20)
    except Exception:  # what the forger's own client makes of its forgery is its own affair
        pass
    # Before: a line nested too deep to decode, or an id that cannot be a key, killed the
    # server's reader without ending the host, and the forger's call waited forever.
    assert time.monotonic() - started < 15
    bob_still_fine(server)
    assert server.code(ALICE, "1 + 1")["result"] == "2"


def test_no_tenant_can_plant_code_in_the_interpreter_every_host_runs(server: Server) -> None:
    # Every host imports coordex and the standard library from the server's own Python:
    # a .pth, a sitecustomize or a bytecode file planted there would run in every tenant.
    planted = server.code(ALICE, (
        "import os, site, sys, sysconfig\n"
        "import coordex\n"
        "targets = [os.path.join(p, 'zz_planted.pth') for p in site.getsitepackages()]\n"
        "targets += [os.path.join(sysconfig.get_paths()['stdlib'], 'sitecustomize.py'),\n"
        "            os.path.join(os.path.dirname(coordex.__file__), '__pycache__', 'x.pyc')]\n"
        "hits = []\n"
        "for path in targets:\n"
        "    try:\n"
        "        with open(path, 'a') as f:\n"
        "            f.write('import os\\n')\n"
        "        hits.append(path)\n"
        "    except OSError:\n"
        "        pass\n"
        "hits, len(targets)"))
    hits, tried = eval(planted["result"])  # a list of paths and a count, printed by repr
    assert tried >= 3 and hits == [], planted


# -- the "landlock" level: no namespaces, every tenant is the server's own user ----------


@pytest.mark.skipif(os.geteuid() != 0, reason="under one unprivileged user Landlock has no "
                    "right for chmod/chown/utime/setxattr, so the tenants of such a server "
                    "can change each other's files' modes by name at this level (README, "
                    "threat model); a root server runs each tenant as a user of its own")
def test_in_the_landlock_level_a_cannot_lock_b_out_of_its_files() -> None:
    # A folder every user may pass through: each tenant runs as a user of its own.
    base = Path(tempfile.mkdtemp(prefix="coordex-landlock-", dir="/var/tmp"))
    os.chmod(base, 0o755)
    try:
        _a_cannot_lock_b_out(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _a_cannot_lock_b_out(open_tmp: Path) -> None:
    home = open_tmp / "home"
    with landlock_server(open_tmp, f"{ATTACKER} {ALICE}\nvictim {BOB}\n") as srv:
        srv.code(BOB, "echo mine > notes.txt", language="bash")
        victim = home / "tenants" / "victim"
        os.chmod(victim / "notes.txt", 0o644)
        folder_mode = os.stat(victim).st_mode & 0o777
        srv.code(ALICE, f"chmod 000 {victim}/notes.txt {victim}; "
                 f"touch -d @1 {victim}/notes.txt", language="bash")
        st = os.stat(victim / "notes.txt")
        assert (oct(st.st_mode & 0o777), oct(os.stat(victim).st_mode & 0o777)) == (
            "0o644", oct(folder_mode))
        assert st.st_mtime > 1
        assert srv.code(BOB, "cat notes.txt", language="bash")["stdout"] == "mine\n"


# -- the environments folder its builder alone writes (SPEC 9: read-only to the host) ----

# The host's code clears the read-only attribute of the mounts in its own view
# (mount_setattr has no Landlock hook) and writes into its environments folder; where
# that folder lies under /tmp or the tenant's folder, Landlock allows the write there
# and the read-only mount was all that held it. It reports what it got.
REMOUNT = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
env = {env!r}
attr = (ctypes.c_uint64 * 4)(0, 1, 0, 0)  # clear MOUNT_ATTR_RDONLY
cleared = libc.syscall(442, -100, env.encode(), 0x8000, ctypes.byref(attr), 32)
try:
    with open(os.path.join(env, 'planted.pth'), 'w') as f:
        f.write('import os')
    wrote = True
except OSError:
    wrote = False
(cleared, wrote)
"""


def _remount_attack(srv: Server) -> None:
    env = srv.home / "environments" / "tenants" / ATTACKER
    found = srv.code(ALICE, REMOUNT.format(env=str(env)))
    assert found.get("result") == "(-1, False)", found
    assert not (env / "planted.pth").exists()
    assert srv.code(BOB, "1 + 1")["result"] == "2"


def test_the_host_cannot_make_its_environments_folder_writable(server: Server) -> None:
    _remount_attack(server)


def test_as_nobody_the_host_cannot_make_its_environments_folder_writable(
        nobody_server: Server) -> None:
    _remount_attack(nobody_server)


# The host's code finds its own end of the builder channel (the BuilderClient) and asks
# for build_spec, the call a cluster node's builds use: another spec, built into the
# folder of an environment the tenant created but has not built yet.
FORGE_BUILD = """
import gc
client = next(o for o in gc.get_objects() if type(o).__name__ == 'BuilderClient')
client.call('build_spec', {{'spec_text': {spec!r}, 'spec_hash': {spec_hash!r}, 'label': 'x'}})
"""


@pytest.mark.slow
def test_a_forged_build_spec_cannot_fill_another_environments_folder(server: Server) -> None:
    from tests.fakes.wheels import build_wheel, ledgerlib_wheel, requirement

    wheels = server.home / "tenants" / ATTACKER / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    spec = requirement("ledgerlib", ledgerlib_wheel(wheels, "1.0"))
    planted = requirement("ledgerlib", build_wheel(
        wheels / "planted", "ledgerlib", "1.0", {"ledgerlib/__init__.py": "VERSION = 'planted'\n"}))
    made = server.run(ALICE, ("create_environment", {"spec": spec}))[0]
    assert made.get("built") is False, made
    forged = server.code(ALICE, FORGE_BUILD.format(spec=planted, spec_hash=made["spec_hash"]))
    assert forged.get("is_error") is False, forged
    used = server.code(ALICE, "import ledgerlib; ledgerlib.VERSION", venv_id=made["venv_id"])
    assert used.get("result") == "'1.0'", used


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("mount"),
                    reason="needs root to make a mount of its own")
def test_in_the_landlock_level_a_cannot_change_the_machines_mounts(tmp_path: Path) -> None:
    # Without namespaces a host of a root server ran as root with every capability, and
    # mount_setattr (which Landlock does not see) takes any path: a tenant could make
    # every mount of the machine read-only or noexec, B's and the server's among them.
    # A tmpfs of the test's own stands for them.
    machine = tmp_path / "mnt"
    machine.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(machine)], check=True)
    try:
        with landlock_server(tmp_path, f"{ATTACKER} {ALICE}\nvictim {BOB}\n") as srv:
            found = srv.code(ALICE, (
                "import ctypes\n"
                "libc = ctypes.CDLL(None, use_errno=True)\n"
                "attr = (ctypes.c_uint64 * 4)(1, 0, 0, 0)  # set MOUNT_ATTR_RDONLY\n"
                f"libc.syscall(442, -100, {str(machine).encode()!r}, 0x8000, "
                "ctypes.byref(attr), 32)"))
            assert found.get("result") == "-1", found
            (machine / "still-writable").write_text("yes")
            assert srv.code(BOB, "1 + 1")["result"] == "2"
    finally:
        subprocess.run(["umount", "-l", str(machine)], check=False)


def _another_python() -> dict[str, str] | None:
    """A Python of another minor version on this machine: its executable, version and
    standard library (a tenant can copy one into its folder, or install one with uv)."""
    import json
    import sys

    home = os.path.expanduser("~")
    candidates = sorted({*glob.glob("/usr/bin/python3.*"), *glob.glob("/usr/local/bin/python3.*"),
                         *glob.glob(f"{home}/.pyenv/versions/*/bin/python3.*"),
                         *glob.glob(f"{home}/.local/share/uv/python/*/bin/python3.*")})
    for path in candidates:
        if path.endswith("-config") or not os.access(path, os.X_OK):
            continue
        try:
            done = subprocess.run([path, "-I", "-c", (
                "import json, platform, sys, sysconfig; print(json.dumps({'version': "
                "platform.python_version(), 'stdlib': sysconfig.get_paths()['stdlib']}))")],
                capture_output=True, text=True, timeout=10)
            found = json.loads(done.stdout)
        except (OSError, ValueError, subprocess.SubprocessError):
            continue
        if found["version"].split(".")[:2] != [str(n) for n in sys.version_info[:2]]:
            return {"executable": path, **found}
    return None


@pytest.mark.slow
def test_a_python_the_tenant_plants_in_its_home_is_not_built_on(server: Server) -> None:
    # The builder's HOME was the tenant's folder: for a requires-python the server's own
    # Python does not meet, uv found a "managed" Python the tenant had put under
    # ~/.local/share/uv/python, and the environment ran on it. Its standard library stayed
    # the tenant's to write: a sitecustomize.py written after the build ran in every
    # worker of the environment.
    import platform

    other = _another_python()
    if other is None:
        pytest.skip("needs a Python of another minor version on this machine")
    minor = ".".join(other["version"].split(".")[:2])
    prefix = (f"~/.local/share/uv/python/cpython-{other['version']}-linux-"
              f"{platform.machine()}-gnu")
    planted = server.code(ALICE, (
        f"P={prefix}; L=$P/lib/$(basename {other['stdlib']})\n"
        f"mkdir -p $P/bin $L && cp {other['executable']} $P/bin/python{minor}\n"
        f"for e in {other['stdlib']}/*; do ln -sf $e $L/; done\n"
        f"$P/bin/python{minor} -c 'import sys; print(sys.prefix)'"), language="bash")
    if not planted.get("stdout", "").strip().endswith(prefix.split("/")[-1]):
        pytest.skip(f"that Python does not run from a copy: {planted}")
    spec = f'# /// script\n# requires-python = "=={minor}.*"\n# dependencies = []\n# ///\n'
    made = server.run(ALICE, ("create_environment", {"spec": spec, "build": True}))[0]
    server.code(ALICE, (f"echo \"import os; os.environ['PLANTED'] = 'yes'\" > "
                        f"{prefix}/lib/$(basename {other['stdlib']})/sitecustomize.py"),
                language="bash")
    if made.get("venv_id") is None:
        # Refused is right only when no Python but the tenant's matched; anything else
        # (a uv failure) shows nothing either way.
        if "requires-python" not in str(made.get("error", "")):
            pytest.skip(f"the build failed for another reason: {made}")
        assert made["error_type"] == "environment", made
        return
    used = server.code(ALICE, "import os; os.environ.get('PLANTED')", venv_id=made["venv_id"])
    assert used.get("result") == "None", (made, used)


# A package's own code runs in a build (the import check imports it; an sdist's build
# backend runs under uv). Before, it ran with the builder's rights, which write every
# environment of the tenant: a package the tenant asked for later rewrote the module of
# an environment built before. Now each process of a build writes only its own folder.
@pytest.mark.slow
def test_a_later_build_cannot_change_an_environment_built_before(server: Server) -> None:
    _a_later_build_rewrites_an_earlier_one(server)


@pytest.mark.slow
def test_in_the_landlock_level_a_later_build_cannot_change_an_earlier_one(
        tmp_path: Path) -> None:
    with landlock_server(tmp_path, f"{ATTACKER} {ALICE}\n") as srv:
        _a_later_build_rewrites_an_earlier_one(srv)


def _a_later_build_rewrites_an_earlier_one(server: Server) -> None:
    from tests.fakes.wheels import build_wheel, ledgerlib_wheel, requirement

    wheels = server.home / "tenants" / ATTACKER / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    first = server.run(ALICE, ("create_environment", {
        "spec": requirement("ledgerlib", ledgerlib_wheel(wheels, "2.0")), "build": True}))[0]
    assert first.get("built") is True, first
    module = f"{first['path']}/lib/python*/site-packages/ledgerlib/__init__.py"
    rewrite = build_wheel(wheels / "rewrite", "rewrite", "1.0", {"rewrite/__init__.py": (
        "import glob\n"
        f"for path in glob.glob({module!r}):\n"
        "    with open(path, 'a') as f:\n"
        "        f.write(\"\\nVERSION = 'planted'\\n\")\n")})
    server.run(ALICE, ("create_environment", {"spec": requirement("rewrite", rewrite),
                                              "build": True}))
    used = server.code(ALICE, "import ledgerlib; ledgerlib.VERSION", venv_id=first["venv_id"])
    assert used.get("result") == "'2.0'", used
