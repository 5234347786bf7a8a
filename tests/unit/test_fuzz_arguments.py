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

# Lone surrogates: what os.listdir gives for a byte that is not UTF-8.
surrogates = st.text(alphabet=st.sampled_from(["\udce9", "\ud800", "a", "\u00e9"]),
                     min_size=1, max_size=5)
anything = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([2**63 - 1, 2**63, 2**70]), surrogates,
    st.floats(allow_nan=True), st.text(max_size=30),
    st.sampled_from(["python", "bash", "stateless", "stateful", "read_only", "audit"]),
    st.lists(st.integers(), max_size=3), st.binary(max_size=10),
)
code_values = st.one_of(
    st.text(max_size=200), st.just("print('caf\\udce9')"), st.just("raise KeyboardInterrupt"),
    st.just("x" * 200_000), st.just("print('a\x00b')"),
    st.just("\x00"), st.just("1\n" * 10_000), anything,
)


nested_toml = st.integers(min_value=1, max_value=3000).map(
    lambda depth: "[project]\ndependencies = []\nx = " + "[" * depth + "]" * depth)
specs = st.one_of(nested_toml, anything, st.just("caf\udce9lib"), st.just(""))


def sendable(record: dict[str, object]) -> None:
    """What a front end does with a result: JSON, as UTF-8."""
    json.dumps(record, ensure_ascii=False).encode("utf-8")


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
    sendable(r)
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


@settings(max_examples=60, deadline=None)
@given(spec=specs, name=anything, venv_id=anything)
def test_environments_never_raise(fuzz_ex: Executor, spec: object, name: object,
                                  venv_id: object) -> None:
    for r in (fuzz_ex.environments.create(spec, name=name),  # type: ignore[arg-type]
              fuzz_ex.environments.build(venv_id),  # type: ignore[arg-type]
              fuzz_ex.environments.list()):
        assert isinstance(r, dict)
        sendable(r)
        if "error_type" in r:
            assert r["error_type"] in ERROR_TYPES and r["suggestion"]
