"""Read-only copies of sessions holding data frames, against copy.deepcopy, in one run.

Own interpreter, each case in a session of its own:

- a pandas frame of N rows (default 2 million) with an int, a float, an object string
  and an Arrow string column: a fork copy (pandas and pyarrow survive fork());
- a polars frame of N rows while polars' thread pool has not started (a fork copy),
  and once it has (``group_by`` ran: a copy by values into a fresh interpreter).

Each read-only call changes the frame (in place for pandas) and returns its length, work
that costs little in itself, so the time is the copy's; the peer is ``copy.deepcopy`` of
the frame in this process, what a tool without a fork or a fresh process would do to
protect the session (for frames a deep copy copies the column buffers, not the Python
objects an object column points to, and polars' clone shares its immutable buffers).
Run in a fresh process, since polars' pool, once started here, makes every later
own-interpreter copy go by value:

    python benchmarks/bench_read_only_data.py [--rows N] [--runs R]
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _util import fmt, median_seconds, table

from coordex import Executor

PANDAS = """
import numpy as np, pandas as pd
n = ROWS
rng = np.random.default_rng(0)
words = np.array(['alpha', 'beta', 'gamma', 'delta', 'epsilon'], dtype=object)
df = pd.DataFrame({'k': rng.integers(0, 1_000_000, n), 'v': rng.random(n),
                   's_obj': words[rng.integers(0, 5, n)]})
df['s_arrow'] = pd.array(df['s_obj'], dtype='string[pyarrow]')
"""
PANDAS_LOOK = "df.iloc[:1000, 1] = 0.0; len(df)"  # an in-place write, cheap in itself
POLARS = """
import numpy as np, polars as pl
n = ROWS
rng = np.random.default_rng(0)
pf = pl.DataFrame({'k': rng.integers(0, 1_000_000, n), 'v': rng.random(n)})
"""
POLARS_LOOK = "pf = pf.with_columns(pl.col('v') * 2); len(pf)"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    rows = [("case", "copy", "read_only", "deepcopy", "ratio")]
    with tempfile.TemporaryDirectory() as root, Executor(root=root, timeout=600) as ex:
        def case(label: str, setup: str, look: str, name: str, value: str,
                 built: str = "") -> None:
            built = built or setup
            done = ex.execute_code(setup.replace("ROWS", str(args.rows)),
                                   state_mode="stateful", session_name=name)
            assert "error" not in done, done
            first = ex.execute_code(look, state_mode="read_only", session_name=name)
            assert "error" not in first, first
            kind = first["isolation"]["copy"]
            ro = median_seconds(lambda: ex.execute_code(
                look, state_mode="read_only", session_name=name), args.runs, warmup=1)
            # The peer deep-copies the same frame, built the same way here.
            here: dict[str, object] = {}
            exec(built.replace("ROWS", str(args.rows)), here)
            frame = here[value]
            deep = median_seconds(lambda: copy.deepcopy(frame), args.runs, warmup=1)
            rows.append((label, kind, fmt(ro), fmt(deep), f"{deep / ro:.1f}x"))

        rows_label = f"{args.rows:,} rows"
        case(f"pandas, object + Arrow strings, {rows_label}", PANDAS, PANDAS_LOOK, "pd", "df")
        case(f"polars, pool not started, {rows_label}", POLARS, POLARS_LOOK, "pl", "pf")
        started = ex.execute_code("pf.group_by('k').agg(pl.col('v').sum()).height",
                                  state_mode="stateful", session_name="pl")
        assert "error" not in started, started
        case(f"polars, pool running, {rows_label}", "pass", POLARS_LOOK, "pl", "pf", POLARS)
    print(table(rows))


if __name__ == "__main__":
    main()
