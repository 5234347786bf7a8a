"""The page served from a thread of the process that holds the sessions.

``Executor.serve_ui`` and ``coordex mcp --ui PORT`` use this: a standard-library
threading HTTP server over :class:`~coordex.ui.app.UIApp`, owned by the Executor (it
stops when the executor closes). Each connection runs on its own short-lived thread;
what a request asks of the executor runs on the page's few threads of its own
(:class:`~coordex.ui.app.TenantThreads`), so a busy session never holds up the page.
"""

from __future__ import annotations

import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from ..contract import ExecutorLike
from ..core.coordinates import is_valid_text
from ..core.errors import CoordexError
from ..worker._coordex_engine import safe_repr
from .app import UIApp, single_tenant
from .http import MAX_BODY
from .keys import SignedKeys, secret_under


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    # Seconds a connection may stay silent (a half-sent request holds a thread until
    # then): each waiting connection costs a thread, so none waits forever.
    timeout = 15.0

    def do_GET(self) -> None:
        self._answer("GET")

    def do_HEAD(self) -> None:
        self._answer("HEAD")

    def do_POST(self) -> None:
        self._answer("POST")

    def _answer(self, method: str) -> None:
        parts = urlsplit(self.path)
        headers = {k.lower(): v for k, v in self.headers.items()}
        body = b""
        length = self.headers.get("Content-Length", "")
        if method == "POST" and length.isdigit():
            body = self.rfile.read(min(int(length), MAX_BODY + 1))
        path = parts.path if self.server.app.handles(parts.path) else \
            self.server.app.prefix + "/nothing-here"
        response = self.server.app.handle(method, path, parts.query, headers, body)
        self.send_response(response.status)
        for key, value in response.all_headers():
            self.send_header(key, value)
        self.end_headers()
        if method != "HEAD":
            self.wfile.write(response.body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # stderr belongs to the program (and under ``coordex mcp`` to its log)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    app: UIApp


class UIServer:
    """A running page: ``url`` (with the token) and ``close()``."""

    def __init__(self, executor: ExecutorLike, host: str, port: int) -> None:
        self.token = secrets.token_urlsafe(24)
        try:
            server = _Server((host, port), _Handler)
        except OSError as exc:
            raise CoordexError(
                "validation", f"Cannot serve the page on {host}:{port}: {exc.strerror or exc}.",
                "Pass port=0 to take any free port, or another port that is free.")
        hosts, origins = _allowed(host)
        root = getattr(executor, "root", None)
        keys = None if root is None else \
            SignedKeys(secret_under(root), lambda: [self.token], single=True)
        server.app = UIApp(single_tenant(executor, self.token), allowed_hosts=hosts,
                           allowed_origins=origins, keys=keys)
        self._server = server
        self._closed = False
        bound_port = server.server_address[1]
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{bound_port}/ui/?token={self.token}"
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="coordex-ui", daemon=True)
        self._thread.start()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def _allowed(host: str) -> tuple[list[str], list[str]]:
    """The ``Host`` and ``Origin`` values of a page bound to ``host``: loopback names,
    and the bound name itself when it is another."""
    from .access import LOOPBACK_HOSTS, LOOPBACK_ORIGINS

    hosts, origins = list(LOOPBACK_HOSTS), list(LOOPBACK_ORIGINS)
    if host not in ("127.0.0.1", "localhost", "::1", "0.0.0.0", "::", ""):
        shown = f"[{host}]" if ":" in host else host
        hosts += [shown, f"{shown}:*"]
        origins += [f"http://{shown}:*", f"http://{shown}"]
    return hosts, origins


def start_ui(executor: ExecutorLike, host: str = "127.0.0.1", port: int = 0) -> UIServer:
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise CoordexError("validation", "port must be an integer from 0 to 65535, got "
                           f"{safe_repr(port, 80)}.", "Pass port=0 to take any free port.")
    if not isinstance(host, str) or not 0 < len(host) <= 253 or "\0" in host \
            or not is_valid_text(host):
        raise CoordexError("validation", "host must be a host name or address to listen on, "
                           f"got {safe_repr(host, 80)}.",
                           "Pass host='127.0.0.1' (the default), or an address of this machine.")
    try:
        return UIServer(executor, host, port)
    except OSError as exc:  # a port taken, an address not of this machine: the caller's
        raise CoordexError("environment", f"The page cannot listen on {host}:{port}: {exc}.",
                           "Pass port=0 to take any free port, and a host this machine "
                           "has (127.0.0.1 by default).") from exc
