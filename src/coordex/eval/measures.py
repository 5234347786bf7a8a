"""The measures of one task's run, from what the calls returned and from the call log.

Pure: rows and results in, numbers out.

- **redone work**: every expensive part prints ``[kit] KEY SECONDS`` (``kit.MARK_LINE``);
  the first run of a key in a task is the work, every later run of the same key is work
  done again, and its seconds count as redo time;
- **calls by coordinate** and **the coordinates chosen, step by step**: from the call
  log's rows (``Executor.history``), which also hold the calls a stored function made on
  its own; from the runner's own record of each call where the log has none (a log
  turned off or unreadable).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .kit import work_done


@dataclass
class CallSeen:
    """One code-running call as the runner saw it: the step it belongs to, where it
    ran (from the result, else from its arguments), and the work its output reported."""

    step: int
    language: str | None
    state_mode: str | None
    session: str | int | None
    venv_id: int | None
    outcome: str
    work: list[tuple[str, float]] = field(default_factory=list)


def seen(step: int, result: Mapping[str, Any], arguments: Mapping[str, Any]) -> CallSeen:
    """A :class:`CallSeen` of ``result``, the answer to a call made with ``arguments``."""
    session_record = result.get("session")
    where: Mapping[str, Any] = session_record if isinstance(session_record, dict) else {}
    session = where.get("session_name")
    if session is None:
        session = where.get("session_id")
    if session is None and not where:
        session = arguments.get("session_name", arguments.get("session_id"))
    text = "\n".join(str(result.get(k) or "") for k in ("stdout", "stderr"))
    return CallSeen(
        step=step,
        language=where.get("language") or arguments.get("language") or "python",
        state_mode=result.get("state_mode") or arguments.get("state_mode") or "stateless",
        session=session,
        venv_id=where.get("venv_id", arguments.get("venv_id")),
        outcome=str(result.get("error_type") or "ok"),
        work=work_done(text),
    )


def redo_seconds(calls: Iterable[CallSeen]) -> float:
    """Seconds spent on expensive parts already run earlier in the task."""
    done: set[str] = set()
    redo = 0.0
    for call in calls:
        for key, seconds in call.work:
            if key in done:
                redo += seconds
            done.add(key)
    return round(redo, 3)


def coordinate_key(language: Any, state_mode: Any, venv_id: Any) -> str:
    """``"LANG/MODE/ENV"``: ENV is ``own`` (the agent's interpreter) or ``venvN``."""
    env = "own" if venv_id is None else f"venv{venv_id}"
    return f"{language or '?'}/{state_mode or '?'}/{env}"


def choices_from_log(rows: Sequence[Mapping[str, Any]],
                     steps: Sequence[tuple[int, int, int]]) -> list[dict[str, Any]]:
    """The log's ``rows`` as choices, each given the step whose seq range
    ``(step, after_seq, last_seq]`` holds it."""
    out = []
    for row in rows:
        step = next((s for s, low, high in steps if low < row["seq"] <= high), None)
        if step is None:
            continue
        session = row.get("session_name")
        out.append({"step": step, "language": row.get("language"),
                    "state_mode": row.get("state_mode"),
                    "session": session if session is not None else row.get("session_id"),
                    "venv_id": row.get("venv_id")})
    return out


def choices_from_calls(calls: Iterable[CallSeen]) -> list[dict[str, Any]]:
    return [{"step": c.step, "language": c.language, "state_mode": c.state_mode,
             "session": c.session, "venv_id": c.venv_id} for c in calls]


def by_coordinate(choices: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for choice in choices:
        key = coordinate_key(choice["language"], choice["state_mode"], choice["venv_id"])
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))
