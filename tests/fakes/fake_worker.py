"""A misbehaving worker for fault tests, chosen by ``COORDEX_FAKE_WORKER``.

Tests point ``coordex.backends.env.workers.WORKER_SCRIPT`` here. Behaviours:

- ``silent``: never sends the handshake (sleeps);
- ``garbage``: writes a non-JSON line where the handshake should be;
- ``old_protocol``: announces a protocol version the host does not speak;
- ``exit``: prints a reason to stderr and exits with status 3 before the handshake;
- ``garbage_later``: handshakes correctly, then answers a run with garbage;
- ``ignore_shutdown``: handshakes, then reads and ignores every message (``shutdown``
  included); SIGINT still ends it;
- ``ignore_interrupt``: as ``ignore_shutdown``, and SIGINT is ignored too (TERM ends it);
- ``ignore_term``: as ``ignore_interrupt``, and SIGTERM is ignored too (only KILL works).

Standard library only, like the real worker.
"""

import json
import os
import signal
import sys
import time


def main() -> int:
    mode = os.environ.get("COORDEX_FAKE_WORKER", "silent")
    out_fd = int(sys.argv[sys.argv.index("--out") + 1])
    in_fd = int(sys.argv[sys.argv.index("--in") + 1])
    hello = {"type": "hello", "protocol": 1, "python": list(sys.version_info[:3]),
             "pid": os.getpid()}
    if mode == "silent":
        time.sleep(600)
    elif mode == "garbage":
        os.write(out_fd, b"this is not a protocol line\n")
        time.sleep(600)
    elif mode == "old_protocol":
        hello["protocol"] = 999
        os.write(out_fd, json.dumps(hello).encode() + b"\n")
        time.sleep(600)
    elif mode == "exit":
        sys.stderr.write("fake worker: refusing to start\n")
        return 3
    elif mode.startswith("ignore_"):
        if mode in ("ignore_interrupt", "ignore_term"):
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        if mode == "ignore_term":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.write(out_fd, json.dumps(hello).encode() + b"\n")
        while os.read(in_fd, 65536):
            pass  # `shutdown` included: not listening
        time.sleep(600)
    elif mode == "garbage_later":
        os.write(out_fd, json.dumps(hello).encode() + b"\n")
        while os.read(in_fd, 65536):
            os.write(out_fd, b"{not json\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
