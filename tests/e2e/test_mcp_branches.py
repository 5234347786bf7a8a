"""SPEC 15 over MCP: the SDK's client starts ``coordex mcp`` over stdio, forks a session,
checkpoints it, restores it, and finds its checkpoints again after a restart."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from mcp import ClientSession
from mcp.types import CallToolResult

from ._procs import run_stdio_session

pytestmark = pytest.mark.timeout(120)

Body = Callable[[ClientSession], Awaitable[None]]
BRANCH_TOOLS = ("fork_session", "checkpoint_session", "restore_session", "list_checkpoints")


def run_session(home: Path, body: Body) -> None:
    run_stdio_session(home, body)


async def call(session: ClientSession, schemas: dict[str, Any], name: str,
               arguments: dict[str, Any]) -> tuple[dict[str, Any], CallToolResult]:
    result = await session.call_tool(name, arguments)
    content = result.structured_content
    assert isinstance(content, dict)
    jsonschema.validate(content, schemas[name])  # structured content fits its outputSchema
    return content, result


async def schemas_of(session: ClientSession) -> dict[str, Any]:
    tools = {tool.name: tool for tool in (await session.list_tools()).tools}
    return {name: tool.output_schema for name, tool in tools.items()}


def test_branch_tools_have_titles_annotations_schemas_and_their_one_line(tmp_path: Path) -> None:
    async def body(session: ClientSession) -> None:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        for name in BRANCH_TOOLS:
            assert tools[name].title and tools[name].output_schema
            assert tools[name].annotations is not None
        assert tools["list_checkpoints"].annotations.read_only_hint is True  # type: ignore[union-attr]
        assert tools["restore_session"].annotations.destructive_hint is True  # type: ignore[union-attr]
        assert (tools["fork_session"].description or "").startswith(
            "Fork for a trial of several steps that must not touch the original")
        assert (tools["checkpoint_session"].description or "").startswith(
            "Checkpoint before a risky stateful step, restore to undo it")
        assert tools["fork_session"].input_schema["required"] == ["new_name"]

    run_session(tmp_path, body)


def test_fork_checkpoint_restore_and_a_restart(tmp_path: Path) -> None:
    made: dict[str, Any] = {}

    async def first(session: ClientSession) -> None:
        schemas = await schemas_of(session)
        await session.call_tool("execute_code", {"code": "rows = [3, 1, 2]", "state_mode":
                                                 "stateful", "session_name": "clean"})
        forked, _ = await call(session, schemas, "fork_session",
                               {"session_name": "clean", "new_name": "trial"})
        assert forked["session"]["session_name"] == "trial"
        await session.call_tool("execute_code", {"code": "rows.sort()", "state_mode":
                                                 "stateful", "session_name": "trial"})
        original = await session.call_tool("execute_code", {
            "code": "rows", "state_mode": "stateful", "session_name": "clean"})
        assert original.structured_content["result"] == "[3, 1, 2]"  # type: ignore[index]
        taken, _ = await call(session, schemas, "checkpoint_session",
                              {"session_name": "clean", "label": "unsorted"})
        made.update(taken)
        await session.call_tool("execute_code", {"code": "rows = None", "state_mode":
                                                 "stateful", "session_name": "clean"})
        back, _ = await call(session, schemas, "restore_session",
                             {"session_name": "clean", "checkpoint": taken["checkpoint"]})
        assert back["restored"] is True and "not touched" in back["files"]
        again = await session.call_tool("execute_code", {
            "code": "rows", "state_mode": "stateful", "session_name": "clean"})
        assert again.structured_content["result"] == "[3, 1, 2]"  # type: ignore[index]
        wrong, result = await call(session, schemas, "restore_session",
                                   {"session_name": "trial", "checkpoint": taken["checkpoint"]})
        assert result.is_error and wrong["error_type"] == "validation"

    async def after_restart(session: ClientSession) -> None:
        schemas = await schemas_of(session)
        listed, _ = await call(session, schemas, "list_checkpoints", {"session_name": "clean"})
        assert [c["checkpoint"] for c in listed["checkpoints"]] == [made["checkpoint"]]
        await session.call_tool("execute_code", {"code": "rows = 'changed'", "state_mode":
                                                 "stateful", "session_name": "clean"})
        back, _ = await call(session, schemas, "restore_session",
                             {"session_name": "clean", "checkpoint": made["checkpoint"]})
        assert back["label"] == "unsorted"
        rows = await session.call_tool("execute_code", {
            "code": "rows", "state_mode": "stateful", "session_name": "clean"})
        assert rows.structured_content["result"] == "[3, 1, 2]"  # type: ignore[index]

    run_session(tmp_path, first)
    run_session(tmp_path, after_restart)


def test_a_bash_fork_over_mcp_carries_an_open_fd_and_leaves_the_source(tmp_path: Path) -> None:
    log = tmp_path / "fd3.txt"

    async def body(session: ClientSession) -> None:
        schemas = await schemas_of(session)

        async def bash(code: str, name: str) -> dict[str, Any]:
            result = await session.call_tool("execute_code", {
                "code": code, "language": "bash", "state_mode": "stateful",
                "session_name": name})
            assert isinstance(result.structured_content, dict)
            return result.structured_content

        await bash(f"x=41; f() {{ echo \"f $x\"; }}; cd {tmp_path}; exec 3>{log}", "src")
        forked, _ = await call(session, schemas, "fork_session", {
            "session_name": "src", "language": "bash", "new_name": "trial"})
        assert forked["copy"] == "process" and forked["left_out"] == []
        shown = await bash("echo $x; f; pwd; echo fork >&3; x=99; cd /", "trial")
        assert shown["stdout"] == f"41\nf 41\n{tmp_path}\n"
        assert (await bash("echo $x; pwd; echo source >&3", "src"))["stdout"] == \
            f"41\n{tmp_path}\n"
        assert log.read_text() == "fork\nsource\n"

    run_session(tmp_path, body)
