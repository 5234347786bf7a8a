"""``coordex log --stats``: what the log says about how sessions were used.

Pure: takes log rows (dicts with the columns of :mod:`coordex.log.store`) and counts,
per session and per coordinate (language x environment x state mode): calls, errors by
``error_type``, state losses, rebuilds, and read-only calls whose copy changed something
(names rebound or deleted, files written in protected folders) - changes the read-only
mode kept out of the session.
"""

from __future__ import annotations

from typing import Any

STATS_COLUMNS = ("kind, language, venv_id, session_id, session_name, state_mode, outcome, "
                 "state_lost, changed, replay_of")


def _blank() -> dict[str, Any]:
    return {"calls": 0, "errors": {}, "state_losses": 0, "rebuilds": 0, "replayed_calls": 0,
            "read_only_changed": 0}


def _count(bucket: dict[str, Any], row: dict[str, Any]) -> None:
    if row.get("kind") == "rebuild":
        bucket["rebuilds"] += 1
        return
    if row.get("kind") != "call":
        return
    bucket["calls"] += 1
    outcome = row.get("outcome")
    if outcome and outcome != "ok":
        bucket["errors"][outcome] = bucket["errors"].get(outcome, 0) + 1
    if row.get("state_lost"):
        bucket["state_losses"] += 1
    if row.get("replay_of") is not None:
        bucket["replayed_calls"] += 1
    if row.get("state_mode") == "read_only" and row.get("changed"):
        bucket["read_only_changed"] += 1


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"totals", "sessions": [...], "coordinates": [...]}`` for ``rows``."""
    totals = _blank()
    sessions: dict[tuple[Any, ...], dict[str, Any]] = {}
    places: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        _count(totals, row)
        if row.get("session_id") is not None or row.get("session_name") is not None:
            key = (row.get("language"), row.get("venv_id"), row.get("session_id"),
                   row.get("session_name"))
            if key not in sessions:
                sessions[key] = {"language": key[0], "venv_id": key[1], "session_id": key[2],
                                 "session_name": key[3], **_blank()}
            _count(sessions[key], row)
        if row.get("kind") in ("call", "rebuild"):
            # A rebuild starts a stateful session over: it counts at that coordinate.
            mode = "stateful" if row.get("kind") == "rebuild" else row.get("state_mode")
            place = (row.get("language"), row.get("venv_id"), mode)
            if place not in places:
                places[place] = {"language": place[0], "venv_id": place[1],
                                 "state_mode": place[2], **_blank()}
            _count(places[place], row)
    return {"totals": totals, "sessions": list(sessions.values()),
            "coordinates": list(places.values())}
