"""The pydantic-ai recipe of docs/frameworks.md survives failing cells (SPEC 8 front ends).

For a code tool, a cell that raises is routine; with pydantic-ai's default tool error
behaviour each error result spends one of the tool's retries (1 by default), so two in a
row ended the run. The recipe (``examples/pydantic_ai_agent.py``: ``coordex_toolset``)
hands error results to the model as results; the run goes on, and the model saw each
error's suggestion.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from ..integration.test_sdk_loops import example
from ._procs import child_env

pytestmark = [pytest.mark.frameworks, pytest.mark.timeout(120)]

CELLS = ["1 / 0", "undefined_name + 1", "6 * 7"]


def test_two_failing_cells_in_a_row_do_not_end_the_run(tmp_path: Path) -> None:
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.messages import (
        ModelMessage,
        ModelResponse,
        RetryPromptPart,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    module = example("pydantic_ai_agent")

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = [part.content for message in messages for part in message.parts
                if isinstance(part, (ToolReturnPart, RetryPromptPart))]
        if len(done) < len(CELLS):
            return ModelResponse(parts=[ToolCallPart("execute_code", {"code": CELLS[len(done)]})])
        return ModelResponse(parts=[TextPart(json.dumps(done, default=str))])

    async def run() -> list[Any]:
        agent = Agent(FunctionModel(model), toolsets=[module.coordex_toolset(child_env(tmp_path))])
        async with agent:
            result = await agent.run("Compute it.")
        return list(json.loads(result.output))

    first, second, third = asyncio.run(run())
    assert "ZeroDivisionError" in str(first) and "suggestion" in str(first)
    assert "NameError" in str(second) and "stateless call" in str(second)
    assert "'42'" in str(third) or '"42"' in str(third)
