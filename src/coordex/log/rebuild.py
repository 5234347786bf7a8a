"""Which logged calls built the state a session lost: pure rules over log rows.

A session's rows (oldest first) fall into *lives*: a life begins when the session is
created, when a call reports ``state_lost`` (that call already ran on the new process,
so it belongs to the new life), or when a rebuild starts the session over; a ``close``
row ends a life. The state a session holds was built by the stateful calls of its
current life that succeeded; read-only and stateless calls never change it.

What a rebuild replays:

- the session is open and its process alive: the life before the latest loss, if the
  current life began with one (a session that was created or rebuilt and has lost
  nothing since has nothing to rebuild - unless that rebuild stopped at a failing call,
  which asking again retries: :func:`unfinished_rebuild`);
- the session is closed, its process is dead, or it belonged to an earlier run of the
  program: the last life.

A life that began with a loss and holds no other successful stateful call (a
``crashed`` call, a shell that ran ``exit``) built nothing, so the life before it is
taken. The call that reported the loss is never replayed: it ended the state itself or
ran on a process that had just been replaced.
"""

from __future__ import annotations

from typing import Any

Row = dict[str, Any]


# Answers given before anything ran: the call never reached the session.
NOT_RUN = frozenset({"validation", "not_found", "capacity"})


def ran_in_session(row: Row) -> bool:
    """Whether a row is of something that happened to the session itself: a stateful
    call that reached it, a read-only call that found its process dead (its state was
    lost), a close or a rebuild. A ``not_found``, ``validation`` or ``capacity`` answer,
    read-only and stateless calls neither start nor end a life."""
    kind = row.get("kind")
    if kind in ("close", "rebuild"):
        return True
    if kind != "call" or row.get("outcome") in NOT_RUN:
        return False
    mode = row.get("state_mode")
    return mode == "stateful" or (mode == "read_only" and bool(row.get("state_lost")))


def lives(rows: list[Row]) -> list[list[Row]]:
    """``rows`` of one session split into lives (see the module docstring); rows of
    calls that did not run in the session (:func:`ran_in_session`) are left out."""
    result: list[list[Row]] = []
    current: list[Row] = []
    for row in rows:
        if not ran_in_session(row):
            continue
        starts_over = row.get("kind") == "rebuild" or bool(row.get("state_lost"))
        if starts_over and current:
            result.append(current)
            current = []
        current.append(row)
        if row.get("kind") == "close":
            result.append(current)
            current = []
    if current:
        result.append(current)
    return result


def replayable(row: Row) -> bool:
    """A stateful call that succeeded on the session's process as it was.

    A call that reported ``state_lost`` is not: it either ended the state itself (a
    shell's ``exit``) or ran on a process that had just been replaced.
    """
    return (row.get("kind") == "call" and row.get("state_mode") == "stateful"
            and row.get("outcome") == "ok" and not row.get("state_lost"))


def _began_with_loss(life: list[Row]) -> bool:
    return bool(life) and bool(life[0].get("state_lost")) and life[0].get("kind") == "call"


def lost_calls(rows: list[Row], *, live: bool) -> list[Row] | None:
    """The calls to replay, oldest first, or None when nothing was lost.

    Args:
        rows: the session's log rows, oldest first.
        live: the session is open in this run and its process is alive.
    """
    life = lost_life(rows, live=live)
    return None if life is None else [row for row in life if replayable(row)]


def failed_in(life: list[Row]) -> list[int]:
    """Seqs of the stateful calls of ``life`` that failed (or never finished): they may
    have changed the state before they failed, and are not replayed."""
    return [row["seq"] for row in life
            if row.get("kind") == "call" and row.get("state_mode") == "stateful"
            and row.get("outcome") != "ok" and not row.get("state_lost")]


def lost_life(rows: list[Row], *, live: bool) -> list[Row] | None:
    """The life whose state was lost (its rows, oldest first), or None when nothing
    was lost; see :func:`lost_calls`."""
    history = lives(rows)
    if not history:
        return None
    if live:
        if not _began_with_loss(history[-1]):
            return None
        history = history[:-1]
    while history and _began_with_loss(history[-1]) and \
            not any(replayable(r) for r in history[-1]) and len(history) > 1:
        history = history[:-1]
    if not history:
        return []
    return history[-1]


def unfinished_rebuild(rows: list[Row]) -> list[int] | None:
    """The seqs a rebuild meant to replay, if the session's current life is that rebuild
    and not all of them replayed (it stopped at a failure): asking again retries it."""
    history = lives(rows)
    if not history or history[-1][0].get("kind") != "rebuild":
        return None
    detail = history[-1][0].get("changed")
    planned = detail.get("replays") if isinstance(detail, dict) else None
    if not isinstance(planned, list):
        return None
    done = {r.get("replay_of") for r in history[-1]
            if r.get("kind") == "call" and r.get("outcome") == "ok"}
    return planned if any(seq not in done for seq in planned) else None


def replay_failed(original: Row, result: dict[str, Any]) -> bool:
    """Whether a replayed call did not do what the original did: an error, or a bash
    command that exited non-zero where the original exited zero."""
    if "error_type" in result:
        return True
    return original.get("exit_code") == 0 and result.get("exit_code") not in (0, None)


