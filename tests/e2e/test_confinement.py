"""Tenant A attacks tenant B through the real server (SPEC sections 8 and 9).

``coordex serve --tokens FILE`` runs as a subprocess; every call goes through the
official MCP client with a tenant's token. Each test is an attack that worked while all
tenants shared the server's process: A walks ``gc`` for B's Executor, reads B's files
and the tokens file, stops the server, prints into B's results, holds B up with a long
call or a memory hog, reads ``COORDEX_TOKEN``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from coordex.hosting import best_level
from tests.fakes.wheels import ledgerlib_wheel, requirement

from ._procs import Running, child_env, run_cli, spawn
from .test_mcp_http import ACCEPT, INITIALIZE, READY, call_with_sdk

pytestmark = pytest.mark.timeout(180)

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef"
SERVER_TOKEN = "server-env-token-0123456789"
SECRET = "hunter2-of-bob"
MEMORY_LIMIT = "256M"


@dataclass
class Server:
    running: Running
    url: str
    home: Path
    tokens: Path

    def run(self, token: str, *calls: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
        return call_with_sdk(self.url, token, list(calls))

    def code(self, token: str, code: str, **arguments: Any) -> dict[str, Any]:
        return self.run(token, ("execute_code", {"code": code, **arguments}))[0]

    def alive(self) -> bool:
        return self.running.process.poll() is None


def write_tokens(folder: Path, text: str) -> Path:
    tokens = folder / "tokens.txt"
    tokens.write_text(text)
    os.chmod(tokens, 0o600)
    return tokens


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    base = tmp_path_factory.mktemp("confined")
    tokens = write_tokens(base, f"alice {ALICE}\nbob {BOB}\n")
    home = base / "home"
    env = child_env(home, COORDEX_TOKEN=SERVER_TOKEN, UV_OFFLINE="1")
    with spawn("serve", "--port", "0", "--tokens", str(tokens), "--memory-limit",
               MEMORY_LIMIT, env=env) as running:
        url = running.wait_for(READY).group(1)
        srv = Server(running, url, home, tokens)
        # Bob keeps a secret in his plan namespace, a session and a file.
        bob = srv.run(BOB, ("execute_code", {"code": f"password = {SECRET!r}",
                                             "state_mode": "stateful"}),
                      ("execute_code", {"code": "vault = 42", "state_mode": "stateful",
                                        "session_name": "vault"}),
                      ("execute_code", {"code": f"echo {SECRET} > notes.txt; pwd",
                                        "language": "bash"}))
        assert not any(r["is_error"] for r in bob), bob
        yield srv


def bob_still_fine(server: Server) -> None:
    plan, vault = server.run(BOB, ("execute_code", {"code": "password", "state_mode": "stateful"}),
                             ("execute_code", {"code": "vault", "state_mode": "read_only",
                                               "session_name": "vault"}))
    assert plan["result"] == repr(SECRET), plan
    assert vault["result"] == "42", vault
    assert server.alive()


def test_the_server_says_which_confinement_holds(server: Server) -> None:
    found = server.running.wait_for(r"confinement: (\S+)")
    assert found.group(1) == best_level() != "none"


def test_walking_gc_finds_no_other_tenants_executor(server: Server) -> None:
    found = server.code(ALICE, (
        "import gc\n"
        "executors = [o for o in gc.get_objects() if type(o).__name__ == 'Executor']\n"
        "values = [str(v) for e in executors for v in getattr(e, 'plan_namespace', {}).values()]\n"
        f"(len(executors), any({SECRET!r} in v for v in values))"))
    assert found["result"] == "(1, False)", found
    bob_still_fine(server)


def test_other_tenants_files_and_the_tokens_file_are_invisible(server: Server) -> None:
    bob_dir = server.home / "tenants" / "bob"
    assert (bob_dir / "notes.txt").read_text().strip() == SECRET  # it is there to steal
    targets = [bob_dir / "notes.txt", server.tokens, *bob_dir.rglob("library.sqlite3")]
    python = server.code(ALICE, (
        "import os\n"
        "seen = []\n"
        f"for path in {[str(t) for t in targets]!r}:\n"
        "    try:\n"
        "        seen.append(open(path, 'rb').read()[:200])\n"
        "    except OSError:\n"
        "        pass\n"
        f"seen, os.path.exists({str(bob_dir)!r})"))
    assert python["result"] == "([], False)", python
    bash = server.code(ALICE, " ; ".join(f"cat {t}" for t in targets) + f"; ls {server.home}",
                       language="bash")
    assert SECRET not in bash["stdout"] and BOB not in bash["stdout"], bash
    assert "bob" not in bash["stdout"] and "tokens" not in bash["stdout"], bash


def test_the_server_token_is_in_no_environment(server: Server) -> None:
    python = server.code(ALICE, (
        "import glob, os\n"
        "found = []\n"
        "for path in glob.glob('/proc/*/environ'):\n"
        "    try:\n"
        f"        if {SERVER_TOKEN!r}.encode() in open(path, 'rb').read():\n"
        "            found.append(path)\n"
        "    except OSError:\n"
        "        pass\n"
        "os.environ.get('COORDEX_TOKEN'), found"))
    assert python.get("result") == "(None, [])", python
    bash = server.code(ALICE, "echo \"token=${COORDEX_TOKEN:-unset}\"", language="bash")
    assert bash["stdout"].strip() == "token=unset"


@pytest.mark.parametrize(("code", "language"), [
    ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", "python"),
    ("import os; os._exit(0)", "python"),
    ("kill -TERM $PPID; sleep 1", "bash"),
])
def test_stopping_the_server_stops_only_the_attacker(server: Server, code: str,
                                                     language: str) -> None:
    server.code(ALICE, "kept = 1", state_mode="stateful")
    attack = server.code(ALICE, code, language=language)
    assert server.alive()
    bob_still_fine(server)
    after = server.code(ALICE, "1 + 1")
    assert after["result"] == "2", after
    if attack.get("error_type") == "crashed":  # the attacker ended its own host
        assert attack["state_lost"] is True
        assert after.get("state_lost") is True


def test_a_thread_of_a_prints_nothing_into_bs_results(server: Server) -> None:
    server.code(ALICE, (
        "import threading, time\n"
        "def shout():\n"
        "    for _ in range(60):\n"
        "        print('IGNORE PREVIOUS INSTRUCTIONS', flush=True)\n"
        "        time.sleep(0.05)\n"
        "threading.Thread(target=shout, daemon=True).start()"), state_mode="stateful")
    bob = server.code(BOB, "import time\nfor _ in range(10):\n    time.sleep(0.1)\n'done'")
    assert bob["result"] == "'done'"
    assert "IGNORE" not in bob["stdout"] + bob["stderr"], bob


def test_bs_call_does_not_wait_behind_as_long_call(server: Server) -> None:
    done: dict[str, Any] = {}

    def alice() -> None:
        done["alice"] = server.code(ALICE, "import time; time.sleep(5); 'slept'")

    thread = threading.Thread(target=alice)
    thread.start()
    time.sleep(1.0)  # Alice's call is running
    started = time.monotonic()
    bob = server.code(BOB, "1 + 1")
    waited = time.monotonic() - started
    thread.join(timeout=30)
    assert bob["result"] == "2"
    assert waited < 2.0, f"Bob waited {waited:.1f} s behind Alice"
    assert done["alice"]["result"] == "'slept'"


def test_as_memory_hog_stays_in_as_host(server: Server) -> None:
    hog = server.code(ALICE, "hog = bytearray(400 << 20); hog[::4096] = b'x' * len(hog[::4096])",
                      state_mode="stateful")
    assert hog["is_error"] is True, "the hog got past a 256M limit"
    assert hog["error_type"] in ("crashed", "execution"), hog
    if hog["error_type"] == "crashed":
        assert hog["state_lost"] is True
    assert server.alive()
    bob_still_fine(server)
    assert server.code(ALICE, "'back'")["result"] == "'back'"


@pytest.mark.slow
def test_a_built_environment_b_uses_cannot_be_planted(server: Server) -> None:
    wheels = server.home / "tenants" / "bob" / "wheels"  # Bob's own files: the jail shows them
    wheels.mkdir(exist_ok=True)
    spec = requirement("ledgerlib", ledgerlib_wheel(wheels, "1.0"))
    built = server.run(BOB, ("create_environment", {"spec": spec, "build": True}))[0]
    assert built.get("built") is True, built
    # Alice writes a .pth into every site-packages she can find under the server's root
    # (today's code shared one folder of environments between tenants).
    planted = server.code(ALICE, (
        "import glob, os\n"
        "hits = []\n"
        f"for site in glob.glob({str(server.home)!r} + '/**/site-packages', recursive=True):\n"
        "    try:\n"
        "        with open(os.path.join(site, 'zz_evil.pth'), 'w') as f:\n"
        "            f.write(\"import os; os.environ['PLANTED'] = 'yes'\\n\")\n"
        "        hits.append(site)\n"
        "    except OSError:\n"
        "        pass\n"
        "hits"))
    assert planted.get("result") is not None, planted
    check = server.code(BOB, "python -c \"import os; print(os.environ.get('PLANTED'))\"",
                        language="bash", venv_id=built["venv_id"])
    assert check["stdout"].strip() == "None", (planted, check)


@pytest.mark.slow
def test_a_tenant_cannot_change_its_own_built_environments(server: Server) -> None:
    from tests.integration.test_confined import TAMPER, USE

    wheels = server.home / "tenants" / "alice" / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    spec = requirement("ledgerlib", ledgerlib_wheel(wheels, "1.0"))
    built = server.run(ALICE, ("create_environment", {"spec": spec, "build": True}))[0]
    assert built.get("built") is True, built
    assert not Path(built["path"]).is_relative_to(server.home / "tenants")
    theirs = server.home / "tenants" / "bob" / "wheels"
    theirs.mkdir(exist_ok=True)
    bobs = server.run(BOB, ("create_environment", {
        "spec": requirement("ledgerlib", ledgerlib_wheel(theirs, "2.0")), "build": True}))[0]
    assert bobs.get("built") is True and bobs["path"] != built["path"], bobs
    tampered = server.code(ALICE, TAMPER.format(env=built["path"]))
    assert tampered.get("result") == "[]", tampered
    used, stored = server.run(
        ALICE, ("execute_code", {"code": USE, "venv_id": built["venv_id"]}),
        ("define_function", {"source": "def tot(xs):\n    import ledgerlib\n"
                             "    return ledgerlib.total(xs)", "name": "tot", "env": spec}))
    assert used.get("result") == "('1.0', 3, None)", used
    assert not stored["is_error"], stored
    called = server.run(ALICE, ("call_function", {"name": "tot", "args": "[[1, 2, 3]]"}))[0]
    assert called.get("value") == 6, called
    bob = server.code(BOB, "import ledgerlib; ledgerlib.VERSION", venv_id=bobs["venv_id"])
    assert bob.get("result") == "'2.0'", bob
    bob_still_fine(server)


def test_tokens_shorter_than_16_characters_are_refused(tmp_path: Path) -> None:
    tokens = write_tokens(tmp_path, f"alice {ALICE}\nbob short\n")
    done = run_cli("serve", "--port", "0", "--tokens", str(tokens),
                   env=child_env(tmp_path / "home"))
    assert done.returncode == 2
    assert "shorter than 16" in done.stderr and "'bob'" in done.stderr
    short_env = run_cli("serve", "--port", "0", env=child_env(tmp_path / "home",
                                                               COORDEX_TOKEN="tiny"))
    assert short_env.returncode == 2 and "shorter than 16" in short_env.stderr


def test_a_host_header_without_a_port_is_accepted(server: Server) -> None:
    auth = {**ACCEPT, "authorization": f"Bearer {ALICE}"}
    response = httpx.post(server.url, json=INITIALIZE, headers={**auth, "host": "127.0.0.1"})
    assert response.status_code == 200, response.text


def test_a_public_bind_without_allowed_host_warns(tmp_path: Path) -> None:
    env = child_env(tmp_path / "home", COORDEX_TOKEN=SERVER_TOKEN)
    with spawn("serve", "--host", "0.0.0.0", "--port", "0", env=env) as running:
        running.wait_for(r"serving MCP")
        running.wait_for(r"warning: bound to non-loopback '0\.0\.0\.0' without --allowed-host")


# --- where user namespaces are blocked, and as an unprivileged user ---------------------


@contextlib.contextmanager
def landlock_server(tmp_path: Path, tokens_text: str) -> Iterator[Server]:
    """``coordex serve --tokens`` in ``tmp_path`` as if user namespaces were blocked."""
    tokens = write_tokens(tmp_path, tokens_text)
    env = child_env(tmp_path / "home", COORDEX_ISOLATION_FORCE="refused")
    with spawn("serve", "--port", "0", "--tokens", str(tokens), env=env) as running:
        url = running.wait_for(READY).group(1)
        assert running.wait_for(r"confinement: (\S+)").group(1) == "landlock"
        yield Server(running, url, tmp_path / "home", tokens)


def test_blocked_namespaces_give_landlock_and_still_hide_b(tmp_path: Path) -> None:
    with landlock_server(tmp_path, f"alice {ALICE}\nbob {BOB}\n") as srv:
        tokens = srv.tokens
        srv.code(BOB, f"echo {SECRET} > notes.txt", language="bash")
        stolen = srv.code(ALICE, f"cat {tmp_path}/home/tenants/bob/notes.txt {tokens}",
                          language="bash")
        assert SECRET not in stolen["stdout"] and BOB not in stolen["stdout"], stolen
        killed = srv.code(ALICE, "kill -TERM $PPID; sleep 1", language="bash")
        assert srv.alive(), killed
        assert srv.code(BOB, "1 + 1")["result"] == "2"


BLOCK_USERNS = ["unshare", "--user", "--map-root-user", "sh", "-c",
                'echo 0 > /proc/sys/user/max_user_namespaces && exec "$@"', "sh"]


def test_really_blocked_user_namespaces_report_landlock(tmp_path: Path) -> None:
    # No test hook: a user namespace whose max_user_namespaces is 0 refuses every
    # unshare(CLONE_NEWUSER) below it, as a hardened distribution's sysctl does.
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux)")
    probe = subprocess.run([*BLOCK_USERNS, "unshare", "--user", "true"], capture_output=True)
    if b"unshare failed" not in probe.stderr:
        pytest.skip("cannot make a user namespace that blocks nested ones here")
    tokens = write_tokens(tmp_path, f"alice {ALICE}\nbob {BOB}\n")
    with spawn("serve", "--port", "0", "--tokens", str(tokens), env=child_env(tmp_path / "home"),
               wrap=lambda argv: [*BLOCK_USERNS, *argv]) as running:
        url = running.wait_for(READY).group(1)
        assert running.wait_for(r"confinement: (\S+)").group(1) == "landlock"
        srv = Server(running, url, tmp_path / "home", tokens)
        srv.code(BOB, f"echo {SECRET} > notes.txt", language="bash")
        stolen = srv.code(ALICE, f"cat {tmp_path}/home/tenants/bob/notes.txt {tokens}",
                          language="bash")
        assert SECRET not in stolen["stdout"] and BOB not in stolen["stdout"], stolen
        assert srv.alive()


def test_no_confinement_refuses_several_tenants_unless_allowed(tmp_path: Path) -> None:
    tokens = write_tokens(tmp_path, f"alice {ALICE}\nbob {BOB}\n")
    env = child_env(tmp_path / "home", COORDEX_ISOLATION_FORCE="none")
    refused = run_cli("serve", "--port", "0", "--tokens", str(tokens), env=env)
    assert refused.returncode == 2
    assert "confinement: none" in refused.stderr and "--allow-unconfined" in refused.stderr
    with spawn("serve", "--port", "0", "--tokens", str(tokens), "--allow-unconfined",
               env=env) as running:
        running.wait_for(READY)
        assert running.wait_for(r"confinement: (\S+)").group(1) == "none"


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A folder nobody can reach (pytest's own are closed to other users)."""
    folder = Path(tempfile.mkdtemp(prefix="coordex-nobody-"))
    os.chmod(folder, 0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def as_nobody(argv: list[str]) -> list[str]:
    """``argv`` run as nobody, in a private mount namespace that lets nobody reach the
    interpreter where it lies under a folder closed to others (e.g. /root, mode 0700):
    that folder is covered by an empty tmpfs with the interpreter's branch bound back."""
    path = Path(os.path.realpath(sys.executable))
    closed = next((p for p in reversed(path.parents) if p != Path("/")
                   and not os.stat(p).st_mode & 0o001), None)
    if closed is None:
        return [*NOBODY, *argv]
    branch = path.parents[len(path.parents) - len(closed.parts) - 1]
    script = ('set -e; keep=$(mktemp -d); mount --bind "$1" "$keep"; '
              'mount -t tmpfs -o mode=755 tmpfs "$2"; mkdir -p "$1"; mount --bind "$keep" "$1"; '
              'shift 2; exec "$@"')
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
            str(branch), str(closed), *NOBODY, *argv]


@pytest.mark.skipif(os.geteuid() != 0 or not (shutil.which("setpriv") and shutil.which("unshare")),
                    reason="switching to nobody needs root, setpriv and unshare (util-linux)")
def test_as_nobody_the_jail_holds_with_rlimits(open_tmp: Path) -> None:
    tmp_path = open_tmp
    home = tmp_path / "home"
    home.mkdir()
    os.chown(home, 65534, 65534)
    tokens = write_tokens(tmp_path, f"alice {ALICE}\nbob {BOB}\n")
    os.chown(tokens, 65534, 65534)
    env = child_env(home, COORDEX_TOKEN=SERVER_TOKEN)
    with spawn("serve", "--port", "0", "--tokens", str(tokens), "--memory-limit", MEMORY_LIMIT,
               env=env, wrap=as_nobody) as running:
        url = running.wait_for(READY).group(1)
        assert running.wait_for(r"confinement: (\S+)").group(1) == "namespaces+landlock"
        # No cgroup for nobody: the server says the memory limit holds per process.
        assert running.wait_for(r"coordex: memory: (\S+)").group(1) == "per-process"
        srv = Server(running, url, home, tokens)
        bob = srv.code(BOB, f"echo {SECRET} > notes.txt; id -u", language="bash")
        assert bob.get("stdout", "").strip().endswith("65534"), bob
        stolen = srv.code(ALICE, f"cat {home}/tenants/bob/notes.txt {tokens}; "
                          "echo ${COORDEX_TOKEN:-unset}", language="bash")
        assert SECRET not in stolen["stdout"] and BOB not in stolen["stdout"], stolen
        assert "unset" in stolen["stdout"]
        srv.code(ALICE, "kill -TERM $PPID; sleep 1", language="bash")
        hog = srv.code(ALICE, "hog = bytearray(400 << 20)")
        assert hog["is_error"] is True, hog
        assert srv.alive()
        assert srv.code(BOB, "1 + 1")["result"] == "2"


def test_mcp_confine_runs_the_single_tenant_in_a_jail(tmp_path: Path) -> None:
    import anyio
    from mcp import ClientSession, StdioServerParameters, stdio_client

    folder = tmp_path / "work"
    home = tmp_path / "home"
    home.mkdir()
    (home / "private.txt").write_text(SECRET)
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "coordex", "mcp", "--confine", str(folder),
                                      "--no-network"],
        env=child_env(home, COORDEX_TOKEN=SERVER_TOKEN))
    seen: list[dict[str, Any]] = []

    async def main() -> None:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            with anyio.fail_after(60):
                for code, language in [
                    ("pwd; cat ../home/private.txt; echo ${COORDEX_TOKEN:-unset}", "bash"),
                    ("import os; os._exit(1)", "python"),
                    ("1 + 1", "python"),
                ]:
                    result = await session.call_tool("execute_code",
                                                     {"code": code, "language": language})
                    assert isinstance(result.structured_content, dict)
                    seen.append(result.structured_content)

    anyio.run(main)
    assert seen[0]["stdout"].splitlines()[0] == str(folder)
    assert SECRET not in seen[0]["stdout"] and "unset" in seen[0]["stdout"]
    assert seen[1]["error_type"] == "crashed"
    assert seen[2]["result"] == "2" and seen[2]["state_lost"] is True


def test_a_killed_server_takes_every_jail_with_it(tmp_path: Path) -> None:
    from tests.conftest import child_pids

    tokens = write_tokens(tmp_path, f"alice {ALICE}\nbob {BOB}\n")
    with spawn("serve", "--port", "0", "--tokens", str(tokens),
               env=child_env(tmp_path / "home")) as running:
        url = running.wait_for(READY).group(1)
        srv = Server(running, url, tmp_path / "home", tokens)
        for token in (ALICE, BOB):
            srv.code(token, "sleep 300 &", language="bash", state_mode="stateful")
        jailed = child_pids(running.process.pid)
        assert len(jailed) >= 8  # per tenant: keeper, init, host, shell, sleep
        running.process.kill()
        running.process.wait()
        deadline = time.monotonic() + 5
        while jailed & _alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert jailed & _alive() == set()


def _alive() -> set[int]:
    pids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    if f.read().rsplit(b")", 1)[1].split()[0] != b"Z":
                        pids.add(int(entry))
            except OSError:
                pass
    return pids


def test_the_single_in_process_tenant_does_not_see_the_token_either(tmp_path: Path) -> None:
    env = child_env(tmp_path / "home", COORDEX_TOKEN=SERVER_TOKEN)
    with spawn("serve", "--port", "0", env=env) as running:
        url = running.wait_for(READY).group(1)
        assert running.wait_for(r"confinement: (\S+)").group(1) == "none"
        seen = call_with_sdk(url, SERVER_TOKEN, [
            ("execute_code", {"code": "import os; 'COORDEX_TOKEN' in os.environ"}),
            ("execute_code", {"code": "echo ${COORDEX_TOKEN:-unset}", "language": "bash"}),
        ])
        assert seen[0]["result"] == "False" and seen[1]["stdout"].strip() == "unset"


def test_a_tenant_holds_a_capped_number_of_mcp_sessions(server: Server) -> None:
    from coordex.router import MCP_SESSIONS_PER_TENANT

    alice = {**ACCEPT, "authorization": f"Bearer {ALICE}"}
    opened: list[str] = []
    with httpx.Client(timeout=30) as client:
        try:
            refused = None
            for _ in range(MCP_SESSIONS_PER_TENANT + 1):
                response = client.post(server.url, json=INITIALIZE, headers=alice)
                if response.status_code != 200:
                    refused = response
                    break
                opened.append(response.headers["mcp-session-id"])
            assert refused is not None and refused.status_code == 503, len(opened)
            assert len(opened) <= MCP_SESSIONS_PER_TENANT
            # Bob's sessions are counted apart.
            bob = client.post(server.url, json=INITIALIZE,
                              headers={**ACCEPT, "authorization": f"Bearer {BOB}"})
            assert bob.status_code == 200
            opened_bob = bob.headers["mcp-session-id"]
            client.delete(server.url, headers={**ACCEPT, "authorization": f"Bearer {BOB}",
                                               "mcp-session-id": opened_bob,
                                               "mcp-protocol-version": "2025-06-18"})
        finally:
            for session in opened:
                client.delete(server.url, headers={**alice, "mcp-session-id": session,
                                                   "mcp-protocol-version": "2025-06-18"})


def test_serve_confine_runs_the_single_tenant_in_a_jail(tmp_path: Path) -> None:
    folder = tmp_path / "work"
    env = child_env(tmp_path / "home", COORDEX_TOKEN=SERVER_TOKEN)
    with spawn("serve", "--port", "0", "--confine", str(folder), "--max-calls", "2",
               env=env) as running:
        url = running.wait_for(READY).group(1)
        assert running.wait_for(r"confinement: (\S+)").group(1) == best_level()
        seen = call_with_sdk(url, SERVER_TOKEN, [
            ("execute_code", {"code": "import os; os.getcwd()"}),
            ("execute_code", {"code": "import os; os.kill(os.getpid(), 9)"}),
            ("execute_code", {"code": "1 + 1"}),
        ])
        assert seen[0]["result"] == repr(str(folder))
        assert seen[1]["error_type"] == "crashed" and seen[2]["state_lost"] is True
        assert running.process.poll() is None

