"""The measures of one task's run, from what the calls returned and from the call log.

Pure: rows and results in, numbers out.

- **redone work**: every expensive part prints ``[kit] KEY SECONDS`` (``kit.MARK_LINE``);
  the first run of a key in a task is the work, every later run of the same key is work
  done again, and its seconds count as redo time;
- **the agent's own work**: the calls it made, the characters of code and arguments it
  sent and of results it read, and the seconds coordex spent running them (:class:`Work`);
- **calls by coordinate** and **the coordinates chosen, step by step**: from the call
  log's rows (``Executor.history``), which also hold the calls a stored function made on
  its own; from the runner's own record of a call where the log has no row for it (a
  log turned off, arguments that were not JSON) or a row without its coordinate (a call
  refused before its coordinate was settled).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .kit import work_done


@dataclass
class Work:
    """What an agent did to get a task done, apart from its own thinking: ``calls`` (tool
    calls), ``code_chars`` (characters of the arguments it sent, code included, as JSON
    text), ``result_chars`` (characters of the results it read) and ``exec_s`` (seconds
    coordex spent running its calls)."""

    calls: int = 0
    code_chars: int = 0
    result_chars: int = 0
    exec_s: float = 0.0

    def add(self, arguments: str, result: str, seconds: float) -> None:
        self.calls += 1
        self.code_chars += len(arguments)
        self.result_chars += len(result)
        self.exec_s += seconds

    def record(self) -> dict[str, Any]:
        return {"calls": self.calls, "code_chars": self.code_chars,
                "result_chars": self.result_chars, "exec_s": round(self.exec_s, 3)}


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
    # Whether the call's arguments could be read (a model's may not be JSON at all).
    asked: bool = True


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
        asked=bool(arguments) or bool(where),
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


def _choice(step: int, row: Mapping[str, Any]) -> dict[str, Any]:
    session = row.get("session_name")
    return {"step": step, "language": row.get("language"), "state_mode": row.get("state_mode"),
            "session": session if session is not None else row.get("session_id"),
            "venv_id": row.get("venv_id")}


def _asked(call: CallSeen) -> dict[str, Any]:
    return {"step": call.step, "language": call.language, "state_mode": call.state_mode,
            "session": call.session, "venv_id": call.venv_id}


def choices(rows: Sequence[Mapping[str, Any]], ranges: Sequence[tuple[int, int, int]],
            calls: Sequence[CallSeen]) -> list[dict[str, Any]]:
    """The coordinates chosen, step by step: the log's rows whose seq falls in a step's
    range ``(step, after_seq, last_seq]`` (a stored function's own calls included).

    The log cannot say everything: a row of a call refused for its coordinate has no
    state mode (the answer came before one was settled), and a call whose arguments were
    not even JSON has no row. There the call as the runner saw it speaks: the coordinate
    it asked for, or nothing when it asked for none it could read. ``ranges`` and
    ``calls`` go one for one.
    """
    out: list[dict[str, Any]] = []
    for (step, low, high), call in zip(ranges, calls, strict=True):
        found = [_choice(step, r) for r in rows if low < r["seq"] <= high]
        if not found:
            if call.asked:
                out.append(_asked(call))
            continue
        for choice in found:
            if choice["language"] is None or choice["state_mode"] is None:
                choice = _asked(call) if call.asked else choice
            out.append(choice)
    return out


def by_coordinate(choices: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for choice in choices:
        key = coordinate_key(choice["language"], choice["state_mode"], choice["venv_id"])
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))
