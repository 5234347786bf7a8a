"""Build progress reaches the caller as uv prints it (SPEC 5).

A build usually starts on first use, inside ``execute_code``: uv's own lines must reach
that call's ``on_progress`` one by one and in order, although they are read on another
thread; and while uv is silent (a slow download, an sdist's build backend at work) a
line saying the build is still running comes at least every 5 s, so a client that
resets its request timer on progress keeps waiting.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest

from coordex import Executor
from tests.fakes.wheels import build_wheel, requirement

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def three_wheels(folder: Path) -> str:
    lines = []
    for name in ("alphapkg", "betapkg", "gammapkg"):
        wheel = build_wheel(folder, name, "1.0", {f"{name}/__init__.py": f"NAME = {name!r}\n"})
        lines.append(requirement(name, wheel))
    return "\n".join(lines)


SLOW_BACKEND = '''\
"""A build backend that works in silence for a while, then hands over a ready wheel."""
import os
import shutil
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WHEEL = "slowpkg-1.0-py3-none-any.whl"


def get_requires_for_build_wheel(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    time.sleep({seconds})
    shutil.copy(os.path.join(HERE, "prebuilt", WHEEL), os.path.join(wheel_directory, WHEEL))
    return WHEEL
'''


def silent_source_tree(folder: Path, seconds: float) -> str:
    """``slowpkg``: a source tree whose in-tree build backend is silent for ``seconds``."""
    build_wheel(folder / "prebuilt", "slowpkg", "1.0", {"slowpkg/__init__.py": "SLOW = True\n"})
    (folder / "slowbackend.py").write_text(SLOW_BACKEND.replace("{seconds}", str(seconds)))
    (folder / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "slowbackend"\nbackend-path = ["."]\n\n'
        '[project]\nname = "slowpkg"\nversion = "1.0"\n')
    return f"slowpkg @ {folder.resolve().as_uri()}"


def test_uvs_lines_reach_execute_codes_on_progress_one_by_one_in_order(
        ex: Executor, tmp_path: Path) -> None:
    made = ex.environments.create(three_wheels(tmp_path / "wheels"))
    lines: list[str] = []
    result = ex.execute_code("import alphapkg, betapkg, gammapkg\n"
                             "alphapkg.NAME + betapkg.NAME + gammapkg.NAME",
                             venv_id=made["venv_id"], on_progress=lines.append)
    assert result.get("result") == "'alphapkgbetapkggammapkg'", result
    assert all("\n" not in line for line in lines), lines
    # uv's own words, not only coordex's "===" and "$" lines.
    installed = next(i for i, line in enumerate(lines) if line.startswith("Installed 3 packages"))
    resolved = next(i for i, line in enumerate(lines) if line.startswith("Resolved 3 packages"))
    built = next(i for i, line in enumerate(lines) if line.startswith("=== built in"))
    assert resolved < installed < built, lines
    assert any(line.startswith(" + alphapkg==1.0") for line in lines), lines


def test_a_stateful_calls_build_reports_to_that_call_and_no_later_one(
        ex: Executor, tmp_path: Path) -> None:
    made = ex.environments.create(three_wheels(tmp_path / "wheels"))
    first: list[str] = []
    result = ex.execute_code("import alphapkg; alphapkg.NAME", state_mode="stateful",
                             venv_id=made["venv_id"], on_progress=first.append)
    assert result.get("result") == "'alphapkg'", result
    assert any(line.startswith("Installed 3 packages") for line in first), first
    # The environment is built: a new session there opens without a line to anyone.
    later: list[str] = []
    result = ex.execute_code("1", state_mode="stateful", session_name="other",
                             venv_id=made["venv_id"], on_progress=later.append)
    assert result.get("result") == "1" and later == [], (result, later)


def test_a_silent_build_backend_still_sends_a_line_at_least_every_5_seconds(
        ex: Executor, tmp_path: Path) -> None:
    made = ex.environments.create(silent_source_tree(tmp_path / "slowpkg", 12))
    arrivals: list[tuple[float, str]] = []
    result = ex.execute_code("import slowpkg\nslowpkg.SLOW", venv_id=made["venv_id"],
                             on_progress=lambda line: arrivals.append((time.monotonic(), line)))
    assert result.get("result") == "True", result
    times = [at for at, _ in arrivals]
    assert times[-1] - times[0] >= 12, arrivals
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert max(gaps) < 5.0, (max(gaps), arrivals)
    beats = [line for _, line in arrivals if line.startswith("... still building")]
    assert len(beats) >= 2 and "venv_id=" in beats[0], arrivals
    # The heartbeat is for the caller; the log on disk holds what uv said.
    log = next((ex.root / "logs").glob("build-*.log")).read_text()
    assert "still building" not in log and "slowpkg" in log

