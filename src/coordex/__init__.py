"""coordex: one execute_code tool for LLM agents, placed by coordinates."""

from .aio import AsyncExecutor
from .backends.confined import ConfinedExecutor
from .core.errors import CoordexError
from .executor import Executor
from .library.errors import CallError

__all__ = ["AsyncExecutor", "CallError", "ConfinedExecutor", "CoordexError", "Executor"]
__version__ = "0.1.0"
