"""A frozen dataclass made on every call, for less: :func:`quick_init`.

A frozen dataclass's own ``__init__`` sets each field through ``object.__setattr__``
(a global, an attribute and a call a field: about 70 ns each); the objects every call
makes (its request, what ran, what the table settled, the call's record: 40-odd fields
in all) then cost a few microseconds of a call of 50. :func:`quick_init` gives such a
class an ``__init__`` with the same signature that stores the fields in the instance's
``__dict__`` directly. The class stays frozen (assignment still raises), equal, hashed
and shown as before; only how it is built changes.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")


class _Unset:
    """A default_factory field's default in the signature: the factory is called."""

    def __repr__(self) -> str:
        return "<factory>"


_UNSET: Any = _Unset()


def quick_init(cls: type[T]) -> type[T]:
    """``cls`` (a frozen dataclass with a ``__dict__``) with a faster ``__init__``; a
    class this cannot speak for (``__slots__``, ``__post_init__``, fields left out of
    ``__init__`` or keyword-only, ``InitVar``) is returned unchanged."""
    params = dataclasses.fields(cls)  # type: ignore[arg-type]
    own = vars(cls)
    if "__slots__" in own or hasattr(cls, "__post_init__") or any(
            not f.init or f.kw_only for f in params) or len(params) != len(
            [f for f in own.get("__dataclass_fields__", {}).values() if f.init]):
        return cls
    env: dict[str, Any] = {"_UNSET": _UNSET}
    signature, body = [], []
    for f in params:
        if f.default is not dataclasses.MISSING:
            env[f"_d_{f.name}"] = f.default
            signature.append(f"{f.name}=_d_{f.name}")
            body.append(f"    d[{f.name!r}] = {f.name}")
        elif f.default_factory is not dataclasses.MISSING:
            env[f"_f_{f.name}"] = f.default_factory
            signature.append(f"{f.name}=_UNSET")
            body.append(f"    d[{f.name!r}] = _f_{f.name}() if {f.name} is _UNSET else {f.name}")
        else:
            signature.append(f.name)
            body.append(f"    d[{f.name!r}] = {f.name}")
    source = (f"def __init__(self, {', '.join(signature)}) -> None:\n"
              "    d = self.__dict__\n" + "\n".join(body) + "\n")
    exec(source, env)
    init = env["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    cls.__init__ = init  # type: ignore[method-assign]
    return cls
