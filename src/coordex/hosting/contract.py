"""The one Executor contract hosting is typed against (SPEC 2, 9).

:class:`ExecutorLike` is what a front end (the MCP server, the page, the tenants'
router) may use of an executor, whether it is an :class:`~coordex.Executor` in this
process or a :class:`~coordex.ConfinedExecutor` whose Executor runs in a jail. What the
Executor offers beyond it lives in its own process and cannot travel:
:data:`IN_PROCESS_ONLY`. A test keeps the three in step — the Executor, this protocol
and the confined host's wire (``wire.METHODS``) — so a method added to the Executor
that a confined executor does not offer fails the suite instead of drifting.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

# The Executor's public names that are objects of its own process, not data: what a
# ConfinedExecutor does not offer (SPEC 9: "everything but plan_namespace and capability").
IN_PROCESS_ONLY = ("plan_namespace", "capability", "call_capability", "run_function_code",
                   "environments_manager", "running_calls", "run_recorded")
# Of ``functions``, the ones that hand back objects of the host (a stored function to
# call in Python, a decorator taking a function object) rather than data.
FUNCTIONS_IN_PROCESS_ONLY = ("get", "stateless", "stateful", "read_only")


@runtime_checkable
class ExecutorLike(Protocol):
    """What hosting and the front ends use of an executor; every method returns
    JSON-ready data and never raises for bad arguments."""

    environments: Any
    functions: Any

    def execute_code(self, code: str, language: Any = ..., state_mode: Any = ...,
                     session_id: int | None = ..., session_name: str | None = ...,
                     venv_id: int | None = ..., timeout: float | None = ...,
                     on_output: Any = ..., **extra: Any) -> Any: ...

    def list_sessions(self) -> Any: ...

    def inspect_session(self, language: Any = ..., session_id: int | None = ...,
                        session_name: str | None = ..., venv_id: int | None = ...) -> Any: ...

    def close_session(self, language: Any = ..., session_id: int | None = ...,
                      session_name: str | None = ..., venv_id: int | None = ...) -> Any: ...

    def history(self, **options: Any) -> Any: ...

    def rebuild_session(self, **options: Any) -> Any: ...

    def fork_session(self, session_id: Any = ..., session_name: str | None = ...,
                     language: Any = ..., venv_id: int | None = ..., *,
                     new_name: str | None = ...) -> Any: ...

    def checkpoint_session(self, language: Any = ..., session_id: int | None = ...,
                           session_name: str | None = ..., venv_id: int | None = ..., *,
                           label: str | None = ...) -> Any: ...

    def restore_session(self, language: Any = ..., session_id: int | None = ...,
                        session_name: str | None = ..., venv_id: int | None = ..., *,
                        checkpoint: str | None = ...) -> Any: ...

    def list_checkpoints(self, language: Any = ..., session_id: int | None = ...,
                         session_name: str | None = ..., venv_id: int | None = ...) -> Any: ...

    def serve_ui(self, port: int = ..., *, host: str = ...) -> Any: ...

    def wait_call(self, call_id: str, wait: float | None = ...) -> Any: ...

    def cancel_call(self, call_id: str) -> Any: ...

    def hold_call(self, call_id: str) -> Any: ...

    def tool_definitions(self, format: Any = ..., **options: Any) -> Any: ...

    def call_tool(self, name: str, arguments: Any = ..., **options: Any) -> Any: ...

    def close(self) -> None: ...


__all__ = ["FUNCTIONS_IN_PROCESS_ONLY", "IN_PROCESS_ONLY", "ExecutorLike"]
