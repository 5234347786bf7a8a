"""Model-facing wording: one event reads the same in every place (pure)."""

from __future__ import annotations

import pytest

from coordex.core import facts, messages
from coordex.core.errors import ERROR_TYPES
from coordex.core.record import CallRecord, Settled, render, render_error

PLACES: list[messages.PlaceKind] = ["own", "worker", "shell", "cluster"]


@pytest.mark.parametrize("place", PLACES)
def test_a_survived_timeout_says_state_kept_in_every_place(place: messages.PlaceKind) -> None:
    error = messages.timeout(place, "stateful", 2.5, survived=True, stdout="o", stderr="e")
    assert error["error_type"] == "timeout" and error["state_lost"] is False
    assert "2.5 s" in error["error"]
    assert "interrupted: state kept" in error["suggestion"]
    assert (error["stdout"], error["stderr"]) == ("o", "e")


@pytest.mark.parametrize("place", ["worker", "shell", "cluster"])
def test_a_killed_session_says_state_lost_and_names_rebuild(place: messages.PlaceKind) -> None:
    error = messages.timeout(place, "stateful", 1, survived=False)
    assert error["state_lost"] is True
    assert "state lost" in error["suggestion"]
    assert "rebuild_session" in error["suggestion"]
    crash = messages.crashed(place, "stateful", "killed by signal SIGKILL")
    assert crash["error_type"] == "crashed" and crash["state_lost"] is True
    assert "rebuild_session" in crash["suggestion"]


def test_the_same_event_differs_only_by_the_place_name() -> None:
    worker = messages.timeout("worker", "stateful", 1, survived=False)["error"]
    shell = messages.timeout("shell", "stateful", 1, survived=False)["error"]
    assert worker.replace("worker process", "X") == shell.replace("bash shell", "X")


def test_read_only_and_stateless_never_claim_a_loss_of_session_state() -> None:
    for mode in ("read_only", "stateless"):
        assert messages.timeout("worker", mode, 1, survived=False)["state_lost"] is False
    assert messages.crashed("worker", "read_only", "exit 70")["state_lost"] is False
    assert "unchanged" in messages.crashed("worker", "read_only", "exit 70")["error"]


def test_every_message_has_a_known_type_and_a_suggestion() -> None:
    records = [messages.timeout("own", "stateful", 1, survived=False, stuck=True),
               messages.session_busy(),
               messages.executor_closed().to_dict(),
               messages.start_failed("bash", "no such file").to_dict(),
               messages.environment_not_found(7, [(1, "ledger")]).to_dict()]
    for record in records:
        assert record["error_type"] in ERROR_TYPES
        assert record["suggestion"].strip()
    assert "1 ('ledger')" in records[-1]["suggestion"]


def test_the_rebuild_hint_is_added_once() -> None:
    once = messages.with_rebuild_hint("Do this.")
    assert messages.with_rebuild_hint(once) == once


def test_a_lost_node_says_what_is_gone_and_how_to_get_it_back() -> None:
    lost = messages.node_lost("the actor died", "stateful")
    assert lost["error_type"] == "crashed" and lost["state_lost"] is True
    assert "the actor died" in lost["error"] and messages.REBUILD_HINT in lost["suggestion"]
    assert "nothing was kept" in messages.node_lost("x", "stateless")["error"]
    assert "did not run" in messages.node_lost("x", "read_only")["error"]


def test_a_signal_is_spelled_one_way_in_every_message() -> None:
    assert messages.killed_by(9) == "killed by SIGKILL"
    assert messages.killed_by(15) == "killed by SIGTERM"
    assert messages.killed_by(200) == "killed by signal 200"


def test_one_event_reads_the_same_in_every_place_but_for_the_place_name() -> None:
    """``render``: each event, worded once; only the name of the place differs."""
    events = [facts.Raised("ValueError", "bad value", "Traceback..."),
              facts.TimedOut(survived=True), facts.TimedOut(survived=False),
              facts.TimedOut(survived=False, taken=False),
              facts.Died("process", "killed by SIGKILL"), facts.Died("copy", "killed by SIGKILL"),
              facts.Closed("session"), facts.Closed("session", during=False),
              facts.Closed("executor"), facts.StartFailed("no memory", copy=True)]
    for event in events:
        for mode in ("stateful", "read_only", "stateless"):
            lost = facts.lost_state(facts.Ran(event), mode)
            said = {place: render_error(Settled(facts.Ran(event, stdout="o"), place, mode, 3.0,
                                                lost=lost))
                    for place in ("own", "worker", "cluster")}
            kinds = {(e["error_type"], e["state_lost"], e["stdout"]) for e in said.values()}
            assert len(kinds) == 1, (event, mode, said)
            words = {e["error"].replace(messages.WORDS[p].process, "PLACE")
                     for p, e in said.items()}
            assert len(words) == 1, (event, mode, words)


def test_a_raised_coordex_error_keeps_its_own_type_and_suggestion() -> None:
    event = facts.Raised("CallError", "m", "tb", error_type="not_found",
                         error="No stored function 'f'.", suggestion="Define it first.")
    error = render_error(Settled(facts.Ran(event), "worker", "stateful", 3.0))
    assert (error["error_type"], error["error"], error["suggestion"]) == (
        "not_found", "No stored function 'f'.", "Define it first.")


def test_a_death_before_the_code_was_read_says_so() -> None:
    ran = facts.Ran(facts.Died("process", "killed by SIGKILL", started=False))
    error = render_error(Settled(ran, "shell", "stateful", 3.0, attempts=2,
                                 hows=("killed by SIGKILL",), lost=True))
    assert "before it read the code" in error["error"] and "not retried" not in error["error"]


@pytest.mark.parametrize("mode", ["stateful", "stateless", "read_only"])
@pytest.mark.parametrize("who", ["person", "caller"])
def test_a_stopped_call_says_it_was_interrupted_once(mode: str, who: str) -> None:

    for survived in (True, False):
        settled = Settled(facts.Ran(facts.TimedOut(survived=survived)), "own", mode, 25,
                          lost=facts.lost_state(facts.Ran(facts.TimedOut(survived=survived)),
                                                mode))
        said = render(CallRecord(mode, {}, 1.0, settled, stopped_by=who))  # type: ignore[arg-type]
        error = said["error"]
        head = "interrupted from the page" if who == "person" else "cancelled by its caller"
        assert error.startswith(f"The call was {head}"), error
        assert "and was interrupted" not in error and "and was stopped" not in error, error
        assert "timeout of 25" not in error, error


@pytest.mark.parametrize("survived", [True, False])
def test_a_retried_call_that_then_times_out_tells_one_story(survived: bool) -> None:
    """N5: it read "…state from before this call is lost; then: … the session survived
    with its state": two stories, the second false."""
    ran = facts.Ran(facts.TimedOut(survived=survived), stdout="o")
    error = render_error(Settled(ran, "worker", "stateful", 4, attempts=2,
                                 hows=("killed by SIGKILL",), lost=True))
    assert error["error_type"] == "timeout" and error["state_lost"] is True
    text = error["error"] + " " + error["suggestion"]
    assert "survived" not in text and "state kept" not in text and "then:" not in text
    assert "killed by SIGKILL" in error["error"] and "timeout of 4 s" in error["error"]
    assert "state" in error["error"] and "lost" in error["error"]
    assert "rebuild_session" in error["suggestion"]
    for mode in ("stateless", "read_only"):
        other = render_error(Settled(ran, "worker", mode, 4, attempts=2,  # type: ignore[arg-type]
                                     hows=("killed by SIGKILL",)))
        assert "died during this call" in other["error"] and "survived" not in other["error"]
