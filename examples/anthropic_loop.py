"""A model's own tool loop with the Anthropic SDK (Messages API).

    ANTHROPIC_API_KEY=... python examples/anthropic_loop.py "How many rows does data.csv have?"

``run`` takes the client, so a test can drive the loop against a scripted endpoint.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from coordex import Executor


def run(client: Any, ex: Executor, prompt: str, model: str = "claude-sonnet-5") -> str:
    tools = ex.tool_definitions(format="anthropic")
    messages: list[Any] = [{"role": "user", "content": prompt}]
    while True:
        reply = client.messages.create(model=model, max_tokens=4096, tools=tools, messages=messages)
        messages.append({"role": "assistant", "content": reply.content})
        calls = [block for block in reply.content if block.type == "tool_use"]
        if not calls:
            return "".join(block.text for block in reply.content if block.type == "text")
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call.id,
             "content": json.dumps(result := ex.call_tool(call.name, call.input)),
             "is_error": "error_type" in result}
            for call in calls]})


if __name__ == "__main__":
    import anthropic

    with Executor() as executor:
        print(run(anthropic.Anthropic(), executor, " ".join(sys.argv[1:]) or "What is 2**100?"))
