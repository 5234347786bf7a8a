"""SPEC section 6 as a table (pure): what follows a process's death under a call."""

from __future__ import annotations

from coordex.core import facts
from coordex.core.faults import Attempt, attempt, next_step, retried

CLEAN = Attempt()
PROCESS = Attempt(died="process")
COPY = Attempt(died="copy")


def test_a_call_nothing_died_under_is_done() -> None:
    assert next_step(True, [CLEAN]) == next_step(False, [CLEAN]) == "done"
    assert not retried([CLEAN])


def test_a_worker_death_is_retried_once_then_crashed() -> None:
    assert next_step(True, [PROCESS]) == "retry"
    assert next_step(True, [PROCESS, CLEAN]) == "done"
    assert next_step(True, [PROCESS, PROCESS]) == "crashed"
    assert retried([PROCESS, CLEAN])


def test_a_shell_is_never_retried() -> None:
    assert next_step(False, [PROCESS]) == "crashed"


def test_only_the_copy_dying_keeps_the_state() -> None:
    assert next_step(True, [COPY]) == "retry"
    copy = facts.Ran(facts.Died("copy", "killed by SIGKILL"))
    assert attempt(copy) == COPY
    assert not facts.lost_state(copy, "stateful") and not facts.lost_state(copy, "read_only")


def test_a_call_a_lost_node_had_taken_is_never_run_again() -> None:
    taken = attempt(facts.Ran(facts.Died("node", "the node died", taken=True)))
    assert next_step(True, [taken]) == "crashed"
    assert next_step(True, [attempt(facts.Ran(facts.Died("node", "gone")))]) == "retry"


def test_what_loses_the_state_by_mode() -> None:
    def lost(event: facts.Event, mode: str) -> bool:
        return facts.lost_state(facts.Ran(event), mode)

    for event in (facts.Died("process", "x"), facts.Closed("session", during=False)):
        assert lost(event, "stateful") and lost(event, "read_only")
        assert not lost(event, "stateless")  # a stateless call has no state to lose
    killed = facts.TimedOut(survived=False)
    assert lost(killed, "stateful") and not lost(killed, "read_only")
    assert lost(facts.Exited(3), "stateful") and not lost(facts.Exited(3), "stateless")
    for event in (facts.OK, facts.Raised("ValueError", "bad"), facts.TimedOut(survived=True),
                  facts.TimedOut(survived=False, stuck=True), facts.Busy()):
        assert not lost(event, "stateful")


def test_a_call_whose_process_died_before_reading_it_runs_again_in_any_place() -> None:
    """Its code never ran, so even a shell (never retried) runs it on a fresh process."""
    unread = attempt(facts.Ran(facts.Died("process", "killed by SIGKILL", started=False)))
    assert next_step(False, [unread]) == "retry"
    assert next_step(False, [unread, unread]) == "crashed"
