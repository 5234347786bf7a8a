"""The page's handler without a server: the token rules and the JSON endpoints."""

from __future__ import annotations

import json
from typing import Any

from coordex.ui.app import COOKIE, UIApp, cookie_name, single_tenant

TOKEN = "tok-0123456789abcdef"


class FakeExecutor:
    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.asked: list[tuple[str, dict[str, Any]]] = []

    def list_sessions(self) -> dict[str, Any]:
        return {"sessions": [{"session_name": self.tag}], "max_sessions": 20}

    def inspect_session(self, **kwargs: Any) -> dict[str, Any]:
        self.asked.append(("inspect_session", kwargs))
        return {"names": []}

    def history(self, **kwargs: Any) -> dict[str, Any]:
        self.asked.append(("history", kwargs))
        return {"calls": []}


def test_without_the_token_everything_is_401() -> None:
    app = UIApp(single_tenant(FakeExecutor("a"), TOKEN))
    for path in ("/ui", "/ui/", "/ui/api/sessions", "/ui/api/history"):
        assert app.handle("GET", path, "", {}).status == 401
        assert app.handle("GET", path, "token=wrong", {}).status == 401
        assert app.handle("GET", path, "", {"cookie": f"{COOKIE}=wrong"}).status == 401


def test_the_token_once_in_the_url_then_a_cookie() -> None:
    app = UIApp(single_tenant(FakeExecutor("a"), TOKEN))
    first = app.handle("GET", "/ui", f"token={TOKEN}", {})
    assert first.status == 303
    headers = dict(first.headers)
    assert headers["Location"] == "/ui/"
    cookie = headers["Set-Cookie"]
    assert cookie.startswith(f"{cookie_name(TOKEN)}={TOKEN};") and "HttpOnly" in cookie
    assert "SameSite=Strict" in cookie
    jar = f"other=1; {COOKIE}_old=stale; {cookie_name(TOKEN)}={TOKEN}"
    page = app.handle("GET", "/ui/", "", {"cookie": jar})
    assert page.status == 200 and page.content_type.startswith("text/html")
    assert b"<script>" in page.body
    sessions = app.handle("GET", "/ui/api/sessions", "", {"authorization": f"Bearer {TOKEN}"})
    assert json.loads(sessions.body)["sessions"] == [{"session_name": "a"}]


def test_the_page_loads_nothing_from_elsewhere() -> None:
    app = UIApp(single_tenant(FakeExecutor("a"), TOKEN))
    page = app.handle("GET", "/ui/", "", {"cookie": f"{COOKIE}={TOKEN}"})
    assert b"src=" not in page.body and b"href=" not in page.body
    assert "default-src 'none'" in dict(page.all_headers())["Content-Security-Policy"]


def test_each_token_sees_its_own_executor() -> None:
    tenants = {"alice-token-0123456789": FakeExecutor("alice"),
               "bob-token-0123456789": FakeExecutor("bob")}
    app = UIApp(tenants.get)
    for token, executor in tenants.items():
        r = app.handle("GET", "/ui/api/sessions", "", {"cookie": f"{cookie_name(token)}={token}"})
        assert json.loads(r.body)["sessions"][0]["session_name"] == executor.tag


def test_the_endpoints_pass_the_session_filter_on() -> None:
    ex = FakeExecutor("a")
    app = UIApp(single_tenant(ex, TOKEN))
    cookie = {"cookie": f"{COOKIE}={TOKEN}"}
    assert app.handle("GET", "/ui/api/history", "language=bash&session_id=2&limit=5", cookie).status == 200
    assert app.handle("GET", "/ui/api/inspect", "session_id=1&venv_id=3", cookie).status == 200
    assert ex.asked == [
        ("history", {"language": "bash", "session_name": None, "limit": 5, "session_id": 2,
                     "venv_id": None}),
        ("inspect_session", {"language": "python", "session_name": None, "session_id": 1,
                             "venv_id": 3}),
    ]
    assert app.handle("GET", "/ui/api/nothing", "", cookie).status == 404
    assert app.handle("POST", "/ui/api/sessions", "", cookie).status == 405
