"""The agent's own interpreter: call overhead against a bare exec (code on a runner
thread, the default, and on the caller's thread: own_on_caller_thread=True), and read-only
against copy.deepcopy of a session holding a ledger as an agent would load it.

Run: python benchmarks/bench_own.py [--big]   (--big adds a 1 GB buffer case)
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _util import fmt, median_seconds, paired_medians, record, table

from coordex import Executor

LEDGER = ("ledger = [{'id': i, 'account': 'acct-%d' % (i % 997), 'amount': i * 0.01}"
          " for i in range(200_000)]\nblob = bytearray(SIZE)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--big", action="store_true", help="also measure a 1 GB buffer")
    args = parser.parse_args()
    rows = [("case", "coordex", "peer", "peer", "ratio")]
    with tempfile.TemporaryDirectory() as root, Executor(root=root) as ex:
        ns: dict[str, object] = {}

        def bare() -> None:
            exec("x = 1", ns)

        # Each case in alternating rounds with the bare exec it is set beside (see
        # _util.paired_medians): the overhead is the difference of the two medians.
        cases = [("stateful call 'x = 1'", ex, {"state_mode": "stateful"}),
                 ("stateless call 'x = 1'", ex, {})]
        # The same calls with the code on the caller's (main) thread: no hand-off.
        here = Executor(root=root, own_on_caller_thread=True)
        cases += [(f"{label}, caller's thread", here, kwargs) for label, _, kwargs in cases]
        with here:
            for label, executor, kwargs in cases:
                took, peer = paired_medians(
                    lambda e=executor, k=kwargs: e.execute_code("x = 1", **k), bare, 5000)
                rows.append((label, fmt(took), "bare exec", fmt(peer),
                             f"overhead {fmt(took - peer)}"))
                if label == "stateful call 'x = 1'":
                    record("own.stateful.overhead_us", (took - peer) * 1e6)
        sizes = [("200k records + 100 MB", 100 * 2**20)]
        if args.big:
            sizes.append(("200k records + 1 GB", 2**30))
        for label, size in sizes:
            ex.execute_code(LEDGER.replace("SIZE", str(size)), state_mode="stateful",
                            session_name="audit", timeout=600)
            ro = median_seconds(lambda: ex.execute_code(
                "ledger.sort(key=lambda r: -r['amount']); len(ledger)",
                state_mode="read_only", session_name="audit"), 10, warmup=1)
            ro_empty = median_seconds(lambda: ex.execute_code(
                "len(ledger)", state_mode="read_only", session_name="audit"), 20, warmup=2)
            # The peer deep-copies the same state, built the same way here, once the
            # read-only calls are measured: a second ledger in this process while they
            # run would double what each fork() copies.
            state: dict[str, object] = {}
            exec(LEDGER.replace("SIZE", str(size)), state)
            del state["__builtins__"]
            deep = median_seconds(lambda s=state: copy.deepcopy(s), 3, warmup=0)
            rows.append((f"read_only len() on {label}", fmt(ro_empty), "deepcopy", fmt(deep),
                         f"{deep / ro_empty:.0f}x faster"))
            rows.append((f"read_only sort on {label}", fmt(ro), "deepcopy", fmt(deep),
                         f"{deep / ro:.1f}x faster"))
            ex.close_session(session_name="audit")
            del state
    print(table(rows))
    # Two cores shared with other work: the figures move with the load, so say it.
    one, five, fifteen = os.getloadavg()
    print(f"load average (1, 5, 15 min) at the end: {one:.2f} {five:.2f} {fifteen:.2f}")


if __name__ == "__main__":
    main()
