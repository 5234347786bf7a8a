"""Plain values as JSON, written once for both sides of a process boundary.

``CODEC_SOURCE`` is Python source (standard library only, 3.8-compatible) that defines
``encode(value, path)``, ``decode(data)`` and ``NotPlain``. The host executes it here to
check and encode arguments before a call; generated call code embeds the same text so
the process that runs the function (an environment's worker, a read-only fork) encodes
the return value with exactly the same rules.

Plain means: None, bool, int, float, str, bytes, and lists/tuples/dicts (string keys)
of them. Tuples come back as lists. Bytes travel as ``{"__bytes__": base64}``; a user
dict whose only key is ``__bytes__`` or ``__dict__`` is wrapped as ``{"__dict__": ...}``
so it can never be mistaken for an encoded value.
"""

from __future__ import annotations

from typing import Any

CODEC_SOURCE = '''
import base64 as _b64


class NotPlain(TypeError):
    def __init__(self, path, type_name):
        TypeError.__init__(self, "%s is a %s" % (path, type_name))
        self.path = path
        self.type_name = type_name


def encode(value, path="value", _depth=0):
    if _depth > 100:
        raise NotPlain(path, "structure nested more than 100 levels deep")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (bytes, bytearray)):
        return {"__bytes__": _b64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, (list, tuple)):
        return [encode(item, "%s[%d]" % (path, i), _depth + 1) for i, item in enumerate(value)]
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise NotPlain("%s key %r" % (path, key), type(key).__name__)
            out[key] = encode(item, "%s[%r]" % (path, key), _depth + 1)
        if len(out) == 1 and ("__bytes__" in out or "__dict__" in out):
            return {"__dict__": out}
        return out
    kind = type(value)
    name = kind.__name__ if kind.__module__ == "builtins" else kind.__module__ + "." + kind.__qualname__
    raise NotPlain(path, name)


def decode(data):
    if isinstance(data, list):
        return [decode(item) for item in data]
    if isinstance(data, dict):
        if len(data) == 1 and "__bytes__" in data:
            return _b64.b64decode(data["__bytes__"])
        if len(data) == 1 and "__dict__" in data:
            return dict((k, decode(v)) for k, v in data["__dict__"].items())
        return dict((k, decode(v)) for k, v in data.items())
    return data
'''

_namespace: dict[str, Any] = {}
exec(compile(CODEC_SOURCE, "<coordex plain-value codec>", "exec"), _namespace)

NotPlain: type[TypeError] = _namespace["NotPlain"]


def encode(value: Any, path: str = "value") -> Any:
    """The JSON-ready form of a plain value; raises ``NotPlain`` naming the path."""
    return _namespace["encode"](value, path)


def decode(data: Any) -> Any:
    """The value :func:`encode` encoded (tuples come back as lists)."""
    return _namespace["decode"](data)
