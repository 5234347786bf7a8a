"""coordex from pydantic-ai: ``MCPToolset`` over stdio, driven by a scripted model.

    python examples/pydantic_ai_agent.py

``FunctionModel`` stands in for a real model (swap in ``Agent("openai:gpt-5", ...)``): it
asks for the four steps of a small analysis - load in a stateful session, look at it
read-only, check a one-off, inspect the session - then reports what came back.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from fastmcp.client.transports import StdioTransport
from pydantic_ai import Agent
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

STEPS: list[tuple[str, dict[str, Any]]] = [
    ("execute_code", {"code": "rows = [('north', 120), ('south', 80), ('east', 45)]\nlen(rows)",
                      "state_mode": "stateful", "session_name": "sales"}),
    ("execute_code", {"code": "rows.sort(key=lambda r: r[1])\nrows[0]", "state_mode": "read_only",
                      "session_name": "sales"}),
    ("execute_code", {"code": "echo $((120 + 80 + 45))", "language": "bash"}),
    ("inspect_session", {"session_name": "sales"}),
    # A misspelt session: the error dict reaches the model, suggestion included.
    ("execute_code", {"code": "rows[0]", "state_mode": "read_only", "session_name": "sale"}),
]


def returns(messages: list[ModelMessage]) -> list[Any]:
    """What each tool call gave back: a result, or the retry prompt of an error result."""
    return [part.content for message in messages for part in message.parts
            if isinstance(part, (ToolReturnPart, RetryPromptPart))]


def scripted_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Ask for the next step; once all have run, answer with their results as JSON."""
    done = returns(messages)
    if len(done) < len(STEPS):
        name, args = STEPS[len(done)]
        return ModelResponse(parts=[ToolCallPart(name, args)])
    return ModelResponse(parts=[TextPart(json.dumps(done, default=str))])


def coordex_toolset(env: dict[str, str] | None = None) -> MCPToolset:
    """coordex as the README's recipe has it.

    ``tool_error_behavior="failed"``: an error result (a cell that raised, a wrong
    coordinate) goes back to the model as the tool's result, error dict and suggestion
    included. With the default ("retry") each error spends one of the tool's retries
    (1 by default), so two failing cells in a row end the run with
    ``UnexpectedModelBehavior`` - and failing cells are routine for a code tool.
    """
    server = StdioTransport(command=sys.executable, args=["-m", "coordex", "mcp"],
                            env=env if env is not None else dict(os.environ))
    return MCPToolset(server, tool_error_behavior="failed")


async def run(env: dict[str, str] | None = None) -> list[Any]:
    """The four steps through a real ``coordex mcp``; the results the model saw."""
    agent = Agent(FunctionModel(scripted_model), toolsets=[coordex_toolset(env)])
    async with agent:
        result = await agent.run("How are sales spread across regions?")
    return list(json.loads(result.output))


if __name__ == "__main__":
    for step, seen in zip(STEPS, asyncio.run(run()), strict=True):
        print(step[0], "->", seen)
