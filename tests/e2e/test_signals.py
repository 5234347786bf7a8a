"""SPEC section 8: ``coordex mcp`` and ``coordex serve`` exit within 5 s of SIGTERM or
SIGINT with every process they started ended, while calls run and the client keeps
its end open (real CLI processes)."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import alive, child_pids

from ._procs import COORDEX, child_env

pytestmark = pytest.mark.timeout(120)
TOKEN = "signal-test-token-0123456789"
CALLS = [  # (arguments, waits for its reply)
    ({"code": "sleep 300 & echo $$ $!", "language": "bash", "state_mode": "stateful"}, True),
    ({"code": "sleep 120", "language": "bash", "state_mode": "stateful",
      "session_name": "busy"}, False),
    ({"code": "sleep 121", "language": "bash"}, False),
    ({"code": "import time\ntime.sleep(122)"}, False),
]


def _tool_call(number: int, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": number, "method": "tools/call",
            "params": {"name": "execute_code", "arguments": arguments}}


INITIALIZE = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "signals", "version": "0"}}}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def _stop_and_check(process: subprocess.Popen[bytes], sig: signal.Signals,
                    started: set[int], within: float = 5.0) -> None:
    assert started, "the server started no processes"
    sent = time.monotonic()
    process.send_signal(sig)
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise AssertionError(f"still running 10 s after {sig.name}") from None
    took = time.monotonic() - sent
    assert took < within, f"exited {took:.1f} s after {sig.name}"
    deadline = time.monotonic() + 2
    while any(alive(pid) for pid in started) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert {pid for pid in started if alive(pid)} == set()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_mcp_exits_promptly_with_everything_ended(tmp_path: Path, sig: signal.Signals) -> None:
    with open(tmp_path / "stderr", "wb") as log:
        process = subprocess.Popen([*COORDEX, "mcp"], env=child_env(tmp_path / "home"),
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
    assert process.stdin is not None and process.stdout is not None
    try:
        def send(message: dict[str, Any]) -> None:
            assert process.stdin is not None
            process.stdin.write(json.dumps(message).encode() + b"\n")
            process.stdin.flush()

        send(INITIALIZE)
        assert json.loads(process.stdout.readline())["id"] == 0
        send(INITIALIZED)
        pids: set[int] = set()
        for number, (arguments, wait) in enumerate(CALLS, 1):
            send(_tool_call(number, arguments))
            if wait:
                reply = json.loads(process.stdout.readline())
                pids |= set(map(int, reply["result"]["structuredContent"]["stdout"].split()))
        time.sleep(1.0)  # the calls are running; the client keeps stdin open
        # SPEC 8 says 5 s; with room under load: it took 3.4-4.0 s (waits on busy
        # sessions' snapshots and on own-interpreter code blocked in C), now ~1.2 s.
        _stop_and_check(process, sig, pids | child_pids(process.pid), within=2.5)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        process.stdin.close()
        process.stdout.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_exits_promptly_with_everything_ended(tmp_path: Path, sig: signal.Signals) -> None:
    env = child_env(tmp_path / "home", COORDEX_TOKEN=TOKEN)
    with open(tmp_path / "stderr", "wb") as log:
        process = subprocess.Popen([*COORDEX, "serve", "--port", "0"], env=env,
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=log)
    try:
        url = serving_url(tmp_path / "stderr")
        client, headers = mcp_session(url, TOKEN, timeout=300)
        pids: set[int] = set()
        for number, (arguments, wait) in enumerate(CALLS, 1):
            if wait:
                reply = client.post(url, json=_tool_call(number, arguments), headers=headers)
                data = next(line for line in reply.text.splitlines() if line.startswith("data:"))
                content = json.loads(data[5:])["result"]["structuredContent"]
                pids |= set(map(int, content["stdout"].split()))
            else:  # left waiting: the client keeps these requests open
                threading.Thread(target=_post_quietly, daemon=True,
                                 args=(client, url, _tool_call(number, arguments),
                                       headers)).start()
        time.sleep(1.5)
        _stop_and_check(process, sig, pids | child_pids(process.pid))
        client.close()
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


def _post_quietly(client: httpx.Client, url: str, body: dict[str, Any],
                  headers: dict[str, str]) -> None:
    try:
        client.post(url, json=body, headers=headers)
    except httpx.HTTPError:
        pass  # the server went away under the request: expected


def serving_url(log: Path, within: float = 30) -> str:
    """The URL a ``coordex serve`` writing its stderr to ``log`` says it serves on."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            if "serving MCP on " in line:
                return line.split("serving MCP on ")[1].split()[0]
        time.sleep(0.05)
    raise AssertionError(log.read_text())


def mcp_session(url: str, token: str, *, timeout: float) -> tuple[httpx.Client, dict[str, str]]:
    """An initialized MCP session over raw HTTP: the client and the headers to send."""
    headers = {"accept": "application/json, text/event-stream",
               "authorization": f"Bearer {token}"}
    client = httpx.Client(timeout=timeout)
    init = client.post(url, json=INITIALIZE, headers=headers)
    headers |= {"mcp-session-id": init.headers["mcp-session-id"],
                "mcp-protocol-version": "2025-06-18"}
    client.post(url, json=INITIALIZED, headers=headers)
    return client, headers
