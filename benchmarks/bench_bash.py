"""Bash backend latency against the usual ways of keeping a shell, in one run.

Stateful: a kept ``ShellSession`` call against a persistent bash driven by pexpect at
its fastest (a pty, ``echo=False``, ``delaybeforesend=None``, a unique PS1 as the
marker, no replwrap). Read-only: ``run_read_only`` (a forked subshell) against what a
tool without a fork must do to give code a throwaway copy of a shell: dump its state
(``declare -p; declare -f; alias -p; shopt -p; set +o; pwd``) and restore it into a
fresh bash. Both sessions hold the same state (variables, functions, aliases).

Run: ``python benchmarks/bench_bash.py [--calls N]``. Prints medians and ratios; the
stateful rows and the paced read-only row time both sides in alternating rounds.
"""

from __future__ import annotations

import argparse
import os
import subprocess
from collections.abc import Callable

import pexpect
from _util import Owned, median_seconds, paired_medians, record

from coordex.backends import isolation
from coordex.backends.base import RunRequest, new_scratch, remove_scratch
from coordex.backends.shell import ShellSession

PROMPT = "__BENCH_PROMPT_7f3a9c__"
SETUP = (
    "for i in $(seq 50); do eval \"var_$i=value_$i\"; done; "
    "for i in $(seq 10); do eval \"fn_$i() { echo $i; }\"; done; "
    "for i in $(seq 5); do alias \"al_$i=echo $i\"; done; shopt -s extglob; cd /tmp"
)
DUMP = "{ declare -p; declare -f; alias -p; shopt -p; set +o; echo \"cd $(printf %q \"$PWD\")\"; }"


def median_ms(fn: Callable[[], object], calls: int, warmup: int = 20,
              gap: float = 0.0) -> float:
    return median_seconds(fn, calls, warmup, gap) * 1000


def paired_median_ms(ours: Callable[[], object], theirs: Callable[[], object],
                     calls: int, warmup: int = 20, gap: float = 0.0) -> tuple[float, float]:
    """The median ms of each of two calls, timed in alternating rounds."""
    mine, peer = paired_medians(ours, theirs, calls, warmup=warmup, gap=gap)
    return mine * 1000, peer * 1000


class PexpectBash:
    """A persistent bash on a pty, driven the fastest way pexpect allows."""

    def __init__(self) -> None:
        self.child = pexpect.spawn("bash", ["--norc", "--noprofile"], echo=False,
                                   encoding="utf-8", timeout=30)
        self.child.delaybeforesend = None
        # The prompt is assembled from two halves only when shown, so neither the echoed
        # line nor `declare -p` output (the dump below) can contain it.
        half = len(PROMPT) // 2
        self.child.sendline(f"P1='{PROMPT[:half]}'; P2='{PROMPT[half:]}'; PS1='${{P1}}${{P2}}'; "
                            "PS2=; unset PROMPT_COMMAND; bind 'set enable-bracketed-paste off'")
        self.child.expect_exact(PROMPT)

    def run(self, line: str) -> str:
        self.child.sendline(line)
        self.child.expect_exact(PROMPT)
        return str(self.child.before).replace("\r\n", "\n")  # the pty's line endings

    def close(self) -> None:
        self.child.close(force=True)


def dump_and_restore(shell: PexpectBash, code: str) -> str:
    """A throwaway copy without fork: dump the state, replay it into a fresh bash."""
    state = shell.run(DUMP)
    # Read-only variables (BASHOPTS, UID...) fail to restore; their errors are dropped.
    done = subprocess.run(["bash", "--norc", "--noprofile"], input=f"{state}\n{code}\n",
                          capture_output=True, text=True, check=False)
    return done.stdout.rsplit("\n", 2)[-2] if done.stdout else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=500, help="timed calls per row")
    args = parser.parse_args()
    calls = args.calls

    session = Owned(ShellSession(), "shell", retries=False)  # as the Executor runs it
    peer = PexpectBash()
    try:
        assert "error" not in session.run(RunRequest(code=SETUP, timeout=30))
        peer.run(SETUP)
        true_req = RunRequest(code="true", timeout=30)
        echo_req = RunRequest(code="echo hi", timeout=30)
        assert session.run(echo_req)["stdout"] == "hi\n"
        assert peer.run("echo hi").strip() == "hi"

        ro_req = RunRequest(code="echo $var_7; fn_3; var_7=x; cd /", timeout=30)
        assert session.run_read_only(ro_req)["stdout"] == "value_7\n3\n"
        assert dump_and_restore(peer, "echo $var_7; fn_3") == "3"
        # With files discarded: the work folder (the session's cwd, /tmp) overlaid, a
        # scratch folder per call named and removed as the Executor does (a protected
        # bash copy makes none: it has one of its own).

        def protected() -> dict[str, object]:
            scratch = new_scratch()
            try:
                # report_changes: as the Executor asks with its call log on (the default).
                return session.run_read_only(RunRequest(
                    code=ro_req.code, timeout=30, protect_paths=(".",), scratch=scratch,
                    report_changes=True))
            finally:
                remove_scratch(scratch)

        first = protected()
        assert first["stdout"] == "value_7\n3\n", first
        files = first["isolation"]["files"]  # type: ignore[index]

        rows = [
            ("stateful `true`", *paired_median_ms(lambda: session.run(true_req),
                                                  lambda: peer.run("true"), calls),
             4.0, "pexpect bash"),
            ("stateful `echo hi`", *paired_median_ms(lambda: session.run(echo_req),
                                                     lambda: peer.run("echo hi"), calls),
             4.0, "pexpect bash"),
            ("read_only `echo; fn`", median_ms(lambda: session.run_read_only(ro_req), calls // 5),
             median_ms(lambda: dump_and_restore(peer, "echo $var_7; fn_3"), calls // 5, 5),
             8.0, "dump + restore"),
            # In alternating rounds, side by side; calls 200 ms apart (a model's calls
            # are seconds apart), so the copy coordex protects ahead of each call is ready.
            (f"read_only files={files}", *paired_median_ms(
                protected, lambda: dump_and_restore(peer, "echo $var_7; fn_3"), calls // 5,
                warmup=5, gap=0.2), 2.5, "dump + restore, no protection"),
            ("  back to back", median_ms(protected, calls // 5, 5),
             median_ms(lambda: dump_and_restore(peer, "echo $var_7; fn_3"), calls // 5, 5),
             0.0, "(no time to make the copy ahead)"),
        ]
    finally:
        session.close()
        peer.close()
    print(f"protection here: {isolation.best_mode()} (probe {isolation.probe()}); "
          f"{os.cpu_count()} CPUs")

    print(f"{'call':<22} {'coordex ms':>11} {'peer ms':>9} {'ratio':>7} {'target':>7}  peer")
    keys = {"stateful `true`": "bash.stateful_true.vs_pexpect",
            f"read_only files={files}": "bash.read_only_paced.vs_dump_restore"}
    for name, ours, theirs, target, peer_name in rows:
        ratio = theirs / ours
        if name in keys:
            record(keys[name], ratio)
        verdict = "ok" if ratio >= target else "BELOW"
        print(f"{name:<22} {ours:>11.3f} {theirs:>9.3f} {ratio:>6.1f}x {target:>6.1f}x  "
              f"{peer_name} ({verdict})")


if __name__ == "__main__":
    main()
