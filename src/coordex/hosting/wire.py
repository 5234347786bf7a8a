"""The owner <-> confined host wire: JSON lines, one table of messages, one version.

Pure: no I/O. The owner (a server, :class:`~coordex.ConfinedExecutor`, a cluster node's
actor) writes ``call`` lines; the host answers each with exactly one ``reply``, after
any number of ``output`` lines for that call when the call asked for them. Rules:

1. The host's first line is ``ready`` carrying :data:`PROTOCOL_VERSION` and what
   confinement and limits hold; the owner refuses another version before it calls.
2. Calls are concurrent: the owner may send the next ``call`` before a ``reply``; the
   ``id`` pairs them up. ``cancel`` interrupts a call in flight as a timeout does.
3. A reply's ``value`` is the method's result dict, unchanged (the host never raises
   across the wire: a coordex bug there becomes a ``crashed`` error dict).

Lines are ASCII JSON (``ensure_ascii``), so output with any characters travels safely.
docs/protocol.md documents every message; tests/unit/test_protocol_doc.py keeps the two
in step.
"""

from __future__ import annotations

import json
from typing import Any

from ..worker._coordex_protocol import LineReader, ProtocolError

PROTOCOL_VERSION = 2

# The host's limits unless its owner says otherwise (SPEC 9: --max-calls defaults to 8).
DEFAULT_MAX_CALLS = 8
DEFAULT_MAX_PROCESSES = 512
# The longest line a reader takes from a peer running the tenant's code (a host, to its
# owner or its builder). The tenant's code can write to the host's end of the pipe, so
# without a bound it could make the server buffer gigabytes; a reply is far smaller
# (output is capped at 64 KiB per stream). Longer ends that peer: a flood costs only it.
MAX_LINE = 64 << 20

OWNER_TO_HOST = "owner->host"
HOST_TO_OWNER = "host->owner"

# type -> (direction, required fields, optional fields)
MESSAGES: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "ready": (HOST_TO_OWNER, ("protocol", "pid", "confinement", "memory", "processes"),
              ("network", "builds", "error", "fatal")),
    "call": (OWNER_TO_HOST, ("id", "method", "args"), ("stream", "tells")),
    "output": (HOST_TO_OWNER, ("id", "stream", "text"), ()),
    "reply": (HOST_TO_OWNER, ("id", "value"), ()),
    "cancel": (OWNER_TO_HOST, ("id",), ("by",)),
    "shutdown": (OWNER_TO_HOST, (), ()),
    # A tenant's Executor on a server whose sessions live on a cluster (SPEC 10) asks
    # its owner, which holds the cluster connection, to reach that tenant's node actors.
    "node": (HOST_TO_OWNER, ("id", "op", "args"), ()),
    "node_reply": (OWNER_TO_HOST, ("id", "value"), ()),
    # The host asks its owner to write its records (call log rows, stored functions),
    # which lie outside its writable view (SPEC 9); ``call`` names the owner's call the
    # row belongs to. See hosting/records.py.
    "record": (HOST_TO_OWNER, ("id", "op", "args"), ("call",)),
    "record_reply": (OWNER_TO_HOST, ("id", "value"), ()),
}

# What a ``call`` may name: the Executor's methods, but ``plan_namespace`` and
# ``capability`` (objects, not data: they live in the host) and ``close`` (``shutdown``).
METHODS = (
    "execute_code", "list_sessions", "inspect_session", "close_session", "call_tool",
    "tool_definitions", "history", "rebuild_session", "serve_ui",
    "wait_call", "cancel_call", "hold_call", "read_spilled",
    "fork_session", "checkpoint_session", "restore_session", "list_checkpoints",
    "environments.create", "environments.list", "environments.show", "environments.build",
    "environments.remove_unused", "functions.list", "functions.show", "functions.versions",
    "functions.define", "functions.call",
)
# What a ``call`` may name on a host that serves a cluster node's sessions of one tenant
# (``--serve node``): the methods of :class:`coordex.backends.ray.node.NodeHost`.
NODE_METHODS = ("begin", "events", "alive", "count", "close_session", "shutdown")


# The builder channel inside one jail (a socketpair the jail's init makes): the host's
# environment manager asks the builder process, the only one that may write the
# environments folder, to create, build and look up environments. Its own version.
BUILDER_PROTOCOL_VERSION = 1
HOST_TO_BUILDER = "host->builder"
BUILDER_TO_HOST = "builder->host"
BUILDER_MESSAGES: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "hello": (BUILDER_TO_HOST, ("protocol", "pid"), ()),
    "request": (HOST_TO_BUILDER, ("id", "op", "args"), ()),
    "progress": (BUILDER_TO_HOST, ("id", "line"), ()),
    "answer": (BUILDER_TO_HOST, ("id", "value"), ()),
}
# What a ``request`` may ask: the environment manager's methods of the same names.
BUILDER_OPS = ("create", "list", "show", "exists", "env_dir", "describe", "build",
               "build_spec", "touch", "remove_unused")


def check(msg: Any, direction: str | None = None,
          table: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = MESSAGES,
          ) -> dict[str, Any]:
    """``msg`` itself when it is a known message of ``table`` with its required fields."""
    if not isinstance(msg, dict):
        raise ProtocolError(f"a message must be a JSON object, got {type(msg).__name__}")
    kind = msg.get("type")
    spec = table.get(kind) if isinstance(kind, str) else None
    if spec is None:
        raise ProtocolError(f"unknown message type {kind!r}")
    if direction is not None and spec[0] != direction:
        raise ProtocolError(f"message {kind!r} does not travel {direction}")
    missing = [name for name in spec[1] if name not in msg]
    if missing:
        raise ProtocolError(f"message {kind!r} lacks field(s) {', '.join(missing)}")
    unknown = sorted(set(msg) - {"type", *spec[1], *spec[2]})
    if unknown:
        raise ProtocolError(f"message {kind!r} has unknown field(s) {', '.join(unknown)}")
    if kind == "call" and msg["method"] not in METHODS + NODE_METHODS:
        raise ProtocolError(f"method {msg['method']!r} is not one of {METHODS + NODE_METHODS}")
    if kind == "request" and msg["op"] not in BUILDER_OPS:
        raise ProtocolError(f"op {msg['op']!r} is not one of {BUILDER_OPS}")
    return msg


def message(kind: str, **fields: Any) -> dict[str, Any]:
    return check({"type": kind, **fields})


_encode_json = json.JSONEncoder(separators=(",", ":"), default=str).encode
_decode_json = json.JSONDecoder().decode


def encode(msg: dict[str, Any]) -> bytes:
    """One message as one ASCII line."""
    return _encode_json(msg).encode("ascii") + b"\n"


def decode(line: bytes, direction: str | None = None,
           table: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = MESSAGES,
           ) -> dict[str, Any]:
    try:
        msg = _decode_json(line.decode("ascii"))
    except (ValueError, RecursionError):  # the host's side is the tenant's: anything comes
        raise ProtocolError(f"not a JSON line: {bytes(line[:200])!r}")
    return check(msg, direction, table)


__all__ = ["BUILDER_MESSAGES", "BUILDER_OPS", "BUILDER_PROTOCOL_VERSION", "BUILDER_TO_HOST",
           "HOST_TO_BUILDER", "HOST_TO_OWNER", "MAX_LINE", "MESSAGES", "METHODS", "NODE_METHODS",
           "OWNER_TO_HOST", "PROTOCOL_VERSION", "LineReader", "ProtocolError", "check",
           "decode", "encode", "message"]
