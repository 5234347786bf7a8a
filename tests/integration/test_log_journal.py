"""The call log's journal (``log/journal.py``, SPEC 11's durability at a few us a call):
a finished call's row is in the journal before the call returns and reaches the SQLite
file afterwards; the rows of a process that died before they got there are put there by
whoever next reads or opens the log, each once; a live log's journal is never taken
from it; a line cut short or not in the format is skipped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coordex import Executor
from coordex.log import LOG_FILE, journal, store
from coordex.log.calls import record_call
from coordex.log.journal import Journal, parse_line
from coordex.log.store import CallLog, LogReader, SQLiteWriter

# A child that makes calls whose rows stay in its journal (its log's thread never moves
# them), forks a child of its own that outlives it, says so, and waits to be killed.
HELD = textwrap.dedent("""
    import os, sys
    from coordex import Executor
    from coordex.log import store
    store.GATHER_SECONDS = 3600
    ex = Executor(root=sys.argv[1])
    for i in range(int(sys.argv[3])):
        ex.execute_code(f"n = {i}", state_mode="stateful", session_name="s")
    if os.fork() == 0:  # a read-only copy's kind of child: it must not keep the lock
        os.write(int(sys.argv[2]), f"{os.getpid()}\\n".encode())  # its fork hooks ran
        os.close(int(sys.argv[2]))
        import time
        time.sleep(60)
        os._exit(0)
    import threading
    threading.Event().wait()
""")


def _journals(root: Path) -> list[Path]:
    return sorted(root.glob(LOG_FILE + "-rows-*"))


def _codes(path: Path) -> list[str]:
    return [r["code"] for r in LogReader(path).query("SELECT code FROM calls ORDER BY seq")]


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> None:
    """Logs of this process move no row by themselves (only reads and close do)."""
    monkeypatch.setattr(store, "GATHER_SECONDS", 3600)


def test_rows_only_in_the_journal_of_a_killed_process_are_not_lost(root: Path) -> None:
    calls = 40
    read_end, write_end = os.pipe()
    child = subprocess.Popen([sys.executable, "-c", HELD, str(root), str(write_end), str(calls)],
                             pass_fds=(write_end,), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    os.close(write_end)
    grandchild = None
    try:
        with os.fdopen(read_end, "rb") as said:
            grandchild = int(said.readline())
        assert not (root / LOG_FILE).exists() or _codes(root / LOG_FILE) == []
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
        # Its forked child still runs: the lock went with the process that held it.
        expected = [f"n = {i}" for i in range(calls)]
        assert _codes(root / LOG_FILE) == expected
        assert _journals(root) == []
        assert _codes(root / LOG_FILE) == expected  # moved once
    finally:
        for pid in (child.pid, grandchild):
            if pid is not None:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        child.wait()
    with Executor(root=root) as ex:
        assert [c["code"] for c in ex.history(limit=100)["calls"]] == expected
        rebuilt = ex.rebuild_session(session_name="s")
        assert rebuilt["replayed"] == calls and rebuilt["failed_at"] is None
        assert ex.execute_code("n", state_mode="stateful", session_name="s")["result"] == "39"


def _row(code: str) -> dict[str, Any]:
    return {"at": time.time(), "kind": "call", "language": "python", "state_mode": "stateless",
            "code": code, "duration_ms": 0.1, "outcome": "ok", "isolation": {"names": True}}


def test_a_live_logs_journal_is_left_to_it(root: Path, held: None) -> None:
    path = root / LOG_FILE
    first, second = CallLog(path), CallLog(path)
    try:
        first.record(_row("a"))
        assert len(_journals(root)) == 1
        assert second.query("SELECT code FROM calls") == []  # not its journal to take
        assert LogReader(path).query("SELECT code FROM calls") == []
        # Whoever reads through the log that wrote the row sees it at once.
        assert [r["code"] for r in first.query("SELECT code FROM calls")] == ["a"]
        first.record(_row("b"))
        first.close()
        assert _journals(root) == []
        rows = second.query("SELECT code, isolation FROM calls ORDER BY seq")
        assert rows == [{"code": "a", "isolation": '{"names": true}'},
                        {"code": "b", "isolation": '{"names": true}'}]
    finally:
        first.close()
        second.close()


def test_the_seq_of_a_row_still_in_the_journal_is_known_on_asking(root: Path, held: None) -> None:
    log = CallLog(root / LOG_FILE)
    try:
        result = {"result": "2", "duration_ms": 0.1, "state_mode": "stateless"}
        row = record_call(log, result, "1 + 1", None)  # a kept session's snapshot is marked with it
        assert row.written and LogReader(log.path).query("SELECT seq FROM calls") == []
        seq = row.seq()
        assert isinstance(seq, int) and row.seq() == seq
        assert log.query("SELECT seq, code FROM calls") == [{"seq": seq, "code": "1 + 1"}]
    finally:
        log.close()


def _dead_journal(path: Path, owner: str, codes: list[str]) -> tuple[Journal, list[bytes]]:
    """A journal as its owner leaves it when it dies: the file, without the lock."""
    dead = Journal(path, owner, store._JOURNALED)
    dead.open()
    lines = [dead.write(store._dumps(list(map(_row(c).get, store._JOURNALED)))) for c in codes]
    return dead, lines


def test_a_journal_adds_only_the_rows_its_owner_had_not_moved(root: Path) -> None:
    path = root / LOG_FILE
    dead, lines = _dead_journal(path, "4242-dead", ["0", "1", "2", "3"])
    writer = SQLiteWriter(path, None)
    try:
        # Its owner moved two rows, then died before the next two.
        moved = writer.append_journaled("4242-dead", [
            parse_line(line, store._JOURNALED) or (0, {}) for line in lines[:2]])
        assert None not in moved
        dead.forget()
        rows = LogReader(path).query("SELECT code, owner FROM calls ORDER BY seq")
        assert rows == [{"code": c, "owner": "4242-dead"} for c in "0123"]
        assert not dead.path.exists()
        assert writer.connection().execute("SELECT * FROM journals").fetchall() == []
    finally:
        writer.close()


def test_a_line_cut_short_or_not_in_the_format_is_skipped(root: Path) -> None:
    path = root / LOG_FILE
    dead, _ = _dead_journal(path, "4243-dead", ["kept", "kept too"])
    dead.forget()
    with open(dead.path, "r+b") as f:  # killed while copying its third line
        f.seek(dead.size)
        f.write(b'[3,1.5,"call","pyth')
    (root / f"{LOG_FILE}-rows-junk").write_bytes(b'not a journal\n[1, "x"]\n')
    (root / f"{LOG_FILE}-rows-odd").write_bytes(
        b'{"journal": 1, "owner": "odd", "columns": ["at", "code"]}\n[1]\n["one", 1, "x"]\n'
        b'[true, 1, "y"]\n[2, 1, "x", "extra"]\n{"a": 1}\n[3, 1.5, "odd row"]\n'
        b'[4, null, "a row the file refuses alone"]\n[5, 2.5, "odd row 2"]\n')
    assert _codes(path) == ["kept", "kept too", "odd row", "odd row 2"]
    assert _journals(root) == []


def test_the_journal_starts_over_and_grows(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(journal, "SPACE", 4096)
    own = Journal(root / LOG_FILE, "4244-own", ["code"])
    own.open()
    try:
        while not own.restart_due:
            own.write('["short"]')
        first = own.written
        own.restart()
        assert not own.restart_due and own.written == first
        own.write('["after"]')
        own.write(store._dumps(["x" * 10_000]))  # past the file's size: it doubles (twice)
        assert os.path.getsize(own.path) == 16384
        found = journal.parse(own.path.read_bytes())
        assert found is not None and found[0] == "4244-own"
        assert [(n, row["code"][:5]) for n, row in found[1]] == [(first + 1, "after"),
                                                                 (first + 2, "xxxxx")]
    finally:
        own.close(remove=True)
    assert not own.path.exists()


def test_a_row_far_past_the_caps_is_cut_before_the_journal(root: Path, held: None) -> None:
    log = CallLog(root / LOG_FILE)
    try:
        log.record({**_row("x = 1\n" + "#" * 1_000_000), "stdout": "y" * 1_000_000})
        assert log._journal is not None and log._journal.size < 120_000
        (row,) = log.query("SELECT code, code_truncated, stdout FROM calls")
        assert len(row["code"]) == 64 * 1024 and row["code_truncated"] == 1
        assert len(row["stdout"].encode()) <= 16 * 1024 and "bytes left out" in row["stdout"]
    finally:
        log.close()


@pytest.fixture
def executor_root(root: Path) -> Iterator[Path]:
    yield root
    assert _journals(root) == [], "a closed Executor leaves no journal behind"


def test_an_executor_leaves_no_journal_when_closed(executor_root: Path) -> None:
    with Executor(root=executor_root) as ex:
        ex.execute_code("x = 1", state_mode="stateful")
        assert len(_journals(executor_root)) == 1


def test_closing_while_the_first_row_wakes_the_log_never_raises(tmp_path: Path) -> None:
    """An Executor closed from another thread while its first call's row is written (a
    timer, a signal handler) closes its log cleanly: close() never joins a helper thread
    that is not started yet (it raised 'cannot join thread before it is started')."""

    import sys

    failures: list[BaseException] = []
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    try:
        _close_while_waking(tmp_path, failures)
    finally:
        sys.setswitchinterval(interval)
    assert failures == []


def _close_while_waking(tmp_path: Path, failures: list[BaseException]) -> None:
    import threading

    for i in range(300):
        log = CallLog(tmp_path / f"{i}.db")
        ready = threading.Barrier(2)

        def write(log: CallLog = log, ready: threading.Barrier = ready) -> None:
            ready.wait()
            log.record(_row("x"))

        writer = threading.Thread(target=write)
        writer.start()
        ready.wait()
        try:
            log.close()
        except BaseException as exc:  # what the caller of close() would see
            failures.append(exc)
        writer.join()
        log.close()


def test_lines_parsed_in_one_batch_read_as_each_alone() -> None:
    """A batch of journal lines parses to what each line parses to alone: a torn or
    foreign line among them is left out alone, the rest read whole."""
    columns = ("a", "b")
    good = [b'[1,"x",null]\n', b'[2,"caf\\udce9",[1,2]]\n', b'[3,1.5,{"k":"v"}]\n']
    odd = [b'[4,"torn', b'[true,1,2]\n', b'[5,1]\n', b'{"a":1}\n', b"", b'[6,1,2] [7,1,2]\n']
    for lines in (good, good[:1] + odd + good[1:], odd):
        assert journal.parse_lines(lines, columns) == [parse_line(x, columns) for x in lines]
    assert journal.parse_lines(good, columns)[1] == (2, {"a": "caf\udce9", "b": [1, 2]})


def test_a_row_read_back_as_a_list_goes_to_the_file_as_the_same_row_as_a_dict() -> None:
    """The log's own lines, read back as lists of values and encoded without a dict,
    reach the file as the same columns and values as the dict of that line: every
    kind of value (texts to escape and cap, flags, JSON columns, NULLs anywhere)."""
    long = "y" * (store.CODE_CAP_BYTES + 10)
    rows: list[dict[str, Any]] = [
        {"at": 1.5, "kind": "call", "language": "python", "session_id": 0,
         "state_mode": "stateful", "code": "x = 1", "duration_ms": 0.2, "outcome": "ok",
         "changed": {"rebound": ["x"], "deleted": []}, "stdout": "", "stderr": ""},
        {"at": 2.0, "kind": None, "code": long, "code_truncated": 1, "session_name": "caf\udce9",
         "state_lost": True, "retried": 1, "isolation": {"files": "protected"},
         "stdout": "o" * (store.OUTPUT_CAP_BYTES * 2), "stderr": "e\udcff", "result": "3",
         "error": "boom", "suggestion": "s", "traceback": "t", "call_id": "c1",
         "replay_of": 4, "exit_code": 2, "venv_id": 7},
        {"at": 3.0},
        {"at": 4.0, "code": None, "changed": [1, "a"], "state_lost": 0},
    ]
    for row in rows:
        line = ("[9," + store._dumps(list(map(row.get, store._JOURNALED)))[1:]).encode()
        as_list = journal.parse_lines([line], store._JOURNALED, as_lists=True)[0]
        as_dict = parse_line(line, store._JOURNALED)
        assert as_list is not None and as_dict is not None
        assert isinstance(as_list[1], list)
        expected = store._bound(store.encode_row(as_dict[1], "me"))
        assert store._bound_journaled(as_list[1], "me") == expected
        assert store._bound_journaled(dict(as_dict[1]), "me") == expected
