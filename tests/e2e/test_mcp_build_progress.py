"""Build progress over MCP: uv's lines arrive as progress notifications, one line each
(SPEC 5), when the build starts on first use inside ``execute_code``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from tests.fakes.wheels import build_wheel, requirement

from ._procs import child_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def test_uvs_lines_arrive_one_per_notification_with_output_on_lines_of_its_own(
        tmp_path: Path) -> None:
    spec = "\n".join(
        requirement(name, build_wheel(tmp_path / "wheels", name, "1.0",
                                      {f"{name}/__init__.py": "X = 1\n"}))
        for name in ("alphapkg", "betapkg", "gammapkg"))
    params = StdioServerParameters(command=sys.executable, args=["-m", "coordex", "mcp"],
                                   env=child_env(tmp_path / "home"))
    notes: list[tuple[float, str]] = []
    seen: dict[str, Any] = {}

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        notes.append((progress, message or ""))

    async def main() -> None:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            with anyio.fail_after(150):
                made = await session.call_tool("create_environment", {"spec": spec})
                assert isinstance(made.structured_content, dict)
                ran = await session.call_tool("execute_code", {
                    "code": "import sys, alphapkg\nprint('out', flush=True)\n"
                            "print('err', file=sys.stderr, flush=True)\nalphapkg.X",
                    "venv_id": made.structured_content["venv_id"]},
                    progress_callback=on_progress)
                seen["ran"] = ran.structured_content

    anyio.run(main)
    assert seen["ran"]["result"] == "1", seen["ran"]
    build = [message for _, message in notes if message.startswith("[build] ")]
    assert all("\n" not in message for message in build), build
    assert any(m.startswith("[build] Resolved 3 packages") for m in build), build
    assert any(m.startswith("[build] Installed 3 packages") for m in build), build
    progress = [value for value, _ in notes]
    assert progress == sorted(progress) and len(set(progress)) == len(progress), notes
    # The run's own output: streams never glued together on one line.
    output = [message for _, message in notes if not message.startswith("[build] ")]
    assert output and "out\n[stderr] err\n" in output[-1], notes
