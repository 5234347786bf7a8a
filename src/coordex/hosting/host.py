"""The confined host program: one Executor in a jail, served over a JSON-lines pipe.

Start it as ``python -m coordex.hosting.host --folder DIR --in R --out W
--lifeline L [limits...]`` (or call :func:`main` with that argv): ``R``/``W`` are the
descriptors of the protocol pipes (:mod:`.wire`), ``L`` the read end of a pipe the owner
holds open for as long as it wants the host to live. The process tree is the one
:mod:`.jail` describes: this process stays outside as the *keeper* (it ends the jail
when the lifeline closes and removes its cgroups), its child the *warden* (makes the
jail's namespaces and view and takes the tenant's user; it lives as long as init), whose
child is the pid namespace's *init* (reaps orphans), and the init's children are the
*builder* (with
``--environments``: the only process that may write the tenant's built environments; see
:mod:`.builder`) and the *host*, which runs the Executor and whose own interpreter runs
the tenant's code. The init ends the host when the builder ends, and everything else
when the host ends.

The Executor's modules are imported by the keeper, before any fork, so the processes
share those pages (a host costs little more than one interpreter).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import select
import signal
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..contract import ExecutorLike
from ..core.record import stop
from . import identity, jail, wire
from .jail import JailSpec, Level, LimitReport, Limits
from .wire import DEFAULT_MAX_CALLS, DEFAULT_MAX_PROCESSES

_PR_SET_CHILD_SUBREAPER = 36


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m coordex.hosting.host",
                                description="Run one coordex Executor in a jail.")
    p.add_argument("--folder", required=True, help="working folder and home (writable)")
    p.add_argument("--root", help="the Executor's data folder (default: the folder)")
    p.add_argument("--environments", help="folder of the built environments: read-only to "
                   "the host, written by the jail's builder process")
    p.add_argument("--records", help="folder of the host's call log and stored functions: "
                   "read-only to the host, written by its owner ('record' lines)")
    p.add_argument("--in", dest="fd_in", type=int, required=True, help="protocol fd, owner to host")
    p.add_argument("--out", dest="fd_out", type=int, required=True, help="protocol fd, host to owner")
    p.add_argument("--lifeline", type=int, help="fd whose end of file ends the host")
    p.add_argument("--memory-limit", type=int, default=4 << 30, help="bytes (0: none)")
    p.add_argument("--max-processes", type=int, default=DEFAULT_MAX_PROCESSES)
    p.add_argument("--max-calls", type=int, default=DEFAULT_MAX_CALLS)
    p.add_argument("--no-network", action="store_true", help="loopback only")
    p.add_argument("--hide", action="append", default=[], help="path made invisible")
    p.add_argument("--hide-fd", type=int, help="fd to read further paths made invisible from "
                   "(NUL-separated, to end of file): kept out of the command line, which the "
                   "jail's own processes can read")
    p.add_argument("--readable", action="append", default=[],
                   help="path the host must read (for the 'landlock' level)")
    p.add_argument("--level", choices=("auto", *jail.LEVELS), default="auto",
                   help="the strongest confinement to try (default: the best here)")
    p.add_argument("--name", default="host", help="name for the host's cgroups")
    p.add_argument("--user", help="UID:GID:NAME the jail runs as (a root server's tenant)")
    p.add_argument("--executor", default="{}", help="JSON object of Executor arguments")
    p.add_argument("--replaces-lost", action="store_true",
                   help="started again after the last host died: its first call of code "
                   "says state_lost")
    p.add_argument("--serve", choices=("executor", "node"), default="executor",
                   help="what runs in the jail: an Executor, or a cluster node's sessions of "
                   "one tenant (NodeHost)")
    p.add_argument("--relay", action="store_true",
                   help="the Executor's sessions live on a cluster reached through the owner "
                   "('node' lines)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # No controlling terminal for anything of the jail, however this was started (the
    # owner starts it in a new session already: then this is refused, and moot).
    with contextlib.suppress(OSError):
        os.setsid()
    folder = os.path.realpath(args.folder)
    root = os.path.realpath(args.root) if args.root else folder
    environments = os.path.realpath(args.environments) if args.environments else None
    records = os.path.realpath(args.records) if args.records else None
    for path in (folder, root, environments, records):
        if path is not None:
            os.makedirs(path, exist_ok=True)
    user = _parse_user(args.user)
    hidden = tuple(os.path.realpath(h) for h in [*args.hide, *_read_paths(args.hide_fd)])
    # Never a folder that is or holds a hidden one (the server started from its root).
    readable = tuple(p for p in args.readable if not any(
        jail.iso._within(h, os.path.realpath(p)) or jail.iso._within(os.path.realpath(p), h)
        for h in hidden))
    spec = JailSpec(folder=folder, writable=(root,) if root != folder else (),
                    hidden=hidden, readable=readable,
                    network=not args.no_network, tmpfs_size=args.memory_limit or None,
                    environments=environments, user=user, records=records)
    level = _level(args.level, spec)
    # Imported here, once, before the forks: the keeper, init, builder and host share
    # the pages.
    from .. import tools  # noqa: F401
    from ..executor import Executor  # noqa: F401

    if spec.environments is not None:
        from ..environments import manager  # noqa: F401
        from . import builder  # noqa: F401

    limits = jail.make_limits(Limits(memory=args.memory_limit or None,
                                     processes=args.max_processes or None, name=args.name))
    jail.join_cgroups(limits, os.getpid())  # the keeper too: everything forked inherits
    jail.apply_rlimits(limits)
    error = ""
    if level == "none":
        # Nothing holds: no jail, so no user of its own either (the server refuses
        # several tenants at this level unless told --allow-unconfined).
        user = None
        spec = dataclasses.replace(spec, user=None)
    if user is not None:
        identity.hand_over([p for p in (folder, root, environments) if p], user[0], user[1])
    scratch = None
    if level != "namespaces+landlock":
        # No private /tmp here: a scratch folder of its own, removed by the keeper.
        import tempfile

        scratch = tempfile.mkdtemp(prefix=f"coordex-{args.name}-")
        if user is not None:
            os.chown(scratch, user[0], user[1])
        _use_scratch(scratch)
    told_r, told_w = os.pipe()  # warden -> keeper: "my namespaces are made, map me"
    mapped_r, mapped_w = os.pipe()  # keeper -> warden: "mapped"
    warden = os.fork()
    if warden == 0:
        _close_quietly(args.lifeline)
        os.close(told_r)
        os.close(mapped_w)
        _exit_with(_warden, level, spec, args, root, limits, error, (told_w, mapped_r))
    for fd in (args.fd_in, args.fd_out, told_w, mapped_r):
        _close_quietly(fd)
    try:
        if user is not None and os.read(told_r, 1) == b"u":
            try:
                identity.map_writer(warden, user[0], user[1])()
                os.write(mapped_w, b"m")
            except OSError as exc:
                os.write(mapped_w, f"!{exc}".encode()[:200])
        os.close(told_r)
        os.close(mapped_w)
        return _keep(warden, args.lifeline)
    finally:
        if scratch is not None:
            import shutil

            shutil.rmtree(scratch, ignore_errors=True)
        jail.leave_cgroups(limits)


def _read_paths(fd: int | None) -> list[str]:
    """NUL-separated paths from ``fd``, read to its end; the fd is closed."""
    if fd is None:
        return []
    data = b""
    try:
        while chunk := os.read(fd, 1 << 16):
            data += chunk
    finally:
        _close_quietly(fd)
    return [os.fsdecode(p) for p in data.split(b"\0") if p]


def _parse_user(text: str | None) -> tuple[int, int, str] | None:
    if not text:
        return None
    uid, gid, name = text.split(":", 2)
    return int(uid), int(gid), name


def _warden(level: Level, spec: JailSpec, args: argparse.Namespace, root: str,
            limits: LimitReport, error: str, sync: tuple[int, int]) -> int:
    """The jail's maker: its namespaces and view, its user; then init, whose end is its
    own. It dies with the keeper, and init dies with it."""
    jail.die_with_parent()
    told, mapped = sync
    user = spec.user
    became = False
    if user is not None:
        os.setgroups([])  # root's groups are no tenant's (and no setgroups() inside)
    if level == "namespaces+landlock":
        def map_ids() -> None:
            os.write(told, b"u")
            answer = os.read(mapped, 200)
            if answer != b"m":
                raise OSError(1, f"identity map: {answer.decode(errors='replace') or 'no answer'}")

        try:
            jail.enter_namespaces(spec.network, map_ids if user is not None else None)
            opened = jail.open_view(spec)
            if user is not None:
                identity.become(user[0], user[1])
                became = True
            jail.build_view(spec, opened)
        except OSError as exc:  # e.g. blocked after the probe: say so, confine less
            error = f"namespaces: {exc}"
            level = "landlock" if jail.best_level() == "landlock" and jail.landlock_covers(
                spec) else "none"
    os.close(told)
    os.close(mapped)
    if level == "landlock" and not spec.network and os.geteuid() == 0:
        try:  # root needs no user namespace for an empty network namespace
            jail.empty_network()
            spec = dataclasses.replace(spec, own_network=True)
        except OSError as exc:  # then sockets are refused (jail.keep_to_own_processes)
            error = error or f"network namespace: {exc}"
    if user is not None and not became and level != "none":
        try:  # no view of its own here: the folders above its own may be closed to it
            from .view import reach

            reach([spec.folder, *spec.writable, *spec.readable,
                   *(p for p in (spec.environments, spec.records) if p)], user[0], user[1])
        except OSError as exc:
            error, level = f"reaching its folders: {exc}", "none"
        if level != "none":
            identity.become(user[0], user[1])
    jail.apply_process_rlimit(limits)  # inside the user namespace: this host's count
    init = os.fork()
    if init == 0:
        _exit_with(_init, level, spec, args, root, limits, error)
    for fd in (args.fd_in, args.fd_out):
        _close_quietly(fd)
    while True:
        try:
            _, status = os.waitpid(init, 0)
        except ChildProcessError:
            return 1
        except InterruptedError:
            continue
        code = os.waitstatus_to_exitcode(status)
        return code if code >= 0 else 128 - code


def _use_scratch(scratch: str) -> None:
    import tempfile

    for name in ("TMPDIR", "TMP", "TEMP"):
        os.environ[name] = scratch
    tempfile.tempdir = scratch  # mkdtemp cached the old one


def _level(wanted: str, spec: JailSpec) -> Level:
    """The level to try: ``wanted`` (the owner probed once for all its hosts), capped by
    ``COORDEX_ISOLATION_FORCE``; ``auto`` probes here."""
    order = jail.LEVELS
    best = jail.best_level() if wanted == "auto" else jail.forced_level()
    chosen = best if wanted == "auto" else order[max(order.index(best), order.index(wanted))]
    if chosen == "landlock" and not jail.landlock_covers(spec):
        return "none"
    return chosen


def _keep(init: int, lifeline: int | None) -> int:
    """The keeper: wait for the warden to end, or for the lifeline to close and end it
    (init, its child, dies with it; the kernel then ends the pid namespace)."""
    pidfd = os.pidfd_open(init)
    watched = [pidfd] + ([lifeline] if lifeline is not None else [])
    while True:
        ready, _, _ = select.select(watched, [], [])
        if pidfd in ready:
            break
        if lifeline in ready and not os.read(lifeline, 64):
            os.kill(init, signal.SIGKILL)  # the kernel then ends the whole pid namespace
            break
    _, status = os.waitpid(init, 0)
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


def _init(level: Level, spec: JailSpec, args: argparse.Namespace, root: str,
          limits: LimitReport, error: str) -> int:
    """pid 1 of the jail: start the builder, mount /proc, start the host, reap every
    orphan until the host ends."""
    jail.die_with_parent()
    if level != "namespaces+landlock":
        # No pid namespace: orphans of the host come here instead of to the system init.
        with contextlib.suppress(OSError):
            jail.iso._libc().prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    builder, channel = None, None
    if spec.environments is not None and level != "none":
        # Forked before this process seals its own view: the builder's view is made from
        # the unsealed one, with only the environments folder writable.
        channel, theirs = socket.socketpair()
        builder = os.fork()
        if builder == 0:
            jail.die_with_parent()
            channel.close()
            for fd in (args.fd_in, args.fd_out):
                _close_quietly(fd)
            _exit_with(_builder, level, spec, args, theirs)
        theirs.close()
    if level == "namespaces+landlock":
        try:
            jail.init_namespace(spec)
        except OSError as exc:
            error, level = f"/proc: {exc}", "none"
    host = os.fork()
    if host == 0:
        jail.die_with_parent()
        _exit_with(_host, level, spec, args, root, limits, error, channel)
    for fd in (args.fd_in, args.fd_out):
        _close_quietly(fd)
    if channel is not None:
        channel.close()
    # An init ignores signals it has no handler for; only the keeper's SIGKILL ends it.
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 1
        if pid == builder:  # builds are gone: end the host, so its owner starts both again
            builder = None
            with contextlib.suppress(OSError):
                os.kill(host, signal.SIGKILL)
        if pid == host:
            code = os.waitstatus_to_exitcode(status)
            if level != "namespaces+landlock":
                _end_children()
            return code if code >= 0 else 128 - code


def _end_children(within: float = 2.0) -> None:
    """Without a pid namespace: SIGKILL every child (the builder, orphans of the host)
    and reap them, and what reaches this subreaper meanwhile, for up to ``within`` s."""
    import time

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/self/task/{os.getpid()}/children") as f:
                pids = [int(p) for p in f.read().split()]
        except OSError:
            return
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        if not pids:
            return
        time.sleep(0.01)


def _exit_with(main: Callable[..., int], *args: Any) -> None:
    """Run a forked child's ``main`` and end the child with its code, whatever it
    raised: an exception must never unwind into the parent's stack in the copy."""
    code = 70
    try:
        code = main(*args)
    except BaseException:
        import traceback

        with contextlib.suppress(Exception):  # to the owner, who shows it as the reason
            traceback.print_exc()
            sys.stderr.flush()
    finally:
        os._exit(code)


def _builder(level: Level, spec: JailSpec, args: argparse.Namespace,
             sock: socket.socket) -> int:
    """The builder: the one process of the jail that may write the environments folder.

    Its view (namespaces) and its Landlock domain let it write only there; in a domain
    of its own, the host cannot signal, trace or read it.
    """
    import shutil

    assert spec.environments is not None
    refused = ""
    if level == "namespaces+landlock":
        try:  # the jail's view first: the folder's path names it there
            jail.seal_for_builder(spec)
        except OSError as exc:
            refused = f"{type(exc).__name__}: {exc}"
    os.chdir(spec.environments)
    # uv's cache and the builds' scratch space beside the environments, read-only to
    # the host like them: no file a build reads or a later build copies can be swapped.
    os.environ["UV_CACHE_DIR"] = os.path.join(spec.environments, "cache")
    # HOME too: uv looks for Pythons under ~/.local/share/uv/python, and one the tenant
    # put in its own folder would stay the tenant's to change (its standard library, a
    # sitecustomize) under every environment built on it.
    os.environ["HOME"] = spec.environments
    scratch = os.path.join(spec.environments, "tmp")
    shutil.rmtree(scratch, ignore_errors=True)  # a killed builder's leftovers
    os.makedirs(scratch, exist_ok=True)
    _use_scratch(scratch)
    try:
        if refused:
            raise OSError(refused)
        jail.restrict(level, jail.builder_spec(spec))
    except OSError as exc:
        refused = refused or f"{type(exc).__name__}: {exc}"
        with contextlib.suppress(OSError):  # refusing every request, with no power left
            jail.drop_capabilities()
    from pathlib import Path

    from ..environments.manager import EnvironmentManager
    from .builder import serve

    folder = Path(spec.environments)
    # Every process a build starts writes only that build's folder (and uv its cache):
    # a package's code cannot change the tenant's environments built before it.
    cache = os.environ["UV_CACHE_DIR"]
    with contextlib.suppress(OSError):  # a Landlock rule needs its folder to exist
        os.makedirs(cache, exist_ok=True)
    confine = jail.confine_build_step(cache, scratch)

    def manager() -> EnvironmentManager:  # made on the first request: an idle jail pays less
        timeout = float(json.loads(args.executor).get("build_timeout", 900.0))
        return EnvironmentManager(folder, build_timeout=timeout, confine_step=confine)

    return serve(sock, manager, refused)


def _host(level: Level, spec: JailSpec, args: argparse.Namespace, root: str,
          limits: LimitReport, error: str, channel: socket.socket | None) -> int:
    os.chdir(spec.folder)
    if level != "none":
        try:
            jail.restrict(level, spec)
        except OSError as exc:
            error, level = f"landlock: {exc}", "none"
            with contextlib.suppress(OSError):  # what confinement is left, best effort
                jail.drop_capabilities()
    from ..executor import Executor

    options = json.loads(args.executor)
    ready = {"protocol": wire.PROTOCOL_VERSION, "pid": os.getpid(), "confinement": level,
             # SPEC 9's words: what bounds the host's memory ("cgroup"), or that only each
             # process is bounded ("per-process": an rlimit), or nothing ("none").
             "memory": "per-process" if limits.memory == "rlimit" else limits.memory,
             "processes": limits.processes,
             # What holds: at level "none" nothing keeps the network from the host.
             "network": spec.network or level == "none",
             # Only a confined host is kept from writing what its builder builds.
             "builds": "builder" if channel is not None and level != "none" else "host"}
    out = _Writer(args.fd_out)
    relay = None
    records = None
    if spec.records is not None and args.serve != "node":
        from .records import HostRecords

        records = options["records"] = HostRecords(spec.records, out.send)
    try:
        if args.serve == "node":
            from ..backends.ray.node import NodeHost

            if spec.environments is not None:
                options["environments_manager"] = _environments(spec.environments, options,
                                                                channel)
            # --max-calls bounds the node's session calls, not only the wire's requests.
            # A NodeHost serves the node's methods by the same wire, not the contract's.
            executor: Any = NodeHost(**options, max_calls=max(1, args.max_calls))
        else:
            if args.relay:
                from .relay import RelayCluster

                relay = options["cluster"] = RelayCluster(out.send)
            if spec.environments is not None:
                options["environments_manager"] = _environments(spec.environments, options,
                                                                channel)
            executor = Executor(root=root, **options, replaces_lost=args.replaces_lost)
    except Exception as exc:
        out.send(wire.message("ready", **ready, error=f"{type(exc).__name__}: {exc}",
                              fatal=True))
        return 2
    if error:
        ready["error"] = error
    out.send(wire.message("ready", **ready))
    from ..worker._coordex_copy import hold

    # Read-only copies of its Python sessions close the wire, and the builder channel: a
    # read-only call changes no environment.
    hold(args.fd_in, args.fd_out, *([channel.fileno()] if channel is not None else []))
    unsaid = getattr(executor, "take_unsaid_loss", None)  # (a NodeHost keeps no sessions)
    return _Server(executor, args.fd_in, out, max(1, args.max_calls), relay, records,
                   unsaid).serve()


def _environments(folder: str, options: dict[str, Any], channel: socket.socket | None) -> Any:
    """The host's environment manager: its builds run in the builder (``channel``), or
    here where nothing confines the host anyway (level ``none``)."""
    from pathlib import Path

    from ..environments.manager import EnvironmentManager

    if channel is None:
        return EnvironmentManager(Path(folder), build_timeout=float(
            options.get("build_timeout", 900.0)))
    from .builder import BuilderClient

    return EnvironmentManager(Path(folder), builder=BuilderClient(channel))


def _close_quietly(fd: int | None) -> None:
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


class _Writer:
    """Whole lines to the owner, one at a time from any thread."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._lock = threading.Lock()

    def send(self, msg: dict[str, Any]) -> None:
        data = memoryview(wire.encode(msg))
        with self._lock:
            while data:
                data = data[os.write(self.fd, data):]


class _Server:
    """Reads calls, runs each on a pool of ``max_calls`` threads, writes replies."""

    def __init__(self, executor: ExecutorLike, fd_in: int, out: _Writer, max_calls: int,
                 relay: Any = None, records: Any = None,
                 unsaid_loss: Callable[[], bool] | None = None) -> None:
        self.executor = executor
        # A host started in place of a lost one: the first reply that can carry
        # ``state_lost`` says the loss (SPEC 9: "its next call ... returns state_lost:
        # true"); a call of code says it from its own record, any other method here.
        self.unsaid_loss = unsaid_loss
        self.relay = relay
        self.records = records
        self.fd_in = fd_in
        self.out = out
        self.pool = ThreadPoolExecutor(max_workers=max_calls, thread_name_prefix="coordex-call")
        self.cancels: dict[Any, threading.Event] = {}

    def serve(self) -> int:
        lines = wire.LineReader(self.fd_in)
        try:
            while True:
                chunk = os.read(self.fd_in, 1 << 16)
                if not chunk:
                    break
                for line in lines.feed(chunk):
                    msg = wire.decode(line, wire.OWNER_TO_HOST)
                    if msg["type"] == "shutdown":
                        return self._stop(0)
                    if msg["type"] == "node_reply":
                        if self.relay is not None:
                            self.relay.answer(msg["id"], msg["value"])
                        continue
                    if msg["type"] == "record_reply":
                        if self.records is not None:
                            self.records.answer(msg["id"], msg["value"])
                        continue
                    if msg["type"] == "cancel":
                        event = self.cancels.get(msg["id"])
                        if event is not None:
                            stop(event, "person" if msg.get("by") == "person" else "caller")
                        continue
                    self.cancels[msg["id"]] = threading.Event()
                    self.pool.submit(self._run, msg)
        except wire.ProtocolError as exc:
            print(f"coordex host: the owner broke the protocol: {exc}", file=sys.stderr)
            return self._stop(3)
        return self._stop(0)

    def _stop(self, code: int) -> int:
        if self.relay is not None:  # no node_reply can arrive any more: fail fast
            self.relay.detach()
        if self.records is not None:
            self.records.detach()
        with contextlib.suppress(Exception):
            self.executor.close()
        os._exit(code)  # call threads may still be blocked in user code

    def _run(self, msg: dict[str, Any]) -> None:
        call_id = msg["id"]
        cancel = self.cancels[call_id]
        on_output: Callable[[str, str], None] | None = None
        if msg.get("stream"):
            def on_output(stream: str, text: str) -> None:
                self.out.send({"type": "output", "id": call_id, "stream": stream, "text": text})
        from .records import serving_call

        try:
            with serving_call(call_id):
                value = invoke(self.executor, msg["method"], msg["args"], on_output, cancel)
            if (self.unsaid_loss is not None and msg.get("tells", True)
                    and isinstance(value, dict)
                    and "state_lost" not in value and "restored" not in value
                    and self.unsaid_loss()):
                value = {**value, "state_lost": True}
        except Exception as exc:  # a coordex bug still reaches the owner as data
            from ..core.errors import make_error

            value = make_error("crashed", f"coordex failed in the host: {type(exc).__name__}: "
                               f"{exc}", "Retry the call once; the session may be lost.",
                               state_lost=False)
        finally:
            self.cancels.pop(call_id, None)
        self.out.send({"type": "reply", "id": call_id, "value": value})


def invoke(executor: ExecutorLike, method: str, args: Any, on_output: Callable[[str, str], None] | None,
           cancel: threading.Event) -> Any:
    """Run one ``call`` against the Executor; bad arguments come back as error dicts."""
    from .. import tools
    from ..core.errors import make_error

    if not isinstance(args, dict):
        return make_error("validation", f"arguments must be an object, got {args!r:.80}.",
                          "Pass the method's arguments by name.")
    progress = None if on_output is None else (lambda line: on_output("build", line))
    try:
        if method == "execute_code":
            return executor.execute_code(**args, on_output=on_output, on_progress=progress,
                                         cancel=cancel)
        if method == "call_tool":
            from ..observe.hook import observing

            with observing(args) as handed_back:  # the trace context; builds, counted
                return handed_back(tools.call_tool(executor, args.get("name"),
                                                   args.get("arguments"),
                                                   on_output=on_output, cancel=cancel))
        if method == "environments.build":
            return executor.environments.build(**args, on_progress=progress)
        if method == "functions.define":  # a stored function is an object: its record travels
            from ..core.errors import CoordexError

            try:
                stored = executor.functions.define(**args)
            except CoordexError as exc:
                return exc.to_dict()
            if isinstance(stored, dict):  # coordex's storage failed: said, not raised
                return stored
            return executor.functions.show(stored.record.name, stored.record.version)
        owner_name, _, name = method.rpartition(".")
        owner = getattr(executor, owner_name) if owner_name else executor
        function = getattr(owner, name, None)
        if function is None:
            return make_error("not_found", f"This coordex has no {method!r}.",
                              "Upgrade coordex, or use the methods it lists in its docs.")
        return function(**args)
    except TypeError as exc:
        return make_error("validation", f"{method}: {exc}.",
                          "Pass only the arguments the method takes, by name.")


if __name__ == "__main__":
    sys.exit(main())
