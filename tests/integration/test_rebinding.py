"""Staleness follows rebinding, not identity: running ``x = 41`` again makes ``x`` fresh
even though Python hands back the same cached int (inspect_session's ``calls_ago``)."""

from __future__ import annotations

from coordex import Executor


def calls_ago(ex: Executor, name: str) -> int | None:
    report = ex.inspect_session(session_name="s")
    return next(item.get("calls_ago") for item in report["names"] if item["name"] == name)


def test_assigning_the_same_value_again_resets_staleness(ex: Executor) -> None:
    ex.execute_code("x = 41\nimport math", state_mode="stateful", session_name="s")
    for _ in range(3):
        ex.execute_code("y = [1]", state_mode="stateful", session_name="s")
    assert calls_ago(ex, "x") == 3
    ex.execute_code("x = 41", state_mode="stateful", session_name="s")
    assert calls_ago(ex, "x") == 0
    ex.execute_code("import math", state_mode="stateful", session_name="s")
    assert calls_ago(ex, "math") == 0


def test_a_cell_that_fails_before_an_assignment_does_not_refresh_it(ex: Executor) -> None:
    ex.execute_code("x = 41", state_mode="stateful", session_name="s")
    ex.execute_code("y = 1", state_mode="stateful", session_name="s")
    failed = ex.execute_code("1 / 0\nx = 41", state_mode="stateful", session_name="s")
    assert failed["error_type"] == "execution"
    assert calls_ago(ex, "x") == 2
