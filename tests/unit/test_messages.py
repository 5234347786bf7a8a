"""Model-facing wording: one event reads the same in every place (pure)."""

from __future__ import annotations

import pytest

from coordex.core import messages
from coordex.core.errors import ERROR_TYPES

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
