"""coordex from langchain-mcp-adapters over stdio, with one persistent session.

    python examples/langchain_mcp.py            # starts `coordex mcp` from PATH

langchain-mcp-adapters 0.3 is built on the MCP SDK 1.x and coordex on 2.x, so the two live
in different environments: run this script with the Python that has
langchain-mcp-adapters; the server it starts is the ``coordex`` command
(``COORDEX_COMMAND`` overrides it, e.g. ``"/path/to/python -m coordex"``).

``MultiServerMCPClient.get_tools()`` opens a new MCP session - a new ``coordex mcp``
process - for every tool call over stdio, so a stateful session would be gone by the
next call. Keep one ``client.session(...)`` open for the whole conversation and load
the tools from it; each ``ToolMessage.artifact`` carries coordex's result dict.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys
from typing import Any

from langchain_mcp_adapters.client import MultiServerMCPClient
from langchain_mcp_adapters.tools import load_mcp_tools

STEPS: list[tuple[str, dict[str, Any]]] = [
    ("execute_code", {"code": "rows = [120, 80, 45]\nlen(rows)", "state_mode": "stateful",
                      "session_name": "sales"}),
    ("execute_code", {"code": "rows.append(1)\nlen(rows)", "state_mode": "read_only",
                      "session_name": "sales"}),
    ("execute_code", {"code": "sum(rows)", "state_mode": "stateful", "session_name": "sales"}),
    ("execute_code", {"code": "undefined_name", "state_mode": "stateful",
                      "session_name": "sales"}),
]


async def run(command: list[str]) -> list[dict[str, Any]]:
    """The steps through a real ``coordex mcp`` started as ``command``; each result dict."""
    client = MultiServerMCPClient({"coordex": {
        "transport": "stdio", "command": command[0], "args": [*command[1:], "mcp"],
        "env": dict(os.environ)}})
    results = []
    async with client.session("coordex") as session:  # one process for the whole run
        tools = {tool.name: tool for tool in await load_mcp_tools(session)}
        for n, (name, args) in enumerate(STEPS):
            message = await tools[name].ainvoke(
                {"type": "tool_call", "id": f"call_{n}", "name": name, "args": args})
            results.append(structured(message))
    return results


def structured(message: Any) -> dict[str, Any]:
    """coordex's result dict from a ``ToolMessage``.

    A result is in the artifact's structured content; an error (``isError``) reaches
    langchain as a tool error whose text is the error dict as JSON.
    """
    artifact = message.artifact
    content = artifact.get("structured_content") if isinstance(artifact, dict) else None
    if isinstance(content, dict):
        return dict(content)
    blocks = message.content if isinstance(message.content, list) else [message.content]
    text = "".join(b.get("text", "") if isinstance(b, dict) else str(b) for b in blocks)
    try:
        return dict(json.loads(text))
    except (ValueError, TypeError):
        return {"error": text, "status": message.status}


if __name__ == "__main__":
    results = asyncio.run(run(shlex.split(os.environ.get("COORDEX_COMMAND", "coordex"))))
    if "--json" in sys.argv:
        print(json.dumps(results))
    else:
        for step, result in zip(STEPS, results, strict=True):
            print(step[1]["code"].splitlines()[0], "->", result.get("result", result.get("error")))
