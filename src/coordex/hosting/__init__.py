"""Hosting: who runs which Executor where (SPEC sections 9 and 10), apart from the
places where code runs (``coordex.backends``), which import nothing from here.

- ``jail.py`` sets up the namespaces, limits, Landlock and the seccomp filter;
  ``view.py`` the file view by allow-list; ``identity.py`` who a jail runs as;
- ``host.py`` is the program that runs one Executor (or a node's sessions of one
  tenant) in a jail; ``builder.py`` its builder process; ``wire.py`` the JSON-lines
  protocol between a host and its owner;
- ``client.py`` is the owner's side, :class:`ConfinedExecutor`, and ``records.py`` the
  call log and stored functions it writes for its host;
- ``tenant_node.py`` is coordex's actor on a cluster node for one tenant (the same jail
  there), ``relay.py`` the tenant's cluster reached through its owner.

One jail everywhere: the server and every node build it with the same code and the
same allow-list.
"""

from .client import ConfinedExecutor
from .jail import LEVELS, best_level

__all__ = ["LEVELS", "ConfinedExecutor", "best_level"]
