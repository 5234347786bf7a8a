"""SPEC section 6 as one table: what happens after a process died under a call.

A place reports *facts* about one attempt at a call — the process holding the session
died during it (``died="process"``), only the throwaway copy running it died
(``died="copy"``: a read-only or stateless fork child), or nothing died — and whether
the process was found dead and replaced before the code ran (``replaced``). This module
decides, from those facts alone, whether the call is tried once more and what the
final result says:

- a Python worker (or the copy it forked) that dies during a call is replaced and the
  call retried once (``retried: true``; ``state_lost: true`` when the session's own
  process died); a second death is ``crashed``;
- a shell is never retried: shell commands are rarely safe to run twice;
- the agent's own interpreter cannot die and survive, so it is never retried;
- ``state_lost`` is reported once per loss: by the first result after it.

Pure: the places and the session owner act on the answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Died = Literal["process", "copy"] | None
Step = Literal["done", "retry", "crashed"]

MAX_ATTEMPTS = 2


@dataclass(frozen=True)
class Attempt:
    """What one attempt at a call reported."""

    died: Died = None  # what died during the attempt, if anything
    replaced: bool = False  # the process was found dead and replaced before the code ran


def next_step(retries: bool, attempts: list[Attempt]) -> Step:
    """After the attempts so far at a call in a place that ``retries`` after a death
    (Python workers) or not (shells, the own interpreter): stop with the last result,
    run it once more, or report a crash."""
    last = attempts[-1]
    if last.died is None:
        return "done"
    if retries and len(attempts) < MAX_ATTEMPTS:
        return "retry"
    return "crashed"


def state_lost(attempts: list[Attempt]) -> bool:
    """Whether the session's state was lost during these attempts (reported once)."""
    return any(a.died == "process" or a.replaced for a in attempts)


def retried(attempts: list[Attempt]) -> bool:
    return len(attempts) > 1
