"""The one executor contract (coordex.contract) holds for every executor.

mypy checks the signatures (the ``TYPE_CHECKING`` block at the end of contract.py runs
in the suite's ``mypy``); these hold the names at run time.
"""

from __future__ import annotations

from coordex.contract import ExecutorLike


def test_the_executor_satisfies_the_contract(tmp_path) -> None:
    from coordex import Executor

    with Executor(root=tmp_path) as ex:
        assert isinstance(ex, ExecutorLike)


def test_the_confined_executor_satisfies_the_contract(tmp_path) -> None:
    from coordex import ConfinedExecutor

    confined = ConfinedExecutor(tmp_path / "t", lazy=True)
    try:
        assert isinstance(confined, ExecutorLike)
    finally:
        confined.close()


def test_the_hosting_name_is_the_same_contract() -> None:
    from coordex.hosting.contract import ExecutorLike as hosted

    assert hosted is ExecutorLike


def test_the_axes_are_defined_once() -> None:
    """One Language and one StateMode (core.coordinates); every other name is that one."""
    import re
    from pathlib import Path

    import coordex
    from coordex.backends.env import workers
    from coordex.core import coordinates, messages, shapes
    from coordex.eval import tasks
    from coordex.library import functions

    for module in (shapes, tasks):
        assert module.Language is coordinates.Language
    for alias in (shapes.StateMode, tasks.StateMode, functions.StateMode, messages.Mode,
                  workers.RunMode):
        assert alias is coordinates.StateMode
    literal = re.compile(r"Literal\[\s*\"(stateless|stateful|read_only|python|bash)\"")
    defined = [str(path) for path in Path(coordex.__file__).parent.rglob("*.py")
               if literal.search(path.read_text(encoding="utf-8"))]
    assert [Path(p).name for p in defined] == ["coordinates.py"], defined
