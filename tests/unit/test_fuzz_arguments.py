"""Every argument combination returns a dict; none raises (SPEC section 2)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordex import Executor
from coordex.core.errors import ERROR_TYPES

pytestmark = pytest.mark.timeout(300)

anything = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True), st.text(max_size=30),
    st.sampled_from(["python", "bash", "stateless", "stateful", "read_only", "audit"]),
    st.lists(st.integers(), max_size=3), st.binary(max_size=10),
)
code_values = st.one_of(
    st.text(max_size=200), st.just("x" * 200_000), st.just("print('a\x00b')"),
    st.just("\x00"), st.just("1\n" * 10_000), anything,
)


@pytest.fixture(scope="module")
def fuzz_ex(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Executor]:
    root: Path = tmp_path_factory.mktemp("fuzz")
    with Executor(root=root, timeout=5, max_sessions=4) as executor:
        yield executor


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(code=code_values, language=anything, state_mode=anything, session_id=anything,
       session_name=anything, venv_id=anything, timeout=anything)
def test_execute_code_never_raises(fuzz_ex: Executor, code: object, language: object,
                                   state_mode: object, session_id: object,
                                   session_name: object, venv_id: object,
                                   timeout: object) -> None:
    if language == "bash" and state_mode == "stateful" and isinstance(code, str):
        code = "true"  # random text as bash could run anything on this machine
    if language == "python" and isinstance(code, str) and "import" in code:
        code = "1"
    r = fuzz_ex.execute_code(code, language=language, state_mode=state_mode,  # type: ignore[arg-type]
                             session_id=session_id, session_name=session_name,  # type: ignore[arg-type]
                             venv_id=venv_id, timeout=timeout)  # type: ignore[arg-type]
    assert isinstance(r, dict)
    json.dumps(r)
    if "error_type" in r:
        assert r["error_type"] in ERROR_TYPES
        assert r["error"] and r["suggestion"]
    else:
        assert {"stdout", "stderr", "truncated", "result", "exit_code", "images", "session",
                "state_mode", "duration_ms"} <= set(r)


@settings(max_examples=80, deadline=None)
@given(language=anything, session_id=anything, session_name=anything, venv_id=anything)
def test_inspect_and_close_never_raise(fuzz_ex: Executor, language: object, session_id: object,
                                       session_name: object, venv_id: object) -> None:
    for method in (fuzz_ex.inspect_session, fuzz_ex.close_session):
        r = method(language=language, session_id=session_id,  # type: ignore[arg-type]
                   session_name=session_name, venv_id=venv_id)  # type: ignore[arg-type]
        assert isinstance(r, dict)
        json.dumps(r)
        if "error_type" in r:
            assert r["error_type"] in ERROR_TYPES and r["suggestion"]
