"""``coordex mcp`` over stdio survives undecodable text: a printed file name with a byte
that is not UTF-8, and lone surrogates the client sends as JSON escapes."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession

from ._procs import child_env
from .test_mcp_stdio import run_session, structured

pytestmark = pytest.mark.timeout(120)


def odd_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "odd"
    folder.mkdir()
    with open(os.path.join(os.fsencode(folder), b"caf\xe9.txt"), "w"):
        pass
    return folder


def test_printing_an_undecodable_file_name_keeps_the_server_up(tmp_path: Path) -> None:
    folder = odd_folder(tmp_path)
    listing = f"import os\nprint(os.listdir({str(folder)!r}))\nos.listdir({str(folder)!r})"

    async def body(session: ClientSession) -> None:
        for arguments in ({"code": listing},
                          {"code": listing, "state_mode": "stateful", "session_name": "s"},
                          {"code": f"ls {str(folder)!r}", "language": "bash"}):
            result = await session.call_tool("execute_code", arguments)
            record = structured(result)
            assert not result.is_error, record
            assert "caf" in record["stdout"], record
        after = await session.call_tool("execute_code", {"code": "1 + 1"})
        assert structured(after)["result"] == "2"

    run_session(tmp_path / "home", body)


def test_lone_surrogates_in_arguments_are_errors_not_crashes(tmp_path: Path) -> None:
    """Raw JSON-RPC: the SDK's client cannot even encode such strings, a careless one can."""
    proc = subprocess.Popen([sys.executable, "-m", "coordex", "mcp"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            env=child_env(tmp_path / "home"))
    assert proc.stdin is not None and proc.stdout is not None
    ids = iter(range(1, 100))

    def send(method: str, params: dict[str, Any], notify: bool = False) -> dict[str, Any]:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
        if not notify:
            message["id"] = next(ids)
        # ensure_ascii: the lone surrogate travels as the JSON escape \udce9
        proc.stdin.write((json.dumps(message) + "\n").encode("ascii"))  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]
        if notify:
            return {}
        while True:
            ready, _, _ = select.select([proc.stdout], [], [], 30)
            assert ready, f"no reply to {method} within 30 s"
            line = proc.stdout.readline()  # type: ignore[union-attr]
            assert line, "the server closed its output"
            reply: dict[str, Any] = json.loads(line)
            if reply.get("id") == message["id"]:
                return reply

    try:
        send("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                            "clientInfo": {"name": "test", "version": "0"}})
        send("notifications/initialized", {}, notify=True)
        calls = [
            ("execute_code", {"code": "1", "state_mode": "stateful", "session_name": "a\udce9"}),
            ("execute_code", {"code": "x = '\udce9'"}),
            ("create_environment", {"spec": "", "name": "env\udce9"}),
            ("create_environment", {"spec": "caf\udce9lib"}),
            ("define_function", {"source": "def f():\n    return '\udce9'\n"}),
            ("execute_code", {"code": "print('caf\\udce9')"}),
        ]
        for name, arguments in calls:
            reply = send("tools/call", {"name": name, "arguments": arguments})
            result = reply["result"]
            record = result["structuredContent"]
            assert record.get("error_type") != "crashed" and record.get("state_lost") is not True, \
                (name, record)
            assert record.get("error_type") in (None, "validation", "execution"), (name, record)
        assert record["stdout"] == "caf\\udce9\n"  # the print, escaped as everywhere
        reply = send("tools/call", {"name": "execute_code", "arguments": {"code": "1 + 1"}})
        assert reply["result"]["structuredContent"]["result"] == "2"
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()
