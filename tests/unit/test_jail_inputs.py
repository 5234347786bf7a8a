"""What a jail is built from, checked without starting one: the folders a host may
read, a node's tenant folder, and the page's cookie look-up (SPEC 8 and 9)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from coordex.hosting.client import readable_paths
from coordex.hosting.identity import server_identity
from coordex.hosting.tenant_node import tenant_folder
from coordex.ui.access import cookie_value


def test_no_folder_a_process_put_on_its_own_sys_path_is_readable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray puts its driver's working folder on every worker's sys.path (a server's base
    folder, holding its root and tokens file); PYTHONPATH and ``python -m`` add others.
    None of them is the installation's: none is made readable in a host's view."""
    driver_cwd = tmp_path / "server-base"
    driver_cwd.mkdir()
    monkeypatch.setattr(sys, "path", [str(driver_cwd), *sys.path, str(tmp_path)])
    monkeypatch.chdir(driver_cwd)
    found = readable_paths()
    assert not any(os.path.realpath(p).startswith(str(tmp_path)) for p in found), found
    import coordex

    package = os.path.dirname(os.path.dirname(os.path.abspath(coordex.__file__)))
    assert package in found and sys.prefix in found


def test_a_node_folder_is_keyed_by_the_server(tmp_path: Path) -> None:
    x, y = server_identity(tmp_path / "x"), server_identity(tmp_path / "y")
    assert x != y and server_identity(tmp_path / "x") == x  # kept across starts
    node = tmp_path / "node"
    assert tenant_folder(node, {"name": "alice", "server": x}) != tenant_folder(
        node, {"name": "alice", "server": y})
    assert tenant_folder(node, {"name": "alice", "server": "../../etc"}) == node / "tenants" / "alice"


def test_the_page_cookie_is_found_in_time_linear_in_the_header() -> None:
    host = "127.0.0.1:8000"
    assert cookie_value({"cookie": "a=1; coordex_ui_8000=k3y_-Z; b=2"}, host) == "k3y_-Z"
    assert cookie_value({"cookie": "coordex_ui_8001=other"}, host) == ""
    assert cookie_value({"cookie": 'coordex_ui_8000="quoted"'}, host) == ""
    started = time.monotonic()
    for size in (8000, 60_000, 1_000_000):
        assert cookie_value({"cookie": 'coordex_ui_8000="' + "\\" * size + '"'}, host) == ""
        assert cookie_value({"cookie": "x=" + "\\;" * size}, host) == ""
    assert time.monotonic() - started < 0.5


def test_one_tenant_opening_its_url_again_and_again_logs_no_one_else_out() -> None:
    from coordex.ui.access import MAX_KEYS, Keys

    keys = Keys()
    bob_cookie, bob_page = keys.issue("bob-token")
    for _ in range(MAX_KEYS + 10):
        keys.issue("alice-token")
    assert keys.token_for(bob_cookie, bob_page) == "bob-token"
    first_alice = keys.issue("alice-token")
    for _ in range(MAX_KEYS):
        keys.issue("alice-token")
    assert keys.token_for(*first_alice) is None  # her own oldest goes
