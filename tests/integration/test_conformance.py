"""One conformance suite that every session type passes for the three state modes.

Each backend gets the same story through the public API: state kept by stateful
calls, nothing kept or seen by stateless ones, read-only calls that see the session
and change nothing, and the same coordinate errors.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest

from coordex import Executor

pytestmark = pytest.mark.timeout(60)


@dataclass(frozen=True)
class Dialect:
    language: str
    set_v: str      # binds v to 41
    show_v: str     # prints v (or nothing when unbound)
    change_v: str   # rebinds v to 99
    slow: str       # runs for ~30 s unless interrupted


PYTHON = Dialect("python", "v = 41", "print(globals().get('v', ''))", "v = 99",
                 "import time\nwhile True: time.sleep(0.01)")
BASH = Dialect("bash", "v=41", 'echo "$v"', "v=99", "sleep 30")


@pytest.fixture(params=[PYTHON, BASH], ids=lambda d: d.language)
def dialect(request: pytest.FixtureRequest) -> Dialect:
    return request.param  # type: ignore[no-any-return]


def run(ex: Executor, d: Dialect, code: str, **kw: object) -> dict[str, object]:
    return ex.execute_code(code, language=d.language, **kw)  # type: ignore[arg-type]


def test_stateful_keeps_state(ex: Executor, dialect: Dialect) -> None:
    run(ex, dialect, dialect.set_v, state_mode="stateful", session_name="s")
    r = run(ex, dialect, dialect.show_v, state_mode="stateful", session_name="s")
    assert r["stdout"] == "41\n"
    assert r["session"]["session_name"] == "s"  # type: ignore[index]


def test_stateless_sees_and_keeps_nothing(ex: Executor, dialect: Dialect) -> None:
    run(ex, dialect, dialect.set_v, state_mode="stateful", session_name="s")
    assert run(ex, dialect, dialect.show_v)["stdout"] == "\n"
    run(ex, dialect, dialect.change_v)
    assert run(ex, dialect, dialect.show_v)["stdout"] == "\n"
    r = run(ex, dialect, dialect.show_v, state_mode="stateful", session_name="s")
    assert r["stdout"] == "41\n"


def test_read_only_sees_the_session_and_changes_nothing(ex: Executor, dialect: Dialect) -> None:
    run(ex, dialect, dialect.set_v, state_mode="stateful", session_name="s")
    r = run(ex, dialect, dialect.change_v + "\n" + dialect.show_v, state_mode="read_only",
            session_name="s")
    assert r["stdout"] == "99\n"
    assert r["isolation"]["names"] is True  # type: ignore[index]
    assert r["state_mode"] == "read_only"
    r = run(ex, dialect, dialect.show_v, state_mode="stateful", session_name="s")
    assert r["stdout"] == "41\n"


def test_the_same_coordinate_errors(ex: Executor, dialect: Dialect) -> None:
    r = run(ex, dialect, dialect.show_v, state_mode="read_only")
    assert r["error_type"] == "validation"
    r = run(ex, dialect, dialect.show_v, state_mode="read_only", session_name="missing")
    assert r["error_type"] == "not_found"
    r = run(ex, dialect, dialect.show_v, state_mode="stateless", session_id=1)
    assert r["error_type"] == "validation"
    r = run(ex, dialect, dialect.show_v, state_mode="stateful", session_id=1, session_name="x")
    assert r["error_type"] == "validation"


def test_closed_sessions_are_gone(ex: Executor, dialect: Dialect) -> None:
    run(ex, dialect, dialect.set_v, state_mode="stateful", session_name="gone")
    closed = ex.close_session(language=dialect.language, session_name="gone")
    assert closed["closed"] is True
    r = run(ex, dialect, dialect.show_v, state_mode="read_only", session_name="gone")
    assert r["error_type"] == "not_found"
    r = run(ex, dialect, dialect.show_v, state_mode="stateful", session_name="gone")
    assert r["stdout"] == "\n"


def test_same_name_in_two_languages_are_two_sessions(ex: Executor) -> None:
    ex.execute_code("v = 'py'", state_mode="stateful", session_name="shared")
    ex.execute_code("v=sh", language="bash", state_mode="stateful", session_name="shared")
    assert ex.execute_code("print(v)", state_mode="stateful",
                           session_name="shared")["stdout"] == "py\n"
    assert ex.execute_code('echo "$v"', language="bash", state_mode="stateful",
                           session_name="shared")["stdout"] == "sh\n"


@pytest.mark.parametrize("mode", ["stateless", "stateful"])
def test_timeouts_return_promptly(ex: Executor, dialect: Dialect, mode: str) -> None:
    started = time.monotonic()
    kw: dict[str, object] = {"state_mode": mode}
    if mode == "stateful":
        kw["session_name"] = "slow"
    r = run(ex, dialect, dialect.slow, timeout=0.5, **kw)
    assert r["error_type"] == "timeout"
    assert isinstance(r["state_lost"], bool) and r["suggestion"]
    assert time.monotonic() - started < 5


def test_output_streams_through_on_output(ex: Executor, dialect: Dialect) -> None:
    chunks: list[tuple[str, str]] = []
    r = run(ex, dialect, dialect.set_v + "\n" + dialect.show_v,
            on_output=lambda s, t: chunks.append((s, t)))
    assert "".join(t for s, t in chunks if s == "stdout") == r["stdout"] == "41\n"
