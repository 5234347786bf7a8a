"""Real uv builds of real environments, offline: wheels are made on the fly (tests/fakes)
and installed by file:// URL, with a private uv cache and UV_OFFLINE=1.

What is proved here: two incompatible pins coexist; equal specs share one id and one
build across managers; bad specs and unresolvable requirements come back as errors a
model can act on; two processes build one spec once; a build killed half-way leaves no
half environment and the next build succeeds; the build timeout stops uv.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from coordex.core.errors import CoordexError
from coordex.environments import EnvironmentManager

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fakes.wheels import bulky_wheel, ledgerlib_wheel, requirement

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("wheels")
    return {"ledgerlib1": ledgerlib_wheel(folder, "1.0"),
            "ledgerlib2": ledgerlib_wheel(folder, "2.0"),
            "bulky": bulky_wheel(folder, modules=1500)}


@pytest.fixture(scope="session")
def uv_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("uv-cache")


@pytest.fixture(autouse=True)
def offline_uv(uv_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UV_CACHE_DIR", str(uv_cache))
    monkeypatch.setenv("UV_OFFLINE", "1")
    for name in ("UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_FIND_LINKS", "UV_DEFAULT_INDEX",
                 "UV_INDEX", "VIRTUAL_ENV"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "root"


def run_in(python: Path, code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                          timeout=30, check=False)


def builds_logged(root: Path) -> int:
    return sum(p.read_text().count("=== build of") for p in (root / "logs").glob("*.log"))


def env_folders(envs: Path) -> list[str]:
    return sorted(p.name for p in envs.iterdir() if p.name != ".locks") if envs.exists() else []


# -- two pins, side by side -----------------------------------------------------------------------


def test_two_incompatible_pins_coexist(root: Path, wheels: dict[str, Path]) -> None:
    manager = EnvironmentManager(root)
    one = manager.create(requirement("ledgerlib", wheels["ledgerlib1"]), name="ledger-v1")
    two = manager.create(
        f'# /// script\n# dependencies = ["{requirement("ledgerlib", wheels["ledgerlib2"])}"]'
        "\n# ///\nprint('the script body is not part of the spec')\n")
    assert one["created"] and two["created"] and one["venv_id"] != two["venv_id"]
    assert one["spec_hash"] != two["spec_hash"] and not one["built"]

    progress: list[str] = []
    built = manager.build(one["venv_id"], on_progress=progress.append)
    assert built["built"] and not built["cached"], built
    assert any("ledgerlib==1.0" in line for line in progress), progress
    python1, python2 = manager.python_for(one["venv_id"]), manager.python_for(two["venv_id"])

    v1 = run_in(python1, "import ledgerlib; print(ledgerlib.VERSION, ledgerlib.total([1, 2]))")
    v2 = run_in(python2, "import ledgerlib; print(ledgerlib.VERSION, "
                         "ledgerlib.total([1, 2], currency='EUR'))")
    assert v1.stdout.split() == ["1.0", "3"], v1.stderr
    assert v2.stdout.split() == ["2.0", "3", "EUR"], v2.stderr
    assert "TypeError" in run_in(python2, "import ledgerlib; ledgerlib.total([1])").stderr

    # Content addressed: each env sits in envs/<spec_hash>, and nothing else is left.
    assert env_folders(root / "envs") == sorted([one["spec_hash"], two["spec_hash"]])
    assert manager.env_dir(one["venv_id"]) == root.absolute() / "envs" / one["spec_hash"]
    listed = {e["venv_id"]: e for e in manager.list()["environments"]}
    assert listed[one["venv_id"]]["built"] and listed[one["venv_id"]]["name"] == "ledger-v1"

    # Built under a temporary name then renamed: console scripts and `bash` with the
    # env's bin/ first on PATH must still work (uv venv --relocatable).
    bin_dir = python1.parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "VIRTUAL_ENV": str(bin_dir.parent)}
    shell = subprocess.run(["bash", "--norc", "--noprofile", "-c", "ledger; python -c "
                            "'import sys; print(sys.prefix)'"],
                           capture_output=True, text=True, env=env, timeout=30, check=False)
    assert shell.stdout.split() == ["ledgerlib", "1.0", str(bin_dir.parent)], shell.stderr


# -- one spec, one id, one build ------------------------------------------------------------------


def test_equal_specs_share_an_id_and_are_not_rebuilt(root: Path,
                                                     wheels: dict[str, Path]) -> None:
    line = requirement("ledgerlib", wheels["ledgerlib1"])
    first = EnvironmentManager(root)
    created = first.create(f"# the ledger\n{line}\n")
    first.python_for(created["venv_id"])
    marker = root / "envs" / created["spec_hash"] / ".coordex-built.json"
    stamp = marker.stat().st_mtime_ns

    second = EnvironmentManager(root)  # a new process's view: nothing in memory
    again = second.create(f'[project]\nname = "x"\nversion = "0"\ndependencies = ["{line}"]\n')
    assert again["venv_id"] == created["venv_id"] and again["created"] is False
    assert again["built"] is True
    started = time.perf_counter()
    second.python_for(again["venv_id"])
    first_use = time.perf_counter() - started
    assert first_use < 0.5, first_use  # finds the marker; no uv involved
    timings = []
    for _ in range(200):
        started = time.perf_counter()
        second.python_for(again["venv_id"])
        timings.append(time.perf_counter() - started)
    assert statistics.median(timings) < 0.001, statistics.median(timings)
    assert second.build(again["venv_id"])["cached"] is True
    assert marker.stat().st_mtime_ns == stamp and builds_logged(root) == 1


def test_threads_asking_at_once_build_once(root: Path, wheels: dict[str, Path]) -> None:
    manager = EnvironmentManager(root)
    venv_id = manager.create(requirement("ledgerlib", wheels["ledgerlib2"]))["venv_id"]
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(manager.python_for(venv_id)))
               for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(results) == 4 and len(set(results)) == 1
    assert builds_logged(root) == 1


_BUILD_SCRIPT = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from coordex.environments import EnvironmentManager
    manager = EnvironmentManager(Path(sys.argv[1]))
    print(json.dumps(manager.build(int(sys.argv[2]))), flush=True)
""")


def test_two_processes_build_one_spec_once(root: Path, wheels: dict[str, Path]) -> None:
    venv_id = EnvironmentManager(root).create(
        requirement("bulkylib", wheels["bulky"]))["venv_id"]
    processes = [subprocess.Popen([sys.executable, "-c", _BUILD_SCRIPT, str(root), str(venv_id)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
    outputs = []
    try:
        for process in processes:
            out, err = process.communicate(timeout=60)
            assert process.returncode == 0, err
            outputs.append(json.loads(out))
    finally:
        for process in processes:
            process.kill()
    assert [o["built"] for o in outputs] == [True, True], outputs
    assert sorted(o["cached"] for o in outputs) == [False, True]
    assert outputs[0]["path"] == outputs[1]["path"]
    assert builds_logged(root) == 1


# -- bad specs and failed builds --------------------------------------------------------------


def test_unparseable_spec_is_a_validation_error_naming_the_line(root: Path) -> None:
    error = EnvironmentManager(root).create("ledgerlib==1.0\nledgerlib=2.0\n")
    assert error["error_type"] == "validation"
    assert "Line 2" in error["error"] and "'ledgerlib=2.0'" in error["error"]
    assert "'ledgerlib==2.0'" in error["suggestion"]
    assert EnvironmentManager(root).list() == {"environments": []}


def test_unresolvable_requirement_is_an_environment_error_with_log(root: Path) -> None:
    manager = EnvironmentManager(root)
    created = manager.create("ledgerlib==9.9\nnonexistent-pkg-xyz\n")
    error = manager.build(created["venv_id"])
    assert error["error_type"] == "environment", error
    assert "No solution found" in error["error"]  # uv's resolver reason, quoted
    assert "ledgerlib" in error["suggestion"]
    assert "uv pip install" in error["log"] and "error:" in error["log"]
    with pytest.raises(CoordexError) as caught:
        manager.python_for(created["venv_id"])
    assert caught.value.error_type == "environment" and caught.value.extra["log"]
    assert env_folders(root / "envs") == []  # nothing half-made, no temp folder
    assert list((root / "logs").glob("build-*.log"))


def test_unknown_ids_and_names(root: Path, wheels: dict[str, Path]) -> None:
    manager = EnvironmentManager(root)
    first = manager.create(requirement("ledgerlib", wheels["ledgerlib1"]), name="ledger")
    missing = manager.build(42)
    assert missing["error_type"] == "not_found" and "venv_id=1 ('ledger')" in missing["suggestion"]
    assert manager.build("1")["error_type"] == "validation"  # type: ignore[arg-type]
    with pytest.raises(CoordexError) as caught:
        manager.python_for(42)
    assert caught.value.error_type == "not_found"
    assert manager.env_dir(42) is None and not manager.exists(42) and manager.exists(1)
    taken = manager.create(requirement("ledgerlib", wheels["ledgerlib2"]), name="ledger")
    assert taken["error_type"] == "validation" and "venv_id=1" in taken["suggestion"]
    renamed = manager.create(requirement("ledgerlib", wheels["ledgerlib1"]), name="other")
    assert renamed["venv_id"] == first["venv_id"] and renamed["name"] == "ledger"
    assert "note" in renamed
    assert manager.create("six", name="")["error_type"] == "validation"


def test_requires_python_nobody_has_is_an_environment_error(root: Path) -> None:
    error = EnvironmentManager(root).create("[project]\nrequires-python = '>=3.99'\n")
    assert error["error_type"] == "environment"
    assert "'>=3.99'" in error["error"] and "requires-python" in error["suggestion"]


def test_a_python_planted_above_the_working_folder_is_never_run(
        root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A confined builder works in its environments folder, which may lie beneath the
    # tenant's: a `.venv` there (or VIRTUAL_ENV) must not be a candidate uv runs to ask
    # its version (it would run with the builder's rights).
    planted = tmp_path / ".venv"
    (planted / "bin").mkdir(parents=True)
    (planted / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.99.0\n")
    ran = tmp_path / "ran"
    script = planted / "bin" / "python"
    script.write_text(f"#!/bin/sh\ntouch {ran}\nexit 1\n")
    script.chmod(0o755)
    (planted / "bin" / "python3").symlink_to("python")
    below = tmp_path / "envs"
    below.mkdir()
    monkeypatch.chdir(below)
    monkeypatch.setenv("VIRTUAL_ENV", str(planted))
    error = EnvironmentManager(root).create("[project]\nrequires-python = '>=3.99'\n")
    assert error["error_type"] == "environment", error
    assert not ran.exists()


# -- crashes and timeouts ------------------------------------------------------------------------


def _uv_processes_using(path_fragment: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if path_fragment.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc (Linux)")
def test_build_killed_half_way_leaves_no_half_env(root: Path, wheels: dict[str, Path]) -> None:
    created = EnvironmentManager(root).create(requirement("bulkylib", wheels["bulky"]))
    envs = root / "envs"
    builder = subprocess.Popen(
        [sys.executable, "-c", _BUILD_SCRIPT, str(root), str(created["venv_id"])],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not any(n.startswith(".tmp-") for n in env_folders(envs)):
            assert time.monotonic() < deadline and builder.poll() is None, "build never began"
            time.sleep(0.002)
        os.kill(builder.pid, signal.SIGKILL)  # a crash mid-build
        builder.wait(timeout=10)
    finally:
        builder.kill()
    # uv ran in its own session, so it outlives the killed builder until its next write
    # to the closed pipe; let such orphans finish so the checks below are deterministic.
    deadline = time.monotonic() + 20
    while _uv_processes_using(f".tmp-{created['spec_hash']}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert created["spec_hash"] not in env_folders(envs)  # no half env under the real name
    manager = EnvironmentManager(root)
    assert manager.list()["environments"][0]["built"] is False

    rebuilt = manager.build(created["venv_id"])
    assert rebuilt["built"] and not rebuilt["cached"], rebuilt
    assert env_folders(envs) == [created["spec_hash"]]  # the leftover temp folder is gone
    assert run_in(manager.python_for(created["venv_id"]), "import bulkylib").returncode == 0


def test_build_timeout_stops_uv_and_keeps_nothing(root: Path, wheels: dict[str, Path]) -> None:
    manager = EnvironmentManager(root, build_timeout=0.05)
    created = manager.create(requirement("bulkylib", wheels["bulky"]) + "\nledgerlib==1.0")
    error = manager.build(created["venv_id"])
    assert error["error_type"] == "environment" and "build_timeout=0.05s" in error["error"]
    assert "build_timeout" in error["suggestion"] and "log" in error
    assert env_folders(root / "envs") == []


def test_remove_unused_deletes_stale_folders_only(root: Path, wheels: dict[str, Path]) -> None:
    manager = EnvironmentManager(root)
    kept = manager.create(requirement("ledgerlib", wheels["ledgerlib1"]))
    manager.python_for(kept["venv_id"])
    (root / "envs" / ("0" * 64)).mkdir()
    (root / "envs" / f".tmp-{'1' * 64}-123-abcd").mkdir()
    result = manager.remove_unused()
    assert sorted(result["removed"]) == sorted([".tmp-" + "1" * 64 + "-123-abcd", "0" * 64])
    assert env_folders(root / "envs") == [kept["spec_hash"]]

    shared = EnvironmentManager(root / "tenant", envs_dir=root / "envs")
    assert shared.remove_unused()["kept_shared"] is True
    assert env_folders(root / "envs") == [kept["spec_hash"]]


def test_tenants_share_built_folders(root: Path, wheels: dict[str, Path]) -> None:
    shared = root / "shared-envs"
    line = requirement("ledgerlib", wheels["ledgerlib2"])
    alice = EnvironmentManager(root / "alice", envs_dir=shared)
    bob = EnvironmentManager(root / "bob", envs_dir=shared)
    a, b = alice.create(line), bob.create(f"{line}\n")
    assert a["spec_hash"] == b["spec_hash"]
    assert alice.build(a["venv_id"])["cached"] is False
    assert bob.build(b["venv_id"])["cached"] is True


# -- a real registry -------------------------------------------------------------------------------


@pytest.mark.network
def test_small_registry_package(root: Path, tmp_path: Path,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("UV_OFFLINE")
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "net-cache"))
    manager = EnvironmentManager(root)
    created = manager.create("# /// script\n# dependencies = ['six==1.16.0']\n# ///\n")
    built = manager.build(created["venv_id"])
    assert built.get("built"), built
    assert run_in(manager.python_for(created["venv_id"]),
                  "import six; print(six.__version__)").stdout.strip() == "1.16.0"

