"""``coordex serve``'s operator endpoints: ``/healthz``, ``/readyz`` and ``/metrics``.

``/healthz`` (the process answers) and ``/readyz`` (its executors are open and it is
not stopping) need no token and say nothing more than ``ok`` / ``ready`` or ``not
ready``. ``/metrics`` (with ``--metrics``) follows the token rules of ``/mcp``: a
request without a valid token gets 401; under ``--tokens`` a tenant's token shows that
tenant's series alone, and the operator's ``COORDEX_METRICS_TOKEN`` shows every
tenant's.
"""

from __future__ import annotations

import hmac
from typing import Any

from ..contract import ExecutorLike
from ..stopping import STOPPING

PROMETHEUS_TEXT = b"text/plain; version=0.0.4; charset=utf-8"
OPERATOR_PATHS = ("/healthz", "/readyz", "/metrics")


async def answer(app: Any, scope: Any, send: Any) -> bool:
    """Answer an operator's request to ``app`` (a BearerTenantApp); False when the path
    is not one of them (or ``/metrics`` is off), so the app goes on as before."""
    path = scope["path"].rstrip("/")
    if path not in OPERATOR_PATHS:
        return False
    if path == "/healthz":
        await _reply(send, 200, b"ok\n")
        return True
    if path == "/readyz":
        ready = _ready(app)
        await _reply(send, 200 if ready else 503, b"ready\n" if ready else b"not ready\n")
        return True
    from . import hook

    figures = hook.FIGURES
    if figures is None or figures.registry is None:
        return False  # no --metrics: the path is nobody's (404 after the token check)
    # One Authorization header, in UTF-8, as /mcp takes it: two, or other bytes, are none.
    sent = [v for k, v in scope["headers"] if k.lower() == b"authorization"]
    try:
        authorization = sent[0].decode("utf-8") if len(sent) == 1 else None
    except UnicodeDecodeError:
        authorization = None
    if _operator(app, authorization):
        body = figures.render(None)
    else:
        tenant = app.tenant_for(authorization)
        if tenant is None:
            await _reply(send, 401, b"Unauthorized: send 'Authorization: Bearer <token>'.\n",
                         [(b"www-authenticate", b'Bearer realm="coordex"')])
            return True
        body = figures.render(tenant.name)
    await _reply(send, 200, body, content_type=PROMETHEUS_TEXT)
    return True


def _operator(app: Any, authorization: str | None) -> bool:
    token = getattr(app, "metrics_token", None)
    if not token or not authorization:
        return False
    scheme, _, presented = authorization.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        presented.strip().encode("utf-8", "replace"), token.encode("utf-8"))


def _ready(app: Any) -> bool:
    if STOPPING.event.is_set() or not getattr(app, "started", True):
        return False
    return all(not _closed(tenant.executor) for tenant in app.tenants)


def _closed(executor: ExecutorLike) -> bool:
    closed = getattr(executor, "_closed", False)
    return bool(closed)


async def _reply(send: Any, status: int, body: bytes,
                 extra: list[tuple[bytes, bytes]] | None = None, *,
                 content_type: bytes = b"text/plain; charset=utf-8") -> None:
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", content_type), (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"), *(extra or [])]})
    await send({"type": "http.response.body", "body": body})
