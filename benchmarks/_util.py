"""Small timing helpers shared by the benchmark scripts."""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any


def median_seconds(fn: Callable[[], object], runs: int, warmup: int = 3,
                   gap: float = 0.0) -> float:
    """Median wall time of ``fn()``; ``gap`` seconds of idle time before each call (as
    between a model's calls, which lets work a backend does ahead of a call finish)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(runs):
        if gap:
            time.sleep(gap)
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def paired_medians(ours: Callable[[], object], theirs: Callable[[], object], runs: int,
                   theirs_runs: int | None = None, rounds: int = 10,
                   warmup: int = 20, gap: float = 0.0) -> tuple[float, float]:
    """The median wall time of each of two calls, timed in alternating rounds (``runs //
    rounds`` of ours, then ``theirs_runs // rounds`` of theirs; ``theirs_runs`` defaults
    to ``runs``): a change in the machine's speed during the run (a shared machine's is
    never still) falls on both alike, not on whichever ran then. ``gap``: as in
    :func:`median_seconds`, before each timed call."""
    for _ in range(warmup):
        ours()
        theirs()
    counts = (runs, runs if theirs_runs is None else theirs_runs)
    samples: tuple[list[float], list[float]] = ([], [])
    for _ in range(rounds):
        for fn, into, count in ((ours, samples[0], counts[0]), (theirs, samples[1], counts[1])):
            for _ in range(max(1, count // rounds)):
                if gap:
                    time.sleep(gap)
                started = time.perf_counter()
                fn()
                into.append(time.perf_counter() - started)
    return statistics.median(samples[0]), statistics.median(samples[1])


# benchmarks/run.py sets this to a JSON-lines file: the figures its goals are read from.
RECORD = "COORDEX_BENCH_RECORD"


def record(key: str, value: float) -> None:
    """Keep one figure for ``benchmarks/run.py`` (a no-op when a script runs alone)."""
    path = os.environ.get(RECORD)
    if path:
        with open(path, "a", encoding="utf-8") as file:
            file.write(json.dumps({"key": key, "value": value}) + "\n")


def fmt(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


class Owned:
    """A place's session (or stateless template) run as the Executor runs it: each call
    through ``coordex.sessions.settle`` (SPEC 6's retry) and rendered by
    ``coordex.core.record.render``, so a figure holds what the session table and the
    result add to the place's own work."""

    def __init__(self, target: Any, kind: str, retries: bool) -> None:
        self.target = target
        self.kind, self.retries = kind, retries

    def _call(self, mode: Any, run: Any, request: Any) -> dict[str, Any]:
        from coordex import sessions
        from coordex.core.record import CallRecord, render

        settled = sessions.settle(self, mode, run, request)  # type: ignore[arg-type]
        return render(CallRecord(mode, {}, 0.0, settled))

    def run(self, request: Any) -> dict[str, Any]:
        return self._call("stateful", self.target.run, request)

    def run_read_only(self, request: Any) -> dict[str, Any]:
        return self._call("read_only", self.target.run_read_only, request)

    def run_stateless(self, request: Any) -> dict[str, Any]:
        return self._call("stateless", self.target.run_stateless, request)

    def close(self) -> None:
        self.target.close()
