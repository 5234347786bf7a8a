"""The servers' logs: stdlib ``logging`` on stderr, as text or JSON lines.

``coordex serve|mcp --log-level LEVEL --log-format text|json``. Each call is one INFO
line of the ``coordex.calls`` logger (tenant, coordinates, outcome, ms; never code or
output, :func:`coordex.observe.hook.log_call`); a JSON line carries those as fields.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
import time
from typing import Any, TextIO

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonLines(logging.Formatter):
    """One JSON object a line: time, level, logger, message, a call's fields, and the
    traceback of an exception."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(), "logger": record.name,
            "message": record.getMessage(),
        }
        facts = getattr(record, "coordex", None)
        if isinstance(facts, dict):
            line.update(facts)
        if record.exc_info:
            line["traceback"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


class _ServerStderr(logging.StreamHandler):
    """The server's stderr, on a descriptor of its own where it has one.

    A call in the agent's own interpreter puts its pipes on fds 1 and 2 while it runs
    (a detached one for minutes, SPEC 14): a log line written to fd 2 then would land in
    that call's output. A duplicate made at start keeps pointing at the server's stderr.
    It stays open as long as the process: ``logging.config`` (a web server's) closes
    every handler it finds yet leaves them attached, and a closed stream would lose
    every line after.
    """

    def __init__(self) -> None:
        stream: TextIO = sys.stderr
        with contextlib.suppress(AttributeError, OSError, ValueError, io.UnsupportedOperation):
            fd = os.dup(sys.stderr.fileno())  # none for an in-memory stream: used as it is
            stream = os.fdopen(fd, "w", buffering=1, errors="backslashreplace",
                               encoding=getattr(sys.stderr, "encoding", None) or "utf-8")
        super().__init__(stream)

    def let_go(self) -> None:
        """This handler is replaced (taken off the root logger): its own duplicate of
        stderr goes with it."""
        with self.lock or contextlib.nullcontext():
            stream, self.stream = self.stream, sys.stderr
        if stream is not sys.stderr:
            with contextlib.suppress(OSError, ValueError):
                stream.close()


def configure(level: str = "info", fmt: str = "text") -> None:
    """Send ``logging`` to stderr at ``level`` in ``fmt`` (replacing earlier handlers
    this function installed)."""
    handler = _ServerStderr()
    handler.setFormatter(JsonLines() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    handler.set_name("coordex")
    root = logging.getLogger()
    for old in list(root.handlers):
        if old.get_name() == "coordex":
            root.removeHandler(old)
            if isinstance(old, _ServerStderr):
                old.let_go()
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.getLogger("coordex").setLevel(level.upper())
    # The MCP SDK says at INFO what every request does (sessions made and ended): at
    # --log-level debug only, so a call stays one line.
    logging.getLogger("mcp").setLevel("DEBUG" if level == "debug" else
                                      max(logging.WARNING, root.level))
