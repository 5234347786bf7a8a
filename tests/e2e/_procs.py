"""Helpers for end-to-end tests: start ``python -m coordex ...`` and always reap it."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

COORDEX = [sys.executable, "-m", "coordex"]


def run_stdio_session(home: Path, body: Callable[[Any], Awaitable[None]],
                      limit: float = 90) -> None:
    """Start ``coordex mcp`` over stdio with the SDK's client, initialize, run ``body`` with
    the client session within ``limit`` seconds; stdio_client ends (and reaps) the server
    when the block exits."""
    import anyio
    from mcp import ClientSession, StdioServerParameters, stdio_client

    params = StdioServerParameters(command=sys.executable, args=["-m", "coordex", "mcp"],
                                   env=child_env(home))

    async def main() -> None:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            with anyio.fail_after(limit):
                await body(session)

    anyio.run(main)


def child_env(home: Path, **extra: str | None) -> dict[str, str]:
    """The test's environment with a private COORDEX_HOME; ``None`` removes a variable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COORDEX_")}
    env["COORDEX_HOME"] = str(home)
    env["PYTHONUNBUFFERED"] = "1"
    for key, value in extra.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def run_cli(*args: str, env: Mapping[str, str],
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*COORDEX, *args], env=dict(env), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


@dataclass
class Running:
    process: subprocess.Popen[str]
    lines: queue.Queue[str] = field(default_factory=queue.Queue)
    seen: list[str] = field(default_factory=list)

    def wait_for(self, pattern: str, timeout: float = 30) -> re.Match[str]:
        """The first stderr line matching ``pattern`` (lines already seen included)."""
        regex = re.compile(pattern)
        for line in self.seen:
            if (found := regex.search(line)) is not None:
                return found
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.1)
            except queue.Empty:
                if self.process.poll() is not None and self.lines.empty():
                    break
                continue
            self.seen.append(line)
            if (found := regex.search(line)) is not None:
                return found
        raise AssertionError(f"no stderr line matched {pattern!r}; stderr so far:\n"
                             + "".join(self.seen))


def _pump(stream: object, lines: queue.Queue[str]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        lines.put(line)


def stop(process: subprocess.Popen[str]) -> None:
    """Interrupt, then TERM, then KILL; always reaped."""
    for sig, grace in ((signal.SIGINT, 10.0), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        if process.poll() is not None:
            break
        process.send_signal(sig)
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue
    for stream in (process.stdout, process.stderr, process.stdin):
        if stream is not None:
            stream.close()


@contextmanager
def spawn(*args: str, env: Mapping[str, str],
          wrap: Callable[[list[str]], list[str]] = list,
          cwd: str | os.PathLike[str] | None = None) -> Iterator[Running]:
    """``coordex ARGS`` running, its stderr lines in ``Running.lines``; ``wrap`` turns the
    argv into the command actually run (as another user, in a namespace); ``cwd`` is its
    working folder (the test's by default)."""
    process = subprocess.Popen(wrap([*COORDEX, *args]), env=dict(env), stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               cwd=cwd)
    running = Running(process)
    reader = threading.Thread(target=_pump, args=(process.stderr, running.lines), daemon=True)
    reader.start()
    try:
        yield running
    finally:
        stop(process)
        reader.join(timeout=5)
