"""Sessions on a local Ray cluster against the same sessions on this machine, in one run.

- a trivial stateful call (Python in an environment, and bash): p50 on the cluster and
  locally, and what the cluster adds (goal: at most 2 ms);
- read-only on a session holding a 100 MB and a 1 GB bytearray, on a node and locally
  (goal: flat in the state's size, within 2x of local);
- idle memory per session on a node (PSS of its worker) and of the node's coordex
  actor, which all sessions there share.

The cluster is a head without CPUs and one node of one CPU (``ray.cluster_utils``); it
is started here and shut down at the end.

Run: python benchmarks/bench_cluster.py [--runs N] [--big-mib 1024]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))

from _util import fmt, table
from tests.fakes.wheels import ledgerlib_wheel, requirement

from coordex import Executor


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timed(call: Callable[[], dict[str, Any]], runs: int, warmup: int = 20) -> list[float]:
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        out = call()
        samples.append(time.perf_counter() - started)
        assert "error" not in out, out
    return samples


def pss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1])
    return 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--big-mib", type=int, default=1024)
    parser.add_argument("--sessions", type=int, default=4)
    args = parser.parse_args()

    import ray
    from ray.cluster_utils import Cluster

    work = Path(tempfile.mkdtemp(prefix="coordex-bench-cluster-"))
    # The node builds into the same folder as this process (one machine): built once.
    os.environ["COORDEX_HOME"] = str(work / "home")
    os.environ.setdefault("UV_OFFLINE", "1")
    store = 75 * 1024 * 1024
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "object_store_memory": store, "include_dashboard": False})
    cluster.add_node(num_cpus=1, object_store_memory=store)
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    local = Executor(root=work / "home", timeout=600)
    remote = Executor(root=work / "home", timeout=600, cluster=cluster.address)
    try:
        wheel = ledgerlib_wheel(work, "1.0")
        venv = local.environments.create(requirement("ledgerlib", wheel))["venv_id"]
        assert local.environments.build(venv).get("built"), "build failed"
        rows: list[tuple[str, ...]] = [("call", "local p50", "cluster p50", "added at p50",
                                        "cluster p90")]
        for label, kw, code in (
                ("stateful Python (x = 1; x + 1)", {"venv_id": venv}, "x = 1\nx + 1"),
                ("stateful bash (true)", {"language": "bash"}, "true")):
            here = timed(lambda kw=kw, code=code: local.execute_code(
                code, state_mode="stateful", session_name="t", **kw), args.runs)
            there = timed(lambda kw=kw, code=code: remote.execute_code(
                code, state_mode="stateful", session_name="t", **kw), args.runs)
            p50h, p50t = statistics.median(here), statistics.median(there)
            rows.append((label, fmt(p50h), fmt(p50t), fmt(p50t - p50h),
                         fmt(percentile(there, 0.9))))
        print(table(rows))
        print()

        rows = [("read-only len(blob)", "local", "cluster", "cluster / local")]
        for mib in (100, args.big_mib):
            setup = f"blob = bytearray({mib} * 1024 * 1024)\nrecords = list(range(100_000))"
            times = []
            for ex in (local, remote):
                name = f"big{mib}"
                out = ex.execute_code(setup, state_mode="stateful", session_name=name,
                                      venv_id=venv)
                assert "error" not in out, out
                samples = timed(lambda ex=ex, name=name: ex.execute_code(
                    "len(blob)", state_mode="read_only", session_name=name, venv_id=venv),
                    15, warmup=2)
                times.append(statistics.median(samples))
                ex.close_session(session_name=name, venv_id=venv)
            rows.append((f"session holding {mib} MiB", fmt(times[0]), fmt(times[1]),
                         f"{times[1] / times[0]:.2f}x"))
        print(table(rows))
        print()

        pids = []
        for i in range(args.sessions):
            out = remote.execute_code("import os; os.getpid()", state_mode="stateful",
                                      session_name=f"idle{i}", venv_id=venv)
            pids.append(int(out["result"]))
        out = local.execute_code("import os; os.getpid()", state_mode="stateful",
                                 session_name="idle", venv_id=venv)
        local_pid = int(out["result"])
        time.sleep(1.0)
        actors = {h.handle for h in remote._cluster._shared.values()}  # the node's actor
        actor_pids = [ray.get(a.info.remote())["pid"] for a in actors]
        per_session = statistics.median(pss_kib(p) for p in pids)
        rows = [("idle memory (PSS)", "MiB"),
                ("one session's worker on a node", f"{per_session / 1024:.1f}"),
                ("one session's worker locally", f"{pss_kib(local_pid) / 1024:.1f}"),
                ("the node's coordex actor (shared by its sessions)",
                 f"{sum(pss_kib(p) for p in actor_pids) / 1024:.1f}")]
        print(table(rows))
    finally:
        remote.close()
        local.close()
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main()
