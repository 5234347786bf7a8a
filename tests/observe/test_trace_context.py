"""Code in a session sees its call's span as ``TRACEPARENT`` for every call, in every
place and state mode: read-only copies (a fork, the values in a new process, a bash
copy protected or not), a stored function, a call given ``wait`` (SPEC 16)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from coordex import Executor

from ._spans import by_name

pytestmark = pytest.mark.timeout(120)

PY = "import os; print(os.environ.get('TRACEPARENT'))"
SH = "echo \"${TRACEPARENT:-None}\""


@pytest.fixture
def ex(tmp_path: Path) -> Iterator[Executor]:
    with Executor(root=tmp_path) as executor:
        executor.execute_code("kept = 1", state_mode="stateful", session_name="p")
        executor.execute_code("KEPT=1", language="bash", state_mode="stateful",
                              session_name="b")
        yield executor


def each_call(ex: Executor) -> list[tuple[str, dict[str, Any]]]:
    """Every state mode of both languages of this process's places: (what, result)."""
    runs = []
    for language, code, name in (("python", PY, "p"), ("bash", SH, "b")):
        for mode in ("stateless", "stateful", "read_only"):
            result = ex.execute_code(code, language=language, state_mode=mode,
                                     session_name=None if mode == "stateless" else name)
            runs.append((f"{language} {mode}", result))
    return runs


def assert_each_saw_its_span(runs: list[tuple[str, dict[str, Any]]],
                             spans: InMemorySpanExporter, trace_id: str) -> None:
    calls = by_name(spans, "tools/call execute_code")[-len(runs):]
    for (what, result), span in zip(runs, calls, strict=True):
        assert "error" not in result, (what, result)
        seen = result["stdout"].strip()
        assert seen == f"00-{trace_id}-{span.context.span_id:016x}-" \
                      f"{span.context.trace_flags:02x}", (what, seen)


def test_every_mode_of_both_languages_sees_its_span(
        ex: Executor, spans: InMemorySpanExporter) -> None:
    with trace.get_tracer("agent").start_as_current_span("agent step") as step:
        trace_id = format(step.get_span_context().trace_id, "032x")
        runs = each_call(ex)
    assert_each_saw_its_span(runs, spans, trace_id)
    copies = {what: r["isolation"]["copy"] for what, r in runs if "isolation" in r}
    assert copies == {"python read_only": "fork", "bash read_only": "values"}


def test_copies_by_value_and_unprotected_copies_see_it_too(
        ex: Executor, spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch) -> None:
    from coordex.backends.own import interpreter as own_interpreter

    # No safe fork: the Python copy is the session's values in a new process. No
    # protection: the bash copy is a plain subshell of the session's shell.
    monkeypatch.setattr(own_interpreter, "FORK_IS_SAFE", False)
    monkeypatch.setenv("COORDEX_ISOLATION_FORCE", "none")
    with trace.get_tracer("agent").start_as_current_span("agent step") as step:
        trace_id = format(step.get_span_context().trace_id, "032x")
        runs = [(f"{language} read_only", ex.execute_code(
            code, language=language, state_mode="read_only", session_name=name))
            for language, code, name in (("python", PY, "p"), ("bash", SH, "b"))]
    assert_each_saw_its_span(runs, spans, trace_id)
    assert [r["isolation"]["copy"] for _, r in runs] == ["values", "fork"]
    assert runs[1][1]["isolation"]["files"] == "none"  # the plain subshell


def test_a_stored_function_and_a_detached_call_see_their_span(
        ex: Executor, spans: InMemorySpanExporter) -> None:
    ex.call_tool("define_function", {"source": "def parent():\n    import os\n"
                                               "    return os.environ.get('TRACEPARENT')"})
    with trace.get_tracer("agent").start_as_current_span("agent step"):
        stored = [ex.call_tool("call_function", {"name": "parent", "state_mode": mode,
                                                 "session_name": "p" if mode != "stateless"
                                                 else None})
                  for mode in ("stateless", "stateful", "read_only")]
        # Given wait, the code runs on the call record's thread; it returns running.
        running = ex.execute_code(f"import time; time.sleep(0.5); {PY}", state_mode="read_only",
                                  session_name="p", wait=0.05)
        assert running.get("running") is True, running
        done = ex.wait_call(running["call_id"])
    functions = by_name(spans, "tools/call call_function")
    for result, span in zip(stored, functions, strict=True):
        assert result["value"].split("-")[2] == f"{span.context.span_id:016x}", result
    [detached] = [s for s in by_name(spans, "tools/call execute_code")
                  if s.attributes.get("coordex.state_mode") == "read_only"]
    assert done["stdout"].split("-")[2] == f"{detached.context.span_id:016x}", done


def test_without_a_span_no_copy_sees_a_traceparent(tmp_path: Path) -> None:
    with Executor(root=tmp_path) as ex:
        ex.execute_code("1", state_mode="stateful", session_name="p")
        ex.execute_code("true", language="bash", state_mode="stateful", session_name="b")
        runs = each_call(ex)
    assert [r["stdout"] for _, r in runs] == ["None\n"] * len(runs)
