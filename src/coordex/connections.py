"""Who may hold a connection to ``coordex serve``, and for how long (SPEC 8: a tenant can
never stop the server).

uvicorn keeps a connection that sends half a request for as long as the client likes,
and accepts until the process runs out of descriptors; then no one is answered. With
the network on, every tenant's code reaches the server's port. :func:`guarded_protocol`
gives uvicorn its HTTP protocol with these rules:

- **A header deadline:** a connection whose request line and headers are not all there
  :data:`HEADER_DEADLINE` seconds after it opened (or after its last answer, when kept
  alive) is closed. Idle keep-alive connections are uvicorn's to close sooner.
- **A header size:** a request whose head (request line and headers) passes
  :data:`MAX_HEAD` bytes gets ``431`` and the connection closes, before anything of it
  is parsed.
- **Room for everyone:** connections still waiting for their request are at most
  :data:`PER_CLIENT_WAITING` per client address and :data:`MAX_WAITING` in all; past
  that the oldest waiting one is closed (a client that sends its request at once is
  never the oldest). Connections in all are held below the process's descriptor limit
  with :data:`RESERVE` descriptors to spare (for hosts, logs and new connections): past
  that the oldest waiting connection goes, or, when none waits, the new one. The
  event loop accepts at most :data:`BACKLOG` connections before it hears of any of them
  (uvicorn's default of 2,048 ran the process out of descriptors within one burst).

Tenants on this machine all come from the loopback address, so a per-address cap alone
would let one tenant lock the others out; the oldest-first rule is what keeps room for
them: a flood of idle connections only ever evicts its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
from collections import OrderedDict
from typing import Any

HEADER_DEADLINE = 10.0  # seconds a connection has to send its request line and headers
MAX_HEAD = 64 * 1024  # bytes of request line and headers
PER_CLIENT_WAITING = 256  # connections of one address waiting for their request
MAX_WAITING = 1024  # connections waiting for their request, in all
BACKLOG = 64  # connections accepted in one go (asyncio takes up to the backlog at once)
RESERVE = 4 * BACKLOG  # descriptors kept free of connections: room for bursts in flight


def connection_cap(reserve: int = RESERVE) -> int:
    """Connections held at once: the descriptor limit less ``reserve`` (at least 16)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(16, soft - reserve)


class Guard:
    """The rules above for one server: its open connections and which of them wait."""

    def __init__(self, *, deadline: float = HEADER_DEADLINE, max_head: int = MAX_HEAD,
                 per_client: int = PER_CLIENT_WAITING, max_waiting: int = MAX_WAITING,
                 cap: int | None = None) -> None:
        self.deadline = deadline
        self.max_head = max_head
        self.per_client = per_client
        self.max_waiting = max_waiting
        self.cap = connection_cap() if cap is None else cap
        self.open: set[Any] = set()
        self.waiting: OrderedDict[Any, str] = OrderedDict()  # protocol -> client address
        self.waiting_by: dict[str, int] = {}
        self.closed_early = 0  # connections this guard closed (for tests and logs)

    def opened(self, conn: Any, client: str) -> bool:
        """A new connection; False when it must be closed at once."""
        self.open.add(conn)
        self.wait(conn, client)
        if len(self.open) > self.cap:
            oldest = next((c for c in self.waiting if c is not conn), None)
            self.drop(oldest if oldest is not None else conn)
        mine = [c for c, who in self.waiting.items() if who == client] \
            if self.waiting_by.get(client, 0) > self.per_client else []
        if mine:
            self.drop(mine[0])
        if len(self.waiting) > self.max_waiting:
            self.drop(next(iter(self.waiting)))
        return conn in self.open

    def wait(self, conn: Any, client: str) -> None:
        if conn not in self.waiting:
            self.waiting[conn] = client
            self.waiting_by[client] = self.waiting_by.get(client, 0) + 1

    def answered(self, conn: Any) -> None:
        """Its request's head arrived: no longer waiting."""
        client = self.waiting.pop(conn, None)
        if client is not None:
            left = self.waiting_by.get(client, 1) - 1
            if left > 0:
                self.waiting_by[client] = left
            else:
                self.waiting_by.pop(client, None)

    def gone(self, conn: Any) -> None:
        self.answered(conn)
        self.open.discard(conn)

    def drop(self, conn: Any) -> None:
        self.gone(conn)
        self.closed_early += 1
        conn.close_now()


def guarded_protocol(guard: Guard | None = None) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with ``guard``'s rules (a new :class:`Guard` if None), for
    ``uvicorn.Config(http=...)``."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    rules = guard if guard is not None else Guard()

    class GuardedH11Protocol(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None
        _head = 0
        _closed_by_guard = False

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            if rules.opened(self, self._address()):
                self._arm()

        def _address(self) -> str:
            return str(self.client[0]) if self.client else "?"

        def _arm(self) -> None:
            self._disarm()
            self._head = 0
            self._deadline = self.loop.call_later(rules.deadline, self._late)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _late(self) -> None:
            self._deadline = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                rules.drop(self)

        def close_now(self) -> None:
            self._disarm()
            self._closed_by_guard = True
            with contextlib.suppress(Exception):
                self.transport.abort()

        def data_received(self, data: bytes) -> None:
            if self._closed_by_guard:
                return
            if self.conn.their_state is h11.IDLE:
                room = rules.max_head - self._head
                if len(data) > room and b"\r\n\r\n" not in data[:room + 3]:
                    rules.gone(self)
                    self._disarm()
                    self._refuse_large_head()
                    return
                self._head += len(data)
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE and self in rules.waiting:
                rules.answered(self)
                self._disarm()

        def _refuse_large_head(self) -> None:
            self._closed_by_guard = True
            body = b"Request header fields too large.\n"
            with contextlib.suppress(Exception):
                self.transport.write(
                    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
                    b"content-type: text/plain; charset=utf-8\r\n"
                    + b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body) + body)
                self.transport.close()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and not self._closed_by_guard \
                    and self.conn.their_state is h11.IDLE:
                # Kept alive: its next request has the same deadline.
                rules.wait(self, self._address())
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            rules.gone(self)
            super().connection_lost(exc)

    return GuardedH11Protocol


__all__ = ["BACKLOG", "HEADER_DEADLINE", "MAX_HEAD", "MAX_WAITING", "PER_CLIENT_WAITING", "RESERVE", "Guard",
           "connection_cap", "guarded_protocol"]
