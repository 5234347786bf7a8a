"""``coordex mcp`` answers ``initialize`` before the MCP SDK is loaded (SPEC 8).

Clients start the server often and wait for ``initialize``; importing the SDK takes
about half a second, so :mod:`coordex.mcp_hello` answers the handshake while the SDK
loads, with exactly the answer the SDK gives, and hands the request to the SDK after.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ._procs import child_env

pytestmark = pytest.mark.timeout(120)


def initialize(version: str, request_id: int | str = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": "initialize",
            "params": {"protocolVersion": version, "capabilities": {},
                       "clientInfo": {"name": "test", "version": "1"}}}


SDK_ONLY = ("import anyio, coordex\n"
            "from coordex.mcp_server import claim_stdio, serve_stdio\n"
            "wire = claim_stdio()\n"
            "with coordex.Executor() as ex:\n"
            "    anyio.run(serve_stdio, ex, wire)\n")


def exchange(home: Path, messages: list[dict[str, Any]], answers: int, *,
             sdk_only: bool = False) -> list[tuple[float, dict[str, Any]]]:
    """Send ``messages`` at once; the first ``answers`` replies, each with its delay.
    ``sdk_only``: a server that leaves the handshake to the SDK from the start."""
    command = ["-c", SDK_ONLY] if sdk_only else ["-m", "coordex", "mcp"]
    process = subprocess.Popen([sys.executable, *command], env=child_env(home),
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL)
    assert process.stdin is not None and process.stdout is not None
    started = time.perf_counter()
    try:
        process.stdin.write("".join(json.dumps(m) + "\n" for m in messages).encode())
        process.stdin.flush()
        replies = []
        for _ in range(answers):
            line = process.stdout.readline()
            replies.append((time.perf_counter() - started, json.loads(line)))
        return replies
    finally:
        process.stdin.close()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        process.stdout.close()


@pytest.mark.parametrize("version", ["2024-11-05", "2025-06-18", "2025-11-25", "1999-01-01"])
def test_the_early_answer_is_the_sdks_answer_and_the_session_goes_on(tmp_path: Path,
                                                                    version: str) -> None:
    from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION

    from coordex.mcp_hello import HANDSHAKE_VERSIONS, LATEST_HANDSHAKE, initialize_result

    assert (HANDSHAKE_VERSIONS, LATEST_HANDSHAKE) == (HANDSHAKE_PROTOCOL_VERSIONS,
                                                      LATEST_HANDSHAKE_VERSION)
    session = [initialize(version, "init-7"),
               {"jsonrpc": "2.0", "method": "notifications/initialized"},
               {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}]
    [(_, sdk_answer), _] = exchange(tmp_path / "sdk", session, answers=2, sdk_only=True)
    [(_, answer), (_, listed)] = exchange(tmp_path / "early", session, answers=2)
    assert answer == sdk_answer
    assert answer["result"] == initialize_result(initialize(version)["params"])
    # The SDK took the handshake over: the next request is served, the answer not repeated.
    assert listed["id"] == 2 and "execute_code" in json.dumps(listed["result"])


def test_initialize_is_answered_long_before_the_sdk_is_ready(tmp_path: Path) -> None:
    [(answered, hello), (listed, tools)] = exchange(tmp_path, [
        initialize("2025-06-18"), {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}], answers=2)
    assert hello["id"] == 1 and tools["id"] == 2
    assert answered < 0.6 * listed, (answered, listed)


def test_a_malformed_initialize_is_left_to_the_sdk(tmp_path: Path) -> None:
    [(_, answer)] = exchange(tmp_path, [{"jsonrpc": "2.0", "id": 1, "method": "initialize",
                                         "params": {"protocolVersion": 5}}], answers=1)
    assert answer["id"] == 1 and "error" in answer


def discover(version: str = "2026-07-28", request_id: int | str = 0) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": "server/discover", "params": {
        "_meta": {"io.modelcontextprotocol/protocolVersion": version,
                  "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "1"},
                  "io.modelcontextprotocol/clientCapabilities": {}}}}


def test_the_early_discover_answer_is_the_sdks_and_the_session_goes_on(tmp_path: Path) -> None:
    from mcp_types import CLIENT_CAPABILITIES_META_KEY, PROTOCOL_VERSION_META_KEY, SERVER_INFO_META_KEY
    from mcp_types.version import MODERN_PROTOCOL_VERSIONS

    from coordex import mcp_hello

    assert mcp_hello.MODERN_VERSIONS == MODERN_PROTOCOL_VERSIONS
    assert (mcp_hello.PROTOCOL_VERSION_KEY, mcp_hello.CLIENT_CAPABILITIES_KEY,
            mcp_hello.SERVER_INFO_KEY) == (PROTOCOL_VERSION_META_KEY,
                                           CLIENT_CAPABILITIES_META_KEY, SERVER_INFO_META_KEY)
    listing = discover(request_id=2)
    listing["method"] = "tools/list"
    session = [discover(request_id="probe"), listing]
    [(_, sdk_answer), _] = exchange(tmp_path / "sdk", session, answers=2, sdk_only=True)
    [(_, answer), (_, listed)] = exchange(tmp_path / "early", session, answers=2)
    assert answer == sdk_answer
    assert answer["result"] == mcp_hello.discover_result(discover()["params"])
    assert listed["id"] == 2 and "execute_code" in json.dumps(listed["result"])


def test_discover_is_answered_long_before_the_sdk_is_ready(tmp_path: Path) -> None:
    listing = discover(request_id=2)
    listing["method"] = "tools/list"
    [(answered, hello), (listed, tools)] = exchange(tmp_path, [discover(), listing], answers=2)
    assert hello["id"] == 0 and tools["id"] == 2
    assert answered < 0.6 * listed, (answered, listed)


def test_a_discover_at_a_version_not_served_is_left_to_the_sdk(tmp_path: Path) -> None:
    [(_, answer)] = exchange(tmp_path, [discover("2099-01-01")], answers=1)
    assert answer["id"] == 0 and answer["error"]["code"] == -32022


# Widens a race of Python 3.11's sysconfig to a certainty: a second thread that fills the
# cache of build settings is slow, and the main thread reads the cache while it is half
# full (as it could on a loaded machine). Loaded by ``site`` from PYTHONPATH.
SLOW_SYSCONFIG = """\
import sysconfig, threading, time

if sysconfig._CONFIG_VARS is None and hasattr(sysconfig, "_init_posix"):
    _fill, _get = sysconfig._init_posix, sysconfig.get_config_vars

    def _slow_fill(found):
        if threading.current_thread() is not threading.main_thread():
            time.sleep(1.5)
        _fill(found)

    def _get_after_another_thread(*args):
        main = threading.current_thread() is threading.main_thread()
        deadline = time.monotonic() + 10
        while (main and sysconfig._CONFIG_VARS is None and threading.active_count() > 1
               and time.monotonic() < deadline):
            time.sleep(0.01)
        return _get(*args)

    sysconfig._init_posix = _slow_fill
    sysconfig.get_config_vars = _get_after_another_thread
"""


def _confined_mcp(home: Path, extra: list[str], env: dict[str, str] | None = None,
                  ) -> tuple[int | None, str, list[dict[str, Any]]]:
    """Start ``coordex mcp --confine``, make one call; (exit code, stderr, replies)."""
    messages = [initialize("2025-06-18"),
                {"jsonrpc": "2.0", "method": "notifications/initialized"},
                {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                 "params": {"name": "execute_code", "arguments": {"code": "6 * 7"}}}]
    process = subprocess.Popen(
        [sys.executable, "-m", "coordex", "mcp", "--confine", str(home.parent / "work"),
         "--no-network", *extra], env=env or child_env(home),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write("".join(json.dumps(m) + "\n" for m in messages).encode())
    process.stdin.flush()
    replies = []
    for line in process.stdout:
        replies.append(json.loads(line))
        if replies[-1].get("id") == 2:
            break
    process.stdin.close()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    assert process.stderr is not None
    err = process.stderr.read()
    process.stdout.close()
    process.stderr.close()
    return process.returncode, err.decode(errors="replace"), replies


def _needs_a_jail() -> None:
    from coordex.hosting import best_level

    if best_level() == "none":
        pytest.skip("no confinement on this machine")


@pytest.mark.slow
def test_a_confined_server_starts_while_the_sdk_loads(tmp_path: Path) -> None:
    """``coordex mcp --confine`` failed at start now and then in the full suite ("cannot
    start the executor: TypeError: can only concatenate str (not "NoneType") to str"):
    the SDK loading on its thread filled sysconfig's cache while the executor read it."""
    _needs_a_jail()
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLOW_SYSCONFIG)
    env = child_env(tmp_path / "home", COORDEX_TOKEN="server-env-token-0123456789",
                    PYTHONPATH=str(site))
    _, err, replies = _confined_mcp(tmp_path / "home", [], env)
    assert "cannot start" not in err, err
    assert replies[-1]["result"]["structuredContent"]["result"] == "42", replies


def test_a_server_that_cannot_start_says_why_with_the_frames(tmp_path: Path) -> None:
    code, err, replies = _confined_mcp(tmp_path / "home",
                                       ["--readable", str(tmp_path / "no-such-folder")])
    assert code == 1 and not [r for r in replies if r.get("id") == 2]
    assert "cannot start the executor: ValueError: readable: no such file" in err, err
    assert "Traceback (most recent call last):" in err and "client.py\", line" in err, err
