"""Sessions that outlive their process (SPEC section 12).

Policy only: ``store`` names the folder of each kept session under ``root/snapshots``;
``manager`` decides when a snapshot is written, which process holds a session, and
brings a kept session back on its first call (its snapshot, then the calls logged after
it; a replay of its calls when the snapshot cannot be read); ``hooks`` is where the
Executor calls it. How a session is written and read is its place's: the
:class:`~coordex.backends.base.Kept` protocol, implemented in each place's package
(``backends/*/keep.py``); a session that is not ``Kept`` is kept
by its logged calls alone (replayed). The pickling
itself is :mod:`coordex.worker._coordex_snapshot`, standard library only, so an
environment's worker runs the same code.
"""

from .manager import Persistence
from .store import Identity, SnapshotStore

__all__ = ["Identity", "Persistence", "SnapshotStore"]
