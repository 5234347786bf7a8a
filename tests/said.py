"""A place's session (or stateless runner) answering as the Executor would.

Places report facts (:class:`coordex.core.facts.Ran`); the session table decides and
words them. Tests that hold a place's session directly wrap it here to read each run as
the outcome dict the Executor shapes: one attempt per call (a retry is the Executor's
to make), each loss said once.
"""

from __future__ import annotations

from typing import Any

from coordex.core import messages
from coordex.sessions import Slot, attempts, inspected, run_once_told


class _OneAttempt:
    retries = False

    def __init__(self, kind: str) -> None:
        self.kind = kind


class Said:
    """``target``'s ``run``/``run_read_only``/``run_stateless``/``inspect`` as outcome
    dicts; everything else passes through."""

    def __init__(self, target: Any, kind: str) -> None:
        self.target = target
        self._place = _OneAttempt(kind)
        self._slot = Slot(target if hasattr(target, "inspect") else None, None)  # type: ignore[arg-type]

    def _said(self, mode: messages.Mode, run: Any, request: Any) -> dict[str, Any]:
        if mode == "stateless":
            return attempts(self._place, mode, run, request)  # type: ignore[arg-type]
        outcome, self._slot.told = run_once_told(self._place, mode, run,  # type: ignore[arg-type]
                                                 request, self._slot.told)
        return outcome

    def run(self, request: Any) -> dict[str, Any]:
        return self._said("stateful", self.target.run, request)

    def run_read_only(self, request: Any) -> dict[str, Any]:
        return self._said("read_only", self.target.run_read_only, request)

    def run_stateless(self, request: Any) -> dict[str, Any]:
        return self._said("stateless", self.target.run_stateless, request)

    def inspect(self) -> dict[str, Any]:
        report, self._slot.told = inspected(self.target.inspect(), self._place,  # type: ignore[arg-type]
                                            self._slot.told)
        return report

    def __getattr__(self, name: str) -> Any:
        return getattr(self.target, name)

    def __enter__(self) -> Said:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.target.close()


def said(target: Any) -> Said:
    """``target`` (a worker or shell session, a worker template, a shell place) wrapped."""
    name = type(target).__name__
    kind = "shell" if "Shell" in name else "worker" if "Worker" in name else "own"
    return Said(target, kind)
