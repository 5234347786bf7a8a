"""``coordex serve`` end to end: a real server on a free loopback port.

Bearer auth (missing and wrong tokens answered alike), the SDK's streamable HTTP client,
raw httpx, DNS-rebinding protection, and tenants that cannot see each other.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from ._procs import Running, child_env, run_cli, spawn

pytestmark = pytest.mark.timeout(120)

TOKEN = "test-token-0123456789abcdef"
READY = r"serving MCP on (http://127\.0\.0\.1:\d+/mcp)"
ACCEPT = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
INITIALIZE = {
    "jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {},
               "clientInfo": {"name": "raw-httpx", "version": "0"}},
}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[Running, str]]:
    env = child_env(tmp_path / "home", COORDEX_TOKEN=TOKEN)
    with spawn("serve", "--port", "0", env=env) as running:
        url = running.wait_for(READY).group(1)
        yield running, url


def sse_json(response: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC message of a response (plain JSON or one SSE ``data:`` line)."""
    if response.headers.get("content-type", "").startswith("application/json"):
        return dict(response.json())
    for line in response.text.splitlines():
        if line.startswith("data:"):
            return dict(json.loads(line[5:]))
    raise AssertionError(f"no data line in {response.text!r}")


def call_with_sdk(url: str, token: str, calls: list[tuple[str, dict[str, Any]]],
                  meta: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Run tool calls through the SDK client; return each result's structured content.
    ``meta``: each request's ``_meta`` (a trace context, say)."""
    results: list[dict[str, Any]] = []

    async def main() -> None:
        client = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        async with client, streamable_http_client(url, http_client=client) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            with anyio.fail_after(60):
                for name, arguments in calls:
                    result = await session.call_tool(name, arguments, meta=meta)
                    assert isinstance(result.structured_content, dict)
                    results.append({"is_error": result.is_error, **result.structured_content})

    anyio.run(main)
    return results


def test_requests_without_or_with_a_wrong_token_get_401(server: tuple[Running, str]) -> None:
    _, url = server
    missing = httpx.post(url, json=INITIALIZE, headers=ACCEPT)
    wrong = httpx.post(url, json=INITIALIZE, headers={**ACCEPT, "authorization": "Bearer nope"})
    almost = httpx.post(url, json=INITIALIZE,
                        headers={**ACCEPT, "authorization": f"Bearer {TOKEN[:-1]}"})
    basic = httpx.post(url, json=INITIALIZE, headers={**ACCEPT, "authorization": f"Basic {TOKEN}"})
    other_path = httpx.get(url.replace("/mcp", "/anything"))
    for response in (missing, wrong, almost, basic, other_path):
        assert response.status_code == 401
        assert response.text == missing.text
        assert response.headers["www-authenticate"] == missing.headers["www-authenticate"]


def test_raw_httpx_with_the_token(server: tuple[Running, str]) -> None:
    _, url = server
    auth = {**ACCEPT, "authorization": f"Bearer {TOKEN}"}
    with httpx.Client(timeout=30) as client:
        init = client.post(url, json=INITIALIZE, headers=auth)
        assert init.status_code == 200, init.text
        assert sse_json(init)["result"]["serverInfo"]["name"] == "coordex"
        session = {**auth, "mcp-session-id": init.headers["mcp-session-id"],
                   "mcp-protocol-version": "2025-06-18"}
        note = client.post(url, headers=session,
                           json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert note.status_code == 202
        call = client.post(url, headers=session, json={
            "jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "execute_code", "arguments": {"code": "2 ** 10"}}})
        result = sse_json(call)["result"]
        assert result["isError"] is False
        assert result["structuredContent"]["result"] == "1024"
        # DNS-rebinding protection: a foreign Host header is refused even with the token.
        rebound = client.post(url, json=INITIALIZE, headers={**auth, "host": "evil.example"})
        assert rebound.status_code >= 400


def test_sdk_client_with_the_token(server: tuple[Running, str]) -> None:
    _, url = server
    results = call_with_sdk(url, TOKEN, [
        ("execute_code", {"code": "data = [3, 1, 2]", "state_mode": "stateful",
                          "session_name": "s"}),
        ("execute_code", {"code": "data.sort(); data", "state_mode": "read_only",
                          "session_name": "s"}),
        ("execute_code", {"code": "data", "state_mode": "stateful", "session_name": "s"}),
        ("execute_code", {"code": "x", "state_mode": "read_only"}),
    ])
    assert results[1]["result"] == "[1, 2, 3]"
    assert results[2]["result"] == "[3, 1, 2]"
    assert results[3]["is_error"] is True and results[3]["error_type"] == "validation"


def test_tenants_cannot_see_each_other(tmp_path: Path) -> None:
    home = tmp_path / "home"
    tokens = tmp_path / "tokens.txt"
    tokens.write_text("# name token\nalice alice-token-0123456789\nbob bob-token-0123456789\n")
    os.chmod(tokens, 0o600)
    env = child_env(home, COORDEX_TOKEN="ignored-token-0123456789")
    with spawn("serve", "--port", "0", "--tokens", str(tokens), env=env) as running:
        url = running.wait_for(READY).group(1)
        running.wait_for(r"--tokens replaces COORDEX_TOKEN")
        alice = call_with_sdk(url, "alice-token-0123456789", [
            ("execute_code", {"code": "secret = 42", "state_mode": "stateful",
                              "session_name": "vault"}),
            ("execute_code", {"code": "plan_value = 'alice'", "state_mode": "stateful"}),
        ])
        assert not alice[0]["is_error"]
        bob = call_with_sdk(url, "bob-token-0123456789", [
            ("list_sessions", {}),
            ("inspect_session", {"session_name": "vault"}),
            ("execute_code", {"code": "secret", "state_mode": "read_only",
                              "session_name": "vault"}),
            ("close_session", {"session_name": "vault"}),
            ("inspect_session", {}),
        ])
        assert all(s.get("session_name") != "vault" for s in bob[0]["sessions"])
        for record in bob[1:4]:
            assert record["is_error"] and record["error_type"] == "not_found"
        assert "plan_value" not in {n["name"] for n in bob[4]["names"]}
        still = call_with_sdk(url, "alice-token-0123456789", [
            ("execute_code", {"code": "secret", "state_mode": "read_only",
                              "session_name": "vault"}),
        ])
        assert still[0]["result"] == "42"
        # Alice's MCP session id is meaningless with Bob's token.
        alice_auth = {**ACCEPT, "authorization": "Bearer alice-token-0123456789"}
        init = httpx.post(url, json=INITIALIZE, headers=alice_auth)
        hijack = httpx.post(url, headers={
            **ACCEPT, "authorization": "Bearer bob-token-0123456789",
            "mcp-session-id": init.headers["mcp-session-id"], "mcp-protocol-version": "2025-06-18",
        }, json={"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                 "params": {"name": "list_sessions", "arguments": {}}})
        assert hijack.status_code in (400, 404), hijack.text
        refused = httpx.post(url, json=INITIALIZE,
                             headers={**ACCEPT, "authorization": "Bearer ignored-token-0123456789"})
        assert refused.status_code == 401
    assert (home / "tenants" / "alice").is_dir() and (home / "tenants" / "bob").is_dir()


def test_a_generated_token_is_printed_once_and_works(tmp_path: Path) -> None:
    env = child_env(tmp_path / "home")
    with spawn("serve", "--port", "0", env=env) as running:
        url = running.wait_for(READY).group(1)
        token = running.wait_for(r"^\s+(\S{20,})\s*$").group(1)
        results = call_with_sdk(url, token, [("list_sessions", {})])
        assert results[0]["max_sessions"] == 20
        assert sum(token in line for line in running.seen) == 1


def test_refuses_a_public_host_without_a_token(tmp_path: Path) -> None:
    done = run_cli("serve", "--host", "0.0.0.0", "--port", "0",
                   env=child_env(tmp_path / "home"))
    assert done.returncode == 2
    assert "non-loopback" in done.stderr and "COORDEX_TOKEN" in done.stderr


def test_a_bad_tokens_file_is_a_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "tokens.txt"
    bad.write_text("alice\n")
    done = run_cli("serve", "--tokens", str(bad), env=child_env(tmp_path / "home"))
    assert done.returncode == 2 and "line 1" in done.stderr
    missing = run_cli("serve", "--tokens", str(tmp_path / "absent"),
                      env=child_env(tmp_path / "home"))
    assert missing.returncode == 2


def test_a_busy_port_is_a_clean_failure(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_cli("serve", "--port", str(port),
                       env=child_env(tmp_path / "home", COORDEX_TOKEN=TOKEN))
    assert done.returncode == 1
    assert "cannot listen" in done.stderr and "Traceback" not in done.stderr
