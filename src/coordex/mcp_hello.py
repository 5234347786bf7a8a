"""The first moments of ``coordex mcp``: the wire claimed, ``initialize`` answered early.

MCP clients start ``coordex mcp`` often and wait for its answer to ``initialize``;
importing the MCP SDK takes about half a second (SPEC 8 wants the answer within
500 ms). So this module, standard library only, does what must come first:

1. :func:`claim_stdio` moves the protocol to private descriptors, so nothing code
   prints can reach the wire.
2. :func:`greet` reads the client's first message while the SDK loads on another
   thread; if it is a well-formed ``initialize``, it writes the answer the SDK would
   give (:func:`initialize_result`, kept equal to the SDK's by a test) at once.
3. The SDK then gets the same ``initialize`` as its first message, as if it had been
   the first to read it, so its session state is what it always is; its own answer to
   it is dropped (:class:`Greeting`), so the client hears one answer.

The stateless era (2026-07-28) opens with ``server/discover`` instead, its protocol
version and client capabilities in ``params._meta``; a well-formed one at a version the
SDK serves is answered the same way (:func:`discover_result`). Anything else as the
first message (a malformed request, a version the SDK would refuse, nothing within
:data:`WAIT_S`) is left to the SDK untouched.
"""

from __future__ import annotations

import json
import os
import select
import time
from dataclasses import dataclass
from typing import Any

from . import __version__

SERVER_NAME = "coordex"
INSTRUCTIONS = (
    "coordex runs Python or bash code for you. Use execute_code with state_mode='stateful' "
    "and a session_name for work of several steps, 'stateless' for one-off checks and "
    "'read_only' to look at a session without changing it. Keep functions you will reuse "
    "with define_function and run them with call_function (the same three state modes). "
    "Errors carry a 'suggestion': follow it."
)
# The MCP SDK's handshake-era versions (mcp_types.version; tests keep them equal) and
# the capabilities its low-level Server declares for coordex's handlers.
HANDSHAKE_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
LATEST_HANDSHAKE = HANDSHAKE_VERSIONS[-1]
# The stateless era's versions (mcp_types.version.MODERN_PROTOCOL_VERSIONS) and the
# ``_meta`` keys of its per-request envelope.
MODERN_VERSIONS = ("2026-07-28",)
PROTOCOL_VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
CLIENT_CAPABILITIES_KEY = "io.modelcontextprotocol/clientCapabilities"
SERVER_INFO_KEY = "io.modelcontextprotocol/serverInfo"
CAPABILITIES: dict[str, Any] = {"resources": {"subscribe": False, "listChanged": False},
                                "tools": {"listChanged": False}}
# What a 2026-07-28 server/discover declares besides: the tasks extension (SPEC 14).
MODERN_CAPABILITIES: dict[str, Any] = {
    **CAPABILITIES, "extensions": {"io.modelcontextprotocol/tasks": {}}}
# How long to wait for the client's first message before leaving it to the SDK.
WAIT_S = 5.0


@dataclass(frozen=True)
class WireFds:
    """The private descriptors that carry the stdio protocol after :func:`claim_stdio`."""

    read_fd: int
    write_fd: int


@dataclass
class Greeting:
    """What :func:`greet` read and answered, for the SDK to take over.

    ``read`` is every byte read from the client so far (the SDK reads them first);
    ``answered`` the id of the ``initialize`` or ``server/discover`` that was answered
    (the SDK's own answer to it is dropped), or None.
    """

    read: bytes = b""
    answered: Any = None

    def drops(self, text: str) -> bool:
        """Whether ``text`` (one message the SDK writes) is its answer to the
        first message already answered; true once at most."""
        if self.answered is None or '"id"' not in text:
            return False
        try:
            message = json.loads(text)
        except ValueError:
            return False
        if (isinstance(message, dict) and message.get("id") == self.answered
                and ("result" in message or "error" in message)):
            self.answered = None
            return True
        return False


def claim_stdio() -> WireFds:
    """Move the protocol off fds 0/1 so nothing else can read or write it.

    The wire is duplicated to private, close-on-exec descriptors (children never
    inherit them); fd 1 then points at stderr and fd 0 at /dev/null, so stray writes to
    fd 1 (``os.write(1, ...)``, a child's stdout) land on stderr and a stray read gets
    end-of-file. Call it first thing, before any thread or child process starts.
    """
    import sys

    sys.stdout.flush()
    read_fd = os.dup(0)  # os.dup returns a non-inheritable descriptor
    write_fd = os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
    finally:
        os.close(null)
    os.dup2(2, 1)
    from .worker._coordex_copy import hold

    hold(read_fd, write_fd)  # read-only copies of Python sessions close the wire
    return WireFds(read_fd, write_fd)


def initialize_result(params: Any) -> dict[str, Any] | None:
    """The SDK's result for ``initialize`` with ``params``; None when the SDK would
    refuse them (it then answers itself)."""
    if not isinstance(params, dict):
        return None
    version, client = params.get("protocolVersion"), params.get("clientInfo")
    if not (isinstance(version, str) and isinstance(params.get("capabilities"), dict)
            and isinstance(client, dict) and isinstance(client.get("name"), str)
            and isinstance(client.get("version"), str)):
        return None
    return {
        "protocolVersion": version if version in HANDSHAKE_VERSIONS else LATEST_HANDSHAKE,
        "capabilities": json.loads(json.dumps(CAPABILITIES)),
        "serverInfo": {"name": SERVER_NAME, "version": __version__},
        "instructions": INSTRUCTIONS,
    }


def discover_result(params: Any) -> dict[str, Any] | None:
    """The SDK's result for ``server/discover`` with ``params``; None when the SDK would
    refuse them or answer otherwise (it then answers itself)."""
    meta = params.get("_meta") if isinstance(params, dict) else None
    if not isinstance(meta, dict) or meta.get(PROTOCOL_VERSION_KEY) not in MODERN_VERSIONS \
            or not isinstance(meta.get(CLIENT_CAPABILITIES_KEY), dict):
        return None
    return {
        "cacheScope": "private",
        "capabilities": json.loads(json.dumps(MODERN_CAPABILITIES)),
        "instructions": INSTRUCTIONS,
        "resultType": "complete",
        "supportedVersions": list(MODERN_VERSIONS),
        "ttlMs": 0,
        "_meta": {SERVER_INFO_KEY: {"name": SERVER_NAME, "version": __version__}},
    }


# The first messages answered early, each by the SDK's result for its params.
_EARLY = {"initialize": initialize_result, "server/discover": discover_result}


def greet(wire: WireFds, wait: float = WAIT_S) -> Greeting:
    """Read the client's first message and answer it if it is ``initialize`` or
    ``server/discover``."""
    greeting = Greeting()
    buffer = b""
    deadline = time.monotonic() + wait
    while b"\n" not in buffer:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([wire.read_fd], [], [], remaining)[0]:
            break
        chunk = os.read(wire.read_fd, 65536)
        if not chunk:  # the client closed its end: the SDK sees the same
            break
        buffer += chunk
    greeting.read = buffer
    first, newline, _ = buffer.partition(b"\n")
    answer = _answer(first.decode("utf-8", "replace")) if newline else None
    if answer is not None:
        request_id, result = answer
        reply = json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result},
                           ensure_ascii=False, separators=(",", ":")) + "\n"
        _write_all(wire.write_fd, reply.encode("utf-8"))
        greeting.answered = request_id
    return greeting


def _answer(line: str) -> tuple[Any, dict[str, Any]] | None:
    try:
        message = json.loads(line)
    except ValueError:
        return None
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0" \
            or message.get("method") not in _EARLY:
        return None
    request_id = message.get("id")
    if isinstance(request_id, bool) or not isinstance(request_id, (int, str)):
        return None
    result = _EARLY[message["method"]](message.get("params"))
    return None if result is None else (request_id, result)


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


__all__ = ["CAPABILITIES", "HANDSHAKE_VERSIONS", "INSTRUCTIONS", "LATEST_HANDSHAKE",
           "MODERN_VERSIONS", "Greeting", "WireFds", "claim_stdio", "discover_result", "greet",
           "initialize_result"]
