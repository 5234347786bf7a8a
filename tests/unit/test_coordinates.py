"""The coordinate rules of SPEC sections 1 and 4, without processes or disk."""

from __future__ import annotations

import pytest

from coordex.core.coordinates import check_coordinate, check_timeout
from coordex.core.errors import CoordexError


def error_of(**kwargs: object) -> dict[str, object]:
    with pytest.raises(CoordexError) as info:
        check_coordinate(**kwargs)  # type: ignore[arg-type]
    return info.value.to_dict()


def test_read_only_without_session_is_the_seed_error_verbatim() -> None:
    record = error_of(state_mode="read_only")
    assert record == {
        "error": "Cannot use state_mode='read_only' without specifying a session.",
        "error_type": "validation",
        "suggestion": "Provide session_id or session_name (must refer to an existing session), "
                      "or use state_mode='stateless'.",
    }


def test_stateless_may_not_name_a_session() -> None:
    record = error_of(state_mode="stateless", session_name="audit")
    assert record["error_type"] == "validation"
    assert "session_name='audit'" in record["error"]
    assert "stateful" in record["suggestion"]


def test_both_id_and_name_is_rejected_naming_both() -> None:
    record = error_of(state_mode="stateful", session_id=1, session_name="a")
    assert record["error_type"] == "validation"
    assert "session_id=1" in record["suggestion"] and "session_name='a'" in record["suggestion"]


@pytest.mark.parametrize(("kwargs", "hint"), [
    ({"language": "pyhton"}, "language='python'"),
    ({"language": "sh"}, "language='bash'"),
    ({"state_mode": "statefull"}, "state_mode='stateful'"),
    ({"state_mode": "readonly"}, "state_mode='read_only'"),
])
def test_typos_get_a_did_you_mean(kwargs: dict[str, object], hint: str) -> None:
    record = error_of(**kwargs)
    assert record["error_type"] == "validation"
    assert hint in record["suggestion"]


@pytest.mark.parametrize("kwargs", [
    {"session_id": -1, "state_mode": "stateful"},
    {"session_id": True, "state_mode": "stateful"},
    {"session_id": "1", "state_mode": "stateful"},
    {"session_id": 1.5, "state_mode": "stateful"},
    {"session_id": 2**70, "state_mode": "stateful"},
    {"session_name": "", "state_mode": "stateful"},
    {"session_name": "a\x00b", "state_mode": "stateful"},
    {"session_name": 3, "state_mode": "stateful"},
    {"venv_id": -2},
    {"venv_id": "env"},
    {"language": None},
    {"state_mode": 7},
])
def test_bad_types_and_ranges_are_validation_errors(kwargs: dict[str, object]) -> None:
    assert error_of(**kwargs)["error_type"] == "validation"


def test_good_coordinates_pass() -> None:
    c = check_coordinate("bash", "stateful", None, "audit", 3)
    assert (c.language, c.state_mode, c.session_name, c.venv_id) == ("bash", "stateful", "audit", 3)
    assert check_coordinate().state_mode == "stateless"


@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf"), "5", True, 1e10, 10**300])
def test_bad_timeouts_are_refused(value: object) -> None:
    with pytest.raises(CoordexError):
        check_timeout(value)
    assert check_timeout(None) is None
    assert check_timeout(2) == 2.0
