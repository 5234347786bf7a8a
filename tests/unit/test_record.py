"""The settled record of a call and its one renderer (pure)."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from coordex.core import facts
from coordex.core.errors import CoordexError
from coordex.core.record import CallRecord, Settled, render

SESSION = {"language": "python", "venv_id": None, "session_id": 1, "session_name": "s"}


@pytest.mark.parametrize("kind", [Settled, CallRecord])
def test_a_record_is_frozen_and_made_from_its_fields(kind: type) -> None:
    """Each record sets its fields in a hand-written __init__ (for speed): it must take
    exactly the fields, with their defaults, and stay frozen."""
    params = list(inspect.signature(kind.__init__).parameters.values())[1:]
    found = [(p.name, p.default) for p in params]
    wanted = [(f.name, inspect.Parameter.empty if f.default is dataclasses.MISSING
               else f.default) for f in dataclasses.fields(kind)]
    assert found == wanted
    ran = facts.Ran()
    record = Settled(ran, "own", "stateful", 5.0) if kind is Settled else \
        CallRecord("stateful", SESSION, 1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.mode = "stateless"
    assert dataclasses.replace(record) == record


def test_broken_is_decided_from_facts_not_words() -> None:
    died = Settled(facts.Ran(facts.Died("process", "killed by SIGKILL")), "shell",
                   "stateful", 5.0, lost=True)
    assert died.broken
    timed_out = Settled(facts.Ran(facts.TimedOut(survived=False)), "shell", "stateful", 5.0,
                        lost=True)
    assert timed_out.lost and not timed_out.broken  # restarted at once: not broken
    refused = Settled(facts.Ran(facts.StartFailed(error=CoordexError(
        "environment", "no node fits", "add one"))), "cluster", "stateful", 5.0, lost=True)
    assert not refused.broken


def test_the_rebuild_hint_is_a_field_of_the_record() -> None:
    settled = Settled(facts.Ran(facts.Died("process", "killed by SIGKILL")), "worker",
                      "stateful", 5.0, lost=True)
    on = render(CallRecord("stateful", SESSION, 1.0, settled, log_on=True))
    off = render(CallRecord("stateful", SESSION, 1.0, settled, log_on=False))
    assert "rebuild_session(language='python', session_name='s')" in on["suggestion"]
    assert "rebuild_session with the same coordinates" in off["suggestion"]
    assert on["error"] == off["error"]


@pytest.mark.parametrize("who", ["person", "caller"])
def test_who_stopped_a_call_is_a_field_and_words_it_once(who: str) -> None:
    settled = Settled(facts.Ran(facts.TimedOut(survived=True)), "own", "stateful", 25.0)
    result = render(CallRecord("stateful", SESSION, 1.0, settled, stopped_by=who))  # type: ignore[arg-type]
    assert result["error"].startswith("The call was ")
    assert "timeout of 25" not in result["error"] and "larger timeout" not in result["suggestion"]
    busy = render(CallRecord("stateful", SESSION, 1.0, stopped_by=who))  # type: ignore[arg-type]
    assert busy["error"].startswith("The call was ") and "stayed busy" in busy["error"]
    assert render(CallRecord("stateful", SESSION, 1.0))["error"].startswith("The session")


def test_a_refused_call_is_rendered_by_the_same_function() -> None:
    error = CoordexError("validation", "bad", "fix it")
    result = render(CallRecord("stateless", None, 2.5, refused=error))
    assert result == {"error": "bad", "error_type": "validation", "suggestion": "fix it",
                      "state_mode": "stateless", "duration_ms": 2.5}


def test_a_loss_before_the_call_is_a_field_said_by_every_kind_of_result() -> None:
    """A host started again after it died (SPEC 9): the first call of code says the
    loss, success or error, refused or busy; one that says ``restored`` says that."""
    ok = Settled(facts.Ran(facts.Ok()), "own", "stateless", 5.0)
    raised = Settled(facts.Ran(facts.Raised("ValueError", "x")), "own",
                     "stateful", 5.0)
    refused = CoordexError("validation", "bad", "fix it")
    assert render(CallRecord("stateless", None, 1.0, ok, lost_before=True))["state_lost"] is True
    assert "state_lost" not in render(CallRecord("stateless", None, 1.0, ok))
    assert render(CallRecord("stateful", SESSION, 1.0, raised, lost_before=True))["state_lost"]
    assert not render(CallRecord("stateful", SESSION, 1.0, raised))["state_lost"]
    assert render(CallRecord("stateless", None, 1.0, refused=refused,
                             lost_before=True))["state_lost"] is True
    assert render(CallRecord("stateful", SESSION, 1.0, lost_before=True))["state_lost"] is True
    restored = render(CallRecord("stateful", SESSION, 1.0, ok, restored={"from": "snapshot"},
                                 lost_before=True))
    assert "state_lost" not in restored and restored["restored"] == {"from": "snapshot"}
