"""The executor contract, where hosting first defined it; it lives in :mod:`coordex.contract`."""

from __future__ import annotations

from ..contract import FUNCTIONS_IN_PROCESS_ONLY, IN_PROCESS_ONLY, ExecutorLike

__all__ = ["FUNCTIONS_IN_PROCESS_ONLY", "IN_PROCESS_ONLY", "ExecutorLike"]
