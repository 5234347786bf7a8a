"""The one executor contract every front end is typed against (SPEC 2, 9).

:class:`ExecutorLike` is what a front end — the MCP server, the tool router, the page,
the eval, the tenants' router and host — may use of an executor, whether it is an
:class:`~coordex.Executor` in this process or a :class:`~coordex.ConfinedExecutor` whose
Executor runs in a jail. It sits at the package's top, beside ``core/``, so a front end
imports it without importing the Executor (no circle, no cost).

What the Executor offers beyond it lives in its own process and cannot travel:
:data:`IN_PROCESS_ONLY`. Two tests keep the three in step — the Executor, this protocol
and the confined host's wire (``wire.METHODS``) — and mypy checks that ``Executor``, ``AsyncExecutor``'s
``sync`` core and ``ConfinedExecutor`` satisfy the protocol (the block at the end), so a method
added to one and not the other fails the suite instead of drifting.

A new executor method a front end calls goes here first, then on both executors.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .core.shapes import Language, StateMode, ToolFormat

# The Executor's public names that are objects of its own process, not data: what a
# ConfinedExecutor does not offer (SPEC 9: "everything but plan_namespace and capability").
IN_PROCESS_ONLY = ("plan_namespace", "capability", "call_capability", "run_function_code",
                   "environments_manager", "running_calls", "run_recorded", "take_unsaid_loss")
# Of ``functions``, the ones that hand back objects of the host (a stored function to
# call in Python, a decorator taking a function object) rather than data.
FUNCTIONS_IN_PROCESS_ONLY = ("get", "stateless", "stateful", "read_only")

OnOutput = Callable[[str, str], None]
#: Every result crosses as JSON-ready data: a dict with string keys (the shapes of
#: :mod:`coordex.core.shapes` are its precise forms, the Executor returns those).
Result = dict[str, Any]


@runtime_checkable
class ExecutorLike(Protocol):
    """What hosting and the front ends use of an executor; every method returns
    JSON-ready data and never raises for bad arguments."""

    @property
    def timeout(self) -> float:
        """The default per-call timeout, in seconds."""

    @property
    def environments(self) -> Any:
        """``ex.environments``: create / build / list / show / remove (SPEC 4)."""

    @property
    def functions(self) -> Any:
        """``ex.functions``: define / list / show / call stored functions (SPEC 5)."""

    def execute_code(self, code: str, language: Language = ..., state_mode: StateMode = ...,
                     session_id: int | None = ..., session_name: str | None = ...,
                     venv_id: int | None = ..., timeout: float | None = ...,
                     on_output: OnOutput | None = ..., *,
                     on_progress: Callable[[str], None] | None = ...,
                     cancel: threading.Event | None = ..., wait: float | None = ...
                     ) -> Mapping[str, Any]: ...

    def list_sessions(self) -> Any: ...

    def inspect_session(self, language: Language = ..., session_id: int | None = ...,
                        session_name: str | None = ..., venv_id: int | None = ...) -> Any: ...

    def close_session(self, language: Language = ..., session_id: int | None = ...,
                      session_name: str | None = ..., venv_id: int | None = ...) -> Any: ...

    def history(self, *, language: Language | None = ..., session_id: int | None = ...,
                session_name: str | None = ..., venv_id: int | None = ...,
                limit: int = ..., seq: int | None = ...) -> Any: ...

    def rebuild_session(self, *, language: Language = ..., session_id: int | None = ...,
                        session_name: str | None = ..., venv_id: int | None = ...,
                        wait: float | None = ...) -> Any: ...

    def fork_session(self, session_id: int | str | None = ..., session_name: str | None = ...,
                     language: Language = ..., venv_id: int | None = ..., *,
                     new_name: str | None = ...) -> Any: ...

    def checkpoint_session(self, language: Language = ..., session_id: int | None = ...,
                           session_name: str | None = ..., venv_id: int | None = ..., *,
                           label: str | None = ...) -> Any: ...

    def restore_session(self, language: Language = ..., session_id: int | None = ...,
                        session_name: str | None = ..., venv_id: int | None = ..., *,
                        checkpoint: str | None = ...) -> Any: ...

    def list_checkpoints(self, language: Language = ..., session_id: int | None = ...,
                         session_name: str | None = ..., venv_id: int | None = ...) -> Any: ...

    def serve_ui(self, port: int = ..., *, host: str = ...) -> Any: ...

    def wait_call(self, call_id: str, wait: float | None = ...) -> Result: ...

    def cancel_call(self, call_id: str) -> Result: ...

    def hold_call(self, call_id: str) -> Result: ...

    def read_spilled(self, uri: str) -> Result: ...

    def tool_definitions(self, format: ToolFormat = ...) -> list[dict[str, Any]]: ...

    def call_tool(self, name: str, arguments: dict[str, Any] | str | None = ...) -> Result: ...

    def close(self) -> None: ...


@runtime_checkable
class ForwardsTools(Protocol):
    """An executor that takes a front end's whole tool call elsewhere (a confined host's
    client: over its pipe, to the host's own router), instead of the front end routing
    it here with :func:`coordex.tools.call_tool`."""

    def forward_tool(self, name: str, arguments: Any = ..., on_output: OnOutput | None = ...,
                     cancel: threading.Event | None = ...) -> Result: ...


if TYPE_CHECKING:  # mypy holds each executor to the contract (the suite's ``mypy`` run)
    from .aio import AsyncExecutor
    from .executor import Executor
    from .hosting.client import ConfinedExecutor

    def _an_executor_is_one(ex: Executor) -> ExecutorLike:
        return ex

    def _a_confined_executor_is_one(ex: ConfinedExecutor) -> ExecutorLike:
        return ex

    def _an_async_executors_core_is_one(ex: AsyncExecutor) -> ExecutorLike:
        return ex.sync

    def _a_confined_executor_forwards(ex: ConfinedExecutor) -> ForwardsTools:
        return ex


__all__ = ["FUNCTIONS_IN_PROCESS_ONLY", "IN_PROCESS_ONLY", "ExecutorLike", "ForwardsTools",
           "OnOutput", "Result"]
