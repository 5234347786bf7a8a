"""Spilled output as MCP resources (SPEC 14): a client that follows a result's
``resource_link`` with ``resources/read`` gets the whole file, through the official SDK
client over stdio and HTTP (both eras); anything else - another tenant's file, a path
outside the spill folder, a link a session planted there - is not found.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from ._procs import child_env, spawn
from .test_mcp_eras import READY, connect, run, structured
from .test_mcp_eras import http_server as http_server  # the fixture, by its name

pytestmark = pytest.mark.timeout(180)

ROWS = 40000
BIG = f"print('\\n'.join(f'row {{i}}' for i in range({ROWS})))\n'v' * 100000"


async def spilled(client: Client, session: str = "big") -> dict[str, Any]:
    """A call whose output and value do not fit: its record and its resource links."""
    result = await client.call_tool("execute_code", {"code": BIG, "state_mode": "stateful",
                                                     "session_name": session})
    record = structured(result)
    links = {item.name.removesuffix(".txt"): str(item.uri) for item in result.content
             if item.type == "resource_link"}
    assert set(links) == {"stdout", "result"}, result.content
    return {"record": record, "links": links}


async def read_text(client: Client, uri: str) -> str:
    found = await client.read_resource(uri)
    assert len(found.contents) == 1 and found.contents[0].mime_type == "text/plain"
    text = getattr(found.contents[0], "text", None)
    assert isinstance(text, str), found
    return text


async def refused(client: Client, uri: str) -> None:
    with pytest.raises(Exception, match=r"(?i)not found|no spilled file|not the uri"):
        await client.read_resource(uri)


async def follows_links(client: Client) -> None:
    got = await spilled(client)
    stdout = (await read_text(client, got["links"]["stdout"])).splitlines()
    assert len(stdout) == ROWS and stdout[-1] == f"row {ROWS - 1}"
    assert await read_text(client, got["links"]["result"]) == "'" + "v" * 100000 + "'"
    folder = Path(got["record"]["spilled"]["stdout"]).parent
    # Nothing but a spilled file is read: not a file beside the folder, not one reached
    # by '..', not a link a session planted in the folder.
    secret = folder.parent.parent / "secret.txt"
    structured(await client.call_tool("execute_code", {
        "code": f"import os\nopen({str(secret)!r}, 'w').write('s3cret')\n"
                f"os.symlink({str(secret)!r}, {str(folder / 'planted.txt')!r})",
        "state_mode": "stateful", "session_name": "big"}))
    await refused(client, secret.as_uri())
    await refused(client, (folder / "planted.txt").as_uri())
    await refused(client, folder.as_uri() + "/../../secret.txt")
    await refused(client, "https://example.com/x")
    # A closed session's files are gone with it.
    structured(await client.call_tool("close_session", {"session_name": "big"}))
    await refused(client, got["links"]["stdout"])


def test_a_spilled_file_is_read_through_its_link_over_stdio(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the server works (and spills) in the client's folder

    async def body() -> None:
        async with connect(tmp_path / "home", "auto") as client:
            await follows_links(client)

    run(body)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_a_spilled_file_is_read_through_its_link_over_http(http_server: Any, mode: str) -> None:
    _, url = http_server

    async def body() -> None:
        async with connect(url, mode) as client:
            await follows_links(client)

    run(body)


@asynccontextmanager
async def as_tenant(url: str, token: str) -> AsyncIterator[Client]:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with http, Client(streamable_http_client(url, http_client=http),
                            mode="legacy") as client:
        yield client


def test_a_tenant_reads_its_own_spilled_files_and_no_other(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.txt"
    alice, bob = "alice-token-0123456789", "bob-token-0123456789"
    tokens.write_text(f"alice {alice}\nbob {bob}\n")
    os.chmod(tokens, 0o600)
    work = tmp_path / "work"
    work.mkdir()
    env = child_env(tmp_path / "home", COORDEX_TOKEN=None)
    with spawn("serve", "--port", "0", "--tokens", str(tokens), env=env, cwd=work) as running:
        url = running.wait_for(READY).group(1)

        async def body() -> None:
            async with as_tenant(url, alice) as client:
                got = await spilled(client)
                lines = (await read_text(client, got["links"]["stdout"])).splitlines()
                assert lines[-1] == f"row {ROWS - 1}"
            async with as_tenant(url, bob) as client:
                await refused(client, got["links"]["stdout"])
                await refused(client, got["links"]["result"])

        run(body)


def test_the_fast_start_path_declares_what_the_server_serves(tmp_path: Path) -> None:
    """``coordex mcp`` answers ``initialize`` before the SDK is loaded: with the
    capabilities the SDK's server then serves (resources among them)."""
    from coordex import Executor
    from coordex.mcp_hello import CAPABILITIES
    from coordex.mcp_server import build_server

    with Executor(root=tmp_path / "home") as executor:
        served = build_server(executor).get_capabilities(protocol_version="2025-06-18")
    declared = served.model_dump(by_alias=True, mode="json", exclude_none=True)
    declared.pop("extensions", None)
    assert declared == CAPABILITIES

