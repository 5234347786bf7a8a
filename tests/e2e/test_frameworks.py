"""coordex driven by agent frameworks, as the README's "Use it from..." section shows.

Each test runs a script from ``examples/`` - a framework's own MCP client starting a
real ``coordex mcp`` over stdio, with a scripted model in place of a real one - and
checks what the model saw. Needs the ``frameworks`` extra.
"""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from ._procs import child_env

pytestmark = [pytest.mark.frameworks, pytest.mark.timeout(120)]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pydantic_ai_mcp_toolset(tmp_path: Path) -> None:
    pytest.importorskip("pydantic_ai")
    module = example("pydantic_ai_agent")
    seen: list[Any] = asyncio.run(module.run(child_env(tmp_path)))
    load, look, check, inspect = seen
    assert load["result"] == "3" and load["session"]["session_name"] == "sales"
    assert look["result"] == "('east', 45)" and look["isolation"]["names"] is True
    assert check["stdout"] == "245\n" and check["exit_code"] == 0
    # The read-only sort was discarded: the session still holds the rows as loaded.
    [rows] = inspect["names"]
    assert rows["repr"] == "[('north', 120), ('south', 80), ('east', 45)]"


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
