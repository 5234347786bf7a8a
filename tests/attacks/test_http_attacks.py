"""Anyone who reaches the server's port tries to stall it (SPEC 8: a tenant - let alone a
stranger - can never stop the server; SPEC 11: the page never slows another's).

With the network on, every tenant's code reaches the server's own port, as does every
local user. These attacks need no token: a cookie that is costly to parse, and
thousands of connections that never finish their request.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.e2e._procs import Running, child_env, spawn
from tests.e2e.test_mcp_http import ACCEPT, INITIALIZE, READY

pytestmark = pytest.mark.timeout(180)

TOKEN = "http-attack-token-0123456789"
FD_LIMIT = 400  # the server's descriptor limit in the flood test


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[Running, str]]:
    with spawn("serve", "--port", "0", env=child_env(tmp_path / "home",
                                                     COORDEX_TOKEN=TOKEN)) as running:
        yield running, running.wait_for(READY).group(1)


def _raw(port: int, request: bytes, timeout: float = 60.0) -> tuple[str, float]:
    """Send ``request`` whole; the status line and the seconds the answer took."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request)
        answer = b""
        with contextlib.suppress(OSError):
            while b"\r\n" not in answer:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                answer += chunk
    return answer.split(b"\r\n", 1)[0].decode("latin-1"), time.monotonic() - started


@pytest.mark.parametrize("path", ["/ui/", "/ui/api/sessions"])
def test_a_cookie_that_is_costly_to_parse_is_not_parsed(server: tuple[Running, str],
                                                        path: str) -> None:
    """CVE-2024-7592: the standard library's cookie parser takes time quadratic in a
    quoted value's backslashes (8 s for 60,000 on an unpatched 3.11), and it ran on the
    event loop for every /ui request before any token was checked."""
    port = urlsplit(server[1]).port
    assert port is not None
    cookie = f'coordex_ui_{port}="' + "\\" * 60_000 + '"'
    status, took = _raw(port, (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                               f"Cookie: {cookie}\r\nConnection: close\r\n\r\n").encode())
    assert took < 1.0, (status, took)
    assert status.split()[1] in ("401", "431"), status
    # A well-formed cookie of the page's name among others is still found (401 here only
    # because no browser was ever given this key).
    status, took = _raw(port, (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                               f"Cookie: a=1; coordex_ui_{port}=abc_DEF-123; b=\"x\"\r\n"
                               "Connection: close\r\n\r\n").encode())
    assert status.split()[1] == "401" and took < 1.0, (status, took)


def test_a_request_head_past_the_limit_gets_431(server: tuple[Running, str]) -> None:
    port = urlsplit(server[1]).port
    assert port is not None
    status, took = _raw(port, (f"GET /ui/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                               f"X-Big: {'a' * 200_000}\r\n\r\n").encode())
    assert status.split()[1:2] in (["431"], ["400"]) or status == "", status
    assert took < 5.0


def _initialize(url: str) -> int:
    response = httpx.post(url, json=INITIALIZE, timeout=30,
                          headers={**ACCEPT, "Authorization": f"Bearer {TOKEN}"})
    return response.status_code


def test_idle_half_requests_leave_room_for_everyone(tmp_path: Path) -> None:
    """Thousands of connections that each send half a request line and wait: past the
    server's descriptor limit (here :data:`FD_LIMIT`) it answered no one, for as long as
    they were held. Now the oldest waiting ones are closed to make room, and each is
    closed at the header deadline anyway."""
    env = child_env(tmp_path / "home", COORDEX_TOKEN=TOKEN)
    wrap = lambda argv: ["prlimit", f"--nofile={FD_LIMIT}:{FD_LIMIT}", "--", *argv]  # noqa: E731
    with spawn("serve", "--port", "0", env=env, wrap=wrap) as running:
        url = running.wait_for(READY).group(1)
        port = urlsplit(url).port
        assert port is not None
        assert _initialize(url) == 200
        held: list[socket.socket] = []
        try:
            failed = 0
            for _ in range(3 * FD_LIMIT):
                sock = socket.socket()
                sock.settimeout(0.5)
                try:
                    sock.connect(("127.0.0.1", port))
                    sock.sendall(b"GET /mcp HTTP/1.1\r\nHost: 127.0")
                except OSError:
                    sock.close()
                    failed += 1
                    if failed > 5:  # the server takes no more (its backlog is full)
                        break
                    continue
                held.append(sock)
            time.sleep(0.5)
            # Another client is answered while they are held (before: never, for as long
            # as they were held; the time is left to the request's own timeout, as a
            # loaded machine may take seconds to start a session).
            assert _initialize(url) == 200
            page = httpx.get(url.replace("/mcp", "/ui/api/sessions"), timeout=20,
                             headers={"Authorization": f"Bearer {TOKEN}"})
            assert page.status_code == 200, page.text
            # The newest half-request is still open now; past the deadline it is closed.
            newest = held[-1]
            newest.settimeout(20)
            started = time.monotonic()
            with contextlib.suppress(ConnectionResetError):
                assert newest.recv(100) == b""
            assert time.monotonic() - started < 15
        finally:
            for sock in held:
                sock.close()
        assert running.process.poll() is None
        assert _initialize(url) == 200
        said = []
        while not running.lines.empty():
            said.append(running.lines.get_nowait())
        # Never out of descriptors (asyncio then stops accepting anyone for a while).
        assert not any("Too many open files" in line for line in said), said[-5:]


NON_ASCII = "tokén-ünïcode-0123456789abcdef"


def _status(port: int, method: str, path: str, headers: list[bytes], body: bytes = b"") -> str:
    request = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n".encode()
               + b"".join(h + b"\r\n" for h in headers)
               + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
    return _raw(port, request, timeout=30)[0].split()[1]


@pytest.mark.parametrize("path", ["/mcp", "/ui/api/sessions"])
def test_a_token_is_one_authorization_header_in_utf_8(tmp_path: Path, path: str) -> None:
    """Two Authorization headers authorise nothing (one part of a chain of proxies may
    read the first, another the last), and a token is its UTF-8 bytes: the same
    characters in latin-1 are another token."""
    env = child_env(tmp_path / "home", COORDEX_TOKEN=NON_ASCII)
    with spawn("serve", "--port", "0", env=env) as running:
        port = urlsplit(running.wait_for(READY).group(1)).port
        assert port is not None
        import json

        method, body = ("POST", json.dumps(INITIALIZE).encode()) if path == "/mcp" else ("GET", b"")
        extra = [b"Accept: application/json, text/event-stream",
                 b"Content-Type: application/json"] if path == "/mcp" else []
        good = b"Authorization: Bearer " + NON_ASCII.encode("utf-8")
        wrong = b"Authorization: Bearer wrong-token-0123456789abc"
        assert _status(port, method, path, [good, *extra], body) == "200"
        assert _status(port, method, path, [wrong, good, *extra], body) == "401"
        assert _status(port, method, path, [good, wrong, *extra], body) == "401"
        assert _status(port, method, path, [good, good, *extra], body) == "401"
        latin = b"Authorization: Bearer " + NON_ASCII.encode("latin-1")
        assert _status(port, method, path, [latin, *extra], body) == "401"


def test_the_servers_token_is_in_no_environment_its_tenant_can_read(
        server: tuple[Running, str]) -> None:
    """The single tenant of an unconfined server runs in the server's own process: the
    environment it started with (``/proc/self/environ``) held ``COORDEX_TOKEN``."""
    from tests.e2e.test_mcp_http import call_with_sdk

    found = call_with_sdk(server[1], TOKEN, [("execute_code", {"code": (
        "import os\n"
        "seen = []\n"
        "for pid in {'self', str(os.getppid()), str(os.getpid())}:\n"
        "    try:\n"
        f"        seen.append({TOKEN!r}.encode() in open(f'/proc/{{pid}}/environ', 'rb').read())\n"
        "    except OSError:\n"
        "        pass\n"
        f"(seen, {TOKEN!r} in str(os.environ))")}), ("execute_code", {
            "code": "cat /proc/$PPID/environ /proc/self/environ 2>/dev/null | tr '\\0' '\\n' | "
                    "grep -c COORDEX_TOKEN=.; true", "language": "bash"})])
    python, bash = found
    seen, in_environ = eval(str(python["result"]))
    assert seen and not any(seen) and not in_environ, python
    assert bash["stdout"].strip() == "0", bash


@pytest.mark.parametrize(("site", "status"), [("same-site", "403"), ("cross-site", "403"),
                                               ("none", "303"), (None, "303")])
def test_a_link_on_another_port_cannot_log_a_browser_in(server: tuple[Running, str],
                                                        site: str | None, status: str) -> None:
    """Login CSRF: a page on another loopback port (a tenant's own listener) is the
    *same site* as the server's (ports do not make a site); sending a browser to
    ``/ui/?token=<attacker's>`` set the attacker's keys in the victim's browser."""
    port = urlsplit(server[1]).port
    assert port is not None
    headers = [f"Sec-Fetch-Site: {site}".encode()] if site else []
    assert _status(port, "GET", f"/ui/?token={TOKEN}", headers) == status


@pytest.mark.parametrize(("header", "status"), [
    ("Referer: http://127.0.0.1:1/trap.html", "403"), ("Origin: http://127.0.0.1:1", "403"),
    ("Referer: http://localhost:1/", "403"), ("Referer: http://127.0.0.1:{port}/ui/", "303"),
    (None, "303")])
def test_a_browser_without_fetch_metadata_is_not_logged_in_from_another_port(
        server: tuple[Running, str], header: str | None, status: str) -> None:
    """N17/R9 for a browser that sends no ``Sec-Fetch-Site`` (older ones): a link on
    another port still says where it was followed from (``Referer``, ``Origin``)."""
    port = urlsplit(server[1]).port
    assert port is not None
    headers = [header.format(port=port).encode()] if header else []
    assert _status(port, "GET", f"/ui/?token={TOKEN}", headers) == status


def test_the_programs_page_server_closes_a_half_sent_request(tmp_path: Path) -> None:
    """``ex.serve_ui()`` and ``coordex mcp --ui`` serve the page with a thread per
    connection: a half-sent request held its thread for good."""
    from coordex import Executor

    with Executor(root=tmp_path / "root", persist=False) as ex:
        url = ex.serve_ui(port=0)["url"]
        port = urlsplit(url).port
        assert port is not None
        with socket.create_connection(("127.0.0.1", port), timeout=40) as sock:
            sock.sendall(b"GET /ui/ HTTP/1.1\r\nHost: 127.0")
            started = time.monotonic()
            with contextlib.suppress(ConnectionResetError):
                assert sock.recv(100) == b""
            assert time.monotonic() - started < 25
