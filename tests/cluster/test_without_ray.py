"""Without Ray installed, Executor(cluster=...) says what to install (no cluster needed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

# Runs in a fresh interpreter where ``import ray`` fails, as it does without the extra.
PROBE = """
import sys
sys.modules["ray"] = None
from coordex import Executor
try:
    Executor(root=sys.argv[1], cluster="auto")
except ValueError as exc:
    print("ValueError:", exc)
with Executor(root=sys.argv[1]) as ex:
    print(ex.execute_code("echo 1", language="bash")["stdout"].strip())
"""


def test_a_cluster_without_ray_is_refused_with_the_install_line(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / "home")],
                         capture_output=True, text=True, timeout=50)
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.splitlines()
    assert first.startswith("ValueError: Executor(cluster=...) needs Ray"), first
    assert "pip install 'coordex[ray]'" in first and "cluster=None" in first
    assert second == "1"  # without cluster= nothing needs Ray


def test_a_cluster_address_must_be_text(tmp_path: Path) -> None:
    from coordex import Executor

    with pytest.raises(ValueError, match="Ray address"):
        Executor(root=tmp_path, cluster="")  # type: ignore[arg-type]
