"""``core.quick.quick_init``: the objects every call makes are built by a faster
``__init__`` with the same signature, and are what the dataclass's own would build."""

from __future__ import annotations

import dataclasses
import inspect
import threading
from typing import Any

import pytest

from coordex.backends.base import RunRequest
from coordex.core import facts
from coordex.core.quick import quick_init
from coordex.core.record import CallRecord, Settled


def _twin(cls: type) -> type:
    """``cls`` as ``@dataclass(frozen=True)`` alone would make it."""
    spec = [(f.name, Any, dataclasses.field(default=f.default, default_factory=f.default_factory))
            for f in dataclasses.fields(cls)]
    return dataclasses.make_dataclass(cls.__name__, spec, frozen=True)


CASES: list[tuple[type, tuple[Any, ...], dict[str, Any]]] = [
    (RunRequest, ("x = 1", 2.5), {}),
    (RunRequest, ("x", 1.0, print, 10), {"cancel": threading.Event(), "env": {"A": "b"},
                                          "protect_paths": (".",), "value_limit": 5}),
    (facts.Ran, (), {}),
    (facts.Ran, (facts.Raised("E", "m", "tb"), "o", "e", True, "1", 3, ["i"], True,
                 {"files": "none"}, ["x"], ["y"], ["f"]), {}),
    (facts.Ran, (facts.OK,), {"stdout": "s", "written": None}),
    (Settled, (facts.Ran(), "own", "stateful", 30.0), {}),
    (Settled, (facts.Ran(), "worker", "read_only", 1.0, 2, ("killed",), True, True, True), {}),
    (CallRecord, ("stateful", {"session_id": 0}, 1.5), {"log_on": True}),
]


@pytest.mark.parametrize(("cls", "args", "kwargs"), CASES)
def test_built_as_the_dataclass_would_build_it(cls: type, args: tuple[Any, ...],
                                               kwargs: dict[str, Any]) -> None:
    assert cls.__init__.__qualname__ == f"{cls.__qualname__}.__init__"  # the quick one
    twin = _twin(cls)
    made, expected = cls(*args, **kwargs), twin(*args, **kwargs)
    assert vars(made) == vars(expected)
    assert [p.name for p in inspect.signature(cls).parameters.values()] == \
        [p.name for p in inspect.signature(twin).parameters.values()]
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.stdout = "changed"  # frozen still
    assert dataclasses.replace(made) == made


def test_a_factory_default_is_fresh_and_missing_arguments_refused() -> None:
    assert RunRequest("a", 1.0).protect_paths == ()
    with pytest.raises(TypeError):
        RunRequest("a")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        facts.Ran(nonsense=1)  # type: ignore[call-arg]

    @quick_init
    @dataclasses.dataclass(frozen=True)
    class Box:
        items: list[int] = dataclasses.field(default_factory=list)

    assert Box().items is not Box().items


def test_a_class_it_cannot_speak_for_is_left_as_it_is() -> None:
    @dataclasses.dataclass(frozen=True)
    class Later:
        a: int

        def __post_init__(self) -> None:
            pass

    @dataclasses.dataclass(frozen=True, slots=True)
    class Slotted:
        a: int

    @dataclasses.dataclass(frozen=True)
    class KeywordOnly:
        a: int = dataclasses.field(kw_only=True)

    for cls in (Later, Slotted, KeywordOnly):
        own = cls.__init__
        assert quick_init(cls).__init__ is own
