"""SPEC 16 word for word, through `coordex serve --metrics --log-level info` driven by
the official MCP client: every metric family by its SPEC name and labels (read with
Prometheus's parser), a detached call (SPEC 14) counted as one and its session as busy
while it runs, counted among the calls once it ends by its outcome (``ok`` or the
error_type), and the server's per-call log line kept out of the output of the call it
reports on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from tests.e2e._procs import child_env, spawn

pytestmark = pytest.mark.timeout(120)
parser = pytest.importorskip("prometheus_client.parser")

TOKEN = "spec16-token-0123456789"
READY = r"serving MCP on (http://127\.0\.0\.1:\d+/mcp)"
# SPEC 16's families: (name as scraped, type, label names) with one tenant (no label).
FAMILIES = {
    "coordex_calls": ("counter", {"language", "state_mode", "place", "outcome"}),
    "coordex_call_duration_seconds": ("histogram", {"language", "state_mode", "place"}),
    "coordex_sessions": ("gauge", {"language", "place", "state"}),
    "coordex_state_lost": ("counter", set()),
    "coordex_rebuilds": ("counter", set()),
    "coordex_builds": ("counter", {"outcome"}),
    "coordex_build_duration_seconds": ("histogram", set()),
    "coordex_detached_calls": ("gauge", set()),
}
SLOW = "import time\ntime.sleep(3)\n'done'"


def scrape(base: str) -> dict[str, Any]:
    text = httpx.get(f"{base}/metrics", headers={"authorization": f"Bearer {TOKEN}"}).text
    return {f.name: f for f in parser.text_string_to_metric_families(text)}


def values(family: Any, suffix: str = "") -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value for s in family.samples
            if s.name == family.name + suffix}


def test_metrics_names_labels_detached_calls_and_the_log_line(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    monkeypatch.chdir(tmp_path)
    env = child_env(tmp_path / "home", COORDEX_TOKEN=TOKEN)
    seen: dict[str, Any] = {}
    with spawn("serve", "--port", "0", "--metrics", "--log-level", "info",
               env=env) as running:
        url = running.wait_for(READY).group(1)
        base = url.rsplit("/mcp", 1)[0]

        async def main() -> None:
            http = create_mcp_http_client(headers={"Authorization": f"Bearer {TOKEN}"})
            async with http, streamable_http_client(url, http_client=http) as (read, write), \
                    ClientSession(read, write) as session:
                await session.initialize()
                with anyio.fail_after(90):
                    await body(session)

        async def body(session: ClientSession) -> None:
            async def call(tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
                result = await session.call_tool(tool, arguments)
                assert isinstance(result.structured_content, dict), result
                return result.structured_content

            await call("execute_code", {"code": "x = 1", "state_mode": "stateful",
                                        "session_name": "a"})
            first = await call("execute_code", {"code": SLOW, "state_mode": "stateful",
                                                "session_name": "a", "wait": 0.5})
            assert first.get("running") is True, first
            seen["during"] = scrape(base)
            seen["final"] = await call("wait_call", {"call_id": first["call_id"]})
            assert await call("wait_call", {"call_id": first["call_id"]}) == seen["final"]
            await call("close_session", {"session_name": "a"})
            seen["rebuilt"] = await call("rebuild_session", {"session_name": "a"})

        anyio.run(main)
        after = scrape(base)
        running.wait_for(r"coordex\.calls: .*tool=rebuild_session")
        log = "".join(running.seen)

    # While the detached call runs: one detached call, its session busy (SPEC 14's
    # list_sessions says so too); session 0 open.
    during = seen["during"]
    assert values(during["coordex_detached_calls"]) == {(): 1.0}
    sessions = values(during["coordex_sessions"])
    assert sessions == {(("language", "python"), ("place", "own"), ("state", "busy")): 1.0,
                        (("language", "python"), ("place", "own"), ("state", "open")): 1.0}

    # The per-call log line goes to the server's log, never into a call's output.
    final = seen["final"]
    assert final["result"] == "'done'" and final["stderr"] == "", final
    assert "outcome=running" in log

    # Every family by its SPEC name, type and labels; the detached call has ended.
    assert seen["rebuilt"]["replayed"] == 2, seen["rebuilt"]
    for name, (kind, labels) in FAMILIES.items():
        assert name in after and after[name].type == kind, (name, sorted(after))
        for sample in after[name].samples:
            got = set(sample.labels) - {"le"}
            assert got == labels, (name, sample)
    assert values(after["coordex_detached_calls"]) == {(): 0.0}
    assert values(after["coordex_rebuilds"], "_total") == {(): 1.0}
    # The detached call counts once, when it ended, by its outcome (ok or the
    # error_type), never as "running"; its duration is its own, not the wait.
    coords = (("language", "python"), ("place", "own"), ("state_mode", "stateful"))
    ok = tuple(sorted((*coords, ("outcome", "ok"))))
    assert values(after["coordex_calls"], "_total") == {ok: 2.0}
    assert values(after["coordex_call_duration_seconds"], "_count") == {coords: 2.0}
    assert values(after["coordex_call_duration_seconds"], "_sum")[coords] > 2.5
