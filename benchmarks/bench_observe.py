"""What tracing costs a call (SPEC 16: at most 20 us at p50 with tracing on and no
exporter; nothing without the extra): the same calls with no tracer provider, with the
SDK's provider and no exporter, and with an in-memory exporter, in the agent's own
interpreter, in an environment's worker and in bash; beside them the floor, the SDK's
own span around the call with nothing of coordex's. The settings take turns in short
rounds, so a noisy neighbour slows each of them alike.

Run: python benchmarks/bench_observe.py [--rounds N]   (needs pip install 'coordex[otel]')
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

sys.path.insert(0, str(Path(__file__).parent))

from _util import fmt, table
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from coordex import Executor


def use(provider: TracerProvider | None) -> None:
    # A benchmark switches the global provider back and forth; the API sets it once.
    trace._TRACER_PROVIDER_SET_ONCE._done = False  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]
    if provider is not None:
        trace.set_tracer_provider(provider)


class BareSpan:
    """The floor: the SDK's own span around the call, nothing of coordex's (no
    attributes, no trace context for the code)."""

    def __init__(self, tool: str) -> None:
        self.span = trace.get_tracer("floor").start_span(f"tools/call {tool}")

    def done(self, arguments: object, result: object) -> None:
        self.span.end()

    def close(self) -> None:
        pass


def p50s(call: Callable[[], object], settings: dict[str, TracerProvider | None],
         rounds: int, per_round: int, clock: Callable[[], float]) -> dict[str, float]:
    import coordex.executor as executor_module

    watch = executor_module.watch_call
    samples: dict[str, list[float]] = {name: [] for name in settings}
    for _ in range(rounds):
        for name, provider in settings.items():
            use(provider)
            executor_module.watch_call = BareSpan if name == "bare SDK span" else watch
            for _ in range(3):  # warm-up after the switch
                call()
            for _ in range(per_round):
                started = clock()
                call()
                samples[name].append(clock() - started)
            exporter.clear()
    executor_module.watch_call = watch
    use(None)
    return {name: statistics.median(values) for name, values in samples.items()}


exporter = InMemorySpanExporter()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    os.environ.setdefault("UV_OFFLINE", "1")
    memory = TracerProvider()
    memory.add_span_processor(SimpleSpanProcessor(exporter))
    settings: dict[str, TracerProvider | None] = {
        "off": None, "on, no exporter": TracerProvider(), "on, in-memory exporter": memory,
        "bare SDK span": TracerProvider()}
    rows = [("call", "off", "on, no exporter", "cost", "on, in-memory", "cost",
             "the SDK's bare span: cost")]
    with tempfile.TemporaryDirectory() as root, Executor(root=root) as ex:
        venv = ex.environments.create("", name="empty")["venv_id"]
        cases = [
            ("own, stateful 'x = 1'", lambda: ex.execute_code("x = 1", state_mode="stateful"),
             200),
            ("own, stateless 'x = 1'", lambda: ex.execute_code("x = 1"), 200),
            ("env worker, stateful 'x = 1'",
             lambda: ex.execute_code("x = 1", state_mode="stateful", venv_id=venv), 100),
            ("bash, stateful 'x=1'",
             lambda: ex.execute_code("x=1", language="bash", state_mode="stateful"), 100),
        ]
        # Wall time of the whole call, and the CPU time of the calling thread, where the
        # span is made (less swayed by other processes on a shared machine).
        for clock_name, clock in (("wall", time.perf_counter), ("caller CPU", time.thread_time)):
            for label, call, per_round in cases:
                found = p50s(call, settings, args.rounds, per_round, clock)
                off = found["off"]
                rows.append((f"{label} [{clock_name}]", fmt(off), fmt(found["on, no exporter"]),
                             fmt(found["on, no exporter"] - off),
                             fmt(found["on, in-memory exporter"]),
                             fmt(found["on, in-memory exporter"] - off),
                             fmt(found["bare SDK span"] - off)))
    print(table(rows))
    print(f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
