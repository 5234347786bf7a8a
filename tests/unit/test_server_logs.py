"""The server's log handler (``--log-level``/``--log-format``): on a stderr of its own,
and set up again without leaving anything behind."""

from __future__ import annotations

import logging
import os
import threading

from coordex.observe import logs


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_setting_the_logs_up_again_leaves_no_descriptor_behind() -> None:
    root = logging.getLogger()
    before = list(root.handlers)
    try:
        logs.configure("info", "text")
        held = _open_fds()
        for fmt in ("json", "text") * 20:
            logs.configure("info", fmt)
        assert _open_fds() == held  # each replaced handler's own stderr is closed
        assert [h.get_name() for h in root.handlers].count("coordex") == 1
        logging.getLogger("coordex.test").warning("still written")
        # ... and from another thread: the handler's own lock was let go after each line.
        other = threading.Thread(target=logging.getLogger("coordex.test").warning,
                                 args=("from another thread",))
        other.start()
        other.join(5)
        assert not other.is_alive()
    finally:
        for handler in list(root.handlers):
            if handler not in before:
                root.removeHandler(handler)
                if isinstance(handler, logs._ServerStderr):
                    handler.let_go()
