"""coordex from langchain-mcp-adapters over stdio, with one persistent session.

    python examples/langchain_mcp.py

``MultiServerMCPClient.get_tools()`` opens a new MCP session - a new ``coordex mcp``
process - for every tool call over stdio, so a stateful session would be gone by the
next call. Keep one ``client.session(...)`` open for the whole conversation and load
the tools from it; each ``ToolMessage.artifact`` carries coordex's result dict.
"""

from __future__ import annotations

import asyncio
import os
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


async def run(env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The steps through a real ``coordex mcp``; each call's result dict."""
    client = MultiServerMCPClient({"coordex": {
        "transport": "stdio", "command": sys.executable, "args": ["-m", "coordex", "mcp"],
        "env": env if env is not None else dict(os.environ)}})
    results = []
    async with client.session("coordex") as session:  # one process for the whole run
        tools = {tool.name: tool for tool in await load_mcp_tools(session)}
        for n, (name, args) in enumerate(STEPS):
            message = await tools[name].ainvoke(
                {"type": "tool_call", "id": f"call_{n}", "name": name, "args": args})
            results.append(structured(message.artifact))
    return results


def structured(artifact: Any) -> dict[str, Any]:
    """coordex's result dict from a tool message's artifact."""
    content = artifact.get("structured_content") if isinstance(artifact, dict) else None
    return dict(content) if isinstance(content, dict) else {"artifact": artifact}


if __name__ == "__main__":
    for step, result in zip(STEPS, asyncio.run(run()), strict=True):
        print(step[1]["code"].splitlines()[0], "->", result.get("result", result.get("error")))
