"""The page's requests and replies as plain data: what ``app`` (the handler), ``api``
(the JSON API) and the two servers (``server``, ``asgi``) share, below all of them."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

MAX_BODY = 64 * 1024

_SECURITY_HEADERS = [
    ("Cache-Control", "no-store"),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
    # Everything the page needs is in it; it may only talk back to its own origin.
    ("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; "
     "style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; "
     "frame-ancestors 'none'; form-action 'none'; base-uri 'none'"),
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


def json_response(status: int, value: Any) -> Response:
    return Response(status, json.dumps(value, default=str).encode("utf-8"))


def text_response(status: int, text: str, headers: Sequence[tuple[str, str]] = ()) -> Response:
    return Response(status, text.encode("utf-8"), "text/plain; charset=utf-8", list(headers))


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: Mapping[str, str]  # lower-case names
    body: bytes = b""


__all__ = ["MAX_BODY", "Request", "Response", "json_response", "text_response"]
