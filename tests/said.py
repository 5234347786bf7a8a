"""A place's session (or stateless runner) answering as the Executor would.

Places report facts (:class:`coordex.core.facts.Ran`); the session table settles them
(:class:`coordex.core.record.Settled`) and :func:`coordex.core.record.render` words them.
Tests that hold a place's session directly wrap it here to read each run as a dict: the
output fields, ``error`` (the error dict :func:`~coordex.core.record.render` gives),
``isolation``, ``state_lost``, ``retried`` and the changes the table and the log keep
(``rebound``, ``deleted``, ``written``). One attempt per call (a retry is the
Executor's to make), each loss said once.
"""

from __future__ import annotations

from typing import Any

from coordex.core.record import Settled, render_error
from coordex.sessions import Slot, inspected, settle


class _OneAttempt:
    retries = False

    def __init__(self, kind: str) -> None:
        self.kind = kind


def outcome(settled: Settled) -> dict[str, Any]:
    """``settled`` as a test reads it (see the module's docstring)."""
    ran = settled.ran
    out: dict[str, Any] = {
        "stdout": ran.stdout, "stderr": ran.stderr, "truncated": ran.truncated,
        "result": ran.result, "exit_code": ran.exit_code, "images": list(ran.images)}
    if settled.mode == "read_only":
        out["isolation"] = dict(ran.isolation) if ran.isolation else {
            "names": True, "objects": True, "files": "none", "copy": "none"}
    if settled.mode != "stateless":
        for key, value in (("rebound", ran.rebound), ("deleted", ran.deleted),
                           ("written", ran.written)):
            if value:
                out[key] = value if callable(value) else list(value)
    if settled.errored:
        out.update(result=None, exit_code=None, error=render_error(settled))
        if ran.event.__class__.__name__ != "Raised":
            out["images"] = []
    elif ran.event.__class__.__name__ == "Exited":
        out["exit_code"] = ran.event.status  # type: ignore[union-attr]
    if settled.lost:
        out["state_lost"] = True
    if settled.retried:
        out["retried"] = True
    return out


class Said:
    """``target``'s ``run``/``run_read_only``/``run_stateless``/``inspect`` as outcome
    dicts; everything else passes through."""

    def __init__(self, target: Any, kind: str) -> None:
        self.target = target
        self._place = _OneAttempt(kind)
        self._slot = Slot(target if hasattr(target, "inspect") else None, None)  # type: ignore[arg-type]

    def _said(self, mode: Any, run: Any, request: Any) -> dict[str, Any]:
        settled = settle(self._place, mode, run, request,  # type: ignore[arg-type]
                         told=mode != "stateless" and self._slot.told)
        if mode != "stateless":
            self._slot.told = settled.during
        return outcome(settled)

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
