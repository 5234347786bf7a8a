"""``ex.environments``: the environment manager as dicts that never raise."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from ..core.errors import CoordexError
from ..core.shapes import EnvironmentBuilt, EnvironmentCreated, EnvironmentList, EnvironmentShown


class Environments:
    """``ex.environments``: a thin dict-returning facade over the environment manager."""

    def __init__(self, manager: Callable[[], Any]) -> None:
        self._manager = manager  # made on first use

    def create(self, spec: str, name: str | None = None) -> EnvironmentCreated:
        return cast(EnvironmentCreated, self._guard(lambda m: m.create(spec, name)))

    def list(self) -> EnvironmentList:
        return cast(EnvironmentList, self._guard(lambda m: m.list()))

    def show(self, venv_id: int) -> EnvironmentShown:
        """One environment's spec, whether it is built, and its packages and versions."""
        return cast(EnvironmentShown, self._guard(lambda m: m.show(venv_id)))

    def build(self, venv_id: int, on_progress: Callable[[str], None] | None = None) -> EnvironmentBuilt:
        return cast(EnvironmentBuilt, self._guard(lambda m: m.build(venv_id, on_progress=on_progress)))

    def remove_unused(self) -> dict[str, Any]:
        """Delete built environment folders that no stored environment refers to."""
        return self._guard(lambda m: m.remove_unused())

    def _guard(self, action: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
        try:
            return dict(action(self._manager()))
        except CoordexError as exc:
            return exc.to_dict()
