"""Confined hosts (SPEC section 9): one Executor per process, each in a jail of its own.

``jail.py`` sets up the namespaces, the file view, Landlock and the limits; ``host.py``
is the program that runs one Executor there; ``wire.py`` is the JSON-lines protocol
between the host and its owner; ``client.py`` is the owner's side,
:class:`ConfinedExecutor`.
"""

from .client import ConfinedExecutor
from .jail import LEVELS, best_level

__all__ = ["LEVELS", "ConfinedExecutor", "best_level"]
