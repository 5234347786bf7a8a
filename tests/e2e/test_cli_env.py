"""``coordex env``: create an environment, show what it holds, and list without side effects."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fakes.wheels import build_wheel, requirement

from ._procs import child_env, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def test_env_list_of_a_missing_data_folder_creates_nothing(tmp_path: Path) -> None:
    home = tmp_path / "nowhere"
    done = run_cli("env", "list", "--home", str(home), env=child_env(home))
    assert done.returncode == 0, done.stderr
    assert "No environments yet" in done.stdout
    assert not home.exists()


def test_env_create_from_text_or_a_file_then_show_its_packages(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = child_env(home)
    wheel = build_wheel(tmp_path / "wheels", "tinypkg", "1.0", {"tinypkg/__init__.py": "X = 1\n"})
    made = run_cli("env", "create", requirement("tinypkg", wheel), "--name", "tiny", env=env)
    assert made.returncode == 0, made.stderr
    created = json.loads(made.stdout)
    assert created["venv_id"] == 1 and created["name"] == "tiny" and created["created"]
    # A file holding the same spec is the same environment.
    spec_file = tmp_path / "requirements.txt"
    spec_file.write_text(requirement("tinypkg", wheel) + "\n")
    again = run_cli("env", "create", str(spec_file), env=env)
    assert again.returncode == 0 and json.loads(again.stdout)["venv_id"] == 1, again.stderr
    before = run_cli("env", "show", "1", env=env)
    assert before.returncode == 0, before.stderr
    assert "built: no" in before.stdout and "tinypkg" in before.stdout
    assert run_cli("env", "build", "1", env=env).returncode == 0
    shown = run_cli("env", "show", "1", "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    record = json.loads(shown.stdout)
    assert record["built"] is True and record["name"] == "tiny"
    assert {"name": "tinypkg", "version": "1.0"} in record["packages"]
    assert run_cli("env", "show", "1", env=env).stdout.count("tinypkg==1.0") == 1


def test_env_show_and_build_of_an_unknown_id_say_which_exist(tmp_path: Path) -> None:
    env = child_env(tmp_path / "home")
    for action in ("show", "build"):
        done = run_cli("env", action, "9", env=env)
        assert done.returncode == 1
        assert "No environment with venv_id=9" in done.stderr
        assert "building" not in done.stderr
