"""A small OTLP/HTTP receiver on loopback: what `coordex serve|mcp --otel` exports, as
spans a test can read (the server runs in another process)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


@dataclass
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    status_code: int  # 0 unset, 1 ok, 2 error
    service: str
    start_ns: int = 0
    end_ns: int = 0
    links: list[str] = field(default_factory=list)  # the span ids it links to


@dataclass
class Receiver:
    url: str
    spans: list[Span] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def wait(self, name: str, count: int = 1, timeout: float = 20.0) -> list[Span]:
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                found = [s for s in self.spans if s.name == name]
            if len(found) >= count or time.monotonic() > deadline:
                return found
            time.sleep(0.05)


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


@contextmanager
def receiver() -> Iterator[Receiver]:
    box: list[Receiver] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            if self.path == "/v1/traces":
                request = ExportTraceServiceRequest.FromString(body)
                for resource_spans in request.resource_spans:
                    service = next((_value(a.value) for a in resource_spans.resource.attributes
                                    if a.key == "service.name"), "")
                    for scope in resource_spans.scope_spans:
                        for span in scope.spans:
                            with box[0].lock:
                                box[0].spans.append(Span(
                                    span.name, span.trace_id.hex(), span.span_id.hex(),
                                    span.parent_span_id.hex(),
                                    {a.key: _value(a.value) for a in span.attributes},
                                    span.status.code, service, span.start_time_unix_nano,
                                    span.end_time_unix_nano,
                                    [link.span_id.hex() for link in span.links]))
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    box.append(Receiver(f"http://127.0.0.1:{server.server_address[1]}"))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield box[0]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def otel_env(url: str) -> dict[str, str]:
    """The standard variables that point `--otel` at the receiver, exporting at once."""
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": url, "OTEL_BSP_SCHEDULE_DELAY": "50",
            "OTEL_METRICS_EXPORTER": "none", "OTEL_SERVICE_NAME": "coordex-test"}
