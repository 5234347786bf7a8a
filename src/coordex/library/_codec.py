"""Plain values as JSON for stored-function calls: the worker protocol's rules, reused.

The rules live once, in ``worker/_coordex_protocol.py`` (``to_wire``/``from_wire``), which
is standard library only and importable on both sides of a process boundary: here in the
host, and in the process that runs a function (an environment's worker loads it from its
own folder; a read-only fork of the host has it as ``coordex.worker._coordex_protocol``).
``IMPORT_SOURCE`` is the code the generated call embeds to get it there.

Plain means: None, bool, int, float, str, bytes, and lists/tuples/dicts (string keys)
of them. Tuples come back as lists. Bytes travel as ``{"__bytes__": base64}``.
"""

from __future__ import annotations

from typing import Any

from ..worker import _coordex_protocol as _wire

IMPORT_SOURCE = """\
try:
    from _coordex_protocol import from_wire as decode, to_wire as encode
except ImportError:
    from coordex.worker._coordex_protocol import from_wire as decode, to_wire as encode
"""


class NotPlain(TypeError):
    """``path`` names where a value that cannot cross sits, ``type_name`` what it is."""

    def __init__(self, path: str, type_name: str) -> None:
        super().__init__(f"{path} is a {type_name}")
        self.path = path
        self.type_name = type_name


def encode(value: Any, path: str = "value") -> Any:
    """The JSON-ready form of a plain value; raises ``NotPlain`` naming the path."""
    try:
        return _wire.to_wire(value, path)
    except TypeError as exc:  # to_wire's refusal carries where and what
        raise NotPlain(getattr(exc, "where", path), getattr(exc, "type_name", "?")) from None


def decode(data: Any) -> Any:
    """The value :func:`encode` encoded (tuples come back as lists)."""
    return _wire.from_wire(data)
