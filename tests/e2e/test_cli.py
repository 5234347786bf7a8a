"""The ``coordex`` command line, run as a real process: help, exit codes, env, demo."""

from __future__ import annotations

from pathlib import Path

import pytest

from coordex import __version__

from ._procs import child_env, run_cli

pytestmark = pytest.mark.timeout(120)


def test_help_lists_every_subcommand(tmp_path: Path) -> None:
    done = run_cli("--help", env=child_env(tmp_path))
    assert done.returncode == 0
    for command in ("mcp", "serve", "demo", "env", "functions", "version"):
        assert command in done.stdout
    env_help = run_cli("env", "--help", env=child_env(tmp_path))
    assert env_help.returncode == 0
    for action in ("list", "build", "remove-unused"):
        assert action in env_help.stdout


def test_version(tmp_path: Path) -> None:
    done = run_cli("version", env=child_env(tmp_path))
    assert done.returncode == 0 and done.stdout.strip() == f"coordex {__version__}"


@pytest.mark.parametrize("argv", [
    (), ("bogus",), ("env",), ("env", "build", "not-a-number"), ("serve", "--port", "99999"),
    ("functions", "show"),
])
def test_usage_errors_exit_2(tmp_path: Path, argv: tuple[str, ...]) -> None:
    done = run_cli(*argv, env=child_env(tmp_path))
    assert done.returncode == 2, done
    assert "usage:" in done.stderr


def test_env_list_on_a_fresh_home(tmp_path: Path) -> None:
    done = run_cli("env", "list", env=child_env(tmp_path / "home"))
    if "no environment support" in done.stderr:
        pytest.skip("this build has no environments yet")
    assert done.returncode == 0, done.stderr
    as_json = run_cli("env", "list", "--json", env=child_env(tmp_path / "home"))
    assert as_json.returncode == 0 and '"environments"' in as_json.stdout


def test_env_build_of_an_unknown_id_fails_with_a_suggestion(tmp_path: Path) -> None:
    done = run_cli("env", "build", "7", env=child_env(tmp_path / "home"))
    if "no environment support" in done.stderr:
        pytest.skip("this build has no environments yet")
    assert done.returncode == 1
    assert "not_found" in done.stderr and "suggestion:" in done.stderr


def test_functions_list_on_a_fresh_home(tmp_path: Path) -> None:
    done = run_cli("functions", "list", env=child_env(tmp_path / "home"))
    if "no stored-function library" in done.stderr:
        pytest.skip("this build has no library yet")
    assert done.returncode == 0, done.stderr


@pytest.mark.timeout(600)
def test_demo_runs_clean_in_a_fresh_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    done = run_cli("demo", env=child_env(home), timeout=540)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    for marker in ("1. bash", "2. python", "3. python", "6. a wrong coordinate", "summary"):
        assert marker in done.stdout
    assert "FAILED" not in done.stdout
    assert "Did you mean session_name='audit'" in done.stdout
    assert home.is_dir()  # the demo used the COORDEX_HOME it was given
    # The read-only step: counts before and after, and what stateful would have cost.
    assert "session 'audit' before: 3000 ledger rows, 6 account totals" in done.stdout
    assert "session 'audit' after: 3000 ledger rows, 6 account totals" in done.stdout
    assert ("would have cost the session 2990 of its 3000 ledger rows (and their order) "
            "and all 6 account totals") in done.stdout
    # The stored function: its source, and its effect after the stateful run.
    assert "    | def mark_reviewed(limit):" in done.stdout and "noqa" not in done.stdout
    assert "['T00000', 'T00001', 'T00002', 'T00003', 'T00004']" in done.stdout
