"""Which session a fork was made from (SPEC 15), while both are open in one executor: what
the page shows beside a forked session. Pure: a map per executor, dropped with it."""

from __future__ import annotations

import weakref
from typing import Any

_FORKS: weakref.WeakKeyDictionary[Any, dict[tuple[Any, Any, Any], dict[str, Any]]] = \
    weakref.WeakKeyDictionary()


def _where(record: dict[str, Any]) -> tuple[Any, Any, Any]:
    return (record.get("language"), record.get("venv_id"), record.get("session_id"))


def note_fork(executor: Any, new: dict[str, Any], source: dict[str, Any]) -> None:
    """Say that session ``new`` was forked from ``source`` in ``executor``."""
    _FORKS.setdefault(executor, {})[_where(new)] = dict(source)


def forked_from(executor: Any, record: dict[str, Any]) -> dict[str, Any] | None:
    """The session ``record``'s session was forked from in ``executor``, if it was (None
    for any other executor-like object: a confined host's client)."""
    try:
        return _FORKS.get(executor, {}).get(_where(record))
    except TypeError:  # an object that cannot be weakly referenced notes no fork
        return None


def forget_fork(executor: Any, record: dict[str, Any]) -> None:
    """``close_session``: the closed session is no longer anyone's fork."""
    try:
        _FORKS.get(executor, {}).pop(_where(record), None)
    except TypeError:
        pass
