"""An MCP client that restarts its server keeps its sessions (SPEC 12), through the real
``coordex mcp`` and the MCP SDK's stdio client: the server is closed by its client, then
SIGKILLed, and each next server answers with every value a returned result showed."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from tests.conftest import assert_no_new_children, child_pids

pytestmark = pytest.mark.timeout(120)


def _server(root: Path, *extra: str) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable,
                                 args=["-m", "coordex", "mcp", "--home", str(root), *extra],
                                 env={**os.environ, "COORDEX_HOME": str(root)})


async def _calls(params: StdioServerParameters, calls: list[dict[str, Any]],
                 kill: bool = False) -> list[dict[str, Any]]:
    """Make ``calls`` (execute_code arguments) in order; with ``kill``, SIGKILL the server
    (its own interpreter's pid, asked of it) once they returned."""
    results: list[dict[str, Any]] = []
    try:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            with anyio.fail_after(60):
                for arguments in calls:
                    done = await session.call_tool("execute_code", arguments)
                    assert isinstance(done.structured_content, dict)
                    results.append(done.structured_content)
                if kill:
                    pid = await session.call_tool("execute_code", {"code": "import os\nos.getpid()"})
                    assert isinstance(pid.structured_content, dict)
                    os.kill(int(pid.structured_content["result"]), signal.SIGKILL)
    except BaseException:
        if not kill:
            raise
    return results


def test_sessions_survive_a_client_restart_and_a_sigkill_of_coordex_mcp(tmp_path: Path) -> None:
    root = tmp_path / "home"
    before = child_pids()
    stateful = {"state_mode": "stateful"}
    first = anyio.run(_calls, _server(root), [
        {"code": "def double(v):\n    return 2 * v\nrows = [1, 2, 3]", **stateful},
        {"code": "total = sum([1, 2, 3])", "session_name": "audit", **stateful},
        {"code": f"cd {tmp_path}; COUNT=1", "language": "bash", **stateful},
    ])
    assert all("error_type" not in r for r in first), first

    # Restarted (the client closed the first one: snapshots were written at close); more
    # work, then the server is SIGKILLed: that work is only in the call log.
    second = anyio.run(_calls, _server(root), [
        {"code": "rows.append(double(rows[-1]))", **stateful},
        {"code": "total += 100", "session_name": "audit", **stateful},
        {"code": "COUNT=$((COUNT+1))", "language": "bash", **stateful},
    ], True)
    assert all("error_type" not in r for r in second), second
    assert {r["restored"]["from"] for r in second} == {"snapshot"}

    third = anyio.run(_calls, _server(root), [
        {"code": "(rows, double(5))", **stateful},
        {"code": "total", "session_name": "audit", **stateful},
        {"code": "pwd; echo $COUNT", "language": "bash", **stateful},
    ])
    assert [r.get("result") for r in third[:2]] == ["([1, 2, 3, 6], 10)", "106"], third
    assert third[2]["stdout"] == f"{tmp_path}\n2\n", third[2]
    assert {r["restored"]["from"] for r in third} == {"snapshot+replay"}
    assert_no_new_children(before)


def test_no_persist_keeps_nothing(tmp_path: Path) -> None:
    root = tmp_path / "home"
    anyio.run(_calls, _server(root, "--no-persist"), [{"code": "x = 1", "state_mode": "stateful"}])
    again = anyio.run(_calls, _server(root, "--no-persist"),
                      [{"code": "'x' in globals()", "state_mode": "stateful"}])
    assert again[0]["result"] == "False" and "restored" not in again[0]
    assert not (root / "snapshots").exists()


def test_a_stopped_server_writes_its_sessions_and_still_exits_within_5_s(tmp_path: Path) -> None:
    """SIGTERM with a session holding 400 MB that changed since its last snapshot: the
    server writes it (or leaves it to the log past its 3 s) and is gone within 5 s."""
    from tests.conftest import alive

    root = tmp_path / "home"
    before = child_pids()
    took: list[float] = []

    async def main() -> None:
        try:
            async with stdio_client(_server(root)) as (read, write), \
                    ClientSession(read, write) as session:
                await session.initialize()
                with anyio.fail_after(60):
                    await session.call_tool("execute_code", {
                        "code": "big = bytearray(400 << 20)\nbig[-1] = 7\nimport os\nos.getpid()",
                        "state_mode": "stateful", "session_name": "big"})
                    pid = await session.call_tool("execute_code",
                                                  {"code": "import os\nos.getpid()"})
                    assert isinstance(pid.structured_content, dict)
                    server = int(pid.structured_content["result"])
                    started = time.monotonic()
                    os.kill(server, signal.SIGTERM)
                    while alive(server) and time.monotonic() - started < 10:
                        await anyio.sleep(0.02)
                    took.append(time.monotonic() - started)
        except BaseException:
            if not took:
                raise

    anyio.run(main)
    assert took and took[0] < 5.0, took
    again = anyio.run(_calls, _server(root), [
        {"code": "(len(big), big[-1])", "state_mode": "stateful", "session_name": "big"}])
    assert again[0]["result"] == f"({400 << 20}, 7)", again[0]
    assert again[0]["restored"]["from"] in ("snapshot", "replay")
    assert_no_new_children(before)




class _Client:
    """One ``coordex mcp`` behind its own MCP client, run by a task of its own (each
    client's streams stay in the task that opened them), told what to call."""

    def __init__(self, tasks: Any, root: Path) -> None:
        self._send, inbox = anyio.create_memory_object_stream[Any](1)
        tasks.start_soon(self._serve, root, inbox)

    async def _serve(self, root: Path, inbox: Any) -> None:
        async with inbox, stdio_client(_server(root)) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            async for tool, arguments, reply in inbox:
                async with reply:
                    done = await session.call_tool(tool, arguments)
                    await reply.send(done.structured_content)

    async def call(self, tool: str, **arguments: Any) -> dict[str, Any]:
        reply, answer = anyio.create_memory_object_stream[Any](1)
        async with answer:
            await self._send.send((tool, arguments, reply))
            result = await answer.receive()
        assert isinstance(result, dict)
        return result

    async def end(self) -> None:
        await self._send.aclose()


async def _two_at_once(root: Path, first_to_end: str) -> None:
    """Two ``coordex mcp`` on one root, as two desktop clients sharing a data folder:
    both work in session 0 and in a session named 'shared'; one ends, the other works
    on, then ends too."""
    stateful = {"state_mode": "stateful"}
    with anyio.fail_after(90):
        async with anyio.create_task_group() as tasks:
            a = _Client(tasks, root)
            await a.call("execute_code", code="x = 1; y = 10", session_name="shared", **stateful)
            await a.call("execute_code", code="who = 'a'", **stateful)
            b = _Client(tasks, root)
            listed = await b.call("list_sessions")
            held = [s for s in listed["sessions"] if s.get("session_name") == "shared"]
            assert held == [dict(held[0], held=False, held_by="another process")], listed
            apart = await b.call("execute_code", code="x = 2", session_name="shared",
                                 **stateful)
            # B's session is its own, and said so; A's is untouched.
            assert "'shared (2)'" in apart.get("kept_apart", ""), apart
            zero = await b.call("execute_code", code="who = 'b'", **stateful)
            assert "'session 0 (2)'" in zero.get("kept_apart", ""), zero
            await a.call("execute_code", code="y += 1", session_name="shared", **stateful)
            mine = await b.call("execute_code", code="x", session_name="shared", **stateful)
            assert mine["result"] == "2" and "kept_apart" not in mine, mine
            ended, going_on = (a, b) if first_to_end == "a" else (b, a)
            await ended.end()
            await anyio.sleep(2)  # its server is gone
            code = "x += 10" if first_to_end == "a" else "y += 100"
            more = await going_on.call("execute_code", code=code, session_name="shared",
                                       **stateful)
            assert "error_type" not in more and "restored" not in more, more
            await going_on.end()

@pytest.mark.parametrize("first_to_end", ["a", "b"])
def test_two_servers_on_one_root_lose_nothing_either_returned(tmp_path: Path,
                                                              first_to_end: str) -> None:
    root = tmp_path / "home"
    before = child_pids()
    anyio.run(_two_at_once, root, first_to_end)
    after = anyio.run(_calls, _server(root), [
        {"code": "(x, y)", "session_name": "shared", "state_mode": "stateful"},
        {"code": "x", "session_name": "shared (2)", "state_mode": "stateful"},
        {"code": "who", "state_mode": "stateful"},
        {"code": "who", "session_name": "session 0 (2)", "state_mode": "stateful"},
    ])
    shared, apart = ("(1, 11)", "12") if first_to_end == "a" else ("(1, 111)", "2")
    assert [r.get("result") for r in after] == [shared, apart, "'a'", "'b'"], after
    assert all(r["restored"]["from"].startswith("snapshot") for r in after), after
    assert_no_new_children(before)
