"""A small OpenAI-compatible Chat Completions server on 127.0.0.1, for ``coordex eval
--policy model``: a real HTTP endpoint whose "model" is a script.

The script is called with the request's JSON body and returns the assistant message
(``{"content": ..., "tool_calls": [...]}``), or a :class:`Raw` answer (any status and
body) to play a broken endpoint. Every reply carries ``usage`` with ``TOKENS_PER_REPLY``
total tokens, so a test can check the count. Requests and their headers are kept.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOKENS_PER_REPLY = 120


@dataclass
class Raw:
    status: int
    body: str


Script = Callable[[dict[str, Any]], "dict[str, Any] | Raw"]


def tool_call(number: int, name: str, arguments: dict[str, Any] | str) -> dict[str, Any]:
    """One entry of a message's ``tool_calls``; arguments go as JSON text, as OpenAI sends."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": f"call_{number}", "type": "function",
            "function": {"name": name, "arguments": text}}


class ChatServer:
    """``with ChatServer(script) as server: server.base_url`` ... ``server.requests``."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if self.path != "/v1/chat/completions":
                    self._send(404, json.dumps({"error": {"message": f"no route {self.path}"}}))
                    return
                owner.requests.append(body)
                owner.headers.append(dict(self.headers.items()))
                answer = owner.script(body)
                if isinstance(answer, Raw):
                    self._send(answer.status, answer.body)
                    return
                message = {"role": "assistant", "content": None, **answer}
                self._send(200, json.dumps({
                    "id": f"chatcmpl-{len(owner.requests)}", "object": "chat.completion",
                    "model": body.get("model"),
                    "choices": [{"index": 0, "message": message,
                                 "finish_reason": "tool_calls" if answer.get("tool_calls") else "stop"}],
                    "usage": {"prompt_tokens": TOKENS_PER_REPLY - 20, "completion_tokens": 20,
                              "total_tokens": TOKENS_PER_REPLY}}))

            def _send(self, status: int, text: str) -> None:
                data = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> ChatServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
