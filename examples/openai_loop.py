"""A model's own tool loop with the OpenAI SDK (Chat Completions, strict schemas).

    OPENAI_API_KEY=... python examples/openai_loop.py "How many rows does data.csv have?"

``run`` takes the client, so a test can drive the loop against a scripted endpoint.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from coordex import Executor


def run(client: Any, ex: Executor, prompt: str, model: str = "gpt-5") -> str:
    tools = ex.tool_definitions(format="openai", strict=True)
    messages: list[Any] = [{"role": "user", "content": prompt}]
    while True:
        reply = client.chat.completions.create(model=model, messages=messages, tools=tools)
        message = reply.choices[0].message
        messages.append(message)
        if not message.tool_calls:
            return str(message.content)
        for call in message.tool_calls:  # arguments arrive as JSON text; nulls mean omitted
            result = ex.call_tool(call.function.name, call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})


if __name__ == "__main__":
    from openai import OpenAI

    with Executor() as executor:
        print(run(OpenAI(), executor, " ".join(sys.argv[1:]) or "What is 2**100?"))
