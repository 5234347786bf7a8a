"""Result shaping: bounded output capture, the success dict of SPEC section 3, and the
budget one result's JSON stays within (SPEC 14).

:class:`OutputBuffer` keeps at most ``limit`` characters of a stream however much is
written: the first half in ``head``, the newest half in a ring of chunks as ``tail``,
and a count of what was dropped in between. Memory stays O(limit).

:func:`fit` cuts a finished result's ``stdout``, ``stderr`` and ``result`` in the
middle until its JSON is within :data:`RESULT_BUDGET` bytes, and names the fields it
cut; the caller keeps their whole text elsewhere (:mod:`coordex.spill`) and says where
in ``spilled``.
"""

from __future__ import annotations

import json
import re
from collections import deque
from typing import Any

DEFAULT_OUTPUT_LIMIT = 64 * 1024
# One result's JSON, in bytes (SPEC 14: clients cap a tool result near 25k tokens).
# Images are not counted: they travel as image content of their own.
RESULT_BUDGET = 80_000
# The fields cut to fit; ``value_repr`` is a stored function's value as text.
FITTED = ("stdout", "stderr", "result", "value_repr")
# Room kept for what is added after fitting (``spilled`` and its paths, a duration).
_ROOM = 1500
_SURROGATE = re.compile("[\ud800-\udfff]")


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
        if not self._head_len:  # nothing written (the head fills first): most streams
            return ""
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


def json_bytes(value: Any) -> int:
    """Bytes of ``value`` as JSON text on a UTF-8 wire; a lone surrogate in a string
    counts as the seven-character escape that carries it."""
    extra = len(_SURROGATE.findall(value)) * 6 if isinstance(value, str) else 0
    return len(json.dumps(value, ensure_ascii=False, default=str).encode("utf-8", "replace")) \
        + extra


def fit(record: dict[str, Any], budget: int = RESULT_BUDGET,
        value_limit: int = DEFAULT_OUTPUT_LIMIT) -> tuple[dict[str, Any], list[str]]:
    """``record`` with its output and value cut in the middle so that its JSON stays
    within ``budget`` bytes, and the names of the fields cut here.

    ``result`` is first cut to ``value_limit`` characters (SPEC 3). The budget left once
    every other field is counted is shared out: a field smaller than its share keeps
    all of it, and what it leaves goes to the others. A cut sets ``truncated`` where the
    record has one.
    """
    chars = 0
    for name in FITTED:
        text = record.get(name)
        if isinstance(text, str):
            chars += len(text)
    if 7 * chars < min(budget // 4, value_limit):
        return record, []  # seven bytes a character at most: nothing to cut (most calls)
    texts = {name: record[name] for name in FITTED if isinstance(record.get(name), str)}
    cut: list[str] = []
    record = dict(record)
    value = texts.get("result")
    if value is not None and len(value) > value_limit:
        texts["result"], _ = truncate_middle(value, value_limit)
        cut.append("result")
    sizes = {name: json_bytes(text) for name, text in texts.items()}
    # Images travel as image content of their own: not counted.
    rest = json_bytes({**record, **dict.fromkeys(texts, ""), "images": []})
    room = budget - rest - _ROOM
    if sum(sizes.values()) > room:
        left = max(room, 0)
        names = sorted(sizes, key=lambda name: sizes[name])
        for index, name in enumerate(names):
            share = left // (len(names) - index)
            if sizes[name] > share:
                texts[name] = _cut_to_bytes(texts[name], share)
                sizes[name] = json_bytes(texts[name])
                if name not in cut:
                    cut.append(name)
            left -= sizes[name]
    for name in cut:
        record[name] = texts[name]
    if cut and "truncated" in record:
        record["truncated"] = True
    return record, [name for name in FITTED if name in cut]


def _cut_to_bytes(text: str, share: int) -> str:
    """``text`` cut in the middle until its JSON fits ``share`` bytes."""
    size = json_bytes(text)
    chars = max(0, int(len(text) * share / max(size, 1)) - 64)
    while True:
        shorter, _ = truncate_middle(text, chars)
        if json_bytes(shorter) <= share or chars == 0:
            return shorter
        chars = int(chars * 0.9)
