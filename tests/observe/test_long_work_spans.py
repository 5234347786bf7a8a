"""Spans of calls that outlive their answer (SPEC 14 x SPEC 16): a call given ``wait``
that answers ``running`` ends its ``tools/call`` span with that answer (as the MCP
conventions have a request's span end with its response), and the run of its code is a
child span, ``execute_tool {tool}``, that ends when the code does, with its outcome;
``wait_call`` and ``cancel_call`` are spans of their own that link to the call's."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from coordex import Executor
from tests.e2e._procs import child_env

from ._otlp import otel_env, receiver
from ._spans import by_name

pytestmark = pytest.mark.timeout(120)

SLOW = "import time; time.sleep(0.6); print('done')"


def test_a_call_answered_running_has_its_run_as_a_child_span_to_its_end(
        tmp_path: Path, spans: InMemorySpanExporter) -> None:
    with Executor(root=tmp_path) as ex:
        running = ex.execute_code(SLOW, state_mode="stateful", wait=0.05)
        assert running["running"] is True, running
        [call] = by_name(spans, "tools/call execute_code")  # ended with its answer
        assert call.attributes["coordex.outcome"] == "running"
        assert call.attributes["gen_ai.tool.call.id"] == running["call_id"]
        assert "error.type" not in call.attributes
        assert not by_name(spans, "execute_tool execute_code")  # the code still runs
        final = ex.wait_call(running["call_id"])
    assert final["stdout"] == "done\n"
    [run] = by_name(spans, "execute_tool execute_code")
    assert run.parent.span_id == call.context.span_id
    assert run.start_time == call.start_time < call.end_time < run.end_time
    assert run.end_time - run.start_time >= 0.6e9  # it covers the code to its end
    assert run.attributes["coordex.outcome"] == "ok"
    assert run.attributes["coordex.state_mode"] == "stateful"
    assert run.attributes["gen_ai.operation.name"] == "execute_tool"
    assert run.attributes["gen_ai.tool.call.id"] == running["call_id"]
    [waited] = by_name(spans, "tools/call wait_call")
    assert waited.attributes["gen_ai.tool.call.id"] == running["call_id"]
    assert waited.attributes["coordex.outcome"] == "ok"
    assert [link.context.span_id for link in waited.links] == [call.context.span_id]


def test_the_run_carries_the_error_and_cancel_call_is_a_span(
        tmp_path: Path, spans: InMemorySpanExporter) -> None:
    with Executor(root=tmp_path) as ex, trace.get_tracer("agent").start_as_current_span("step"):
        failing = ex.execute_code("import time; time.sleep(0.4); 1/0", wait=0.05)
        endless = ex.execute_code("import time; time.sleep(60)", wait=0.05)
        failed = ex.wait_call(failing["call_id"])
        cancelled = ex.cancel_call(endless["call_id"])
    assert failed["error_type"] == "execution" and cancelled["error_type"], cancelled
    calls = {s.attributes["gen_ai.tool.call.id"]: s
             for s in by_name(spans, "tools/call execute_code")}
    runs = {s.attributes["gen_ai.tool.call.id"]: s
            for s in by_name(spans, "execute_tool execute_code")}
    for answer, end in ((failing, failed), (endless, cancelled)):
        call, run = calls[answer["call_id"]], runs[answer["call_id"]]
        assert call.attributes["coordex.outcome"] == "running" and call.status.is_unset
        assert run.parent.span_id == call.context.span_id
        assert run.attributes["coordex.outcome"] == end["error_type"]
        assert run.attributes["error.type"] == "tool_error"
        assert run.status.status_code == trace.StatusCode.ERROR
    [cancel] = by_name(spans, "tools/call cancel_call")
    assert cancel.attributes["coordex.outcome"] == cancelled["error_type"]
    assert [link.context.span_id for link in cancel.links] == \
        [calls[endless["call_id"]].context.span_id]


def test_a_call_that_ends_within_wait_is_one_span(
        tmp_path: Path, spans: InMemorySpanExporter) -> None:
    with Executor(root=tmp_path) as ex:
        result = ex.execute_code("1 + 1", wait=30)
    assert result["result"] == "2"
    [call] = by_name(spans, "tools/call execute_code")
    assert call.attributes["coordex.outcome"] == "ok"
    assert call.attributes["gen_ai.tool.call.id"] == result["call_id"]
    assert not by_name(spans, "execute_tool execute_code")


def test_over_mcp_the_run_is_a_child_of_the_servers_span(tmp_path: Path) -> None:
    results: list[dict[str, Any]] = []
    with receiver() as otlp, (tmp_path / "stderr.log").open("w") as errlog:
        params = StdioServerParameters(
            command=sys.executable, args=["-m", "coordex", "mcp", "--otel"],
            env=child_env(tmp_path / "home", **otel_env(otlp.url)))

        async def main() -> None:
            async with stdio_client(params, errlog=errlog) as (read, write), \
                    ClientSession(read, write) as session:
                await session.initialize()
                with anyio.fail_after(90):
                    for tool, arguments in (("execute_code", {"code": SLOW, "wait": 0.05}),
                                            ("wait_call", None)):
                        if arguments is None:
                            arguments = {"call_id": results[0]["call_id"]}
                        found = await session.call_tool(tool, arguments)
                        assert isinstance(found.structured_content, dict)
                        results.append(found.structured_content)

        anyio.run(main)
        [run] = otlp.wait("execute_tool execute_code")
        [call] = otlp.wait("tools/call execute_code")
        [waited] = otlp.wait("tools/call wait_call")
    assert results[0]["running"] is True and results[1]["stdout"] == "done\n", results
    assert call.attributes["coordex.outcome"] == "running"
    assert call.attributes["gen_ai.tool.call.id"] == results[0]["call_id"]
    assert run.parent_span_id == call.span_id and run.trace_id == call.trace_id
    assert run.start_ns == call.start_ns and run.end_ns - run.start_ns >= 0.6e9
    assert run.attributes["coordex.outcome"] == "ok"
    assert waited.links == [call.span_id]


def test_under_tokens_the_run_comes_from_the_wait_call_that_fetched_its_end(
        tmp_path: Path) -> None:
    from tests.e2e._procs import spawn
    from tests.e2e.test_mcp_http import call_with_sdk

    from .test_servers import ALICE, READY, _tokens

    with receiver() as otlp:
        env = child_env(tmp_path / "home", **otel_env(otlp.url))
        with spawn("serve", "--port", "0", "--tokens", str(_tokens(tmp_path)), "--otel",
                   env=env) as running:
            url = running.wait_for(READY).group(1)
            [answer] = call_with_sdk(url, ALICE, [("execute_code", {"code": SLOW,
                                                                    "wait": 0.05})])
            [final] = call_with_sdk(url, ALICE, [("wait_call",
                                                  {"call_id": answer["call_id"]})])
            [run] = otlp.wait("execute_tool execute_code")
            [call] = otlp.wait("tools/call execute_code")
            [waited] = otlp.wait("tools/call wait_call")
    assert answer["running"] is True and final["stdout"] == "done\n", (answer, final)
    assert call.attributes["coordex.outcome"] == "running"
    assert run.parent_span_id == call.span_id and run.start_ns == call.start_ns
    assert run.end_ns - run.start_ns == pytest.approx(final["duration_ms"] * 1e6, abs=2e6)
    assert run.attributes["coordex.outcome"] == "ok"
    assert run.attributes["gen_ai.tool.call.id"] == answer["call_id"]
    assert waited.links == [call.span_id]
