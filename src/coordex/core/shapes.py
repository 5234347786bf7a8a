"""The shapes of what the public API takes and returns, for a user's type checker (SPEC 2).

The axes are ``Literal`` types, so ``state_mode="readonly"`` is flagged before it runs;
the results are ``TypedDict``s, so ``r["reslt"]`` is flagged and ``r["result"]`` is
``str | None``. At run time they are plain dicts, exactly as SPEC sections 3 and 4 say.

Every method may return the SPEC error dict instead of its result, so each result type
also holds the error keys and every key is optional (``total=False``): test for an error
with ``"error" in r`` (or ``r.get("error_type")``) before reading result keys.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

from .coordinates import Language, StateMode
from .errors import ErrorType

# The axes are defined once, in core.coordinates, and re-exported here (__all__).
ToolFormat = Literal["openai", "openai-responses", "anthropic", "mcp"]


class ErrorFields(TypedDict, total=False):
    """The SPEC section 4 error dict; any result may be one."""

    error: str
    error_type: ErrorType
    suggestion: str
    traceback: str
    log: str


class SessionRecord(TypedDict):
    """Which session a call ran in (``session_id``/``session_name`` None: stateless)."""

    language: Language
    venv_id: int | None
    session_id: int | None
    session_name: str | None


class Image(TypedDict):
    mime: str
    data: str


class Isolation(TypedDict, total=False):
    """How a read-only call was kept from changing anything."""

    names: bool
    objects: bool
    files: str
    copy: str


class RunResult(ErrorFields, total=False):
    """``execute_code``: SPEC section 3 (or an error)."""

    stdout: str
    stderr: str
    truncated: bool
    result: str | None
    exit_code: int | None
    images: list[Image]
    session: SessionRecord
    state_mode: StateMode
    duration_ms: float
    isolation: Isolation
    state_lost: bool
    retried: bool
    # SPEC 14: a call given ``wait`` carries its ``call_id``; one still running then is
    # ``{"running": True, "call_id", "elapsed_ms", "stdout", "stderr", "session",
    # "state_mode", "suggestion"}``; a result handed to a re-sent call is
    # ``redelivered``; one read back from the call log says ``from_log``.
    call_id: str
    running: bool
    elapsed_ms: float
    redelivered: bool
    from_log: bool
    # SPEC 14: files holding the whole of what the result cut ("stdout", "stderr",
    # "result"), present only then.
    spilled: dict[str, str]
    # A call that ran but whose row the call log could not keep (a full disk) says so.
    warning: str


class SessionInfo(TypedDict, total=False):
    language: Language
    venv_id: int | None
    session_id: int
    session_name: str | None
    created_at: float
    last_used_at: float
    calls: int
    alive: bool
    node: str


class SessionsResult(ErrorFields, total=False):
    """``list_sessions``."""

    sessions: list[SessionInfo]
    max_sessions: int


class NameInfo(TypedDict, total=False):
    name: str
    type: str
    repr: str
    bound_at_call: int | None
    calls_ago: int | None


class InspectResult(ErrorFields, total=False):
    """``inspect_session``: Python sessions list ``names``; bash ones the rest."""

    names: list[NameInfo]
    capabilities: list[str]
    functions: Any
    cwd: str
    variables: dict[str, str]
    aliases: dict[str, str]
    session: SessionInfo


class CloseResult(ErrorFields, total=False):
    """``close_session``."""

    closed: bool
    session: SessionInfo


class HistoryRecord(TypedDict, total=False):
    seq: int
    at: float
    language: Language | None
    venv_id: int | None
    session_id: int | None
    session_name: str | None
    state_mode: StateMode | None
    code: str
    duration_ms: float
    outcome: str
    state_lost: bool


class HistoryResult(ErrorFields, total=False):
    """``history``: ``calls`` newest last, or ``call`` for one ``seq``."""

    calls: list[HistoryRecord]
    call: HistoryRecord


class RebuildResult(ErrorFields, total=False):
    """``rebuild_session``."""

    replayed: int
    failed_at: int | None
    session: SessionRecord
    calls: list[int]
    skipped_failed: list[int]
    failure: dict[str, Any]


class ForkResult(ErrorFields, total=False):
    """``fork_session`` (SPEC 15): the new session and the one it was copied from."""

    session: SessionRecord
    # "from" is a Python keyword: the key is set, and read, as a string.
    ms: float
    copy: str
    left_out: list[str]
    files: str


class CheckpointInfo(TypedDict, total=False):
    checkpoint: str
    label: str | None
    at: float
    bytes: int | None
    left_out: list[str]


class CheckpointResult(ErrorFields, total=False):
    """``checkpoint_session`` (SPEC 15)."""

    checkpoint: str
    label: str | None
    at: float
    bytes: int
    ms: float
    left_out: list[str]
    session: SessionRecord
    dropped: list[CheckpointInfo]
    note: str


class RestoreResult(ErrorFields, total=False):
    """``restore_session`` (SPEC 15)."""

    restored: bool
    checkpoint: str
    label: str | None
    at: float
    session: SessionRecord
    ms: float
    left_out: list[str]
    files: str


class CheckpointList(ErrorFields, total=False):
    """``list_checkpoints`` (SPEC 15): newest last."""

    checkpoints: list[CheckpointInfo]
    session: SessionRecord
    max_checkpoints: int


class UIResult(ErrorFields, total=False):
    """``serve_ui``."""

    url: str


class EnvironmentCreated(ErrorFields, total=False):
    """``environments.create``: ``created`` False when an equal spec had an id."""

    venv_id: int
    name: str | None
    spec_hash: str
    built: bool
    created: bool
    note: str


class EnvironmentInfo(TypedDict):
    venv_id: int
    name: str | None
    spec_hash: str
    built: bool
    created_at: float
    last_used_at: float | None


class EnvironmentList(ErrorFields, total=False):
    """``environments.list``."""

    environments: list[EnvironmentInfo]


class PackageInfo(TypedDict):
    name: str
    version: str


class EnvironmentShown(ErrorFields, total=False):
    """``environments.show``: the spec and, once built, the packages in it."""

    venv_id: int
    name: str | None
    spec: str
    requirements: list[str]
    spec_hash: str
    built: bool
    path: str | None
    packages: list[PackageInfo]
    created_at: float
    last_used_at: float | None


class EnvironmentBuilt(ErrorFields, total=False):
    """``environments.build``: ``cached`` True when it was built already."""

    venv_id: int
    built: bool
    path: str
    python: str
    duration_ms: float
    cached: bool


__all__ = [
    "CheckpointInfo", "CheckpointList", "CheckpointResult", "CloseResult",
    "EnvironmentBuilt", "EnvironmentCreated", "EnvironmentInfo", "EnvironmentList",
    "EnvironmentShown", "ErrorFields", "ForkResult", "HistoryRecord", "HistoryResult",
    "Image", "InspectResult", "Isolation", "Language", "NameInfo", "PackageInfo",
    "RebuildResult", "RestoreResult", "RunResult", "SessionInfo", "SessionRecord",
    "SessionsResult", "StateMode", "ToolFormat", "UIResult",
]
