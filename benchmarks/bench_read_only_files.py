"""What read-only file protection adds to one read-only call, per backend.

Each backend runs the same trivial read-only call (Python ``x = 1``, bash ``true``)
through the public ``Executor`` against a session whose cwd is a small project folder,
with ``COORDEX_ISOLATION_FORCE`` capping the mode: ``none`` is the baseline (the same
call, same scratch folder, no protection: a plain fork, or for bash a plain subshell),
then ``refused`` (Landlock) and ``discarded`` (overlay + Landlock). The hook is set
before each executor starts so every process inherits it. "added" is the median minus
the baseline's median. The warm-up calls also start the bash session's launcher server
(~20 ms, once per session), which the medians leave out.

    python benchmarks/bench_read_only_files.py [runs] [--no-worker] [--back-to-back]

The worker row builds an empty environment with uv (offline, ~0.1 s) in a temp root.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from _util import fmt, median_seconds, table

from coordex import Executor
from coordex.backends import isolation

MODES = ("none", "refused", "discarded")
# Idle time before each call, as between a model's calls: a bash session makes its next
# protected copy ahead of the call in it (0 with --back-to-back).
GAP = 0.0 if "--back-to-back" in sys.argv else 0.05


def measure(kind: str, mode: str, runs: int, base: Path) -> tuple[float, str]:
    """Median seconds of one read-only call, and the files mode it reported."""
    os.environ[isolation.FORCE_ENV] = mode  # before the executor: children inherit it
    project = base / "project"
    root = base / f"root-{kind}-{mode}"
    language = "bash" if kind == "bash" else "python"
    with Executor(root=root, envs_dir=base / "envs", read_only_paths=[".", str(base / "home")]) as ex:
        venv_id = None
        if kind == "worker":
            venv_id = ex.environments.create("")["venv_id"]
        enter = f"cd {str(project)!r}" if kind == "bash" else f"import os; os.chdir({str(project)!r})"
        started = ex.execute_code(enter, language=language, state_mode="stateful",
                                  session_name="s", venv_id=venv_id)
        assert "error" not in started, started
        code = "true" if kind == "bash" else "x = 1"
        seen: set[str] = set()

        def call() -> None:
            result = ex.execute_code(code, language=language, state_mode="read_only",
                                     session_name="s", venv_id=venv_id)
            assert "error" not in result, result
            seen.add(result["isolation"]["files"])

        seconds = median_seconds(call, runs, warmup=5, gap=GAP)
    return seconds, ",".join(sorted(seen))


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    runs = int(args[0]) if args else 100
    kinds = ["own", "bash"] + ([] if "--no-worker" in sys.argv else ["worker"])
    base = Path(tempfile.mkdtemp(prefix="coordex-bench-ro-"))
    previous = os.environ.get(isolation.FORCE_ENV)
    os.environ.setdefault("UV_OFFLINE", "1")
    try:
        for folder in ("project/src", "home"):
            (base / folder).mkdir(parents=True)
        for i in range(50):
            (base / "project" / "src" / f"f{i}.py").write_text("x = 1\n")
        print(f"probe(): {isolation.probe()}; {runs} calls per row, median\n")
        rows: list[tuple[str, ...]] = [("backend", "asked", "got", "per call", "added")]
        for kind in kinds:
            baseline = 0.0
            for mode in MODES:
                seconds, got = measure(kind, mode, runs, base)
                if mode == "none":
                    baseline = seconds
                rows.append((kind, mode, got, fmt(seconds),
                             "-" if mode == "none" else fmt(seconds - baseline)))
        print(table(rows))
    finally:
        if previous is None:
            os.environ.pop(isolation.FORCE_ENV, None)
        else:
            os.environ[isolation.FORCE_ENV] = previous
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
