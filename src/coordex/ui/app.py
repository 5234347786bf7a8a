"""The page for a person (SPEC section 11), as a handler with no server in it.

:class:`UIApp` turns one HTTP request (method, path, query, headers) into a
:class:`Response`; :mod:`coordex.ui.server` serves it from a thread for
``Executor.serve_ui`` and ``coordex mcp --ui``, and :mod:`coordex.ui.asgi` mounts it in
``coordex serve``. Which executor a request sees is decided by its token alone
(``lookup(token)``), so one app can serve every tenant of a server, each its own.

Routes under the prefix (default ``/ui``): the page itself, and JSON endpoints
``api/sessions`` (``list_sessions()``), ``api/inspect`` (``inspect_session(...)``) and
``api/history`` (``history(...)``). The executor only needs those three methods.

The token: a browser passes it once as ``?token=...``; the answer sets it in a cookie
(HttpOnly, SameSite=Strict) and, for the page, redirects to the same URL without it, so
it does not stay in the address bar or the history. ``Authorization: Bearer`` works too.
Anything else gets 401.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.cookies import CookieError, SimpleCookie
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlencode

COOKIE = "coordex_ui"
COOKIE_AGE = 7 * 24 * 3600  # kept across browser restarts, as Jupyter's is
MAX_COOKIES = 8  # tokens tried per request: a bound on the work a request can cause
_SECURITY_HEADERS = [
    ("Cache-Control", "no-store"),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
    # Everything the page needs is in it; it may only talk back to its own origin.
    ("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; "
     "style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; "
     "frame-ancestors 'none'"),
]


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: list[tuple[str, str]] = field(default_factory=list)

    def all_headers(self) -> list[tuple[str, str]]:
        return [("Content-Type", self.content_type), ("Content-Length", str(len(self.body))),
                *_SECURITY_HEADERS, *self.headers]


@functools.cache
def _page() -> bytes:
    return resources.files("coordex.ui").joinpath("page.html").read_bytes()


def _json(status: int, value: Any) -> Response:
    return Response(status, json.dumps(value, default=str).encode("utf-8"))


def _int(values: dict[str, list[str]], name: str) -> int | str | None:
    raw = values.get(name, [""])[0]
    if raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        return raw  # the executor's validation quotes it back


class UIApp:
    """The page and its JSON endpoints over whichever executor a token names.

    Args:
        lookup: ``lookup(token)`` -> the executor that token may see, or None. It must
            compare tokens in constant time.
        prefix: the path the page lives at.
    """

    def __init__(self, lookup: Callable[[str], Any | None], prefix: str = "/ui") -> None:
        self.lookup = lookup
        self.prefix = prefix.rstrip("/")

    def handles(self, path: str) -> bool:
        return path == self.prefix or path.startswith(self.prefix + "/")

    def handle(self, method: str, path: str, query_string: str,
               headers: Mapping[str, str]) -> Response:
        """Answer one request. ``headers`` keys are lower-case."""
        query = parse_qs(query_string, keep_blank_values=True)
        from_query = query.pop("token", [""])[0]
        executor = self.lookup(from_query) if from_query else None
        for token in (() if from_query else
                      (*_cookie_tokens(headers.get("cookie", "")),
                       _bearer(headers.get("authorization", "")))):
            executor = self.lookup(token) if token else None
            if executor is not None:
                break
        if executor is None:
            return Response(401, b"Unauthorized: open the URL with ?token=... once.\n",
                            "text/plain; charset=utf-8",
                            [("WWW-Authenticate", 'Bearer realm="coordex"')])
        extra: list[tuple[str, str]] = []
        if from_query:
            extra.append(("Set-Cookie", f"{cookie_name(from_query)}={from_query}; HttpOnly; "
                          f"SameSite=Strict; Path={self.prefix or '/'}; Max-Age={COOKIE_AGE}"))
        if method not in ("GET", "HEAD"):
            return Response(405, b"Only GET.\n", "text/plain; charset=utf-8", extra)
        rest = path[len(self.prefix):].strip("/")
        if rest == "":
            # Keep the token out of the address bar from now on, and end the page's URL
            # with "/" so its relative "api/..." requests land under the prefix.
            if from_query or not path.endswith("/"):
                clean = self.prefix + "/" + (("?" + urlencode(query, doseq=True)) if query else "")
                return Response(303, b"", "text/plain", [*extra, ("Location", clean)])
            return Response(200, _page(), "text/html; charset=utf-8", extra)
        response = self._api(executor, rest, query)
        response.headers.extend(extra)
        return response

    def _api(self, executor: Any, rest: str, query: dict[str, list[str]]) -> Response:
        language = query.get("language", [None])[0] or None
        session = {"session_id": _int(query, "session_id"), "venv_id": _int(query, "venv_id")}
        name = query.get("session_name", [None])[0] or None
        if rest == "api/sessions":
            return _json(200, executor.list_sessions())
        if rest == "api/inspect":
            return _json(200, executor.inspect_session(language=language or "python",
                                                       session_name=name, **session))
        if rest == "api/history":
            limit = _int(query, "limit")
            return _json(200, executor.history(language=language, session_name=name,
                                               limit=50 if limit is None else limit, **session))
        return Response(404, f"Not found: {rest!r}. The page is at {self.prefix}/.\n".encode(),
                        "text/plain; charset=utf-8")


def cookie_name(token: str) -> str:
    """The cookie for one token. Cookies do not tell ports apart, so two pages on one
    host (two programs, two tenants) each need a name of their own."""
    return f"{COOKIE}_{hashlib.sha256(token.encode('utf-8', 'replace')).hexdigest()[:12]}"


def _cookie_tokens(header: str) -> list[str]:
    if not header:
        return []
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(header)
    except CookieError:
        return []
    return [m.value for name, m in jar.items() if name.startswith(COOKIE)][:MAX_COOKIES]


def _bearer(header: str) -> str:
    scheme, _, credentials = header.partition(" ")
    return credentials.strip() if scheme.lower() == "bearer" else ""


def single_tenant(executor: Any, token: str) -> Callable[[str], Any | None]:
    """``lookup`` for one executor behind one token (constant-time comparison)."""
    import hmac

    expected = token.encode("utf-8")

    def lookup(presented: str) -> Any | None:
        ok = hmac.compare_digest(presented.encode("utf-8", "replace"), expected)
        return executor if ok else None

    return lookup
