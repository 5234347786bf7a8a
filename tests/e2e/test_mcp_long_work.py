"""Long work through real MCP clients (SPEC 14): the official SDK client against
``coordex serve`` (both eras) and ``coordex mcp``.

The seed's scenario, scaled: a load longer than the client's request timeout, with
``--max-wait`` shorter still: the load runs once and the model gets its value through
``wait_call``. And a stream broken mid-call: the code runs once and the re-sent call
gets the result with ``redelivered: true``.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import anyio
import httpx
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from ._procs import Running, child_env, spawn

pytestmark = pytest.mark.timeout(120)

TOKEN = "test-token-0123456789abcdef"
READY = r"serving MCP on (http://127\.0\.0\.1:\d+/mcp)"
Body = Callable[[ClientSession], Awaitable[None]]

# A stateful load that counts its runs in a file of the session's folder and takes
# ``seconds``: what ran twice shows as a count of 2.
LOAD = ("import time, pathlib\n"
        "p = pathlib.Path({marker!r})\n"
        "COUNT = int(p.read_text()) + 1 if p.exists() else 1\n"
        "p.write_text(str(COUNT))\n"
        "print('loading', flush=True)\n"
        "time.sleep({seconds})\n"
        "COUNT")


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[tuple[Running, str]]:
    env = child_env(tmp_path / "home", COORDEX_TOKEN=TOKEN)
    with spawn("serve", "--port", "0", "--max-wait", "1.5", env=env) as running:
        yield running, running.wait_for(READY).group(1)


def with_http(url: str, era: str, body: Body) -> None:
    async def main() -> None:
        client = create_mcp_http_client(headers={"Authorization": f"Bearer {TOKEN}"})
        async with client, streamable_http_client(url, http_client=client) as (read, write), \
                ClientSession(read, write) as session:
            if era == "initialize":
                await session.initialize()
            else:
                await session.discover()
            with anyio.fail_after(90):
                await body(session)

    anyio.run(main)


def content(result: Any) -> dict[str, Any]:
    assert isinstance(result.structured_content, dict), result
    return dict(result.structured_content)


async def until_done(session: ClientSession, record: dict[str, Any]) -> dict[str, Any]:
    while record.get("running"):
        record = content(await session.call_tool("wait_call", {"call_id": record["call_id"]},
                                                 read_timeout_seconds=4))
    return record


@pytest.mark.parametrize("era", ["initialize", "2026-07-28"])
def test_a_load_longer_than_the_request_runs_once_and_reaches_the_model(
        http_server: tuple[Running, str], tmp_path: Path, era: str) -> None:
    _, url = http_server
    marker = str(tmp_path / "count")
    code = LOAD.format(marker=marker, seconds=6)

    async def body(session: ClientSession) -> None:
        tools = {t.name: t for t in (await session.list_tools()).tools}
        assert {"wait_call", "cancel_call"} <= set(tools)
        assert "1.5 s" in (tools["execute_code"].description or "")
        assert tools["wait_call"].output_schema and tools["wait_call"].annotations
        started = time.monotonic()
        first = content(await session.call_tool(
            "execute_code", {"code": code, "state_mode": "stateful", "session_name": "load"},
            read_timeout_seconds=4))  # the client's own request timeout: shorter than the load
        assert first["running"] is True and first["call_id"].startswith("c_"), first
        assert time.monotonic() - started < 4
        # Another call to the session is told at once, naming the call.
        busy = content(await session.call_tool(
            "execute_code", {"code": "1", "state_mode": "stateful", "session_name": "load"}))
        assert busy["error_type"] == "busy" and busy["call_id"] == first["call_id"]
        listed = content(await session.call_tool("list_sessions", {}))
        assert any(s.get("call_id") == first["call_id"] for s in listed["sessions"])
        # The identical call re-sent joins the running one: same call_id, no second run.
        again = content(await session.call_tool(
            "execute_code", {"code": code, "state_mode": "stateful", "session_name": "load"}))
        assert again.get("call_id") == first["call_id"]
        final = await until_done(session, again)
        assert final["result"] == "1" and final["call_id"] == first["call_id"]
        assert "loading" in final["stdout"]
        fetched = content(await session.call_tool("wait_call", {"call_id": first["call_id"]}))
        assert fetched == final
        # A delivered result is never handed out again: the same call runs anew.
        twice = [content(await session.call_tool("execute_code", {"code": "import os\nos.urandom(4)"}))
                 for _ in range(2)]
        assert "redelivered" not in twice[1] and twice[0]["result"] != twice[1]["result"]

    with_http(url, era, body)
    assert Path(marker).read_text() == "1"


def test_a_stream_broken_mid_call_runs_once_and_the_resent_call_is_redelivered(
        http_server: tuple[Running, str], tmp_path: Path) -> None:
    """Initialize era, raw HTTP: the socket of the call's SSE stream is closed while the
    code runs (no cancellation is sent); the same call sent again gets the result."""
    _, url = http_server
    marker = str(tmp_path / "count")
    code = LOAD.format(marker=marker, seconds=1)
    with httpx.Client(timeout=30) as client:
        session = _initialized(client, url, TOKEN)
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "execute_code",
            "arguments": {"code": code, "state_mode": "stateful", "wait": 20}}}
        with client.stream("POST", url, headers=session, json=call) as response:
            assert response.status_code == 200
            time.sleep(0.4)  # the code is running
            response.close()  # the stream breaks: the connection is closed
        time.sleep(2.0)  # the load ends meanwhile; its answer had nowhere to go
        resent = client.post(url, headers=session, json={**call, "id": 3})
        record = _sse_result(resent)
    assert record["redelivered"] is True, record
    assert record["result"] == "1"
    assert Path(marker).read_text() == "1"
    with httpx.Client(timeout=30) as client:  # redelivered once: sent again, it runs again
        again = _sse_result(client.post(url, headers=session, json={**call, "id": 4}))
    assert "redelivered" not in again and again["result"] == "2"


def _initialized(client: httpx.Client, url: str, token: str) -> dict[str, str]:
    """A 2025-06-18 MCP session over raw HTTP: its request headers."""
    headers = {"accept": "application/json, text/event-stream",
               "content-type": "application/json", "authorization": f"Bearer {token}"}
    init = client.post(url, headers=headers, json={
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "raw", "version": "0"}}})
    session = {**headers, "mcp-session-id": init.headers["mcp-session-id"],
               "mcp-protocol-version": "2025-06-18"}
    client.post(url, headers=session, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
    return session


@pytest.mark.parametrize("tenants", [False, True], ids=["one-token", "tenants"])
def test_a_result_held_when_its_stream_broke_survives_a_server_restart(
        tmp_path: Path, tenants: bool) -> None:
    """The stream of a call breaks mid-call; the code ends meanwhile, its answer held.
    The server is stopped and started again on the same root: the re-sent identical call
    gets the result, ``redelivered``, and the code ran once. Under --tokens the held
    result is the tenant's: another tenant sending the identical call runs its own."""
    import os

    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    options: list[str] = []
    alice = bob = TOKEN
    if tenants:
        alice, bob = "alice-token-0123456789", "bob-token-0123456789"
        tokens = tmp_path / "tokens.txt"
        tokens.write_text(f"alice {alice}\nbob {bob}\n")
        os.chmod(tokens, 0o600)
        options = ["--tokens", str(tokens)]
    env = child_env(home, COORDEX_TOKEN=None if tenants else TOKEN)
    # The count lives in the session's own folder (a tenant's jail writes nowhere else).
    code = LOAD.format(marker="count", seconds=1)
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "execute_code", "arguments": {"code": code, "state_mode": "stateful",
                                              "wait": 20}}}

    def counts() -> list[str]:
        return [p.read_text() for p in (home, work) for p in p.rglob("count")]

    with spawn("serve", "--port", "0", "--max-wait", "1.5", *options, env=env,
               cwd=work) as running:
        url = running.wait_for(READY).group(1)
        with httpx.Client(timeout=30) as client:
            session = _initialized(client, url, alice)
            with client.stream("POST", url, headers=session, json=call) as response:
                assert response.status_code == 200
                time.sleep(0.4)  # the code is running
                response.close()  # the stream breaks
            time.sleep(2.5)  # the load ends meanwhile; its answer is held
    assert counts() == ["1"]
    with spawn("serve", "--port", "0", "--max-wait", "1.5", *options, env=env,
               cwd=work) as running:
        url = running.wait_for(READY).group(1)
        with httpx.Client(timeout=30) as client:
            if tenants:  # bob's identical call is his own: not handed alice's result
                other = _sse_result(client.post(url, headers=_initialized(client, url, bob),
                                                json={**call, "id": 3}))
                assert "redelivered" not in other, other
            session = _initialized(client, url, alice)
            record = _sse_result(client.post(url, headers=session, json={**call, "id": 4}))
            assert record.get("redelivered") is True, record
            assert record["result"] == "1" and record["call_id"].startswith("c_")
            again = _sse_result(client.post(url, headers=session, json={**call, "id": 5}))
    assert "redelivered" not in again  # handed out once: sent again, it runs again
    assert sorted(counts()) == (["1", "2"] if tenants else ["2"]), counts()


def test_a_2026_stream_closed_mid_call_runs_once_and_is_redelivered(
        http_server: tuple[Running, str], tmp_path: Path) -> None:
    """The 2026-07-28 era through the SDK client: abandoning a request closes its
    stream (that era's only signal). The code goes on, once; the re-sent identical
    call gets its result, redelivered."""
    _, url = http_server
    marker = str(tmp_path / "count")
    arguments = {"code": LOAD.format(marker=marker, seconds=1.5), "state_mode": "stateful",
                 "wait": 10}

    async def body(session: ClientSession) -> None:
        with anyio.move_on_after(0.6):  # the client gives up: its POST's stream is closed
            await session.call_tool("execute_code", arguments)
        await anyio.sleep(2.5)  # the load ends meanwhile
        again = content(await session.call_tool("execute_code", arguments))
        assert again.get("redelivered") is True, again
        assert again["result"] == "1"

    with_http(url, "2026-07-28", body)
    assert Path(marker).read_text() == "1"


def test_stdio_wait_call_and_cancel_call(tmp_path: Path) -> None:
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "coordex", "mcp", "--max-wait", "1"],
                                   env=child_env(tmp_path / "home"))
    marker = str(tmp_path / "count")

    async def main() -> None:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            with anyio.fail_after(60):
                first = content(await session.call_tool("execute_code", {
                    "code": LOAD.format(marker=marker, seconds=3), "state_mode": "stateful"}))
                assert first["running"] is True
                final = await until_done(session, first)
                assert final["result"] == "1"
                slow = content(await session.call_tool("execute_code", {
                    "code": "import time\nfor _ in range(300):\n    time.sleep(0.1)",
                    "state_mode": "stateful"}))
                assert slow["running"] is True
                stopped = content(await session.call_tool("cancel_call",
                                                          {"call_id": slow["call_id"]}))
                assert stopped["error_type"] == "timeout" and stopped["state_lost"] is False
                kept = content(await session.call_tool("execute_code", {
                    "code": "COUNT", "state_mode": "stateful"}))
                assert kept.get("result") == "1", kept
                missing = await session.call_tool("wait_call", {"call_id": "c_nothing"})
                assert missing.is_error and content(missing)["error_type"] == "not_found"

    anyio.run(main)


def _sse_result(response: httpx.Response) -> dict[str, Any]:
    for line in response.text.splitlines():
        if line.startswith("data:"):
            message = json.loads(line[5:])
            if "result" in message:
                return dict(message["result"]["structuredContent"])
    raise AssertionError(response.text)


async def send(session: ClientSession, method: str, task_id: str) -> dict[str, Any]:
    """``tasks/get`` or ``tasks/cancel`` of ``task_id`` (the tasks extension's)."""
    import mcp_types as types
    from pydantic import ConfigDict

    class TaskState(types.Result):  # tasks/get and tasks/cancel: resultType "complete"
        model_config = ConfigDict(extra="allow")

    answer = await session.send_request(
        types.Request[Any, Any](method=method, params={"taskId": task_id}),
        TaskState, request_read_timeout_seconds=10)
    return dict(answer.model_dump(by_alias=True, mode="json", exclude_none=True))


def test_tasks_extension_serves_the_call_record(http_server: tuple[Running, str],
                                                tmp_path: Path) -> None:
    """A 2026-07-28 client that declares io.modelcontextprotocol/tasks gets a call past
    --max-wait as a task (resultType "task", taskId = call_id), polls tasks/get to its
    result, and tasks/cancel interrupts another: one call record behind tasks and
    wait_call alike."""
    import mcp_types as types
    from mcp.client.extension import ResultClaim
    from pydantic import ConfigDict

    _, url = http_server
    marker = str(tmp_path / "count")

    class TaskHandle(types.Result):
        model_config = ConfigDict(extra="allow")
        result_type: Literal["task"] = "task"

    async def never(handle: TaskHandle, ctx: Any) -> types.CallToolResult:
        raise AssertionError("resolved by the test itself")

    claim = ResultClaim(result_type="task", model=TaskHandle, resolve=never)

    async def start(session: ClientSession, arguments: dict[str, Any]) -> dict[str, Any]:
        handle = await session.call_tool("execute_code", arguments, allow_claimed=True)
        assert isinstance(handle, TaskHandle), handle
        return dict(handle.model_dump(by_alias=True, mode="json", exclude_none=True))

    async def until_ended(session: ClientSession, task: dict[str, Any]) -> dict[str, Any]:
        while task["status"] == "working":
            await anyio.sleep(0.3)
            task = await send(session, "tasks/get", task["taskId"])
        return task

    async def main() -> None:
        client = create_mcp_http_client(headers={"Authorization": f"Bearer {TOKEN}"})
        async with client, streamable_http_client(url, http_client=client) as (read, write), \
                ClientSession(read, write, extensions={"io.modelcontextprotocol/tasks": {}},
                              result_claims={"io.modelcontextprotocol/tasks": [claim]}) \
                as session:
            discovered = await session.discover()
            assert "io.modelcontextprotocol/tasks" in (discovered.capabilities.extensions or {})
            with anyio.fail_after(60):
                task = await start(session, {"code": LOAD.format(marker=marker, seconds=3),
                                             "state_mode": "stateful"})
                assert task["resultType"] == "task" and task["status"] == "working", task
                assert task["taskId"].startswith("c_") and task["ttlMs"] >= 3_600_000
                done = await until_ended(session, task)
                assert done["status"] == "completed"
                assert done["result"]["structuredContent"]["result"] == "1"
                # The same record through wait_call.
                fetched = content(await session.call_tool("wait_call",
                                                          {"call_id": task["taskId"]}))
                assert fetched["result"] == "1"
                slow = await start(session, {
                    "code": "import time\nfor _ in range(300):\n    time.sleep(0.1)",
                    "state_mode": "stateful", "session_name": "slow"})
                assert await send(session, "tasks/cancel", slow["taskId"]) is not None
                stopped = await until_ended(session, slow)
                record = stopped["result"]["structuredContent"]
                assert record["error_type"] == "timeout" and record["state_lost"] is False
                with pytest.raises(Exception, match="not found"):
                    await send(session, "tasks/get", "c_nothing")

    anyio.run(main)


def test_a_task_poll_after_a_host_restart_leaves_the_loss_to_the_models_next_result(
        tmp_path: Path) -> None:
    """SPEC 9 through a confined tenant: a client's tasks/get (or tasks/cancel) that
    reaches a host started again after its predecessor died is no model's answer; the
    model's next tool result says ``state_lost``. (The poll took it: the model was never
    told.)"""
    # Ends the host 0.3 s after the call answered (the timer holds os._exit itself:
    # the call's namespace is emptied as it ends).
    dies = "import os, threading\nthreading.Timer(0.3, os._exit, (1,)).start()"

    async def main(url: str) -> None:
        client = create_mcp_http_client(headers={"Authorization": f"Bearer {TOKEN}"})
        async with client, streamable_http_client(url, http_client=client) as (read, write), \
                ClientSession(read, write, extensions={"io.modelcontextprotocol/tasks": {}}) \
                as session:
            await session.discover()
            with anyio.fail_after(60):
                await session.call_tool("execute_code", {"code": "kept = 1",
                                                         "state_mode": "stateful"})
                await session.call_tool("execute_code", {"code": dies})
                await anyio.sleep(1.5)  # the host is gone
                for method in ("tasks/get", "tasks/cancel"):  # each starts a host again
                    with pytest.raises(Exception, match="not found"):
                        await send(session, method, "c_of_the_host_that_died")
                    after = content(await session.call_tool("execute_code", {
                        "code": "'kept' in globals()", "state_mode": "stateful"}))
                    assert after["result"] == "False" and after.get("state_lost") is True, after
                    await session.call_tool("execute_code", {"code": "kept = 1",
                                                             "state_mode": "stateful"})
                    await session.call_tool("execute_code", {"code": dies})
                    await anyio.sleep(1.5)

    env = child_env(tmp_path / "home", COORDEX_TOKEN=TOKEN)
    # Sessions not kept: a host that died takes their state with it (else the next call
    # says ``restored``, SPEC 12, which tells the model as much).
    with spawn("serve", "--port", "0", "--confine", str(tmp_path / "work"), "--no-persist",
               env=env) as running:
        anyio.run(main, running.wait_for(READY).group(1))


def test_a_tenant_sees_only_its_own_calls(tmp_path: Path) -> None:
    """Through confined tenants: Bob cannot wait for, fetch or cancel Alice's call by
    its call_id, and her call goes on to its end."""
    import os

    from .test_mcp_http import call_with_sdk

    tokens = tmp_path / "tokens.txt"
    tokens.write_text("alice alice-token-0123456789\nbob bob-token-0123456789\n")
    os.chmod(tokens, 0o600)
    env = child_env(tmp_path / "home")
    with spawn("serve", "--port", "0", "--tokens", str(tokens), "--max-wait", "1",
               env=env) as running:
        url = running.wait_for(READY).group(1)
        alice = call_with_sdk(url, "alice-token-0123456789", [
            ("execute_code", {"code": "import time\ntime.sleep(3)\n'done'",
                              "state_mode": "stateful"})])
        call_id = alice[0]["call_id"]
        assert alice[0]["running"] is True
        # Alice's page lists it among the calls running, detached (it runs in her host).
        page = httpx.get(url.replace("/mcp", "/ui/api/running"),
                         headers={"authorization": "Bearer alice-token-0123456789"}).json()
        listed = [c for c in page["running"] if c.get("call_id") == call_id]
        assert listed and listed[0]["detached"] is True, page
        bob = call_with_sdk(url, "bob-token-0123456789", [
            ("wait_call", {"call_id": call_id}), ("cancel_call", {"call_id": call_id}),
            ("list_sessions", {})])
        assert bob[0]["error_type"] == "not_found" and bob[1]["error_type"] == "not_found"
        assert "Calls running now: none" in bob[0]["suggestion"]  # hers are not named
        assert call_id not in json.dumps(bob[2])
        time.sleep(3)
        again = call_with_sdk(url, "alice-token-0123456789", [("wait_call", {"call_id": call_id})])
        assert again[0]["result"] == "'done'"  # Bob's cancel_call did not reach it
        page = httpx.get(url.replace("/mcp", "/ui/api/running"),
                         headers={"authorization": "Bearer alice-token-0123456789"}).json()
        assert not [c for c in page["running"] if c.get("call_id") == call_id]
