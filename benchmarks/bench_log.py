"""The call log's cost per call: the same calls side by side, ``log=True`` against
``log=False``, in one run.

Blocks of calls alternate between the two executors so drift (CPU frequency, other
load) hits both alike. The per-call p50 is the figure the log must keep at or below
30 us. Each call's row is in the log's journal before the call returns (so a killed
process loses no returned call) and in the SQLite file a few milliseconds later, moved
there by the log's own thread; the mean per call of whole blocks also carries that
thread's work (the inserts, and the checkpoints every few hundred rows) where it takes
the CPU the calls need. The p50 moves by several microseconds from run to run with the
CPUs the threads wake on: run it a few times (``taskset -c 1`` holds it steady, and
puts the log's thread on the calls' CPU).

Run: python benchmarks/bench_log.py [--calls N] [--rounds R]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _util import fmt, median_seconds, table

from coordex import Executor
from coordex.core.coordinates import check_coordinate
from coordex.log.calls import record_call

GOAL_US = 30.0


def block(ex: Executor, code: str, mode: str, calls: int) -> tuple[list[float], float]:
    samples = []
    started = time.perf_counter()
    for _ in range(calls):
        t = time.perf_counter()
        ex.execute_code(code, state_mode=mode)
        samples.append(time.perf_counter() - t)
    return samples, (time.perf_counter() - started) / calls


def compare(on: Executor, off: Executor, code: str, mode: str, calls: int,
            rounds: int) -> tuple[float, float, float, float]:
    for ex in (on, off):
        block(ex, code, mode, 200)  # warm up
    samples: dict[bool, list[float]] = {True: [], False: []}
    means: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(rounds):
        for logged, ex in ((True, on), (False, off)):
            got, mean = block(ex, code, mode, calls)
            samples[logged] += got
            means[logged].append(mean)
    return (statistics.median(samples[True]), statistics.median(samples[False]),
            statistics.median(means[True]), statistics.median(means[False]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000, help="calls per block")
    parser.add_argument("--rounds", type=int, default=5, help="blocks per executor")
    args = parser.parse_args()
    rows = [("call", "p50 log=True", "p50 log=False", "p50 cost", "mean cost")]
    worst = 0.0
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b, \
            Executor(root=a, log=True) as on, Executor(root=b, log=False) as off:
        for label, code, mode in (("stateful 'x = 1'", "x = 1", "stateful"),
                                  ("stateless 'x = 1'", "x = 1", "stateless")):
            p_on, p_off, m_on, m_off = compare(on, off, code, mode, args.calls, args.rounds)
            worst = max(worst, p_on - p_off)
            rows.append((label, fmt(p_on), fmt(p_off), fmt(p_on - p_off), fmt(m_on - m_off)))
        rows_logged = on._call_log.query("SELECT COUNT(*) AS n FROM calls")[0]["n"]
        # The hook alone, on a result as a stateful call returns it.
        result = on.execute_code("x = 1", state_mode="stateful")
        coordinate = check_coordinate("python", "stateful", None, None, None)
        hook = median_seconds(lambda: record_call(on._call_log, result, "x = 1", coordinate),
                              20_000)
        rows.append(("the hook alone", "", "", fmt(hook), ""))
    print(table(rows))
    print(f"\nrows logged: {rows_logged}; goal: p50 cost <= {GOAL_US:.0f} us "
          f"({'met' if worst * 1e6 <= GOAL_US else 'NOT met'})")


if __name__ == "__main__":
    main()
