"""``coordex mcp`` end to end: the SDK's client starts the real process over stdio."""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession
from mcp.types import CallToolResult, ImageContent, TextContent

from ._procs import run_stdio_session

pytestmark = pytest.mark.timeout(120)

Body = Callable[[ClientSession], Awaitable[None]]


def run_session(home: Path, body: Body) -> None:
    run_stdio_session(home, body)


def structured(result: CallToolResult) -> dict[str, Any]:
    assert isinstance(result.structured_content, dict)
    return result.structured_content


def test_tools_are_listed_with_schemas_and_annotations(tmp_path: Path) -> None:
    async def body(session: ClientSession) -> None:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        assert {"execute_code", "list_sessions", "inspect_session", "close_session"} <= set(tools)
        schema = tools["execute_code"].input_schema
        assert schema["required"] == ["code"]
        props = schema["properties"]
        assert props["language"]["enum"] == ["python", "bash"]
        assert props["state_mode"]["enum"] == ["stateless", "stateful", "read_only"]
        assert all(p.get("description") for p in props.values())
        description = tools["execute_code"].description or ""
        for mode in ("stateful", "stateless", "read_only"):
            assert mode in description
        for name in ("list_sessions", "inspect_session"):
            annotations = tools[name].annotations
            assert annotations is not None and annotations.read_only_hint is True
        exec_annotations = tools["execute_code"].annotations
        assert exec_annotations is not None and exec_annotations.read_only_hint is False

    run_session(tmp_path, body)


def test_stateful_then_read_only_then_inspect(tmp_path: Path) -> None:
    async def body(session: ClientSession) -> None:
        loaded = await session.call_tool("execute_code", {
            "code": "rows = list(range(5))\nlen(rows)", "state_mode": "stateful",
            "session_name": "audit"})
        assert not loaded.is_error
        assert structured(loaded)["result"] == "5"
        assert structured(loaded)["session"]["session_name"] == "audit"

        looked = await session.call_tool("execute_code", {
            "code": "rows.reverse(); rows.append(99); rows", "state_mode": "read_only",
            "session_name": "audit"})
        assert not looked.is_error, looked
        record = structured(looked)
        assert record["result"] == "[4, 3, 2, 1, 0, 99]"
        assert record["isolation"]["names"] is True

        inspected = await session.call_tool("inspect_session", {"session_name": "audit"})
        names = {n["name"]: n for n in structured(inspected)["names"]}
        assert names["rows"]["repr"] == "[0, 1, 2, 3, 4]"

        listed = structured(await session.call_tool("list_sessions", {}))
        assert any(s["session_name"] == "audit" for s in listed["sessions"])

        # The text block carries the same dict as JSON.
        assert isinstance(inspected.content[0], TextContent)
        assert '"rows"' in inspected.content[0].text

    run_session(tmp_path, body)


def test_validation_errors_are_tool_results_with_the_error_dict(tmp_path: Path) -> None:
    async def body(session: ClientSession) -> None:
        result = await session.call_tool("execute_code", {"code": "x", "state_mode": "read_only"})
        assert result.is_error
        record = structured(result)
        assert record["error_type"] == "validation"
        assert record["error"] == "Cannot use state_mode='read_only' without specifying a session."
        assert "session_id or session_name" in record["suggestion"]

        # Values the schema forbids still reach coordex and get its suggestion.
        typo = await session.call_tool("execute_code", {"code": "1", "state_mode": "statefull"})
        assert typo.is_error
        assert "stateful" in structured(typo)["suggestion"]

        unknown = await session.call_tool("execute_code", {"code": "1", "sesion_name": "a"})
        assert unknown.is_error and structured(unknown)["error_type"] == "validation"
        assert "session_name" in structured(unknown)["suggestion"]

        closing_plan = await session.call_tool("close_session", {"session_id": 0})
        assert closing_plan.is_error and structured(closing_plan)["error_type"] == "validation"

        missing = await session.call_tool("inspect_session", {"session_name": "nope"})
        assert missing.is_error and structured(missing)["error_type"] == "not_found"

    run_session(tmp_path, body)


def test_a_stored_function_defined_then_tried_read_only_then_run_stateful(
        tmp_path: Path) -> None:
    source = (
        "def mark_reviewed(limit):\n"
        "    \"\"\"Mark the first `limit` rows reviewed; return how many are.\"\"\"\n"
        "    for row in rows[:limit]:\n"
        "        row['reviewed'] = True\n"
        "    return sum(1 for row in rows if row.get('reviewed'))\n"
    )
    count_reviewed = "sum(1 for row in rows if row.get('reviewed'))"

    async def body(session: ClientSession) -> None:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        for name, read_only in (("list_functions", True), ("show_function", True),
                                ("define_function", False), ("call_function", False)):
            annotations = tools[name].annotations
            assert annotations is not None and annotations.read_only_hint is read_only, name
        assert tools["call_function"].input_schema["properties"]["state_mode"]["enum"] == [
            "stateless", "stateful", "read_only"]

        loaded = await session.call_tool("execute_code", {
            "code": "rows = [{'id': i} for i in range(4)]", "state_mode": "stateful",
            "session_name": "audit"})
        assert not loaded.is_error, loaded

        defined = await session.call_tool("define_function", {"source": source})
        assert not defined.is_error, defined
        assert structured(defined)["name"] == "mark_reviewed"
        assert structured(defined)["version"] == 1
        listed = structured(await session.call_tool("list_functions", {}))
        assert [f["name"] for f in listed["functions"]] == ["mark_reviewed"]

        tried = await session.call_tool("call_function", {
            "name": "mark_reviewed", "args": [3], "state_mode": "read_only",
            "session_name": "audit"})
        assert not tried.is_error, tried
        assert structured(tried)["value"] == 3
        assert structured(tried)["isolation"]["objects"] is True
        untouched = await session.call_tool("execute_code", {
            "code": count_reviewed, "state_mode": "stateful", "session_name": "audit"})
        assert structured(untouched)["result"] == "0"

        applied = await session.call_tool("call_function", {
            "name": "mark_reviewed", "kwargs": {"limit": 2}, "state_mode": "stateful",
            "session_name": "audit"})
        assert not applied.is_error, applied
        assert structured(applied)["value"] == 2
        changed = await session.call_tool("execute_code", {
            "code": count_reviewed, "state_mode": "stateful", "session_name": "audit"})
        assert structured(changed)["result"] == "2"

        missing = await session.call_tool("call_function", {
            "name": "mark_reveiwed", "args": [1], "state_mode": "stateful",
            "session_name": "audit"})
        assert missing.is_error
        record = structured(missing)
        assert record["error_type"] == "not_found"
        assert "Did you mean 'mark_reviewed'?" in record["suggestion"]

    run_session(tmp_path, body)


def test_raw_fd1_writes_do_not_corrupt_the_protocol(tmp_path: Path) -> None:
    code = (
        "import os, subprocess, sys\n"
        "os.write(1, b'garbage\\n')\n"
        "subprocess.run([sys.executable, '-c', 'print(\"from a child\")'])\n"
        "print('printed')\n"
    )

    async def body(session: ClientSession) -> None:
        result = await session.call_tool("execute_code", {"code": code})
        assert not result.is_error, result
        stdout = structured(result)["stdout"]
        for text in ("garbage", "from a child", "printed"):
            assert text in stdout
        # The connection still works afterwards.
        again = await session.call_tool("execute_code", {"code": "6 * 7"})
        assert structured(again)["result"] == "42"

    run_session(tmp_path, body)


def test_progress_notifications_carry_new_output(tmp_path: Path) -> None:
    code = "import time\nfor i in range(4):\n    print('step', i, flush=True)\n    time.sleep(.4)"
    messages: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        messages.append(message or "")

    async def body(session: ClientSession) -> None:
        result = await session.call_tool("execute_code", {"code": code},
                                         progress_callback=on_progress)
        assert not result.is_error
        assert messages, "no progress notification arrived during a 1.6 s run"
        assert any("step" in m for m in messages)

    run_session(tmp_path, body)


def test_figures_come_back_as_image_content(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    code = (
        "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
        "plt.plot([1, 3, 2])\nNone\n"
    )

    async def body(session: ClientSession) -> None:
        result = await session.call_tool("execute_code", {"code": code})
        assert not result.is_error, result
        images = [c for c in result.content if isinstance(c, ImageContent)]
        assert images, f"no image content in {result.content!r}"
        assert images[0].mime_type == "image/png"
        assert base64.b64decode(images[0].data).startswith(b"\x89PNG")
        record = structured(result)
        assert record["images"][0]["data"] == images[0].data
        # The text block points at the image instead of repeating the base64.
        text = result.content[0]
        assert isinstance(text, TextContent) and images[0].data not in text.text

    run_session(tmp_path, body)


def test_bash_sessions_keep_their_shell_state(tmp_path: Path) -> None:
    async def body(session: ClientSession) -> None:
        first = await session.call_tool("execute_code", {
            "code": "cd /tmp && GREETING=hello && false", "language": "bash",
            "state_mode": "stateful"})
        assert not first.is_error, first  # a non-zero exit is a result, not an error
        assert structured(first)["exit_code"] == 1
        second = await session.call_tool("execute_code", {
            "code": 'echo "$GREETING from $PWD"', "language": "bash", "state_mode": "stateful"})
        assert structured(second)["stdout"].strip() == "hello from /tmp"

    run_session(tmp_path, body)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_environment_built_with_progress_then_used(tmp_path: Path) -> None:
    from coordex.demo import write_forecast_wheel

    wheel = write_forecast_wheel(tmp_path / "wheels")
    spec = f"coordex-demo-forecast @ {wheel.as_uri()}\n"
    messages: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        messages.append(message or "")

    async def body(session: ClientSession) -> None:
        names = {tool.name for tool in (await session.list_tools()).tools}
        if "create_environment" not in names:
            pytest.skip("this build has no environments")
        created = await session.call_tool(
            "create_environment", {"spec": spec, "name": "forecast", "build": True},
            progress_callback=on_progress)
        assert not created.is_error, created
        venv_id = structured(created)["venv_id"]
        assert any("[build]" in m for m in messages), messages
        listed = structured(await session.call_tool("list_environments", {}))
        assert [e["venv_id"] for e in listed["environments"]] == [venv_id]
        used = await session.call_tool("execute_code", {
            "code": "from coordex_demo_forecast import linear_forecast\n"
                    "linear_forecast([1.0, 2.0, 3.0], steps=2)",
            "venv_id": venv_id})
        assert structured(used)["result"] == "[4.0, 5.0]"

    run_session(tmp_path, body)


def test_a_cancelled_call_leaves_the_server_responsive(tmp_path: Path) -> None:
    async def body(session: ClientSession) -> None:
        with pytest.raises(Exception):  # noqa: B017 - the SDK's timeout error type is internal
            await session.call_tool("execute_code", {
                "code": "import time\ntime.sleep(4)",
                "timeout": 10}, read_timeout_seconds=0.5)
        with anyio.fail_after(3):
            listed = await session.call_tool("list_sessions", {})
        assert not listed.is_error
        with anyio.fail_after(20):  # at worst the abandoned call runs out first
            after = await session.call_tool("execute_code", {"code": "'still here'"})
        assert structured(after)["result"] == "'still here'"

    run_session(tmp_path, body)
