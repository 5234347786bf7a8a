"""SPEC sections 6 and 8 at SIGTERM: every request in flight gets an answer saying the
server is stopping, the server exits within 5 s, and the processes its own-interpreter
code started end with it (real ``coordex mcp`` and ``coordex serve`` processes)."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import alive

from ._procs import COORDEX, child_env
from .test_signals import INITIALIZE, INITIALIZED, TOKEN, _tool_call, mcp_session, serving_url

pytestmark = pytest.mark.timeout(120)

OWN_POPEN = {"code": "import subprocess\nprint(subprocess.Popen(['sleep', '304']).pid)"}
IN_FLIGHT = [
    {"code": "sleep 120", "language": "bash", "state_mode": "stateful", "session_name": "b"},
    {"code": "sleep 121", "language": "bash"},
    {"code": "import time\ntime.sleep(122)", "state_mode": "stateful", "session_name": "p"},
]


def _assert_stopping(replies: dict[int, dict[str, Any]], numbers: list[int]) -> None:
    assert sorted(replies) == numbers, replies
    for number in numbers:
        result = replies[number]["result"]
        assert result["isError"] is True, result
        error = result["structuredContent"]
        assert "stopping" in error["error"], error


def _wait_exit(process: subprocess.Popen[Any], sent: float) -> float:
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        raise AssertionError("still running 10 s after SIGTERM") from None
    return time.monotonic() - sent


def _gone(pids: set[int], within: float = 2.0) -> set[int]:
    deadline = time.monotonic() + within
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return {p for p in pids if alive(p)}


def test_mcp_answers_every_request_in_flight_at_sigterm(tmp_path: Path) -> None:
    with open(tmp_path / "stderr", "wb") as log:
        process = subprocess.Popen([*COORDEX, "mcp"], env=child_env(tmp_path / "home"),
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
    assert process.stdin is not None and process.stdout is not None
    lines: queue.Queue[bytes] = queue.Queue()
    pids: set[int] = set()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)
        lines.put(b"")

    threading.Thread(target=read, daemon=True).start()

    def send(message: dict[str, Any]) -> None:
        assert process.stdin is not None
        process.stdin.write(json.dumps(message).encode() + b"\n")
        process.stdin.flush()

    try:
        send(INITIALIZE)
        assert json.loads(lines.get(timeout=30))["id"] == 0
        send(INITIALIZED)
        send(_tool_call(1, OWN_POPEN))
        first = json.loads(lines.get(timeout=30))
        pids.add(int(first["result"]["structuredContent"]["stdout"]))
        numbers = list(range(2, 2 + len(IN_FLIGHT)))
        for number, arguments in zip(numbers, IN_FLIGHT, strict=True):
            send(_tool_call(number, arguments))
        time.sleep(1.5)  # running; the client keeps stdin open
        sent = time.monotonic()
        process.send_signal(signal.SIGTERM)
        took = _wait_exit(process, sent)
        replies: dict[int, dict[str, Any]] = {}
        while (line := lines.get(timeout=5)) != b"":
            message = json.loads(line)
            if "id" in message:
                replies[message["id"]] = message
        assert took < 5, took
        _assert_stopping(replies, numbers)
        assert _gone(pids) == set()
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        process.stdin.close()
        process.stdout.close()
        for pid in pids:
            if alive(pid):
                import os

                os.kill(pid, signal.SIGKILL)


def test_serve_answers_every_request_in_flight_at_sigterm(tmp_path: Path) -> None:
    env = child_env(tmp_path / "home", COORDEX_TOKEN=TOKEN)
    with open(tmp_path / "stderr", "wb") as log:
        process = subprocess.Popen([*COORDEX, "serve", "--port", "0"], env=env,
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=log)
    pids: set[int] = set()
    try:
        url = serving_url(tmp_path / "stderr")
        client, headers = mcp_session(url, TOKEN, timeout=60)
        first = _data(client.post(url, json=_tool_call(1, OWN_POPEN), headers=headers))
        pids.add(int(first["result"]["structuredContent"]["stdout"]))
        replies: dict[int, dict[str, Any]] = {}
        numbers = list(range(2, 2 + len(IN_FLIGHT)))

        def post(number: int, arguments: dict[str, Any]) -> None:
            try:
                replies[number] = _data(client.post(url, json=_tool_call(number, arguments),
                                                    headers=headers))
            except httpx.HTTPError as exc:
                replies[number] = {"result": {"isError": None, "transport": repr(exc)}}

        posts = [threading.Thread(target=post, args=(n, a), daemon=True)
                 for n, a in zip(numbers, IN_FLIGHT, strict=True)]
        for thread in posts:
            thread.start()
        time.sleep(1.5)
        sent = time.monotonic()
        process.send_signal(signal.SIGTERM)
        took = _wait_exit(process, sent)
        for thread in posts:
            thread.join(5)
        client.close()
        assert took < 5, took
        _assert_stopping(replies, numbers)
        assert _gone(pids) == set()
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        for pid in pids:
            if alive(pid):
                import os

                os.kill(pid, signal.SIGKILL)


def _data(reply: httpx.Response) -> dict[str, Any]:
    line = next(line for line in reply.text.splitlines() if line.startswith("data:"))
    return dict(json.loads(line[5:]))
