"""The session registry: which sessions exist, their names, the cap, their lifecycle.

Sessions are keyed by :class:`SessionKey` (language, environment, id). Within one
(language, environment) a name maps to exactly one id; a new name takes the lowest free
id above 0, because id 0 is the default session a stateful call without a session uses.
Python session 0 of the agent's own interpreter (the plan namespace) exists from the
start, counts toward the cap, and can never be closed.

Lifecycle: a session is ``starting``, ``idle``, ``busy``, ``broken`` or ``closed``, and
only :meth:`SessionRegistry.move` changes that, following ``TRANSITIONS``; an illegal
move raises ``RuntimeError`` because it is a bug in coordex, not in the caller's input.

The registry also keeps per-name provenance for Python sessions (``bound_at_call``): the
backends report which names a call rebound and the registry stamps them with the call's
sequence number. Time is always passed in, so this module stays pure.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from .coordinates import Coordinate, Language, SessionKey
from .errors import CoordexError, nearest

SessionState = Literal["starting", "idle", "busy", "broken", "closed"]

# Every legal lifecycle move. ``broken`` means the process holding the session died or
# is stuck; the next call either replaces it (-> starting) or the session is closed.
TRANSITIONS: dict[SessionState, frozenset[SessionState]] = {
    "starting": frozenset({"idle", "broken", "closed"}),
    "idle": frozenset({"busy", "broken", "closed", "starting"}),
    "busy": frozenset({"idle", "broken", "closed"}),
    "broken": frozenset({"starting", "closed", "idle"}),
    "closed": frozenset(),
}

PLAN_KEY = SessionKey("python", None, 0)
DEFAULT_MAX_SESSIONS = 20
LANGUAGE_TITLE = {"python": "Python", "bash": "bash"}


@dataclass
class SessionEntry:
    key: SessionKey
    name: str | None
    created_at: float
    last_used_at: float
    calls: int = 0
    state: SessionState = "starting"
    bindings: dict[str, int] = field(default_factory=dict)

    @property
    def alive(self) -> bool:
        return self.state in ("idle", "busy", "starting")

    def record(self) -> dict[str, Any]:
        return {
            "language": self.key.language,
            "venv_id": self.key.venv_id,
            "session_id": self.key.session_id,
            "session_name": self.name,
            "created_at": self.created_at,
            "last_used_at": self.last_used_at,
            "calls": self.calls,
            "alive": self.alive,
        }

    def label(self) -> str:
        if self.key.venv_id is not None:
            where = f"venv_id={self.key.venv_id}"
        else:
            where = "own interpreter" if self.key.language == "python" else "no environment"
        ident = repr(self.name) if self.name is not None else f"id {self.key.session_id}"
        return f"{ident} ({self.key.language}, {where})"


class SessionRegistry:
    """Sessions by key, names by (language, environment), the cap and the lifecycle."""

    def __init__(self, max_sessions: int = DEFAULT_MAX_SESSIONS, now: float = 0.0) -> None:
        if max_sessions < 1:
            raise ValueError("max_sessions must be at least 1 (the plan namespace is a session)")
        self.max_sessions = max_sessions
        self._entries: dict[SessionKey, SessionEntry] = {}
        self._names: dict[tuple[Language, int | None, str], int] = {}
        plan = SessionEntry(PLAN_KEY, None, now, now, state="idle")
        self._entries[PLAN_KEY] = plan

    # -- lookup ---------------------------------------------------------------------

    def get(self, key: SessionKey) -> SessionEntry | None:
        return self._entries.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def entries(self) -> list[SessionEntry]:
        return sorted(
            self._entries.values(),
            key=lambda e: (e.key.language, -1 if e.key.venv_id is None else e.key.venv_id,
                           e.key.session_id),
        )

    def find(self, coordinate: Coordinate) -> SessionKey | None:
        """The existing session a coordinate names (id 0 when it names none), or None."""
        language, venv = coordinate.language, coordinate.venv_id
        if coordinate.session_name is not None:
            sid = self._names.get((language, venv, coordinate.session_name))
            if sid is None:
                return None
            entry = self._entries.get(SessionKey(language, venv, sid))
            return entry.key if entry is not None else SessionKey(language, venv, sid)
        entry = self._entries.get(SessionKey(language, venv, coordinate.session_id or 0))
        return entry.key if entry is not None else None  # the table's own key object

    def require(self, coordinate: Coordinate) -> SessionKey:
        """The existing session a coordinate names, else a ``not_found`` error."""
        key = self.find(coordinate)
        if key is None:
            raise self.not_found(coordinate)
        return key

    def resolve_or_reserve(self, coordinate: Coordinate, now: float) -> tuple[SessionKey, bool]:
        """For a stateful call: the named session, created if new. Returns (key, created)."""
        key = self.find(coordinate)
        if key is not None:
            return key, False
        if coordinate.session_name is not None:
            sid = self._next_free_id(coordinate.language, coordinate.venv_id)
        else:
            sid = coordinate.session_id or 0
        key = SessionKey(coordinate.language, coordinate.venv_id, sid)
        self.reserve(key, coordinate.session_name, now)
        return key, True

    # -- creation and removal -------------------------------------------------------------

    def reserve(self, key: SessionKey, name: str | None, now: float) -> SessionEntry:
        if key in self._entries:
            raise RuntimeError(f"session {key} already exists")
        self.check_capacity()
        entry = SessionEntry(key, name, now, now)
        self._entries[key] = entry
        if name is not None:
            self._names[(key.language, key.venv_id, name)] = key.session_id
        return entry

    def check_capacity(self) -> None:
        if len(self._entries) >= self.max_sessions:
            open_sessions = [e.record() for e in self.entries()]
            labels = ", ".join(e.label() for e in self.entries() if e.key != PLAN_KEY)
            raise CoordexError(
                "capacity",
                f"Cannot open another session: {len(self._entries)} of max_sessions="
                f"{self.max_sessions} are open.",
                "Close a session you no longer need with close_session(...) (open: "
                f"{labels or 'only the plan namespace'}), reuse an open session, or use "
                "state_mode='stateless' which needs no session.",
                sessions=open_sessions,
            )

    def remove(self, key: SessionKey) -> SessionEntry:
        if key == PLAN_KEY:
            raise CoordexError(
                "validation",
                "Python session 0 of the agent's own interpreter is the plan namespace and "
                "cannot be closed.",
                "Close a different session, or delete names from the plan namespace with "
                "execute_code('del name', state_mode='stateful').",
            )
        self.move(key, "closed")
        entry = self._entries.pop(key)
        if entry.name is not None:
            self._names.pop((key.language, key.venv_id, entry.name), None)
        return entry

    def _next_free_id(self, language: Language, venv_id: int | None) -> int:
        used = {k.session_id for k in self._entries if k.language == language
                and k.venv_id == venv_id}
        used.update(sid for (lang, venv, _), sid in self._names.items()
                    if lang == language and venv == venv_id)
        sid = 1
        while sid in used:
            sid += 1
        return sid

    # -- lifecycle --------------------------------------------------------------------

    def move(self, key: SessionKey, state: SessionState) -> None:
        entry = self._entries[key]
        if state != entry.state and state not in TRANSITIONS[entry.state]:
            raise RuntimeError(f"illegal session move {entry.state} -> {state} for {key}")
        entry.state = state

    def begin_call(self, key: SessionKey, now: float) -> int:
        """Count a call against the session; returns its sequence number (1-based)."""
        entry = self._entries[key]
        entry.calls += 1
        entry.last_used_at = now
        return entry.calls

    # -- provenance -------------------------------------------------------------------

    def record_bindings(self, key: SessionKey, call: int, rebound: Iterable[str],
                        deleted: Iterable[str] = ()) -> None:
        entry = self._entries.get(key)
        if entry is None:
            return
        for name in rebound:
            entry.bindings[name] = call
        for name in deleted:
            entry.bindings.pop(name, None)

    def keep_bindings_of(self, key: SessionKey, call: int) -> None:
        """The session's state was lost during ``call``: what was bound before went
        with it; only that call's own names are left."""
        entry = self._entries.get(key)
        if entry is not None:
            entry.bindings = {n: c for n, c in entry.bindings.items() if c == call}

    def provenance(self, key: SessionKey, name: str) -> tuple[int, int]:
        """(bound_at_call, calls_ago) for one name; names bound before coordex are call 0."""
        entry = self._entries[key]
        bound = entry.bindings.get(name, 0)
        return bound, entry.calls - bound

    # -- errors -----------------------------------------------------------------------

    def not_found(self, coordinate: Coordinate) -> CoordexError:
        language, venv = coordinate.language, coordinate.venv_id
        title = LANGUAGE_TITLE[language]
        if venv is not None:
            where = f"venv_id={venv}"
        else:
            where = "the agent's own interpreter" if language == "python" else "the host (no environment)"
        same = [e for e in self.entries() if e.key.language == language and e.key.venv_id == venv]
        opened = ", ".join(e.label() for e in same) or "none"
        if coordinate.session_name is not None:
            what = f"No {title} session named {coordinate.session_name!r} in {where}."
            names = [e.name for e in same if e.name is not None]
            guess = nearest(coordinate.session_name, names)
            hint = f" Did you mean session_name={guess!r}?" if guess else ""
        else:
            what = f"No {title} session with session_id={coordinate.session_id or 0} in {where}."
            hint = ""
        suggestion = (
            f"Open {title} sessions there: {opened}.{hint} A session is created by its first "
            "call with state_mode='stateful'; use that, or state_mode='stateless' for a one-off."
        )
        return CoordexError("not_found", what, suggestion)
