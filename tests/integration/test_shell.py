"""The bash backend against a real bash: what a user of a kept shell relies on."""

from __future__ import annotations

import os
import signal
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordex.backends.base import INTERRUPT_GRACE, RunRequest
from coordex.backends.shell import ShellPlace, ShellSession
from tests.conftest import cpu_seconds
from tests.said import said

pytestmark = pytest.mark.timeout(60)


def req(code: str, timeout: float = 20.0, **kwargs: object) -> RunRequest:
    return RunRequest(code=code, timeout=timeout, **kwargs)  # type: ignore[arg-type]


def live_group_members(pgid: int) -> list[int]:
    """Pids of non-zombie processes in process group ``pgid``."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(b")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != b"Z":
            members.append(int(entry))
    return members


def process_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return False
    return state != b"Z"


@pytest.fixture
def session() -> Iterator[ShellSession]:
    shell = said(ShellSession())
    try:
        yield shell
    finally:
        shell.close()


def ok(outcome: dict[str, object]) -> dict[str, object]:
    assert "error" not in outcome, outcome
    return outcome


# -- stateful persistence --------------------------------------------------------------


def test_state_persists_across_calls(session: ShellSession, tmp_path: Path) -> None:
    ok(session.run(req(
        f"cd {tmp_path}; plain=1; export exported=2; greet() {{ echo hi $1; }}; "
        "alias ll='echo aliased'; shopt -s extglob; set -o noclobber"
    )))
    out = ok(session.run(req(
        'pwd; echo "$plain $exported"; greet you; ll; shopt -q extglob && echo ext; '
        "[[ -o noclobber ]] && echo noclob; bash -c 'echo child:$plain:$exported'"
    )))
    assert out["stdout"] == (
        f"{tmp_path}\n1 2\nhi you\naliased\next\nnoclob\nchild::2\n"
    )


def test_alias_defined_in_one_call_expands_in_the_next(session: ShellSession) -> None:
    ok(session.run(req("alias greet='echo from-alias'")))
    assert ok(session.run(req("greet"))) ["stdout"] == "from-alias\n"


def test_stdout_and_stderr_are_separate(session: ShellSession) -> None:
    out = ok(session.run(req("echo to-out; echo to-err >&2; echo again")))
    assert out["stdout"] == "to-out\nagain\n"
    assert out["stderr"] == "to-err\n"
    assert out["result"] is None and out["images"] == [] and out["truncated"] is False


def test_exit_status_is_reported_not_an_error(session: ShellSession) -> None:
    assert ok(session.run(req("false")))["exit_code"] == 1
    assert ok(session.run(req("(exit 42)")))["exit_code"] == 42
    assert ok(session.run(req("true")))["exit_code"] == 0
    syntax = ok(session.run(req("echo 'unterminated")))
    assert syntax["exit_code"] == 2 and "unexpected EOF" in str(syntax["stderr"])
    assert ok(session.run(req("echo still-here")))["stdout"] == "still-here\n"


def test_output_without_trailing_newline_is_kept_exactly(session: ShellSession) -> None:
    out = ok(session.run(req("printf abc; printf xyz >&2")))
    assert (out["stdout"], out["stderr"]) == ("abc", "xyz")
    assert ok(session.run(req("printf ''")))["stdout"] == ""


def test_unicode_and_invalid_utf8_never_crash(session: ShellSession) -> None:
    out = ok(session.run(req("echo 'héllo — 世界 🎉'; printf '\\xff\\xfe\\x00ok\\n'")))
    assert str(out["stdout"]).startswith("héllo — 世界 🎉\n")
    assert "\ufffd" in str(out["stdout"]) and str(out["stdout"]).endswith("ok\n")
    binary = ok(session.run(req("head -c 100000 /dev/urandom")))
    assert isinstance(binary["stdout"], str)


def test_huge_output_is_truncated_with_bounded_memory(session: ShellSession) -> None:
    tracemalloc.start()
    try:
        out = ok(session.run(req("yes 0123456789 | head -c 30000000; echo END", output_limit=4000)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out["truncated"] is True
    stdout = str(out["stdout"])
    assert stdout.startswith("0123456789\n") and stdout.endswith("END\n")
    assert len(stdout) < 4200
    assert peak < 5_000_000  # 30 MB went through; far less was ever held


def test_commands_reading_stdin_get_eof_at_once(session: ShellSession) -> None:
    start = time.monotonic()
    out = ok(session.run(req("cat; read line; echo status=$?; python3 -c 'input()' 2>&1 | tail -1",
                             timeout=10)))
    assert time.monotonic() - start < 5
    assert "status=1" in str(out["stdout"]) and "EOFError" in str(out["stdout"])


def test_pagers_never_take_over(session: ShellSession) -> None:
    out = ok(session.run(req('echo "$PAGER $GIT_PAGER $TERM"')))
    assert out["stdout"] == "cat cat dumb\n"


def test_background_job_does_not_block_and_is_reaped_on_close() -> None:
    shell = said(ShellSession())
    try:
        start = time.monotonic()
        out = ok(shell.run(req("sleep 100 & echo started $!")))
        assert time.monotonic() - start < 5
        bg_pid = int(str(out["stdout"]).split()[1])
        assert "[1]" not in str(out["stderr"])  # no interactive job notice
        assert ok(shell.run(req("echo next")))["stdout"] == "next\n"
        assert process_alive(bg_pid)
    finally:
        shell.close()
    # SIGKILL was sent before close() returned; the kernel may take a moment under load.
    deadline = time.monotonic() + 2
    while process_alive(bg_pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not process_alive(bg_pid)


def test_xtrace_shows_only_the_users_commands(session: ShellSession) -> None:
    ok(session.run(req("set -x")))
    out = ok(session.run(req("echo traced")))
    assert "traced" in str(out["stderr"]) and "coordex" not in str(out["stderr"])
    assert "builtin" not in str(out["stderr"])


def test_a_shell_under_errexit_lives_on_between_calls(session: ShellSession) -> None:
    # After its record the runner tries stdin a moment before bash sleeps (``read -t
    # 0``, failing until a line comes): under ``set -e`` the shell lives on through it.
    ok(session.run(req("set -e; kept=yes")))
    for _ in range(3):
        ok(session.run(req("true")))
        time.sleep(0.05)  # past the moment the runner waits for the next line
    out = ok(session.run(req('echo "$kept $-"')))
    assert str(out["stdout"]).startswith("yes ") and "e" in str(out["stdout"]).split()[1]
    ok(session.run(req("unset -f $(compgen -A function)")))  # ours too: no more tries
    time.sleep(0.05)
    assert ok(session.run(req("echo $kept")))["stdout"] == "yes\n"


def test_a_debug_trap_runs_for_the_code_not_for_the_wait_after_it(
        session: ShellSession) -> None:
    # The runner's tries of stdin after a call are a function's: a DEBUG trap the code
    # set (a command log, a preexec hook) runs once for them, not hundreds of times.
    ok(session.run(req("n=0; trap 'n=$((n + 1))' DEBUG")))
    ok(session.run(req("n=0")))
    for _ in range(3):
        ok(session.run(req("true")))
        time.sleep(0.05)  # past the moment the runner waits for the next line
    count = int(str(ok(session.run(req("echo $n")))["stdout"]))
    assert 0 < count < 60, count


@pytest.mark.parametrize("word", ["case", "for", "do", "done"])
def test_an_alias_named_like_a_reserved_word_leaves_later_calls_working(
        session: ShellSession, word: str) -> None:
    # Bash expands an alias of a reserved word where a command starts: the runner's own
    # words are parsed once, before any code ran, so such an alias breaks no call.
    ok(session.run(req(f"kept=yes; alias {word}='echo aliased;'")))
    assert ok(session.run(req('echo "$kept"')))["stdout"] == "yes\n"
    assert ok(session.run(req(f"unalias {word}; echo two")))["stdout"] == "two\n"


def test_a_timeout_in_a_shell_that_aliased_case_keeps_its_state(session: ShellSession) -> None:
    # The sync line queued behind the interrupt uses no word the code could alias: the
    # shell answers it, and keeps what it held.
    ok(session.run(req("kept=yes; alias case='echo aliased;'")))
    r = session.run(req("sleep 10", timeout=0.5))
    assert r["error"]["error_type"] == "timeout" and r["error"]["state_lost"] is False, r
    assert ok(session.run(req('echo "$kept"')))["stdout"] == "yes\n"


def test_disabling_the_printf_builtin_keeps_calls_answering(session: ShellSession) -> None:
    # The runner prints the call's record with printf; with printf disabled (``enable
    # -n printf``, for the coreutils one) the record stays in PS1, and bash prints it.
    ok(session.run(req("kept=yes; enable -n printf")))
    out = ok(session.run(req('echo "$kept"; printf "%s\\n" external', timeout=5.0)))
    assert out["stdout"] == "yes\nexternal\n"
    ok(session.run(req("enable printf")))


def test_a_dump_of_the_state_holds_the_users_functions_not_ours(
        session: ShellSession, tmp_path: Path) -> None:
    # Snapshots, checkpoints and read-only copies restore this dump into a shell whose
    # own setup made the runner's names: the dump keeps only the user's.
    from coordex.backends.shell import copies

    target = tmp_path / "state"
    ok(session.run(req("greet() { echo hi; }; mine=1")))
    ok(session.run(req(copies.dump_state(str(target), options="opts", reset=":",
                                         after=""))))
    state = target.read_text()
    assert "greet ()" in state and "mine=" in state
    assert "__coordex_wait ()" not in state and "__coordex_i=" not in state


def test_an_idle_shell_sleeps(session: ShellSession) -> None:
    # Back-to-back calls find bash still trying its stdin; between calls it takes no
    # CPU. A shell still trying would take about a second of it here.
    for _ in range(20):
        ok(session.run(req("x=1")))
    before = cpu_seconds(session.pid)
    time.sleep(1.0)
    assert cpu_seconds(session.pid) - before < 0.1
    assert ok(session.run(req("echo $x")))["stdout"] == "1\n"


def test_verbose_and_alias_options_persist_like_any_other(session: ShellSession) -> None:
    ok(session.run(req("set -v")))
    out = ok(session.run(req("echo one\necho two")))
    assert out["stderr"] == "echo one\necho two\n"  # the user's lines, none of ours
    ok(session.run(req("set +v")))
    assert ok(session.run(req("echo quiet")))["stderr"] == ""
    ok(session.run(req("alias hi='echo aliased'; shopt -u expand_aliases")))
    assert "command not found" in str(ok(session.run(req("hi")))["stderr"])
    ok(session.run(req("shopt -s expand_aliases")))
    assert ok(session.run(req("hi")))["stdout"] == "aliased\n"


def test_job_table_and_return_behave_as_in_a_sourced_script(session: ShellSession) -> None:
    out = ok(session.run(req("sleep 0.01; /bin/true; sleep 100 & jobs; kill %1; wait; echo done")))
    assert out["stdout"].startswith("[1]+  Running") and out["stdout"].endswith("done\n")
    assert out["stdout"].count("\n") == 2  # finished foreground commands are not jobs
    out = ok(session.run(req("echo before; return 4; echo never")))
    assert (out["stdout"], out["exit_code"]) == ("before\n", 4)


def test_commands_see_only_their_three_standard_fds(session: ShellSession) -> None:
    out = ok(session.run(req("ls /proc/self/fd")))
    assert str(out["stdout"]).split() == ["0", "1", "2", "3"]  # 3: ls's own listing


def test_bash_itself_holds_no_descriptor_of_ours(session: ShellSession) -> None:
    # Its runner is read by the path of our descriptor, its outputs opened per call: an
    # fd of ours in bash would cost every call a redirection to close it for the code.
    # (While it prints a record, bash holds its own copy of its fd 1 a moment: the
    # record's redirection to fd 2. Between calls it holds nothing else.)
    deadline = time.monotonic() + 5
    while True:
        fds = sorted(int(fd) for fd in os.listdir(f"/proc/{session.pid}/fd"))
        fds = [fd for fd in fds if fd != 255]  # 255: bash's own (interactive)
        if fds == [0, 1, 2] or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert fds == [0, 1, 2]
    assert ok(session.run(req("echo $((6 * 7))")))["stdout"] == "42\n"


def test_an_interrupt_keeps_the_users_stderr_exactly(session: ShellSession) -> None:
    out = session.run(req("echo err >&2; sleep 30", timeout=0.3))
    assert out["error"]["error_type"] == "timeout" and out["stderr"] == "err\n"


def test_timeout_before_bash_has_read_a_large_call_keeps_state(session: ShellSession,
                                                                tmp_path: Path) -> None:
    # The interrupt waits until bash has the whole line; none of the call may run later.
    ok(session.run(req("kept=1")))
    filler = ": padding-padding-padding; " * 40000
    out = session.run(req(f"sleep 30; {filler} echo tail > {tmp_path}/ran", timeout=0.01))
    assert out["error"]["error_type"] == "timeout" and out["error"]["state_lost"] is False
    assert ok(session.run(req("echo $kept")))["stdout"] == "1\n"
    assert not (tmp_path / "ran").exists()


def test_large_code_and_nul_bytes(session: ShellSession) -> None:
    code = "".join(f"v{i}={i}\n" for i in range(30000)) + "echo $v29999"
    assert len(code) > 200_000
    assert ok(session.run(req(code)))["stdout"] == "29999\n"
    assert ok(session.run(req("echo a\0b")))["stdout"] == "ab\n"


# -- timeouts --------------------------------------------------------------------------


def test_timeout_interrupts_and_keeps_state(session: ShellSession) -> None:
    ok(session.run(req("kept=yes; cd /")))
    start = time.monotonic()
    out = session.run(req("echo before; sleep 30; echo never", timeout=0.5))
    assert time.monotonic() - start < 0.5 + INTERRUPT_GRACE
    error = out["error"]
    assert error["error_type"] == "timeout" and error["state_lost"] is False
    assert "survived" in error["suggestion"]
    assert error["stdout"] == "before\n" and out["stdout"] == "before\n"
    assert "state_lost" not in out
    assert ok(session.run(req('echo "$kept $PWD"')))["stdout"] == "yes /\n"


def test_timeout_of_a_pure_bash_loop_keeps_state(session: ShellSession) -> None:
    ok(session.run(req("kept=1")))
    out = session.run(req("while :; do :; done", timeout=0.3))
    assert out["error"]["error_type"] == "timeout" and out["error"]["state_lost"] is False
    assert ok(session.run(req("echo $kept")))["stdout"] == "1\n"


def test_command_ignoring_sigint_is_killed_and_state_lost(session: ShellSession) -> None:
    ok(session.run(req("kept=1")))
    old_pid = session.pid
    start = time.monotonic()
    out = session.run(req("trap '' INT; sleep 100", timeout=0.3))
    assert time.monotonic() - start < 0.3 + INTERRUPT_GRACE + 3
    assert out["error"]["error_type"] == "timeout" and out["error"]["state_lost"] is True
    assert out["state_lost"] is True and "lost" in out["error"]["suggestion"]
    assert live_group_members(old_pid) == []
    after = ok(session.run(req('echo "kept=$kept"')))
    assert after["stdout"] == "kept=\n" and "state_lost" not in after  # already reported
    assert session.pid != old_pid


# -- the shell ending -----------------------------------------------------------------


def test_exit_ends_the_shell_without_retry_and_next_call_is_fresh(session: ShellSession) -> None:
    ok(session.run(req("kept=1; sleep 100 &")))
    old_pid = session.pid
    out = session.run(req("echo bye; exit 3; echo never"))
    assert "error" not in out
    assert out["exit_code"] == 3 and out["state_lost"] is True and out["stdout"] == "bye\n"
    assert live_group_members(old_pid) == []  # the background sleep went with it
    after = ok(session.run(req('echo "kept=$kept"')))
    assert after["stdout"] == "kept=\n" and "state_lost" not in after


def test_shell_killed_by_a_signal_is_crashed(session: ShellSession) -> None:
    out = session.run(req("kill -9 $$"))
    assert out["error"]["error_type"] == "crashed" and out["error"]["state_lost"] is True
    assert "SIGKILL" in out["error"]["error"] and out["state_lost"] is True
    assert ok(session.run(req("echo fresh")))["stdout"] == "fresh\n"


def test_shell_found_dead_is_replaced_and_the_call_runs(session: ShellSession) -> None:
    ok(session.run(req("kept=1")))
    os.kill(session.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while session.alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not session.alive()
    out = ok(session.run(req('echo "kept=$kept"')))
    assert out["stdout"] == "kept=\n" and out["state_lost"] is True
    assert session.alive()


# -- read-only ------------------------------------------------------------------------


def test_read_only_sees_the_session_and_changes_nothing(session: ShellSession,
                                                        tmp_path: Path) -> None:
    ok(session.run(req(f"cd {tmp_path}; v=orig; f() {{ echo f-orig; }}; alias a='echo a-orig'")))
    out = ok(session.run_read_only(req(
        'echo "$v $PWD"; f; a\n'
        "cd /; v=changed; export NEWVAR=1; f() { echo f-new; }; alias a='echo a-new'; "
        "alias b='echo b'; unset -f f; shopt -s extglob; set -o noclobber; echo done; exit 7"
    )))
    assert out["stdout"] == f"orig {tmp_path}\nf-orig\na-orig\ndone\n"
    assert out["exit_code"] == 7
    assert out["isolation"] == {"names": True, "objects": True, "files": "none", "copy": "fork"}
    after = ok(session.run(req(
        'echo "$v $PWD ${NEWVAR-unset}"; f; a; type b >/dev/null 2>&1 || echo no-b; '
        "shopt -q extglob || echo no-ext; [[ -o noclobber ]] || echo no-noclob"
    )))
    assert after["stdout"] == f"orig {tmp_path} unset\nf-orig\na-orig\nno-b\nno-ext\nno-noclob\n"
    assert "state_lost" not in after


def test_read_only_timeout_keeps_the_session(session: ShellSession) -> None:
    ok(session.run(req("kept=1")))
    out = session.run_read_only(req("kept=2; sleep 30", timeout=0.3))
    assert out["error"]["error_type"] == "timeout" and out["error"]["state_lost"] is False
    assert out["isolation"]["names"] is True
    assert ok(session.run(req("echo $kept")))["stdout"] == "1\n"


def test_read_only_command_is_a_wrappable_seam(session: ShellSession) -> None:
    command = session.read_only_command("echo 'it''s'")
    assert command.startswith("(") and command.endswith(")")
    assert ok(session.run(req(command)))["stdout"] == "its\n"


# -- inspect ----------------------------------------------------------------------------


def test_inspect_shows_only_what_the_session_added(tmp_path: Path) -> None:
    env = {**os.environ, "INHERITED": "1", "CHANGED": "before"}
    with said(ShellSession(env=env, cwd=str(tmp_path))) as shell:
        empty = shell.inspect()
        assert empty == {"cwd": str(tmp_path), "variables": {}, "functions": [], "aliases": {}}
        ok(shell.run(req(
            "mine=1; export exp=two; CHANGED=after; arr=(a b); greet() { :; }; "
            "alias ll='ls -l'; cd /; [[ x =~ x ]]"
        )))
        seen = shell.inspect()
    assert seen["cwd"] == "/"
    assert seen["variables"] == {"mine": "1", "exp": "two", "CHANGED": "after",
                                 "arr": '([0]="a" [1]="b")'}
    assert seen["functions"] == ["greet"]
    assert seen["aliases"] == {"ll": "ls -l"}


def test_inspect_changes_nothing(session: ShellSession) -> None:
    ok(session.run(req("set -u; x=1; (exit 5)")))
    first = session.inspect()
    second = session.inspect()
    assert first == second
    after = ok(session.run(req('echo "$x $-"; echo ${undefined_var}')))
    assert str(after["stdout"]).startswith("1 ") and "u" in str(after["stdout"]).split()[1]
    assert "unbound variable" in str(after["stderr"])


# -- stateless ------------------------------------------------------------------------


def test_stateless_sees_nothing_of_a_session_and_leaves_nothing(session: ShellSession,
                                                                tmp_path: Path) -> None:
    ok(session.run(req("secret=1; f() { :; }; alias z=ls; export SECRET_EXPORTED=1")))
    marker = tmp_path / "pid"
    out = ok(said(ShellPlace(cwd=str(tmp_path))).run_stateless(req(
        f'echo "[$secret][${{SECRET_EXPORTED-}}]"; type f z 2>&1 | wc -l; '
        f"sleep 100 & echo $$ > {marker}")))
    assert str(out["stdout"]).startswith("[][]\n")
    assert live_group_members(int(marker.read_text())) == []
    assert "state_lost" not in out


def test_stateless_timeout_and_env(tmp_path: Path) -> None:
    place = said(ShellPlace(env={"PATH": os.environ["PATH"], "ONLY_HERE": "yes"},
                            cwd=str(tmp_path)))
    out = place.run_stateless(req("echo $ONLY_HERE; pwd; sleep 30", timeout=0.3))
    assert out["error"]["error_type"] == "timeout"
    assert out["stdout"] == f"yes\n{tmp_path}\n"


# -- processes, threads, streaming ------------------------------------------------------


def test_close_leaves_no_process_and_is_idempotent() -> None:
    shell = said(ShellSession())
    ok(shell.run(req("sleep 100 & (trap '' TERM; sleep 100) & disown; true")))
    pid = shell.pid
    assert len(live_group_members(pid)) >= 3
    shell.close()
    shell.close()
    assert live_group_members(pid) == []
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped, not a zombie
    assert shell.alive() is False
    assert shell.run(req("true"))["error"]["error_type"] == "crashed"


def test_close_from_another_thread_ends_a_running_call() -> None:
    shell = said(ShellSession())
    results: list[dict[str, object]] = []
    worker = threading.Thread(target=lambda: results.append(shell.run(req("sleep 30"))))
    worker.start()
    time.sleep(0.3)
    start = time.monotonic()
    shell.close()
    worker.join(10)
    assert not worker.is_alive() and time.monotonic() - start < 5
    assert results[0]["error"]["error_type"] == "crashed"  # type: ignore[index]


def test_sessions_run_in_parallel_and_one_session_serialises() -> None:
    with said(ShellSession()) as a, said(ShellSession()) as b:
        start = time.monotonic()
        threads = [threading.Thread(target=s.run, args=(req("sleep 1"),)) for s in (a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert time.monotonic() - start < 1.8
        outs: list[dict[str, object]] = []
        count = req("n=$((${n:-0}+1)); sleep 0.2; echo $n")
        threads = [threading.Thread(target=lambda: outs.append(a.run(count)))
                   for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(str(o["stdout"]) for o in outs) == ["1\n", "2\n", "3\n"]


def test_on_output_receives_chunks_before_the_call_returns(session: ShellSession) -> None:
    chunks: list[tuple[float, str, str]] = []

    def on_output(stream: str, text: str) -> None:
        chunks.append((time.monotonic(), stream, text))

    out = ok(session.run(req("echo first; echo err >&2; sleep 1; echo second",
                             on_output=on_output)))
    returned = time.monotonic()
    assert ("stdout", "first\n") in [(s, t) for _, s, t in chunks]
    assert ("stderr", "err\n") in [(s, t) for _, s, t in chunks]
    first_at = next(at for at, _, text in chunks if "first" in text)
    assert returned - first_at > 0.5
    assert "".join(t for _, s, t in chunks if s == "stdout") == out["stdout"]


def test_a_broken_on_output_callback_does_not_break_the_call(session: ShellSession) -> None:
    def broken(stream: str, text: str) -> None:
        raise RuntimeError("callback bug")

    assert ok(session.run(req("echo fine", on_output=broken)))["stdout"] == "fine\n"


def test_a_restored_snapshot_keeps_the_shells_own_go_record(tmp_path: Path) -> None:
    # A snapshot holds the old shell's private variables; the "go" text carries its
    # token. Restored as it was, the new shell's calls would say "go" in a token the
    # host does not read, and a call that kills the shell would pass for one that
    # never started (and be run again).
    source, target = ShellSession(), ShellSession()
    try:
        source.start_snapshot(str(tmp_path), attempt=1, through=1, max_bytes=10**7,
                              identity={})
        target.restore_snapshot(str(tmp_path), [], 10.0)
        ran = target.run(req("kill -9 $$"))
        assert getattr(ran.event, "started", None) is True, ran.event
    finally:
        source.close()
        target.close()
