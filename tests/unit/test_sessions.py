"""The session table, the one owner of session state, with sessions that are plain objects.

No process is started: a place reports facts in its outcome and the table decides the
lifecycle from them.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from coordex.backends.base import RunRequest, Session
from coordex.core import coordinates as coords
from coordex.core import messages
from coordex.core.errors import CoordexError
from coordex.core.registry import PLAN_KEY
from coordex.sessions import SessionTable


class FakeSession:
    def __init__(self) -> None:
        self.closed = False

    def run(self, request: RunRequest) -> dict[str, Any]:
        return {"stdout": request.code}

    def run_read_only(self, request: RunRequest) -> dict[str, Any]:
        return {"stdout": request.code, "isolation": {}}

    def inspect(self) -> dict[str, Any]:
        return {"names": []}

    def alive(self) -> bool:
        return not self.closed

    def close(self) -> None:
        self.closed = True


def stateful(name: str | None = None) -> coords.Coordinate:
    return coords.check_coordinate("bash", "stateful", None, name, None)


def opener(made: list[FakeSession]) -> Any:
    def open_one(key: Any) -> Session:
        made.append(FakeSession())
        return made[-1]
    return open_one


def state(table: SessionTable, name: str) -> str:
    key = table.registry.require(stateful(name))
    entry = table.registry.get(key)
    assert entry is not None
    return entry.state


def test_a_fake_session_is_a_session() -> None:
    assert isinstance(FakeSession(), Session)


def test_a_call_moves_starting_idle_busy_idle() -> None:
    table = SessionTable(5, FakeSession())
    made: list[FakeSession] = []
    with table.stateful(stateful("a"), 1.0, None, opener(made)) as (key, session, call):
        assert session is made[0] and call == 1
        assert state(table, "a") == "busy"
        table.finish(key, call, {"rebound": ["x"]})
    assert state(table, "a") == "idle"
    assert table.provenance(key, "x") == (1, 0)


def test_a_crash_that_lost_state_leaves_the_session_broken_until_its_next_call() -> None:
    table = SessionTable(5, FakeSession())
    made: list[FakeSession] = []
    with table.stateful(stateful("a"), 1.0, None, opener(made)) as (key, _, call):
        table.finish(key, call, {"rebound": ["x"]})
    with table.stateful(stateful("a"), 1.0, None, opener(made)) as (key, _, call):
        table.finish(key, call, {"error": messages.crashed("shell", "stateful", "killed")})
    assert state(table, "a") == "broken"
    with table.stateful(stateful("a"), 1.0, None, opener(made)) as (key, _, call):
        assert state(table, "a") == "busy"
        table.finish(key, call, {"state_lost": True, "rebound": ["y"]})
    assert state(table, "a") == "idle"
    # Names bound before the loss are gone with it; provenance keeps only the new ones.
    assert table.provenance(key, "x") == (0, 3)
    assert table.provenance(key, "y") == (3, 0)
    assert len(made) == 1  # the place replaces its process; the table keeps the session


def test_a_session_that_cannot_start_frees_its_place_under_the_cap() -> None:
    table = SessionTable(2, FakeSession())

    def broken(key: Any) -> Session:
        raise OSError("no such program")

    with pytest.raises(CoordexError) as caught, \
            table.stateful(stateful("a"), 1.0, None, broken):
        pass
    assert caught.value.error_type == "crashed"
    assert table.registry.find(stateful("a")) is None
    made: list[FakeSession] = []
    with table.stateful(stateful("b"), 1.0, None, opener(made)) as (key, session, call):
        assert session is not None
        table.finish(key, call, {})


def test_a_busy_session_yields_no_session_after_the_timeout() -> None:
    table = SessionTable(5, FakeSession())
    made: list[FakeSession] = []
    inside, release = threading.Event(), threading.Event()

    def hold() -> None:
        with table.stateful(stateful("a"), 1.0, None, opener(made)) as (key, _, call):
            inside.set()
            release.wait(5)
            table.finish(key, call, {})

    holder = threading.Thread(target=hold)
    holder.start()
    inside.wait(5)
    with table.stateful(stateful("a"), 0.05, None, opener(made)) as (_, session, _call):
        assert session is None
    release.set()
    holder.join()


def test_close_moves_to_closed_and_drain_hands_back_every_session() -> None:
    plan = FakeSession()
    table = SessionTable(5, plan)
    made: list[FakeSession] = []
    for name in ("a", "b"):
        with table.stateful(stateful(name), 1.0, None, opener(made)) as (key, _, call):
            table.finish(key, call, {})
    record, session = table.remove(stateful("a"))
    assert record["session_name"] == "a" and session is made[0]
    assert table.registry.find(stateful("a")) is None
    assert set(map(id, table.drain())) == {id(plan), id(made[1])}
    assert table.drain() == []
    with pytest.raises(CoordexError) as caught:
        table.existing(stateful("b"))
    assert caught.value.error == "This Executor is closed."


def test_the_plan_namespace_cannot_be_removed() -> None:
    table = SessionTable(5, FakeSession())
    plan = coords.check_coordinate("python", "stateful", 0, None, None)
    with pytest.raises(CoordexError) as caught:
        table.remove(plan)
    assert caught.value.error_type == "validation"
    assert PLAN_KEY in table.registry


def test_an_illegal_move_is_a_bug_and_raises() -> None:
    table = SessionTable(5, FakeSession())
    made: list[FakeSession] = []
    with table.stateful(stateful("a"), 1.0, None, opener(made)) as (key, _, call):
        table.finish(key, call, {})
    table.remove(stateful("a"))
    with pytest.raises(KeyError):
        table.registry.move(key, "idle")
