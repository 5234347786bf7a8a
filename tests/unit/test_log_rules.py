"""Pure rules of the call log: which calls a rebuild replays, the hint, the stats, the cap."""

from __future__ import annotations

from typing import Any

from coordex.core.messages import rebuild_hint
from coordex.log.rebuild import lives, lost_calls, replay_failed, unfinished_rebuild
from coordex.log.stats import summarize
from coordex.log.store import CODE_CAP_BYTES, cap_code


def call(seq: int, mode: str = "stateful", outcome: str = "ok", lost: bool = False,
         **extra: Any) -> dict[str, Any]:
    return {"seq": seq, "kind": "call", "state_mode": mode, "outcome": outcome,
            "state_lost": lost, **extra}


def event(seq: int, kind: str) -> dict[str, Any]:
    return {"seq": seq, "kind": kind, "state_lost": False}


def seqs(rows: list[dict[str, Any]] | None) -> list[int] | None:
    return None if rows is None else [r["seq"] for r in rows]


def test_a_loss_starts_a_new_life_and_a_close_ends_one() -> None:
    rows = [call(1), call(2), call(3, lost=True), call(4), event(5, "close"), call(6)]
    assert [[r["seq"] for r in life] for life in lives(rows)] == [[1, 2], [3, 4, 5], [6]]


def test_a_live_session_replays_the_life_before_its_last_loss() -> None:
    rows = [call(1), call(2, "read_only"), call(3, "stateless"), call(4, outcome="execution"),
            call(5), call(6, lost=True), call(7)]
    assert seqs(lost_calls(rows, live=True)) == [1, 5]


def test_a_live_session_that_lost_nothing_has_nothing_to_rebuild() -> None:
    assert lost_calls([call(1), call(2)], live=True) is None
    after_rebuild = [call(1), event(2, "close"), event(3, "rebuild"), call(4, replay_of=1)]
    assert lost_calls(after_rebuild, live=True) is None


def test_a_dead_or_closed_session_replays_its_last_life() -> None:
    rows = [call(1), call(2, lost=True), call(3), event(4, "close")]
    assert seqs(lost_calls(rows, live=False)) == [3]
    rebuilt = [call(1), event(2, "rebuild"), call(3, replay_of=1), call(4)]
    assert seqs(lost_calls(rebuilt, live=False)) == [3, 4]


def test_a_life_that_built_nothing_after_a_loss_is_passed_over() -> None:
    crashed = [call(1), call(2), call(3, outcome="crashed", lost=True)]
    assert seqs(lost_calls(crashed, live=False)) == [1, 2]
    shell_exit = [call(1), call(2, lost=True)]  # `exit 3`: ok, but it ended the state
    assert seqs(lost_calls(shell_exit, live=False)) == [1]
    assert seqs(lost_calls([call(1, outcome="execution")], live=False)) == []


def test_a_replay_fails_on_an_error_or_a_new_non_zero_exit() -> None:
    assert replay_failed({"exit_code": None}, {"error_type": "execution"})
    assert replay_failed({"exit_code": 0}, {"exit_code": 1})
    assert not replay_failed({"exit_code": 2}, {"exit_code": 2})
    assert not replay_failed({"exit_code": None}, {"result": "1"})


def test_the_hint_names_the_call_to_make() -> None:
    hint = rebuild_hint({"language": "bash", "venv_id": 3, "session_id": 2, "session_name": "etl"})
    assert "rebuild_session(language='bash', session_name='etl', venv_id=3)" in hint
    assert "session_id=2" in rebuild_hint({"language": "python", "venv_id": None,
                                           "session_id": 2, "session_name": None})


def test_code_is_capped_in_utf8_bytes_without_splitting_a_character() -> None:
    assert cap_code("print(1)") == ("print(1)", False)
    text = "é" * CODE_CAP_BYTES
    capped, cut = cap_code(text)
    assert cut and len(capped.encode()) <= CODE_CAP_BYTES and text.startswith(capped)


def test_stats_count_per_session_and_per_coordinate() -> None:
    where = {"language": "python", "venv_id": None, "session_id": 1, "session_name": "a"}
    rows = [
        {**call(1), **where},
        {**call(2, outcome="execution"), **where},
        {**call(3, "read_only", changed={"rebound": ["x"], "deleted": []}), **where},
        {**call(4, "read_only"), **where},
        {**call(5, lost=True), **where},
        {**event(6, "rebuild"), **where},
        {**call(7, replay_of=1), **where},
        {**call(8, "stateless", outcome="timeout"), "language": "bash", "venv_id": None,
         "session_id": None, "session_name": None},
    ]
    report = summarize(rows)
    (session,) = report["sessions"]
    assert (session["calls"], session["errors"], session["state_losses"], session["rebuilds"],
            session["replayed_calls"], session["read_only_changed"]) == (6, {"execution": 1}, 1, 1, 1, 1)
    places = {(c["language"], c["state_mode"]): c for c in report["coordinates"]}
    assert places[("python", "read_only")]["read_only_changed"] == 1
    assert places[("bash", "stateless")]["errors"] == {"timeout": 1}
    assert places[("python", "stateful")]["rebuilds"] == 1
    assert report["totals"]["calls"] == 7


def test_a_rebuild_that_stopped_at_a_failure_can_be_asked_again() -> None:
    stopped = [call(1), call(2), event(3, "close"),
               {**event(4, "rebuild"), "changed": {"replays": [1, 2]}},
               call(5, replay_of=1), call(6, outcome="execution", replay_of=2)]
    assert lost_calls(stopped, live=True) is None
    assert unfinished_rebuild(stopped) == [1, 2]
    finished = [*stopped[:5], call(6, replay_of=2)]
    assert unfinished_rebuild(finished) is None
    lost_again = [*finished, call(7, lost=True)]
    assert unfinished_rebuild(lost_again) is None
