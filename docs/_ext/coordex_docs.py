"""The reference pages the code holds, written at build time (never copied by hand).

Sphinx calls :func:`write_all` when the builder starts (``builder-inited``), before any
page is read; each page under ``docs/generated/`` (git-ignored) is the Markdown one
function here returns, and the hand-written pages ``{include}`` them:

- ``tools.md`` and ``tool-formats.md``: every tool, from ``tool_definitions`` (the
  function ``Executor.tool_definitions`` and the MCP server render with), in every format;
- ``errors.md``: every ``error_type``, what it means, and what the model is told, from
  the pure core's own constructors (the same ones every place goes through);
- ``call-endings.md``: every event a place reports (``core/facts.py``) in every mode, as
  ``core/record.render`` words it, with the ``state_lost`` the core decides;
- ``cli.md``: ``coordex --help`` and every command's help, from the argument parser;
- ``executor-options.md``: the ``Executor`` constructor's options and defaults;
- ``view.md``: what a confined host's file view holds (``hosting/view.py``);
- ``benchmarks.md``: the benchmarks ``benchmarks/run.py`` runs and the goals it holds.

``tests/unit/test_reference_docs.py`` holds these pages to the code.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from coordex import Executor
from coordex.cli import build_parser
from coordex.core import facts
from coordex.core.coordinates import check_coordinate
from coordex.core.errors import ERROR_MEANINGS, ERROR_TYPES, CoordexError
from coordex.core.messages import WORDS, build_outside_spec, detached_busy, environment_not_found
from coordex.core.record import Settled, render_error
from coordex.core.registry import SessionRegistry
from coordex.tools import FORMATS, TOOL_NAMES, tool_definitions

MODES = ("stateless", "stateful", "read_only")
GENERATED_NOTE = ("<!-- Written by docs/_ext/coordex_docs.py at build time from the code; "
                  "do not edit. -->\n\n")


def _cell(text: object) -> str:
    """``text`` fit for one cell of a Markdown table."""
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ").strip()


def _code(text: object) -> str:
    """``text`` as inline code, whatever backticks it holds."""
    value = str(text)
    fence = "``" if "`" in value else "`"
    pad = " " if value.startswith("`") or value.endswith("`") else ""
    return f"{fence}{pad}{value}{pad}{fence}"


def _type(schema: dict[str, Any]) -> str:
    if "enum" in schema:
        return " \\| ".join(_code(json.dumps(v)) for v in schema["enum"])
    kind = schema.get("type", "any")
    if "anyOf" in schema or "oneOf" in schema:
        kind = [_type(s) for s in schema.get("anyOf", schema.get("oneOf", []))]
        return " or ".join(kind)
    if isinstance(kind, list):
        return " or ".join(kind)
    if kind == "array" and isinstance(schema.get("items"), dict):
        return f"array of {_type(schema['items'])}"
    return str(kind)


# --- tools ---------------------------------------------------------------------------------


def tools_page() -> str:
    """Every tool as a model sees it over MCP: title, description, arguments, result."""
    out = [GENERATED_NOTE]
    for tool in tool_definitions("mcp"):
        out.append(f"## `{tool['name']}`\n\n**{tool['title']}**\n\n")
        out.append(f"```text\n{tool['description']}\n```\n\n")
        hints = ", ".join(f"`{k}`: {json.dumps(v)}" for k, v in tool["annotations"].items()
                          if k != "title")
        out.append(f"Annotations: {hints}.\n\n")
        properties = tool["inputSchema"].get("properties", {})
        required = set(tool["inputSchema"].get("required", []))
        if properties:
            out.append("| argument | type | required | description |\n|---|---|---|---|\n")
            for name, prop in properties.items():
                out.append(f"| `{name}` | {_cell(_type(prop))} | "
                           f"{'yes' if name in required else 'no'} | "
                           f"{_cell(prop.get('description', ''))} |\n")
            out.append("\n")
        else:
            out.append("No arguments.\n\n")
        result = tool["outputSchema"]
        keys = sorted({k for branch in result.get("anyOf", [result])
                       for k in branch.get("properties", {})})
        if keys:
            out.append("Result keys (or the error dict): "
                       + ", ".join(f"`{k}`" for k in keys) + ".\n\n")
    return "".join(out)


def _format_variants() -> Iterator[tuple[str, str, bool]]:
    for format in FORMATS:
        yield format, f"`format={format!r}`", False
        if format != "mcp":
            yield format, f"`format={format!r}, strict=True`", True


def tool_formats_page() -> str:
    """Every tool in every format, as ``tool_definitions`` renders it (default timeouts)."""
    out = [GENERATED_NOTE]
    for format, label, strict in _format_variants():
        out.append(f"## {label}\n\n")
        for tool in tool_definitions(format, strict=strict):
            name = tool.get("name") or tool["function"]["name"]
            out.append(f"### {name} ({format}{', strict' if strict else ''})\n\n")
            out.append("```json\n" + json.dumps(tool, indent=2) + "\n```\n\n")
    return "".join(out)


# --- errors --------------------------------------------------------------------------------


def _raised(make: Callable[[], object]) -> dict[str, Any]:
    try:
        made = make()
    except CoordexError as exc:
        return exc.to_dict()
    if isinstance(made, CoordexError):
        return made.to_dict()
    assert isinstance(made, dict), made
    return made


def _full_registry() -> None:
    registry = SessionRegistry(max_sessions=2)
    registry.resolve_or_reserve(check_coordinate("python", "stateful", session_name="audit"), 0)
    registry.check_capacity()


_TLS_FAILURE = ("error: Request failed after 3 retries: invalid peer certificate: "
                "UnknownIssuer (https://pypi.internal.example/simple/pandas/)")
_DIED = facts.Ran(event=facts.Died("process", "killed by SIGKILL"))
_RAISED = facts.Ran(event=facts.Raised(
    "ZeroDivisionError", "division by zero",
    'Traceback (most recent call last):\n  File "<cell>", line 1, in <module>\n'
    "ZeroDivisionError: division by zero\n"))
_TIMED_OUT = facts.Ran(event=facts.TimedOut(survived=True))

# One real case per error_type, made by the constructors the code itself calls.
def _said(ran: facts.Ran, mode: Any, *, lost: bool, attempts: int = 1,
          place: Any = "worker") -> dict[str, Any]:
    """The error a call that ended in ``ran`` is told (a 60 s timeout; {}: a success),
    as :func:`coordex.core.record.render` words it."""
    settled = Settled(ran, place, mode, 60, attempts=attempts, lost=lost)
    return render_error(settled) if settled.errored else {}


ERROR_EXAMPLES: dict[str, tuple[str, Callable[[], object]]] = {
    "validation": ("`execute_code(\"x\", state_mode=\"read_only\")`",
                   lambda: check_coordinate("python", "read_only")),
    "not_found": ("`execute_code(\"1\", venv_id=7)` where only environment 1 exists",
                  lambda: environment_not_found(7, [(1, "pandas<2")])),
    "capacity": ("a stateful call opening one session more than `max_sessions=2` allow",
                 _full_registry),
    "execution": ("`1/0`, stateful, in an environment's worker",
                  lambda: _said(_RAISED, "stateful", lost=False)),
    "timeout": ("`time.sleep(999)`, stateful, in an environment's worker, interrupted",
                lambda: _said(_TIMED_OUT, "stateful", lost=False)),
    "crashed": ("the worker killed (SIGKILL) under a stateful call, after its retry",
                lambda: _said(_DIED, "stateful", lost=True, attempts=2)),
    "busy": ("a stateful call to a session whose earlier call returned `running` and still "
             "runs", lambda: detached_busy("c-7f3a")),
    "environment": ("a build whose index's certificate is not trusted (a corporate CA)",
                    lambda: build_outside_spec("the environment 'pandas<2'", _TLS_FAILURE,
                                               "coordex.toml")),
}


def errors_page() -> str:
    """Every ``error_type``: what it means, and one case with what the model is told."""
    out = [GENERATED_NOTE, "| `error_type` | when |\n|---|---|\n"]
    for error_type in ERROR_TYPES:
        out.append(f"| `{error_type}` | {_cell(ERROR_MEANINGS[error_type])} |\n")
    out.append("\n")
    for error_type in ERROR_TYPES:
        if error_type not in ERROR_EXAMPLES:
            continue
        label, make = ERROR_EXAMPLES[error_type]
        record = _raised(make)
        assert record["error_type"] == error_type, (error_type, record)
        shown = {k: record[k] for k in ("error", "error_type", "suggestion")}
        out.append(f"## `{error_type}`\n\n{label}:\n\n")
        out.append("```json\n" + json.dumps(shown, indent=2, ensure_ascii=False) + "\n```\n\n")
    return "".join(out)


# --- how a call ends -----------------------------------------------------------------------

# Each event a place reports, in the variants the core words differently.
EVENTS: list[tuple[str, facts.Event]] = [
    ("Ok()", facts.Ok()),
    ("Exited(status=3)", facts.Exited(3)),
    ("Raised(...)", _RAISED.event),
    ("TimedOut(survived=True)", facts.TimedOut(survived=True)),
    ("TimedOut(survived=False)", facts.TimedOut(survived=False)),
    ("TimedOut(survived=False, stuck=True)", facts.TimedOut(survived=False, stuck=True)),
    ("TimedOut(survived=False, taken=False)", facts.TimedOut(survived=False, taken=False)),
    ("Died('process', ...)", _DIED.event),
    ("Died('copy', ...)", facts.Died("copy", "killed by SIGKILL")),
    ("Died('node', ..., taken=True)", facts.Died("node", "the node left the cluster",
                                                  taken=True)),
    ("Closed(by='session', during=False)", facts.Closed("session", during=False)),
    ("Closed(by='session')", facts.Closed("session")),
    ("Closed(by='executor')", facts.Closed("executor")),
    ("StartFailed(reason=...)", facts.StartFailed("fork failed: out of memory")),
    ("StartFailed(copy=True)", facts.StartFailed("fork failed: out of memory", copy=True)),
    ("Busy()", facts.Busy()),
    ("Busy(stuck=True)", facts.Busy(stuck=True)),
]

# The place each event is worded for here; every place reads the same but for its name.
_PLACE_OF = {"Died('node', ..., taken=True)": "cluster"}


def call_endings_page() -> str:
    """Each event in each mode: ``error_type``, ``state_lost``, and the words."""
    out = [GENERATED_NOTE, "The process each place names in these words:\n\n",
           "| place | named |\n|---|---|\n"]
    for place, words in WORDS.items():
        out.append(f"| `{place}` | {words.process} |\n")
    out.append("\n")
    for label, event in EVENTS:
        kind = type(event)
        place = _PLACE_OF.get(label, "worker")
        doc = inspect.cleandoc(kind.__doc__ or "").split("\n\n")[0].replace("\n", " ")
        out.append(f"## `{label}`\n\n{doc}\n\n")
        out.append("| mode | `error_type` | `state_lost` | error | suggestion |\n"
                   "|---|---|---|---|---|\n")
        for mode in MODES:
            ran = facts.Ran(event=event)
            lost = facts.lost_state(ran, mode)
            error = _said(ran, mode, lost=lost, place=place)
            out.append(f"| `{mode}` | {_cell(error.get('error_type', '(success)'))} | "
                       f"{'true' if lost else 'false'} | "
                       f"{_cell(error.get('error', ''))} | "
                       f"{_cell(error.get('suggestion', ''))} |\n")
        out.append("\n")
    return "".join(out)


# --- the command line and the Executor's options -----------------------------------------


def _parsers(parser: argparse.ArgumentParser, prog: str) -> Iterator[tuple[str, Any]]:
    yield prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{prog} {name}")


def cli_page() -> str:
    """``--help`` of ``coordex`` and of every command, at a fixed width."""
    os.environ["COLUMNS"] = "88"
    out = [GENERATED_NOTE]
    for prog, parser in _parsers(build_parser(), "coordex"):
        out.append(f"## `{prog}`\n\n```text\n{parser.format_help().rstrip()}\n```\n\n")
    return "".join(out)


def _documented_args(doc: str) -> dict[str, str]:
    """``Args:`` entries of a Google-style docstring, by name."""
    section = doc.split("Args:", 1)[1].split("\n\n", 1)[0] if "Args:" in doc else ""
    found: dict[str, str] = {}
    for match in re.finditer(r"^ {8}(\w+): (.*?)(?=^ {8}\w+: |\Z)", section, re.M | re.S):
        found[match.group(1)] = " ".join(match.group(2).split())
    return found


def executor_options_page() -> str:
    """The ``Executor`` constructor's options, defaults and meaning."""
    documented = _documented_args(Executor.__doc__ or "")
    out = [GENERATED_NOTE, "| option | default | meaning |\n|---|---|---|\n"]
    for name, param in inspect.signature(Executor.__init__).parameters.items():
        if name == "self":
            continue
        default = "(required)" if param.default is param.empty else repr(param.default)
        out.append(f"| `{name}` | `{default}` | {_cell(documented.get(name, ''))} |\n")
    return "".join(out)


def view_page() -> str:
    """What a confined host's file view holds, from the lists the view is built from."""
    from coordex.hosting import view

    def listed(items: tuple[str, ...]) -> str:
        return ", ".join(f"`{item}`" for item in items)

    rows = [
        ("its folder (`ROOT/tenants/NAME`, or `--confine DIR`): working folder and `HOME`",
         "read-write"),
        ("a private `/tmp` and `/dev/shm`", "read-write, bounded by `--memory-limit`"),
        (f"{listed(view.SYSTEM_DIRS)} (those the machine has), and {listed(view.SYS_READ)}",
         "read-only"),
        (f"from `/etc`: {listed(view.ETC_FILES)} (those the machine has) — and a "
         "`passwd`/`group` of its own naming only `root`, `nobody` and the tenant",
         "read-only"),
        (f"from `/dev`: {listed(view.DEVICE_NODES)}, a `devpts` of its own (`/dev/pts`, "
         "`/dev/ptmx`); `/proc` of its own pid namespace", ""),
        ("the Python installation coordex runs on, coordex itself, uv",
         "read-only, at their own paths"),
        ("its built environments", "read-only (its builder process alone writes them)"),
        ("its call log and stored functions (`ROOT/records/tenants/NAME`)",
         "read-only: written by the server"),
        ("each folder the operator names with `--readable DIR` (repeatable; "
         "`ConfinedExecutor(readable=[...])`), e.g. a wheelhouse",
         "read-only, at its own path"),
    ]
    out = [GENERATED_NOTE, "| in the view | how |\n|---|---|\n"]
    out.extend(f"| {what} | {how} |\n" for what, how in rows)
    return "".join(out)


def _bench_runner() -> Any:
    """``benchmarks/run.py`` loaded as a module (it is a script, not a package)."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "run.py"
    spec = importlib.util.spec_from_file_location("coordex_bench_run", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def benchmarks_page() -> str:
    """What ``benchmarks/run.py`` runs (by default, or with ``--all``) and its goals."""
    run = _bench_runner()
    out = [GENERATED_NOTE, "| script | measures | runs | the code it covers |\n"
           "|---|---|---|---|\n"]
    for bench in run.BENCHES:
        command = " ".join([f"{bench.script}.py", *bench.args])
        covers = ", ".join(f"`{c}`" for c in bench.covers)
        out.append(f"| `{command}` | {_cell(bench.what)} | "
                   f"{'by default' if bench.default else 'with `--all`'} | {covers} |\n")
    out.append("\n| goal | held to |\n|---|---|\n")
    for goal in run.GOALS:
        out.append(f"| {_cell(goal.what)} | {_cell(goal.goal())} |\n")
    return "".join(out)


PAGES: dict[str, Callable[[], str]] = {
    "benchmarks.md": benchmarks_page,
    "view.md": view_page,
    "tools.md": tools_page,
    "tool-formats.md": tool_formats_page,
    "errors.md": errors_page,
    "call-endings.md": call_endings_page,
    "cli.md": cli_page,
    "executor-options.md": executor_options_page,
}


def write_all(folder: Path) -> list[Path]:
    """Write every generated page into ``folder``; a page whose text is unchanged is
    left alone (so Sphinx does not re-read it)."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, make in PAGES.items():
        path = folder / name
        text = make()
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
        written.append(path)
    return written


def _on_builder_inited(app: Any) -> None:
    write_all(Path(app.srcdir) / "generated")


def setup(app: Any) -> dict[str, Any]:
    app.connect("builder-inited", _on_builder_inited)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}


__all__ = ["PAGES", "TOOL_NAMES", "write_all"]
