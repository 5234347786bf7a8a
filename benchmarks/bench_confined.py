"""Confined tenants against today's in-process tenant, side by side in one run.

1. A trivial ``execute_code`` over HTTP (raw httpx, one MCP session, p50 of N calls):
   ``coordex serve`` with COORDEX_TOKEN (the tenant runs in the server) against
   ``coordex serve --tokens FILE`` (the tenant runs in a confined host). Goal: <= 1 ms added.
2. A host's start to its first result (``ConfinedExecutor(...)`` then ``1 + 1``), against
   ``Executor(...)`` then ``1 + 1`` in this process. Goal: <= 300 ms.
3. Idle memory per tenant: the PSS of every process of one confined host (keeper, init,
   host), against the growth of this process's PSS for one more in-process Executor.
   Goal: <= 40 MiB.

Run: python benchmarks/bench_confined.py [--calls 300] [--starts 5]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import httpx
from _util import fmt, table

from coordex import ConfinedExecutor, Executor

TOKEN = "bench-token-0123456789abcdef"
ACCEPT = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


def _serve(home: Path, *extra: str) -> tuple[subprocess.Popen[str], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COORDEX_")}
    env.update(COORDEX_HOME=str(home), COORDEX_TOKEN=TOKEN, PYTHONUNBUFFERED="1")
    process = subprocess.Popen([sys.executable, "-m", "coordex", "serve", "--port", "0", *extra],
                               env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    for line in process.stderr:
        found = re.search(r"serving MCP on (\S+)", line)
        if found:
            return process, found.group(1)
    raise RuntimeError("the server did not start")


def _stop(process: subprocess.Popen[str]) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _data(response: httpx.Response) -> dict[str, Any]:
    if response.headers.get("content-type", "").startswith("application/json"):
        return dict(response.json())
    line = next(x for x in response.text.splitlines() if x.startswith("data:"))
    return dict(json.loads(line[5:]))


def http_p50(url: str, calls: int) -> float:
    auth = {**ACCEPT, "authorization": f"Bearer {TOKEN}"}
    with httpx.Client(timeout=60) as client:
        init = client.post(url, headers=auth, json={
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "bench", "version": "0"}}})
        session = {**auth, "mcp-session-id": init.headers["mcp-session-id"],
                   "mcp-protocol-version": "2025-06-18"}
        client.post(url, headers=session, json={"jsonrpc": "2.0",
                                                "method": "notifications/initialized"})
        samples = []
        for i in range(calls + 10):
            started = time.perf_counter()
            reply = _data(client.post(url, headers=session, json={
                "jsonrpc": "2.0", "id": i + 1, "method": "tools/call",
                "params": {"name": "execute_code", "arguments": {"code": "1 + 1"}}}))
            elapsed = time.perf_counter() - started
            assert reply["result"]["structuredContent"]["result"] == "2", reply
            if i >= 10:
                samples.append(elapsed)
    return statistics.median(samples)


def pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Pss:"))
    except (OSError, StopIteration):
        return 0


def tree(pid: int) -> list[int]:
    found, frontier = [pid], [pid]
    while frontier:
        nxt = []
        for parent in frontier:
            try:
                with open(f"/proc/{parent}/task/{parent}/children") as f:
                    nxt += [int(p) for p in f.read().split()]
            except OSError:
                pass
        found += nxt
        frontier = nxt
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--starts", type=int, default=5)
    args = parser.parse_args()
    rows = [("case", "in-process", "confined", "added", "goal")]
    with tempfile.TemporaryDirectory() as base:
        tokens = Path(base) / "tokens"
        tokens.write_text(f"bench {TOKEN}\n")
        tokens.chmod(0o600)
        own, own_url = _serve(Path(base) / "own")
        jailed, jailed_url = _serve(Path(base) / "jailed", "--tokens", str(tokens))
        try:
            http_p50(own_url, 20)
            http_p50(jailed_url, 20)  # starts the host
            a, b = http_p50(own_url, args.calls), http_p50(jailed_url, args.calls)
        finally:
            _stop(own)
            _stop(jailed)
        rows.append(("execute_code '1 + 1' over HTTP (p50)", fmt(a), fmt(b), fmt(b - a), "<= 1 ms"))

        in_process, confined, level = [], [], ""
        for i in range(args.starts):
            started = time.perf_counter()
            with Executor(root=Path(base) / f"e{i}") as ex:
                assert ex.execute_code("1 + 1")["result"] == "2"
                in_process.append(time.perf_counter() - started)
            started = time.perf_counter()
            with ConfinedExecutor(Path(base) / f"c{i}") as cx:
                assert cx.execute_code("1 + 1")["result"] == "2"
                confined.append(time.perf_counter() - started)
                level = cx.confinement["level"]
        a, b = statistics.median(in_process), statistics.median(confined)
        rows.append(("start to first result (median)", fmt(a), fmt(b), fmt(b - a), "<= 300 ms"))

        before = pss_kib(os.getpid())
        extra = Executor(root=Path(base) / "idle-own")
        extra.execute_code("1 + 1", state_mode="stateful")
        own_kib = max(0, pss_kib(os.getpid()) - before)
        with ConfinedExecutor(Path(base) / "idle") as cx:
            cx.execute_code("1 + 1", state_mode="stateful")
            time.sleep(0.5)
            assert cx.pid is not None
            pids = tree(cx.pid)
            jail_kib = sum(pss_kib(p) for p in pids)
        extra.close()
        rows.append((f"idle memory per tenant (PSS, {len(pids)} processes)",
                     f"{own_kib / 1024:.1f} MiB", f"{jail_kib / 1024:.1f} MiB",
                     f"{(jail_kib - own_kib) / 1024:.1f} MiB", "<= 40 MiB"))
    print(f"confinement: {level}")
    print(table(rows))


if __name__ == "__main__":
    main()
