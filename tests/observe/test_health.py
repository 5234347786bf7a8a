"""/healthz and /readyz without a token and without detail; /metrics only with
--metrics and a token; a server that cannot start logs why, with the traceback."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import httpx
import pytest

from coordex import Executor
from coordex.mcp_server import BearerTenantApp, make_tenant
from coordex.observe import hook
from coordex.observe.figures import Figures
from tests.e2e._procs import child_env, run_cli

pytestmark = pytest.mark.timeout(60)
TOKEN = "health-token-0123456789"


def _get(app: BearerTenantApp, path: str, token: str | None = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {token}"} if token else {}

    async def main() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            return await client.get(path, headers=headers)

    return anyio.run(main)


def test_health_and_readiness_need_no_token_and_say_no_more(tmp_path: Path) -> None:
    ex = Executor(root=tmp_path)
    app = BearerTenantApp([make_tenant("default", TOKEN, ex, "127.0.0.1")])
    try:
        healthy, ready = _get(app, "/healthz"), _get(app, "/readyz")
        assert (healthy.status_code, healthy.text) == (200, "ok\n")
        assert (ready.status_code, ready.text) == (200, "ready\n")
        # Without --metrics, /metrics is nobody's: 401 without a token, 404 with one.
        assert _get(app, "/metrics").status_code == 401
        assert _get(app, "/metrics", TOKEN).status_code == 404
    finally:
        ex.close()
    closed = _get(app, "/readyz")
    assert (closed.status_code, closed.text) == (503, "not ready\n")
    assert _get(app, "/healthz").status_code == 200  # alive, though not ready


def test_metrics_follow_the_token_rules_of_mcp(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    ex = Executor(root=tmp_path)
    app = BearerTenantApp([make_tenant("default", TOKEN, ex, "127.0.0.1")])
    hook.FIGURES = Figures(sources=lambda: [(None, ex)])
    try:
        ex.execute_code("y = 2", state_mode="stateful", session_name="s")
        assert _get(app, "/metrics").status_code == 401
        assert _get(app, "/metrics", "wrong-token-0123456789").status_code == 401
        scraped = _get(app, "/metrics", TOKEN)
    finally:
        hook.FIGURES = None
        ex.close()
    assert scraped.status_code == 200
    from prometheus_client.parser import text_string_to_metric_families

    sessions = {tuple(sorted(s.labels.items())): s.value
                for f in text_string_to_metric_families(scraped.text) for s in f.samples
                if s.name == "coordex_sessions"}
    # The plan namespace (python session 0) and "s": open, no tenant label.
    assert sessions == {(("language", "python"), ("place", "own"), ("state", "open")): 2}


def test_a_server_that_cannot_start_logs_the_traceback(tmp_path: Path) -> None:
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    done = run_cli("serve", "--port", "0", "--log-format", "json",
                   env=child_env(not_a_folder))
    assert done.returncode == 1
    [line] = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    assert line["level"] == "error" and line["logger"] == "coordex.server"
    assert "Traceback (most recent call last)" in line["traceback"]
    assert "FileExistsError" in line["traceback"]


@pytest.mark.slow
def test_a_failed_build_counts_and_an_unknown_environment_does_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families

    monkeypatch.setenv("UV_OFFLINE", "1")
    ex = Executor(root=tmp_path)
    hook.FIGURES = figures = Figures(sources=lambda: [(None, ex)])
    try:
        assert ex.execute_code("1", venv_id=41)["error_type"] == "not_found"
        venv = ex.environments.create("ledgerlib-does-not-exist==9.9")["venv_id"]
        assert ex.execute_code("1", venv_id=venv)["error_type"] == "environment"
        text = figures.render().decode()
    finally:
        hook.FIGURES = None
        ex.close()
    builds = [(s.labels, s.value) for f in text_string_to_metric_families(text)
              for s in f.samples if s.name == "coordex_builds_total"]
    assert builds == [({"outcome": "error"}, 1.0)]
