"""The call log loses nothing that was returned (SPEC 11): a process making calls is
SIGKILLed at a random moment, and every call whose result it had seen is in the log;
a new process then rebuilds the sessions from it."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from coordex import Executor
from coordex.log import LOG_FILE
from coordex.log.store import LogReader

# Threads making calls of three kinds; each reports "cid" once its call has returned.
CHILD = textwrap.dedent("""
    import os, sys, threading
    from coordex import Executor
    ex = Executor(root=sys.argv[1])
    report = int(sys.argv[2])  # a pipe of its own: fd 1 is the own interpreter's to capture
    out_lock = threading.Lock()

    def say(line):
        with out_lock:
            os.write(report, (line + "\\n").encode())

    def work(kind):
        n = 0
        while True:
            n += 1
            cid = f"{kind}-{n}"
            if kind == "own":
                r = ex.execute_code(f"acc_{kind} = globals().get('acc_{kind}', 0) + 1  # {cid}",
                                    state_mode="stateful", session_name="own")
            elif kind == "bash":
                r = ex.execute_code(f"N=$((N+1))  # {cid}", language="bash",
                                    state_mode="stateful", session_name="sh")
            else:
                r = ex.execute_code(f"print('out of {cid}')  # {cid}")
            assert "error_type" not in r, r
            say(cid)

    say("ready")
    for kind in ("own", "bash", "free"):
        threading.Thread(target=work, args=(kind,), daemon=True).start()
    threading.Event().wait()
""")


@pytest.mark.parametrize("run", range(3))
def test_every_returned_call_is_in_the_log_after_a_sigkill(tmp_path: Path, run: int) -> None:
    root = tmp_path / "root"
    read_end, write_end = os.pipe()
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(root), str(write_end)],
                             pass_fds=(write_end,), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    os.close(write_end)
    reports = os.fdopen(read_end, "rb")
    try:
        assert reports.readline() == b"ready\n"
        time.sleep(random.uniform(0.8, 2.5))
        os.kill(child.pid, signal.SIGKILL)
        returned = [line.strip().decode() for line in reports.read().splitlines()]
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        reports.close()
    returned = [cid for cid in returned if cid and "-" in cid]
    assert len(returned) > 50, "the child made too few calls to tell anything"
    rows = LogReader(root / LOG_FILE).query("SELECT code, outcome FROM calls WHERE kind = 'call'")
    logged = {row["code"].rsplit("# ", 1)[1] for row in rows if row["code"]}
    missing = [cid for cid in returned if cid not in logged]
    assert not missing, f"{len(missing)} of {len(returned)} returned calls are not in the log"
    # What the log holds is enough to rebuild the sessions in a new process.
    last_own = max(int(c.split("-")[1]) for c in logged if c.startswith("own-"))
    last_bash = max(int(c.split("-")[1]) for c in logged if c.startswith("bash-"))
    with Executor(root=root) as ex:
        own = ex.rebuild_session(session_name="own")
        assert own["failed_at"] is None and own["replayed"] == last_own, own
        bash = ex.rebuild_session(language="bash", session_name="sh")
        assert bash["failed_at"] is None and bash["replayed"] == last_bash, bash
        assert ex.execute_code("acc_own", state_mode="stateful",
                               session_name="own")["result"] == str(last_own)
        echoed = ex.execute_code("echo $N", language="bash", state_mode="stateful",
                                 session_name="sh")
        assert echoed["stdout"] == f"{last_bash}\n"
