"""The session registry: keys, names, the cap, the lifecycle and provenance."""

from __future__ import annotations

import pytest

from coordex.core.coordinates import check_coordinate
from coordex.core.errors import CoordexError
from coordex.core.registry import PLAN_KEY, SessionRegistry


def stateful(**kwargs: object):  # type: ignore[no-untyped-def]
    return check_coordinate(state_mode="stateful", **kwargs)  # type: ignore[arg-type]


def test_plan_namespace_exists_from_the_start_and_counts() -> None:
    reg = SessionRegistry(max_sessions=2)
    assert [e.key for e in reg.entries()] == [PLAN_KEY]
    reg.resolve_or_reserve(stateful(language="bash"), 1.0)
    with pytest.raises(CoordexError) as info:
        reg.resolve_or_reserve(stateful(session_name="x"), 2.0)
    record = info.value.to_dict()
    assert record["error_type"] == "capacity"
    assert len(record["sessions"]) == 2
    assert "close_session" in record["suggestion"]


def test_names_take_the_lowest_free_id_above_zero_per_language_and_env() -> None:
    reg = SessionRegistry()
    a, created = reg.resolve_or_reserve(stateful(session_name="a"), 0)
    assert created and a.session_id == 1
    b, _ = reg.resolve_or_reserve(stateful(session_name="b"), 0)
    assert b.session_id == 2
    again, created = reg.resolve_or_reserve(stateful(session_name="a"), 0)
    assert again == a and not created
    bash_a, _ = reg.resolve_or_reserve(stateful(language="bash", session_name="a"), 0)
    assert bash_a.session_id == 1 and bash_a.language == "bash"
    env_a, _ = reg.resolve_or_reserve(stateful(session_name="a", venv_id=4), 0)
    assert env_a.session_id == 1 and env_a.venv_id == 4
    assert len({a, bash_a, env_a}) == 3


def test_not_found_lists_open_sessions_and_guesses_the_name() -> None:
    reg = SessionRegistry()
    reg.resolve_or_reserve(stateful(session_name="audit"), 0)
    with pytest.raises(CoordexError) as info:
        reg.require(check_coordinate(state_mode="read_only", session_name="audti"))
    record = info.value.to_dict()
    assert record["error_type"] == "not_found"
    assert "'audti'" in record["error"]
    assert "Did you mean session_name='audit'?" in record["suggestion"]
    assert "'audit' (python, own interpreter)" in record["suggestion"]


def test_plan_namespace_cannot_be_closed_but_others_can() -> None:
    reg = SessionRegistry()
    with pytest.raises(CoordexError) as info:
        reg.remove(PLAN_KEY)
    assert info.value.error_type == "validation"
    key, _ = reg.resolve_or_reserve(stateful(session_name="x"), 0)
    reg.remove(key)
    assert reg.find(stateful(session_name="x")) is None
    again, _ = reg.resolve_or_reserve(stateful(session_name="y"), 0)
    assert again.session_id == 1  # the freed id is reused


def test_lifecycle_moves_follow_the_table() -> None:
    reg = SessionRegistry()
    key, _ = reg.resolve_or_reserve(stateful(session_id=3), 0)
    reg.move(key, "idle")
    reg.move(key, "busy")
    reg.move(key, "idle")
    reg.remove(key)
    reg2 = SessionRegistry()
    key2, _ = reg2.resolve_or_reserve(stateful(session_id=3), 0)
    reg2.move(key2, "idle")
    reg2.move(key2, "closed")
    with pytest.raises(RuntimeError, match="illegal session move"):
        reg2.move(key2, "busy")


def test_provenance_counts_calls_since_binding() -> None:
    reg = SessionRegistry()
    call1 = reg.begin_call(PLAN_KEY, 1.0)
    reg.record_bindings(PLAN_KEY, call1, ["x", "y"])
    call2 = reg.begin_call(PLAN_KEY, 2.0)
    reg.record_bindings(PLAN_KEY, call2, ["y"], deleted=["x"])
    reg.begin_call(PLAN_KEY, 3.0)
    assert reg.provenance(PLAN_KEY, "y") == (2, 1)
    assert reg.provenance(PLAN_KEY, "x") == (0, 3)  # unknown / pre-existing names are call 0
