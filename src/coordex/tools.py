"""Tool descriptions and JSON schemas: what a model reads about coordex, written once.

Every front end shows the model the same tools. This module holds them as plain data
(:data:`TOOLS`: name, description, JSON schema of the arguments, behaviour hints) and
renders them in the three dialects agent frameworks expect:

- ``openai``: ``{"type": "function", "function": {"name", "description", "parameters"}}``
- ``anthropic``: ``{"name", "description", "input_schema"}``
- ``mcp``: ``{"name", "description", "inputSchema", "annotations"}``

:func:`call_tool` maps a tool call (name + argument dict, as a model sent it) onto the
:class:`~coordex.Executor` method behind it, so an MCP server, an OpenAI loop or an
Anthropic loop all dispatch the same way. Unknown tools, unknown arguments and missing
required arguments come back as ``validation`` error dicts (SPEC section 4), never as
exceptions; everything else (types, modes, session rules) is the executor's to check.

The tools come in three groups: sessions (``execute_code``, ``list_sessions``,
``inspect_session``, ``close_session``, ``rebuild_session``), environments
(``list_environments``, ``create_environment``) and the stored-function library (``list_functions``,
``show_function``, ``define_function``, ``call_function``), which places a stored
function at a coordinate exactly as ``execute_code`` places code.

This module imports nothing that starts a process or touches the disk.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from .core.errors import CoordexError, make_error, nearest, quoted_list

ToolFormat = Literal["openai", "anthropic", "mcp"]
FORMATS: tuple[ToolFormat, ...] = ("openai", "anthropic", "mcp")
OnOutput = Callable[[str, str], None]


@dataclass(frozen=True)
class ToolSpec:
    """One tool as data. ``parameters`` is a JSON schema object (draft 2020-12 subset)."""

    name: str
    description: str
    parameters: dict[str, Any]
    read_only: bool = False
    destructive: bool = False
    idempotent: bool = False
    # Whether the tool reaches beyond coordex's own state (code can touch anything).
    open_world: bool = False
    title: str = ""
    required: tuple[str, ...] = field(default=())


# --- argument descriptions, shared by every tool that takes a session coordinate -------

_LANGUAGE = {
    "type": "string",
    "enum": ["python", "bash"],
    "default": "python",
    "description": "Language of the code or session: 'python' or 'bash'. A Python session "
    "and a bash session with the same id or name are unrelated.",
}
_SESSION_ID = {
    "type": "integer",
    "minimum": 0,
    "description": "Number of the kept session to use (>= 0). Give session_id or "
    "session_name, never both.",
}
_SESSION_NAME = {
    "type": "string",
    "minLength": 1,
    "maxLength": 200,
    "description": "Name of the kept session, e.g. 'audit'. A new name opens a new session "
    "on its first stateful call. Give session_name or session_id, never both.",
}
_VENV_ID = {
    "type": "integer",
    "minimum": 0,
    "description": "Dedicated environment to run in (from create_environment / "
    "list_environments). Omit to use the agent's own interpreter. Sessions in different "
    "environments are unrelated even with the same id.",
}
_TIMEOUT = {
    "type": "number",
    "exclusiveMinimum": 0,
    "maximum": 604800,
    "description": "Seconds before the code is interrupted (default 60). "
    "Environment builds do not count against it.",
}
_FUNCTION_NAME = {
    "type": "string",
    "minLength": 1,
    "description": "Name of the stored function, as list_functions shows it.",
}
_FUNCTION_VERSION = {
    "type": "integer",
    "minimum": 1,
    "description": "A stored version of the function (see 'versions'); omit for the latest.",
}
_STATE_MODES = ["stateless", "stateful", "read_only"]
# The arguments of every tool that names one session and nothing else.
_SESSION_COORDINATE = {
    "language": _LANGUAGE,
    "session_id": _SESSION_ID,
    "session_name": _SESSION_NAME,
    "venv_id": _VENV_ID,
}


def _object(properties: dict[str, Any], required: Iterable[str] = ()) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


_EXECUTE_CODE_DESCRIPTION = """\
Run Python or bash code and get back stdout, stderr, the value of the last expression \
(Python), the exit code (bash), and any figures as images.

Choose state_mode by what the code is for:
- stateful: work of several steps (load, then analyse) - names, files opened and the \
working directory stay in the session for the next call.
- stateless: a one-off check - fresh namespace or shell, nothing is kept afterwards.
- read_only: a look that must not change anything - runs against a copy of an existing \
session; whatever it changes or writes is discarded (the result's "isolation" says which \
guarantees held).

Sessions: stateful without a session uses session 0; name one with session_name \
(e.g. 'audit') or session_id, never both. read_only must name an existing session; \
stateless must not name one. venv_id runs in a dedicated environment with its own \
packages (see create_environment); omit it for the agent's own interpreter. Errors come \
back as {"error", "error_type", "suggestion"}: follow the suggestion."""

_CALL_FUNCTION_DESCRIPTION = """\
Call a stored function (see list_functions / define_function) with JSON arguments and \
get back its return value as "value" (plain JSON; bytes as {"__bytes__": base64}), plus \
what it printed. A function stored with an env runs in that environment.

Choose state_mode by what the call is for:
- stateful: let the function change a session - it runs inside the kept session (session 0 \
when none is named), which keeps the function and whatever it changed for later calls.
- read_only: try it against a copy of an existing session first - it sees the session's \
state, and nothing it changes or writes is kept (the result's "isolation" says which \
guarantees held).
- stateless: a one-off - a fresh namespace, nothing is kept.

Sessions are Python sessions, named as in execute_code: session_name or session_id, never \
both; read_only must name an existing session; stateless must not name one. Errors come \
back as {"error", "error_type", "suggestion"}: follow the suggestion."""

_DEFINE_FUNCTION_DESCRIPTION = """\
Store a Python function in the library so it can be called later (call_function, or \
functions.NAME(...) inside execute_code Python) - it survives restarts. The source must \
be self-contained: put imports and helpers inside the function or around it in source. \
Storing the same source and env again keeps the version; anything else adds a new \
version (older ones stay callable). Returns the stored record: name, version, signature, \
doc, env, venv_id, versions."""


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        name="execute_code",
        title="Execute code",
        description=_EXECUTE_CODE_DESCRIPTION,
        parameters=_object(
            {
                "code": {
                    "type": "string",
                    "description": "Source to run: Python statements (the last expression's "
                    "value is returned as 'result') or a bash script.",
                },
                "language": _LANGUAGE,
                "state_mode": {
                    "type": "string",
                    "enum": _STATE_MODES,
                    "default": "stateless",
                    "description": "'stateful' for work of several steps in a kept session; "
                    "'stateless' for a one-off check; 'read_only' for a look at an existing "
                    "session that must not change it.",
                },
                "session_id": _SESSION_ID,
                "session_name": _SESSION_NAME,
                "venv_id": _VENV_ID,
                "timeout": _TIMEOUT,
            },
            required=("code",),
        ),
        required=("code",),
        destructive=True,
        open_world=True,
    ),
    ToolSpec(
        name="list_sessions",
        title="List sessions",
        description="List the kept sessions (language, venv_id, session_id, session_name, "
        "calls, alive) and the max_sessions limit. Changes nothing.",
        parameters=_object({}),
        read_only=True,
        idempotent=True,
    ),
    ToolSpec(
        name="inspect_session",
        title="Inspect a session",
        description="Show what a session holds without changing it. Python: each name with "
        "its type, a short repr and bound_at_call / calls_ago (how stale it is). Bash: cwd, "
        "variables, functions and aliases the session added. Without a session, inspects "
        "session 0 of that language and environment.",
        parameters=_object(_SESSION_COORDINATE),
        read_only=True,
        idempotent=True,
    ),
    ToolSpec(
        name="close_session",
        title="Close a session",
        description="End a kept session and free its slot; its state is lost. Name the "
        "session with session_id or session_name. Python session 0 of the agent's own "
        "interpreter cannot be closed.",
        parameters=_object(_SESSION_COORDINATE),
        destructive=True,
        idempotent=True,
    ),
    ToolSpec(
        name="rebuild_session",
        title="Rebuild a lost session",
        description="Bring back a session whose state was lost (a result said "
        "state_lost: true or crashed) or that was closed: coordex replays into a fresh "
        "session, in order, the stateful calls that succeeded and built that state, and "
        "stops at the first that fails. Warning: the replayed code runs again - files it "
        "writes are written again, requests it sends are sent again. Returns replayed (how "
        "many calls ran), failed_at (the log seq of the call that failed, or null) and the "
        "session. Read-only and stateless calls are never replayed.",
        parameters=_object(_SESSION_COORDINATE),
        destructive=True,
        open_world=True,
    ),
    ToolSpec(
        name="list_environments",
        title="List environments",
        description="List the dedicated environments (venv_id, name, spec_hash, built, "
        "created_at, last_used_at). Use a venv_id from here in execute_code. Changes nothing.",
        parameters=_object({}),
        read_only=True,
        idempotent=True,
    ),
    ToolSpec(
        name="create_environment",
        title="Create an environment",
        description="Register a dedicated environment and get its venv_id. The spec is a "
        "requirements list (one per line, e.g. 'pandas<2'), PEP 723 inline script metadata "
        "('# /// script' ... '# ///') or pyproject.toml text. The same spec always gets the "
        "same venv_id. It is built with uv on first use (or now, with build=true).",
        parameters=_object(
            {
                "spec": {
                    "type": "string",
                    "description": "Requirements list, PEP 723 script metadata, or "
                    "pyproject.toml text naming the packages the environment needs.",
                },
                "name": {
                    "type": "string",
                    "description": "Optional human-readable name for the environment.",
                },
                "build": {
                    "type": "boolean",
                    "default": False,
                    "description": "Build it now instead of on first use (reports progress).",
                },
            },
            required=("spec",),
        ),
        required=("spec",),
        idempotent=True,
        open_world=True,
    ),
    ToolSpec(
        name="list_functions",
        title="List stored functions",
        description="List the stored functions (latest version of each): name, version, "
        "signature, doc, env, venv_id and all versions. Call one with call_function; see its "
        "source with show_function. Changes nothing.",
        parameters=_object({}),
        read_only=True,
        idempotent=True,
    ),
    ToolSpec(
        name="show_function",
        title="Show a stored function",
        description="Show one stored function: its source, signature, doc, env (the "
        "environment spec it runs in, or null for the agent's own interpreter), venv_id and "
        "versions. Changes nothing.",
        parameters=_object(
            {
                "name": _FUNCTION_NAME,
                "version": _FUNCTION_VERSION,
            },
            required=("name",),
        ),
        required=("name",),
        read_only=True,
        idempotent=True,
    ),
    ToolSpec(
        name="define_function",
        title="Define a stored function",
        description=_DEFINE_FUNCTION_DESCRIPTION,
        parameters=_object(
            {
                "source": {
                    "type": "string",
                    "description": "Python text defining the function with def, e.g. "
                    "\"def total(rows):\\n    return sum(r['amount'] for r in rows)\". It may "
                    "also hold imports and helpers.",
                },
                "name": {
                    "type": "string",
                    "description": "Which function in source to store and call. Optional when "
                    "source defines exactly one top-level function.",
                },
                "env": {
                    "type": "string",
                    "description": "Environment the function runs in, as a requirements list "
                    "(one per line, e.g. 'pandas<2'), PEP 723 script metadata ('# /// script' "
                    "... '# ///') or pyproject.toml text. Omit to run it in the agent's own "
                    "interpreter.",
                },
            },
            required=("source",),
        ),
        required=("source",),
        idempotent=True,
    ),
    ToolSpec(
        name="call_function",
        title="Call a stored function",
        description=_CALL_FUNCTION_DESCRIPTION,
        parameters=_object(
            {
                "name": _FUNCTION_NAME,
                "args": {
                    "type": "array",
                    "items": {"description": "A plain JSON value."},
                    "default": [],
                    "description": "Positional arguments, as a JSON array of plain values.",
                },
                "kwargs": {
                    "type": "object",
                    "additionalProperties": True,
                    "default": {},
                    "description": "Keyword arguments, as a JSON object of plain values.",
                },
                "state_mode": {
                    "type": "string",
                    "enum": _STATE_MODES,
                    "default": "stateless",
                    "description": "'stateful' to let the function change a kept session; "
                    "'read_only' to try it against a copy of an existing session first; "
                    "'stateless' for a one-off call.",
                },
                "session_id": _SESSION_ID,
                "session_name": _SESSION_NAME,
                "version": _FUNCTION_VERSION,
                "timeout": _TIMEOUT,
            },
            required=("name",),
        ),
        required=("name",),
        destructive=True,
        open_world=True,
    ),
)

_BY_NAME = {tool.name: tool for tool in TOOLS}
TOOL_NAMES: tuple[str, ...] = tuple(_BY_NAME)


def get_tool(name: str) -> ToolSpec | None:
    return _BY_NAME.get(name)


def mcp_annotations(tool: ToolSpec) -> dict[str, Any]:
    """MCP ``ToolAnnotations`` (camelCase, as on the wire)."""
    return {
        "title": tool.title or tool.name,
        "readOnlyHint": tool.read_only,
        "destructiveHint": tool.destructive,
        "idempotentHint": tool.idempotent,
        "openWorldHint": tool.open_world,
    }


def render(tool: ToolSpec, format: ToolFormat) -> dict[str, Any]:
    """One tool in one dialect; the schema is copied so callers may mutate it freely."""
    schema = copy.deepcopy(tool.parameters)
    if format == "openai":
        return {
            "type": "function",
            "function": {"name": tool.name, "description": tool.description, "parameters": schema},
        }
    if format == "anthropic":
        return {"name": tool.name, "description": tool.description, "input_schema": schema}
    return {
        "name": tool.name,
        "description": tool.description,
        "inputSchema": schema,
        "annotations": mcp_annotations(tool),
    }


def tool_definitions(
    format: Any = "openai", names: Iterable[str] | None = None
) -> list[dict[str, Any]] | dict[str, Any]:
    """The coordex tools rendered for one agent framework.

    Args:
        format: ``"openai"``, ``"anthropic"`` or ``"mcp"``.
        names: restrict to these tools (in :data:`TOOLS` order); default all.

    Returns:
        A list of tool definitions, or a ``validation`` error dict for an unknown format
        or tool name (never an exception).
    """
    if not isinstance(format, str) or format not in FORMATS:
        guess = nearest(format, FORMATS) if isinstance(format, str) else None
        hint = f" Did you mean format={guess!r}?" if guess else ""
        return make_error(
            "validation",
            f"Unknown tool definition format {format!r}.",
            f"Use format='openai', 'anthropic' or 'mcp'.{hint}",
        )
    wanted = list(TOOL_NAMES) if names is None else list(names)
    unknown = [n for n in wanted if n not in _BY_NAME]
    if unknown:
        return make_error(
            "validation",
            f"Unknown tool name(s): {quoted_list(unknown)}.",
            f"Choose from {quoted_list(TOOL_NAMES)}.",
        )
    return [render(tool, format) for tool in TOOLS if tool.name in wanted]


def check_arguments(name: Any, arguments: Any) -> dict[str, Any] | None:
    """A ``validation`` error dict if the call cannot be dispatched, else None.

    Checks only the tool's shape (known tool, an object of arguments, no unknown keys,
    required keys present); values are the executor's to judge.
    """
    tool = _BY_NAME.get(name) if isinstance(name, str) else None
    if tool is None:
        guess = nearest(name, TOOL_NAMES) if isinstance(name, str) else None
        hint = f" Did you mean {guess!r}?" if guess else ""
        return make_error(
            "validation",
            f"Unknown tool {name!r}.",
            f"Call one of {quoted_list(TOOL_NAMES)}.{hint}",
        )
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return make_error(
            "validation",
            f"Arguments to {tool.name} must be an object, got {type(arguments).__name__}.",
            f"Pass a JSON object with keys from {quoted_list(tool.parameters['properties'])}.",
        )
    allowed = tool.parameters["properties"]
    for key in arguments:
        if key not in allowed:
            guess = nearest(str(key), allowed)
            hint = f" Did you mean {guess!r}?" if guess else ""
            return make_error(
                "validation",
                f"Unknown argument {key!r} for {tool.name}.",
                f"Use only {quoted_list(allowed, empty='no arguments')}.{hint}",
            )
    missing = [key for key in tool.required if key not in arguments]
    if missing:
        return make_error(
            "validation",
            f"{tool.name} needs {quoted_list(missing)}.",
            f"Add {', '.join(f'{key}=...' for key in missing)} to the call.",
        )
    return None


def call_tool(
    executor: Any,
    name: Any,
    arguments: Any,
    on_output: OnOutput | None = None,
    cancel: threading.Event | None = None,
) -> dict[str, Any]:
    """Run one tool call against an executor and return its result or error dict.

    The one router every front end uses. Blocking (run it in a worker thread from async
    code). ``on_output(stream, text)`` receives output chunks of ``execute_code`` and
    build lines (stream ``"build"``) of ``execute_code`` and of ``create_environment``
    with ``build=true``, for progress reporting. ``cancel`` is handed to
    ``execute_code`` (setting it interrupts the run).
    """
    problem = check_arguments(name, arguments)
    if problem is not None:
        return problem
    handler = _HANDLERS[name]
    return handler(executor, dict(arguments or {}), on_output, cancel)


# (executor, arguments, on_output, cancel) -> result or error dict
_Handler = Callable[[Any, dict[str, Any], OnOutput | None, threading.Event | None],
                    dict[str, Any]]


def _execute_code(ex: Any, args: dict[str, Any], on_output: OnOutput | None,
                  cancel: threading.Event | None) -> dict[str, Any]:
    return cast(dict[str, Any], ex.execute_code(
        on_output=on_output, on_progress=_build_lines(on_output), cancel=cancel, **args))


def _create_environment(ex: Any, args: dict[str, Any], on_output: OnOutput | None,
                        cancel: threading.Event | None) -> dict[str, Any]:
    build = args.pop("build", False)
    created = cast(dict[str, Any], ex.environments.create(**args))
    if not build or "error_type" in created:
        return created
    built = build_environment(ex.environments, created["venv_id"], on_output)
    if "error_type" in built:
        return built
    return {**created, **built}


def _show_function(ex: Any, args: dict[str, Any], on_output: OnOutput | None,
                   cancel: threading.Event | None) -> dict[str, Any]:
    return cast(dict[str, Any], ex.functions.show(args["name"], args.get("version")))


def _define_function(ex: Any, args: dict[str, Any], on_output: OnOutput | None,
                     cancel: threading.Event | None) -> dict[str, Any]:
    source, env = args["source"], args.get("env")
    if not isinstance(source, str):
        # define(source=None) would mean "use me as a decorator"; a model means text.
        return make_error(
            "validation", f"source must be Python text defining a function, got {source!r:.80}.",
            "Pass the function's code as a string: source='def f(x):\\n    return x'.")
    if isinstance(env, str) and not env.strip():
        env = None  # an empty spec means "no environment", not "an empty one"
    try:
        stored = ex.functions.define(source=source, name=args.get("name"), env=env)
    except CoordexError as exc:
        return exc.to_dict()
    return cast(dict[str, Any], stored.describe())


def _call_function(ex: Any, args: dict[str, Any], on_output: OnOutput | None,
                   cancel: threading.Event | None) -> dict[str, Any]:
    return cast(dict[str, Any], ex.functions.call(
        args["name"], args.get("args"), args.get("kwargs"),
        state_mode=args.get("state_mode", "stateless"), session_id=args.get("session_id"),
        session_name=args.get("session_name"), version=args.get("version"),
        timeout=args.get("timeout"), on_output=on_output))


def _plain(method: Callable[[Any], Any]) -> _Handler:
    """A handler that passes the arguments on unchanged to ``method(executor)``."""
    def handler(ex: Any, args: dict[str, Any], on_output: OnOutput | None,
                cancel: threading.Event | None) -> dict[str, Any]:
        return cast(dict[str, Any], method(ex)(**args))

    return handler


_HANDLERS: dict[str, _Handler] = {
    "execute_code": _execute_code,
    "list_sessions": _plain(lambda ex: ex.list_sessions),
    "inspect_session": _plain(lambda ex: ex.inspect_session),
    "close_session": _plain(lambda ex: ex.close_session),
    "rebuild_session": _plain(lambda ex: ex.rebuild_session),
    "list_environments": _plain(lambda ex: ex.environments.list),
    "create_environment": _create_environment,
    "list_functions": _plain(lambda ex: ex.functions.list),
    "show_function": _show_function,
    "define_function": _define_function,
    "call_function": _call_function,
}
assert set(_HANDLERS) == set(TOOL_NAMES), "every tool needs exactly one handler"


def _build_lines(on_output: OnOutput | None) -> Callable[[str], None] | None:
    """``on_progress(line)`` for environment builds, relayed as ``on_output("build", line)``."""
    if on_output is None:
        return None
    relay = on_output

    def on_progress(line: str) -> None:
        relay("build", line)

    return on_progress


def build_environment(
    environments: Any, venv_id: int, on_output: OnOutput | None = None
) -> dict[str, Any]:
    """``environments.build(venv_id)``, streaming build lines as ``on_output("build", line)``."""
    return cast(dict[str, Any], environments.build(venv_id, on_progress=_build_lines(on_output)))


__all__ = [
    "FORMATS", "TOOLS", "TOOL_NAMES", "ToolFormat", "ToolSpec", "build_environment", "call_tool",
    "check_arguments", "get_tool", "mcp_annotations", "render",
    "tool_definitions",
]
