"""The page as ASGI, for ``coordex serve``: one :class:`~coordex.ui.app.UIApp` whose
``lookup`` maps each tenant's token to that tenant's executor, so each token shows that
tenant alone. The handler blocks (it asks the executor), so it runs in a worker thread."""

from __future__ import annotations

from typing import Any

import anyio.to_thread

from .app import UIApp


async def serve_asgi(app: UIApp, scope: Any, receive: Any, send: Any) -> None:
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
    query = scope.get("query_string", b"").decode("latin-1")
    response = await anyio.to_thread.run_sync(
        app.handle, scope.get("method", "GET"), scope["path"], query, headers)
    await send({"type": "http.response.start", "status": response.status,
                "headers": [(k.lower().encode("latin-1"), v.encode("latin-1"))
                            for k, v in response.all_headers()]})
    await send({"type": "http.response.body",
                "body": b"" if scope.get("method") == "HEAD" else response.body})
