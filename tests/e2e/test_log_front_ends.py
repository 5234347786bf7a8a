"""The call log and the page through the front ends, as real processes: ``coordex log``
(its JSON, ``--session``, ``--limit``, ``--stats``), ``coordex serve`` at ``/ui`` (each
tenant's token shows that tenant alone), ``coordex mcp --ui PORT`` and the MCP tool
``rebuild_session``."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from coordex import Executor
from coordex.log import LOG_FILE

from ._procs import child_env, run_cli, spawn
from .test_mcp_http import READY, call_with_sdk

pytestmark = pytest.mark.timeout(120)


def test_coordex_log_prints_the_history_as_json(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with Executor(root=home) as ex:
        ex.execute_code("a = 1", state_mode="stateful", session_name="one")
        ex.execute_code("b = 2", state_mode="stateful", session_name="two")
        ex.execute_code("a / 0", state_mode="stateful", session_name="one")
        ex.execute_code("a = 5", state_mode="read_only", session_name="one")
        expected = ex.history()
        ex.close_session(session_name="one")
        ex.rebuild_session(session_name="one")
    env = child_env(home)
    done = run_cli("log", "--json", env=env)
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert printed["calls"][:4] == expected["calls"]
    assert printed["calls"][-1]["code"] == "a = 1"  # the replay, logged too
    only = json.loads(run_cli("log", "--json", "--session", "one", "--limit", "2", env=env).stdout)
    assert [c["code"] for c in only["calls"]] == ["a = 5", "a = 1"]
    table = run_cli("log", env=env)
    assert table.returncode == 0 and "a / 0" in table.stdout and "execution" in table.stdout
    stats = json.loads(run_cli("log", "--stats", "--json", env=env).stdout)
    one = next(s for s in stats["sessions"] if s["session_name"] == "one")
    assert one["calls"] == 4 and one["errors"] == {"execution": 1}
    assert one["rebuilds"] == 1 and one["read_only_changed"] == 1
    text = run_cli("log", "--stats", env=env)
    assert text.returncode == 0 and "per coordinate:" in text.stdout


def test_coordex_log_counts_a_bash_copy_that_wrote_files(tmp_path: Path) -> None:
    from coordex.backends import isolation

    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    with Executor(root=home) as ex:
        ex.execute_code(f"cd {str(work)!r}", language="bash", state_mode="stateful",
                        session_name="sh")
        r = ex.execute_code("echo x > data.txt", language="bash", state_mode="read_only",
                            session_name="sh")
        ex.execute_code("ls", language="bash", state_mode="read_only", session_name="sh")
    env = child_env(home)
    printed = json.loads(run_cli("log", "--json", "--session", "sh", env=env).stdout)
    assert [c["state_mode"] for c in printed["calls"]] == ["stateful", "read_only", "read_only"]
    stats = json.loads(run_cli("log", "--stats", "--json", env=env).stdout)
    sh = next(s for s in stats["sessions"] if s["session_name"] == "sh")
    discarded = r["isolation"]["files"] == "discarded"
    assert discarded == (isolation.best_mode() == "discarded")
    # The copy that wrote a file changed something; the one that only looked did not.
    assert sh["read_only_changed"] == (1 if discarded else 0)
    bash_ro = next(c for c in stats["coordinates"]
                   if (c["language"], c["state_mode"]) == ("bash", "read_only"))
    assert bash_ro["calls"] == 2 and bash_ro["read_only_changed"] == sh["read_only_changed"]
    assert not (work / "data.txt").exists()


def test_coordex_log_counts_a_bash_copy_that_rebound_names(tmp_path: Path) -> None:
    from coordex.backends import isolation

    if isolation.best_mode() == "none":
        pytest.skip("no protected copy here: a plain subshell runs read-only bash code")
    home = tmp_path / "home"
    with Executor(root=home) as ex:
        ex.execute_code("x=1; y=1", language="bash", state_mode="stateful", session_name="nm")
        ex.execute_code("x=2; unset y; f() { :; }; alias ll=ls", language="bash",
                        state_mode="read_only", session_name="nm")
        ex.execute_code("echo $x", language="bash", state_mode="read_only", session_name="nm")
    env = child_env(home)
    stats = json.loads(run_cli("log", "--stats", "--json", env=env).stdout)
    nm = next(s for s in stats["sessions"] if s["session_name"] == "nm")
    assert nm["read_only_changed"] == 1  # the copy that rebound names; not the one that read
    rows = sqlite3.connect(home / LOG_FILE).execute(
        "SELECT changed FROM calls WHERE state_mode = 'read_only' ORDER BY seq").fetchall()
    assert [None if c is None else json.loads(c) for (c,) in rows] == [
        {"rebound": ["alias ll", "f()", "x"], "deleted": ["y"]}, None]


def test_coordex_log_on_an_empty_home(tmp_path: Path) -> None:
    done = run_cli("log", "--json", env=child_env(tmp_path / "home"))
    assert done.returncode == 0 and json.loads(done.stdout) == {"calls": []}


def _ui(base: str, token: str | None, path: str = "api/sessions") -> httpx.Response:
    query = {"token": token} if token else {}
    return httpx.get(f"{base}/ui/{path}", params=query)


def test_serve_shows_each_tenant_its_own_page(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.txt"
    tokens.write_text("alice alice-token-0123456789\nbob bob-token-0123456789\n")
    os.chmod(tokens, 0o600)
    with spawn("serve", "--port", "0", "--tokens", str(tokens),
               env=child_env(tmp_path / "home")) as running:
        url = running.wait_for(READY).group(1)
        running.wait_for(r"/ui/\?token=<token>")
        base = url.removesuffix("/mcp")
        call_with_sdk(url, "alice-token-0123456789", [
            ("execute_code", {"code": "secret = 42", "state_mode": "stateful",
                              "session_name": "vault"})])
        assert _ui(base, None).status_code == 401
        assert _ui(base, "wrong-token-0123456789").status_code == 401
        alice = _ui(base, "alice-token-0123456789").json()
        bob = _ui(base, "bob-token-0123456789").json()
        assert "vault" in {s["session_name"] for s in alice["sessions"]}
        assert "vault" not in {s["session_name"] for s in bob["sessions"]}
        history = _ui(base, "alice-token-0123456789", "api/history").json()
        assert [c["code"] for c in history["calls"]] == ["secret = 42"]
        assert _ui(base, "bob-token-0123456789", "api/history").json()["calls"] == []
        with httpx.Client(follow_redirects=True) as browser:
            page = browser.get(f"{base}/ui", params={"token": "bob-token-0123456789"})
            assert page.status_code == 200 and "<title>coordex" in page.text
            assert "token" not in str(page.url)  # the redirect dropped it from the URL
            cookie = page.history[-1].headers["set-cookie"]
            assert "HttpOnly" in cookie and "bob-token" not in cookie
            key = page.history[-1].headers["location"].split("#key=")[1]
            # From now on the cookie and the page's key are the browser's pass.
            assert browser.get(f"{base}/ui/api/sessions").status_code == 401
            mine = browser.get(f"{base}/ui/api/sessions", headers={"X-Coordex-Key": key})
            assert mine.status_code == 200 and "vault" not in mine.text
        # The Host check of /mcp holds for /ui too.
        evil = httpx.get(f"{base}/ui/api/sessions", params={"token": "bob-token-0123456789"},
                         headers={"Host": "evil.example"})
        assert evil.status_code == 421


def test_mcp_ui_serves_the_page_next_to_stdio_and_rebuild_session_is_a_tool(tmp_path: Path) -> None:
    home = tmp_path / "home"
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "coordex", "mcp", "--ui", "0"], env=child_env(home))
    log = open(tmp_path / "stderr.txt", "w+")  # noqa: SIM115 - read after the server ends

    async def main() -> dict[str, Any]:
        async with stdio_client(params, errlog=log) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            tools = {t.name: t for t in (await session.list_tools()).tools}
            assert "runs again" in (tools["rebuild_session"].description or "")
            await session.call_tool("execute_code", {"code": "n = 7", "state_mode": "stateful",
                                                     "session_name": "m"})
            await session.call_tool("close_session", {"session_name": "m"})
            rebuilt = await session.call_tool("rebuild_session", {"session_name": "m"})
            assert rebuilt.structured_content is not None
            log.flush()
            log.seek(0)
            url = next(line.split()[-1] for line in log if "/ui/?token=" in line)
            sessions = await anyio.to_thread.run_sync(lambda: httpx.get(
                url.replace("/ui/?", "/ui/api/sessions?")).json())
            value = await session.call_tool("execute_code", {"code": "n", "state_mode": "stateful",
                                                             "session_name": "m"})
            return {"rebuilt": rebuilt.structured_content, "sessions": sessions,
                    "value": value.structured_content}

    try:
        out = anyio.run(main)
    finally:
        log.close()
    assert out["rebuilt"]["replayed"] == 1 and out["rebuilt"]["failed_at"] is None
    assert "m" in {s["session_name"] for s in out["sessions"]["sessions"]}
    assert out["value"]["result"] == "7"


def test_coordex_log_escapes_what_the_code_wrote(tmp_path: Path) -> None:
    home = tmp_path / "home"
    trap = "\x1b]52;c;ZWNobyBwd25lZA==\x07\x1b[2J\x1b[1;1Hcoordex: all calls ok\x1b[8m"
    with Executor(root=home) as ex:
        ex.execute_code(f"x = 1  # {trap}", state_mode="stateful", session_name="esc\x1b[31m")
        ex.execute_code(f"print({trap!r})")
        seq = ex.history()["calls"][-1]["seq"]
    env = child_env(home)
    for argv in (("log",), ("log", "--seq", str(seq)), ("log", "--json"), ("log", "--stats")):
        done = run_cli(*argv, env=env)
        assert done.returncode == 0, done.stderr
        assert "\x1b" not in done.stdout and "\x07" not in done.stdout, argv
    table = run_cli("log", env=env).stdout
    assert "\\x1b]52;c;" in table
    detail = run_cli("log", "--seq", str(seq), env=env).stdout
    assert "--- stdout" in detail and "\\x1b[2J" in detail and "all calls ok" in detail


def test_coordex_log_stats_reads_every_log(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with Executor(root=home) as ex:
        ex.execute_code("x", state_mode="read_only")  # the seed's own wrong coordinate
        ex.execute_code("1", language="ruby")  # type: ignore[arg-type]
        ex.execute_code("y = 1", state_mode="stateful", session_name="s")
        ex.execute_code("y", state_mode="read_only", session_name="nope")
    env = child_env(home)
    done = run_cli("log", "--stats", env=env)
    assert done.returncode == 0, done.stderr
    assert "validation 2" in done.stdout and "not_found 1" in done.stdout
    assert "4 calls" in done.stdout


def test_serve_shows_a_tenants_running_call_to_that_tenant_alone(tmp_path: Path) -> None:
    import threading
    import time

    tokens = tmp_path / "tokens.txt"
    alice, bob = "alice-token-0123456789", "bob-token-0123456789"
    tokens.write_text(f"alice {alice}\nbob {bob}\n")
    os.chmod(tokens, 0o600)
    with spawn("serve", "--port", "0", "--tokens", str(tokens),
               env=child_env(tmp_path / "home")) as running:
        url = running.wait_for(READY).group(1)
        base = url.removesuffix("/mcp")
        out: list[dict[str, Any]] = []
        code = "for i in $(seq 1 200); do echo tick $i; sleep 0.1; done"
        caller = threading.Thread(target=lambda: out.extend(call_with_sdk(url, alice, [
            ("execute_code", {"code": code, "language": "bash", "state_mode": "stateful",
                              "session_name": "loop"})])), daemon=True)
        caller.start()
        deadline = time.monotonic() + 30
        while True:
            calls = _ui(base, alice, "api/running").json()["running"]
            if calls and "tick 3" in calls[0]["stdout"]:
                break
            assert time.monotonic() < deadline, calls
            time.sleep(0.2)
        assert calls[0]["code"] == code and calls[0]["session_name"] == "loop"
        assert _ui(base, bob, "api/running").json() == {"running": []}
        sessions = _ui(base, alice, "api/sessions").json()["sessions"]
        assert next(s for s in sessions if s["session_name"] == "loop")["busy"] is True
        # Bob cannot interrupt Alice's call; Alice can, with her token.
        target = {"id": calls[0]["id"]}
        refused = httpx.post(f"{base}/ui/api/interrupt", json=target,
                             headers={"Authorization": f"Bearer {bob}"})
        assert refused.json()["error_type"] == "not_found"
        done = httpx.post(f"{base}/ui/api/interrupt", json=target,
                          headers={"Authorization": f"Bearer {alice}"})
        assert done.json()["interrupted"] is True
        caller.join(timeout=30)
        assert out and out[0]["error_type"] == "timeout" and out[0]["state_lost"] is False
        assert "interrupted from the page by the person watching" in out[0]["error"]
        assert "cancelled by its caller" not in out[0]["error"]  # said once, as it was
        assert _ui(base, alice, "api/running").json() == {"running": []}


def test_a_tenants_stuck_page_holds_neither_another_tenant_nor_the_stop(tmp_path: Path) -> None:
    import signal
    import threading
    import time

    from coordex.ui.app import THREADS_PER_TENANT

    tokens = tmp_path / "tokens.txt"
    alice, bob = "alice-token-0123456789", "bob-token-0123456789"
    tokens.write_text(f"alice {alice}\nbob {bob}\n")
    os.chmod(tokens, 0o600)
    names = [f"s{i}" for i in range(THREADS_PER_TENANT)]
    # Quick the first time; replayed once the flag file exists, each sleeps 40 s.
    step = "import os, time\nif os.path.exists('slow'):\n    time.sleep(40)\nn = 1"
    with spawn("serve", "--port", "0", "--tokens", str(tokens),
               env=child_env(tmp_path / "home")) as running:
        url = running.wait_for(READY).group(1)
        base = url.removesuffix("/mcp")
        call_with_sdk(url, alice, [
            *(("execute_code", {"code": step, "state_mode": "stateful", "session_name": n})
              for n in names),
            ("execute_code", {"code": "open('slow', 'w').close()"}),
            *(("close_session", {"session_name": n}) for n in names)])
        answers: list[int] = []

        def rebuild(name: str) -> None:
            with contextlib.suppress(httpx.HTTPError):
                answers.append(httpx.post(f"{base}/ui/api/rebuild", json={"session_name": name},
                                          headers={"Authorization": f"Bearer {alice}"},
                                          timeout=60).status_code)

        stuck = [threading.Thread(target=rebuild, args=(n,), daemon=True) for n in names]
        for thread in stuck:
            thread.start()
        time.sleep(1.0)
        started = time.monotonic()
        full = _ui(base, alice, "api/sessions")
        assert full.status_code == 503 and time.monotonic() - started < 1.0
        started = time.monotonic()
        assert _ui(base, bob, "api/sessions").status_code == 200
        assert time.monotonic() - started < 1.0
        stopping = time.monotonic()
        running.process.send_signal(signal.SIGTERM)
        running.process.wait(timeout=10)
        assert time.monotonic() - stopping < 5.0


def test_a_restarted_serve_keeps_each_browser_logged_in_and_the_calls_counted(
        tmp_path: Path) -> None:
    import socket

    with socket.socket() as probe:  # one port for both runs: the cookie is named by it
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    token = "the-token-0123456789abcdef"
    env = child_env(tmp_path / "home", COORDEX_TOKEN=token)
    with httpx.Client() as browser:
        _restart_keeps_login(browser, port, token, env)


def _restart_keeps_login(browser: httpx.Client, port: int, token: str,
                         env: dict[str, str]) -> None:
    with spawn("serve", "--port", str(port), env=env) as running:
        url = running.wait_for(READY).group(1)
        base = url.removesuffix("/mcp")
        call_with_sdk(url, token, [("execute_code", {"code": f"n = {i}", "session_name": "s",
                                                     "state_mode": "stateful"})
                                   for i in range(3)])
        login = browser.get(f"{base}/ui/", params={"token": token})
        assert login.status_code == 303
        key = login.headers["location"].split("#key=")[1]
    with spawn("serve", "--port", str(port), env=env) as running:
        running.wait_for(READY)
        assert browser.get(f"{base}/ui/").status_code == 200  # no ?token= again
        listed = browser.get(f"{base}/ui/api/sessions", headers={"X-Coordex-Key": key})
        assert listed.status_code == 200, listed.text
        (kept,) = [s for s in listed.json()["sessions"] if s.get("session_name") == "s"]
        assert kept["held"] is False and kept["calls"] == 3, kept
