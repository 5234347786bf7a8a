"""The call log (SPEC section 11) through the public Executor: rows, order, bounds,
restarts, threads, several processes, storage faults, and rebuilding sessions in the
agent's own interpreter and in bash."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from coordex import Executor
from coordex.log import LOG_FILE
from tests.said import said

HISTORY_KEYS = {"seq", "at", "language", "venv_id", "session_id", "session_name", "state_mode",
                "code", "duration_ms", "outcome", "state_lost"}


def test_every_call_is_a_row_in_order(ex: Executor) -> None:
    ex.execute_code("x = 1", state_mode="stateful", session_name="audit")
    ex.execute_code("1 / 0", state_mode="stateful", session_name="audit")
    ex.execute_code("x", state_mode="read_only", session_name="audit")
    ex.execute_code("echo hi; exit 3", language="bash")
    ex.execute_code("x", state_mode="read_only")  # validation: no session
    calls = ex.history()["calls"]
    assert [c["code"] for c in calls] == ["x = 1", "1 / 0", "x", "echo hi; exit 3", "x"]
    assert all(set(c) == HISTORY_KEYS for c in calls)
    assert [c["seq"] for c in calls] == sorted(c["seq"] for c in calls)
    assert [c["at"] for c in calls] == sorted(c["at"] for c in calls)
    assert [c["outcome"] for c in calls] == ["ok", "execution", "ok", "ok", "validation"]
    first = calls[0]
    assert (first["language"], first["venv_id"], first["session_id"], first["session_name"],
            first["state_mode"]) == ("python", None, 1, "audit", "stateful")
    assert calls[3]["language"] == "bash" and calls[3]["state_mode"] == "stateless"
    assert ex.history(session_name="audit", limit=2)["calls"] == calls[1:3]
    assert [c["code"] for c in ex.history(language="bash")["calls"]] == ["echo hi; exit 3"]
    rows = ex._call_log.query("SELECT exit_code, isolation FROM calls WHERE kind = 'call'")
    assert rows[3]["exit_code"] == 3
    assert json.loads(rows[2]["isolation"])["names"] is True


def test_a_refused_call_keeps_what_was_asked(ex: Executor) -> None:
    ex.execute_code("x", state_mode="read_only")
    ex.execute_code("1", language="ruby", state_mode="stateful", session_name="s")  # type: ignore[arg-type]
    ex.execute_code("1", state_mode="stateful", session_id=True)  # type: ignore[arg-type]
    calls = ex.history()["calls"]
    assert [c["outcome"] for c in calls] == ["validation"] * 3
    assert [(c["language"], c["state_mode"], c["session_name"], c["session_id"])
            for c in calls] == [("python", "read_only", None, None),
                                ("ruby", "stateful", "s", None),
                                ("python", "stateful", None, None)]
    # A refused call never counts as a session's call.
    assert ex.rebuild_session(language="python", session_name="s")["error_type"] == "not_found"


def test_history_checks_its_arguments(ex: Executor) -> None:
    for bad in ({"limit": 0}, {"limit": "5"}, {"language": "ruby"}, {"session_id": -1},
                {"session_id": 1, "session_name": "a"}):
        r = ex.history(**bad)
        assert r["error_type"] == "validation" and r["suggestion"], bad


def test_the_log_survives_a_restart(root: Path) -> None:
    with Executor(root=root) as first:
        first.execute_code("kept = 'yes'", state_mode="stateful", session_name="s")
    with Executor(root=root) as second:
        calls = second.history()["calls"]
        assert [c["code"] for c in calls] == ["kept = 'yes'"]
        # A session of the earlier run comes back in this one.
        rebuilt = second.rebuild_session(session_name="s")
        assert rebuilt["replayed"] == 1 and rebuilt["failed_at"] is None
        assert second.execute_code("kept", state_mode="stateful", session_name="s")["result"] == "'yes'"


def test_a_rebuilds_replays_mark_their_rows_and_no_other(root: Path) -> None:
    with Executor(root=root) as ex:
        ex.execute_code("a = 1", state_mode="stateful", session_name="s")
        ex.execute_code("b = a + 1", state_mode="stateful", session_name="s")
        ex.close_session(session_name="s")
        assert ex.rebuild_session(session_name="s")["replayed"] == 2
        ex.execute_code("a = 1", state_mode="stateful", session_name="s")  # not a replay
    rows = sqlite3.connect(root / LOG_FILE).execute(
        "SELECT seq, code, replay_of FROM calls WHERE kind = 'call' ORDER BY seq").fetchall()
    first, second = rows[0][0], rows[1][0]
    assert [(code, of) for _, code, of in rows] == [
        ("a = 1", None), ("b = a + 1", None), ("a = 1", first), ("b = a + 1", second),
        ("a = 1", None)]


def test_the_log_is_bounded_oldest_first(root: Path) -> None:
    with Executor(root=root, log_max_rows=10) as ex:
        for i in range(25):
            ex.execute_code(f"{i}")
        codes = [c["code"] for c in ex.history(limit=100)["calls"]]
        assert codes == [str(i) for i in range(15, 25)]
        count = sqlite3.connect(root / LOG_FILE).execute("SELECT COUNT(*) FROM calls").fetchone()
        assert count == (10,)


def test_log_false_records_nothing(root: Path) -> None:
    with Executor(root=root, log=False) as ex:
        assert ex.execute_code("1 + 1")["result"] == "2"
        assert ex.history()["error_type"] == "validation"
        assert ex.rebuild_session(session_name="x")["error_type"] == "validation"
    assert not (root / LOG_FILE).exists()


def test_the_code_is_capped_at_64_kib(ex: Executor) -> None:
    long = "x = 1\n" + "#" * 70_000
    ex.execute_code(long, state_mode="stateful", session_name="big")
    stored = ex.history()["calls"][-1]["code"]
    assert len(stored.encode()) == 64 * 1024 and long.startswith(stored)
    # A step the log could not keep whole is not replayed half.
    ex.close_session(session_name="big")
    rebuilt = ex.rebuild_session(session_name="big")
    assert rebuilt["replayed"] == 0 and rebuilt["failed_at"] == ex.history()["calls"][0]["seq"]


def test_many_threads_lose_no_row(ex: Executor) -> None:
    def work(n: int) -> None:
        for i in range(20):
            ex.execute_code(f"{n} * 100 + {i}")

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    codes = {c["code"] for c in ex.history(limit=1000)["calls"]}
    assert codes == {f"{n} * 100 + {i}" for n in range(8) for i in range(20)}


WRITER = textwrap.dedent("""
    import sys
    from coordex import Executor
    with Executor(root=sys.argv[1]) as ex:
        for i in range(100):
            ex.execute_code(f"'{sys.argv[2]}' + str({i})")
""")


def test_two_processes_share_one_log(root: Path) -> None:
    root.mkdir(parents=True)
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(root), tag]) for tag in "ab"]
    try:
        for p in procs:
            assert p.wait(timeout=60) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    with Executor(root=root) as ex:
        calls = ex.history(limit=1000)["calls"]
    assert len(calls) == 200
    assert {c["code"] for c in calls} == {f"'{t}' + str({i})" for t in "ab" for i in range(100)}
    assert len({c["seq"] for c in calls}) == 200


def test_a_corrupt_log_costs_the_rows_not_the_calls(root: Path) -> None:
    root.mkdir(parents=True)
    (root / LOG_FILE).write_bytes(b"this is not a database" * 100)
    with Executor(root=root) as ex:
        assert ex.execute_code("1 + 1")["result"] == "2"
        r = ex.execute_code("y = 2", state_mode="stateful", session_name="s")
        assert "error_type" not in r
        assert ex.history()["error_type"] == "environment"
        assert ex._call_log.dropped >= 2 and ex._call_log.problem


def test_a_log_path_taken_by_a_folder_costs_the_rows_not_the_calls(root: Path) -> None:
    (root / LOG_FILE).mkdir(parents=True)
    with Executor(root=root) as ex:
        assert ex.execute_code("print('fine')")["stdout"] == "fine\n"
        ex._call_log.flush()
        assert ex._call_log.dropped == 1


FULL_DISK = textwrap.dedent("""
    import json, resource, signal, sys
    from coordex import Executor
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a write past the limit fails with EFBIG
    ex = Executor(root=sys.argv[1])
    ex.execute_code("0")
    ex._call_log.flush()
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))
    results = [ex.execute_code("x = 'y' * 5000; len(x)", state_mode="stateful",
                               session_name="s") for _ in range(200)]
    ex._call_log.flush()
    print(json.dumps({"results": [r.get("result") for r in results],
                      "dropped": ex._call_log.dropped, "problem": ex._call_log.problem}))
    ex.close()
""")


def test_a_full_disk_costs_the_rows_not_the_calls(root: Path) -> None:
    root.mkdir(parents=True)
    done = subprocess.run([sys.executable, "-c", FULL_DISK, str(root)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["results"] == ["5000"] * 200
    assert report["dropped"] > 0 and report["problem"]


def test_a_read_only_log_costs_the_rows_not_the_calls(root: Path) -> None:
    with Executor(root=root) as ex:
        ex.execute_code("0")
        ex._call_log.flush()
        # The database refuses writes (as a read-only file or folder would make it).
        ex._call_log._sqlite.connection().execute("PRAGMA query_only = ON")
        assert ex.execute_code("1 + 1")["result"] == "2"
        ex._call_log.flush()
        assert ex._call_log.dropped == 1 and "readonly" in ex._call_log.problem.lower()
        # Once the cause is gone the log resumes.
        assert ex.execute_code("2 + 2")["result"] == "4"
        assert [c["code"] for c in ex.history()["calls"]] == ["0", "2 + 2"]


# --- rebuilding ------------------------------------------------------------------------


def test_rebuild_after_close_in_the_own_interpreter(ex: Executor) -> None:
    ex.execute_code("rows = [1, 2]", state_mode="stateful", session_name="w")
    ex.execute_code("rows.append(3)", state_mode="stateful", session_name="w")
    ex.execute_code("rows.append(99)", state_mode="read_only", session_name="w")
    ex.execute_code("print(len(rows))")  # stateless: never replayed
    ex.execute_code("rows.appendx(4)", state_mode="stateful", session_name="w")  # failed
    ex.close_session(session_name="w")
    rebuilt = ex.rebuild_session(session_name="w")
    seqs = [c["seq"] for c in ex.history(session_name="w")["calls"]]
    # The failed call is not replayed, but named: it may have changed the state first.
    assert rebuilt == {"replayed": 2, "failed_at": None, "calls": seqs[:2],
                       "skipped_failed": [seqs[3]],
                       "session": {"language": "python", "venv_id": None, "session_id": 1,
                                   "session_name": "w"}}
    assert ex.execute_code("rows", state_mode="stateful", session_name="w")["result"] == "[1, 2, 3]"
    # The rebuilt session has lost nothing: a second rebuild has nothing to do.
    again = ex.rebuild_session(session_name="w")
    assert again["error_type"] == "validation"


def test_a_not_found_answer_does_not_hide_the_calls_before_it(ex: Executor) -> None:
    for code in ("acc = [1]", "acc.append(2)"):
        ex.execute_code(code, state_mode="stateful", session_name="mine")
    ex.close_session(session_name="mine")
    # The model reads the closed session, is told it does not exist, asks for it back.
    gone = ex.execute_code("acc", state_mode="read_only", session_name="mine")
    assert gone["error_type"] == "not_found"
    assert ex.execute_code("x", state_mode="read_only")["error_type"] == "validation"
    rebuilt = ex.rebuild_session(session_name="mine")
    assert rebuilt["replayed"] == 2 and rebuilt["failed_at"] is None, rebuilt
    assert rebuilt["session"]["session_name"] == "mine" and rebuilt["skipped_failed"] == []
    r = ex.execute_code("acc", state_mode="stateful", session_name="mine")
    assert r["result"] == "[1, 2]"


def test_a_not_found_answer_in_a_new_run_does_not_hide_the_last_run(root: Path) -> None:
    with Executor(root=root) as first:
        first.execute_code("saved = 41 + 1", state_mode="stateful", session_name="kept")
    with Executor(root=root) as second:
        gone = second.execute_code("saved", state_mode="read_only", session_name="kept")
        assert gone["error_type"] == "not_found"
        rebuilt = second.rebuild_session(session_name="kept")
        assert rebuilt["replayed"] == 1, rebuilt
        r = second.execute_code("saved", state_mode="stateful", session_name="kept")
        assert r["result"] == "42"


def test_a_replay_stops_at_the_first_call_that_fails(ex: Executor, tmp_path: Path) -> None:
    flag = tmp_path / "flag"
    flag.write_text("1")
    ex.execute_code("a = 1", state_mode="stateful", session_name="r")
    ex.execute_code(f"import pathlib\nb = pathlib.Path({str(flag)!r}).read_text()",
                    state_mode="stateful", session_name="r")
    ex.execute_code("c = 3", state_mode="stateful", session_name="r")
    ex.close_session(session_name="r")
    flag.unlink()
    second = ex.history(session_name="r")["calls"][1]["seq"]
    rebuilt = ex.rebuild_session(session_name="r")
    assert rebuilt["replayed"] == 1 and rebuilt["failed_at"] == second
    assert rebuilt["failure"]["error_type"] == "execution"
    held = {n["name"] for n in ex.inspect_session(session_name="r")["names"]}
    assert "a" in held and "b" not in held and "c" not in held
    # Once the cause is fixed, asking again retries the whole rebuild.
    flag.write_text("2")
    again = ex.rebuild_session(session_name="r")
    assert again["replayed"] == 3 and again["failed_at"] is None
    r = ex.execute_code("a, b, c", state_mode="stateful", session_name="r")
    assert r["result"] == "(1, '2', 3)"
    assert ex.rebuild_session(session_name="r")["error_type"] == "validation"


def test_rebuild_a_bash_session_after_its_shell_exited(ex: Executor) -> None:
    ex.execute_code("cd /tmp && export MARK=7 && greet() { echo hi $1; }", language="bash",
                    state_mode="stateful", session_name="sh")
    lost = ex.execute_code("exit 3", language="bash", state_mode="stateful", session_name="sh")
    assert lost["state_lost"] is True and "rebuild_session(" in lost["suggestion"]
    rebuilt = ex.rebuild_session(language="bash", session_name="sh")
    assert rebuilt["replayed"] == 1 and rebuilt["failed_at"] is None
    r = ex.execute_code("pwd; echo $MARK; greet you", language="bash", state_mode="stateful",
                        session_name="sh")
    assert r["stdout"] == "/tmp\n7\nhi you\n"


def test_rebuild_errors_are_spec_dicts(ex: Executor) -> None:
    r = ex.rebuild_session(session_name="never")
    assert r["error_type"] == "not_found" and r["suggestion"]
    r = ex.rebuild_session(session_id=1, session_name="x")
    assert r["error_type"] == "validation"
    ex.execute_code("z = 1", state_mode="stateful", session_name="alive")
    r = ex.rebuild_session(session_name="alive")
    assert r["error_type"] == "validation" and "nothing to rebuild" in r["error"]


def test_replays_are_logged_and_counted_in_the_stats(ex: Executor) -> None:
    from coordex.log.stats import STATS_COLUMNS, summarize
    from coordex.log.store import decode_row

    ex.execute_code("q = 1", state_mode="stateful", session_name="st")
    ex.execute_code("q = 2", state_mode="read_only", session_name="st")
    ex.close_session(session_name="st")
    ex.rebuild_session(session_name="st")
    rows = [decode_row(r) for r in ex._call_log.query(f"SELECT {STATS_COLUMNS} FROM calls")]
    report = summarize(rows)
    session = next(s for s in report["sessions"] if s["session_name"] == "st")
    assert session["calls"] == 3 and session["rebuilds"] == 1
    assert session["replayed_calls"] == 1 and session["read_only_changed"] == 1



def test_stored_function_calls_are_logged(ex: Executor) -> None:
    @ex.functions.define()
    def remember(value):  # type: ignore[no-untyped-def]
        global remembered
        remembered = value
        return value

    assert ex.functions["remember"].stateful(session_name="fn")(7) == 7
    calls = ex.history(session_name="fn")["calls"]
    assert len(calls) == 1 and calls[0]["state_mode"] == "stateful" and calls[0]["outcome"] == "ok"
    ex.execute_code("after = 1", state_mode="stateful", session_name="fn")
    ex.close_session(session_name="fn")
    # In the own interpreter the arguments were live objects the log does not keep.
    rebuilt = ex.rebuild_session(session_name="fn")
    assert rebuilt["replayed"] == 0 and rebuilt["failed_at"] == calls[0]["seq"]
    assert "stored-function call" in rebuilt["failure"]["error"]


def test_a_read_only_copy_cannot_read_the_log(ex: Executor) -> None:
    ex.plan_namespace["ex"] = ex
    r = ex.execute_code("ex.history()", state_mode="read_only", session_id=0)
    assert "not readable from a read-only copy" in r["result"], r


def test_a_forked_child_logs_only_through_its_own_executor(root: Path) -> None:
    import warnings

    with Executor(root=root) as ex:
        ex.execute_code("'parent'")
        ex._call_log.flush()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads, 3.12+
            pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through its exit status
            code = 1
            try:
                # The parent's log is silent here (its runner threads did not survive the
                # fork either, so write to the log directly).
                ex._call_log.event("close", {"language": "python", "session_id": 9})
                ex._call_log.flush()
                with Executor(root=root) as own:
                    own.execute_code("'child'")
                code = 0
            finally:
                os._exit(code)
        assert os.waitpid(pid, 0)[1] == 0
        codes = [c["code"] for c in ex.history()["calls"]]
        kinds = [r["kind"] for r in ex._call_log.query("SELECT kind FROM calls")]
    assert codes == ["'parent'", "'child'"] and kinds == ["call", "call"]


def test_text_utf8_cannot_carry_costs_no_row(ex: Executor) -> None:
    ex.execute_code("s = '\udcff'", state_mode="stateful", session_name="odd")
    refused = ex.execute_code("1", state_mode="stateful", session_name="odd\ud800name")
    assert refused["error_type"] == "validation"  # a name must be text
    calls = ex.history()["calls"]
    # Python cannot compile a lone surrogate (an execution error); both rows are kept.
    assert [c["outcome"] for c in calls] == ["execution", "validation"]
    assert calls[0]["session_name"] == "odd" and "\\udcff" in calls[0]["code"]


def test_the_log_keeps_the_files_a_read_only_copy_wrote(ex: Executor, tmp_path: Path) -> None:
    from coordex.backends import isolation

    if isolation.best_mode() != "discarded":
        pytest.skip("writes are refused here, not discarded: nothing is written to list")
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    (work / "old.txt").write_text("kept")
    ex.execute_code(f"import os; os.chdir({str(work)!r})", state_mode="stateful",
                    session_name="files")
    r = ex.execute_code("open('new.txt', 'w').write('x')\nopen('sub/deep.txt', 'w').write('y')\n"
                        "import os; os.remove('old.txt')", state_mode="read_only",
                        session_name="files")
    assert r["isolation"]["files"] == "discarded", r
    rows = ex._call_log.query("SELECT changed FROM calls WHERE state_mode = 'read_only'")
    written = json.loads(rows[-1]["changed"])["written"]
    assert set(written) == {str(work / "new.txt"), str(work / "sub" / "deep.txt"),
                            str(work / "old.txt")}
    assert not (work / "new.txt").exists() and (work / "old.txt").read_text() == "kept"


def _changed(ex: Executor, seq: int) -> dict[str, Any] | None:
    row = ex._call_log.query("SELECT changed FROM calls WHERE seq = ?", [seq])[0]
    return None if row["changed"] is None else json.loads(row["changed"])


def test_the_log_keeps_the_files_a_bash_read_only_copy_wrote(ex: Executor,
                                                             tmp_path: Path) -> None:
    from coordex.backends import isolation
    from coordex.log.stats import STATS_COLUMNS, summarize
    from coordex.log.store import decode_row

    work = tmp_path / "work"
    work.mkdir()
    (work / "old.txt").write_text("kept")
    ex.execute_code(f"cd {str(work)!r}; x=1", language="bash", state_mode="stateful",
                    session_name="sh")
    wrote = ex.execute_code("echo x > data.txt; mkdir out; touch out/a; rm old.txt; "
                            "ln -s / link", language="bash", state_mode="read_only",
                            session_name="sh")
    quiet = ex.execute_code("cat old.txt", language="bash", state_mode="read_only",
                            session_name="sh")
    assert quiet["stdout"] == "kept"
    calls = ex.history(language="bash", session_name="sh")["calls"]
    assert [c["state_mode"] for c in calls] == ["stateful", "read_only", "read_only"]
    assert all(set(c) == HISTORY_KEYS for c in calls)
    assert _changed(ex, calls[2]["seq"]) is None  # it wrote nothing
    rows = [decode_row(r) for r in ex._call_log.query(f"SELECT {STATS_COLUMNS} FROM calls")]
    session = next(s for s in summarize(rows)["sessions"] if s["session_name"] == "sh")
    if isolation.best_mode() != "discarded":
        assert wrote["isolation"]["files"] != "discarded" and session["read_only_changed"] == 0
        pytest.skip("writes are refused here, not discarded: nothing is written to list")
    assert wrote["isolation"]["files"] == "discarded", wrote
    # As a Python copy lists them: absolute paths, sorted per folder, a folder with
    # files by its files; the link is listed, not followed.
    assert _changed(ex, calls[1]["seq"]) == {
        "rebound": [], "deleted": [],
        "written": [str(work / "data.txt"), str(work / "link"), str(work / "old.txt"),
                    str(work / "out" / "a")]}
    assert session["read_only_changed"] == 1
    assert sorted(os.listdir(work)) == ["old.txt"] and (work / "old.txt").read_text() == "kept"


def test_the_log_keeps_the_names_a_bash_read_only_copy_changed(ex: Executor) -> None:
    from coordex.backends import isolation
    from coordex.log.stats import STATS_COLUMNS, summarize
    from coordex.log.store import decode_row

    if isolation.best_mode() == "none":
        pytest.skip("no protected copy here: a plain subshell runs read-only bash code")
    ex.execute_code("x=1; y=1; declare -A m=([a]=1 [b]=2 [c]=3); g() { cat <<END\nhi\nEND\n}; "
                    "export -f g; alias la='ls -a'", language="bash", state_mode="stateful",
                    session_name="names")
    calls = {}
    for name, code in (("reads", "echo $x; g; cd /; echo $RANDOM $SECONDS; true | true"),
                       ("changes", "x=2; unset y; f() { :; }; alias ll=ls"),
                       ("exports", "export x; g() { :; }; unalias la"),
                       ("reads again", "echo $x")):
        r = ex.execute_code(code, language="bash", state_mode="read_only", session_name="names")
        assert "error" not in r, r
        calls[name] = ex.history(session_name="names", limit=1)["calls"][0]["seq"]
    assert _changed(ex, calls["reads"]) is None and _changed(ex, calls["reads again"]) is None
    # Variables by name, functions as name(), aliases as "alias name"; sorted.
    assert _changed(ex, calls["changes"]) == {"rebound": ["alias ll", "f()", "x"],
                                              "deleted": ["y"]}
    assert _changed(ex, calls["exports"]) == {"rebound": ["g()", "x"], "deleted": ["alias la"]}
    assert ex.execute_code("echo $x $y; type -t f ll", language="bash", state_mode="stateful",
                           session_name="names")["stdout"] == "1 1\n"
    rows = [decode_row(r) for r in ex._call_log.query(f"SELECT {STATS_COLUMNS} FROM calls")]
    session = next(s for s in summarize(rows)["sessions"] if s["session_name"] == "names")
    assert session["read_only_changed"] == 2


def test_a_bash_copy_dumps_its_state_only_when_the_names_are_wanted(tmp_path: Path) -> None:
    from coordex.backends import isolation
    from coordex.backends.base import RunRequest
    from coordex.backends.shell import ShellSession

    if isolation.best_mode() == "none":
        pytest.skip("no protected copy here: a plain subshell runs read-only bash code")
    with said(ShellSession()) as shell:
        assert "error" not in shell.run(RunRequest(code="x=1", timeout=30))
        # Off, on, on (the copy made ahead), off: a copy made for the other case is
        # called off, never used.
        for n, wanted in enumerate((False, True, True, False)):
            scratch = tmp_path / f"scratch{n}"
            scratch.mkdir()
            r = shell.run_read_only(RunRequest(code="x=2; echo $x", timeout=30,
                                               protect_paths=(".",), scratch=str(scratch),
                                               report_changes=wanted))
            assert r["stdout"] == "2\n" and "error" not in r, r
            assert callable(r.get("rebound")) == wanted, (n, r)  # asked only when wanted
            if wanted:
                assert r["rebound"]() == (["x"], [])


def test_a_bash_copy_names_are_capped_as_files_are(ex: Executor) -> None:
    from coordex.backends import isolation
    from coordex.log.calls import NAMES_LIMIT

    if isolation.best_mode() == "none":
        pytest.skip("no protected copy here: a plain subshell runs read-only bash code")
    ex.execute_code("true", language="bash", state_mode="stateful", session_name="many")
    ex.execute_code(f"for i in {{1..{NAMES_LIMIT + 5}}}; do declare v$i=1; done",
                    language="bash", state_mode="read_only", session_name="many")
    seq = ex.history(session_name="many", limit=1)["calls"][0]["seq"]
    rebound = (_changed(ex, seq) or {})["rebound"]
    assert len(rebound) == NAMES_LIMIT + 1 and rebound[-1] == "..."


def test_a_bash_copy_lists_what_it_wrote_however_it_ended(ex: Executor, tmp_path: Path) -> None:
    from coordex.backends import isolation
    from coordex.backends.isolation import WRITTEN_LIMIT

    if isolation.best_mode() != "discarded":
        pytest.skip("writes are refused here, not discarded: nothing is written to list")
    work = tmp_path / "work"
    work.mkdir()
    ex.execute_code(f"cd {str(work)!r}", language="bash", state_mode="stateful",
                    session_name="ends")
    endings = {"exit": "echo y > by-exit; exit 3",
               "traced": "set -x; echo q > by-trace",
               "trap": "trap 'echo t > by-trap' EXIT; echo z > by-code",
               "background": "(sleep 0.2; echo late > by-late) & echo now > by-now",
               "many": f"touch f{{1..{WRITTEN_LIMIT + 5}}}"}
    for name, code in endings.items():
        ex.execute_code(code, language="bash", state_mode="read_only", session_name="ends")
        seq = ex.history(session_name="ends", language="bash", limit=1)["calls"][0]["seq"]
        written = (_changed(ex, seq) or {}).get("written")
        if name == "many":
            assert written is not None and len(written) == WRITTEN_LIMIT + 1, name
            assert written[-1] == "..."
        else:
            expected = {"exit": ["by-exit"], "traced": ["by-trace"],
                        "trap": ["by-code", "by-trap"], "background": ["by-now"]}[name]
            assert written == [str(work / f) for f in expected], (name, written)
    assert os.listdir(work) == []


def test_a_bash_copy_called_off_lends_nothing_to_the_next_listing(ex: Executor,
                                                                    tmp_path: Path) -> None:
    from coordex.backends import isolation

    if isolation.best_mode() != "discarded":
        pytest.skip("writes are refused here, not discarded: nothing is written to list")
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    ex.execute_code(f"cd {str(one)!r}", language="bash", state_mode="stateful",
                    session_name="off")
    listed = []
    # Each stateful call makes the copy waiting for the next read-only call stale: it
    # is called off (after it sent its layers) and another one runs the code.
    for folder, name in ((one, "a"), (two, "b"), (two, "c")):
        ex.execute_code(f"cd {str(folder)!r}; n=1", language="bash", state_mode="stateful",
                        session_name="off")
        ex.execute_code(f"echo x > {name}", language="bash", state_mode="read_only",
                        session_name="off")
        seq = ex.history(session_name="off", language="bash", limit=1)["calls"][0]["seq"]
        listed.append((_changed(ex, seq) or {}).get("written"))
    assert listed == [[str(one / "a")], [str(two / "b")], [str(two / "c")]]


def test_history_refuses_impossible_coordinates_as_a_call_does(ex: Executor) -> None:
    for kw in ({"session_id": 2**70}, {"venv_id": 2**70}, {"language": "ruby"},
               {"session_id": 1, "session_name": "a"}, {"session_id": -1}):
        r = ex.history(**kw)  # type: ignore[arg-type]
        assert r["error_type"] == "validation", (kw, r)
        assert r["suggestion"]


# --- what a row keeps --------------------------------------------------------------------


def test_a_row_keeps_what_the_call_returned(ex: Executor) -> None:
    ok = ex.execute_code("import sys; print('to out'); print('to err', file=sys.stderr); 6 * 7",
                         state_mode="stateful", session_name="kept")
    bad = ex.execute_code("raise ValueError('no good')", state_mode="stateful",
                          session_name="kept")
    loud = ex.execute_code("print('a' * 100_000 + 'THE END')")
    seqs = [c["seq"] for c in ex.history()["calls"]]
    first = ex.history(seq=seqs[0])["call"]
    assert (first["stdout"], first["stderr"], first["result"]) == ("to out\n", "to err\n", "42")
    assert first["outcome"] == "ok" and first["session_name"] == "kept"
    assert first["changed"] == {"rebound": ["sys"], "deleted": []}
    second = ex.history(seq=seqs[1])["call"]
    assert second["outcome"] == "execution" and second["error"] == bad["error"]
    assert second["suggestion"] == bad["suggestion"] and "no good" in second["traceback"]
    third = ex.history(seq=seqs[2])["call"]
    # 16 KiB of each stream: its head and its tail, with what was left out said between.
    assert len(third["stdout"].encode()) <= 16 * 1024 and loud["stdout"].startswith("a" * 100)
    assert third["stdout"].startswith("a" * 1000) and third["stdout"].endswith("THE END\n")
    assert "left out" in third["stdout"]
    # SPEC 11: everything the call returned, empty streams as returned, not None.
    assert (loud["stderr"], third["stderr"]) == ("", "")
    assert (bad["stdout"], second["stdout"], second["stderr"]) == ("", "", "")
    missing = ex.history(seq=10_000)
    assert missing["error_type"] == "not_found" and "history()" in missing["suggestion"]
    assert ex.history(seq="1")["error_type"] == "validation"
    assert ok["result"] == "42"


def test_changed_holds_only_what_the_code_did(tmp_path: Path) -> None:
    from coordex.backends import isolation

    home = tmp_path / "home"
    root = home / ".local" / "share" / "coordex"  # the default root lies under HOME
    with Executor(root=root, read_only_paths=[".", str(home)]) as ex:
        ex.execute_code("x = [1]", state_mode="stateful", session_name="c")
        ex.execute_code("x", state_mode="stateful", session_name="c")  # binds `_` only
        ex.execute_code("len(x)", state_mode="read_only", session_name="c")
        ex.execute_code("x.append(2); y = 3", state_mode="read_only", session_name="c")
        calls = ex.history()["calls"]
        changed = [ex.history(seq=c["seq"])["call"]["changed"] for c in calls]
    assert changed[0] == {"rebound": ["x"], "deleted": []}
    assert changed[1] is None and changed[2] is None
    assert changed[3]["rebound"] == ["y"]
    if isolation.best_mode() == "discarded":
        assert "written" not in changed[3], changed[3]  # never coordex's own log files
