"""The text protocol a kept bash is driven with: pure, no processes, no pipes.

See docs/protocol.md, "The bash record wire". A shell reads one *setup* line, then one
*trigger* line per call; it answers with *records* on a private status pipe
(``TOKEN r CALL STATUS FLAGS`` when a call ended, ``TOKEN s ...`` after a sync line,
``TOKEN g ...`` once it has read a call's line). This module builds every text the
shell is sent and parses what it sends back; :mod:`.session` moves the bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ...protocol import SPIN_SECONDS

# Bash's own ever-changing variables, and ones reported elsewhere (PWD is ``cwd``).
VOLATILE_VARIABLES = frozenset({
    "_", "BASHPID", "BASH_SUBSHELL", "RANDOM", "SRANDOM", "SECONDS", "LINENO",
    "EPOCHSECONDS", "EPOCHREALTIME", "BASH_COMMAND", "PIPESTATUS", "BASH_LINENO",
    "BASH_SOURCE", "FUNCNAME", "BASH_ARGC", "BASH_ARGV", "BASH_ARGV0", "HISTCMD",
    "BASH_ALIASES", "BASH_CMDS", "BASH_REMATCH", "PWD", "OLDPWD", "DIRSTACK", "COLUMNS",
    "LINES", "BASHOPTS", "SHELLOPTS", "PS1", "PS0",
})
PRIVATE_PREFIX = "__coordex_"

# Prints the session's state as NUL-separated records: ``c PWD``, ``v NAME VALUE``,
# ``a NAME DECLARE-P-TEXT`` (arrays), ``f NAME``, ``l NAME VALUE``. It runs in a subshell
# and resets IFS/noglob/nounset there, so a user's settings cannot skew it.
DUMP = r"""(
\builtin set +euf; IFS=$' \t\n'
\builtin printf 'c\0%s\0' "$PWD"
for __coordex_n in $(\builtin compgen -v); do
  case ${!__coordex_n@a} in
    *[aA]*) \builtin printf 'a\0%s\0%s\0' "$__coordex_n" "$(\builtin declare -p "$__coordex_n")" ;;
    *) \builtin printf 'v\0%s\0%s\0' "$__coordex_n" "${!__coordex_n}" ;;
  esac
done
for __coordex_n in $(\builtin compgen -A function); do \builtin printf 'f\0%s\0' "$__coordex_n"; done
for __coordex_n in $(\builtin compgen -a); do
  \builtin printf 'l\0%s\0%s\0' "$__coordex_n" "${BASH_ALIASES[$__coordex_n]}"
done
)"""


def quote_code(code: str, ascii_only: bool = False) -> bytes:
    """``code`` as one ``$'...'`` word on one line (NUL bytes dropped).

    Only ``\\``, ``'``, newline and ``!`` (history expansion, were a user to turn it
    back on) are escaped; every other byte, binary ones included, stands for itself -
    but with ``ascii_only`` bytes past 127 are ``\\xHH`` too, so the word has as many
    characters as bytes in any locale (a fork's loop counts the line it reads).
    """
    data = code.encode("utf-8", "surrogateescape")
    if b"\0" in data:
        data = data.replace(b"\0", b"")
    data = (data.replace(b"\\", b"\\\\").replace(b"'", b"\\'").replace(b"\n", b"\\n")
            .replace(b"!", b"\\041"))
    if ascii_only and not data.isascii():
        data = _HIGH_BYTE.sub(lambda m: b"\\x%02x" % m[0][0], data)
    return b"$'" + data + b"'"


_HIGH_BYTE = re.compile(rb"[\x80-\xff]")


# The version of the trigger-line / record texts below (docs/protocol.md, "The bash
# record wire"); both ends live in this module, so it changes with them.
RECORD_WIRE_VERSION = 3  # 2: the `g` record (PS0) tells a call's line was read;
# 3: the runner prints the record itself, then waits for the next line a moment

# After a call's record the runner tries bash's stdin this many times (``read -t 0``
# takes about 2.3 us: SPIN_SECONDS in all) before bash goes back to its blocking read,
# as a worker does: calls that come back to back then never wake a sleeping bash (on a
# small machine the wake-up was a quarter of a call). The record is printed first and PS1
# emptied, so the host has it at once (a printf the code disabled leaves the record
# in PS1, for bash to print); bash restores ``$?`` after PROMPT_COMMAND.
#
# The tries are a function's, defined by the setup line (WAIT; see FUNCTIONS): its body
# is parsed before the code can alias a reserved word (``for``, ``case``), a DEBUG trap
# the code set runs once for it rather than for each try, and none are made under
# ``set -x`` (each would be traced to the status pipe) or ``set -T`` (the trap would
# run in it). Its call ends an ``&&``/``||`` list: no failed try (nor the code's
# ``unset -f`` of it) ends a shell under ``set -e`` or runs an ERR trap.
SPIN_READS = round(SPIN_SECONDS / 2.3e-6)
WAIT = f"{PRIVATE_PREFIX}wait"
_WAIT_FUNCTION = (f"{WAIT}() {{ case $- in *[xT]*) \\builtin return 0 ;; esac; "
                  f"for (({PRIVATE_PREFIX}i = 0; {PRIVATE_PREFIX}i < {SPIN_READS}; "
                  f"{PRIVATE_PREFIX}i++)); do \\builtin read -t 0 && \\builtin break; done; }}; ")
SPIN = f"\\builtin printf %s \"${{PS1@P}}\" >&2 && PS1= && {WAIT} || \\builtin :"

# What a record says after the status: ``$-``, then the length of BASHOPTS.
# PROMPT_COMMAND runs with the parser state of the prompt saved and restores it after
# (bash 5.2 keeps echo_input_at_read - set -v - and expand_aliases there), so what the
# code did to those two the next trigger line repeats at the top level: set -v from
# ``$-``; expand_aliases when the shopt options changed at all (their length is a
# cheap tell; matching BASHOPTS against a pattern costs a call ~4 us).
FLAGS = "$-:${#BASHOPTS}"
# Functions the setup line defines, so their words are parsed before code can alias a
# reserved word (``case``): ALIASES makes the parser's expand_aliases what ``shopt``
# says it is, SYNC also its set -v what ``$-`` says. Called at the top level (not in
# PROMPT_COMMAND, which restores the parser's state), each ending an ``||`` list (an
# ``unset -f`` of it by the code only leaves the options as they are).
ALIASES = f"{PRIVATE_PREFIX}aliases"
SYNC = f"{PRIVATE_PREFIX}sync"
_SYNC_FUNCTIONS = (
    f"{ALIASES}() {{ case :$BASHOPTS: in *:expand_aliases:*) \\builtin shopt -s "
    f"expand_aliases ;; *) \\builtin shopt -u expand_aliases ;; esac; }}; "
    f"{SYNC}() {{ case $- in *v*) \\builtin set -v ;; *) \\builtin set +v ;; esac; "
    f"{ALIASES}; }}; ")
# Put before a trigger line once the code changed the shopt options.
SYNC_ALIASES = f"{ALIASES} || \\builtin :"
# A fork's loop (FORK_LOOP) is parsed each time it starts (after an interrupt or a
# ``break`` too), and its words are reserved words (``while``, ``if``, ``[[``) the code
# may have aliased; so is the fork's setup line (``for``, ``case``), which the loop
# runs. NO_ALIASES, run just before every parse of the loop, notes in ``ALIASED``
# whether alias expansion is on (``s``) or off (``u``) and turns it off; a note already
# there is kept (a second start before the first was undone: a fork made then inherits
# the note). It reads BASHOPTS, not ``shopt -q``: a new subshell has expansion off
# until a ``shopt`` changes it, while BASHOPTS still says what its shell had. Once the
# loop has run the line it read (the setup line, which turns expansion on; a sync or a
# fork line), it puts expansion back as it was (_BACK_ALIASES), before any code is
# parsed. NO_ALIASES is parsed where the code's aliases are in force, so it holds no
# reserved word; neither is a function (the code could unset it) or holds an unquoted
# expansion (the code's IFS would split it).
ALIASED = f"{PRIVATE_PREFIX}aliased"
NO_ALIASES = (f"{ALIASED}=${{{ALIASED}:-:$BASHOPTS:}}; "
              f"{ALIASED}=${{{ALIASED}/*:expand_aliases:*/s}}; {ALIASED}=${{{ALIASED}/#:*/u}}; "
              "\\builtin shopt -u expand_aliases")
_BACK_ALIASES = (f"case ${{{ALIASED}-}} in [su]) \\builtin shopt -\"${ALIASED}\" "
                 f"expand_aliases; {ALIASED}= ;; esac")
# The functions of ours in a shell: in the user's function list, as the variables of
# ours are in theirs (inspect_session and a state dump leave them out).
FUNCTIONS = (WAIT, ALIASES, SYNC)


@dataclass(frozen=True)
class ShellProtocol:
    """The fixed texts one shell is driven with; see the module docstring.

    ``runner`` is the body of the runner file; ``setup`` the first line bash reads;
    ``trigger`` the head of every call's line (``%d`` takes the call number, the code
    follows as a ``$'...'`` word).
    """

    runner: bytes
    setup: bytes
    trigger: bytes

    @classmethod
    def build(cls, token: str, stderr_fd: int, runner_fd: int,
              stdout_fd: int | None = None,
              outputs: tuple[str, str] | None = None,
              runner_path: str | None = None) -> ShellProtocol:
        """``outputs``: the paths each call's code opens as its fd 1 and fd 2, a writer
        of its own on the host's pipes (``/proc/HOST/fd/N``, see
        :mod:`..late_output`); closed when the code ends, so a pipe still written to
        after that is held by something the code left running.

        ``runner_path`` (with ``outputs``): where bash opens the runner file, the host's
        own descriptor of it (``/proc/HOST/fd/N``): bash then holds no descriptor of
        ours at all, and the code has none to close (a redirection, ten system calls,
        less on every call). Without it bash sources ``/dev/fd/{runner_fd}``.

        Without ``outputs`` (no ``/proc``): ``stdout_fd`` is where bash keeps a copy of
        its fd 1 (set up by the first line), which every call's code gets as fd 1
        again, whatever an earlier call did to its fd 1 (``exec >&-``); by default one
        above the others; the code's fd 2 is ``stderr_fd``."""
        p = PRIVATE_PREFIX
        out = max(stderr_fd, runner_fd) + 1 if stdout_fd is None else stdout_fd
        # Sourced, not eval'd in PROMPT_COMMAND directly: only while a file is sourced
        # does bash clean finished foreground jobs out of its job table (else `jobs`
        # and %1 see them), and `return` ends the code as it did in a sourced script.
        # Our fds are closed for the code (its children see 0, 1 and 2 only) and come
        # back after it, whatever it did to those numbers. The eval's redirections
        # come after its trace and its line's set -v echo: those go to the status pipe.
        if outputs is not None:
            close_runner = "" if runner_path is not None else f" {runner_fd}<&-"
            runner = (f"\\builtin eval \"${p}code\" </dev/null 1>{outputs[0]} "
                      f"2>{outputs[1]}{close_runner}\n")
        else:
            runner = (f"\\builtin eval \"${p}code\" </dev/null 1>&{out} 2>&{stderr_fd}- "
                      f"{out}>&- {runner_fd}<&-\n")
        source = f"/dev/fd/{runner_fd}" if runner_path is None or outputs is None \
            else runner_path
        # The record's head is written out (one expansion fewer a call; ``{p}record``
        # stays for the fork's loop and exit record).
        prompt_command = (
            f"\\builtin unset PROMPT_COMMAND; \\builtin . {source}; "
            f"PS1=\"\\n{token} r ${p}call $? {FLAGS}\\n\" PS0=${p}go; {SPIN}")
        keep_stdout = "" if outputs is not None else f"\\exec {out}>&1; "
        setup = (f"{keep_stdout}"
                 f"\\builtin set +o history +H; \\builtin unset HISTFILE MAILCHECK; "
                 f"\\builtin shopt -s expand_aliases; {p}run={shell_quote(prompt_command)}; "
                 f"{p}record='{token} r '; {p}go=$'\\n{token} g 0 0 :\\n'; PS0=${p}go; "
                 f"{p}call=0; {_WAIT_FUNCTION}{_SYNC_FUNCTIONS}").encode() + sync_line(token, 0)
        # PS0 (bash >= 4.4) is printed once a line is read and parsed, before it runs:
        # the "go" record. A shell killed just before a call arrives dies inside its
        # read of the line and prints none, which proves the code never started.
        trigger = f"PROMPT_COMMAND=${p}run {p}call=%d {p}code=".encode()
        return cls(runner.encode(), setup, trigger)


# A fork of a session's shell (``fork_session``, SPEC 15) is a subshell of it: a process
# fork, so it carries everything the shell holds (variables, functions, aliases,
# options, cwd, umask, open fds, exported env) without copying a byte. A subshell does
# not read commands by itself, so it runs this loop, which speaks the same record wire:
# read a line, print the "go" record, run PROMPT_COMMAND (the runner) and print PS1. The
# code runs in the loop's body, not its condition, so ``set -e`` ends the shell as it
# would end the source's. A call's ``continue`` comes back to the condition and its
# ``break`` ends the loop, which the trailing eval starts again: either way the call's
# record is printed (PS1 holds a fallback record for it before the code runs). An interrupt runs the INT
# trap, whose ``break`` leaves every loop the code was in, as an interactive shell
# abandons the line; it empties PS1, so the call's record is the sync line's, as there.
# Each line comes after its length (a line of its own): ``read -N`` reads it in large
# chunks, where a plain ``read`` from a pipe takes one byte per system call. ``-N`` counts
# characters, so every line a fork is sent is ASCII (``quote_code(ascii_only=True)``):
# as many characters as bytes in any locale, and no locale switch on every call.
#
# The INT trap also turns ``set -e`` off before its ``break``, noting in ``ERREXIT``
# whether it was on: the interrupted command's failure would otherwise end the fork (the
# source, an interactive shell, abandons the line). The loop turns it back on before it
# runs the next line. Inside a function the ``break`` reaches only the function's own
# loops (bash refuses it where there are none; its complaint is not the code's output),
# so ``-e`` is left alone there: a function of the code's goes on from the interrupted
# command, as a script's would (the call's record, or its kill after the grace, ends
# the call); our wait just ends. The trap is parsed where the code's aliases are in
# force: no reserved word (``((`` cannot be an alias's name).
ERREXIT = f"{PRIVATE_PREFIX}errexit"
INTERRUPTED = (f"PS1=; (( ${{#FUNCNAME[@]}} )) || {ERREXIT}=${{{ERREXIT}:-$-}}; "
               "(( ${#FUNCNAME[@]} )) || \\builtin set +e; \\builtin break 1000000 2>/dev/null")
_BACK_ERREXIT = f"case ${{{ERREXIT}-}} in *e*) \\builtin set -e ;; esac; {ERREXIT}="
FORK_LOOP = (
    "while \\builtin printf %s \"${PS1@P}\" >&2; "
    f"IFS= \\builtin read -r {PRIVATE_PREFIX}n && IFS= \\builtin read -r -N "
    f"\"${PRIVATE_PREFIX}n\" {PRIVATE_PREFIX}line || \\builtin exit 0; "
    f"do \\builtin printf %s \"${{PS0@P}}\" >&2; {_BACK_ERREXIT}; "
    f"\\builtin eval \"${PRIVATE_PREFIX}line\"; {_BACK_ALIASES}; "
    "if [[ -n ${PROMPT_COMMAND-} ]]; then "
    f"PS1=\"\\n${{{PRIVATE_PREFIX}record}}${{{PRIVATE_PREFIX}call}} 0 {FLAGS}\\n\"; "
    f"\\builtin eval \"$PROMPT_COMMAND\"; fi; done; {NO_ALIASES}; "
    f"\\builtin eval \"${PRIVATE_PREFIX}loop\"")


def fork_line(folder: str, stderr_fd: int, stdout_fd: int, *,
              per_call: bool = False) -> str:
    """The text that forks the shell into a loop on the FIFOs in ``folder`` (``in``,
    ``out``, ``err``, ``status``), its pid written to ``folder/pid`` first.

    ``per_call``: for a shell whose calls open their output pipes by path and read
    their runner by path (``ShellProtocol.build(outputs=..., runner_path=...)``): the
    fork's setup line names its own runner, which names its own pipes; it keeps no
    writer on them (``out`` and ``err`` are then left unopened).

    Run at the top level, between calls. The subshell in between (``set -m`` there puts
    the loop's process in a group of its own) leaves the source's ``$!`` and job table
    as they were; the loop's process is then nobody's job, and the source's group is
    not its group, so signals to one never reach the other.
    """
    p = PRIVATE_PREFIX
    f = shell_quote(folder.rstrip("/") + "/")
    if not per_call:
        exec_line = f"\\exec <{f}in >{f}out 2>{f}status {stderr_fd}>{f}err {stdout_fd}>&1"
    else:
        exec_line = f"\\exec <{f}in >/dev/null 2>{f}status"
    # Not our child, so its exit status is not ours to read: its EXIT trap says it.
    said = ("\\builtin printf '\\n%s e 0 %s :\\n' "
            f"\"${{{p}record% r }}\" \"$?\" >&2")
    inner = (f"\\builtin set +m; \\builtin trap {shell_quote(INTERRUPTED)} INT; "
             f"\\builtin trap {shell_quote(said)} EXIT; "
             f"\\builtin printf %s \"$BASHPID\" >{f}pid; "
             f"{exec_line}; {p}loop={shell_quote(FORK_LOOP)}; {NO_ALIASES}; "
             f"\\builtin eval \"${p}loop\"")
    return f"( \\builtin set -m; ( {inner} ) & ) >/dev/null 2>&1 </dev/null; "


def sync_line(token: str, number: int) -> bytes:
    """The line that reports ``TOKEN s NUMBER STATUS FLAGS`` once bash reads commands.

    It also makes the parser's set -v and expand_aliases agree with the options again
    (an interrupt can land after the runner restored them).
    """
    return (f"PS1=\"\\n{token} s {number} $? {FLAGS}\\n\"; \\builtin unset PROMPT_COMMAND; "
            f"{SYNC} || \\builtin :\n").encode()


def parse_flags(field: bytes) -> tuple[bool, int]:
    """(set -v, length of BASHOPTS) from a record's flags field."""
    dash, _, options = field.partition(b":")
    try:
        return b"v" in dash, int(options)
    except ValueError:
        return b"v" in dash, -1


def shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def parse_dump(text: str) -> dict[str, Any]:
    fields = text.split("\0")
    state: dict[str, Any] = {"cwd": "", "variables": {}, "functions": [], "aliases": {}}
    i = 0
    while i < len(fields) - 1:
        kind = fields[i]
        if kind == "c":
            state["cwd"] = fields[i + 1]
            i += 2
        elif kind == "f":
            state["functions"].append(fields[i + 1])
            i += 2
        elif kind in ("v", "a", "l") and i + 2 < len(fields):
            name, value = fields[i + 1], fields[i + 2]
            if kind == "l":
                state["aliases"][name] = value
            elif name not in VOLATILE_VARIABLES and not name.startswith(PRIVATE_PREFIX):
                if kind == "a":  # `declare -a x=(...)`: keep the value text after `=`
                    value = value.split("=", 1)[1] if "=" in value else ""
                state["variables"][name] = value
            i += 3
        else:
            i += 1
    state["functions"] = [f for f in state["functions"] if not f.startswith(PRIVATE_PREFIX)]
    return state


# A state text (what ``declare -p; declare -f; alias -p`` print, as a protected copy's
# state file holds it and its end dump repeats it): where each name's entry starts.
_VARIABLE = re.compile(r"declare -(\S+) ([^=\s]+)(=|$)")
_FUNCTION = re.compile(r"(\S+) \(\) $")
_ALIAS = re.compile(r"alias ([^=\s]+)=")
# Lines of a state file that belong to no name (the options, positional parameters).
_NO_NAME = ("set --", "\\builtin ", "\\exec ", f"{PRIVATE_PREFIX}options")


def state_names(text: str) -> dict[str, str]:
    """Each name a state text binds, with the text that binds it: variables by name,
    functions as ``name()``, aliases as ``alias name`` (the call log's convention).

    One entry runs from its first line to the next entry's: a value with newlines in
    it, a function's body, ``declare -fx f`` after ``f``'s body stay with their name.
    A function starts at ``name () `` followed by ``{ ``, as ``declare -f`` prints it.
    Private names (``__coordex_...``) are left out.
    """
    entries: dict[str, list[str]] = {}
    current: list[str] | None = None
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if line.startswith("declare -"):
            match = _VARIABLE.match(line)
            if match is not None:
                name = match.group(2)
                key = f"{name}()" if "f" in match.group(1) else name
                current = entries.setdefault(key, [])
                current.append(line)
                continue
        elif line.startswith("alias "):
            match = _ALIAS.match(line)
            if match is not None:
                current = entries.setdefault(f"alias {match.group(1)}", [])
                current.append(line)
                continue
        elif line.endswith(" () ") and i + 1 < len(lines) and lines[i + 1] == "{ ":
            match = _FUNCTION.match(line)  # (a heredoc's line rarely looks like this)
            if match is not None:
                current = entries.setdefault(f"{match.group(1)}()", [])
                current.append(line)
                continue
        if line.startswith(_NO_NAME):
            current = None
        elif current is not None:
            current.append(line)
    return {key: "\n".join(lines).rstrip("\n") for key, lines in entries.items()
            if not key.startswith((PRIVATE_PREFIX, f"alias {PRIVATE_PREFIX}"))}


def changed_names(before: str, after: str,
                  ignored: frozenset[str]) -> tuple[list[str], list[str]]:
    """(rebound, deleted): the names of state text ``after`` bound anew or differently
    (value or attributes) than in ``before``, and those it no longer has; variables in
    ``ignored`` (bash's own, ever-changing ones) never count.

    Most calls change a few one-line variables or nothing: the lines that differ are
    found as sets (fast), and only when one of them is not a whole one-line variable
    or alias are both texts parsed name by name.
    """
    start, end = before.find("\ndeclare -"), before.rfind("\nset --")
    body = before[start + 1:end] if 0 <= start < end else before  # a state file's names
    old_lines, new_lines = body.split("\n"), after.split("\n")
    gone, came = set(old_lines).difference(new_lines), set(new_lines).difference(old_lines)
    gone.discard("")
    came.discard("")
    gone_names, came_names = _line_names(gone, ignored), _line_names(came, ignored)
    if gone_names is not None and came_names is not None:
        return sorted(came_names), sorted(gone_names - came_names)
    old, new = state_names(before), state_names(after)
    rebound = [key for key, value in new.items()
               if key not in ignored and old.get(key) != value]
    deleted = [key for key in old if key not in new and key not in ignored]
    return rebound, deleted


def _line_names(lines: set[str], ignored: frozenset[str]) -> set[str] | None:
    """The names ``lines`` bind, as :func:`state_names` keys them (private and
    ``ignored`` ones left out), if each starts a variable or an alias; None if one is
    part of a function or the rest of a value (a later line of a first line that did
    not change): then only a parse tells whose it is. A value whose first line changed
    is named by that line."""
    names = set()
    for line in lines:
        match = _VARIABLE.match(line) if line.startswith("declare -") else None
        if match is not None and "f" not in match.group(1):
            if match.group(2) not in ignored:
                names.add(match.group(2))
            continue
        match = _ALIAS.match(line) if line.startswith("alias ") else None
        if match is None:
            return None
        names.add(f"alias {match.group(1)}")
    return {name for name in names if not name.startswith((PRIVATE_PREFIX,
                                                           f"alias {PRIVATE_PREFIX}"))}


__all__ = [
    "DUMP",
    "FLAGS",
    "FORK_LOOP",
    "FUNCTIONS",
    "PRIVATE_PREFIX",
    "RECORD_WIRE_VERSION",
    "SPIN_READS",
    "SYNC_ALIASES",
    "VOLATILE_VARIABLES",
    "WAIT",
    "ShellProtocol",
    "changed_names",
    "fork_line",
    "parse_dump",
    "parse_flags",
    "quote_code",
    "shell_quote",
    "state_names",
    "sync_line",
]
