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
from coordex.core import facts
from coordex.core.errors import CoordexError
from coordex.core.record import Settled
from coordex.core.registry import PLAN_KEY
from coordex.sessions import SessionTable, settle
from tests.said import outcome as told


class FakeSession:
    def __init__(self) -> None:
        self.closed = False
        self.script: list[facts.Ran] = []  # what the next runs report (else Ok)

    def run(self, request: RunRequest) -> facts.Ran:
        return self.script.pop(0) if self.script else facts.Ran(stdout=request.code)

    def run_read_only(self, request: RunRequest) -> facts.Ran:
        return facts.Ran(stdout=request.code, isolation={})

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
        table.finish(key, call, None, ["x"])
    assert state(table, "a") == "idle"
    assert table.provenance(key, "x") == (1, 0)


def test_a_crash_that_lost_state_leaves_the_session_broken_until_its_next_call() -> None:
    table = SessionTable(5, FakeSession())
    made: list[FakeSession] = []
    with table.stateful(stateful("a"), 1.0, None, opener(made)) as (key, _, call):
        table.finish(key, call, None, ["x"])
    with table.stateful(stateful("a"), 1.0, None, opener(made)) as (key, _, call):
        crash = Settled(facts.Ran(facts.Died("process", "killed")), "shell", "stateful", 5.0,
                        lost=True)
        table.finish(key, call, crash, lost=True)
    assert state(table, "a") == "broken"
    with table.stateful(stateful("a"), 1.0, None, opener(made)) as (key, _, call):
        assert state(table, "a") == "busy"
        table.finish(key, call, None, ["y"], lost=True)
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
        table.finish(key, call, None)


def test_a_busy_session_yields_no_session_after_the_timeout() -> None:
    table = SessionTable(5, FakeSession())
    made: list[FakeSession] = []
    inside, release = threading.Event(), threading.Event()

    def hold() -> None:
        with table.stateful(stateful("a"), 1.0, None, opener(made)) as (key, _, call):
            inside.set()
            release.wait(5)
            table.finish(key, call, None)

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
            table.finish(key, call, None)
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
        table.finish(key, call, None)
    table.remove(stateful("a"))
    with pytest.raises(KeyError):
        table.registry.move(key, "idle")


class _Place:
    def __init__(self, kind: str, retries: bool) -> None:
        self.kind, self.retries = kind, retries


def test_a_replacement_is_news_once_and_only_if_not_already_said() -> None:
    """The one "loss already said" flag: a process found dead and replaced is said as
    ``state_lost`` unless the session's last result said it died during that call."""
    made: list[FakeSession] = []
    table = SessionTable(4, FakeSession())
    place = _Place("shell", retries=False)

    def call(*script: facts.Ran) -> dict[str, Any]:
        with table.stateful(stateful("s"), 5, None, opener(made)) as (key, session, n):
            assert isinstance(session, FakeSession)
            session.script = list(script)
            settled = table.run(key, place, "stateful", RunRequest("x", 5))  # type: ignore[arg-type]
            table.finish(key, n, settled, lost=settled.lost)
            return told(settled)

    assert call(facts.Ran(replaced=True)).get("state_lost") is True  # found dead: news
    # Killed again before the next call: a new loss of the fresh process, said again.
    assert call(facts.Ran(replaced=True)).get("state_lost") is True
    assert "state_lost" not in call()
    died = call(facts.Ran(facts.Died("process", "killed by SIGKILL")))
    assert died["state_lost"] is True and died["error"]["error_type"] == "crashed"
    assert "state_lost" not in call(facts.Ran(replaced=True))  # the same loss, said already
    assert call(facts.Ran(replaced=True)).get("state_lost") is True  # a new one


def test_a_retry_runs_in_what_is_left_of_the_one_timeout() -> None:
    import time

    seen: list[float] = []

    def run(request: RunRequest) -> facts.Ran:
        seen.append(request.timeout)
        time.sleep(0.3)
        return facts.Ran(facts.Died("process", "killed by SIGKILL"))

    outcome = told(settle(_Place("worker", retries=True), "stateful", run,  # type: ignore[arg-type]
                          RunRequest("x", 2.0)))
    assert len(seen) == 2 and seen[0] == 2.0 and seen[1] < 1.75
    assert outcome["retried"] is True and outcome["state_lost"] is True
    assert "died 2 times" in outcome["error"]["error"]
    seen.clear()
    settle(_Place("worker", retries=True), "stateful", run,  # type: ignore[arg-type]
           RunRequest("x", 0.6))
    assert len(seen) == 1  # under the floor left: no retry, crashed


def test_a_call_a_lost_node_had_taken_is_not_run_again() -> None:
    runs: list[int] = []

    def run(request: RunRequest) -> facts.Ran:
        runs.append(1)
        return facts.Ran(facts.Died("node", "the node died", taken=True))

    outcome = told(settle(_Place("cluster", retries=True), "stateful", run,  # type: ignore[arg-type]
                          RunRequest("x", 30)))
    assert runs == [1] and outcome["error"]["error_type"] == "crashed"
    assert "retried" not in outcome


def test_a_stateless_call_never_says_state_lost() -> None:
    for event in (facts.Died("process", "x"), facts.TimedOut(survived=False),
                  facts.Closed("executor"), facts.StartFailed("no bash")):
        outcome = told(settle(_Place("shell", retries=False), "stateless",  # type: ignore[arg-type]
                              lambda r, e=event: facts.Ran(e), RunRequest("x", 5)))
        assert "state_lost" not in outcome and outcome["error"]["state_lost"] is False
