"""Who may use the page: ``Host``/``Origin`` checks, and the keys a browser holds.

A browser that showed the token once holds two random keys of the server's: one in a
cookie (``HttpOnly``, ``SameSite=Strict``, path ``/ui``, a name per port so two pages on
one host do not overwrite each other) and one the page keeps in its origin's storage
and sends as the :data:`PAGE_KEY_HEADER` header. Cookies are sent to every port of a
host, so another program listening on this host could receive the first key; the
second stays with the page's own origin (scheme, host and port). A request needs both,
and neither is the token: the server maps them to it, in memory, for a week at most.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit

COOKIE = "coordex_ui"
COOKIE_AGE = 7 * 24 * 3600  # kept across browser restarts, as Jupyter's is
PAGE_KEY_HEADER = "x-coordex-key"
MAX_KEYS = 1000  # browsers remembered per token; that token's oldest is forgotten first
MAX_ALL_KEYS = 100_000  # browsers remembered in all (a few MB); the oldest go first

LOOPBACK_HOSTS = ("127.0.0.1:*", "localhost:*", "[::1]:*", "127.0.0.1", "localhost", "[::1]")
LOOPBACK_ORIGINS = ("http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*")


def _matches(value: str, patterns: Sequence[str]) -> bool:
    for pattern in patterns:
        if value == pattern:
            return True
        if pattern.endswith(":*"):
            base = pattern[:-2]
            if value.startswith(base + ":") and value[len(base) + 1:].isdigit():
                return True
    return False


class Checks:
    """The ``Host``/``Origin`` rules of ``/mcp`` (DNS rebinding), and a same-origin
    ``POST``."""

    def __init__(self, hosts: Sequence[str] | None = None,
                 origins: Sequence[str] | None = None) -> None:
        self.hosts = list(hosts) if hosts else list(LOOPBACK_HOSTS)
        self.origins = list(origins) if origins else list(LOOPBACK_ORIGINS)

    def refuse(self, method: str, headers: Mapping[str, str]) -> tuple[int, str] | None:
        """(status, why) for a request from where the page may not be used, or None."""
        host = headers.get("host", "")
        if not _matches(host, self.hosts):
            return 421, f"Invalid Host header {host!r}: the page answers on loopback names.\n"
        origin = headers.get("origin")
        if origin is not None and origin != "null" and not _matches(origin, self.origins):
            return 403, f"Invalid Origin {origin!r}.\n"
        if method not in ("GET", "HEAD", "POST"):
            return 405, "Only GET and POST.\n"
        return None

    def refuse_post(self, headers: Mapping[str, str], by_cookie: bool) -> tuple[int, str] | None:
        """A ``POST`` changes things: from a browser it must come from the page's own
        origin, and it must carry JSON (which no plain form can send)."""
        kind = headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != "application/json":
            return 415, "A POST carries JSON: Content-Type: application/json.\n"
        if by_cookie:
            site = headers.get("sec-fetch-site")
            origin = headers.get("origin")
            own = "http://" + headers.get("host", "")
            if not (site == "same-origin" or origin == own):
                return 403, "A POST from a browser must come from the page itself.\n"
        return None


def from_elsewhere(headers: Mapping[str, str], host: str) -> bool:
    """Whether ``Origin`` or ``Referer`` names an origin other than this page's own
    (``http://`` + ``Host``): another port of the same host included."""
    own = "http://" + host.lower()
    for key in ("origin", "referer"):
        value = headers.get(key)
        if not value or value == "null":
            continue
        parts = urlsplit(value)
        if f"{parts.scheme}://{parts.netloc}".lower() != own:
            return True
    return False


def port_of(host: str) -> str:
    """The port a ``Host`` header names (``"80"`` when it names none)."""
    if host.startswith("["):
        _, _, rest = host.partition("]")
        return rest[1:] if rest.startswith(":") and rest[1:].isdigit() else "80"
    name, _, port = host.rpartition(":")
    return port if name and port.isdigit() else "80"


def cookie_name(host: str) -> str:
    return f"{COOKIE}_{port_of(host)}"


def set_cookie(host: str, key: str, prefix: str) -> str:
    return (f"{cookie_name(host)}={key}; HttpOnly; SameSite=Strict; Path={prefix or '/'}; "
            f"Max-Age={COOKIE_AGE}")


MAX_COOKIE_HEADER = 8192  # characters of a Cookie header looked at; a longer one holds no key
_KEY_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def cookie_value(headers: Mapping[str, str], host: str) -> str:
    """The page's key from the ``Cookie`` header, or ``""``.

    Read before anyone is known to be who they say, so it costs time in proportion to
    the header at most, and a header past :data:`MAX_COOKIE_HEADER` is not read at all:
    the header is split on ``;``, and only the one cookie of this port's name is taken,
    when its value is a key this server could have issued (``token_urlsafe``). No
    general cookie parser runs (the standard library's took seconds of CPU for one
    crafted header: CVE-2024-7592)."""
    header = headers.get("cookie", "")
    if not header or len(header) > MAX_COOKIE_HEADER:
        return ""
    wanted = cookie_name(host)
    for part in header.split(";"):
        name, sep, value = part.partition("=")
        if sep and name.strip() == wanted:
            value = value.strip()
            if 0 < len(value) <= 64 and all(c in _KEY_CHARS for c in value):
                return value
            return ""
    return ""


def bearer(header: str) -> str:
    scheme, _, credentials = header.partition(" ")
    return credentials.strip() if scheme.lower() == "bearer" else ""


class Keys:
    """The browsers' keys: ``cookie key -> (page key, token, issued)``, in memory.

    At most ``limit`` per token: a tenant that opens its own URL again and again forgets
    only its own oldest browsers, never another tenant's.
    """

    def __init__(self, limit: int = MAX_KEYS, age: float = COOKIE_AGE,
                 limit_all: int = MAX_ALL_KEYS) -> None:
        self._keys: OrderedDict[str, tuple[str, str, float]] = OrderedDict()
        self._by_token: dict[str, OrderedDict[str, None]] = {}
        self._limit = limit
        self._limit_all = max(limit, limit_all)
        self._age = age
        self._lock = threading.Lock()

    def issue(self, token: str) -> tuple[str, str]:
        cookie_key, page_key = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
        with self._lock:
            self._keys[cookie_key] = (page_key, token, time.time())
            mine = self._by_token.setdefault(token, OrderedDict())
            mine[cookie_key] = None
            while len(mine) > self._limit:
                self._forget(next(iter(mine)))
            while len(self._keys) > self._limit_all:
                self._forget(next(iter(self._keys)))
        return cookie_key, page_key

    def _forget(self, cookie_key: str) -> None:
        entry = self._keys.pop(cookie_key, None)
        if entry is None:
            return
        mine = self._by_token.get(entry[1])
        if mine is not None:
            mine.pop(cookie_key, None)
            if not mine:
                del self._by_token[entry[1]]

    def _entry(self, cookie_key: str) -> tuple[str, str, float] | None:
        if not cookie_key:
            return None
        with self._lock:
            entry = self._keys.get(cookie_key)
            if entry is not None and time.time() - entry[2] > self._age:
                self._forget(cookie_key)
                return None
            return entry

    def token_for_cookie(self, cookie_key: str) -> str | None:
        """The token behind a cookie alone: enough for the page itself, which holds
        nothing of the tenant's; never for its API."""
        entry = self._entry(cookie_key)
        return entry[1] if entry is not None else None

    def token_for(self, cookie_key: str, page_key: str) -> str | None:
        entry = self._entry(cookie_key)
        if entry is None or not page_key:
            return None
        ok = hmac.compare_digest(entry[0].encode(), page_key.encode("utf-8", "replace"))
        return entry[1] if ok else None
