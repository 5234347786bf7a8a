"""SPEC 16 on a real local Ray cluster: code on a node sees its call's span as
``TRACEPARENT`` in every state mode, bash and an environment's Python alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from coordex import Executor
from tests.cluster.conftest import LocalCluster

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace

from tests.observe._spans import by_name, recording

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(180)]


def test_code_on_a_node_sees_its_span_in_every_mode(local_cluster: LocalCluster,
                                                    tmp_path: Path) -> None:
    runs = []
    with Executor(root=tmp_path / "home", timeout=30, cluster=local_cluster.address) as cex:
        venv = cex.environments.create("# no requirements\n", name="bare")["venv_id"]
        cex.execute_code("kept = 1", state_mode="stateful", session_name="w", venv_id=venv)
        cex.execute_code("KEPT=1", language="bash", state_mode="stateful", session_name="b")
        with recording() as spans, \
                trace.get_tracer("agent").start_as_current_span("agent step") as step:
            for language, code, name, venv_id in (
                    ("bash", 'echo "${COORDEX_NODE_OWNER:+node} ${TRACEPARENT:-None}"', "b",
                     None),
                    ("python", "import os; print('node' if os.environ.get('COORDEX_NODE_OWNER')"
                               " else '', os.environ.get('TRACEPARENT'))", "w", venv)):
                for mode in ("stateless", "stateful", "read_only"):
                    result = cex.execute_code(
                        code, language=language, state_mode=mode, venv_id=venv_id,
                        session_name=None if mode == "stateless" else name)
                    runs.append((f"{language} {mode}", result))
    trace_id = format(step.get_span_context().trace_id, "032x")
    calls = by_name(spans, "tools/call execute_code")
    for (what, result), span in zip(runs, calls, strict=True):
        assert "error" not in result, (what, result)
        # It ran in a process a coordex actor on a node started, and saw its span.
        assert result["stdout"].split() == ["node", f"00-{trace_id}-{span.context.span_id:016x}-"
                                            f"{span.context.trace_flags:02x}"], (what, result)
