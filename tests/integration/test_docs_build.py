"""The docs build strictly, and a broken link or a page left out of the site fails them.

``.ci/run`` builds the site with ``sphinx-build -W --keep-going -n``; these tests build a
copy of ``docs/`` the same way, as it is and with one fault planted.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _build(tmp_path: Path, plant: str | None = None,
           page: str = "limits.md") -> subprocess.CompletedProcess[str]:
    pytest.importorskip("sphinx", reason="the docs extra: pip install -e '.[docs]'")
    shutil.copytree(ROOT / "docs", tmp_path / "docs",
                    ignore=shutil.ignore_patterns("_build", "generated"))
    shutil.copy(ROOT / "CHANGELOG.md", tmp_path / "CHANGELOG.md")
    (tmp_path / "benchmarks").mkdir()  # its runner's list is a generated page
    shutil.copy(ROOT / "benchmarks" / "run.py", tmp_path / "benchmarks" / "run.py")
    if plant is not None:
        target = tmp_path / "docs" / page
        target.write_text((target.read_text() if target.exists() else "") + plant)
    return subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html",
         str(tmp_path / "docs"), str(tmp_path / "html")],
        capture_output=True, text=True, timeout=280)


def test_the_docs_build_strictly(tmp_path: Path) -> None:
    built = _build(tmp_path)
    assert built.returncode == 0, built.stderr
    for page in ("index", "tools", "errors", "call-endings", "api", "cli", "tenants"):
        assert (tmp_path / "html" / f"{page}.html").is_file(), page
    tools = (tmp_path / "html" / "tools.html").read_text()
    assert "execute_code" in tools and "session_name" in tools


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    built = _build(tmp_path, "\nSee [a page](no-such-page.md) and "
                             "[an anchor](connect.md#no-such-anchor).\n")
    assert built.returncode != 0
    assert "no-such-page" in built.stderr and "no-such-anchor" in built.stderr


def test_a_page_outside_the_toctree_fails_the_build(tmp_path: Path) -> None:
    built = _build(tmp_path, "# Forgotten\n", page="forgotten.md")
    assert built.returncode != 0 and "forgotten" in built.stderr
