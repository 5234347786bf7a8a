"""coordex driven by agent frameworks, as docs/frameworks.md shows.

Each test runs a script from ``examples/`` - a framework's own MCP client starting a
real ``coordex mcp`` over stdio, with a scripted model in place of a real one - and
checks what the model saw. Needs the ``frameworks`` extra.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ..integration.test_sdk_loops import EXAMPLES, example
from ._procs import child_env

pytestmark = [pytest.mark.frameworks, pytest.mark.timeout(120)]

def test_pydantic_ai_mcp_toolset(tmp_path: Path) -> None:
    pytest.importorskip("pydantic_ai")
    module = example("pydantic_ai_agent")
    seen: list[Any] = asyncio.run(module.run(child_env(tmp_path)))
    load, look, check, inspect, misspelt = seen
    assert load["result"] == "3" and load["session"]["session_name"] == "sales"
    assert look["result"] == "('east', 45)" and look["isolation"]["names"] is True
    assert check["stdout"] == "245\n" and check["exit_code"] == 0
    # The read-only sort was discarded: the session still holds the rows as loaded.
    [rows] = inspect["names"]
    assert rows["repr"] == "[('north', 120), ('south', 80), ('east', 45)]"
    # An error result reaches the model as a retry prompt holding the error dict.
    assert "Did you mean session_name='sales'?" in str(misspelt)


def test_openai_agents_sdk_with_strict_schemas(tmp_path: Path) -> None:
    pytest.importorskip("agents")
    module = example("openai_agents_sdk")
    outputs, tools = asyncio.run(module.run(child_env(tmp_path)))
    # The SDK's own strict conversion accepts every coordex tool (none falls back).
    assert {t.name for t in tools if t.strict_json_schema} == {t.name for t in tools}
    assert len(tools) >= 10
    load, clear, after, define, call, listed = outputs
    assert load["result"] == "200" and clear["result"] == "0"  # cleared in the copy only
    assert after["result"] == "2"
    assert define["name"] == "share" and call["value"] == 0.6  # args as JSON text
    assert [s["session_name"] for s in listed["sessions"]] == [None, "sales"]


@pytest.mark.network
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_langchain_mcp_adapters_with_a_persistent_session(tmp_path: Path) -> None:
    # langchain-mcp-adapters needs the MCP SDK 1.x, coordex 2.x: the client runs in an
    # environment coordex builds for it, and starts this checkout's coordex as its server.
    from coordex.environments import EnvironmentManager

    manager = EnvironmentManager(tmp_path / "client-env")
    created = manager.create("langchain-mcp-adapters>=0.3,<0.4")
    built = manager.build(created["venv_id"])
    if built.get("error_type") == "environment" and "network" in built["error"].lower():
        pytest.skip("the package registry cannot be reached")
    assert built.get("built"), built
    env = child_env(tmp_path / "home", COORDEX_COMMAND=f"{sys.executable} -m coordex")
    done = subprocess.run([str(manager.python_for(created["venv_id"])),
                           str(EXAMPLES / "langchain_mcp.py"), "--json"],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    load, look, total, missing = json.loads(done.stdout.splitlines()[-1])
    assert load["result"] == "3" and look["result"] == "4"
    assert total["result"] == "245"  # the session lived across calls; the copy's append did not
    assert missing["error_type"] == "execution" and missing["exception"] == "NameError"
