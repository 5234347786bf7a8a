"""What SPEC 14's ``wait`` costs a call that ends before it: the same calls with and
without ``wait`` (own interpreter, a bash session), side by side. A call without
``wait`` takes the path it took before ``wait`` existed (run this file against the code
before the change with PYTHONPATH to compare: the ``wait`` rows are then skipped).

Run: python benchmarks/bench_wait.py [--runs N]
"""

from __future__ import annotations

import argparse
import inspect
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _util import fmt, median_seconds, table

from coordex import Executor


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=2000)
    args = parser.parse_args()
    has_wait = "wait" in inspect.signature(Executor.execute_code).parameters
    rows = [("case", "no wait", "wait=30", "added")]
    cases = [("own, stateful 'x = 1'", "x = 1", {"state_mode": "stateful"}, args.runs),
             ("own, stateless 'x = 1'", "x = 1", {}, args.runs),
             ("bash session 'x=1'", "x=1", {"language": "bash", "state_mode": "stateful"},
              args.runs // 4)]
    with tempfile.TemporaryDirectory() as root, Executor(root=root) as ex:
        for label, code, kwargs, runs in cases:
            plain = median_seconds(lambda c=code, k=kwargs: ex.execute_code(c, **k), runs)
            if not has_wait:
                rows.append((label, fmt(plain), "-", "-"))
                continue
            waited = median_seconds(
                lambda c=code, k=kwargs: ex.execute_code(c, wait=30, **k), runs)
            rows.append((label, fmt(plain), fmt(waited), fmt(waited - plain)))
    print(table(rows))


if __name__ == "__main__":
    main()
