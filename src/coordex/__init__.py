"""coordex: one execute_code tool for LLM agents, placed by coordinates."""

from typing import TYPE_CHECKING, Any

from .core.errors import CoordexError
from .core.shapes import (
    CloseResult,
    EnvironmentBuilt,
    EnvironmentCreated,
    EnvironmentList,
    HistoryResult,
    InspectResult,
    Language,
    RebuildResult,
    RunResult,
    SessionsResult,
    StateMode,
    ToolFormat,
    UIResult,
)
from .executor import Executor
from .library.errors import CallError

if TYPE_CHECKING:
    from .aio import AsyncExecutor
    from .hosting import ConfinedExecutor

__all__ = [
    "AsyncExecutor", "CallError", "CloseResult", "ConfinedExecutor", "CoordexError",
    "EnvironmentBuilt", "EnvironmentCreated", "EnvironmentList", "Executor", "HistoryResult",
    "InspectResult", "Language", "RebuildResult", "RunResult", "SessionsResult", "StateMode",
    "ToolFormat", "UIResult",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # Loaded on first use: asyncio alone takes ~120 ms to import, a third of a confined
    # host's start, and a host never needs it.
    if name == "AsyncExecutor":
        from .aio import AsyncExecutor

        return AsyncExecutor
    if name == "ConfinedExecutor":
        from .hosting import ConfinedExecutor

        return ConfinedExecutor
    raise AttributeError(f"module 'coordex' has no attribute {name!r}")
