"""Build settings that reach uv however coordex was started (SPEC 5).

MCP clients start ``coordex mcp`` with a handful of variables (HOME, PATH, ...): an
index, a wheelhouse, proxies or a certificate bundle set in the user's shell never
arrive. ``root/coordex.toml`` ``[build.env]`` carries them; a build that fails for a
cause outside the spec (TLS, an index that cannot be reached) says so and names the
setting, and never tells the model to change a spec that is fine.
"""

from __future__ import annotations

import http.server
import shutil
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from coordex import Executor
from tests.fakes.wheels import build_wheel

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def tinypkg_wheelhouse(folder: Path) -> Path:
    build_wheel(folder, "tinypkg", "1.0", {"tinypkg/__init__.py": "VALUE = 'from the wheelhouse'\n"})
    return folder


def write_settings(root: Path, env: dict[str, str]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    lines = "".join(f"{key} = {value!r}\n".replace("'", '"') for key, value in env.items())
    (root / "coordex.toml").write_text(f"[build.env]\n{lines}", encoding="utf-8")


def test_mcp_started_with_a_clients_environment_builds_from_a_wheelhouse_in_coordex_toml(
        tmp_path: Path) -> None:
    """The SDK's stdio client passes only HOME, PATH and a few more (as desktop clients
    do); the wheelhouse named in coordex.toml is what uv resolves ``tinypkg`` from."""
    root = tmp_path / "home"
    wheels = tinypkg_wheelhouse(tmp_path / "wheels")
    write_settings(root, {"UV_FIND_LINKS": str(wheels), "UV_NO_INDEX": "1"})
    # env=None: the SDK's own default environment for servers, as a desktop client has.
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "coordex", "mcp", "--home", str(root)])
    seen: dict[str, Any] = {}

    async def main() -> None:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            with anyio.fail_after(150):
                made = await session.call_tool("create_environment", {"spec": "tinypkg==1.0"})
                seen["made"] = made.structured_content
                assert isinstance(made.structured_content, dict)
                ran = await session.call_tool("execute_code", {
                    "code": "import tinypkg\ntinypkg.VALUE",
                    "venv_id": made.structured_content["venv_id"]})
                seen["ran"] = ran.structured_content

    anyio.run(main)
    assert "venv_id" in seen["made"], seen["made"]
    assert seen["ran"].get("result") == "'from the wheelhouse'", seen["ran"]


def test_a_confined_tenant_builds_with_the_servers_coordex_toml(tmp_path: Path) -> None:
    """``coordex mcp --confine DIR``: the jail's builder reads the server's coordex.toml,
    and the wheelhouse it names (outside the jail's view otherwise) is shown read-only."""
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="coordex-settings-", dir="/var/tmp"))
    try:
        root = base / "home"
        wheels = tinypkg_wheelhouse(base / "wheels")
        write_settings(root, {"UV_FIND_LINKS": str(wheels), "UV_NO_INDEX": "1"})
        params = StdioServerParameters(command=sys.executable, args=[
            "-m", "coordex", "mcp", "--home", str(root), "--confine", str(base / "work")])
        seen: dict[str, Any] = {}

        async def main() -> None:
            async with stdio_client(params) as (read, write), \
                    ClientSession(read, write) as session:
                await session.initialize()
                with anyio.fail_after(150):
                    made = await session.call_tool("create_environment", {"spec": "tinypkg==1.0"})
                    assert isinstance(made.structured_content, dict)
                    seen["made"] = made.structured_content
                    ran = await session.call_tool("execute_code", {
                        "code": "import tinypkg, os\n(tinypkg.VALUE, os.listdir("
                                f"{str(wheels)!r}) != [], sorted(os.listdir({str(root)!r})))",
                        "venv_id": made.structured_content["venv_id"]})
                    seen["ran"] = ran.structured_content

        anyio.run(main)
        assert "venv_id" in seen["made"], seen["made"]
        # Of the server's root, only the way to the tenant's own environments and records.
        assert seen["ran"].get("result") == (
            "('from the wheelhouse', True, ['environments', 'records'])"), seen["ran"]
    finally:
        shutil.rmtree(base, ignore_errors=True)


# -- failures outside the spec ------------------------------------------------------------


@pytest.fixture
def https_index(tmp_path: Path) -> Iterator[str]:
    """An HTTPS index on loopback whose certificate no trust store holds."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed (it makes the index's certificate)")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                    str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             http.server.SimpleHTTPRequestHandler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/simple"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def build_error(root: Path) -> dict[str, Any]:
    with Executor(root=root) as ex:
        made = ex.environments.create("tinypkg==1.0")
        assert "venv_id" in made, made
        return ex.environments.build(made["venv_id"])


def test_a_tls_failure_is_worded_as_tls_and_names_the_setting(tmp_path: Path,
                                                                https_index: str) -> None:
    root = tmp_path / "home"
    write_settings(root, {"UV_INDEX_URL": https_index, "UV_HTTP_RETRIES": "0"})
    failed = build_error(root)
    assert failed["error_type"] == "environment", failed
    assert "certificate" in failed["error"].lower() or "tls" in failed["error"].lower(), failed
    assert "SSL_CERT_FILE" in failed["suggestion"], failed
    assert "coordex.toml" in failed["suggestion"], failed
    assert "spec is fine" in failed["suggestion"], failed
    assert "Change the requirement" not in failed["suggestion"], failed


def test_an_unreachable_index_is_worded_as_the_network_and_names_the_settings(
        tmp_path: Path) -> None:
    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    root = tmp_path / "home"
    write_settings(root, {"UV_INDEX_URL": f"http://127.0.0.1:{port}/simple",
                          "UV_HTTP_RETRIES": "0"})
    failed = build_error(root)
    assert failed["error_type"] == "environment", failed
    assert "could not reach" in failed["error"].lower(), failed
    for setting in ("HTTPS_PROXY", "UV_INDEX_URL", "coordex.toml"):
        assert setting in failed["suggestion"], failed
    assert "Change the requirement" not in failed["suggestion"], failed


def test_a_malformed_coordex_toml_is_a_validation_error_naming_the_file(tmp_path: Path) -> None:
    root = tmp_path / "home"
    root.mkdir()
    (root / "coordex.toml").write_text("[build.env]\nUV_INDEX_URL = https://x\n", encoding="utf-8")
    with Executor(root=root) as ex:
        made = ex.environments.create("tinypkg==1.0")
    assert made["error_type"] == "validation", made
    assert "coordex.toml" in made["error"], made
    assert "line 2" in made["error"], made
