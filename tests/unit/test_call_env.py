"""A call's own variables (its TRACEPARENT, SPEC 16) in the agent's process: seen by the
code and by what it starts, gone after the call, and nothing left behind per call (glibc
keeps every string ``setenv`` was ever given; a TRACEPARENT is new on every call)."""

from __future__ import annotations

import os
import subprocess

import pytest

from coordex.worker import _coordex_env as call_env


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_the_variable_is_seen_by_the_code_and_its_children_and_gone_after() -> None:
    assert "TRACEPARENT" not in os.environ
    value = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    saved = call_env.enter({"TRACEPARENT": value})
    try:
        assert os.environ["TRACEPARENT"] == value
        seen = subprocess.run(["sh", "-c", 'echo "$TRACEPARENT"'], capture_output=True,
                              text=True, check=True).stdout
        assert seen == value + "\n"
    finally:
        call_env.leave(saved)
    assert "TRACEPARENT" not in os.environ
    seen = subprocess.run(["sh", "-c", 'echo "${TRACEPARENT-unset}"'], capture_output=True,
                          text=True, check=True).stdout
    assert seen == "unset\n"


def test_a_value_the_process_had_is_put_back() -> None:
    os.environ["TRACESTATE"] = "before=1"
    try:
        saved = call_env.enter({"TRACESTATE": "congo=t61rcWkgMzE," + "x" * 200})
        assert os.environ["TRACESTATE"].startswith("congo=")
        call_env.leave(saved)
        assert os.environ["TRACESTATE"] == "before=1"
        assert subprocess.run(["sh", "-c", 'echo "$TRACESTATE"'], capture_output=True,
                              text=True, check=True).stdout == "before=1\n"
    finally:
        del os.environ["TRACESTATE"]


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads /proc")
def test_a_new_value_every_call_leaves_no_memory_behind() -> None:
    # With os.environ (glibc setenv) 100,000 calls keep about 11 MB.
    before = _rss_bytes()
    for number in range(100_000):
        call_env.leave(call_env.enter(
            {"TRACEPARENT": f"00-4bf92f3577b34da6a3ce929d0e0e4736-{number:016x}-01"}))
    assert _rss_bytes() - before < 3 * 1024 * 1024
    assert "TRACEPARENT" not in os.environ
