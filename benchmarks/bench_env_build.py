"""Environment builds: coordex (uv) against `python -m venv` + pip, for the same spec.

Offline and self-contained: the wheels are made on the fly (tests/fakes/wheels.py) and
installed from local files, with a private uv cache warmed once (as it would be after the
first build on a machine). Prints medians and ratios:

- cold build of a spec through EnvironmentManager (uv venv + uv pip install, copy mode);
- the same with plain `python -m venv` + `pip install --no-index` of the same wheels;
- uv's link modes: copy (what coordex uses, see builder.LINK_MODE) vs hardlink;
- python_for on a built environment: the first call of a fresh manager, and cached calls.

Run: python benchmarks/bench_env_build.py [--reps 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from coordex.environments import EnvironmentManager
from coordex.environments.builder import uv_binary
from fakes.wheels import build_wheel, bulky_wheel, ledgerlib_wheel, requirement


def median_time(action: Callable[[int], object], reps: int) -> float:
    timings = []
    for rep in range(reps):
        started = time.perf_counter()
        action(rep)
        timings.append(time.perf_counter() - started)
    return statistics.median(timings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="coordex-bench-"))
    os.environ["UV_CACHE_DIR"] = str(work / "uv-cache")
    os.environ["UV_OFFLINE"] = "1"
    try:
        wheels_dir = work / "wheels"
        wheels = [ledgerlib_wheel(wheels_dir, "1.0"), bulky_wheel(wheels_dir, modules=400)]
        for i in range(6):
            wheels.append(build_wheel(wheels_dir, f"small{i}", "1.0",
                                      {f"small{i}/__init__.py": f"N = {i}\n"}))
        names = ["ledgerlib", "bulkylib"] + [f"small{i}" for i in range(6)]
        spec = "\n".join(requirement(n, w) for n, w in zip(names, wheels, strict=True))
        print(f"spec: {len(wheels)} local wheels ({sum(w.stat().st_size for w in wheels)} bytes,"
              " one with 400 modules); reps={}".format(args.reps))

        # Warm uv's cache once, as a machine that has built anything before would have.
        EnvironmentManager(work / "warm").build(EnvironmentManager(work / "warm").create(spec)
                                                ["venv_id"])

        def coordex_build(rep: int) -> None:
            manager = EnvironmentManager(work / f"coordex-{rep}")
            result = manager.build(manager.create(spec)["venv_id"])
            assert result.get("built") and not result["cached"], result

        def venv_pip(rep: int) -> None:
            target = work / f"venv-{rep}"
            subprocess.run([sys.executable, "-m", "venv", str(target)], check=True)
            subprocess.run([str(target / "bin" / "python"), "-m", "pip", "install", "-q",
                            "--no-index", "--disable-pip-version-check",
                            *map(str, wheels)], check=True)

        def uv_mode(mode: str) -> Callable[[int], None]:
            def action(rep: int) -> None:
                target = work / f"uv-{mode}-{rep}"
                subprocess.run([uv_binary(), "venv", "-q", "--no-config", "--python",
                                sys.executable, str(target)], check=True)
                subprocess.run([uv_binary(), "pip", "install", "-q", "--no-config", "--python",
                                str(target / "bin" / "python"), f"--link-mode={mode}",
                                *(requirement(n, w) for n, w in zip(names, wheels, strict=True))],
                               check=True)
            return action

        coordex_s = median_time(coordex_build, args.reps)
        pip_s = median_time(venv_pip, args.reps)
        copy_s = median_time(uv_mode("copy"), args.reps)
        hardlink_s = median_time(uv_mode("hardlink"), args.reps)

        fresh = EnvironmentManager(work / "coordex-0")
        venv_id = fresh.list()["environments"][0]["venv_id"]
        started = time.perf_counter()
        fresh.python_for(venv_id)
        first_use = time.perf_counter() - started
        calls = 10_000
        started = time.perf_counter()
        for _ in range(calls):
            fresh.python_for(venv_id)
        cached = (time.perf_counter() - started) / calls

        print(f"coordex build (uv, copy)       {coordex_s * 1000:8.1f} ms")
        print(f"python -m venv + pip install   {pip_s * 1000:8.1f} ms")
        print(f"  ratio venv+pip / coordex     {pip_s / coordex_s:8.1f} x")
        print(f"uv venv + install, copy        {copy_s * 1000:8.1f} ms")
        print(f"uv venv + install, hardlink    {hardlink_s * 1000:8.1f} ms")
        print(f"  cost of copy over hardlink   {(copy_s - hardlink_s) * 1000:8.1f} ms "
              f"({copy_s / hardlink_s:.2f} x)")
        print(f"python_for, fresh manager      {first_use * 1000:8.3f} ms (marker found, no uv)")
        print(f"python_for, cached             {cached * 1e6:8.2f} us per call")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
