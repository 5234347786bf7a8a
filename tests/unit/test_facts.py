"""What places report (pure): one run's facts, and their form on the wire to a node."""

from __future__ import annotations

import dataclasses
import json

from coordex.core import facts
from coordex.core.errors import CoordexError

FULL = facts.Ran(facts.TimedOut(survived=True), "out", "err", True, "'r'", 3, [{"png": "x"}],
                 True, {"names": True, "files": "none"}, ["a"], ["b"], ["/w"])


def test_naming_is_the_run_with_its_names() -> None:
    assert FULL.naming(["x"], ["y"]) == dataclasses.replace(FULL, rebound=["x"], deleted=["y"])


def test_every_event_crosses_the_wire_as_json_and_back() -> None:
    events: list[facts.Event] = [
        facts.OK, facts.Exited(3), facts.Raised("ValueError", "bad", "tb", "not_found", "e", "s"),
        facts.TimedOut(survived=False, stuck=False, taken=False),
        facts.Died("node", "lost", taken=True, started=False), facts.Closed("executor", True, "d"),
        facts.StartFailed("r", copy=True,
                          error=CoordexError("environment", "full", "free some", log="l")),
        facts.Busy(stuck=True)]
    for event in events:
        ran = dataclasses.replace(FULL, event=event)
        back = facts.from_wire(json.loads(json.dumps(facts.to_wire(ran))))
        assert type(back.event) is type(event)
        if isinstance(event, facts.StartFailed):
            assert back.event.error is not None and event.error is not None  # type: ignore[union-attr]
            assert back.event.error.to_dict() == event.error.to_dict()  # type: ignore[union-attr]
        else:
            assert back.event == event
        assert dataclasses.replace(back, event=event) == dataclasses.replace(
            ran, images=list(ran.images), rebound=list(ran.rebound), deleted=list(ran.deleted))


def test_a_bash_copys_names_are_asked_before_they_cross() -> None:
    ran = dataclasses.replace(FULL, rebound=lambda: (["v"], ["w"]))
    wire = facts.to_wire(ran)
    assert (wire["rebound"], wire["deleted"]) == (["v"], ["w"])


def test_a_node_answer_this_coordex_cannot_read_is_a_lost_node_not_an_exception() -> None:
    from coordex.backends.ray.place import _unwrap

    for wire in ({"event": {"kind": "Teleported"}}, {"event": {"kind": "Ok"}, "mood": 1}):
        event = _unwrap({"ran": wire}).event
        assert isinstance(event, facts.Died) and event.what == "node" and event.taken
