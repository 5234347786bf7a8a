"""Dedicated environments: specs registered in SQLite, built once by uv, content-addressed.

``manager.py`` is the entry point (:class:`EnvironmentManager`); ``store.py`` holds the
registry, ``builder.py`` runs uv. The pure spec model lives in :mod:`coordex.core.spec`.
"""

from .manager import EnvironmentManager

__all__ = ["EnvironmentManager"]
