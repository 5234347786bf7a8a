"""The performance page is the output of the last benchmark run on the code it describes.

``docs/performance.md`` is written by ``benchmarks/run.py``: each section names the commit
it ran on. A section is stale when a file its benchmark covers, its own script or the
shared timing helpers changed after that commit; this test names the stale ones (run
``python benchmarks/run.py --only NAME,...`` and commit the page).
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _runner() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_run", ROOT / "benchmarks" / "run.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while made
    spec.loader.exec_module(module)
    return module


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


@pytest.fixture(scope="module")
def checkout() -> None:
    if shutil.which("git") is None or _git("rev-parse", "--git-dir").returncode != 0:
        pytest.skip("not a git checkout: the page's commits cannot be compared")


def test_every_default_benchmark_has_a_section_with_its_figures(checkout: None) -> None:
    run = _runner()
    page = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    found = run.sections(page)
    missing = [b.script for b in run.BENCHES if b.default and b.script not in found]
    assert not missing, f"docs/performance.md has no section for {missing}: run benchmarks/run.py"
    figures = {k for _, _, f in found.values() for k in f}
    assert {goal.key for goal in run.GOALS} <= figures
    # The goals table is the one the sections' figures give, not an edited one.
    assert run.page(found, "").split("## Goals", 1)[1].split("## `", 1)[0] \
        == page.split("## Goals", 1)[1].split("## `", 1)[0]


def test_no_figure_is_older_than_the_code_it_measures(checkout: None) -> None:
    run = _runner()
    found = run.sections((ROOT / "docs" / "performance.md").read_text(encoding="utf-8"))
    stale = []
    for script, (_, commit, _) in found.items():
        bench = run.BY_SCRIPT[script]
        if _git("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
            stale.append(f"{script} (its commit {commit[:10]} is not in this history)")
            continue
        changed = _git("diff", "--name-only", commit, "HEAD", "--", *bench.sources).stdout.split()
        if changed:
            stale.append(f"{script} ({', '.join(changed[:4])}{' ...' if len(changed) > 4 else ''}"
                         f" changed since {commit[:10]})")
    assert not stale, ("stale figures in docs/performance.md: " + "; ".join(stale)
                       + ". Run: python benchmarks/run.py --only "
                       + ",".join(s.split()[0] for s in stale) + ", and commit the page.")
