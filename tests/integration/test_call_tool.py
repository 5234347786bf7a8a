"""``Executor.call_tool``: a model's tool call routed as it was produced, on a real Executor.

Strict-mode models send every argument, ``null`` for the ones they mean to leave out;
each such call must behave exactly like the call without them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coordex import Executor
from coordex.tools import TOOLS, get_tool

# call_id: a fresh id per call; over MCP every call waits at most --max-wait (SPEC 14)
# and so carries one, as a Python call given wait does.
VOLATILE = {"duration_ms", "created_at", "last_used_at", "spec_hash", "ms", "at", "checkpoint",
            "call_id"}


def steady(value: Any) -> Any:
    """``value`` without the keys that differ between two runs of the same call."""
    if isinstance(value, dict):
        return {k: steady(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [steady(v) for v in value]
    if isinstance(value, str):  # cell numbers count per process, not per executor
        return re.sub(r"cp-[0-9a-f]{8}", "cp-", re.sub(r"<cell-\d+>", "<cell>", value))
    return value


@pytest.fixture
def ex(tmp_path: Path) -> Iterator[Executor]:
    with Executor(root=tmp_path / "home") as executor:
        yield executor


def with_nulls(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """``arguments`` plus every other argument of the tool set to null (strict mode)."""
    tool = get_tool(name)
    assert tool is not None
    return {**{key: None for key in tool.parameters["properties"]}, **arguments}


# A session-building sequence run twice, once plain and once with every optional null.
CALLS: list[tuple[str, dict[str, Any]]] = [
    ("execute_code", {"code": "rows = [1, 2, 3]\nlen(rows)", "state_mode": "stateful",
                      "session_name": "audit"}),
    ("execute_code", {"code": "rows.append(4)\nlen(rows)", "state_mode": "read_only",
                      "session_name": "audit"}),
    ("execute_code", {"code": "len(rows)", "state_mode": "stateful", "session_name": "audit"}),
    ("execute_code", {"code": "echo $((6 * 7))", "language": "bash"}),
    ("execute_code", {"code": "1 +"}),
    ("execute_code", {"code": "x", "state_mode": "read_only"}),
    ("inspect_session", {"session_name": "audit"}),
    ("inspect_session", {}),
    ("list_sessions", {}),
    ("fork_session", {"session_name": "audit", "new_name": "trial"}),
    ("checkpoint_session", {"session_name": "trial", "label": "four rows"}),
    ("list_checkpoints", {"session_name": "trial"}),
    ("restore_session", {"session_name": "trial", "checkpoint": "cp-00000000"}),
    ("define_function", {"source": "def double(x, factor=2):\n    return x * factor"}),
    ("show_function", {"name": "double"}),
    ("call_function", {"name": "double", "args": [21]}),
    ("call_function", {"name": "double", "args": [2], "kwargs": {"factor": 5}}),
    ("call_function", {"name": "double", "state_mode": "read_only", "session_name": "audit",
                       "args": [1]}),
    ("list_functions", {}),
    ("create_environment", {"spec": "ledgerlib==1.0"}),
    ("list_environments", {}),
    ("close_session", {"session_name": "audit"}),
    ("rebuild_session", {"session_name": "audit"}),
    ("close_session", {"session_name": "audit"}),
    ("close_session", {"session_name": "audit"}),
    ("wait_call", {"call_id": "c_unknown"}),
    ("cancel_call", {"call_id": "c_unknown"}),
]


def run_all(ex: Executor, nulls: bool) -> list[dict[str, Any]]:
    return [steady(ex.call_tool(name, with_nulls(name, args) if nulls else args))
            for name, args in CALLS]


def test_every_tool_is_in_the_sequence() -> None:
    assert {name for name, _ in CALLS} == {tool.name for tool in TOOLS}


def test_nulls_mean_omitted_in_every_tool(tmp_path: Path) -> None:
    with Executor(root=tmp_path / "plain") as plain, Executor(root=tmp_path / "nulls") as nulls:
        expected = run_all(plain, nulls=False)
        got = run_all(nulls, nulls=True)
    for (name, args), want, have in zip(CALLS, expected, got, strict=True):
        assert have == want, f"{name}({args})"
    assert expected[2]["result"] == "3"  # the read-only append was discarded
    assert expected[15]["value"] == 42 and expected[16]["value"] == 10
    assert expected[9]["session"]["session_name"] == "trial"
    assert expected[10]["label"] == "four rows" and len(expected[11]["checkpoints"]) == 1
    assert expected[12]["error_type"] == "not_found"
    assert expected[4]["error_type"] == "execution"
    assert expected[5]["error_type"] == "validation"  # read_only without a session


def test_arguments_as_json_text_are_the_same_call(ex: Executor) -> None:
    as_dict = ex.call_tool("execute_code", {"code": "6 * 7", "session_id": None})
    as_text = ex.call_tool("execute_code", json.dumps({"code": "6 * 7", "session_id": None}))
    assert steady(as_text) == steady(as_dict) and as_dict["result"] == "42"
    assert "sessions" in ex.call_tool("list_sessions", "")  # no-argument tools: empty text


def test_strict_call_function_takes_args_and_kwargs_as_json_text(ex: Executor) -> None:
    ex.call_tool("define_function", {"source": "def scale(x, by=1):\n    return [x, by]"})
    result = ex.call_tool("call_function", with_nulls("call_function", {
        "name": "scale", "args": "[3]", "kwargs": '{"by": 4}'}))
    assert result["value"] == [3, 4]
    bad = ex.call_tool("call_function", {"name": "scale", "args": "[3"})
    assert bad["error_type"] == "validation" and "'[3'" in bad["error"]


@pytest.mark.parametrize("arguments", ['{"code": ', "[1, 2]", "42"])
def test_malformed_argument_text_is_a_validation_error(ex: Executor, arguments: str) -> None:
    error = ex.call_tool("execute_code", arguments)
    assert error["error_type"] == "validation" and error["suggestion"]


def test_an_unknown_tool_names_the_nearest(ex: Executor) -> None:
    error = ex.call_tool("execute", {"code": "1"})
    assert error["error_type"] == "not_found"
    assert "Did you mean 'execute_code'?" in error["suggestion"]


def test_a_required_argument_sent_as_null_is_missing(ex: Executor) -> None:
    error = ex.call_tool("execute_code", with_nulls("execute_code", {}))
    assert error["error_type"] == "validation" and "code" in error["error"]


def test_call_tool_results_are_json_normal(ex: Executor) -> None:
    result = ex.call_tool("execute_code", {"code": "print('hi')"})
    assert json.loads(json.dumps(result)) == result and result["stdout"] == "hi\n"


def test_the_async_executor_routes_tool_calls(tmp_path: Path) -> None:
    import asyncio

    from coordex import AsyncExecutor

    async def main() -> dict[str, Any]:
        async with AsyncExecutor(root=tmp_path) as ex:
            return await ex.call_tool("execute_code", '{"code": "6 * 7", "timeout": null}')

    assert asyncio.run(main())["result"] == "42"


def test_lone_surrogates_are_escaped_as_on_the_mcp_wire(ex: Executor) -> None:
    # A stored function's value is the function's own: nothing escaped it on the way.
    ex.call_tool("define_function", {"source": "def cafe():\n    return 'caf' + chr(0xDCE9)"})
    assert ex.call_tool("call_function", {"name": "cafe"})["value"] == "caf\\udce9"
