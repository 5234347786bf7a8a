"""The owner's side of a confined host: :class:`ConfinedExecutor`.

It starts the host program (:mod:`.host`) with a clean environment, reads its ``ready``
line, and then offers the Executor's methods by sending each as one ``call`` line and
waiting for its ``reply``; ``output`` lines in between reach ``on_output``. One reader
thread per host dispatches what arrives; the calling threads only wait.

A host that dies (``os._exit`` in the tenant's code, a signal, the memory limit) fails
the calls in flight with ``crashed`` and ``state_lost: true``; the next call starts a new
host told that it replaces a lost one (``--replaces-lost``), whose first result of code
(``execute_code``, ``call_function``, success or error) says ``state_lost: true``,
rendered there as any result is: nothing here edits a result. Nothing else notices.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core import messages
from ..core.errors import make_error
from ..core.record import stopped_by
from ..observe.hook import observed
from . import wire
from .jail import best_level
from .wire import DEFAULT_MAX_CALLS, DEFAULT_MAX_PROCESSES

OnOutput = Callable[[str, str], None]
DEFAULT_MEMORY_LIMIT = 4 << 30
READY_TIMEOUT = 30.0
CANCEL_GRACE = 10.0  # seconds a cancelled call may take to answer before its host is ended
STUCK_GRACE = 30.0  # seconds past a call's timeout before its host counts as stuck
STOPPED_AFTER = 2.0  # seconds a call waits before the owner looks whether its host is stopped
_STDERR_TAIL = 4000
# Bytes of a reply the owner parses for the reads a page repeats (the sessions, one
# session, the log): a host's answer past that is refused unread (see _Host).
MAX_READ_REPLY = {"list_sessions": 16 << 20, "inspect_session": 16 << 20, "history": 64 << 20}
_PEEKED = 1 << 20  # lines shorter than this are parsed without a look at their head
_REPLY_HEAD = re.compile(rb'\{"type":"reply","id":(\d{1,18}),')
KEEPER_GRACE = 3.0  # seconds a keeper may take to end its jail and remove its cgroups
# The environment a host starts with: nothing of the owner's but these (no tokens).
# uv's index and offline settings and the proxies pass too: the jail's builder runs uv.
PASSED_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TERM", "COORDEX_ISOLATION_FORCE",
              "UV_OFFLINE", "UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_DEFAULT_INDEX", "UV_INDEX",
              "UV_FIND_LINKS", "UV_PYTHON_DOWNLOADS", "UV_SYSTEM_CERTS", "UV_NATIVE_TLS",
              "SSL_CERT_FILE", "SSL_CERT_DIR", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY",
              "NO_PROXY", "http_proxy", "https_proxy", "all_proxy", "no_proxy")
# Of those, the ones that may name a file or folder builds read: shown read-only in the
# jail's view (the operator set them for coordex's builds).
PATH_SETTINGS = ("SSL_CERT_FILE", "SSL_CERT_DIR", "UV_FIND_LINKS")


@dataclass
class _Pending:
    on_output: OnOutput | None
    done: threading.Event = field(default_factory=threading.Event)
    value: Any = None
    call: dict[str, Any] | None = None  # method and arguments, for the host's records
    max_reply: int | None = None  # bytes of the reply's line taken; a longer one is refused


class _Host:
    """One running host process: its pipes, its reader thread, its calls in flight."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str,
                 on_node: Callable[[dict[str, Any], Callable[[dict[str, Any]], None]], None]
                 | None = None, records: Any = None, hidden: Sequence[str] = ()) -> None:
        self._on_node = on_node
        self._records = records
        to_host_r, self._to_host = os.pipe()
        self._from_host, from_host_w = os.pipe()
        lifeline_r, self._lifeline = os.pipe()
        # What the host hides (the server's root, its tokens file) travels down a pipe,
        # not on its command line: the jail's pid 1 is a fork of the keeper, and its
        # command line is readable inside.
        hide_r, hide_w = os.pipe()
        with os.fdopen(hide_w, "wb") as pipe:
            pipe.write(b"".join(os.fsencode(h) + b"\0" for h in hidden)[:60_000])
        passed = (to_host_r, from_host_w, lifeline_r, hide_r)
        argv = [*argv, "--in", str(to_host_r), "--out", str(from_host_w),
                "--lifeline", str(lifeline_r), "--hide-fd", str(hide_r)]
        try:
            # A session of its own: the keeper and all it starts have no controlling
            # terminal, so no tenant can read or type into the server's (TIOCSTI), nor
            # get its signals (^C, SIGHUP) or send it any through the terminal.
            self.process = subprocess.Popen(
                argv, env=env, cwd=cwd, pass_fds=passed, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        except BaseException:
            for fd in (*passed, self._to_host, self._from_host, self._lifeline):
                os.close(fd)
            raise
        for fd in passed:
            os.close(fd)
        self._write_lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}
        self._pending_lock = threading.Lock()
        self._ids = itertools.count(1)
        self.alive = True
        self.ready: dict[str, Any] | None = None
        self._ready = threading.Event()
        self.stderr_tail = b""
        self._reader = threading.Thread(target=self._read, name="coordex-confined-reader",
                                        daemon=True)
        self._reader.start()

    # -- reading
    def _read(self) -> None:
        assert self.process.stderr is not None
        err_fd = self.process.stderr.fileno()
        selector = selectors.DefaultSelector()
        selector.register(self._from_host, selectors.EVENT_READ, "out")
        selector.register(err_fd, selectors.EVENT_READ, "err")
        lines = wire.LineReader(self._from_host, max_line=wire.MAX_LINE)
        open_streams = 2
        try:
            while open_streams:
                for key, _ in selector.select():
                    chunk = os.read(key.fd, 1 << 16)
                    if not chunk:
                        selector.unregister(key.fd)
                        open_streams -= 1
                        if key.data == "out":
                            self._lost()  # the host is gone (or closed its end)
                        continue
                    if key.data == "err":
                        self.stderr_tail = (self.stderr_tail + chunk)[-_STDERR_TAIL:]
                        continue
                    for line in lines.feed(chunk):
                        if len(line) > _PEEKED and self._refused_as_too_long(line):
                            continue
                        self._dispatch(wire.decode(line, wire.HOST_TO_OWNER))
        except Exception as exc:  # the tenant's code can write anything there: end the host
            self.stderr_tail += f"\n[owner] {exc}".encode()
            self.kill()
        finally:
            selector.close()
            self._lost()

    def _refused_as_too_long(self, line: bytes) -> bool:
        """A reply longer than its call takes (:attr:`_Pending.max_reply`): answered
        with a ``capacity`` error without being parsed. Parsing a tenant's tens of MB
        for every page request slowed every tenant of the server (one process, one
        GIL)."""
        found = _REPLY_HEAD.match(line[:80])
        if found is None:
            return False
        call_id = int(found.group(1))
        with self._pending_lock:
            pending = self._pending.get(call_id)
            if pending is None or pending.max_reply is None or len(line) <= pending.max_reply:
                return False
            self._pending.pop(call_id, None)
        pending.value = make_error(
            "capacity", f"The tenant's host answered with {len(line) >> 20} MiB, more than "
            f"{pending.max_reply >> 20} MiB this request may take.",
            "Close sessions you no longer need, or ask for less (history: a smaller limit).")
        pending.done.set()
        return True

    def _dispatch(self, msg: dict[str, Any]) -> None:
        kind = msg["type"]
        if kind == "node":  # the host's Executor asks for its tenant's cluster actors
            if self._on_node is not None:
                self._on_node(msg, self._send)
            return
        if kind == "ready":
            if self.ready is not None:  # once, before any call: the tenant's code could
                raise wire.ProtocolError("a second 'ready' line")  # rewrite what holds
            self.ready = msg
            self._ready.set()
            return
        if kind == "record":  # the host's records, which only this side writes
            call_id = msg.get("call")
            with self._pending_lock:
                pending = self._pending.get(call_id) if isinstance(call_id, int) else None
            value = (self._records.handle(msg["op"], msg["args"], call_id,
                                          pending.call if pending is not None else None)
                     if self._records is not None else {"error": "no records here"})
            self._send({"type": "record_reply", "id": msg["id"], "value": value})
            return
        with self._pending_lock:
            pending = self._pending.get(msg["id"])
        if pending is None:
            return
        if kind == "output":
            if pending.on_output is not None:
                with contextlib.suppress(Exception):  # a caller's bug must not stop the reader
                    pending.on_output(msg["stream"], msg["text"])
        elif kind == "reply":
            with self._pending_lock:
                self._pending.pop(msg["id"], None)
            pending.value = msg["value"]
            pending.done.set()

    def _lost(self) -> None:
        self.alive = False
        self._ready.set()
        with self._pending_lock:
            pending, self._pending = list(self._pending.values()), {}
        for call in pending:
            call.value = None
            call.done.set()

    # -- calling
    def wait_ready(self, timeout: float) -> dict[str, Any] | None:
        self._ready.wait(timeout)
        return self.ready

    def call(self, method: str, args: dict[str, Any], on_output: OnOutput | None,
             cancel: threading.Event | None, deadline: float | None = None,
             max_reply: int | None = None, tells: bool = True) -> Any:
        """The reply's value, or None when the host died (or was ended) first.

        ``deadline`` (seconds) bounds the wait: a host that has not answered by then is
        stuck beyond its own timeouts (code holding the GIL in C) and is ended.
        ``tells=False``: the reply reaches no model (an operator's figures, a front
        end's own request), so it never says a loss a model is yet to be told of.
        """
        call_id = next(self._ids)
        pending = _Pending(on_output, call={"method": method, "args": args, "at": time.time()},
                           max_reply=max_reply)
        if self._records is not None:
            self._records.sent_call()
        with self._pending_lock:
            if not self.alive:
                return None
            self._pending[call_id] = pending
        msg: dict[str, Any] = {"type": "call", "id": call_id, "method": method, "args": args}
        if not tells:
            msg["tells"] = False
        if on_output is not None:
            msg["stream"] = True
        try:
            self._send(msg)
        except OSError:
            self.kill()
            return None
        give_up = None if deadline is None else time.monotonic() + deadline
        look = time.monotonic() + STOPPED_AFTER
        while not pending.done.wait(0.05):
            if time.monotonic() > look:
                # A host its own code stopped (SIGSTOP) answers nothing, ever: ended
                # now, not at the call's deadline.
                look = time.monotonic() + 1.0
                if self.stopped():
                    self.kill()
                    pending.done.wait()
                    break
            if cancel is not None and cancel.is_set():
                with contextlib.suppress(OSError):  # who stopped it: the host words it
                    self._send({"type": "cancel", "id": call_id, "by": stopped_by(cancel)})
                give_up = time.monotonic() + CANCEL_GRACE
                cancel = None
            if give_up is not None and time.monotonic() > give_up:
                self.kill()
                pending.done.wait()
        if self._records is not None and pending.value is not None:
            self._records.mark_restored(pending.value)
        return pending.value

    def stopped(self) -> bool:
        """True when a process of the host program (keeper, warden, init, builder or
        the host itself: they share its command line) is stopped by a signal."""
        pids, seen = [self.process.pid], 0
        while pids and seen < 16:
            pid = pids.pop()
            seen += 1
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"coordex.hosting.host" not in f.read():
                        continue
                with open(f"/proc/{pid}/stat", "rb") as f:
                    if f.read().rpartition(b")")[2].split()[:1] == [b"T"]:
                        return True
                with open(f"/proc/{pid}/task/{pid}/children", "rb") as f:
                    pids += [int(child) for child in f.read().split()]
            except (OSError, ValueError):
                continue
        return False

    def _send(self, msg: dict[str, Any]) -> None:
        data = memoryview(wire.encode(msg))
        with self._write_lock:
            while data:
                data = data[os.write(self._to_host, data):]

    # -- ending
    def kill(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._lifeline)  # the keeper ends the jail
        self._lifeline = -1
        # The keeper then removes the host's cgroups and exits; a keeper killed first
        # leaves them behind for good, and a tenant that gets its host ended again and
        # again would use up the machine's cgroups. Only a keeper that lingers is killed.
        try:
            self.process.wait(KEEPER_GRACE)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                self.process.kill()

    def close(self, grace: float = 2.0) -> str:
        """shutdown line, then the lifeline (the keeper kills the jail), then SIGKILL."""
        step = "shutdown"
        with contextlib.suppress(OSError):
            self._send({"type": "shutdown"})
        try:
            self.process.wait(grace)
        except subprocess.TimeoutExpired:
            step = "lifeline"
            with contextlib.suppress(OSError):
                if self._lifeline >= 0:
                    os.close(self._lifeline)
            self._lifeline = -1
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                step = "kill"
                self.process.kill()
                self.process.wait()
        for fd in (self._to_host, self._lifeline):
            with contextlib.suppress(OSError):
                if fd >= 0:
                    os.close(fd)
        self._reader.join(timeout=5)
        with contextlib.suppress(OSError):
            os.close(self._from_host)
        if self.process.stderr is not None:
            self.process.stderr.close()
        return step


class _Namespace:
    """``ex.environments`` / ``ex.functions`` of a confined executor: calls by name."""

    def __init__(self, owner: ConfinedExecutor, prefix: str, names: Sequence[str]) -> None:
        self._owner, self._prefix, self._names = owner, prefix, tuple(names)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name not in self._names:
            raise AttributeError(f"{self._prefix}.{name} is not offered by a confined executor; "
                                 f"it offers {', '.join(self._names)}")
        return lambda **kwargs: self._owner._call(f"{self._prefix}.{name}", kwargs)


class ConfinedExecutor:
    """An :class:`~coordex.Executor` in a confined host process of its own (SPEC 9).

    Args:
        folder: the host's working folder and home; the only place it may write
            (besides ``root`` and its private ``/tmp``).
        root: the Executor's data folder (default: ``folder``).
        environments: the folder of the tenant's built environments, their registry and
            uv's cache (default: ``<root>.environments`` beside ``root``). Outside the
            folders above, and read-only to the host: only the jail's builder process
            writes there, so the tenant's code cannot change an environment it runs.
        build_settings: a ``coordex.toml`` whose ``[build.env]`` the jail's builds use
            (a server passes its own root's); copied into the environments folder, where
            the builder reads it. Files its settings and :data:`PASSED_ENV` name
            (``SSL_CERT_FILE``, a local ``UV_FIND_LINKS``) are made readable in the view.
        records: the folder of the host's call log and stored functions (default:
            ``<root>.records``), read-only to the host and written by this object
            (:mod:`.records`): the tenant reads them through the API only.
        memory_limit: bytes for the whole host (default 4 GiB); a cgroup where the
            machine lets coordex make one, else a per-process rlimit (``"per-process"``)
            (``confinement["memory"]`` says which).
        network: False leaves the host loopback only.
        max_calls: calls the host runs at once; more wait their turn (default 8).
        max_processes: processes the host may have (default 512): a pids cgroup, else
            ``RLIMIT_NPROC`` set inside the host's user namespace (this host's count
            alone); at level ``landlock`` that count is the user's, every host's together.
        hide: further folders and files the host must never see, even beneath a
            folder it is given (a server passes its root and its tokens file).
        readable: further folders (or files) of the machine the host may read, bound
            read-only into its view at their own paths (a wheelhouse, a data set).
            Nothing else of the machine exists in its view but the system's program
            folders, a few files of ``/etc``, the Python installation and coordex.
        user: ``(uid, gid, name)`` the host runs as; default: the server's user, or,
            where that is root, a user of the host's own (:mod:`.identity`).
        level: the strongest confinement to try (``"namespaces+landlock"``,
            ``"landlock"``, ``"none"``); default the best this machine gives.
        name: a label for the host's cgroups.
        env: further environment variables for the host (it gets none of the owner's
            but ``PATH``, the locale and ``TERM``).
        lazy: start the host on the first call instead of now.
        nodes: the tenant's actors on a cluster (a :class:`~coordex.hosting.relay.
            NodeRelay` the owner keeps): the host's bash and environment sessions then
            live on the cluster's nodes, each in a confined host of this tenant there.
        serve: ``"node"`` runs a cluster node's sessions of one tenant in the jail
            instead of an Executor (coordex's actor on a node does this; see
            :meth:`call`).
        executor_args: ``Executor`` arguments (``max_sessions``, ``timeout``, ...),
            JSON values.

    Every method returns what the Executor's does, as a dict; ``plan_namespace`` and
    ``capability`` are not offered (they are objects that live in the host). Raises
    RuntimeError when the host cannot start at all.
    """

    def __init__(self, folder: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None,
                 environments: str | os.PathLike[str] | None = None,
                 records: str | os.PathLike[str] | None = None,
                 build_settings: str | os.PathLike[str] | None = None,
                 memory_limit: int | None = None, network: bool = True,
                 max_calls: int = DEFAULT_MAX_CALLS, max_processes: int = DEFAULT_MAX_PROCESSES,
                 hide: Sequence[str | os.PathLike[str]] = (),
                 readable: Sequence[str | os.PathLike[str]] = (),
                 user: tuple[int, int, str] | None = None, level: str | None = None,
                 name: str = "host", env: Mapping[str, str] | None = None,
                 lazy: bool = False, nodes: Any = None, serve: str = "executor",
                 **executor_args: Any) -> None:
        import json

        given = tuple(str(Path(p).expanduser().absolute()) for p in readable)
        missing = [p for p in given if not os.path.exists(p)]
        if missing:  # a typo would otherwise leave the folder out of the view, silently
            raise ValueError(f"readable: no such file or folder: {', '.join(map(repr, missing))}")
        self.folder = Path(folder).expanduser().absolute()
        self.root = Path(root).expanduser().absolute() if root is not None else self.folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.root.mkdir(parents=True, exist_ok=True)
        self.environments_folder = self._environments_folder(environments, executor_args)
        self.memory_limit = DEFAULT_MEMORY_LIMIT if memory_limit is None else int(memory_limit)
        self.network = bool(network)
        self.max_calls = int(max_calls)
        self.timeout = float(executor_args.get("timeout", 60.0))  # the host's default
        self._argv = [sys.executable, "-I", "-m", "coordex.hosting.host",
                      "--folder", str(self.folder), "--root", str(self.root),
                      "--memory-limit", str(self.memory_limit),
                      "--max-processes", str(int(max_processes)),
                      "--max-calls", str(self.max_calls), "--name", name,
                      "--executor", json.dumps(executor_args)]
        if not self.network:
            self._argv.append("--no-network")
        if serve != "executor":
            self._argv += ["--serve", serve]
        if self.environments_folder is not None:
            self._argv += ["--environments", str(self.environments_folder)]
        self.records_folder = (Path(records).expanduser().absolute() if records is not None
                               else self.root.with_name(self.root.name + ".records"))
        _check_apart(self.records_folder, (self.folder, self.root))
        self._records: Any = None
        if serve == "executor":
            self._argv += ["--records", str(self.records_folder)]
        self._nodes = nodes
        if nodes is not None:
            self._argv.append("--relay")
        # Probed once per owner process (cached), not once per host start.
        self._argv += ["--level", level if level is not None else best_level()]
        self._hidden = [str(path) for path in hide]
        build_env = self._build_settings(build_settings)
        for path in [*readable_paths(), *given, *_setting_paths({**os.environ, **build_env})]:
            self._argv += ["--readable", path]
        self.readable = given
        from .identity import tenant_user

        self.user = user if user is not None else tenant_user(str(self.folder), name)
        if self.user is not None:
            self._argv += ["--user", ":".join(str(x) for x in self.user)]
        if serve == "executor":
            self._records = self._open_records(int(executor_args.get("log_max_rows", 100_000)))
        self._env = self._host_env(env)
        self._lock = threading.Lock()
        self._host: _Host | None = None
        self._closed = False
        self.restarts = 0
        # A host died and no reply to a model has said so yet (the next host is told).
        self._loss_unsaid = False
        self.close_step: str | None = None
        # What the wire offers, and nothing else: one list (wire.METHODS) for both ends.
        self.environments = _Namespace(self, "environments", _offered("environments"))
        self.functions = _Namespace(self, "functions", _offered("functions"))
        if not lazy:
            started = self._start()
            if isinstance(started, dict):
                raise RuntimeError(started["error"])

    def _environments_folder(self, environments: str | os.PathLike[str] | None,
                             executor_args: dict[str, Any]) -> Path:
        folder = (Path(environments).expanduser().absolute() if environments is not None
                  else self.root.with_name(self.root.name + ".environments"))
        _check_apart(folder, (self.folder, self.root))
        if "envs_dir" in executor_args:
            raise ValueError("a confined executor keeps its built environments in "
                             "environments=DIR (read-only to the host); pass that, not envs_dir")
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"cannot make the environments folder {str(folder)!r} "
                             f"({exc.strerror}); pass environments=DIR, a folder this user "
                             "may write apart from the host's folder") from None
        return folder

    def _build_settings(self, path: str | os.PathLike[str] | None) -> dict[str, str]:
        """Copy ``path`` (a ``coordex.toml``) where the jail's builder reads it; its
        ``[build.env]``. A file coordex cannot read as meant raises ValueError."""
        if path is None or self.environments_folder is None:
            return {}
        from ..core.errors import CoordexError
        from ..environments.build_env import read_settings, settings_file

        source = Path(path)
        target = settings_file(self.environments_folder)
        try:
            settings = read_settings(source)
        except CoordexError as exc:
            raise ValueError(exc.error) from None
        if not source.exists():
            target.unlink(missing_ok=True)
            return {}
        target.write_bytes(source.read_bytes())
        return dict(settings.build_env)

    def _open_records(self, max_rows: int) -> Any:
        """The host's records, written here (see :mod:`.records`); readable by the host's
        user alone where that is not this one."""
        from .records import OwnerRecords

        records = OwnerRecords(self.records_folder, max_rows)
        if self.user is not None:
            os.chown(self.records_folder, os.geteuid(), self.user[1])
            os.chmod(self.records_folder, 0o750)
        return records

    def _host_env(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
        env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
        env.update({"HOME": str(self.folder), "PYTHONNOUSERSITE": "1"})
        # -I drops PYTHONPATH; a package importable only through it is passed by path.
        env.update(extra or {})
        return env

    # ------------------------------------------------------------------ the host

    @property
    def confinement(self) -> dict[str, Any]:
        """What holds for the running host: level, memory, processes, network, and who
        builds environments (``"builder"``: a process of the jail the host cannot touch,
        the environments read-only to the host; ``"host"``: the host itself)."""
        host = self._host
        ready = host.ready if host is not None and host.ready else {}
        return {"level": ready.get("confinement"), "memory": ready.get("memory"),
                "processes": ready.get("processes"), "network": ready.get("network"),
                "builds": ready.get("builds")}

    @property
    def host_alive(self) -> bool:
        """Whether a host is running now (nothing is started to find out)."""
        host = self._host
        return host is not None and host.alive

    @property
    def pid(self) -> int | None:
        """The keeper's process id (the host process tree's root, outside the jail)."""
        return self._host.process.pid if self._host is not None else None

    def _start(self, replaces_lost: bool = False) -> _Host | dict[str, Any]:
        """Start a host; the running one, or an error dict when it cannot start.
        ``replaces_lost``: the last host died, and the new one's first call of code says
        so (its Executor is told, and renders it as a fact of that call)."""
        if self._records is not None:
            self._records.new_life()
        argv = [*self._argv, "--replaces-lost"] if replaces_lost else self._argv
        host = _Host(argv, self._env, str(self.folder),
                     self._nodes.serve if self._nodes is not None else None, self._records,
                     self._hidden)
        ready = host.wait_ready(READY_TIMEOUT)
        if ready is not None and ready.get("fatal") and str(ready.get("error")).startswith(
                ("TypeError", "ValueError")):
            host.close(grace=0.5)
            return make_error("validation", f"The host's Executor refused its arguments: "
                              f"{ready['error']}", "Fix the Executor arguments.")
        if ready is None or ready.get("protocol") != wire.PROTOCOL_VERSION or ready.get(
                "fatal") or not host.alive:
            host.close(grace=0.5)
            reason = (ready or {}).get("error") or host.stderr_tail.decode("utf-8", "replace")
            return make_error("crashed", f"The confined host did not start: {reason.strip()[-800:]}",
                              "Retry the call; if it fails again, the operator must check the "
                              "host's limits and folder.", state_lost=True)
        self._host = host
        return host

    def _running(self, tells: bool = True) -> tuple[_Host | None, dict[str, Any] | None]:
        """(host, error): the live host, starting one if the last died. ``tells``: the
        caller's reply reaches a model (see :meth:`_Host.call`)."""
        with self._lock:
            if self._closed:
                return None, messages.executor_closed().to_dict()
            host = self._host
            if host is not None and host.alive:
                return host, None
            if host is not None:
                host.close(grace=0.2)
                self.restarts += 1
                self._loss_unsaid = True
                if self._nodes is not None:  # the dead Executor's sessions on the cluster
                    self._nodes.reset()
            started = self._start(replaces_lost=self._loss_unsaid)
            if isinstance(started, dict):
                self._host = None
                # A start that fails says state_lost itself, to a caller whose reply
                # reaches a model; else the next start is told of the loss still.
                if tells:
                    self._loss_unsaid = False
                return None, started
            self._loss_unsaid = False  # the new host says it (``replaces_lost``)
            return started, None

    def _call(self, method: str, args: dict[str, Any], on_output: OnOutput | None = None,
              cancel: threading.Event | None = None, deadline: float | None = None, *,
              tells: bool = True) -> Any:
        host, error = self._running(tells)
        if host is None:
            return error
        value = host.call(method, args, on_output, cancel, deadline, MAX_READ_REPLY.get(method),
                          tells)
        if value is None and not host.alive:
            host.process.wait()
            how = _how_it_ended(host.process.returncode)
            return make_error(
                "crashed", f"The tenant's host process died during the call ({how}); every "
                "session's state is gone (the plan namespace too).",
                "Run the call again: the next call starts a fresh host. Rebuild the state "
                "you need (rebuild_session replays a session's calls).", state_lost=True)
        return value

    def call(self, method: str, args: dict[str, Any], deadline: float | None = None) -> Any:
        """One ``call`` by method name (``serve="node"``: NodeHost's methods); the reply's
        value, or a ``crashed`` error dict when the host died."""
        return self._call(method, args, deadline=deadline)

    # ------------------------------------------------------------------ the Executor's methods

    def execute_code(self, code: str, language: str = "python", state_mode: str = "stateless",
                     session_id: int | None = None, session_name: str | None = None,
                     venv_id: int | None = None, timeout: float | None = None,
                     on_output: OnOutput | None = None, *,
                     cancel: threading.Event | None = None, **extra: Any) -> dict[str, Any]:
        """As :meth:`Executor.execute_code`; ``on_output`` streams from the host."""
        extra.pop("on_progress", None)  # build lines arrive as on_output("build", line)
        args = {"code": code, "language": language, "state_mode": state_mode,
                "session_id": session_id, "session_name": session_name, "venv_id": venv_id,
                "timeout": timeout, **extra}
        # Without an environment nothing is built, so the call's own timeout bounds it;
        # past that and a grace the host is stuck and is ended (state lost).
        deadline = None
        if venv_id is None and isinstance(timeout or self.timeout, (int, float)):
            deadline = float(timeout or self.timeout) + STUCK_GRACE
        result: dict[str, Any] = self._call("execute_code", args, on_output, cancel, deadline)
        return result

    def call_tool(self, name: str, arguments: Any = None, on_output: OnOutput | None = None,
                  cancel: threading.Event | None = None) -> dict[str, Any]:
        """Route a model's tool call into the host (as :func:`coordex.tools.call_tool`).

        An ``execute_code`` call without an environment is bounded as
        :meth:`execute_code` bounds it: a host that has not answered by its timeout plus
        :data:`STUCK_GRACE` (stopped by its own code, say) is ended, and the call
        returns ``crashed`` with ``state_lost: true`` instead of hanging."""
        deadline = None
        if name == "execute_code" and isinstance(arguments, dict) \
                and arguments.get("venv_id") is None:
            timeout = arguments.get("timeout")
            timeout = timeout if isinstance(timeout, (int, float)) and not isinstance(
                timeout, bool) and 0 < timeout < 1e7 else self.timeout
            deadline = float(timeout) + STUCK_GRACE
        args: dict[str, Any] = {"name": name, "arguments": arguments}
        args.update(observed())  # the trace context, and whether builds are counted
        result: dict[str, Any] = self._call("call_tool", args, on_output, cancel, deadline)
        return result

    # The MCP server hands whole tool calls over with this (see mcp_server.run_tool).
    forward_tool = call_tool

    def list_sessions(self) -> dict[str, Any]:
        return self._call("list_sessions", {})

    def inspect_session(self, language: str = "python", session_id: int | None = None,
                        session_name: str | None = None, venv_id: int | None = None) -> dict[str, Any]:
        return self._call("inspect_session", {
            "language": language, "session_id": session_id, "session_name": session_name,
            "venv_id": venv_id})

    def close_session(self, language: str = "python", session_id: int | None = None,
                      session_name: str | None = None, venv_id: int | None = None) -> dict[str, Any]:
        return self._call("close_session", {
            "language": language, "session_id": session_id, "session_name": session_name,
            "venv_id": venv_id})

    def tool_definitions(self, format: str = "openai", **options: Any) -> Any:
        return self._call("tool_definitions", {"format": format, **options})

    def history(self, language: str | None = None, session_id: int | None = None,
                session_name: str | None = None, venv_id: int | None = None,
                limit: int = 50, seq: int | None = None, **options: Any) -> dict[str, Any]:
        """As :meth:`Executor.history` (its arguments in the same order)."""
        args = {"language": language, "session_id": session_id, "session_name": session_name,
                "venv_id": venv_id, "limit": limit, "seq": seq, **options}
        return self._call("history", args)

    def rebuild_session(self, language: str = "python", session_id: int | None = None,
                        session_name: str | None = None, venv_id: int | None = None,
                        **options: Any) -> dict[str, Any]:
        """As :meth:`Executor.rebuild_session` (its arguments in the same order)."""
        args = {"language": language, "session_id": session_id, "session_name": session_name,
                "venv_id": venv_id, **options}
        return self._call("rebuild_session", args)

    # SPEC 15: branches and checkpoints, made inside the host (its tenant's own store).

    def fork_session(self, session_id: int | str | None = None, session_name: str | None = None,
                     language: str = "python", venv_id: int | None = None, *,
                     new_name: str | None = None) -> dict[str, Any]:
        return self._call("fork_session", {
            "session_id": session_id, "session_name": session_name, "language": language,
            "venv_id": venv_id, "new_name": new_name})

    def checkpoint_session(self, language: str = "python", session_id: int | None = None,
                           session_name: str | None = None, venv_id: int | None = None, *,
                           label: str | None = None) -> dict[str, Any]:
        return self._call("checkpoint_session", {
            "language": language, "session_id": session_id, "session_name": session_name,
            "venv_id": venv_id, "label": label})

    def restore_session(self, language: str = "python", session_id: int | None = None,
                        session_name: str | None = None, venv_id: int | None = None, *,
                        checkpoint: str | None = None) -> dict[str, Any]:
        return self._call("restore_session", {
            "language": language, "session_id": session_id, "session_name": session_name,
            "venv_id": venv_id, "checkpoint": checkpoint})

    def list_checkpoints(self, language: str = "python", session_id: int | None = None,
                         session_name: str | None = None,
                         venv_id: int | None = None) -> dict[str, Any]:
        return self._call("list_checkpoints", {
            "language": language, "session_id": session_id, "session_name": session_name,
            "venv_id": venv_id})

    def serve_ui(self, port: int = 0, *, host: str = "127.0.0.1") -> dict[str, Any]:
        return self._call("serve_ui", {"port": port, "host": host}, tells=False)

    # SPEC 14: the call records live in the host, with the calls.
    def wait_call(self, call_id: str, wait: float | None = None) -> dict[str, Any]:
        return self._call("wait_call", {"call_id": call_id, "wait": wait})

    def cancel_call(self, call_id: str) -> dict[str, Any]:
        return self._call("cancel_call", {"call_id": call_id})

    # A front end's own requests and an operator's figures: no model reads these
    # replies, so they never say a loss (SPEC 9) in its place.
    def hold_call(self, call_id: str) -> dict[str, Any]:
        return self._call("hold_call", {"call_id": call_id}, tells=False)

    def read_spilled(self, uri: str) -> dict[str, Any]:
        """A spilled file of this host's, read by the host in its own view."""
        return self._call("read_spilled", {"uri": uri}, tells=False)

    def held_sessions(self) -> dict[str, Any]:
        """:meth:`list_sessions` for an operator's figures (``/metrics``)."""
        return self._call("list_sessions", {}, tells=False)

    def poll_call(self, call_id: str) -> dict[str, Any]:
        """:meth:`wait_call` without waiting, for a front end's task poll (MCP
        ``tasks/get``): a task that is not found, or still runs, reaches no model."""
        return self._call("wait_call", {"call_id": call_id, "wait": 0.001}, tells=False)

    def stop_call(self, call_id: str) -> dict[str, Any]:
        """:meth:`cancel_call` for a front end's task cancel (MCP ``tasks/cancel``),
        whose reply no model reads."""
        return self._call("cancel_call", {"call_id": call_id}, tells=False)

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """End the host and every process in its jail."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            host, self._host = self._host, None
        if host is not None:
            self.close_step = host.close()
        if self._nodes is not None:
            self._nodes.close()
        if self._records is not None:
            self._records.close()

    def __enter__(self) -> ConfinedExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _offered(prefix: str) -> tuple[str, ...]:
    return tuple(m.split(".", 1)[1] for m in wire.METHODS if m.startswith(prefix + "."))


def _setting_paths(env: Mapping[str, str]) -> list[str]:
    """Local files and folders the build settings name (see :data:`PATH_SETTINGS`)."""
    found = []
    for name in PATH_SETTINGS:
        for value in env.get(name, "").replace(",", " ").split():
            value = value.removeprefix("file://")
            if os.path.isabs(value) and os.path.exists(value):
                found.append(value)
    return found


def _check_apart(environments: Path, folders: Sequence[Path]) -> None:
    """The environments folder may lie inside a writable folder (the namespaces level
    still shows it read-only; Landlock alone cannot, so that level then gives ``none``)
    but neither be one nor hold one: that folder would then be read-only too."""
    mine = os.path.realpath(environments)
    for folder in folders:
        if os.path.commonpath([mine, os.path.realpath(folder)]) == mine:
            raise ValueError(f"environments={str(environments)!r} is or holds the host's "
                             f"writable folder {str(folder)!r}; pass a folder apart from it, "
                             f"e.g. {str(folder) + '.environments'!r}")


def _how_it_ended(code: int | None) -> str:
    if code is None:
        return "still ending"
    if code >= 128 and code - 128 in signal.Signals._value2member_map_:
        return messages.killed_by(code - 128)
    if code < 0:
        return messages.killed_by(-code)
    return f"exit status {code}"


def readable_paths() -> list[str]:
    """What a host reads beyond the system's folders: the Python installation (its
    prefixes, the interpreter's folder, the folders an isolated interpreter - the host
    runs ``python -I`` - puts on ``sys.path``), coordex's own folder and uv's.

    Never what this process's own ``sys.path`` adds beyond those: the current folder
    (``python -m`` puts it there), ``PYTHONPATH``, and what a cluster puts on a worker's
    path (Ray adds its driver's working folder, which may be a server's base folder
    holding its root and tokens file). Those are the operator's, not the installation's."""
    # The folder holding the coordex package: three up from this file.
    package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(sys.executable), os.path.dirname(os.path.realpath(sys.executable)),
             package}
    paths |= {p for p in _isolated_sys_path() if os.path.isdir(p)}
    try:
        import uv  # the builder's uv binary

        paths.add(os.path.dirname(os.path.abspath(uv.__file__)))
        paths.add(os.path.dirname(uv.find_uv_bin()))
    except (ImportError, FileNotFoundError):
        pass
    return sorted(paths)


_ISOLATED_PATH: dict[str, tuple[str, ...]] = {}


def _isolated_sys_path() -> tuple[str, ...]:
    """``sys.path`` of ``sys.executable -I`` (no current folder, no ``PYTHONPATH``, no
    user site), asked once per interpreter; the installation's own folders only."""
    found = _ISOLATED_PATH.get(sys.executable)
    if found is None:
        import json

        try:
            out = subprocess.run(
                [sys.executable, "-I", "-c", "import json, sys; print(json.dumps(sys.path))"],
                capture_output=True, text=True, timeout=60, cwd="/", stdin=subprocess.DEVNULL,
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}).stdout
            found = tuple(str(p) for p in json.loads(out) if isinstance(p, str) and p)
        except (OSError, ValueError, subprocess.SubprocessError):
            # What site adds for this installation, without asking a new interpreter.
            import site

            found = tuple(p for p in sys.path if p and any(
                os.path.realpath(p).startswith(os.path.realpath(prefix) + os.sep)
                for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix,
                               sys.base_exec_prefix}))
            found += tuple(site.getsitepackages())
        _ISOLATED_PATH[sys.executable] = found
    return found


def confinement_level(hidden: Sequence[str]) -> str:
    """The level a confined host reaches here, given what it must not see."""
    from .jail import JailSpec, landlock_covers

    level = best_level()
    if level == "landlock" and not landlock_covers(
            JailSpec(folder=os.devnull, hidden=tuple(hidden), readable=tuple(readable_paths()))):
        return "none"
    return level


__all__ = ["DEFAULT_MEMORY_LIMIT", "ConfinedExecutor", "confinement_level", "readable_paths"]
