"""AsyncExecutor: calls run off the event loop, in parallel, and cancel cleanly."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from coordex import AsyncExecutor

pytestmark = pytest.mark.timeout(60)


def test_calls_run_off_the_loop_and_in_parallel(tmp_path: Path) -> None:
    async def main() -> None:
        async with AsyncExecutor(root=tmp_path) as ex:
            ticks = 0

            async def ticker() -> None:
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.01)
                    ticks += 1

            tick_task = asyncio.create_task(ticker())
            started = time.monotonic()
            a, b = await asyncio.gather(
                ex.execute_code("sleep 0.5; echo a", language="bash", state_mode="stateful",
                                session_name="a"),
                ex.execute_code("sleep 0.5; echo b", language="bash", state_mode="stateful",
                                session_name="b"))
            tick_task.cancel()
            assert (a["stdout"], b["stdout"]) == ("a\n", "b\n")
            assert time.monotonic() - started < 0.95  # two shells ran side by side
            assert ticks > 10  # the loop kept running
            listed = await ex.list_sessions()
            assert {s["session_name"] for s in listed["sessions"]} >= {"a", "b"}

    asyncio.run(main())


def test_cancelling_the_task_interrupts_the_code_and_keeps_the_session(tmp_path: Path) -> None:
    async def main() -> None:
        async with AsyncExecutor(root=tmp_path) as ex:
            await ex.execute_code("n = 1", state_mode="stateful", session_name="s")
            task = asyncio.create_task(
                ex.execute_code("while True:\n    n += 1", state_mode="stateful",
                                session_name="s"))
            await asyncio.sleep(0.3)
            started = time.monotonic()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert time.monotonic() - started < 2
            r = await ex.execute_code("n > 1", state_mode="stateful", session_name="s")
            assert r["result"] == "True"

    asyncio.run(main())


def test_the_log_and_rebuild_are_awaitable(tmp_path: Path) -> None:
    async def main() -> None:
        async with AsyncExecutor(root=tmp_path / "home") as ex:
            await ex.execute_code("v = 3", state_mode="stateful", session_name="aio")
            await ex.close_session(session_name="aio")
            rebuilt = await ex.rebuild_session(session_name="aio")
            assert rebuilt["replayed"] == 1
            calls = (await ex.history(session_name="aio"))["calls"]
            assert [c["code"] for c in calls] == ["v = 3", "v = 3"]
            assert (await ex.serve_ui())["url"].startswith("http://127.0.0.1:")

    asyncio.run(main())


def test_fork_and_checkpoints_from_asyncio(tmp_path: Path) -> None:
    async def main() -> None:
        async with AsyncExecutor(root=tmp_path) as ex:
            await ex.execute_code("v = [1]", state_mode="stateful", session_name="a")
            forked = await ex.fork_session(session_name="a", new_name="b")
            assert forked["session"]["session_name"] == "b"
            made = await ex.checkpoint_session(session_name="a", label="one")
            await ex.execute_code("v.append(2)", state_mode="stateful", session_name="a")
            back = await ex.restore_session(session_name="a", checkpoint=made["checkpoint"])
            assert back["restored"] is True
            listed = await ex.list_checkpoints(session_name="a")
            assert [c["label"] for c in listed["checkpoints"]] == ["one"]
            again = await ex.execute_code("v", state_mode="stateful", session_name="a")
            assert again["result"] == "[1]"

    asyncio.run(main())
