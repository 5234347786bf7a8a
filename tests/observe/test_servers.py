"""The servers as an operator runs them (SPEC 16): `coordex mcp --otel` over stdio and
`coordex serve --tokens --metrics --otel` with two confined tenants, driven by the
official MCP client; spans received over OTLP/HTTP, /metrics read with Prometheus's
parser, log lines as JSON."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e._procs import child_env, spawn
from tests.e2e.test_mcp_http import call_with_sdk

from ._otlp import Receiver, receiver

pytestmark = pytest.mark.timeout(180)

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
PRINT_TRACEPARENT = "import os; print(os.environ.get('TRACEPARENT'))"
ALICE, BOB, OPERATOR = "alice-token-0123456789", "bob-token-0123456789", "operator-0123456789ab"
READY = r"serving MCP on (http://127\.0\.0\.1:\d+/mcp)"


def otel_env(otlp: Receiver) -> dict[str, str]:
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url, "OTEL_BSP_SCHEDULE_DELAY": "50",
            "OTEL_METRICS_EXPORTER": "none", "OTEL_SERVICE_NAME": "coordex-test"}


def _text(result: Any) -> dict[str, Any]:
    assert isinstance(result.structured_content, dict)
    return {"is_error": result.is_error, **result.structured_content}


def test_stdio_span_parented_by_meta_traceparent_and_seen_by_the_code(tmp_path: Path) -> None:
    errors = tmp_path / "stderr.log"
    with receiver() as otlp, errors.open("w") as errlog:
        params = StdioServerParameters(
            command=sys.executable,
            args=["-m", "coordex", "mcp", "--otel", "--log-level", "info", "--log-format", "json"],
            env=child_env(tmp_path / "home", **otel_env(otlp)))
        results: list[dict[str, Any]] = []

        async def main() -> None:
            async with stdio_client(params, errlog=errlog) as (read, write), \
                    ClientSession(read, write) as session:
                await session.initialize()
                with anyio.fail_after(90):
                    for code, mode in ((PRINT_TRACEPARENT, "stateful"), ("1/0", "stateless"),
                                       ("echo $TRACEPARENT", "stateless")):
                        language = "bash" if code.startswith("echo") else "python"
                        results.append(_text(await session.call_tool(
                            "execute_code", {"code": code, "state_mode": mode,
                                             "language": language},
                            meta={"traceparent": TRACEPARENT})))

        anyio.run(main)
        spans = otlp.wait("tools/call execute_code", 3)
    ok, error, bash = spans
    for span in spans:
        assert span.trace_id == TRACE_ID and span.parent_span_id == PARENT_ID
        assert span.attributes["mcp.method.name"] == "tools/call"
        assert span.attributes["gen_ai.tool.name"] == "execute_code"
        assert span.attributes["gen_ai.operation.name"] == "execute_tool"
        assert span.attributes["network.transport"] == "pipe"
        assert span.attributes["jsonrpc.request.id"]
        assert span.attributes["mcp.protocol.version"]
        assert span.service == "coordex-test"
    assert ok.attributes["coordex.state_mode"] == "stateful"
    assert ok.attributes["coordex.session"] == "0" and ok.attributes["coordex.outcome"] == "ok"
    assert error.attributes["coordex.outcome"] == "execution"
    assert error.attributes["error.type"] == "tool_error" and error.status_code == 2
    # The code saw the server's span for its call as TRACEPARENT: the same trace.
    assert results[0]["stdout"].strip().startswith(f"00-{TRACE_ID}-{ok.span_id}-")
    assert results[2]["stdout"].strip().startswith(f"00-{TRACE_ID}-{bash.span_id}-")
    lines = [json.loads(line) for line in errors.read_text().splitlines()
             if line.startswith("{")]
    calls = [line for line in lines if line.get("logger") == "coordex.calls"]
    assert [(c["state_mode"], c["outcome"]) for c in calls] == [
        ("stateful", "ok"), ("stateless", "execution"), ("stateless", "ok")]
    assert all(isinstance(c["ms"], float) and c["level"] == "info" for c in calls)
    assert "1/0" not in errors.read_text() and "os.environ" not in errors.read_text()


def _tokens(tmp_path: Path) -> Path:
    tokens = tmp_path / "tokens.txt"
    tokens.write_text(f"alice {ALICE}\nbob {BOB}\n")
    os.chmod(tokens, 0o600)
    return tokens


def _calls(url: str, token: str, calls: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    return call_with_sdk(url, token, calls, meta={"traceparent": TRACEPARENT})


def _samples(text: str) -> dict[str, list[Any]]:
    found: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(sample)
    return found


def test_http_tenants_metrics_spans_health_and_logs(tmp_path: Path) -> None:
    env_extra = {"COORDEX_METRICS_TOKEN": OPERATOR}
    with receiver() as otlp:
        env = child_env(tmp_path / "home", **otel_env(otlp), **env_extra)
        with spawn("serve", "--port", "0", "--tokens", str(_tokens(tmp_path)), "--metrics",
                   "--otel", "--log-format", "json", env=env) as running:
            url = running.wait_for(READY).group(1)
            base = url.rsplit("/mcp", 1)[0]
            # Health without a token, and nothing more than that.
            assert httpx.get(f"{base}/healthz").text == "ok\n"
            ready = httpx.get(f"{base}/readyz")
            assert (ready.status_code, ready.text) == (200, "ready\n")
            assert httpx.get(f"{base}/metrics").status_code == 401
            assert httpx.get(f"{base}/metrics", headers={
                "authorization": "Bearer wrong-token-0123456789"}).status_code == 401

            alice = _calls(url, ALICE, [
                ("execute_code", {"code": PRINT_TRACEPARENT, "state_mode": "stateful",
                                  "session_name": "a"}),
                ("execute_code", {"code": "1/0"}),
                ("execute_code", {"code": "import os; os._exit(3)", "state_mode": "stateful",
                                  "session_name": "a"}),
                ("list_sessions", {}),
            ])
            bob = _calls(url, BOB, [("execute_code", {"code": "echo $TRACEPARENT",
                                                      "language": "bash"})])
            scraped = {who: httpx.get(f"{base}/metrics",
                                      headers={"authorization": f"Bearer {token}"})
                       for who, token in (("alice", ALICE), ("bob", BOB),
                                          ("operator", OPERATOR))}
            spans = otlp.wait("tools/call execute_code", 4)
            log = running.seen + [running.lines.get_nowait()
                                  for _ in range(running.lines.qsize())]
    assert [r["is_error"] for r in alice] == [False, True, True, False]
    assert alice[2]["error_type"] == "crashed" and alice[2]["state_lost"] is True

    # Each tenant's token shows that tenant's series alone; the operator's, both.
    for who in ("alice", "bob"):
        response = scraped[who]
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
        tenants = {s.labels.get("tenant") for samples in _samples(response.text).values()
                   for s in samples if "tenant" in s.labels}
        assert tenants == {who}
    samples = _samples(scraped["operator"].text)
    calls = {(s.labels["tenant"], s.labels["language"], s.labels["state_mode"],
              s.labels["place"], s.labels["outcome"]): s.value
             for s in samples["coordex_calls_total"]}
    assert calls == {("alice", "python", "stateful", "own", "ok"): 1,
                     ("alice", "python", "stateless", "own", "execution"): 1,
                     ("alice", "python", "stateful", "own", "crashed"): 1,
                     ("bob", "bash", "stateless", "shell", "ok"): 1}
    counts = {(s.labels["tenant"], s.labels["state_mode"]): s.value
              for s in samples["coordex_call_duration_seconds_count"]}
    assert counts[("alice", "stateful")] == 2 and counts[("bob", "stateless")] == 1
    # os._exit ended alice's host: the crash says state_lost, and so does the call that
    # started the host again (SPEC 9); bob lost nothing.
    assert {s.labels["tenant"]: s.value for s in samples["coordex_state_lost_total"]} == {
        "alice": 2}
    assert any(s.labels == {"tenant": "alice", "language": "python", "place": "own",
                            "state": "open"} and s.value >= 1
               for s in samples["coordex_sessions"])
    assert {s.labels["tenant"]: s.value for s in samples["coordex_detached_calls"]} == {
        "alice": 0, "bob": 0}
    assert "coordex_builds_total" not in samples or not samples["coordex_builds_total"]

    # Spans: the tenant's calls, from the server, in the caller's trace; the confined
    # host's code saw TRACEPARENT for its call.
    by_session = {s.attributes.get("coordex.session"): s for s in spans}
    first = by_session["a"]
    assert first.trace_id == TRACE_ID and first.attributes["network.transport"] == "tcp"
    assert alice[0]["stdout"].strip().startswith(f"00-{TRACE_ID}-")
    assert bob[0]["stdout"].strip().startswith(f"00-{TRACE_ID}-")
    crashed = [s for s in spans if s.attributes["coordex.outcome"] == "crashed"]
    assert crashed and crashed[0].attributes["coordex.state_lost"] is True

    lines = [json.loads(line) for line in log if line.startswith("{")]
    logged = [(line.get("tenant"), line.get("tool"), line.get("outcome")) for line in lines
              if line.get("logger") == "coordex.calls"]
    assert ("alice", "execute_code", "crashed") in logged
    assert ("bob", "execute_code", "ok") in logged
    assert not any("os._exit" in line for line in log)


@pytest.mark.slow
@pytest.mark.parametrize("tenants", [True, False], ids=["tokens", "one-token"])
def test_builds_are_counted_for_the_tenant_that_made_them(tmp_path: Path, tenants: bool) -> None:
    """A confined tenant's build runs in its jail; its call hands the build back to the
    server, which counts it under the tenant. A server's own executor counts its own."""
    extra = ["--tokens", str(_tokens(tmp_path))] if tenants else []
    with receiver() as otlp:
        env = child_env(tmp_path / "home", UV_OFFLINE="1", **otel_env(otlp),
                        **({} if tenants else {"COORDEX_TOKEN": ALICE}))
        with spawn("serve", "--port", "0", "--metrics", "--otel", *extra, env=env) as running:
            url = running.wait_for(READY).group(1)
            base = url.rsplit("/mcp", 1)[0]
            created, ran = _calls(url, ALICE, [
                ("create_environment", {"spec": "", "name": "empty", "build": True}),
                ("execute_code", {"code": PRINT_TRACEPARENT, "venv_id": 1}),  # the first id
            ])
            scraped = httpx.get(f"{base}/metrics",
                                headers={"authorization": f"Bearer {ALICE}"})
            [build] = otlp.wait("coordex.build")
            [create] = otlp.wait("tools/call create_environment")
    # The build is the creating call's child, wherever it ran (a host: placed from the
    # call's start for as long as the host says it took).
    assert build.parent_span_id == create.span_id and build.trace_id == TRACE_ID
    assert build.attributes["coordex.outcome"] == "ok"
    assert not created["is_error"] and "_coordex_observed" not in created, created
    assert created["venv_id"] == 1
    assert ran.get("stdout", "").startswith(f"00-{TRACE_ID}-"), (created, ran)  # the env worker
    samples = _samples(scraped.text)
    label = {"tenant": "alice"} if tenants else {}
    assert [(s.labels, s.value) for s in samples["coordex_builds_total"]] == [
        ({**label, "outcome": "ok"}, 1.0)]
    [count] = samples["coordex_build_duration_seconds_count"]
    assert (count.labels, count.value) == (label, 1.0)
    [call] = samples["coordex_calls_total"]
    assert call.labels == {**label, "language": "python", "state_mode": "stateless",
                           "place": "env", "outcome": "ok"}
    assert [s.value for s in samples.get("coordex_state_lost_total", [])] in ([], [0.0])


def test_a_collector_that_is_down_does_not_hold_the_stop(tmp_path: Path) -> None:
    """The last spans are flushed at the stop; with no collector there, the server is
    still out within SPEC 8's 5 s."""
    import signal
    import socket
    import time

    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}"
    env = child_env(tmp_path / "home", COORDEX_TOKEN=ALICE, OTEL_EXPORTER_OTLP_ENDPOINT=dead,
                    OTEL_METRICS_EXPORTER="none", OTEL_BSP_SCHEDULE_DELAY="60000")
    with spawn("serve", "--port", "0", "--otel", env=env) as running:
        url = running.wait_for(READY).group(1)
        _calls(url, ALICE, [("execute_code", {"code": "1"})] * 3)
        started = time.monotonic()
        running.process.send_signal(signal.SIGINT)
        running.process.wait(timeout=15)
        took = time.monotonic() - started
    assert took < 5.0, took
