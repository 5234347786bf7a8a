"""Run the benchmarks and write the performance page, ``docs/performance.md``.

    python benchmarks/run.py            # the hot paths and their peers (a few minutes)
    python benchmarks/run.py --all      # every benchmark (builds, persistence, Ray: longer)
    python benchmarks/run.py --only bench_own,bench_bash

Each benchmark script runs as it runs alone, side by side with its peer, and prints its
own table; the page holds those tables as printed, the goals read from the figures the
scripts record (``_util.record``), and what they ran on: the date, the machine, the load
before and after, and the commit. Nothing on the page is written by hand, and the README
and the docs link the page instead of quoting its figures.

Each section names the commit it ran on, and ``tests/integration/test_performance_page.py``
checks them: when a file a benchmark covers (``BENCHES[...].covers``), its own script or
the shared timing helpers (``_util.py``) changed after its section's commit, the test
fails and names the stale figures. Run this script again and commit the page (``--only``
the stale ones keeps the others).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PAGE = ROOT / "docs" / "performance.md"


@dataclass(frozen=True)
class Bench:
    """One script: its arguments here, the source it measures, and whether it runs by
    default (the hot paths) or only with ``--all``."""

    script: str
    args: tuple[str, ...]
    covers: tuple[str, ...]
    default: bool = True
    what: str = ""

    @property
    def sources(self) -> tuple[str, ...]:
        """What its figures depend on: the code it measures, the script itself and the
        timing helpers every script uses."""
        return (*self.covers, f"benchmarks/{self.script}.py", "benchmarks/_util.py")


# The call path every place shares (a change here moves every figure).
_CALL_PATH = ("src/coordex/executor.py", "src/coordex/sessions.py", "src/coordex/core/",
              "src/coordex/backends/base.py", "src/coordex/log/")

BENCHES: tuple[Bench, ...] = (
    Bench("bench_own", (), (*_CALL_PATH, "src/coordex/backends/own/",
                            "src/coordex/worker/_coordex_engine.py",
                            "src/coordex/worker/_coordex_copy.py"),
          what="the agent's own interpreter: call overhead beside a bare exec; read-only "
               "beside copy.deepcopy"),
    Bench("bench_workers", (), ("src/coordex/sessions.py", "src/coordex/core/",
                                "src/coordex/backends/base.py", "src/coordex/backends/env/",
                                "src/coordex/worker/"),
          what="an environment's worker beside ipykernel (jupyter_client) and a fresh "
               "interpreter; read-only beside copy.deepcopy"),
    Bench("bench_bash", ("--calls", "500"), ("src/coordex/sessions.py", "src/coordex/core/",
                                             "src/coordex/backends/base.py",
                                             "src/coordex/backends/shell/",
                                             "src/coordex/backends/isolation.py"),
          what="a kept bash beside a tuned pexpect bash; read-only beside dump + restore"),
    Bench("bench_read_only_files", (), (*_CALL_PATH, "src/coordex/backends/"),
          what="what read-only file protection adds to a call, per place"),
    Bench("bench_log", ("--calls", "1000", "--rounds", "3"), (*_CALL_PATH,),
          what="the call log's cost per call"),
    Bench("bench_mcp_startup", ("--runs", "5"), ("src/coordex/mcp_hello.py",
                                                  "src/coordex/mcp_server.py",
                                                  "src/coordex/cli.py"),
          what="coordex mcp: time to answer initialize"),
    Bench("bench_read_only_data", ("--rows", "500000", "--runs", "3"),
          ("src/coordex/backends/", "src/coordex/worker/"), default=False,
          what="read-only on data frames beside copying them"),
    Bench("bench_isolation", (), ("src/coordex/backends/isolation.py",), default=False,
          what="the read-only file protection's own cost"),
    Bench("bench_persist", ("--sizes", "64,256"),
          ("src/coordex/persist/", "src/coordex/backends/_kept.py",
           "src/coordex/backends/own/keep.py", "src/coordex/backends/env/keep.py",
           "src/coordex/backends/shell/keep.py", "src/coordex/worker/_coordex_snapshot.py"),
          default=False,
          what="snapshots of kept sessions"),
    Bench("bench_env_build", ("--reps", "2"), ("src/coordex/environments/",), default=False,
          what="building an environment with uv"),
    Bench("bench_confined", ("--calls", "200", "--starts", "3"), ("src/coordex/hosting/",),
          default=False, what="a call through a tenant's confined host"),
    Bench("bench_branches", (), ("src/coordex/backends/",), default=False,
          what="forking a session and its checkpoints"),
    Bench("bench_observe", (), ("src/coordex/observe/",), default=False,
          what="what a span per call costs with tracing on"),
    Bench("bench_wait", (), ("src/coordex/log/detached.py",), default=False,
          what="what `wait` adds to a call that ends before it"),
)
BY_SCRIPT = {b.script: b for b in BENCHES}


@dataclass(frozen=True)
class Goal:
    """A figure a script records, and the goal it is held to."""

    key: str
    what: str
    unit: str
    at_most: float | None = None
    at_least: float | None = None

    def met(self, value: float) -> bool:
        if self.at_most is not None:
            return value <= self.at_most
        return self.at_least is None or value >= self.at_least

    def goal(self) -> str:
        return (f"<= {self.at_most:g} {self.unit}" if self.at_most is not None
                else f">= {self.at_least:g}{self.unit}")


GOALS = (
    Goal("own.stateful.overhead_us", "own interpreter, stateful `x = 1`: overhead beside a "
         "bare exec", "us", at_most=50),
    Goal("worker.stateful.vs_ipykernel", "environment worker, stateful call: times faster than "
         "ipykernel", "x", at_least=50),
    Goal("bash.stateful_true.vs_pexpect", "bash, stateful `true`: times faster than a tuned "
         "pexpect bash", "x", at_least=4),
    Goal("bash.read_only_paced.vs_dump_restore", "bash, read-only with its files protected, "
         "paced: times faster than dump + restore", "x", at_least=2.5),
)


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


def _machine() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
        kib = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal"))
        memory = f"{kib / 2**20:.0f} GiB"
    except (OSError, StopIteration, ValueError):
        memory = "? GiB"
    return (f"{model}, {os.cpu_count()} cores, {memory}, {platform.system()} "
            f"{platform.release()}, Python {platform.python_version()}")


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def run(benches: list[Bench]) -> list[tuple[Bench, str, float, dict[str, float]]]:
    """Run each script: its printed output, its seconds and the figures it recorded."""
    outputs = []
    with tempfile.TemporaryDirectory() as folder:
        for bench in benches:
            recorded = Path(folder) / f"{bench.script}.jsonl"
            env = dict(os.environ, COORDEX_BENCH_RECORD=str(recorded))
            print(f"== {bench.script} {' '.join(bench.args)}", file=sys.stderr, flush=True)
            started = time.monotonic()
            done = subprocess.run([sys.executable, str(HERE / f"{bench.script}.py"), *bench.args],
                                  cwd=ROOT, env=env, capture_output=True, text=True)
            took = time.monotonic() - started
            text = done.stdout.rstrip()
            if done.returncode != 0:
                tail = "\n".join(done.stderr.strip().splitlines()[-5:])
                text += f"\n[exit {done.returncode}]\n{tail}"
            print(text, file=sys.stderr, flush=True)
            figures: dict[str, float] = {}
            if recorded.exists():
                for line in recorded.read_text(encoding="utf-8").splitlines():
                    item = json.loads(line)
                    figures[item["key"]] = float(item["value"])
            outputs.append((bench, text, took, figures))
    return outputs


# A section of the page: its heading, the commit it ran on, the figures it recorded.
_SECTION = re.compile(r"^## `(?P<script>\w+)\.py`.*?^commit `(?P<commit>[0-9a-f]+)`"
                      r".*?^<!-- figures: (?P<figures>\{.*?\}) -->.*?(?=^## |\Z)",
                      re.MULTILINE | re.DOTALL)


def sections(page: str) -> dict[str, tuple[str, str, dict[str, float]]]:
    """The page's sections by script: (text, commit, figures)."""
    return {m.group("script"): (m.group(0).rstrip() + "\n", m.group("commit"),
                                json.loads(m.group("figures")))
            for m in _SECTION.finditer(page)}


def _section(bench: Bench, text: str, took: float, figures: dict[str, float], commit: str,
             when: str, load: str) -> str:
    return "\n".join([
        f"## `{bench.script}.py` {' '.join(bench.args)}".rstrip(), "",
        f"{bench.what}.", "",
        f"commit `{commit}`, {when}, {took:.0f} s, load average at its end {load}",
        f"<!-- figures: {json.dumps(figures, sort_keys=True)} -->", "",
        "```text", text, "```", ""])


def page(kept: dict[str, tuple[str, str, dict[str, float]]], machine: str) -> str:
    """The whole page from its sections (this run's and those an earlier run left)."""
    figures: dict[str, float] = {}
    for _, _, found in kept.values():
        figures.update(found)
    lines = [
        "# Performance",
        "",
        "Generated by `python benchmarks/run.py`; not edited by hand. Each benchmark runs "
        "coordex side by side with its peer in one run and prints its own table, shown here "
        "as printed, with the commit it ran on. Figures move with the machine's load: each "
        "section gives the load average at its end.",
        "",
        f"- machine: {machine}",
        "",
        "## Goals",
        "",
        "| figure | measured | goal | met |",
        "|---|---|---|---|",
    ]
    for goal in GOALS:
        value = figures.get(goal.key)
        if value is None:
            lines.append(f"| {goal.what} | not measured | {goal.goal()} | - |")
            continue
        shown = f"{value:.1f} {goal.unit}" if goal.unit == "us" else f"{value:.1f}{goal.unit}"
        lines.append(f"| {goal.what} | {shown} | {goal.goal()} | "
                     f"{'yes' if goal.met(value) else 'no'} |")
    lines.append("")
    lines += [kept[b.script][0] for b in BENCHES if b.script in kept]
    return "\n".join(lines).rstrip() + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="every benchmark, not only the hot paths")
    parser.add_argument("--only", metavar="NAME,...", help="these scripts (bench_own,...)")
    parser.add_argument("--page", type=Path, default=PAGE, help="where to write the page")
    args = parser.parse_args()
    if args.only:
        names = [n.strip().removesuffix(".py") for n in args.only.split(",") if n.strip()]
        unknown = [n for n in names if n not in BY_SCRIPT]
        if unknown:
            parser.error(f"no benchmark {unknown[0]!r}; there are: {', '.join(BY_SCRIPT)}")
        chosen = [BY_SCRIPT[n] for n in names]
    else:
        chosen = [b for b in BENCHES if args.all or b.default]
    chosen = [b for b in chosen if (HERE / f"{b.script}.py").exists()]
    commit = _git("rev-parse", "HEAD")
    if _git("status", "--porcelain", "--untracked-files=no", "--", "src"):
        print("note: src/ has changes not committed; the page names the last commit",
              file=sys.stderr)
    earlier = args.page.read_text(encoding="utf-8") if args.page.exists() else ""
    kept = sections(earlier) if args.only else {}
    for bench, text, took, figures in run(chosen):
        when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        kept[bench.script] = (_section(bench, text, took, figures, commit, when, _load()),
                              commit, figures)
    args.page.write_text(page(kept, _machine()), encoding="utf-8")
    print(f"wrote {args.page}", file=sys.stderr)


if __name__ == "__main__":
    main()
