"""The host <-> worker wire: JSON lines, one table of messages, one version.

Standard library only and valid on CPython 3.8: the worker loads this file by path in
interpreters where coordex is not installed, and the host imports the same file
(re-exported as ``coordex.protocol``), so both sides read one definition.

Rules the protocol keeps:

1. The worker's first line is ``hello`` carrying :data:`PROTOCOL_VERSION`; the host
   refuses any other version before sending anything.
2. Protocol lines travel on two private pipes (not fds 0/1/2). The worker's fds 1 and 2
   are plain pipes the host reads itself, so output from ``print``, ``os.write(1, ...)``,
   forked children and subprocesses is captured without the worker's help and can never
   corrupt the protocol. The worker flushes before ``done``, and pipe writes are
   synchronous, so once ``done`` is read a non-blocking drain of fds 1/2 completes the
   run's output.
3. A run is answered by exactly one ``done``; in between the worker may send
   ``capability_call`` lines, each answered by one ``capability_result`` with its ``id``.

Capability arguments and results are *plain values*; :func:`to_wire` / :func:`from_wire`
carry bytes as ``{"__bytes__": base64}`` and refuse anything else with a TypeError that
names the type and the way out.
"""

from __future__ import annotations

import base64
import json
import os
import select
import time
from typing import Any, Dict, List, Optional, Tuple

PROTOCOL_VERSION = 1

HOST_TO_WORKER = "host->worker"
WORKER_TO_HOST = "worker->host"

# type -> (direction, required fields, optional fields). Everything else in this module
# and docs/protocol.md follows this table; tests/unit/test_protocol_doc.py checks both.
MESSAGES: Dict[str, Tuple[str, Tuple[str, ...], Tuple[str, ...]]] = {
    "hello": (WORKER_TO_HOST, ("protocol", "python", "pid"), ("fork", "executable")),
    "capabilities": (HOST_TO_WORKER, ("names",), ()),
    "run": (HOST_TO_WORKER, ("id", "code", "mode", "output_limit"),
            ("timeout", "protect", "scratch", "capabilities", "env", "outputs")),
    "capability_call": (WORKER_TO_HOST, ("id", "name", "args", "kwargs"), ()),
    "capability_result": (HOST_TO_WORKER, ("id",), ("value", "error")),
    "done": (WORKER_TO_HOST, ("id", "result", "error", "interrupted", "images"),
             ("rebound", "deleted", "written", "isolation", "child_died",
              "result_truncated")),
    "copy_ready": (WORKER_TO_HOST, ("isolation",), ()),
    "inspect": (HOST_TO_WORKER, ("id",), ()),
    "inspect_result": (WORKER_TO_HOST, ("id", "names"), ("capabilities",)),
    "shutdown": (HOST_TO_WORKER, (), ()),
    # Sessions that outlive their process (coordex.persist, _coordex_snapshot).
    "snapshot": (HOST_TO_WORKER, ("id", "folder", "pickler", "attempt", "through",
                                  "max_bytes"), ("identity",)),
    "snapshot_done": (WORKER_TO_HOST, ("id", "report"), ()),
    "restore": (HOST_TO_WORKER, ("id", "folder", "pickler"), ("replay",)),
    "restore_done": (WORKER_TO_HOST, ("id", "report"), ()),
    # A session forked into a new one (SPEC 15): the fork child serves the new session.
    "fork": (HOST_TO_WORKER, ("id", "fifos"), ()),
    "fork_done": (WORKER_TO_HOST, ("id", "report"), ()),
}

RUN_MODES = ("stateful", "read_only", "stateless")

# How long the end of a pipe that sent or answered a message tries the pipe again
# before it sleeps: waking a sleeping process costs both sides tens of microseconds on
# a small VM, more than a short call. Every such wait uses it: the worker's for the
# next run (LineReader), the host's for a worker's ``done`` and for bash's record, and
# a kept bash's for its next line.
SPIN_SECONDS = 0.0003

# Plain values: what may cross the boundary as a capability argument or result.
PLAIN_TYPES = "None, bool, int, float, str, bytes, lists/tuples, dicts with str keys"
_MAX_DEPTH = 100


class ProtocolError(Exception):
    """A line that is not a valid message of this protocol version."""


def message(kind: str, **fields: Any) -> Dict[str, Any]:
    """Build one message dict, checking its type and required fields."""
    msg: Dict[str, Any] = {"type": kind}
    msg.update(fields)
    check(msg)
    return msg


def check(msg: Any, direction: Optional[str] = None) -> None:
    """Raise ProtocolError unless ``msg`` is a known message with its required fields."""
    if not isinstance(msg, dict):
        raise ProtocolError("a message must be a JSON object, got %s" % type(msg).__name__)
    kind = msg.get("type")
    spec = MESSAGES.get(kind) if isinstance(kind, str) else None
    if spec is None:
        raise ProtocolError("unknown message type %r" % (kind,))
    if direction is not None and spec[0] != direction:
        raise ProtocolError("message %r does not travel %s" % (kind, direction))
    missing = [name for name in spec[1] if name not in msg]
    if missing:
        raise ProtocolError("message %r lacks field(s) %s" % (kind, ", ".join(missing)))
    unknown = [name for name in msg if name != "type" and name not in spec[1]
               and name not in spec[2]]
    if unknown:
        # The table is the whole truth: a field it does not name is a bug on one side.
        raise ProtocolError("message %r has unknown field(s) %s"
                            % (kind, ", ".join(sorted(unknown))))
    if kind == "run" and msg["mode"] not in RUN_MODES:
        raise ProtocolError("run mode %r is not one of %s" % (msg["mode"], RUN_MODES))


# Made once: json.dumps/json.loads build an encoder (or sniff the encoding of bytes) on
# every call, a measurable share of a round trip that is itself ~100 microseconds.
_encode_json = json.JSONEncoder(separators=(",", ":")).encode
_decode_json = json.JSONDecoder().decode


def encode(msg: Dict[str, Any]) -> bytes:
    """One message as one line of bytes (ASCII JSON, so no byte is ever a newline)."""
    return _encode_json(msg).encode("ascii") + b"\n"


def decode(line: bytes, direction: Optional[str] = None) -> Dict[str, Any]:
    """Parse and check one line; raises ProtocolError for anything else."""
    try:
        msg = _decode_json(line.decode("ascii"))
    except ValueError:  # UnicodeDecodeError too: every line of this protocol is ASCII
        raise ProtocolError("not a JSON line: %r" % (bytes(line[:200]),))
    check(msg, direction)
    checked: Dict[str, Any] = msg
    return checked


class LineReader:
    """Split what arrives on a file descriptor into lines (:meth:`read_line` waits for
    one: on a non-blocking fd it tries again for ``spin`` seconds, then sleeps).

    Only bytes not yet searched are searched for the newline, so a long line arriving
    in many chunks costs linear time; with ``max_line``, a line longer than that (one
    with no end in sight: a flood from a peer that cannot be trusted) raises
    ProtocolError.
    """

    def __init__(self, fd: int, max_line: Optional[int] = None, spin: float = 0.0) -> None:
        self.fd = fd
        self.max_line = max_line
        # :meth:`read_line` on a non-blocking ``fd``: try this long before sleeping
        # (waking a sleeping process costs both sides tens of microseconds).
        self.spin = spin
        self._poll = None  # type: Any
        self._buffer = bytearray()
        self._searched = 0  # bytes of the buffer known to hold no newline

    def pending(self) -> bytes:
        return bytes(self._buffer)

    def _take(self) -> Optional[bytes]:
        end = self._buffer.find(b"\n", self._searched)
        if end < 0:
            self._searched = len(self._buffer)
            if self.max_line is not None and self._searched > self.max_line:
                raise ProtocolError("a line longer than %d bytes" % self.max_line)
            return None
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 1]
        self._searched = 0
        return line

    def feed(self, data: bytes) -> List[bytes]:
        """Add bytes; return the complete lines now available."""
        self._buffer += data
        lines: List[bytes] = []
        while True:
            line = self._take()
            if line is None:
                return lines
            lines.append(line)

    def read_line(self) -> Optional[bytes]:
        """Block for the next line; None at end of file."""
        spin_until = None
        while True:
            line = self._take()
            if line is not None:
                return line
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:  # a non-blocking fd: try again for ``spin``, then sleep
                now = time.monotonic()
                if spin_until is None:
                    spin_until = now + self.spin
                if now >= spin_until:
                    poller = self._poll
                    if poller is None:  # kept only once registered (an interrupt
                        poller = select.poll()  # between the two: made again)
                        poller.register(self.fd, select.POLLIN)
                        self._poll = poller
                    poller.poll()
                continue
            if not data:
                return None
            self._buffer += data


def _not_plain(message: str, where: str, type_name: str) -> TypeError:
    """The TypeError user code sees for a value that cannot cross, carrying ``where`` it
    sits and ``type_name`` (what it is) for callers that word their own message."""
    exc = TypeError(message)
    exc.where = where  # type: ignore[attr-defined]
    exc.type_name = type_name  # type: ignore[attr-defined]
    return exc


def to_wire(value: Any, where: str = "value", _depth: int = 0) -> Any:
    """A plain value made JSON-safe; TypeError (naming the type and the fix) otherwise."""
    if _depth > _MAX_DEPTH:
        raise _not_plain("%s is nested more than %d levels deep (or refers to itself); "
                       "pass a flatter plain value" % (where, _MAX_DEPTH),
                       where, "structure nested more than %d levels deep" % _MAX_DEPTH)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"__bytes__": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, (list, tuple)):
        return [to_wire(item, "%s[%d]" % (where, i), _depth + 1)
                for i, item in enumerate(value)]
    if isinstance(value, dict):
        out: Dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise _not_plain("%s has a key of type %s (%r); only str keys can cross "
                               "between host and worker" % (where, type(key).__name__, key),
                               "%s key %r" % (where, key), type(key).__name__)
            out[key] = to_wire(item, "%s[%r]" % (where, key), _depth + 1)
        if "__bytes__" in out or "__dict__" in out:
            return {"__dict__": out}  # escape a real dict that looks like an encoding
        return out
    kind = type(value)
    name = kind.__name__ if kind.__module__ == "builtins" else \
        "%s.%s" % (kind.__module__, kind.__qualname__)
    raise _not_plain(
        "%s is a %s.%s object, which cannot cross between host and worker: only plain "
        "values can (%s). Write it to a file and pass the path instead."
        % (where, kind.__module__, kind.__qualname__, PLAIN_TYPES), where, name)


def from_wire(value: Any) -> Any:
    """Undo :func:`to_wire` (tuples come back as lists)."""
    if isinstance(value, list):
        return [from_wire(item) for item in value]
    if isinstance(value, dict):
        if len(value) == 1 and "__bytes__" in value:
            return base64.b64decode(value["__bytes__"])
        if len(value) == 1 and "__dict__" in value:
            value = value["__dict__"]
        return {key: from_wire(item) for key, item in value.items()}
    return value
