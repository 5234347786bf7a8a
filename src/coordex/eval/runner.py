"""Running the suite under a policy: one Executor per task, on a data folder of its own.

For each task: write its data into a fresh workspace, create its environments and stored
functions (built ahead, so no policy pays for a build), run it, then check what it wrote.
The fixed policies run every step's reference code at the policy's coordinate:

- ``fresh``: stateless, every call (the environment a step needs is kept: without it the
  code cannot run at all);
- ``kept``: stateful in session 0 of the language and environment, every call;
- ``reference``: the coordinate written beside each step, in a session named after the
  task.

``model`` hands the task to an endpoint (:mod:`coordex.eval.model`). A step that fails
does not stop a task (an agent carries on; the checker judges the outcome).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..contract import ExecutorLike
from . import data
from .measures import CallSeen, Work, by_coordinate, redo_seconds, seen
from .measures import choices as choices_of
from .model import Endpoint, drive, step_prompts, task_prompt
from .tasks import Step, Task, Verdict, fill, reference_code

POLICIES = ("fresh", "kept", "reference", "model")
FIXED = ("fresh", "kept", "reference")
CALL_TIMEOUT = 600.0
CODE_TOOLS = ("execute_code", "call_function")


@dataclass
class TaskResult:
    """One task's line of the report (SPEC 13's keys) and a note on why it failed."""

    name: str
    steps: int
    success: bool
    wall_s: float
    redo_s: float
    stale_errors: int
    calls_by_coordinate: dict[str, int]
    tokens: int | None
    choices: list[dict[str, Any]]
    work: Work = field(default_factory=Work)
    note: str = ""
    stale: tuple[str, ...] = ()
    unreachable: bool = False

    def record(self) -> dict[str, Any]:
        return {"name": self.name, "steps": self.steps, "success": self.success,
                "wall_s": self.wall_s, "redo_s": self.redo_s, "stale_errors": self.stale_errors,
                "calls_by_coordinate": self.calls_by_coordinate, "tokens": self.tokens,
                "choices": self.choices, **self.work.record()}


def coordinate(policy: str, task: Task, step: Step, venvs: Mapping[str, int]) -> dict[str, Any]:
    """Where a fixed policy runs ``step``."""
    venv_id = venvs[step.env] if step.env is not None else None
    where: dict[str, Any] = {"language": step.language, "venv_id": venv_id}
    if policy == "fresh":
        return {**where, "state_mode": "stateless"}
    if policy == "kept":
        return {**where, "state_mode": "stateful"}
    if step.mode == "stateless":
        return {**where, "state_mode": "stateless"}
    return {**where, "state_mode": step.mode, "session_name": task.name}


@dataclass
class Workbench:
    """Folders shared by the tasks of one run: the wheels and the built environments."""

    folder: Path
    wheels: Path = field(init=False)
    envs: Path = field(init=False)

    def __post_init__(self) -> None:
        self.wheels = self.folder / "wheels"
        self.envs = self.folder / "envs"
        for version in data.LEDGERLIB:
            data.ledgerlib_wheel(self.wheels, version)


class SetupError(Exception):
    """A task could not be set up (an environment did not build)."""


def _spec(task: Task, key: str, bench: Workbench) -> str:
    return task.environments[key].replace("{wheels}", bench.wheels.resolve().as_uri()) + "\n"


def _setup(ex: ExecutorLike, task: Task, bench: Workbench) -> dict[str, int]:
    venvs: dict[str, int] = {}
    for key in task.environments:
        created = ex.environments.create(_spec(task, key, bench), name=f"{task.name}-{key}")
        built = ex.environments.build(created["venv_id"]) if "venv_id" in created else created
        if "error_type" in built:
            raise SetupError(f"environment {key!r} of {task.name} did not build: {built['error']}")
        venvs[key] = created["venv_id"]
    for source, env in task.functions:
        stored = ex.functions.define(source=source,
                                     env=None if env is None else _spec(task, env, bench))
        if isinstance(stored, dict) and "error_type" in stored:
            raise SetupError(f"a function of {task.name} could not be stored: {stored['error']}")
    return venvs


def _last_seq(ex: ExecutorLike) -> int:
    calls = ex.history(limit=1).get("calls") or []
    return int(calls[-1]["seq"]) if calls else 0


class Steps:
    """The seq range of the log each step's calls fall in, and the calls seen."""

    def __init__(self, ex: ExecutorLike) -> None:
        self.ex = ex
        self.ranges: list[tuple[int, int, int]] = []
        self.calls: list[CallSeen] = []
        self.work = Work()
        self._start = _last_seq(ex)

    def mark(self, step: int) -> None:
        end = _last_seq(self.ex)
        self.ranges.append((step, self._start, end))
        self._start = end

    def choices(self) -> list[dict[str, Any]]:
        rows = self.ex.history(limit=10_000).get("calls") or []
        return choices_of(rows, self.ranges, self.calls)


def _run_fixed(ex: ExecutorLike, policy: str, task: Task, ws: Path, venvs: Mapping[str, int],
               steps: Steps) -> None:
    import json

    for number, step in enumerate(task.steps, start=1):
        where = coordinate(policy, task, step, venvs)
        code = reference_code(task, step, ws, venvs)
        started = time.perf_counter()
        result = ex.execute_code(code, timeout=CALL_TIMEOUT, **where)
        seconds = time.perf_counter() - started
        steps.calls.append(seen(number, result, where))
        steps.work.add(json.dumps({"code": code, **where}), json.dumps(result, default=str),
                       seconds)
        steps.mark(number)


@dataclass(frozen=True)
class ModelSettings:
    """How a model is driven: its endpoint, the tools it is given (``--tools``), whether
    the steps come one at a time (``--stepwise``), and its request budget per task."""

    endpoint: Endpoint
    tools: str = "coordex"
    stepwise: bool = False
    max_turns: int = 40


def _run_model(ex: ExecutorLike, model: ModelSettings, task: Task, ws: Path, venvs: Mapping[str, int],
               steps: Steps) -> tuple[int | None, str, bool, list[Any]]:
    brief = fill(task.brief, ws, venvs)
    says = [fill(step.says, ws, venvs) for step in task.steps]
    prompts = step_prompts(brief, says) if model.stepwise else [task_prompt(brief, says)]

    def on_result(name: str, arguments: Any, result: dict[str, Any]) -> None:
        if name not in CODE_TOOLS:
            return
        number = len(steps.calls) + 1
        args = _arguments(arguments)
        steps.calls.append(seen(number, result, args))
        steps.mark(number)

    run = drive(ex, model.endpoint, prompts, model.max_turns, on_result,
                arm=model.tools, stepwise=model.stepwise)
    steps.work = run.work
    return run.tokens, run.failure or "", run.unreachable, run.messages


def _arguments(arguments: Any) -> dict[str, Any]:
    import json

    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return {}
    return arguments if isinstance(arguments, dict) else {}


def run_task(task: Task, policy: str, bench: Workbench, scale: float, *,
             model: ModelSettings | None = None,
             transcripts: Path | None = None) -> TaskResult:
    """Run one task under ``policy`` and check it."""
    from ..executor import Executor

    place = Path(tempfile.mkdtemp(prefix=f"{task.name}-", dir=bench.folder))
    ws = place / "ws"
    ws.mkdir()
    try:
        facts = task.prepare(ws, scale)
        with Executor(root=place / "home", envs_dir=bench.envs, timeout=CALL_TIMEOUT,
                      read_only_paths=[str(place)]) as ex:
            try:
                venvs = _setup(ex, task, bench)
            except SetupError as exc:
                return _failed(task, str(exc))
            steps = Steps(ex)
            tokens, note, unreachable = None, "", False
            started = time.perf_counter()
            if policy == "model":
                assert model is not None
                tokens, note, unreachable, messages = _run_model(ex, model, task, ws, venvs,
                                                                 steps)
                if transcripts is not None:
                    _save_transcript(transcripts / f"{task.name}.json", messages)
            else:
                _run_fixed(ex, policy, task, ws, venvs, steps)
            wall = time.perf_counter() - started
            chosen = steps.choices()
        verdict = task.check(ws, facts)
    finally:
        shutil.rmtree(place, ignore_errors=True)
    if note:
        verdict = Verdict(False, verdict.stale, note)
    return TaskResult(
        name=task.name, steps=len(task.steps), success=verdict.success,
        wall_s=round(wall, 3), redo_s=redo_seconds(steps.calls),
        stale_errors=len(verdict.stale), calls_by_coordinate=by_coordinate(chosen),
        tokens=tokens, choices=chosen, work=steps.work, note=verdict.reason, stale=verdict.stale,
        unreachable=unreachable)


def _failed(task: Task, why: str, unreachable: bool = False) -> TaskResult:
    return TaskResult(task.name, len(task.steps), False, 0.0, 0.0, 0, {}, None, [], note=why,
                      unreachable=unreachable)


def _save_transcript(path: Path, messages: list[Any]) -> None:
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(messages, indent=1, default=str), encoding="utf-8")


def run_suite(tasks: Sequence[Task], policy: str, scale: float, *,
              model: ModelSettings | None = None,
              transcripts: Path | None = None,
              on_task: Callable[[TaskResult], None] | None = None) -> list[TaskResult]:
    """Every task of ``tasks`` under ``policy``; a task that cannot run is failed with a
    note, and once an endpoint is unreachable the tasks left fail with its reason."""
    results: list[TaskResult] = []
    with tempfile.TemporaryDirectory(prefix="coordex-eval-") as folder:
        bench = Workbench(Path(folder))
        gone: TaskResult | None = None
        for task in tasks:
            if gone is not None:
                result = _failed(task, gone.note, unreachable=True)
            else:
                try:
                    result = run_task(task, policy, bench, scale, model=model,
                                      transcripts=transcripts)
                except Exception as exc:  # a fault of the eval's or coordex's: the run goes on
                    result = _failed(task, f"the task could not run: {type(exc).__name__}: {exc}")
                if result.unreachable:
                    gone = result
            results.append(result)
            if on_task is not None:
                on_task(result)
    return results
