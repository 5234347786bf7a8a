"""What the observe modules share of a call, below them all: standard library only.

:mod:`~coordex.observe.hook` (the call path's hooks), :mod:`~coordex.observe.spans`
and :mod:`~coordex.observe.figures` each read these; none of them imports another to
get them (the hook loads the other two on first use).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

# The key under which a confined host hands its call's facts back to the server.
FACTS_KEY = "_coordex_observed"


_environ = getattr(os.environ, "_data", None)  # os.environ's own (encoded) dict
_CONTENT = (os.environ.encodekey("COORDEX_OTEL_CONTENT")
            if isinstance(_environ, dict) else "")
_ON = os.environ.encodevalue("1") if isinstance(_environ, dict) else ""


def content_on() -> bool:
    """``COORDEX_OTEL_CONTENT=1`` now (read each call, in os.environ's own dict: a
    tenth of ``os.environ.get``)."""
    if isinstance(_environ, dict):
        return bool(_environ.get(_CONTENT) == _ON)
    return os.environ.get("COORDEX_OTEL_CONTENT") == "1"


def coordinates(tool: str, arguments: Mapping[str, Any] | None,
                result: Any) -> dict[str, Any]:
    """A call's coordinates and outcome, from its result (what ran) and its arguments
    (what was asked, for a call that failed before it had a session)."""
    # dict, not Mapping: an ABC check costs a call ~1 us here (results are plain dicts).
    args = arguments if isinstance(arguments, dict) else {}
    record = result if isinstance(result, dict) else {}
    found = record.get("session")
    session: Mapping[str, Any] = found if isinstance(found, dict) else {}
    if tool not in ("execute_code", "call_function") and not session and not any(
            key in args for key in ("language", "state_mode", "session_id", "session_name",
                                    "venv_id")):
        return {"tool": tool, "language": "", "state_mode": "", "session": "", "venv_id": "",
                "place": "", "outcome": _outcome(record), "state_lost": bool(
                    record.get("state_lost")), "retried": bool(record.get("retried"))}
    language = session.get("language") or args.get("language") or "python"
    venv_id = session.get("venv_id") if "venv_id" in session else args.get("venv_id")
    name = session.get("session_name") or args.get("session_name")
    sid = session.get("session_id") if session.get("session_id") is not None \
        else args.get("session_id")
    if language == "bash":
        place = "shell"
    elif venv_id is None:
        place = "own"
    else:
        place = "env"
    if session.get("node"):
        place = "cluster"
    return {
        "tool": tool, "language": str(language),
        "state_mode": str(record.get("state_mode") or args.get("state_mode") or "stateless"),
        "session": "" if name is None and sid is None else str(name if name is not None else sid),
        "venv_id": "" if venv_id is None else str(venv_id), "place": place,
        "outcome": _outcome(record), "state_lost": bool(record.get("state_lost")),
        "retried": bool(record.get("retried")),
    }


def _outcome(record: Mapping[str, Any]) -> str:
    error_type = record.get("error_type")
    if error_type:
        return str(error_type)
    return "running" if record.get("running") else "ok"
