"""The host<->worker protocol, for host code.

The definition lives in ``coordex/worker/_coordex_protocol.py`` because the worker,
which runs in interpreters without coordex installed, loads that file by path; this
module re-exports it so host code imports ``coordex.protocol`` like any other module.
See docs/protocol.md.
"""

from __future__ import annotations

from .worker._coordex_protocol import (
    HOST_TO_WORKER,
    MESSAGES,
    PLAIN_TYPES,
    PROTOCOL_VERSION,
    RUN_MODES,
    SPIN_SECONDS,
    WORKER_TO_HOST,
    LineReader,
    ProtocolError,
    check,
    decode,
    encode,
    from_wire,
    message,
    to_wire,
)

__all__ = [
    "HOST_TO_WORKER", "MESSAGES", "PLAIN_TYPES", "PROTOCOL_VERSION", "RUN_MODES",
    "SPIN_SECONDS", "WORKER_TO_HOST", "LineReader", "ProtocolError", "check", "decode", "encode",
    "from_wire", "message", "to_wire",
]
