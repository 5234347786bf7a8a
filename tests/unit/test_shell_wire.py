"""The bash text protocol, without bash: what a shell is sent and what it answers."""

from __future__ import annotations

from coordex.backends.shell import wire


def test_code_is_one_dollar_quoted_word_on_one_line() -> None:
    word = wire.quote_code("echo 'a'\nb\\c !x\0y")
    assert word.startswith(b"$'") and word.endswith(b"'")
    assert b"\n" not in word and b"\0" not in word
    assert word == b"$'echo \\'a\\'\\nb\\\\c \\041xy'"


def test_binary_and_surrogate_escaped_bytes_stand_for_themselves() -> None:
    assert wire.quote_code("\udce9") == b"$'\xe9'"  # a byte that came in undecodable


def test_the_protocol_texts_carry_the_token_and_the_private_fds() -> None:
    proto = wire.ShellProtocol.build("TOK", stderr_fd=201, runner_fd=202)
    assert b"2>&201-" in proto.runner and b"202<&-" in proto.runner
    assert b"TOK r " in proto.setup and b"TOK g 0 0 :" in proto.setup
    assert proto.setup.endswith(wire.sync_line("TOK", 0))
    assert proto.trigger % 7 == b"PROMPT_COMMAND=$__coordex_run __coordex_call=7 __coordex_code="


def test_a_runner_read_by_path_leaves_no_fd_for_the_code_to_close() -> None:
    proto = wire.ShellProtocol.build("TOK", stderr_fd=201, runner_fd=202,
                                     outputs=("/proc/9/fd/5", "/proc/9/fd/7"),
                                     runner_path="/proc/9/fd/202")
    assert proto.runner.endswith(b" 1>/proc/9/fd/5 2>/proc/9/fd/7\n")
    assert b"<&-" not in proto.runner and b"/dev/fd/" not in proto.setup
    assert b"\\builtin . /proc/9/fd/202; " in proto.setup


def test_a_sync_line_asks_for_an_s_record_of_its_call() -> None:
    line = wire.sync_line("TOK", 3)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert b"TOK s 3 $? " + wire.FLAGS.encode() in line


def test_flags_say_set_v_and_the_options_length() -> None:
    assert wire.parse_flags(b"himBHv:143") == (True, 143)
    assert wire.parse_flags(b"himBH:12") == (False, 12)
    assert wire.parse_flags(b"hB:garbage") == (False, -1)


def test_a_dump_reads_back_what_the_session_added() -> None:
    text = "\0".join(["c", "/work", "v", "x", "41", "v", "RANDOM", "9", "a", "arr",
                      "declare -a arr=([0]=\"1\")", "f", "greet", "f", "__coordex_options",
                      "l", "ll", "ls -l", "v", "__coordex_code", "secret", ""])
    state = wire.parse_dump(text)
    assert state == {"cwd": "/work", "variables": {"x": "41", "arr": '([0]="1")'},
                     "functions": ["greet"], "aliases": {"ll": "ls -l"}}


def test_quoting_for_bash_survives_single_quotes() -> None:
    assert wire.shell_quote("it's") == "'it'\\''s'"


_STATE = """\\exec 200<&-
__coordex_options() {
shopt -u extglob
:
}
declare -- x="1"
declare -a arr=([0]="a" [1]="b")
declare -x y=$'two\\nlines'
declare -- __coordex_f=""
g ()\x20
{\x20
    cat <<END
not ()\x20
END

}
declare -fx g
alias ll='ls -l'
set -- 'a b'
__coordex_options; \\builtin unset -f __coordex_options
\\builtin set +xv
"""


def test_a_state_text_names_variables_functions_and_aliases() -> None:
    names = wire.state_names(_STATE)
    assert sorted(names) == ["alias ll", "arr", "g()", "x", "y"]
    assert names["g()"].endswith("declare -fx g")  # the heredoc stays in the body
    assert names["alias ll"] == "alias ll='ls -l'"  # the positional parameters are not


def test_changed_names_compare_text_per_name() -> None:
    after = (_STATE.replace('x="1"', 'x="2"').replace("declare -fx g", "declare -f g")
             .replace("alias ll='ls -l'\n", "alias ll='ls -l'\nalias la='ls -a'\n")
             .replace('declare -a arr=([0]="a" [1]="b")\n', "") + 'declare -- RANDOM="9"\n')
    rebound, deleted = wire.changed_names(_STATE, after, frozenset({"RANDOM"}))
    assert sorted(rebound) == ["alias la", "g()", "x"] and deleted == ["arr"]
    assert wire.changed_names(_STATE, _STATE + "\n\n", frozenset()) == ([], [])
    # A copy's end dump: the names alone (no options, no positional parameters).
    dump = _STATE[_STATE.index("declare -"):_STATE.index("set --")]
    assert wire.changed_names(_STATE, dump, frozenset()) == ([], [])
    dump = dump.replace('x="1"', 'x="2"').replace('declare -- __coordex_f=""\n', "")
    assert wire.changed_names(_STATE, dump + "declare -i RANDOM\n", frozenset({"RANDOM"})) \
        == (["x"], [])
