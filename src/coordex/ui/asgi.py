"""The page as ASGI, for ``coordex serve``: one :class:`~coordex.ui.app.UIApp` whose
``lookup`` maps each tenant's token to that tenant's executor, so each token shows that
tenant alone.

The event loop never blocks on an executor and borrows no thread of the server's
shared pool: :meth:`UIApp.start` runs what it asks of an executor on that tenant's own
threads and hands the response back through the loop; past the route's deadline the
request is answered that the executor is still busy.
"""

from __future__ import annotations

import asyncio
from typing import Any

from .app import UIApp, late
from .http import MAX_BODY, Request, Response, text_response


async def _body(receive: Any) -> bytes | None:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            return b"\0" * (MAX_BODY + 1)  # the app refuses it as too large
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


async def serve_asgi(app: UIApp, scope: Any, receive: Any, send: Any) -> None:
    from urllib.parse import parse_qs

    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
    sent = [v for k, v in scope["headers"] if k.lower() == b"authorization"]
    if sent:
        # One Authorization header, in UTF-8 (a token is UTF-8): two, or bytes that are
        # not UTF-8, authorise nothing, whichever of them a part of the server reads.
        try:
            headers["authorization"] = sent[0].decode("utf-8") if len(sent) == 1 else ""
        except UnicodeDecodeError:
            headers["authorization"] = ""
        if not headers["authorization"]:
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                    (b"www-authenticate", b'Bearer realm="coordex"')]})
            await send({"type": "http.response.body",
                        "body": b"Unauthorized: send one 'Authorization: Bearer <token>'.\n"})
            return
    method = scope.get("method", "GET")
    body = await _body(receive) if method == "POST" else b""
    if body is None:
        return
    loop = asyncio.get_running_loop()
    answered: asyncio.Future[Response] = loop.create_future()

    def reply(response: Response) -> None:
        def settle() -> None:
            if not answered.done():
                answered.set_result(response)
        try:
            loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the server stopped while the executor was answering
            pass

    query = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
    try:
        wait = app.start(Request(method, scope["path"], query, headers, body), reply)
        response = await asyncio.wait_for(asyncio.shield(answered), timeout=max(wait, 0.05))
    except asyncio.TimeoutError:
        response = late(wait)
    except Exception as exc:  # a coordex bug must still get an answer
        response = text_response(500, f"The page failed: {type(exc).__name__}\n")
    await send({"type": "http.response.start", "status": response.status,
                "headers": [(k.lower().encode("latin-1"), v.encode("latin-1"))
                            for k, v in response.all_headers()]})
    await send({"type": "http.response.body",
                "body": b"" if method == "HEAD" else response.body})
