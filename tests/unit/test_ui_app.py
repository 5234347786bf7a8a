"""The page's pure rules: the Host/Origin checks, the browsers' keys and their cookie,
and how a request's path and arguments are read."""

from __future__ import annotations

from coordex.ui import access, api
from coordex.ui.app import Request


def test_host_and_origin_are_checked_as_on_mcp() -> None:
    checks = access.Checks()
    assert checks.refuse("GET", {"host": "127.0.0.1:8000"}) is None
    assert checks.refuse("GET", {"host": "localhost"}) is None
    assert checks.refuse("GET", {"host": "evil.example"})[0] == 421  # type: ignore[index]
    assert checks.refuse("GET", {"host": "127.0.0.1:8000.evil"})[0] == 421  # type: ignore[index]
    refused = checks.refuse("GET", {"host": "127.0.0.1:8000", "origin": "http://evil.example"})
    assert refused is not None and refused[0] == 403
    assert checks.refuse("DELETE", {"host": "127.0.0.1:1"})[0] == 405  # type: ignore[index]
    named = access.Checks(["box.lan:*"], ["http://box.lan:*"])
    assert named.refuse("GET", {"host": "box.lan:9"}) is None
    assert named.refuse("GET", {"host": "127.0.0.1:9"}) is not None


def test_a_post_from_a_browser_must_come_from_the_page() -> None:
    checks = access.Checks()
    own = {"host": "127.0.0.1:8000", "content-type": "application/json"}
    assert checks.refuse_post({**own, "origin": "http://127.0.0.1:8000"}, by_cookie=True) is None
    assert checks.refuse_post({**own, "sec-fetch-site": "same-origin"}, by_cookie=True) is None
    assert checks.refuse_post(own, by_cookie=True)[0] == 403  # type: ignore[index]
    other_port = {**own, "origin": "http://127.0.0.1:9999", "sec-fetch-site": "same-site"}
    assert checks.refuse_post(other_port, by_cookie=True)[0] == 403  # type: ignore[index]
    assert checks.refuse_post(own, by_cookie=False) is None  # a program with the token
    form = {**own, "content-type": "application/x-www-form-urlencoded"}
    assert checks.refuse_post(form, by_cookie=False)[0] == 415  # type: ignore[index]


def test_the_cookie_holds_a_key_never_the_token_and_is_named_per_port() -> None:
    keys = access.Keys()
    cookie_key, page_key = keys.issue("the-token-0123456789")
    assert "the-token" not in cookie_key + page_key and cookie_key != page_key
    header = access.set_cookie("127.0.0.1:8123", cookie_key, "/ui")
    assert header.startswith(f"coordex_ui_8123={cookie_key};")
    for part in ("HttpOnly", "SameSite=Strict", "Path=/ui"):
        assert part in header
    assert access.cookie_name("[::1]:70") == "coordex_ui_70"
    assert access.cookie_name("localhost") == "coordex_ui_80"
    jar = {"cookie": f"coordex_ui_9999=other; coordex_ui_8123={cookie_key}"}
    assert access.cookie_value(jar, "127.0.0.1:8123") == cookie_key
    # Both keys are needed; the cookie alone opens the page (which holds no data).
    assert keys.token_for(cookie_key, page_key) == "the-token-0123456789"
    assert keys.token_for(cookie_key, "") is None
    assert keys.token_for(cookie_key, "guess") is None
    assert keys.token_for_cookie(cookie_key) == "the-token-0123456789"


def test_old_keys_are_forgotten() -> None:
    keys = access.Keys(limit=2, age=3600)
    first = keys.issue("t1")
    keys.issue("t2")
    keys.issue("t3")
    assert keys.token_for(*first) is None
    stale = access.Keys(age=-1)
    assert stale.token_for(*stale.issue("t")) is None


def test_routes_and_arguments() -> None:
    assert api.route("GET", "api/sessions") == (api.sessions, False)
    assert api.route("POST", "api/rebuild") == (api.rebuild, True)
    assert api.route("GET", "api/calls/12") == (api.one_call, False)
    assert api.route("POST", "api/sessions") == 405
    assert api.route("GET", "api/interrupt") == 405
    assert api.route("GET", "api/nothing") is None
    query = {"session_id": ["2"], "venv_id": [""], "limit": ["x"], "token": ["t"], "text": [""]}
    found = api.arguments(Request("GET", "/ui/api/calls", query, {}), "api/calls")
    assert found == {"session_id": 2, "venv_id": None, "limit": "x", "text": None}
    posted = api.arguments(Request("POST", "/ui/api/close", {}, {}, b'{"session_name": "a"}'),
                           "api/close")
    assert posted == {"session_name": "a"}
    bad = api.arguments(Request("POST", "/ui/api/close", {}, {}, b"[1]"), "api/close")
    assert not isinstance(bad, dict) and bad.status == 400
    one = api.arguments(Request("GET", "/ui/api/calls/7", {}, {}), "api/calls/7")
    assert one == {"seq": 7}


def test_signed_keys_outlive_the_process_that_issued_them(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from coordex.ui.keys import SECRET_FILE, SignedKeys, secret_under

    secret = secret_under(tmp_path)
    assert oct((tmp_path / SECRET_FILE).stat().st_mode & 0o777) == "0o600"
    served = ["token-a-0123456789", "token-b-0123456789"]
    first = SignedKeys(secret, lambda: served)
    cookie_key, page_key = first.issue("token-b-0123456789")
    assert "token" not in cookie_key + page_key
    # A restart: a new object over the same secret, read again from the folder.
    again = SignedKeys(secret_under(tmp_path), lambda: served)
    assert again.token_for(cookie_key, page_key) == "token-b-0123456789"
    assert again.token_for_cookie(cookie_key) == "token-b-0123456789"
    assert again.token_for(cookie_key, "") is None and again.token_for(cookie_key, "x" * 22) is None
    # Changed by one character, signed by another secret, or for a token no longer served.
    flipped = cookie_key[:-1] + ("A" if cookie_key[-1] != "A" else "B")
    assert again.token_for_cookie(flipped) is None
    assert SignedKeys(b"another secret", lambda: served).token_for_cookie(cookie_key) is None
    assert SignedKeys(secret, lambda: ["token-a-0123456789"]).token_for_cookie(cookie_key) is None
    assert SignedKeys(secret, lambda: served, age=-1).token_for_cookie(cookie_key) is None
    # A single-tenant page gets a new token at each start: its key stands for the tenant.
    one = SignedKeys(secret, lambda: ["old"], single=True)
    keys = one.issue("old")
    assert SignedKeys(secret, lambda: ["new"], single=True).token_for(*keys) == "new"
    assert SignedKeys(secret, lambda: ["new"]).token_for(*keys) is None
