"""Whether a server is stopping, and the requests it still answers (SPEC section 8).

Below both the MCP server, which stops, and its health endpoints, which say so.
"""

from __future__ import annotations

import threading


class _Stopping:
    """The requests in flight, and whether the server is stopping.

    At SIGTERM (:func:`stop_answering`) the executors are closed first, so every call in
    flight returns an error dict at once (its processes ended); each is sent as an
    answer saying the server is stopping, and only once none is left in flight (or
    after :data:`ANSWER_SECONDS`) does the transport stop. A request that comes in
    meanwhile is answered the same way without running.
    """

    def __init__(self) -> None:
        self.event = threading.Event()
        self._idle = threading.Condition()
        self._in_flight = 0

    def enter(self) -> None:
        with self._idle:
            self._in_flight += 1

    def leave(self) -> None:
        with self._idle:
            self._in_flight -= 1
            if self._in_flight <= 0:
                self._idle.notify_all()

    def wait_answered(self, seconds: float) -> bool:
        with self._idle:
            return self._idle.wait_for(lambda: self._in_flight <= 0, seconds)


STOPPING = _Stopping()
