"""The confined host's wire and the router's start-up checks: pure, no processes."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from coordex import router
from coordex.hosting import wire
from coordex.hosting.jail import JailSpec, landlock_covers


def test_lines_are_ascii_and_checked() -> None:
    line = wire.encode(wire.message("call", id=1, method="execute_code",
                                    args={"code": "print('✓')"}))
    line.decode("ascii")
    assert wire.decode(line, wire.OWNER_TO_HOST)["args"]["code"] == "print('✓')"
    with pytest.raises(wire.ProtocolError, match="does not travel"):
        wire.decode(line, wire.HOST_TO_OWNER)
    with pytest.raises(wire.ProtocolError, match="is not one of"):
        wire.message("call", id=1, method="plan_namespace", args={})
    with pytest.raises(wire.ProtocolError, match="lacks field"):
        wire.message("reply", id=1)
    with pytest.raises(wire.ProtocolError, match="unknown field"):
        wire.message("cancel", id=1, now=True)
    with pytest.raises(wire.ProtocolError, match="not a JSON line"):
        wire.decode(b"\xff")


def test_a_line_reader_joins_chunks_and_ends_a_flood() -> None:
    # Lines split across reads come out whole and in order; a peer sending a line with
    # no end past the bound is a ProtocolError (its host is ended), not memory gone.
    lines = wire.LineReader(-1, max_line=16)
    assert lines.feed(b'{"a"') == []
    assert lines.feed(b': 1}\n{"b": 2}\n{"c"') == [b'{"a": 1}', b'{"b": 2}']
    assert lines.feed(b": 3}\n") == [b'{"c": 3}']
    assert lines.feed(b"x" * 16) == []
    with pytest.raises(wire.ProtocolError, match="longer than 16"):
        lines.feed(b"x")


def test_capability_and_plan_namespace_never_travel() -> None:
    assert "capability" not in wire.METHODS and "plan_namespace" not in wire.METHODS


def test_short_tokens_are_named() -> None:
    assert router.short_tokens({"alice": "a" * 16}) is None
    problem = router.short_tokens({"alice": "a" * 16, "bob": "short", "": "x"})
    assert problem is not None
    assert "'bob'" in problem and "'COORDEX_TOKEN'" in problem and "'alice'" not in problem


def test_several_tenants_without_confinement_are_refused_unless_allowed() -> None:
    assert router.confinement_refusal("none", 2, allow_unconfined=False) is not None
    assert router.confinement_refusal("none", 2, allow_unconfined=True) is None
    assert router.confinement_refusal("none", 1, allow_unconfined=False) is None
    assert router.confinement_refusal("landlock", 5, allow_unconfined=False) is None


def test_the_public_bind_warning() -> None:
    assert router.startup_warnings("0.0.0.0", [], is_loopback=False)
    assert not router.startup_warnings("0.0.0.0", ["example.org"], is_loopback=False)
    assert not router.startup_warnings("127.0.0.1", [], is_loopback=True)


@pytest.mark.parametrize(("text", "size"), [("512M", 512 << 20), ("4G", 4 << 30),
                                            ("1.5GiB", 3 << 29), ("100000000", 100000000)])
def test_memory_sizes(text: str, size: int) -> None:
    parser = argparse.ArgumentParser()
    router.add_confinement_options(parser, tenants=True)
    assert parser.parse_args(["--memory-limit", text]).memory_limit == size


def test_landlock_cannot_hide_what_lies_under_an_allowed_folder() -> None:
    assert landlock_covers(JailSpec(folder="/srv/t/a", hidden=("/srv/secret",)))
    # /etc is not allowed whole any more: a tokens file there stays out of reach.
    assert landlock_covers(JailSpec(folder="/srv/t/a", hidden=("/etc/coordex-tokens",)))
    assert not landlock_covers(JailSpec(folder="/srv/t/a", hidden=("/usr/share/coordex",)))


def test_the_view_holds_the_allow_list_and_never_a_hidden_path(tmp_path: Path) -> None:
    from coordex.hosting.view import plan

    for sub in ("venv/lib", "tenant/pkg", "root/tenants/a", "other", "data"):
        (tmp_path / sub).mkdir(parents=True)
    (tmp_path / "venv" / "python").symlink_to("/usr/bin/env")
    (tmp_path / "link").symlink_to("data")
    view = plan(readable=[str(tmp_path / "venv"), str(tmp_path / "venv" / "lib"),
                          str(tmp_path / "root"), str(tmp_path / "link"),
                          str(tmp_path / "missing")],
                writable=[str(tmp_path / "root" / "tenants" / "a")],
                hidden=[str(tmp_path / "root")])
    real = str(tmp_path.resolve())
    bound = {b.path: b.writable for b in view.binds}
    assert bound[real + "/venv"] is False and real + "/venv/lib" not in bound  # seen through
    assert real + "/data" in bound and (real + "/link", "data") in view.links
    # The server's root is never bound, nor anything in it but the tenant's own folder.
    assert [p for p in bound if p.startswith(real + "/root")] == [real + "/root/tenants/a"]
    assert bound[real + "/root/tenants/a"] is True
    assert real + "/other" not in bound and real + "/missing" not in bound
    assert bound["/usr"] is False and "/etc/shadow" not in bound and "/root" not in bound
    assert all(not p.startswith("/etc/") or p[5:].split("/")[0] in {
        n.split("/")[0] for n in ETC} or p.startswith("/etc/alternatives") for p in bound)


ETC = ("nsswitch.conf", "hosts", "host.conf", "resolv.conf", "gai.conf", "services", "protocols",
       "ssl", "ca-certificates", "ca-certificates.conf", "pki", "localtime", "timezone",
       "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "os-release", "mime.types",
       "bash.bashrc", "profile", "inputrc", "gitconfig", "environment", "locale.alias",
       "locale.gen")


def _filtered(probe: Callable[[], list[object]], **options: bool) -> list[object]:
    """What ``probe`` finds in a forked child under the jail's seccomp filter."""
    import json

    from coordex.backends.isolation import _PR_SET_NO_NEW_PRIVS, _libc
    from coordex.hosting.jail import keep_to_own_processes

    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the forked child reports through the pipe
        code = 70
        try:
            _libc().prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
            keep_to_own_processes(**options)
            os.write(write, json.dumps(probe()).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    answer = os.read(read, 400).decode()
    os.close(read)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0, answer
    found: list[object] = json.loads(answer)
    return found


def _errno_of(call: Callable[[], object]) -> object:
    try:
        call()
        return "done"
    except OSError as exc:
        return exc.errno


def test_the_landlock_levels_filter_refuses_what_has_no_namespace_there() -> None:
    """shared_ipc: System V, keyrings and inotify; no_inet: IPv4/IPv6 sockets; io_uring
    always. Unix sockets and the process's own calls still work."""
    import ctypes
    import socket

    def probe() -> list[object]:
        libc = ctypes.CDLL(None, use_errno=True)
        found: list[object] = [
            call() == -1 and ctypes.get_errno() == 1
            for call in (lambda: libc.shmget(0, 4096, 0o1600),
                         lambda: libc.syscall(248, b"user", b"k", b"v", 1, -4),
                         lambda: libc.syscall(425, 8, None))]
        found.append(_errno_of(lambda: socket.socket(socket.AF_INET)))
        found.append(len(socket.socketpair()))
        return found

    assert _filtered(probe, shared_ipc=True, no_inet=True) == [True, True, True, 1, 2]


def test_the_seccomp_filter_keeps_a_process_to_itself() -> None:
    import resource
    import subprocess

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])

    def probe() -> list[object]:
        found = [_errno_of(call) for call in (
            lambda: os.setpriority(os.PRIO_PROCESS, other.pid, 5),
            lambda: resource.prlimit(other.pid, resource.RLIMIT_CORE, (0, 0)),
            lambda: os.sched_setaffinity(other.pid, {0}),
            lambda: os.setpriority(os.PRIO_USER, 0, 5))]
        os.nice(1)  # its own: still allowed
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.sched_setaffinity(0, os.sched_getaffinity(0))
        return found

    niceness = os.getpriority(os.PRIO_PROCESS, other.pid)  # the suite's own, under nice
    try:
        assert _filtered(probe) == [1, 1, 1, 1]
        assert os.getpriority(os.PRIO_PROCESS, other.pid) == niceness
    finally:
        other.kill()
        other.wait()


def _public(obj: type) -> set[str]:
    return {n for n in dir(obj) if not n.startswith("_")}


def test_a_confined_executor_offers_every_method_of_the_executor() -> None:
    """One contract: what the Executor offers, the confined executor offers over the
    wire, but the objects that cannot leave the host's process (hosting.contract)."""
    from coordex import ConfinedExecutor, Executor
    from coordex.executor import Environments
    from coordex.hosting.client import _offered
    from coordex.hosting.contract import FUNCTIONS_IN_PROCESS_ONLY, IN_PROCESS_ONLY, ExecutorLike
    from coordex.library.functions import FunctionLibrary

    wanted = _public(Executor) - set(IN_PROCESS_ONLY)
    # environments and functions are namespaces the confined executor makes per instance.
    assert wanted - _public(ConfinedExecutor) == {"environments", "functions"}
    assert wanted - _public(ExecutorLike) - {"environments", "functions"} == set()
    assert _public(Environments) - {"manager"} <= set(_offered("environments")), \
        _public(Environments) - set(_offered("environments"))
    functions = _public(FunctionLibrary) - set(FUNCTIONS_IN_PROCESS_ONLY) - {"close"}
    assert functions <= set(_offered("functions")), functions - set(_offered("functions"))
    for method in wire.METHODS:  # and nothing the Executor lacks
        owner, _, name = method.rpartition(".")
        holder = {"": Executor, "environments": Environments, "functions": FunctionLibrary}
        assert hasattr(holder[owner], name), method


def test_a_readable_folder_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    from coordex import ConfinedExecutor

    with pytest.raises(ValueError, match=r"no such file or folder: .*wheelhous"):
        ConfinedExecutor(tmp_path / "t", readable=[tmp_path / "wheelhous"], lazy=True)


def test_a_malformed_tenant_id_range_is_refused() -> None:
    from coordex.hosting.identity import DEFAULT_RANGE, id_range, tenant_user

    assert id_range("") == DEFAULT_RANGE and id_range("2000000-3000000") == (2000000, 3000000)
    for bad in ("10-20", "x-y", "5000000-4000000"):
        with pytest.raises(ValueError, match="COORDEX_TENANT_IDS"):
            id_range(bad)
    one = tenant_user("/srv/t/alice", "alice", ids=(2000000, 3000000), euid=0)
    assert one is not None and 2000000 <= one[0] < 3000000 and one[2] == "alice"
    assert tenant_user("/srv/t/alice", "alice", ids=(2000000, 3000000), euid=0) == one
    assert tenant_user("/srv/t/bob", "bob", ids=(2000000, 3000000), euid=0) != one
    assert tenant_user("/srv/t/alice", "alice", euid=1000) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="an unprivileged server's tenants keep its user")
def test_tenants_that_would_share_a_user_are_named_at_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COORDEX_TENANT_IDS", "2000000-2000001")  # one id for everyone
    said = router.shared_users(tmp_path, {"alice": "a" * 16, "bob": "b" * 16})
    assert len(said) == 1 and "alice" in said[0] and "bob" in said[0], said
    assert "COORDEX_TENANT_IDS" in said[0]
    monkeypatch.delenv("COORDEX_TENANT_IDS")
    assert router.shared_users(tmp_path, {"alice": "a" * 16, "bob": "b" * 16}) == []
