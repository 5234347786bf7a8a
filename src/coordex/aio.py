"""``AsyncExecutor``: the Executor for asyncio code.

Each method runs the blocking Executor call in a worker thread, so the event loop keeps
serving other tasks while code runs. Cancelling the awaiting task interrupts the running
code (as a timeout would) through the call's cancel event; the session survives exactly
as it does on a timeout.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from .core.shapes import (
    CheckpointList,
    CheckpointResult,
    CloseResult,
    EnvironmentBuilt,
    EnvironmentCreated,
    EnvironmentList,
    ForkResult,
    HistoryResult,
    InspectResult,
    Language,
    RebuildResult,
    RestoreResult,
    RunResult,
    SessionsResult,
    StateMode,
    UIResult,
)
from .executor import Executor


class AsyncExecutor:
    """Async wrapper over :class:`Executor`; same arguments, same dicts.

    Use ``async with AsyncExecutor(...) as ex:``; ``ex.sync`` is the wrapped Executor
    (for ``capability``, ``functions``, ``plan_namespace`` and ``tool_definitions``).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.sync = Executor(*args, **kwargs)

    async def __aenter__(self) -> AsyncExecutor:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await asyncio.to_thread(self.sync.close)

    async def execute_code(self, code: str, language: Language = "python",
                           state_mode: StateMode = "stateless", session_id: int | None = None,
                           session_name: str | None = None, venv_id: int | None = None,
                           timeout: float | None = None,
                           on_output: Callable[[str, str], None] | None = None, *,
                           on_progress: Callable[[str], None] | None = None,
                           wait: float | None = None) -> RunResult:
        """``Executor.execute_code``; cancelling the task interrupts the code (a call
        already answered ``running`` goes on: :meth:`cancel_call` interrupts it)."""
        cancel = threading.Event()
        task = asyncio.ensure_future(asyncio.to_thread(
            self.sync.execute_code, code, language, state_mode, session_id, session_name,
            venv_id, timeout, on_output, on_progress=on_progress, cancel=cancel, wait=wait))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            cancel.set()
            # The thread stops within the interrupt grace; wait so nothing runs on.
            await asyncio.wait([task])
            raise

    async def list_sessions(self) -> SessionsResult:
        return await asyncio.to_thread(self.sync.list_sessions)

    async def inspect_session(self, language: Language = "python", session_id: int | None = None,
                              session_name: str | None = None,
                              venv_id: int | None = None) -> InspectResult:
        return await asyncio.to_thread(self.sync.inspect_session, language, session_id,
                                       session_name, venv_id)

    async def close_session(self, language: Language = "python", session_id: int | None = None,
                            session_name: str | None = None,
                            venv_id: int | None = None) -> CloseResult:
        return await asyncio.to_thread(self.sync.close_session, language, session_id,
                                       session_name, venv_id)

    async def history(self, language: Language | None = None, session_id: int | None = None,
                      session_name: str | None = None, venv_id: int | None = None,
                      limit: int = 50, seq: int | None = None) -> HistoryResult:
        return await asyncio.to_thread(self.sync.history, language, session_id, session_name,
                                       venv_id, limit, seq)

    async def rebuild_session(self, language: Language = "python", session_id: int | None = None,
                              session_name: str | None = None,
                              venv_id: int | None = None, *,
                              wait: float | None = None) -> RebuildResult:
        return await asyncio.to_thread(self.sync.rebuild_session, language, session_id,
                                       session_name, venv_id, wait=wait)

    async def wait_call(self, call_id: str, wait: float | None = None) -> dict[str, Any]:
        """``Executor.wait_call`` (SPEC 14), off the event loop."""
        return await asyncio.to_thread(self.sync.wait_call, call_id, wait)

    async def cancel_call(self, call_id: str) -> dict[str, Any]:
        """``Executor.cancel_call`` (SPEC 14), off the event loop."""
        return await asyncio.to_thread(self.sync.cancel_call, call_id)

    async def fork_session(self, session_id: int | str | None = None,
                           session_name: str | None = None, language: Language = "python",
                           venv_id: int | None = None, *,
                           new_name: str | None = None) -> ForkResult:
        return await asyncio.to_thread(self.sync.fork_session, session_id, session_name,
                                       language, venv_id, new_name=new_name)

    async def checkpoint_session(self, language: Language = "python",
                                 session_id: int | None = None, session_name: str | None = None,
                                 venv_id: int | None = None, *,
                                 label: str | None = None) -> CheckpointResult:
        return await asyncio.to_thread(self.sync.checkpoint_session, language, session_id,
                                       session_name, venv_id, label=label)

    async def restore_session(self, language: Language = "python", session_id: int | None = None,
                              session_name: str | None = None, venv_id: int | None = None, *,
                              checkpoint: str | None = None) -> RestoreResult:
        return await asyncio.to_thread(self.sync.restore_session, language, session_id,
                                       session_name, venv_id, checkpoint=checkpoint)

    async def list_checkpoints(self, language: Language = "python", session_id: int | None = None,
                               session_name: str | None = None,
                               venv_id: int | None = None) -> CheckpointList:
        return await asyncio.to_thread(self.sync.list_checkpoints, language, session_id,
                                       session_name, venv_id)

    async def serve_ui(self, port: int = 0) -> UIResult:
        return await asyncio.to_thread(self.sync.serve_ui, port)

    async def create_environment(self, spec: str, name: str | None = None) -> EnvironmentCreated:
        return await asyncio.to_thread(self.sync.environments.create, spec, name)

    async def build_environment(self, venv_id: int, on_progress: Callable[[str], None] | None = None,
                                ) -> EnvironmentBuilt:
        return await asyncio.to_thread(self.sync.environments.build, venv_id, on_progress)

    async def list_environments(self) -> EnvironmentList:
        return await asyncio.to_thread(self.sync.environments.list)

    async def call_tool(self, name: str,
                        arguments: dict[str, Any] | str | None = None) -> dict[str, Any]:
        """``Executor.call_tool``: a model's tool call, routed off the event loop."""
        return await asyncio.to_thread(self.sync.call_tool, name, arguments)
