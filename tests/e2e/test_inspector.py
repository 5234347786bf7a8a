"""The MCP Inspector CLI (npm ``@modelcontextprotocol/inspector``) against coordex.

The commands of docs/frameworks.md, run as written: stdio (``--cli coordex mcp``) and streamable HTTP
(``--transport http --header "Authorization: Bearer ..."``). The package is installed
with npm into a temporary folder once per test session; without npm the tests skip.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ._procs import child_env, spawn

pytestmark = [pytest.mark.frameworks, pytest.mark.network, pytest.mark.slow,
              pytest.mark.timeout(300)]

INSPECTOR = "@modelcontextprotocol/inspector@2.12"
TOKEN = "inspector-token-0123456789"
READY = r"serving MCP on (http://127\.0\.0\.1:\d+/mcp)"


@pytest.fixture(scope="module")
def inspector(tmp_path_factory: pytest.TempPathFactory) -> Path:
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed")
    folder = tmp_path_factory.mktemp("inspector")
    done = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--prefix", str(folder),
                           INSPECTOR], capture_output=True, text=True, timeout=240, check=False,
                          stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        pytest.skip(f"npm could not install {INSPECTOR}: {done.stderr[-500:]}")
    return folder / "node_modules" / ".bin" / "mcp-inspector"


def cli(inspector: Path, home: Path, *args: str, status: int = 0) -> dict[str, Any]:
    """The Inspector's JSON output; ``status`` is its expected exit status (5: isError)."""
    done = subprocess.run([str(inspector), "--cli", *args], env=child_env(home),
                          capture_output=True, text=True, timeout=90, check=False,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == status, done.stderr[-2000:]
    return dict(json.loads(done.stdout))


@pytest.fixture
def coordex_command() -> str:
    return str(Path(sys.executable).with_name("coordex"))


def test_stdio_lists_and_calls(inspector: Path, tmp_path: Path, coordex_command: str) -> None:
    listed = cli(inspector, tmp_path, coordex_command, "mcp", "--method", "tools/list")
    tools = {tool["name"]: tool for tool in listed["tools"]}
    assert tools["execute_code"]["title"] == "Execute code"
    assert all("outputSchema" in tool and tool["annotations"] for tool in tools.values())
    called = cli(inspector, tmp_path, coordex_command, "mcp", "--method", "tools/call",
                 "--tool-name", "execute_code", "--tool-arg", "code=print(6 * 7)")
    assert called["structuredContent"]["stdout"] == "42\n" and called["isError"] is False
    failed = cli(inspector, tmp_path, coordex_command, "mcp", "--method", "tools/call",
                 "--tool-name", "execute_code", "--tool-arg", "code=x",
                 "--tool-arg", "state_mode=read_only", status=5)
    assert failed["isError"] is True
    assert failed["structuredContent"]["error_type"] == "validation"


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[str]:
    with spawn("serve", "--port", "0",
               env=child_env(tmp_path / "home", COORDEX_TOKEN=TOKEN)) as running:
        yield running.wait_for(READY).group(1)


def test_http_with_the_bearer_header(inspector: Path, tmp_path: Path, http_server: str) -> None:
    listed = cli(inspector, tmp_path, http_server, "--transport", "http",
                 "--header", f"Authorization: Bearer {TOKEN}", "--method", "tools/list")
    assert "execute_code" in {tool["name"] for tool in listed["tools"]}
    denied = subprocess.run([str(inspector), "--cli", http_server, "--transport", "http",
                             "--method", "tools/list"], env=child_env(tmp_path),
                            capture_output=True, text=True, timeout=90, check=False,
                            stdin=subprocess.DEVNULL)
    assert denied.returncode != 0  # no token: 401
