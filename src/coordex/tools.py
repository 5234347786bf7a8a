"""Tool descriptions and JSON schemas: what a model reads about coordex, written once.

Every front end shows the model the same tools. This module holds them as plain data
(:data:`TOOLS`: name, description, JSON schema of the arguments and of the result,
behaviour hints) and renders them in the dialects agent frameworks expect:

- ``openai``: ``{"type": "function", "function": {"name", "description", "parameters"}}``
  (Chat Completions);
- ``openai-responses``: ``{"type": "function", "name", "description", "parameters",
  "strict"}`` (the Responses API's ``FunctionToolParam``);
- ``anthropic``: ``{"name", "description", "input_schema"}``;
- ``mcp``: ``{"name", "title", "description", "inputSchema", "outputSchema",
  "annotations"}``.

``strict=True`` rewrites each argument schema the way OpenAI's strict mode demands:
every property required, the optional ones nullable, ``additionalProperties: false``,
no keyword strict mode refuses (``default``, ``minLength``, ``maxLength``: their meaning
moves into the description), and free-form JSON values (``call_function``'s ``args`` and
``kwargs``) carried as JSON text. In every dialect ``null`` for an argument means
"omitted" - the router drops it before dispatch - so a strict model that must send
every key can always say "not this one". For ``anthropic`` the strict schema is further
written the way Anthropic's strict tool use reads it (:func:`anthropic_strict`: ``anyOf``
instead of type arrays, limits in words), so its SDK's own transform leaves it as it is.
No rendered schema carries a ``default``: the description says it
(:func:`described_defaults`), since the OpenAI Agents SDK's strict conversion keeps a
``default`` that strict endpoints refuse.

:func:`call_tool` maps a tool call (name + argument dict or JSON text, as a model sent
it) onto the :class:`~coordex.Executor` method behind it, so an MCP server, an OpenAI
loop or an Anthropic loop all dispatch the same way. An unknown tool is ``not_found``
(with the nearest name); unknown arguments and missing required ones are
``validation`` error dicts (SPEC section 4), never exceptions; everything else (types,
modes, session rules) is the executor's to check. :func:`route` is the same call as the
application sees it (``Executor.call_tool``): never raising, and JSON-normal, so it
equals the structured content the MCP tool returns.

The tools come in three groups: sessions (``execute_code``, ``list_sessions``,
``inspect_session``, ``close_session``, ``rebuild_session``), branches
(``fork_session``, ``checkpoint_session``, ``restore_session``, ``list_checkpoints``), environments
(``list_environments``, ``create_environment``) and the stored-function library (``list_functions``,
``show_function``, ``define_function``, ``call_function``), which places a stored
function at a coordinate exactly as ``execute_code`` places code.

This module imports nothing that starts a process or touches the disk.
"""

from __future__ import annotations

import copy
import difflib
import json
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, cast

from .contract import ExecutorLike
from .core.errors import ERROR_TYPES, CoordexError, make_error, nearest, quoted_list
from .worker._coordex_engine import escape_text, safe_repr

if TYPE_CHECKING:
    from .log.detached import CallRecord as Recorded

ToolFormat = Literal["openai", "openai-responses", "anthropic", "mcp"]
FORMATS: tuple[ToolFormat, ...] = ("openai", "openai-responses", "anthropic", "mcp")
OnOutput = Callable[[str, str], None]

# The Executor's own default call timeout, and the one the MCP front end uses: below the
# common 60 s client request timeout, so a client receives coordex's own ``timeout``
# result (with its suggestion and kept state) rather than its own "Request timed out".
DEFAULT_TIMEOUT = 60.0
MCP_DEFAULT_TIMEOUT = 50.0
# Descriptions name the default call timeout through this mark; rendering fills it in.
_TIMEOUT_MARK = "{default_timeout}"


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
    # JSON schema of a successful result (an object); an error result always matches the
    # error branch that :func:`output_schema` adds. Empty: any object.
    result: dict[str, Any] = field(default_factory=dict)
    # Free-form JSON arguments, and an example of each as JSON text: strict mode cannot
    # describe an open object, so there the model sends them as text (accepted everywhere).
    json_text: tuple[tuple[str, str], ...] = field(default=())


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
    "description": f"Seconds before the code is interrupted (default {_TIMEOUT_MARK}); pass "
    "a larger value for long work. Environment builds do not count against it.",
}
# Where descriptions name how long a call waits by default (SPEC 14); rendering fills it.
_WAIT_MARK = "{default_wait}"
_WAIT = {
    "type": "number",
    "exclusiveMinimum": 0,
    "maximum": 604800,
    "description": "Seconds to wait for the end before returning {\"running\": true, "
    "\"call_id\", ...} with the output so far (" + _WAIT_MARK + "). Pass a small wait "
    "(e.g. 20) for work that may outlast your client's request; the code goes on under "
    "its own timeout and wait_call(call_id) fetches its result.",
}
_RUNNING_LINE = (" A result with \"running\": true means the call goes on: call "
                 "wait_call with its call_id for the result (do not run the code again; the "
                 "session answers other calls with error_type 'busy' until it ends).")
_CALL_ID = {
    "type": "string",
    "minLength": 1,
    "maxLength": 100,
    "description": "The call_id of a result with \"running\": true (e.g. 'c_3f2a...').",
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
    """An argument object; optional arguments without a default also accept ``null``.

    ``null`` means "omitted" (the router drops it), and saying so in the schema keeps it
    usable after a framework's own strict conversion (OpenAI Agents SDK
    ``convert_schemas_to_strict``), which makes every key required: the model can still
    send ``session_id: null`` next to a ``session_name``.
    """
    needed = list(required)
    return {
        "type": "object",
        "properties": {
            key: prop if key in needed or "default" in prop else _nullable(prop)
            for key, prop in properties.items()
        },
        "required": needed,
        "additionalProperties": False,
    }


def _nullable(prop: dict[str, Any]) -> dict[str, Any]:
    """``prop`` that also accepts ``null`` (in ``type`` and, if present, ``enum``)."""
    out = dict(prop)
    kind = out.get("type")
    if isinstance(kind, str) and kind != "null":
        out["type"] = [kind, "null"]
    elif isinstance(kind, list) and "null" not in kind:
        out["type"] = [*kind, "null"]
    if "enum" in out and None not in out["enum"]:
        out["enum"] = [*out["enum"], None]
    return out


def _result(properties: dict[str, Any], required: Iterable[str] = ()) -> dict[str, Any]:
    """A result schema: the keys named are typed, others may follow (results grow)."""
    return {"type": "object", "properties": properties, "required": list(required)}


_NULLABLE_INT = {"type": ["integer", "null"]}
_NULLABLE_STR = {"type": ["string", "null"]}
_SESSION_RECORD = _result({
    "language": {"type": "string"}, "venv_id": _NULLABLE_INT,
    "session_id": _NULLABLE_INT, "session_name": _NULLABLE_STR,
})
_RUN_RESULT = {
    "stdout": {"type": "string"}, "stderr": {"type": "string"},
    "truncated": {"type": "boolean"}, "result": _NULLABLE_STR, "exit_code": _NULLABLE_INT,
    "images": {"type": "array", "items": _result(
        {"mime": {"type": "string"}, "data": {"type": "string"}}, ("mime", "data"))},
    "session": _SESSION_RECORD, "state_mode": {"type": "string", "enum": _STATE_MODES},
    "duration_ms": {"type": "number"}, "isolation": {"type": "object"},
    "state_lost": {"type": "boolean"}, "retried": {"type": "boolean"},
    # SPEC 14: the files holding what a result cut, whole (present only then).
    "spilled": {"type": "object", "additionalProperties": {"type": "string"}},
}
_RUN_REQUIRED = ("stdout", "stderr", "session", "state_mode")
_FUNCTION_RECORD = {
    "name": {"type": "string"}, "version": {"type": "integer"},
    "signature": {"type": "string"}, "doc": _NULLABLE_STR, "env": _NULLABLE_STR,
    "venv_id": _NULLABLE_INT, "versions": {"type": "array", "items": {"type": "integer"}},
}
_RECORDS = {"type": "array", "items": {"type": "object"}}
_STRINGS = {"type": "array", "items": {"type": "string"}}
# The error dict of SPEC section 4; every tool may return one.
ERROR_RESULT = _result({
    "error": {"type": "string"},
    "error_type": {"type": "string", "enum": list(ERROR_TYPES)},
    "suggestion": {"type": "string"},
}, ("error", "error_type", "suggestion"))
# A plain JSON value (a stored function's return value), and its scalar part.
_PLAIN_VALUE = {"type": ["string", "number", "boolean", "null", "array", "object"]}
_SCALAR = {"type": ["string", "number", "boolean", "null"]}


_EXECUTE_CODE_DESCRIPTION = """\
Run Python or bash code and get back stdout, stderr, the value of the last expression \
(Python), the exit code (bash), and any figures as images.

Choose state_mode by what the code is for:
- stateful: work of several steps (load, then analyse) - names, files opened and the \
working directory stay in the session for the next call.
- stateless: a one-off check - fresh namespace or shell, nothing is kept afterwards.
- read_only: a look that must not change anything, or a try of a change you may throw \
away - runs against a copy of an existing session; whatever it changes or writes is \
discarded. Its result's "isolation" says what held: copy "fork" (all of the session \
copied) or "values" (names copied one by one; left_out lists those that could not be); \
files "discarded" (its writes, a mkdir included, are thrown away), "refused" (writes \
fail) or "none" (files are not protected on this machine).

Sessions: a new executor holds only session 0; stateful without a session uses it; name \
one with session_name (e.g. 'audit') or session_id, never both. read_only must name an \
existing session; \
stateless must not name one. venv_id runs in a dedicated environment with its own \
packages (see create_environment); omit it for the agent's own interpreter. null for any \
argument means the same as leaving it out. A call is interrupted after \
{default_timeout} unless you pass timeout (seconds): pass a larger timeout for long \
work. Errors come back as {"error", "error_type", "suggestion"}: follow the suggestion.
Pass wait (seconds; """ + _WAIT_MARK + """) when the work may outlast your client's \
request.""" + _RUNNING_LINE

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
back as {"error", "error_type", "suggestion"}: follow the suggestion. Pass wait (seconds) \
when the call may outlast your client's request.""" + _RUNNING_LINE

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
                "wait": _WAIT,
            },
            required=("code",),
        ),
        required=("code",),
        result=_result(_RUN_RESULT, _RUN_REQUIRED),
        destructive=True,
        open_world=True,
    ),
    ToolSpec(
        name="list_sessions",
        title="List sessions",
        description="List the kept sessions (language, venv_id, session_id, session_name, "
        "calls, alive) and the max_sessions limit. Changes nothing. A session running a "
        "call that answered 'running' shows busy: true and that call's call_id.",
        parameters=_object({}),
        result=_result({"sessions": _RECORDS, "max_sessions": {"type": "integer"}},
                       ("sessions", "max_sessions")),
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
        result=_result({"names": _RECORDS, "cwd": {"type": "string"},
                        "variables": {"type": "object"}, "aliases": {"type": "object"},
                        "session": _SESSION_RECORD}),
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
        result=_result({"closed": {"type": "boolean"}, "session": _SESSION_RECORD},
                       ("closed",)),
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
        "session. Read-only and stateless calls are never replayed." + _RUNNING_LINE,
        parameters=_object({**_SESSION_COORDINATE, "wait": _WAIT}),
        result=_result({"replayed": {"type": "integer"},
                        "failed_at": {"type": ["integer", "null"]},
                        "session": _SESSION_RECORD}, ("replayed", "failed_at", "session")),
        destructive=True,
        open_world=True,
    ),
    # -- branches and checkpoints (SPEC 15) ------------------------------------------------
    ToolSpec(
        name="fork_session",
        title="Fork a session",
        description="Fork for a trial of several steps that must not touch the original: "
        "opens a new session new_name (same language and environment) holding a copy of the "
        "session's state; the original never changes. Files on disk are shared, not "
        "copied. Returns the new session, from, ms and left_out (names that could not be "
        "copied). Close the fork when the trial is over.",
        parameters=_object({**_SESSION_COORDINATE, "new_name": {
            "type": "string", "minLength": 1, "maxLength": 200,
            "description": "Name of the new session, e.g. 'trial'; must not be in use."}},
            ("new_name",)),
        result=_result({"session": _SESSION_RECORD, "from": _SESSION_RECORD,
                        "ms": {"type": "number"}, "copy": {"type": "string"},
                        "left_out": _STRINGS, "files": {"type": "string"}},
                       ("session", "from", "ms", "left_out")),
    ),
    ToolSpec(
        name="checkpoint_session",
        title="Checkpoint a session",
        description="Checkpoint before a risky stateful step, restore to undo it: records "
        "the session's state (written from a copy, so the session keeps answering) and "
        "returns its checkpoint id. Files on disk are not part of it. Up to 10 are kept per "
        "session (the oldest is dropped); they survive restarts and go with close_session.",
        parameters=_object({**_SESSION_COORDINATE, "label": {
            "type": "string", "maxLength": 200,
            "description": "Optional words saying what the state is, e.g. 'before dedup'."}}),
        result=_result({"checkpoint": {"type": "string"}, "label": _NULLABLE_STR,
                        "at": {"type": "number"}, "bytes": _NULLABLE_INT,
                        "ms": {"type": "number"}, "left_out": _STRINGS,
                        "session": _SESSION_RECORD},
                       ("checkpoint", "label", "at", "bytes", "ms", "left_out")),
    ),
    ToolSpec(
        name="restore_session",
        title="Restore a checkpoint",
        description="Restore to undo: puts the session back to a checkpoint of it "
        "(from checkpoint_session or list_checkpoints); what it bound since is gone. Files "
        "on disk are not touched. Names that could not be kept are listed in left_out.",
        parameters=_object({**_SESSION_COORDINATE, "checkpoint": {
            "type": "string", "minLength": 1, "maxLength": 100,
            "description": "The checkpoint id, e.g. 'cp-1a2b3c4d'."}}, ("checkpoint",)),
        result=_result({"restored": {"type": "boolean"}, "checkpoint": {"type": "string"},
                        "label": _NULLABLE_STR, "at": {"type": "number"},
                        "session": _SESSION_RECORD, "ms": {"type": "number"},
                        "left_out": _STRINGS, "files": {"type": "string"}},
                       ("restored", "checkpoint", "session", "left_out")),
        destructive=True,
        idempotent=True,
    ),
    ToolSpec(
        name="list_checkpoints",
        title="List checkpoints",
        description="List a session's checkpoints (checkpoint, label, at, bytes, left_out), "
        "newest last. Changes nothing.",
        parameters=_object(_SESSION_COORDINATE),
        result=_result({"checkpoints": _RECORDS, "session": _SESSION_RECORD,
                        "max_checkpoints": {"type": "integer"}}, ("checkpoints",)),
        read_only=True,
        idempotent=True,
    ),
    ToolSpec(
        name="list_environments",
        title="List environments",
        description="List the dedicated environments (venv_id, name, spec_hash, built, "
        "created_at, last_used_at). Use a venv_id from here in execute_code. Changes nothing.",
        parameters=_object({}),
        result=_result({"environments": _RECORDS}, ("environments",)),
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
        result=_result({"venv_id": {"type": "integer"}, "name": _NULLABLE_STR,
                        "spec_hash": {"type": "string"}, "built": {"type": "boolean"}},
                       ("venv_id",)),
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
        result=_result({"functions": _RECORDS}, ("functions",)),
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
        result=_result({**_FUNCTION_RECORD, "source": {"type": "string"}},
                       ("name", "version", "source")),
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
        result=_result(_FUNCTION_RECORD, ("name", "version")),
        idempotent=True,
    ),
    ToolSpec(
        name="call_function",
        title="Call a stored function",
        description=_CALL_FUNCTION_DESCRIPTION,
        parameters=_object(
            {
                "name": _FUNCTION_NAME,
                # Free-form values are JSON text where they could hold objects: a schema
                # with an open object cannot be made strict (OpenAI Agents SDK
                # convert_schemas_to_strict refuses it), and the router accepts both.
                "args": {
                    "type": ["array", "string", "null"],
                    "items": _SCALAR,
                    "default": [],
                    "description": "Positional arguments: a JSON array of numbers, strings, "
                    "booleans or nulls, or the JSON text of any array (needed for nested lists "
                    "or objects), e.g. '[[1, 2], {\"a\": 1}]'.",
                },
                "kwargs": {
                    "type": ["string", "null"],
                    "description": "Keyword arguments: the JSON text of an object of plain "
                    "values, e.g. '{\"currency\": \"EUR\"}' (an object itself is accepted too).",
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
                "wait": _WAIT,
            },
            required=("name",),
        ),
        required=("name",),
        result=_result({**_RUN_RESULT, "value": _PLAIN_VALUE, "function": _result(
            {"name": {"type": "string"}, "version": {"type": "integer"}})},
            (*_RUN_REQUIRED, "value")),
        json_text=(("args", '["exports/monthly.csv", 3]'), ("kwargs", '{"currency": "EUR"}')),
        destructive=True,
        open_world=True,
    ),
    ToolSpec(
        name="wait_call",
        title="Wait for a running call",
        description="Get the result of a call that returned {\"running\": true, "
        "\"call_id\"}: waits up to wait seconds (" + _WAIT_MARK + ") and returns the "
        "call's own result (the dict it would have returned, call_id added), or another "
        "running record with the output so far - then call wait_call again. Never reruns "
        "or interrupts anything. Results are kept at least an hour after a call ends.",
        parameters=_object({"call_id": _CALL_ID, "wait": _WAIT}, required=("call_id",)),
        required=("call_id",),
        result={},
        read_only=True,
        idempotent=True,
    ),
    ToolSpec(
        name="cancel_call",
        title="Cancel a running call",
        description="Interrupt a call that returned {\"running\": true, \"call_id\"} "
        "as a timeout would (a session keeps its state) and return its final result. A "
        "call that already ended: its result, unchanged.",
        parameters=_object({"call_id": _CALL_ID}, required=("call_id",)),
        required=("call_id",),
        result={},
        destructive=True,
        idempotent=True,
    ),
)

# What a call given ``wait`` returns while it still runs (SPEC 14).
RUNNING_RESULT = _result({
    "running": {"type": "boolean", "const": True}, "call_id": {"type": "string"},
    "elapsed_ms": {"type": "number"}, "stdout": {"type": "string"},
    "stderr": {"type": "string"}, "session": {"type": ["object", "null"]},
    "state_mode": {"type": "string"}, "suggestion": {"type": "string"},
}, ("running", "call_id", "elapsed_ms", "stdout", "stderr", "state_mode", "suggestion"))

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


def output_schema(tool: ToolSpec) -> dict[str, Any]:
    """The MCP ``outputSchema``: the tool's result, or the SPEC error dict."""
    success = copy.deepcopy(tool.result) or {"type": "object"}
    branches = [success]
    if "wait" in tool.parameters["properties"] and tool.result:
        branches.append(copy.deepcopy(RUNNING_RESULT))  # SPEC 14: still running
    return {"type": "object", "anyOf": [*branches, copy.deepcopy(ERROR_RESULT)]}


# Keywords OpenAI's strict mode refuses inside a property; their meaning moves into the
# description (a default) or is checked by coordex itself (lengths).
_NOT_STRICT = ("default", "minLength", "maxLength")


def strict_parameters(tool: ToolSpec) -> dict[str, Any]:
    """``tool.parameters`` as OpenAI's strict mode accepts it.

    Every property is required; an optional one also accepts ``null`` (meaning omitted);
    ``default`` becomes a sentence of the description; free-form JSON arguments
    (``tool.json_text``) become strings holding JSON text.
    """
    json_text = dict(tool.json_text)
    properties: dict[str, Any] = {}
    for key, prop in tool.parameters["properties"].items():
        out = copy.deepcopy(prop)
        default = out.get("default")
        if key in json_text:
            out = {"type": "string", "description": f"{prop['description']} In this schema "
                   f"always JSON text, e.g. {json_text[key]!r}; null for none."}
            default = None
        for keyword in _NOT_STRICT:
            out.pop(keyword, None)
        if key not in tool.required:
            out = _nullable(out)
            if default is not None:
                out["description"] += f" null means the default, {json.dumps(default)}."
        properties[key] = out
    return {"type": "object", "properties": properties, "required": list(properties),
            "additionalProperties": False}


def described_defaults(tool: ToolSpec) -> dict[str, Any]:
    """``tool.parameters`` with each ``default`` said in its description instead.

    A ``default`` that is not null survives the OpenAI Agents SDK's strict conversion
    (``convert_schemas_to_strict`` over the MCP schemas) and Azure's strict mode refuses
    it; in words the model reads the same thing. The property stays non-nullable: a
    model that must send it sends the default.
    """
    schema = copy.deepcopy(tool.parameters)
    for prop in schema["properties"].values():
        if "default" in prop:
            default = prop.pop("default")
            prop["description"] += f" Default: {default!r}."
    return schema


# JSON Schema limits Anthropic's strict tool use does not take; its SDK's own transform
# moves them into the description, and so do we, in words.
_LIMIT_WORDS = {"minimum": ">= {}", "exclusiveMinimum": "> {}", "maximum": "<= {}",
                "exclusiveMaximum": "< {}", "minItems": "at least {} items",
                "maxItems": "at most {} items"}


def anthropic_strict(schema: dict[str, Any]) -> dict[str, Any]:
    """A strict schema as Anthropic's strict tool use reads it: what its SDK's
    ``transform_schema`` leaves unchanged.

    A type array (``["integer", "null"]``) becomes ``anyOf`` of single types; an ``enum``
    stands without a ``type`` (the enum says it all); numeric and item limits become a
    sentence of the description (coordex checks them itself).
    """
    out = dict(schema)
    limits = [_LIMIT_WORDS[key].format(out.pop(key)) for key in list(_LIMIT_WORDS)
              if key in out and not (key == "minItems" and out[key] in (0, 1))]
    if limits and "description" in out:
        out["description"] += f" Must be {' and '.join(limits)}."
    if "enum" in out:
        out.pop("type", None)
        return out
    kinds = out.get("type")
    if isinstance(kinds, list):
        description = out.pop("description", None)
        body = {k: v for k, v in out.items() if k != "type"}
        variants = [anthropic_strict({"type": kind, **(body if kind != "null" else {})})
                    for kind in kinds]
        out = {"anyOf": variants}
        if description is not None:
            out["description"] = description
        return out
    if kinds == "object":
        out["properties"] = {k: anthropic_strict(v) for k, v in out.get("properties", {}).items()}
        out["additionalProperties"] = False
    elif kinds == "array" and isinstance(out.get("items"), dict):
        out["items"] = anthropic_strict(out["items"])
    return out


def render(tool: ToolSpec, format: ToolFormat, strict: bool = False,
           default_timeout: float = DEFAULT_TIMEOUT,
           default_wait: float | None = None) -> dict[str, Any]:
    """One tool in one dialect; the schema is copied so callers may mutate it freely.
    ``default_wait``: how long a call waits when not told (the MCP server's
    ``--max-wait``); None: to its end."""
    schema = strict_parameters(tool) if strict else described_defaults(tool)
    if strict and format == "anthropic":
        schema = anthropic_strict(schema)
    schema = _fill_wait(_fill_timeout(schema, default_timeout), default_wait)
    description = _fill_wait(_fill_timeout(tool.description, default_timeout), default_wait)
    if format == "openai":
        function = {"name": tool.name, "description": description, "parameters": schema}
        if strict:
            function["strict"] = True
        return {"type": "function", "function": function}
    if format == "openai-responses":
        return {"type": "function", "name": tool.name, "description": description,
                "parameters": schema, "strict": strict}
    if format == "anthropic":
        rendered = {"name": tool.name, "description": description, "input_schema": schema}
        if strict:
            rendered["strict"] = True
        return rendered
    return {
        "name": tool.name,
        "title": tool.title or tool.name,
        "description": description,
        "inputSchema": schema,
        "outputSchema": output_schema(tool),
        "annotations": mcp_annotations(tool),
    }


def _fill_timeout(value: Any, seconds: float) -> Any:
    """``value`` with every description's default-timeout mark replaced by ``seconds``."""
    if isinstance(value, str):
        return value.replace(_TIMEOUT_MARK, f"{seconds:g} s")
    if isinstance(value, dict):
        return {key: _fill_timeout(item, seconds) for key, item in value.items()}
    if isinstance(value, list):
        return [_fill_timeout(item, seconds) for item in value]
    return value


def _fill_wait(value: Any, seconds: float | None) -> Any:
    """``value`` with every description's default-wait mark said in words."""
    if isinstance(value, str):
        words = ("default: until the end" if seconds is None else
                 f"default and most: {seconds:g} s")
        return value.replace(_WAIT_MARK, words)
    if isinstance(value, dict):
        return {key: _fill_wait(item, seconds) for key, item in value.items()}
    if isinstance(value, list):
        return [_fill_wait(item, seconds) for item in value]
    return value


def tool_definitions(
    format: Any = "openai", strict: Any = False, names: Iterable[str] | None = None,
    default_timeout: float | None = None, default_wait: float | None = None,
) -> list[dict[str, Any]] | dict[str, Any]:
    """The coordex tools rendered for one agent framework.

    Args:
        format: ``"openai"`` (Chat Completions), ``"openai-responses"`` (Responses API),
            ``"anthropic"`` or ``"mcp"``.
        strict: schemas OpenAI's strict mode accepts (every property required, optional
            ones nullable, ``additionalProperties: false``); ``null`` always means
            "omitted", strict or not.
        names: restrict to these tools (in :data:`TOOLS` order); default all.
        default_timeout: the call timeout the descriptions name (default: 60 s, the
            Executor's; 50 s for ``"mcp"``, the MCP front end's).

    Returns:
        A list of tool definitions, or a ``validation`` error dict for an unknown format
        or tool name (never an exception).
    """
    if not isinstance(format, str) or format not in FORMATS:
        guess = nearest(format, FORMATS) if isinstance(format, str) else None
        hint = f" Did you mean format={guess!r}?" if guess else ""
        return make_error(
            "validation",
            f"Unknown tool definition format {safe_repr(format, 80)}.",
            f"Use format='openai', 'openai-responses', 'anthropic' or 'mcp'.{hint}",
        )
    if not isinstance(strict, bool):
        return make_error("validation", f"strict must be true or false, got {safe_repr(strict, 80)}.",
                          "Pass strict=True for OpenAI strict-mode schemas, else strict=False.")
    wanted = list(TOOL_NAMES) if names is None else list(names)
    unknown = [n for n in wanted if n not in _BY_NAME]
    if unknown:
        return make_error(
            "validation",
            f"Unknown tool name(s): {quoted_list(unknown)}.",
            f"Choose from {quoted_list(TOOL_NAMES)}.",
        )
    if default_timeout is None:
        default_timeout = MCP_DEFAULT_TIMEOUT if format == "mcp" else DEFAULT_TIMEOUT
    return [render(tool, format, strict, default_timeout, default_wait)
            for tool in TOOLS if tool.name in wanted]


def check_arguments(name: object, arguments: object) -> dict[str, Any] | None:
    """An error dict if the call cannot be dispatched, else None.

    Checks only the tool's shape: a known tool (else ``not_found`` naming the nearest),
    an object of arguments, no unknown keys, required keys present and not ``null``
    (else ``validation``); values are the executor's to judge.
    """
    tool = _BY_NAME.get(name) if isinstance(name, str) else None
    if tool is None:
        guess = nearest_tool(name) if isinstance(name, str) else None
        hint = f" Did you mean {guess!r}?" if guess else ""
        return make_error(
            "not_found",
            f"No tool named {name!r}.",
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
    missing = [key for key in tool.required if arguments.get(key) is None]
    if missing:
        return make_error(
            "validation",
            f"{tool.name} needs {quoted_list(missing)}.",
            f"Add {', '.join(f'{key}=...' for key in missing)} to the call.",
        )
    return None


def nearest_tool(name: str) -> str:
    """The tool whose name is closest to ``name`` (there always is one to name)."""
    return nearest(name, TOOL_NAMES) or max(
        TOOL_NAMES, key=lambda tool: difflib.SequenceMatcher(None, name.lower(), tool).ratio())


def decode_arguments(name: object, arguments: object) -> object:
    """Arguments as a model sent them, made a dict where they are JSON text.

    ``arguments`` may be a dict, ``None`` or a JSON string of an object (what the OpenAI
    SDKs hand over); an empty string means no arguments. Text that is not JSON raises
    a ``validation`` :class:`CoordexError` quoting the parser's complaint.
    """
    if not isinstance(arguments, str):
        return arguments
    if not arguments.strip():
        return {}
    try:
        return json.loads(arguments)
    except ValueError as exc:
        raise CoordexError(
            "validation",
            f"The arguments to {name!r} are not valid JSON: {exc} (in {arguments[:200]!r}).",
            "Send the arguments as one JSON object, e.g. {\"code\": \"print(1)\"}.",
        )


def _omit_nulls(tool: ToolSpec, arguments: dict[str, Any]) -> dict[str, Any]:
    """Drop ``null`` arguments (null means omitted) and decode JSON-text arguments."""
    out = {key: value for key, value in arguments.items() if value is not None}
    for key, _example in tool.json_text:
        value = out.get(key)
        if isinstance(value, str):
            try:
                decoded = json.loads(value) if value.strip() else None
            except ValueError as exc:
                raise CoordexError(
                    "validation",
                    f"{key} for {tool.name} is text that is not JSON: {value[:200]!r} ({exc}).",
                    f"Pass {key} as a JSON value, or as its JSON text, e.g. {_example!r}.",
                )
            if decoded is None:
                del out[key]
            else:
                out[key] = decoded
    return out


def call_tool(
    executor: ExecutorLike,
    name: object,
    arguments: object,
    on_output: OnOutput | None = None,
    cancel: threading.Event | None = None,
) -> dict[str, Any]:
    """Run one tool call against an executor and return its result or error dict.

    The one router every front end uses. Blocking (run it in a worker thread from async
    code). ``arguments`` is a dict or its JSON text; ``null`` values mean "omitted".
    ``on_output(stream, text)`` receives output chunks of ``execute_code`` and build
    lines (stream ``"build"``) of ``execute_code`` and of ``create_environment`` with
    ``build=true``, for progress reporting. ``cancel`` is handed to ``execute_code``
    (setting it interrupts the run).
    """
    try:
        decoded = decode_arguments(name, arguments)
        problem = check_arguments(name, decoded)
        if problem is not None:
            return problem
        # What check_arguments found: a known tool's name, an object of arguments or none.
        assert isinstance(name, str) and isinstance(decoded, dict | None)
        args = _omit_nulls(_BY_NAME[name], dict(decoded or {}))
    except CoordexError as exc:
        return exc.to_dict()
    return _HANDLERS[name](executor, args, on_output, cancel)


def route(executor: ExecutorLike, name: object, arguments: object) -> dict[str, Any]:
    """``Executor.call_tool``: one model tool call, answered exactly as the MCP tool is.

    Never raises: a bug in coordex is an error dict too (:func:`internal_error`). The
    result is JSON-normal (what a client decodes from the MCP structured content).
    """
    try:
        record = call_tool(executor, name, arguments)
    except Exception as exc:
        record = internal_error(exc)
    return json_normal(record)


def json_normal(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` as a JSON round trip gives it back (tuples as lists, odd values as text),
    with lone surrogates escaped as every place escapes them (a UTF-8 wire cannot carry
    them), so the Python API and the MCP wire return the same dict."""
    normal = cast(dict[str, Any], json.loads(json.dumps(record, default=str)))
    try:
        json.dumps(normal, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return cast(dict[str, Any], escape_strings(normal))
    return normal


def escape_strings(value: Any) -> Any:
    """``value`` with every string's (keys included) lone surrogates escaped."""
    if isinstance(value, str):
        return escape_text(value)
    if isinstance(value, dict):
        return {escape_strings(k): escape_strings(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [escape_strings(v) for v in value]
    return value


def internal_error(exc: BaseException) -> dict[str, Any]:
    """A bug in coordex itself, still reported as a result a model can act on."""
    return make_error(
        "crashed",
        f"coordex failed internally: {type(exc).__name__}: {exc}",
        "Retry the call once; if it fails again, continue without the session's state "
        "(it may be lost) and report the problem to the operator.",
        state_lost=True,
    )


# (executor, arguments, on_output, cancel) -> result or error dict
_Handler = Callable[[Any, dict[str, Any], OnOutput | None, threading.Event | None],
                    dict[str, Any]]


def _execute_code(ex: ExecutorLike, args: dict[str, Any], on_output: OnOutput | None,
                  cancel: threading.Event | None) -> dict[str, Any]:
    return cast(dict[str, Any], ex.execute_code(
        on_output=on_output, on_progress=_build_lines(on_output), cancel=cancel, **args))


def _create_environment(ex: ExecutorLike, args: dict[str, Any], on_output: OnOutput | None,
                        cancel: threading.Event | None) -> dict[str, Any]:
    build = args.pop("build", False)
    created = cast(dict[str, Any], ex.environments.create(**args))
    if not build or "error_type" in created:
        return created
    built = build_environment(ex.environments, created["venv_id"], on_output)
    if "error_type" in built:
        return built
    return {**created, **built}


def _show_function(ex: ExecutorLike, args: dict[str, Any], on_output: OnOutput | None,
                   cancel: threading.Event | None) -> dict[str, Any]:
    return cast(dict[str, Any], ex.functions.show(args["name"], args.get("version")))


def _define_function(ex: ExecutorLike, args: dict[str, Any], on_output: OnOutput | None,
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
    if isinstance(stored, dict):  # refused: the error dict, as define returns it
        return stored
    return cast(dict[str, Any], stored.describe())


def _call_function(ex: ExecutorLike, args: dict[str, Any], on_output: OnOutput | None,
                   cancel: threading.Event | None) -> dict[str, Any]:
    def run(output: OnOutput | None, event: threading.Event | None,
            record: Recorded | None) -> dict[str, Any]:
        # The call record goes down the call's path (never over a wire: a confined
        # host's own Executor records its calls).
        given = {"recorded": record} if record is not None else {}
        return cast(dict[str, Any], ex.functions.call(
            args["name"], args.get("args"), args.get("kwargs"),
            state_mode=args.get("state_mode", "stateless"), session_id=args.get("session_id"),
            session_name=args.get("session_name"), version=args.get("version"),
            timeout=args.get("timeout"), on_output=output, **given))

    recorded = getattr(ex, "run_recorded", None)  # SPEC 14: wait, busy, join
    if recorded is None:
        return run(on_output, cancel, None)
    return cast(dict[str, Any], recorded("call_function", args, run, args.get("wait"),
                                         on_output, cancel))


def _plain(method: Callable[[Any], Any]) -> _Handler:
    """A handler that passes the arguments on unchanged to ``method(executor)``."""
    def handler(ex: ExecutorLike, args: dict[str, Any], on_output: OnOutput | None,
                cancel: threading.Event | None) -> dict[str, Any]:
        return cast(dict[str, Any], method(ex)(**args))

    return handler


_HANDLERS: dict[str, _Handler] = {
    "execute_code": _execute_code,
    "list_sessions": _plain(lambda ex: ex.list_sessions),
    "inspect_session": _plain(lambda ex: ex.inspect_session),
    "close_session": _plain(lambda ex: ex.close_session),
    "rebuild_session": _plain(lambda ex: ex.rebuild_session),
    "fork_session": _plain(lambda ex: ex.fork_session),
    "checkpoint_session": _plain(lambda ex: ex.checkpoint_session),
    "restore_session": _plain(lambda ex: ex.restore_session),
    "list_checkpoints": _plain(lambda ex: ex.list_checkpoints),
    "list_environments": _plain(lambda ex: ex.environments.list),
    "create_environment": _create_environment,
    "list_functions": _plain(lambda ex: ex.functions.list),
    "show_function": _show_function,
    "define_function": _define_function,
    "call_function": _call_function,
    "wait_call": _plain(lambda ex: ex.wait_call),
    "cancel_call": _plain(lambda ex: ex.cancel_call),
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
    "DEFAULT_TIMEOUT", "ERROR_RESULT", "FORMATS", "MCP_DEFAULT_TIMEOUT", "TOOLS", "TOOL_NAMES",
    "ToolFormat", "ToolSpec", "anthropic_strict", "build_environment", "call_tool",
    "check_arguments", "decode_arguments", "described_defaults", "escape_strings", "get_tool",
    "internal_error", "json_normal", "mcp_annotations",
    "output_schema", "render", "route", "strict_parameters", "tool_definitions",
]
