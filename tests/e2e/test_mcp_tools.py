"""The MCP tool listing and results, through the SDK's client against ``coordex mcp``.

Every tool's structured content - success and error - validates against the
``outputSchema`` it lists, and equals what ``Executor.call_tool`` returns for the same
call.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import anyio
import jsonschema
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from coordex import Executor

from ..integration.test_call_tool import CALLS, steady, with_nulls
from ._procs import child_env

pytestmark = pytest.mark.timeout(120)


def over_mcp(home: Path, calls: list[tuple[str, dict[str, Any]]],
             *extra: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The listed tools by name, and each call's structured content (``isError`` checked)."""
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "coordex", "mcp", *extra], env=child_env(home))
    tools: dict[str, Any] = {}
    results: list[dict[str, Any]] = []

    async def main() -> None:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            with anyio.fail_after(90):
                listed = await session.list_tools()
                tools.update({tool.name: tool.model_dump(by_alias=True, exclude_none=True)
                              for tool in listed.tools})
                for name, arguments in calls:
                    # The SDK client also checks structured content against outputSchema.
                    result = await session.call_tool(name, arguments)
                    assert isinstance(result.structured_content, dict)
                    assert result.is_error == ("error_type" in result.structured_content)
                    results.append(result.structured_content)

    anyio.run(main)
    return tools, results


def test_results_validate_against_the_output_schema_and_equal_call_tool(tmp_path: Path) -> None:
    tools, results = over_mcp(tmp_path / "mcp", CALLS)
    for (name, _), result in zip(CALLS, results, strict=True):
        jsonschema.validate(result, tools[name]["outputSchema"])
    assert any("error_type" in r for r in results) and any("stdout" in r for r in results)
    with Executor(root=tmp_path / "local", persist=True) as ex:  # as coordex mcp keeps them
        local = [ex.call_tool(name, arguments) for name, arguments in CALLS]
    assert [steady(r) for r in results] == [steady(r) for r in local]


def test_tools_have_titles_annotations_and_the_50_s_default(tmp_path: Path) -> None:
    tools, results = over_mcp(tmp_path, [
        ("execute_code", with_nulls("execute_code", {"code": "'strict'"}))])
    assert results[0]["result"] == "'strict'"
    for tool in tools.values():
        assert tool["title"] and tool["annotations"]["title"] == tool["title"]
        assert tool["outputSchema"]["type"] == "object"
    assert "interrupted after 50 s unless you pass timeout" in tools["execute_code"]["description"]
    schema = tools["execute_code"]["inputSchema"]
    assert "(default 50 s)" in schema["properties"]["timeout"]["description"]


def test_the_operator_timeout_is_the_one_described(tmp_path: Path) -> None:
    tools, results = over_mcp(tmp_path, [("execute_code", {"code": "import time; time.sleep(5)"})],
                              "--timeout", "1")
    assert "interrupted after 1 s" in tools["execute_code"]["description"]
    assert results[0]["error_type"] == "timeout"


def test_the_documented_desktop_config_starts_a_working_server(tmp_path: Path) -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "connect.md").read_text()
    found = re.search(r"\*\*Claude Desktop\*\*.*?```json\n(.*?)```", page, re.S)
    assert found is not None, "the docs show the Claude Desktop config"
    server = json.loads(found.group(1))["mcpServers"]["coordex"]
    # The config names the installed command by its full path (a placeholder folder);
    # here it is this interpreter's script of that name.
    command = str(Path(sys.executable).with_name(Path(server["command"]).name))
    params = StdioServerParameters(command=command, args=server["args"], env=child_env(tmp_path))

    async def main() -> list[str]:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            result = await session.call_tool("execute_code", {"code": "6 * 7"})
            assert result.structured_content is not None
            assert result.structured_content["result"] == "42"
            return [tool.name for tool in (await session.list_tools()).tools]

    assert "execute_code" in anyio.run(main)
