"""Result shaping: bounded output capture and the success dict of SPEC section 3.

:class:`OutputBuffer` keeps at most ``limit`` characters of a stream however much is
written: the first half in ``head``, the newest half in a ring of chunks as ``tail``,
and a count of what was dropped in between. Memory stays O(limit).
"""

from __future__ import annotations

from collections import deque
from typing import Any

DEFAULT_OUTPUT_LIMIT = 64 * 1024


def cut_marker(dropped: int) -> str:
    return f"\n... [{dropped} characters truncated] ...\n"


class OutputBuffer:
    """A stream capture that keeps the head and tail of at most ``limit`` characters."""

    __slots__ = ("_head", "_head_len", "_tail", "_tail_len", "dropped", "limit")

    def __init__(self, limit: int = DEFAULT_OUTPUT_LIMIT) -> None:
        self.limit = max(2, limit)
        self._head: list[str] = []
        self._head_len = 0
        self._tail: deque[str] = deque()
        self._tail_len = 0
        self.dropped = 0

    def write(self, text: str) -> None:
        if not text:
            return
        half = self.limit // 2
        room = half - self._head_len
        if room > 0:
            part = text[:room]
            self._head.append(part)
            self._head_len += len(part)
            text = text[room:]
            if not text:
                return
        keep = self.limit - half
        if len(text) >= keep:
            self.dropped += self._tail_len + len(text) - keep
            self._tail.clear()
            self._tail.append(text[-keep:])
            self._tail_len = keep
            return
        self._tail.append(text)
        self._tail_len += len(text)
        while self._tail_len > keep:
            first = self._tail[0]
            excess = self._tail_len - keep
            if len(first) <= excess:
                self._tail.popleft()
                self._tail_len -= len(first)
                self.dropped += len(first)
            else:
                self._tail[0] = first[excess:]
                self._tail_len -= excess
                self.dropped += excess

    @property
    def truncated(self) -> bool:
        return self.dropped > 0

    def getvalue(self) -> str:
        head = "".join(self._head)
        tail = "".join(self._tail)
        if self.dropped:
            return head + cut_marker(self.dropped) + tail
        return head + tail


def truncate_middle(text: str, limit: int = DEFAULT_OUTPUT_LIMIT) -> tuple[str, bool]:
    """Shorten ``text`` to about ``limit`` characters keeping head and tail."""
    if len(text) <= limit:
        return text, False
    half = limit // 2
    dropped = len(text) - limit
    return text[:half] + cut_marker(dropped) + text[len(text) - (limit - half):], True


def session_record(language: str, venv_id: int | None, session_id: int | None,
                   session_name: str | None) -> dict[str, Any]:
    return {"language": language, "venv_id": venv_id, "session_id": session_id,
            "session_name": session_name}


def success(*, stdout: str, stderr: str, truncated: bool, result: str | None,
            exit_code: int | None, images: list[dict[str, str]], session: dict[str, Any],
            state_mode: str, duration_ms: float, **extra: Any) -> dict[str, Any]:
    """The SPEC section 3 success dict; ``extra`` adds e.g. ``isolation``, ``state_lost``."""
    record: dict[str, Any] = {
        "stdout": stdout, "stderr": stderr, "truncated": truncated, "result": result,
        "exit_code": exit_code, "images": images, "session": session,
        "state_mode": state_mode, "duration_ms": duration_ms,
    }
    record.update(extra)
    return record
