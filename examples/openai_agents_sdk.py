"""coordex from the OpenAI Agents SDK: ``MCPServerStdio`` with strict schemas, scripted model.

    python examples/openai_agents_sdk.py

Two settings matter. ``client_session_timeout_seconds`` defaults to 5 s, so any call
longer than that fails in the SDK with no hint; set it above coordex's own 50 s default
call timeout (here 60 s), so a long call ends with coordex's ``timeout`` result, which
says whether the session kept its state. ``convert_schemas_to_strict=True`` makes every
argument required: coordex's optional arguments accept ``null``, which means omitted.

``ScriptedModel`` stands in for a real model (drop ``model=`` to use OpenAI's): it sends
the steps below as a strict-mode model would, every optional argument null.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from agents import Agent, FunctionTool, RunConfig, Runner
from agents.items import ModelResponse
from agents.mcp import MCPServerStdio
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

STEPS: list[tuple[str, dict[str, Any]]] = [
    ("execute_code", {"code": "totals = {'north': 120, 'south': 80}\nsum(totals.values())",
                      "language": "python", "state_mode": "stateful", "session_name": "sales",
                      "session_id": None, "venv_id": None, "timeout": None}),
    ("execute_code", {"code": "totals.clear()\nlen(totals)", "language": "python",
                      "state_mode": "read_only", "session_name": "sales", "session_id": None,
                      "venv_id": None, "timeout": None}),
    ("execute_code", {"code": "len(totals)", "language": "python", "state_mode": "stateful",
                      "session_name": "sales", "session_id": None, "venv_id": None,
                      "timeout": None}),
    ("define_function", {"source": "def share(totals, region):\n"
                                    "    return totals[region] / sum(totals.values())",
                         "name": None, "env": None}),
    ("call_function", {"name": "share", "args": '[{"north": 120, "south": 80}, "north"]',
                       "kwargs": None, "state_mode": "stateless", "session_id": None,
                       "session_name": None, "version": None, "timeout": None}),
    ("list_sessions", {}),
]


class ScriptedModel(Model):
    """Asks for the next step; once all have run, answers with their outputs as JSON."""

    def __init__(self) -> None:
        self.tools: list[Any] = []

    async def get_response(self, system_instructions: Any, input: Any, model_settings: Any,
                           tools: list[Any], *args: Any, **kwargs: Any) -> ModelResponse:
        self.tools = tools
        outputs = [item["output"] for item in input if isinstance(item, dict)
                   and item.get("type") == "function_call_output"]
        if len(outputs) < len(STEPS):
            name, arguments = STEPS[len(outputs)]
            n = len(outputs)
            item: Any = ResponseFunctionToolCall(type="function_call", id=f"fc_{n}",
                                                 call_id=f"call_{n}", name=name,
                                                 arguments=json.dumps(arguments))
        else:
            item = ResponseOutputMessage(
                id="msg", type="message", role="assistant", status="completed",
                content=[ResponseOutputText(type="output_text", text=json.dumps(outputs),
                                            annotations=[])])
        return ModelResponse(output=[item], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


async def run(env: dict[str, str] | None = None) -> tuple[list[Any], list[FunctionTool]]:
    """The steps through a real ``coordex mcp``; the tool outputs and the tools the model saw."""
    model = ScriptedModel()
    async with MCPServerStdio(
        params={"command": sys.executable, "args": ["-m", "coordex", "mcp"],
                "env": env if env is not None else dict(os.environ)},
        client_session_timeout_seconds=60,  # above coordex's 50 s default call timeout
    ) as coordex:
        agent = Agent(name="analyst", model=model, mcp_servers=[coordex],
                      mcp_config={"convert_schemas_to_strict": True})
        result = await Runner.run(agent, "How are sales spread across regions?",
                                  run_config=RunConfig(tracing_disabled=True))
    return [json.loads(_text(output)) for output in json.loads(result.final_output)], model.tools


def _text(output: Any) -> str:
    """A tool output as the SDK hands it to the model: text, or a list of content parts."""
    if isinstance(output, str):
        return output
    return "".join(part.get("text", "") for part in output if isinstance(part, dict))


if __name__ == "__main__":
    outputs, tools = asyncio.run(run())
    print("strict tools:", [t.name for t in tools if t.strict_json_schema])
    for step, seen in zip(STEPS, outputs, strict=True):
        print(step[0], "->", seen)
