"""SPEC 8, 11, 14 and 15 word for word over MCP: the argument names each tool the SPEC
names takes, which are required, and what ``wait`` accepts, read from ``tools/list`` of
a real ``coordex mcp`` in both eras of the protocol (``initialize``, and 2026-07-28's
``server/discover``) through the official client."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters

from tests.e2e._procs import child_env

pytestmark = pytest.mark.timeout(90)

SESSION = {"language", "session_id", "session_name", "venv_id"}
# tool: (argument names, required), as SPEC 2, 11, 14 and 15 spell them.
ARGUMENTS: dict[str, tuple[set[str], list[str]]] = {
    "execute_code": ({"code", "language", "state_mode", "session_id", "session_name",
                      "venv_id", "timeout", "wait"}, ["code"]),
    "list_sessions": (set(), []),
    "inspect_session": (SESSION, []),
    "close_session": (SESSION, []),
    "rebuild_session": (SESSION | {"wait"}, []),
    "fork_session": (SESSION | {"new_name"}, ["new_name"]),
    "checkpoint_session": (SESSION | {"label"}, []),
    "restore_session": (SESSION | {"checkpoint"}, ["checkpoint"]),
    "list_checkpoints": (SESSION, []),
    "wait_call": ({"call_id", "wait"}, ["call_id"]),
    "cancel_call": ({"call_id"}, ["call_id"]),
}


def listed(home: Path, mode: str) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}

    async def main() -> None:
        params = StdioServerParameters(command=sys.executable,
                                       args=["-m", "coordex", "mcp"], env=child_env(home))
        with anyio.fail_after(60):
            async with Client(params, mode=mode) as client:
                for tool in (await client.list_tools()).tools:
                    found[tool.name] = tool.model_dump(mode="json")

    anyio.run(main)
    return found


def test_every_named_tool_takes_the_spec_arguments_in_both_eras(tmp_path: Path) -> None:
    eras = {mode: listed(tmp_path / "home", mode) for mode in ("legacy", "auto")}
    assert eras["legacy"] == eras["auto"]  # one tools/list, whichever era asks
    tools = eras["legacy"]
    for name, (arguments, required) in ARGUMENTS.items():
        schema = tools[name]["input_schema"]
        assert set(schema["properties"]) == arguments, name
        assert sorted(schema.get("required", [])) == sorted(required), name
    for name in ("execute_code", "rebuild_session", "wait_call", "call_function"):
        wait = tools[name]["input_schema"]["properties"]["wait"]  # SPEC 14: seconds, > 0
        assert wait["exclusiveMinimum"] == 0 and "number" in wait["type"], (name, wait)
    execute = tools["execute_code"]["input_schema"]["properties"]
    assert execute["language"]["enum"] == ["python", "bash"]
    assert execute["state_mode"]["enum"] == ["stateless", "stateful", "read_only"]
    for name in SESSION - {"language"}:
        assert "null" in execute[name]["type"], name  # null means omitted
