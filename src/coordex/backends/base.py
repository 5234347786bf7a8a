"""What every backend takes and gives back.

A backend runs one :class:`RunRequest` and returns an *outcome*: a plain dict with the
output keys of the SPEC success shape (``stdout``, ``stderr``, ``truncated``,
``result``, ``exit_code``, ``images``) and, when the call failed, ``error`` holding the
SPEC error dict (``error``, ``error_type``, ``suggestion`` and its extra keys). Optional
keys: ``state_lost`` and ``retried`` (a process was replaced), ``isolation`` (read-only
calls), ``rebound``/``deleted`` (Python names a stateful call changed, for provenance).
The executor adds ``session``, ``state_mode`` and ``duration_ms``; backends never do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..core.results import DEFAULT_OUTPUT_LIMIT

OutputCallback = Callable[[str, str], None]
Outcome = dict[str, Any]

# After SIGINT, how long code gets to stop before its process is killed (state lost).
INTERRUPT_GRACE = 2.0


@dataclass(frozen=True)
class RunRequest:
    code: str
    timeout: float
    on_output: OutputCallback | None = None
    output_limit: int = DEFAULT_OUTPUT_LIMIT
    # Read-only file protection: folders whose writes are discarded (SPEC guarantee 3).
    protect_paths: tuple[str, ...] = field(default_factory=tuple)


def emit(request: RunRequest, stream: str, text: str) -> None:
    """Call ``on_output`` without letting a broken callback break the run."""
    if request.on_output is not None and text:
        try:
            request.on_output(stream, text)
        except Exception:
            pass


def empty_outcome() -> Outcome:
    return {"stdout": "", "stderr": "", "truncated": False, "result": None,
            "exit_code": None, "images": []}
