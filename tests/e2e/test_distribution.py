"""The wheels a clean checkout builds install and run as the docs say.

Both distributions are built with ``uv build --wheel`` from a copy of the checkout
holding only what git would commit (nothing ignored, no build leftovers): ``coordex`` from
the checkout's root, ``coordex-slim`` from ``packages/coordex-slim`` (the same source
tree). Then: the library alone in a fresh environment (the Executor runs; the MCP SDK is
absent and never imported; ``coordex demo`` runs), the full wheel in another (``coordex
demo`` runs), ``uvx`` from the wheel and from the checkout, the desktop bundle's entry
as its manifest starts it, and ``pip install .`` of the checkout then ``coordex mcp`` —
each server listed through the official MCP client.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

import coordex
from coordex.tools import TOOL_NAMES

from ._procs import child_env

ROOT = Path(__file__).resolve().parents[2]
VERSION = coordex.__version__

pytestmark = [pytest.mark.slow, pytest.mark.network, pytest.mark.timeout(600)]


def _run(args: list[str], env: dict[str, str], timeout: float = 300,
         cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, cwd=cwd)


def _clean_copy(target: Path) -> Path:
    """The checkout as a clone of it would hold it: tracked and new files, none ignored."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        source, copy = ROOT / name, target / name
        if not source.is_symlink() and not source.exists():
            continue  # deleted in the working tree, not yet committed
        copy.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            os.symlink(os.readlink(source), copy)
        else:
            shutil.copy2(source, copy)
    return target


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    return _clean_copy(tmp_path_factory.mktemp("clone"))


@pytest.fixture(scope="module")
def wheelhouse(checkout: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    house = tmp_path_factory.mktemp("wheels")
    env = child_env(tmp_path_factory.mktemp("home"))
    for project in (checkout, checkout / "packages" / "coordex-slim"):
        built = _run(["uv", "build", "--wheel", "-o", str(house), str(project)], env)
        assert built.returncode == 0, built.stderr
    names = sorted(p.name for p in house.glob("*.whl"))
    assert names == [f"coordex-{VERSION}-py3-none-any.whl",
                     f"coordex_slim-{VERSION}-py3-none-any.whl"]
    return house


def _venv(where: Path, wheelhouse: Path, package: str, env: dict[str, str]) -> Path:
    made = _run(["uv", "venv", "-q", "--python", sys.executable, str(where)], env)
    assert made.returncode == 0, made.stderr
    python = where / "bin" / "python"
    installed = _run(["uv", "pip", "install", "-q", "--python", str(python),
                      "--find-links", str(wheelhouse), package], env)
    assert installed.returncode == 0, installed.stderr
    return python


def _listed_tools(command: str, args: list[str], env: dict[str, str]) -> list[str]:
    params = StdioServerParameters(command=command, args=args, env=env)

    async def main() -> list[str]:
        with anyio.fail_after(240):
            async with stdio_client(params) as (read, write), \
                    ClientSession(read, write) as session:
                await session.initialize()
                return [tool.name for tool in (await session.list_tools()).tools]

    return anyio.run(main)


LIBRARY_ONLY = """
import importlib.util, sys
import coordex
with coordex.Executor(root=sys.argv[1]) as ex:
    assert ex.execute_code("6 * 7")["result"] == "42"
    ran = ex.execute_code("x=1; echo $x", language="bash", state_mode="stateful")
    assert ran["stdout"] == "1\\n", ran
    assert ex.call_tool("execute_code", '{"code": "2 ** 10"}')["result"] == "1024"
    assert len(ex.tool_definitions("mcp")) > 0
assert importlib.util.find_spec("mcp") is None
server = sorted({m.split(".")[0] for m in sys.modules} & {"mcp", "anyio", "starlette", "uvicorn"})
assert not server, server
print("library ok")
"""


def test_the_library_alone_runs_without_the_mcp_sdk(wheelhouse: Path, tmp_path: Path) -> None:
    env = child_env(tmp_path / "home")
    python = _venv(tmp_path / "venv", wheelhouse, "coordex-slim", env)
    ran = _run([str(python), "-c", LIBRARY_ONLY, str(tmp_path / "root")], env)
    assert ran.returncode == 0 and "library ok" in ran.stdout, ran.stderr
    server = _run([str(python.with_name("coordex")), "mcp"], env, timeout=60)
    assert server.returncode == 1
    assert "pip install coordex" in server.stderr and "coordex-slim[mcp]" in server.stderr
    assert server.stdout == ""  # nothing on the MCP wire
    # The library alone runs the CLI's other commands.
    demo = _run([str(python.with_name("coordex")), "demo"], env, cwd=tmp_path)
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]


def test_the_server_wheel_installs_in_a_fresh_venv_and_runs_the_demo(
        wheelhouse: Path, tmp_path: Path) -> None:
    env = child_env(tmp_path / "home")
    python = _venv(tmp_path / "venv", wheelhouse, "coordex", env)
    demo = _run([str(python.with_name("coordex")), "demo"], env, cwd=tmp_path)
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]
    version = _run([str(python), "-c", "import mcp, coordex; print(coordex.__version__)"], env)
    assert version.stdout.strip() == VERSION


def test_uvx_runs_the_server_from_the_wheel(wheelhouse: Path, tmp_path: Path) -> None:
    wheel = wheelhouse / f"coordex-{VERSION}-py3-none-any.whl"
    tools = _listed_tools("uvx", ["--find-links", str(wheelhouse), "--from", str(wheel),
                                  "coordex", "mcp"], child_env(tmp_path / "home"))
    assert tools == list(TOOL_NAMES)


def test_pip_install_of_a_checkout_then_coordex_mcp_is_one_step(
        checkout: Path, tmp_path: Path) -> None:
    # The README's first command installs the checkout (`pip install .`); its `coordex mcp`
    # serves at once, with no extra named.
    env = child_env(tmp_path / "home")
    made = _run(["uv", "venv", "-q", "--python", sys.executable, str(tmp_path / "venv")], env)
    assert made.returncode == 0, made.stderr
    python = tmp_path / "venv" / "bin" / "python"
    installed = _run(["uv", "pip", "install", "-q", "--python", str(python), str(checkout)], env)
    assert installed.returncode == 0, installed.stderr
    tools = _listed_tools(str(python.with_name("coordex")), ["mcp"], env)
    assert tools == list(TOOL_NAMES)


def test_uvx_runs_the_cli_from_a_checkout(checkout: Path, tmp_path: Path) -> None:
    ran = _run(["uvx", "--from", str(checkout), "coordex", "--help"],
               child_env(tmp_path / "home"))
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("usage: coordex") and "mcp" in ran.stdout


def test_the_desktop_bundle_entry_answers_tools_list(
        checkout: Path, wheelhouse: Path, tmp_path: Path) -> None:
    bundle = shutil.copytree(checkout / "mcpb", tmp_path / "bundle")
    _bundle_answers_tools_list(bundle, wheelhouse, tmp_path)


# The official bundle tool, from the npm registry (its major version: the manifest's
# format is held by it).
MCPB = "@anthropic-ai/mcpb@2"


def test_the_desktop_bundle_packs_with_the_official_tool_and_runs_from_the_archive(
        checkout: Path, wheelhouse: Path, tmp_path: Path) -> None:
    """``mcpb validate`` passes on the manifest; ``mcpb pack`` makes an archive holding
    the manifest, the project and the entry point, and nothing else; unpacked, the
    archive's entry starts as its manifest says and answers ``tools/list``."""
    import zipfile

    npx = shutil.which("npx")
    if npx is None:
        pytest.skip("npx (Node.js) is not installed: the bundle is packed with " + MCPB)
    env = child_env(tmp_path / "npx-home")
    checked = _run([npx, "-y", MCPB, "validate", str(checkout / "mcpb" / "manifest.json")],
                   env, cwd=tmp_path)
    assert checked.returncode == 0 and "validation passes" in checked.stdout, checked
    archive = tmp_path / "out" / f"coordex-{VERSION}.mcpb"
    packed = _run([npx, "-y", MCPB, "pack", str(checkout / "mcpb"), str(archive)], env,
                  cwd=tmp_path)
    assert packed.returncode == 0, packed.stdout + packed.stderr
    with zipfile.ZipFile(archive) as bundle:
        assert sorted(bundle.namelist()) == ["manifest.json", "pyproject.toml", "server/main.py"]
        manifest = json.loads(bundle.read("manifest.json"))
        assert manifest == json.loads((checkout / "mcpb" / "manifest.json").read_text())
        assert manifest["server"]["entry_point"] in bundle.namelist()
        bundle.extractall(tmp_path / "unpacked")
    _bundle_answers_tools_list(tmp_path / "unpacked", wheelhouse, tmp_path)


def _bundle_answers_tools_list(bundle: Path, wheelhouse: Path, tmp_path: Path) -> None:
    """Start ``bundle``'s server as a desktop host would (its manifest's command, the
    user settings at their defaults) and list its tools through the MCP client."""
    manifest = json.loads((bundle / "manifest.json").read_text())
    config = manifest["server"]["mcp_config"]
    home = tmp_path / "user"
    defaults = {f"${{user_config.{key}}}": str(option["default"]).replace("${HOME}", str(home))
                for key, option in manifest["user_config"].items()}

    def filled(text: str) -> str:
        text = text.replace("${__dirname}", str(bundle))
        for mark, value in defaults.items():
            text = text.replace(mark, value)
        return text

    env = child_env(home, UV_FIND_LINKS=str(wheelhouse))
    env.update({key: filled(value) for key, value in config["env"].items()})
    tools = _listed_tools(config["command"], [filled(a) for a in config["args"]], env)
    assert tools == list(TOOL_NAMES)
    assert (home / ".coordex").is_dir()  # the data folder the user's setting names
