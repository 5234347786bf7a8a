"""SPEC section 6 as a table (pure): what follows a process's death under a call."""

from __future__ import annotations

from coordex.core.faults import Attempt, next_step, retried, state_lost

CLEAN = Attempt()
PROCESS = Attempt(died="process")
COPY = Attempt(died="copy")


def test_a_call_nothing_died_under_is_done() -> None:
    assert next_step(True, [CLEAN]) == next_step(False, [CLEAN]) == "done"
    assert not retried([CLEAN]) and not state_lost([CLEAN])


def test_a_worker_death_is_retried_once_then_crashed() -> None:
    assert next_step(True, [PROCESS]) == "retry"
    assert next_step(True, [PROCESS, CLEAN]) == "done"
    assert next_step(True, [PROCESS, PROCESS]) == "crashed"
    assert retried([PROCESS, CLEAN]) and state_lost([PROCESS, CLEAN])


def test_a_shell_is_never_retried() -> None:
    assert next_step(False, [PROCESS]) == "crashed"


def test_only_the_copy_dying_keeps_the_state() -> None:
    assert next_step(True, [COPY]) == "retry"
    assert not state_lost([COPY, CLEAN])


def test_a_process_found_dead_and_replaced_is_a_loss_reported_by_that_call() -> None:
    assert state_lost([Attempt(replaced=True)])
    assert next_step(True, [Attempt(replaced=True)]) == "done"
