"""What a task is: steps (an instruction, the reference code, the reference coordinate),
the builders that bring back a missing name, the data it needs, and a checker of its
outcome.

Pure: no process, no disk beyond what a task's ``prepare`` and ``check`` are handed.

The reference code of a step is the same under every fixed policy, and it is written
the way an agent writes code that must survive a fresh sandbox: each name the step
reads and did not build itself is rebuilt when missing (``if "ledger" not in
globals(): ...``). That one idiom is what makes the policies differ: in a fresh sandbox
it rebuilds every time (redone work), in one interpreter kept for good it finds the name
an abandoned attempt left behind (a stale name), and in the reference's coordinates it
finds what the task built, or nothing an attempt left.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.coordinates import Language, StateMode


@dataclass(frozen=True)
class Step:
    """One step. ``says`` is what a model reads; ``code`` what the reference runs at
    ``mode`` (in the task's own session when stateful or read_only). ``{ws}`` in either
    is the workspace folder; ``{venv:KEY}`` the id of the task's environment KEY."""

    says: str
    code: str
    mode: StateMode = "stateful"
    language: Language = "python"
    needs: tuple[str, ...] = ()
    env: str | None = None


@dataclass(frozen=True)
class Verdict:
    """A checker's finding: ``stale`` names the planted names whose values showed up
    in an output (each is one stale-name error); ``reason`` says what was wrong."""

    success: bool
    stale: tuple[str, ...] = ()
    reason: str = ""


@dataclass(frozen=True)
class Task:
    """A long task. ``builders`` maps a name to (the names it needs, the code that binds
    it); ``prepare(ws, scale)`` writes the data and returns facts for ``check(ws,
    facts)``; ``environments`` maps a key to a requirements text (``{wheels}`` is the
    wheel folder); ``functions`` are stored before the task starts: (source, env key)."""

    name: str
    title: str
    brief: str
    steps: tuple[Step, ...]
    prepare: Callable[[Path, float], dict[str, Any]]
    check: Callable[[Path, dict[str, Any]], Verdict]
    builders: Mapping[str, tuple[tuple[str, ...], str]] = field(default_factory=dict)
    environments: Mapping[str, str] = field(default_factory=dict)
    functions: tuple[tuple[str, str | None], ...] = ()


def fill(text: str, ws: Path, venvs: Mapping[str, int]) -> str:
    """``text`` with ``{ws}`` and ``{venv:KEY}`` put in (no other braces are touched)."""
    text = text.replace("{ws}", str(ws))
    for key, venv_id in venvs.items():
        text = text.replace("{venv:" + key + "}", str(venv_id))
    return text


def _order(task: Task, needs: tuple[str, ...]) -> list[str]:
    """The builders ``needs`` calls for, each after the ones it needs itself."""
    done: list[str] = []

    def visit(name: str) -> None:
        if name in done:
            return
        for dep in task.builders[name][0]:
            visit(dep)
        done.append(name)

    for name in needs:
        visit(name)
    return done


def reference_code(task: Task, step: Step, ws: Path, venvs: Mapping[str, int]) -> str:
    """The code the fixed policies run for ``step``: the kit import (own-interpreter
    Python), a guard per needed name, then the step's own code."""
    if step.language == "bash" or step.env is not None:
        return fill(step.code, ws, venvs)
    lines = ["from coordex.eval import kit"]
    for name in _order(task, step.needs):
        body = task.builders[name][1].strip("\n")
        lines.append(f"if {name!r} not in globals():")
        lines.extend("    " + line if line else "" for line in body.splitlines())
    lines.append(step.code.strip("\n"))
    return fill("\n".join(lines) + "\n", ws, venvs)


def same(a: Any, b: Any) -> bool:
    """Equal, floats within a millionth (JSON round trips keep them; this is slack)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


def judge(found: Any, expected: Any, stale: Mapping[str, Any], what: str) -> Verdict:
    """``found`` against the right value and the values each planted name would give."""
    if same(found, expected):
        return Verdict(True)
    names = tuple(name for name, value in stale.items() if same(found, value))
    if names:
        return Verdict(False, names, f"{what} holds the value the left-over {names[0]!r} gives")
    return Verdict(False, (), f"{what} is not the expected value")


def judge_file(ws: Path, relative: str, expected: Any, stale: Mapping[str, Any]) -> Verdict:
    """:func:`judge` of the JSON file ``ws/relative`` (missing or unreadable: failed)."""
    import json

    path = ws / relative
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return Verdict(False, (), f"{relative} was not written")
    except (OSError, ValueError) as exc:
        return Verdict(False, (), f"{relative} cannot be read: {exc}")
    return judge(found, expected, stale, relative)


def all_of(*verdicts: Verdict) -> Verdict:
    stale = tuple(dict.fromkeys(name for v in verdicts for name in v.stale))
    reasons = "; ".join(v.reason for v in verdicts if v.reason)
    return Verdict(all(v.success for v in verdicts), stale, reasons)
