"""The coordinate model: where one call runs, and the rules that make a coordinate legal.

A call names four independent axes (SPEC section 1): language, state mode, session
(``session_id`` or ``session_name``, never both) and environment (``venv_id``). This
module checks the raw arguments a model sent and turns them into a frozen
:class:`Coordinate`, or raises a ``validation`` :class:`CoordexError` whose suggestion
names the fix. Whether a named session *exists* is the registry's question, not this one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, cast

from .errors import CoordexError, nearest, validation

Language = Literal["python", "bash"]
StateMode = Literal["stateless", "stateful", "read_only"]
LANGUAGES: tuple[Language, ...] = ("python", "bash")
STATE_MODES: tuple[StateMode, ...] = ("stateless", "stateful", "read_only")
MAX_SESSION_NAME = 200
MAX_SESSION_ID = 2**31 - 1  # JSON clients (JavaScript) lose precision above 2**53 anyway
# Ids are SQLite INTEGERs (64-bit); a larger one can name nothing stored.
MAX_VENV_ID = 2**63 - 1
MAX_TIMEOUT = 7 * 24 * 3600.0  # beyond a week a deadline is a mistake, and OS waits overflow


@dataclass(frozen=True)
class SessionKey:
    """A session's identity: (language, environment, id). Names are aliases for ids."""

    language: Language
    venv_id: int | None
    session_id: int

    def __post_init__(self) -> None:
        # Keys are looked up several times a call: hash the three fields once.
        object.__setattr__(self, "_hash", hash((self.language, self.venv_id, self.session_id)))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined,no-any-return]

    def describe(self) -> str:
        where = "own interpreter" if self.venv_id is None else f"venv_id={self.venv_id}"
        return f"{self.language} session {self.session_id} ({where})"


@dataclass(frozen=True)
class Coordinate:
    """A validated call coordinate. ``session_id``/``session_name`` are as the caller gave them."""

    language: Language
    state_mode: StateMode
    venv_id: int | None
    session_id: int | None
    session_name: str | None

    @property
    def names_session(self) -> bool:
        return self.session_id is not None or self.session_name is not None


def is_valid_text(text: str) -> bool:
    """False for text with a lone surrogate (``'caf\\udce9'``, from undecodable bytes):
    it cannot be stored, logged or sent as UTF-8, so names and specs refuse it."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_choice(argument: str, value: Any, choices: tuple[str, ...], usage: str) -> str:
    """``value`` if it is one of ``choices``, else a validation error with a guess."""
    if isinstance(value, str) and value in choices:
        return value
    guess = nearest(value, choices) if isinstance(value, str) else None
    hint = f" Did you mean {argument}={guess!r}?" if guess else ""
    raise validation(f"Unknown {argument} {_short(value)}.", f"{usage}{hint}")


def check_language(language: Any) -> Language:
    return cast(Language, _check_choice(
        "language", language, LANGUAGES, "Use language='python' or language='bash'."))


def check_state_mode(state_mode: Any) -> StateMode:
    return cast(StateMode, _check_choice(
        "state_mode", state_mode, STATE_MODES,
        "Use state_mode='stateless' (a fresh run), 'stateful' (a kept session) or "
        "'read_only' (a look at an existing session that changes nothing)."))


def check_venv_id(venv_id: Any) -> int | None:
    if venv_id is None:
        return None
    if not _is_int(venv_id) or not 0 <= venv_id <= MAX_VENV_ID:
        raise validation(
            f"venv_id must be None or an integer from 0 to {MAX_VENV_ID}, got "
            f"{_short(venv_id)}.",
            "Use venv_id=None for the agent's own interpreter, or the venv_id returned by "
            "environments.create / list_environments.",
        )
    return int(venv_id)


def check_session(session_id: Any, session_name: Any) -> tuple[int | None, str | None]:
    if session_id is not None and session_name is not None:
        raise validation(
            "Cannot specify both session_id and session_name.",
            f"Pass only one: session_id={_short(session_id)} or session_name={_short(session_name)}.",
        )
    if session_id is not None and (not _is_int(session_id) or not 0 <= session_id <= MAX_SESSION_ID):
        raise validation(
            f"session_id must be an integer from 0 to {MAX_SESSION_ID}, got {_short(session_id)}.",
            "Use an integer such as session_id=1, or name the session with session_name='...'.",
        )
    if session_name is not None:
        if not isinstance(session_name, str):
            raise validation(
                f"session_name must be a string, got {type(session_name).__name__} "
                f"{_short(session_name)}.",
                "Use a short text name such as session_name='audit', or session_id=<int>.",
            )
        if not session_name.strip() or len(session_name) > MAX_SESSION_NAME \
                or "\x00" in session_name or not is_valid_text(session_name):
            raise validation(
                f"session_name {_short(session_name)} is not a usable name.",
                f"Use a non-empty name of at most {MAX_SESSION_NAME} characters without NUL "
                "or undecodable characters (lone surrogates), such as session_name='audit'.",
            )
    return session_id, session_name


def check_coordinate(
    language: Any = "python",
    state_mode: Any = "stateless",
    session_id: Any = None,
    session_name: Any = None,
    venv_id: Any = None,
) -> Coordinate:
    """Validate the raw call arguments (types, values, and mode/session rules)."""
    # Most calls name a coordinate seen before: plain arguments are looked up (their
    # exact types first, so 1, 1.0 and True never share an entry).
    plain = type(language) is str and type(state_mode) is str \
        and type(session_id) in _ID_TYPES and type(session_name) in _NAME_TYPES \
        and type(venv_id) in _ID_TYPES
    if plain:
        asked = (language, state_mode, session_id, session_name, venv_id)
        found = _CHECKED.get(asked)
        if found is not None:
            return found
    coordinate = _check_coordinate(language, state_mode, session_id, session_name, venv_id)
    if plain:
        if len(_CHECKED) >= _CHECKED_MAX:
            _CHECKED.clear()
        _CHECKED[asked] = coordinate
    return coordinate


_ID_TYPES = (int, type(None))
_NAME_TYPES = (str, type(None))
_CHECKED: dict[tuple[Any, ...], Coordinate] = {}  # plain arguments -> their coordinate
_CHECKED_MAX = 1024


def _check_coordinate(language: Any, state_mode: Any, session_id: Any, session_name: Any,
                      venv_id: Any) -> Coordinate:
    lang = check_language(language)
    mode = check_state_mode(state_mode)
    sid, sname = check_session(session_id, session_name)
    venv = check_venv_id(venv_id)
    coordinate = Coordinate(lang, mode, venv, sid, sname)
    if mode == "stateless" and coordinate.names_session:
        named = f"session_id={sid!r}" if sid is not None else f"session_name={sname!r}"
        raise validation(
            f"Cannot use state_mode='stateless' with a session ({named}): a stateless run "
            "starts fresh and keeps nothing.",
            f"Drop {named.split('=')[0]} for a one-off run, or use state_mode='stateful' to run "
            f"in that session (or 'read_only' to look at it without changing it).",
        )
    if mode == "read_only" and not coordinate.names_session:
        raise validation(
            "Cannot use state_mode='read_only' without specifying a session.",
            "Provide session_id or session_name (must refer to an existing session), "
            "or use state_mode='stateless'.",
        )
    return coordinate


def check_code(code: Any) -> str:
    if not isinstance(code, str):
        raise validation(
            f"code must be a string, got {type(code).__name__}.",
            "Pass the source to run as a string, e.g. code='print(1)'.",
        )
    return code


def check_timeout(timeout: Any) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
            or not 0 < timeout <= MAX_TIMEOUT:
        raise validation(
            f"timeout must be a number of seconds above 0 and at most {MAX_TIMEOUT:.0f} "
            f"(a week), got {_short(timeout)}.",
            "Use e.g. timeout=30, or omit it for the executor's default.",
        )
    return float(timeout)


def _short(value: Any, limit: int = 80) -> str:
    try:
        text = repr(value)
    except Exception:  # a hostile __repr__ must not break the error path
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


__all__ = [
    "LANGUAGES",
    "STATE_MODES",
    "CoordexError",
    "Coordinate",
    "Language",
    "SessionKey",
    "StateMode",
    "check_code",
    "check_coordinate",
    "check_language",
    "check_session",
    "check_state_mode",
    "check_timeout",
    "check_venv_id",
]
