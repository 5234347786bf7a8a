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
