"""Joining a cluster that cannot be joined says what to do, at once (no cluster needed).

Without Ray installed, ``Executor(cluster=...)`` says what to install; an address where
nothing answers is refused within seconds (Ray alone would retry for minutes), from
Python and from ``coordex serve --cluster``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e._procs import child_env, run_cli

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


def test_an_address_where_nothing_answers_is_refused_at_once(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    from coordex import Executor

    with pytest.raises(ValueError) as caught:
        Executor(root=tmp_path, cluster="127.0.0.1:1")
    assert "Could not join the Ray cluster at '127.0.0.1:1'" in str(caught.value)
    assert "ray start --head" in str(caught.value)


def test_serve_with_a_cluster_that_does_not_answer_stops_with_the_reason(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    done = run_cli("serve", "--port", "0", "--cluster", "ray://127.0.0.1:1",
                   env=child_env(tmp_path, COORDEX_TOKEN="t" * 32), timeout=50)
    assert done.returncode == 1, done
    assert "Could not join the Ray cluster at 'ray://127.0.0.1:1'" in done.stderr
