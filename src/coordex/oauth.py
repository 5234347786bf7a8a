"""``coordex serve`` as an OAuth resource server: JWT access tokens from one issuer.

Hosted connectors (claude.ai, ChatGPT) speak OAuth only. With ``--oauth-issuer URL`` the
server also accepts a JWT access token that URL's authorization server issued: signed by
a key of its JWKS (found through its RFC 8414 or OpenID Connect metadata, or given with
``--oauth-jwks``), with ``iss`` that issuer, ``aud`` this server's resource URL (RFC
8707; ``--oauth-audience`` names another), and not expired. The tenant is the value of
one claim (``--oauth-tenant-claim``, default ``coordex_tenant``) naming a tenant of the
server; a server with one tenant takes a token without the claim. The server publishes
RFC 9728 protected-resource metadata at ``/.well-known/oauth-protected-resource/mcp``
and names it in every 401's ``WWW-Authenticate``, so a client finds where to get a token.
Bearer tokens (``COORDEX_TOKEN``, ``--tokens``) keep working beside it.

The signature and claims are checked by PyJWT (the MCP SDK's own dependency), the expiry
and the resource again by the SDK's ``BearerAuthBackend``, and the metadata is the SDK's
route: nothing here parses a token by hand.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import jwt
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser, BearerAuthBackend
from mcp.server.auth.provider import AccessToken, TokenVerifier
from mcp.server.auth.routes import build_resource_metadata_url, create_protected_resource_routes
from pydantic import AnyHttpUrl
from starlette.requests import HTTPConnection
from starlette.routing import Router

DEFAULT_TENANT_CLAIM = "coordex_tenant"
ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384",
              "ES512", "EdDSA")
_DISCOVERY = ("/.well-known/oauth-authorization-server", "/.well-known/openid-configuration")


class OAuthSetupError(Exception):
    """The issuer named cannot be used (its metadata or keys cannot be found)."""


def discover_jwks(issuer: str, timeout: float = 10.0) -> str:
    """The ``jwks_uri`` of ``issuer``, from its RFC 8414 or OpenID Connect metadata."""
    base = issuer.rstrip("/")
    problems = []
    for path in _DISCOVERY:
        url = base + path
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                metadata = json.load(response)
        except (OSError, ValueError) as exc:
            problems.append(f"{url}: {exc}")
            continue
        if metadata.get("issuer", "").rstrip("/") != base:
            problems.append(f"{url} names issuer {metadata.get('issuer')!r}")
            continue
        if isinstance(metadata.get("jwks_uri"), str):
            return str(metadata["jwks_uri"])
        problems.append(f"{url} has no jwks_uri")
    raise OAuthSetupError(
        f"cannot find the signing keys of issuer {issuer!r} ({'; '.join(problems)}). Check "
        "the issuer URL, or give its keys' URL with --oauth-jwks.")


class JWTVerifier(TokenVerifier):
    """The MCP SDK's ``TokenVerifier`` for JWT access tokens of one issuer and audience."""

    def __init__(self, issuer: str, audience: str, jwks_url: str,
                 algorithms: Sequence[str] = ALGORITHMS) -> None:
        self.issuer, self.audience = issuer, audience
        self.algorithms = list(algorithms)
        # Keys are cached and fetched again when a token names a key id not yet seen.
        self.keys = jwt.PyJWKClient(jwks_url, cache_keys=True, lifespan=300, timeout=10)

    def claims(self, token: str) -> dict[str, Any] | None:
        """The token's claims when its signature, issuer, audience and times hold."""
        try:
            key = self.keys.get_signing_key_from_jwt(token)
            return dict(jwt.decode(
                token, key.key, algorithms=self.algorithms, audience=self.audience,
                issuer=self.issuer, options={"require": ["exp", "iss", "aud"]}, leeway=30))
        except (jwt.PyJWTError, OSError):
            return None

    async def verify_token(self, token: str) -> AccessToken | None:
        claims = await anyio.to_thread.run_sync(self.claims, token)
        if claims is None:
            return None
        scopes = claims.get("scope", claims.get("scp", ""))
        return AccessToken(
            token=token,
            client_id=str(claims.get("client_id") or claims.get("azp") or claims.get("sub")
                          or "unknown"),
            scopes=scopes.split() if isinstance(scopes, str) else [str(s) for s in scopes],
            expires_at=int(claims["exp"]),
            resource=_audience(claims["aud"], self.audience),
            subject=str(claims["sub"]) if "sub" in claims else None,
            claims=claims,
        )


def _audience(aud: Any, wanted: str) -> str:
    """The audience a token was issued for: ``wanted`` when a list holds it (the SDK's
    backend then compares it with this resource again)."""
    if isinstance(aud, list):
        return wanted if wanted in aud else str(aud[0]) if aud else ""
    return str(aud)


@dataclass
class OAuthGate:
    """What ``BearerTenantApp`` asks when a request carries no static token: the RFC 9728
    metadata route, and the tenant a verified token's claim names."""

    resource: str
    issuer: str
    verifier: TokenVerifier
    tenant_claim: str = DEFAULT_TENANT_CLAIM
    metadata_url: str = field(init=False)
    _router: Router = field(init=False, repr=False)
    _backend: BearerAuthBackend = field(init=False, repr=False)

    def __post_init__(self) -> None:
        resource = AnyHttpUrl(self.resource)
        self.metadata_url = str(build_resource_metadata_url(resource))
        self._router = Router(routes=create_protected_resource_routes(
            resource, [AnyHttpUrl(self.issuer)], resource_name="coordex"))
        # The SDK's backend checks the expiry again and, where the audience is this
        # resource's URL (the default), that the token was issued for it (RFC 8707).
        audience = getattr(self.verifier, "audience", self.resource)
        same = audience.rstrip("/") == self.resource.rstrip("/")
        self._backend = BearerAuthBackend(self.verifier,
                                          resource_server_url=resource if same else None)

    @property
    def metadata_path(self) -> str:
        return "/" + self.metadata_url.split("://", 1)[1].split("/", 1)[1]

    def handles(self, path: str) -> bool:
        return path == self.metadata_path

    async def metadata(self, scope: Any, receive: Any, send: Any) -> None:
        await self._router(scope, receive, send)

    def challenge(self) -> bytes:
        """``WWW-Authenticate`` for a request without a usable token (RFC 9728 §5.1)."""
        return f'Bearer realm="coordex", resource_metadata="{self.metadata_url}"'.encode()

    async def tenant_name(self, scope: Any, names: Sequence[str]) -> str | None:
        """The tenant a verified token names; ``None`` when the token does not verify.

        Raises:
            PermissionError: the token verifies but names no tenant of this server.
        """
        found = await self._backend.authenticate(HTTPConnection(scope))
        if found is None:
            return None
        user = found[1]
        assert isinstance(user, AuthenticatedUser)
        claims = user.access_token.claims or {}
        named = claims.get(self.tenant_claim)
        if named is None and len(names) == 1:
            return names[0]
        if isinstance(named, str) and named in names:
            return named
        raise PermissionError(
            f"The token's {self.tenant_claim!r} claim ({named!r}) names no tenant of this "
            "server.")


__all__ = ["DEFAULT_TENANT_CLAIM", "JWTVerifier", "OAuthGate", "OAuthSetupError",
           "discover_jwks"]
