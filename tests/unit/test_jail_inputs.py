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


def test_a_hosts_rows_keep_the_logs_caps_and_an_mcp_calls_code(tmp_path: Path) -> None:
    """Rows "of the host's own" are the tenant's word: each column was cut at 70,000
    characters only (16 rows of 11 such columns per call: 12.6 MB written by the owner,
    outside the tenant's folder); and a call handed over by the MCP server
    (``call_tool``) was not tied to its row, so its code was the host's word too."""
    import sqlite3

    from coordex.hosting.records import OwnerRecords
    from coordex.log.store import CODE_CAP_BYTES, LOG_FILE, OUTPUT_CAP_BYTES

    records = OwnerRecords(tmp_path / "records")
    try:
        big = "x" * 70_000
        seq = records.handle("log_append", {"row": {
            "owner": "t", "kind": "call", "code_truncated": False, "state_lost": False,
            "retried": False, "code": big, "stdout": big, "session_name": big,
            "error": big}})
        assert isinstance(seq, int), seq
        mcp = {"method": "call_tool", "at": time.time(),
               "args": {"name": "execute_code", "arguments": {"code": "print('sent')"}}}
        tied = records.handle("log_append", {"row": {
            "owner": "t", "kind": "call", "code": "forged()", "code_truncated": False,
            "state_lost": False, "retried": False}},
                              7, mcp)
        assert isinstance(tied, int), tied
    finally:
        records.close()
    with sqlite3.connect(tmp_path / "records" / LOG_FILE) as db:
        row = db.execute("SELECT code, stdout, session_name, error FROM calls WHERE seq = ?",
                         (seq,)).fetchone()
        code = db.execute("SELECT code FROM calls WHERE seq = ?", (tied,)).fetchone()[0]
    assert len(row[0].encode()) <= CODE_CAP_BYTES + 100, len(row[0])
    assert all(len(v.encode()) <= OUTPUT_CAP_BYTES + 100 for v in row[1:]), [len(v) for v in row]
    assert code == "print('sent')"


def test_a_seq_past_the_logs_integers_is_a_validation_error(tmp_path: Path) -> None:
    """It read as a broken log ("environment": move the file away)."""
    from coordex import Executor

    with Executor(root=tmp_path / "root", persist=False) as ex:
        ex.execute_code("1")
        for seq in (99999999999999999999, 1 << 63):
            found = ex.history(seq=seq)
            assert found.get("error_type") == "validation", found
        assert ex.history(seq=1).get("call", {}).get("seq") == 1


def test_a_lone_surrogate_in_a_function_name_is_a_validation_error(tmp_path: Path) -> None:
    """functions.show and functions.call never raise (SPEC 2): a name holding a lone
    surrogate raised UnicodeEncodeError from the store."""
    from coordex import Executor

    with Executor(root=tmp_path / "root", persist=False) as ex:
        for found in (ex.functions.show("\ud800"), ex.functions.call("\ud800"),
                      ex.functions.call("f@99999999999999999999999"),
                      ex.functions.show("f", 10**30)):
            assert found.get("error_type") == "validation", found


def test_a_session_whose_rows_the_log_refused_says_so_when_restored(tmp_path: Path) -> None:
    """R12: rows of a session the owner could not write (its file gone unwritable)
    before the host restarted: the restored session's reply says calls are missing,
    once, and only for that session."""
    import shutil

    from coordex.hosting.records import OwnerRecords
    from coordex.log.store import LOG_FILE

    records = OwnerRecords(tmp_path / "records")
    try:
        row = {"owner": "t", "kind": "call", "code_truncated": False, "state_lost": False,
               "retried": False, "language": "python", "session_name": "s",
               "session_id": 1}
        assert isinstance(records.handle("log_append", {"row": row}), int)
        records._log.drop()
        log = tmp_path / "records" / LOG_FILE
        for leftover in tmp_path.joinpath("records").glob(LOG_FILE + "*"):
            leftover.unlink()
        log.mkdir()  # a file that cannot be opened: each row is refused
        refused = records.handle("log_append", {"row": row})
        assert refused.get("storage") is True, refused
        records.new_life()
        other = {"restored": {"from": "replay"},
                 "session": {"language": "python", "session_name": "t", "session_id": 2,
                             "venv_id": None}}
        records.mark_restored(other)
        assert "missing_rows" not in other["restored"]
        mine = {"restored": {"from": "replay", "replayed": 1},
                "session": {"language": "python", "session_name": "s", "session_id": 1,
                            "venv_id": None}}
        records.mark_restored(mine)
        assert mine["restored"]["missing_rows"] == 1, mine
        assert "no row in the call log" in mine["restored"]["why"]
        again = {"restored": {"from": "snapshot"}, "session": mine["session"]}
        records.mark_restored(again)
        assert "missing_rows" not in again["restored"]
        shutil.rmtree(log)
    finally:
        records.close()
