"""coordex: one execute_code tool for LLM agents, placed by coordinates."""

from .core.errors import CoordexError
from .executor import Executor

__all__ = ["CoordexError", "Executor"]
__version__ = "0.1.0"
