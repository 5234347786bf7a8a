"""Worker processes against their peers, side by side, with ratios.

- stateful call in a worker vs the same cell in an ipykernel driven by jupyter_client;
- stateless call (fork of a template) vs starting a fresh interpreter of the same venv;
- read_only on a session holding 200,000 small records plus a 100 MB (and, with
  --big, 1 GB) bytearray vs ``copy.deepcopy`` of the same state;
- idle memory (RSS and PSS from /proc/<pid>/smaps_rollup) of a worker vs an ipykernel.

Run: python benchmarks/bench_workers.py [--big] [--python PATH]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _util import Owned, fmt, median_seconds, paired_medians, record, table

from coordex.backends.base import RunRequest
from coordex.backends.env.workers import WorkerSession, WorkerTemplate

RECORDS = ("records = [{'id': i, 'account': 'acct-%d' % (i % 997), 'amount': i * 0.01}"
           " for i in range(200_000)]\nblob = bytearray(SIZE)")
CELL = "x = 1\nx + 1"


def req(code: str, timeout: float = 600.0) -> RunRequest:
    return RunRequest(code=code, timeout=timeout)


def memory_kib(pid: int) -> tuple[int, int]:
    """(RSS, PSS) in KiB of one process."""
    values = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if parts[0] in ("Rss:", "Pss:"):
                values[parts[0]] = int(parts[1])
    return values["Rss:"], values["Pss:"]


def ratio(peer: float, ours: float) -> str:
    return f"{peer / ours:.0f}x faster" if ours > 0 else "-"


def bench_stateful_vs_ipykernel(python: str, rows: list[tuple[str, ...]],
                                memory: list[tuple[str, ...]]) -> None:
    from jupyter_client.manager import KernelManager

    session = Owned(WorkerSession(python), "worker", retries=True)
    km = KernelManager(kernel_name="python3")
    km.kernel_cmd = [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        # In alternating rounds (_util.paired_medians): the machine's speed changing
        # during the run falls on both alike.
        ours, peer = paired_medians(
            lambda: session.run(req(CELL)),
            lambda: kc.execute_interactive(CELL, timeout=60, output_hook=lambda m: None),
            2000, theirs_runs=300)
        rows.append(("stateful call (x = 1; x + 1)", fmt(ours), "ipykernel + jupyter_client",
                     fmt(peer), ratio(peer, ours)))
        record("worker.stateful.vs_ipykernel", peer / ours)
        time.sleep(1.0)  # let both settle before measuring idle memory
        kernel_pid = km.provisioner.pid if km.provisioner else None  # type: ignore[attr-defined]
        w_rss, w_pss = memory_kib(session.target.pid)
        memory.append(("idle worker", f"{w_rss / 1024:.1f} MiB", f"{w_pss / 1024:.1f} MiB"))
        if kernel_pid:
            k_rss, k_pss = memory_kib(kernel_pid)
            memory.append(("idle ipykernel", f"{k_rss / 1024:.1f} MiB",
                           f"{k_pss / 1024:.1f} MiB"))
            memory.append(("ratio", f"{k_rss / w_rss:.1f}x less", f"{k_pss / w_pss:.1f}x less"))
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        session.close()


def median_spaced(fn: Callable[[], object], runs: int, pause: float) -> float:
    """Median time of ``fn`` when calls are ``pause`` seconds apart (pause not timed)."""
    fn()
    samples = []
    for _ in range(runs):
        time.sleep(pause)
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def bench_stateless(python: str, rows: list[tuple[str, ...]]) -> None:
    template = Owned(WorkerTemplate(python), "worker", retries=True)
    try:
        # An agent's calls are seconds apart, so the template's standby child is ready;
        # back-to-back calls also pay the next fork and its page faults.
        spaced = median_spaced(lambda: template.run_stateless(req(CELL)), 300, 0.02)
        packed = median_seconds(lambda: template.run_stateless(req(CELL)), 300, warmup=10)
        peer = median_seconds(lambda: subprocess.run([python, "-c", CELL], check=True),
                              50, warmup=3)
        rows.append(("stateless call, 20 ms apart", fmt(spaced),
                     "fresh `python -c` of the venv", fmt(peer), ratio(peer, spaced)))
        rows.append(("stateless call, back-to-back", fmt(packed),
                     "fresh `python -c` of the venv", fmt(peer), ratio(peer, packed)))
    finally:
        template.close()


def bench_read_only(python: str, size: int, label: str, rows: list[tuple[str, ...]]) -> None:
    session = Owned(WorkerSession(python), "worker", retries=True)
    try:
        session.run(req(RECORDS.replace("SIZE", str(size))))
        ours = median_seconds(lambda: session.run_read_only(req("len(records), len(blob)")),
                              30, warmup=3)
    finally:
        session.close()
    state: dict[str, object] = {}
    exec(RECORDS.replace("SIZE", str(size)), state)
    del state["__builtins__"]
    peer = median_seconds(lambda: copy.deepcopy(state), 3, warmup=1)
    state.clear()
    rows.append((f"read_only, {label}", fmt(ours), "copy.deepcopy of the state", fmt(peer),
                 ratio(peer, ours)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--big", action="store_true", help="also measure a 1 GB bytearray")
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter for workers and kernel (needs ipykernel)")
    args = parser.parse_args()
    rows: list[tuple[str, ...]] = [("case", "coordex", "peer", "peer time", "ratio")]
    memory: list[tuple[str, ...]] = [("process", "RSS", "PSS")]
    bench_stateful_vs_ipykernel(args.python, rows, memory)
    bench_stateless(args.python, rows)
    bench_read_only(args.python, 100 * 2**20, "200k records + 100 MB", rows)
    if args.big:
        bench_read_only(args.python, 2**30, "200k records + 1 GB", rows)
    print(table(rows))
    print()
    print(table(memory))


if __name__ == "__main__":
    main()
