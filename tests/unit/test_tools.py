"""Tool definitions (three dialects, one source) and tool-call dispatch.

Dispatch is tested against a recording fake, except the library tools, which run through
a real Executor on a temporary root (own interpreter only: no environments are built).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from coordex import Executor
from coordex.tools import (
    TOOL_NAMES,
    TOOLS,
    build_environment,
    call_tool,
    check_arguments,
    described_defaults,
    tool_definitions,
)

SESSION_TOOLS = ("execute_code", "list_sessions", "inspect_session", "close_session")
LIBRARY_TOOLS = ("list_functions", "show_function", "define_function", "call_function")


def defs(fmt: str) -> list[dict[str, Any]]:
    result = tool_definitions(fmt)
    assert isinstance(result, list)
    return result


def test_every_session_tool_is_defined() -> None:
    assert set(SESSION_TOOLS) <= set(TOOL_NAMES)


def filled(schema: dict[str, Any], seconds: str) -> dict[str, Any]:
    """``schema`` with its default-timeout and default-wait marks written out, as
    rendering does (no wait given: a call waits for its end)."""
    return cast(dict[str, Any], json.loads(json.dumps(schema).replace(
        "{default_timeout}", seconds).replace("{default_wait}", "default: until the end")))


@pytest.mark.parametrize("fmt", ["openai", "openai-responses", "anthropic", "mcp"])
def test_the_dialects_carry_the_same_schema(fmt: str) -> None:
    rendered = defs(fmt)
    assert [d["function"]["name"] if fmt == "openai" else d["name"] for d in rendered] == list(
        TOOL_NAMES)
    for tool, d in zip(TOOLS, rendered, strict=True):
        if fmt == "openai":
            assert d["type"] == "function"
            assert set(d["function"]) == {"name", "description", "parameters"}
            schema = d["function"]["parameters"]
        elif fmt == "openai-responses":
            assert set(d) == {"type", "name", "description", "parameters", "strict"}
            assert d["type"] == "function" and d["strict"] is False
            schema = d["parameters"]
        elif fmt == "anthropic":
            assert set(d) == {"name", "description", "input_schema"}
            schema = d["input_schema"]
        else:
            assert set(d) == {"name", "title", "description", "inputSchema", "outputSchema",
                              "annotations"}
            assert d["title"] == tool.title
            schema = d["inputSchema"]
        assert schema == filled(described_defaults(tool), "50 s" if fmt == "mcp" else "60 s")
        assert schema is not tool.parameters  # callers may mutate their copy


def test_every_argument_has_a_description_and_modes_are_enums() -> None:
    for tool in TOOLS:
        assert tool.description
        schema = tool.parameters
        assert schema["type"] == "object" and schema["additionalProperties"] is False
        for name, prop in schema["properties"].items():
            assert prop.get("description"), f"{tool.name}.{name} has no description"
    props = TOOLS[0].parameters["properties"]
    assert props["language"]["enum"] == ["python", "bash"]
    assert props["state_mode"]["enum"] == ["stateless", "stateful", "read_only"]
    assert TOOLS[0].parameters["required"] == ["code"]


def test_execute_code_reasons_once_per_state_mode() -> None:
    description = TOOLS[0].description
    lines = description.splitlines()

    def line_for(mode: str) -> str:
        found = [line for line in lines if line.startswith(f"- {mode}:")]
        assert len(found) == 1, f"no single line for {mode}"
        return found[0]

    assert "several steps" in line_for("stateful") and "load" in line_for("stateful")
    assert "one-off" in line_for("stateless")
    assert "must not change" in line_for("read_only")
    for word in ("session_id", "session_name", "venv_id"):
        assert word in description


def test_mcp_annotations_mark_the_read_only_tools() -> None:
    hints = {d["name"]: d["annotations"]["readOnlyHint"] for d in defs("mcp")}
    assert hints["list_sessions"] and hints["inspect_session"] and hints["list_environments"]
    assert not hints["execute_code"] and not hints["close_session"]


@pytest.mark.parametrize("bad", ["opena", "json", "", None, 3])
def test_an_unknown_format_is_a_validation_error(bad: Any) -> None:
    error = tool_definitions(bad)
    assert isinstance(error, dict)
    assert error["error_type"] == "validation"
    assert "openai" in error["suggestion"]
    if bad == "opena":
        assert "Did you mean format='openai'" in error["suggestion"]


def test_names_restrict_and_unknown_names_are_errors() -> None:
    only = tool_definitions("anthropic", names=["list_sessions"])
    assert isinstance(only, list) and [d["name"] for d in only] == ["list_sessions"]
    error = tool_definitions("anthropic", names=["run"])
    assert isinstance(error, dict) and error["error_type"] == "validation"


class FakeExecutor:
    """Records calls; returns what a real Executor would shape-wise."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.environments = FakeEnvironments(self)

    def execute_code(self, code: str, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(("execute_code", {"code": code, **kwargs}))
        on_output = kwargs.get("on_output")
        if on_output is not None:
            on_output("stdout", "hi\n")
        return {"stdout": "hi\n", "result": None}

    def list_sessions(self) -> dict[str, Any]:
        self.calls.append(("list_sessions", {}))
        return {"sessions": [], "max_sessions": 20}

    def inspect_session(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(("inspect_session", kwargs))
        return {"names": []}

    def close_session(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(("close_session", kwargs))
        return {"closed": True}


class FakeEnvironments:
    def __init__(self, owner: FakeExecutor) -> None:
        self.owner = owner

    def create(self, spec: str, name: str | None = None) -> dict[str, Any]:
        self.owner.calls.append(("create", {"spec": spec, "name": name}))
        return {"venv_id": 1}

    def list(self) -> dict[str, Any]:
        return {"environments": []}

    def build(self, venv_id: int, on_progress: Any = None) -> dict[str, Any]:
        self.owner.calls.append(("build", {"venv_id": venv_id}))
        if on_progress is not None:
            on_progress("Resolved 1 package")
        return {"venv_id": venv_id, "built": True}


def test_call_tool_dispatches_to_the_executor() -> None:
    ex = FakeExecutor()
    seen: list[tuple[str, str]] = []
    call_tool(ex, "execute_code", {"code": "1", "state_mode": "stateful"},
              on_output=lambda s, t: seen.append((s, t)))
    call_tool(ex, "list_sessions", None)
    call_tool(ex, "inspect_session", {"session_name": "a"})
    call_tool(ex, "close_session", {"session_id": 2, "language": "bash"})
    assert [c[0] for c in ex.calls] == ["execute_code", "list_sessions", "inspect_session",
                                        "close_session"]
    assert ex.calls[0][1]["state_mode"] == "stateful"
    assert ex.calls[3][1] == {"session_id": 2, "language": "bash"}
    assert seen == [("stdout", "hi\n")]


def test_call_tool_hands_cancel_and_build_progress_to_execute_code() -> None:
    ex = FakeExecutor()
    event = threading.Event()
    lines: list[tuple[str, str]] = []
    call_tool(ex, "execute_code", {"code": "1"}, on_output=lambda s, t: lines.append((s, t)),
              cancel=event)
    passed = ex.calls[0][1]
    assert passed["cancel"] is event
    passed["on_progress"]("Built 1 package")
    assert lines[-1] == ("build", "Built 1 package")
    call_tool(ex, "execute_code", {"code": "1"})
    assert ex.calls[1][1]["cancel"] is None and ex.calls[1][1]["on_progress"] is None


def test_create_environment_with_build_streams_progress() -> None:
    ex = FakeExecutor()
    lines: list[tuple[str, str]] = []
    result = call_tool(ex, "create_environment", {"spec": "pandas<2", "build": True},
                       on_output=lambda s, t: lines.append((s, t)))
    assert result == {"venv_id": 1, "built": True}
    assert lines == [("build", "Resolved 1 package")]
    assert build_environment(ex.environments, 3) == {"venv_id": 3, "built": True}


@pytest.mark.parametrize(("name", "guess"), [
    ("run_code", "execute_code"), ("listsessions", "list_sessions"), ("exec", "execute_code"),
    ("call_functions", "call_function"), ("zzz", None),
])
def test_an_unknown_tool_is_not_found_with_the_nearest_name(name: str, guess: str | None) -> None:
    error = check_arguments(name, {})
    assert error is not None and error["error_type"] == "not_found"
    assert "Did you mean" in error["suggestion"]
    if guess is not None:
        assert f"Did you mean {guess!r}?" in error["suggestion"]


@pytest.mark.parametrize(("name", "arguments", "fragment"), [
    ("execute_code", {}, "code"),
    ("execute_code", {"code": "1", "sessionname": "a"}, "Did you mean 'session_name'"),
    ("execute_code", ["code"], "object"),
    ("list_sessions", {"verbose": True}, "no arguments"),
])
def test_malformed_calls_are_validation_errors(name: str, arguments: Any, fragment: str) -> None:
    error = check_arguments(name, arguments)
    assert error is not None and error["error_type"] == "validation"
    assert fragment in error["error"] + error["suggestion"]
    ex = FakeExecutor()
    assert call_tool(ex, name, arguments) == error
    assert ex.calls == []


def test_well_formed_calls_pass_the_shape_check() -> None:
    assert check_arguments("execute_code", {"code": "1", "timeout": "soon"}) is None  # values:
    assert check_arguments("list_sessions", None) is None                            # executor's


# --- the library tools -------------------------------------------------------------------


def props_of(name: str) -> dict[str, Any]:
    return dict(next(t for t in TOOLS if t.name == name).parameters["properties"])


def schema_of(rendered: dict[str, Any], fmt: str) -> dict[str, Any]:
    if fmt == "openai":
        return dict(rendered["function"]["parameters"])
    return dict(rendered["input_schema" if fmt == "anthropic" else "inputSchema"])


@pytest.mark.parametrize("fmt", ["openai", "anthropic", "mcp"])
def test_library_tools_are_defined_in_every_dialect(fmt: str) -> None:
    rendered = {(d["function"] if fmt == "openai" else d)["name"]: d for d in defs(fmt)}
    assert set(LIBRARY_TOOLS) <= set(rendered)
    schemas = {name: schema_of(rendered[name], fmt) for name in LIBRARY_TOOLS}
    for name, schema in schemas.items():
        assert schema == filled(described_defaults(next(t for t in TOOLS if t.name == name)),
                                "50 s" if fmt == "mcp" else "60 s")
        assert schema["additionalProperties"] is False
        assert all(p.get("description") for p in schema["properties"].values()), name
    assert {name: schema["required"] for name, schema in schemas.items()} == {
        "list_functions": [], "show_function": ["name"], "define_function": ["source"],
        "call_function": ["name"]}
    if fmt == "mcp":
        hints = {n: rendered[n]["annotations"] for n in LIBRARY_TOOLS}
        assert hints["list_functions"]["readOnlyHint"] and hints["show_function"]["readOnlyHint"]
        assert not hints["define_function"]["readOnlyHint"]
        assert not hints["define_function"]["destructiveHint"]
        assert hints["define_function"]["idempotentHint"]  # same source and env: same version
        assert not hints["call_function"]["readOnlyHint"]
        assert hints["call_function"]["destructiveHint"]  # stateful changes a session


def test_library_tool_arguments() -> None:
    call = props_of("call_function")
    assert set(call) == {"name", "args", "kwargs", "state_mode", "session_id", "session_name",
                         "version", "timeout", "wait"}
    assert call["state_mode"]["enum"] == ["stateless", "stateful", "read_only"]
    assert call["state_mode"]["default"] == "stateless"
    assert "array" in call["args"]["type"] and "items" in call["args"]  # OpenAI wants items
    assert call["args"]["items"].get("type"), "an items schema that validates something"
    # No open object anywhere: a framework's strict conversion must be able to close it.
    assert "object" not in call["args"]["items"]["type"]
    assert call["kwargs"]["type"] == ["string", "null"]
    # Optional arguments without a default accept null, which means omitted.
    assert call["version"]["type"] == call["session_id"]["type"] == ["integer", "null"]
    assert set(props_of("define_function")) == {"source", "name", "env"}
    assert set(props_of("show_function")) == {"name", "version"}
    assert props_of("list_functions") == {}
    env = props_of("define_function")["env"]["description"]
    assert "PEP 723" in env and "pyproject" in env and "requirements" in env


def test_call_function_reasons_once_per_state_mode() -> None:
    description = next(t for t in TOOLS if t.name == "call_function").description
    lines = description.splitlines()

    def line_for(mode: str) -> str:
        found = [line for line in lines if line.startswith(f"- {mode}:")]
        assert len(found) == 1, f"no single line for {mode}"
        return found[0]

    assert "change a session" in line_for("stateful")
    assert "copy" in line_for("read_only") and "first" in line_for("read_only")
    assert "one-off" in line_for("stateless")


@pytest.mark.parametrize(("name", "arguments", "fragment"), [
    ("call_function", {}, "name"),
    ("call_function", {"name": "f", "arg": [1]}, "Did you mean 'args'"),
    ("define_function", {"name": "f"}, "source"),
    ("show_function", {}, "name"),
    ("list_functions", {"name": "f"}, "no arguments"),
])
def test_malformed_library_calls_are_validation_errors(name: str, arguments: Any,
                                                       fragment: str) -> None:
    error = check_arguments(name, arguments)
    assert error is not None and error["error_type"] == "validation"
    assert fragment in error["error"] + error["suggestion"]


LEDGER_SOURCE = """\
def record(amount):
    \"\"\"Add an amount to the session's ledger; return the count and the total.\"\"\"
    ledger = globals().setdefault("ledger", [])
    ledger.append(amount)
    return {"count": len(ledger), "total": sum(ledger)}
"""


@pytest.fixture
def executor(tmp_path: Path) -> Iterator[Executor]:
    with Executor(root=tmp_path / "home", timeout=30) as ex:
        yield ex


@pytest.mark.timeout(60)
def test_library_tools_route_to_a_real_executor(executor: Executor) -> None:
    ex = executor
    assert call_tool(ex, "list_functions", {}) == {"functions": []}

    stored = call_tool(ex, "define_function", {"source": LEDGER_SOURCE})
    assert "error_type" not in stored, stored
    assert stored["name"] == "record" and stored["version"] == 1
    assert stored["signature"] == "record(amount)" and stored["venv_id"] is None
    assert stored["doc"].startswith("Add an amount")
    # Same source again keeps the version; an empty env means the own interpreter.
    again = call_tool(ex, "define_function", {"source": LEDGER_SOURCE, "name": "record",
                                              "env": ""})
    assert again["version"] == 1 and again["env"] is None

    listed = call_tool(ex, "list_functions", None)
    assert [(f["name"], f["version"]) for f in listed["functions"]] == [("record", 1)]
    shown = call_tool(ex, "show_function", {"name": "record"})
    assert shown["source"] == LEDGER_SOURCE and shown["versions"] == [1]

    for amount, expected in ((5, {"count": 1, "total": 5}), (7, {"count": 2, "total": 12})):
        changed = call_tool(ex, "call_function", {
            "name": "record", "args": [amount], "state_mode": "stateful",
            "session_name": "books"})
        assert "error_type" not in changed, changed
        assert changed["value"] == expected
        assert changed["function"] == {"name": "record", "version": 1}
        assert changed["session"]["session_name"] == "books"

    # read_only sees the session's state ...
    tried = call_tool(ex, "call_function", {
        "name": "record", "kwargs": {"amount": 100}, "state_mode": "read_only",
        "session_name": "books"})
    assert "error_type" not in tried, tried
    assert tried["value"] == {"count": 3, "total": 112}
    assert tried["isolation"]["names"] is True and tried["isolation"]["objects"] is True
    # ... and changes nothing in it.
    names = {n["name"]: n for n in call_tool(ex, "inspect_session",
                                             {"session_name": "books"})["names"]}
    assert names["ledger"]["repr"] == "[5, 7]"

    # A one-off call runs fresh.
    once = call_tool(ex, "call_function", {"name": "record", "args": [1]})
    assert once["value"] == {"count": 1, "total": 1} and once["state_mode"] == "stateless"


@pytest.mark.timeout(60)
def test_library_tool_errors_are_spec_dicts(executor: Executor) -> None:
    ex = executor
    assert "error_type" not in call_tool(ex, "define_function", {"source": LEDGER_SOURCE})

    bad_coordinates: list[tuple[dict[str, Any], str]] = [
        ({"state_mode": "read_only"}, "without specifying a session"),
        ({"session_name": "books"}, "stateless"),
        ({"state_mode": "stateful", "session_id": 1, "session_name": "books"}, "both"),
        ({"state_mode": "statefull"}, "Did you mean state_mode='stateful'"),
        ({"timeout": -1}, "timeout"),
    ]
    for coordinate, fragment in bad_coordinates:
        error = call_tool(ex, "call_function", {"name": "record", "args": [1], **coordinate})
        assert error["error_type"] == "validation", (coordinate, error)
        assert fragment in error["error"] + error["suggestion"], (coordinate, error)
        assert error["suggestion"]
    # Nothing ran, so no session was opened.
    assert [s["session_name"] for s in call_tool(ex, "list_sessions", {})["sessions"]] == [None]

    missing = call_tool(ex, "call_function", {"name": "recrod", "args": [1]})
    assert missing["error_type"] == "not_found"
    assert "Did you mean 'record'?" in missing["suggestion"]
    assert call_tool(ex, "show_function", {"name": "recrod"})["error_type"] == "not_found"
    no_version = call_tool(ex, "call_function", {"name": "record", "version": 9})
    assert no_version["error_type"] == "not_found" and "1" in no_version["suggestion"]

    not_a_list = call_tool(ex, "call_function", {"name": "record", "args": {"amount": 1}})
    assert not_a_list["error_type"] == "validation"
    raised = call_tool(ex, "call_function", {"name": "record", "args": ["x"]})
    assert raised["error_type"] == "execution" and raised["exception"] == "TypeError"

    for bad in ({"source": None}, {"source": "x = 1"}, {"source": "def f(:"},
                {"source": LEDGER_SOURCE, "name": "nope"}, {"source": LEDGER_SOURCE, "env": 3}):
        error = call_tool(ex, "define_function", bad)
        assert error["error_type"] == "validation", (bad, error)
        assert error["suggestion"], bad
    assert [f["name"] for f in call_tool(ex, "list_functions", {})["functions"]] == ["record"]
