"""How soon ``coordex mcp`` answers ``initialize`` (SPEC 8: within 500 ms on a warm machine).

A real MCP client (the official SDK's ``stdio_client``) starts the server as a desktop
client does, sends ``initialize`` and waits for the answer; the time is from just
before the process is spawned to the answer. The client's own imports are done before
the clock starts. Median of 10 starts, after 2 to warm the file cache.

    python benchmarks/bench_mcp_startup.py [--runs 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio
from _util import fmt, table
from mcp import ClientSession, StdioServerParameters, stdio_client


async def one_start(home: Path) -> tuple[float, float]:
    """Seconds to the ``initialize`` answer, and to the first ``tools/list`` answer."""
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "coordex", "mcp", "--home", str(home)])
    started = time.perf_counter()
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        initialized = time.perf_counter() - started
        await session.list_tools()
        listed = time.perf_counter() - started
    return initialized, listed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        home = Path(folder)
        for _ in range(2):
            anyio.run(one_start, home)
        samples = [anyio.run(one_start, home) for _ in range(args.runs)]
    init = [s[0] for s in samples]
    listed = [s[1] for s in samples]
    print(table([
        ("coordex mcp over stdio", "median", "min", "max"),
        ("initialize answered", fmt(statistics.median(init)), fmt(min(init)), fmt(max(init))),
        ("tools/list answered", fmt(statistics.median(listed)), fmt(min(listed)),
         fmt(max(listed))),
    ]))


if __name__ == "__main__":
    main()
