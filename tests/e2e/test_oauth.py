"""``coordex serve --oauth-issuer``: JWT access tokens of a real local issuer.

The issuer is a small authorization server on a loopback port: RFC 8414 metadata and a
JWKS with its RSA key, which signs the tokens the tests mint. The server finds the keys
through the metadata, publishes RFC 9728 protected-resource metadata, takes the tenant
from a claim, and refuses tokens of another key, issuer or audience and expired ones;
bearer tokens keep working beside them.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from ._procs import child_env, run_cli, spawn
from .test_mcp_http import ACCEPT, INITIALIZE, READY, call_with_sdk

pytestmark = pytest.mark.timeout(180)

TOKEN = "static-token-0123456789abcdef"
KID = "coordex-test-key"


class Issuer:
    """An authorization server's public face: its metadata and its signing keys."""

    def __init__(self) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        jwk = jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key(), as_dict=True)
        jwk.update(kid=KID, use="sig", alg="RS256")
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                documents = {
                    "/.well-known/oauth-authorization-server": {
                        "issuer": issuer.url, "jwks_uri": f"{issuer.url}/jwks.json",
                        "authorization_endpoint": f"{issuer.url}/authorize",
                        "token_endpoint": f"{issuer.url}/token",
                        "response_types_supported": ["code"]},
                    "/jwks.json": {"keys": [jwk]},
                }
                if self.path not in documents:
                    self.send_error(404)
                    return
                body = json.dumps(documents[self.path]).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self.thread.start()

    def token(self, audience: str, key: Any = None, **claims: Any) -> str:
        now = int(time.time())
        payload = {"iss": self.url, "aud": audience, "sub": "user-1", "iat": now,
                   "exp": now + 300, "scope": "mcp", "client_id": "connector", **claims}
        payload = {k: v for k, v in payload.items() if v is not None}
        return jwt.encode(payload, key or self.key, algorithm="RS256", headers={"kid": KID})

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()
        self.thread.join(timeout=5)


@pytest.fixture(scope="module")
def issuer() -> Iterator[Issuer]:
    running = Issuer()
    try:
        yield running
    finally:
        running.close()


def _status(url: str, token: str | None) -> httpx.Response:
    headers = dict(ACCEPT)
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    return httpx.post(url, json=INITIALIZE, headers=headers)


def test_jwts_are_checked_and_the_metadata_names_the_issuer(
        issuer: Issuer, tmp_path: Path) -> None:
    env = child_env(tmp_path / "home", COORDEX_TOKEN=TOKEN)
    with spawn("serve", "--port", "0", "--oauth-issuer", issuer.url, env=env) as running:
        url = running.wait_for(READY).group(1)
        running.wait_for(r"OAuth: JWTs of ")
        base = url.rsplit("/mcp", 1)[0]
        metadata = httpx.get(f"{base}/.well-known/oauth-protected-resource/mcp")
        assert metadata.status_code == 200, metadata.text
        assert metadata.json()["resource"] == url
        assert [s.rstrip("/") for s in metadata.json()["authorization_servers"]] == [issuer.url]

        missing = _status(url, None)
        assert missing.status_code == 401
        assert (f'resource_metadata="{base}/.well-known/oauth-protected-resource/mcp"'
                in missing.headers["www-authenticate"])
        other_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        for refused in (
            issuer.token("https://elsewhere.example/mcp"),           # another audience
            issuer.token(url, exp=int(time.time()) - 120),          # expired
            issuer.token(url, key=other_key),                      # not the issuer's key
            issuer.token(url, iss="http://127.0.0.1:1"),           # another issuer
            issuer.token(url, exp=None),                           # no expiry
            "not-a-jwt",
        ):
            assert _status(url, refused).status_code == 401

        # One tenant: a token without the tenant claim is that tenant's, as is the
        # static token; both see the same session.
        made = call_with_sdk(url, issuer.token(url), [
            ("execute_code", {"code": "kept = 7", "state_mode": "stateful",
                              "session_name": "s"})])
        assert not made[0]["is_error"]
        seen = call_with_sdk(url, TOKEN, [
            ("execute_code", {"code": "kept * 6", "state_mode": "read_only",
                              "session_name": "s"})])
        assert seen[0]["result"] == "42"


def test_the_tenant_claim_routes_a_jwt_to_its_tenant(issuer: Issuer, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.txt"
    tokens.write_text("alice alice-token-0123456789\nbob bob-token-0123456789\n")
    os.chmod(tokens, 0o600)
    env = child_env(tmp_path / "home")
    with spawn("serve", "--port", "0", "--tokens", str(tokens), "--oauth-issuer", issuer.url,
               "--allow-unconfined", env=env) as running:
        url = running.wait_for(READY, timeout=60).group(1)
        alice_jwt = issuer.token(url, coordex_tenant="alice")
        made = call_with_sdk(url, alice_jwt, [
            ("execute_code", {"code": "secret = 42", "state_mode": "stateful",
                              "session_name": "vault"})])
        assert not made[0]["is_error"]
        bob = call_with_sdk(url, issuer.token(url, coordex_tenant="bob"), [
            ("inspect_session", {"session_name": "vault"})])
        assert bob[0]["is_error"] and bob[0]["error_type"] == "not_found"
        alice = call_with_sdk(url, "alice-token-0123456789", [
            ("execute_code", {"code": "secret", "state_mode": "read_only",
                              "session_name": "vault"})])
        assert alice[0]["result"] == "42"
        assert _status(url, issuer.token(url)).status_code == 403          # names no tenant
        assert _status(url, issuer.token(url, coordex_tenant="mallory")).status_code == 403


def test_an_issuer_without_keys_stops_the_server_at_once(tmp_path: Path) -> None:
    done = run_cli("serve", "--port", "0", "--oauth-issuer", "http://127.0.0.1:9/",
                   env=child_env(tmp_path / "home", COORDEX_TOKEN=TOKEN), timeout=60)
    assert done.returncode == 2
    assert "cannot use --oauth-issuer" in done.stderr and "--oauth-jwks" in done.stderr
