"""The Executor used as a library: one span per call on the user's own global provider,
its coordinates and outcome; the trace context reaches the code; build and restore
children; code and output kept out unless asked for (SPEC 16)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from coordex import Executor

from ._spans import by_name

pytestmark = pytest.mark.timeout(120)


def test_one_span_per_call_with_coordinates_and_outcome(
        tmp_path: Path, spans: InMemorySpanExporter) -> None:
    with Executor(root=tmp_path) as ex:
        ex.execute_code("x = 1", state_mode="stateful", session_name="work")
        ex.execute_code("1/0")
        ex.execute_code("exit 3", language="bash")
    first, error, bash = by_name(spans, "tools/call execute_code")
    assert dict(first.attributes) == {
        "gen_ai.tool.name": "execute_code", "gen_ai.operation.name": "execute_tool",
        "coordex.language": "python", "coordex.state_mode": "stateful",
        "coordex.session": "work", "coordex.outcome": "ok",
        "coordex.state_lost": False, "coordex.retried": False}
    assert first.status.is_ok
    assert not any(key.startswith("mcp.") for key in first.attributes)  # no MCP here
    assert error.attributes["coordex.outcome"] == "execution"
    assert error.attributes["error.type"] == "tool_error"
    assert error.status.status_code == trace.StatusCode.ERROR
    # A bash command that exits non-zero is a successful call (SPEC 3).
    assert bash.attributes["coordex.outcome"] == "ok"
    assert bash.attributes["coordex.language"] == "bash"
    assert "error.type" not in bash.attributes


def test_every_tool_is_one_span_in_the_library_too(
        tmp_path: Path, spans: InMemorySpanExporter) -> None:
    """SPEC 16: every tool call is one span; the library makes the same (the session and
    branch tools made none)."""
    with Executor(root=tmp_path) as ex:
        ex.execute_code("x = 1", state_mode="stateful", session_name="work")
        ex.list_sessions()
        ex.inspect_session(session_name="work")
        point = ex.checkpoint_session(session_name="work")["checkpoint"]
        ex.list_checkpoints(session_name="work")
        ex.restore_session(session_name="work", checkpoint=point)
        ex.fork_session(session_name="work", new_name="trial")
        ex.close_session(session_name="trial")
        ex.close_session(session_name="nowhere")
        ex.close_session(session_name="work")
        ex.rebuild_session(session_name="work")
    for tool in ("list_sessions", "inspect_session", "checkpoint_session", "list_checkpoints",
                 "restore_session", "fork_session", "rebuild_session"):
        (span,) = by_name(spans, f"tools/call {tool}")
        assert span.attributes["coordex.outcome"] == "ok", (tool, dict(span.attributes))
    closed, missing, _ = by_name(spans, "tools/call close_session")
    assert closed.attributes["coordex.session"] == "trial"
    assert missing.attributes["coordex.outcome"] == "not_found"
    assert missing.attributes["error.type"] == "tool_error"


def test_code_sees_its_span_as_traceparent_in_every_place_and_keeps_none(
        tmp_path: Path, spans: InMemorySpanExporter) -> None:
    tracer = trace.get_tracer("agent")
    with Executor(root=tmp_path) as ex, tracer.start_as_current_span("agent step") as step:
        trace_id = format(step.get_span_context().trace_id, "032x")
        seen = [
            ex.execute_code("import os; print(os.environ['TRACEPARENT'])")["stdout"],
            ex.execute_code("import os; print(os.environ['TRACEPARENT'])",
                            state_mode="stateful", session_name="p")["stdout"],
            ex.execute_code("echo $TRACEPARENT", language="bash")["stdout"],
            ex.execute_code("echo $TRACEPARENT", language="bash", state_mode="stateful")["stdout"],
        ]
        inspected = ex.inspect_session(language="bash", session_id=0)
    calls = by_name(spans, "tools/call execute_code")
    assert len(calls) == 4
    for printed, span in zip(seen, calls, strict=True):
        # 00-TRACE-SPAN-FLAGS: the call's own span, in the agent's trace.
        assert printed.strip().rsplit("-", 1)[0] == f"00-{trace_id}-{span.context.span_id:016x}"
        assert span.parent.span_id == step.get_span_context().span_id
    # The variable is the call's alone: the bash session keeps none, nor does Python's.
    assert "TRACEPARENT" not in inspected["variables"]
    assert "TRACEPARENT" not in os.environ  # the own interpreter's calls share it


def test_code_and_output_are_never_attributes_unless_asked(
        tmp_path: Path, spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch) -> None:
    with Executor(root=tmp_path) as ex:
        ex.execute_code("print('secret-output')  # secret-code")
        monkeypatch.setenv("COORDEX_OTEL_CONTENT", "1")
        ex.execute_code("print('shown-output')  # shown-code")
    hidden, shown = by_name(spans, "tools/call execute_code")
    assert not any("secret" in str(v) for v in hidden.attributes.values())
    assert "shown-code" in shown.attributes["coordex.code"]
    assert shown.attributes["coordex.stdout"] == "shown-output\n"


def test_a_restore_is_a_child_span(tmp_path: Path, spans: InMemorySpanExporter) -> None:
    with Executor(root=tmp_path, persist=True) as ex:
        ex.execute_code("kept = 41", state_mode="stateful", session_name="k")
    spans.clear()
    with Executor(root=tmp_path, persist=True) as ex:
        result = ex.execute_code("kept + 1", state_mode="stateful", session_name="k")
    assert result["result"] == "42" and "restored" in result
    [call] = by_name(spans, "tools/call execute_code")
    [restore] = by_name(spans, "coordex.restore")
    assert restore.parent.span_id == call.context.span_id
    assert restore.attributes["coordex.restored.from"] == result["restored"]["from"]
    assert call.start_time <= restore.start_time <= restore.end_time <= call.end_time


def test_call_tool_is_one_span_named_for_the_tool(
        tmp_path: Path, spans: InMemorySpanExporter) -> None:
    with Executor(root=tmp_path) as ex:
        ex.call_tool("execute_code", {"code": "1 + 1"})
        ex.call_tool("list_sessions", {})
    names = [s.name for s in spans.get_finished_spans()]
    assert names == ["tools/call execute_code", "tools/call list_sessions"]
    listed = by_name(spans, "tools/call list_sessions")[0]
    assert "coordex.language" not in listed.attributes  # no coordinates to give


def test_no_provider_no_span(tmp_path: Path) -> None:
    # The API's proxy provider: nothing is recorded, the code sees no TRACEPARENT.
    with Executor(root=tmp_path) as ex:
        result = ex.execute_code("import os; print(os.environ.get('TRACEPARENT'))")
    assert result["stdout"] == "None\n"


def test_the_same_figures_as_otel_metrics(tmp_path: Path, meter: InMemoryMetricReader) -> None:
    with Executor(root=tmp_path) as ex:
        ex.execute_code("1", state_mode="stateful")
        ex.execute_code("1/0")
    data = meter.get_metrics_data()
    points = {m.name: list(m.data.data_points) for rm in data.resource_metrics
              for sm in rm.scope_metrics for m in sm.metrics}
    calls = {(p.attributes["state_mode"], p.attributes["outcome"]): p.value
             for p in points["coordex.calls"]}
    assert calls == {("stateful", "ok"): 1, ("stateless", "execution"): 1}
    [duration] = [p for p in points["coordex.call.duration"]
                  if p.attributes["state_mode"] == "stateless"]
    assert duration.count == 1
    assert "coordex.state_lost" not in points  # nothing lost, nothing counted


@pytest.mark.slow
def test_an_environment_build_is_a_child_span_and_its_worker_sees_traceparent(
        tmp_path: Path, spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UV_OFFLINE", "1")
    with Executor(root=tmp_path) as ex:
        venv = ex.environments.create("", name="empty")["venv_id"]
        code = "import os; print(os.environ['TRACEPARENT'])"
        kept = ex.execute_code(code, venv_id=venv, state_mode="stateful")
        fresh = ex.execute_code(code, venv_id=venv)
        later = ex.execute_code("import os; print(os.environ.get('TRACEPARENT'))",
                                venv_id=venv, state_mode="stateful")
        copy = ex.execute_code(code, venv_id=venv, state_mode="read_only", session_id=0)
    first, second, third, fourth = by_name(spans, "tools/call execute_code")
    [build] = by_name(spans, "coordex.build")
    assert build.parent.span_id == first.context.span_id
    assert build.attributes["coordex.outcome"] == "ok"
    assert build.attributes["coordex.venv_id"] == str(venv)
    assert first.attributes["coordex.language"] == "python"
    assert first.attributes["coordex.venv_id"] == venv
    assert copy["isolation"]["copy"] == "fork", copy
    for result, span in ((kept, first), (fresh, second), (later, third), (copy, fourth)):
        assert f"-{span.context.span_id:016x}-" in result["stdout"], result
