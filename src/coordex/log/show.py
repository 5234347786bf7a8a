"""What ``coordex log`` prints: pure functions from log records to lines of text.

Logged text is the code's own (code, output, session names): it may hold terminal
escape sequences (clear the screen, move the cursor, write the clipboard with OSC 52)
meant for whoever reads it. :func:`printable` writes every control character as a
visible escape (``\\x1b``), so nothing of a log reaches the operator's terminal as a
sequence it would obey.
"""

from __future__ import annotations

import re
import time
from typing import Any

# C0 controls but tab and newline, DEL, C1 controls, and the Unicode line and paragraph
# separators and bidirectional overrides that can make a line read as another.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_CONTROL_AND_LINES = re.compile(
    "[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    return {"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(char) or (
        f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")


def printable(text: Any, *, lines: bool = False) -> str:
    """``text`` with control characters escaped; with ``lines``, newlines and tabs are
    kept (a block of output), else they are escaped too (one table cell)."""
    if text is None:
        return ""
    pattern = _CONTROL if lines else _CONTROL_AND_LINES
    return pattern.sub(_escaped, str(text))


def place(record: dict[str, Any]) -> str:
    """``python``, ``bash venv 3``: the language and environment of a record."""
    language = record.get("language") or "?"
    venv_id = record.get("venv_id")
    return str(language) + ("" if venv_id is None else f" venv {venv_id}")


def session_label(record: dict[str, Any]) -> str:
    name, number = record.get("session_name"), record.get("session_id")
    if name is not None:
        return printable(repr(name))
    return "" if number is None else f"#{number}"


def call_line(call: dict[str, Any]) -> dict[str, Any]:
    """One table row of ``coordex log``."""
    where = place(call)
    label = session_label(call)
    if label:
        where += " " + label
    first = (call.get("code") or "").strip().splitlines()[:1]
    code = printable(first[0] if first else "")
    outcome = call.get("outcome") or "no outcome (running, or its process died)"
    if call.get("state_lost"):
        outcome += " (state lost)"
    at = call.get("at")
    duration = call.get("duration_ms")
    code = code[:60] + ("..." if len(code) > 60 else "")
    if call.get("said_by") == "host":
        code = "[host's word] " + code
    return {"seq": call.get("seq"),
            "at": time.strftime("%m-%d %H:%M:%S", time.localtime(at)) if at else "",
            "where": where, "state_mode": call.get("state_mode") or "",
            "outcome": outcome, "ms": f"{duration:.1f}" if duration is not None else "",
            "code": code}


def call_detail(call: dict[str, Any]) -> list[str]:
    """The lines of ``coordex log --seq N``: one call with everything its row keeps."""
    head = call_line(call)
    out = [f"call {call.get('seq')}  {head['at']}  {head['where']}  {head['state_mode']}  "
           f"{head['outcome']}  {head['ms']} ms"]
    if call.get("said_by") == "host":
        out.append("said by: the host's own word (no call the server sent; its code, "
                   "outcome and output are what the tenant's host said)")
    for key in ("exit_code", "retried", "replay_of", "isolation", "changed"):
        if call.get(key) not in (None, False):
            out.append(f"{key}: {printable(call[key])}")
    for key in ("code", "stdout", "stderr", "result", "error", "suggestion", "traceback"):
        value = call.get(key)
        if value:
            out.append(f"--- {key}" + (" (cut at 64 KiB)" if key == "code" and
                                        call.get("code_truncated") else ""))
            out.append(printable(value, lines=True).rstrip("\n"))
    return out


def stats_tables(report: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str]:
    """``--stats`` as (per-session rows, per-coordinate rows, the totals line); every
    row of every log renders, those of calls that failed validation included."""
    def errors(bucket: dict[str, Any]) -> str:
        return ", ".join(f"{printable(k)} {v}" for k, v in sorted(
            bucket["errors"].items(), key=lambda item: str(item[0]))) or "-"

    sessions = [{**s, "session": session_label(s) or "-", "place": place(s),
                 "errors": errors(s)} for s in report["sessions"]]
    places = [{**c, "place": place(c), "state_mode": c.get("state_mode") or "?",
               "errors": errors(c)} for c in report["coordinates"]]
    totals = report["totals"]
    line = (f"{totals['calls']} calls, errors: {errors(totals)}, {totals['state_losses']} state "
            f"losses, {totals['rebuilds']} rebuilds, {totals['read_only_changed']} read-only "
            "calls whose copy changed something.")
    return sessions, places, line
