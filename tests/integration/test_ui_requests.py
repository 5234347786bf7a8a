"""The page's server over HTTP with a real Executor: who may ask, the API of SPEC 11
(sessions, calls, one call, running, interrupt, close, rebuild), a busy session that
never holds the page up, and a tenant's page threads that stay its own."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from coordex import Executor
from coordex.ui.app import THREADS_PER_TENANT, UIApp

pytestmark = pytest.mark.timeout(60)


class Page:
    """A browser's view of the page: the cookie and the second key after ``?token=``."""

    def __init__(self, url: str) -> None:
        self.base = url.split("?")[0]
        self.origin = self.base.split("/ui/")[0]
        self.client = httpx.Client()
        first = self.client.get(url)
        assert first.status_code == 303, first.text
        self.set_cookie = first.headers["set-cookie"]
        self.key = first.headers["location"].split("#key=")[1]

    def get(self, path: str, **params: Any) -> httpx.Response:
        return self.client.get(self.base + path, params=params,
                               headers={"X-Coordex-Key": self.key})

    def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return self.client.post(self.base + path, json=body, headers={
            "X-Coordex-Key": self.key, "Origin": self.origin})


@pytest.fixture
def page(ex: Executor) -> Page:
    return Page(ex.serve_ui()["url"])


def test_the_token_comes_once_and_the_browser_holds_keys_of_its_own(ex: Executor) -> None:
    url = ex.serve_ui()["url"]
    token = url.split("token=")[1]
    port = url.split(":")[2].split("/")[0]
    page = Page(url)
    assert page.set_cookie.startswith(f"coordex_ui_{port}=") and token not in page.set_cookie
    for part in ("HttpOnly", "SameSite=Strict", "Path=/ui"):
        assert part in page.set_cookie
    assert page.get("api/sessions").status_code == 200
    # The cookie alone (what a listener on another port of this host would receive)
    # opens the page, which holds nothing, but not its API.
    assert page.client.get(page.base).status_code == 200
    assert page.client.get(page.base + "api/sessions").status_code == 401
    assert httpx.get(page.base + "api/calls").status_code == 401
    # A ?token= from another site does not log this browser in.
    cross = httpx.get(url, headers={"Sec-Fetch-Site": "cross-site"})
    assert cross.status_code == 403 and "set-cookie" not in cross.headers
    # Host and Origin are checked on every route, as on /mcp.
    for path in ("", "api/sessions"):
        assert httpx.get(page.base + path, params={"token": token},
                         headers={"Host": "evil.example"}).status_code == 421
    assert page.client.get(page.base + "api/sessions", headers={
        "X-Coordex-Key": page.key, "Origin": "http://evil.example"}).status_code == 403
    # A program passes the token as a header.
    assert httpx.get(page.base + "api/running",
                     headers={"Authorization": f"Bearer {token}"}).json() == {"running": []}


def test_a_post_needs_the_pages_own_origin(ex: Executor, page: Page) -> None:
    ex.execute_code("a = 1", state_mode="stateful", session_name="s")
    body = {"language": "python", "session_name": "s"}
    no_origin = page.client.post(page.base + "api/close", json=body,
                                 headers={"X-Coordex-Key": page.key})
    assert no_origin.status_code == 403
    form = page.client.post(page.base + "api/close", content=b"session_name=s", headers={
        "X-Coordex-Key": page.key, "Origin": page.origin,
        "Content-Type": "application/x-www-form-urlencoded"})
    assert form.status_code == 415
    assert "s" in {s["session_name"] for s in ex.list_sessions()["sessions"]}
    closed = page.post("api/close", body).json()
    assert closed["closed"] is True
    rebuilt = page.post("api/rebuild", body).json()
    assert rebuilt["replayed"] == 1 and rebuilt["skipped_failed"] == []
    assert page.post("api/close", {"session_name": "nope"}).json()["error_type"] == "not_found"


def test_calls_filters_and_one_call_with_all_it_returned(ex: Executor, page: Page) -> None:
    ex.execute_code("print('hello'); 6 * 7", state_mode="stateful", session_name="a")
    ex.execute_code("1 / 0", state_mode="stateful", session_name="a")
    ex.execute_code("echo shell", language="bash")
    ex.execute_code("x", state_mode="read_only")
    listed = page.get("api/calls").json()["calls"]
    assert [c["outcome"] for c in listed] == ["ok", "execution", "ok", "validation"]
    assert [c["code"] for c in page.get("api/calls", outcome="error").json()["calls"]] == [
        "1 / 0", "x"]
    assert [c["code"] for c in page.get("api/calls", outcome="execution").json()["calls"]] == [
        "1 / 0"]
    assert [c["language"] for c in page.get("api/calls", language="bash").json()["calls"]] == [
        "bash"]
    assert len(page.get("api/calls", state_mode="stateful").json()["calls"]) == 2
    assert [c["code"] for c in page.get("api/calls", text="shell").json()["calls"]] == [
        "echo shell"]
    assert [c["code"] for c in page.get("api/calls", text="hello").json()["calls"]] == [
        "print('hello'); 6 * 7"]  # found in its output
    assert [c["seq"] for c in page.get("api/calls", after_seq=listed[2]["seq"]).json()[
        "calls"]] == [listed[3]["seq"]]
    one = page.get(f"api/calls/{listed[1]['seq']}").json()["call"]
    assert "ZeroDivisionError" in one["traceback"] and one["suggestion"]
    first = page.get(f"api/calls/{listed[0]['seq']}").json()["call"]
    assert (first["stdout"], first["result"]) == ("hello\n", "42")
    missing = page.get("api/calls/99999")
    assert missing.status_code == 404 and missing.json()["error_type"] == "not_found"
    assert page.get("api/calls", outcome="sideways").json()["error_type"] == "validation"


def test_a_busy_session_never_holds_the_page_and_is_interrupted(ex: Executor,
                                                                page: Page) -> None:
    ex.execute_code("cd /tmp", language="bash", state_mode="stateful", session_name="sh")
    out: dict[str, Any] = {}
    code = "for i in $(seq 1 100); do echo tick $i; sleep 0.1; done"
    runner = threading.Thread(target=lambda: out.update(ex.execute_code(
        code, language="bash", state_mode="stateful", session_name="sh")), daemon=True)
    runner.start()
    deadline = time.monotonic() + 10
    while True:
        running = page.get("api/running").json()["running"]
        if running and "tick 3" in running[0]["stdout"]:
            break
        assert time.monotonic() < deadline, running
        time.sleep(0.1)
    call = running[0]
    assert (call["session_name"], call["state_mode"], call["code"]) == ("sh", "stateful", code)
    assert call["elapsed_ms"] > 200 and isinstance(call["seq"], int)
    for path, params in (("api/sessions", {}), ("api/calls", {}),
                         ("api/inspect", {"language": "bash", "session_id": 1})):
        started = time.monotonic()
        answer = page.get(path, **params).json()
        assert time.monotonic() - started < 1.0, path
    sh = next(s for s in page.get("api/sessions").json()["sessions"]
              if s["session_name"] == "sh")
    assert sh["busy"] is True and sh["busy_with"] == call["seq"]
    assert answer["busy"] is True  # the inspection did not wait for the shell
    # The running call has a row already, with no outcome yet.
    assert page.get(f"api/calls/{call['seq']}").json()["call"]["outcome"] is None
    interrupted = page.post("api/interrupt", {"seq": call["seq"]}).json()
    assert interrupted["interrupted"] is True
    runner.join(timeout=15)
    assert out["error_type"] == "timeout" and out["state_lost"] is False
    # The model is told a person stopped it, not that it ran out of time.
    assert out["error"].startswith("The call was interrupted from the page by the person")
    assert "larger timeout" not in out["suggestion"] and "on purpose" in out["suggestion"]
    row = page.get(f"api/calls/{call['seq']}").json()["call"]
    assert row["outcome"] == "timeout" and "tick 1" in row["stdout"]
    assert page.post("api/interrupt", {"seq": call["seq"]}).json()["error_type"] == "not_found"
    still = ex.execute_code("pwd", language="bash", state_mode="stateful", session_name="sh")
    assert still["stdout"] == "/tmp\n"


def test_one_tenants_slow_page_leaves_the_others_alone(tmp_path: Path) -> None:
    with Executor(root=tmp_path / "a") as slow, Executor(root=tmp_path / "b") as other:
        names = [f"s{i}" for i in range(THREADS_PER_TENANT)]
        for name in names:
            slow.execute_code("import time; time.sleep(2); n = 1", state_mode="stateful",
                              session_name=name)
            slow.close_session(session_name=name)
        app = UIApp({"slow-token-0123456789": slow, "other-token-0123456789": other}.get)
        host = {"host": "127.0.0.1:1", "content-type": "application/json",
                "authorization": "Bearer slow-token-0123456789"}
        answers: list[int] = []

        def rebuild(name: str) -> None:
            body = f'{{"session_name": "{name}"}}'.encode()
            answers.append(app.handle("POST", "/ui/api/rebuild", "", host, body).status)

        # Each rebuild replays a 2 s call: the slow tenant's page threads fill up.
        workers = [threading.Thread(target=rebuild, args=(name,), daemon=True)
                   for name in names]
        for worker in workers:
            worker.start()
        time.sleep(0.3)
        started = time.monotonic()
        full = app.handle("GET", "/ui/api/sessions", "", host)
        assert full.status == 503 and time.monotonic() - started < 1.0
        started = time.monotonic()
        theirs = app.handle("GET", "/ui/api/sessions", "", {
            "host": "127.0.0.1:1", "authorization": "Bearer other-token-0123456789"})
        assert theirs.status == 200 and time.monotonic() - started < 1.0
        for worker in workers:
            worker.join(timeout=30)
        assert answers == [200] * THREADS_PER_TENANT


@pytest.mark.slow
def test_an_environment_built_by_a_call_shows_its_lines_as_the_call_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.fakes.wheels import ledgerlib_wheel, requirement

    monkeypatch.setenv("UV_OFFLINE", "1")
    wheel = ledgerlib_wheel(tmp_path / "wheels", "1.0")
    with Executor(root=tmp_path / "home", timeout=30) as ex:
        venv_id = ex.environments.create(requirement("ledgerlib", wheel))["venv_id"]
        seen: list[list[dict[str, Any]]] = []

        def on_progress(line: str) -> None:
            if not seen:  # what the page would see now, while the build runs
                seen.append(ex.running_calls.running())

        r = ex.execute_code("import ledgerlib; 1", venv_id=venv_id, on_progress=on_progress)
        assert r["result"] == "1", r
    (call,) = seen[0]
    assert call["venv_id"] == venv_id and call["build"].strip()


def test_a_browser_stays_logged_in_when_the_server_restarts(tmp_path: Path) -> None:
    import socket

    with socket.socket() as probe:  # a port of its own, used by both runs
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with Executor(root=tmp_path / "home") as ex:
        ex.execute_code("x = 1", state_mode="stateful", session_name="s")
        page = Page(ex.serve_ui(port=port)["url"])
        assert page.get("api/sessions").status_code == 200
    with Executor(root=tmp_path / "home") as ex:  # the restarted server: a new token
        ex.serve_ui(port=port)
        assert page.client.get(page.base).status_code == 200  # the page, by its cookie
        again = page.get("api/sessions")
        assert again.status_code == 200, again.text
        assert page.client.get(page.base + "api/sessions").status_code == 401  # cookie alone
