"""SPEC 15: a bash session is forked as a process (a subshell of its shell serving the
same record wire), so the fork carries all the shell holds - open fds included - and is
owned and ended like every process coordex starts."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from coordex import Executor
from tests.conftest import alive

BASH = {"language": "bash", "state_mode": "stateful"}


def _gone(pid: int, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not alive(pid)


def test_a_fork_carries_variables_functions_cwd_and_an_open_fd(tmp_path: Path) -> None:
    log = tmp_path / "fd3.txt"
    with Executor(root=tmp_path / "home") as ex:
        ex.execute_code(f"x=41; declare -a rows=(b a); f() {{ echo \"f $x\"; }}; "
                        f"alias ll='echo listed'; shopt -s extglob; cd {tmp_path}; "
                        f"exec 3>{log}; hidden=not-exported",
                        session_name="src", **BASH)
        forked = ex.fork_session(session_name="src", language="bash", new_name="trial")
        assert forked["copy"] == "process" and forked["left_out"] == []
        assert forked["ms"] < 1000
        shown = ex.execute_code("echo $x ${rows[1]} $hidden; f; ll; shopt -q extglob && "
                                "echo extglob; pwd; echo from-fork >&3",
                                session_name="trial", **BASH)
        assert shown["stdout"] == f"41 a not-exported\nf 41\nlisted\nextglob\n{tmp_path}\n"
        # The fork writes through the same open file description as the source's fd 3.
        assert log.read_text() == "from-fork\n"
        ex.execute_code("x=99; unset -f f; cd /; exec 3>&-", session_name="trial", **BASH)
        src = ex.execute_code("echo $x; f; pwd; echo from-source >&3", session_name="src",
                              **BASH)
        assert src["stdout"] == f"41\nf 41\n{tmp_path}\n" and src["exit_code"] == 0
        assert log.read_text() == "from-fork\nfrom-source\n"


def test_a_forks_break_continue_and_timeout_keep_it_answering(tmp_path: Path) -> None:
    with Executor(root=tmp_path / "home") as ex:
        ex.execute_code("n=1", session_name="src", **BASH)
        ex.fork_session(session_name="src", language="bash", new_name="f")
        for code in ("for i in 1 2; do :; done; break; echo no",
                     "continue; echo no"):
            r = ex.execute_code(code, session_name="f", **BASH)
            assert r["stdout"] == "" and r["exit_code"] == 0, r
        r = ex.execute_code("n=2; while :; do :; done", session_name="f", timeout=1, **BASH)
        assert r["error_type"] == "timeout" and r["state_lost"] is False, r
        r = ex.execute_code("sleep 30; echo not-reached", session_name="f", timeout=1, **BASH)
        assert r["error_type"] == "timeout" and r["stdout"] == "", r
        assert ex.execute_code("echo $n", session_name="f", **BASH)["stdout"] == "2\n"


def test_a_fork_is_ended_on_close_even_after_its_source(tmp_path: Path) -> None:
    ex = Executor(root=tmp_path / "home")
    try:
        ex.execute_code("sleep 300 &", session_name="src", **BASH)
        ex.fork_session(session_name="src", language="bash", new_name="f")
        pid = int(ex.execute_code("sleep 301 & echo $BASHPID", session_name="f",
                                  **BASH)["stdout"])
        job = int(ex.execute_code("echo $!", session_name="f", **BASH)["stdout"])
        ex.close_session(session_name="src", language="bash")  # the fork lives on
        assert ex.execute_code("echo alive", session_name="f", **BASH)["stdout"] == "alive\n"
        assert alive(pid) and alive(job)
        ex.fork_session(session_name="f", language="bash", new_name="g")
        grand = int(ex.execute_code("echo $BASHPID", session_name="g", **BASH)["stdout"])
        ex.close_session(session_name="f", language="bash")
        assert _gone(pid) and _gone(job)  # its own group ends with it
        assert alive(grand)
    finally:
        ex.close()
    assert _gone(grand)
    members = [p for p in os.listdir("/proc") if p.isdigit() and alive(int(p))]
    assert str(pid) not in members and str(grand) not in members


HOST = r"""
import sys, time
from coordex import Executor
from tests.conftest import alive
ex = Executor(root=sys.argv[1])
bash = {"language": "bash", "state_mode": "stateful"}
ex.execute_code("x=1", session_name="src", **bash)
ex.fork_session(session_name="src", language="bash", new_name="f")
out = ex.execute_code("sleep 300 & echo $BASHPID $!", session_name="f", **bash)["stdout"]
ex.close_session(session_name="src", language="bash")
open(sys.argv[2], "w").write(out)
time.sleep(600)
"""


def test_a_fork_ends_when_the_host_dies_after_its_source_closed(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    report = tmp_path / "pids"
    host = subprocess.Popen([sys.executable, "-c", HOST, str(tmp_path / "home"), str(report)])
    try:
        deadline = time.monotonic() + 60
        while not report.exists() or not report.read_text():
            assert host.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        pids = [int(p) for p in report.read_text().split()]
        assert all(alive(p) for p in pids)
        host.send_signal(signal.SIGKILL)
        host.wait(10)
        assert all(_gone(p, 10) for p in pids), pids
    finally:
        if host.poll() is None:
            host.kill()
            host.wait()


def test_set_e_ends_a_forks_shell_as_it_ends_the_sources(tmp_path: Path) -> None:
    with Executor(root=tmp_path / "home") as ex:
        ex.execute_code("v=1", session_name="src", **BASH)
        ex.fork_session(session_name="src", language="bash", new_name="f")
        r = ex.execute_code("set -e; false; echo not-reached", session_name="f", **BASH)
        assert r["stdout"] == "" and r["exit_code"] == 1, r
        assert ex.execute_code("echo ${v-gone}", session_name="f", **BASH)["stdout"] == \
            "gone\n"  # a fresh shell took its place, as for the source
        assert ex.execute_code("echo $v", session_name="src", **BASH)["stdout"] == "1\n"


def test_a_fork_under_set_e_lives_on_between_calls(tmp_path: Path) -> None:
    # A fork's loop evals the runner, whose wait for the next line ends with a failed
    # try when none came: neither set -e nor an ERR trap may see that as the user's.
    log = tmp_path / "err.log"
    with Executor(root=tmp_path / "home") as ex:
        ex.execute_code("kept=yes", session_name="src", **BASH)
        ex.fork_session(session_name="src", language="bash", new_name="f")
        ex.execute_code(f"trap 'echo ERR >> {log}' ERR", session_name="f", **BASH)
        r = ex.execute_code("set -e; echo set", session_name="f", **BASH)
        assert r["stdout"] == "set\n" and r["exit_code"] == 0, r
        for _ in range(3):
            time.sleep(0.05)  # past the moment the runner waits for the next line
            assert ex.execute_code("true", session_name="f", **BASH)["exit_code"] == 0
        r = ex.execute_code('echo "${kept-gone} $-"', session_name="f", **BASH)
        assert str(r["stdout"]).startswith("yes ") and "e" in str(r["stdout"]).split()[1], r
        assert not log.exists() or log.read_text() == "", log.read_text()


def test_a_shell_that_aliased_case_forks_as_a_process(tmp_path: Path) -> None:
    with Executor(root=tmp_path / "home") as ex:
        ex.execute_code("kept=yes; alias case='echo aliased;'", session_name="src", **BASH)
        forked = ex.fork_session(session_name="src", language="bash", new_name="f")
        assert forked["copy"] == "process" and forked["ms"] < 5000, forked
        assert ex.execute_code('echo "$kept"', session_name="f", **BASH)["stdout"] == "yes\n"


# Every reserved word a fork's loop or its setup line is made of, aliased by the code.
_RESERVED = ("while", "do", "done", "if", "then", "fi", "[[", "for", "case", "esac")


@pytest.mark.parametrize("where", ["source", "fork"])
def test_a_fork_whose_code_aliased_reserved_words_keeps_its_state_at_a_timeout(
        tmp_path: Path, where: str) -> None:
    aliases = "; ".join(f"alias {word}='echo aliased;'" for word in _RESERVED)
    with Executor(root=tmp_path / "home") as ex:
        ex.execute_code("kept=yes; alias hi='echo hello'"
                        + (f"; {aliases}" if where == "source" else ""),
                        session_name="src", **BASH)
        forked = ex.fork_session(session_name="src", language="bash", new_name="f")
        assert forked["copy"] == "process", forked
        if where == "fork":
            ex.execute_code(aliases, session_name="f", **BASH)
        r = ex.execute_code("n=2; sleep 30", session_name="f", timeout=1, **BASH)
        assert r["error_type"] == "timeout" and r["state_lost"] is False, r
        r = ex.execute_code('echo "$kept $n"; hi; type -t while', session_name="f", **BASH)
        assert r["stdout"] == "yes 2\nhello\nalias\n", r


def test_a_fork_keeps_alias_expansion_off_where_its_source_turned_it_off(
        tmp_path: Path) -> None:
    with Executor(root=tmp_path / "home") as ex:
        ex.execute_code("shopt -u expand_aliases; alias hi='echo aliased'", session_name="src",
                        **BASH)
        assert ex.fork_session(session_name="src", language="bash",
                               new_name="f")["copy"] == "process"
        r = ex.execute_code("shopt -q expand_aliases || echo off; hi", session_name="f", **BASH)
        assert r["stdout"] == "off\n" and r["exit_code"] == 127, r
        # And after an interrupt, which parses the loop again.
        r = ex.execute_code("sleep 30", session_name="f", timeout=1, **BASH)
        assert r["error_type"] == "timeout" and r["state_lost"] is False, r
        r = ex.execute_code("shopt -q expand_aliases || echo off; hi", session_name="f", **BASH)
        assert r["stdout"] == "off\n" and r["exit_code"] == 127, r


def test_a_forks_alias_expansion_holds_against_its_ifs_a_break_and_a_fork_of_it(
        tmp_path: Path) -> None:
    asked = "shopt -q expand_aliases && echo on; hi"
    with Executor(root=tmp_path / "home") as ex:
        # An IFS holding letters of our names, and -e: nothing of ours may split or fail.
        ex.execute_code("alias hi='echo hello'; IFS=_; exec 3>/dev/null", session_name="src",
                        **BASH)
        ex.execute_code("set -e", session_name="src", **BASH)
        forked = ex.fork_session(session_name="src", language="bash", new_name="f")
        assert forked["copy"] == "process", forked
        ex.execute_code("set +e", session_name="f", **BASH)
        r = ex.execute_code("sleep 30", session_name="f", timeout=1, **BASH)
        assert r["error_type"] == "timeout" and r["state_lost"] is False, r
        assert ex.execute_code(asked, session_name="f", **BASH)["stdout"] == "on\nhello\n"
        # Forked again just after a top-level break, which starts the loop again.
        assert ex.execute_code("break", session_name="f", **BASH)["exit_code"] == 0
        assert ex.fork_session(session_name="f", language="bash",
                               new_name="g")["copy"] == "process"
        for name in ("f", "g"):
            r = ex.execute_code(asked + "; echo fd >&3", session_name=name, **BASH)
            assert r["stdout"] == "on\nhello\n" and r["exit_code"] == 0, (name, r)


def test_a_fork_under_set_e_keeps_its_state_through_a_timeout(tmp_path: Path) -> None:
    with Executor(root=tmp_path / "home") as ex:
        ex.execute_code("kept=yes", session_name="src", **BASH)
        ex.fork_session(session_name="src", language="bash", new_name="f")
        ex.execute_code("set -e", session_name="f", **BASH)
        for code in ("sleep 30", "while :; do :; done"):  # a command killed; a builtin loop
            r = ex.execute_code(code, session_name="f", timeout=1, **BASH)
            assert r["error_type"] == "timeout" and r["state_lost"] is False, r
            r = ex.execute_code('echo "$kept $-"', session_name="f", **BASH)
            assert r["stdout"].startswith("yes ") and "e" in r["stdout"].split()[1], r
        r = ex.execute_code("false; echo not-reached", session_name="f", **BASH)
        assert r["stdout"] == "" and r["state_lost"] is True, r  # -e still ends it


def test_a_timeout_leaves_a_forks_set_e_as_the_code_had_it(tmp_path: Path) -> None:
    """Bash refuses the interrupt's ``break`` inside a function: ``-e`` is left alone
    there, and a later timeout does not turn it back on after the code turned it off."""
    with Executor(root=tmp_path / "home") as ex:
        ex.execute_code("kept=yes", session_name="src", **BASH)
        ex.fork_session(session_name="src", language="bash", new_name="f")
        ex.execute_code("set -e", session_name="f", **BASH)
        r = ex.execute_code("f() { sleep 30; }; f", session_name="f", timeout=1, **BASH)
        assert r["error_type"] == "timeout", r
        shown = ex.execute_code('echo "${kept-gone} $-"', session_name="f", **BASH)["stdout"]
        # Kept, and -e with it; or lost, and said so.
        assert ("yes" in shown and "e" in shown.split()[1]) if r["state_lost"] is False \
            else shown.startswith("gone "), (r, shown)
        # A fork again (that one may have ended): -e on through one timeout, then off.
        ex.fork_session(session_name="src", language="bash", new_name="g")
        for flags, wanted in (("-e", True), ("+e", False)):
            ex.execute_code(f"set {flags}", session_name="g", **BASH)
            r = ex.execute_code("sleep 30", session_name="g", timeout=1, **BASH)
            assert r["error_type"] == "timeout" and r["state_lost"] is False, r
            shown = ex.execute_code('echo "$kept $-"', session_name="g", **BASH)["stdout"]
            assert shown.startswith("yes ") and ("e" in shown.split()[1]) is wanted, shown


def test_a_fork_reads_large_and_non_ascii_code_whole(tmp_path: Path) -> None:
    with Executor(root=tmp_path / "home") as ex:
        ex.execute_code("export LC_ALL=C.UTF-8", session_name="src", **BASH)
        ex.fork_session(session_name="src", language="bash", new_name="f")
        code = "s='héllo ✓ " + "x" * 300_000 + "'; echo ${#s}; echo 'ünï' | od -An -tx1"
        r = ex.execute_code(code, session_name="f", **BASH)
        assert r["stdout"].split("\n")[0] == str(len("héllo ✓ ") + 300_000), r
        assert r["stdout"].split("\n")[1].split() == \
            [f"{b:02x}" for b in "ünï\n".encode()]
        assert ex.execute_code("echo next", session_name="f", **BASH)["stdout"] == "next\n"
