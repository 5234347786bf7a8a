"""The builder process of a jail, and the host's client of it (SPEC 9: built environments
are read-only to the tenant's code).

A host's own interpreter runs the tenant's code, so nothing the host can write is safe
from it. The jail's init therefore starts a second process before the host, the
*builder*, in the same namespaces (where the level has them) and cgroups: it alone
sees the tenant's environments folder (built environments, their store, uv's cache, the
build logs) writable, through a mount namespace of its own or its Landlock rules, and
it restricts itself with Landlock in a domain the host is not in, so the host cannot
trace or read it, nor signal it (Landlock ABI >= 6). The host's
:class:`~coordex.environments.manager.EnvironmentManager` takes a :class:`BuilderClient`
as its builder and asks over a socketpair the init made (the ``request``/``answer``
lines of :data:`.wire.BUILDER_MESSAGES`); the builder runs a plain manager that builds
as it would in-process, and sends every build line back as ``progress``.

The host is the tenant: the builder takes nothing from it but the operation's
arguments, which its manager checks as it checks any caller's. A line it cannot decode
ends the builder, and the init then ends the host (the owner starts both again).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import re
import socket
import threading
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..core.errors import CoordexError, make_error
from . import wire
from .wire import BUILDER_MESSAGES, BUILDER_TO_HOST, HOST_TO_BUILDER

ProgressCallback = Any  # Callable[[str], None] | None
# Requests the builder runs at once; more wait their turn (one build per environment
# at a time anyway: the manager's own locks).
BUILDER_THREADS = 8


def _lines(sock: socket.socket, direction: str) -> Any:
    """The messages arriving on ``sock``, decoded, until end of file."""
    lines = wire.LineReader(sock.fileno(), max_line=wire.MAX_LINE)
    while True:
        chunk = sock.recv(1 << 16)
        if not chunk:
            return
        for line in lines.feed(chunk):
            yield wire.decode(line, direction, BUILDER_MESSAGES)


class _Sender:
    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._lock = threading.Lock()

    def send(self, msg: dict[str, Any]) -> None:
        data = wire.encode(wire.check(msg, table=BUILDER_MESSAGES))
        with self._lock:
            self._sock.sendall(data)


# ---------------------------------------------------------------------- the builder side

def serve(sock: socket.socket, make_manager: Callable[[], Any], refused: str = "") -> int:
    """Answer the host's requests with the manager ``make_manager()`` makes (on the first
    request) until the host closes the channel.

    ``refused`` (the builder could not confine itself), or a manager that cannot be
    made (a damaged store): every request gets an ``environment`` error saying so.
    """
    out = _Sender(sock)
    out.send({"type": "hello", "protocol": wire.BUILDER_PROTOCOL_VERSION, "pid": os.getpid()})
    pool = ThreadPoolExecutor(max_workers=BUILDER_THREADS, thread_name_prefix="coordex-build")
    made: list[Any] = []
    making = threading.Lock()

    def manager() -> Any:
        """The manager, or why there is none."""
        with making:
            if not made and not refused:
                try:
                    made.append(make_manager())
                except Exception as exc:  # tried again on the next request (a locked store)
                    return f"{type(exc).__name__}: {exc}"
        return made[0] if made else refused

    def answer(msg: dict[str, Any]) -> None:
        def progress(line: str) -> None:
            out.send({"type": "progress", "id": msg["id"], "line": line})

        found = manager()
        value = (_refusal(found) if isinstance(found, str) else
                 _run(found, msg["op"], msg["args"], progress))
        with contextlib.suppress(OSError):  # the host is gone: nothing to tell
            out.send({"type": "answer", "id": msg["id"], "value": value})

    try:
        for msg in _lines(sock, HOST_TO_BUILDER):
            pool.submit(answer, msg)
    except (wire.ProtocolError, OSError):
        return 3
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        with contextlib.suppress(OSError):  # the host's calls in flight fail at once
            sock.shutdown(socket.SHUT_RDWR)
    return 0


def _refusal(why: str) -> dict[str, Any]:
    return make_error("environment", f"This host cannot build environments: its builder "
                      f"could not confine itself or open its folder ({why}).",
                      "Use venv_id=None (the agent's own interpreter); the operator must "
                      "check the machine's Landlock and namespace support.", log="")


_FILE_URL = re.compile(r"file://(/[^\s\"',;\]#]+)")


def outside_the_view(spec_text: str) -> list[str]:
    """The paths of the spec's ``file://`` requirements that do not exist in the jail's
    view (the builder sees what the host sees, read-only, beside its own folder)."""
    paths = [urllib.parse.unquote(m.group(1)) for m in _FILE_URL.finditer(spec_text)]
    return [p for p in dict.fromkeys(paths) if not os.path.exists(p)]


def _outside(paths: list[str]) -> dict[str, Any]:
    shown = ", ".join(repr(p) for p in paths[:3])
    return make_error(
        "environment", f"The spec names {shown} by file://, which is outside this jail: a "
        "confined host sees its own folder, the system's program folders and the folders "
        "the operator names with --readable, nothing else of the machine.",
        "Copy the file into your own folder and name it there (file:///<your folder>/...), "
        "or ask the operator to start coordex with --readable DIR for the folder that holds "
        "it.", log="")


def _run(manager: Any, op: str, args: Any, progress: Any) -> Any:
    """One operation of the manager; whatever goes wrong comes back as an error dict."""
    if not isinstance(args, dict):
        args = {}
    venv_id = args.get("venv_id")
    try:
        if op in ("create", "build_spec"):
            missing = outside_the_view(str(args.get("spec") or args.get("spec_text") or ""))
            if missing:
                return _outside(missing)
        if op == "create":
            return manager.create(args.get("spec"), args.get("name"))
        if op == "list":
            return manager.list()
        if op == "show":
            return manager.show(venv_id)
        if op == "exists":
            return manager.exists(venv_id)
        if op == "env_dir":
            folder = manager.env_dir(venv_id)
            return None if folder is None else str(folder)
        if op == "describe":
            return list(manager.describe(venv_id))
        if op == "build":
            return manager.build(venv_id, on_progress=progress)
        if op == "build_spec":
            return manager.build_spec(args.get("spec_text"), args.get("spec_hash"),
                                      args.get("label", "environment"), on_progress=progress)
        if op == "touch":
            manager.touch(venv_id)
            return None
        if op == "remove_unused":
            return manager.remove_unused()
        return make_error("validation", f"environments.{op} is not an operation of the "
                          "builder.", "Use one of: " + ", ".join(sorted(wire.BUILDER_OPS)) + ".")
    except CoordexError as exc:
        return exc.to_dict()
    except (TypeError, ValueError, AttributeError) as exc:  # arguments of the wrong type
        return make_error("validation", f"environments.{op}: {type(exc).__name__}: {exc}"[:400],
                          "Pass the arguments the method documents (venv_id: an integer, "
                          "spec and name: text).")
    except Exception as exc:  # the folder or the machine (a full disk): an answer still
        return make_error("environment", f"environments.{op} failed in the builder: "
                          f"{type(exc).__name__}: {exc}"[:400],
                          "Run the call again; if it fails again, the operator must check "
                          "the environments folder (disk space, permissions).", log="")


# ---------------------------------------------------------------------- the host side

_LOST = object()


class BuilderClient:
    """The host's end of the builder channel: :meth:`call` runs one operation there.

    Thread-safe; one reader thread hands answers and progress lines to the waiting
    call by id, and the call's own thread runs ``on_progress`` (as a local build would:
    the Executor's progress callback is the calling thread's).
    """

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._out = _Sender(sock)
        self._ids = itertools.count(1)
        self._calls: dict[int, queue.SimpleQueue[tuple[str, Any]]] = {}
        self._lock = threading.Lock()
        self._open = True
        self._why = "it has not started"
        self.pid: int | None = None
        self._reader = threading.Thread(target=self._read, name="coordex-builder-reader",
                                        daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for msg in _lines(self._sock, BUILDER_TO_HOST):
                if msg["type"] == "hello":
                    if msg["protocol"] != wire.BUILDER_PROTOCOL_VERSION:
                        self._why = f"it speaks builder protocol {msg['protocol']!r}"
                        break
                    self.pid = msg["pid"]
                    continue
                with self._lock:
                    call = (self._calls.get(msg["id"]) if msg["type"] == "progress"
                            else self._calls.pop(msg["id"], None))
                if call is not None:
                    call.put((msg["type"], msg.get("line", msg.get("value"))))
            else:
                self._why = "it ended"
        except (wire.ProtocolError, OSError) as exc:
            self._why = f"its channel broke: {exc}"
        with self._lock:
            self._open = False
            calls, self._calls = list(self._calls.values()), {}
        for call in calls:
            call.put(("lost", _LOST))

    def call(self, op: str, args: dict[str, Any], on_progress: ProgressCallback = None) -> Any:
        """The operation's value (an error dict where it failed).

        Raises:
            CoordexError: ``environment`` when the builder is gone (its host is then
                ended by the jail's init, and the next call starts both again).
        """
        call: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        call_id = next(self._ids)
        with self._lock:
            registered = self._open
            if registered:
                self._calls[call_id] = call
        if not registered:
            raise self._gone()
        try:
            self._out.send({"type": "request", "id": call_id, "op": op, "args": args})
        except OSError:
            with self._lock:
                self._calls.pop(call_id, None)
            raise self._gone() from None
        while True:
            kind, value = call.get()
            if kind == "answer":
                return value
            if kind == "lost":
                raise self._gone()
            if on_progress is not None:
                with contextlib.suppress(Exception):  # a caller's bug must not lose the answer
                    on_progress(value)

    def _gone(self) -> CoordexError:
        return CoordexError(
            "environment", f"This host's environment builder is not available ({self._why}).",
            "Run the call again: a host whose builder ended is started again with a new one "
            "(state_lost: true).", log="")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._reader.join(timeout=2)
        self._sock.close()


__all__ = ["BuilderClient", "serve"]
