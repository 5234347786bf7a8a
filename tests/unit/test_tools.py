"""Tool definitions (three dialects, one source) and tool-call dispatch, without processes."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from coordex.tools import (
    TOOL_NAMES,
    TOOLS,
    build_environment,
    call_tool,
    check_arguments,
    tool_definitions,
)

SESSION_TOOLS = ("execute_code", "list_sessions", "inspect_session", "close_session")


def defs(fmt: str) -> list[dict[str, Any]]:
    result = tool_definitions(fmt)
    assert isinstance(result, list)
    return result


def test_every_session_tool_is_defined() -> None:
    assert set(SESSION_TOOLS) <= set(TOOL_NAMES)


@pytest.mark.parametrize("fmt", ["openai", "anthropic", "mcp"])
def test_the_three_dialects_carry_the_same_schema(fmt: str) -> None:
    rendered = defs(fmt)
    assert [d["name"] if fmt != "openai" else d["function"]["name"] for d in rendered] == list(
        TOOL_NAMES)
    for tool, d in zip(TOOLS, rendered, strict=True):
        if fmt == "openai":
            assert d["type"] == "function"
            assert set(d["function"]) == {"name", "description", "parameters"}
            schema = d["function"]["parameters"]
        elif fmt == "anthropic":
            assert set(d) == {"name", "description", "input_schema"}
            schema = d["input_schema"]
        else:
            assert set(d) == {"name", "description", "inputSchema", "annotations"}
            schema = d["inputSchema"]
        assert schema == tool.parameters
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


def test_call_tool_passes_cancel_only_when_accepted() -> None:
    ex = FakeExecutor()
    call_tool(ex, "execute_code", {"code": "1"}, cancel=threading.Event())
    assert "cancel" not in ex.calls[0][1]

    class Cancellable(FakeExecutor):
        def execute_code(self, code: str, cancel: Any = None, **kwargs: Any) -> dict[str, Any]:
            return super().execute_code(code, cancel=cancel, **kwargs)

    ex2 = Cancellable()
    event = threading.Event()
    call_tool(ex2, "execute_code", {"code": "1"}, cancel=event)
    assert ex2.calls[0][1]["cancel"] is event


def test_create_environment_with_build_streams_progress() -> None:
    ex = FakeExecutor()
    lines: list[tuple[str, str]] = []
    result = call_tool(ex, "create_environment", {"spec": "pandas<2", "build": True},
                       on_output=lambda s, t: lines.append((s, t)))
    assert result == {"venv_id": 1, "built": True}
    assert lines == [("build", "Resolved 1 package")]
    assert build_environment(ex.environments, 3) == {"venv_id": 3, "built": True}


@pytest.mark.parametrize(("name", "arguments", "fragment"), [
    ("run_code", {}, "Did you mean 'execute_code'"),
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
