"""Sessions that outlive their process (SPEC section 12).

``store`` names the folder of each kept session under ``root/snapshots``; ``kinds``
writes and reads a snapshot for each kind of session (the own interpreter, an
environment's worker, a bash shell); ``manager`` decides when a snapshot is written and
brings a kept session back on its first call. The pickling itself is
:mod:`coordex.worker._coordex_snapshot`, standard library only, so an environment's
worker runs the same code.
"""

from .manager import Persistence
from .store import Identity, SnapshotStore

__all__ = ["Identity", "Persistence", "SnapshotStore"]
