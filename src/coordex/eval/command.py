"""``coordex eval``: run the suite under a policy, write the report, print the table.

Exit codes as the rest of the command line: 0 the report is written (whatever the tasks'
outcome: a failed task is a finding, not a failure of the run), 1 the endpoint could not
be used, 2 a bad command line (an unknown task, ``--policy model`` without ``--base-url``
or ``--model``, an ``--out`` folder that cannot be written).
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
import time
from pathlib import Path
from typing import Any

from .runner import TaskResult

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


def _say(*parts: object) -> None:
    print("coordex eval:", *parts, file=sys.stderr, flush=True)


def _tasks(text: str | None, suite: str = "default") -> list[str] | str:
    """The task names ``--tasks`` asks for, or a message naming what is wrong."""
    from .suite import BY_NAME, SUITES

    tasks = SUITES[suite]
    if not text:
        return [task.name for task in tasks]
    names = [n.strip() for n in text.split(",") if n.strip()]
    for name in names:
        if name not in BY_NAME:
            near = difflib.get_close_matches(name, list(BY_NAME), n=1)
            hint = f" Did you mean {near[0]!r}?" if near else ""
            return f"no task named {name!r}.{hint} 'coordex eval --list' names them all."
    return names or [task.name for task in tasks]


def _unwritable(out: Path) -> str | None:
    """Why ``out`` cannot take the report, or None: checked before hours of work."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".coordex-eval-probe"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        return str(exc.strerror or exc)
    return None


def run(args: argparse.Namespace) -> int:
    from .suite import BY_NAME, SUITES

    suite = getattr(args, "suite", "default")
    if args.list:
        for task in SUITES[suite]:
            print(task.name)
        return EXIT_OK
    chosen = _tasks(args.tasks, suite)
    if isinstance(chosen, str):
        _say(chosen)
        return EXIT_USAGE
    endpoint = None
    if args.policy == "model":
        if not args.base_url or not args.model:
            _say("--policy model needs --base-url URL and --model NAME (an OpenAI-compatible "
                 "Chat Completions endpoint; the key is read from OPENAI_API_KEY).")
            return EXIT_USAGE
        if not args.base_url.startswith(("http://", "https://")):
            _say(f"--base-url must be an http:// or https:// address, got {args.base_url!r} "
                 "(e.g. https://api.openai.com/v1).")
            return EXIT_USAGE
        from .model import Endpoint

        endpoint = Endpoint(args.base_url, args.model, os.environ.get("OPENAI_API_KEY") or None,
                            timeout=args.request_timeout)
    elif args.base_url or args.model or args.tools != "coordex" or args.stepwise:
        _say("--base-url, --model, --tools and --stepwise are for --policy model; ignored "
             f"under {args.policy!r}.")
    return _run(args, [BY_NAME[n] for n in chosen], endpoint)


def _run(args: argparse.Namespace, tasks: list[Any], endpoint: Any) -> int:
    from . import report as reports
    from .runner import ModelSettings, run_suite

    out = Path(args.out).expanduser()
    problem = _unwritable(out)
    if problem:
        _say(f"cannot write the report into {str(out)!r}: {problem}. Pass --out DIR with a "
             "folder you can write.")
        return EXIT_USAGE
    total = len(tasks)
    done: list[TaskResult] = []
    model = (ModelSettings(endpoint, tools=args.tools, stepwise=args.stepwise,
                           max_turns=args.max_turns) if endpoint is not None else None)
    _say(f"{total} task(s), policy {args.policy}"
         + (f" ({args.model} at {args.base_url}, tools {args.tools}"
            + (", stepwise)" if args.stepwise else ")") if endpoint is not None else "")
         + f", scale {args.scale:g}")
    started = time.monotonic()

    def progress(result: TaskResult) -> None:
        done.append(result)
        status = "ok" if result.success else f"FAILED: {result.note}"
        _say(f"[{len(done)}/{total}] {result.name}: {status} ({result.wall_s:.1f} s)")

    results = run_suite(tasks, args.policy, args.scale, model=model,
                        transcripts=out / "transcripts" if endpoint is not None else None,
                        on_task=progress)
    report = reports.build(args.policy, args.model if endpoint is not None else None, results,
                           tools=args.tools if endpoint is not None else None)
    print(reports.table(report))
    try:
        notes = reports.write(report, results, out, args.scale,
                              stepwise=bool(args.stepwise and endpoint is not None))
    except OSError as exc:
        _say(f"cannot write the report into {str(out)!r}: {exc.strerror or exc}.")
        return EXIT_FAILURE
    for note in notes:
        _say(note)
    written = "report.json, report.md" + ("" if notes else " and report.png")
    _say(f"{written} in {out} "
         f"({time.monotonic() - started:.0f} s in all)")
    if any(r.unreachable for r in results):
        _say(f"the endpoint could not be used: {next(r.note for r in results if r.unreachable)}")
        return EXIT_FAILURE
    return EXIT_OK
