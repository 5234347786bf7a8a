"""Browser keys that outlive the server's process (SPEC section 11).

:class:`SignedKeys` offers what :class:`coordex.ui.access.Keys` offers (``issue``,
``token_for_cookie``, ``token_for``) without a table in memory: a cookie key is signed
with a secret kept under the data folder (:func:`secret_under`, created once, readable
by its owner alone), so a browser that logged in once stays logged in when the server
restarts, as Jupyter's cookie secret does. Neither key holds the token:

- the cookie key is ``issued`` (8 hex digits), a random nonce, which token it stands
  for (a keyed hash of it: the server finds the token among those it serves), and a MAC
  over all three;
- the page key is a MAC over the cookie key, so one is worth nothing without the other.

Every field is made of the characters of ``secrets.token_urlsafe`` and of fixed length.
A key expires ``age`` seconds after it was issued; a token the server no longer serves
opens nothing. A single-tenant page (``serve_ui``, ``coordex mcp --ui``) gets a new
token at each start, so there a key stands for the one tenant, not a token.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import os
import secrets
import time
from collections.abc import Callable, Iterable
from pathlib import Path

SECRET_FILE = "ui-secret"
_NONCE, _WHICH, _MAC = 16, 16, 22
_LENGTH = 8 + _NONCE + _WHICH + _MAC
_ONE = "0" * _WHICH  # the key of a single-tenant page: that tenant, whatever its token


def secret_under(root: Path) -> bytes:
    """The page's signing secret kept in ``root`` (made once, mode 0600); a secret of
    this process alone when the folder cannot hold one."""
    path = Path(root) / SECRET_FILE
    for _ in range(50):
        try:
            text = path.read_text(encoding="ascii").strip()
        except FileNotFoundError:
            text = ""
        except OSError:
            break
        if len(text) == 64:
            return bytes.fromhex(text)
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            time.sleep(0.01)  # another process is writing it
            continue
        except OSError:
            break
        secret = secrets.token_bytes(32)
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(secret.hex())
            f.flush()
            os.fsync(f.fileno())
        return secret
    return secrets.token_bytes(32)


def _b64(data: bytes, length: int) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")[:length]


class SignedKeys:
    """Browser keys signed with ``secret``: valid across restarts of the server.

    Args:
        secret: from :func:`secret_under`.
        tokens: the tokens the server serves now (each tenant's); called only for a key
            of a token this process has not seen yet.
        single: one tenant whose token changes at each start: a key stands for it.
        age: seconds a key is valid.
    """

    def __init__(self, secret: bytes, tokens: Callable[[], Iterable[str]], *,
                 single: bool = False, age: float = 7 * 24 * 3600) -> None:
        self._secret = secret
        self._tokens = tokens
        self._single = single
        self._age = age

    def _mac(self, what: str, length: int) -> str:
        return _b64(hmac.new(self._secret, what.encode("utf-8", "surrogatepass"),
                             hashlib.sha256).digest(), length)

    def _which(self, token: str) -> str:
        return _ONE if self._single else self._mac("token|" + token, _WHICH)

    def issue(self, token: str) -> tuple[str, str]:
        which = self._which(token)
        body = f"{int(time.time()) & 0xFFFFFFFF:08x}{_b64(secrets.token_bytes(12), _NONCE)}{which}"
        cookie_key = body + self._mac("cookie|" + body, _MAC)
        return cookie_key, self._mac("page|" + cookie_key, _MAC)

    def _token(self, cookie_key: str) -> str | None:
        if len(cookie_key) != _LENGTH or not cookie_key.isascii():
            return None
        body, mac = cookie_key[:-_MAC], cookie_key[-_MAC:]
        if not hmac.compare_digest(self._mac("cookie|" + body, _MAC).encode(), mac.encode()):
            return None
        try:
            issued = int(body[:8], 16)
        except ValueError:
            return None
        if not 0 <= time.time() - issued <= self._age:
            return None
        which = body[-_WHICH:]
        current = list(self._tokens())
        if self._single:
            return current[0] if len(current) == 1 else None
        found = None
        for token in current:  # every one compared: the time taken tells nothing
            if hmac.compare_digest(self._which(token).encode(), which.encode()):
                found = token
        return found

    def token_for_cookie(self, cookie_key: str) -> str | None:
        """The token behind a cookie alone: enough for the page itself, never its API."""
        with contextlib.suppress(Exception):
            return self._token(cookie_key)
        return None

    def token_for(self, cookie_key: str, page_key: str) -> str | None:
        token = self.token_for_cookie(cookie_key)
        if token is None or not page_key:
            return None
        expected = self._mac("page|" + cookie_key, _MAC).encode()
        return token if hmac.compare_digest(expected, page_key.encode("utf-8", "replace")) \
            else None
