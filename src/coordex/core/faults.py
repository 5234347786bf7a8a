"""SPEC section 6 as one table: what happens after a process died under a call.

A place reports *facts* about one attempt at a call (:class:`coordex.core.facts.Ran`):
the process holding the session died during it (``died="process"``), only the
throwaway copy running it died (``died="copy"``: a read-only or stateless fork child),
the cluster node holding it was lost (``died="node"``), or nothing died. This module
decides, from those facts alone, whether the call is tried once more:

- a Python worker (or the copy it forked) that dies during a call is replaced and the
  call retried once (``retried: true``; ``state_lost: true`` when the session's own
  process died); a second death is ``crashed``;
- a read-only copy that dies once it read the code is never retried (the session
  is unchanged, as in every place);
- a shell is never retried: shell commands are rarely safe to run twice; but a call
  whose process died before it read the code (killed just before the call came) runs
  on a fresh process in every place: its code never ran;
- the agent's own interpreter cannot die and survive, so it is never retried;
- a call that what died had already taken (a lost node: it may still run there) is
  never run again (SPEC 10).

Pure: the places and the session owner act on the answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from . import facts

Died = Literal["process", "copy", "node"] | None
Step = Literal["done", "retry", "crashed"]

MAX_ATTEMPTS = 2


@dataclass(frozen=True)
class Attempt:
    """What one attempt at a call reported."""

    died: Died = None  # what died during the attempt, if anything
    taken: bool = False  # what died had taken the call and may still run it
    started: bool = True  # what died had read the code (False: the code never ran)


def attempt(ran: facts.Ran) -> Attempt:
    """The facts of one run that decide what follows it."""
    event = ran.event
    if isinstance(event, facts.Died):
        return Attempt(died=event.what, taken=event.taken, started=event.started)
    return Attempt()


def next_step(retries: bool, attempts: list[Attempt], *, read_only: bool = False) -> Step:
    """After the attempts so far at a call in a place that ``retries`` after a death
    (Python workers) or not (shells, the own interpreter): stop with the last result,
    run it once more, or report a crash. A ``read_only`` call whose copy died after it
    read the code is ``crashed`` in every place, the session unchanged (SPEC 6: a
    killed read-only copy reads the same in every place)."""
    last = attempts[-1]
    if last.died is None:
        return "done"
    if read_only and last.died == "copy" and last.started:
        return "crashed"
    if len(attempts) < MAX_ATTEMPTS and (not last.started or (retries and not last.taken)):
        return "retry"
    return "crashed"


def retried(attempts: list[Attempt]) -> bool:
    return len(attempts) > 1
