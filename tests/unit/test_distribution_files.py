"""What the package says about itself agrees everywhere it is said.

The README, the two distributions' ``pyproject.toml`` files (``coordex`` at the
checkout's root, ``coordex-slim`` in ``packages/coordex-slim``), ``server.json`` (the MCP
registry's entry), the desktop bundle's manifest and ``.ci/run`` each name the version,
the package, the command or the install line; these tests keep them in step with the
code and with each other.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the tomli backport on 3.10
    import tomli as tomllib

import coordex
from coordex.mcp_hello import HANDSHAKE_VERSIONS
from coordex.tools import TOOL_NAMES

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
SLIM_DIR = ROOT / "packages" / "coordex-slim"
FULL_TOML = tomllib.loads((ROOT / "pyproject.toml").read_text())
SLIM_TOML = tomllib.loads((SLIM_DIR / "pyproject.toml").read_text())
FULL, SLIM = FULL_TOML["project"], SLIM_TOML["project"]
SERVER = json.loads((ROOT / "server.json").read_text())
BUNDLE = json.loads((ROOT / "mcpb" / "manifest.json").read_text())
BUNDLE_PROJECT = tomllib.loads((ROOT / "mcpb" / "pyproject.toml").read_text())


def test_the_readme_is_short() -> None:
    assert len(README.splitlines()) <= 150


def test_one_version_everywhere() -> None:
    version = coordex.__version__
    assert FULL["version"] == version
    # coordex-slim reads coordex.__version__ from the same source tree.
    assert SLIM["dynamic"] == ["version"] and "version" not in SLIM
    assert SLIM_TOML["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "coordex.__version__"}
    assert SERVER["version"] == SERVER["packages"][0]["version"] == version
    assert BUNDLE["version"] == version
    assert BUNDLE_PROJECT["project"]["dependencies"] == [f"coordex=={version}"]


def test_the_readme_test_command_is_what_ci_installs() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    installed = re.findall(r"pip install --quiet -e '\.\[([\w,]+)\]'", ci)
    shown = re.findall(r"pip install -e '\.\[([\w,]+)\]' && pytest", README)
    assert installed and shown == installed
    assert re.search(r"^pytest$", ci, re.M)
    assert "sphinx-build -W --keep-going -n" in ci


def test_the_readme_names_the_mcp_revisions_served() -> None:
    import mcp.types

    served = set(HANDSHAKE_VERSIONS) | {mcp.types.LATEST_PROTOCOL_VERSION}
    named = set(re.findall(r"\b20\d\d-\d\d-\d\d\b", README.split("## Two commands")[0]))
    assert {"2025-06-18", "2025-11-25", "2026-07-28"} <= named <= served


def test_the_registry_entry_names_this_package() -> None:
    assert SERVER["$schema"].endswith("/schemas/2025-12-11/server.schema.json")
    assert len(SERVER["description"]) <= 100
    found = re.search(r"mcp-name: (\S+)", README)
    assert found is not None and found.group(1) == SERVER["name"]
    [package] = SERVER["packages"]
    assert package["registryType"] == "pypi" and package["identifier"] == FULL["name"]
    assert package["runtimeHint"] == "uvx" and package["transport"] == {"type": "stdio"}
    assert [a["value"] for a in package["packageArguments"]] == ["mcp"]


def test_the_bundle_runs_its_entry_with_uv() -> None:
    server = BUNDLE["server"]
    assert BUNDLE["manifest_version"] == "0.4" and server["type"] == "uv"
    assert (ROOT / "mcpb" / server["entry_point"]).is_file()
    config = server["mcp_config"]
    assert config["command"] == "uv"
    assert config["args"] == ["run", "--directory", "${__dirname}", server["entry_point"]]
    # Shown before install: every tool, in the server's order (a new tool adds a line).
    assert [tool["name"] for tool in BUNDLE["tools"]] == list(TOOL_NAMES)
    assert set(re.findall(r"\$\{user_config\.(\w+)\}", json.dumps(config))) <= set(
        BUNDLE["user_config"])


def test_a_checkout_installs_the_server() -> None:
    # `pip install .` then `coordex mcp`, one step: the root is `coordex`, with the MCP SDK.
    assert FULL["name"] == "coordex" and SLIM["name"] == "coordex-slim"
    assert "mcp>=2.3,<3" in FULL["dependencies"]
    assert not any("coordex" in d for extra in FULL["optional-dependencies"].values()
                   for d in extra)  # no self-reference: the test extra needs no [mcp]
    assert FULL["scripts"] == SLIM["scripts"] == {"coordex": "coordex.cli:main"}


def test_the_slim_distribution_is_the_library_without_the_mcp_sdk() -> None:
    assert not any(d.startswith("mcp") for d in SLIM["dependencies"])
    assert SLIM["dependencies"] == [d for d in FULL["dependencies"] if not d.startswith("mcp")]
    assert sorted(SLIM["optional-dependencies"]) == ["eval", "mcp", "ray"]
    for extra, needs in SLIM["optional-dependencies"].items():
        assert needs == FULL["optional-dependencies"][extra], extra
    assert SLIM["optional-dependencies"]["mcp"] == [
        d for d in FULL["dependencies"] if d.startswith("mcp")]


def test_the_slim_distribution_is_built_from_the_same_source_tree() -> None:
    tool = SLIM_TOML["tool"]["setuptools"]
    assert tool["package-dir"] == {"": "../../src"}
    assert tool["packages"]["find"]["where"] == ["../../src"]
    assert (SLIM_DIR / tool["package-dir"][""] / "coordex" / "__init__.py").resolve() == (
        ROOT / "src" / "coordex" / "__init__.py")
    assert tool["package-data"] == FULL_TOML["tool"]["setuptools"]["package-data"]
    assert SLIM["requires-python"] == FULL["requires-python"]


def test_the_licence_travels_with_both_wheels() -> None:
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    assert (SLIM_DIR / "LICENSE").resolve() == (ROOT / "LICENSE")
    for project in (SLIM, FULL):
        assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
        assert project["urls"]["Repository"] and project["classifiers"] and project["keywords"]


def test_the_changelog_is_in_the_docs() -> None:
    assert (ROOT / "CHANGELOG.md").read_text().startswith("# Changelog")
    assert "../CHANGELOG.md" in (ROOT / "docs" / "changelog.md").read_text()


def test_a_library_install_says_how_to_add_the_server(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import importlib.util

    from coordex import cli

    assert cli.missing_server_sdk() is None  # the test environment has the server
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "mcp" else real(name, *a))
    why = cli.missing_server_sdk()
    assert why is not None and "pip install coordex" in why and "coordex-slim[mcp]" in why
    monkeypatch.undo()


def test_an_mcp_sdk_too_old_for_the_server_is_named(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import importlib.metadata

    from coordex import cli

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: "1.26.0" if name == "mcp" else real(name))
    why = cli.missing_server_sdk()
    assert why is not None and "is version 1.26.0" in why
