"""A build is checked before it is kept: every requirement's top-level modules import.

Real uv builds, offline, of wheels made on the fly (tests/fakes/wheels.py) whose modules
fail at import the way real packages do.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from coordex.environments import EnvironmentManager
from coordex.environments.builder import import_fix

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fakes.wheels import build_wheel, ledgerlib_wheel, requirement

from .test_environments import env_folders, offline_uv, uv_cache  # noqa: F401 - fixtures

pytestmark = pytest.mark.slow

NUMPY_1_ERROR = ("numpy.dtype size changed, may indicate binary incompatibility. "
                 "Expected 96 from C header, got 88 from PyObject")


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("import-wheels")
    return {
        "good": ledgerlib_wheel(folder, "1.0"),
        "flat": build_wheel(folder, "flat-mod", "1.0", {"flat_mod.py": "VALUE = 1\n"}),
        "broken": build_wheel(folder, "brokenlib", "1.0", {
            "brokenlib/__init__.py": "raise ImportError('brokenlib cannot find its engine')\n"}),
        "numpy1": build_wheel(folder, "oldnumlib", "1.0", {
            "oldnumlib/__init__.py": f"print('loading')\nraise ValueError({NUMPY_1_ERROR!r})\n"}),
        "undeclared": build_wheel(folder, "needy", "1.0", {
            "needy/__init__.py": "import ledgerlib_helpers\n"}),
    }


def test_a_package_that_fails_at_import_is_an_environment_error_and_not_kept(
        tmp_path: Path, wheels: dict[str, Path]) -> None:
    manager = EnvironmentManager(tmp_path)
    created = manager.create(requirement("brokenlib", wheels["broken"]) + "\n"
                             + requirement("ledgerlib", wheels["good"]))
    error = manager.build(created["venv_id"])
    assert error["error_type"] == "environment", error
    assert "import brokenlib (brokenlib): ImportError: brokenlib cannot find its engine" \
        in error["error"]
    assert "'brokenlib'" in error["suggestion"] and error["log"]
    assert env_folders(tmp_path / "envs") == []  # neither the env nor its temp folder
    assert manager.list()["environments"][0]["built"] is False
    assert manager.build(created["venv_id"])["error_type"] == "environment"  # checked again


def test_a_package_built_against_numpy_1_suggests_pinning_numpy(
        tmp_path: Path, wheels: dict[str, Path]) -> None:
    manager = EnvironmentManager(tmp_path)
    error = manager.build(manager.create(requirement("oldnumlib", wheels["numpy1"]))["venv_id"])
    assert error["error_type"] == "environment" and "numpy.dtype size changed" in error["error"]
    assert "'numpy<2'" in error["suggestion"]
    assert "loading" in error["log"]  # what the import printed is in the log, not the error


def test_an_undeclared_dependency_is_named(tmp_path: Path, wheels: dict[str, Path]) -> None:
    manager = EnvironmentManager(tmp_path)
    error = manager.build(manager.create(requirement("needy", wheels["undeclared"]))["venv_id"])
    assert error["error_type"] == "environment"
    assert "'ledgerlib_helpers'" in error["suggestion"]


def test_packages_that_import_are_kept(tmp_path: Path, wheels: dict[str, Path]) -> None:
    manager = EnvironmentManager(tmp_path)
    created = manager.create(requirement("flat-mod", wheels["flat"]) + "\n"
                             + requirement("ledgerlib", wheels["good"])
                             + "\nskipped==1; python_version < '3'")
    built = manager.build(created["venv_id"])
    assert built.get("built") is True, built
    log = "".join(p.read_text() for p in (tmp_path / "logs").glob("*.log"))
    assert "_coordex_import_check.py" in log and "ledgerlib" in log


@pytest.mark.parametrize(("error", "fragment"), [
    (NUMPY_1_ERROR, "numpy<2"),
    ("A module that was compiled using NumPy 1.x cannot be run in NumPy 2.0.2", "numpy<2"),
    ("ModuleNotFoundError: No module named 'six.moves'", "'six'"),
    ("ImportError: libGL.so.1: cannot open shared object file: No such file", "'libGL.so.1'"),
])
def test_known_import_failures_name_their_fix(error: str, fragment: str) -> None:
    fix = import_fix("somepkg", error)
    assert fix is not None and fragment in fix
    assert import_fix("somepkg", "RuntimeError: something else") is None
