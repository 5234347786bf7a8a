"""Long work over the Python API (SPEC 14): ``wait``, ``running``, ``wait_call``,
``cancel_call``, ``busy``, joining an identical call, redelivery, and results read back
from the call log after a restart. Real sessions, real processes."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from coordex import AsyncExecutor, ConfinedExecutor, Executor

pytestmark = pytest.mark.timeout(90)

RUNNING_KEYS = {"running", "call_id", "elapsed_ms", "stdout", "stderr", "session",
                "state_mode", "suggestion"}


def counting(marker: Path, seconds: float) -> str:
    """Python that counts its runs in ``marker``, prints, sleeps, and returns the count."""
    return (f"import time, pathlib\np = pathlib.Path({str(marker)!r})\n"
            "COUNT = int(p.read_text()) + 1 if p.exists() else 1\np.write_text(str(COUNT))\n"
            f"print('loading', flush=True)\ntime.sleep({seconds})\nCOUNT")


@pytest.fixture
def ex(tmp_path: Path) -> Any:
    with Executor(root=tmp_path / "root") as executor:
        yield executor


def test_a_call_past_wait_returns_running_and_goes_on(ex: Executor, tmp_path: Path) -> None:
    code = counting(tmp_path / "n", 1.5)
    started = time.monotonic()
    first = ex.execute_code(code, state_mode="stateful", session_name="load", wait=0.4)
    assert time.monotonic() - started < 1.2
    assert set(first) == RUNNING_KEYS and first["running"] is True
    assert first["stdout"] == "loading\n" and first["state_mode"] == "stateful"
    assert first["session"]["session_name"] == "load"
    assert first["session"]["session_id"] is not None  # the session the call opened
    assert "wait_call" in first["suggestion"]
    again = ex.wait_call(first["call_id"], wait=0.2)  # bounded: still running
    assert again["running"] is True and again["call_id"] == first["call_id"]
    final = ex.wait_call(first["call_id"])
    assert final["result"] == "1" and final["call_id"] == first["call_id"]
    assert final["session"] == first["session"] == again["session"]
    assert final["stdout"] == "loading\n" and "error" not in final
    assert ex.wait_call(first["call_id"]) == final  # fetchable again, the very dict
    # The code ran under its own timeout, once; its session kept what it bound.
    assert ex.execute_code("COUNT", state_mode="stateful", session_name="load")["result"] == "1"


def test_a_call_that_ends_in_time_is_the_same_result_with_its_call_id(ex: Executor) -> None:
    plain = ex.execute_code("6 * 7")
    waited = ex.execute_code("6 * 7", wait=30)
    assert waited["call_id"].startswith("c_")
    assert {k: v for k, v in waited.items() if k not in ("call_id", "duration_ms")} == \
        {k: v for k, v in plain.items() if k != "duration_ms"}


def test_a_detached_session_answers_busy_at_once(ex: Executor, tmp_path: Path) -> None:
    first = ex.execute_code(counting(tmp_path / "n", 4), state_mode="stateful",
                            session_name="load", wait=0.3)
    started = time.monotonic()
    for mode in ("stateful", "read_only"):
        busy = ex.execute_code("1", state_mode=mode, session_name="load")
        assert busy["error_type"] == "busy" and busy["call_id"] == first["call_id"]
        assert f"wait_call(call_id={first['call_id']!r})" in busy["suggestion"]
    assert time.monotonic() - started < 0.5
    listed = {s["session_name"]: s for s in ex.list_sessions()["sessions"]}
    assert listed["load"]["busy"] is True and listed["load"]["call_id"] == first["call_id"]
    # The page's running calls (GET running) show it detached, with its call_id.
    shown = [c for c in ex.running_calls.running() if c["call_id"] == first["call_id"]]
    assert shown and shown[0]["detached"] is True
    # Other sessions run meanwhile (a bash session: own-interpreter code shares one
    # interpreter with the load).
    other = ex.execute_code("echo 2", language="bash", state_mode="stateful",
                            session_name="load")
    assert other["stdout"] == "2\n"
    assert time.monotonic() - started < 3.5
    listed = {(s["language"], s["session_name"]): s for s in ex.list_sessions()["sessions"]}
    assert "busy" not in listed[("bash", "load")]
    ex.wait_call(first["call_id"])
    assert ex.execute_code("COUNT", state_mode="stateful", session_name="load")["result"] == "1"
    assert "busy" not in {s["session_name"]: s for s in ex.list_sessions()["sessions"]}["load"]


def test_an_identical_call_joins_the_running_one(ex: Executor, tmp_path: Path) -> None:
    marker = tmp_path / "n"
    code = counting(marker, 1.5)
    first = ex.execute_code(code, state_mode="stateful", wait=0.3)
    again = ex.execute_code(code, state_mode="stateful", wait=0.3)
    assert again["running"] is True and again["call_id"] == first["call_id"]
    joined = ex.execute_code(code, state_mode="stateful")  # no wait: waits for the end
    assert joined["call_id"] == first["call_id"] and joined["result"] == "1"
    assert marker.read_text() == "1"


def test_cancel_call_interrupts_and_keeps_the_state(ex: Executor) -> None:
    ex.execute_code("kept = 5", state_mode="stateful")
    slow = ex.execute_code("import time\nfor _ in range(300):\n    time.sleep(0.1)",
                           state_mode="stateful", wait=0.3)
    started = time.monotonic()
    stopped = ex.cancel_call(slow["call_id"])
    assert time.monotonic() - started < 10
    assert stopped["error_type"] == "timeout" and stopped["state_lost"] is False
    assert stopped["call_id"] == slow["call_id"]
    assert ex.cancel_call(slow["call_id"]) == stopped  # ended: the same result
    assert ex.execute_code("kept", state_mode="stateful")["result"] == "5"


def test_an_unknown_call_id_is_not_found_naming_those_running(ex: Executor) -> None:
    slow = ex.execute_code("import time; time.sleep(1)", wait=0.2)
    missing = ex.wait_call("c_nothing")
    assert missing["error_type"] == "not_found" and slow["call_id"] in missing["suggestion"]
    assert ex.wait_call(7)["error_type"] == "validation"  # type: ignore[arg-type]
    for bad in (0, -1, True, "soon"):
        assert ex.execute_code("1", wait=bad)["error_type"] == "validation"  # type: ignore[arg-type]
    ex.wait_call(slow["call_id"])


def test_a_result_is_read_from_the_log_after_a_restart(tmp_path: Path) -> None:
    with Executor(root=tmp_path / "root") as first:
        ran = first.execute_code("print('out')\n40 + 2", wait=10)
        failed = first.execute_code("1/0", state_mode="stateful", wait=10)
    with Executor(root=tmp_path / "root") as second:
        found = second.wait_call(ran["call_id"])
        assert found["result"] == "42" and found["stdout"] == "out\n"
        assert found["from_log"] is True and found["call_id"] == ran["call_id"]
        error = second.wait_call(failed["call_id"])
        assert error["error_type"] == "execution" and "ZeroDivisionError" in error["error"]


def test_a_lost_result_is_redelivered_to_the_identical_call_once(ex: Executor,
                                                                 tmp_path: Path) -> None:
    marker = tmp_path / "n"
    code = counting(marker, 0.2)
    first = ex.execute_code(code, state_mode="stateful", wait=10)
    assert ex.hold_call(first["call_id"])["held"] is True  # its answer never arrived
    again = ex.execute_code(code, state_mode="stateful", wait=10)
    assert again["redelivered"] is True and again["call_id"] == first["call_id"]
    assert again["result"] == "1" and marker.read_text() == "1"
    third = ex.execute_code(code, state_mode="stateful", wait=10)  # delivered now: runs
    assert third["result"] == "2" and "redelivered" not in third


def test_a_held_result_outlives_a_restart_and_is_redelivered_once(tmp_path: Path) -> None:
    """Held on disk under the root: a new Executor on the same root hands it to the
    identical call, once, without running the code; nothing of it is left after."""
    marker = tmp_path / "n"
    code = counting(marker, 0.2)
    with Executor(root=tmp_path / "root") as first:
        ran = first.execute_code(code, state_mode="stateful", wait=10)
        assert first.hold_call(ran["call_id"])["held"] is True
    with Executor(root=tmp_path / "root") as second:
        other = second.execute_code(code + "\n", state_mode="stateful", wait=10)
        assert "redelivered" not in other  # another call: not the held one's twin
        assert marker.read_text() == "2"
    marker.write_text("1")
    with Executor(root=tmp_path / "root") as third:
        again = third.execute_code(code, state_mode="stateful")
        assert again["redelivered"] is True and again["call_id"] == ran["call_id"]
        assert again["result"] == "1" and marker.read_text() == "1"
        assert not list((tmp_path / "root" / "held").iterdir())
    with Executor(root=tmp_path / "root") as fourth:  # handed out once: runs again
        twice = fourth.execute_code(code, state_mode="stateful")
        assert "redelivered" not in twice and marker.read_text() == "2"


def test_a_held_result_fetched_by_its_call_id_is_not_redelivered_after_a_restart(
        tmp_path: Path) -> None:
    marker = tmp_path / "n"
    code = counting(marker, 0.1)
    with Executor(root=tmp_path / "root") as first:
        ran = first.execute_code(code, state_mode="stateful", wait=10)
        first.hold_call(ran["call_id"])
        assert first.wait_call(ran["call_id"])["result"] == "1"
    with Executor(root=tmp_path / "root") as second:
        again = second.execute_code(code, state_mode="stateful")
        assert "redelivered" not in again and again["result"] == "2"
    # Held, then fetched by its call_id after a restart (from the log): not handed out
    # a second time to the identical call.
    with Executor(root=tmp_path / "root") as third:
        ran = third.execute_code(code, state_mode="stateful", wait=10)
        third.hold_call(ran["call_id"])
    with Executor(root=tmp_path / "root") as fourth:
        fetched = fourth.wait_call(ran["call_id"])
        assert fetched["from_log"] is True and fetched["result"] == "3", fetched
        again = fourth.execute_code(code, state_mode="stateful")
        assert "redelivered" not in again and again["result"] == "4", again


def test_rebuild_session_and_call_function_take_wait(ex: Executor) -> None:
    ex.call_tool("define_function", {"source": "def slow(n):\n    import time\n"
                                               "    time.sleep(n)\n    return n * 2"})
    running = ex.call_tool("call_function", {"name": "slow", "args": [1], "wait": 0.2,
                                             "state_mode": "stateful"})
    assert running["running"] is True
    assert ex.call_tool("execute_code", {"code": "1", "state_mode": "stateful"})[
        "error_type"] == "busy"
    assert ex.call_tool("wait_call", {"call_id": running["call_id"]})["value"] == 2
    ex.execute_code("export X=1", language="bash", state_mode="stateful", session_name="r")
    lost = ex.execute_code("kill -9 $$", language="bash", state_mode="stateful",
                           session_name="r")
    assert lost["state_lost"] is True
    rebuilt = ex.rebuild_session("bash", session_name="r", wait=30)
    assert rebuilt["replayed"] == 1 and rebuilt["call_id"].startswith("c_"), rebuilt
    assert ex.execute_code("echo $X", language="bash", state_mode="stateful",
                           session_name="r")["stdout"] == "1\n"


def test_cancel_call_reaches_a_rebuilds_replay(ex: Executor, tmp_path: Path) -> None:
    """The call record is passed down the rebuild's path to its replays: cancel_call on
    a rebuild that returned ``running`` interrupts the replay it is in."""
    slow = tmp_path / "slow"
    ex.execute_code(f"if [ -e {slow} ]; then sleep 60; fi; X=1", language="bash",
                    state_mode="stateful", session_name="r", timeout=120)
    lost = ex.execute_code("kill -9 $$", language="bash", state_mode="stateful",
                           session_name="r")
    assert lost["state_lost"] is True
    slow.write_text("now")
    rebuilding = ex.rebuild_session("bash", session_name="r", wait=0.5)
    assert rebuilding["running"] is True, rebuilding
    started = time.monotonic()
    stopped = ex.cancel_call(rebuilding["call_id"])
    assert time.monotonic() - started < 10, stopped
    assert stopped["replayed"] == 0 and stopped["failed_at"] is not None, stopped
    assert stopped["failure"]["error_type"] == "timeout", stopped


def test_async_executor_waits_and_cancels(tmp_path: Path) -> None:
    async def main() -> None:
        async with AsyncExecutor(root=tmp_path / "root") as aex:
            first = await aex.execute_code("import time; time.sleep(0.8); 9", wait=0.2)
            assert first["running"] is True
            assert (await aex.wait_call(first["call_id"]))["result"] == "9"
            slow = await aex.execute_code("import time\nfor _ in range(300):\n"
                                          "    time.sleep(0.1)", wait=0.2)
            assert (await aex.cancel_call(slow["call_id"]))["error_type"] == "timeout"

    asyncio.run(main())


def test_a_confined_executor_keeps_its_call_records_in_its_host(tmp_path: Path) -> None:
    with ConfinedExecutor(tmp_path / "t", level="none", timeout=20) as cex:
        first = cex.execute_code("import time; time.sleep(1); 5", state_mode="stateful",
                                 wait=0.3)
        assert first["running"] is True
        assert cex.execute_code("1", state_mode="stateful")["error_type"] == "busy"
        assert cex.wait_call(first["call_id"])["result"] == "5"
        assert cex.call_tool("wait_call", {"call_id": first["call_id"]})["result"] == "5"


def test_a_call_without_wait_starts_no_thread(ex: Executor) -> None:
    """The Python API pays nothing for SPEC 14 when no call is detached."""
    ex.execute_code("1")
    before = {t.ident for t in threading.enumerate()}
    seen: list[set[int | None]] = []
    ex.execute_code("1", on_output=lambda *_: seen.append(
        {t.ident for t in threading.enumerate()}))
    ex.execute_code("print(1)", on_output=lambda *_: seen.append(
        {t.ident for t in threading.enumerate()}))
    assert seen and not any(t.name.startswith("coordex-call-") for t in threading.enumerate()
                            if t.ident in seen[-1] - before)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_first_use_build_counts_toward_wait(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A real uv build (no requirements, offline) runs inside the call: past wait the
    call answers running, and wait_call brings the code's result once it has run."""
    monkeypatch.setenv("UV_OFFLINE", "1")
    with Executor(root=tmp_path / "root") as ex:
        venv = ex.environments.create("", name="bare")["venv_id"]
        first = ex.execute_code("import sys\nsys.prefix", venv_id=venv, wait=0.05)
        assert first["running"] is True, first
        final = ex.wait_call(first["call_id"])
        assert "envs" in (final["result"] or ""), final


def test_held_files_are_handed_out_once_and_expire(tmp_path: Path) -> None:
    """The disk side of redelivery: a result taken by one process is not taken by
    another; an expired or foreign file is dropped when a process starts."""
    import json
    import time

    from coordex.log.held import HeldResults

    first = HeldResults(tmp_path, hold_seconds=600)
    first.put("key", {"result": "1", "call_id": "c_1"}, time.time())
    first.put("old", {"result": "2", "call_id": "c_2"}, time.time() - 700)
    (tmp_path / "held" / ("0" * 40 + ".json")).write_text("not json")
    (tmp_path / "held" / ("1" * 40 + ".json")).write_text(json.dumps(
        {"key": "another", "ended_at": time.time(), "result": {}}))  # named for another key
    second, third = HeldResults(tmp_path, 600), HeldResults(tmp_path, 600)
    assert len(list((tmp_path / "held").iterdir())) == 1  # the expired and foreign: gone
    assert second.take("key") == {"result": "1", "call_id": "c_1"}
    assert third.take("key") is None and second.take("key") is None
    assert not second.any() and not list((tmp_path / "held").iterdir())
