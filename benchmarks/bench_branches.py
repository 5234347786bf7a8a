"""Branches and checkpoints (SPEC 15): fork, checkpoint and restore of an environment
session holding N MiB, beside what the sandbox peers publish.

For each size, a session of a dedicated environment's worker holds a bytearray of that
many MiB (every page written). Then:

- **fork**: ``fork_session`` wall time, and the proportional set size (PSS, from
  ``/proc/PID/smaps_rollup``) of the source's worker and of the fork's, before the fork,
  just after it, and after the fork has written every page of its copy;
- **checkpoint**: ``checkpoint_session`` wall time (a fork of the worker pickles the state
  to disk) and the p50 of small calls to the session while it is written, against their
  p50 before;
- **restore**: ``restore_session`` wall time (a fresh worker loads the checkpoint).

Peers' published figures are printed beside them: E2B fork / pause ~4 s per GiB (whole
VM), forkd 56 ms (live branch of a microVM), DeltaBox 1.86 ms (rollback).

Run: python benchmarks/bench_branches.py [--sizes 100,1024]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _util import fmt, table

from coordex import Executor

PEERS = [("E2B fork / pause (whole VM)", "~4 s per GiB"),
         ("forkd live branch (microVM)", "56 ms"),
         ("DeltaBox rollback", "1.86 ms")]
FORK_GOAL_S = 0.100  # 1 GiB (SPEC 15)
CALL_GOAL_MS = 5.0  # extra p50 while a checkpoint is written


def pss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def ok(result: dict) -> dict:
    if "error_type" in result:
        raise SystemExit(f"failed: {result}")
    return result


def pid_of(ex: Executor, venv_id: int, name: str) -> int:
    out = ok(ex.execute_code("import os; print(os.getpid())", state_mode="stateful",
                             session_name=name, venv_id=venv_id))["stdout"]
    return int(out)


def p50_calls(ex: Executor, venv_id: int, name: str, seconds: float | None = None,
              stop: threading.Event | None = None, count: int = 40) -> float:
    samples = []
    deadline = time.monotonic() + (seconds or 1e9)
    while len(samples) < count or (stop is not None and not stop.is_set()):
        if (stop is not None and stop.is_set()) or time.monotonic() > deadline:
            break
        started = time.perf_counter()
        ok(ex.execute_code("n += 1", state_mode="stateful", session_name=name,
                           venv_id=venv_id))
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) if samples else float("nan")


def measure(ex: Executor, venv_id: int, mib: int) -> dict[str, float]:
    src, trial = f"src{mib}", f"trial{mib}"
    ok(ex.execute_code(
        f"n = 0\nblob = bytearray({mib} << 20)\nfor i in range(0, len(blob), 4096): blob[i] = 1",
        state_mode="stateful", session_name=src, venv_id=venv_id, timeout=300))
    src_pid = pid_of(ex, venv_id, src)
    before = pss_mib(src_pid)
    started = time.perf_counter()
    forked = ok(ex.fork_session(session_name=src, venv_id=venv_id, new_name=trial))
    fork_s = time.perf_counter() - started
    fork_pid = pid_of(ex, venv_id, trial)
    after = pss_mib(src_pid) + pss_mib(fork_pid)
    ok(ex.execute_code("for i in range(0, len(blob), 4096): blob[i] = 2",
                       state_mode="stateful", session_name=trial, venv_id=venv_id,
                       timeout=300))
    written = pss_mib(src_pid) + pss_mib(fork_pid)
    ok(ex.close_session(session_name=trial, venv_id=venv_id))

    quiet = p50_calls(ex, venv_id, src)
    stop = threading.Event()
    during: list[float] = []
    caller = threading.Thread(target=lambda: during.append(
        p50_calls(ex, venv_id, src, stop=stop, count=0)))
    caller.start()
    time.sleep(0.05)
    started = time.perf_counter()
    checkpoint = ok(ex.checkpoint_session(session_name=src, venv_id=venv_id))
    checkpoint_s = time.perf_counter() - started
    stop.set()
    caller.join()
    started = time.perf_counter()
    ok(ex.restore_session(session_name=src, venv_id=venv_id,
                          checkpoint=checkpoint["checkpoint"]))
    restore_s = time.perf_counter() - started
    ok(ex.close_session(session_name=src, venv_id=venv_id))
    return {"fork_s": fork_s, "fork_ms_reported": forked["ms"], "pss_before": before,
            "pss_after_fork": after, "pss_after_write": written, "checkpoint_s": checkpoint_s,
            "bytes": checkpoint["bytes"], "p50_quiet": quiet, "p50_during": during[0],
            "restore_s": restore_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,1024", help="MiB, comma separated")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    with tempfile.TemporaryDirectory() as root, Executor(root=root, timeout=300) as ex:
        venv_id = ok(ex.environments.create("# no requirements\n", name="bare"))["venv_id"]
        ok(ex.environments.build(venv_id))
        rows = [("MiB", "fork", "PSS before", "after fork", "after fork writes",
                 "checkpoint", "call p50 quiet", "call p50 while written", "restore")]
        for mib in sizes:
            m = measure(ex, venv_id, mib)
            rows.append((str(mib), fmt(m["fork_s"]), f"{m['pss_before']:.0f} MiB",
                         f"{m['pss_after_fork']:.0f} MiB", f"{m['pss_after_write']:.0f} MiB",
                         f"{fmt(m['checkpoint_s'])} ({m['bytes'] / 2**20:.0f} MiB)",
                         fmt(m["p50_quiet"]), fmt(m["p50_during"]), fmt(m["restore_s"])))
    print(table(rows))
    print()
    print("PSS: the source's worker plus the fork's (copy-on-write: no more memory until")
    print("either side writes). Goals (SPEC 15): fork of 1 GiB <= "
          f"{FORK_GOAL_S * 1000:.0f} ms; calls <= {CALL_GOAL_MS:.0f} ms slower at p50 while "
          "a checkpoint is written.")
    print()
    print(table([("peer (published)", "figure"), *PEERS]))


if __name__ == "__main__":
    main()
